//! `skip_if_locked` and `hold_at_least` compile lint-clean on the shapes a scheduled job has.
#![deny(warnings, clippy::all)]

use lock_runtime::{distributed_locked, LockError};

#[derive(Debug)]
pub struct AppError(pub LockError);

impl From<LockError> for AppError {
    fn from(e: LockError) -> Self {
        AppError(e)
    }
}

#[distributed_locked(name = "report", hold_at_least = "30s", skip_if_locked)]
async fn report() {}

#[distributed_locked(name = "count", skip_if_locked, wait = "1s")]
async fn count() -> u64 {
    1
}

#[distributed_locked(name = "export", skip_if_locked, lease = "10m", hold_at_least = "30s")]
async fn export() -> Result<Option<u32>, AppError> {
    Ok(Some(1))
}

#[distributed_locked(name = "sync", skip_if_locked, on_lost = ignore)]
async fn sync() -> Vec<u8> {
    Vec::new()
}

fn main() {
    let _ = (report(), count(), export(), sync());
}
