//! The in-process backend: always compiled, nothing to install.
//!
//! Per-name state lives in a sharded map. An entry exists only while its lock is held or
//! waited on, and is removed with the last holder or waiter, so a million distinct names
//! locked and released leave nothing behind. Waiting is a FIFO queue with direct hand-off to
//! the longest waiter (fair, no polling); a waiter that gives up is removed at once and is
//! never handed the lock afterwards. Fixed leases are enforced: a holder past its lease loses
//! the lock to the next waiter.

use std::collections::VecDeque;
use std::hash::BuildHasher;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use hashbrown::hash_table::Entry as TableEntry;
use hashbrown::{DefaultHashBuilder, HashTable};
use tokio::sync::oneshot;

use super::{Acquire, Attempt, BoxFuture, Busy, Grant, Held, Lease, LockBackend, OwnerId, Wake};
use crate::error::LockError;

const SHARDS: usize = 64;

/// The in-process lock store. Cheap to clone: clones share one store.
///
/// ```
/// use lock_runtime::{backend::memory::MemoryBackend, LockManager};
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), lock_runtime::LockError> {
/// let store = MemoryBackend::new();
/// let manager = LockManager::builder().backend(store.clone());
/// let guard = manager.lock("job:1").await?;
/// assert_eq!(store.len(), 1);
/// guard.release().await?;
/// assert_eq!(store.len(), 0); // nothing is left behind
/// # Ok(()) }
/// ```
#[derive(Clone, Default)]
pub struct MemoryBackend {
    inner: Arc<Inner>,
}

struct Inner {
    shards: Box<[Mutex<Shard>]>,
    hasher: DefaultHashBuilder,
    tokens: AtomicU64,
}

impl Default for Inner {
    fn default() -> Self {
        Inner {
            shards: (0..SHARDS).map(|_| Mutex::new(HashTable::new())).collect(),
            hasher: Default::default(),
            tokens: AtomicU64::new(1),
        }
    }
}

type Shard = HashTable<Entry>;

struct Entry {
    key: Arc<str>,
    holder: Option<Holder>,
    waiters: VecDeque<Waiter>,
}

struct Holder {
    owner: OwnerId,
    token: u64,
    /// `None` for a watchdog lease: an in-process lock cannot outlive its holder's guard.
    expires_at: Option<Instant>,
}

impl Holder {
    fn expired(&self, now: Instant) -> bool {
        self.expires_at.is_some_and(|at| now >= at)
    }
}

struct Waiter {
    owner: OwnerId,
    lease: Lease,
    grant: oneshot::Sender<Grant>,
}

impl std::fmt::Debug for MemoryBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryBackend").field("entries", &self.len()).finish()
    }
}

impl MemoryBackend {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    /// How many names are held or waited on right now (the number of entries in the store).
    pub fn len(&self) -> usize {
        self.inner.shards.iter().map(|s| lock(s).len()).sum()
    }

    /// Whether no name is held or waited on.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// How many callers wait for `key` (the backend key: prefix and name) right now.
    pub fn waiting(&self, key: &str) -> usize {
        let (hash, shard) = self.shard(key);
        shard.find(hash, |e| *e.key == *key).map_or(0, |e| e.waiters.len())
    }

    /// The allocated capacity of the store, in entries (to check that it shrinks).
    pub fn capacity(&self) -> usize {
        self.inner.shards.iter().map(|s| lock(s).capacity()).sum()
    }

    /// The key's hash (computed once per operation) and its locked shard.
    fn shard(&self, key: &str) -> (u64, MutexGuard<'_, Shard>) {
        let hash = self.inner.hasher.hash_one(key);
        (hash, lock(&self.inner.shards[((hash >> 40) as usize) % SHARDS]))
    }

    fn next_token(&self) -> u64 {
        self.inner.tokens.fetch_add(1, Ordering::Relaxed)
    }

    fn holder_for(&self, owner: OwnerId, lease: Lease, now: Option<Instant>) -> (Holder, Grant) {
        let token = self.next_token();
        let (expires_at, granted_at) = match lease {
            Lease::Fixed(d) => {
                let now = now.unwrap_or_else(Instant::now);
                (now.checked_add(d), Some(now))
            }
            // Not time-bound: an in-process lock lives exactly as long as its guard.
            Lease::Renewed(_) => (None, now),
        };
        let grant = Grant { fencing_token: token, needs_renewal: false, tag: None, granted_at };
        (Holder { owner, token, expires_at }, grant)
    }

    /// Gives a free entry to its longest waiter still listening. Returns `false` when nobody
    /// waits any more (the caller removes the entry).
    fn hand_off(&self, entry: &mut Entry, now: Instant) -> bool {
        debug_assert!(entry.holder.is_none());
        while let Some(waiter) = entry.waiters.pop_front() {
            let (holder, grant) = self.holder_for(waiter.owner, waiter.lease, Some(now));
            if waiter.grant.send(grant).is_ok() {
                entry.holder = Some(holder);
                return true;
            }
        }
        false
    }

    fn attempt(&self, req: &Acquire<'_>) -> Attempt {
        let (hash, mut shard) = self.shard(req.key);
        let hasher = &self.inner.hasher;
        match shard.entry(hash, |e| *e.key == **req.key, |e| hasher.hash_one(&*e.key)) {
            TableEntry::Vacant(slot) => {
                let (holder, grant) = self.holder_for(req.owner, req.lease, None);
                slot.insert(Entry { key: req.key.clone(), holder: Some(holder), waiters: VecDeque::new() });
                Attempt::Acquired(grant)
            }
            TableEntry::Occupied(mut slot) => {
                let entry = slot.get_mut();
                let now = Instant::now();
                if entry.holder.as_ref().is_some_and(|h| h.expired(now)) {
                    entry.holder = None;
                    self.hand_off(entry, now);
                }
                match &entry.holder {
                    None => {
                        let (holder, grant) = self.holder_for(req.owner, req.lease, Some(now));
                        entry.holder = Some(holder);
                        Attempt::Acquired(grant)
                    }
                    Some(h) => {
                        Attempt::Busy(Busy { expires_in: h.expires_at.map(|at| at.saturating_duration_since(now)) })
                    }
                }
            }
        }
    }

    /// Frees the entry of `key` held by `owner` (if it still is), hands it on or removes it.
    /// Returns whether `owner` still held it within its lease.
    fn release_sync(&self, key: &str, owner: OwnerId, token: u64) -> Result<(), &'static str> {
        let (hash, mut shard) = self.shard(key);
        let Ok(mut slot) = shard.find_entry(hash, |e| *e.key == *key) else {
            return Err("it is no longer held (its lease ran out and nobody else took it yet)");
        };
        let entry = slot.get_mut();
        let mine = entry.holder.as_ref().filter(|h| h.owner == owner && h.token == token);
        let Some(holder) = mine else {
            return Err("its lease ran out and it is now held by another owner");
        };
        let now = holder.expires_at.map(|_| Instant::now());
        let verdict = match now {
            Some(now) if holder.expired(now) => Err("its lease ran out before the release"),
            _ => Ok(()),
        };
        entry.holder = None;
        if entry.waiters.is_empty() || !self.hand_off(entry, now.unwrap_or_else(Instant::now)) {
            slot.remove();
            shrink(&mut shard, &self.inner.hasher);
        }
        verdict
    }

    /// Takes away the lock of a holder whose lease ran out, handing it on. Returns the next
    /// instant at which the (new) holder's lease runs out, if any.
    fn reap(&self, key: &str, now: Instant) -> Option<Instant> {
        let (hash, mut shard) = self.shard(key);
        let mut slot = shard.find_entry(hash, |e| *e.key == *key).ok()?;
        let entry = slot.get_mut();
        if entry.holder.as_ref().is_some_and(|h| h.expired(now)) {
            entry.holder = None;
            if !self.hand_off(entry, now) {
                slot.remove();
                shrink(&mut shard, &self.inner.hasher);
                return None;
            }
        }
        entry.holder.as_ref().and_then(|h| h.expires_at)
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Gives memory back once a shard has emptied out after a burst.
fn shrink(shard: &mut Shard, hasher: &DefaultHashBuilder) {
    if shard.capacity() > 64 && shard.len() * 4 < shard.capacity() {
        shard.shrink_to(shard.len() * 2, |e| hasher.hash_one(&*e.key));
    }
}

/// Removes a waiter that stops waiting (deadline, or its future dropped) from the queue; if
/// the lock was handed to it in the meantime, passes the lock on.
struct QueuedWaiter<'a> {
    store: &'a MemoryBackend,
    key: &'a str,
    owner: OwnerId,
    grant: oneshot::Receiver<Grant>,
    finished: bool,
}

impl Drop for QueuedWaiter<'_> {
    fn drop(&mut self) {
        if self.finished {
            return;
        }
        let now = Instant::now();
        let (hash, mut shard) = self.store.shard(self.key);
        let Ok(mut slot) = shard.find_entry(hash, |e| *e.key == *self.key) else { return };
        let entry = slot.get_mut();
        entry.waiters.retain(|w| w.owner != self.owner);
        // Hand-offs happen under the shard lock, so a grant sent to us is visible now.
        self.grant.close();
        let remove = if let Ok(grant) = self.grant.try_recv() {
            if entry.holder.as_ref().is_some_and(|h| h.owner == self.owner && h.token == grant.fencing_token) {
                entry.holder = None;
                !self.store.hand_off(entry, now)
            } else {
                false
            }
        } else {
            entry.holder.is_none() && entry.waiters.is_empty()
        };
        if remove {
            slot.remove();
            shrink(&mut shard, &self.store.inner.hasher);
        }
    }
}

impl LockBackend for MemoryBackend {
    fn kind(&self) -> &'static str {
        "memory"
    }

    fn try_acquire_now(&self, req: &Acquire<'_>) -> Option<Result<Attempt, LockError>> {
        Some(Ok(self.attempt(req)))
    }

    fn try_acquire<'a>(&'a self, req: &'a Acquire<'a>) -> BoxFuture<'a, Result<Attempt, LockError>> {
        Box::pin(std::future::ready(Ok(self.attempt(req))))
    }

    fn wait<'a>(
        &'a self,
        req: &'a Acquire<'a>,
        _busy: &'a Busy,
        deadline: Instant,
    ) -> BoxFuture<'a, Result<Wake, LockError>> {
        Box::pin(async move {
            let (tx, rx) = oneshot::channel();
            let mut expiry = {
                let (hash, mut shard) = self.shard(req.key);
                let Some(entry) = shard.find_mut(hash, |e| *e.key == **req.key) else {
                    return Ok(Wake::Retry); // released since the attempt
                };
                let Some(holder) = &entry.holder else {
                    return Ok(Wake::Retry);
                };
                let expiry = holder.expires_at;
                entry.waiters.push_back(Waiter { owner: req.owner, lease: req.lease, grant: tx });
                expiry
            };
            let mut queued = QueuedWaiter { store: self, key: req.key, owner: req.owner, grant: rx, finished: false };
            loop {
                let wake_at = expiry.map_or(deadline, |e| e.min(deadline));
                tokio::select! {
                    biased;
                    granted = &mut queued.grant => {
                        queued.finished = true;
                        return Ok(match granted {
                            Ok(grant) => Wake::Acquired(grant),
                            Err(_) => Wake::Retry,
                        });
                    }
                    _ = tokio::time::sleep_until(wake_at.into()) => {
                        let now = Instant::now();
                        if expiry.is_some_and(|e| now >= e) {
                            // The holder's lease ran out: take it away and hand it on (perhaps to us).
                            expiry = self.reap(req.key, now);
                        }
                        if let Ok(grant) = queued.grant.try_recv() {
                            queued.finished = true;
                            return Ok(Wake::Acquired(grant));
                        }
                        if now >= deadline {
                            return Ok(Wake::TimedOut); // `queued` leaves the queue on drop
                        }
                    }
                }
            }
        })
    }

    fn extend<'a>(&'a self, held: &'a Held, lease: Duration) -> BoxFuture<'a, Result<(), LockError>> {
        let now = Instant::now();
        let (hash, mut shard) = self.shard(&held.key);
        let result = match shard.find_mut(hash, |e| *e.key == *held.key).and_then(|e| e.holder.as_mut()) {
            Some(h) if h.owner == held.owner && h.token == held.fencing_token && !h.expired(now) => {
                if h.expires_at.is_some() {
                    h.expires_at = now.checked_add(lease);
                }
                Ok(())
            }
            _ => Err(LockError::lost(&*held.name, "its lease ran out before it could be extended")),
        };
        drop(shard);
        Box::pin(std::future::ready(result))
    }

    fn release<'a>(&'a self, held: &'a Held) -> BoxFuture<'a, Result<(), LockError>> {
        Box::pin(std::future::ready(self.release_checked(held)))
    }

    fn release_now(&self, held: &Held) -> Option<Result<(), LockError>> {
        Some(self.release_checked(held))
    }
}

impl MemoryBackend {
    fn release_checked(&self, held: &Held) -> Result<(), LockError> {
        self.release_sync(&held.key, held.owner, held.fencing_token)
            .map_err(|reason| LockError::lost(&*held.name, reason))
    }
}
