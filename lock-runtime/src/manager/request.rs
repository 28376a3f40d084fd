//! [`LockRequest`]: one lock asked for, configured, then awaited ([`LockFuture`]) or run
//! ([`LockRequest::run`](crate::LockRequest::run)).

use std::future::{Future, IntoFuture};
use std::sync::Arc;

use super::acquire::FastPath;
use super::LockManager;
use crate::backend::{BoxFuture, LockKind};
use crate::error::LockError;
use crate::guard::LockGuard;
use crate::options::LockOptions;

/// A lock request being configured: `.await` it for a [`LockGuard`], or
/// [`run`](LockRequest::run) a future under it.
///
/// One request for every kind: created by [`LockManager::lock`] (a mutex),
/// [`read_lock`](LockManager::read_lock), [`write_lock`](LockManager::write_lock) and
/// [`semaphore`](LockManager::semaphore). Every knob is optional and falls back to the
/// manager's defaults.
#[derive(Debug)]
#[must_use = "a lock request does nothing until it is awaited"]
pub struct LockRequest<'m> {
    pub(crate) manager: &'m LockManager,
    pub(crate) name: Arc<str>,
    pub(crate) kind: LockKind,
    pub(crate) options: LockOptions,
}

impl LockRequest<'_> {
    /// Which kind of lock it asks for.
    ///
    /// ```
    /// use lock_runtime::{backend::LockKind, LockManager};
    /// let manager = LockManager::memory();
    /// assert_eq!(manager.lock("a").kind(), LockKind::Exclusive);
    /// assert_eq!(manager.semaphore("a", 3).kind(), LockKind::Semaphore { permits: 3 });
    /// ```
    pub fn kind(&self) -> LockKind {
        self.kind
    }

    crate::options::option_setters!();

    /// Takes the lock inside the caller's own transaction, where a store can (PostgreSQL: a
    /// tokio-postgres `&Transaction`, or `&mut *tx` of a `sqlx::Transaction`; see
    /// [`LockInTransaction`](crate::backend::LockInTransaction)): held until the transaction
    /// commits or rolls back, with no guard, no connection of the manager's and no session of
    /// its own, so it works through any pooler. Its key has the manager's prefix, as the
    /// manager's other locks of the name do, so the two exclude each other: the lock a handler
    /// takes here and the one an attribute takes on `order:42`. Returns the fencing token.
    ///
    /// The request's `wait` (or the manager's default) applies; `lease`, `retry` and
    /// `hold_at_least` do not (the transaction ends the lock). After
    /// [`shutdown`](LockManager::shutdown), [`is_shut_down`](LockError::is_shut_down). A kind other than a mutex is an
    /// [`is_invalid`](LockError::is_invalid) error; held past `wait`,
    /// [`is_contended`](LockError::is_contended), the transaction still usable. The rest is
    /// [`lock_in_transaction`](https://docs.rs/lock-runtime/latest/lock_runtime/backend/postgres/fn.lock_in_transaction.html)'s.
    ///
    /// ```no_run
    /// # #[cfg(feature = "postgres")]
    /// # async fn settle(db: &mut tokio_postgres::Client, manager: &lock_runtime::LockManager) -> Result<(), Box<dyn std::error::Error>> {
    /// use std::time::Duration;
    ///
    /// let tx = db.transaction().await?;
    /// let token = manager.lock("order:42").wait(Duration::from_secs(2)).in_transaction(&tx).await?;
    /// lock_runtime::fence::postgres::check(&tx, "order:42", token).await?;
    /// tx.execute("UPDATE orders SET state = 'paid' WHERE id = 42", &[]).await?;
    /// tx.commit().await?; // the lock ends here
    /// # Ok(()) }
    /// ```
    pub async fn in_transaction<T: crate::backend::LockInTransaction>(self, tx: T) -> Result<u64, LockError> {
        let inner = &*self.manager.inner;
        // As every other acquisition of a manager that was shut down.
        if inner.shutdown.is_closed() {
            return Err(LockError::ShutDown { name: self.name.to_string() });
        }
        crate::options::check_name(&self.name)?;
        if self.kind != LockKind::Exclusive {
            let why = format!("a lock in a transaction is a mutex; {:?} was asked for", self.kind);
            return Err(LockError::invalid(&*self.name, why));
        }
        let wait = self.options.wait_for().unwrap_or(inner.default_wait);
        crate::options::check_wait(&self.name, wait)?;
        let key = format!("{}{}", inner.prefix, self.name);
        tx.lock_key(&key, wait).await
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
            let LockRequest { manager, name, kind, options } = request;
            if kind != LockKind::Exclusive {
                // The other kinds: one boxed acquisition (the mutex's fast path stays as it was).
                self.state = LockFutureState::Running(manager.acquire_kind(name, kind, options));
            } else {
                // In the caller's context: its span is the parent of `lock.acquire` and `lock.hold`.
                let mut acquiring = manager.inner.telemetry.acquiring(&name);
                let plan = match manager.plan(name, LockKind::Exclusive, &options, &acquiring) {
                    Ok(plan) => plan,
                    Err(e) => {
                        acquiring.failed(&e);
                        return Poll::Ready(Err(e));
                    }
                };
                let (plan, busy, acquiring) = if let Some(memory) = &manager.inner.memory {
                    // The built-in in-process store: the guard is built right here, the plan
                    // moved only once granted.
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
