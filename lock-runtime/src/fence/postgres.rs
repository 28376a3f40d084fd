//! The PostgreSQL fence (feature `postgres` or `sqlx`): a table of the highest token written per
//! resource, and the SQL function `lock_runtime_fence(resource text, token bigint)` that a
//! writer calls in its own transaction before writing.
//!
//! ```no_run
//! # async fn settle(db: &mut tokio_postgres::Client, manager: &lock_runtime::LockManager) -> Result<(), Box<dyn std::error::Error>> {
//! use lock_runtime::fence::postgres::{check, INSTALL_SQL};
//!
//! db.batch_execute(INSTALL_SQL).await?; // once, in a migration
//!
//! let guard = manager.lock("orders:42").await?;
//! let tx = db.transaction().await?;
//! check(&tx, "orders:42", guard.fencing_token()).await?; // a stale holder fails here
//! tx.execute("UPDATE orders SET state = 'paid' WHERE id = 42", &[]).await?;
//! tx.commit().await?;
//! guard.release().await?;
//! # Ok(()) }
//! ```
//!
//! At every isolation level the newest holder wins: at READ COMMITTED a writer that waited on
//! the fence row sees the other's token at once; at REPEATABLE READ and SERIALIZABLE it gets
//! [`LockError::Conflict`] (SQLSTATE 40001, [`is_conflict`](LockError::is_conflict)) when
//! another holder's write committed after its snapshot, and its retry, in a new transaction,
//! is admitted if its token is the newest and fenced if not.
//!
//! [`check`] runs on a tokio-postgres client or transaction (feature `postgres`), and on a
//! `&mut sqlx::PgConnection` (feature `sqlx`: `check(&mut *tx, ..)` in a sqlx transaction).
//! Any other client can call the function (`SELECT lock_runtime_fence('orders:42', $1)` from
//! diesel or psql); a refusal is SQLSTATE [`SQLSTATE`] (`LR409`), whose message says "fenced"
//! and names both tokens, and it fails the transaction, so nothing of the stale write is kept.

#[cfg(feature = "postgres")]
use tokio_postgres::error::SqlState;
#[cfg(feature = "postgres")]
use tokio_postgres::types::{ToSql, Type};
#[cfg(feature = "postgres")]
use tokio_postgres::GenericClient;

#[cfg(feature = "postgres")]
use super::FenceStore;
use crate::backend::BoxFuture;
use crate::error::LockError;

/// The SQL that installs the fence: the table `lock_runtime_fences` and the function
/// `lock_runtime_fence(resource text, token bigint) RETURNS bigint` (and the token sequence).
/// Idempotent, and safe from any number of sessions at once (it serialises on an advisory
/// lock held to the end of its transaction): run it at every startup, or as a migration: the
/// crate ships it as one, `migrations/20260101000000_lock_runtime_fence.sql` in its package
/// (copy it into the folder `sqlx::migrate!` or refinery reads; it runs in the migration's
/// transaction). Send it as one batch
/// (tokio-postgres `batch_execute`, `sqlx::raw_sql`), which PostgreSQL runs as one
/// transaction; with psql, `psql --single-transaction -f`.
///
/// ```
/// assert!(lock_runtime::fence::postgres::INSTALL_SQL.contains("CREATE TABLE IF NOT EXISTS lock_runtime_fences"));
/// ```
pub const INSTALL_SQL: &str = include_str!("../../migrations/20260101000000_lock_runtime_fence.sql");

/// The SQLSTATE of a write refused by the fence.
pub const SQLSTATE: &str = "LR409";

/// Checks and records `token` for `resource` in the transaction of `client`
/// (`SELECT lock_runtime_fence($1, $2)`). The fence row stays locked until that transaction
/// ends, so call it first in the transaction that writes `resource`, then write, then commit.
///
/// Errors: [`is_fenced`](LockError::is_fenced) when a newer holder already wrote with a higher
/// token (the transaction is then aborted: roll it back); [`is_conflict`](LockError::is_conflict)
/// when the transaction runs at REPEATABLE READ or SERIALIZABLE and another holder's write to
/// the fence committed after its snapshot (SQLSTATE 40001): roll back and run the transaction
/// again, which admits a holder whose token is the newest and fences a stale one (so the newer
/// holder wins at every isolation level, as it does at once at READ COMMITTED);
/// [`is_invalid`](LockError::is_invalid) for a token above `i64::MAX` (PostgreSQL's `bigint`);
/// [`is_backend`](LockError::is_backend) for anything else (e.g. [`INSTALL_SQL`] was never run).
pub async fn check<C: FenceClient>(mut client: C, resource: &str, token: u64) -> Result<(), LockError> {
    let Ok(signed) = i64::try_from(token) else {
        return Err(LockError::invalid(resource, format!("fencing token {token} is above PostgreSQL's bigint")));
    };
    client.fence(resource, token, signed).await
}

/// What [`check`] runs on: any tokio-postgres client (`&Client`, `&Transaction`, a pool's
/// object), or (feature `sqlx`) a `&mut sqlx::PgConnection` (`&mut *tx` of a
/// `sqlx::Transaction<'_, Postgres>`). Sealed.
pub trait FenceClient: Send + sealed::Sealed {
    /// `SELECT lock_runtime_fence(resource, signed)`, its refusal as [`LockError::Fenced`].
    #[doc(hidden)]
    fn fence<'a>(&'a mut self, resource: &'a str, token: u64, signed: i64) -> BoxFuture<'a, Result<(), LockError>>;
}

mod sealed {
    pub trait Sealed {}
    #[cfg(feature = "postgres")]
    impl<C: tokio_postgres::GenericClient + Sync> Sealed for &C {}
    #[cfg(feature = "sqlx")]
    impl Sealed for &mut sqlx::PgConnection {}
}

#[cfg(feature = "postgres")]
impl<C: GenericClient + Sync> FenceClient for &C {
    fn fence<'a>(&'a mut self, resource: &'a str, token: u64, signed: i64) -> BoxFuture<'a, Result<(), LockError>> {
        Box::pin(async move {
            // Typed parameters: one round trip (no statement prepared first), on the writer's
            // hot path.
            let params: [(&(dyn ToSql + Sync), Type); 2] = [(&resource, Type::TEXT), (&signed, Type::INT8)];
            match self.query_typed("SELECT lock_runtime_fence($1, $2)", &params).await {
                Ok(_) => Ok(()),
                Err(e) => Err(refusal(resource, token, &e)
                    .or_else(|| conflict(resource, &e))
                    .unwrap_or_else(|| failed(resource, e))),
            }
        })
    }
}

/// Any other failure of the fence's query: the server's severity, SQLSTATE and message (the
/// client's own text is only "db error").
#[cfg(feature = "postgres")]
fn failed(resource: &str, e: tokio_postgres::Error) -> LockError {
    match e.as_db_error() {
        Some(db) => LockError::backend(
            resource,
            "postgres",
            "fence",
            format!("{} {}: {}", db.severity(), db.code().code(), db.message()),
        ),
        None => LockError::backend(resource, "postgres", "fence", e),
    }
}

#[cfg(feature = "sqlx")]
impl FenceClient for &mut sqlx::PgConnection {
    fn fence<'a>(&'a mut self, resource: &'a str, token: u64, signed: i64) -> BoxFuture<'a, Result<(), LockError>> {
        Box::pin(async move {
            // Not prepared for keeps: a transaction-mode pooler hands the next transaction to
            // another server connection, which has no such statement.
            let query = sqlx::query("SELECT lock_runtime_fence($1, $2)").bind(resource).bind(signed).persistent(false);
            let Err(e) = query.execute(&mut **self).await else { return Ok(()) };
            let Some(db) = e.as_database_error() else {
                return Err(LockError::backend(resource, "postgres", "fence", e));
            };
            let code = db.code().map(|c| c.into_owned()).unwrap_or_default();
            if code == SQLSTATE {
                let detail = db.try_downcast_ref::<sqlx::postgres::PgDatabaseError>().and_then(|pg| pg.detail());
                return Err(LockError::Fenced { name: resource.to_owned(), token, highest: highest(detail) });
            }
            if code == "40001" || code == "40P01" {
                let message = db.message().to_owned();
                return Err(LockError::Conflict { name: resource.to_owned(), sqlstate: code, message });
            }
            Err(LockError::backend(resource, "postgres", "fence", format!("ERROR {code}: {}", db.message())))
        })
    }
}

/// The [`LockError::Conflict`] of a serialization failure (`40001`) or a deadlock (`40P01`):
/// the transaction is to be retried whole.
#[cfg(feature = "postgres")]
fn conflict(resource: &str, error: &tokio_postgres::Error) -> Option<LockError> {
    let db = error.as_db_error()?;
    if *db.code() != SqlState::T_R_SERIALIZATION_FAILURE && *db.code() != SqlState::T_R_DEADLOCK_DETECTED {
        return None;
    }
    Some(LockError::Conflict {
        name: resource.to_owned(),
        sqlstate: db.code().code().to_owned(),
        message: db.message().to_owned(),
    })
}

/// The highest token a refusal's detail (`highest=<n>`) names.
fn highest(detail: Option<&str>) -> u64 {
    detail.and_then(|d| d.strip_prefix("highest=")).and_then(|n| n.parse().ok()).unwrap_or(0)
}

/// The [`LockError::Fenced`] of an error raised by `lock_runtime_fence`, if it is one.
#[cfg(feature = "postgres")]
pub fn refusal(resource: &str, token: u64, error: &tokio_postgres::Error) -> Option<LockError> {
    let db = error.as_db_error()?;
    if *db.code() != SqlState::from_code(SQLSTATE) {
        return None;
    }
    Some(LockError::Fenced { name: resource.to_owned(), token, highest: highest(db.detail()) })
}

/// A [`FenceStore`] on PostgreSQL for the HTTP form ([`Fenced`](crate::fence::Fenced)): each
/// admission is `SELECT lock_runtime_fence(resource, token)` in its own transaction, on the
/// table of [`INSTALL_SQL`] (which must have been run), shared by every replica of a service.
#[cfg(feature = "postgres")]
pub struct PostgresFences {
    client: tokio_postgres::Client,
}

#[cfg(feature = "postgres")]
impl PostgresFences {
    /// A store on `client` (its connection task running, as `tokio_postgres::connect` leaves it).
    pub fn new(client: tokio_postgres::Client) -> Self {
        PostgresFences { client }
    }
}

#[cfg(feature = "postgres")]
impl std::fmt::Debug for PostgresFences {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("PostgresFences")
    }
}

#[cfg(feature = "postgres")]
impl FenceStore for PostgresFences {
    fn admit<'a>(&'a self, resource: &'a str, token: u64) -> BoxFuture<'a, Result<(), LockError>> {
        Box::pin(check(&self.client, resource, token))
    }
}
