//! The acquisition policy of every request: validation, the fast path, the deadline and retry
//! accounting, time bounds, and the guard a grant becomes.

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::LockManager;
use crate::backend::{Acquire, Attempt, BoxFuture, Grant, Lease, LockKind, OwnerId, Wake};
use crate::error::LockError;
use crate::guard::LockGuard;
use crate::lost::LostSignal;
use crate::options::{self, LockOptions};
use crate::telemetry::Acquiring;
use crate::watchdog;

impl LockManager {
    /// Validates a request and works out what to ask the backend for. (Inlined into the
    /// mutex's fast path, as when it was its only caller: the plan is built in place.)
    #[inline(always)]
    pub(super) fn plan(
        &self,
        name: Arc<str>,
        kind: LockKind,
        options: &LockOptions,
        acquiring: &Acquiring,
    ) -> Result<Plan, LockError> {
        let inner = &*self.inner;
        if inner.shutdown.is_closed() {
            return Err(shut_down(&name));
        }
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
        if kind != LockKind::Exclusive {
            self.check_kind(&name, kind)?;
        }
        acquiring.planned(wait, lease);
        let key: Arc<str> =
            if inner.prefix.is_empty() { name.clone() } else { Arc::from(format!("{}{}", inner.prefix, name)) };
        let req = Acquire { name, key, owner: OwnerId::next(), holder: inner.holder.clone(), lease, kind };
        Ok(Plan { req, wait, retry: options.retries(), hold: options.hold_at_least_for() })
    }

    /// The synchronous fast path of other in-process backends: one attempt, no allocation for
    /// the future or the lost signal; without a verdict, the plan is given back with whether
    /// the lock was found held. (The built-in store's is in [`LockFuture::poll`].)
    #[inline(always)]
    pub(super) fn attempt_now(&self, plan: Plan, mut acquiring: Acquiring) -> FastPath {
        match self.inner.backend.try_acquire_now(&plan.req) {
            Some(Ok(Attempt::Acquired(grant))) => FastPath::Done(self.admit_now(self.guard(
                plan.req.name,
                plan.req.lease,
                grant,
                None,
                acquiring,
                plan.hold,
            ))),
            Some(Ok(Attempt::Busy | Attempt::Split)) => FastPath::Slow { plan, busy: true, acquiring },
            Some(Err(e)) => {
                acquiring.failed(&e);
                FastPath::Done(Err(e))
            }
            None => FastPath::Slow { plan, busy: false, acquiring },
        }
    }

    /// Wraps a grant into a guard; starts the watchdog when the lease needs renewing. `hold`:
    /// `hold_at_least`, counted from now, when the grant's reply is in: the store granted the
    /// name before that, so it stays taken at least `hold` after the grant, however long the
    /// reply took (the lease is counted from before the request, the other way round).
    #[inline(always)]
    pub(super) fn guard(
        &self,
        name: Arc<str>,
        lease: Lease,
        grant: Grant,
        lost: Option<LostSignal>,
        acquiring: Acquiring,
        hold: Option<Duration>,
    ) -> LockGuard {
        if let Some(hold) = hold {
            let until = crate::clock::now().checked_add(hold);
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
        let holding = acquiring.granted(&inner.telemetry, &name, fencing_token, &lost, Some(granted_at));
        let watchdog = renewal.map(|renewal| {
            let renewed = watchdog::Renewed { renewal, bound: inner.bound, telemetry: holding.renewals() };
            watchdog::spawn(renewed, lease.duration(), lost.clone())
        });
        let guard = LockGuard::new(name, fencing_token, lock, (inner.bound, inner.kind), lost, holding);
        match watchdog {
            Some(watchdog) => guard.renewed_by(watchdog),
            None => guard,
        }
    }

    /// Attempts until granted, the deadline (`wait` from `started`) passes, or the retry budget
    /// is spent. `busy`: a first attempt already made on the fast path found the lock held.
    ///
    /// The acquisition owns the backend state of this call: whenever this future is dropped or
    /// returns without a grant, dropping it cleans up.
    pub(super) async fn acquire_slow(
        &self,
        plan: Plan,
        started: Instant,
        busy: bool,
        mut acquiring: Acquiring,
    ) -> Result<LockGuard, LockError> {
        // (The plan lent, not moved: an `async fn` keeps what it is given in its state, and this
        // future is boxed on every acquisition that is not granted at once.)
        let acquired = self.acquire_within(&plan, started, busy, &mut acquiring).await;
        if let Err(e) = &acquired {
            acquiring.waited_since(started);
            acquiring.failed(e);
        }
        acquired
    }

    /// [`acquire_slow`](Self::acquire_slow), keeping `acquiring`'s count of attempts.
    async fn acquire_within(
        &self,
        plan: &Plan,
        started: Instant,
        busy: bool,
        acquiring: &mut Acquiring,
    ) -> Result<LockGuard, LockError> {
        let backend = &*self.inner.backend;
        let bound = self.inner.bound;
        let lost = LostSignal::new();
        let mut acquisition = backend.begin(plan.req.clone(), lost.clone());
        let deadline = started.checked_add(plan.wait).unwrap_or(started);
        let contended = |attempts, held| LockError::Contended {
            name: plan.req.name.to_string(),
            waited: started.elapsed(),
            attempts,
            held,
        };
        let mut attempts = 1u32;
        // What the last attempt found: another owner's (`true`), or a split with nobody holding.
        let mut held = true;
        if !busy {
            match self.bounded(&plan.req.name, "acquire", bound, acquisition.attempt()).await? {
                Attempt::Acquired(grant) => {
                    acquiring.waited_since(started);
                    let guard = self.guard(
                        plan.req.name.clone(),
                        plan.req.lease,
                        grant,
                        Some(lost),
                        acquiring.take(),
                        plan.hold,
                    );
                    return self.admit(guard).await;
                }
                Attempt::Busy => {}
                Attempt::Split => held = false,
            }
        }
        let _waiting = acquiring.waiting();
        let grant = loop {
            if crate::clock::now() >= deadline || plan.retry.is_some_and(|r| attempts > r) {
                return Err(contended(attempts, held));
            }
            let bound_wait = deadline.saturating_duration_since(crate::clock::now()).saturating_add(bound);
            let wait = self.bounded(&plan.req.name, "wait for", bound_wait, acquisition.wait(deadline));
            // A shutdown ends the wait (dropping the acquisition cleans up).
            let woken = tokio::select! {
                biased;
                () = self.inner.shutdown.closed() => return Err(shut_down(&plan.req.name)),
                woken = wait => woken?,
            };
            match woken {
                Wake::Acquired(grant) => break grant,
                Wake::TimedOut => return Err(contended(attempts, held)),
                Wake::Retry => {}
            }
            attempts += 1;
            acquiring.attempts(attempts);
            match self.bounded(&plan.req.name, "acquire", bound, acquisition.attempt()).await? {
                Attempt::Acquired(grant) => break grant,
                Attempt::Busy => held = true,
                Attempt::Split => held = false,
            }
        };
        acquiring.waited_since(started);
        let guard = self.guard(plan.req.name.clone(), plan.req.lease, grant, Some(lost), acquiring.take(), plan.hold);
        self.admit(guard).await
    }

    /// The acquisition of a kind beside the mutex (a read lock, a write lock, a permit): the
    /// policy of the mutex's, boxed as one future, out of the mutex's fast path.
    #[cold]
    #[inline(never)]
    pub(super) fn acquire_kind(
        &self,
        name: Arc<str>,
        kind: LockKind,
        options: LockOptions,
    ) -> BoxFuture<'_, Result<LockGuard, LockError>> {
        Box::pin(async move {
            // Polled first in the caller's context: its span is the parent of `lock.acquire`.
            let mut acquiring = self.inner.telemetry.acquiring(&name);
            let plan = match self.plan(name, kind, &options, &acquiring) {
                Ok(plan) => plan,
                Err(e) => {
                    acquiring.failed(&e);
                    return Err(e);
                }
            };
            match self.attempt_now(plan, acquiring) {
                FastPath::Done(done) => done,
                FastPath::Slow { plan, busy, acquiring } => {
                    self.acquire_slow(plan, crate::clock::now(), busy, acquiring).await
                }
            }
        })
    }

    /// The checks of a kind beside the mutex, on every path that takes one (awaited, tried,
    /// run, the attribute): permits, whether the backend offers it, and whether the task
    /// already holds the name in a way this request cannot re-enter (a write inside a read, a
    /// semaphore's permits that differ from the held one's).
    #[cold]
    #[inline(never)]
    fn check_kind(&self, name: &str, kind: LockKind) -> Result<(), LockError> {
        if let LockKind::Semaphore { permits: 0 } = kind {
            return Err(LockError::invalid(name, "a semaphore of 0 permits admits nobody; give at least 1"));
        }
        if !self.inner.backend.supports(kind) {
            return Err(super::kinds::unsupported(name, self.inner.kind, kind));
        }
        match crate::context::lookup(self.id(), name, kind).held {
            Some(outer) => crate::context::check_reentry(name, kind, &outer),
            None => Ok(()),
        }
    }

    /// `fut`, a backend operation on `name`, cut after `bound` with a timed-out error.
    pub(crate) async fn bounded<T>(
        &self,
        name: &str,
        operation: &'static str,
        bound: Duration,
        fut: impl Future<Output = Result<T, LockError>>,
    ) -> Result<T, LockError> {
        match crate::bounded::bounded(bound, fut).await {
            Some(result) => result,
            None => Err(LockError::timed_out(name, self.inner.kind, operation, bound)),
        }
    }
}

/// A validated request: what the backend is asked for, and the policy around it.
pub(super) struct Plan {
    pub(super) req: Acquire,
    wait: Duration,
    retry: Option<u32>,
    /// `hold_at_least`, if given.
    pub(super) hold: Option<Duration>,
}

/// How the fast path ended.
pub(super) enum FastPath {
    /// With a guard or an error.
    Done(Result<LockGuard, LockError>),
    /// Without a verdict: the acquisition goes on in the background; `busy` when an attempt
    /// already found the lock held.
    Slow { plan: Plan, busy: bool, acquiring: Acquiring },
}

/// The error of a request made to a manager that was shut down.
#[cold]
#[inline(never)]
fn shut_down(name: &str) -> LockError {
    LockError::ShutDown { name: name.to_owned() }
}
