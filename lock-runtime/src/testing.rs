#![doc = include_str!("testing.md")]

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use tokio::sync::watch;

use crate::backend::memory::MemoryBackend;
use crate::backend::{Acquire, Acquisition, Attempt, BoxFuture, Grant, Held, HeldLock, LockBackend, Renewal, Wake};
use crate::error::LockError;
use crate::lost::LostSignal;

/// Why a lock taken away by [`TestBackend::lose`] was lost, as its guard reports it.
const TAKEN_AWAY: &str = "it was taken away by `testing::TestBackend::lose`";

/// A [`LockBackend`] for tests: wraps a backend (the in-process one by default) and lets the
/// test make names busy, attempts fail and held locks lost, deterministically.
///
/// Build a manager on a clone and keep the other to drive it (clones share one state):
///
/// ```
/// use lock_runtime::{testing::TestBackend, LockManager};
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() -> Result<(), lock_runtime::LockError> {
/// let backend = TestBackend::new();
/// let manager = LockManager::builder().backend(backend.clone());
/// let _other = backend.hold("job");
/// assert!(manager.try_lock("job").await?.is_none()); // busy
/// assert_eq!(backend.attempts("job"), 1);
/// # Ok(()) }
/// ```
///
/// It is transparent otherwise: every acquisition goes to the wrapped backend, and its
/// [`name`](LockBackend::name) and [`operation_timeout`](LockBackend::operation_timeout) are
/// the wrapped backend's (so error messages name the real store). Two things differ, on
/// purpose: every acquisition goes through [`begin`](LockBackend::begin) (no synchronous fast
/// path, so that each guard has a [`LostSignal`] that [`lose`](TestBackend::lose) can fire), and
/// a wait ends at its deadline on tokio's clock (see the [module docs](self#time)).
///
/// Names are the names as the code under test writes them (without the manager's prefix), for
/// every manager built on the wrapper.
#[derive(Clone)]
pub struct TestBackend {
    shared: Arc<Shared>,
}

struct Shared {
    inner: Arc<dyn LockBackend>,
    state: Mutex<State>,
    /// Bumped whenever a [`Holding`] is taken or let go: waiters on a held name watch it.
    holdings: watch::Sender<u64>,
}

#[derive(Default)]
struct State {
    names: HashMap<Arc<str>, Name>,
    /// Attempts, of any name, still to fail.
    fail_any: u32,
}

/// What the wrapper knows of one name. Kept for the life of the wrapper (it is for tests).
#[derive(Default)]
struct Name {
    /// Live [`Holding`]s of the name.
    holdings: usize,
    /// Attempts on the name still to fail.
    fail: u32,
    attempts: u64,
    grants: u64,
    /// Acquisitions waiting for the name right now.
    waiting: usize,
    /// The locks of the name granted through the wrapper and not released yet.
    held: Vec<Arc<Granted>>,
}

/// A lock granted through the wrapper, shared by its [`TestHeld`] and the wrapper's state.
struct Granted {
    name: Arc<str>,
    lost: LostSignal,
    /// The wrapped backend's lock; `None` once released, or taken away by `lose`.
    lock: Mutex<Option<Held>>,
}

impl Granted {
    fn taken_away(&self) -> LockError {
        LockError::lost(&*self.name, TAKEN_AWAY)
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Default for TestBackend {
    fn default() -> Self {
        Self::new()
    }
}

impl fmt::Debug for TestBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = self.shared.state();
        let held = state.names.values().filter(|n| !n.held.is_empty()).count();
        let holdings = state.names.values().filter(|n| n.holdings > 0).count();
        f.debug_struct("TestBackend")
            .field("inner", &self.shared.inner.name())
            .field("held", &held)
            .field("holdings", &holdings)
            .finish_non_exhaustive()
    }
}

impl TestBackend {
    /// A wrapper around a fresh in-process store ([`MemoryBackend`]).
    ///
    /// ```
    /// let backend = lock_runtime::testing::TestBackend::new();
    /// let manager = lock_runtime::LockManager::builder().backend(backend.clone());
    /// assert_eq!(manager.backend_name(), "memory"); // the wrapped backend's kind
    /// ```
    pub fn new() -> Self {
        Self::wrap(MemoryBackend::new())
    }

    /// A wrapper around `inner`, any backend (your own, or Redis in an integration test).
    ///
    /// ```
    /// use lock_runtime::{backend::memory::MemoryBackend, testing::TestBackend};
    ///
    /// let store = MemoryBackend::new();
    /// let backend = TestBackend::wrap(store.clone());
    /// # let _ = backend;
    /// ```
    pub fn wrap(inner: impl LockBackend) -> Self {
        Self::wrap_arc(Arc::new(inner))
    }

    /// A wrapper around a shared backend.
    ///
    /// ```
    /// use std::sync::Arc;
    /// use lock_runtime::{backend::{memory::MemoryBackend, LockBackend}, testing::TestBackend};
    ///
    /// let shared: Arc<dyn LockBackend> = Arc::new(MemoryBackend::new());
    /// let backend = TestBackend::wrap_arc(shared.clone());
    /// # let _ = backend;
    /// ```
    pub fn wrap_arc(inner: Arc<dyn LockBackend>) -> Self {
        TestBackend {
            shared: Arc::new(Shared { inner, state: Mutex::new(State::default()), holdings: watch::Sender::new(0) }),
        }
    }

    /// Holds `name` as "someone else" until the returned [`Holding`] is released or dropped:
    /// meanwhile every attempt on the name finds it busy, and waiters wait. Letting it go
    /// wakes them at once (an event, no polling).
    ///
    /// A holding does not take the name away from a guard that holds it already (use
    /// [`lose`](Self::lose) for that); it makes every later attempt find the name busy.
    /// Holdings of one name add up: the name is free once all are let go.
    ///
    /// ```
    /// use std::time::Duration;
    /// use lock_runtime::{testing::TestBackend, LockManager};
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() -> Result<(), lock_runtime::LockError> {
    /// let backend = TestBackend::new();
    /// let manager = LockManager::builder().backend(backend.clone());
    /// let other = backend.hold("job");
    /// let err = manager.lock("job").wait(Duration::from_secs(5)).await.unwrap_err();
    /// assert!(err.is_contended()); // after 5 s of virtual time
    /// other.release();
    /// assert!(manager.try_lock("job").await?.is_some());
    /// # Ok(()) }
    /// ```
    pub fn hold(&self, name: impl AsRef<str>) -> Holding {
        let name: Arc<str> = Arc::from(name.as_ref());
        self.shared.state().name(&name).holdings += 1;
        self.shared.holdings_changed();
        Holding { shared: self.shared.clone(), name }
    }

    /// Fails the next `n` acquisition attempts, of any name, as a backend outage: each gives
    /// an [`is_backend`](LockError::is_backend) error. A lock call makes one attempt first, so
    /// the next `n` lock calls fail. Adds to the failures still pending.
    ///
    /// ```
    /// use lock_runtime::{testing::TestBackend, LockManager};
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() -> Result<(), lock_runtime::LockError> {
    /// let backend = TestBackend::new();
    /// let manager = LockManager::builder().backend(backend.clone());
    /// backend.fail_next(1);
    /// assert!(manager.lock("job").await.unwrap_err().is_backend());
    /// manager.lock("job").await?; // the outage is over
    /// # Ok(()) }
    /// ```
    pub fn fail_next(&self, n: u32) {
        let mut state = self.shared.state();
        state.fail_any = state.fail_any.saturating_add(n);
    }

    /// Fails the next `n` acquisition attempts on `name` as a backend outage (other names are
    /// not affected); taken before the failures of [`fail_next`](Self::fail_next).
    ///
    /// ```
    /// use lock_runtime::{testing::TestBackend, LockManager};
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() -> Result<(), lock_runtime::LockError> {
    /// let backend = TestBackend::new();
    /// let manager = LockManager::builder().backend(backend.clone());
    /// backend.fail_next_for("job", 2);
    /// manager.lock("other").await?;
    /// assert!(manager.lock("job").await.unwrap_err().is_backend());
    /// assert!(manager.lock("job").await.unwrap_err().is_backend());
    /// manager.lock("job").await?;
    /// # Ok(()) }
    /// ```
    pub fn fail_next_for(&self, name: impl AsRef<str>, n: u32) {
        let name: Arc<str> = Arc::from(name.as_ref());
        let mut state = self.shared.state();
        let entry = state.name(&name);
        entry.fail = entry.fail.saturating_add(n);
    }

    /// Takes away the locks of `name` held through the wrapper, as a lost lease or session
    /// would: frees the name in the wrapped backend, then fires each holder's loss, so its
    /// guard's [`lost()`](crate::LockGuard::lost) completes, [`is_lost()`](crate::LockGuard::is_lost)
    /// is true, its release reports [`is_lost`](LockError::is_lost), and a locked call
    /// running under it is stopped with the lost error. Returns whether a held lock was found.
    ///
    /// ```
    /// use lock_runtime::{testing::TestBackend, LockManager};
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() -> Result<(), lock_runtime::LockError> {
    /// let backend = TestBackend::new();
    /// let manager = LockManager::builder().backend(backend.clone());
    /// let guard = manager.lock("job").await?;
    /// assert!(backend.lose("job").await);
    /// guard.lost().await; // completes at once
    /// assert!(guard.is_lost());
    /// assert!(manager.try_lock("job").await?.is_some()); // the name is free
    /// assert!(guard.release().await.unwrap_err().is_lost());
    /// # Ok(()) }
    /// ```
    pub async fn lose(&self, name: impl AsRef<str>) -> bool {
        let taken = self.shared.state().names.get_mut(name.as_ref()).map(|n| std::mem::take(&mut n.held));
        let taken = taken.unwrap_or_default();
        for granted in &taken {
            let held = lock(&granted.lock).take();
            if let Some(mut held) = held {
                let released = match held.release_now() {
                    Some(released) => released,
                    None => {
                        let (bound, kind) = (self.shared.inner.operation_timeout(), self.shared.inner.name());
                        crate::bounded::bounded(bound, held.release())
                            .await
                            .unwrap_or_else(|| Err(LockError::timed_out(&*granted.name, kind, "release", bound)))
                    }
                };
                if let Err(e) = released {
                    tracing::debug!(lock = %crate::telemetry::shown_name(&granted.name), error = %crate::telemetry::shown_error(&e), "testing: freeing a lock taken away failed");
                }
            }
            granted.lost.fire(TAKEN_AWAY);
        }
        !taken.is_empty()
    }

    /// How many acquisition attempts reached the wrapper for `name` (failed, busy or granted).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() -> Result<(), lock_runtime::LockError> {
    /// # let backend = lock_runtime::testing::TestBackend::new();
    /// # let manager = lock_runtime::LockManager::builder().backend(backend.clone());
    /// let _held = manager.lock("job").await?;
    /// assert!(manager.try_lock("job").await?.is_none());
    /// assert_eq!(backend.attempts("job"), 2);
    /// # Ok(()) }
    /// ```
    pub fn attempts(&self, name: impl AsRef<str>) -> u64 {
        self.shared.state().names.get(name.as_ref()).map_or(0, |n| n.attempts)
    }

    /// How many times `name` was granted through the wrapper.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() -> Result<(), lock_runtime::LockError> {
    /// # let backend = lock_runtime::testing::TestBackend::new();
    /// # let manager = lock_runtime::LockManager::builder().backend(backend.clone());
    /// manager.lock("job").await?.release().await?;
    /// manager.lock("job").await?.release().await?;
    /// assert_eq!(backend.grants("job"), 2);
    /// # Ok(()) }
    /// ```
    pub fn grants(&self, name: impl AsRef<str>) -> u64 {
        self.shared.state().names.get(name.as_ref()).map_or(0, |n| n.grants)
    }

    /// How many acquisitions wait for `name` right now (to let go of a [`Holding`] only once a
    /// waiter is queued).
    ///
    /// ```
    /// use std::time::Duration;
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() -> Result<(), lock_runtime::LockError> {
    /// # let backend = lock_runtime::testing::TestBackend::new();
    /// # let manager = lock_runtime::LockManager::builder().backend(backend.clone());
    /// let other = backend.hold("job");
    /// let waiter = tokio::spawn(async move { manager.lock("job").wait(Duration::from_secs(9)).await.map(drop) });
    /// while backend.waiting("job") == 0 {
    ///     tokio::task::yield_now().await;
    /// }
    /// other.release();
    /// waiter.await.expect("task")?;
    /// assert_eq!(backend.waiting("job"), 0);
    /// # Ok(()) }
    /// ```
    pub fn waiting(&self, name: impl AsRef<str>) -> usize {
        self.shared.state().names.get(name.as_ref()).map_or(0, |n| n.waiting)
    }

    /// Whether a guard holds `name` through the wrapper (a [`Holding`] does not count).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() -> Result<(), lock_runtime::LockError> {
    /// # let backend = lock_runtime::testing::TestBackend::new();
    /// # let manager = lock_runtime::LockManager::builder().backend(backend.clone());
    /// let guard = manager.lock("job").await?;
    /// assert!(backend.is_held("job"));
    /// guard.release().await?;
    /// assert!(!backend.is_held("job"));
    /// # Ok(()) }
    /// ```
    pub fn is_held(&self, name: impl AsRef<str>) -> bool {
        self.shared.state().names.get(name.as_ref()).is_some_and(|n| !n.held.is_empty())
    }
}

impl State {
    fn name(&mut self, name: &Arc<str>) -> &mut Name {
        self.names.entry(name.clone()).or_default()
    }
}

/// What the wrapper makes of an attempt before the wrapped backend sees it.
enum Verdict {
    /// An injected outage.
    Fail,
    /// A [`Holding`] holds the name.
    Busy,
    /// Up to the wrapped backend.
    Pass,
}

impl Shared {
    fn state(&self) -> MutexGuard<'_, State> {
        lock(&self.state)
    }

    fn holdings_changed(&self) {
        self.holdings.send_modify(|generation| *generation = generation.wrapping_add(1));
    }

    fn is_holding(&self, name: &str) -> bool {
        self.state().names.get(name).is_some_and(|n| n.holdings > 0)
    }

    /// Counts an attempt on `name` and says what becomes of it.
    fn verdict(&self, name: &Arc<str>) -> Verdict {
        let mut state = self.state();
        let State { names, fail_any } = &mut *state;
        let entry = names.entry(name.clone()).or_default();
        entry.attempts += 1;
        if entry.fail > 0 {
            entry.fail -= 1;
            Verdict::Fail
        } else if *fail_any > 0 {
            *fail_any -= 1;
            Verdict::Fail
        } else if entry.holdings > 0 {
            Verdict::Busy
        } else {
            Verdict::Pass
        }
    }

    fn outage(&self, name: &str) -> LockError {
        LockError::backend(
            name,
            self.inner.name(),
            "acquire",
            "an outage injected by `testing::TestBackend::fail_next` (or `fail_next_for`)",
        )
    }

    /// Wraps a grant of the wrapped backend, and registers it under its name.
    fn granted(self: &Arc<Self>, name: &Arc<str>, lost: &LostSignal, grant: Grant) -> Grant {
        let Grant { fencing_token, granted_at, lock } = grant;
        let granted = Arc::new(Granted { name: name.clone(), lost: lost.clone(), lock: Mutex::new(Some(lock)) });
        {
            let mut state = self.state();
            let entry = state.name(name);
            entry.grants += 1;
            entry.held.push(granted.clone());
        }
        Grant { fencing_token, granted_at, lock: Held::new(TestHeld { shared: self.clone(), granted }) }
    }

    /// Unregisters a lock released (or dropped).
    fn forget(&self, granted: &Arc<Granted>) {
        if let Some(entry) = self.state().names.get_mut(&*granted.name) {
            entry.held.retain(|g| !Arc::ptr_eq(g, granted));
        }
    }
}

impl LockBackend for TestBackend {
    /// The wrapped backend's kind.
    fn name(&self) -> &'static str {
        self.shared.inner.name()
    }

    /// The wrapped backend's kinds.
    fn supports(&self, kind: crate::backend::LockKind) -> bool {
        self.shared.inner.supports(kind)
    }

    fn begin(&self, req: Acquire, lost: LostSignal) -> Box<dyn Acquisition> {
        let name = req.name.clone();
        let inner = self.shared.inner.begin(req, lost.clone());
        Box::new(TestAcquisition { shared: self.shared.clone(), name, lost, inner })
    }

    // No `try_acquire_now`: every acquisition goes through `begin`, so that its guard has a
    // `LostSignal` that `lose` can fire.

    fn operation_timeout(&self) -> Duration {
        self.shared.inner.operation_timeout()
    }

    /// The wrapped backend's inspection (what a store tells is unchanged by the wrapper).
    fn inspector(&self) -> Option<&dyn crate::backend::Inspect> {
        self.shared.inner.inspector()
    }
}

/// One acquisition through the wrapper: the wrapped backend's, with faults injected.
struct TestAcquisition {
    shared: Arc<Shared>,
    name: Arc<str>,
    lost: LostSignal,
    inner: Box<dyn Acquisition>,
}

impl TestAcquisition {
    async fn attempt_once(&mut self) -> Result<Attempt, LockError> {
        match self.shared.verdict(&self.name) {
            Verdict::Fail => return Err(self.shared.outage(&self.name)),
            Verdict::Busy => return Ok(Attempt::Busy),
            Verdict::Pass => {}
        }
        Ok(match self.inner.attempt().await? {
            Attempt::Acquired(grant) => Attempt::Acquired(self.shared.granted(&self.name, &self.lost, grant)),
            refused => refused,
        })
    }

    async fn wait_until(&mut self, deadline: Instant) -> Result<Wake, LockError> {
        // The runtime's deadlines are on tokio's clock (a paused one in tests).
        let timer = tokio::time::sleep_until(deadline.into());
        tokio::pin!(timer);
        let _waiting = Waiting::new(&self.shared, &self.name);
        // Subscribed before the name is looked at: a change after the look is not missed.
        let mut holdings = self.shared.holdings.subscribe();
        if self.shared.is_holding(&self.name) {
            while self.shared.is_holding(&self.name) {
                tokio::select! {
                    biased;
                    () = &mut timer => return Ok(Wake::TimedOut),
                    changed = holdings.changed() => {
                        if changed.is_err() {
                            break; // not reached: the wrapper keeps the sender
                        }
                    }
                }
            }
            return Ok(Wake::Retry); // let go: the runtime attempts again
        }
        let shared = &self.shared;
        let name = &self.name;
        let held_again = async {
            while holdings.changed().await.is_ok() {
                if shared.is_holding(name) {
                    return;
                }
            }
            std::future::pending().await
        };
        tokio::select! {
            biased;
            () = &mut timer => Ok(Wake::TimedOut),
            woke = self.inner.wait(deadline) => Ok(match woke? {
                Wake::Acquired(grant) => Wake::Acquired(shared.granted(name, &self.lost, grant)),
                other => other,
            }),
            () = held_again => Ok(Wake::Retry), // a holding came first: attempt (and wait) again
        }
    }
}

impl Acquisition for TestAcquisition {
    fn attempt(&mut self) -> BoxFuture<'_, Result<Attempt, LockError>> {
        Box::pin(self.attempt_once())
    }

    fn wait(&mut self, deadline: Instant) -> BoxFuture<'_, Result<Wake, LockError>> {
        Box::pin(self.wait_until(deadline))
    }
}

/// Counts an acquisition as waiting for its name while it lives.
struct Waiting {
    shared: Arc<Shared>,
    name: Arc<str>,
}

impl Waiting {
    fn new(shared: &Arc<Shared>, name: &Arc<str>) -> Self {
        shared.state().name(name).waiting += 1;
        Waiting { shared: shared.clone(), name: name.clone() }
    }
}

impl Drop for Waiting {
    fn drop(&mut self) {
        if let Some(entry) = self.shared.state().names.get_mut(&*self.name) {
            entry.waiting = entry.waiting.saturating_sub(1);
        }
    }
}

/// The held lock of a grant through the wrapper: the wrapped backend's, unless taken away.
struct TestHeld {
    shared: Arc<Shared>,
    granted: Arc<Granted>,
}

impl HeldLock for TestHeld {
    fn release(&mut self) -> BoxFuture<'_, Result<(), LockError>> {
        let held = lock(&self.granted.lock).take();
        self.shared.forget(&self.granted);
        Box::pin(async move {
            match held {
                Some(mut held) => held.release().await,
                None => Err(self.granted.taken_away()),
            }
        })
    }

    fn release_after(&mut self, remaining: Duration) -> BoxFuture<'_, Result<(), LockError>> {
        let held = lock(&self.granted.lock).take();
        self.shared.forget(&self.granted);
        Box::pin(async move {
            match held {
                Some(mut held) => held.release_after(remaining).await,
                None => Err(self.granted.taken_away()),
            }
        })
    }

    fn release_now(&mut self) -> Option<Result<(), LockError>> {
        let released = {
            let mut slot = lock(&self.granted.lock);
            match slot.as_mut() {
                Some(held) => {
                    let released = held.release_now()?; // `None`: `release` will run
                    *slot = None;
                    released
                }
                None => Err(self.granted.taken_away()),
            }
        };
        self.shared.forget(&self.granted);
        Some(released)
    }

    fn renewal(&self) -> Option<Box<dyn Renewal>> {
        let inner = lock(&self.granted.lock).as_ref()?.renewal()?;
        Some(Box::new(TestRenewal { inner, granted: self.granted.clone() }))
    }
}

impl Drop for TestHeld {
    fn drop(&mut self) {
        self.shared.forget(&self.granted);
    }
}

/// The wrapped backend's renewal, refused once the lock was taken away.
struct TestRenewal {
    inner: Box<dyn Renewal>,
    granted: Arc<Granted>,
}

impl Renewal for TestRenewal {
    fn extend(&self, lease: Duration) -> BoxFuture<'_, Result<(), LockError>> {
        Box::pin(async move {
            let taken_away = lock(&self.granted.lock).is_none();
            if taken_away {
                return Err(self.granted.taken_away());
            }
            self.inner.extend(lease).await
        })
    }
}

/// A name held by "someone else", from [`TestBackend::hold`] until it is released or dropped.
///
/// ```
/// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() -> Result<(), lock_runtime::LockError> {
/// let backend = lock_runtime::testing::TestBackend::new();
/// let manager = lock_runtime::LockManager::builder().backend(backend.clone());
/// {
///     let _other = backend.hold("job");
///     assert!(manager.try_lock("job").await?.is_none());
/// } // dropped: let go
/// assert!(manager.try_lock("job").await?.is_some());
/// # Ok(()) }
/// ```
#[must_use = "the name is let go as soon as the holding is dropped"]
pub struct Holding {
    shared: Arc<Shared>,
    name: Arc<str>,
}

impl fmt::Debug for Holding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Holding").field("name", &self.name).finish()
    }
}

impl Holding {
    /// The name held.
    ///
    /// ```
    /// let backend = lock_runtime::testing::TestBackend::new();
    /// assert_eq!(backend.hold("job").name(), "job");
    /// ```
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Lets the name go (as dropping the holding does), waking its waiters.
    ///
    /// ```
    /// let backend = lock_runtime::testing::TestBackend::new();
    /// let other = backend.hold("job");
    /// other.release();
    /// ```
    pub fn release(self) {
        drop(self);
    }
}

impl Drop for Holding {
    fn drop(&mut self) {
        if let Some(entry) = self.shared.state().names.get_mut(&*self.name) {
            entry.holdings = entry.holdings.saturating_sub(1);
        }
        self.shared.holdings_changed();
    }
}

/// Panics unless the calling code runs under the lock `name` (as the code wrote it, without
/// the manager's prefix): inside a `#[distributed_locked]` fn or a
/// [`LockRequest::run`](crate::LockRequest::run) of that name, at any depth of nesting, in
/// the task that runs it. In the spirit of ShedLock's `LockAssert.assertLocked()`: put it in
/// code that must only ever run locked, and a test that calls it unlocked fails.
///
/// ```
/// use lock_runtime::{distributed_locked, testing::assert_locked, LockError, LockManager};
///
/// #[distributed_locked(name = "report:{day}", manager = manager)]
/// async fn send_report(manager: &LockManager, day: u32) -> Result<(), LockError> {
///     assert_locked(&format!("report:{day}"));
///     Ok(())
/// }
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), LockError> {
/// send_report(&LockManager::memory(), 7).await?;
/// let outside = std::panic::catch_unwind(|| assert_locked("report:7"));
/// assert!(outside.is_err());
/// # Ok(()) }
/// ```
#[track_caller]
pub fn assert_locked(name: &str) {
    let held = crate::context::held_names();
    if held.iter().any(|h| **h == *name) {
        return;
    }
    if held.is_empty() {
        panic!(
            "assert_locked: expected to run under the lock `{name}`, but no lock is held here \
             (not inside `#[distributed_locked]` or `LockRequest::run`, or in a task spawned from \
             one: the lock context belongs to the task)"
        );
    }
    panic!("assert_locked: expected to run under the lock `{name}`, but the locks held here are {}", list(&held));
}

/// Panics if the calling code runs under any lock (inside a `#[distributed_locked]` fn or a
/// [`LockRequest::run`](crate::LockRequest::run), in the task that runs it).
///
/// ```
/// use lock_runtime::{testing::assert_not_locked, LockManager};
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), lock_runtime::LockError> {
/// assert_not_locked();
/// let inside = LockManager::memory()
///     .lock("job")
///     .run(async { std::panic::catch_unwind(assert_not_locked).is_err() })
///     .await?;
/// assert!(inside);
/// # Ok(()) }
/// ```
#[track_caller]
pub fn assert_not_locked() {
    let held = crate::context::held_names();
    if !held.is_empty() {
        panic!("assert_not_locked: expected to run under no lock, but the locks held here are {}", list(&held));
    }
}

/// `` `a`, `b` (innermost first) ``.
fn list(names: &[Arc<str>]) -> String {
    let names: Vec<String> = names.iter().map(|n| format!("`{n}`")).collect();
    format!("{} (innermost first)", names.join(", "))
}
