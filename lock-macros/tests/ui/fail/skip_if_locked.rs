use lock_runtime::{distributed_locked, LockError};

pub struct Report;

// No `Default`: nothing to return when the lock is held elsewhere.
#[distributed_locked(name = "a", skip_if_locked)]
async fn no_default() -> Report {
    Report
}

// `Ok(Default::default())` needs `Default` of the `Ok` type.
#[derive(Debug)]
pub struct AppError;

impl From<LockError> for AppError {
    fn from(_: LockError) -> Self {
        AppError
    }
}

#[distributed_locked(name = "b", skip_if_locked)]
async fn ok_without_default() -> Result<Report, AppError> {
    Ok(Report)
}

async fn later() {}

// Conflicting and malformed options, all reported in one build.
#[distributed_locked(name = "c", skip_if_locked, fallback = later, lease = "1s", hold_at_least = "2s")]
async fn conflicting() {}

#[distributed_locked(name = "d", skip_if_locked = true)]
async fn flag_with_value() {}

fn main() {
    let _ = no_default();
    let _ = ok_without_default();
    let _ = conflicting();
    let _ = flag_with_value();
}
