//! The tables a MySQL backend needs, made if missing when it connects: the fencing counter
//! (required) and the holders' records (wanted, never required).
//!
//! Each table is looked at on its own, and only a missing one is created, so a
//! least-privilege user whose tables were made beforehand needs no `CREATE` right, and an
//! error names the table it is about. A user who may not create the holders' table still
//! connects: holder records are turned off, with one warning that gives the statement to run
//! (or `MysqlOptions::record_holders(false)`, which says so and silences it).

use super::sql::{counter_create_sql, holders_sql};
use super::{COUNTER, HOLDERS, KIND};
use crate::backend::BoxFuture;
use crate::error::LockError;

/// What the server answered a set-up query.
pub(super) enum Refused {
    /// The table does not exist (error 1146).
    Missing,
    /// The user may not do it (errors 1142, 1044, 1227): the server's message.
    Denied(String),
    /// Anything else.
    Failed(LockError),
}

/// A connection the set-up runs on (this backend's own driver, or the application's pool).
pub(super) trait SetupConn: Send {
    /// Runs `sql` and answers the first column of its first row (a count), `None` for none.
    fn run<'a>(&'a mut self, sql: &'a str) -> BoxFuture<'a, Result<Option<u64>, Refused>>;
}

/// The server error numbers that mean "no such table" and "not allowed".
pub(super) fn refused(number: u16, message: String, e: impl FnOnce() -> LockError) -> Refused {
    match number {
        1146 => Refused::Missing,
        1142 | 1044 | 1227 => Refused::Denied(message),
        _ => Refused::Failed(e()),
    }
}

/// Makes sure the counter table and its row exist, and the holders' table when
/// `record_holders`: whether holders are recorded (`false` when wanted but the table is
/// missing and cannot be made, after one warning).
pub(super) async fn setup(conn: &mut impl SetupConn, record_holders: bool) -> Result<bool, LockError> {
    let failed = |why: String| LockError::backend("", KIND, "connect", why);
    let counter = format!("SELECT COUNT(*) FROM {COUNTER} WHERE id = 1");
    let counted = match conn.run(&counter).await {
        Ok(count) => count == Some(1),
        Err(Refused::Missing) => false,
        Err(Refused::Denied(why)) => {
            return Err(failed(format!("this user may not read the fencing counter table `{COUNTER}`: {why}")))
        }
        Err(Refused::Failed(e)) => return Err(e),
    };
    if !counted {
        match conn.run(&counter_create_sql()).await {
            Ok(_) => {}
            Err(Refused::Denied(why)) => {
                return Err(failed(format!(
                    "the fencing counter table `{COUNTER}` (or its row) is missing and this user may not make it: \
                     {why}; run as a user who may: {}",
                    counter_create_sql()
                )))
            }
            Err(Refused::Missing) => {
                return Err(failed(format!("could not make the fencing counter table `{COUNTER}`")))
            }
            Err(Refused::Failed(e)) => return Err(e),
        }
    }
    if !record_holders {
        return Ok(false);
    }
    let holders = format!("SELECT COUNT(*) FROM {HOLDERS} WHERE 1 = 0");
    match conn.run(&holders).await {
        Ok(_) => return Ok(true),
        Err(Refused::Missing) => {}
        Err(Refused::Denied(why)) => return Ok(records_off(&why)),
        Err(Refused::Failed(e)) => return Err(e),
    }
    match conn.run(&holders_sql()).await {
        Ok(_) => Ok(true),
        Err(Refused::Denied(why)) => Ok(records_off(&why)),
        Err(Refused::Missing) => Ok(records_off("it could not be made")),
        Err(Refused::Failed(e)) => Err(e),
    }
}

/// The one warning of records turned off: `false`.
fn records_off(why: &str) -> bool {
    tracing::warn!(
        "the MySQL holders' table `{HOLDERS}` is missing and this user may not make it ({why}): holder records \
         are off, so inspection and `lockctl` cannot name holders (locks work as before). Make it as a user who \
         may: `{}`; or set MysqlOptions::record_holders(false) to turn records off and silence this warning",
        holders_sql()
    );
    false
}

impl SetupConn for mysql_async::Conn {
    fn run<'a>(&'a mut self, sql: &'a str) -> BoxFuture<'a, Result<Option<u64>, Refused>> {
        use mysql_async::prelude::Queryable;
        Box::pin(async move {
            let mut result = self.query_iter(sql).await.map_err(own_refused)?;
            let rows: Vec<Option<u64>> = result.collect().await.map_err(own_refused)?;
            result.drop_result().await.map_err(own_refused)?;
            Ok(rows.into_iter().next().flatten())
        })
    }
}

fn own_refused(e: mysql_async::Error) -> Refused {
    match e {
        mysql_async::Error::Server(server) => {
            let (code, message) = (server.code, server.message.clone());
            refused(code, message, || super::my_error("", "connect", mysql_async::Error::Server(server)))
        }
        e => Refused::Failed(super::my_error("", "connect", e)),
    }
}

#[cfg(feature = "sqlx")]
impl SetupConn for sqlx::pool::PoolConnection<sqlx::MySql> {
    fn run<'a>(&'a mut self, sql: &'a str) -> BoxFuture<'a, Result<Option<u64>, Refused>> {
        use futures_util::TryStreamExt;
        use sqlx::{Executor, Row};
        Box::pin(async move {
            let mut first = None;
            let mut results = (&mut **self).fetch_many(sqlx::AssertSqlSafe(sql));
            while let Some(step) = results.try_next().await.map_err(app_refused)? {
                if let (None, Some(row)) = (&first, step.right()) {
                    first = Some(row.try_get::<Option<i64>, _>(0).map_err(app_refused)?);
                }
            }
            Ok(first.flatten().and_then(|n| u64::try_from(n).ok()))
        })
    }
}

#[cfg(feature = "sqlx")]
fn app_refused(e: sqlx::Error) -> Refused {
    let number = e
        .as_database_error()
        .and_then(|d| d.try_downcast_ref::<sqlx::mysql::MySqlDatabaseError>())
        .map(|d| (d.number(), d.message().to_owned()));
    match number {
        Some((number, message)) => refused(number, message, || super::app_pool::error("", "connect", e)),
        None => Refused::Failed(super::app_pool::error("", "connect", e)),
    }
}
