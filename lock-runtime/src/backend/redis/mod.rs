#![doc = include_str!("README.md")]

mod acquire;
mod batch;
pub mod cluster;
mod handoff;
mod held;
mod holdings;
mod inspect;
pub(crate) mod layout;
mod pubsub;
pub mod redlock;
mod resend;
pub mod sentinel;
mod topology;
mod url;
mod waiters;

use std::future::Future;
use std::sync::{Arc, LazyLock, PoisonError};
use std::time::Duration;

use redis::aio::ConnectionManager;
use redis::{AsyncConnectionConfig, FromRedisValue, Script, ScriptInvocation};

pub use inspect::Changes;
pub use layout::{key_slot, KeyLayout};
use pubsub::Timings;
pub use redlock::RedlockBackend;
use topology::{Conn, Source};
use url::redact;
use waiters::Waiters;

use super::LockKind;
use super::{Acquire, Acquisition, LockBackend};
use crate::error::LockError;

const KIND: &str = "redis";
/// The largest accepted [`RedisOptions`] duration.
const MAX_OPTION: Duration = Duration::from_secs(3600);

/// `acquire.lua`'s function, called on its own, then (given a queue) `queue.lua`'s `queued`.
static ACQUIRE: LazyLock<Script> = LazyLock::new(|| {
    resend::script(concat!(
        include_str!("acquire.lua"),
        include_str!("queue.lua"),
        "local now = redis.call('time')\n",
        "local answer = acquire(KEYS[1], KEYS[2], ARGV[1], ARGV[2], ARGV[3], now)\n",
        "if KEYS[3] then queued(KEYS[3], ARGV[1], answer, ARGV[4], ARGV[5], now) end\n",
        "return answer\n"
    ))
});
static EXTEND: LazyLock<Script> = LazyLock::new(|| resend::script(include_str!("extend.lua")));
/// `release.lua`'s function, called on its own.
static RELEASE: LazyLock<Script> = LazyLock::new(|| {
    resend::script(concat!(
        include_str!("acquire.lua"),
        include_str!("queue.lua"),
        include_str!("release.lua"),
        "return release(KEYS[1], ARGV[1], ARGV[2], KEYS[2], KEYS[3])\n"
    ))
});
/// A release that grants the lock to the releasing process's next waiter (`handoff.lua`).
static HANDOFF: LazyLock<Script> = LazyLock::new(|| {
    resend::script(concat!(
        include_str!("acquire.lua"),
        include_str!("queue.lua"),
        include_str!("release.lua"),
        include_str!("handoff.lua")
    ))
});
/// Many attempts and releases in one call (`batch.lua`, see `batch.rs`).
static BATCH: LazyLock<Script> = LazyLock::new(|| {
    resend::script(concat!(
        include_str!("acquire.lua"),
        include_str!("queue.lua"),
        include_str!("release.lua"),
        include_str!("batch.lua")
    ))
});
static RELEASE_AFTER: LazyLock<Script> = LazyLock::new(|| resend::script(include_str!("release_after.lua")));
static WATCH: LazyLock<Script> = LazyLock::new(|| resend::script(include_str!("watch.lua")));
static FORCE_RELEASE: LazyLock<Script> = LazyLock::new(|| resend::script(include_str!("force_release.lua")));
static INSPECT: LazyLock<Script> = LazyLock::new(|| resend::script(include_str!("inspect.lua")));
static INSPECT_KINDS: LazyLock<Script> = LazyLock::new(|| resend::script(include_str!("inspect_kinds.lua")));
static KIND_ACQUIRE: LazyLock<Script> = LazyLock::new(|| resend::script(include_str!("kind_acquire.lua")));
static KIND_RELEASE: LazyLock<Script> = LazyLock::new(|| resend::script(include_str!("kind_release.lua")));
static KIND_EXTEND: LazyLock<Script> = LazyLock::new(|| resend::script(include_str!("kind_extend.lua")));

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
    #[cfg(feature = "_tls")]
    tls: Option<crate::tls::TlsOptions>,
}

impl Default for RedisOptions {
    fn default() -> Self {
        RedisOptions {
            command_timeout: DEFAULT_COMMAND_TIMEOUT,
            unsubscribe_after: DEFAULT_UNSUBSCRIBE_AFTER,
            ping_interval: DEFAULT_PING_INTERVAL,
            wait_for_replicas: None,
            #[cfg(feature = "_tls")]
            tls: None,
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

    crate::options::tls_setters!(
        "The URLs must be `rediss://` ones. Every connection of the backend uses the settings: \
         commands, pub/sub, a Cluster's nodes, the Sentinels and the primary they name, each \
         Redlock primary. A `rediss://` URL without them trusts the platform's roots alone.\n\n\
         ```\n\
         use lock_runtime::backend::redis::RedisOptions;\n\
         use lock_runtime::TlsOptions;\n\n\
         let tls = TlsOptions::new().ca_file(\"ca.pem\").client_cert_files(\"client.pem\", \"client.key\");\n\
         assert!(RedisOptions::default().tls(tls).get_tls().is_some());\n\
         ```"
    );

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
    /// The scripts loaded (`SCRIPT LOAD`), by hash: at connect ([`RedisBackend::preload`]), or
    /// before their first pipeline with `WAIT`, where a `NOSCRIPT` answer inside the pipeline
    /// would make the call wait for the replicas twice.
    loaded: std::sync::Mutex<std::collections::HashSet<String>>,
    /// The locks held through this backend, checked at once after a lost connection.
    holdings: Arc<holdings::Holdings>,
    /// Where mutex attempts and releases made while another is on the wire wait, to go out
    /// together (see `batch.rs`); none on a Cluster.
    lane: Option<batch::Lane>,
}

impl std::fmt::Debug for RedisBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisBackend").field("url", &self.inner.url).field("options", &self.inner.options).finish()
    }
}

impl RedisBackend {
    /// Whether mutex waiters queue in Redis and releases grant from that queue (see
    /// `handoff.rs`): not on a Cluster, where a release declares the lock's key only, so that
    /// it runs while the slot migrates (see `cluster.rs`).
    fn queues(&self) -> bool {
        !matches!(self.inner.conn, Conn::Cluster(_))
    }

    /// The fencing counter of a lock's grants, given its slot's (`layout.fence`): the
    /// server's one counter where one server holds every lock (one server, Sentinel), so that
    /// a batch reads and writes it once; the slot's on a Cluster. Every grant of a name takes
    /// the same one, so its tokens keep increasing.
    fn fence<'a>(&self, slot_fence: &'a str) -> &'a str {
        match self.inner.conn {
            Conn::Cluster(_) => slot_fence,
            _ => layout::SERVER_FENCE,
        }
    }

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
        let example = "`redis://127.0.0.1:6379`, `redis://user:password@host:6379/0`, `rediss://host:6380` \
                       or `redis+unix:///run/redis.sock`";
        let info = url::connection_info(url, &options, example)?;
        let client = redis::Client::open(info).map_err(|e| LockError::invalid(&shown, e.to_string()))?;
        Self::on_client(client, options, shown).await
    }

    /// Locks on the server of the application's own `client` (its address, database,
    /// credentials and TLS settings, as the application configured them), with `options` (a
    /// TLS setting there is refused: the client's own apply). The backend makes its own
    /// connections from it (a command connection and a pub/sub one), so the application's
    /// connections are left alone.
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), lock_runtime::LockError> {
    /// use lock_runtime::backend::redis::{RedisBackend, RedisOptions};
    ///
    /// let client = redis::Client::open("redis://cache:6379/0").expect("the app's client");
    /// let backend = RedisBackend::from_client(client.clone(), RedisOptions::default()).await?;
    /// let manager = lock_runtime::LockManager::builder().backend(backend);
    /// # Ok(()) }
    /// ```
    pub async fn from_client(client: redis::Client, options: RedisOptions) -> Result<Self, LockError> {
        let shown = redact(&client.get_connection_info().addr().to_string());
        Self::check_beside_client_options(&options, &shown)?;
        Self::on_client(client, options, shown).await
    }

    /// Refuses options a backend on the application's own client cannot take: any out of
    /// range, and TLS settings (the client's own apply).
    fn check_beside_client_options(options: &RedisOptions, shown: &str) -> Result<(), LockError> {
        if let Some(problem) = options.problem() {
            return Err(LockError::invalid(shown, problem));
        }
        #[cfg(feature = "_tls")]
        if options.get_tls().is_some() {
            let why = "TLS settings were given beside a client (`RedisOptions::tls`): the client's own apply";
            return Err(LockError::invalid(shown, why));
        }
        Ok(())
    }

    /// The backend on `client`, connected.
    async fn on_client(client: redis::Client, options: RedisOptions, shown: String) -> Result<Self, LockError> {
        let runtime = tokio::runtime::Handle::try_current()
            .map_err(|e| LockError::invalid(&shown, format!("the Redis backend needs a tokio runtime ({e})")))?;
        let timeout = options.command_timeout;
        let config = redis::aio::ConnectionManagerConfig::new()
            .set_connection_timeout(Some(timeout))
            .set_response_timeout(Some(timeout))
            .set_min_delay(Duration::from_millis(20))
            .set_max_delay(Duration::from_secs(1));
        // One plain connection first: the connection manager retries every failure until the
        // bound, which would hide why the server refused (a TLS handshake, a password).
        let probe =
            AsyncConnectionConfig::new().set_connection_timeout(Some(timeout)).set_response_timeout(Some(timeout));
        let connected = async {
            drop(client.get_multiplexed_async_connection_with_config(&probe).await?);
            ConnectionManager::new_with_config(client.clone(), config).await
        };
        let conn = match tokio::time::timeout(timeout, connected).await {
            Ok(Ok(conn)) => conn,
            Ok(Err(e)) => return Err(LockError::backend(shown, KIND, "connect", e)),
            Err(_) => return Err(LockError::timed_out(shown, KIND, "connect", timeout)),
        };
        Ok(Self::from_parts(Conn::Single(conn), Source::Single(Box::new(client)), options, shown, &runtime)
            .preload()
            .await)
    }

    /// Loads the scripts of every mutex lock, release, hand-off and renewal at once (their
    /// commands go out together on the one connection), bounded by the command timeout. A new
    /// process's first calls are then not answered `NOSCRIPT`, loaded and sent again: two more
    /// round trips each (a scheduled job that locks once paid four), and a call sent again
    /// behind what the process sent after it. A failure is left to those calls, which load
    /// what they miss, as after a server restart.
    async fn preload(self) -> Self {
        let scripts = [&*ACQUIRE, &*RELEASE, &*HANDOFF, &*BATCH, &*EXTEND];
        let timeout = self.inner.options.command_timeout;
        match tokio::time::timeout(timeout, load_scripts(&self.inner.conn, &scripts)).await {
            Ok(loaded) => self.inner.loaded.lock().unwrap_or_else(PoisonError::into_inner).extend(loaded),
            Err(_) => tracing::debug!("redis: scripts not loaded within {timeout:?} at connect; loaded on first use"),
        }
        self
    }

    /// A backend on `conn` and `source`, whatever the topology behind them.
    /// (A topology's module hands over its own connection and source, which `topology.rs`
    /// turns into a [`Conn`] and a [`Source`]: it does not name those.)
    fn from_parts(
        conn: impl Into<Conn>,
        source: impl Into<Source>,
        options: RedisOptions,
        url: String,
        runtime: &tokio::runtime::Handle,
    ) -> Self {
        let (conn, source) = (conn.into(), source.into());
        let timings =
            Timings { timeout: options.command_timeout, grace: options.unsubscribe_after, ping: options.ping_interval };
        let holdings = holdings::Holdings::new(conn.clone(), options.command_timeout, runtime.clone());
        let waiters = Waiters::start(runtime, source.clone(), timings, holdings.clone());
        let runtime = runtime.clone();
        let loaded = Default::default();
        let lane = (!matches!(conn, Conn::Cluster(_))).then(batch::Lane::default);
        RedisBackend { inner: Arc::new(Inner { conn, source, waiters, options, url, runtime, loaded, holdings, lane }) }
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
        self.eval_raw(invocation).await.map_err(|e| self.failed(name, operation, e))
    }

    /// [`eval`](Self::eval) with the connection's own error, for a caller that looks at it.
    async fn eval_raw<T: FromRedisValue>(&self, invocation: ScriptInvocation<'_>) -> Result<T, redis::RedisError> {
        let mut conn = self.inner.conn.clone();
        invocation.invoke_async(&mut conn).await
    }

    /// [`eval_raw`](Self::eval_raw) of an `EVALSHA` the caller wrote itself (in one buffer,
    /// not an argument at a time). A server that lost the script is given it again by the
    /// connection (see `resend.rs`).
    async fn eval_command<T: FromRedisValue>(&self, command: redis::Cmd) -> Result<T, redis::RedisError> {
        let mut conn = self.inner.conn.clone();
        command.query_async(&mut conn).await
    }

    /// The error of a failed command; a connection found lost has every held lock checked.
    fn failed(&self, name: &str, operation: &'static str, e: redis::RedisError) -> LockError {
        if holdings::connection_lost(&e) {
            self.inner.holdings.suspect();
        }
        command_error(name, operation, self.inner.options.command_timeout, e)
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
        let map = |e: redis::RedisError| self.failed(name, operation, e);
        let loaded = |hash: &str| self.inner.loaded.lock().unwrap_or_else(PoisonError::into_inner).contains(hash);
        if !loaded(script.get_hash()) {
            // Once per script and backend; a server that lost it later answers NOSCRIPT below.
            script.load_async(&mut conn).await.map_err(map)?;
            self.inner.loaded.lock().unwrap_or_else(PoisonError::into_inner).insert(script.get_hash().to_owned());
        }
        // A server that lost the script since is given it again by the connection (`resend.rs`).
        pipe.query_async(&mut conn).await.map_err(map)
    }
}

/// `fut` bounded by `timeout`: past it, a timed-out `operation` error of lock `name`.
///
/// A future of its own rather than an `async fn`: the latter would keep `fut` twice in its
/// state (as its argument, and inside the timeout), and the futures it bounds are the largest
/// part of every attempt's and release's.
fn bounded<'a, T, F: Future<Output = Result<T, LockError>>>(
    name: &'a str,
    operation: &'static str,
    timeout: Duration,
    fut: F,
) -> Bounded<'a, F> {
    Bounded { timed: tokio::time::timeout(timeout, fut), name, operation, timeout }
}

pin_project_lite::pin_project! {
    /// The future of [`bounded`].
    struct Bounded<'a, F> {
        #[pin]
        timed: tokio::time::Timeout<F>,
        name: &'a str,
        operation: &'static str,
        timeout: Duration,
    }
}

impl<T, F: Future<Output = Result<T, LockError>>> Future for Bounded<'_, F> {
    type Output = Result<T, LockError>;

    fn poll(self: std::pin::Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> std::task::Poll<Self::Output> {
        let this = self.project();
        match std::task::ready!(this.timed.poll(cx)) {
            Ok(out) => std::task::Poll::Ready(out),
            Err(_) => {
                std::task::Poll::Ready(Err(LockError::timed_out(*this.name, KIND, this.operation, *this.timeout)))
            }
        }
    }
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
    invocation.invoke_async(&mut conn).await.map_err(|e| command_error(name, operation, timeout, e))
}

/// The error of a failed command: timed out past `timeout`, or the server's or connection's.
fn command_error(name: &str, operation: &'static str, timeout: Duration, e: redis::RedisError) -> LockError {
    if e.is_timeout() {
        LockError::timed_out(name, KIND, operation, timeout)
    } else {
        LockError::backend(name, KIND, operation, e)
    }
}

/// The URL with any password replaced by `***`, for messages.
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

    fn begin(&self, req: Acquire, lost: crate::lost::LostSignal) -> Box<dyn Acquisition> {
        let owner = req.owner.with_holder(&req.holder);
        Box::new(acquire::RedisAcquisition::new(self, req, owner, lost))
    }

    fn operation_timeout(&self) -> Duration {
        // A little over the command bound, so the backend's own (more precise) error wins.
        self.inner.options.command_timeout.saturating_add(Duration::from_millis(250))
    }

    fn inspector(&self) -> Option<&dyn crate::backend::Inspect> {
        Some(self)
    }
}

/// Loads `scripts` on `conn` together (one round trip), as a backend connects: the hashes of
/// those loaded. A script not loaded is only logged: the call that needs it loads it (the
/// server answers `NOSCRIPT`), as after a server restart.
async fn load_scripts(conn: &Conn, scripts: &[&Script]) -> Vec<String> {
    let mut conns: Vec<Conn> = scripts.iter().map(|_| conn.clone()).collect();
    let loads = scripts.iter().zip(conns.iter_mut()).map(|(script, conn)| script.load_async(conn));
    let mut loaded = Vec::new();
    for outcome in futures_util::future::join_all(loads).await {
        match outcome {
            Ok(hash) => loaded.push(hash),
            Err(e) => tracing::debug!(error = %e, "redis: a script not loaded at connect; loaded on first use"),
        }
    }
    loaded
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scripts_state_their_interface() {
        for src in [
            include_str!("acquire.lua"),
            include_str!("extend.lua"),
            include_str!("release.lua"),
            include_str!("release_after.lua"),
            include_str!("force_release.lua"),
            include_str!("handoff.lua"),
            include_str!("batch.lua"),
        ] {
            assert!(src.contains("KEYS[1]") && src.contains("ARGV[1]") && src.contains("Returns"));
        }
        for src in [
            include_str!("watch.lua"),
            include_str!("inspect.lua"),
            include_str!("check.lua"),
            include_str!("inspect_kinds.lua"),
        ] {
            assert!(src.contains("KEYS[1]") && src.contains("Returns"));
        }
    }

    #[test]
    fn kind_scripts_state_their_interface() {
        for src in [include_str!("kind_acquire.lua"), include_str!("kind_release.lua"), include_str!("kind_extend.lua")]
        {
            assert!(src.contains("KEYS[1]") && src.contains("ARGV[1]") && src.contains("Returns"));
        }
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
