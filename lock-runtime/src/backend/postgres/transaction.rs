//! [`lock_in_transaction`]: a lock held by the caller's own transaction, no connection of ours.

use std::time::Duration;

use tokio_postgres::types::{ToSql, Type};
use tokio_postgres::{CancelToken, NoTls, SimpleQueryMessage, Transaction};

use super::{advisory_key, pg_error, KIND, SEQUENCE};
use crate::error::LockError;

/// How long past `wait` a call may take before it gives up on the server (and asks it to
/// cancel the wait).
const BOUND: Duration = Duration::from_secs(5);

/// The savepoint a wait runs under, so that a wait that runs out leaves the caller's
/// transaction usable.
const SAVEPOINT: &str = "lock_runtime_wait";

/// Takes the lock `key` inside the caller's transaction `tx` and returns its fencing token;
/// the lock ends exactly when the transaction commits or rolls back
/// (`pg_advisory_xact_lock`). Nothing of the backend is involved: no connection, no pool, no
/// session state, so it works through any pooler (PgBouncer in transaction mode included),
/// and a handler can lock, check the fence and write in one transaction.
///
/// - `key` is the lock's key as a manager writes it (its prefix followed by the name): the
///   lock is the same advisory lock a [`PostgresBackend`](super::PostgresBackend) takes, so a
///   transaction and a manager's guard of the same key exclude each other.
/// - `wait`: how long to wait for a holder to go (on the server, under `lock_timeout`, no
///   polling); zero tries once. Still held after it: [`is_contended`](LockError::is_contended),
///   and the transaction stays usable (the wait ran under a savepoint, rolled back).
/// - The token comes from the sequence `lock_runtime_fence` (the one every holder of this
///   backend draws from, created by [`INSTALL_SQL`](crate::fence::postgres::INSTALL_SQL) or by a
///   backend's first connect), drawn after the grant: successive holders' tokens increase.
/// - The call is bounded by `wait` plus 5 s; past that, or dropped while it waits, it asks the
///   server to cancel the wait (a cancel request without TLS; a server that refuses one ends
///   the wait at `lock_timeout`). Either way the transaction is then in an unknown state: roll
///   it back.
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
pub async fn lock_in_transaction(tx: &Transaction<'_>, key: &str, wait: Duration) -> Result<u64, LockError> {
    if key.is_empty() {
        return Err(LockError::invalid(key, "the lock key is empty"));
    }
    let bound = wait.saturating_add(BOUND);
    let cancel = OnDrop(Some(tx.cancel_token()));
    match tokio::time::timeout(bound, take(tx, key, wait)).await {
        Ok(taken) => {
            // Nothing runs any more: a cancel now could only hit the caller's next query.
            cancel.disarm();
            taken
        }
        Err(_) => Err(LockError::timed_out(key, KIND, "lock in the transaction", bound)),
    }
}

/// An attempt, then (if `wait` allows) a wait on the server.
async fn take(tx: &Transaction<'_>, key: &str, wait: Duration) -> Result<u64, LockError> {
    let (k1, k2) = advisory_key(key);
    let attempt = format!("SELECT CASE WHEN pg_try_advisory_xact_lock($1, $2) THEN nextval('{SEQUENCE}') END");
    let params: [(&(dyn ToSql + Sync), Type); 2] = [(&k1, Type::INT4), (&k2, Type::INT4)];
    let rows = tx.query_typed(&attempt, &params).await.map_err(|e| failed(key, e))?;
    if let Some(token) = rows.first().and_then(|row| row.get::<_, Option<i64>>(0)) {
        return Ok(token as u64);
    }
    let contended = || LockError::Contended { name: key.to_owned(), waited: wait, attempts: 1 };
    if wait.is_zero() {
        return Err(contended());
    }
    // The wait, under a savepoint: its `lock_timeout` is local to it, and a wait that runs out
    // (`55P03`) is rolled back to it, which leaves the transaction as it was.
    let ms = wait.as_millis().max(1);
    let waiting = format!(
        "SAVEPOINT {SAVEPOINT}; SELECT current_setting('lock_timeout'); SET LOCAL lock_timeout = '{ms}ms'; \
         SELECT pg_advisory_xact_lock({k1}, {k2}); SELECT nextval('{SEQUENCE}')"
    );
    match tx.simple_query(&waiting).await {
        Ok(messages) => {
            let values: Vec<&str> = messages
                .iter()
                .filter_map(|m| match m {
                    SimpleQueryMessage::Row(row) => row.get(0),
                    _ => None,
                })
                .collect();
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
            tx.simple_query(&restore).await.map_err(|e| failed(key, e))?;
            Ok(token)
        }
        Err(e) => {
            let ran_out = e.code() == Some(&tokio_postgres::error::SqlState::LOCK_NOT_AVAILABLE);
            let back = format!("ROLLBACK TO SAVEPOINT {SAVEPOINT}; RELEASE SAVEPOINT {SAVEPOINT}");
            tx.simple_query(&back).await.map_err(|e| failed(key, e))?;
            match ran_out {
                true => Err(contended()),
                false => Err(failed(key, e)),
            }
        }
    }
}

fn failed(key: &str, e: tokio_postgres::Error) -> LockError {
    if e.code() == Some(&tokio_postgres::error::SqlState::UNDEFINED_TABLE) {
        let why = format!(
            "the sequence `{SEQUENCE}` the fencing tokens come from does not exist: run \
             `lock_runtime::fence::postgres::INSTALL_SQL` once (or connect a PostgresBackend once)"
        );
        return LockError::invalid(key, why);
    }
    pg_error(key, "lock in the transaction", e)
}

/// Asks the server to cancel the transaction's running query when dropped armed: a call
/// dropped or timed out while it waits.
struct OnDrop(Option<CancelToken>);

impl OnDrop {
    fn disarm(mut self) {
        self.0 = None;
    }
}

impl Drop for OnDrop {
    fn drop(&mut self) {
        let (Some(token), Ok(runtime)) = (self.0.take(), tokio::runtime::Handle::try_current()) else { return };
        runtime.spawn(async move {
            let _ = tokio::time::timeout(BOUND, token.cancel_query(NoTls)).await;
        });
    }
}
