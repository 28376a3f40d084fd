//! The attribute without `manager = ..` before and after `set_default` (its own test binary:
//! the default manager is process-wide).
#![deny(warnings, clippy::all)]

use lock_runtime::{distributed_locked, LockError, LockManager};

#[distributed_locked(name = "nc")]
async fn needs_default() -> Result<u32, LockError> {
    Ok(1)
}

#[distributed_locked(name = "nc-fallback", fallback = not_locked)]
async fn with_fallback(n: u32) -> u32 {
    n
}
async fn not_locked(n: u32) -> u32 {
    n + 100
}

#[tokio::test]
async fn without_a_default_manager_the_call_fails_as_not_configured() {
    let err = needs_default().await.expect_err("no manager");
    assert!(err.is_not_configured(), "{err}");
    assert!(err.to_string().contains("set_default"), "{err}");
    assert_eq!(with_fallback(1).await, 101, "the fallback covers any failure to lock, this one included");

    assert!(lock_runtime::set_default(LockManager::memory()).is_none());
    assert_eq!(needs_default().await.expect("configured now"), 1);
    assert_eq!(with_fallback(1).await, 1);
}
