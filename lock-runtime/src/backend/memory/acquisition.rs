//! One waiting acquisition for every kind of the in-process store: the mutexes' table and the
//! kinds' table ([`Table`]) differ in what an entry holds, not in how a caller waits.

use std::sync::Arc;
use std::time::Instant;

use tokio::sync::{oneshot, Notify};

use super::{Handed, MemoryBackend};
use crate::backend::{Acquire, Acquisition, Attempt, BoxFuture, Grant, Wake};
use crate::error::LockError;

/// The state one table keeps per name, as one acquisition sees it. Every method takes the
/// store, the request and the key's hash (computed once by [`MemoryBackend::begin`]).
///
/// [`MemoryBackend::begin`]: crate::backend::LockBackend::begin
pub(super) trait Table: Send + Sync + 'static {
    /// One attempt: the grant, or the earliest lease end among the holders (`Err(None)`:
    /// held without expiry).
    fn attempt(store: &MemoryBackend, req: &Acquire, hash: u64) -> Result<Result<Handed, Option<Instant>>, LockError>;

    /// Joins the queue of the name: the earliest lease end among its holders, or `Ok(None)`
    /// when there is nothing to queue behind (attempt again).
    fn enqueue(
        store: &MemoryBackend,
        req: &Acquire,
        hash: u64,
        grant: oneshot::Sender<Handed>,
        head_changed: Arc<Notify>,
    ) -> Result<Option<Option<Instant>>, LockError>;

    /// The earliest lease end among the holders of the name.
    fn expiry(store: &MemoryBackend, req: &Acquire, hash: u64) -> Option<Instant>;

    /// Takes the lock from holders whose lease ran out by `now`, handing it on (perhaps to
    /// us); the earliest lease end left.
    fn reap(store: &MemoryBackend, req: &Acquire, hash: u64, now: Instant) -> Option<Instant>;

    /// Leaves the queue (a waiter that gave up or was dropped); passes on anything handed to
    /// `grant` meanwhile (hand-offs happen under the shard's lock, so it is visible here).
    fn leave(store: &MemoryBackend, req: &Acquire, hash: u64, grant: oneshot::Receiver<Handed>);

    /// The grant of a hand-off or a successful attempt.
    fn grant(store: &MemoryBackend, req: &Acquire, hash: u64, handed: Handed) -> Grant;
}

/// One acquisition on the in-process store: owns its place in the queue while it waits.
/// Dropped while queued, it leaves the queue at once; if the lock was handed to it in the
/// meantime, it passes the lock on.
pub(super) struct MemoryAcquisition<T: Table> {
    store: MemoryBackend,
    req: Acquire,
    hash: u64,
    /// The earliest lease end among the holders seen by the last look (`None`: no expiry).
    expiry: Option<Instant>,
    /// Our place in the queue: the hand-off arrives here.
    queued: Option<oneshot::Receiver<Handed>>,
    /// Poked when what we wait behind changes (shared with our entry in the queue).
    head_changed: Arc<Notify>,
    table: std::marker::PhantomData<T>,
}

impl<T: Table> MemoryAcquisition<T> {
    pub(super) fn new(store: MemoryBackend, req: Acquire, hash: u64) -> Self {
        let head_changed = Arc::default();
        let table = std::marker::PhantomData;
        MemoryAcquisition { store, req, hash, expiry: None, queued: None, head_changed, table }
    }

    fn grant(&self, handed: Handed) -> Grant {
        T::grant(&self.store, &self.req, self.hash, handed)
    }

    async fn wait_until(&mut self, deadline: Instant) -> Result<Wake, LockError> {
        if self.queued.is_none() {
            let (tx, rx) = oneshot::channel();
            match T::enqueue(&self.store, &self.req, self.hash, tx, self.head_changed.clone())? {
                Some(expiry) => (self.expiry, self.queued) = (expiry, Some(rx)),
                None => return Ok(Wake::Retry), // released since the attempt
            }
        }
        loop {
            let wake_at = self.expiry.map_or(deadline, |e| e.min(deadline));
            let Some(queued) = self.queued.as_mut() else { return Ok(Wake::Retry) };
            let head_changed = &self.head_changed;
            tokio::select! {
                biased;
                granted = queued => {
                    self.queued = None;
                    return Ok(match granted {
                        Ok(handed) => Wake::Acquired(self.grant(handed)),
                        Err(_) => Wake::Retry,
                    });
                }
                _ = head_changed.notified() => self.expiry = T::expiry(&self.store, &self.req, self.hash),
                _ = tokio::time::sleep_until(wake_at.into()) => {
                    let now = crate::clock::now();
                    if self.expiry.is_some_and(|e| now >= e) {
                        // A holder's lease ran out: take it away and hand it on (perhaps to us).
                        self.expiry = T::reap(&self.store, &self.req, self.hash, now);
                    }
                    if let Some(Ok(handed)) = self.queued.as_mut().map(|q| q.try_recv()) {
                        self.queued = None;
                        return Ok(Wake::Acquired(self.grant(handed)));
                    }
                    if now >= deadline {
                        return Ok(Wake::TimedOut); // still queued: leaves the queue when dropped
                    }
                }
            }
        }
    }
}

impl<T: Table> Drop for MemoryAcquisition<T> {
    fn drop(&mut self) {
        if let Some(grant) = self.queued.take() {
            T::leave(&self.store, &self.req, self.hash, grant);
        }
    }
}

impl<T: Table> Acquisition for MemoryAcquisition<T> {
    fn attempt(&mut self) -> BoxFuture<'_, Result<Attempt, LockError>> {
        let attempt = match T::attempt(&self.store, &self.req, self.hash) {
            Ok(Ok(handed)) => Ok(Attempt::Acquired(self.grant(handed))),
            Ok(Err(expiry)) => {
                self.expiry = expiry;
                Ok(Attempt::Busy)
            }
            Err(e) => Err(e),
        };
        Box::pin(std::future::ready(attempt))
    }

    fn wait(&mut self, deadline: Instant) -> BoxFuture<'_, Result<Wake, LockError>> {
        Box::pin(self.wait_until(deadline))
    }
}

/// Calls `reap` once `until` has passed, on the current runtime (a release with
/// `hold_at_least` time left frees the entry then, if nobody waits to take it over; a waiter
/// watches the lease end it returns by itself).
pub(super) fn reap_at(until: Instant, reap: impl FnOnce() -> Option<Instant> + Send + 'static) {
    if let Ok(runtime) = tokio::runtime::Handle::try_current() {
        runtime.spawn(async move {
            tokio::time::sleep_until(until.into()).await;
            reap()
        });
    }
}
