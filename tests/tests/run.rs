//! `LockRequest::run` on the in-memory backend: the lock is held while the future runs,
//! `current()` inside, reentrancy, release on completion, panic and cancellation, the loss of a
//! fixed lease (abort by default, `ignore_lost`), and `Send`.
#![deny(warnings, clippy::all)]

use std::time::Duration;

use lock_runtime::{LockError, LockManager, Run};
use tokio::sync::oneshot;

/// Generous bound for anything that should happen "at once" on a loaded CI box.
const BOUND: Duration = Duration::from_secs(20);

async fn is_free(m: &LockManager, name: &str) -> bool {
    m.try_lock(name).await.expect("try_lock").is_some()
}

#[tokio::test]
async fn runs_under_the_lock_and_releases_on_completion() {
    let m = LockManager::memory();
    let out = m
        .lock("run:held")
        .run(async {
            assert!(m.try_lock("run:held").await.expect("try_lock").is_none(), "held while the future runs");
            7
        })
        .await
        .expect("locked");
    assert_eq!(out, 7);
    assert!(is_free(&m, "run:held").await, "released when the future completed");
}

#[tokio::test]
async fn current_inside_and_none_outside() {
    let m = LockManager::memory();
    assert!(lock_runtime::current().is_none());
    let (key, token) = m
        .lock("run:cur")
        .run(async {
            let cur = lock_runtime::current().expect("inside");
            (cur.key().to_owned(), cur.fencing_token())
        })
        .await
        .expect("locked");
    assert_eq!(key, "run:cur");
    assert!(token > 0);
    assert!(lock_runtime::current().is_none(), "the context is left as it was");
}

#[tokio::test]
async fn a_nested_run_with_the_same_name_reenters_and_another_name_nests() {
    let m = LockManager::memory();
    let (outer, nested, other, after) = tokio::time::timeout(
        BOUND,
        m.lock("run:re").run(async {
            let outer = lock_runtime::current().expect("inside").fencing_token();
            // Same task, same manager, same name: must not wait for itself.
            let nested = m
                .lock("run:re")
                .wait(Duration::ZERO)
                .run(async { lock_runtime::current().expect("inside").fencing_token() })
                .await
                .expect("re-entered");
            assert!(!is_free(&m, "run:re").await, "the nested run's end did not release the outer lock");
            let other = m
                .lock("run:other")
                .run(async { lock_runtime::current().expect("inside").key().to_owned() })
                .await
                .expect("nested");
            let after = lock_runtime::current().expect("inside").key().to_owned();
            (outer, nested, other, after)
        }),
    )
    .await
    .expect("no deadlock")
    .expect("locked");
    assert_eq!(outer, nested, "the nested run sees the outer lock");
    assert_eq!(other, "run:other");
    assert_eq!(after, "run:re");
    assert!(is_free(&m, "run:re").await && is_free(&m, "run:other").await);
}

#[tokio::test]
async fn another_task_does_not_reenter() {
    let m = LockManager::memory();
    let busy = m
        .lock("run:task")
        .run(async {
            let m2 = m.clone();
            tokio::spawn(async move { m2.lock("run:task").wait(Duration::ZERO).run(async {}).await })
                .await
                .expect("task")
        })
        .await
        .expect("locked");
    assert!(busy.expect_err("another task waits").is_contended());
}

#[tokio::test]
async fn a_lock_that_cannot_be_taken_never_polls_the_future() {
    let m = LockManager::memory();
    let held = m.lock("run:busy").await.expect("holder");
    let err = m
        .lock("run:busy")
        .wait(Duration::ZERO)
        .run(async { unreachable!("the future must not run") })
        .await
        .expect_err("busy");
    assert!(err.is_contended(), "{err}");
    held.release().await.expect("release");
}

#[tokio::test]
async fn released_on_panic() {
    let m = LockManager::memory();
    let m2 = m.clone();
    let joined = tokio::spawn(async move { m2.lock("run:panic").run(async { panic!("boom") }).await }).await;
    assert!(joined.expect_err("panicked").is_panic());
    assert!(is_free(&m, "run:panic").await, "the panicking run released its lock");
    assert!(lock_runtime::current().is_none());
}

#[tokio::test(flavor = "current_thread")]
async fn a_panic_leaves_no_context_on_the_thread() {
    let m = LockManager::memory();
    let joined = tokio::spawn(async move { m.lock("run:panic-cx").run(async { panic!("boom") }).await }).await;
    assert!(joined.expect_err("panicked").is_panic());
    // Same thread: the panic unwound through the poll that had installed the frame.
    assert!(lock_runtime::current().is_none());
}

/// Records what `current()` says when it is dropped.
struct SeesOnDrop(Option<oneshot::Sender<Option<String>>>);

impl Drop for SeesOnDrop {
    fn drop(&mut self) {
        if let Some(tx) = self.0.take() {
            let _ = tx.send(lock_runtime::current().map(|c| c.key().to_owned()));
        }
    }
}

#[tokio::test]
async fn released_on_cancellation_after_the_first_poll() {
    let m = LockManager::memory();
    let (entered_tx, entered_rx) = oneshot::channel();
    let (seen_tx, seen_rx) = oneshot::channel();
    let probe = SeesOnDrop(Some(seen_tx));
    let mut run = Box::pin(m.lock("run:cancel").run(async move {
        let _probe = probe;
        let _ = entered_tx.send(());
        std::future::pending::<()>().await;
    }));
    // One poll: the body runs up to its pending await.
    assert!(lock_tests::poll_once(&mut run.as_mut()).await.is_pending());
    entered_rx.await.expect("the body ran");
    assert!(!is_free(&m, "run:cancel").await, "held while the body is pending");
    drop(run);
    assert_eq!(seen_rx.await.expect("dropped").as_deref(), Some("run:cancel"), "dropped in its context");
    assert!(is_free(&m, "run:cancel").await, "released when the run was dropped");
    assert!(lock_runtime::current().is_none());
}

#[tokio::test]
async fn a_lost_lease_aborts_by_default() {
    let m = LockManager::memory();
    let (dropped_tx, dropped_rx) = oneshot::channel();
    let probe = SeesOnDrop(Some(dropped_tx));
    let result = tokio::time::timeout(
        BOUND,
        m.lock("run:lost").lease(Duration::from_millis(30)).run(async move {
            let _probe = probe;
            std::future::pending::<()>().await; // outlives the lease
        }),
    )
    .await
    .expect("aborted, not pending");
    let err = result.expect_err("lost");
    assert!(err.is_lost(), "{err}");
    assert_eq!(dropped_rx.await.expect("the body was dropped").as_deref(), Some("run:lost"));
    assert!(is_free(&m, "run:lost").await);
}

#[tokio::test]
async fn ignore_lost_runs_to_the_end() {
    let m = LockManager::memory();
    let m2 = m.clone();
    let out = tokio::time::timeout(
        BOUND,
        m.lock("run:ignored")
            .lease(Duration::from_millis(30))
            .run(async move {
                // Another task gets the lock only once our lease has run out: the loss. The
                // body goes on after it (with the default, it would have been dropped).
                let taken = tokio::spawn(async move {
                    let guard = m2.lock("run:ignored").wait(BOUND).await.expect("taken after the lease");
                    guard.release().await.expect("release");
                })
                .await;
                taken.expect("task");
                "finished"
            })
            .ignore_lost(),
    )
    .await
    .expect("ran to the end")
    .expect("its output, though the lock was lost");
    assert_eq!(out, "finished");
    assert!(is_free(&m, "run:ignored").await);
}

#[tokio::test]
async fn a_loss_found_by_the_release_is_the_lost_error() {
    let m = LockManager::memory();
    // The body completes after the lease ran out, without awaiting in between (so the watch
    // never sees the loss first): the release reports it.
    let err = m
        .lock("run:late")
        .lease(Duration::from_millis(1))
        .run(async { std::thread::sleep(Duration::from_millis(20)) })
        .await
        .expect_err("lost");
    assert!(err.is_lost(), "{err}");
}

fn assert_send<T: Send>(_: &T) {}

#[test]
fn run_is_send_when_its_future_is() {
    let m = LockManager::memory();
    let run: Run<'_, _> = m.lock("run:send").run(async { tokio::task::yield_now().await });
    assert_send(&run);
    assert_send(&m.lock("run:send").run(async { 1 }).ignore_lost());
    let _: Option<Result<(), LockError>> = None;
}
