//! The lifecycle matrix's steps, shared by every backend's row (`tests/lifecycle.rs`): a
//! manager that has locked and released before an everyday event (the server closes idle
//! connections, an operator kills every client session, a crash and restart), then, as soon
//! as the server answers again, every operation of the manager succeeds at its first call, a
//! waiter parked across the event is granted, and a lock released or dropped while the server
//! was away is free for others once it answers.

#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)]

use std::time::Duration;

use lock_runtime::backend::LockKind;
use lock_runtime::{LockGuard, LockManager};

/// How long a waiter parked across an event may wait: far longer than any event here lasts
/// (a restart takes under a second on an idle machine, a few on a loaded one).
pub const PARKED_WAIT: Duration = Duration::from_secs(30);

/// Locks and releases three names, so that the manager has connections (idle ones, for the
/// pooled backends) before the event.
pub async fn warm(manager: &LockManager, label: &str) {
    for i in 0..3 {
        let guard = manager.lock(format!("{label}:warm:{i}")).await.expect("lock before the event");
        guard.release().await.expect("release before the event");
    }
}

/// Holds three locks at once, then releases them: a pooled backend keeps three idle
/// connections (each to be found dead after the event).
pub async fn several_idle(manager: &LockManager, label: &str) {
    let names: Vec<String> = (0..3).map(|i| format!("{label}:many:{i}")).collect();
    let held =
        futures_util::future::join_all(names.iter().map(|n| std::future::IntoFuture::into_future(manager.lock(n))))
            .await;
    for guard in held {
        guard.expect("lock before the event").release().await.expect("release before the event");
    }
}

/// Waits until the server lists none of `before` (the manager's connections, as `list` gives
/// the server's own) any more: it closed them (an idle timeout). Panics after 30 s.
pub async fn until_closed<T: PartialEq + std::fmt::Debug>(before: &[T], mut list: impl AsyncFnMut() -> Vec<T>) {
    assert!(!before.is_empty(), "the manager has connections before the event");
    crate::eventually("the manager's idle connections closed by the server", Duration::from_secs(30), async || {
        let now = list().await;
        let open: Vec<&T> = before.iter().filter(|c| now.contains(c)).collect();
        if open.is_empty() {
            Ok(())
        } else {
            Err(format!("{open:?} still open"))
        }
    })
    .await;
}

/// Every operation the backend supports succeeds at its first call (no retry here): `lock()`,
/// `try_lock()`, `read_lock()`, `semaphore()` and an election's `campaign()`, each released.
pub async fn every_operation_succeeds(manager: &LockManager, label: &str, event: &str) {
    let name = |what: &str| format!("{label}:after:{what}");
    let guard = manager.lock(name("lock")).await.unwrap_or_else(|e| panic!("lock() after {event}: {e}"));
    guard.release().await.unwrap_or_else(|e| panic!("release after {event}: {e}"));
    let guard = manager
        .try_lock(name("try"))
        .await
        .unwrap_or_else(|e| panic!("try_lock() after {event}: {e}"))
        .unwrap_or_else(|| panic!("try_lock() after {event}: busy although nobody holds it"));
    guard.release().await.unwrap_or_else(|e| panic!("release after {event}: {e}"));
    if manager.supports(LockKind::Read) {
        let guard = manager.read_lock(name("read")).await.unwrap_or_else(|e| panic!("read_lock() after {event}: {e}"));
        guard.release().await.unwrap_or_else(|e| panic!("release after {event}: {e}"));
    }
    if manager.supports(LockKind::Semaphore { permits: 2 }) {
        let guard =
            manager.semaphore(name("sem"), 2).await.unwrap_or_else(|e| panic!("semaphore() after {event}: {e}"));
        guard.release().await.unwrap_or_else(|e| panic!("release after {event}: {e}"));
    }
    let leadership =
        manager.election(name("election")).campaign().await.unwrap_or_else(|e| panic!("campaign() after {event}: {e}"));
    leadership.resign().await.unwrap_or_else(|e| panic!("resign after {event}: {e}"));
}

/// A waiter parked on `name` (held by `holder`) before the event: spawned, and given time to
/// queue. Its task answers the fencing token it was granted.
pub async fn park_waiter(
    manager: &LockManager,
    name: &str,
) -> tokio::task::JoinHandle<Result<u64, lock_runtime::LockError>> {
    let (m, owned) = (manager.clone(), name.to_owned());
    let waiter = tokio::spawn(async move { m.lock(owned).wait(PARKED_WAIT).await.map(|g| g.fencing_token()) });
    // Parked: seen in the store where it says so (waiters, or Redis's server-side queue, which
    // a waiter enters a third of its claim window in). Where the store says nothing of its
    // waiters (MySQL, a Redis Cluster, Redlock), 200 ms: far more than the one round trip its
    // first attempt takes.
    let mut told = false;
    if manager.can_inspect() {
        crate::eventually("the waiter parked", Duration::from_secs(10), async || {
            let info = manager.inspect(name).await.map_err(|e| e.to_string())?.ok_or("not held")?;
            match (info.waiters, info.queued) {
                (None, None) => Ok(()),
                (w, q) if w.unwrap_or(0) + q.unwrap_or(0) >= 1 => {
                    told = true;
                    Ok(())
                }
                _ => Err("no waiter yet".to_owned()),
            }
        })
        .await;
    }
    if !told {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    waiter
}

/// The waiter is granted once `holder` is released (or was gone with the event).
pub async fn waiter_granted(
    waiter: tokio::task::JoinHandle<Result<u64, lock_runtime::LockError>>,
    holder: Option<LockGuard>,
    event: &str,
) {
    if let Some(holder) = holder {
        // The holder's own release may find its lock gone (a restart without persistence):
        // either way the name is free afterwards.
        let _ = holder.release().await;
    }
    waiter
        .await
        .expect("waiter task")
        .unwrap_or_else(|e| panic!("a waiter parked across {event} was not granted: {e}"));
}
