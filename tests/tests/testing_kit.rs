//! The testing kit (`lock_runtime::testing`, feature `testing`): a held name, an injected
//! outage and a lost lock, each driven under tokio's paused clock; `assert_locked`; and the
//! conformance suite on the wrapper with no fault injected (it is transparent).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use lock_runtime::testing::{assert_locked, assert_not_locked, TestBackend};
use lock_runtime::{distributed_locked, LockError, LockManager};
use tokio::time::Instant;

/// With no fault injected, the wrapper passes the conformance suite (on the in-process store).
mod conformance {
    lock_tests::conformance_suite!(
        |builder: lock_runtime::LockManagerBuilder| async move {
            builder.backend(lock_runtime::testing::TestBackend::new())
        },
        kinds = [
            lock_runtime::backend::LockKind::Read,
            lock_runtime::backend::LockKind::Write,
            lock_runtime::backend::LockKind::Semaphore { permits: 1 }
        ],
        inspect = true
    );
}

fn setup() -> (TestBackend, LockManager) {
    let backend = TestBackend::new();
    let manager = LockManager::builder().prefix("app:").backend(backend.clone());
    (backend, manager)
}

/// A held name: `try_lock` finds it busy, and a `wait(d)` fails contended after exactly `d` of
/// virtual time (no real waiting: the test would take 30 s otherwise).
#[tokio::test(start_paused = true)]
async fn a_held_name_is_contended_for_exactly_the_wait() {
    let (backend, manager) = setup();
    let other = backend.hold("job");
    assert_eq!(other.name(), "job");
    assert!(manager.try_lock("job").await.expect("try_lock").is_none());
    assert!(manager.try_lock("other").await.expect("try_lock").is_some(), "other names are free");

    let wall = std::time::Instant::now();
    let started = Instant::now();
    let err = manager.lock("job").wait(Duration::from_secs(30)).await.expect_err("busy");
    assert!(err.is_contended(), "{err}");
    assert_eq!(started.elapsed(), Duration::from_secs(30), "the wait ends at its deadline, in virtual time");
    assert!(wall.elapsed() < Duration::from_secs(10), "no real waiting: {:?}", wall.elapsed());
    assert_eq!(backend.waiting("job"), 0);
    assert_eq!(backend.grants("job"), 0);

    other.release();
    let guard = manager.try_lock("job").await.expect("try_lock").expect("free once let go");
    assert!(backend.is_held("job"));
    guard.release().await.expect("release");
    assert!(!backend.is_held("job"));
}

/// Letting go of a holding while a caller waits wakes it at once: it is granted at the very
/// instant of the release, after exactly one more attempt (a poller would make more, or wake
/// later).
#[tokio::test(start_paused = true)]
async fn releasing_a_holding_mid_wait_wakes_the_waiter() {
    let (backend, manager) = setup();
    let other = backend.hold("job");
    let started = Instant::now();
    let waiter = tokio::spawn({
        let manager = manager.clone();
        async move {
            let guard = manager.lock("job").wait(Duration::from_secs(60)).await?;
            Ok::<_, LockError>((started.elapsed(), guard.fencing_token()))
        }
    });
    tokio::time::sleep(Duration::from_secs(7)).await;
    assert_eq!(backend.waiting("job"), 1, "the caller waits");
    assert_eq!(backend.attempts("job"), 1);
    other.release();
    let (waited, token) = waiter.await.expect("task").expect("granted once let go");
    assert_eq!(waited, Duration::from_secs(7), "woken at the release");
    assert!(token > 0);
    assert_eq!(backend.attempts("job"), 2, "one attempt before the wait, one after the wake-up");
    assert_eq!(backend.grants("job"), 1);
}

/// Holdings of one name add up: the name is free once every one is let go; dropping one
/// lets it go too.
#[tokio::test(start_paused = true)]
async fn holdings_add_up_and_drop_lets_go() {
    let (backend, manager) = setup();
    let first = backend.hold("job");
    let second = backend.hold("job");
    drop(first);
    assert!(manager.try_lock("job").await.expect("try_lock").is_none(), "still held by the second");
    drop(second);
    assert!(manager.try_lock("job").await.expect("try_lock").is_some());
}

/// An injected outage fails the next attempt with a backend error, once; then the store works.
#[tokio::test(start_paused = true)]
async fn an_outage_fails_once_then_the_store_works() {
    let (backend, manager) = setup();
    backend.fail_next(1);
    let err = manager.lock("job").await.expect_err("outage");
    assert!(err.is_backend(), "{err}");
    assert_eq!(err.lock_name(), "job");
    assert!(err.to_string().contains("memory backend failed to acquire"), "{err}");
    manager.lock("job").await.expect("the outage is over").release().await.expect("release");

    // Per name: the other names are not affected, and it lasts `n` attempts.
    backend.fail_next_for("job", 2);
    manager.lock("other").await.expect("another name").release().await.expect("release");
    assert!(manager.lock("job").await.expect_err("first").is_backend());
    assert!(manager.try_lock("job").await.expect_err("second").is_backend());
    assert!(manager.try_lock("job").await.expect("over").is_some());
    assert_eq!(backend.attempts("job"), 5);
    assert_eq!(backend.grants("job"), 2);
}

/// `lose` takes a held lock away: the guard's `lost()` completes, `is_lost()` is true, the
/// name is free for others at once, and the guard's release reports the loss.
#[tokio::test(start_paused = true)]
async fn lose_fires_lost_of_a_held_guard_and_frees_the_name() {
    let (backend, manager) = setup();
    let guard = manager.lock("job").await.expect("lock");
    assert!(!guard.is_lost());
    assert!(!backend.lose("other").await, "nothing held under that name");

    let watcher = tokio::spawn({
        let manager = manager.clone();
        async move {
            let guard = manager.lock("watched").await?;
            guard.lost().await;
            Ok::<_, LockError>(guard.is_lost())
        }
    });
    tokio::task::yield_now().await;
    assert!(backend.is_held("watched"));
    assert!(backend.lose("watched").await);
    assert!(watcher.await.expect("task").expect("lock"), "lost() completed, is_lost() is true");

    assert!(backend.lose("job").await);
    assert!(guard.is_lost());
    tokio::time::timeout(Duration::from_secs(1), guard.lost()).await.expect("lost() completes");
    assert!(!backend.is_held("job"));
    let next = manager.try_lock("job").await.expect("try_lock").expect("the name is free");
    assert!(next.fencing_token() > guard.fencing_token());
    let err = guard.release().await.expect_err("lost");
    assert!(err.is_lost(), "{err}");
    assert!(err.to_string().contains("TestBackend::lose"), "{err}");
    next.release().await.expect("the new holder is unaffected");
}

static BODY_DONE: AtomicBool = AtomicBool::new(false);

#[distributed_locked(name = "export:{id}", manager = manager)]
async fn export(manager: &LockManager, id: u32, entered: tokio::sync::oneshot::Sender<()>) -> Result<(), LockError> {
    assert_locked(&format!("export:{id}"));
    let _ = entered.send(());
    tokio::time::sleep(Duration::from_secs(3600)).await;
    BODY_DONE.store(true, Ordering::SeqCst);
    Ok(())
}

/// `lose` while a `#[distributed_locked]` body runs stops the body (it never completes) and
/// the call returns the lost error, as for a real loss.
#[tokio::test(start_paused = true)]
async fn lose_aborts_the_body_of_a_locked_fn() {
    let (backend, manager) = setup();
    let (entered_tx, entered) = tokio::sync::oneshot::channel();
    let started = Instant::now();
    let call = tokio::spawn({
        let manager = manager.clone();
        async move { export(&manager, 3, entered_tx).await }
    });
    entered.await.expect("the body runs");
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert!(backend.lose("export:3").await);
    let err = call.await.expect("task").expect_err("lost");
    assert!(err.is_lost(), "{err}");
    assert_eq!(started.elapsed(), Duration::from_secs(5), "stopped at the loss, not at the end of the body");
    assert!(!BODY_DONE.load(Ordering::SeqCst), "the body was stopped");
    assert!(!backend.is_held("export:3"));
}

/// The same through `LockRequest::run`: the future is dropped at the loss.
#[tokio::test(start_paused = true)]
async fn lose_aborts_a_run() {
    let (backend, manager) = setup();
    let dropped = Arc::new(AtomicBool::new(false));
    struct SetOnDrop(Arc<AtomicBool>);
    impl Drop for SetOnDrop {
        fn drop(&mut self) {
            self.0.store(true, Ordering::SeqCst);
        }
    }
    let run = tokio::spawn({
        let (manager, dropped) = (manager.clone(), dropped.clone());
        async move {
            manager
                .lock("run")
                .run(async move {
                    let _flag = SetOnDrop(dropped);
                    std::future::pending::<()>().await;
                })
                .await
        }
    });
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(backend.lose("run").await);
    assert!(run.await.expect("task").expect_err("lost").is_lost());
    assert!(dropped.load(Ordering::SeqCst), "the future was dropped");
}

/// The wrapper reports the wrapped backend's kind, and a manager on it does not take the
/// in-process fast path (which gives guards no loss signal): `lose` reaches every guard.
#[tokio::test(start_paused = true)]
async fn the_wrapper_is_the_wrapped_kind_but_not_the_fast_path() {
    let (backend, manager) = setup();
    assert_eq!(manager.backend_name(), "memory");
    assert!(format!("{backend:?}").contains("TestBackend"));
    let guard = manager.lock("fast").await.expect("uncontended");
    assert!(backend.lose("fast").await);
    assert!(guard.is_lost());
}

/// `assert_locked` passes under the lock of that name (by the name the code wrote, without the
/// manager's prefix), also when nested under another lock.
#[tokio::test(start_paused = true)]
async fn assert_locked_passes_inside() {
    let (_backend, manager) = setup();
    assert_not_locked();
    manager
        .lock("outer")
        .run(async {
            assert_locked("outer");
            manager
                .lock("inner")
                .run(async {
                    assert_locked("inner");
                    assert_locked("outer");
                    let not = std::panic::catch_unwind(|| assert_locked("neither")).expect_err("panics");
                    let message = not.downcast_ref::<String>().cloned().unwrap_or_default();
                    assert!(message.contains("`neither`") && message.contains("`inner`, `outer`"), "{message}");
                    assert!(std::panic::catch_unwind(assert_not_locked).is_err());
                })
                .await
        })
        .await
        .expect("outer")
        .expect("inner");
    assert_not_locked();
}

/// Outside a locked call `assert_locked` panics.
#[test]
#[should_panic(expected = "expected to run under the lock `job`, but no lock is held here")]
fn assert_locked_panics_outside() {
    assert_locked("job");
}

/// A task spawned from a locked body runs outside the lock (the context belongs to the task).
#[tokio::test(start_paused = true)]
async fn assert_locked_panics_in_a_task_spawned_from_a_locked_body() {
    let (_backend, manager) = setup();
    let spawned = manager
        .lock("job")
        .run(async {
            assert_locked("job");
            tokio::spawn(async { assert_locked("job") }).await
        })
        .await
        .expect("lock");
    assert!(spawned.expect_err("the spawned task panicked").is_panic());
}

/// Waiting behind a guard (the wrapped store's own queue) also runs on virtual time, also once
/// tokio's paused clock has run ahead of the system's: the wait ends at its deadline, and a
/// release mid-wait hands the lock over at that instant.
#[tokio::test(start_paused = true)]
async fn waiting_behind_a_guard_runs_on_virtual_time() {
    let (backend, manager) = setup();
    tokio::time::sleep(Duration::from_secs(3600)).await; // tokio's clock is an hour ahead now
    let guard = manager.lock("job").await.expect("lock");
    let wall = std::time::Instant::now();
    let started = Instant::now();
    let err = manager.lock("job").wait(Duration::from_secs(20)).await.expect_err("busy");
    assert!(err.is_contended(), "{err}");
    assert_eq!(started.elapsed(), Duration::from_secs(20));
    assert!(wall.elapsed() < Duration::from_secs(10), "no real waiting: {:?}", wall.elapsed());

    let started = Instant::now();
    let waiter = tokio::spawn({
        let manager = manager.clone();
        async move { manager.lock("job").wait(Duration::from_secs(20)).await.map(|g| (started.elapsed(), g)) }
    });
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert_eq!(backend.waiting("job"), 1);
    guard.release().await.expect("release");
    let (waited, next) = waiter.await.expect("task").expect("handed over");
    assert_eq!(waited, Duration::from_secs(4));
    assert!(backend.is_held("job"));
    next.release().await.expect("release");
    assert_eq!(backend.grants("job"), 2);
}
