use lock_runtime::{distributed_locked, LockError};

#[distributed_locked(name = "a", leese = "2s")]
async fn typo() -> Result<(), LockError> {
    Ok(())
}

fn main() {
    let _ = typo();
}
