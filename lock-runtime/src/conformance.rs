//! The backend conformance suite (feature `conformance`): written once, run against every
//! backend, this project's and yours.
//!
//! Each case is a plain async fn taking a [`Factory`]: an async closure that turns a
//! [`LockManagerBuilder`] (already carrying a unique prefix and any defaults the case needs)
//! into a manager on the backend under test. A failure panics with the property that broke,
//! as a test should. [`conformance_suite!`](crate::conformance_suite) generates one
//! `#[tokio::test]` per case (your crate needs `tokio` with the `macros` and `rt-multi-thread`
//! features among its dev-dependencies):
//!
//! ```ignore
//! // tests/conformance.rs of a crate with its own backend, `MyBackend`:
//! lock_runtime::conformance_suite!(|builder: lock_runtime::LockManagerBuilder| async move {
//!     builder.backend(MyBackend::connect("…").await.expect("backend"))
//! });
//! ```
//!
//! The kind cases run where the backend [`supports`](crate::backend::LockBackend::supports)
//! the kind and are skipped elsewhere. Name the kinds your backend offers with `kinds = [..]`
//! and one more case checks that it offers exactly those, so that a `supports` broken by
//! mistake cannot skip the kind cases unseen:
//!
//! ```ignore
//! use lock_runtime::backend::LockKind;
//! lock_runtime::conformance_suite!(
//!     |builder: lock_runtime::LockManagerBuilder| async move { builder.backend(MyBackend::new()) },
//!     kinds = [LockKind::Read, LockKind::Write]
//! );
//! ```
//!
//! Add `inspect = true` (or `false`) after the kinds to declare whether the backend can be
//! inspected ([`LockBackend::inspector`](crate::backend::LockBackend::inspector)): the election
//! cases that read the leader run where it can, and check the refusal where it cannot.
//!
//! Or call the cases yourself:
//!
//! ```
//! # #[tokio::main(flavor = "multi_thread", worker_threads = 2)] async fn main() {
//! let make = |builder: lock_runtime::LockManagerBuilder| async move { builder.memory() };
//! lock_runtime::conformance::mutual_exclusion(&make).await;
//! lock_runtime::conformance::cancelled_after_any_poll_leaves_nothing(&make).await;
//! # }
//! ```
//!
//! The cases rely only on the public API, and never on sleeps to learn something they can
//! observe; where the API has no signal for "this waiter is queued", a case waits until the
//! waiter stops being polled, and its assertions hold whether or not it was.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::future::{Future, IntoFuture};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use crate::{LockManager, LockManagerBuilder};

mod elections;
mod kinds;
pub use elections::*;
pub use kinds::*;

/// Builds a manager on the backend under test.
pub trait Factory: Fn(LockManagerBuilder) -> Self::Fut {
    /// The future that builds the manager.
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
    LockManager::builder().prefix(format!("t:{}:", crate::backend::OwnerId::next()))
}

async fn manager(make: &impl Factory) -> LockManager {
    make(builder()).await
}

/// Generates one `#[tokio::test]` per conformance case for the backend built by `$factory`.
#[macro_export]
macro_rules! conformance_suite {
    ($factory:expr, kinds = [$($kind:expr),* $(,)?], inspect = $inspect:expr) => {
        $crate::conformance_suite!($factory, kinds = [$($kind),*]);
        #[::tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn inspection_is_offered_as_declared() {
            $crate::conformance::inspection_is_offered_as_declared(&$factory, $inspect).await;
        }
    };
    ($factory:expr, kinds = [$($kind:expr),* $(,)?]) => {
        $crate::conformance_suite!($factory);
        #[::tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn supports_exactly_the_declared_kinds() {
            $crate::conformance::supports_exactly_the_declared_kinds(&$factory, &[$($kind),*]).await;
        }
    };
    ($factory:expr) => {
        $crate::conformance_suite!(@cases $factory;
            mutual_exclusion, wait_runs_out_is_contended, try_lock_makes_one_attempt,
            release_wakes_waiter_promptly, drop_releases, aborted_holder_releases,
            lease_expiry_hands_over_and_fires_lost, release_after_expiry_is_lost,
            fencing_tokens_strictly_increase, timed_out_waiter_is_never_handed_the_lock,
            dropped_waiter_is_never_handed_the_lock, bad_input_is_invalid,
            retry_budget_bounds_attempts, watchdog_keeps_lock_past_default_lease,
            distinct_names_do_not_block, guard_reports_key_without_prefix,
            cancelled_after_any_poll_leaves_nothing, cancelled_waiter_after_any_poll_leaves_nothing,
            woken_waiter_dropped_passes_the_lock_on, lease_of_a_holder_that_waited_counts_from_its_grant,
            hold_at_least_keeps_the_name_taken_after_an_early_release, release_after_hold_at_least_frees_at_once,
            dropped_guard_honours_hold_at_least, hold_at_least_outlasts_a_shorter_watchdog_lease);
        // Lock kinds (`conformance/kinds.rs`): `lock_all` on every backend; read-write locks
        // and semaphores where the backend supports them (skipped otherwise).
        $crate::conformance_suite!(@cases $factory;
            lock_all_takes_every_name_or_none, lock_all_in_both_orders_never_deadlocks_nor_overlaps,
            lock_all_cancelled_after_any_poll_rolls_back, lock_all_is_lost_if_one_is_lost,
            unsupported_kinds_are_refused_at_once, kinds_have_their_own_namespace, readers_overlap,
            writer_excludes_everyone, no_writer_starvation_under_read_load, dropped_waiting_writer_lets_readers_in,
            read_lease_expiry_lets_a_writer_in, write_inside_read_is_invalid_at_once,
            semaphore_admits_at_most_permits, semaphore_permits_mismatch_is_invalid,
            kind_waiter_cancelled_after_any_poll_leaves_nothing,
            semaphore_waiter_cancelled_after_any_poll_leaves_nothing, kinds_are_listed_with_each_holder);
        // Leader election (`conformance/elections.rs`): on every backend; the cases that read
        // the leader check that a store without inspection refuses.
        $crate::conformance_suite!(@cases $factory;
            campaign_resign_and_succession_in_order, bounded_campaign_is_contended,
            observe_sees_every_change, lead_campaigns_again_after_a_loss,
            cancelled_campaign_after_any_poll_leaves_nothing, dropped_leadership_resigns);
    };
    (@cases $factory:expr; $($case:ident),* $(,)?) => {
        $(
            #[::tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $case() {
                $crate::conformance::$case(&$factory).await;
            }
        )*
    };
}

/// The backend offers the mutex and exactly the `declared` kinds besides (a semaphore of any
/// `permits` stands for semaphores): the kind cases of the others are skipped, so a `supports`
/// broken by mistake would otherwise go unseen.
pub async fn supports_exactly_the_declared_kinds(make: &impl Factory, declared: &[crate::backend::LockKind]) {
    use crate::backend::LockKind;
    let m = manager(make).await;
    let same = |a: &LockKind, b: &LockKind| std::mem::discriminant(a) == std::mem::discriminant(b);
    for kind in [LockKind::Exclusive, LockKind::Read, LockKind::Write, LockKind::Semaphore { permits: 3 }] {
        let expected = kind == LockKind::Exclusive || declared.iter().any(|d| same(d, &kind));
        assert_eq!(
            m.supports(kind),
            expected,
            "the {} backend {} a {kind}, but its suite declares {declared:?}",
            m.backend_name(),
            if expected { "does not offer" } else { "offers" }
        );
    }
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
    let long = "x".repeat(crate::MAX_NAME_LEN + 1);
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

// ---------------------------------------------------------------------------------------------
// Cancellation at every await point of an acquisition, and hand-off past a waiter that left.

/// How long a waiter's future may go unpolled before the cases take it to be parked in its
/// wait (queued behind the holder). Only an assumption about speed, never about correctness:
/// every assertion below holds whether or not the waiter was parked yet.
const PARKED: Duration = Duration::from_millis(300);

/// A future driven by hand: polled only when woken, and dropped by [`Polled::drop_now`] or
/// [`Polled::arm`] (dropped at its next wake-up, without being polled again).
struct Polled<F: Future> {
    fut: Option<Pin<Box<F>>>,
    polls: Arc<AtomicUsize>,
    armed: Arc<AtomicBool>,
}

impl<F: Future> Polled<F> {
    fn new(fut: F) -> Self {
        Polled { fut: Some(Box::pin(fut)), polls: Arc::default(), armed: Arc::default() }
    }
}

/// What a [`Polled`] future gave.
enum Driven<T> {
    /// The inner future completed.
    Done(T),
    /// It was dropped unfinished.
    Dropped,
}

impl<F: Future> Future for Polled<F> {
    type Output = Driven<F::Output>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        if self.armed.load(Ordering::SeqCst) {
            self.fut = None; // dropped at this wake-up, without another poll
            return Poll::Ready(Driven::Dropped);
        }
        self.polls.fetch_add(1, Ordering::SeqCst);
        let Some(fut) = self.fut.as_mut() else { return Poll::Ready(Driven::Dropped) };
        match fut.as_mut().poll(cx) {
            Poll::Ready(out) => {
                self.fut = None;
                Poll::Ready(Driven::Done(out))
            }
            Poll::Pending => Poll::Pending,
        }
    }
}

/// Polls `fut` until it completes or has been polled `polls` times (each poll after the first
/// made only once it woke up); then drops it. Returns its output if it completed, and whether
/// it went [`PARKED`] without a wake-up before that.
async fn poll_then_drop<F: Future>(fut: F, polls: usize) -> (Option<F::Output>, bool) {
    struct Wakeup(tokio::sync::Notify);
    impl std::task::Wake for Wakeup {
        fn wake(self: Arc<Self>) {
            self.0.notify_one();
        }
        fn wake_by_ref(self: &Arc<Self>) {
            self.0.notify_one();
        }
    }
    let wakeup = Arc::new(Wakeup(tokio::sync::Notify::new()));
    let waker = std::task::Waker::from(wakeup.clone());
    let mut fut = Box::pin(fut);
    for polled in 1..=polls {
        if let Poll::Ready(out) = fut.as_mut().poll(&mut Context::from_waker(&waker)) {
            return (Some(out), false);
        }
        if polled < polls && tokio::time::timeout(PARKED, wakeup.0.notified()).await.is_err() {
            return (None, true); // parked in its wait: more polls would find nothing new
        }
    }
    (None, false)
}

/// Waits until a spawned [`Polled`] future has not been polled for [`PARKED`].
async fn until_parked(polls: &AtomicUsize) {
    let mut seen = polls.load(Ordering::SeqCst);
    loop {
        tokio::time::sleep(PARKED).await;
        let now = polls.load(Ordering::SeqCst);
        if now == seen {
            return;
        }
        seen = now;
    }
}

/// An acquisition of a free lock whose future is dropped after its first, second, … poll
/// (every await point of the acquisition: a request in flight, a reply being read) leaves
/// nothing behind: the next `lock()` gets the lock at once, not after a lease.
pub async fn cancelled_after_any_poll_leaves_nothing(make: &impl Factory) {
    let m = make(builder().default_lease(Duration::from_secs(30))).await;
    for polls in 1..=64 {
        let (got, _) = poll_then_drop(m.lock("cancelled").wait(Duration::from_secs(5)).into_future(), polls).await;
        if let Some(got) = got {
            got.expect("free").release().await.expect("release");
            return; // every await point before completion was cut once
        }
        let started = Instant::now();
        let next =
            m.lock("cancelled").wait(Duration::from_secs(10)).await.unwrap_or_else(|e| {
                panic!("after dropping the acquisition at poll {polls}, the lock stayed taken: {e}")
            });
        assert!(
            started.elapsed() < Duration::from_secs(2),
            "after dropping the acquisition at poll {polls}, the next lock took {:?}",
            started.elapsed()
        );
        next.release().await.expect("release");
    }
    panic!("an uncontended acquisition was still pending after 64 polls");
}

/// A waiter whose future is dropped after any of its polls leaves nothing behind: when the
/// holder releases, the next caller gets the lock at once.
pub async fn cancelled_waiter_after_any_poll_leaves_nothing(make: &impl Factory) {
    let m = make(builder().default_lease(Duration::from_secs(30))).await;
    let mut held = m.lock("cancelled-waiter").await.expect("holder");
    for polls in 1..=64 {
        let waiter = m.lock("cancelled-waiter").wait(Duration::from_secs(20)).into_future();
        let (got, parked) = poll_then_drop(waiter, polls).await;
        assert!(got.is_none(), "a waiter got a held lock (poll {polls})");
        let released_at = Instant::now();
        held.release().await.expect("release");
        held =
            m.lock("cancelled-waiter").wait(Duration::from_secs(10)).await.unwrap_or_else(|e| {
                panic!("after dropping a waiter at poll {polls}, the released lock stayed taken: {e}")
            });
        assert!(
            released_at.elapsed() < Duration::from_secs(2),
            "after dropping a waiter at poll {polls}, the next lock took {:?}",
            released_at.elapsed()
        );
        if parked {
            held.release().await.expect("release");
            return; // it reached its wait: every await point before it was cut once
        }
    }
    panic!("a waiter was still being polled after 64 polls without parking");
}

/// `manager.lock(name)` with a long wait, owning its manager (to be spawned).
async fn lock_owned(m: LockManager, name: &'static str) -> Result<crate::LockGuard, crate::LockError> {
    m.lock(name).wait(Duration::from_secs(20)).await
}

/// A waiter that is woken by the release and dropped before it acts on the wake-up (a web
/// client that disconnects just then) passes the lock on: the next waiter gets it at once.
pub async fn woken_waiter_dropped_passes_the_lock_on(make: &impl Factory) {
    let m = make(builder().default_lease(Duration::from_secs(30))).await;
    let held = m.lock("woken").await.expect("holder");

    let first = Polled::new(lock_owned(m.clone(), "woken"));
    let (first_polls, first_armed) = (first.polls.clone(), first.armed.clone());
    let first = tokio::spawn(first);
    until_parked(&first_polls).await;

    let second = Polled::new(lock_owned(m.clone(), "woken"));
    let second_polls = second.polls.clone();
    let second = tokio::spawn(second);
    until_parked(&second_polls).await;

    first_armed.store(true, Ordering::SeqCst); // dropped at its next wake-up: the release
    let released_at = Instant::now();
    held.release().await.expect("release");
    let first = first.await.expect("first waiter");
    assert!(matches!(first, Driven::Dropped), "the first waiter was not dropped");
    let second = tokio::time::timeout(Duration::from_secs(10), second).await.expect("second waiter woken");
    let Driven::Done(Ok(guard)) = second.expect("second waiter") else { panic!("the second waiter got no lock") };
    assert!(
        released_at.elapsed() < Duration::from_secs(2),
        "the hand-off past a dropped waiter took {:?}",
        released_at.elapsed()
    );
    guard.release().await.expect("release");
}

/// A holder that waited for its lock counts its fixed lease from its grant, and nobody takes
/// the lock from it before that lease is over (nor before its `lost()` fires).
pub async fn lease_of_a_holder_that_waited_counts_from_its_grant(make: &impl Factory) {
    let m = make(builder().default_lease(Duration::from_secs(30))).await;
    let lease = Duration::from_secs(2);
    let first = m.lock("waited").await.expect("first holder");
    let m2 = m.clone();
    let second = tokio::spawn(async move {
        let guard = m2.lock("waited").wait(Duration::from_secs(20)).lease(lease).await.expect("second holder");
        let granted = Instant::now();
        guard.lost().await;
        (granted, Instant::now(), guard)
    });
    // The second holder waits this long before its grant (a condition, not a synchronisation).
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let m3 = m.clone();
    let third = tokio::spawn(async move {
        let guard = m3.lock("waited").wait(Duration::from_secs(20)).await.expect("third holder");
        (Instant::now(), guard)
    });
    tokio::time::sleep(Duration::from_millis(100)).await; // the third queues behind the second
    first.release().await.expect("release");
    let (granted, lost_at, second) = second.await.expect("second");
    let (third_at, third) = third.await.expect("third");
    assert!(
        third_at >= granted + lease - Duration::from_millis(50),
        "the lock was taken {:?} after a grant with a {lease:?} lease",
        third_at.duration_since(granted)
    );
    assert!(lost_at <= third_at + Duration::from_millis(5), "the lock was taken before the holder's lost() fired");
    assert!(third.fencing_token() > second.fencing_token());
    third.release().await.expect("release");
}

/// `hold_at_least`: a holder released before it keeps the name taken until `hold` after its
/// grant (an attempt in between fails); a waiter that was queued before the release (and was
/// told the holder's long lease) is granted when the remainder ends: not earlier, not much later.
pub async fn hold_at_least_keeps_the_name_taken_after_an_early_release(make: &impl Factory) {
    let m = make(builder().default_lease(Duration::from_secs(30))).await;
    let hold = Duration::from_millis(1500);
    let too_long = m.lock("hold").lease(Duration::from_secs(1)).hold_at_least(Duration::from_secs(2)).await;
    assert!(too_long.unwrap_err().is_invalid(), "hold_at_least longer than the fixed lease is refused");
    let before = Instant::now();
    let guard = m.lock("hold").hold_at_least(hold).wait(Duration::ZERO).await.expect("first holder");
    let m2 = m.clone();
    let polled = Polled::new(async move {
        let guard = m2.lock("hold").wait(Duration::from_secs(20)).await.expect("waiter");
        (Instant::now(), guard)
    });
    let polls = polled.polls.clone();
    let waiter = tokio::spawn(polled);
    until_parked(&polls).await; // queued behind a holder whose lease is 30 s
    guard.release().await.expect("an early release with hold_at_least is a release");
    let released_at = Instant::now();
    assert!(released_at < before + hold, "the test took too long to check anything");
    let m3 = m.clone();
    let other = tokio::spawn(async move { m3.try_lock("hold").await.expect("try").is_some() });
    let attempted_at = Instant::now();
    let took = other.await.expect("try_lock");
    if attempted_at + Duration::from_millis(100) < before + hold {
        assert!(
            !took,
            "the name was free {:?} after the grant, before hold_at_least ({hold:?})",
            attempted_at - before
        );
    }
    let Driven::Done((granted_at, next)) = waiter.await.expect("waiter") else { panic!("the waiter was dropped") };
    assert!(
        granted_at >= before + hold,
        "the waiter was granted {:?} after the first grant, before hold_at_least ({hold:?})",
        granted_at - before
    );
    let late = granted_at - (before + hold);
    assert!(late < Duration::from_millis(750), "the waiter was granted {late:?} after the remainder ended");
    next.release().await.expect("release");
}

/// A release after `hold_at_least` has passed frees the name at once.
pub async fn release_after_hold_at_least_frees_at_once(make: &impl Factory) {
    let m = make(builder().default_lease(Duration::from_secs(30))).await;
    let guard = m.lock("held-long").hold_at_least(Duration::from_millis(100)).await.expect("holder");
    tokio::time::sleep(Duration::from_millis(150)).await;
    guard.release().await.expect("release");
    assert!(m.try_lock("held-long").await.expect("try").is_some(), "the name is free at once");
}

/// Dropping a guard before `hold_at_least` has passed keeps the name taken for the rest of it.
pub async fn dropped_guard_honours_hold_at_least(make: &impl Factory) {
    let m = make(builder().default_lease(Duration::from_secs(30))).await;
    let hold = Duration::from_millis(1000);
    let before = Instant::now();
    let guard = m.lock("dropped").hold_at_least(hold).await.expect("holder");
    drop(guard);
    tokio::time::sleep(Duration::from_millis(200)).await; // the background release runs
    let took = m.try_lock("dropped").await.expect("try").is_some();
    if Instant::now() + Duration::from_millis(100) < before + hold {
        assert!(!took, "a dropped guard freed the name before hold_at_least");
    }
    let guard = m.lock("dropped").wait(Duration::from_secs(10)).await.expect("taken once the hold is over");
    assert!(Instant::now() >= before + hold, "granted {:?} after the first grant", before.elapsed());
    guard.release().await.expect("release");
}

/// `hold_at_least` longer than the watchdog lease: once released, the watchdog stops renewing,
/// and the name still stays taken for the whole remainder (not only the lease's rest).
pub async fn hold_at_least_outlasts_a_shorter_watchdog_lease(make: &impl Factory) {
    let m = make(builder().default_lease(Duration::from_millis(300))).await;
    let hold = Duration::from_millis(1500);
    let before = Instant::now();
    let guard = m.lock("outlast").hold_at_least(hold).await.expect("holder");
    guard.release().await.expect("release");
    tokio::time::sleep(Duration::from_millis(700)).await; // past the 300 ms lease
    let took = m.try_lock("outlast").await.expect("try").is_some();
    if Instant::now() + Duration::from_millis(100) < before + hold {
        assert!(!took, "the name was freed when the watchdog lease ran out, before hold_at_least");
    }
    let guard = m.lock("outlast").wait(Duration::from_secs(10)).await.expect("taken once the hold is over");
    assert!(Instant::now() >= before + hold, "granted {:?} after the first grant", before.elapsed());
    guard.release().await.expect("release");
}
