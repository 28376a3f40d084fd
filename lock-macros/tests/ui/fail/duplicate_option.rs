use lock_runtime::{distributed_locked, LockError};

#[distributed_locked(name = "a", wait = "1s", wait = "2s")]
async fn twice() -> Result<(), LockError> {
    Ok(())
}

fn main() {
    let _ = twice();
}
