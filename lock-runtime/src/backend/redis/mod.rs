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
//! On a Redis Cluster, the same protocol runs through [`RedisBackend::cluster`] /
//! [`LockManager::redis_cluster`](crate::LockManager::redis_cluster): see the [cluster module docs](cluster) for routing,
//! pub/sub across nodes, failover and resharding.
//! For one lock over several independent primaries (Redlock, with strictly increasing fencing
//! tokens across quorums), see [`RedlockBackend`] and the [`redlock`] module.
//!
//! # Protocol
//!
//! - **Acquire, extend, release and a waiter's look at the lock** are atomic Lua scripts
//!   (`acquire.lua`, `extend.lua`, `release.lua`, `watch.lua` beside this file, each stating
//!   its keys, arguments and answers), sent by SHA (`EVALSHA`) and loaded again transparently
//!   when the server answers `NOSCRIPT` (after a restart or `SCRIPT FLUSH`).
//! - **The lock** is a string key `<owner>#<token>#<granted ms>` with a `PX` lease, set only
//!   when the key is absent, followed by `+` once someone waits for it (see *Waiting*). The
//!   owner is `<owner id>@<holder>`: the acquisition's unique [`OwnerId`](super::OwnerId) and
//!   the process that took it ([`Holder`](super::Holder): host, pid and the manager's label);
//!   then the lock's fencing token and the server's clock at the grant, in milliseconds. So an
//!   operator (or `lockctl`, through [`RedisBackend::list`] / [`RedisBackend::inspect`]) sees
//!   who holds a lock, since when and with which token; about 80 bytes per held lock. Extend
//!   and release act only when the value still starts with the caller's owner and `#`;
//!   otherwise the caller learns that the lock was lost
//!   ([`LockError::is_lost`](crate::LockError::is_lost)). An operator can free a lock whose
//!   holder is gone with [`RedisBackend::force_release`] (`force_release.lua`): its waiters
//!   are woken, and the holder's next renewal reports it lost.
//! - **Fencing tokens** are minted by the acquire script itself (no extra round trip): one
//!   above the counter of the lock's Redis Cluster hash slot (see [`KeyLayout`]), and never
//!   below the server's clock (`TIME`) in microseconds. Tokens therefore strictly increase per
//!   name, and keep doing so when the counter is lost with the data (a restart without
//!   persistence, `FLUSHALL`, eviction, a failover to a replica that had not received it): the
//!   first token afterwards is above every earlier one, so a fenced store refuses the stale
//!   holder and accepts the new one. What remains: data loss *and* a server clock set back
//!   past the earlier tokens together can repeat a token. The keys left behind stay bounded
//!   (at most 16,384 counters, however many names were ever locked).
//! - **Key layout** puts a lock's key, channel and counter in one hash slot, ready for Redis
//!   Cluster: see [`KeyLayout`].
//! - **Read-write locks and semaphores** ([`LockKind`]) live in their own
//!   namespaces, `lock:rw:{<key>}` and `lock:sem:{<key>}` (same hash tag, so same slot and
//!   same fencing counter as the mutex of that name): a hash of the holders, each with its own
//!   expiry (server's clock), token, lease and watchdog renewal, pruned by every script (a
//!   crashed holder blocks nobody past its lease, and the key expires with its last entry);
//!   the intents of waiting writers, which keep new readers out in every process (no writer
//!   starvation) and expire with the writer's lease unless its attempts renew them; and a
//!   semaphore's `permits`, which a request with another number is refused against
//!   ([`is_invalid`](crate::LockError::is_invalid)). Scripts `kind_acquire.lua`,
//!   `kind_release.lua`, `kind_extend.lua`; waiting as for the mutex (local queue, pub/sub
//!   wake-ups published when the state is marked waited on, bounded by the earliest expiry in
//!   the way). [`RedisBackend::list`] and [`RedisBackend::inspect`] show mutexes only.
//! - **Acquisitions own their state.** Each `lock()` call is one acquisition object that owns
//!   its place in the local queue and any acquire request in flight, until it is granted the
//!   lock or dropped. Dropped at any point (its future cancelled, its call timed out client
//!   side), it leaves the queue and passes on a wake-up it was given; if an acquire it sent
//!   was never answered, a background task undoes it with an owner-checked release (bounded by
//!   the command timeout, logged if it fails), so no lock is left held for an owner nobody
//!   knows. An acquire that finds its own owner id in the key (an earlier answer of the same
//!   acquisition was lost) is granted again.
//! - **A release runs to its end.** A release (or `hold_at_least` release) whose future is
//!   dropped before its answer (a `select!` or timeout of the caller gave up) finishes in the
//!   background, bounded by the command timeout, and local waiters are told: the lock is not
//!   left held until its lease ends. The scripts stay owner-checked, so a release that lands
//!   late never touches a later owner's lock.
//!
//! # Waiting
//!
//! - **Release publishes only when someone waits.** An attempt that finds the lock held marks
//!   its value as waited on (a `+` after the owner id) in the same atomic step, and so does a
//!   waiter's look at the lock (`watch.lua`); the release script publishes the owner id on the
//!   lock's channel only for a marked value. A release either comes before that step (the
//!   attempt takes the lock, the look finds it free) or after it (and is announced). An
//!   uncontended lock/release cycle publishes nothing.
//! - **Local FIFO.** Tasks of one process waiting for the same lock queue locally, and a new
//!   request that finds tasks of its process queued joins the back without an attempt (so it
//!   does not race the woken head; this also applies to `try_lock`, which then reports the
//!   lock held). Only the head is woken: a release costs one attempt per process however many
//!   tasks wait. A release made through this backend wakes the local head directly (no
//!   pub/sub round trip, no mark needed); one made elsewhere wakes it through the channel.
//! - **No lost wake-ups.** The woken head keeps its place at the front during its attempt; a
//!   release observed while its attempt is in flight makes it attempt again at once if that
//!   attempt found the lock held; a head dropped or failed while woken wakes the next one. A
//!   release announced while nobody of this process was queued is counted, so an attempt in
//!   flight at that moment that finds the lock held is woken at once.
//! - **Subscriptions.** Each backend keeps **one** pub/sub connection; a channel is subscribed
//!   while some task of this process waits for its lock, and unsubscribed
//!   [`unsubscribe_after`](RedisOptions::unsubscribe_after) nobody does. Once a subscription
//!   is confirmed, the head looks at the lock once (a release may have come before it). The
//!   connection is pinged every [`ping_interval`](RedisOptions::ping_interval); a ping not
//!   answered within the command timeout (a connection that died silently), or a dropped
//!   connection (a server restart, `CLIENT KILL TYPE pubsub`), makes it reconnect, resubscribe,
//!   and the heads look at the lock again. A waiter's failed look or attempt (the server
//!   restarting, a failover under way) is retried with backoff (50 ms doubling to 1 s) while its
//!   `wait` lasts, so a waiter rides out an outage and is granted once the server is back; if
//!   its wait runs out first, the outage's [`is_backend`](crate::LockError::is_backend) error is
//!   its answer. A *first* attempt that fails ends the `lock()` call at once with that error, so
//!   a server that is down is reported without delay (and fallbacks run).
//! - **Leases.** A holder that crashed publishes nothing, so the head also wakes when the
//!   holder's remaining lease runs out: a lost notification never strands a waiter beyond that
//!   lease.
//! - **Lease ends are counted by the server's clock.** A lease is sent as a duration and set
//!   with `PX`/`PEXPIRE`; the server expires the key on its own clock, so the clocks of the
//!   holders and waiters never need to agree (a waiter sleeps for the `PTTL` it was told).
//! - **`hold_at_least`.** A holder that lets go before its `hold_at_least` has passed runs
//!   `release_after.lua` instead of the release: the key's expiry is set to the
//!   remainder (a duration, counted by the server) instead of deleting it, owner-checked, and
//!   the owner id is published when the value is marked waited on, so that waiters look again
//!   and sleep for the new `PTTL` (they attempt when it runs out). The stored value is
//!   unchanged.
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
//! The background tasks (pub/sub connection, reconnection, the cleanup of dropped
//! acquisitions and the rest of dropped releases) run on the tokio runtime that created the backend, and stop when the backend
//! is dropped (a cleanup already started finishes within the command timeout).
//!
//! # Running Redis for locks
//!
//! - Use a `maxmemory-policy` of `noeviction` (the default) or a `volatile-*` one: evicting a
//!   held lock's key would hand the lock to a second owner (the counters have no expiry, so
//!   `volatile-*` policies never pick them; were one evicted, tokens would still increase).
//! - With replicas, a failover can lose the last writes: a lock granted just before it may be
//!   granted again while its first holder still believes it holds. Tokens still increase (see
//!   above): check them downstream where that matters. See GUARANTEES.md in the repository.
//! - To follow a Sentinel-managed primary across failovers, and to have grants wait for
//!   replicas ([`RedisOptions::wait_for_replicas`]), see [`sentinel`].
//!
//! # Cost
//!
//! An uncontended lock/release cycle is two script calls: acquire (`GET`, `TIME`, the counter, `SET PX`) and
//! release (`GET` + `DEL`), seven server commands, nothing published. Under contention, when
//! the competing tasks share one process, an acquisition costs the same two calls (a new
//! request queues behind the local waiters without an attempt, and a release wakes the head
//! directly); each other competing process adds about one attempt per acquisition (its
//! woken head racing), and a release then publishes. Measured with `examples/bench_redis.rs`
//! against a local `redis-server` on a busy 2-core machine: a release hands the lock to a task
//! waiting in another process, or in the same one, in 0.3 to 0.4 ms (p50; p99 0.6 to 2 ms,
//! more when other work competes for the cores); 8 tasks of one process cost 2.0 script calls
//! per acquisition, and 4 processes of 8 tasks each 4.3; 16 tasks of one process on one lock
//! hand it over 7,500 to 11,000 times a second, every acquisition a hand-off, with fairness
//! 1.00 (fewest over most acquisitions per task).

pub mod cluster;
mod inspect;
mod kinds;
mod layout;
mod pubsub;
pub mod redlock;
pub mod sentinel;
mod topology;
mod waiters;

use std::future::Future;
use std::sync::{Arc, LazyLock};
use std::time::{Duration, Instant};

use redis::aio::ConnectionManager;
use redis::{FromRedisValue, Script, ScriptInvocation};

pub use inspect::Changes;
pub use layout::{key_slot, KeyLayout};
pub use redlock::RedlockBackend;
use topology::{Conn, Source};
use waiters::{Before, Capture, Outage, Slot, Step, Timings, Waiters};

use super::LockKind;
use super::{Acquire, Acquisition, Attempt, BoxFuture, Grant, Held, HeldLock, LockBackend, Renewal, Wake};
use crate::error::LockError;

const KIND: &str = "redis";
/// The largest accepted [`RedisOptions`] duration.
const MAX_OPTION: Duration = Duration::from_secs(3600);

static ACQUIRE: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("acquire.lua")));
static EXTEND: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("extend.lua")));
static RELEASE: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("release.lua")));
static RELEASE_AFTER: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("release_after.lua")));
static WATCH: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("watch.lua")));
static FORCE_RELEASE: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("force_release.lua")));

/// The default [`RedisOptions::command_timeout`].
pub const DEFAULT_COMMAND_TIMEOUT: Duration = Duration::from_secs(2);
/// The default [`RedisOptions::unsubscribe_after`].
pub const DEFAULT_UNSUBSCRIBE_AFTER: Duration = Duration::from_millis(500);
/// The default [`RedisOptions::ping_interval`].
pub const DEFAULT_PING_INTERVAL: Duration = Duration::from_secs(5);

/// Settings of a [`RedisBackend`], checked by [`RedisBackend::connect_with`]: every duration
/// must be at most one hour, and the command timeout and ping interval greater than zero
/// (otherwise the connection fails with an [`is_invalid`](crate::LockError::is_invalid) error).
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
    ping_interval: Duration,
    wait_for_replicas: Option<(usize, Duration)>,
}

impl Default for RedisOptions {
    fn default() -> Self {
        RedisOptions {
            command_timeout: DEFAULT_COMMAND_TIMEOUT,
            unsubscribe_after: DEFAULT_UNSUBSCRIBE_AFTER,
            ping_interval: DEFAULT_PING_INTERVAL,
            wait_for_replicas: None,
        }
    }
}

impl RedisOptions {
    /// The longest any single Redis command (a script call, a connection attempt, a
    /// (un)subscription, a ping of the pub/sub connection) may take; past it the operation
    /// fails with an [`is_backend`](crate::LockError::is_backend) error. Default
    /// [`DEFAULT_COMMAND_TIMEOUT`]; greater than zero and at most one hour. Keep it well under
    /// the leases you use, so the watchdog can retry a renewal in time.
    pub fn command_timeout(mut self, timeout: Duration) -> Self {
        self.command_timeout = timeout;
        self
    }

    /// How long a lock's release channel stays subscribed after the last local waiter left
    /// (so steady contention does not resubscribe on every hand-off). Default
    /// [`DEFAULT_UNSUBSCRIBE_AFTER`]; at most one hour.
    pub fn unsubscribe_after(mut self, grace: Duration) -> Self {
        self.unsubscribe_after = grace;
        self
    }

    /// How often the pub/sub connection is pinged. A ping not answered within the command
    /// timeout drops the connection (it may have died silently, e.g. in a network partition)
    /// and a new one is made and subscribed. Default [`DEFAULT_PING_INTERVAL`]; greater than
    /// zero and at most one hour.
    pub fn ping_interval(mut self, interval: Duration) -> Self {
        self.ping_interval = interval;
        self
    }

    /// After each granted mutex acquisition and each renewal, wait until `replicas` replicas
    /// acknowledged it (`WAIT`), at most `timeout`; a grant short of replicas is undone and
    /// refused with an [`is_backend`](crate::LockError::is_backend) error. For a primary with
    /// replicas (one server, or [Sentinel](RedisBackend::sentinel)); see the
    /// [sentinel docs](sentinel) for what it buys and what not, and what it costs. `replicas`
    /// at least one, `timeout` greater than zero and less than the command timeout. Not set
    /// by default. Mutexes (and `lock_all`) only: read-write locks and semaphores do not wait.
    /// Not for a Redis Cluster (each slot's primary has its own replicas).
    ///
    /// ```
    /// use std::time::Duration;
    /// use lock_runtime::backend::redis::RedisOptions;
    ///
    /// let options = RedisOptions::default().wait_for_replicas(1, Duration::from_millis(500));
    /// assert_eq!(options.get_wait_for_replicas(), Some((1, Duration::from_millis(500))));
    /// ```
    pub fn wait_for_replicas(mut self, replicas: usize, timeout: Duration) -> Self {
        self.wait_for_replicas = Some((replicas, timeout));
        self
    }

    /// The configured [`wait_for_replicas`](Self::wait_for_replicas), if any.
    pub fn get_wait_for_replicas(&self) -> Option<(usize, Duration)> {
        self.wait_for_replicas
    }

    /// The configured command timeout.
    pub fn get_command_timeout(&self) -> Duration {
        self.command_timeout
    }

    /// The configured unsubscription grace period.
    pub fn get_unsubscribe_after(&self) -> Duration {
        self.unsubscribe_after
    }

    /// The configured ping interval of the pub/sub connection.
    pub fn get_ping_interval(&self) -> Duration {
        self.ping_interval
    }

    /// Why these options cannot be used, if they cannot.
    fn problem(&self) -> Option<String> {
        let check = |what: &str, d: Duration, zero_ok: bool| {
            if d.is_zero() && !zero_ok {
                Some(format!("the Redis {what} must be greater than zero"))
            } else if d > MAX_OPTION {
                Some(format!("the Redis {what} must be at most one hour (got {d:?})"))
            } else {
                None
            }
        };
        check("command timeout", self.command_timeout, false)
            .or_else(|| check("unsubscribe_after grace period", self.unsubscribe_after, true))
            .or_else(|| check("ping interval", self.ping_interval, false))
            .or_else(|| match self.wait_for_replicas {
                Some((0, _)) => Some("wait_for_replicas needs at least one replica".to_owned()),
                Some((_, t)) if t.is_zero() || t >= self.command_timeout => Some(format!(
                    "the wait_for_replicas timeout must be greater than zero and less than the command timeout \
                     ({:?}; got {t:?})",
                    self.command_timeout
                )),
                _ => None,
            })
    }
}

/// Locks in Redis. Cheap to clone: clones share the connections.
///
/// Create it with [`RedisBackend::connect`] or [`RedisBackend::connect_with`] and hand it to
/// [`LockManagerBuilder::backend`](crate::LockManagerBuilder::backend), or use [`LockManager::redis`](crate::LockManager::redis) /
/// [`LockManagerBuilder::redis`](crate::LockManagerBuilder::redis). See the [module docs](self) for the protocol.
#[derive(Clone)]
pub struct RedisBackend {
    inner: Arc<Inner>,
}

struct Inner {
    conn: Conn,
    /// Where pub/sub connections are made (the waiters', inspection tools' subscriptions).
    source: Source,
    waiters: Waiters,
    options: RedisOptions,
    url: String,
    /// Where the cleanup of dropped acquisitions and the rest of dropped releases run.
    runtime: tokio::runtime::Handle,
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

    /// Connects to the server at `url` with `options`. Options out of range (see
    /// [`RedisOptions`]) are an [`is_invalid`](crate::LockError::is_invalid) error.
    pub async fn connect_with(url: &str, options: RedisOptions) -> Result<Self, LockError> {
        let shown = redact(url);
        if let Some(problem) = options.problem() {
            return Err(LockError::invalid(shown, problem));
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
        let runtime = tokio::runtime::Handle::try_current()
            .map_err(|e| LockError::invalid(&shown, format!("the Redis backend needs a tokio runtime ({e})")))?;
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
        Ok(Self::from_parts(Conn::Single(conn), Source::Single(client), options, shown, &runtime))
    }

    /// A backend on `conn` and `source`, whatever the topology behind them.
    fn from_parts(
        conn: Conn,
        source: Source,
        options: RedisOptions,
        url: String,
        runtime: &tokio::runtime::Handle,
    ) -> Self {
        let timings =
            Timings { timeout: options.command_timeout, grace: options.unsubscribe_after, ping: options.ping_interval };
        let waiters = Waiters::start(runtime, source.clone(), timings);
        RedisBackend { inner: Arc::new(Inner { conn, source, waiters, options, url, runtime: runtime.clone() }) }
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

    /// How many acquisitions of this backend wait in its local queues right now, all locks
    /// together (for tests and metrics).
    pub fn local_waiters(&self) -> usize {
        self.inner.waiters.queued()
    }

    async fn eval<T: FromRedisValue>(
        &self,
        name: &str,
        operation: &'static str,
        invocation: ScriptInvocation<'_>,
    ) -> Result<T, LockError> {
        eval(&self.inner.conn, self.inner.options.command_timeout, name, operation, invocation).await
    }

    /// `script` and then `WAIT <replicas> <timeout>` in one pipeline, so both go on the same
    /// connection and the `WAIT` covers the script's writes: the script's answer and how many
    /// replicas acknowledged.
    async fn eval_then_wait<T: FromRedisValue>(
        &self,
        name: &str,
        operation: &'static str,
        (script, keys, args): (&Script, &[&str], &[&str]),
        (replicas, timeout): (usize, Duration),
    ) -> Result<(T, usize), LockError> {
        let mut evalsha = redis::cmd("EVALSHA");
        evalsha.arg(script.get_hash()).arg(keys.len()).arg(keys).arg(args);
        let mut pipe = redis::pipe();
        pipe.add_command(evalsha).cmd("WAIT").arg(replicas).arg(lease_millis(timeout));
        let mut conn = self.inner.conn.clone();
        let map = |e: redis::RedisError| {
            if e.is_timeout() {
                LockError::timed_out(name, KIND, operation, self.inner.options.command_timeout)
            } else {
                LockError::backend(name, KIND, operation, e)
            }
        };
        match pipe.query_async(&mut conn).await {
            Err(e) if e.code() == Some("NOSCRIPT") || e.to_string().contains("NOSCRIPT") => {
                script.load_async(&mut conn).await.map_err(map)?;
                pipe.query_async(&mut conn).await.map_err(map)
            }
            outcome => outcome.map_err(map),
        }
    }

    fn grant(&self, req: &Acquire, layout: &KeyLayout, owner: &Arc<str>, token: i64, sent: Instant) -> Grant {
        let lock = RedisHeld {
            backend: self.clone(),
            name: req.name.clone(),
            lock: layout.lock.as_str().into(),
            channel: layout.channel.as_str().into(),
            owner: owner.clone(),
        };
        Grant { fencing_token: u64::try_from(token).unwrap_or(0), granted_at: Some(sent), lock: Held::new(lock) }
    }
}

/// `fut` bounded by `timeout`: past it, a timed-out `operation` error of lock `name`.
async fn bounded<T>(
    name: &str,
    operation: &'static str,
    timeout: Duration,
    fut: impl Future<Output = Result<T, LockError>>,
) -> Result<T, LockError> {
    tokio::time::timeout(timeout, fut)
        .await
        .unwrap_or_else(|_| Err(LockError::timed_out(name, KIND, operation, timeout)))
}

/// One script call. The connection's response timeout (the command timeout) bounds it; no
/// timer of its own (the runtime bounds every operation as well).
async fn eval<T: FromRedisValue>(
    conn: &Conn,
    timeout: Duration,
    name: &str,
    operation: &'static str,
    invocation: ScriptInvocation<'_>,
) -> Result<T, LockError> {
    let mut conn = conn.clone();
    match invocation.invoke_async(&mut conn).await {
        Ok(value) => Ok(value),
        Err(e) if e.is_timeout() => Err(LockError::timed_out(name, KIND, operation, timeout)),
        Err(e) => Err(LockError::backend(name, KIND, operation, e)),
    }
}

/// One `lock()` call on Redis: owns its place in the local queue (once it has one) and any
/// acquire request in flight. Dropped, it leaves the queue (passing on a wake-up it was given)
/// and undoes an acquire whose answer it never saw with an owner-checked release.
struct RedisAcquisition {
    backend: RedisBackend,
    req: Acquire,
    layout: KeyLayout,
    owner: Arc<str>,
    slot: Option<Slot>,
    /// An acquire script was sent and its answer not seen: it may hold the lock server-side.
    in_flight: bool,
    /// This waiter's attempts or looks failing (a restart, a failover): retried with backoff.
    outage: Outage,
}

impl RedisAcquisition {
    async fn attempt_inner(&mut self) -> Result<Attempt, LockError> {
        let waiters = &self.backend.inner.waiters;
        let capture = match &self.slot {
            Some(slot) => {
                slot.attempting();
                None
            }
            None => match waiters.before_attempt(&self.layout.channel) {
                Before::Queued(slot) => {
                    // Local FIFO: behind this process's waiters, without racing their head.
                    self.slot = Some(slot);
                    return Ok(Attempt::Busy);
                }
                Before::Attempt(capture) => Some(capture),
            },
        };
        let lease = self.req.lease.duration();
        let sent = crate::clock::now();
        let mut invocation = ACQUIRE.prepare_invoke();
        invocation.key(&self.layout.lock).key(&self.layout.fence).arg(&*self.owner).arg(lease_millis(lease));
        self.in_flight = true;
        let wait = self.backend.inner.options.wait_for_replicas;
        let call = async {
            match wait {
                None => Ok((self.backend.eval(&self.req.name, "acquire", invocation).await?, None)),
                Some(wait) => {
                    let lease = lease_millis(lease).to_string();
                    let script = (
                        &*ACQUIRE,
                        &[self.layout.lock.as_str(), self.layout.fence.as_str()][..],
                        &[&*self.owner, &*lease][..],
                    );
                    let (reply, acked) = self.backend.eval_then_wait(&self.req.name, "acquire", script, wait).await?;
                    Ok((reply, Some(acked)))
                }
            }
        };
        // Bounded here too (a connection being made again may not answer at all), so that the
        // outage is this backend's error, which a waiter waits out below.
        let timeout = self.backend.inner.options.command_timeout;
        let reply: Result<((i64, i64), Option<usize>), LockError> =
            bounded(&self.req.name, "acquire", timeout, call).await;
        let ((status, value), acked) = match (reply, &self.slot) {
            (Ok(reply), _) => {
                self.outage.ended();
                reply
            }
            // A waiter's attempt met an outage (a restart, a failover; the holder's lease may
            // have run out meanwhile): it keeps waiting and tries again with backoff while its
            // wait lasts; if the wait runs out first, this error is its answer. (A first attempt
            // fails the call at once, so a server that is down is reported without delay.)
            (Err(e), Some(slot)) if e.is_backend() => {
                slot.look_failed();
                self.outage.failed(&self.req.name, e);
                return Ok(Attempt::Busy);
            }
            (Err(e), _) => return Err(e),
        };
        self.in_flight = false;
        if status == 1 {
            if value <= 0 {
                // Not ours to keep: undone when this acquisition is dropped.
                self.in_flight = true;
                let why = format!("the fencing counter returned {value}");
                return Err(LockError::backend(&*self.req.name, KIND, "acquire", why));
            }
            if let (Some(acked), Some((replicas, timeout))) = (acked, wait) {
                if acked < replicas {
                    return Err(self.undo_short_grant(acked, replicas, timeout).await);
                }
            }
            let lease_end = sent.checked_add(lease);
            match self.slot.take() {
                Some(slot) => slot.granted(lease_end),
                None => waiters.acquired(&self.layout.channel, lease_end),
            }
            return Ok(Attempt::Acquired(self.backend.grant(&self.req, &self.layout, &self.owner, value, sent)));
        }
        match (&self.slot, capture) {
            (Some(slot), _) => slot.busy(sent, value),
            (None, capture) => {
                let capture = capture.unwrap_or(Capture::NONE);
                self.slot = Some(waiters.busy(&self.layout.channel, capture, sent, value));
            }
        }
        Ok(Attempt::Busy)
    }

    /// Undoes a grant that too few replicas acknowledged (owner-checked; left to `Drop` if
    /// the release fails) and says why it failed.
    async fn undo_short_grant(&mut self, acked: usize, replicas: usize, timeout: Duration) -> LockError {
        let mut invocation = RELEASE.prepare_invoke();
        invocation.key(&self.layout.lock).arg(&*self.owner).arg(&self.layout.channel);
        // Held until undone: dropped meanwhile (or the release failing), `Drop` undoes it.
        self.in_flight = true;
        if self.backend.eval::<i64>(&self.req.name, "release", invocation).await.is_ok() {
            self.in_flight = false;
            self.backend.inner.waiters.released(&self.layout.channel, &self.owner);
        }
        let why = format!(
            "only {acked} of the {replicas} required replica(s) acknowledged the grant within {timeout:?} \
             (wait_for_replicas), so it was undone: check the replicas (`INFO replication`), or lower \
             wait_for_replicas / raise its timeout"
        );
        LockError::backend(&*self.req.name, KIND, "acquire", why)
    }

    async fn wait_inner(&mut self, deadline: Instant) -> Result<Wake, LockError> {
        let Some(slot) = &self.slot else { return Ok(Wake::Retry) };
        let deadline_sleep = tokio::time::sleep_until(deadline.into());
        tokio::pin!(deadline_sleep);
        // A failed look at the lock or attempt (the server is restarting, say) is retried with
        // backoff while the wait lasts; if the wait runs out meanwhile, the failure is the answer.
        loop {
            if crate::clock::now() >= deadline {
                return self.outage.timed_out();
            }
            let step = slot.step();
            if let (Step::Attempt | Step::Check, Some(again)) = (&step, self.outage.backoff_until()) {
                // Not before the backoff has passed (a notification may wake it earlier).
                slot.back_off(again.min(deadline)).await;
                continue;
            }
            let (notify, until) = match step {
                Step::Attempt => return Ok(Wake::Retry),
                Step::Check => {
                    let sent = crate::clock::now();
                    let mut invocation = WATCH.prepare_invoke();
                    invocation.key(&self.layout.lock);
                    let look = self.backend.eval::<i64>(&self.req.name, "wait for", invocation);
                    let outcome = tokio::select! {
                        outcome = look => outcome,
                        _ = &mut deadline_sleep => continue,
                    };
                    match outcome {
                        Ok(-2) => {
                            self.outage.ended();
                            slot.free();
                            return Ok(Wake::Retry);
                        }
                        Ok(pttl) => {
                            self.outage.ended();
                            slot.busy(sent, pttl);
                        }
                        Err(e) => {
                            slot.look_failed();
                            self.outage.failed(&self.req.name, e);
                        }
                    }
                    continue;
                }
                Step::Sleep(notify, until) => (notify, until),
            };
            let wake_at = until.map_or(deadline, |t| t.min(deadline));
            tokio::select! {
                _ = notify.notified() => {}
                _ = tokio::time::sleep_until(wake_at.into()) => {}
            }
        }
    }
}

impl Acquisition for RedisAcquisition {
    fn attempt(&mut self) -> BoxFuture<'_, Result<Attempt, LockError>> {
        Box::pin(self.attempt_inner())
    }

    fn wait(&mut self, deadline: Instant) -> BoxFuture<'_, Result<Wake, LockError>> {
        Box::pin(self.wait_inner(deadline))
    }
}

impl Drop for RedisAcquisition {
    fn drop(&mut self) {
        // Leave the queue first: a wake-up this acquisition held goes to the next waiter now.
        drop(self.slot.take());
        if !self.in_flight {
            return;
        }
        // An acquire whose answer was never seen may have taken the lock: undo it (only if it
        // did: the release is owner-checked). Local waiters are told when it was undone (or may
        // have been), not when the lock is someone else's: that holder's release tells them.
        let (lock, channel) = (std::mem::take(&mut self.layout.lock), std::mem::take(&mut self.layout.channel));
        let call = ReleaseCall::new(&self.backend, &RELEASE, &self.req.name, lock.into(), channel.into(), &self.owner);
        undo_dropped(call, false);
    }
}

/// One owner-checked release script call (`release.lua`, `release_after.lua`,
/// `kind_release.lua`): key a lock's key (or a kind's state), arguments the owner, where the
/// script takes one a number of milliseconds, and the release channel.
pub(super) struct ReleaseCall {
    backend: RedisBackend,
    script: &'static Script,
    name: Arc<str>,
    key: Arc<str>,
    channel: Arc<str>,
    owner: Arc<str>,
    millis: Option<u64>,
}

impl ReleaseCall {
    pub(super) fn new(
        backend: &RedisBackend,
        script: &'static Script,
        name: &Arc<str>,
        key: Arc<str>,
        channel: Arc<str>,
        owner: &Arc<str>,
    ) -> Self {
        ReleaseCall {
            backend: backend.clone(),
            script,
            name: name.clone(),
            key,
            channel,
            owner: owner.clone(),
            millis: None,
        }
    }

    /// The script's number of milliseconds (before the channel).
    pub(super) fn millis(mut self, millis: u64) -> Self {
        self.millis = Some(millis);
        self
    }

    /// Sends the script; its answer.
    async fn call(&self) -> Result<i64, LockError> {
        let mut invocation = self.script.prepare_invoke();
        invocation.key(&*self.key).arg(&*self.owner);
        if let Some(millis) = self.millis {
            invocation.arg(millis);
        }
        invocation.arg(&*self.channel);
        self.backend.eval::<i64>(&self.name, "release", invocation).await
    }

    /// Tells the local queue of the lock that its holder let go (or may have).
    fn tell(&self) {
        self.backend.inner.waiters.released(&self.channel, &self.owner);
    }

    /// [`call`](Self::call) bounded by the command timeout, for work nobody awaits.
    async fn call_bounded(&self) -> Result<i64, LockError> {
        bounded(&self.name, "release", self.backend.inner.options.command_timeout, self.call()).await
    }

    /// A holder's release: `Ok` when the script found the lock still the owner's. Local
    /// waiters are told however it ends. Dropped before its answer (the caller's `select!` or
    /// timeout gave up), it still completes in the background: see [`Unabandoned`].
    pub(super) fn release(self) -> BoxFuture<'static, Result<(), LockError>> {
        let runtime = self.backend.inner.runtime.clone();
        let timeout = self.backend.inner.options.command_timeout;
        let name = self.name.clone();
        let release = Box::pin(async move {
            let _tell = Tell(&self);
            still_held(&self.name, self.call().await?)
        });
        Box::pin(Unabandoned { release: Some(release), runtime, timeout, name })
    }
}

/// Tells local waiters of a [`ReleaseCall`] when dropped: completed, failed or abandoned.
struct Tell<'a>(&'a ReleaseCall);

impl Drop for Tell<'_> {
    fn drop(&mut self) {
        self.0.tell();
    }
}

/// Undoes, in the background, what a dropped acquisition may have left in Redis (an acquire
/// whose answer it never saw, a waiting writer's intent) with an owner-checked release
/// script, bounded by the command timeout. Local waiters are told when something was undone
/// or may have been (the call failed), and whatever the answer when `always_tell`.
pub(super) fn undo_dropped(call: ReleaseCall, always_tell: bool) {
    let runtime = call.backend.inner.runtime.clone();
    let undo = async move {
        let shown = crate::telemetry::shown_name(&call.name);
        match call.call_bounded().await {
            Ok(1) => {
                tracing::debug!(lock = %shown, "undid what a dropped acquisition left");
                call.tell();
            }
            Ok(_) if !always_tell => {}
            Ok(_) => call.tell(),
            Err(e) => {
                tracing::warn!(lock = %shown, error = %crate::telemetry::shown_error(&e), "could not undo what a dropped acquisition left; its lease will");
                call.tell();
            }
        }
    };
    finish_in_background(&runtime, undo, "could not undo what a dropped acquisition left; its lease will");
}

/// Runs `work` to its end though nobody awaits it any more. Polled once here, so that its
/// command is queued on the connection now: behind the commands it follows up on, and ahead
/// of any command sent after this call (a `try_lock` made right after a dropped acquisition or
/// release finds the lock free). The rest runs on `runtime`. `failed` is logged when it cannot
/// even be polled (its runtime shuts down, say).
fn finish_in_background(
    runtime: &tokio::runtime::Handle,
    work: impl Future<Output = ()> + Send + 'static,
    failed: &'static str,
) {
    let mut work = Box::pin(work);
    if std::thread::panicking() {
        drop(runtime.spawn(work)); // no polling here while unwinding
        return;
    }
    let _entered = runtime.enter();
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| work.as_mut().poll(&mut cx))) {
        Ok(std::task::Poll::Pending) => drop(runtime.spawn(work)),
        Ok(std::task::Poll::Ready(())) => {}
        Err(_) => tracing::warn!("{failed}"),
    }
}

/// A holder's release that completes even when its future is dropped before the answer: the
/// rest runs in the background (polled once at the drop, then spawned on the backend's
/// runtime), bounded by the command timeout; the script stays owner-checked, so a release
/// that lands late never touches a later owner's lock.
struct Unabandoned {
    release: Option<BoxFuture<'static, Result<(), LockError>>>,
    runtime: tokio::runtime::Handle,
    timeout: Duration,
    name: Arc<str>,
}

impl Future for Unabandoned {
    type Output = Result<(), LockError>;

    fn poll(mut self: std::pin::Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> std::task::Poll<Self::Output> {
        let Some(release) = &mut self.release else { return std::task::Poll::Ready(Ok(())) };
        let done = std::task::ready!(release.as_mut().poll(cx));
        self.release = None;
        std::task::Poll::Ready(done)
    }
}

impl Drop for Unabandoned {
    fn drop(&mut self) {
        let Some(release) = self.release.take() else { return };
        let (name, timeout) = (self.name.clone(), self.timeout);
        let rest = async move {
            let outcome = bounded(&name, "release", timeout, release).await;
            let shown = crate::telemetry::shown_name(&name);
            match outcome {
                Ok(()) => tracing::debug!(lock = %shown, "finished a release whose future was dropped"),
                Err(e) if e.is_lost() => {
                    tracing::debug!(lock = %shown, error = %crate::telemetry::shown_error(&e), "a release whose future was dropped found the lock gone")
                }
                Err(e) => {
                    tracing::warn!(lock = %shown, error = %crate::telemetry::shown_error(&e), "could not finish a release whose future was dropped; its lease will free the lock")
                }
            }
        };
        finish_in_background(
            &self.runtime,
            rest,
            "could not finish a release whose future was dropped; its lease will free the lock",
        );
    }
}

/// A lock held in Redis.
struct RedisHeld {
    backend: RedisBackend,
    name: Arc<str>,
    lock: Arc<str>,
    channel: Arc<str>,
    owner: Arc<str>,
}

impl RedisHeld {
    fn call(&self, script: &'static Script) -> ReleaseCall {
        ReleaseCall::new(&self.backend, script, &self.name, self.lock.clone(), self.channel.clone(), &self.owner)
    }
}

impl HeldLock for RedisHeld {
    fn release(&mut self) -> BoxFuture<'_, Result<(), LockError>> {
        self.call(&RELEASE).release()
    }

    fn release_after(&mut self, remaining: Duration) -> BoxFuture<'_, Result<(), LockError>> {
        // Local waiters look again (and learn the new expiry), as remote ones do from the
        // publication.
        self.call(&RELEASE_AFTER).millis(lease_millis(remaining)).release()
    }

    fn renewal(&self) -> Option<Box<dyn Renewal>> {
        Some(Box::new(RedisRenewal {
            backend: self.backend.clone(),
            name: self.name.clone(),
            lock: self.lock.clone(),
            owner: self.owner.clone(),
        }))
    }
}

/// Renews a lock held in Redis (`extend.lua`).
struct RedisRenewal {
    backend: RedisBackend,
    name: Arc<str>,
    lock: Arc<str>,
    owner: Arc<str>,
}

impl Renewal for RedisRenewal {
    fn extend(&self, lease: Duration) -> BoxFuture<'_, Result<(), LockError>> {
        Box::pin(async move {
            let mut invocation = EXTEND.prepare_invoke();
            invocation.key(&*self.lock).arg(&*self.owner).arg(lease_millis(lease));
            let Some((replicas, timeout)) = self.backend.inner.options.wait_for_replicas else {
                return still_held(&self.name, self.backend.eval::<i64>(&self.name, "extend", invocation).await?);
            };
            let lease = lease_millis(lease).to_string();
            let script = (&*EXTEND, &[&*self.lock][..], &[&*self.owner, &*lease][..]);
            match self.backend.eval_then_wait::<i64>(&self.name, "extend", script, (replicas, timeout)).await? {
                (1, acked) if acked >= replicas => Ok(()),
                (1, acked) => {
                    let why = format!(
                        "only {acked} of the {replicas} required replica(s) acknowledged the renewal within \
                         {timeout:?} (wait_for_replicas); the lock is still held on the primary"
                    );
                    Err(LockError::backend(&*self.name, KIND, "extend", why))
                }
                (status, _) => Err(LockError::lost(&*self.name, lost_reason(status))),
            }
        })
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

/// The answer of an owner-checked script (release, extend): `1` done; anything else means
/// the lock was lost (see [`lost_reason`]).
fn still_held(name: &str, status: i64) -> Result<(), LockError> {
    match status {
        1 => Ok(()),
        status => Err(LockError::lost(name, lost_reason(status))),
    }
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

    fn supports(&self, kind: LockKind) -> bool {
        matches!(kind, LockKind::Exclusive | LockKind::Read | LockKind::Write | LockKind::Semaphore { .. })
    }

    fn begin(&self, req: Acquire, _lost: crate::LostSignal) -> Box<dyn Acquisition> {
        let owner: Arc<str> = format!("{}@{}", req.owner, req.holder).into();
        if req.kind != LockKind::Exclusive {
            return kinds::begin(self, req, owner);
        }
        let layout = KeyLayout::of(&req.key);
        Box::new(RedisAcquisition {
            backend: self.clone(),
            req,
            layout,
            owner,
            slot: None,
            in_flight: false,
            outage: Outage::default(),
        })
    }

    fn operation_timeout(&self) -> Duration {
        // A little over the command bound, so the backend's own (more precise) error wins.
        self.inner.options.command_timeout.saturating_add(Duration::from_millis(250))
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
        for src in [
            include_str!("acquire.lua"),
            include_str!("extend.lua"),
            include_str!("release.lua"),
            include_str!("release_after.lua"),
            include_str!("force_release.lua"),
        ] {
            assert!(src.contains("KEYS[1]") && src.contains("ARGV[1]") && src.contains("Returns"));
        }
        let watch = include_str!("watch.lua");
        assert!(watch.contains("KEYS[1]") && watch.contains("Returns"));
    }

    #[test]
    fn options_out_of_range_are_refused() {
        let hour = Duration::from_secs(3600);
        assert!(RedisOptions::default().problem().is_none());
        let edge = RedisOptions::default().command_timeout(hour).unsubscribe_after(hour).ping_interval(hour);
        assert!(edge.problem().is_none());
        assert!(RedisOptions::default().unsubscribe_after(Duration::ZERO).problem().is_none());
        assert!(RedisOptions::default().wait_for_replicas(2, Duration::from_millis(500)).problem().is_none());
        for bad in [
            RedisOptions::default().command_timeout(Duration::ZERO),
            RedisOptions::default().command_timeout(Duration::MAX),
            RedisOptions::default().unsubscribe_after(hour + Duration::from_nanos(1)),
            RedisOptions::default().ping_interval(Duration::ZERO),
            RedisOptions::default().ping_interval(Duration::MAX),
            RedisOptions::default().wait_for_replicas(0, Duration::from_millis(100)),
            RedisOptions::default().wait_for_replicas(1, Duration::ZERO),
            RedisOptions::default().wait_for_replicas(1, DEFAULT_COMMAND_TIMEOUT),
        ] {
            assert!(bad.problem().is_some(), "{bad:?}");
        }
    }
}
