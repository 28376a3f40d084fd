//! Read-write locks and semaphores of the in-process store ([`LockKind::Read`],
//! [`LockKind::Write`], [`LockKind::Semaphore`]).
//!
//! Kept apart from the mutex (its own sharded maps, one per kind's namespace), so the mutex's
//! fast path is untouched. Each name's entry holds its holders and one FIFO queue of waiters
//! across readers and writers (or permit holders): a new caller never overtakes a waiter, so
//! a waiting writer blocks new readers; when the head can be granted it is, and so is every
//! waiter behind it that can (consecutive readers are granted together). Entries are removed
//! with their last holder or waiter; fixed leases are enforced (an expired holder is removed
//! and the queue moves on); a waiter that leaves (timed out, cancelled at any poll) is
//! removed at once and passes on anything it was handed.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::{oneshot, Notify};

use super::acquisition::{reap_at, Table};
use super::{lock, Handed, MemoryBackend};
use crate::backend::{Acquire, Attempt, BoxFuture, Grant, Held, HeldLock, Lease, LockKind, OwnerId};
use crate::error::LockError;

const SHARDS: usize = 16;

/// The kinds' store of one [`MemoryBackend`].
pub(super) struct Kinds {
    shards: Box<[Mutex<Shard>]>,
}

impl Default for Kinds {
    fn default() -> Self {
        Kinds { shards: (0..SHARDS).map(|_| Mutex::new(Shard::default())).collect() }
    }
}

/// One shard: the entries of each namespace, and the shard's fencing token counter (a name
/// always lives in the same shard, so its tokens strictly increase).
struct Shard {
    rw: HashMap<Arc<str>, Entry>,
    sem: HashMap<Arc<str>, Entry>,
    next_token: u64,
}

impl Default for Shard {
    fn default() -> Self {
        Shard { rw: HashMap::new(), sem: HashMap::new(), next_token: 1 }
    }
}

/// Which namespace a kind lives in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Space {
    Rw,
    Sem,
}

/// What a holder or waiter holds or wants.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Want {
    Read,
    Write,
    Permit,
}

/// The namespace, the wish and the permits (0 for read-write locks) of a kind.
fn split(kind: LockKind) -> (Space, Want, u32) {
    match kind {
        LockKind::Read => (Space::Rw, Want::Read, 0),
        LockKind::Semaphore { permits } => (Space::Sem, Want::Permit, permits),
        _ => (Space::Rw, Want::Write, 0),
    }
}

impl Shard {
    fn map(&mut self, space: Space) -> &mut HashMap<Arc<str>, Entry> {
        match space {
            Space::Rw => &mut self.rw,
            Space::Sem => &mut self.sem,
        }
    }
}

struct Holder {
    token: u64,
    want: Want,
    /// Who holds it, for inspection: the acquisition and its process (an interned text).
    owner: OwnerId,
    process: crate::backend::Holder,
    /// `None` for a watchdog lease: an in-process holding lives as long as its guard.
    expires_at: Option<Instant>,
}

struct Waiter {
    owner: OwnerId,
    process: crate::backend::Holder,
    lease: Lease,
    want: Want,
    grant: oneshot::Sender<Handed>,
    /// Poked when this waiter becomes the head of the queue, or the holders change while it is.
    head_changed: Arc<Notify>,
}

struct Entry {
    /// The semaphore's permits, agreed by every holder and waiter (0 for a read-write lock).
    permits: u32,
    holders: Vec<Holder>,
    waiters: VecDeque<Waiter>,
}

impl Entry {
    fn can_grant(&self, want: Want) -> bool {
        match want {
            Want::Read => !self.holders.iter().any(|h| h.want == Want::Write),
            Want::Write => self.holders.is_empty(),
            Want::Permit => self.holders.len() < self.permits as usize,
        }
    }

    /// Removes the holders whose fixed lease ran out; whether any was.
    fn reap(&mut self, now: Instant) -> bool {
        let before = self.holders.len();
        self.holders.retain(|h| h.expires_at.is_none_or(|at| now < at));
        self.holders.len() != before
    }

    /// Grants the head of the queue, and each waiter after it, while they can be granted.
    fn hand_off(&mut self, tokens: &mut u64, now: Instant) {
        while self.waiters.front().is_some_and(|w| self.can_grant(w.want)) {
            let Some(waiter) = self.waiters.pop_front() else { break };
            let who = (waiter.owner, waiter.process.clone());
            let (holder, handed) = holder_for(tokens, waiter.want, who, waiter.lease, now);
            if waiter.grant.send(handed).is_ok() {
                self.holders.push(holder);
            }
        }
        if let Some(head) = self.waiters.front() {
            head.head_changed.notify_one();
        }
    }

    fn earliest_expiry(&self) -> Option<Instant> {
        self.holders.iter().filter_map(|h| h.expires_at).min()
    }

    fn is_free(&self) -> bool {
        self.holders.is_empty() && self.waiters.is_empty()
    }

    fn check_permits(&self, name: &str, permits: u32) -> Result<(), LockError> {
        if self.permits == permits {
            return Ok(());
        }
        Err(LockError::invalid(
            name,
            format!(
                "the semaphore is held or waited for with {} permits; this call asked for {permits}: every holder \
                 of a semaphore must give the same number of permits",
                self.permits
            ),
        ))
    }
}

fn holder_for(
    tokens: &mut u64,
    want: Want,
    (owner, process): (OwnerId, crate::backend::Holder),
    lease: Lease,
    now: Instant,
) -> (Holder, Handed) {
    let token = *tokens;
    *tokens += 1;
    let (expires_at, granted_at) = match lease {
        Lease::Fixed(d) => (now.checked_add(d), Some(now)),
        Lease::Renewed(_) => (None, Some(now)),
    };
    (Holder { token, want, owner, process, expires_at }, Handed { token, granted_at })
}

impl Kinds {
    /// Every holder of a read-write lock or semaphore whose key starts with `prefix`, within
    /// its lease: one record each, with the waiters queued on its name.
    pub(super) fn list(&self, prefix: &str) -> Vec<crate::backend::LockInfo> {
        let now = crate::clock::now();
        let mut out = Vec::new();
        for shard in self.shards.iter() {
            let shard = lock(shard);
            for (key, entry) in shard.rw.iter().chain(shard.sem.iter()).filter(|(k, _)| k.starts_with(prefix)) {
                for holder in entry.holders.iter().filter(|h| h.expires_at.is_none_or(|at| now < at)) {
                    let mut info = crate::backend::LockInfo::new(&**key, holder.owner.to_string());
                    info.holder = Some(holder.process.clone());
                    info.kind = Some(match holder.want {
                        Want::Read => LockKind::Read,
                        Want::Write => LockKind::Write,
                        Want::Permit => LockKind::Semaphore { permits: entry.permits },
                    });
                    info.fencing_token = Some(holder.token);
                    info.remaining_lease = holder.expires_at.map(|at| at.saturating_duration_since(now));
                    info.session_bound = holder.expires_at.is_none();
                    info.waiters = Some(entry.waiters.len() as u64);
                    out.push(info);
                }
            }
        }
        out
    }

    pub(super) fn len(&self) -> usize {
        self.shards.iter().map(|s| lock(s)).map(|s| s.rw.len() + s.sem.len()).sum()
    }

    fn shard(&self, hash: u64) -> std::sync::MutexGuard<'_, Shard> {
        lock(&self.shards[(hash >> 40) as usize % SHARDS])
    }

    /// One attempt: the grant, or the earliest lease end among the holders (busy).
    fn attempt(&self, req: &Acquire, hash: u64) -> Result<Result<Handed, Option<Instant>>, LockError> {
        let (space, want, permits) = split(req.kind);
        if space == Space::Sem && permits == 0 {
            return Err(LockError::invalid(&*req.name, "a semaphore of 0 permits admits nobody; give at least 1"));
        }
        let now = crate::clock::now();
        let mut shard = self.shard(hash);
        let Shard { rw, sem, next_token } = &mut *shard;
        let map = if space == Space::Rw { rw } else { sem };
        let entry = match map.get_mut(&*req.key) {
            Some(entry) => entry,
            None => {
                let (holder, handed) = holder_for(next_token, want, (req.owner, req.holder.clone()), req.lease, now);
                let entry = Entry { permits, holders: vec![holder], waiters: VecDeque::new() };
                map.insert(req.key.clone(), entry);
                return Ok(Ok(handed));
            }
        };
        entry.check_permits(&req.name, permits)?;
        if entry.reap(now) {
            entry.hand_off(next_token, now);
        }
        if entry.waiters.is_empty() && entry.can_grant(want) {
            let (holder, handed) = holder_for(next_token, want, (req.owner, req.holder.clone()), req.lease, now);
            entry.holders.push(holder);
            return Ok(Ok(handed));
        }
        Ok(Err(entry.earliest_expiry()))
    }

    /// Removes the holding `token` of `key`, moving the queue on; whether it was still held
    /// within its lease.
    fn release(&self, space: Space, key: &str, hash: u64, token: u64) -> Result<(), &'static str> {
        let now = crate::clock::now();
        let mut shard = self.shard(hash);
        let Shard { rw, sem, next_token } = &mut *shard;
        let map = if space == Space::Rw { rw } else { sem };
        let Some(entry) = map.get_mut(key) else {
            return Err("it is no longer held (its lease ran out and nobody else took it yet)");
        };
        let Some(at) = entry.holders.iter().position(|h| h.token == token) else {
            return Err("its lease ran out and its place was given to another holder");
        };
        let holder = entry.holders.swap_remove(at);
        let verdict = match holder.expires_at {
            Some(end) if now >= end => Err("its lease ran out before the release"),
            _ => Ok(()),
        };
        entry.reap(now);
        entry.hand_off(next_token, now);
        if entry.is_free() {
            map.remove(key);
        }
        verdict
    }

    /// Keeps the holding `token` of `key` until `remaining` from now (`hold_at_least`): its
    /// lease end becomes that instant (the queue's head re-arms its timer on it, and the queue
    /// moves on when it passes), and a task frees an entry nobody waits for then.
    fn release_after(
        &self,
        store: &MemoryBackend,
        (space, key, hash): (Space, &Arc<str>, u64),
        token: u64,
        remaining: Duration,
    ) -> Result<(), &'static str> {
        let now = crate::clock::now();
        let Some(until) = now.checked_add(remaining) else { return self.release(space, key, hash, token) };
        {
            let mut shard = self.shard(hash);
            let Some(entry) = shard.map(space).get_mut(&**key) else {
                return Err("it is no longer held (its lease ran out and nobody else took it yet)");
            };
            let Some(holder) = entry.holders.iter_mut().find(|h| h.token == token) else {
                return Err("its lease ran out and its place was given to another holder");
            };
            if holder.expires_at.is_some_and(|end| now >= end) {
                drop(shard);
                return self.release(space, key, hash, token);
            }
            holder.expires_at = Some(until);
            if let Some(head) = entry.waiters.front() {
                head.head_changed.notify_one(); // a holder's lease end moved
            }
        }
        let (store, key) = (store.clone(), key.clone());
        reap_at(until, move || store.inner.kinds.reap(space, &key, hash, crate::clock::now()));
        Ok(())
    }

    /// Removes expired holders of `key` and moves the queue on; the earliest lease end left.
    fn reap(&self, space: Space, key: &str, hash: u64, now: Instant) -> Option<Instant> {
        let mut shard = self.shard(hash);
        let Shard { rw, sem, next_token } = &mut *shard;
        let map = if space == Space::Rw { rw } else { sem };
        let entry = map.get_mut(key)?;
        if entry.reap(now) {
            entry.hand_off(next_token, now);
        }
        let expiry = entry.earliest_expiry();
        if entry.is_free() {
            map.remove(key);
        }
        expiry
    }
}

impl Table for Kinds {
    fn attempt(store: &MemoryBackend, req: &Acquire, hash: u64) -> Result<Result<Handed, Option<Instant>>, LockError> {
        store.inner.kinds.attempt(req, hash)
    }

    fn enqueue(
        store: &MemoryBackend,
        req: &Acquire,
        hash: u64,
        grant: oneshot::Sender<Handed>,
        head_changed: Arc<Notify>,
    ) -> Result<Option<Option<Instant>>, LockError> {
        let (space, want, permits) = split(req.kind);
        let mut shard = store.inner.kinds.shard(hash);
        let Some(entry) = shard.map(space).get_mut(&*req.key) else { return Ok(None) };
        entry.check_permits(&req.name, permits)?;
        if entry.waiters.is_empty() && entry.can_grant(want) {
            return Ok(None);
        }
        let expiry = entry.earliest_expiry();
        let process = req.holder.clone();
        entry.waiters.push_back(Waiter { owner: req.owner, process, lease: req.lease, want, grant, head_changed });
        Ok(Some(expiry))
    }

    fn expiry(store: &MemoryBackend, req: &Acquire, hash: u64) -> Option<Instant> {
        let mut shard = store.inner.kinds.shard(hash);
        shard.map(split(req.kind).0).get(&*req.key).and_then(Entry::earliest_expiry)
    }

    fn reap(store: &MemoryBackend, req: &Acquire, hash: u64, now: Instant) -> Option<Instant> {
        store.inner.kinds.reap(split(req.kind).0, &req.key, hash, now)
    }

    fn leave(store: &MemoryBackend, req: &Acquire, hash: u64, mut grant: oneshot::Receiver<Handed>) {
        let now = crate::clock::now();
        let mut shard = store.inner.kinds.shard(hash);
        let Shard { rw, sem, next_token } = &mut *shard;
        let map = if split(req.kind).0 == Space::Rw { rw } else { sem };
        let Some(entry) = map.get_mut(&*req.key) else { return };
        entry.waiters.retain(|w| w.owner != req.owner);
        grant.close();
        if let Ok(handed) = grant.try_recv() {
            entry.holders.retain(|h| h.token != handed.token);
        }
        // A writer that left the head may let readers in; a permit handed to us goes on.
        entry.hand_off(next_token, now);
        if entry.is_free() {
            map.remove(&*req.key);
        }
    }

    fn grant(store: &MemoryBackend, req: &Acquire, hash: u64, handed: Handed) -> Grant {
        let lock = KindHeld {
            store: store.clone(),
            space: split(req.kind).0,
            name: req.name.clone(),
            key: req.key.clone(),
            hash,
            token: handed.token,
        };
        Grant { fencing_token: handed.token, granted_at: handed.granted_at, lock: Held::new(lock) }
    }
}

/// [`LockBackend::try_acquire_now`](crate::backend::LockBackend::try_acquire_now) of a kind.
pub(super) fn try_acquire_now(store: &MemoryBackend, req: &Acquire, hash: u64) -> Result<Attempt, LockError> {
    Ok(match store.inner.kinds.attempt(req, hash)? {
        Ok(handed) => Attempt::Acquired(Kinds::grant(store, req, hash, handed)),
        Err(_) => Attempt::Busy,
    })
}

/// A reader's, writer's or permit's holding in the in-process store.
struct KindHeld {
    store: MemoryBackend,
    space: Space,
    name: Arc<str>,
    key: Arc<str>,
    hash: u64,
    token: u64,
}

impl KindHeld {
    fn release_checked(&self) -> Result<(), LockError> {
        self.store
            .inner
            .kinds
            .release(self.space, &self.key, self.hash, self.token)
            .map_err(|reason| LockError::lost(&*self.name, reason))
    }
}

impl HeldLock for KindHeld {
    fn release(&mut self) -> BoxFuture<'_, Result<(), LockError>> {
        Box::pin(std::future::ready(self.release_checked()))
    }

    fn release_after(&mut self, remaining: Duration) -> BoxFuture<'_, Result<(), LockError>> {
        let kept = self.store.inner.kinds.release_after(
            &self.store,
            (self.space, &self.key, self.hash),
            self.token,
            remaining,
        );
        Box::pin(std::future::ready(kept.map_err(|reason| LockError::lost(&*self.name, reason))))
    }

    fn release_now(&mut self) -> Option<Result<(), LockError>> {
        Some(self.release_checked())
    }
}
