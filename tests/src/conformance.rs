//! The backend conformance suite: written once, run against every backend.
//!
//! A backend's test file invokes [`conformance_suite!`](crate::conformance_suite) with an
//! async factory that turns a [`LockManagerBuilder`] (already carrying a unique prefix and any
//! defaults a case needs) into a manager on that backend:
//!
//! ```ignore
//! lock_tests::conformance_suite!(|builder: lock_runtime::LockManagerBuilder| async move { builder.memory() });
//! ```
//!
//! Each case is a plain async fn here, so a failure points at the property that broke.

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::future::Future;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use lock_runtime::{LockManager, LockManagerBuilder};

/// Builds a manager on the backend under test.
pub trait Factory: Fn(LockManagerBuilder) -> Self::Fut {
    type Fut: Future<Output = LockManager>;
}

impl<F, Fut> Factory for F
where
    F: Fn(LockManagerBuilder) -> Fut,
    Fut: Future<Output = LockManager>,
{
    type Fut = Fut;
}

fn builder() -> LockManagerBuilder {
    LockManager::builder().prefix(format!("{}:", crate::unique("t")))
}

async fn manager(make: &impl Factory) -> LockManager {
    make(builder()).await
}

/// Generates one `#[tokio::test]` per conformance case for the backend built by `$factory`.
#[macro_export]
macro_rules! conformance_suite {
    ($factory:expr) => {
        $crate::conformance_suite!(@cases $factory;
            mutual_exclusion, wait_runs_out_is_contended, try_lock_makes_one_attempt,
            release_wakes_waiter_promptly, drop_releases, aborted_holder_releases,
            lease_expiry_hands_over_and_fires_lost, release_after_expiry_is_lost,
            fencing_tokens_strictly_increase, timed_out_waiter_is_never_handed_the_lock,
            dropped_waiter_is_never_handed_the_lock, bad_input_is_invalid,
            retry_budget_bounds_attempts, watchdog_keeps_lock_past_default_lease,
            distinct_names_do_not_block, guard_reports_key_without_prefix);
    };
    (@cases $factory:expr; $($case:ident),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $case() {
                $crate::conformance::$case(&$factory).await;
            }
        )*
    };
}

/// 16 tasks doing a non-atomic read-modify-write under one lock lose no update, and never
/// overlap.
pub async fn mutual_exclusion(make: &impl Factory) {
    let m = manager(make).await;
    let counter = Arc::new(AtomicU64::new(0));
    let inside = Arc::new(AtomicUsize::new(0));
    const TASKS: u64 = 16;
    const ROUNDS: u64 = 10;
    let mut tasks = Vec::new();
    for _ in 0..TASKS {
        let (m, counter, inside) = (m.clone(), counter.clone(), inside.clone());
        tasks.push(tokio::spawn(async move {
            for _ in 0..ROUNDS {
                let guard = m.lock("counter").wait(Duration::from_secs(60)).await.expect("acquire");
                assert_eq!(inside.fetch_add(1, Ordering::SeqCst), 0, "two holders at once");
                let read = counter.load(Ordering::SeqCst);
                tokio::task::yield_now().await;
                counter.store(read + 1, Ordering::SeqCst);
                inside.fetch_sub(1, Ordering::SeqCst);
                guard.release().await.expect("release");
            }
        }));
    }
    for t in tasks {
        t.await.expect("task");
    }
    assert_eq!(counter.load(Ordering::SeqCst), TASKS * ROUNDS);
}

/// A `wait` that runs out gives `is_contended()` after about `wait`, naming the lock.
pub async fn wait_runs_out_is_contended(make: &impl Factory) {
    let m = manager(make).await;
    let _held = m.lock("busy").await.expect("first");
    let started = Instant::now();
    let err = m.lock("busy").wait(Duration::from_millis(300)).await.expect_err("held");
    let waited = started.elapsed();
    assert!(err.is_contended(), "{err}");
    assert!(err.to_string().contains("busy"), "message names the lock: {err}");
    assert!(waited >= Duration::from_millis(290), "gave up early: {waited:?}");
    assert!(waited < Duration::from_millis(2500), "gave up late: {waited:?}");
}

/// `try_lock` makes one attempt: `None` at once when held, `Some` when free.
pub async fn try_lock_makes_one_attempt(make: &impl Factory) {
    let m = make(builder().default_wait(Duration::from_secs(30))).await;
    let held = m.try_lock("once").await.expect("try").expect("free");
    let started = Instant::now();
    assert!(m.try_lock("once").await.expect("try").is_none());
    assert!(started.elapsed() < Duration::from_secs(5), "try_lock waited: {:?}", started.elapsed());
    held.release().await.expect("release");
    assert!(m.try_lock("once").await.expect("try").is_some());
}

/// A release wakes a waiter promptly (well before any lease would run out).
pub async fn release_wakes_waiter_promptly(make: &impl Factory) {
    let m = make(builder().default_lease(Duration::from_secs(30))).await;
    let held = m.lock("wake").await.expect("first");
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let m2 = m.clone();
    let waiter = tokio::spawn(async move {
        let _ = tx.send(());
        let guard = m2.lock("wake").wait(Duration::from_secs(20)).await.expect("waiter");
        (Instant::now(), guard.fencing_token())
    });
    rx.await.expect("waiter started");
    tokio::time::sleep(Duration::from_millis(50)).await; // let it reach the wait (not needed for correctness)
    let released_at = Instant::now();
    held.release().await.expect("release");
    let (acquired_at, _) = waiter.await.expect("waiter");
    let handoff = acquired_at.saturating_duration_since(released_at);
    assert!(handoff < Duration::from_secs(2), "hand-off took {handoff:?}");
}

/// Dropping a guard releases the lock.
pub async fn drop_releases(make: &impl Factory) {
    let m = make(builder().default_lease(Duration::from_secs(30))).await;
    let guard = m.lock("dropped").await.expect("first");
    drop(guard);
    let started = Instant::now();
    let again = m.lock("dropped").wait(Duration::from_secs(10)).await.expect("free after drop");
    assert!(started.elapsed() < Duration::from_secs(3), "took {:?}", started.elapsed());
    again.release().await.expect("release");
}

/// Aborting the task that holds the lock releases it without waiting for the lease.
pub async fn aborted_holder_releases(make: &impl Factory) {
    let m = make(builder().default_lease(Duration::from_secs(30))).await;
    let (tx, rx) = tokio::sync::oneshot::channel();
    let m2 = m.clone();
    let holder = tokio::spawn(async move {
        let _guard = m2.lock("aborted").await.expect("holder");
        let _ = tx.send(());
        std::future::pending::<()>().await;
    });
    rx.await.expect("holder has the lock");
    assert!(m.try_lock("aborted").await.expect("try").is_none(), "held while the task runs");
    holder.abort();
    let _ = holder.await;
    let started = Instant::now();
    let guard = m.lock("aborted").wait(Duration::from_secs(10)).await.expect("free after abort");
    assert!(started.elapsed() < Duration::from_secs(3), "took {:?}", started.elapsed());
    guard.release().await.expect("release");
}

/// A fixed lease that runs out hands the lock to the waiter and fires the holder's `lost()`.
pub async fn lease_expiry_hands_over_and_fires_lost(make: &impl Factory) {
    let m = manager(make).await;
    let lease = Duration::from_millis(400);
    let started = Instant::now();
    let holder = m.lock("expiring").lease(lease).await.expect("holder");
    let m2 = m.clone();
    let waiter = tokio::spawn(async move {
        let g = m2.lock("expiring").wait(Duration::from_secs(10)).await.expect("waiter");
        (Instant::now(), g)
    });
    tokio::time::timeout(Duration::from_secs(5), holder.lost()).await.expect("lost() fired");
    assert!(started.elapsed() >= lease - Duration::from_millis(50), "lost early: {:?}", started.elapsed());
    let (acquired_at, next) = waiter.await.expect("waiter");
    assert!(acquired_at.duration_since(started) >= lease - Duration::from_millis(50));
    assert!(next.fencing_token() > holder.fencing_token());
    let err = holder.release().await.expect_err("released after its lease");
    assert!(err.is_lost(), "{err}");
    next.release().await.expect("release");
}

/// Releasing after the lease ran out is `is_lost()`, even when nobody took the lock since.
pub async fn release_after_expiry_is_lost(make: &impl Factory) {
    let m = manager(make).await;
    let guard = m.lock("late").lease(Duration::from_millis(100)).await.expect("holder");
    guard.lost().await;
    assert!(guard.is_lost());
    let err = guard.release().await.expect_err("late release");
    assert!(err.is_lost(), "{err}");
    assert!(err.to_string().contains("late"), "{err}");
    // The lock is free for the next caller.
    m.lock("late").wait(Duration::from_secs(5)).await.expect("free").release().await.expect("release");
}

/// Fencing tokens strictly increase per name, across releases and holders.
pub async fn fencing_tokens_strictly_increase(make: &impl Factory) {
    let m = manager(make).await;
    let mut last = 0;
    for _ in 0..20 {
        let g = m.lock("fenced").await.expect("acquire");
        assert!(g.fencing_token() > last, "{} after {last}", g.fencing_token());
        last = g.fencing_token();
        g.release().await.expect("release");
    }
}

/// A waiter whose `wait` ran out is never handed the lock afterwards.
pub async fn timed_out_waiter_is_never_handed_the_lock(make: &impl Factory) {
    let m = manager(make).await;
    let held = m.lock("timed-out").await.expect("holder");
    let err = m.lock("timed-out").wait(Duration::from_millis(100)).await.expect_err("busy");
    assert!(err.is_contended());
    held.release().await.expect("release");
    // Had the lock been handed to the gone waiter, this would not get it.
    let next = m.lock("timed-out").wait(Duration::from_secs(5)).await.expect("free");
    next.release().await.expect("release");
    assert!(m.try_lock("timed-out").await.expect("try").is_some());
}

/// A waiter whose future is dropped is removed at once and never handed the lock.
pub async fn dropped_waiter_is_never_handed_the_lock(make: &impl Factory) {
    let m = manager(make).await;
    let held = m.lock("dropped-waiter").await.expect("holder");
    let waiting = m.lock("dropped-waiter").wait(Duration::from_secs(30));
    assert!(tokio::time::timeout(Duration::from_millis(100), waiting).await.is_err(), "still held");
    held.release().await.expect("release");
    let started = Instant::now();
    let next = m.lock("dropped-waiter").wait(Duration::from_secs(10)).await.expect("free");
    assert!(started.elapsed() < Duration::from_secs(3), "took {:?}", started.elapsed());
    next.release().await.expect("release");
}

/// Bad input is `is_invalid()`, never a panic.
pub async fn bad_input_is_invalid(make: &impl Factory) {
    let m = manager(make).await;
    let long = "x".repeat(lock_runtime::MAX_NAME_LEN + 1);
    let cases = [
        m.lock("").await.map(drop),
        m.lock(&long).await.map(drop),
        m.lock("nul\0").await.map(drop),
        m.lock("zero-lease").lease(Duration::ZERO).await.map(drop),
        m.lock("huge-lease").lease(Duration::from_secs(365 * 24 * 3600)).await.map(drop),
        m.lock("huge-wait").wait(Duration::from_secs(365 * 24 * 3600)).await.map(drop),
        m.lock("huge-retry").retry(u32::MAX).await.map(drop),
        m.try_lock("").await.map(drop),
    ];
    for (i, case) in cases.into_iter().enumerate() {
        let err = case.expect_err("bad input accepted");
        assert!(err.is_invalid(), "case {i}: {err}");
    }
    let tiny = make(builder().default_lease(Duration::from_millis(1))).await;
    assert!(tiny.lock("tiny-default-lease").await.expect_err("accepted").is_invalid());
}

/// `retry(0)` makes exactly one attempt even with a long `wait`.
pub async fn retry_budget_bounds_attempts(make: &impl Factory) {
    let m = manager(make).await;
    let held = m.lock("budget").await.expect("holder");
    let started = Instant::now();
    let err = m.lock("budget").wait(Duration::from_secs(20)).retry(0).await.expect_err("busy");
    assert!(err.is_contended(), "{err}");
    assert!(started.elapsed() < Duration::from_secs(5), "retry(0) waited {:?}", started.elapsed());
    held.release().await.expect("release");
}

/// Without a fixed lease, the watchdog keeps the lock past `default_lease` while the guard
/// lives, and the lock is never reported lost.
pub async fn watchdog_keeps_lock_past_default_lease(make: &impl Factory) {
    let m = make(builder().default_lease(Duration::from_millis(300))).await;
    let guard = m.lock("kept").await.expect("holder");
    tokio::select! {
        _ = guard.lost() => panic!("lost while the guard lives"),
        _ = tokio::time::sleep(Duration::from_millis(1200)) => {}
    }
    assert!(m.try_lock("kept").await.expect("try").is_none(), "still held after 4 leases");
    guard.release().await.expect("release");
    assert!(m.try_lock("kept").await.expect("try").is_some());
}

/// Locks on different names do not block each other.
pub async fn distinct_names_do_not_block(make: &impl Factory) {
    let m = manager(make).await;
    let a = m.lock("left").await.expect("a");
    let b = m.lock("right").wait(Duration::ZERO).await.expect("b");
    a.release().await.expect("a");
    b.release().await.expect("b");
}

/// The guard's key is the name as given, without the manager prefix.
pub async fn guard_reports_key_without_prefix(make: &impl Factory) {
    let m = manager(make).await;
    let g = m.lock("order:42").await.expect("acquire");
    assert_eq!(g.key(), "order:42");
    g.release().await.expect("release");
}
