//! The Redis backend (feature `redis`): Redisson's lock protocol, event-driven and fenced.
//!
//! ```no_run
//! # async fn demo() -> Result<(), lock_runtime::LockError> {
//! use std::time::Duration;
//! use lock_runtime::backend::redis::{RedisBackend, RedisOptions};
//! use lock_runtime::LockManager;
//!
//! let manager = LockManager::redis("redis://127.0.0.1:6379").await?;
//!
//! // With a prefix and a tighter bound on every Redis command:
//! let backend = RedisBackend::connect_with(
//!     "redis://127.0.0.1:6379",
//!     RedisOptions::default().command_timeout(Duration::from_millis(500)),
//! )
//! .await?;
//! let manager = LockManager::builder().prefix("myapp:").backend(backend);
//! # Ok(()) }
//! ```
//!
//! # Protocol
//!
//! - **Acquire, extend and release** are atomic Lua scripts (`acquire.lua`, `extend.lua`,
//!   `release.lua` beside this file), sent by SHA (`EVALSHA`) and loaded again transparently
//!   when the server answers `NOSCRIPT` (after a restart or `SCRIPT FLUSH`).
//! - **The lock** is a string key holding the owner id (unique to each acquisition), set with
//!   `NX` and a `PX` lease. Extend and release act only when the key still holds the caller's
//!   owner id; otherwise the caller learns that the lock was lost
//!   ([`LockError::is_lost`](crate::LockError::is_lost)).
//! - **Fencing tokens** come from a counter incremented by the acquire script. There is one
//!   counter per Redis Cluster hash slot (see [`KeyLayout`]), so tokens strictly increase per
//!   name for the life of the dataset, and the keys left behind stay bounded (at most 16,384
//!   counters, however many names were ever locked).
//! - **Key layout** puts a lock's key, channel and counter in one hash slot, ready for Redis
//!   Cluster: see [`KeyLayout`].
//!
//! # Waiting
//!
//! The release script publishes on the lock's channel. Each backend keeps **one** pub/sub
//! connection; a channel is subscribed while some task of this process waits for its lock,
//! and unsubscribed shortly after nobody does. Tasks of one process waiting for the same lock
//! queue locally: a release wakes one of them per process (the head of the queue), never all
//! of them; a waiter that loses the race to another process keeps its place at the front. A
//! holder that crashed publishes nothing, so the head also wakes when the holder's remaining
//! lease (`PTTL`) runs out: a lost notification never strands a waiter beyond that lease. When
//! the pub/sub connection drops (a server restart, `CLIENT KILL TYPE pubsub`), it reconnects,
//! resubscribes, and the waiters re-check the lock (retrying a failed re-check with backoff
//! while their `wait` lasts, so a task waiting across a server restart still gets the lock).
//!
//! # Failures
//!
//! Every Redis command is bounded by [`RedisOptions::command_timeout`]: an unreachable or
//! stalled server gives an [`is_backend`](crate::LockError::is_backend) error within it. A
//! malformed URL gives [`is_invalid`](crate::LockError::is_invalid). Locks taken without a
//! fixed lease are renewed by the runtime's watchdog through the extend script; a renewal that
//! finds the key gone or someone else's fires the guard's `lost()`. Connections are managed
//! by the `redis` crate's connection manager, which reconnects after a server restart; locks
//! that vanished with the restart are then reported lost, and new locks work.
//!
//! The background tasks (pub/sub connection, reconnection) run on the tokio runtime that
//! created the backend, and stop when the backend is dropped.
//!
//! # Running Redis for locks
//!
//! - Use a `maxmemory-policy` of `noeviction` (the default) or a `volatile-*` one: evicting a
//!   held lock's key would hand the lock to a second owner, and evicting a fencing counter
//!   (which has no expiry, so `volatile-*` policies never pick it) would let tokens repeat.
//! - With replicas, a failover can lose the last writes: a lock granted just before it may be
//!   granted again, and a token may repeat. Check fencing tokens downstream where that matters.
//!
//! # Cost
//!
//! Measured on one machine against a local `redis-server` (`examples/bench_redis.rs`): a
//! release hands the lock to a task waiting in another process in 0.25 to 0.5 ms (p50, on a
//! busy 2-core machine).
//! Under contention an acquisition costs about 3 commands when the competing tasks share one
//! process (a first attempt that finds the lock held, the attempt after the wake-up, the
//! release), and about one more per other competing process (5 with four processes), however
//! many tasks each process runs.

mod layout;
mod waiters;

use std::sync::{Arc, LazyLock};
use std::time::{Duration, Instant};

use redis::aio::ConnectionManager;
use redis::{FromRedisValue, Script, ScriptInvocation};

pub use layout::{key_slot, KeyLayout};
use waiters::{Joined, Step, Waiters};

use super::{Acquire, Attempt, BoxFuture, Busy, Grant, Held, Lease, LockBackend, Wake};
use crate::error::LockError;
use crate::manager::{LockManager, LockManagerBuilder};

const KIND: &str = "redis";
/// First and longest pause between two failed re-checks of a waiter.
const RECHECK_MIN: Duration = Duration::from_millis(50);
const RECHECK_MAX: Duration = Duration::from_secs(1);

static ACQUIRE: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("acquire.lua")));
static EXTEND: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("extend.lua")));
static RELEASE: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("release.lua")));

/// The default [`RedisOptions::command_timeout`].
pub const DEFAULT_COMMAND_TIMEOUT: Duration = Duration::from_secs(2);
/// The default [`RedisOptions::unsubscribe_after`].
pub const DEFAULT_UNSUBSCRIBE_AFTER: Duration = Duration::from_millis(500);

/// Settings of a [`RedisBackend`].
///
/// ```
/// use std::time::Duration;
/// use lock_runtime::backend::redis::RedisOptions;
///
/// let options = RedisOptions::default().command_timeout(Duration::from_millis(500));
/// assert_eq!(options.get_command_timeout(), Duration::from_millis(500));
/// ```
#[derive(Debug, Clone)]
pub struct RedisOptions {
    command_timeout: Duration,
    unsubscribe_after: Duration,
}

impl Default for RedisOptions {
    fn default() -> Self {
        RedisOptions { command_timeout: DEFAULT_COMMAND_TIMEOUT, unsubscribe_after: DEFAULT_UNSUBSCRIBE_AFTER }
    }
}

impl RedisOptions {
    /// The longest any single Redis command (a script call, a connection attempt, a
    /// (un)subscription) may take; past it the operation fails with an
    /// [`is_backend`](crate::LockError::is_backend) error. Default [`DEFAULT_COMMAND_TIMEOUT`].
    /// Keep it well under the leases you use, so the watchdog can retry a renewal in time.
    pub fn command_timeout(mut self, timeout: Duration) -> Self {
        self.command_timeout = timeout;
        self
    }

    /// How long a lock's release channel stays subscribed after the last local waiter left
    /// (so steady contention does not resubscribe on every hand-off). Default
    /// [`DEFAULT_UNSUBSCRIBE_AFTER`].
    pub fn unsubscribe_after(mut self, grace: Duration) -> Self {
        self.unsubscribe_after = grace;
        self
    }

    /// The configured command timeout.
    pub fn get_command_timeout(&self) -> Duration {
        self.command_timeout
    }

    /// The configured unsubscription grace period.
    pub fn get_unsubscribe_after(&self) -> Duration {
        self.unsubscribe_after
    }
}

/// Locks in Redis. Cheap to clone: clones share the connections.
///
/// Create it with [`RedisBackend::connect`] or [`RedisBackend::connect_with`] and hand it to
/// [`LockManagerBuilder::backend`], or use [`LockManager::redis`] /
/// [`LockManagerBuilder::redis`]. See the [module docs](self) for the protocol.
#[derive(Clone)]
pub struct RedisBackend {
    inner: Arc<Inner>,
}

struct Inner {
    conn: ConnectionManager,
    waiters: Waiters,
    options: RedisOptions,
    url: String,
}

impl std::fmt::Debug for RedisBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisBackend").field("url", &self.inner.url).field("options", &self.inner.options).finish()
    }
}

impl RedisBackend {
    /// Connects to the server at `url` (`redis://[[user]:password@]host[:port][/db]`, or
    /// `redis+unix:///path`) with default [`RedisOptions`].
    ///
    /// A malformed URL is an [`is_invalid`](crate::LockError::is_invalid) error; a server that
    /// cannot be reached within the command timeout is an
    /// [`is_backend`](crate::LockError::is_backend) error.
    pub async fn connect(url: &str) -> Result<Self, LockError> {
        Self::connect_with(url, RedisOptions::default()).await
    }

    /// Connects to the server at `url` with `options`.
    pub async fn connect_with(url: &str, options: RedisOptions) -> Result<Self, LockError> {
        let shown = redact(url);
        if options.command_timeout.is_zero() {
            return Err(LockError::invalid(shown, "the Redis command timeout must be greater than zero"));
        }
        let client = redis::Client::open(url).map_err(|e| {
            LockError::invalid(
                &shown,
                format!(
                    "not a usable Redis URL ({e}); expected e.g. `redis://127.0.0.1:6379`, \
                     `redis://:password@host:6379/0` or `redis+unix:///run/redis.sock`"
                ),
            )
        })?;
        let timeout = options.command_timeout;
        let config = redis::aio::ConnectionManagerConfig::new()
            .set_connection_timeout(Some(timeout))
            .set_response_timeout(Some(timeout))
            .set_min_delay(Duration::from_millis(20))
            .set_max_delay(Duration::from_secs(1));
        let conn = match tokio::time::timeout(timeout, ConnectionManager::new_with_config(client.clone(), config)).await
        {
            Ok(Ok(conn)) => conn,
            Ok(Err(e)) => return Err(LockError::backend(shown, KIND, "connect", e)),
            Err(_) => return Err(LockError::timed_out(shown, KIND, "connect", timeout)),
        };
        let waiters = Waiters::start(client, timeout, options.unsubscribe_after);
        Ok(RedisBackend { inner: Arc::new(Inner { conn, waiters, options, url: shown }) })
    }

    /// The options this backend was created with.
    pub fn options(&self) -> &RedisOptions {
        &self.inner.options
    }

    /// How many release channels are subscribed (or about to be) for local waiters right now,
    /// including those in their [`unsubscribe_after`](RedisOptions::unsubscribe_after) grace.
    pub fn subscribed_channels(&self) -> usize {
        self.inner.waiters.channels()
    }

    async fn eval<T: FromRedisValue>(
        &self,
        name: &str,
        operation: &'static str,
        invocation: ScriptInvocation<'_>,
    ) -> Result<T, LockError> {
        let mut conn = self.inner.conn.clone();
        let timeout = self.inner.options.command_timeout;
        match tokio::time::timeout(timeout, invocation.invoke_async(&mut conn)).await {
            Ok(Ok(value)) => Ok(value),
            Ok(Err(e)) => Err(LockError::backend(name, KIND, operation, e)),
            Err(_) => Err(LockError::timed_out(name, KIND, operation, timeout)),
        }
    }

    async fn pttl(&self, name: &str, key: &str) -> Result<i64, LockError> {
        let mut conn = self.inner.conn.clone();
        let timeout = self.inner.options.command_timeout;
        match tokio::time::timeout(timeout, redis::cmd("PTTL").arg(key).query_async(&mut conn)).await {
            Ok(Ok(value)) => Ok(value),
            Ok(Err(e)) => Err(LockError::backend(name, KIND, "wait for", e)),
            Err(_) => Err(LockError::timed_out(name, KIND, "wait for", timeout)),
        }
    }

    async fn wait_inner(&self, req: &Acquire<'_>, busy: &Busy, deadline: Instant) -> Result<Wake, LockError> {
        let layout = KeyLayout::of(req.key);
        let mut reg = match self.inner.waiters.register(&layout.channel, req.owner, busy.expires_in) {
            Joined::Retry => return Ok(Wake::Retry),
            Joined::Queued(reg) => reg,
        };
        // A failed look at the lock (the server is restarting, say) is retried with backoff
        // while the wait lasts; if the wait runs out meanwhile, the failure is the answer.
        let mut failed: Option<(LockError, Instant, Duration)> = None;
        loop {
            if Instant::now() >= deadline {
                return match failed {
                    Some((e, ..)) => Err(e),
                    None => Ok(Wake::TimedOut),
                };
            }
            let (notify, until) = match reg.step() {
                Step::Retry => return Ok(Wake::Retry),
                Step::Check(notify, until) => match &failed {
                    Some((_, again, _)) if Instant::now() < *again => {
                        (notify, Some(until.map_or(*again, |t| t.min(*again))))
                    }
                    _ => {
                        let sent = Instant::now();
                        match self.pttl(req.name, &layout.lock).await {
                            Ok(-2) => {
                                reg.retry();
                                return Ok(Wake::Retry);
                            }
                            Ok(ms) => {
                                failed = None;
                                reg.checked(sent, u64::try_from(ms).ok().map(Duration::from_millis));
                            }
                            Err(e) => {
                                let backoff = failed.as_ref().map_or(RECHECK_MIN, |f| (f.2 * 2).min(RECHECK_MAX));
                                tracing::debug!(lock = %req.name, error = %e, "re-check failed; again in {backoff:?}");
                                failed = Some((e, Instant::now() + backoff, backoff));
                            }
                        }
                        continue;
                    }
                },
                Step::Sleep(notify, until) => (notify, until),
            };
            let until = until.map_or(deadline, |t| t.min(deadline));
            tokio::select! {
                _ = notify.notified() => {}
                _ = tokio::time::sleep_until(until.into()) => {}
            }
        }
    }
}

/// The URL with any password replaced by `***`, for messages.
fn redact(url: &str) -> String {
    let Some(scheme_end) = url.find("://") else { return url.to_owned() };
    let rest = &url[scheme_end + 3..];
    let authority_end = rest.find('/').unwrap_or(rest.len());
    match rest[..authority_end].rfind('@') {
        Some(at) => {
            let userinfo = &rest[..at];
            let user = userinfo.split(':').next().unwrap_or("");
            let masked = if userinfo.contains(':') { format!("{user}:***") } else { "***".to_owned() };
            format!("{}{}{}", &url[..scheme_end + 3], masked, &rest[at..])
        }
        None => url.to_owned(),
    }
}

fn lease_millis(lease: Duration) -> u64 {
    u64::try_from(lease.as_millis()).unwrap_or(u64::MAX).max(1)
}

fn lost_reason(status: i64) -> &'static str {
    if status == 0 {
        "its Redis key is gone: the lease ran out, or the key was deleted"
    } else {
        "its Redis key now holds another owner"
    }
}

impl LockBackend for RedisBackend {
    fn kind(&self) -> &'static str {
        KIND
    }

    fn try_acquire<'a>(&'a self, req: &'a Acquire<'a>) -> BoxFuture<'a, Result<Attempt, LockError>> {
        Box::pin(async move {
            let layout = KeyLayout::of(req.key);
            let lease = req.lease.duration();
            let sent = Instant::now();
            let mut invocation = ACQUIRE.prepare_invoke();
            invocation.key(&layout.lock).key(&layout.fence).arg(req.owner.to_string()).arg(lease_millis(lease));
            let (status, value): (i64, i64) = self.eval(req.name, "acquire", invocation).await?;
            if status == 1 {
                let fencing_token = u64::try_from(value).map_err(|_| {
                    LockError::backend(&**req.name, KIND, "acquire", format!("the fencing counter returned {value}"))
                })?;
                self.inner.waiters.note_acquired(&layout.channel, req.owner, sent.checked_add(lease));
                Ok(Attempt::Acquired(Grant {
                    fencing_token,
                    needs_renewal: matches!(req.lease, Lease::Renewed(_)),
                    tag: None,
                    granted_at: Some(sent),
                }))
            } else {
                self.inner.waiters.note_busy(&layout.channel, req.owner, sent);
                let expires_in = u64::try_from(value).ok().map(Duration::from_millis);
                Ok(Attempt::Busy(Busy { expires_in }))
            }
        })
    }

    fn wait<'a>(
        &'a self,
        req: &'a Acquire<'a>,
        busy: &'a Busy,
        deadline: Instant,
    ) -> BoxFuture<'a, Result<Wake, LockError>> {
        Box::pin(self.wait_inner(req, busy, deadline))
    }

    fn extend<'a>(&'a self, held: &'a Held, lease: Duration) -> BoxFuture<'a, Result<(), LockError>> {
        Box::pin(async move {
            let layout = KeyLayout::of(&held.key);
            let mut invocation = EXTEND.prepare_invoke();
            invocation.key(&layout.lock).arg(held.owner.to_string()).arg(lease_millis(lease));
            match self.eval::<i64>(&held.name, "extend", invocation).await? {
                1 => Ok(()),
                status => Err(LockError::lost(&*held.name, lost_reason(status))),
            }
        })
    }

    fn release<'a>(&'a self, held: &'a Held) -> BoxFuture<'a, Result<(), LockError>> {
        Box::pin(async move {
            let layout = KeyLayout::of(&held.key);
            let mut invocation = RELEASE.prepare_invoke();
            invocation.key(&layout.lock).key(&layout.channel).arg(held.owner.to_string());
            match self.eval::<i64>(&held.name, "release", invocation).await? {
                1 => Ok(()),
                status => Err(LockError::lost(&*held.name, lost_reason(status))),
            }
        })
    }

    fn operation_timeout(&self) -> Duration {
        // A little over the command bound, so the backend's own (more precise) error wins.
        self.inner.options.command_timeout + Duration::from_millis(250)
    }
}

impl LockManager {
    /// A manager on the Redis server at `url`, with default settings; same as
    /// `LockManager::builder().redis(url).await`. Feature `redis`.
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), lock_runtime::LockError> {
    /// let manager = lock_runtime::LockManager::redis("redis://127.0.0.1:6379").await?;
    /// let guard = manager.lock("order:42").await?;
    /// guard.release().await?;
    /// # Ok(()) }
    /// ```
    pub async fn redis(url: impl AsRef<str>) -> Result<LockManager, LockError> {
        LockManager::builder().redis(url).await
    }
}

impl LockManagerBuilder {
    /// A manager on the Redis server at `url` (see [`RedisBackend::connect`]). Feature `redis`.
    /// For a custom command timeout, use [`RedisBackend::connect_with`] and
    /// [`backend`](LockManagerBuilder::backend).
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), lock_runtime::LockError> {
    /// let manager = lock_runtime::LockManager::builder().prefix("myapp:").redis("redis://127.0.0.1:6379").await?;
    /// # Ok(()) }
    /// ```
    pub async fn redis(self, url: impl AsRef<str>) -> Result<LockManager, LockError> {
        Ok(self.backend(RedisBackend::connect(url.as_ref()).await?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_are_redacted() {
        assert_eq!(redact("redis://:secret@host:6379/0"), "redis://:***@host:6379/0");
        assert_eq!(redact("redis://user:secret@host"), "redis://user:***@host");
        assert_eq!(redact("redis://host:6379"), "redis://host:6379");
        assert_eq!(redact("nonsense"), "nonsense");
    }

    #[test]
    fn scripts_state_their_interface() {
        for src in [include_str!("acquire.lua"), include_str!("extend.lua"), include_str!("release.lua")] {
            assert!(src.contains("KEYS[1]") && src.contains("ARGV[1]") && src.contains("Returns"));
        }
    }
}
