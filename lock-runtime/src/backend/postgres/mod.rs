//! The PostgreSQL backend (feature `postgres`): session-level advisory locks, on
//! [`tokio-postgres`](https://docs.rs/tokio-postgres).
//!
//! ```no_run
//! use std::time::Duration;
//! use lock_runtime::backend::postgres::{PostgresBackend, PostgresOptions};
//! use lock_runtime::LockManager;
//!
//! # #[tokio::main] async fn main() -> Result<(), lock_runtime::LockError> {
//! // Defaults: operation timeout 5 s, up to 16 idle connections kept for reuse.
//! let manager = LockManager::postgres("postgres://app@127.0.0.1:5432/app").await?;
//!
//! // Or with options:
//! let options = PostgresOptions::new().operation_timeout(Duration::from_secs(3)).max_idle(4);
//! let backend = PostgresBackend::connect_with("postgres://app@db:5432/app", options).await?;
//! let manager = LockManager::builder().prefix("orders:").backend(backend);
//! let guard = manager.lock("42").await?;
//! guard.release().await?;
//! # Ok(()) }
//! ```
//!
//! `tokio-postgres` rather than `sqlx`: the backend needs one plain connection per held lock, a
//! cancel request and the simple query protocol, nothing of an ORM-style toolkit; it builds
//! with `default-features = false` and the `runtime` feature only (no TLS: see *Missing*).
//!
//! # How it works
//!
//! - **One connection per held lock.** A PostgreSQL advisory lock taken with
//!   `pg_advisory_lock` belongs to the *session* (the connection) that took it, until it is
//!   unlocked or the session ends. So each acquisition takes a connection of its own (an idle
//!   one kept from an earlier lock, or a new one) and keeps it for as long as it waits and then
//!   holds the lock. A release runs `pg_advisory_unlock` and gives the connection back to the
//!   idle set ([`PostgresOptions::max_idle`]); any doubt (an error, a time bound passed, a
//!   cancelled call) closes the connection instead, which frees whatever its session held.
//! - **An attempt** is one round trip:
//!   `SELECT CASE WHEN pg_try_advisory_lock(k1, k2) THEN nextval('lock_runtime_fence') END`.
//! - **Waiting** is the server's, not a poll: on the same connection, one round trip of
//!   `SELECT set_config('lock_timeout', '<remaining>ms', true); SELECT pg_advisory_lock(k1, k2);
//!   SELECT nextval('lock_runtime_fence')` (one implicit transaction, so the `lock_timeout` is
//!   local to it). The server queues the waiter and grants it the lock as soon as the holder's
//!   session lets go (a release, a lease ending, a connection closed), in the order
//!   PostgreSQL's lock manager wakes waiters. A wait that runs out fails with `lock_not_available`
//!   (`55P03`): the acquisition is contended. A waiting acquisition that is dropped sends a
//!   cancel request (`CancelToken`) and closes its connection, so nothing stays queued on the
//!   server (and a grant that raced the cancel is freed with the session).
//! - **Fencing token**: `nextval` of the sequence `lock_runtime_fence` (created on connect
//!   if missing, in the connection's `search_path`), drawn on the holder's connection right
//!   after the grant, in the same statement or query message. An advisory session lock is not
//!   transactional, so "the same transaction" means: only the holder draws, after it holds the
//!   lock and before it is told so, hence tokens of successive holders of a name strictly
//!   increase. The sequence is global (one counter for every name), survives restarts, and after
//!   a crash only ever jumps forward.
//! - **Every call is bounded** by the operation timeout (a wait by its remaining time plus the
//!   operation timeout); a bound passed closes the connection.
//!
//! # Lock keys and collisions
//!
//! A lock's key (the manager's prefix and the name) is mapped to the two-int form of the
//! advisory lock functions, `pg_advisory_lock(int4, int4)`: the first 8 bytes of the key's
//! MD5 digest, as two big-endian signed 32-bit integers ([`advisory_key`]). The two-int key
//! space is separate from the single-`bigint` one, so locks an application takes with
//! `pg_advisory_lock(bigint)` never collide with these.
//!
//! Two different keys with the same 64-bit digest prefix share one advisory lock: a collision
//! is **false contention** (one waits for the other), never false exclusion (two holders at
//! once). With 64 bits, a collision among a million names in use is a one-in-30-million
//! chance. Fencing tokens stay strictly increasing per name either way.
//!
//! # Leases and sessions
//!
//! PostgreSQL has no leases: a held lock lives with its session, like a ZooKeeper lock. A
//! watchdog lease (no `lease` given) needs no renewal ([`HeldLock::renewal`](crate::backend::HeldLock::renewal) is `None`): the
//! lock is kept while the guard lives and its connection is open, and freed by the server when
//! the holder's process dies (the socket closes; for a host that vanishes, TCP keepalives,
//! which this backend turns on, end the session).
//!
//! A **fixed `lease`** must not be held past its end, so each grant starts a small task that
//! closes the lock's connection at `granted_at + lease` (the runtime fires
//! [`lost()`](crate::LockGuard::lost) a little before): the server frees the lock and its next
//! waiter is granted at once. `granted_at` is taken when the grant's reply arrives: the lease is
//! counted by this process alone, the server never takes the lock away by itself.
//!
//! **`hold_at_least`**: a holder that lets go early keeps its connection (and so the lock) and
//! unlocks when the remainder has passed, from a task of its own; if the process dies meanwhile,
//! the session's end frees the lock earlier.
//!
//! **Connection loss fires `lost()`**: each held lock watches its connection, and when the
//! connection ends (the server terminated the backend with `pg_terminate_backend`, restarted,
//! or the network failed) the server has released (or will release, once it notices) the
//! session's advisory locks, so `lost()` fires at once and a later release is an
//! [`is_lost`](LockError::is_lost) error. New acquisitions use fresh connections.
//!
//! # Connection poolers
//!
//! Session locks need a session: a pooler in **transaction** or **statement** mode (PgBouncer's
//! `pool_mode = transaction`) hands each transaction to any server connection, so a lock would
//! be taken on one server session and unlocked (or not) on another. [`PostgresBackend::connect`]
//! detects what it can: it asks the server for its backend pid twice, in two transactions, and
//! refuses with an [`is_invalid`](LockError::is_invalid) error if the answers differ. Connect
//! directly to PostgreSQL, or through a pooler in `session` mode.
//!
//! The transaction-scoped alternative, for work that fits in one database transaction behind
//! such a pooler, is PostgreSQL's own `pg_advisory_xact_lock(k1, k2)`, released at commit or
//! rollback; [`advisory_key`] gives the same keys, so both kinds of holders exclude each other:
//!
//! ```sql
//! BEGIN;
//! SELECT pg_advisory_xact_lock(k1, k2);  -- (k1, k2) = advisory_key("orders:42")
//! -- … the work …
//! COMMIT;                                -- frees it
//! ```
//!
//! # What is guaranteed
//!
//! Mutual exclusion holds as long as the holder's session lives; a session's end (terminated,
//! server restart, network failure noticed by either side) frees the lock and fires the
//! holder's `lost()` when its process notices. A silent network partition is noticed by the
//! server only through TCP keepalives, and by the holder on its next use of the connection or
//! by keepalives: until then both may believe it held; use the fencing token downstream.
//!
//! # Missing
//!
//! TLS (the backend connects with `NoTls`; `sslmode=require` fails to connect), read-write
//! locks and semaphores (`pg_advisory_lock_shared` would give read locks), and `lockctl`
//! inspection.

use crate::error::LockError;

mod backend;

pub use backend::{PostgresBackend, PostgresOptions};

const KIND: &str = "postgres";
/// The sequence the fencing tokens are drawn from.
const SEQUENCE: &str = "lock_runtime_fence";

/// The two-int advisory lock key of lock `key` (the manager's prefix followed by the name):
/// the first 8 bytes of `md5(key)` as two big-endian `int4`, for
/// `pg_advisory_lock(int4, int4)` and its relatives (`pg_advisory_xact_lock`, `pg_locks`'
/// `classid`/`objid` columns, read as unsigned there).
///
/// ```
/// use lock_runtime::backend::postgres::advisory_key;
///
/// assert_eq!(advisory_key("orders:42"), advisory_key("orders:42"));
/// assert_ne!(advisory_key("orders:42"), advisory_key("orders:43"));
/// ```
pub fn advisory_key(key: &str) -> (i32, i32) {
    let digest = md5::compute(key.as_bytes()).0;
    let [a0, a1, a2, a3, b0, b1, b2, b3, ..] = digest;
    (i32::from_be_bytes([a0, a1, a2, a3]), i32::from_be_bytes([b0, b1, b2, b3]))
}

fn pg_error(name: &str, operation: &'static str, e: tokio_postgres::Error) -> LockError {
    LockError::backend(name, KIND, operation, e)
}
