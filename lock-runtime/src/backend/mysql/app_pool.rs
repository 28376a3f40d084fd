//! The application's own sqlx pool as the backend's connections
//! ([`MysqlBackend::from_pool`](super::MysqlBackend::from_pool), features `mysql` and `sqlx`):
//! each acquisition takes a connection of the pool for as long as it waits and holds (waits
//! take at most half the pool: [`waits`](crate::backend::app_conn::waits)), and gives it back
//! at the release; the statements are the backend's own (`GET_LOCK`, the counter
//! row, `RELEASE_LOCK`). As with the backend's own connections, a heartbeat finds a closed
//! connection under a held lock, and a dropped waiter's query is ended by `KILL QUERY` from
//! another of the pool's connections. A connection whose session may hold or wait for a lock
//! is never given back to the pool: it is closed, which frees whatever it held.

use std::sync::Arc;
use std::time::Duration;

use futures_util::TryStreamExt;
use sqlx::mysql::MySqlRow;
use sqlx::{AssertSqlSafe, Executor, MySql, Row};

use super::options::MysqlOptions;
use super::sql::MyKey;
use super::KIND;
use crate::backend::session::{Beat, Carry, Failure, Idle, Sessions};
use crate::backend::{Acquire, BoxFuture};
use crate::error::LockError;

/// Locks on connections of the application's pool.
pub(super) struct AppSessions {
    pub(super) pool: sqlx::MySqlPool,
    pub(super) options: MysqlOptions,
    /// The waits on the server allowed at once ([`waits`](crate::backend::app_conn::waits)).
    pub(super) waits: Arc<tokio::sync::Semaphore>,
}

/// One connection of the application's pool, for one acquisition.
pub(super) type AppConn = crate::backend::app_conn::AppConn<MySql>;

/// A driver error as a [`LockError`], with the server's code.
pub(super) fn error(name: &str, operation: &'static str, e: sqlx::Error) -> LockError {
    crate::backend::app_conn::error(KIND, name, operation, e)
}

impl AppSessions {
    /// The rows `sql` answers, on a connection of the pool.
    pub(super) async fn inspect(&self, sql: String) -> Result<Vec<super::sql::Recorded>, LockError> {
        let rows = self.pool.fetch_all(AssertSqlSafe(sql)).await.map_err(|e| error("", "inspect", e))?;
        let decode = |row: &MySqlRow| {
            Ok((row.try_get(0)?, row.try_get(1)?, row.try_get(2)?, row.try_get(3)?, row.try_get(4)?, row.try_get(5)?))
        };
        rows.iter().map(|row| decode(row).map_err(|e: sqlx::Error| error("", "inspect", e))).collect()
    }
}

/// A driver error as a [`Failure`] (the connection to be closed).
fn failure(conn: &mut AppConn, name: &str, operation: &'static str, e: sqlx::Error) -> Failure {
    conn.clean = false;
    crate::backend::app_conn::failure(KIND, name, operation, e)
}

impl Sessions for AppSessions {
    type Conn = AppConn;
    type Key = MyKey;
    const KIND: &'static str = KIND;
    const LOST: &'static str = "its MySQL connection (of the application's pool) was closed or stopped answering \
                                (the server frees the session's locks with it)";

    fn operation_timeout(&self) -> Duration {
        self.options.get_operation_timeout()
    }

    fn waits(&self) -> Option<&Arc<tokio::sync::Semaphore>> {
        Some(&self.waits)
    }

    /// None: a connection goes back to the application's pool.
    fn max_idle(&self) -> usize {
        0
    }

    fn key(&self, req: &Acquire) -> MyKey {
        MyKey::of(req, self.options.record_holders)
    }

    fn connect<'a>(&'a self, name: &'a str) -> BoxFuture<'a, Result<AppConn, LockError>> {
        // Four fifths of the bound: a pool with none free says so before the bound runs out.
        Box::pin(AppConn::acquire(&self.pool, KIND, name, self.options.get_operation_timeout() * 4 / 5))
    }

    fn is_closed(conn: &AppConn) -> bool {
        conn.is_closed()
    }

    fn lock<'a>(
        &'a self,
        conn: &'a mut AppConn,
        key: &'a MyKey,
        wait: Option<Duration>,
    ) -> BoxFuture<'a, Result<Option<u64>, Failure>> {
        Box::pin(async move {
            // The connection's id with each attempt (for a `KILL QUERY` of a dropped wait).
            let (sql, operation) = key.get_lock(wait, ", CONNECTION_ID()");
            let Some(c) = conn.conn.as_mut() else {
                return Err(Failure::Closed(LockError::backend(&*key.name, KIND, operation, "closed")));
            };
            // Until answered, the session may hold or wait: not to be given back.
            conn.clean = false;
            let answer = sqlx::query_as::<_, (Option<i64>, u64)>(AssertSqlSafe(sql.as_str()))
                .persistent(false)
                .fetch_one(&mut **c)
                .await;
            match answer {
                Ok((Some(1), id)) => conn.id = Some(id),
                Ok((Some(_), id)) => {
                    conn.id = Some(id);
                    conn.clean = true;
                    return Ok(None);
                }
                Ok((None, _)) => {
                    let why = "GET_LOCK answered NULL (the query was killed, or failed on the server)";
                    return Err(Failure::Failed(LockError::backend(&*key.name, KIND, operation, why)));
                }
                Err(e) => return Err(failure(conn, &key.name, operation, e)),
            }
            // Granted: the token and the record, on the same connection (a failure closes it,
            // freeing the lock). The token is the first statement's last insert id.
            let Some(c) = conn.conn.as_mut() else {
                return Err(Failure::Closed(LockError::backend(&*key.name, KIND, operation, "closed")));
            };
            let grant = key.grant();
            let mut results = c.fetch_many(AssertSqlSafe(grant));
            let mut token = None;
            let answer = loop {
                match results.try_next().await {
                    Ok(Some(step)) => {
                        if let (None, Some(done)) = (token, step.left()) {
                            token = Some(done.last_insert_id());
                        }
                    }
                    Ok(None) => break Ok(()),
                    // The record's statement refused by the server (the table full, missing,
                    // not allowed) after the counter's gave the token: granted all the same.
                    Err(sqlx::Error::Database(e)) if token.is_some() => {
                        super::sql::record_failed(&e);
                        break Ok(());
                    }
                    Err(e) => break Err(e),
                }
            };
            drop(results);
            match answer {
                Ok(()) => super::sql::token(&key.name, operation, token).map(Some),
                Err(e) => Err(failure(conn, &key.name, operation, e)),
            }
        })
    }

    fn unlock<'a>(&'a self, conn: &'a mut AppConn, key: &'a MyKey) -> BoxFuture<'a, Result<bool, Failure>> {
        Box::pin(async move {
            let Some(c) = conn.conn.as_mut() else {
                return Err(Failure::Closed(LockError::backend(&*key.name, KIND, "release", "closed")));
            };
            let sql = key.release_lock();
            let answer = c.fetch_all(AssertSqlSafe(sql)).await;
            match answer.and_then(|rows| rows.first().map(|row| row.try_get::<Option<i64>, _>(0)).transpose()) {
                Ok(answer) => {
                    conn.clean = answer == Some(Some(1));
                    Ok(conn.clean)
                }
                Err(e) => Err(failure(conn, &key.name, "release", e)),
            }
        })
    }

    /// Ends the dropped waiter's query from another of the pool's connections (`KILL QUERY`),
    /// then closes its connection.
    fn cancel_and_close(sessions: &Arc<Self>, _: &Arc<Idle<AppConn>>, mut conn: AppConn) {
        conn.clean = false;
        let (Ok(runtime), Some(id)) = (tokio::runtime::Handle::try_current(), conn.id) else { return drop(conn) };
        let sessions = sessions.clone();
        runtime.spawn(async move {
            let bound = sessions.options.get_operation_timeout();
            let kill = async {
                let mut other = sessions.pool.acquire().await?;
                other.execute(AssertSqlSafe(format!("KILL QUERY {id}"))).await
            };
            if !matches!(tokio::time::timeout(bound, kill).await, Ok(Ok(_))) {
                tracing::debug!("could not end a dropped MySQL lock waiter's query; closing its connection");
            }
            drop(conn);
        });
    }

    /// sqlx tells nothing of a closed connection: the heartbeat finds it.
    fn closed<'a>(&'a self, _: &'a AppConn) -> BoxFuture<'a, ()> {
        Box::pin(std::future::pending())
    }

    fn heartbeat(&self) -> Option<Duration> {
        Some(self.options.get_heartbeat())
    }

    /// With records on, the heartbeat asks whether an operator asked for the lock to be freed
    /// (see `sql::mark_sql`); a refusal of the server (no table) still says it answers.
    fn alive<'a>(&'a self, conn: &'a mut AppConn) -> BoxFuture<'a, Beat> {
        let records = self.options.record_holders;
        Box::pin(async move {
            let Some(c) = conn.conn.as_mut() else { return Beat::Dead };
            let beat = if records {
                match sqlx::query(AssertSqlSafe(super::sql::forced_sql())).fetch_all(&mut **c).await {
                    Ok(rows) if rows.is_empty() => Beat::Alive,
                    Ok(_) => Beat::Forced,
                    Err(sqlx::Error::Database(_)) => Beat::Alive,
                    Err(_) => Beat::Dead,
                }
            } else {
                match c.execute("SELECT 1").await {
                    Ok(_) => Beat::Alive,
                    Err(_) => Beat::Dead,
                }
            };
            conn.clean &= beat == Beat::Alive;
            beat
        })
    }
}

/// An application's pool carries no locks side by side: each lock keeps one of its connections.
impl Carry for AppSessions {}
