use lock_runtime::{distributed_locked, LockError};

// The name given alone, as other attributes take it: the error names the key it wants.
#[distributed_locked("order:{id}")]
async fn settle(id: u64) -> Result<(), LockError> {
    let _ = id;
    Ok(())
}

fn main() {
    let _ = settle(1);
}
