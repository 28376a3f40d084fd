//! The in-process backend: always compiled, nothing to install.
//!
//! Per-name state lives in a sharded map. An entry exists only while its lock is held or
//! waited on, and is removed with the last holder or waiter, so a million distinct names
//! locked and released leave nothing behind. Waiting is a FIFO queue with direct hand-off to
//! the longest waiter (fair, no polling); a waiter that gives up is removed at once and is
//! never handed the lock afterwards. Fixed leases are enforced: a holder past its lease loses
//! the lock to the next waiter. A release with `hold_at_least` time left keeps the entry held
//! until then, as a lease that ends then.

use std::collections::VecDeque;
use std::hash::BuildHasher;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use hashbrown::hash_table::Entry as TableEntry;
use hashbrown::{DefaultHashBuilder, HashTable};
use tokio::sync::{oneshot, Notify};

use super::LockKind;
use super::{Acquire, Acquisition, Attempt, BoxFuture, Grant, Held, HeldLock, Lease, LockBackend, OwnerId};
use crate::error::LockError;

mod acquisition;
mod inspect;
mod kinds;

use acquisition::{reap_at, MemoryAcquisition, Table};

const SHARDS: usize = 64;

/// The in-process lock store. Cheap to clone: clones share one store.
///
/// [`LockManager::memory()`](crate::LockManager::memory) builds a manager on a store of its own,
/// with the fast path (an uncontended mutex taken in the caller's poll). A store passed to
/// [`backend`](crate::LockManagerBuilder::backend), as here to look into it, works the same
/// through the general path, at a little more cost a lock.
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
    /// Read-write locks and semaphores, apart from the mutexes ([`kinds`]).
    kinds: kinds::Kinds,
    /// Counts the mutexes' changes of holder while someone watches them ([`inspect`]).
    changes: tokio::sync::watch::Sender<u64>,
}

impl Default for Inner {
    fn default() -> Self {
        Inner {
            shards: (0..SHARDS).map(|_| Mutex::new(Shard::default())).collect(),
            hasher: Default::default(),
            kinds: kinds::Kinds::default(),
            changes: tokio::sync::watch::Sender::new(0),
        }
    }
}

/// One shard of the store: its entries, and the fencing tokens of the names it holds (a name
/// always lives in the same shard, so its tokens strictly increase for the life of the store;
/// a counter under the shard's lock costs no atomic operation of its own).
struct Shard {
    entries: HashTable<Entry>,
    /// The next token to grant in this shard.
    tokens: Tokens,
}

impl Default for Shard {
    fn default() -> Self {
        Shard { entries: HashTable::new(), tokens: Tokens(1) }
    }
}

/// A shard's token counter: the tokens it grants are unique in the shard (so a token and the
/// entry it was granted on name one grant) and strictly increase.
struct Tokens(u64);

impl Tokens {
    fn next(&mut self) -> u64 {
        let token = self.0;
        self.0 += 1;
        token
    }
}

struct Entry {
    key: Key,
    holder: Option<Holder>,
    waiters: Queue,
}

/// An entry's key. A short key is copied into the entry (a few bytes copied cost less than
/// counting the references of a shared string on insert and removal); a longer one is shared.
enum Key {
    Inline { len: u8, bytes: [u8; INLINE_KEY] },
    Shared(Arc<str>),
}

/// The longest key kept inline (the entry's key is then no larger than a shared one's plus 8).
const INLINE_KEY: usize = 22;

/// Whether `a` and `b`, of one length of at most 24 bytes, hold the same bytes: two or three
/// overlapping word compares (the hottest compare of the store: every release makes one)
/// instead of a call to `memcmp`.
#[inline(always)]
fn same_short(a: &[u8], b: &[u8]) -> bool {
    debug_assert!(a.len() == b.len() && a.len() <= 24);
    match a.len() {
        0..4 => a.iter().eq(b),
        4..8 => a.first_chunk::<4>() == b.first_chunk::<4>() && a.last_chunk::<4>() == b.last_chunk::<4>(),
        8..=16 => a.first_chunk::<8>() == b.first_chunk::<8>() && a.last_chunk::<8>() == b.last_chunk::<8>(),
        _ => {
            a.first_chunk::<8>() == b.first_chunk::<8>()
                && a.get(8..).and_then(<[u8]>::first_chunk::<8>) == b.get(8..).and_then(<[u8]>::first_chunk::<8>)
                && a.last_chunk::<8>() == b.last_chunk::<8>()
        }
    }
}

/// `b`, of at most [`INLINE_KEY`] bytes, zero-padded: built from word loads of `b` (the first
/// and last bytes, overlapping), not copied byte-wise into the array, whose first load by the
/// entry's move would then wait for the copy. `None` for a longer `b`.
#[inline(always)]
fn inline_bytes(b: &[u8]) -> Option<[u8; INLINE_KEY]> {
    let len = b.len();
    // `tail` (the last 8 or 4 bytes of `b`) without its first `taken_bits / 8` bytes (those the
    // words before hold already), moved down to the low bytes (a shift of 64 or more: nothing).
    let rest =
        |tail: u64, taken_bits: usize| tail.checked_shr(u32::try_from(taken_bits).unwrap_or(u32::MAX)).unwrap_or(0);
    let le8 = |c: &[u8; 8]| u64::from_le_bytes(*c);
    let (w0, w1, w2) = match (b.first_chunk::<8>(), b.last_chunk::<8>()) {
        _ if len > INLINE_KEY => return None,
        (Some(first), Some(last)) if len > 16 => {
            let second = b.get(8..).and_then(<[u8]>::first_chunk::<8>).map_or(0, le8);
            (le8(first), second, rest(le8(last), 8 * (24 - len)))
        }
        (Some(first), Some(last)) => (le8(first), rest(le8(last), 8 * (16 - len)), 0),
        _ => match (b.first_chunk::<4>(), b.last_chunk::<4>()) {
            (Some(first), Some(last)) => {
                let high = rest(u64::from(u32::from_le_bytes(*last)), 8 * (8 - len));
                (u64::from(u32::from_le_bytes(*first)) | high << 32, 0, 0)
            }
            _ => (b.iter().rev().fold(0, |w, &byte| w << 8 | u64::from(byte)), 0, 0),
        },
    };
    let mut bytes = [0u8; INLINE_KEY];
    let (a, tail) = bytes.split_at_mut(8);
    let (c, d) = tail.split_at_mut(8);
    a.copy_from_slice(&w0.to_le_bytes());
    c.copy_from_slice(&w1.to_le_bytes());
    d.copy_from_slice(&w2.to_le_bytes()[..INLINE_KEY - 16]);
    Some(bytes)
}

impl Key {
    #[inline]
    fn new(key: &Arc<str>) -> Key {
        match (inline_bytes(key.as_bytes()), u8::try_from(key.len())) {
            (Some(bytes), Ok(len)) => Key::Inline { len, bytes },
            _ => Key::Shared(key.clone()),
        }
    }

    #[inline]
    fn as_bytes(&self) -> &[u8] {
        match self {
            Key::Inline { len, bytes } => bytes.get(..usize::from(*len)).unwrap_or_default(),
            Key::Shared(key) => key.as_bytes(),
        }
    }

    /// Whether this is the key `key`.
    #[inline]
    fn is(&self, key: &str) -> bool {
        match self {
            Key::Inline { len, bytes } => {
                usize::from(*len) == key.len() && bytes.get(..key.len()).is_some_and(|b| same_short(b, key.as_bytes()))
            }
            Key::Shared(shared) => **shared == *key,
        }
    }

    /// The key as a string, to hash it again when the table is resized (an inline key holds
    /// the whole of a string, so it is always valid UTF-8).
    fn as_str(&self) -> &str {
        match self {
            Key::Inline { .. } => std::str::from_utf8(self.as_bytes()).unwrap_or_default(),
            Key::Shared(key) => key,
        }
    }
}

/// The waiters of one name, oldest first. Allocated only once someone waits, so an entry that
/// is only ever held stays small and cheap to drop.
#[derive(Default)]
#[allow(clippy::box_collection)] // one pointer in every entry; the deque only where someone waits
struct Queue(Option<Box<VecDeque<Waiter>>>);

impl Queue {
    fn len(&self) -> usize {
        self.0.as_ref().map_or(0, |q| q.len())
    }

    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn front(&self) -> Option<&Waiter> {
        self.0.as_ref().and_then(|q| q.front())
    }

    fn pop_front(&mut self) -> Option<Waiter> {
        self.0.as_mut().and_then(|q| q.pop_front())
    }

    fn push_back(&mut self, waiter: Waiter) {
        self.0.get_or_insert_with(Default::default).push_back(waiter);
    }

    fn retain(&mut self, keep: impl FnMut(&Waiter) -> bool) {
        if let Some(q) = &mut self.0 {
            q.retain(keep);
        }
    }
}

struct Holder {
    owner: OwnerId,
    /// The process and manager label of the acquisition (an interned text: copied, not
    /// counted), for inspection.
    process: super::Holder,
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
    process: super::Holder,
    lease: Lease,
    grant: oneshot::Sender<Handed>,
    /// Tells the waiter that the holder changed (its lease end may have): poked for the head
    /// of the queue whenever the lock is handed on or the head leaves.
    holder_changed: Arc<Notify>,
}

/// What a hand-off gives the waiter: its token and when its lease started.
#[derive(Debug, Clone, Copy)]
struct Handed {
    token: u64,
    granted_at: Option<Instant>,
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

    /// How many names are held or waited on right now (the number of entries in the store,
    /// read-write locks and semaphores included).
    pub fn len(&self) -> usize {
        self.inner.shards.iter().map(|s| lock(s).entries.len()).sum::<usize>() + self.inner.kinds.len()
    }

    /// Whether no name is held or waited on.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// How many callers wait for `key` (the backend key: prefix and name) right now.
    pub fn waiting(&self, key: &str) -> usize {
        let (hash, shard) = self.shard(key);
        shard.entries.find(hash, |e| e.key.is(key)).map_or(0, |e| e.waiters.len())
    }

    /// The allocated capacity of the store, in entries (to check that it shrinks).
    pub fn capacity(&self) -> usize {
        self.inner.shards.iter().map(|s| lock(s).entries.capacity()).sum()
    }

    /// The key's hash (computed once per operation) and its locked shard.
    fn shard(&self, key: &str) -> (u64, MutexGuard<'_, Shard>) {
        let hash = self.inner.hasher.hash_one(key);
        (hash, self.shard_of(hash))
    }

    /// The locked shard of a key whose hash is known.
    fn shard_of(&self, hash: u64) -> MutexGuard<'_, Shard> {
        lock(&self.inner.shards[((hash >> 40) as usize) % SHARDS])
    }

    fn holder_for(
        tokens: &mut Tokens,
        owner: OwnerId,
        process: super::Holder,
        lease: Lease,
        now: Option<Instant>,
    ) -> (Holder, Handed) {
        let token = tokens.next();
        let (expires_at, granted_at) = match lease {
            Lease::Fixed(d) => {
                let now = now.unwrap_or_else(crate::clock::now);
                (now.checked_add(d), Some(now))
            }
            // Not time-bound: an in-process lock lives exactly as long as its guard.
            Lease::Renewed(_) => (None, now),
        };
        (Holder { owner, process, token, expires_at }, Handed { token, granted_at })
    }

    /// Gives a free entry to its longest waiter still listening. Returns `false` when nobody
    /// waits any more (the caller removes the entry).
    fn hand_off(entry: &mut Entry, tokens: &mut Tokens, now: Instant) -> bool {
        debug_assert!(entry.holder.is_none());
        while let Some(waiter) = entry.waiters.pop_front() {
            let (holder, grant) = Self::holder_for(tokens, waiter.owner, waiter.process, waiter.lease, Some(now));
            if waiter.grant.send(grant).is_ok() {
                entry.holder = Some(holder);
                if let Some(head) = entry.waiters.front() {
                    head.holder_changed.notify_one(); // it now waits behind a new lease
                }
                return true;
            }
        }
        false
    }

    /// One attempt: the grant, or the holder's lease end (`Err(None)`: held without expiry).
    #[inline(always)]
    fn attempt(&self, req: &Acquire, hash: u64) -> Result<Handed, Option<Instant>> {
        let mut shard = self.shard_of(hash);
        let Shard { entries, tokens } = &mut *shard;
        let hasher = &self.inner.hasher;
        match entries.entry(hash, |e| e.key.is(&req.key), |e| hasher.hash_one(e.key.as_str())) {
            TableEntry::Vacant(slot) => {
                let (holder, grant) = Self::holder_for(tokens, req.owner, req.holder.clone(), req.lease, None);
                slot.insert(Entry { key: Key::new(&req.key), holder: Some(holder), waiters: Queue::default() });
                self.announce();
                Ok(grant)
            }
            TableEntry::Occupied(mut slot) => {
                let entry = slot.get_mut();
                let now = crate::clock::now();
                if entry.holder.as_ref().is_some_and(|h| h.expired(now)) {
                    entry.holder = None;
                    Self::hand_off(entry, tokens, now);
                    self.announce();
                }
                match &entry.holder {
                    None => {
                        let (holder, grant) =
                            Self::holder_for(tokens, req.owner, req.holder.clone(), req.lease, Some(now));
                        entry.holder = Some(holder);
                        self.announce();
                        Ok(grant)
                    }
                    Some(h) => Err(h.expires_at),
                }
            }
        }
    }

    /// Frees the entry of `key` held under `token` (if it still is), hands it on or removes it.
    /// Returns whether that grant still held it within its lease. Tokens are unique in the
    /// shard, so the entry of `key` and the token name the grant (and its owner).
    #[inline(always)]
    fn release_sync(&self, key: &str, hash: u64, token: u64) -> Result<(), &'static str> {
        let mut shard = self.shard_of(hash);
        let Shard { entries, tokens } = &mut *shard;
        // The entry still holds the key it was granted with, unless it was removed since.
        let Ok(mut slot) = entries.find_entry(hash, |e| e.key.is(key)) else {
            return Err("it is no longer held (its lease ran out and nobody else took it yet)");
        };
        let entry = slot.get_mut();
        let mine = entry.holder.as_ref().filter(|h| h.token == token);
        let Some(holder) = mine else {
            return Err("its lease ran out and it is now held by another owner");
        };
        let now = holder.expires_at.map(|_| crate::clock::now());
        let verdict = match now {
            Some(now) if holder.expired(now) => Err("its lease ran out before the release"),
            _ => Ok(()),
        };
        entry.holder = None;
        if entry.waiters.is_empty() || !Self::hand_off(entry, tokens, now.unwrap_or_else(crate::clock::now)) {
            slot.remove();
            shrink(entries, &self.inner.hasher);
        }
        self.announce();
        verdict
    }

    /// [`release_sync`](Self::release_sync) that keeps the entry held until `remaining` from
    /// now (`hold_at_least`): the holder's lease end becomes that instant (the queue's head
    /// re-arms its timer on it, and the lock is handed on when it passes), and a task frees an
    /// entry nobody waits for then.
    fn release_after_sync(
        &self,
        key: &Arc<str>,
        hash: u64,
        token: u64,
        remaining: Duration,
    ) -> Result<(), &'static str> {
        let now = crate::clock::now();
        let Some(until) = now.checked_add(remaining) else { return self.release_sync(key, hash, token) };
        {
            let mut shard = self.shard_of(hash);
            let Some(entry) = shard.entries.find_mut(hash, |e| e.key.is(key)) else {
                return Err("it is no longer held (its lease ran out and nobody else took it yet)");
            };
            let Some(holder) = entry.holder.as_mut().filter(|h| h.token == token) else {
                return Err("its lease ran out and it is now held by another owner");
            };
            if holder.expired(now) {
                drop(shard);
                return self.release_sync(key, hash, token);
            }
            holder.expires_at = Some(until);
            if let Some(head) = entry.waiters.front() {
                head.holder_changed.notify_one(); // its holder's lease end moved
            }
        }
        let (store, key) = (self.clone(), key.clone());
        reap_at(until, move || store.reap(&key, hash, crate::clock::now()));
        Ok(())
    }

    /// Takes away the lock of a holder whose lease ran out, handing it on. Returns the next
    /// instant at which the (new) holder's lease runs out, if any.
    fn reap(&self, key: &str, hash: u64, now: Instant) -> Option<Instant> {
        let mut shard = self.shard_of(hash);
        let Shard { entries, tokens } = &mut *shard;
        let mut slot = entries.find_entry(hash, |e| e.key.is(key)).ok()?;
        let entry = slot.get_mut();
        if entry.holder.as_ref().is_some_and(|h| h.expired(now)) {
            entry.holder = None;
            self.announce();
            if !Self::hand_off(entry, tokens, now) {
                slot.remove();
                shrink(entries, &self.inner.hasher);
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
#[inline]
fn shrink(shard: &mut HashTable<Entry>, hasher: &DefaultHashBuilder) {
    if shard.capacity() > 64 && shard.len() * 4 < shard.capacity() {
        shrink_now(shard, hasher);
    }
}

#[cold]
#[inline(never)]
fn shrink_now(shard: &mut HashTable<Entry>, hasher: &DefaultHashBuilder) {
    shard.shrink_to(shard.len() * 2, |e| hasher.hash_one(e.key.as_str()));
}

/// The mutexes' table, as an acquisition waits on it.
struct Mutexes;

impl Table for Mutexes {
    fn attempt(store: &MemoryBackend, req: &Acquire, hash: u64) -> Result<Result<Handed, Option<Instant>>, LockError> {
        Ok(store.attempt(req, hash))
    }

    fn enqueue(
        store: &MemoryBackend,
        req: &Acquire,
        hash: u64,
        grant: oneshot::Sender<Handed>,
        holder_changed: Arc<Notify>,
    ) -> Result<Option<Option<Instant>>, LockError> {
        let mut shard = store.shard_of(hash);
        let Some(entry) = shard.entries.find_mut(hash, |e| e.key.is(&req.key)) else { return Ok(None) };
        let Some(holder) = &entry.holder else { return Ok(None) };
        let expiry = holder.expires_at;
        let process = req.holder.clone();
        entry.waiters.push_back(Waiter { owner: req.owner, process, lease: req.lease, grant, holder_changed });
        Ok(Some(expiry))
    }

    fn expiry(store: &MemoryBackend, req: &Acquire, hash: u64) -> Option<Instant> {
        let shard = store.shard_of(hash);
        let entry = shard.entries.find(hash, |e| e.key.is(&req.key));
        entry.and_then(|e| e.holder.as_ref()).and_then(|h| h.expires_at)
    }

    fn reap(store: &MemoryBackend, req: &Acquire, hash: u64, now: Instant) -> Option<Instant> {
        store.reap(&req.key, hash, now)
    }

    fn leave(store: &MemoryBackend, req: &Acquire, hash: u64, mut grant: oneshot::Receiver<Handed>) {
        let now = crate::clock::now();
        let owner = req.owner;
        let mut shard = store.shard_of(hash);
        let Shard { entries, tokens } = &mut *shard;
        let Ok(mut slot) = entries.find_entry(hash, |e| e.key.is(&req.key)) else { return };
        let entry = slot.get_mut();
        let was_head = entry.waiters.front().is_some_and(|w| w.owner == owner);
        entry.waiters.retain(|w| w.owner != owner);
        if was_head {
            if let Some(head) = entry.waiters.front() {
                head.holder_changed.notify_one(); // the new head watches the holder's lease
            }
        }
        grant.close();
        let remove = if let Ok(handed) = grant.try_recv() {
            if entry.holder.as_ref().is_some_and(|h| h.owner == owner && h.token == handed.token) {
                entry.holder = None;
                store.announce();
                !MemoryBackend::hand_off(entry, tokens, now)
            } else {
                false
            }
        } else {
            entry.holder.is_none() && entry.waiters.is_empty()
        };
        if remove {
            slot.remove();
            shrink(entries, &store.inner.hasher);
        }
    }

    fn grant(store: &MemoryBackend, req: &Acquire, hash: u64, handed: Handed) -> Grant {
        store.grant_taking(Granted { hash, handed }, req.clone()).1
    }
}

/// A lock taken by [`MemoryBackend::try_acquire_granted`], its held lock not built yet.
pub(crate) struct Granted {
    hash: u64,
    handed: Handed,
}

/// A lock held in the in-process store.
pub(crate) struct MemoryHeld {
    store: MemoryBackend,
    /// The key's hash, computed once by the attempt.
    hash: u64,
    /// `None` when the name is the key (no prefix): one shared string, one count less.
    name: Option<Arc<str>>,
    key: Arc<str>,
    /// Unique in the key's shard: with the key, names the grant (and so its owner).
    token: u64,
}

impl HeldLock for MemoryHeld {
    fn release(&mut self) -> BoxFuture<'_, Result<(), LockError>> {
        Box::pin(std::future::ready(self.release_checked()))
    }

    #[inline]
    fn release_now(&mut self) -> Option<Result<(), LockError>> {
        Some(self.release_checked())
    }

    fn release_after(&mut self, remaining: Duration) -> BoxFuture<'_, Result<(), LockError>> {
        Box::pin(std::future::ready(self.release_after_now(remaining)))
    }
}

impl MemoryHeld {
    /// [`HeldLock::release_after`], at once.
    pub(crate) fn release_after_now(&self, remaining: Duration) -> Result<(), LockError> {
        match self.store.release_after_sync(&self.key, self.hash, self.token, remaining) {
            Ok(()) => Ok(()),
            Err(reason) => Err(self.lost(reason)),
        }
    }

    #[inline(always)]
    fn release_checked(&self) -> Result<(), LockError> {
        match self.store.release_sync(&self.key, self.hash, self.token) {
            Ok(()) => Ok(()),
            Err(reason) => Err(self.lost(reason)),
        }
    }

    #[cold]
    #[inline(never)]
    fn lost(&self, reason: &'static str) -> LockError {
        LockError::lost(&**self.name.as_ref().unwrap_or(&self.key), reason)
    }
}

impl MemoryBackend {
    /// [`LockBackend::try_acquire_now`] for a caller that gives up the request once it is
    /// granted ([`grant_taking`](Self::grant_taking)); `None` when the lock is held.
    #[inline(always)]
    pub(crate) fn try_acquire_granted(&self, req: &Acquire) -> Option<Granted> {
        let hash = self.inner.hasher.hash_one(&*req.key);
        self.attempt(req, hash).ok().map(|handed| Granted { hash, handed })
    }

    /// The grant of [`try_acquire_granted`](Self::try_acquire_granted), taking the request's
    /// key (one reference count less than a clone); gives back its name.
    #[inline(always)]
    pub(crate) fn grant_taking(&self, granted: Granted, req: Acquire) -> (Arc<str>, Grant) {
        let Granted { hash, handed } = granted;
        let Acquire { name, key, .. } = req;
        let lock = MemoryHeld {
            hash,
            store: self.clone(),
            name: if Arc::ptr_eq(&name, &key) { None } else { Some(name.clone()) },
            key,
            token: handed.token,
        };
        (name, Grant { fencing_token: handed.token, granted_at: handed.granted_at, lock: Held::memory(lock) })
    }
}

impl LockBackend for MemoryBackend {
    fn name(&self) -> &'static str {
        "memory"
    }

    fn inspector(&self) -> Option<&dyn super::Inspect> {
        Some(self)
    }

    /// Every kind: mutexes, read-write locks and semaphores.
    fn supports(&self, _kind: LockKind) -> bool {
        true
    }

    fn begin(&self, req: Acquire, _lost: crate::lost::LostSignal) -> Box<dyn Acquisition> {
        let hash = self.inner.hasher.hash_one(&*req.key);
        if req.kind == LockKind::Exclusive {
            Box::new(MemoryAcquisition::<Mutexes>::new(self.clone(), req, hash))
        } else {
            Box::new(MemoryAcquisition::<kinds::Kinds>::new(self.clone(), req, hash))
        }
    }

    fn try_acquire_now(&self, req: &Acquire) -> Option<Result<Attempt, LockError>> {
        if req.kind != LockKind::Exclusive {
            let hash = self.inner.hasher.hash_one(&*req.key);
            return Some(kinds::try_acquire_now(self, req, hash));
        }
        // A manager built on this store calls `try_acquire_granted` instead (no key clone).
        Some(Ok(match self.try_acquire_granted(req) {
            Some(granted) => Attempt::Acquired(self.grant_taking(granted, req.clone()).1),
            None => Attempt::Busy,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::{inline_bytes, same_short, INLINE_KEY};

    #[test]
    fn inline_keys_hold_every_byte_zero_padded() {
        for len in 0..=INLINE_KEY + 2 {
            let key: Vec<u8> = (0..len).map(|i| b'a' + i as u8).collect();
            let mut expected = [0u8; INLINE_KEY];
            match expected.get_mut(..len) {
                Some(head) => {
                    head.copy_from_slice(&key);
                    assert_eq!(inline_bytes(&key), Some(expected), "len {len}");
                }
                None => assert_eq!(inline_bytes(&key), None, "len {len}"),
            }
        }
    }

    #[test]
    fn short_keys_compare_every_byte() {
        for len in 0..=24 {
            let a: Vec<u8> = (0..len).map(|i| b'a' + i as u8).collect();
            assert!(same_short(&a, &a.clone()), "len {len}");
            for at in 0..len {
                let mut b = a.clone();
                b[at] ^= 0x20;
                assert!(!same_short(&a, &b), "len {len}, differing at {at}");
            }
        }
    }
}
