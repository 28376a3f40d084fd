use lock_runtime::{distributed_locked, LockError};

// Every problem of the build is reported together.
#[distributed_locked(wait = "2 sec", lease = "0s", retry = 5000000, on_lost = stop)]
async fn many(id: u32) -> Result<u32, LockError> {
    Ok(id)
}

#[distributed_locked(wait = "25h", lease = 1.5, name = order, fallback = "later")]
async fn more(id: u32) -> Result<u32, LockError> {
    Ok(id)
}

fn main() {
    let _ = many(1);
    let _ = more(1);
}
