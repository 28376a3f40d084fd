//! The `leader` form, lint-clean: a singleton worker with and without arguments, on the
//! default manager or one given, with a fixed term lease, in a method on `&self`.
#![deny(warnings)]

use std::sync::LazyLock;

use lock_runtime::{distributed_locked, LockError, LockManager};

static LOCKS: LazyLock<LockManager> = LazyLock::new(LockManager::memory);

#[derive(Debug)]
pub struct AppError(pub LockError);
impl From<LockError> for AppError {
    fn from(e: LockError) -> Self {
        AppError(e)
    }
}

#[distributed_locked(name = "scheduler", leader)]
async fn scheduler() -> Result<u64, AppError> {
    Ok(lock_runtime::current().map_or(0, |term| term.fencing_token()))
}

#[distributed_locked(name = "shard:{shard}", leader, lease = "10s", manager = &*LOCKS)]
async fn shard_worker(shard: u32, tag: String, (a, b): (u8, u8)) -> Result<String, AppError> {
    Ok(format!("{shard}:{tag}:{a}{b}"))
}

pub struct Service {
    pub region: String,
}

impl Service {
    #[distributed_locked(name = "region:{self.region}", leader, manager = &*LOCKS)]
    pub async fn lead_region(&self, round: &u32) -> Result<u32, LockError> {
        Ok(*round)
    }
}

fn main() {
    lock_runtime::set_default(LockManager::memory());
    let service = Service { region: "eu".to_owned() };
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    runtime.block_on(async {
        assert!(scheduler().await.expect("led") > 0);
        assert_eq!(shard_worker(3, "x".to_owned(), (1, 2)).await.expect("led"), "3:x:12");
        assert_eq!(service.lead_region(&7).await.expect("led"), 7);
    });
}
