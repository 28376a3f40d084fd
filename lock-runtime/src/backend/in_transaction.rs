//! [`LockInTransaction`]: the caller's own transaction as a place a store can take a lock, a
//! capability of the stores that have one (PostgreSQL's transactions: tokio-postgres' and, with
//! the feature `sqlx`, sqlx's).

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use crate::error::LockError;

/// The application's own transaction, where a store takes a lock that ends with it (commit
/// or rollback): what [`LockRequest::in_transaction`](crate::LockRequest::in_transaction)
/// takes, so that the lock has the manager's prefix, as its other locks of the same name do.
///
/// Implemented by PostgreSQL's transactions (feature `postgres`: a tokio-postgres
/// `&Transaction`; feature `sqlx`: `&mut *tx` of a `sqlx::Transaction<'_, Postgres>`), through
/// [`backend::postgres::lock_in_transaction`](https://docs.rs/lock-runtime/latest/lock_runtime/backend/postgres/fn.lock_in_transaction.html).
pub trait LockInTransaction: Send {
    /// Takes the lock `key` (the manager's prefix, then the name) in the transaction, waiting
    /// up to `wait` for a holder to go: its fencing token.
    #[allow(clippy::type_complexity)] // `backend::BoxFuture`, spelled out
    fn lock_key<'a>(
        self,
        key: &'a str,
        wait: Duration,
    ) -> Pin<Box<dyn Future<Output = Result<u64, LockError>> + Send + 'a>>
    where
        Self: 'a;
}
