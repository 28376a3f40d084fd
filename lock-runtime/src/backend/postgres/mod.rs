#![cfg_attr(feature = "postgres", doc = include_str!("README.md"))]
#![doc = ""]
#![cfg_attr(all(feature = "postgres", feature = "_tls"), doc = "[`PostgresOptions::tls`]: PostgresOptions::tls")]
#![cfg_attr(
    not(all(feature = "postgres", feature = "_tls")),
    doc = "[`PostgresOptions::tls`]: https://docs.rs/lock-runtime/latest/lock_runtime/backend/postgres/struct.PostgresOptions.html#method.tls"
)]
#![cfg_attr(feature = "_tls", doc = "[TlsOptions]: crate::TlsOptions")]
#![cfg_attr(
    not(feature = "_tls"),
    doc = "[TlsOptions]: https://docs.rs/lock-runtime/latest/lock_runtime/struct.TlsOptions.html"
)]
#![cfg_attr(
    not(feature = "postgres"),
    doc = "PostgreSQL locks in the application's own sqlx transactions ([`lock_in_transaction`]); \
           the backend of its own connections is the feature `postgres`."
)]

#[cfg(feature = "postgres")]
use crate::error::LockError;

#[cfg(all(feature = "postgres", feature = "sqlx"))]
mod app_pool;
#[cfg(feature = "postgres")]
mod backend;
#[cfg(feature = "postgres")]
mod carrier;
#[cfg(feature = "postgres")]
mod conn;
#[cfg(feature = "postgres")]
mod inspect;
#[cfg(feature = "postgres")]
mod options;
#[cfg(feature = "postgres")]
mod semaphore;
#[cfg(feature = "postgres")]
mod semaphore_keys;
#[cfg(feature = "postgres")]
mod sql;
#[cfg(feature = "postgres")]
mod tls;
mod transaction;

#[cfg(feature = "postgres")]
pub use backend::PostgresBackend;
#[cfg(feature = "postgres")]
pub use options::PostgresOptions;
#[cfg(feature = "postgres")]
pub use semaphore_keys::MAX_PERMITS;
pub use transaction::{lock_in_transaction, InTransaction};
#[doc(hidden)]
pub use transaction::{Canceller, Failed};

const KIND: &str = "postgres";
/// The sequence the fencing tokens are drawn from.
const SEQUENCE: &str = "lock_runtime_fence";
/// Appended to a read-write lock's key before it is hashed: its own advisory key, apart from
/// the mutex of the same name.
#[cfg(feature = "postgres")]
const RW_SUFFIX: &str = "\u{0}rw";

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

#[cfg(feature = "postgres")]
/// A client error as a [`LockError`]: a server's error with its severity, SQLSTATE, message,
/// detail and hint (`ERROR 57014: canceling statement due to statement timeout`), anything
/// else with its whole chain of causes.
fn pg_error(name: &str, operation: &'static str, e: tokio_postgres::Error) -> LockError {
    let Some(db) = e.as_db_error() else { return LockError::backend_with_causes(name, KIND, operation, e) };
    let mut text = format!("{} {}: {}", db.severity(), db.code().code(), db.message());
    if let Some(detail) = db.detail() {
        text.push_str(&format!(" (detail: {detail})"));
    }
    if let Some(hint) = db.hint() {
        text.push_str(&format!(" (hint: {hint})"));
    }
    LockError::backend(name, KIND, operation, text)
}
