//! The ZooKeeper backend (feature `zookeeper`): Curator's `InterProcessMutex` recipe, on the
//! async [`zookeeper-client`](https://docs.rs/zookeeper-client) crate.
//!
//! ```no_run
//! use std::time::Duration;
//! use lock_runtime::backend::zookeeper::{ZookeeperBackend, ZookeeperOptions};
//! use lock_runtime::LockManager;
//!
//! # #[tokio::main] async fn main() -> Result<(), lock_runtime::LockError> {
//! // Defaults: session timeout 6 s, operation timeout 5 s, locks under `/lock-runtime`.
//! let manager = LockManager::zookeeper("127.0.0.1:2181").await?;
//!
//! // Or with options:
//! let options = ZookeeperOptions::new()
//!     .session_timeout(Duration::from_secs(10))
//!     .operation_timeout(Duration::from_secs(3))
//!     .root("/myapp/locks");
//! let backend = ZookeeperBackend::connect_with("zk1:2181,zk2:2181,zk3:2181", options).await?;
//! let manager = LockManager::builder().prefix("orders:").backend(backend);
//! let guard = manager.lock("42").await?;
//! guard.release().await?;
//! # Ok(()) }
//! ```
//!
//! # The recipe
//!
//! A lock named `key` (the manager prefix and the name) is the container node
//! `<root>/<encoded key>`; `key` is percent-encoded so that any valid lock name, `/` included, is
//! one safe znode name. Every acquisition creates an ephemeral sequential child
//! `lk-<owner id>-<sequence>`; the child with the lowest sequence holds the lock (fair, FIFO).
//!
//! - **One attempt** ([`try_lock`](crate::LockManager::try_lock), or the first attempt of
//!   every call) creates the node and lists the children. Lowest: acquired. Otherwise the node is
//!   deleted again before the attempt returns, so a caller that gives up after one attempt leaves
//!   nothing behind.
//! - **Waiting** creates the node again and watches only its predecessor (an `exists` watch), so a
//!   release wakes exactly one waiter: no herd, no polling. The lock is handed over when the node
//!   becomes the lowest. A waiter whose `wait` runs out deletes its node before it returns; a
//!   waiter whose future is dropped has its node deleted at once by a spawned task.
//! - **Lost replies.** The node name carries the acquisition's unique owner id. When a create's
//!   reply is lost to a connection loss, the children are searched for that id after the
//!   session reconnects instead of creating a second node; an acquisition abandoned half-way
//!   (its future dropped while a create was in flight) deletes whatever node carries its id.
//! - **No leftovers.** Lock nodes are containers (the server deletes them once empty), and a
//!   release also deletes the parent when it is empty (pipelined behind the node's delete, so it
//!   costs no extra round trip), so names that are no longer used leave no znodes behind.
//! - **Fencing token**: the lock node's creation zxid (`czxid`), which is global and strictly
//!   increasing across the whole ensemble, unlike the sequence suffix, which restarts when a
//!   parent node is recreated.
//!
//! # Leases and sessions
//!
//! ZooKeeper holds a lock for as long as the session that created its node lives, so a
//! watchdog lease (no `lease` given) needs no renewal: the lock is kept while the guard lives
//! and the session is healthy, and freed by the server when the holder's process dies (its
//! session expires after the session timeout).
//!
//! A **fixed `lease`** must not be held past its end, and a session store does not expire nodes
//! by itself. So the holder's process deletes its node when the lease ends: each grant starts
//! a small task that sleeps until `granted_at + lease` (the instant at which the runtime also
//! fires [`lost()`](crate::LockGuard::lost)) and then deletes the node, handing the lock to the
//! next waiter. The task stops when the guard is released or dropped.
//!
//! The lease is also recorded in the node's data (`lease_ms=<n>`), for the case where the
//! holder's process cannot delete its node (it hangs with its session alive, or is cut off from
//! the ensemble). The next waiter (the one watching the holder) deletes the holder's node once
//! the lease is over by the server's clock: it compares the holder node's creation time
//! (`ctime`) with its own node's, both stamped by the server, so no two client clocks are
//! compared, and adds [`STALE_HOLDER_MARGIN`] for a step of the server's clock or a leader
//! change in between. The holder's own lease ran from before its create reached the server, so
//! the lock is never taken away before the holder's runtime has reported it lost. If the
//! holder's process dies and nobody waits, its session's end frees the node.
//!
//! **Session loss** fires `lost()` on every lock held through the session: at once when the
//! session expires or is closed, and when the client has been disconnected for longer than
//! [`ZookeeperOptions::lost_after_disconnect`] (half the negotiated session timeout by
//! default). Half, not all of it: a silent network partition is noticed only after up to 2/5 of
//! the timeout, and the server may expire the session (and let another client take the lock) a
//! full timeout after it last heard from this one; firing earlier leaves a margin, as Curator
//! advises for its `SUSPENDED` state. The abandoned session is closed as soon as it can be, and
//! the next operation connects a new session, so new attempts work again once the ensemble is
//! reachable; while it is not, they fail at once with an [`is_backend`](LockError::is_backend)
//! error. Each held lock also watches its own node, so a node deleted by anyone else (an
//! operator, another tool) fires `lost()` too.
//!
//! The session runs on the tokio runtime that created the backend: keep that runtime alive
//! for as long as the manager is used.

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};
use std::time::{Duration, Instant};

use tokio::task::AbortHandle;
use zookeeper_client::{Acls, Client, CreateMode, EventType, SessionState};

use super::{Acquire, Attempt, BoxFuture, Busy, Grant, Held, Lease, LockBackend, Wake};
use crate::error::LockError;
use crate::lost::LostSignal;
use crate::{LockManager, LockManagerBuilder};

const KIND: &str = "zookeeper";
/// The prefix of every lock node's name.
const NODE_PREFIX: &str = "lk-";

/// Settings of a [`ZookeeperBackend`]: build with [`ZookeeperOptions::new`] and its setters.
///
/// ```
/// use std::time::Duration;
/// use lock_runtime::backend::zookeeper::ZookeeperOptions;
///
/// let options = ZookeeperOptions::new()
///     .session_timeout(Duration::from_secs(10))
///     .operation_timeout(Duration::from_secs(2))
///     .root("/myapp/locks");
/// assert_eq!(options.get_root(), "/myapp/locks");
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ZookeeperOptions {
    session_timeout: Duration,
    operation_timeout: Duration,
    root: String,
    lost_after_disconnect: Option<Duration>,
}

impl Default for ZookeeperOptions {
    fn default() -> Self {
        ZookeeperOptions {
            session_timeout: Self::DEFAULT_SESSION_TIMEOUT,
            operation_timeout: Self::DEFAULT_OPERATION_TIMEOUT,
            root: Self::DEFAULT_ROOT.to_owned(),
            lost_after_disconnect: None,
        }
    }
}

impl ZookeeperOptions {
    /// The session timeout asked for by default.
    pub const DEFAULT_SESSION_TIMEOUT: Duration = Duration::from_secs(6);
    /// The operation timeout used by default.
    pub const DEFAULT_OPERATION_TIMEOUT: Duration = Duration::from_secs(5);
    /// The znode under which lock nodes live by default.
    pub const DEFAULT_ROOT: &'static str = "/lock-runtime";

    /// The defaults: a 6 s session, 5 s operations, locks under `/lock-runtime`.
    pub fn new() -> Self {
        Self::default()
    }

    /// The session timeout to ask the server for (it may adjust it into its
    /// `minSessionTimeout..=maxSessionTimeout`, by default 2 to 20 ticks). A holder whose
    /// process dies keeps its watchdog-leased locks until the session expires, this long after
    /// the server last heard from it.
    pub fn session_timeout(mut self, timeout: Duration) -> Self {
        self.session_timeout = timeout;
        self
    }

    /// The longest a single operation (one attempt, one release, connecting) may take before it
    /// fails with an [`is_backend`](LockError::is_backend) error.
    pub fn operation_timeout(mut self, timeout: Duration) -> Self {
        self.operation_timeout = timeout;
        self
    }

    /// The znode under which lock nodes are created (an absolute path, created if missing).
    pub fn root(mut self, root: impl Into<String>) -> Self {
        self.root = root.into();
        self
    }

    /// How long the client may stay disconnected before every lock held through the session is
    /// reported lost and the session is abandoned. Default: half the negotiated session timeout
    /// (see the [module docs](self) for why not all of it).
    pub fn lost_after_disconnect(mut self, grace: Duration) -> Self {
        self.lost_after_disconnect = Some(grace);
        self
    }

    /// The session timeout asked for.
    pub fn get_session_timeout(&self) -> Duration {
        self.session_timeout
    }

    /// The operation timeout.
    pub fn get_operation_timeout(&self) -> Duration {
        self.operation_timeout
    }

    /// The lock root.
    pub fn get_root(&self) -> &str {
        &self.root
    }

    fn check(&self, hosts: &str) -> Result<(), LockError> {
        let root = &self.root;
        if !root.starts_with('/') || root.len() < 2 || root.ends_with('/') || root.contains("//") {
            return Err(LockError::invalid(
                hosts,
                format!("the ZooKeeper lock root `{root}` must be an absolute znode path such as `/locks`, not `/`"),
            ));
        }
        if root.chars().any(char::is_control) || root.split('/').any(|part| part == "." || part == "..") {
            return Err(LockError::invalid(
                hosts,
                format!("the ZooKeeper lock root `{root}` is not a valid znode path"),
            ));
        }
        if self.session_timeout.is_zero() || self.operation_timeout.is_zero() {
            return Err(LockError::invalid(hosts, "the ZooKeeper session and operation timeouts must not be zero"));
        }
        if self.lost_after_disconnect.is_some_and(|d| d.is_zero()) {
            return Err(LockError::invalid(hosts, "`lost_after_disconnect` must not be zero"));
        }
        Ok(())
    }
}

/// Counters of a [`ZookeeperBackend`], for metrics and tests.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ZookeeperStats {
    /// How many times a waiting acquisition was woken by a watch on its predecessor. With no
    /// herd, each release wakes one waiter.
    pub wakeups: u64,
    /// How many acquisitions wait on a predecessor's watch right now.
    pub waiting: u64,
    /// How many sessions were established (1 plus the reconnections after a session loss).
    pub sessions: u64,
}

/// The ZooKeeper lock store. Cheap to clone: clones share one session. See the
/// [module docs](self) for the recipe and how leases and sessions map onto each other.
#[derive(Clone)]
pub struct ZookeeperBackend {
    shared: Arc<Shared>,
}

struct Shared {
    hosts: String,
    options: ZookeeperOptions,
    /// The live session, if any; `None` after a session loss until the next operation connects.
    current: Mutex<Option<Arc<Session>>>,
    /// Serialises reconnection.
    connecting: tokio::sync::Mutex<()>,
    /// Locks held through this backend, by node path.
    holders: Mutex<HashMap<Arc<str>, HolderEntry>>,
    generations: AtomicU64,
    wakeups: AtomicU64,
    waiting: AtomicU64,
}

struct Session {
    client: Client,
    generation: u64,
    /// Set (under the `holders` lock) once the session is lost: nothing is granted through it
    /// afterwards.
    dead: AtomicBool,
    /// Wakes the waits of a session that is lost.
    died: tokio::sync::Notify,
}

impl Session {
    /// Completes once the session is lost.
    async fn lost(&self) {
        let notified = self.died.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        if self.dead.load(Ordering::Acquire) {
            return;
        }
        notified.await
    }
}

struct HolderEntry {
    generation: u64,
    lost: LostSignal,
    released: Arc<AtomicBool>,
    task: Option<AbortHandle>,
}

impl Drop for Shared {
    fn drop(&mut self) {
        for (_, entry) in lock(&self.holders).drain() {
            if let Some(task) = entry.task {
                task.abort();
            }
        }
    }
}

impl fmt::Debug for ZookeeperBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ZookeeperBackend")
            .field("hosts", &self.shared.hosts)
            .field("options", &self.shared.options)
            .field("stats", &self.stats())
            .finish()
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

fn zk_error(name: &str, operation: &'static str, e: zookeeper_client::Error) -> LockError {
    LockError::backend(name, KIND, operation, e)
}

fn gone(name: &str, operation: &'static str, what: String) -> LockError {
    LockError::backend(name, KIND, operation, what)
}

fn session_gone(name: &str, operation: &'static str) -> LockError {
    gone(name, operation, "the ZooKeeper session was lost (expired, or disconnected too long)".to_owned())
}

impl ZookeeperBackend {
    /// Connects to `hosts` (`"host:port,host:port"`, optionally followed by a chroot path) with
    /// the default [`ZookeeperOptions`].
    pub async fn connect(hosts: impl AsRef<str>) -> Result<Self, LockError> {
        Self::connect_with(hosts, ZookeeperOptions::new()).await
    }

    /// Connects to `hosts` with `options`; creates the lock root if it is missing. Fails with an
    /// [`is_invalid`](LockError::is_invalid) error for a malformed host list or option, and an
    /// [`is_backend`](LockError::is_backend) error when no server answers within the operation
    /// timeout.
    pub async fn connect_with(hosts: impl AsRef<str>, options: ZookeeperOptions) -> Result<Self, LockError> {
        let hosts = hosts.as_ref().trim();
        if hosts.is_empty() {
            return Err(LockError::invalid(hosts, "the ZooKeeper host list is empty; give `host:port[,host:port…]`"));
        }
        options.check(hosts)?;
        let shared = Arc::new(Shared {
            hosts: hosts.to_owned(),
            options,
            current: Mutex::new(None),
            connecting: tokio::sync::Mutex::new(()),
            holders: Mutex::new(HashMap::new()),
            generations: AtomicU64::new(0),
            wakeups: AtomicU64::new(0),
            waiting: AtomicU64::new(0),
        });
        let backend = ZookeeperBackend { shared };
        match backend.session(hosts, "connect").await {
            Ok(_) => Ok(backend),
            Err(LockError::Backend { source, .. })
                if matches!(
                    source.downcast_ref::<zookeeper_client::Error>(),
                    Some(zookeeper_client::Error::BadArguments(_))
                ) =>
            {
                Err(LockError::invalid(hosts, format!("not a valid ZooKeeper host list: {source}")))
            }
            Err(e) => Err(e),
        }
    }

    /// The counters of this backend.
    pub fn stats(&self) -> ZookeeperStats {
        ZookeeperStats {
            wakeups: self.shared.wakeups.load(Ordering::Relaxed),
            waiting: self.shared.waiting.load(Ordering::Relaxed),
            sessions: self.shared.generations.load(Ordering::Relaxed),
        }
    }

    /// The options this backend was built with.
    pub fn options(&self) -> &ZookeeperOptions {
        &self.shared.options
    }

    /// The znode that holds the nodes of lock `key` (the manager prefix followed by the name).
    pub fn lock_path(&self, key: &str) -> String {
        format!("{}/{}", self.shared.options.root, encode(key))
    }

    /// The live session, connecting a new one if there is none (after a session loss).
    async fn session(&self, name: &str, operation: &'static str) -> Result<Arc<Session>, LockError> {
        let shared = &self.shared;
        if let Some(session) = self.usable(name, operation).await? {
            return Ok(session);
        }
        let _connecting = shared.connecting.lock().await;
        if let Some(session) = self.usable(name, operation).await? {
            return Ok(session);
        }
        let bound = shared.options.operation_timeout;
        let connect = Client::connector()
            .with_session_timeout(shared.options.session_timeout)
            .with_fail_eagerly()
            .connect(&shared.hosts);
        let client = match tokio::time::timeout(bound, connect).await {
            Ok(Ok(client)) => client,
            Ok(Err(e @ zookeeper_client::Error::BadArguments(_))) => return Err(zk_error(name, operation, e)),
            Ok(Err(e)) => {
                return Err(gone(name, operation, format!("could not connect to ZooKeeper at `{}`: {e}", shared.hosts)))
            }
            Err(_) => {
                return Err(gone(
                    name,
                    operation,
                    format!("could not connect to ZooKeeper at `{}` within {bound:?}", shared.hosts),
                ))
            }
        };
        let persistent = CreateMode::Persistent.with_acls(Acls::anyone_all());
        let create_root = client.mkdir(&shared.options.root, &persistent);
        match tokio::time::timeout(bound, create_root).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => return Err(zk_error(name, operation, e)),
            Err(_) => return Err(gone(name, operation, format!("could not create the lock root within {bound:?}"))),
        }
        let generation = shared.generations.fetch_add(1, Ordering::Relaxed) + 1;
        let grace = shared.options.lost_after_disconnect.unwrap_or(client.session_timeout() / 2);
        let watcher = client.state_watcher();
        let session = Arc::new(Session { client, generation, dead: AtomicBool::new(false), died: Default::default() });
        *lock(&shared.current) = Some(session.clone());
        tokio::spawn(supervise(Arc::downgrade(shared), Arc::downgrade(&session), generation, watcher, grace));
        tracing::debug!(hosts = %shared.hosts, generation, "ZooKeeper session established");
        Ok(session)
    }

    /// The current session if it is connected; waits briefly for a disconnected one to
    /// reconnect; `None` when there is none.
    async fn usable(&self, name: &str, operation: &'static str) -> Result<Option<Arc<Session>>, LockError> {
        let Some(session) = lock(&self.shared.current).clone() else { return Ok(None) };
        let mut watcher = session.client.state_watcher();
        let mut state = watcher.state();
        if state == SessionState::SyncConnected {
            return Ok(Some(session));
        }
        if state.is_terminated() {
            return Ok(None);
        }
        let patience = (self.shared.options.operation_timeout / 2).min(Duration::from_secs(1));
        let until = tokio::time::Instant::now() + patience;
        while state != SessionState::SyncConnected && !state.is_terminated() {
            match tokio::time::timeout_at(until, watcher.changed()).await {
                Ok(next) => state = next,
                Err(_) => break,
            }
        }
        match state {
            SessionState::SyncConnected => Ok(Some(session)),
            s if s.is_terminated() => Ok(None),
            s => Err(gone(
                name,
                operation,
                format!(
                    "not connected to ZooKeeper at `{}` (session state: {s}); retry once it is reachable",
                    self.shared.hosts
                ),
            )),
        }
    }

    /// Reports every lock held through session `generation` lost and forgets the session.
    fn session_lost(shared: &Shared, session: Option<Arc<Session>>, generation: u64, reason: &str) {
        {
            let mut current = lock(&shared.current);
            if current.as_ref().is_some_and(|s| s.generation == generation) {
                *current = None;
            }
        }
        let lost: Vec<HolderEntry> = {
            let mut holders = lock(&shared.holders);
            if let Some(session) = &session {
                session.dead.store(true, Ordering::Release);
                session.died.notify_waiters();
            }
            let paths: Vec<Arc<str>> =
                holders.iter().filter(|(_, e)| e.generation == generation).map(|(p, _)| p.clone()).collect();
            paths.iter().filter_map(|p| holders.remove(p)).collect()
        };
        if !lost.is_empty() {
            tracing::warn!(count = lost.len(), reason, "ZooKeeper session lost: locks held through it are lost");
        }
        for entry in lost {
            if let Some(task) = entry.task {
                task.abort();
            }
            entry.lost.fire(reason.to_owned());
        }
    }

    /// Creates the acquisition's node under `dir`, creating parents as needed; after a lost
    /// reply, finds the node by the owner id instead of creating a second one.
    async fn create_node(
        &self,
        session: &Session,
        dir: &str,
        owner: &str,
        data: &[u8],
    ) -> Result<Node, zookeeper_client::Error> {
        let client = &session.client;
        let prefix = format!("{dir}/{NODE_PREFIX}{owner}-");
        let options = CreateMode::EphemeralSequential.with_acls(Acls::anyone_all());
        let mut tries = 0;
        loop {
            tries += 1;
            match client.create(&prefix, data, &options).await {
                Ok((stat, seq)) => {
                    return Ok(Node {
                        path: Arc::from(format!("{prefix}{seq}")),
                        seq: seq.into_i64(),
                        czxid: stat.czxid,
                        ctime: stat.ctime,
                        seen: Instant::now(),
                    })
                }
                // No parent yet, or a release just deleted the empty parent: (re)create it.
                Err(zookeeper_client::Error::NoNode) if tries < 8 => self.make_dir(client, dir).await?,
                Err(zookeeper_client::Error::ConnectionLoss) if tries < 4 => {
                    // The create may have happened: look for our node once the session is back.
                    wait_connected(client).await?;
                    if let Some(node) = find_own(client, dir, owner).await? {
                        return Ok(node);
                    }
                }
                Err(e) => return Err(e),
            }
        }
    }

    async fn make_dir(&self, client: &Client, dir: &str) -> Result<(), zookeeper_client::Error> {
        let container = CreateMode::Container.with_acls(Acls::anyone_all());
        match client.create(dir, &[], &container).await {
            Ok(_) | Err(zookeeper_client::Error::NodeExists) => Ok(()),
            Err(zookeeper_client::Error::NoNode) => {
                client.mkdir(&self.shared.options.root, &CreateMode::Persistent.with_acls(Acls::anyone_all())).await?;
                match client.create(dir, &[], &container).await {
                    Ok(_) | Err(zookeeper_client::Error::NodeExists) => Ok(()),
                    Err(e) => Err(e),
                }
            }
            Err(e) => Err(e),
        }
    }

    /// Records a granted lock: its lost signal (fired on session loss), and a task that deletes
    /// the node when a fixed lease ends and fires `lost()` if the node is deleted by anyone else.
    ///
    /// Returns `false` (registering nothing) when the session is already lost.
    #[must_use]
    fn register(&self, session: &Session, req: &Acquire<'_>, node: &Node, granted_at: Instant) -> bool {
        let mut holders = lock(&self.shared.holders);
        if session.dead.load(Ordering::Acquire) {
            return false;
        }
        let released = Arc::new(AtomicBool::new(false));
        let lease_end = match req.lease {
            Lease::Fixed(d) => granted_at.checked_add(d),
            Lease::Renewed(_) => None,
        };
        let task = tokio::spawn(hold(
            Arc::downgrade(&self.shared),
            session.client.clone(),
            node.path.clone(),
            lease_end,
            req.lost.clone(),
            released.clone(),
        ))
        .abort_handle();
        let entry = HolderEntry { generation: session.generation, lost: req.lost.clone(), released, task: Some(task) };
        holders.insert(node.path.clone(), entry);
        true
    }

    fn grant(node: &Node, granted_at: Instant) -> Grant {
        Grant {
            fencing_token: u64::try_from(node.czxid).unwrap_or(0),
            needs_renewal: false,
            tag: Some(node.path.clone()),
            granted_at: Some(granted_at),
        }
    }
}

/// A lock node this backend created.
struct Node {
    path: Arc<str>,
    seq: i64,
    czxid: i64,
    /// The server's clock when it was created (milliseconds since the epoch).
    ctime: i64,
    /// A local instant after its creation (when the reply arrived).
    seen: Instant,
}

/// Percent-encodes a lock key into one znode name: ASCII letters, digits, `_`, `-` and `:` are
/// kept, every other byte (`/`, `.`, `%`, non-ASCII, …) becomes `%XX`.
fn encode(key: &str) -> String {
    let mut out = String::with_capacity(key.len());
    for b in key.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b':') {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// The sequence number of a lock node's name, if it is one of ours.
fn sequence(child: &str) -> Option<i64> {
    let rest = child.strip_prefix(NODE_PREFIX)?;
    rest.rsplit_once('-')?.1.parse().ok()
}

/// The lock nodes among `children`, lowest sequence first.
fn queue(children: Vec<String>) -> Vec<(i64, String)> {
    let mut nodes: Vec<(i64, String)> = children.into_iter().filter_map(|c| sequence(&c).map(|s| (s, c))).collect();
    nodes.sort_unstable();
    nodes
}

fn parent(path: &str) -> &str {
    path.rsplit_once('/').map_or(path, |(dir, _)| dir)
}

/// Waits (briefly) until `client` is connected again after a connection loss.
async fn wait_connected(client: &Client) -> Result<(), zookeeper_client::Error> {
    let mut watcher = client.state_watcher();
    let mut state = watcher.state();
    let until = tokio::time::Instant::now() + client.session_timeout();
    loop {
        match state {
            SessionState::SyncConnected => return Ok(()),
            s if s.is_terminated() => return Err(zookeeper_client::Error::SessionExpired),
            _ => match tokio::time::timeout_at(until, watcher.changed()).await {
                Ok(next) => state = next,
                Err(_) => return Err(zookeeper_client::Error::ConnectionLoss),
            },
        }
    }
}

/// Finds the node of `owner` under `dir`, if it exists.
async fn find_own(client: &Client, dir: &str, owner: &str) -> Result<Option<Node>, zookeeper_client::Error> {
    let mine = format!("{NODE_PREFIX}{owner}-");
    let children = match client.list_children(dir).await {
        Ok(children) => children,
        Err(zookeeper_client::Error::NoNode) => return Ok(None),
        Err(e) => return Err(e),
    };
    for child in children.into_iter().filter(|c| c.starts_with(&mine)) {
        let Some(seq) = sequence(&child) else { continue };
        let path = format!("{dir}/{child}");
        if let Some(stat) = client.check_stat(&path).await? {
            return Ok(Some(Node {
                path: Arc::from(path),
                seq,
                czxid: stat.czxid,
                ctime: stat.ctime,
                seen: Instant::now(),
            }));
        }
    }
    Ok(None)
}

/// Deletes the lock node at `path`, then its parent if that is now empty (pipelined: the
/// requests are sent back to back, the parent's delete failing harmlessly when not empty).
async fn delete_node(client: &Client, path: &str) -> Result<(), zookeeper_client::Error> {
    let node = client.delete(path, None);
    let dir = client.delete(parent(path), None);
    let result = node.await;
    let _ = dir.await;
    result
}

/// Deletes the nodes an abandoned acquisition may have left: `path` if known, else every node
/// of `owner` under `dir`. Retries across a connection loss; bounded by the session timeout
/// (a node of a session that expires goes with it).
async fn purge(shared: Arc<Shared>, dir: Arc<str>, owner: String, path: Option<Arc<str>>) {
    let Some(session) = lock(&shared.current).clone() else { return };
    let client = session.client.clone();
    let bound = shared.options.operation_timeout + client.session_timeout();
    let work = async {
        for _ in 0..4 {
            let target = match &path {
                Some(p) => Some(p.to_string()),
                None => match find_own(&client, &dir, &owner).await {
                    Ok(found) => found.map(|n| n.path.to_string()),
                    Err(zookeeper_client::Error::ConnectionLoss) => {
                        if wait_connected(&client).await.is_err() {
                            return;
                        }
                        continue;
                    }
                    Err(_) => return,
                },
            };
            let Some(target) = target else { return };
            match delete_node(&client, &target).await {
                Ok(()) | Err(zookeeper_client::Error::NoNode) => return,
                Err(zookeeper_client::Error::ConnectionLoss) => {
                    if wait_connected(&client).await.is_err() {
                        return;
                    }
                }
                Err(e) => {
                    tracing::warn!(node = %target, error = %e, "could not delete an abandoned ZooKeeper lock node");
                    return;
                }
            }
        }
    };
    if tokio::time::timeout(bound, work).await.is_err() {
        tracing::warn!(dir = %dir, "gave up deleting an abandoned ZooKeeper lock node; it goes with its session");
    }
}

/// Deletes the acquisition's node if the acquisition stops half-way (its future dropped, or an
/// error), so no orphan blocks the queue.
struct Pending {
    shared: Arc<Shared>,
    dir: Arc<str>,
    owner: String,
    path: Option<Arc<str>>,
    armed: bool,
}

impl Pending {
    fn disarm(&mut self) {
        self.armed = false;
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let job = purge(self.shared.clone(), self.dir.clone(), std::mem::take(&mut self.owner), self.path.take());
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                runtime.spawn(job);
            }
            Err(_) => {
                tracing::warn!(dir = %self.dir, "acquisition dropped outside a tokio runtime; its node goes with the session")
            }
        }
    }
}

/// Decrements the waiting gauge when a wait stops waiting, however it stops.
struct Waiting<'a>(&'a AtomicU64);

impl<'a> Waiting<'a> {
    fn new(gauge: &'a AtomicU64) -> Self {
        gauge.fetch_add(1, Ordering::Relaxed);
        Waiting(gauge)
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Watches the session of one backend: fires `lost()` on its locks when it expires or stays
/// disconnected past `grace`. Ends with the session (the backend dropped closes it).
async fn supervise(
    shared: Weak<Shared>,
    session: Weak<Session>,
    generation: u64,
    mut watcher: zookeeper_client::StateWatcher,
    grace: Duration,
) {
    let mut state = watcher.peek_state();
    let reason = loop {
        state = match state {
            SessionState::Disconnected => {
                tokio::select! {
                    next = watcher.changed() => next,
                    _ = tokio::time::sleep(grace) => {
                        break format!("the ZooKeeper session was disconnected for longer than {grace:?}");
                    }
                }
            }
            s if s.is_terminated() => break format!("the ZooKeeper session ended ({s})"),
            _ => watcher.changed().await,
        };
    };
    if let Some(shared) = shared.upgrade() {
        ZookeeperBackend::session_lost(&shared, session.upgrade(), generation, &reason);
    }
}

/// Runs while a lock is held: deletes the node when a fixed lease ends, and fires `lost()` if
/// the node disappears for any other reason. Aborted by the release.
async fn hold(
    shared: Weak<Shared>,
    client: Client,
    path: Arc<str>,
    lease_end: Option<Instant>,
    lost: LostSignal,
    released: Arc<AtomicBool>,
) {
    let lease_over = async {
        match lease_end {
            Some(at) => tokio::time::sleep_until(at.into()).await,
            None => std::future::pending().await,
        }
    };
    tokio::pin!(lease_over);
    // Watch our own node (a failed watch only loses the extra detection; the lease still ends).
    let watched = tokio::select! {
        watched = client.check_and_watch_stat(&path) => watched.ok(),
        _ = &mut lease_over => None,
    };
    let deleted = async {
        match watched {
            Some((Some(_), watcher)) => watcher.changed().await.event_type == EventType::NodeDeleted,
            Some((None, _)) => true,
            None => std::future::pending().await,
        }
    };
    tokio::select! {
        deleted = deleted => {
            if released.load(Ordering::Acquire) || !deleted {
                // Released by its owner; session events are handled by the session's supervisor.
                return;
            }
            lost.fire("its ZooKeeper node was deleted by someone else");
        }
        _ = &mut lease_over => {
            tracing::debug!(node = %path, "fixed lease over: deleting the lock node");
            if let Some(shared) = shared.upgrade() {
                lock(&shared.holders).remove(&path);
                drop(shared);
            }
            for _ in 0..4 {
                match delete_node(&client, &path).await {
                    Ok(()) | Err(zookeeper_client::Error::NoNode) => return,
                    Err(zookeeper_client::Error::ConnectionLoss) if wait_connected(&client).await.is_ok() => {}
                    Err(e) => {
                        tracing::warn!(node = %path, error = %e, "could not delete a lock node whose lease ended");
                        return;
                    }
                }
            }
            return;
        }
    }
    if let Some(shared) = shared.upgrade() {
        lock(&shared.holders).remove(&path);
    }
}

impl LockBackend for ZookeeperBackend {
    fn kind(&self) -> &'static str {
        KIND
    }

    fn try_acquire<'a>(&'a self, req: &'a Acquire<'a>) -> BoxFuture<'a, Result<Attempt, LockError>> {
        Box::pin(async move {
            let granted_at = Instant::now();
            let session = self.session(req.name, "acquire").await?;
            let dir: Arc<str> = Arc::from(self.lock_path(req.key));
            let owner = req.owner.to_string();
            let mut pending = Pending {
                shared: self.shared.clone(),
                dir: dir.clone(),
                owner: owner.clone(),
                path: None,
                armed: true,
            };
            let fail = |e| zk_error(req.name, "acquire", e);
            let node = self.create_node(&session, &dir, &owner, &lease_data(req.lease)).await.map_err(fail)?;
            pending.path = Some(node.path.clone());
            let children = session.client.list_children(&dir).await.map_err(fail)?;
            let nodes = queue(children);
            match nodes.first() {
                Some((seq, _)) if *seq == node.seq => {
                    if !self.register(&session, req, &node, granted_at) {
                        return Err(session_gone(req.name, "acquire"));
                    }
                    pending.disarm();
                    Ok(Attempt::Acquired(Self::grant(&node, granted_at)))
                }
                Some(_) if nodes.iter().any(|(seq, _)| *seq == node.seq) => {
                    // Busy: take our node out again so a caller that stops here leaves nothing.
                    match session.client.delete(&node.path, None).await {
                        Ok(()) | Err(zookeeper_client::Error::NoNode) => pending.disarm(),
                        Err(e) => return Err(fail(e)), // `pending` deletes it in the background
                    }
                    Ok(Attempt::Busy(Busy { expires_in: None }))
                }
                _ => Err(gone(req.name, "acquire", "its new lock node vanished (the session ended)".to_owned())),
            }
        })
    }

    fn wait<'a>(
        &'a self,
        req: &'a Acquire<'a>,
        _busy: &'a Busy,
        deadline: Instant,
    ) -> BoxFuture<'a, Result<Wake, LockError>> {
        Box::pin(async move {
            let session = self.session(req.name, "wait for").await?;
            let client = &session.client;
            let dir: Arc<str> = Arc::from(self.lock_path(req.key));
            let owner = req.owner.to_string();
            let mut pending = Pending {
                shared: self.shared.clone(),
                dir: dir.clone(),
                owner: owner.clone(),
                path: None,
                armed: true,
            };
            let fail = |e| zk_error(req.name, "wait for", e);
            let node = self.create_node(&session, &dir, &owner, &lease_data(req.lease)).await.map_err(fail)?;
            pending.path = Some(node.path.clone());
            loop {
                let checked_at = Instant::now();
                let nodes = queue(client.list_children(&dir).await.map_err(fail)?);
                let Some(index) = nodes.iter().position(|(seq, _)| *seq == node.seq) else {
                    return Err(gone(req.name, "wait for", "its lock node vanished (the session ended)".to_owned()));
                };
                if index == 0 {
                    if !self.register(&session, req, &node, checked_at) {
                        return Err(session_gone(req.name, "wait for"));
                    }
                    pending.disarm();
                    return Ok(Wake::Acquired(Self::grant(&node, checked_at)));
                }
                let predecessor = format!("{dir}/{}", nodes[index - 1].1);
                // Watch the predecessor; when it is the holder, also read the fixed lease it
                // recorded, to free the lock if the holder's process cannot (see `stale_at`).
                let (stale_at, watcher) = if index == 1 {
                    match client.get_and_watch_data(&predecessor).await {
                        Ok((data, stat, watcher)) => (stale_at(&data, &stat, &node), watcher),
                        Err(zookeeper_client::Error::NoNode) => continue, // gone since the listing
                        Err(e) => return Err(fail(e)),
                    }
                } else {
                    match client.check_and_watch_stat(&predecessor).await.map_err(fail)? {
                        (Some(_), watcher) => (None, watcher),
                        (None, _) => continue, // gone since the listing: look again
                    }
                };
                let stale = async {
                    match stale_at {
                        Some(at) => tokio::time::sleep_until(at.into()).await,
                        None => std::future::pending().await,
                    }
                };
                let _waiting = Waiting::new(&self.shared.waiting);
                tokio::select! {
                    biased;
                    event = watcher.changed() => {
                        self.shared.wakeups.fetch_add(1, Ordering::Relaxed);
                        if event.event_type == EventType::Session && event.session_state.is_terminated() {
                            return Err(gone(req.name, "wait for", format!("the ZooKeeper session ended ({}) while waiting", event.session_state)));
                        }
                    }
                    _ = session.lost() => return Err(session_gone(req.name, "wait for")),
                    _ = stale, if stale_at.is_some_and(|at| at < deadline) => {
                        tracing::warn!(node = %predecessor, "the holder's fixed lease is over but its node remains: deleting it");
                        match client.delete(&predecessor, None).await {
                            Ok(()) | Err(zookeeper_client::Error::NoNode) => {}
                            Err(e) => return Err(fail(e)),
                        }
                    }
                    _ = tokio::time::sleep_until(deadline.into()) => {
                        match delete_node(client, &node.path).await {
                            Ok(()) | Err(zookeeper_client::Error::NoNode) => pending.disarm(),
                            Err(e) => tracing::debug!(node = %node.path, error = %e, "timed-out waiter: delete failed, retrying in the background"),
                        }
                        return Ok(Wake::TimedOut);
                    }
                }
            }
        })
    }

    fn extend<'a>(&'a self, held: &'a Held, _lease: Duration) -> BoxFuture<'a, Result<(), LockError>> {
        Box::pin(async move {
            let Some(path) = held.tag.clone() else {
                return Err(LockError::lost(&*held.name, "it has no ZooKeeper node"));
            };
            if !lock(&self.shared.holders).contains_key(&path) {
                return Err(LockError::lost(&*held.name, "its ZooKeeper session or lease ended"));
            }
            let session = self.session(&held.name, "extend").await?;
            match session.client.check_stat(&path).await {
                Ok(Some(_)) => Ok(()),
                Ok(None) => Err(LockError::lost(&*held.name, "its ZooKeeper node is gone")),
                Err(e) => Err(zk_error(&held.name, "extend", e)),
            }
        })
    }

    fn release<'a>(&'a self, held: &'a Held) -> BoxFuture<'a, Result<(), LockError>> {
        Box::pin(async move {
            let Some(path) = held.tag.clone() else {
                return Err(LockError::lost(&*held.name, "it has no ZooKeeper node"));
            };
            let entry = lock(&self.shared.holders).remove(&path);
            if let Some(entry) = &entry {
                entry.released.store(true, Ordering::Release);
                if let Some(task) = &entry.task {
                    task.abort();
                }
            }
            let dir: Arc<str> = Arc::from(parent(&path));
            let background = |shared: Arc<Shared>| {
                tokio::spawn(purge(shared, dir.clone(), String::new(), Some(path.clone())));
            };
            let session = match self.session(&held.name, "release").await {
                Ok(session) => session,
                Err(e) => {
                    background(self.shared.clone());
                    return Err(e);
                }
            };
            match delete_node(&session.client, &path).await {
                Ok(()) if entry.is_some() => Ok(()),
                Ok(()) => Err(LockError::lost(&*held.name, "its ZooKeeper session or lease had ended")),
                Err(zookeeper_client::Error::NoNode) => Err(LockError::lost(
                    &*held.name,
                    "its ZooKeeper node was already gone (the session expired, or the lease ended)",
                )),
                Err(e) => {
                    background(self.shared.clone());
                    Err(zk_error(&held.name, "release", e))
                }
            }
        })
    }

    fn operation_timeout(&self) -> Duration {
        self.shared.options.operation_timeout
    }
}

/// The data stored in a lock node: the fixed lease, if any, so that waiters in other processes
/// can free the lock if the holder's process cannot.
fn lease_data(lease: Lease) -> Vec<u8> {
    match lease {
        Lease::Fixed(d) => format!("lease_ms={}", d.as_millis()).into_bytes(),
        Lease::Renewed(_) => Vec::new(),
    }
}

/// Added to a holder's fixed lease before a waiter deletes its node: covers a step of the
/// server's wall clock (or a leader change) between the two creations being compared.
pub const STALE_HOLDER_MARGIN: Duration = Duration::from_secs(1);

/// When a waiter may delete the holder's node: the holder recorded a fixed lease, and that
/// lease plus [`STALE_HOLDER_MARGIN`] has passed. Both creation times come from the server's
/// clock, so no client clocks are compared: the holder's lease ran from before its create
/// reached the server (`holder.ctime`), and `own` was created at server time `own.ctime`, which
/// the local clock had passed by `own.seen`.
fn stale_at(data: &[u8], holder: &zookeeper_client::Stat, own: &Node) -> Option<Instant> {
    let lease_ms: i64 = std::str::from_utf8(data).ok()?.strip_prefix("lease_ms=")?.parse().ok()?;
    let left_ms = holder.ctime.checked_add(lease_ms)?.checked_sub(own.ctime)?.max(0);
    own.seen.checked_add(Duration::from_millis(u64::try_from(left_ms).ok()?) + STALE_HOLDER_MARGIN)
}

impl LockManager {
    /// A manager on ZooKeeper at `hosts` (`"host:port,host:port"`) with default settings; same
    /// as `LockManager::builder().zookeeper(hosts)`. See [`ZookeeperBackend`] for the options.
    ///
    /// ```no_run
    /// # #[tokio::main] async fn main() -> Result<(), lock_runtime::LockError> {
    /// let manager = lock_runtime::LockManager::zookeeper("127.0.0.1:2181").await?;
    /// let guard = manager.lock("order:42").await?;
    /// guard.release().await?;
    /// # Ok(()) }
    /// ```
    pub async fn zookeeper(hosts: impl AsRef<str>) -> Result<LockManager, LockError> {
        LockManager::builder().zookeeper(hosts).await
    }
}

impl LockManagerBuilder {
    /// A manager on ZooKeeper at `hosts` with the default [`ZookeeperOptions`]; for other
    /// options, pass [`ZookeeperBackend::connect_with`]'s backend to
    /// [`backend`](LockManagerBuilder::backend).
    ///
    /// ```no_run
    /// # use std::time::Duration;
    /// # #[tokio::main] async fn main() -> Result<(), lock_runtime::LockError> {
    /// let manager = lock_runtime::LockManager::builder()
    ///     .prefix("myapp:")
    ///     .default_lease(Duration::from_secs(30))
    ///     .zookeeper("zk1:2181,zk2:2181,zk3:2181")
    ///     .await?;
    /// # Ok(()) }
    /// ```
    pub async fn zookeeper(self, hosts: impl AsRef<str>) -> Result<LockManager, LockError> {
        Ok(self.backend(ZookeeperBackend::connect(hosts).await?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::OwnerId;

    #[test]
    fn names_become_one_safe_znode_name() {
        assert_eq!(encode("order:42"), "order:42");
        assert_eq!(encode("a/b"), "a%2Fb");
        assert_eq!(encode(".."), "%2E%2E");
        assert_eq!(encode("100%"), "100%25");
        assert_eq!(encode("é"), "%C3%A9");
        assert_ne!(encode("a/b"), encode("a%2Fb"));
    }

    #[test]
    fn queue_orders_by_sequence_and_skips_foreign_children() {
        let q = queue(vec![
            "lk-ab-1-0000000010".into(),
            "lk-cd-2-0000000002".into(),
            "foreign".into(),
            "lk-ef-3-0000000007".into(),
        ]);
        let seqs: Vec<i64> = q.iter().map(|(s, _)| *s).collect();
        assert_eq!(seqs, [2, 7, 10]);
    }

    #[test]
    fn bad_options_are_invalid() {
        for root in ["", "/", "locks", "/locks/", "/a//b", "/a/../b"] {
            let err = ZookeeperOptions::new().root(root).check("h:1").expect_err(root);
            assert!(err.is_invalid(), "{root}: {err}");
        }
        assert!(ZookeeperOptions::new().session_timeout(Duration::ZERO).check("h:1").is_err());
        assert!(ZookeeperOptions::new().check("h:1").is_ok());
    }

    #[test]
    fn owner_ids_fit_node_names() {
        let owner = OwnerId::next().to_string();
        assert!(!owner.contains('/'));
        assert_eq!(sequence(&format!("lk-{owner}-0000000042")), Some(42));
    }
}
