//! The etcd backend (feature `etcd`): etcd's lock recipe (a lease per manager, a key per
//! waiter, each waiter watching the key just before its own), on the async
//! [`etcd-client`](https://docs.rs/etcd-client) crate (gRPC over tonic; plain `http://`
//! endpoints, no TLS in this build).
//!
//! ```no_run
//! use std::time::Duration;
//! use lock_runtime::backend::etcd::{EtcdBackend, EtcdOptions};
//! use lock_runtime::LockManager;
//!
//! # #[tokio::main] async fn main() -> Result<(), lock_runtime::LockError> {
//! // Defaults: lease TTL 10 s, operation timeout 5 s, keys under `lock-runtime/`.
//! let manager = LockManager::etcd(&["http://127.0.0.1:2379"]).await?;
//!
//! // Or with options:
//! let options = EtcdOptions::new()
//!     .lease_ttl(Duration::from_secs(6))
//!     .operation_timeout(Duration::from_secs(3))
//!     .root("myapp/locks");
//! let backend = EtcdBackend::connect_with(&["http://etcd1:2379", "http://etcd2:2379"], options).await?;
//! let manager = LockManager::builder().prefix("orders:").backend(backend);
//! let guard = manager.lock("42").await?;
//! guard.release().await?;
//! # Ok(()) }
//! ```
//!
//! # The recipe
//!
//! - **One lease per backend** (per manager), granted when it connects, with
//!   [`EtcdOptions::lease_ttl`]; a background task keeps it alive (a keep-alive every third of
//!   the TTL) and stops when the backend is dropped (which also revokes the lease).
//! - **One key per acquisition**: `<root>/<encoded lock key>/<lease id, hex>-<owner id>`, put
//!   with the lease (the lock key is percent-encoded so that one lock's keys are never under
//!   another's prefix). Its value is the [`Holder`](crate::backend::Holder) text.
//! - **The key with the lowest create revision under the lock's prefix holds the lock** (fair,
//!   FIFO). The first attempt puts the key and reads the lowest key in one transaction.
//! - **Waiting** reads the key with the largest create revision below its own and watches that
//!   one key for its deletion (from the revision of the read, so no event is missed): a release
//!   wakes exactly one waiter, no herd, no polling. When no key is below its own, the waiter
//!   holds the lock (handed over without another attempt).
//! - **Fencing token**: the key's create revision, global and strictly increasing across the
//!   cluster.
//! - **Giving up** (the wait ran out, an error, a dropped future, a `try_lock` that found the
//!   lock busy) drops the acquisition, and its drop deletes its key in a spawned task. A put
//!   whose future was dropped runs to its end in its own task, and the key (whose name the
//!   acquisition knows in advance) is deleted after it; a put whose answer was lost is deleted
//!   at once and once more after the operation timeout. Nothing is left behind.
//!
//! # Leases
//!
//! Keys live as long as the manager's lease, which the keep-alive task renews for every lock at
//! once: a watchdog lease (no `lease` given) needs no renewal of its own
//! ([`HeldLock::renewal`](crate::backend::HeldLock::renewal) is `None`).
//!
//! - **A fixed `lease`** is enforced by the holder: a task owned by the held lock deletes the
//!   key when the lease ends (at the instant the runtime fires
//!   [`lost()`](crate::LockGuard::lost)), handing the lock to the next waiter. A holder whose
//!   process hangs with its keep-alive running keeps the lock past a fixed lease: etcd itself
//!   only knows the manager's lease.
//! - **`hold_at_least`**: a holder that lets go early keeps its key and deletes it when the
//!   remainder has passed (a bounded task); if its process dies meanwhile, the lease frees it
//!   sooner.
//! - **Lease loss** fires `lost()` on every lock held through the lease: when the server says
//!   the lease is gone, and when no keep-alive has been answered for two thirds of the TTL,
//!   *before* the server may expire the lease and let another client in (the server counts the
//!   TTL from the last keep-alive it received, which is after the last one this client sent).
//!   The task then revokes the old lease when it can and grants a new one; until it has one,
//!   new acquisitions fail at once with an [`is_backend`](LockError::is_backend) error.
//! - **Server restart.** etcd keeps its keys and leases across a restart (with its data
//!   directory) and renews every lease's TTL when it comes back: a restart shorter than two
//!   thirds of the TTL (server start-up included) loses nothing; a longer one fires `lost()` as above, and the manager
//!   works again with a new lease once the server is back.
//!
//! [`EtcdBackend::stats`] counts the waiters, the watches they opened and their wake-ups (one
//! per release with a waiter behind it: no herd).
//!
//! Every operation is bounded by [`EtcdOptions::operation_timeout`]. The keep-alive task runs
//! on the tokio runtime that created the backend: keep that runtime alive for as long as the
//! manager is used.

use std::sync::{Mutex, MutexGuard, PoisonError};

use crate::error::LockError;

mod backend;
mod options;
mod recipe;
mod session;

pub use backend::{EtcdBackend, EtcdStats};
pub use options::EtcdOptions;

const KIND: &str = "etcd";

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

fn etcd_error(name: &str, operation: &'static str, e: etcd_client::Error) -> LockError {
    LockError::backend(name, KIND, operation, e)
}

/// `key` with `%` and `/` percent-encoded: one path segment, never a prefix of another lock's.
fn encode(key: &str) -> String {
    let mut out = String::with_capacity(key.len());
    for c in key.chars() {
        match c {
            '%' => out.push_str("%25"),
            '/' => out.push_str("%2F"),
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encoded_keys_are_one_segment_and_distinct() {
        assert_eq!(encode("a/b"), "a%2Fb");
        assert_eq!(encode("a%2Fb"), "a%252Fb");
        assert_ne!(encode("a/b"), encode("a%2Fb"));
        assert_eq!(encode("plain:42"), "plain:42");
    }
}
