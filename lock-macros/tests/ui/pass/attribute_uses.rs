//! A parameter bound by a pattern and used only by the attribute (the manager expression, a
//! name template) is used: no "unused variable" warning (it warned for `State(state)` used in
//! `manager = &state.locks` alone). One that nobody uses still warns, as without the attribute.
#![deny(warnings)]

use lock_runtime::{distributed_locked, LockError, LockManager};

struct AppState {
    locks: LockManager,
}

/// An extractor's shape, as axum's `State` and `Path`.
struct State<T>(T);
struct Path<T>(T);

#[distributed_locked(name = "order:{id}", manager = &state.locks)]
async fn settle(State(state): State<AppState>, Path(id): Path<u64>) -> Result<u64, LockError> {
    Ok(7)
}

fn main() {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    let state = AppState { locks: LockManager::memory() };
    assert_eq!(rt.block_on(settle(State(state), Path(1))).expect("locked"), 7);
}
