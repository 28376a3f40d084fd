//! The ZooKeeper backend (feature `zookeeper`): Curator's `InterProcessMutex` recipe, on the
//! async [`zookeeper-client`](https://docs.rs/zookeeper-client) crate.
//!
//! ```no_run
//! use std::time::Duration;
//! use lock_runtime::backend::zookeeper::{ZookeeperBackend, ZookeeperOptions};
//! use lock_runtime::LockManager;
//!
//! # #[tokio::main] async fn main() -> Result<(), lock_runtime::LockError> {
//! // Defaults: session timeout 6 s, operation timeout 5 s, locks under `/lock-runtime`.
//! let manager = LockManager::zookeeper("127.0.0.1:2181").await?;
//!
//! // Or with options:
//! let options = ZookeeperOptions::new()
//!     .session_timeout(Duration::from_secs(10))
//!     .operation_timeout(Duration::from_secs(3))
//!     .root("/myapp/locks");
//! let backend = ZookeeperBackend::connect_with("zk1:2181,zk2:2181,zk3:2181", options).await?;
//! let manager = LockManager::builder().prefix("orders:").backend(backend);
//! let guard = manager.lock("42").await?;
//! guard.release().await?;
//! # Ok(()) }
//! ```
//!
//! # The recipe
//!
//! A lock named `key` (the manager prefix and the name) is the container node
//! `<root>/<encoded key>`; `key` is percent-encoded so that any valid lock name, `/` included, is
//! one safe znode name. Each acquisition (one `lock()` call) owns **one** ephemeral sequential
//! child `lk-<owner id>-<sequence>` for its whole life; the child with the lowest sequence
//! holds the lock (fair, FIFO).
//!
//! - **The first attempt** creates the node and lists the children. Lowest: acquired.
//!   Otherwise the node stays: it is the acquisition's place in the queue.
//! - **Waiting** watches only the predecessor (a watch on that one node), so a release wakes
//!   exactly one waiter: no herd, no polling. The lock is handed over when the node becomes the
//!   lowest: a waiter right behind the holder takes it as soon as the holder's node is deleted
//!   (later nodes get higher sequence numbers), without listing the children again. The node is kept across attempts and waits, so the acquisition keeps its FIFO
//!   place until it is granted or gives up.
//! - **Giving up** (the `wait` ran out, an error, the future was dropped, or a
//!   [`try_lock`](crate::LockManager::try_lock) whose one attempt found the lock busy) drops
//!   the acquisition, and its drop deletes the node: the delete is sent at once (so any later
//!   request of the same session comes after it) and awaited by a spawned task that retries
//!   across a connection loss. Nothing is left behind.
//! - **Lost replies.** The node name carries the acquisition's unique owner id. When a create's
//!   reply is lost to a connection loss, the acquisition looks for its node by that id once the
//!   session has reconnected, instead of creating a second one. It first `sync`s: the client
//!   may have reconnected to a follower that has not applied the create yet, and a plain
//!   listing there would miss the node. An acquisition dropped while a create is in flight
//!   deletes whatever node carries its id, the same way (in a spawned task; until it is done,
//!   new acquisitions of that lock through the same backend wait for it, so the orphan is never
//!   ahead of them).
//! - **No leftovers.** Lock nodes are containers (the server deletes them once empty), and a
//!   release also deletes the parent when it is empty (pipelined behind the node's delete, so it
//!   costs no extra round trip), so names that are no longer used leave no znodes behind.
//! - **Fencing token**: the lock node's creation zxid (`czxid`), which is global and strictly
//!   increasing across the whole ensemble, unlike the sequence suffix, which restarts when a
//!   parent node is recreated.
//!
//! # Read-write locks and semaphores
//!
//! [`read_lock`](crate::LockManager::read_lock), [`write_lock`](crate::LockManager::write_lock)
//! and [`semaphore`](crate::LockManager::semaphore) use the same recipe (one ephemeral
//! sequential node per acquisition, kept while it waits; fixed leases; fencing token = the
//! node's `czxid`; cancellation deletes the node), in containers of their own beside the
//! mutex's: `<root>/<encoded key>.rw` and `<root>/<encoded key>.sem`.
//!
//! - Nodes `read-<owner id>-<seq>` and `write-<owner id>-<seq>`: a writer holds when its node
//!   is the lowest and otherwise watches its predecessor; a reader holds when no `write-` node is
//!   lower than its own (so a waiting writer blocks later readers) and otherwise watches the
//!   nearest lower `write-` node.
//! - Nodes `sem<permits>-<owner id>-<seq>`: the first `permits` nodes hold. The first waiter
//!   watches the holders, every later waiter its predecessor; a waiter granted after waiting
//!   records its grant in its node's data, which wakes the one behind it. A release wakes one
//!   waiter (and its grant the next), never the whole queue.
//! - The permits are part of each node's name: an acquisition whose listing shows a node ahead
//!   of it with other permits is refused with an [`is_invalid`](LockError::is_invalid) error.
//!
//! `lockctl` ([`Inspect::list`](crate::backend::Inspect::list)) shows the mutexes only.
//!
//! # Leases and sessions
//!
//! ZooKeeper holds a lock for as long as the session that created its node lives, so a
//! watchdog lease (no `lease` given) needs no renewal: the lock is kept while the guard lives
//! and the session is healthy, and freed by the server when the holder's process dies (its
//! session expires after the session timeout).
//!
//! A **fixed `lease`** must not be held past its end, and a session store does not expire nodes
//! by itself. So the holder's process deletes its node when the lease ends: each grant starts
//! a small task that sleeps until `granted_at + lease` (the instant at which the runtime also
//! fires [`lost()`](crate::LockGuard::lost)) and then deletes the node, handing the lock to the
//! next waiter. The task stops when the guard is released or dropped.
//!
//! **Every lease is counted from its grant**, also by the waiters, for the case where the
//! holder's process cannot delete its node (it hangs with its session alive, or is cut off from
//! the ensemble). The fixed lease is recorded in the node's data (`holder=<h>;lease_ms=<n>`,
//! `<h>` the [`Holder`](crate::backend::Holder): host, pid and the manager's label, also
//! recorded alone for a watchdog lease, so that `lockctl` can tell who holds a lock), and a
//! holder that *waited* records its grant before it takes the lock, by rewriting the data to
//! `holder=<h>;lease_ms=<n>;granted` (conditional on the node's first version); its `granted_at` is taken
//! before that write. The next waiter (the one watching the holder) deletes the holder's node
//! once the lease plus [`STALE_HOLDER_MARGIN`] is over:
//!
//! - for a recorded grant, counted from the record's server time (`mtime`), compared with the
//!   waiter's own node's creation time (`ctime`), both stamped by the server, so no two client
//!   clocks are compared;
//! - without a record, counted from when the waiter saw the holder's node become the lowest. A
//!   holder granted in the attempt that created its node counts its lease from before that
//!   create, so from earlier. A holder that waited and has not recorded yet holds nothing: the
//!   waiter's delete is conditional on the version it read, and the holder's record on the
//!   first version, so exactly one of them wins.
//!
//! **`hold_at_least`.** A holder that lets go before its `hold_at_least` has passed does not
//! delete its node: it rewrites the node's data to `holder=<h>;lease_ms=<remainder>;granted`
//! (so the server's `mtime` of that write starts the remainder, counted as a recorded grant's
//! lease by the waiter watching the node) and deletes the node when the remainder has passed
//! (by its own timer, started after the write's answer). The deletion wakes the next waiter
//! through its watch, as a release does. The node stays ephemeral: if the holder's process
//! dies during the remainder, its session's end frees the lock earlier (and a waiter deletes
//! it once the recorded remainder plus the margin is over if the process hangs).
//!
//! The margin covers a step of the server's clock or a leader change in between. So the lock
//! is never taken away before the holder's runtime has reported it lost. If the holder's
//! process dies and nobody waits, its session's end frees the node.
//!
//! **Session loss** fires `lost()` on every lock held through the session: at once when the
//! session expires or is closed, and when the client has been disconnected for longer than
//! [`ZookeeperOptions::lost_after_disconnect`] (half the negotiated session timeout by
//! default). Half, not all of it: a silent network partition is noticed only after up to 2/5 of
//! the timeout, and the server may expire the session (and let another client take the lock) a
//! full timeout after it last heard from this one; firing earlier leaves a margin, as Curator
//! advises for its `SUSPENDED` state. The abandoned session is closed as soon as it can be, and
//! the next operation connects a new session, so new attempts work again once the ensemble is
//! reachable; while it is not, they fail at once with an [`is_backend`](LockError::is_backend)
//! error. Each held lock also watches its own node, so a node deleted by anyone else (an
//! operator, another tool, [`Inspect::force_release`](crate::backend::Inspect::force_release)) fires `lost()` too.
//! [`Inspect::list`](crate::backend::Inspect::list) and [`Inspect::inspect`](crate::backend::Inspect::inspect) show the held locks: holder,
//! token (`czxid`), age, lease and the exact number of waiters.
//!
//! Every option is validated when the backend connects (see [`ZookeeperOptions`]); every
//! operation is bounded by the operation timeout, and every background task (the session's
//! supervisor, a held lock's lease task, a clean-up) ends with what it serves.
//!
//! The session runs on the tokio runtime that created the backend: keep that runtime alive
//! for as long as the manager is used.

use std::sync::{Mutex, MutexGuard, PoisonError};

use crate::error::LockError;

mod backend;
mod inspect;
mod kinds;
mod options;
mod purge;
mod recipe;
mod session;

pub use backend::{ZookeeperBackend, ZookeeperStats};
pub use options::ZookeeperOptions;
pub use recipe::STALE_HOLDER_MARGIN;

const KIND: &str = "zookeeper";
/// The prefix of every lock node's name.
const NODE_PREFIX: &str = "lk-";

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

fn zk_error(name: &str, operation: &'static str, e: zookeeper_client::Error) -> LockError {
    LockError::backend(name, KIND, operation, e)
}

fn gone(name: &str, operation: &'static str, what: String) -> LockError {
    LockError::backend(name, KIND, operation, what)
}

fn session_gone(name: &str, operation: &'static str) -> LockError {
    gone(name, operation, "the ZooKeeper session was lost (expired, or disconnected too long)".to_owned())
}
