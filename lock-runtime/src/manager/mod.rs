//! [`LockManager`]: the entry point, its builder, and the acquisition policy (deadline, retry
//! accounting, time bounds).

use std::future::{Future, IntoFuture};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, PoisonError, RwLock};
use std::time::{Duration, Instant};

use crate::backend::memory::MemoryBackend;
use crate::backend::LockKind;
use crate::backend::{Acquire, Attempt, BoxFuture, Grant, Holder, Lease, LockBackend, OwnerId, Wake};
use crate::error::LockError;
use crate::guard::LockGuard;
use crate::lost::LostSignal;
use crate::options::{self, LockOptions};
use crate::telemetry::{self, Acquiring};
use crate::watchdog;

/// The default `wait`: how long a call waits for a held lock when it gives no `wait`.
pub const DEFAULT_WAIT: Duration = Duration::from_secs(3);
/// The default watchdog lease; renewed at a third of it while the guard lives.
pub const DEFAULT_LEASE: Duration = Duration::from_secs(30);

/// Takes locks on one backend. Cheap to clone (shared inside), `Send + Sync + 'static`.
///
/// ```
/// use std::time::Duration;
/// use lock_runtime::LockManager;
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), lock_runtime::LockError> {
/// let manager = LockManager::builder().prefix("myapp:").default_wait(Duration::from_secs(2)).memory();
/// let guard = manager.lock("order:42").wait(Duration::from_millis(500)).await?;
/// assert_eq!(guard.key(), "order:42");
/// assert!(manager.try_lock("order:42").await?.is_none()); // held
/// guard.release().await?;
/// assert!(manager.try_lock("order:42").await?.is_some()); // free again
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct LockManager {
    inner: Arc<Inner>,
}

pub(crate) struct Inner {
    pub(crate) id: u64,
    pub(crate) prefix: String,
    pub(crate) default_wait: Duration,
    pub(crate) default_lease: Duration,
    /// Stored with every lock taken (host, pid, label).
    holder: Holder,
    pub(crate) backend: Arc<dyn LockBackend>,
    /// The backend again when it is the built-in in-process store: its fast path takes the
    /// request by value.
    memory: Option<MemoryBackend>,
    /// The backend's operation timeout and kind, read once.
    pub(crate) bound: Duration,
    pub(crate) kind: &'static str,
    pub(crate) telemetry: telemetry::Telemetry,
}

impl std::fmt::Debug for LockManager {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LockManager")
            .field("backend", &self.inner.backend.kind())
            .field("prefix", &self.inner.prefix)
            .field("default_wait", &self.inner.default_wait)
            .field("default_lease", &self.inner.default_lease)
            .finish()
    }
}

/// Configures a [`LockManager`]; the backend comes last.
///
/// ```
/// use std::time::Duration;
/// let manager = lock_runtime::LockManager::builder()
///     .prefix("myapp:")
///     .default_wait(Duration::from_secs(3))
///     .default_lease(Duration::from_secs(30))
///     .memory();
/// ```
#[derive(Debug, Clone)]
#[must_use = "a builder does nothing until its backend method (e.g. `.memory()`) is called"]
pub struct LockManagerBuilder {
    pub(crate) prefix: String,
    pub(crate) default_wait: Duration,
    pub(crate) default_lease: Duration,
    pub(crate) label: Option<String>,
    /// Its own methods are in `telemetry.rs`.
    pub(crate) telemetry: telemetry::Config,
}

impl Default for LockManagerBuilder {
    fn default() -> Self {
        LockManagerBuilder {
            prefix: String::new(),
            default_wait: DEFAULT_WAIT,
            default_lease: DEFAULT_LEASE,
            label: None,
            telemetry: telemetry::Config::default(),
        }
    }
}

impl LockManagerBuilder {
    /// Prepended to every lock name in the backend (not shown in [`LockGuard::key`]).
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// Used when a call gives no `wait` (default [`DEFAULT_WAIT`]).
    pub fn default_wait(mut self, wait: Duration) -> Self {
        self.default_wait = wait;
        self
    }

    /// The watchdog lease used when a call gives no `lease` (default [`DEFAULT_LEASE`]): the
    /// lock is renewed at a third of it while its guard lives, and expires after it if the
    /// holder dies.
    pub fn default_lease(mut self, lease: Duration) -> Self {
        self.default_lease = lease;
        self
    }

    /// A label for this process's locks, stored with each of them next to the host name and
    /// the process id (see [`Holder`]), so that `lockctl` can tell who holds a lock, e.g.
    /// `"billing-worker"`. Characters other than ASCII letters, digits, `-`, `_`, `.` and `:`
    /// become `_`; at most 64 are kept. Default: none. (The text is kept for the life of the
    /// process, once per distinct label.)
    pub fn label(mut self, label: impl Into<String>) -> Self {
        self.label = Some(label.into());
        self
    }

    /// A manager on the in-process backend.
    pub fn memory(self) -> LockManager {
        self.backend(MemoryBackend::new())
    }

    /// A manager on any [`LockBackend`].
    pub fn backend(self, backend: impl LockBackend) -> LockManager {
        let memory = (&backend as &dyn std::any::Any).downcast_ref::<MemoryBackend>().cloned();
        self.build(Arc::new(backend), memory)
    }

    /// A manager on a shared backend.
    pub fn backend_arc(self, backend: Arc<dyn LockBackend>) -> LockManager {
        self.build(backend, None)
    }

    fn build(self, backend: Arc<dyn LockBackend>, memory: Option<MemoryBackend>) -> LockManager {
        static IDS: AtomicU64 = AtomicU64::new(1);
        LockManager {
            inner: Arc::new(Inner {
                id: IDS.fetch_add(1, Ordering::Relaxed),
                prefix: self.prefix,
                default_wait: self.default_wait,
                default_lease: self.default_lease,
                holder: Holder::of_process(self.label.as_deref()),
                bound: backend.operation_timeout(),
                kind: backend.kind(),
                telemetry: self.telemetry.build(backend.kind()),
                backend,
                memory,
            }),
        }
    }
}

static DEFAULT: RwLock<Option<LockManager>> = RwLock::new(None);

/// Sets the process-wide manager that `#[distributed_locked]` uses when it is given no
/// `manager = ..`; returns the previous one.
///
/// ```
/// let previous = lock_runtime::set_default(lock_runtime::LockManager::memory());
/// # let _ = previous;
/// assert!(lock_runtime::default_manager().is_some());
/// ```
pub fn set_default(manager: LockManager) -> Option<LockManager> {
    DEFAULT.write().unwrap_or_else(PoisonError::into_inner).replace(manager)
}

/// The manager set by [`set_default`], if any.
pub fn default_manager() -> Option<LockManager> {
    DEFAULT.read().unwrap_or_else(PoisonError::into_inner).clone()
}

impl LockManager {
    /// Starts configuring a manager.
    pub fn builder() -> LockManagerBuilder {
        LockManagerBuilder::default()
    }

    /// A manager on the in-process backend with default settings; same as
    /// `LockManager::builder().memory()`.
    pub fn memory() -> LockManager {
        Self::builder().memory()
    }

    /// Asks for the lock `name`; configure the request, then `.await` it for a [`LockGuard`].
    ///
    /// ```
    /// # use std::time::Duration;
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), lock_runtime::LockError> {
    /// let manager = lock_runtime::LockManager::memory();
    /// let guard = manager.lock("order:42").wait(Duration::from_secs(2)).lease(Duration::from_secs(10)).retry(3).await?;
    /// assert!(guard.fencing_token() > 0);
    /// # Ok(()) }
    /// ```
    pub fn lock(&self, name: impl AsRef<str>) -> LockRequest<'_> {
        self.lock_named(Arc::from(name.as_ref()))
    }

    /// [`lock`](Self::lock) with the name already shared.
    #[inline]
    pub(crate) fn lock_named(&self, name: Arc<str>) -> LockRequest<'_> {
        LockRequest { manager: self, name, options: LockOptions::new() }
    }

    /// One attempt, no waiting: `Ok(None)` when someone else holds the lock.
    pub async fn try_lock(&self, name: impl AsRef<str>) -> Result<Option<LockGuard>, LockError> {
        match self.lock(name).wait(Duration::ZERO).retry(0).await {
            Ok(guard) => Ok(Some(guard)),
            Err(e) if e.is_contended() => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// The prefix prepended to every lock name in the backend.
    pub fn prefix(&self) -> &str {
        &self.inner.prefix
    }

    /// The `wait` used when a call gives none.
    pub fn default_wait(&self) -> Duration {
        self.inner.default_wait
    }

    /// The watchdog lease used when a call gives no `lease`.
    pub fn default_lease(&self) -> Duration {
        self.inner.default_lease
    }

    /// The process identity stored with this manager's locks (host, pid, label).
    pub fn holder(&self) -> &Holder {
        &self.inner.holder
    }

    /// The backend's short name (`"memory"`, `"redis"`, …).
    pub fn backend_kind(&self) -> &'static str {
        self.inner.backend.kind()
    }

    /// Whether the backend offers `kind` ([`LockBackend::supports`]): the others are refused
    /// with an [`is_invalid`](LockError::is_invalid) error.
    ///
    /// ```
    /// use lock_runtime::{backend::LockKind, LockManager};
    /// assert!(LockManager::memory().supports(LockKind::Semaphore { permits: 3 }));
    /// ```
    pub fn supports(&self, kind: LockKind) -> bool {
        self.inner.backend.supports(kind)
    }

    pub(crate) fn id(&self) -> u64 {
        self.inner.id
    }

    pub(crate) fn telemetry(&self) -> &telemetry::Telemetry {
        &self.inner.telemetry
    }

    /// Validates a request and works out what to ask the backend for. (Inlined into the
    /// mutex's fast path, as when it was its only caller: the plan is built in place.)
    #[inline(always)]
    fn plan(&self, name: Arc<str>, options: LockOptions, acquiring: &Acquiring) -> Result<Plan, LockError> {
        let inner = &*self.inner;
        options::check_name(&name)?;
        let wait = options.wait_for().unwrap_or(inner.default_wait);
        options::check_wait(&name, wait)?;
        let lease = match options.lease_for() {
            Some(lease) => {
                options::check_lease(&name, "lease", lease, options::MIN_LEASE)?;
                Lease::Fixed(lease)
            }
            None => {
                options::check_lease(&name, "default_lease", inner.default_lease, options::MIN_DEFAULT_LEASE)?;
                Lease::Renewed(inner.default_lease)
            }
        };
        if let Some(retry) = options.retries() {
            options::check_retry(&name, retry)?;
        }
        if let Some(hold) = options.hold_at_least_for() {
            options::check_hold(&name, hold, options.lease_for())?;
        }
        acquiring.planned(wait, lease);
        let key: Arc<str> =
            if inner.prefix.is_empty() { name.clone() } else { Arc::from(format!("{}{}", inner.prefix, name)) };
        let kind = LockKind::Exclusive;
        let req = Acquire { name, key, owner: OwnerId::next(), holder: inner.holder.clone(), lease, kind };
        Ok(Plan { req, wait, retry: options.retries(), hold: options.hold_at_least_for() })
    }

    /// The synchronous fast path of other in-process backends: one attempt, no allocation for
    /// the future or the lost signal; without a verdict, the plan is given back with whether
    /// the lock was found held. (The built-in store's is in [`LockFuture::poll`].)
    #[inline(always)]
    fn attempt_now(&self, plan: Plan, mut acquiring: Acquiring) -> FastPath {
        match self.inner.backend.try_acquire_now(&plan.req) {
            Some(Ok(Attempt::Acquired(grant))) => {
                FastPath::Done(Ok(self.guard(plan.req.name, plan.req.lease, grant, None, acquiring, plan.hold)))
            }
            Some(Ok(Attempt::Busy)) => FastPath::Slow { plan, busy: true, acquiring },
            Some(Err(e)) => {
                acquiring.failed(&e);
                FastPath::Done(Err(e))
            }
            None => FastPath::Slow { plan, busy: false, acquiring },
        }
    }

    /// Wraps a grant into a guard; starts the watchdog when the lease needs renewing. `hold`:
    /// `hold_at_least`, counted from the grant (from now when the backend gave no instant: later
    /// than the grant, so never shorter).
    #[inline(always)]
    fn guard(
        &self,
        name: Arc<str>,
        lease: Lease,
        grant: Grant,
        lost: Option<LostSignal>,
        acquiring: Acquiring,
        hold: Option<Duration>,
    ) -> LockGuard {
        if let Some(hold) = hold {
            let until = grant.granted_at.unwrap_or_else(crate::clock::now).checked_add(hold);
            return self.guard(name, lease, grant, lost, acquiring, None).holding_until(until);
        }
        let inner = &*self.inner;
        let Grant { fencing_token, granted_at, lock } = grant;
        let renewal = match lease {
            Lease::Renewed(_) => lock.renewal(),
            Lease::Fixed(_) => None,
        };
        if renewal.is_none() && matches!(lease, Lease::Renewed(_)) {
            // Not time-bound (an in-process lock kept by its guard): no deadline, no watchdog.
            let lost = lost.unwrap_or_else(LostSignal::never);
            let holding = acquiring.granted(&inner.telemetry, &name, fencing_token, &lost, granted_at);
            return LockGuard::new(name, fencing_token, lock, (inner.bound, inner.kind), lost, holding);
        }
        self.timed_guard(name, lease, Grant { fencing_token, granted_at, lock }, renewal, lost, acquiring)
    }

    /// [`guard`](Self::guard) of a time-bound lock: a fixed lease (`renewal` is `None`), or one
    /// the watchdog renews.
    #[inline(never)]
    fn timed_guard(
        &self,
        name: Arc<str>,
        lease: Lease,
        grant: Grant,
        renewal: Option<Box<dyn crate::backend::Renewal>>,
        lost: Option<LostSignal>,
        acquiring: Acquiring,
    ) -> LockGuard {
        let inner = &*self.inner;
        let Grant { fencing_token, granted_at, lock } = grant;
        let lost = lost.unwrap_or_default();
        let granted_at = granted_at.unwrap_or_else(crate::clock::now);
        lost.set_deadline(crate::clock::trusted_until(granted_at, lease.duration()));
        let mut holding = acquiring.granted(&inner.telemetry, &name, fencing_token, &lost, Some(granted_at));
        if let Some(renewal) = renewal {
            let renewed = watchdog::Renewed { renewal, bound: inner.bound, telemetry: holding.renewals() };
            holding.keep_watchdog(watchdog::spawn(renewed, lease.duration(), lost.clone()));
        }
        LockGuard::new(name, fencing_token, lock, (inner.bound, inner.kind), lost, holding)
    }

    /// Attempts until granted, the deadline (`wait` from `started`) passes, or the retry budget
    /// is spent. `busy`: a first attempt already made on the fast path found the lock held.
    ///
    /// The acquisition owns the backend state of this call: whenever this future is dropped or
    /// returns without a grant, dropping it cleans up.
    async fn acquire_slow(
        &self,
        plan: Plan,
        started: Instant,
        busy: bool,
        mut acquiring: Acquiring,
    ) -> Result<LockGuard, LockError> {
        let acquired = self.acquire_within(plan, started, busy, &mut acquiring).await;
        if let Err(e) = &acquired {
            acquiring.waited_since(started);
            acquiring.failed(e);
        }
        acquired
    }

    /// [`acquire_slow`](Self::acquire_slow), keeping `acquiring`'s count of attempts.
    async fn acquire_within(
        &self,
        plan: Plan,
        started: Instant,
        busy: bool,
        acquiring: &mut Acquiring,
    ) -> Result<LockGuard, LockError> {
        let backend = &*self.inner.backend;
        let bound = self.inner.bound;
        let lost = LostSignal::new();
        let mut acquisition = backend.begin(plan.req.clone(), lost.clone());
        let deadline = started.checked_add(plan.wait).unwrap_or(started);
        let contended =
            |attempts| LockError::Contended { name: plan.req.name.to_string(), waited: started.elapsed(), attempts };
        let mut attempts = 1u32;
        if !busy {
            match self.bounded(&plan, "acquire", bound, acquisition.attempt()).await? {
                Attempt::Acquired(grant) => {
                    acquiring.waited_since(started);
                    return Ok(self.guard(
                        plan.req.name,
                        plan.req.lease,
                        grant,
                        Some(lost),
                        acquiring.take(),
                        plan.hold,
                    ));
                }
                Attempt::Busy => {}
            }
        }
        let _waiting = acquiring.waiting();
        let grant = loop {
            if crate::clock::now() >= deadline || plan.retry.is_some_and(|r| attempts > r) {
                return Err(contended(attempts));
            }
            let bound_wait = deadline.saturating_duration_since(crate::clock::now()).saturating_add(bound);
            match self.bounded(&plan, "wait for", bound_wait, acquisition.wait(deadline)).await? {
                Wake::Acquired(grant) => break grant,
                Wake::TimedOut => return Err(contended(attempts)),
                Wake::Retry => {}
            }
            attempts += 1;
            acquiring.attempts(attempts);
            match self.bounded(&plan, "acquire", bound, acquisition.attempt()).await? {
                Attempt::Acquired(grant) => break grant,
                Attempt::Busy => {}
            }
        };
        acquiring.waited_since(started);
        Ok(self.guard(plan.req.name, plan.req.lease, grant, Some(lost), acquiring.take(), plan.hold))
    }

    /// Takes a lock of `kind` (see [`crate::kinds`]): the policy of an awaited [`LockRequest`],
    /// after checking that the backend offers the kind.
    pub(crate) async fn acquire_kind(
        &self,
        name: Arc<str>,
        kind: LockKind,
        options: LockOptions,
    ) -> Result<LockGuard, LockError> {
        // In the caller's context: its span is the parent of `lock.acquire` and `lock.hold`.
        let mut acquiring = self.inner.telemetry.acquiring(&name);
        let mut plan = match self.plan(name, options, &acquiring) {
            Ok(plan) => plan,
            Err(e) => {
                acquiring.failed(&e);
                return Err(e);
            }
        };
        if !self.inner.backend.supports(kind) {
            let e = crate::kinds::unsupported(&plan.req.name, self.inner.kind, kind);
            acquiring.failed(&e);
            return Err(e);
        }
        plan.req.kind = kind;
        match self.attempt_now(plan, acquiring) {
            FastPath::Done(done) => done,
            FastPath::Slow { plan, busy, acquiring } => {
                self.acquire_slow(plan, crate::clock::now(), busy, acquiring).await
            }
        }
    }

    async fn bounded<T>(
        &self,
        plan: &Plan,
        operation: &'static str,
        bound: Duration,
        fut: impl Future<Output = Result<T, LockError>>,
    ) -> Result<T, LockError> {
        match crate::bounded::bounded(bound, fut).await {
            Some(result) => result,
            None => Err(LockError::timed_out(&*plan.req.name, self.inner.kind, operation, bound)),
        }
    }
}

/// A validated request: what the backend is asked for, and the policy around it.
struct Plan {
    req: Acquire,
    wait: Duration,
    retry: Option<u32>,
    /// `hold_at_least`, if given.
    hold: Option<Duration>,
}

/// How the fast path ended.
enum FastPath {
    /// With a guard or an error.
    Done(Result<LockGuard, LockError>),
    /// Without a verdict: the acquisition goes on in the background; `busy` when an attempt
    /// already found the lock held.
    Slow { plan: Plan, busy: bool, acquiring: Acquiring },
}

/// A lock request being configured: `.await` it for a [`LockGuard`].
///
/// Created by [`LockManager::lock`]. Every knob is optional and falls back to the manager's
/// defaults.
#[derive(Debug)]
#[must_use = "a lock request does nothing until it is awaited"]
pub struct LockRequest<'m> {
    pub(crate) manager: &'m LockManager,
    pub(crate) name: Arc<str>,
    pub(crate) options: LockOptions,
}

impl LockRequest<'_> {
    /// The longest time to wait for the lock; `Duration::ZERO` makes one attempt.
    pub fn wait(mut self, wait: Duration) -> Self {
        self.options = self.options.wait(wait);
        self
    }

    /// A fixed lease: the lock expires after it unless released; no watchdog renewal.
    pub fn lease(mut self, lease: Duration) -> Self {
        self.options = self.options.lease(lease);
        self
    }

    /// At most this many further attempts after the first, within `wait`.
    pub fn retry(mut self, retry: u32) -> Self {
        self.options = self.options.retry(retry);
        self
    }

    /// Keeps the name taken until `hold` after the grant, even when the guard is released (or
    /// dropped) earlier: ShedLock's `lockAtLeastFor`, for a scheduled job that runs on several
    /// instances whose clocks differ a little. A 50 ms job started by each instance's timer at
    /// "12:00:00" by its own clock thus runs once, not once per instance whose timer fires
    /// after the first one finished.
    ///
    /// The remainder is counted from before the request was sent and handed to the store as a
    /// duration, which counts it on its own clock (Redis sets the key's expiry to it instead of
    /// deleting it; ZooKeeper's node is deleted when the remainder recorded in it has passed;
    /// the in-process store keeps the entry held): the clocks of the instances need not agree.
    /// Waiters are woken when the remainder ends. A release after `hold` is a plain release.
    /// The remainder outlives the guard but not the holder's process on ZooKeeper (its session
    /// ends, and its node with it) nor the in-process store. At most the fixed `lease`, if
    /// one is given.
    ///
    /// ```
    /// # use std::time::Duration;
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), lock_runtime::LockError> {
    /// let manager = lock_runtime::LockManager::memory();
    /// let guard = manager.lock("nightly").hold_at_least(Duration::from_millis(200)).wait(Duration::ZERO).await?;
    /// guard.release().await?; // the job took no time
    /// assert!(manager.try_lock("nightly").await?.is_none()); // still taken for ~200 ms
    /// tokio::time::sleep(Duration::from_millis(250)).await;
    /// assert!(manager.try_lock("nightly").await?.is_some());
    /// # Ok(()) }
    /// ```
    pub fn hold_at_least(mut self, hold: Duration) -> Self {
        self.options = self.options.hold_at_least(hold);
        self
    }

    /// Replaces all options at once.
    pub fn options(mut self, options: LockOptions) -> Self {
        self.options = options;
        self
    }
}

impl<'m> IntoFuture for LockRequest<'m> {
    type Output = Result<LockGuard, LockError>;
    type IntoFuture = LockFuture<'m>;

    fn into_future(self) -> LockFuture<'m> {
        LockFuture { state: LockFutureState::Start(self) }
    }
}

/// The future of an awaited [`LockRequest`]. On an in-process backend an uncontended lock is
/// taken on the first poll without allocating; otherwise the acquisition runs boxed.
#[must_use = "futures do nothing unless polled"]
pub struct LockFuture<'m> {
    state: LockFutureState<'m>,
}

enum LockFutureState<'m> {
    Start(LockRequest<'m>),
    Running(BoxFuture<'m, Result<LockGuard, LockError>>),
    Done,
}

impl LockFuture<'_> {
    /// Whether it has completed (it owns nothing any more).
    pub(crate) fn is_done(&self) -> bool {
        matches!(self.state, LockFutureState::Done)
    }
}

impl std::fmt::Debug for LockFuture<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LockFuture").finish_non_exhaustive()
    }
}

impl Future for LockFuture<'_> {
    type Output = Result<LockGuard, LockError>;

    fn poll(mut self: std::pin::Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> std::task::Poll<Self::Output> {
        use std::task::Poll;
        if let LockFutureState::Start(_) = self.state {
            // An in-process lock may be taken without ever returning `Pending`: spend the task's
            // cooperative budget like tokio's own primitives (yielding when it is used up), so a
            // tight lock loop cannot starve the other tasks and timers of its worker.
            let coop = std::task::ready!(tokio::task::coop::poll_proceed(cx));
            let LockFutureState::Start(request) = std::mem::replace(&mut self.state, LockFutureState::Done) else {
                return Poll::Ready(Err(polled_after_completion())); // not reached: matched above
            };
            let LockRequest { manager, name, options } = request;
            // In the caller's context: its span is the parent of `lock.acquire` and `lock.hold`.
            let mut acquiring = manager.inner.telemetry.acquiring(&name);
            let plan = match manager.plan(name, options, &acquiring) {
                Ok(plan) => plan,
                Err(e) => {
                    acquiring.failed(&e);
                    return Poll::Ready(Err(e));
                }
            };
            let (plan, busy, acquiring) = if let Some(memory) = &manager.inner.memory {
                // The built-in in-process store: the guard is built right here, the plan moved
                // only once granted.
                match memory.try_acquire_granted(&plan.req) {
                    Some(granted) => {
                        coop.made_progress();
                        let (lease, hold) = (plan.req.lease, plan.hold);
                        let (name, grant) = memory.grant_taking(granted, plan.req);
                        return Poll::Ready(Ok(manager.guard(name, lease, grant, None, acquiring, hold)));
                    }
                    None => (plan, true, acquiring),
                }
            } else {
                match manager.attempt_now(plan, acquiring) {
                    FastPath::Done(Ok(guard)) => {
                        coop.made_progress();
                        return Poll::Ready(Ok(guard));
                    }
                    FastPath::Done(Err(e)) => return Poll::Ready(Err(e)),
                    FastPath::Slow { plan, busy, acquiring } => (plan, busy, acquiring),
                }
            };
            let started = crate::clock::now();
            self.state = LockFutureState::Running(Box::pin(manager.acquire_slow(plan, started, busy, acquiring)));
        }
        match &mut self.state {
            LockFutureState::Running(fut) => {
                let out = fut.as_mut().poll(cx);
                if out.is_ready() {
                    self.state = LockFutureState::Done;
                }
                out
            }
            _ => Poll::Ready(Err(polled_after_completion())),
        }
    }
}

#[cold]
fn polled_after_completion() -> LockError {
    LockError::invalid("", "a lock future was polled after it completed")
}
