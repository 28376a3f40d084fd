use lock_runtime::{distributed_locked, LockError};

#[distributed_locked(name = "a")]
async fn plain() -> u32 {
    1
}

#[distributed_locked(name = "b")]
async fn unit() {}

#[derive(Debug)]
pub struct MyError;

#[distributed_locked(name = "c")]
async fn no_from() -> Result<u32, MyError> {
    Ok(1)
}

async fn busy() -> u32 {
    0
}

#[distributed_locked(name = "d", fallback = busy, on_lost = abort)]
async fn abort_without_result() -> u32 {
    1
}

fn main() {
    let _ = plain();
    let _ = unit();
    let _ = no_from();
    let _ = abort_without_result();
    let _: Option<LockError> = None;
}
