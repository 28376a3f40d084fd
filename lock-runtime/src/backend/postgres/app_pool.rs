//! The application's own sqlx pool as the backend's connections
//! ([`PostgresBackend::from_pool`](super::PostgresBackend::from_pool), features `postgres` and
//! `sqlx`): each acquisition takes a connection of the pool for as long as it waits and holds,
//! and gives it back at the release; waits take at most half the pool
//! ([`waits`](crate::backend::app_conn::waits)). The statements are the backend's own ([`PgSql`]).
//!
//! What sqlx does not offer is made up for: a connection closed under a held lock is found by a
//! heartbeat (`SELECT 1` every second, after the grant's comment, which inspection reads in the
//! session's last query; sqlx tells nothing until the next query), and a dropped
//! waiter's connection is closed instead of cancelled (sqlx has no cancel request; the server
//! ends the session at its next check of the client, `client_connection_check_interval`,
//! 500 ms, on PostgreSQL 14 and later). A connection whose session may hold or wait for a lock
//! is never given back to the pool: it is closed, which frees whatever it held.

use std::sync::Arc;
use std::time::Duration;

use sqlx::{Executor, Postgres, Row};

use super::sql::{PgKey, PgSql};
use super::KIND;
use crate::backend::session::{Beat, Carry, Failure, Idle, Sessions};
use crate::backend::{Acquire, BoxFuture};
use crate::error::LockError;

/// How often a held lock's connection is asked whether it is alive.
const HEARTBEAT: Duration = Duration::from_secs(1);

/// Locks on connections of the application's pool.
pub(super) struct AppSessions {
    pub(super) pool: sqlx::PgPool,
    pub(super) sql: PgSql,
    /// The waits on the server allowed at once ([`waits`](crate::backend::app_conn::waits)).
    pub(super) waits: Arc<tokio::sync::Semaphore>,
}

/// One connection of the application's pool, for one acquisition.
pub(super) type AppConn = crate::backend::app_conn::AppConn<Postgres>;

/// The value of a row's column as text (the simple protocol's values, typed by sqlx).
fn text(row: &sqlx::postgres::PgRow, i: usize) -> Option<String> {
    if let Ok(value) = row.try_get::<Option<String>, _>(i) {
        return value;
    }
    if let Ok(value) = row.try_get::<Option<bool>, _>(i) {
        return value.map(|b| if b { "t" } else { "f" }.to_owned());
    }
    row.try_get::<Option<i64>, _>(i).ok().flatten().map(|n| n.to_string())
}

/// Runs `sql` (the simple protocol: several statements) on `conn`: every row's columns as text.
pub(super) async fn rows(conn: &mut sqlx::PgConnection, sql: &str) -> Result<Vec<Vec<String>>, sqlx::Error> {
    let rows = conn.fetch_all(sqlx::AssertSqlSafe(sql)).await?;
    Ok(rows.iter().map(|row| (0..row.len()).map(|i| text(row, i).unwrap_or_default()).collect()).collect())
}

/// A driver error as a [`LockError`], with the server's SQLSTATE.
pub(super) fn error(name: &str, operation: &'static str, e: sqlx::Error) -> LockError {
    crate::backend::app_conn::error(KIND, name, operation, e)
}

impl AppSessions {
    /// Runs `sql` on `conn`: the last row's first value. An error leaves the connection to be
    /// closed.
    async fn last(
        conn: &mut AppConn,
        name: &str,
        operation: &'static str,
        sql: &str,
    ) -> Result<Option<String>, Failure> {
        Self::ask(conn, sql).await.map_err(|e| crate::backend::app_conn::failure(KIND, name, operation, e))
    }

    /// [`last`](Self::last) with the driver's own error (its SQLSTATE still readable).
    async fn ask(conn: &mut AppConn, sql: &str) -> Result<Option<String>, sqlx::Error> {
        let Some(c) = conn.conn.as_mut() else { return Err(sqlx::Error::PoolClosed) };
        match rows(c, sql).await {
            Ok(rows) => Ok(rows.last().and_then(|row| row.first().cloned()).filter(|v| !v.is_empty())),
            Err(e) => {
                conn.clean = false;
                Err(e)
            }
        }
    }
}

impl Sessions for AppSessions {
    type Conn = AppConn;
    type Key = PgKey;
    const KIND: &'static str = KIND;
    const LOST: &'static str =
        "its PostgreSQL connection (of the application's pool) stopped answering (the server ended the session and its advisory locks)";

    fn operation_timeout(&self) -> Duration {
        self.sql.options.operation_timeout
    }

    fn waits(&self) -> Option<&Arc<tokio::sync::Semaphore>> {
        Some(&self.waits)
    }

    /// None: a connection goes back to the application's pool.
    fn max_idle(&self) -> usize {
        0
    }

    fn key(&self, req: &Acquire) -> PgKey {
        self.sql.key(req)
    }

    fn connect<'a>(&'a self, name: &'a str) -> BoxFuture<'a, Result<AppConn, LockError>> {
        // Four fifths of the bound: a pool with none free says so before the bound runs out.
        Box::pin(AppConn::acquire(&self.pool, KIND, name, self.sql.options.operation_timeout * 4 / 5))
    }

    fn is_closed(conn: &AppConn) -> bool {
        conn.is_closed()
    }

    fn lock<'a>(
        &'a self,
        conn: &'a mut AppConn,
        key: &'a PgKey,
        wait: Option<Duration>,
    ) -> BoxFuture<'a, Result<Option<u64>, Failure>> {
        Box::pin(async move {
            let (sql, operation) = self.sql.lock(key, wait);
            // Until answered, the session may hold or wait: not to be given back.
            conn.clean = false;
            let refused = |conn: &'a mut AppConn| async move {
                if let Some(end) = self.sql.refused() {
                    Self::last(conn, &key.name, operation, end).await?;
                }
                conn.clean = true;
                Ok(None)
            };
            match Self::ask(conn, &sql).await {
                Ok(None) if wait.is_none() => refused(conn).await,
                Ok(value) => match value.as_deref().and_then(super::inspect::token) {
                    Some(token) => {
                        conn.record = Some(key.record.clone());
                        Ok(Some(token))
                    }
                    None => Err(Failure::Failed(LockError::backend(
                        &*key.name,
                        KIND,
                        operation,
                        "no fencing token in the answer",
                    ))),
                },
                // `lock_not_available`: the wait ran out, the session holds nothing.
                Err(e) if e.as_database_error().and_then(|db| db.code()).as_deref() == Some("55P03") => {
                    refused(conn).await
                }
                Err(e) => Err(crate::backend::app_conn::failure(KIND, &key.name, operation, e)),
            }
        })
    }

    fn unlock<'a>(&'a self, conn: &'a mut AppConn, key: &'a PgKey) -> BoxFuture<'a, Result<bool, Failure>> {
        Box::pin(async move {
            let released = Self::last(conn, &key.name, "release", &self.sql.unlock(key)).await?;
            let held = self.sql.pooled() || released.as_deref() == Some("t");
            conn.clean = held;
            Ok(held)
        })
    }

    fn cancel_and_close(_: &Arc<Self>, _: &Arc<Idle<AppConn>>, mut conn: AppConn) {
        conn.clean = false;
        drop(conn);
    }

    /// sqlx tells nothing of a closed connection: the heartbeat finds it.
    fn closed<'a>(&'a self, _: &'a AppConn) -> BoxFuture<'a, ()> {
        Box::pin(std::future::pending())
    }

    fn heartbeat(&self) -> Option<Duration> {
        Some(HEARTBEAT)
    }

    fn alive<'a>(&'a self, conn: &'a mut AppConn) -> BoxFuture<'a, Beat> {
        Box::pin(async move {
            // The grant's comment again: the session's last query is where inspection reads
            // the holder (a bare `SELECT 1` hid the lock from `lockctl` at the first beat).
            let beat = format!("{}SELECT 1", conn.record.as_deref().unwrap_or_default());
            match Self::last(conn, "", "heartbeat", &beat).await {
                Ok(_) => Beat::Alive,
                Err(_) => Beat::Dead,
            }
        })
    }
}

/// An application's pool carries no locks side by side: each lock keeps one of its connections.
impl Carry for AppSessions {}
