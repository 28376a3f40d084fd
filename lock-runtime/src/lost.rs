//! [`LostSignal`]: how a held lock learns that it is no longer held.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Instant;

use tokio::sync::Notify;

/// Completes the [`LockGuard::lost`](crate::LockGuard::lost) future of one acquisition.
///
/// Fired by the runtime when the local lease deadline passes without a renewal, by the
/// watchdog when a renewal is refused, and by backends that learn of a loss themselves (a
/// ZooKeeper session expiry). Cheap to clone; all clones share one state.
#[derive(Clone, Default)]
pub struct LostSignal {
    inner: Arc<Inner>,
}

#[derive(Default)]
struct Inner {
    fired: AtomicBool,
    reason: Mutex<Option<String>>,
    /// The local lease deadline: the lock is considered lost once it passes unrenewed.
    deadline: Mutex<Option<Instant>>,
    notify: Notify,
}

impl std::fmt::Debug for LostSignal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LostSignal").field("lost", &self.is_lost()).finish()
    }
}

impl LostSignal {
    /// A signal that has not fired, with no lease deadline.
    pub fn new() -> Self {
        Self::default()
    }

    /// Marks the lock as lost, with what was observed, and wakes everyone waiting on it.
    /// The first reason given is kept.
    pub fn fire(&self, reason: impl Into<String>) {
        {
            let mut slot = self.inner.reason.lock().unwrap_or_else(PoisonError::into_inner);
            if slot.is_none() {
                *slot = Some(reason.into());
            }
        }
        self.inner.fired.store(true, Ordering::Release);
        self.inner.notify.notify_waiters();
    }

    /// Whether the lock is lost: fired, or its local lease deadline has passed.
    pub fn is_lost(&self) -> bool {
        self.inner.fired.load(Ordering::Acquire) || self.deadline().is_some_and(|d| Instant::now() >= d)
    }

    /// What was observed when the lock was lost, if it was.
    pub fn reason(&self) -> Option<String> {
        if let Some(r) = self.inner.reason.lock().unwrap_or_else(PoisonError::into_inner).clone() {
            return Some(r);
        }
        self.is_lost().then(|| "its lease ran out before it was released or renewed".to_owned())
    }

    /// Sets (or clears) the instant after which the lock counts as lost unless renewed.
    pub fn set_deadline(&self, deadline: Option<Instant>) {
        *self.inner.deadline.lock().unwrap_or_else(PoisonError::into_inner) = deadline;
        self.inner.notify.notify_waiters();
    }

    fn deadline(&self) -> Option<Instant> {
        *self.inner.deadline.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Completes once the lock is lost. Never completes for a lock that is held until released.
    pub async fn wait(&self) {
        loop {
            let notified = self.inner.notify.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if self.inner.fired.load(Ordering::Acquire) {
                return;
            }
            match self.deadline() {
                Some(deadline) => {
                    if Instant::now() >= deadline {
                        return;
                    }
                    tokio::select! {
                        _ = &mut notified => {}
                        _ = tokio::time::sleep_until(deadline.into()) => {}
                    }
                }
                None => notified.await,
            }
        }
    }
}
