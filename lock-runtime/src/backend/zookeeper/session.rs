//! The ZooKeeper session of a backend: connecting (and reconnecting after a loss), the
//! supervisor that reports locks lost when the session ends or stays disconnected, and the
//! registry of the locks held through it.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use tokio::task::AbortHandle;
use zookeeper_client::{Acls, Client, CreateMode, SessionState};

use super::options::ZookeeperOptions;
use super::{gone, lock, zk_error};
use crate::error::LockError;
use crate::lost::LostSignal;

/// What every clone of a backend (and every acquisition and held lock it made) shares.
pub(super) struct Shared {
    pub(super) hosts: String,
    pub(super) options: ZookeeperOptions,
    /// The live session, if any; `None` after a session loss until the next operation connects.
    current: Mutex<Option<Arc<Session>>>,
    /// Serialises reconnection.
    connecting: tokio::sync::Mutex<()>,
    /// Locks held through this backend, by node path.
    pub(super) holders: Mutex<HashMap<Arc<str>, HolderEntry>>,
    generations: AtomicU64,
    pub(super) wakeups: AtomicU64,
    pub(super) waiting: AtomicU64,
    /// Lock containers with a clean-up by owner id in progress (see `purge`), and how many.
    pub(super) purging: Mutex<HashMap<Arc<str>, usize>>,
    /// Notified whenever such a clean-up ends.
    pub(super) purged: tokio::sync::Notify,
}

/// One ZooKeeper session. Lock nodes are ephemeral: they live exactly as long as it does.
pub(super) struct Session {
    pub(super) client: Client,
    pub(super) generation: u64,
    /// Set (under the `holders` lock) once the session is lost: nothing is granted through it
    /// afterwards.
    pub(super) dead: AtomicBool,
    /// Wakes the waits of a session that is lost.
    died: tokio::sync::Notify,
}

impl Session {
    /// Whether the session was lost (its nodes are gone, or will be when it expires).
    pub(super) fn is_dead(&self) -> bool {
        self.dead.load(Ordering::Acquire)
    }

    /// Completes once the session is lost.
    pub(super) async fn lost(&self) {
        let notified = self.died.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        if self.is_dead() {
            return;
        }
        notified.await
    }
}

/// A lock held through the backend: what a session loss must fire and stop.
pub(super) struct HolderEntry {
    pub(super) generation: u64,
    pub(super) lost: LostSignal,
    pub(super) released: Arc<AtomicBool>,
    pub(super) task: Option<AbortHandle>,
}

impl HolderEntry {
    /// Stops the lock's background task (it must not report the release as a loss).
    pub(super) fn stop(&self) {
        self.released.store(true, Ordering::Release);
        if let Some(task) = &self.task {
            task.abort();
        }
    }
}

impl Drop for Shared {
    fn drop(&mut self) {
        for (_, entry) in lock(&self.holders).drain() {
            entry.stop();
        }
    }
}

impl Shared {
    pub(super) fn new(hosts: &str, options: ZookeeperOptions) -> Self {
        Shared {
            hosts: hosts.to_owned(),
            options,
            current: Mutex::new(None),
            connecting: tokio::sync::Mutex::new(()),
            holders: Mutex::new(HashMap::new()),
            generations: AtomicU64::new(0),
            wakeups: AtomicU64::new(0),
            waiting: AtomicU64::new(0),
            purging: Mutex::new(HashMap::new()),
            purged: tokio::sync::Notify::new(),
        }
    }

    /// The manager's shutdown: the clean-ups of dropped acquisitions under way finish, then
    /// the session is let go of (the client closes it once its last handle is gone, and the
    /// server deletes its ephemeral nodes at once).
    pub(super) async fn shut_down(&self) {
        loop {
            let purged = self.purged.notified();
            if lock(&self.purging).is_empty() {
                break;
            }
            purged.await;
        }
        drop(lock(&self.current).take());
    }

    pub(super) fn sessions(&self) -> u64 {
        self.generations.load(Ordering::Relaxed)
    }

    /// The live session, connecting a new one if there is none (after a session loss).
    pub(super) async fn session(
        self: &Arc<Self>,
        name: &str,
        operation: &'static str,
    ) -> Result<Arc<Session>, LockError> {
        if let Some(session) = self.usable(name, operation).await? {
            return Ok(session);
        }
        let _connecting = self.connecting.lock().await;
        if let Some(session) = self.usable(name, operation).await? {
            return Ok(session);
        }
        let bound = self.options.get_operation_timeout();
        let session_timeout = self.options.get_session_timeout();
        let connector = Client::connector()
            .with_session_timeout(session_timeout)
            .with_connection_timeout(connection_timeout(session_timeout, &self.hosts))
            .with_fail_eagerly();
        let connector = match self.options.get_digest() {
            Some(d) => connector.with_auth("digest", format!("{}:{}", d.user, d.password).as_bytes()),
            None => connector,
        };
        let deadline = tokio::time::Instant::now() + bound;
        #[cfg(feature = "tls-aws-lc")]
        let tls = match self.options.get_tls() {
            Some(settings) => Some(client_tls(settings, &self.hosts)?),
            None => None,
        };
        #[cfg(feature = "tls-aws-lc")]
        let probe = tls.as_ref().map(|(_, config)| config.clone());
        let connect = async {
            // Every host of the list on its secure client port.
            #[cfg(feature = "tls-aws-lc")]
            if let Some((tls, _)) = tls {
                return connector.with_tls(tls).secure_connect(&self.hosts).await;
            }
            connector.connect(&self.hosts).await
        };
        let client = match tokio::time::timeout_at(deadline, connect).await {
            Ok(Ok(client)) => client,
            Ok(Err(e @ zookeeper_client::Error::BadArguments(_))) => return Err(zk_error(name, operation, e)),
            Ok(Err(e)) => {
                #[allow(unused_mut)]
                let mut why = format!("could not connect to ZooKeeper at `{}`: {e}", self.hosts);
                // The client says only "no available hosts": a handshake of our own tells why.
                #[cfg(feature = "tls-aws-lc")]
                if let Some(config) = probe {
                    if let Some(failed) = handshake_failure(&self.hosts, config, deadline).await {
                        why = format!("{why} ({failed})");
                    }
                }
                return Err(gone(name, operation, why));
            }
            Err(_) => {
                return Err(gone(
                    name,
                    operation,
                    format!("could not connect to ZooKeeper at `{}` within {bound:?}", self.hosts),
                ))
            }
        };
        let persistent = CreateMode::Persistent.with_acls(Acls::anyone_all());
        let create_root = client.mkdir(self.options.get_root(), &persistent);
        match tokio::time::timeout(bound, create_root).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => return Err(zk_error(name, operation, e)),
            Err(_) => return Err(gone(name, operation, format!("could not create the lock root within {bound:?}"))),
        }
        let generation = self.generations.fetch_add(1, Ordering::Relaxed) + 1;
        let watch = Watch {
            grace: self.options.get_lost_after_disconnect(),
            confirm: Confirm::new(client.session_timeout()),
            root: self.options.get_root().to_owned(),
        };
        let watcher = client.state_watcher();
        let session = Arc::new(Session { client, generation, dead: AtomicBool::new(false), died: Default::default() });
        *lock(&self.current) = Some(session.clone());
        tokio::spawn(supervise(Arc::downgrade(self), Arc::downgrade(&session), watcher, watch));
        tracing::debug!(hosts = %self.hosts, generation, "ZooKeeper session established");
        Ok(session)
    }

    /// The current session if it is connected; waits up to half the operation timeout for a
    /// disconnected one to reconnect; `None` when there is none.
    async fn usable(&self, name: &str, operation: &'static str) -> Result<Option<Arc<Session>>, LockError> {
        let Some(session) = lock(&self.current).clone() else { return Ok(None) };
        if session.is_dead() {
            return Ok(None);
        }
        let mut watcher = session.client.state_watcher();
        let mut state = watcher.state();
        if state == SessionState::SyncConnected {
            return Ok(Some(session));
        }
        if state.is_terminated() {
            return Ok(None);
        }
        // Half the operation's bound: a client reconnecting after a server restart can take more
        // than a second on a loaded machine (a fresh-clone CI run saw the first `lock()` after a
        // restart fail at 1 s), and the operation itself keeps the other half.
        let patience = self.options.get_operation_timeout() / 2;
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
                    self.hosts
                ),
            )),
        }
    }

    /// Reports every lock held through `session` lost and forgets the session.
    fn session_lost(&self, session: Option<Arc<Session>>, generation: u64, reason: &str) {
        {
            let mut current = lock(&self.current);
            if current.as_ref().is_some_and(|s| s.generation == generation) {
                *current = None;
            }
        }
        let lost: Vec<HolderEntry> = {
            let mut holders = lock(&self.holders);
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
            if let Some(task) = &entry.task {
                task.abort();
            }
            entry.lost.fire(reason.to_owned());
        }
    }
}

/// What the supervisor of a session watches for.
struct Watch {
    /// `lost_after_disconnect`, if set.
    grace: Option<Duration>,
    confirm: Confirm,
    /// The lock root (the path synced).
    root: String,
}

/// How a session is confirmed with the ensemble's leader: a `sync` every `every`; the session
/// is believed alive for `within` after the last confirmed one was sent.
///
/// The connection alone cannot tell: a follower cut from its leader goes on answering its
/// clients' pings until it notices (`syncLimit` ticks, 10 s with the usual settings), while the
/// leader, which no longer hears of the session, ends it a session timeout after the cut and
/// lets another client take its locks. A `sync` goes through the leader, so one answered says
/// that the follower still reached it (and so, within half a tick, forwarded the session's
/// touches) after it was sent.
#[derive(Debug, Clone, Copy)]
struct Confirm {
    every: Duration,
    within: Duration,
}

impl Confirm {
    /// For a negotiated session timeout `t`: a sync every `t/8`, the session believed alive for
    /// `3t/4` after the last confirmed one was sent. The ensemble can end it `t` after the leader
    /// last heard of it, so `lost()` fires at least `t/4` less half a tick before (6 s sessions
    /// on 2 s ticks: 0.5 s), and a leader's failure is survived if a new one is elected and
    /// the session reconnected within `5t/8` of the last confirmation (ensembles that notice a
    /// lost leader after `syncLimit` ticks need `syncLimit × tickTime` well below that).
    fn new(t: Duration) -> Self {
        Confirm { every: (t / 8).max(Duration::from_millis(1)), within: t * 3 / 4 }
    }
}

/// Watches the session of one backend: fires `lost()` on its locks when it expires or is
/// closed, when the ensemble's leader has not confirmed it for `confirm.within` ([`Confirm`]),
/// or when it stays disconnected past `lost_after_disconnect` (if set). Ends with the session
/// (the backend dropped closes it).
async fn supervise(
    shared: Weak<Shared>,
    session: Weak<Session>,
    mut watcher: zookeeper_client::StateWatcher,
    watch: Watch,
) {
    let generation = match session.upgrade() {
        Some(s) => s.generation,
        None => return,
    };
    let Confirm { every, within } = watch.confirm;
    let mut state = watcher.peek_state();
    let now = tokio::time::Instant::now();
    // Just made: the session's creation went through the leader.
    let (mut confirmed, mut next_sync, mut disconnected_at) = (now, now + every, now);
    let reason = loop {
        if state.is_terminated() {
            break format!("the ZooKeeper session ended ({state})");
        }
        let grace = watch.grace.filter(|_| state == SessionState::Disconnected);
        let disconnected_too_long = async {
            match grace {
                Some(grace) => tokio::time::sleep_until(disconnected_at + grace).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            next = watcher.changed() => {
                state = next;
                match state {
                    SessionState::Disconnected => disconnected_at = tokio::time::Instant::now(),
                    // Confirm at once after a reconnection.
                    SessionState::SyncConnected => next_sync = tokio::time::Instant::now(),
                    _ => {}
                }
            }
            () = disconnected_too_long => {
                let grace = grace.unwrap_or_default();
                break format!("the ZooKeeper session was disconnected for longer than {grace:?}");
            }
            () = tokio::time::sleep_until(confirmed + within) => {
                break format!(
                    "the ZooKeeper ensemble's leader did not confirm the session for {within:?} (the ensemble \
                     may end it and grant its locks to others)"
                );
            }
            synced = sync_once(&session, &watch.root, next_sync, every) => match synced {
                None => return, // the backend is gone, and the session with it
                Some((sent, answered)) => {
                    if answered {
                        confirmed = confirmed.max(sent);
                    }
                    next_sync = if answered { sent + every } else { tokio::time::Instant::now() + every / 4 };
                }
            },
        }
    };
    if let Some(shared) = shared.upgrade() {
        shared.session_lost(session.upgrade(), generation, &reason);
    }
}

/// At `at`, a `sync` of `root` on the session, waited for at most `patience`: when it was sent
/// and whether it was answered; `None` once the session is dropped.
async fn sync_once(
    session: &Weak<Session>,
    root: &str,
    at: tokio::time::Instant,
    patience: Duration,
) -> Option<(tokio::time::Instant, bool)> {
    tokio::time::sleep_until(at).await;
    let session = session.upgrade()?;
    let sent = tokio::time::Instant::now();
    let answered = matches!(tokio::time::timeout(patience, session.client.sync(root)).await, Ok(Ok(())));
    Some((sent, answered))
}

/// Waits until `client` is connected again after a connection loss, at most `patience` (and
/// never past the session's end).
pub(super) async fn wait_connected(client: &Client, patience: Duration) -> Result<(), zookeeper_client::Error> {
    let mut watcher = client.state_watcher();
    let mut state = watcher.state();
    let until = tokio::time::Instant::now() + patience.min(client.session_timeout());
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

/// Counts the acquisitions waiting on a watch while it lives.
pub(super) struct Waiting<'a>(&'a AtomicU64);

impl<'a> Waiting<'a> {
    pub(super) fn new(gauge: &'a AtomicU64) -> Self {
        gauge.fetch_add(1, Ordering::Relaxed);
        Waiting(gauge)
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// The ZooKeeper client's TLS settings from ours: the trusted roots (the CAs given and the
/// platform's) and the client identity, as PEM text; the process's rustls provider installed
/// (the client builds its configuration on it).
#[cfg(feature = "tls-aws-lc")]
fn client_tls(
    settings: &crate::tls::TlsOptions,
    hosts: &str,
) -> Result<(zookeeper_client::TlsOptions, Arc<rustls::ClientConfig>), LockError> {
    let loaded = settings.load(hosts)?;
    crate::tls::install_provider();
    let invalid = |what: &str, e: zookeeper_client::Error| LockError::invalid(hosts, format!("{what}: {e}"));
    let text = |pem: &[u8], what: &str| {
        std::str::from_utf8(pem)
            .map(str::to_owned)
            .map_err(|_| LockError::invalid(hosts, format!("{what} is not UTF-8 PEM text")))
    };
    let mut tls = zookeeper_client::TlsOptions::new()
        .with_pem_ca(&text(&loaded.roots_pem(), "the TLS CA")?)
        .map_err(|e| invalid("the TLS CAs are not usable by the ZooKeeper client", e))?;
    if let Some((cert, key)) = &loaded.identity {
        tls = tls
            .with_pem_identity(&text(cert, "the TLS client certificate")?, &text(key, "the TLS client key")?)
            .map_err(|e| invalid("the TLS client identity is not usable by the ZooKeeper client", e))?;
    }
    Ok((tls, loaded.config))
}

/// Why a TLS handshake with the first host of `hosts` fails, with the same roots and identity,
/// before `deadline`: `None` when it succeeds, or the host cannot be reached at all.
#[cfg(feature = "tls-aws-lc")]
async fn handshake_failure(
    hosts: &str,
    config: Arc<rustls::ClientConfig>,
    deadline: tokio::time::Instant,
) -> Option<String> {
    let first = hosts.split([',', '/']).next()?.trim();
    let first = first.strip_prefix("tcp+tls://").unwrap_or(first);
    let host = first.rsplit_once(':').map_or(first, |(host, _)| host).trim_matches(['[', ']']);
    let server = rustls::pki_types::ServerName::try_from(host.to_owned()).ok()?;
    let handshake = async {
        let socket = tokio::net::TcpStream::connect(first).await.ok()?;
        tokio_rustls::TlsConnector::from(config).connect(server, socket).await.err()
    };
    let error = tokio::time::timeout_at(deadline, handshake).await.ok()??;
    Some(format!("a TLS handshake with `{first}` failed: {error}"))
}

/// How long a connection may stay silent (and a connect attempt may take) before the client
/// moves to the next member: the client's own default (2/5 of the session timeout) with one
/// server, and with `n` members `1/(2n)` of it (not below 500 ms), so that after a member goes
/// silent every other member is tried within half the session timeout, before the holder is
/// told `lost()` (see [`Confirm`]) and well before the session ends on the ensemble (a client
/// cut from two members of three, its session on one of them, waited 2.4 s for each silent
/// member at a 6 s session and was told `lost()` with the third one up).
fn connection_timeout(session_timeout: Duration, hosts: &str) -> Duration {
    let members = hosts.split(',').filter(|h| !h.trim().is_empty()).count().max(1) as u32;
    let eager = session_timeout / (2 * members);
    (session_timeout * 2 / 5).min(eager.max(Duration::from_millis(500)))
}
