//! [`lock_in_transaction`]: a lock held by the caller's own transaction, no connection of ours.

use std::time::Duration;

#[cfg(feature = "postgres")]
use tokio_postgres::types::{ToSql, Type};
#[cfg(feature = "postgres")]
use tokio_postgres::{NoTls, SimpleQueryMessage, Transaction};

#[cfg(feature = "postgres")]
use super::pg_error;
use super::{advisory_key, KIND, SEQUENCE};
use crate::backend::BoxFuture;
use crate::error::LockError;

/// The caller's connection, in its transaction, that [`lock_in_transaction`] takes the lock
/// on: a tokio-postgres `&Transaction`, or (feature `sqlx`) a `&mut sqlx::PgConnection`
/// (`&mut *tx` of a `sqlx::Transaction<'_, Postgres>`). Sealed.
pub trait InTransaction: Send + sealed::Sealed {
    /// `SELECT CASE WHEN pg_try_advisory_xact_lock(k1, k2) THEN nextval(..) END`.
    #[doc(hidden)]
    fn try_lock(&mut self, key: &str, k1: i32, k2: i32) -> BoxFuture<'_, Result<Option<i64>, Failed>>;
    /// The first column of every row of `sql` (simple protocol, several statements).
    #[doc(hidden)]
    fn simple(&mut self, sql: String) -> BoxFuture<'_, Result<Vec<String>, Failed>>;
    /// What asks the server to cancel the connection's running query, where the driver can.
    #[doc(hidden)]
    fn canceller(&self) -> Option<Canceller>;
}

/// Sends a cancel request for a connection's running query.
#[doc(hidden)]
pub type Canceller = Box<dyn FnOnce() -> BoxFuture<'static, ()> + Send>;

mod sealed {
    pub trait Sealed {}
    #[cfg(feature = "postgres")]
    impl Sealed for &tokio_postgres::Transaction<'_> {}
    #[cfg(feature = "sqlx")]
    impl Sealed for &mut sqlx::PgConnection {}
}

/// A statement the server refused, or a driver's failure: its SQLSTATE, and the error.
#[doc(hidden)]
#[derive(Debug)]
pub struct Failed {
    code: Option<String>,
    error: LockError,
}

impl Failed {
    #[cfg(feature = "postgres")]
    fn of_tokio(key: &str, e: tokio_postgres::Error) -> Self {
        Failed { code: e.code().map(|c| c.code().to_owned()), error: pg_error(key, "lock in the transaction", e) }
    }

    #[cfg(feature = "sqlx")]
    fn of_sqlx(key: &str, e: sqlx::Error) -> Self {
        let code = e.as_database_error().and_then(|db| db.code()).map(|c| c.into_owned());
        let shown = match e.as_database_error() {
            Some(db) => format!("ERROR {}: {}", code.as_deref().unwrap_or("?"), db.message()),
            None => e.to_string(),
        };
        Failed { code, error: LockError::backend(key, KIND, "lock in the transaction", shown) }
    }
}

#[cfg(feature = "postgres")]
impl InTransaction for &Transaction<'_> {
    fn try_lock(&mut self, key: &str, k1: i32, k2: i32) -> BoxFuture<'_, Result<Option<i64>, Failed>> {
        let key = key.to_owned();
        Box::pin(async move {
            let attempt = format!("SELECT CASE WHEN pg_try_advisory_xact_lock($1, $2) THEN nextval('{SEQUENCE}') END");
            let params: [(&(dyn ToSql + Sync), Type); 2] = [(&k1, Type::INT4), (&k2, Type::INT4)];
            let rows = self.query_typed(&attempt, &params).await.map_err(|e| Failed::of_tokio(&key, e))?;
            Ok(rows.first().and_then(|row| row.get::<_, Option<i64>>(0)))
        })
    }

    fn simple(&mut self, sql: String) -> BoxFuture<'_, Result<Vec<String>, Failed>> {
        Box::pin(async move {
            let messages = self.simple_query(&sql).await.map_err(|e| Failed::of_tokio("", e))?;
            Ok(messages
                .iter()
                .filter_map(|m| match m {
                    SimpleQueryMessage::Row(row) => row.get(0).map(str::to_owned),
                    _ => None,
                })
                .collect())
        })
    }

    fn canceller(&self) -> Option<Canceller> {
        let token = Transaction::cancel_token(self);
        Some(Box::new(move || {
            Box::pin(async move {
                let _ = tokio::time::timeout(BOUND, token.cancel_query(NoTls)).await;
            })
        }))
    }
}

#[cfg(feature = "sqlx")]
impl InTransaction for &mut sqlx::PgConnection {
    fn try_lock(&mut self, key: &str, k1: i32, k2: i32) -> BoxFuture<'_, Result<Option<i64>, Failed>> {
        let key = key.to_owned();
        Box::pin(async move {
            let attempt = format!("SELECT CASE WHEN pg_try_advisory_xact_lock($1, $2) THEN nextval('{SEQUENCE}') END");
            // Not prepared for keeps: a transaction-mode pooler hands the next transaction to
            // another server connection, which has no such statement.
            let query = sqlx::query_scalar::<_, Option<i64>>(sqlx::AssertSqlSafe(attempt.as_str()))
                .bind(k1)
                .bind(k2)
                .persistent(false);
            query.fetch_one(&mut **self).await.map_err(|e| Failed::of_sqlx(&key, e))
        })
    }

    fn simple(&mut self, sql: String) -> BoxFuture<'_, Result<Vec<String>, Failed>> {
        Box::pin(sqlx_simple(self, sql))
    }

    fn canceller(&self) -> Option<Canceller> {
        None
    }
}

/// How long past `wait` a call may take before it gives up on the server (and asks it to
/// cancel the wait).
const BOUND: Duration = Duration::from_secs(5);

/// The savepoint a wait runs under, so that a wait that runs out leaves the caller's
/// transaction usable.
const SAVEPOINT: &str = "lock_runtime_wait";

/// Takes the lock `key` inside the caller's transaction `tx` (a tokio-postgres `&Transaction`,
/// or with the feature `sqlx` a `&mut sqlx::PgConnection`: `&mut *tx` of the application's
/// `pool.begin()`) and returns its fencing token;
/// the lock ends exactly when the transaction commits or rolls back
/// (`pg_advisory_xact_lock`). Nothing of the backend is involved: no connection, no pool, no
/// session state, so it works through any pooler (PgBouncer in transaction mode included),
/// and a handler can lock, check the fence and write in one transaction.
///
/// - `key` is the lock's key as a manager writes it (its prefix followed by the name): the
///   lock is the same advisory lock a `PostgresBackend` takes, so a
///   transaction and a manager's guard of the same key exclude each other. A manager's
///   request writes it for you: `manager.lock("orders:42").in_transaction(&tx)`
///   ([`LockRequest::in_transaction`](crate::LockRequest::in_transaction)), the way to use
///   when a manager has a prefix.
/// - `wait`: how long to wait for a holder to go (on the server, under `lock_timeout`, no
///   polling); zero tries once. Still held after it: [`is_contended`](LockError::is_contended),
///   and the transaction stays usable (the wait ran under a savepoint, rolled back).
/// - The token comes from the sequence `lock_runtime_fence` (the one every holder of this
///   backend draws from, created by [`INSTALL_SQL`](crate::fence::postgres::INSTALL_SQL) or by a
///   backend's first connect), drawn after the grant: successive holders' tokens increase.
/// - The call is bounded by `wait` plus 5 s; past that, or dropped while it waits, it asks the
///   server to cancel the wait (tokio-postgres: a cancel request without TLS; sqlx has no
///   cancel request: the wait then ends at its `lock_timeout`). Either way the transaction is
///   then in an unknown state: roll it back. Through a transaction-mode pooler, do not drop a
///   waiting call: a pooler can deliver the cancel request to a server connection it has
///   handed to another client since (PgBouncer #245, #684); give a `wait` instead.
/// - The caller's `lock_timeout` is as it was after the call.
///
/// Under REPEATABLE READ or SERIALIZABLE, take the lock first in the transaction: the
/// transaction's snapshot is taken by its first statement, and one taken before the lock was
/// granted does not see the previous holder's writes (a write that meets them is a
/// serialization failure: see [`fence::postgres::check`](crate::fence::postgres::check)).
///
/// ```no_run
/// # async fn settle(db: &mut tokio_postgres::Client) -> Result<(), Box<dyn std::error::Error>> {
/// use std::time::Duration;
/// use lock_runtime::backend::postgres::lock_in_transaction;
///
/// let tx = db.transaction().await?;
/// let token = lock_in_transaction(&tx, "orders:42", Duration::from_secs(2)).await?;
/// lock_runtime::fence::postgres::check(&tx, "orders:42", token).await?;
/// tx.execute("UPDATE orders SET state = 'paid' WHERE id = 42", &[]).await?;
/// tx.commit().await?; // the lock ends here
/// # Ok(()) }
/// ```
#[cfg_attr(
    feature = "sqlx",
    doc = r#"
With sqlx (feature `sqlx`), on the application's pool:

```no_run
# async fn settle(pool: &sqlx::PgPool) -> Result<(), Box<dyn std::error::Error>> {
# use std::time::Duration;
# use lock_runtime::backend::postgres::lock_in_transaction;
let mut tx = pool.begin().await?;
let token = lock_in_transaction(&mut *tx, "orders:42", Duration::from_secs(2)).await?;
lock_runtime::fence::postgres::check(&mut *tx, "orders:42", token).await?;
sqlx::query("UPDATE orders SET state = 'paid' WHERE id = 42").execute(&mut *tx).await?;
tx.commit().await?;
# Ok(()) }
```"#
)]
pub async fn lock_in_transaction<T: InTransaction>(mut tx: T, key: &str, wait: Duration) -> Result<u64, LockError> {
    if key.is_empty() {
        return Err(LockError::invalid(key, "the lock key is empty"));
    }
    let bound = wait.saturating_add(BOUND);
    let cancel = OnDrop(tx.canceller());
    match tokio::time::timeout(bound, take(&mut tx, key, wait)).await {
        Ok(taken) => {
            // Nothing runs any more: a cancel now could only hit the caller's next query.
            cancel.disarm();
            taken
        }
        Err(_) => Err(LockError::timed_out(key, KIND, "lock in the transaction", bound)),
    }
}

/// Every transaction [`lock_in_transaction`] takes is one a manager's request can lock in
/// ([`LockRequest::in_transaction`](crate::LockRequest::in_transaction)).
impl<T: InTransaction> crate::backend::LockInTransaction for T {
    fn lock_key<'a>(self, key: &'a str, wait: Duration) -> BoxFuture<'a, Result<u64, LockError>>
    where
        Self: 'a,
    {
        Box::pin(lock_in_transaction(self, key, wait))
    }
}

/// An attempt, then (if `wait` allows) a wait on the server.
async fn take<T: InTransaction>(tx: &mut T, key: &str, wait: Duration) -> Result<u64, LockError> {
    let (k1, k2) = advisory_key(key);
    if let Some(token) = tx.try_lock(key, k1, k2).await.map_err(|f| failed(key, f))? {
        return Ok(token as u64);
    }
    let contended = || LockError::Contended { name: key.to_owned(), waited: wait, attempts: 1, held: true };
    if wait.is_zero() {
        return Err(contended());
    }
    // The wait, under a savepoint: its `lock_timeout` is local to it, and a wait that runs out
    // (`55P03`) is rolled back to it, which leaves the transaction as it was.
    let ms = wait.as_millis().max(1);
    let waiting = format!(
        "SAVEPOINT {SAVEPOINT}; SELECT current_setting('lock_timeout'); SET LOCAL lock_timeout = '{ms}ms'; \
         SELECT pg_advisory_xact_lock({k1}, {k2})::text; SELECT nextval('{SEQUENCE}')::text"
    );
    match tx.simple(waiting).await {
        Ok(values) => {
            let (Some(before), Some(token)) = (values.first(), values.last().and_then(|t| t.parse::<u64>().ok()))
            else {
                return Err(LockError::backend(key, KIND, "lock in the transaction", "the wait answered no token"));
            };
            // The caller's `lock_timeout` back, then the savepoint released: the lock, taken
            // under it, now belongs to the transaction.
            let restore = format!(
                "SELECT set_config('lock_timeout', '{}', true); RELEASE SAVEPOINT {SAVEPOINT}",
                before.replace('\'', "''")
            );
            tx.simple(restore).await.map_err(|f| failed(key, f))?;
            Ok(token)
        }
        Err(f) => {
            let ran_out = f.code.as_deref() == Some("55P03");
            let back = format!("ROLLBACK TO SAVEPOINT {SAVEPOINT}; RELEASE SAVEPOINT {SAVEPOINT}");
            tx.simple(back).await.map_err(|f| failed(key, f))?;
            match ran_out {
                true => Err(contended()),
                false => Err(failed(key, f)),
            }
        }
    }
}

fn failed(key: &str, f: Failed) -> LockError {
    if f.code.as_deref() == Some("42P01") {
        let why = format!(
            "the sequence `{SEQUENCE}` the fencing tokens come from does not exist: run \
             `lock_runtime::fence::postgres::INSTALL_SQL` once (or connect a PostgresBackend once)"
        );
        return LockError::invalid(key, why);
    }
    match f.error {
        LockError::Backend { backend, operation, source, .. } => {
            LockError::Backend { name: key.to_owned(), backend, operation, source }
        }
        other => other,
    }
}

/// [`InTransaction::simple`] on a sqlx connection: a `&str` query runs unprepared (the simple
/// protocol), several statements at once.
#[cfg(feature = "sqlx")]
async fn sqlx_simple(conn: &mut sqlx::PgConnection, sql: String) -> Result<Vec<String>, Failed> {
    use sqlx::{Executor, Row};
    let rows = conn.fetch_all(sqlx::AssertSqlSafe(sql)).await.map_err(|e| Failed::of_sqlx("", e))?;
    Ok(rows.iter().filter_map(|row| row.try_get::<Option<String>, _>(0).ok().flatten()).collect())
}

/// Asks the server to cancel the transaction's running query when dropped armed: a call
/// dropped or timed out while it waits.
struct OnDrop(Option<Canceller>);

impl OnDrop {
    fn disarm(mut self) {
        self.0 = None;
    }
}

impl Drop for OnDrop {
    fn drop(&mut self) {
        let (Some(cancel), Ok(runtime)) = (self.0.take(), tokio::runtime::Handle::try_current()) else { return };
        runtime.spawn(cancel());
    }
}
