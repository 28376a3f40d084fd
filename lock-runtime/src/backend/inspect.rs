//! Inspection: what a store can tell about its locks ([`LockInfo`]), forced releases, and the
//! [`Inspect`] capability that a backend implements beside [`LockBackend`](super::LockBackend)
//! so that a tool (`lockctl`) can list, show, release and watch its locks through one
//! `dyn Inspect`, whatever the store.

use std::time::Duration;

use super::{BoxFuture, Holder, LockKind};
use crate::error::LockError;

/// What a store can tell about one held lock, for inspection tools (`lockctl`). A field the
/// store cannot know is `None` ("unknown"), never guessed.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct LockInfo {
    /// The key in the backend: the manager's prefix followed by the lock's name.
    pub key: String,
    /// The holding acquisition's owner id, as stored.
    pub owner: String,
    /// The holding process, when it stored one (older versions did not).
    pub holder: Option<Holder>,
    /// Which kind of lock the holder took (a mutex, the read or write side of a read-write
    /// lock, a permit of a semaphore), when the store tells it. An election's term is a mutex.
    pub kind: Option<LockKind>,
    /// The fencing token the holder was granted.
    pub fencing_token: Option<u64>,
    /// How long ago the lock was granted (by the store's clock where it has one).
    pub age: Option<Duration>,
    /// `age` is an upper bound: counted from when the holder queued, which may be before it
    /// was granted the lock (ZooKeeper, for a holder that does not record its grant).
    pub age_at_most: bool,
    /// The lease left before the store frees the lock by itself; `None` when unknown or when
    /// the lock has no lease (see `session_bound`).
    pub remaining_lease: Option<Duration>,
    /// Held for as long as the holder's session lives (ZooKeeper without a fixed lease).
    pub session_bound: bool,
    /// Acquisitions queued behind the holder, when the store knows them all (ZooKeeper, etcd,
    /// PostgreSQL, memory).
    pub waiters: Option<u64>,
    /// Whether some acquisition found the lock held and waits for its release, or an
    /// election's observer watches it (Redis's waited-on mark), when the store records it.
    pub waited_on: Option<bool>,
    /// Connections subscribed to the lock's release channel (Redis: processes with a waiter
    /// now, or within their unsubscribe grace), when the store has such a channel.
    pub subscribers: Option<u64>,
    /// Acquisitions of other processes queued in the store to be granted the lock by its
    /// release (Redis, one server or Sentinel: the live entries of the lock's queue; a waiter
    /// enters it once it has waited a third of its claim window), when the store keeps such a
    /// queue and the user may read it. Waiters that have not entered it yet are not counted.
    pub queued: Option<u64>,
    /// Granted by a release to a waiting acquisition of another process that has not claimed
    /// it yet (Redis's queue of waiting processes): nobody holds the lock, and nobody else can
    /// take it until the grantee claims it (keeping `fencing_token`) or its claim deadline,
    /// `remaining_lease`, passes. An election names no leader for it.
    pub unclaimed: bool,
}

impl LockInfo {
    /// A record of a held lock where nothing but the key and the owner is known yet.
    pub fn new(key: impl Into<String>, owner: impl Into<String>) -> Self {
        LockInfo {
            key: key.into(),
            owner: owner.into(),
            holder: None,
            kind: None,
            fencing_token: None,
            age: None,
            age_at_most: false,
            remaining_lease: None,
            session_bound: false,
            waiters: None,
            waited_on: None,
            subscribers: None,
            queued: None,
            unclaimed: false,
        }
    }
}

/// How a forced release ([`RedisBackend::force_release`],
/// …) ended.
#[doc = ""]
#[cfg_attr(feature = "redis", doc = "[`RedisBackend::force_release`]: super::redis::RedisBackend::force_release")]
#[cfg_attr(
    not(feature = "redis"),
    doc = "[`RedisBackend::force_release`]: https://docs.rs/lock-runtime/latest/lock_runtime/backend/redis/struct.RedisBackend.html#method.force_release"
)]
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ForceRelease {
    /// The lock was freed (its waiters are woken); holds the owner it was taken from.
    Released(String),
    /// Nobody held it.
    NotHeld,
    /// Another owner than the expected one holds it now (left untouched); holds that owner.
    OwnerChanged(String),
}

/// The inspection capability: a backend whose locks can be listed, shown, released by force
/// and watched. Implemented by every built-in backend but Redlock; a tool takes a
/// `Box<dyn Inspect>` and needs to know no more of the store.
///
/// ```no_run
/// use lock_runtime::backend::Inspect;
///
/// async fn show_all(store: &dyn Inspect) -> Result<(), lock_runtime::LockError> {
///     for lock in store.list("orders:").await? {
///         println!("{} held by {:?} (token {:?})", lock.key, lock.holder, lock.fencing_token);
///     }
///     Ok(())
/// }
/// ```
pub trait Inspect: Send + Sync + 'static {
    /// The store's short name (`"redis"`, `"zookeeper"`, …).
    fn store(&self) -> &'static str;

    /// The held locks whose key (the manager prefix followed by the lock name) starts with
    /// `prefix`.
    fn list<'a>(&'a self, prefix: &'a str) -> BoxFuture<'a, Result<Vec<LockInfo>, LockError>>;

    /// The lock `key`, if it is held.
    fn inspect<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<Option<LockInfo>, LockError>>;

    /// Releases the lock `key` whoever holds it; with `expected_owner`, only while that owner
    /// still holds it (else [`ForceRelease::OwnerChanged`]). Its waiters are woken.
    fn force_release<'a>(
        &'a self,
        key: &'a str,
        expected_owner: Option<&'a str>,
    ) -> BoxFuture<'a, Result<ForceRelease, LockError>>;

    /// What tells a live view of the locks under `prefix` to look again.
    fn changes<'a>(&'a self, prefix: &'a str) -> BoxFuture<'a, Result<Box<dyn ChangeFeed>, LockError>>;

    /// What tells a watcher of the one lock `key` to look again (an election's
    /// [`LeaderWatch`](crate::LeaderWatch)). The default is [`changes`](Self::changes) of `key`
    /// as a prefix; a store may do better for one lock (Redis subscribes to the lock's own
    /// channel and has its release announced).
    fn changes_of<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<Box<dyn ChangeFeed>, LockError>> {
        self.changes(key)
    }
}

/// What tells a live view of the locks under a prefix to look again ([`Inspect::changes`]).
///
/// A feed reports every change made since it was opened, or since its last
/// [`changed`](ChangeFeed::changed) completed, even one made before `changed` is called
/// again: a view looks, then waits, and a change between the two must not be missed.
pub trait ChangeFeed: Send {
    /// Completes when the locks may have changed (it may also complete when nothing did).
    fn changed(&mut self) -> BoxFuture<'_, Result<(), LockError>>;

    /// Whether every change is announced. When not (Redis announces releases, but takes only
    /// with keyspace notifications on), a live view also looks again now and then.
    fn complete(&self) -> bool;
}

/// The change feed of a store that announces nothing (lock files, PostgreSQL): a live view
/// looks again every interval.
pub(crate) struct Unannounced;

impl ChangeFeed for Unannounced {
    fn changed(&mut self) -> BoxFuture<'_, Result<(), LockError>> {
        Box::pin(std::future::pending())
    }

    fn complete(&self) -> bool {
        false
    }
}
