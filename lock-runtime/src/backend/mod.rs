//! The [`LockBackend`] trait and the backends that implement it.
//!
//! A backend owns the primitive operations (one acquisition attempt, waiting for a chance to
//! acquire, extending, releasing) and its own way of waking waiters. The runtime
//! ([`LockManager`](crate::LockManager)) owns the policy: validation, deadline and retry
//! accounting, time bounds, the lease watchdog, release on drop and the task-scoped context.
//!
//! Implement [`LockBackend`] and pass it to
//! [`LockManagerBuilder::backend`](crate::LockManagerBuilder::backend) to plug in a store of
//! your own; run the project's conformance suite against it.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use crate::error::LockError;
use crate::lost::LostSignal;

#[cfg(all(feature = "sqlx", any(feature = "postgres", feature = "mysql")))]
mod app_conn;
mod credentials;
#[cfg(feature = "etcd")]
#[cfg_attr(docsrs, doc(cfg(feature = "etcd")))]
pub mod etcd;
pub mod file;
mod identity;
mod in_transaction;
mod inspect;
pub mod memory;
#[cfg(feature = "mysql")]
#[cfg_attr(docsrs, doc(cfg(feature = "mysql")))]
pub mod mysql;
#[cfg(any(feature = "postgres", feature = "sqlx"))]
#[cfg_attr(docsrs, doc(cfg(any(feature = "postgres", feature = "sqlx"))))]
pub mod postgres;
#[cfg(feature = "redis")]
#[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
pub mod redis;
#[cfg(any(feature = "postgres", feature = "mysql"))]
mod session;
pub mod url;
#[cfg(feature = "zookeeper")]
#[cfg_attr(docsrs, doc(cfg(feature = "zookeeper")))]
pub mod zookeeper;

/// A boxed, `Send` future: what the object-safe [`LockBackend`] methods return.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

pub use crate::kind::LockKind;
pub use crate::options::Lease;
pub use identity::{Holder, OwnerId};
pub use in_transaction::LockInTransaction;
pub use inspect::{ChangeFeed, ForceRelease, Inspect, LockInfo};

/// What an acquisition asks for: handed to [`LockBackend::begin`], kept by the acquisition.
#[derive(Debug, Clone)]
pub struct Acquire {
    /// The lock's name as the user gave it (for error messages).
    pub name: Arc<str>,
    /// The key in the backend: the manager's prefix followed by the name.
    pub key: Arc<str>,
    /// Unique to this acquisition.
    pub owner: OwnerId,
    /// The process taking it (host, pid, the manager's label): stored with the lock where
    /// the store can keep it.
    pub holder: Holder,
    /// How the lease is kept.
    pub lease: Lease,
    /// Which kind of lock ([`LockKind::Exclusive`] for [`LockManager::lock`](crate::LockManager::lock));
    /// only kinds the backend [`supports`](LockBackend::supports) reach it.
    pub kind: LockKind,
}

/// A lock that was granted to an acquisition.
#[derive(Debug)]
pub struct Grant {
    /// Strictly greater than every earlier token for this name.
    pub fencing_token: u64,
    /// A local instant at or before which the lease started (taken before the request was
    /// sent, or at the hand-off): the runtime counts the lease from here, so its idea of the
    /// lease never outlasts the store's. May be `None` only for a [`Lease::Renewed`] lock
    /// whose [`HeldLock::renewal`] is `None` (nothing is counted from it).
    pub granted_at: Option<Instant>,
    /// The held lock: what releases (and, for lease-based stores, renews) it.
    pub lock: Held,
}

/// A granted lock's [`HeldLock`], as a [`Grant`] carries it: `Held::new(your_lock)`.
///
/// The in-process backend's locks are kept inline (no allocation on its fast path); every
/// other backend's are shared between the guard and its manager's
/// [`shutdown`](crate::LockManager::shutdown), and released by whichever comes first.
pub struct Held(HeldRepr);

enum HeldRepr {
    Memory(memory::MemoryHeld),
    Shared(Arc<SharedHeld>),
}

impl Held {
    /// Wraps a backend's held lock.
    pub fn new(lock: impl HeldLock) -> Self {
        Held(HeldRepr::Shared(Arc::new(SharedHeld::new(Box::new(lock)))))
    }

    /// Sets what bounds an awaited release: the backend's operation timeout and kind.
    #[inline]
    pub(crate) fn bound_by(&mut self, bound: (Duration, &'static str)) {
        if let HeldRepr::Shared(shared) = &mut self.0 {
            if let Some(shared) = Arc::get_mut(shared) {
                shared.bound = bound;
            }
        }
    }

    /// What bounds an awaited release ([`bound_by`](Self::bound_by)).
    pub(crate) fn bound(&self) -> (Duration, &'static str) {
        match &self.0 {
            HeldRepr::Memory(_) => (Duration::from_secs(5), "memory"),
            HeldRepr::Shared(shared) => shared.bound,
        }
    }

    /// The lock as its manager's shutdown releases it (`None` for an in-process one, which
    /// goes with its process).
    pub(crate) fn shared(&self) -> Option<&Arc<SharedHeld>> {
        match &self.0 {
            HeldRepr::Memory(_) => None,
            HeldRepr::Shared(shared) => Some(shared),
        }
    }

    pub(crate) fn memory(lock: memory::MemoryHeld) -> Self {
        Held(HeldRepr::Memory(lock))
    }

    /// [`HeldLock::release`]. A lock its manager's shutdown released already is
    /// [`is_lost`](LockError::is_lost) here.
    pub fn release(&mut self) -> BoxFuture<'_, Result<(), LockError>> {
        match &mut self.0 {
            HeldRepr::Memory(lock) => lock.release(),
            HeldRepr::Shared(shared) => Box::pin(shared.release(None)),
        }
    }

    /// [`HeldLock::release_now`].
    #[inline]
    pub fn release_now(&mut self) -> Option<Result<(), LockError>> {
        match &mut self.0 {
            HeldRepr::Memory(lock) => lock.release_now(),
            HeldRepr::Shared(shared) => shared.release_now(),
        }
    }

    /// [`HeldLock::release_after`].
    pub fn release_after(&mut self, remaining: Duration) -> BoxFuture<'_, Result<(), LockError>> {
        match &mut self.0 {
            HeldRepr::Memory(lock) => Box::pin(std::future::ready(lock.release_after_now(remaining))),
            HeldRepr::Shared(shared) => Box::pin(shared.release(Some(remaining))),
        }
    }

    /// [`HeldLock::release_after`] at once without blocking, where the lock is the built-in
    /// in-process store's; `None` when [`release_after`](Held::release_after) must run.
    #[inline]
    pub(crate) fn release_after_now(&mut self, remaining: Duration) -> Option<Result<(), LockError>> {
        match &mut self.0 {
            HeldRepr::Memory(lock) => Some(lock.release_after_now(remaining)),
            HeldRepr::Shared(_) => None,
        }
    }

    /// [`HeldLock::renewal`].
    pub fn renewal(&self) -> Option<Box<dyn Renewal>> {
        match &self.0 {
            HeldRepr::Memory(lock) => lock.renewal(),
            HeldRepr::Shared(shared) => shared.renewal(),
        }
    }
}

impl fmt::Debug for Held {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Held")
    }
}

impl From<Box<dyn HeldLock>> for Held {
    fn from(lock: Box<dyn HeldLock>) -> Self {
        Held::new(lock)
    }
}

/// A boxed lock is a lock.
impl<L: HeldLock + ?Sized> HeldLock for Box<L> {
    fn release(&mut self) -> BoxFuture<'_, Result<(), LockError>> {
        (**self).release()
    }

    fn release_after(&mut self, remaining: Duration) -> BoxFuture<'_, Result<(), LockError>> {
        (**self).release_after(remaining)
    }

    fn release_now(&mut self) -> Option<Result<(), LockError>> {
        (**self).release_now()
    }

    fn renewal(&self) -> Option<Box<dyn Renewal>> {
        (**self).renewal()
    }
}

/// Why a shutdown's release takes a lock away from its holder.
pub(crate) const SHUT_DOWN: &str = "the lock manager was shut down";

/// A backend's held lock, shared by its guard and its manager's shutdown: whichever comes
/// first releases it, once. The guard's release (awaited, or in the background after a drop)
/// holds the lock's slot until the store answered, so a shutdown that comes meanwhile waits for
/// that release instead of racing it; a shutdown that comes first fires the holder's `lost()`,
/// releases, and leaves the slot empty, so the guard's own release later does nothing and
/// reports the lock lost.
pub(crate) struct SharedHeld {
    /// The backend's operation timeout and kind: what bounds an awaited release.
    pub(crate) bound: (Duration, &'static str),
    /// `None` once a shutdown released it.
    lock: tokio::sync::Mutex<Option<Box<dyn HeldLock>>>,
    /// Its name, its holder's signal and `hold_at_least`'s end, told by the manager when it
    /// registers the lock for its shutdown.
    holder: OnceLock<(Arc<str>, LostSignal, Option<Instant>)>,
    /// Released by a shutdown: its guard's release reports it lost.
    taken: AtomicBool,
    /// Released by its guard (or found gone): a shutdown leaves it alone. The guard's own
    /// releases still reach the backend, which answers a second one as it sees fit (lost).
    released: AtomicBool,
}

impl SharedHeld {
    pub(crate) fn new(lock: Box<dyn HeldLock>) -> Self {
        SharedHeld {
            bound: (Duration::from_secs(5), "backend"),
            lock: tokio::sync::Mutex::new(Some(lock)),
            holder: OnceLock::new(),
            taken: AtomicBool::new(false),
            released: AtomicBool::new(false),
        }
    }

    /// Tells the lock its name, its holder's signal and when `hold_at_least` ends, for a
    /// shutdown.
    pub(crate) fn held_by(&self, name: &Arc<str>, lost: &LostSignal, hold_until: Option<Instant>) {
        let _ = self.holder.set((name.clone(), lost.clone(), hold_until));
    }

    /// What a release finds once the lock is gone: lost when a shutdown took it.
    fn gone(&self) -> Result<(), LockError> {
        match (self.taken.load(Ordering::Acquire), self.holder.get()) {
            (true, Some((name, ..))) => Err(LockError::lost(&**name, SHUT_DOWN)),
            _ => Ok(()),
        }
    }

    /// The guard's release (`release_after` with `remaining`); nothing to do once released.
    pub(crate) async fn release(&self, remaining: Option<Duration>) -> Result<(), LockError> {
        let mut slot = self.lock.lock().await;
        let Some(lock) = slot.as_mut() else { return self.gone() };
        let released = match remaining {
            None => lock.release().await,
            Some(remaining) => lock.release_after(remaining).await,
        };
        self.answered(&released);
        released
    }

    /// Notes a release's answer: freed, or found gone, the lock is not the shutdown's to free.
    fn answered(&self, released: &Result<(), LockError>) {
        if released.as_ref().map_or_else(LockError::is_lost, |()| true) {
            self.released.store(true, Ordering::Release);
        }
    }

    /// [`HeldLock::release_now`], when nothing else is releasing it.
    pub(crate) fn release_now(&self) -> Option<Result<(), LockError>> {
        let mut slot = self.lock.try_lock().ok()?;
        let Some(lock) = slot.as_mut() else { return Some(self.gone()) };
        let released = lock.release_now()?;
        self.answered(&released);
        Some(released)
    }

    pub(crate) fn renewal(&self) -> Option<Box<dyn Renewal>> {
        self.lock.try_lock().ok()?.as_ref()?.renewal()
    }

    /// The shutdown's release: waits for a release under way to finish; a lock still held
    /// fires its holder's `lost()`, then is released (a `hold_at_least` still running keeps the
    /// name taken for its remainder, by the store). Bounded by the backend's operation timeout.
    pub(crate) async fn shut_down(&self) -> Result<(), LockError> {
        let (bound, kind) = self.bound;
        let release = async {
            let mut slot = self.lock.lock().await;
            let Some(lock) = slot.as_mut() else { return Ok(()) };
            if self.released.load(Ordering::Acquire) {
                return Ok(());
            }
            self.taken.store(true, Ordering::Release);
            let remaining = match self.holder.get() {
                Some((_, lost, hold_until)) => {
                    lost.fire(SHUT_DOWN);
                    hold_until.map(|until| until.saturating_duration_since(crate::clock::now()))
                }
                None => None,
            };
            let released = match remaining.filter(|r| !r.is_zero()) {
                None => lock.release().await,
                Some(remaining) => lock.release_after(remaining).await,
            };
            *slot = None;
            released
        };
        match crate::bounded::bounded(bound, release).await {
            Some(released) => released,
            None => Err(LockError::timed_out("", kind, "release at shutdown", bound)),
        }
    }
}

/// The result of one acquisition attempt.
#[derive(Debug)]
pub enum Attempt {
    /// The lock is now held by the requesting acquisition.
    Acquired(Grant),
    /// Someone else holds it.
    Busy,
    /// Nobody holds it, and this attempt could not take it either: the nodes of a quorum store
    /// that answered were split between contenders (Redlock), and no owner held a majority of
    /// them. The runtime waits and tries again as after [`Busy`](Attempt::Busy); a wait that
    /// runs out after it says that nobody held the lock
    /// ([`LockError::Contended`]'s `held` is `false`).
    Split,
}

/// How an [`Acquisition::wait`] ended.
#[derive(Debug)]
pub enum Wake {
    /// The backend handed the lock straight to this acquisition (fair, queue-based backends).
    Acquired(Grant),
    /// The lock may be free now (a release was observed, or the holder's lease ran out):
    /// the runtime makes another [`attempt`](Acquisition::attempt) if its retry budget allows.
    Retry,
    /// The deadline passed with no chance to acquire.
    TimedOut,
}

/// One `lock()` call in progress: created by [`LockBackend::begin`], it owns the call's
/// server-side state for its whole life (a queue slot, an in-flight request's owner id, a
/// sequential node) and offers attempts and deadline-bounded waits.
///
/// **Dropping it cleans up.** An acquisition dropped at any point (the caller gave up, its
/// future was cancelled after any poll, an operation timed out) leaves nothing behind and is
/// never handed the lock afterwards: a queued waiter leaves the queue and passes on any
/// wake-up it was given; a request that may have taken the lock server-side is undone with an
/// owner-checked release. Once it has produced a [`Grant`], the grant's [`HeldLock`] owns the
/// lock and the acquisition's drop leaves it alone.
///
/// The runtime calls [`attempt`](Acquisition::attempt) and [`wait`](Acquisition::wait) in
/// turn, never concurrently, and may drop either future after any poll.
pub trait Acquisition: Send {
    /// One attempt to take the lock. Never waits for the holder.
    fn attempt(&mut self) -> BoxFuture<'_, Result<Attempt, LockError>>;

    /// Waits, at most until `deadline`, for a chance to take the lock after an attempt found
    /// it busy. Queue-based backends may hand the lock over directly ([`Wake::Acquired`]).
    fn wait(&mut self, deadline: Instant) -> BoxFuture<'_, Result<Wake, LockError>>;
}

/// A granted lock, owned by its guard: releases it, and renews it where the store has leases.
///
/// Dropping it without [`release`](HeldLock::release) does nothing by itself: the guard
/// releases in the background, and the lease is the safety net.
pub trait HeldLock: Send + Sync + 'static {
    /// Releases the lock. A lock that is gone or owned by someone else is an
    /// [`is_lost`](LockError::is_lost) error.
    fn release(&mut self) -> BoxFuture<'_, Result<(), LockError>>;

    /// Lets go of the lock but keeps the name taken for `remaining` more (counted by the
    /// store's clock where it has one), then frees it: what
    /// [`LockRequest::hold_at_least`](crate::LockRequest::hold_at_least) asks of a holder that
    /// finishes early. The runtime calls it instead of [`release`](HeldLock::release) (never
    /// both), with `remaining > 0`, computed from [`Grant::granted_at`] (so never shorter than
    /// what is left on the store's side); durations, not timestamps, reach the store, so the
    /// clocks of the holders need not agree.
    ///
    /// A backend implementing it must:
    /// - keep the name taken (an attempt finds it [`Busy`](Attempt::Busy)) until `remaining`
    ///   has passed, and free it then, with no further call from this process (e.g. Redis
    ///   sets the key's expiry to the remainder, `PEXPIRE`, instead of deleting it);
    /// - wake waiters when the remainder ends, as a lease running out does (no polling); a
    ///   waiter that was told a longer lease must learn of the shorter one;
    /// - report a lock that is gone or owned by someone else as an
    ///   [`is_lost`](LockError::is_lost) error, as `release` does.
    ///
    /// **The default refuses** with an [`is_invalid`](LockError::is_invalid) error and leaves
    /// the lock as it is (taken until its lease ends): a backend that does not implement it
    /// never silently frees a name that was promised to stay taken. The guard reports the
    /// error from its release.
    fn release_after(&mut self, remaining: Duration) -> BoxFuture<'_, Result<(), LockError>> {
        let _ = remaining;
        Box::pin(std::future::ready(Err(LockError::invalid(
            "",
            "this lock backend does not implement `hold_at_least` (HeldLock::release_after); the lock is left to its lease",
        ))))
    }

    /// Releases at once without blocking, if the backend can (in-process stores); tried first
    /// by `release()` and by `Drop`. `None` (the default) when the runtime must run
    /// [`release`](HeldLock::release) instead.
    fn release_now(&mut self) -> Option<Result<(), LockError>> {
        None
    }

    /// The renewal capability of a lease-based store: `Some` when a [`Lease::Renewed`] lock
    /// expires unless renewed, and the runtime's watchdog renews it through the returned
    /// handle while the guard lives. `None` (the default) for a lock that cannot outlive its
    /// holder (in-process, or tied to a session).
    fn renewal(&self) -> Option<Box<dyn Renewal>> {
        None
    }
}

/// Renews one held lock's lease ([`HeldLock::renewal`]); used by the watchdog.
pub trait Renewal: Send + Sync + 'static {
    /// Extends the lease to `lease` from now. A lock that is gone or owned by someone else is
    /// an [`is_lost`](LockError::is_lost) error.
    fn extend(&self, lease: Duration) -> BoxFuture<'_, Result<(), LockError>>;
}

/// A lock store. Object-safe; used as `Arc<dyn LockBackend>`.
///
/// Contract (checked by the conformance suite, [`crate::conformance`][conformance] with the
/// feature `conformance`):
/// - at most one owner holds a key at a time; only the owner can renew or release it;
/// - fencing tokens strictly increase per key, for the life of the store;
/// - a lock held past its lease is lost: its release reports [`LockError::is_lost`];
/// - a lock let go of with [`HeldLock::release_after`] stays taken for the remainder given,
///   then is freed and its waiters woken (backends that do not implement it refuse it);
/// - a [`wait`](Acquisition::wait) is woken by a release (no polling with fixed sleeps) and by
///   the holder's lease running out, and never outlives its deadline by more than a
///   scheduling delay;
/// - an [`Acquisition`] dropped at any point leaves nothing behind and is never handed the
///   lock afterwards; a wake-up it was given goes to the next waiter;
/// - every operation is bounded in time (the runtime adds an outer bound as well).
///
/// **Lock kinds.** Every backend offers [`LockKind::Exclusive`]. A backend that also offers
/// read-write locks or semaphores says so in [`supports`](LockBackend::supports); for those
/// kinds the same rules hold per holder (each reader, each permit, is one owner with its own
/// fencing token, lease, release and cancellation), plus: readers share a name with readers
/// only, a writer excludes everyone, and a waiting writer blocks new readers; at most `permits`
/// holders of a semaphore at once, and a `permits` that differs from the name's current
/// holders' or waiters' is refused as [`is_invalid`](LockError::is_invalid). Multi-name locks
/// (`lock_all`) need nothing from a backend: the runtime composes them from exclusive locks.
#[doc = ""]
#[cfg_attr(feature = "conformance", doc = "[conformance]: crate::conformance")]
#[cfg_attr(
    not(feature = "conformance"),
    doc = "[conformance]: https://docs.rs/lock-runtime/latest/lock_runtime/conformance/index.html"
)]
pub trait LockBackend: Send + Sync + 'static {
    /// The store's short name, for messages and metrics (`"memory"`, `"redis"`, …): which
    /// store, never which kind of lock (that is [`LockKind`]).
    fn name(&self) -> &'static str;

    /// Whether this backend offers `kind`. The default offers [`LockKind::Exclusive`] only;
    /// the runtime refuses the others at once with an [`is_invalid`](LockError::is_invalid)
    /// error naming the backend and the kind, and never begins their acquisition here.
    ///
    /// ```
    /// use lock_runtime::backend::{memory::MemoryBackend, LockBackend, LockKind};
    ///
    /// let memory = MemoryBackend::new();
    /// assert!(memory.supports(LockKind::Exclusive));
    /// assert!(memory.supports(LockKind::Read));
    /// ```
    fn supports(&self, kind: LockKind) -> bool {
        kind == LockKind::Exclusive
    }

    /// Begins one acquisition (no I/O yet): the object that owns its state until it is
    /// granted or dropped. `lost` is the lock's [`LostSignal`] once granted: fire it if the
    /// lock is lost while held and the backend learns of it itself (e.g. a session loss); the
    /// runtime also fires it when the lease runs out unrenewed.
    fn begin(&self, req: Acquire, lost: LostSignal) -> Box<dyn Acquisition>;

    /// One attempt made at once without blocking and without an [`Acquisition`], if the
    /// backend can (in-process stores): the runtime's fast path. `None` (the default) when the
    /// backend needs I/O. After [`Attempt::Busy`] here, the runtime begins an acquisition and
    /// goes straight to [`wait`](Acquisition::wait).
    fn try_acquire_now(&self, req: &Acquire) -> Option<Result<Attempt, LockError>> {
        let _ = req;
        None
    }

    /// The longest a single backend operation may take before the runtime gives up on it with
    /// an [`is_backend`](LockError::is_backend) error.
    fn operation_timeout(&self) -> Duration {
        Duration::from_secs(5)
    }

    /// The store's [`Inspect`] capability, when its locks can be looked at from outside their
    /// holders: what [`LockManager::inspect`](crate::LockManager::inspect) and elections'
    /// [`leader`](crate::Election::leader) and [`observe`](crate::Election::observe) read.
    /// `None` (the default) for a store that cannot tell who holds a lock; those calls are then
    /// refused with an [`is_invalid`](LockError::is_invalid) error naming the backend.
    ///
    /// ```
    /// use lock_runtime::backend::{memory::MemoryBackend, LockBackend};
    /// assert!(MemoryBackend::new().inspector().is_some());
    /// ```
    fn inspector(&self) -> Option<&dyn Inspect> {
        None
    }

    /// Ends what the store keeps for this backend beyond its locks (a session, a lease,
    /// connections), at [`LockManager::shutdown`](crate::LockManager::shutdown), once every
    /// lock the manager held was released. Bounded by the runtime with the operation timeout;
    /// the backend takes no lock after it. The default does nothing.
    fn shutdown(&self) -> BoxFuture<'_, ()> {
        Box::pin(std::future::ready(()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::Ordering;

    /// A third-party held lock that implements only `release`.
    struct Plain(Arc<std::sync::atomic::AtomicBool>);

    impl HeldLock for Plain {
        fn release(&mut self) -> BoxFuture<'_, Result<(), LockError>> {
            self.0.store(true, Ordering::SeqCst);
            Box::pin(std::future::ready(Ok(())))
        }
    }

    #[tokio::test]
    async fn release_after_is_refused_by_default_and_leaves_the_lock_alone() {
        let released = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let mut held = Held::new(Plain(released.clone()));
        let refused = held.release_after(Duration::from_secs(1)).await.expect_err("refused");
        assert!(refused.is_invalid() && refused.to_string().contains("hold_at_least"), "{refused}");
        assert!(!released.load(Ordering::SeqCst), "not silently released");
    }
}
