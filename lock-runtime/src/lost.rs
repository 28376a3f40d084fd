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
#[derive(Clone)]
pub struct LostSignal {
    /// `None` for a lock that nothing can take away before it is released (no allocation).
    inner: Option<Arc<Inner>>,
}

impl Default for LostSignal {
    fn default() -> Self {
        Self::new()
    }
}

#[derive(Default)]
struct Inner {
    fired: AtomicBool,
    /// The loss was reported (a `warn` event, `lock_lost_total`): reported once.
    reported: AtomicBool,
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
        LostSignal { inner: Some(Arc::default()) }
    }

    /// A signal that never fires: for a lock that cannot be lost before it is released (an
    /// in-process lock kept without a fixed lease). Firing it does nothing.
    pub fn never() -> Self {
        LostSignal { inner: None }
    }

    /// Whether this signal can ever fire (`false` for [`never`](LostSignal::never)).
    pub(crate) fn can_fire(&self) -> bool {
        self.inner.is_some()
    }

    /// Marks the lock as lost, with what was observed, and wakes everyone waiting on it.
    /// The first reason given is kept.
    pub fn fire(&self, reason: impl Into<String>) {
        let Some(inner) = &self.inner else { return };
        {
            let mut slot = inner.reason.lock().unwrap_or_else(PoisonError::into_inner);
            if slot.is_none() {
                *slot = Some(reason.into());
            }
        }
        inner.fired.store(true, Ordering::Release);
        inner.notify.notify_waiters();
    }

    /// Whether the lock is lost: fired, or its local lease deadline has passed.
    pub fn is_lost(&self) -> bool {
        let Some(inner) = &self.inner else { return false };
        inner.fired.load(Ordering::Acquire) || self.deadline().is_some_and(|d| crate::clock::now() >= d)
    }

    /// `true` the first time it is called: whoever reports the loss first (telemetry).
    pub(crate) fn report_once(&self) -> bool {
        self.inner.as_ref().is_some_and(|inner| !inner.reported.swap(true, Ordering::AcqRel))
    }

    /// What was observed when the lock was lost, if it was.
    pub fn reason(&self) -> Option<String> {
        let inner = self.inner.as_ref()?;
        if let Some(r) = inner.reason.lock().unwrap_or_else(PoisonError::into_inner).clone() {
            return Some(r);
        }
        self.is_lost().then(|| "its lease ran out before it was released or renewed".to_owned())
    }

    /// Sets (or clears) the instant after which the lock counts as lost unless renewed.
    /// (No effect on a [`never`](LostSignal::never) signal.)
    pub fn set_deadline(&self, deadline: Option<Instant>) {
        let Some(inner) = &self.inner else { return };
        *inner.deadline.lock().unwrap_or_else(PoisonError::into_inner) = deadline;
        inner.notify.notify_waiters();
    }

    fn deadline(&self) -> Option<Instant> {
        *self.inner.as_ref()?.deadline.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Completes once the lock is lost. Never completes for a lock that is held until released.
    pub async fn wait(&self) {
        let Some(inner) = &self.inner else { return std::future::pending().await };
        loop {
            let notified = inner.notify.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if inner.fired.load(Ordering::Acquire) {
                return;
            }
            match self.deadline() {
                Some(deadline) => {
                    if crate::clock::now() >= deadline {
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

/// The first of `signals` (each with what names it) to fire. Pending forever when there are
/// none.
pub(crate) async fn first_lost<T>(signals: &[(T, LostSignal)]) -> &(T, LostSignal) {
    type Wait<'a> = std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send + 'a>>;
    let mut waits: Vec<Wait<'_>> = signals.iter().map(|(_, lost)| Box::pin(lost.wait()) as Wait<'_>).collect();
    let first = std::future::poll_fn(|cx| {
        for (i, wait) in waits.iter_mut().enumerate() {
            if wait.as_mut().poll(cx).is_ready() {
                return std::task::Poll::Ready(i);
            }
        }
        std::task::Poll::Pending
    })
    .await;
    &signals[first]
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn fires_once_with_the_first_reason() {
        let signal = LostSignal::new();
        assert!(!signal.is_lost());
        let waiter = tokio::spawn({
            let signal = signal.clone();
            async move { signal.wait().await }
        });
        signal.fire("first");
        signal.fire("second");
        waiter.await.expect("woken");
        assert!(signal.is_lost());
        assert_eq!(signal.reason().as_deref(), Some("first"));
    }

    #[tokio::test]
    async fn deadline_passing_counts_as_lost_and_renewal_moves_it() {
        let signal = LostSignal::new();
        signal.set_deadline(Some(crate::clock::now() + Duration::from_secs(3600)));
        assert!(!signal.is_lost());
        let waiter = tokio::spawn({
            let signal = signal.clone();
            async move { signal.wait().await }
        });
        signal.set_deadline(Some(crate::clock::now() + Duration::from_millis(20)));
        tokio::time::timeout(Duration::from_secs(5), waiter).await.expect("woken by the new deadline").expect("task");
        assert!(signal.is_lost());
        assert!(signal.reason().is_some_and(|r| r.contains("lease ran out")));
    }

    #[tokio::test]
    async fn never_does_not_fire() {
        let signal = LostSignal::never();
        signal.fire("ignored");
        signal.set_deadline(Some(crate::clock::now()));
        assert!(!signal.is_lost());
        assert!(signal.reason().is_none());
        assert!(tokio::time::timeout(Duration::from_millis(20), signal.wait()).await.is_err());
    }
}
