//! The Redis fence (feature `redis`): fenced writes to Redis used as the data store, on any
//! connection of the `redis` crate (`redis::aio::ConnectionLike`: a multiplexed connection, a
//! connection manager, a cluster connection).
//!
//! ```no_run
//! # async fn settle(manager: &lock_runtime::LockManager, conn: &mut redis::aio::MultiplexedConnection) -> Result<(), lock_runtime::LockError> {
//! let guard = manager.lock("orders:42").await?;
//! lock_runtime::fence::redis::set(conn, "orders:42:state", "paid", guard.fencing_token()).await?;
//! guard.release().await?;
//! # Ok(()) }
//! ```
//!
//! Each write is one script: it writes only when the writer's token is at least the highest
//! recorded for the key, and records it beside the value, in the key's fence key
//! ([`fence_key`]) of the same hash slot, expiring with the value. A refusal is an error for
//! which [`LockError::is_fenced`] is true.

use std::sync::LazyLock;
use std::time::Duration;

use redis::aio::ConnectionLike;
use redis::{Script, ToRedisArgs};

use super::FenceStore;
use crate::backend::redis::layout::slot_tag_of;
use crate::backend::BoxFuture;
use crate::error::LockError;

static SET: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("set.lua")));
static RECORD: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("record.lua")));

/// Writes `value` at `key` (a plain `SET`, which clears any TTL) only if `token` is at least
/// the highest token recorded for `key`, and records `token`. A repeated write with the same
/// token succeeds.
///
/// Errors: [`is_fenced`](LockError::is_fenced) when a newer holder already wrote `key` with a
/// higher token (nothing is written); [`is_backend`](LockError::is_backend) when Redis fails.
pub async fn set<C: ConnectionLike>(
    conn: &mut C,
    key: &str,
    value: impl ToRedisArgs,
    token: u64,
) -> Result<(), LockError> {
    fenced(conn, &SET, key, Keys::ValueAndFence, token, |script| {
        script.arg(value).arg(padded(token)).arg(0);
    })
    .await
}

/// The longest TTL [`set_expiring`] accepts.
const MAX_TTL: Duration = Duration::from_secs(100 * 365 * 24 * 60 * 60);

/// [`set`] with a TTL (`SET .. PX`): the value and its recorded token expire together. A TTL
/// under 1 ms or over 100 years is an [`is_invalid`](LockError::is_invalid) error.
pub async fn set_expiring<C: ConnectionLike>(
    conn: &mut C,
    key: &str,
    value: impl ToRedisArgs,
    token: u64,
    ttl: Duration,
) -> Result<(), LockError> {
    let ms = u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX);
    if ms == 0 {
        return Err(LockError::invalid(key, format!("TTL {ttl:?} is below Redis' 1 ms")));
    }
    if ttl > MAX_TTL {
        return Err(LockError::invalid(
            key,
            format!("TTL {ttl:?} is more than the 100 years accepted (Redis refuses an expiry past its clock's range); use `set` for a value that does not expire"),
        ));
    }
    fenced(conn, &SET, key, Keys::ValueAndFence, token, |script| {
        script.arg(value).arg(padded(token)).arg(ms);
    })
    .await
}

/// Sets `field` of the hash at `key` to `value` (`HSET`) only if `token` is at least the
/// highest token recorded for `key` (one record for the whole hash, shared with [`set`] and
/// [`del`] of the same key, expiring with the hash when it has a TTL), and records `token`.
pub async fn hset<C: ConnectionLike>(
    conn: &mut C,
    key: &str,
    field: impl ToRedisArgs,
    value: impl ToRedisArgs,
    token: u64,
) -> Result<(), LockError> {
    fenced(conn, &SET, key, Keys::ValueAndFence, token, |script| {
        script.arg(value).arg(padded(token)).arg(0).arg(field);
    })
    .await
}

/// Deletes `key` only if `token` is at least the highest token recorded for it. The recorded
/// token stays (expiring when it would have with the value, if it had a TTL), so a stale holder
/// cannot write the value back.
pub async fn del<C: ConnectionLike>(conn: &mut C, key: &str, token: u64) -> Result<(), LockError> {
    fenced(conn, &RECORD, key, Keys::ValueAndFence, token, |script| {
        script.arg(padded(token));
    })
    .await
}

/// A [`FenceStore`] on Redis for the HTTP form ([`Fenced`](crate::fence::Fenced)): the highest
/// token per resource in its [`fence_key`] (kept for good: one small key per resource),
/// shared by every replica of a service. Built on any cloneable connection (a
/// `redis::aio::ConnectionManager`, a `MultiplexedConnection`, a cluster connection).
#[derive(Debug, Clone)]
pub struct RedisFences<C> {
    conn: C,
}

impl<C> RedisFences<C> {
    /// A store on `conn`.
    pub fn new(conn: C) -> Self {
        RedisFences { conn }
    }
}

impl<C: ConnectionLike + Clone + Send + Sync + 'static> FenceStore for RedisFences<C> {
    fn admit<'a>(&'a self, resource: &'a str, token: u64) -> BoxFuture<'a, Result<(), LockError>> {
        let mut conn = self.conn.clone();
        Box::pin(async move {
            fenced(&mut conn, &RECORD, resource, Keys::Fence, token, |script| {
                script.arg(padded(token));
            })
            .await
        })
    }
}

/// The key in which the highest token written to `key` is kept: `lock:fenced:{<tag>}:<key>`,
/// `<tag>` a short string of `key`'s hash slot, so that both live on one Cluster node.
///
/// ```
/// use lock_runtime::fence::redis::fence_key;
/// assert!(fence_key("orders:42").starts_with("lock:fenced:{"));
/// assert!(fence_key("orders:42").ends_with("}:orders:42"));
/// ```
pub fn fence_key(key: &str) -> String {
    format!("lock:fenced:{{{}}}:{key}", slot_tag_of(key))
}

/// A token as the scripts compare it: 20 digits, so string order is number order.
fn padded(token: u64) -> String {
    format!("{token:020}")
}

/// Which keys a fence script of `key` touches.
enum Keys {
    /// The value's key, then its fence key (a write).
    ValueAndFence,
    /// The fence key alone (an admission: a record of the token).
    Fence,
}

/// Runs a fence script for a writer of `token` to `key`.
async fn fenced<C: ConnectionLike>(
    conn: &mut C,
    script: &Script,
    key: &str,
    keys: Keys,
    token: u64,
    args: impl FnOnce(&mut redis::ScriptInvocation<'_>),
) -> Result<(), LockError> {
    let mut invocation = script.prepare_invoke();
    if let Keys::ValueAndFence = keys {
        invocation.key(key);
    }
    invocation.key(fence_key(key));
    args(&mut invocation);
    let refused: Option<String> =
        invocation.invoke_async(conn).await.map_err(|e| LockError::backend(key, "redis", "fence", e))?;
    match refused {
        None => Ok(()),
        Some(highest) => {
            Err(LockError::Fenced { name: key.to_owned(), token, highest: highest.parse().unwrap_or(u64::MAX) })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::redis::key_slot;

    #[test]
    fn a_fence_key_shares_its_keys_slot() {
        for key in ["orders:42", "a{b}c", "{}x", "}x", "}{x}", "a}b{", "é", ""] {
            assert_eq!(key_slot(fence_key(key).as_bytes()), key_slot(key.as_bytes()), "{key}");
        }
        assert!(padded(7) < padded(10) && padded(u64::MAX - 1) < padded(u64::MAX));
    }
}
