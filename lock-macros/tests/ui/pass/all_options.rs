//! Every option, lint-clean.
#![deny(warnings)]

use std::sync::LazyLock;

use lock_runtime::{distributed_locked, LockError, LockManager};

static LOCKS: LazyLock<LockManager> = LazyLock::new(LockManager::memory);

pub struct Order {
    pub id: u64,
}

#[derive(Debug)]
pub struct AppError(pub LockError);
impl From<LockError> for AppError {
    fn from(e: LockError) -> Self {
        AppError(e)
    }
}

#[distributed_locked]
pub async fn defaults() -> Result<(), AppError> {
    Ok(())
}

#[distributed_locked(
    name = "order:{order.id}",
    wait = "2s",
    lease = "30s",
    retry = 3,
    fallback = settle_later,
    manager = &*LOCKS,
    on_lost = abort,
    crate = "lock_runtime"
)]
pub async fn settle(order: &Order) -> Result<u64, AppError> {
    Ok(order.id)
}
pub async fn settle_later(order: &Order) -> Result<u64, AppError> {
    Ok(order.id + 1000)
}

#[distributed_locked(name = "n:{id}", wait = "250ms", lease = "1m", on_lost = ignore, manager = LOCKS.clone())]
pub async fn ignore(id: u32) -> Result<u32, AppError> {
    Ok(id)
}

#[distributed_locked(name = "h", wait = "1h", lease = "250ms", retry = 0, manager = &*LOCKS)]
pub async fn hour() -> Result<(), LockError> {
    Ok(())
}

fn main() {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    rt.block_on(async {
        lock_runtime::set_default(LockManager::memory());
        defaults().await.expect("default manager");
        assert_eq!(settle(&Order { id: 4 }).await.expect("locked"), 4);
        assert_eq!(ignore(2).await.expect("locked"), 2);
        hour().await.expect("locked");
    });
}
