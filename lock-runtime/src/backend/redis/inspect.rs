//! Looking at the locks of a Redis server from outside their holders: listing, inspecting and
//! force-releasing them (what `lockctl` does).

use std::time::Duration;

use futures_util::StreamExt;
use redis::Value;

use super::backend::RedisBackend;
use super::layout::KeyLayout;
use super::options::KIND;
use super::scripts::{FORCE_RELEASE, INSPECT, INSPECT_KINDS, WATCH};
use super::topology::Conn;
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
        let mut locks = Vec::new();
        for key in self.scan_keys(&format!("lock:{{{}*", glob_escape(prefix)), "lock:{", prefix).await? {
            if let Some(info) = self.inspect_mutex(&key).await? {
                locks.push(info);
            }
        }
        // Read-write locks and semaphores: one entry per holder.
        for space in ["rw", "sem"] {
            let start = format!("lock:{space}:{{");
            for key in self.scan_keys(&format!("{start}{}*", glob_escape(prefix)), &start, prefix).await? {
                locks.extend(self.kind_holders(&format!("{start}{key}}}"), &key).await?);
            }
        }
        locks.sort_by(|a, b| a.key.cmp(&b.key));
        Ok(locks)
    }

    /// The backend keys of the Redis keys matching `pattern` that are `<start><key>}`, sorted.
    async fn scan_keys(&self, pattern: &str, start: &str, prefix: &str) -> Result<Vec<String>, LockError> {
        let found = match &self.shared.server.conn() {
            // A cluster's keys are spread over its primaries: each is scanned.
            Conn::Cluster(cluster, _) => super::cluster::scan_primaries(cluster, pattern, SCAN_COUNT).await,
            conn => scan(conn, pattern).await,
        };
        let found = found.map_err(|e| LockError::backend(prefix, KIND, "list", e))?;
        let mut keys: Vec<String> =
            found.iter().filter_map(|k| k.strip_prefix(start)?.strip_suffix('}')).map(str::to_owned).collect();
        keys.sort_unstable();
        keys.dedup();
        Ok(keys)
    }

    /// The holders of the read-write lock or semaphore whose state is `state`, for backend key
    /// `key` (`inspect_kinds.lua`).
    async fn kind_holders(&self, state: &str, key: &str) -> Result<Vec<LockInfo>, LockError> {
        let mut invocation = INSPECT_KINDS.prepare_invoke();
        invocation.key(state);
        let (fields, _pttl, (secs, micros)) =
            self.shared.server.eval::<(Vec<String>, i64, (u64, u64))>(key, "inspect", invocation).await?;
        let now_ms = secs.saturating_mul(1000).saturating_add(micros / 1000);
        Ok(parse_kind_state(key, &fields, now_ms))
    }

    /// The lock of backend key `key` (the manager prefix followed by the name), if it is held.
    ///
    /// Redis cannot tell how many acquisitions wait in other processes:
    /// [`LockInfo::waiters`] is `None`; [`waited_on`](LockInfo::waited_on) tells whether one
    /// marked the lock, [`subscribers`](LockInfo::subscribers) how many connections listen
    /// on its release channel (`PUBSUB NUMSUB`: processes with a waiter, or within their
    /// unsubscribe grace), and [`queued`](LockInfo::queued) how many processes' waiters are in
    /// the lock's queue (not on a Cluster, which keeps none).
    ///
    /// The value, lease and time are read at one instant by a script (`inspect.lua`, no
    /// MULTI: the least ACL of the README runs it); the subscribers beside it, `None` for a
    /// user whose ACL does not allow `PUBSUB NUMSUB`.
    ///
    /// A name held as a read-write lock or a semaphore (and not as a mutex) gives its first
    /// holder; [`list`](Self::list) gives each.
    pub async fn inspect(&self, key: &str) -> Result<Option<LockInfo>, LockError> {
        if let Some(info) = self.inspect_mutex(key).await? {
            return Ok(Some(info));
        }
        for kind in [crate::backend::LockKind::Read, crate::backend::LockKind::Semaphore { permits: 1 }] {
            let state = KeyLayout::of_kind(key, kind).lock;
            if let Some(first) = self.kind_holders(&state, key).await?.into_iter().next() {
                return Ok(Some(first));
            }
        }
        Ok(None)
    }

    /// The mutex of backend key `key`, if it is held.
    async fn inspect_mutex(&self, key: &str) -> Result<Option<LockInfo>, LockError> {
        let layout = KeyLayout::of(key);
        let timeout = self.shared.options.command_timeout;
        let mut invocation = INSPECT.prepare_invoke();
        invocation.key(&layout.lock);
        if self.shared.queues() {
            invocation.key(layout.queue());
        }
        let look =
            self.shared.server.eval::<(Option<String>, i64, (u64, u64), Option<u64>)>(key, "inspect", invocation);
        let mut conn = self.shared.server.conn().clone();
        let mut numsub = redis::cmd("PUBSUB");
        numsub.arg("NUMSUB").arg(&layout.channel);
        let numsub = tokio::time::timeout(timeout, numsub.query_async::<Vec<Value>>(&mut conn));
        let (look, numsub) = tokio::join!(look, numsub);
        let (value, pttl, time, queued) = look?;
        let Some(value) = value else { return Ok(None) };
        let now_ms = time.0.saturating_mul(1000).saturating_add(time.1 / 1000);
        let subscribers = match numsub.ok().and_then(Result::ok).as_deref() {
            Some([_, Value::Int(n)]) => u64::try_from(*n).ok(),
            _ => None,
        };
        let mut info = parse_value(key, &value, pttl, now_ms, subscribers);
        info.queued = queued;
        Ok(Some(info))
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
        let (status, owner): (i64, String) = self.shared.server.eval(key, "force release", invocation).await?;
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
        let timeout = self.shared.options.command_timeout;
        let subscribe = async {
            let mut pubsub = self.shared.source.pubsub().await?;
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

/// Reads a lock key's value: `<owner id>@<holder>#<token>#<granted ms>[#q][+]` (see acquire.lua;
/// `#q` marks a grant from the queue not claimed yet);
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
    info.unclaimed = fields.next() == Some("q");
    info.remaining_lease = u64::try_from(pttl).ok().map(Duration::from_millis);
    info.waited_on = Some(waited_on);
    info.subscribers = subscribers;
    info
}

/// Reads a read-write lock's or semaphore's state (see kind_acquire.lua): one record per holder
/// within its lease (`h:<owner>` = `<expiry ms>#<R|W|S>#<token>#<granted ms>`), sorted by
/// token; waited on when marked or a writer's intent lives.
fn parse_kind_state(key: &str, fields: &[String], now_ms: u64) -> Vec<LockInfo> {
    let pairs: Vec<(&str, &str)> = fields.chunks_exact(2).map(|p| (p[0].as_str(), p[1].as_str())).collect();
    let permits = pairs.iter().find(|(f, _)| *f == "permits").and_then(|(_, v)| v.parse().ok()).unwrap_or(0);
    let live = |v: &str| v.split('#').next().and_then(|e| e.parse::<u64>().ok()).filter(|e| *e > now_ms);
    let waited_on = pairs.iter().any(|(f, v)| *f == "mark" || (f.starts_with("w:") && live(v).is_some()));
    let mut holders: Vec<LockInfo> = pairs
        .iter()
        .filter_map(|(f, v)| {
            let owner = f.strip_prefix("h:")?;
            let expiry = live(v)?;
            let mut parts = v.split('#').skip(1);
            let mut info = LockInfo::new(key, owner);
            info.holder = owner.split_once('@').and_then(|(_, holder)| Holder::parse(holder));
            info.kind = match parts.next()? {
                "R" => Some(crate::backend::LockKind::Read),
                "W" => Some(crate::backend::LockKind::Write),
                "S" => Some(crate::backend::LockKind::Semaphore { permits }),
                _ => None,
            };
            info.fencing_token = parts.next().and_then(|t| t.parse().ok());
            let granted_ms: Option<u64> = parts.next().and_then(|t| t.parse().ok());
            info.age = granted_ms.map(|g| Duration::from_millis(now_ms.saturating_sub(g)));
            info.remaining_lease = Some(Duration::from_millis(expiry - now_ms));
            info.waited_on = Some(waited_on);
            Some(info)
        })
        .collect();
    holders.sort_by_key(|h| h.fencing_token);
    holders
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
        let timeout = self.shared.options.command_timeout;
        let subscribe = async {
            let mut pubsub = self.shared.source.pubsub().await?;
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
            let _pttl: i64 = self.backend.shared.server.eval(&self.key, "watch", invocation).await?;
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
    fn kind_states_are_read_back() {
        let fields: Vec<String> = [
            ("h:0a-1@db-1/42/api", "1700000002000#R#17#1700000000000"),
            ("h:0a-2@db-2/7", "1700000000500#R#18#1700000000100"), // expired
            ("w:0a-3@db-3/9", "1700000003000"),
            ("h:0a-4@db-1/43", "1700000002500#W#16#1700000000600"),
        ]
        .iter()
        .flat_map(|(f, v)| [f.to_string(), v.to_string()])
        .collect();
        let holders = parse_kind_state("doc", &fields, 1700000001000);
        assert_eq!(holders.len(), 2, "{holders:?}");
        let (writer, reader) = (&holders[0], &holders[1]);
        assert_eq!((writer.kind, writer.fencing_token), (Some(crate::backend::LockKind::Write), Some(16)));
        assert_eq!((reader.kind, reader.fencing_token), (Some(crate::backend::LockKind::Read), Some(17)));
        assert_eq!(reader.holder.as_ref().and_then(|h| h.label()), Some("api"));
        assert_eq!((reader.age, reader.remaining_lease), (Some(Duration::from_secs(1)), Some(Duration::from_secs(1))));
        assert_eq!(reader.waited_on, Some(true), "a writer's intent lives");
        let permits: Vec<String> =
            ["permits", "3", "h:0b-1@h/1", "1700000002000#S#5#1700000000000"].iter().map(|s| s.to_string()).collect();
        let holders = parse_kind_state("pool", &permits, 1700000001000);
        assert_eq!(holders[0].kind, Some(crate::backend::LockKind::Semaphore { permits: 3 }));
        assert_eq!(holders[0].waited_on, Some(false));
    }

    #[test]
    fn prefixes_are_matched_literally() {
        assert_eq!(glob_escape("a*b?[c]\\"), "a\\*b\\?\\[c\\]\\\\");
    }
}
