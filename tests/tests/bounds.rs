//! Send/Sync/'static bounds users rely on (as tokio's async_send_sync.rs).

use lock_runtime::{LockError, LockGuard, LockManager, LockManagerBuilder};

fn send_sync_static<T: Send + Sync + 'static>() {}
fn send<T: Send>(_: &T) {}

#[test]
fn public_types_are_send_sync_static() {
    send_sync_static::<LockManager>();
    send_sync_static::<LockManagerBuilder>();
    send_sync_static::<LockGuard>();
    send_sync_static::<LockError>();
    send_sync_static::<lock_runtime::CurrentLock>();
    send_sync_static::<lock_runtime::LostSignal>();
    send_sync_static::<std::sync::Arc<dyn lock_runtime::backend::LockBackend>>();
}

#[test]
fn futures_are_send() {
    let m = LockManager::memory();
    send(&m.lock("a").into_future());
    send(&m.try_lock("a"));
    let fut = async {
        let g = m.lock("a").await.expect("free");
        g.lost().await;
        g.release().await
    };
    send(&fut);
}

use std::future::IntoFuture;
