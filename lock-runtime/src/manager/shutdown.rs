//! [`LockManager::shutdown`]: a process that stops leaves nothing behind in the store.
//!
//! The manager keeps a registry of the locks its acquisitions were granted on a networked
//! store (weak references: a released lock leaves it by itself). The shutdown closes the
//! manager (no acquisition is granted after it; waits and campaigns under way end), releases
//! every lock still held, or waits for the release already under way (a dropped guard's), and
//! then lets the backend end what it keeps beyond its locks (a session, a lease, connections).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};

use tokio::sync::watch;

use super::LockManager;
use crate::backend::SharedHeld;
use crate::error::LockError;
use crate::guard::LockGuard;

/// A manager's shutdown state: whether it was shut down, and the locks it would release.
pub(crate) struct Shutdown {
    /// Set (under `held`'s mutex) when the shutdown begins.
    closed: AtomicBool,
    /// Wakes the waits and campaigns under way.
    signal: watch::Sender<bool>,
    held: Mutex<Registry>,
}

#[derive(Default)]
struct Registry {
    locks: Vec<Weak<SharedHeld>>,
    /// The length at which released locks are swept out (twice the live ones at the last
    /// sweep): each lock is looked at a bounded number of times.
    sweep_at: usize,
}

impl Default for Shutdown {
    fn default() -> Self {
        Shutdown { closed: AtomicBool::new(false), signal: watch::Sender::new(false), held: Mutex::default() }
    }
}

impl Shutdown {
    #[inline]
    pub(crate) fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Relaxed)
    }

    /// Completes once the shutdown began.
    pub(crate) async fn closed(&self) {
        let mut signal = self.signal.subscribe();
        let _ = signal.wait_for(|closed| *closed).await;
    }

    /// Registers a granted guard's lock for the shutdown: `false` when the shutdown began (the
    /// guard must then be released and refused).
    pub(crate) fn register(&self, guard: &LockGuard) -> bool {
        let Some(shared) = guard.shared_for_shutdown() else { return !self.is_closed() };
        let mut held = self.held.lock().unwrap_or_else(PoisonError::into_inner);
        if self.is_closed() {
            return false;
        }
        held.locks.push(Arc::downgrade(shared));
        if held.locks.len() >= held.sweep_at {
            held.locks.retain(|lock| lock.strong_count() > 0);
            held.sweep_at = (held.locks.len() * 2).max(64);
        }
        true
    }

    /// Begins the shutdown: the locks to release.
    fn close(&self) -> Vec<Arc<SharedHeld>> {
        let locks = {
            let mut held = self.held.lock().unwrap_or_else(PoisonError::into_inner);
            self.closed.store(true, Ordering::Relaxed);
            std::mem::take(&mut held.locks)
        };
        self.signal.send_replace(true);
        locks.iter().filter_map(Weak::upgrade).collect()
    }
}

impl LockManager {
    /// Shuts the manager (and every clone of it) down, so that a process that stops leaves
    /// nothing behind: the next holder gets each lock at once instead of a lease later.
    ///
    /// - No lock is granted after it: a request fails with an
    ///   [`is_shut_down`](LockError::is_shut_down) error, and so do the waits and campaigns
    ///   under way. A leader loop ([`Election::lead`](crate::Election::lead), the attribute's
    ///   `leader`) ends with that error.
    /// - Every lock still held is taken from its holder: its [`lost()`](LockGuard::lost)
    ///   fires (a locked call or a leader's term is stopped at its next poll), then the lock is
    ///   released in the store, a leadership resigned; a `hold_at_least` still running keeps
    ///   its name taken for what is left of it. The release its guard makes later does nothing
    ///   and reports the lock [`is_lost`](LockError::is_lost).
    /// - The releases of guards dropped before it, still under way in the background, are
    ///   waited for.
    /// - The store's own state ends: the etcd lease is revoked, the ZooKeeper session closed,
    ///   the SQL connections closed.
    ///
    /// Each step is bounded by the backend's operation timeout; what fails is logged. Locks of
    /// the in-process store go with their process and are left to their guards.
    ///
    /// Call it last, once the work that holds locks stopped: after a web server's graceful
    /// shutdown, which lets the requests under way finish (with axum:
    /// `axum::serve(listener, app).with_graceful_shutdown(signal).await?;` then
    /// `manager.shutdown().await;`), or after `tokio::signal::ctrl_c().await` and your own
    /// tasks' end:
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), lock_runtime::LockError> {
    /// # let dir = std::env::temp_dir().join(format!("lock-runtime-doc-shutdown-{}", std::process::id()));
    /// let manager = lock_runtime::LockManager::file(&dir)?; // or any networked store
    /// let guard = manager.lock("report").await?;
    /// // tokio::signal::ctrl_c().await; then stop the work
    /// manager.shutdown().await;
    /// assert!(guard.release().await.unwrap_err().is_lost()); // the shutdown released it
    /// assert!(manager.lock("report").await.unwrap_err().is_shut_down());
    /// # Ok(()) }
    /// ```
    ///
    /// Dropping the last clone of a manager does not take the locks whose guards are still
    /// alive (a guard may outlive its manager); their guards release them.
    pub async fn shutdown(&self) {
        let inner = &*self.inner;
        let mut releases = tokio::task::JoinSet::new();
        for lock in inner.shutdown.close() {
            releases.spawn(async move { lock.shut_down().await });
        }
        while let Some(released) = releases.join_next().await {
            match released {
                Ok(Ok(())) => {}
                Ok(Err(e)) if e.is_lost() => {}
                Ok(Err(e)) => {
                    tracing::warn!(error = %crate::telemetry::shown_error(&e), "a release at shutdown failed; the lock's lease will free it")
                }
                Err(e) => tracing::warn!(error = %e, "a release at shutdown did not finish"),
            }
        }
        if crate::bounded::bounded(inner.bound, inner.backend.shutdown()).await.is_none() {
            tracing::warn!(backend = inner.kind, bound = ?inner.bound, "the backend's shutdown did not finish in time");
        }
    }

    /// Whether [`shutdown`](Self::shutdown) was called on this manager or a clone of it.
    pub fn is_shut_down(&self) -> bool {
        self.inner.shutdown.is_closed()
    }

    /// A granted guard, registered for the shutdown; one granted after the shutdown began is
    /// released and refused.
    pub(super) async fn admit(&self, guard: LockGuard) -> Result<LockGuard, LockError> {
        if self.inner.shutdown.register(&guard) {
            return Ok(guard);
        }
        let name = guard.key().to_owned();
        let _ = guard.release().await;
        Err(LockError::ShutDown { name })
    }

    /// [`admit`](Self::admit) on the synchronous fast path: a refused guard is released by
    /// its drop.
    pub(super) fn admit_now(&self, guard: LockGuard) -> Result<LockGuard, LockError> {
        if self.inner.shutdown.register(&guard) {
            return Ok(guard);
        }
        Err(LockError::ShutDown { name: guard.key().to_owned() })
    }
}
