use lock_runtime::{distributed_locked, LockError};

// `leader` campaigns without a bound and always stops its body at a loss: the options that
// say otherwise are refused, each on its own token.
#[distributed_locked(name = "a", leader, wait = "2s", retry = 3)]
async fn bounded() -> Result<(), LockError> {
    Ok(())
}

#[distributed_locked(name = "a", leader, skip_if_locked, on_lost = ignore)]
async fn skipping() -> Result<(), LockError> {
    Ok(())
}

#[distributed_locked(name = "a", leader, mode = write)]
async fn kind() -> Result<(), LockError> {
    Ok(())
}

#[distributed_locked(name = "a", leader = true)]
async fn valued() -> Result<(), LockError> {
    Ok(())
}

#[distributed_locked(name = "a", leader)]
async fn not_a_result() -> u32 {
    1
}

fn main() {}
