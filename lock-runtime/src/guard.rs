//! [`LockGuard`]: a held lock.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::task::AbortHandle;

use crate::backend::Held;
use crate::error::LockError;
use crate::lost::LostSignal;
use crate::telemetry::{self, Holding};

/// A held lock. Release it with [`release`](LockGuard::release) to learn whether it was still
/// held; dropping it also releases, in the background (never blocking in `Drop`), and if even
/// that cannot run, the lease is the safety net.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), lock_runtime::LockError> {
/// let manager = lock_runtime::LockManager::memory();
/// let guard = manager.lock("invoice:9").await?;
/// println!("{} held with token {}", guard.key(), guard.fencing_token());
/// guard.release().await?;
/// # Ok(()) }
/// ```
#[must_use = "the lock is released as soon as the guard is dropped"]
pub struct LockGuard {
    state: Option<State>,
    name: Arc<str>,
    fencing_token: u64,
    lost: LostSignal,
}

/// What a guard needs until its lock is released.
struct State {
    lock: Held,
    /// The lease watchdog of a lock it renews: stopped when the lock is released (or its
    /// release given up).
    watchdog: Option<AbortHandle>,
    /// The `lock.hold` span and the metrics of the holding: they end with the state.
    holding: Holding,
    /// `hold_at_least`: the name stays taken until then, even when released earlier.
    hold_until: Option<Instant>,
}

impl std::fmt::Debug for LockGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LockGuard")
            .field("key", &self.key())
            .field("fencing_token", &self.fencing_token())
            .field("lost", &self.is_lost())
            .finish()
    }
}

impl LockGuard {
    pub(crate) fn new(
        name: Arc<str>,
        fencing_token: u64,
        lock: Held,
        bound: (Duration, &'static str),
        lost: LostSignal,
        holding: Holding,
    ) -> Self {
        let mut lock = lock;
        lock.bound_by(bound);
        let state = State { lock, watchdog: None, holding, hold_until: None };
        LockGuard { state: Some(state), name, fencing_token, lost }
    }

    /// Keeps the lease watchdog renewing this lock, to stop it on release.
    pub(crate) fn renewed_by(mut self, watchdog: AbortHandle) -> Self {
        match &mut self.state {
            Some(state) => state.watchdog = Some(watchdog),
            None => watchdog.abort(),
        }
        self
    }

    /// Drops a `hold_at_least`: the next release frees the name at once (a partial
    /// `lock_all` rolled back must not keep the names it took).
    pub(crate) fn without_hold(mut self) -> Self {
        if let Some(state) = &mut self.state {
            state.hold_until = None;
        }
        self
    }

    /// Keeps the name taken until `until` when released earlier (`hold_at_least`).
    pub(crate) fn holding_until(mut self, until: Option<Instant>) -> Self {
        if let Some(state) = &mut self.state {
            // Overflowing `Instant`: held for as long as the lease lets it.
            state.hold_until = Some(until.unwrap_or_else(|| crate::clock::now() + crate::options::MAX_LEASE));
        }
        self
    }

    /// Its lock as the manager's shutdown releases it, told this guard's signal and
    /// `hold_at_least` (`None` for an in-process lock, or once released).
    pub(crate) fn shared_for_shutdown(&self) -> Option<&Arc<crate::backend::SharedHeld>> {
        let state = self.state.as_ref()?;
        let shared = state.lock.shared()?;
        shared.held_by(&self.name, &self.lost, state.hold_until);
        Some(shared)
    }

    #[inline(always)]
    pub(crate) fn hold_span(&self) -> Option<&tracing::Span> {
        self.state.as_ref().and_then(|state| state.holding.span())
    }

    /// The lock's name, e.g. `"order:42"` (without the manager prefix).
    #[allow(clippy::misnamed_getters)] // the key users see is the name, not the prefixed backend key
    pub fn key(&self) -> &str {
        &self.name
    }

    /// The shared name, for holders that keep it beyond the guard's borrow.
    pub(crate) fn name(&self) -> &Arc<str> {
        &self.name
    }

    /// Strictly greater than every earlier token for this name: hand it to downstream stores
    /// so they can reject writes from a holder that lost the lock.
    pub fn fencing_token(&self) -> u64 {
        self.fencing_token
    }

    /// Completes when the lock is lost: its lease ran out unrenewed, a renewal was refused, or
    /// the backend reported the loss. Never completes while the lock is held.
    ///
    /// ```
    /// # use std::time::{Duration, Instant};
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), lock_runtime::LockError> {
    /// let manager = lock_runtime::LockManager::memory();
    /// let guard = manager.lock("short").lease(Duration::from_millis(20)).await?;
    /// guard.lost().await; // the fixed lease runs out
    /// assert!(guard.release().await.unwrap_err().is_lost());
    /// # Ok(()) }
    /// ```
    pub async fn lost(&self) {
        self.lost.wait().await
    }

    /// Whether the lock is known to be lost (see [`lost`](LockGuard::lost)).
    pub fn is_lost(&self) -> bool {
        self.lost.is_lost()
    }

    /// The signal behind [`lost`](LockGuard::lost), for code that must outlive the borrow.
    pub(crate) fn lost_signal(&self) -> &LostSignal {
        &self.lost
    }

    /// Releases the lock. An [`is_lost`](LockError::is_lost) error means it was no longer held
    /// (the lease ran out or it was taken away): work done under it may not have been exclusive.
    pub fn release(self) -> ReleaseFuture {
        ReleaseFuture { guard: Some(self), remote: None }
    }

    /// Releases at once when the backend can (an in-process one): `Some(verdict)`, as
    /// [`release`](LockGuard::release) would give. `None`: the backend's release must be awaited.
    #[inline(always)]
    pub(crate) fn release_at_once(&mut self) -> Option<Result<(), LockError>> {
        let Some(state) = &mut self.state else { return Some(Ok(())) };
        state.stop_watchdog();
        let released = match state.remaining() {
            None => state.lock.release_now()?,
            Some(remaining) => state.lock.release_after_now(remaining)?,
        };
        self.state = None;
        // Spelled out so that the common verdict is built in place, not copied.
        Some(match released {
            Ok(()) if !self.lost.can_fire() => Ok(()),
            released => self.verdict(released),
        })
    }

    /// The verdict of a release: a lock already known to be lost is reported lost.
    #[inline]
    fn verdict(&self, released: Result<(), LockError>) -> Result<(), LockError> {
        if !self.lost.can_fire() {
            return released;
        }
        self.verdict_of_losable(released)
    }

    #[inline(never)]
    fn verdict_of_losable(&self, released: Result<(), LockError>) -> Result<(), LockError> {
        match self.lost.reason() {
            Some(reason) => Err(LockError::lost(&*self.name, reason)),
            None => released,
        }
    }
}

/// The future of [`LockGuard::release`]. An in-process backend releases on the first poll
/// without allocating; a networked one runs its release, bounded by its operation timeout.
#[must_use = "futures do nothing unless polled; dropping this releases in the background"]
pub struct ReleaseFuture {
    guard: Option<LockGuard>,
    remote: Option<crate::backend::BoxFuture<'static, Result<(), LockError>>>,
}

impl std::fmt::Debug for ReleaseFuture {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReleaseFuture").finish_non_exhaustive()
    }
}

impl std::future::Future for ReleaseFuture {
    type Output = Result<(), LockError>;

    fn poll(mut self: std::pin::Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> std::task::Poll<Self::Output> {
        use std::task::Poll;
        if let Some(remote) = &mut self.remote {
            return remote.as_mut().poll(cx);
        }
        // Released in place: an in-process lock is released without moving the guard.
        let Some(guard) = &mut self.guard else { return Poll::Ready(Ok(())) };
        match guard.release_at_once() {
            Some(Ok(())) => {
                self.guard = None;
                return Poll::Ready(Ok(()));
            }
            Some(Err(e)) => {
                self.guard = None;
                return Poll::Ready(Err(e));
            }
            None => {}
        }
        let Some(mut guard) = self.guard.take() else { return Poll::Ready(Ok(())) };
        // The guard keeps its state until the release is answered: if this future is dropped
        // half-way, the guard's `Drop` still releases in the background.
        let mut remote: crate::backend::BoxFuture<'static, _> = Box::pin(async move {
            let released = match &mut guard.state {
                Some(state) => release_remote(&guard.name, state).await,
                None => Ok(()),
            };
            guard.state = None;
            guard.verdict(released)
        });
        let polled = remote.as_mut().poll(cx);
        self.remote = Some(remote);
        polled
    }
}

impl State {
    /// Stops the watchdog, if any.
    #[inline]
    fn stop_watchdog(&self) {
        if let Some(watchdog) = &self.watchdog {
            watchdog.abort();
        }
    }

    /// What is left of `hold_at_least`, if anything.
    #[inline]
    fn remaining(&self) -> Option<Duration> {
        let until = self.hold_until?;
        Some(until.saturating_duration_since(crate::clock::now())).filter(|d| !d.is_zero())
    }
}

async fn release_remote(name: &str, state: &mut State) -> Result<(), LockError> {
    let (bound, kind) = state.lock.bound();
    let release = match state.remaining() {
        None => state.lock.release(),
        Some(remaining) => state.lock.release_after(remaining),
    };
    match crate::bounded::bounded(bound, release).await {
        // A backend's refusal of `release_after` (the trait's default) names no lock.
        Some(Err(LockError::Invalid { name: unnamed, reason })) if unnamed.is_empty() => {
            Err(LockError::invalid(name, reason))
        }
        Some(result) => result,
        None => Err(LockError::timed_out(name, kind, "release", bound)),
    }
}

impl Drop for LockGuard {
    #[inline]
    fn drop(&mut self) {
        if self.state.is_some() {
            self.release_on_drop();
        }
    }
}

impl LockGuard {
    #[inline(never)]
    fn release_on_drop(&mut self) {
        let Some(mut state) = self.state.take() else { return };
        state.stop_watchdog();
        let at_once = match state.remaining() {
            None => state.lock.release_now(),
            Some(remaining) => state.lock.release_after_now(remaining),
        };
        if at_once.is_some() {
            return;
        }
        let name = self.name.clone();
        let names = state.holding.names();
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                // Sent from here (polled once now, the rest in the background): ahead of any
                // command this task sends next, such as a `try_lock` of the same name.
                let release = async move {
                    if let Err(e) = release_remote(&name, &mut state).await {
                        let (lock, error) = (names.render(&name), telemetry::ShownError(&e, names));
                        let lock = lock.as_deref().unwrap_or("<hidden>");
                        if e.is_backend() {
                            tracing::warn!(lock, error = %error, "release on drop failed; the lease will free it")
                        } else {
                            tracing::debug!(lock, error = %error, "release on drop failed")
                        }
                    }
                };
                crate::background::finish_in_background(
                    &runtime,
                    release,
                    "could not release a dropped guard's lock; its lease will free it",
                );
            }
            Err(_) => {
                let lock = names.render(&name);
                let lock = lock.as_deref().unwrap_or("<hidden>");
                tracing::warn!(lock, "guard dropped outside a tokio runtime; the lease will free the lock");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    /// A guard is moved on every lock and release (into the result, out of it, into the
    /// release): up to 128 bytes it moves in registers, larger it is copied by a call to
    /// `memcpy`, which cost the in-process lock cycle about a hundred instructions. (With the
    /// `metrics` feature the holding carries its gauges too, and a guard is 144 bytes.)
    #[cfg(not(feature = "metrics"))]
    #[test]
    fn a_guard_moves_without_memcpy() {
        assert!(std::mem::size_of::<super::LockGuard>() <= 128, "{}", std::mem::size_of::<super::LockGuard>());
    }
}
