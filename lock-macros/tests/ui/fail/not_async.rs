use lock_runtime::{distributed_locked, LockError};

#[distributed_locked(name = "a")]
fn not_async() -> Result<(), LockError> {
    Ok(())
}

fn main() {
    // Still emitted: callers keep compiling.
    let _ = not_async();
}
