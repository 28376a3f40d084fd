//! [`AppConn`]: one connection of the application's sqlx pool, held by one acquisition of a
//! session backend (`PostgresBackend::from_pool`, `MysqlBackend::from_pool`), and the driver's
//! errors as the skeleton's ([`Failure`]).

use sqlx::pool::PoolConnection;

use super::session::Failure;
use crate::error::LockError;

/// One connection of the application's pool, for one acquisition. Dropped clean, it goes back
/// to the pool; otherwise it is closed (its session may hold or wait for a lock, which the
/// server frees with the session).
pub(crate) struct AppConn<DB: sqlx::Database> {
    pub(crate) conn: Option<PoolConnection<DB>>,
    /// The server's id of the connection, where a store needs it (MySQL's `KILL QUERY`).
    #[cfg_attr(not(feature = "mysql"), allow(dead_code))]
    pub(crate) id: Option<u64>,
    /// Holds and waits for nothing: may go back to the pool.
    pub(crate) clean: bool,
    /// What a held lock's heartbeat starts with, where a store needs it (PostgreSQL: the
    /// grant's comment, which inspection reads in the session's last query).
    #[cfg_attr(not(feature = "postgres"), allow(dead_code))]
    pub(crate) record: Option<std::sync::Arc<str>>,
}

impl<DB: sqlx::Database> AppConn<DB> {
    /// A connection of `pool`, for an acquisition of the `kind` backend, waited for at most
    /// `patience` (and the pool's own acquire timeout): a pool with none free within it is an
    /// error that says so (not a server to reach), before the caller's bound runs out.
    pub(crate) async fn acquire(
        pool: &sqlx::Pool<DB>,
        kind: &'static str,
        name: &str,
        patience: std::time::Duration,
    ) -> Result<Self, LockError> {
        let patience = patience.min(pool.options().get_acquire_timeout());
        let exhausted = || {
            let why = format!(
                "the application's pool had no free connection within {patience:?}: all {} of its connections \
                 are in use (by the application, and by this manager's locks: each lock held or waited for keeps \
                 one)",
                pool.size()
            );
            LockError::backend(name, kind, "connect", why)
        };
        let conn = match tokio::time::timeout(patience, pool.acquire()).await {
            Ok(Ok(conn)) => conn,
            Ok(Err(sqlx::Error::PoolTimedOut)) | Err(_) => return Err(exhausted()),
            Ok(Err(e)) => return Err(error(kind, name, "connect", e)),
        };
        Ok(AppConn { conn: Some(conn), id: None, clean: true, record: None })
    }

    /// Whether the connection is gone (closed after a failure).
    pub(crate) fn is_closed(&self) -> bool {
        self.conn.is_none()
    }
}

impl<DB: sqlx::Database> Drop for AppConn<DB> {
    fn drop(&mut self) {
        if let Some(conn) = self.conn.take() {
            if !self.clean {
                // Its session may hold or wait for a lock: closed, not given back.
                drop(conn.detach());
            }
        }
    }
}

/// The waits on the server a backend on `pool` allows at once: half the pool's
/// `max_connections`, at least one (each keeps one of its connections while it waits; the rest
/// stay free for the application and for held locks).
pub(crate) fn waits<DB: sqlx::Database>(pool: &sqlx::Pool<DB>) -> std::sync::Arc<tokio::sync::Semaphore> {
    let share = (pool.options().get_max_connections() / 2).max(1);
    std::sync::Arc::new(tokio::sync::Semaphore::new(share as usize))
}

/// A driver error as a [`LockError`] of the `kind` backend, with the server's code.
pub(crate) fn error(kind: &'static str, name: &str, operation: &'static str, e: sqlx::Error) -> LockError {
    match e.as_database_error() {
        Some(db) => {
            let code = db.code().map(|c| c.into_owned()).unwrap_or_default();
            LockError::backend(name, kind, operation, format!("ERROR {code}: {}", db.message()))
        }
        None => LockError::backend(name, kind, operation, e),
    }
}

/// A driver error as a [`Failure`]: the connection closed (or the server's answer ends its
/// session: SQLSTATE class `57P`, an operator's termination or a shutdown, or `08`, a
/// connection exception), or anything else.
pub(crate) fn failure(kind: &'static str, name: &str, operation: &'static str, e: sqlx::Error) -> Failure {
    let ending =
        e.as_database_error().and_then(|db| db.code()).is_some_and(|c| c.starts_with("57P") || c.starts_with("08"));
    let closed = ending || matches!(e, sqlx::Error::Io(_) | sqlx::Error::Protocol(_) | sqlx::Error::PoolClosed);
    match closed {
        true => Failure::Closed(error(kind, name, operation, e)),
        false => Failure::Failed(error(kind, name, operation, e)),
    }
}
