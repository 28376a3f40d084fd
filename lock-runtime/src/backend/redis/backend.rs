//! [`RedisBackend`]: the public face of the Redis wing. It composes the parts (`shared.rs`) on
//! the connection a topology's module makes (one server here; `cluster.rs`, `sentinel.rs`) and
//! hands each acquisition to `acquire.rs`; it holds no lock logic of its own.

use std::sync::Arc;
use std::time::Duration;

use redis::aio::ConnectionManager;
use redis::AsyncConnectionConfig;

use super::acquire::RedisAcquisition;
use super::options::RedisOptions;
use super::options::KIND;
#[cfg(doc)]
use super::server::Server;
use super::shared::Shared;
use super::topology::{Conn, Source};
use super::url::{self, redact};
use super::{cluster, sentinel};
use crate::backend::{Acquire, Acquisition, LockBackend, LockKind};
use crate::error::LockError;

/// Locks in Redis. Cheap to clone: clones share the connections.
///
/// Create it with [`RedisBackend::connect`] or [`RedisBackend::connect_with`] and hand it to
/// [`LockManagerBuilder::backend`](crate::LockManagerBuilder::backend), or use [`LockManager::redis`](crate::LockManager::redis) /
/// [`LockManagerBuilder::redis`](crate::LockManagerBuilder::redis). See the [module docs](super) for the protocol.
#[derive(Clone)]
pub struct RedisBackend {
    pub(super) shared: Arc<Shared>,
}

impl std::fmt::Debug for RedisBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisBackend").field("url", &self.shared.url).field("options", &self.shared.options).finish()
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
        options.check_beside_client(&shown)?;
        Self::on_client(client, options, shown).await
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
        // bound, which would hide why the server refused (a TLS handshake, a password). Its
        // `PING` finds a server that wants a password the URL lacks (it accepts the connection
        // and answers `NOAUTH` to every command: found here, not at the first `lock()`).
        let probe =
            AsyncConnectionConfig::new().set_connection_timeout(Some(timeout)).set_response_timeout(Some(timeout));
        let connected = async {
            let mut probe = client.get_multiplexed_async_connection_with_config(&probe).await?;
            redis::cmd("PING").query_async::<()>(&mut probe).await?;
            drop(probe);
            ConnectionManager::new_with_config(client.clone(), config).await
        };
        let conn = match tokio::time::timeout(timeout, connected).await {
            Ok(Ok(conn)) => conn,
            Ok(Err(e)) => return Err(LockError::backend(shown, KIND, "connect", e)),
            Err(_) => return Err(LockError::timed_out(shown, KIND, "connect", timeout)),
        };
        Ok(Self::on(Conn::Single(conn), Source::Single(Box::new(client)), options, shown, &runtime).preload().await)
    }

    /// Connects to the Redis Cluster that the nodes at `urls` belong to (any nodes of it: the
    /// rest is discovered), with `options`. See the [cluster module docs](super::cluster).
    ///
    /// An empty list, a malformed URL (or a `redis+unix://` one: a cluster announces TCP
    /// addresses), options out of range or [`wait_for_replicas`](RedisOptions::wait_for_replicas)
    /// are an [`is_invalid`](crate::LockError::is_invalid)
    /// error; a cluster none of whose nodes answers within the command timeout is an
    /// [`is_backend`](crate::LockError::is_backend) error.
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), lock_runtime::LockError> {
    /// use lock_runtime::backend::redis::{RedisBackend, RedisOptions};
    /// let backend =
    ///     RedisBackend::cluster(&["redis://127.0.0.1:7000", "redis://127.0.0.1:7001"], RedisOptions::default())
    ///         .await?;
    /// # Ok(()) }
    /// ```
    pub async fn cluster<E: AsRef<str>, S: AsRef<[E]>>(urls: S, options: RedisOptions) -> Result<Self, LockError> {
        let given: Vec<&str> = urls.as_ref().iter().map(AsRef::as_ref).collect();
        let ((conn, silence), nodes, shown, runtime) = cluster::connect(&given, &options).await?;
        Ok(Self::on(Conn::Cluster(conn, silence), nodes, options, shown, &runtime))
    }

    /// Locks on the application's own Redis Cluster `client` (its credentials, TLS, routing and
    /// timeouts carry every lock command), for a service that configured its client already.
    /// `nodes` are URLs of some of the cluster's nodes, with the same credentials and TLS: the
    /// backend's pub/sub connections (which wake waiters) go to them and to the nodes the
    /// cluster reports, and a `ClusterClient` tells neither its nodes nor its credentials. The
    /// options' TLS settings are refused (the client's own apply; put the URLs' TLS in them as
    /// `rediss://`).
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
    /// use lock_runtime::backend::redis::{RedisBackend, RedisOptions};
    /// let nodes = ["redis://127.0.0.1:7000", "redis://127.0.0.1:7001"];
    /// let client = redis::cluster::ClusterClient::new(nodes.to_vec())?;
    /// let backend = RedisBackend::cluster_from_client(client, &nodes, RedisOptions::default()).await?;
    /// let manager = lock_runtime::LockManager::builder().backend(backend);
    /// # Ok(()) }
    /// ```
    pub async fn cluster_from_client<E: AsRef<str>, S: AsRef<[E]>>(
        client: redis::cluster::ClusterClient,
        nodes: S,
        options: RedisOptions,
    ) -> Result<Self, LockError> {
        let given: Vec<&str> = nodes.as_ref().iter().map(AsRef::as_ref).collect();
        let ((conn, silence), nodes, shown, runtime) = cluster::connect_client(client, &given, &options).await?;
        Ok(Self::on(Conn::Cluster(conn, silence), nodes, options, shown, &runtime))
    }

    /// Locks on the primary the sentinels at `sentinels` (`redis://host:port` URLs) name
    /// `master_name`, following its failovers (see the [sentinel docs](super::sentinel)).
    ///
    /// No sentinel, a malformed URL, an empty name or options out of range are an
    /// [`is_invalid`](crate::LockError::is_invalid) error; no sentinel reachable, or none
    /// knowing the name, within the command timeout an
    /// [`is_backend`](crate::LockError::is_backend) error.
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), lock_runtime::LockError> {
    /// use lock_runtime::backend::redis::{RedisBackend, RedisOptions};
    /// let backend =
    ///     RedisBackend::sentinel(&["redis://127.0.0.1:26379"], "mymaster", RedisOptions::default()).await?;
    /// # Ok(()) }
    /// ```
    pub async fn sentinel<E: AsRef<str>, S: AsRef<[E]>>(
        sentinels: S,
        master_name: &str,
        options: RedisOptions,
    ) -> Result<Self, LockError> {
        let given: Vec<&str> = sentinels.as_ref().iter().map(AsRef::as_ref).collect();
        let (conn, shown, runtime) = sentinel::connect(&given, master_name, &options).await?;
        Ok(Self::on(conn.clone(), conn, options, shown, &runtime).preload().await)
    }

    /// The backend on a topology's connection and source (see [`Shared::new`]).
    fn on(
        conn: impl Into<Conn>,
        source: impl Into<Source>,
        options: RedisOptions,
        url: String,
        runtime: &tokio::runtime::Handle,
    ) -> Self {
        RedisBackend { shared: Arc::new(Shared::new(conn.into(), source.into(), options, url, runtime)) }
    }

    /// Loads the scripts of every mutex lock, release, hand-off and renewal at once (see
    /// [`Server::preload`]).
    async fn preload(self) -> Self {
        self.shared.server.preload().await;
        self
    }

    /// The options this backend was created with.
    pub fn options(&self) -> &RedisOptions {
        &self.shared.options
    }

    /// How many release channels are subscribed (or about to be) for local waiters right now,
    /// including those in their [`unsubscribe_after`](RedisOptions::unsubscribe_after) grace.
    pub fn subscribed_channels(&self) -> usize {
        self.shared.waiters.channels()
    }

    /// How many acquisitions of this backend wait in its local queues right now, all locks
    /// together (for tests and metrics).
    pub fn local_waiters(&self) -> usize {
        self.shared.waiters.queued()
    }
}

impl LockBackend for RedisBackend {
    fn name(&self) -> &'static str {
        KIND
    }

    fn supports(&self, kind: LockKind) -> bool {
        matches!(kind, LockKind::Exclusive | LockKind::Read | LockKind::Write | LockKind::Semaphore { .. })
    }

    fn begin(&self, req: Acquire, lost: crate::lost::LostSignal) -> Box<dyn Acquisition> {
        let owner = req.owner.with_holder(&req.holder);
        Box::new(RedisAcquisition::new(&self.shared, req, owner, lost))
    }

    fn operation_timeout(&self) -> Duration {
        // A little over the command bound, so the backend's own (more precise) error wins.
        self.shared.options.command_timeout.saturating_add(Duration::from_millis(250))
    }

    fn inspector(&self) -> Option<&dyn crate::backend::Inspect> {
        Some(self)
    }
}
