//! Looking at the locks of a Redis server from outside their holders: listing, inspecting and
//! force-releasing them (what `lockctl` does).

use std::time::Duration;

use futures_util::StreamExt;
use redis::Value;

use super::topology::Conn;
use super::{eval, KeyLayout, RedisBackend, FORCE_RELEASE, INSPECT, KIND, WATCH};
use crate::backend::{BoxFuture, ChangeFeed, ForceRelease, Holder, LockInfo};
use crate::error::LockError;

/// Keys asked for per `SCAN` call.
const SCAN_COUNT: usize = 500;

impl RedisBackend {
    /// The locks held now whose key (the manager prefix followed by the name) starts with
    /// `prefix`, sorted by key. Scans the keyspace (`SCAN`, never `KEYS`; on a Redis Cluster,
    /// every primary's in turn), so a busy server is not blocked; a lock taken or released
    /// during the scan may or may not be listed.
    pub async fn list(&self, prefix: &str) -> Result<Vec<LockInfo>, LockError> {
        let pattern = format!("lock:{{{}*", glob_escape(prefix));
        let found = match &self.inner.conn {
            // A cluster's keys are spread over its primaries: each is scanned.
            Conn::Cluster(cluster) => super::cluster::scan_primaries(cluster, &pattern, SCAN_COUNT).await,
            conn => scan(conn, &pattern).await,
        };
        let found = found.map_err(|e| LockError::backend(prefix, KIND, "list", e))?;
        let mut keys: Vec<String> = found.iter().filter_map(|k| KeyLayout::key_of(k)).map(str::to_owned).collect();
        keys.sort_unstable();
        keys.dedup();
        let mut locks = Vec::with_capacity(keys.len());
        for key in keys {
            if let Some(info) = self.inspect(&key).await? {
                locks.push(info);
            }
        }
        Ok(locks)
    }

    /// The lock of backend key `key` (the manager prefix followed by the name), if it is held.
    ///
    /// Redis cannot tell how many acquisitions wait in other processes:
    /// [`LockInfo::waiters`] is `None`; [`waited_on`](LockInfo::waited_on) tells whether one
    /// marked the lock, and [`subscribers`](LockInfo::subscribers) how many connections listen
    /// on its release channel (`PUBSUB NUMSUB`: processes with a waiter, or within their
    /// unsubscribe grace).
    ///
    /// The value, lease and time are read at one instant by a script (`inspect.lua`, no
    /// MULTI: the least ACL of the README runs it); the subscribers beside it, `None` for a
    /// user whose ACL does not allow `PUBSUB NUMSUB`.
    pub async fn inspect(&self, key: &str) -> Result<Option<LockInfo>, LockError> {
        let layout = KeyLayout::of(key);
        let timeout = self.inner.options.command_timeout;
        let mut invocation = INSPECT.prepare_invoke();
        invocation.key(&layout.lock);
        let look = eval::<(Option<String>, i64, (u64, u64))>(&self.inner.conn, timeout, key, "inspect", invocation);
        let mut conn = self.inner.conn.clone();
        let mut numsub = redis::cmd("PUBSUB");
        numsub.arg("NUMSUB").arg(&layout.channel);
        let numsub = tokio::time::timeout(timeout, numsub.query_async::<Vec<Value>>(&mut conn));
        let (look, numsub) = tokio::join!(look, numsub);
        let (value, pttl, time) = look?;
        let Some(value) = value else { return Ok(None) };
        let now_ms = time.0.saturating_mul(1000).saturating_add(time.1 / 1000);
        let subscribers = match numsub.ok().and_then(Result::ok).as_deref() {
            Some([_, Value::Int(n)]) => u64::try_from(*n).ok(),
            _ => None,
        };
        Ok(Some(parse_value(key, &value, pttl, now_ms, subscribers)))
    }

    /// Frees the lock of backend key `key` whatever holds it, and wakes its waiters (in every
    /// process) as a release does (`force_release.lua`). With `expected_owner` (a
    /// [`LockInfo::owner`] read before), only if that owner still holds it. The holder is not
    /// told at once: its next renewal (or its release) finds the key gone and reports the lock
    /// lost ([`LockGuard::lost`](crate::LockGuard::lost) fires). A lock with a fixed lease is
    /// never renewed: its holder's `lost()` fires when that lease ends, as it would anyway.
    pub async fn force_release(&self, key: &str, expected_owner: Option<&str>) -> Result<ForceRelease, LockError> {
        let layout = KeyLayout::of(key);
        let mut invocation = FORCE_RELEASE.prepare_invoke();
        invocation.key(&layout.lock).arg(expected_owner.unwrap_or("")).arg(&layout.channel);
        let timeout = self.inner.options.command_timeout;
        let (status, owner): (i64, String) = eval(&self.inner.conn, timeout, key, "force release", invocation).await?;
        Ok(match status {
            1 => ForceRelease::Released(owner),
            0 => ForceRelease::NotHeld,
            _ => ForceRelease::OwnerChanged(owner),
        })
    }
}

/// The keys matching `pattern` on the server of `conn`.
async fn scan(conn: &Conn, pattern: &str) -> redis::RedisResult<Vec<String>> {
    let mut conn = conn.clone();
    let mut keys = Vec::new();
    let mut cursor: u64 = 0;
    loop {
        let (next, batch): (u64, Vec<String>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(pattern)
            .arg("COUNT")
            .arg(SCAN_COUNT)
            .query_async(&mut conn)
            .await?;
        keys.extend(batch);
        if next == 0 {
            return Ok(keys);
        }
        cursor = next;
    }
}

/// Announcements of changes to the locks under a prefix ([`RedisBackend::changes`]), on a
/// pub/sub connection of its own.
pub struct Changes {
    stream: redis::aio::PubSubStream,
}

impl std::fmt::Debug for Changes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Changes")
    }
}

impl Changes {
    /// The next announcement: the pub/sub channel it came on. `None` once the connection is
    /// closed (subscribe again).
    pub async fn next(&mut self) -> Option<String> {
        self.stream.next().await.map(|msg| msg.get_channel_name().to_owned())
    }
}

impl RedisBackend {
    /// Subscribes to what Redis announces about the locks whose key starts with `prefix`: their
    /// release channels (a release someone waited for, a forced release) and, when the server
    /// has keyspace notifications on (`notify-keyspace-events` with `K` and `g$x`, which this
    /// never turns on), their keys' events, taking included. Redis announces nothing else, so
    /// a live view also looks again now and then.
    pub async fn changes(&self, prefix: &str) -> Result<Changes, LockError> {
        let key = glob_escape(prefix);
        let timeout = self.inner.options.command_timeout;
        let subscribe = async {
            let mut pubsub = self.inner.source.pubsub().await?;
            pubsub.psubscribe(format!("lock:{{{key}*:released")).await?;
            pubsub.psubscribe(format!("__keyspace@*__:lock:{{{key}*")).await?;
            Ok::<_, redis::RedisError>(pubsub)
        };
        match tokio::time::timeout(timeout, subscribe).await {
            Ok(Ok(pubsub)) => Ok(Changes { stream: pubsub.into_on_message() }),
            Ok(Err(e)) => Err(LockError::backend(prefix, KIND, "subscribe", e)),
            Err(_) => Err(LockError::timed_out(prefix, KIND, "subscribe", timeout)),
        }
    }
}

/// Reads a lock key's value: `<owner id>@<holder>#<token>#<granted ms>[+]` (see acquire.lua);
/// a value of an older version (the owner id alone, maybe followed by `+`) gives only its owner.
fn parse_value(key: &str, value: &str, pttl: i64, now_ms: u64, subscribers: Option<u64>) -> LockInfo {
    let (value, waited_on) = match value.strip_suffix('+') {
        Some(v) => (v, true),
        None => (value, false),
    };
    let (owner, fields) = value.split_once('#').unwrap_or((value, ""));
    let mut info = LockInfo::new(key, owner);
    info.holder = owner.split_once('@').and_then(|(_, holder)| Holder::parse(holder));
    info.kind = Some(crate::backend::LockKind::Exclusive); // a plain lock key: a mutex
    let mut fields = fields.split('#');
    info.fencing_token = fields.next().and_then(|t| t.parse().ok());
    let granted_ms: Option<u64> = fields.next().and_then(|t| t.parse().ok());
    info.age = granted_ms.map(|g| Duration::from_millis(now_ms.saturating_sub(g)));
    info.remaining_lease = u64::try_from(pttl).ok().map(Duration::from_millis);
    info.waited_on = Some(waited_on);
    info.subscribers = subscribers;
    info
}

/// `text` with Redis glob's special characters escaped.
fn glob_escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

impl crate::backend::Inspect for RedisBackend {
    fn store(&self) -> &'static str {
        KIND
    }

    fn list<'a>(&'a self, prefix: &'a str) -> BoxFuture<'a, Result<Vec<LockInfo>, LockError>> {
        Box::pin(RedisBackend::list(self, prefix))
    }

    fn inspect<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<Option<LockInfo>, LockError>> {
        Box::pin(RedisBackend::inspect(self, key))
    }

    fn force_release<'a>(
        &'a self,
        key: &'a str,
        expected_owner: Option<&'a str>,
    ) -> BoxFuture<'a, Result<ForceRelease, LockError>> {
        Box::pin(RedisBackend::force_release(self, key, expected_owner))
    }

    fn changes<'a>(&'a self, prefix: &'a str) -> BoxFuture<'a, Result<Box<dyn ChangeFeed>, LockError>> {
        Box::pin(async move { Ok(Box::new(Some(RedisBackend::changes(self, prefix).await?)) as Box<dyn ChangeFeed>) })
    }

    /// The lock's own release channel (a plain `SUBSCRIBE`, which the least ACL allows), its
    /// holder marked waited on at each look so that its release is announced.
    fn changes_of<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<Box<dyn ChangeFeed>, LockError>> {
        Box::pin(async move { Ok(Box::new(self.changes_of_one(key).await?) as Box<dyn ChangeFeed>) })
    }
}

/// What tells a watcher of one lock to look again ([`Inspect::changes_of`]): its release
/// announced on its channel (each `changed()` first marks the holder as waited on, as a
/// waiter's look does, so that its release is published). Neither a take nor a lease running
/// out is announced (`complete()` is false; the watcher knows the lease left from its look).
///
/// [`Inspect::changes_of`]: crate::backend::Inspect::changes_of
struct OneLock {
    backend: RedisBackend,
    key: String,
    layout: KeyLayout,
    /// `None` once the subscription closed (the server went away): lease ends only then.
    stream: Option<redis::aio::PubSubStream>,
}

impl RedisBackend {
    async fn changes_of_one(&self, key: &str) -> Result<OneLock, LockError> {
        let layout = KeyLayout::of(key);
        let timeout = self.inner.options.command_timeout;
        let subscribe = async {
            let mut pubsub = self.inner.source.pubsub().await?;
            pubsub.subscribe(&layout.channel).await?;
            Ok::<_, redis::RedisError>(pubsub)
        };
        match tokio::time::timeout(timeout, subscribe).await {
            Ok(Ok(pubsub)) => {
                let stream = Some(pubsub.into_on_message());
                Ok(OneLock { backend: self.clone(), key: key.to_owned(), layout, stream })
            }
            Ok(Err(e)) => Err(LockError::backend(key, KIND, "subscribe", e)),
            Err(_) => Err(LockError::timed_out(key, KIND, "subscribe", timeout)),
        }
    }
}

impl ChangeFeed for OneLock {
    fn changed(&mut self) -> BoxFuture<'_, Result<(), LockError>> {
        Box::pin(async move {
            let mut invocation = WATCH.prepare_invoke();
            invocation.key(&self.layout.lock);
            let timeout = self.backend.inner.options.command_timeout;
            let _pttl: i64 = eval(&self.backend.inner.conn, timeout, &self.key, "watch", invocation).await?;
            let open = match &mut self.stream {
                Some(stream) => stream.next().await.is_some(),
                None => std::future::pending().await,
            };
            if !open {
                self.stream = None;
                return Err(LockError::backend(&*self.key, KIND, "watch", "the subscription was closed"));
            }
            Ok(())
        })
    }

    fn complete(&self) -> bool {
        false
    }
}

/// Redis announces releases (and, with keyspace notifications on, every event of a lock key),
/// never a plain take: a live view also looks again now and then. Once the subscription is
/// closed (`None`) only that is left.
impl ChangeFeed for Option<Changes> {
    fn changed(&mut self) -> BoxFuture<'_, Result<(), LockError>> {
        Box::pin(async move {
            match self {
                Some(changes) => {
                    if changes.next().await.is_none() {
                        *self = None;
                    }
                }
                None => std::future::pending().await,
            }
            Ok(())
        })
    }

    fn complete(&self) -> bool {
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_are_read_back() {
        let info =
            parse_value("k", "0a-1@db-1/42/billing#1700000000000123#1700000000000+", 2500, 1700000000750, Some(1));
        assert_eq!(info.owner, "0a-1@db-1/42/billing");
        let holder = info.holder.as_ref().expect("holder");
        assert_eq!((holder.host(), holder.pid(), holder.label()), ("db-1", Some(42), Some("billing")));
        assert_eq!(info.fencing_token, Some(1700000000000123));
        assert_eq!(info.age, Some(Duration::from_millis(750)));
        assert_eq!(info.remaining_lease, Some(Duration::from_millis(2500)));
        assert_eq!((info.waited_on, info.subscribers, info.waiters), (Some(true), Some(1), None));
        // An older version's value: the owner id only.
        let old = parse_value("k", "0a-1+", -1, 0, None);
        assert_eq!((old.owner.as_str(), old.holder, old.fencing_token, old.age), ("0a-1", None, None, None));
        assert_eq!((old.remaining_lease, old.waited_on), (None, Some(true)));
    }

    #[test]
    fn prefixes_are_matched_literally() {
        assert_eq!(glob_escape("a*b?[c]\\"), "a\\*b\\?\\[c\\]\\\\");
    }
}
