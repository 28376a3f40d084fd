use lock_runtime::{distributed_locked, LockError};

#[distributed_locked(name = "a:{id}", fallback = wrong_args)]
async fn args(id: u32, tag: &str) -> Result<u32, LockError> {
    Ok(id + tag.len() as u32)
}
async fn wrong_args(id: u32) -> Result<u32, LockError> {
    Ok(id)
}

#[distributed_locked(name = "b:{id}", fallback = wrong_output)]
async fn output(id: u32) -> Result<u32, LockError> {
    Ok(id)
}
async fn wrong_output(id: u32) -> u32 {
    id
}

#[distributed_locked(name = "c:{id}", fallback = not_async)]
async fn sync_fallback(id: u32) -> Result<u32, LockError> {
    Ok(id)
}
fn not_async(id: u32) -> Result<u32, LockError> {
    Ok(id)
}

fn main() {
    let _ = args(1, "x");
    let _ = output(1);
    let _ = sync_fallback(1);
}
