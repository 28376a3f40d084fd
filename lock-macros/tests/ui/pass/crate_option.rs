//! `crate = ".."` for re-exporters: the expansion names only the path given.
#![deny(warnings)]

mod facade {
    pub use ::lock_runtime as locks;
}

use facade::locks::{distributed_locked, LockError, LockManager};

#[distributed_locked(name = "r", crate = "crate::facade::locks", manager = LockManager::memory())]
async fn through_facade() -> Result<u32, LockError> {
    Ok(7)
}

fn main() {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    assert_eq!(rt.block_on(through_facade()).expect("locked"), 7);
}
