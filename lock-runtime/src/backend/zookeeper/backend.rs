//! [`ZookeeperBackend`] and the types it hands to the runtime: one [`Acquisition`] per `lock()`
//! call, owning its one sequential node, and one [`HeldLock`] per granted lock.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::task::Poll;
use std::time::{Duration, Instant};

use zookeeper_client::{Client, Error as ZkError, EventType, WatchedEvent};

use super::kinds::{self, Verdict};
use super::options::ZookeeperOptions;
use super::purge::{purge, send_delete, Leftover};
use super::recipe::{create_node, encode, find_own, node_acls, queue, stale_at, LeaseRecord, Node};
use super::session::{wait_connected, HolderEntry, Session, Shared, Waiting};
use super::{cut, gone, lock, session_gone, zk_error, KIND};
use crate::backend::{
    Acquire, Acquisition, Attempt, BoxFuture, Grant, Held, HeldLock, Lease, LockBackend, LockKind, Wake,
};
use crate::error::LockError;
use crate::lost::LostSignal;

/// Counters of a [`ZookeeperBackend`], for metrics and tests.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ZookeeperStats {
    /// How many times a waiting acquisition was woken by the deletion of its predecessor (or,
    /// for the lock kinds, by any change of a node it watches). With no herd, each release wakes
    /// one waiter (one per reader it lets in; two for a semaphore: the first waiter, then the
    /// one behind it through the grant's record).
    pub wakeups: u64,
    /// How many acquisitions wait on a predecessor's watch right now.
    pub waiting: u64,
    /// How many sessions were established (1 plus the reconnections after a session loss).
    pub sessions: u64,
}

/// The ZooKeeper lock store. Cheap to clone: clones share one session. See the
/// [module docs](super) for the recipe and how leases and sessions map onto each other.
#[derive(Clone)]
pub struct ZookeeperBackend {
    pub(super) shared: Arc<Shared>,
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

impl ZookeeperBackend {
    /// Connects to `hosts` (`"host:port,host:port"`, optionally followed by a chroot path) with
    /// the default [`ZookeeperOptions`].
    pub async fn connect(hosts: impl AsRef<str>) -> Result<Self, LockError> {
        Self::connect_with(hosts, ZookeeperOptions::new()).await
    }

    /// Connects to `hosts` with `options`; creates the lock root if it is missing. Fails with an
    /// [`is_invalid`](LockError::is_invalid) error for a malformed host list or an option out
    /// of range (see [`ZookeeperOptions`]), and an [`is_backend`](LockError::is_backend) error
    /// when no server answers within the operation timeout.
    pub async fn connect_with(hosts: impl AsRef<str>, options: ZookeeperOptions) -> Result<Self, LockError> {
        let hosts = hosts.as_ref().trim();
        if hosts.is_empty() {
            return Err(LockError::invalid(hosts, "the ZooKeeper host list is empty; give `host:port[,host:port…]`"));
        }
        options.check(hosts)?;
        let backend = ZookeeperBackend { shared: Arc::new(Shared::new(hosts, options)) };
        match backend.shared.session(hosts, "connect").await {
            Ok(_) => Ok(backend),
            Err(LockError::Backend { source, .. })
                if matches!(source.downcast_ref::<ZkError>(), Some(ZkError::BadArguments(_))) =>
            {
                Err(LockError::invalid(hosts, format!("not a valid ZooKeeper host list: {source}")))
            }
            Err(LockError::Backend { source, .. })
                if matches!(source.downcast_ref::<ZkError>(), Some(ZkError::NoNode)) && hosts.contains('/') =>
            {
                let chroot = &hosts[hosts.find('/').unwrap_or(0)..];
                let why = format!(
                    "the chroot `{chroot}` does not exist on the server: create it (`zkCli.sh create {chroot}`), \
                     or leave it out and give the lock root instead (`ZookeeperOptions::root`)"
                );
                Err(LockError::invalid(hosts, why))
            }
            Err(e) => Err(e),
        }
    }

    /// The counters of this backend.
    pub fn stats(&self) -> ZookeeperStats {
        ZookeeperStats {
            wakeups: self.shared.wakeups.load(Ordering::Relaxed),
            waiting: self.shared.waiting.load(Ordering::Relaxed),
            sessions: self.shared.sessions(),
        }
    }

    /// The options this backend was built with.
    pub fn options(&self) -> &ZookeeperOptions {
        &self.shared.options
    }

    /// The znode that holds the nodes of lock `key` (the manager prefix followed by the name).
    pub fn lock_path(&self, key: &str) -> String {
        format!("{}/{}", self.shared.options.get_root(), encode(key))
    }
}

impl LockBackend for ZookeeperBackend {
    fn name(&self) -> &'static str {
        KIND
    }

    /// The mutex, read-write locks and semaphores (see the `kinds` recipes in the module
    /// docs).
    fn supports(&self, kind: LockKind) -> bool {
        matches!(kind, LockKind::Exclusive | LockKind::Read | LockKind::Write | LockKind::Semaphore { .. })
    }

    fn begin(&self, req: Acquire, lost: LostSignal) -> Box<dyn Acquisition> {
        Box::new(ZkAcquisition {
            lost,
            shared: self.shared.clone(),
            dir: Arc::from(format!("{}{}", self.lock_path(&req.key), kinds::dir_suffix(req.kind))),
            tag: Arc::from(kinds::tag(req.kind, &req.owner.to_string())),
            req,
            state: State::Idle,
        })
    }

    fn operation_timeout(&self) -> Duration {
        self.shared.options.get_operation_timeout()
    }

    /// Lets the session go once the clean-ups under way finished (see `session.rs`).
    fn shutdown(&self) -> crate::backend::BoxFuture<'_, ()> {
        Box::pin(self.shared.shut_down())
    }

    fn inspector(&self) -> Option<&dyn crate::backend::Inspect> {
        Some(self)
    }
}

/// One `lock()` call on ZooKeeper: owns its one sequential node from the first attempt until it
/// is granted (the [`ZkHeld`] owns it then) or dropped (the node is deleted).
pub(super) struct ZkAcquisition {
    pub(super) shared: Arc<Shared>,
    pub(super) req: Acquire,
    /// The lock's lost signal once granted (fired on session loss or a foreign delete).
    lost: LostSignal,
    /// The lock's container node.
    pub(super) dir: Arc<str>,
    /// The node's name before `-<sequence>`: its kind's prefix and the owner id.
    tag: Arc<str>,
    state: State,
}

enum State {
    /// No node.
    Idle,
    /// A create was sent through this session; its outcome is unknown.
    Creating(Weak<Session>),
    /// Our node, in the queue. (Sessions are held weakly: a lost session is closed at once,
    /// its nodes go with it.)
    Queued { session: Weak<Session>, node: Node },
    /// Handed to a [`ZkHeld`].
    Granted,
}

impl Drop for ZkAcquisition {
    fn drop(&mut self) {
        match std::mem::replace(&mut self.state, State::Idle) {
            State::Queued { session, node } => {
                let Some(session) = session.upgrade() else { return };
                purge(&self.shared, &session, Leftover::Node(node.path));
            }
            State::Creating(session) => {
                let Some(session) = session.upgrade() else { return };
                purge(&self.shared, &session, Leftover::Owner { dir: self.dir.clone(), tag: self.tag.clone() });
            }
            State::Idle | State::Granted => {}
        }
    }
}

impl Acquisition for ZkAcquisition {
    fn attempt(&mut self) -> BoxFuture<'_, Result<Attempt, LockError>> {
        Box::pin(self.attempt_once())
    }

    fn wait(&mut self, deadline: Instant) -> BoxFuture<'_, Result<Wake, LockError>> {
        Box::pin(self.wait_until(deadline))
    }
}

impl ZkAcquisition {
    pub(super) fn fail(&self, operation: &'static str) -> impl Fn(ZkError) -> LockError + '_ {
        move |e| zk_error(&self.req.name, operation, e)
    }

    fn patience(&self) -> Duration {
        self.shared.options.get_operation_timeout()
    }

    /// Our node, created on first use. The instant is `Some` (taken before the create was
    /// sent) when this call created it.
    pub(super) async fn node(
        &mut self,
        operation: &'static str,
    ) -> Result<(Arc<Session>, Node, Option<Instant>), LockError> {
        match std::mem::replace(&mut self.state, State::Idle) {
            State::Queued { session: weak, node } => {
                let Some(session) = weak.upgrade().filter(|s| !s.is_dead()) else {
                    return Err(session_gone(&self.req.name, operation)); // its node went with it
                };
                self.state = State::Queued { session: weak, node: node.clone() };
                return Ok((session, node, None));
            }
            State::Creating(weak) => {
                // An earlier create was abandoned in flight (its future dropped): the session
                // applies requests in order, so a lookup now sees it if it happened.
                if let Some(session) = weak.upgrade().filter(|s| !s.is_dead()) {
                    self.state = State::Creating(weak);
                    if let Some(node) =
                        find_own(&session.client, &self.dir, &self.tag).await.map_err(self.fail(operation))?
                    {
                        self.state = State::Queued { session: Arc::downgrade(&session), node: node.clone() };
                        return Ok((session, node, None));
                    }
                    self.state = State::Idle;
                }
            }
            State::Granted => {
                self.state = State::Granted;
                return Err(LockError::invalid(&*self.req.name, "this acquisition was already granted"));
            }
            State::Idle => {}
        }
        let before = crate::clock::now();
        // An earlier acquisition of this lock abandoned with a create in flight may have left
        // a node ahead of ours: its clean-up comes first.
        self.shared.purged(&self.dir).await;
        let session = self.shared.session(&self.req.name, operation).await?;
        self.state = State::Creating(Arc::downgrade(&session));
        let data = LeaseRecord::initial(self.req.lease, &self.req.holder);
        let (root, options) = (self.shared.options.get_root(), &self.shared.options);
        let acls = node_acls(options.get_digest().is_some());
        let node = create_node(&session.client, (root, &self.dir), &self.tag, &data, acls, self.patience())
            .await
            .map_err(self.fail(operation))?;
        self.state = State::Queued { session: Arc::downgrade(&session), node: node.clone() };
        Ok((session, node, Some(before)))
    }

    /// The queue under our lock: our place in it and the nodes, lowest first.
    pub(super) async fn lineup(
        &mut self,
        session: &Session,
        node: &Node,
        operation: &'static str,
    ) -> Result<(usize, Vec<(i64, String)>), LockError> {
        let client = &session.client;
        let children = match client.list_children(&self.dir).await {
            Err(ref e) if cut(e) => {
                wait_connected(client, self.patience()).await.map_err(self.fail(operation))?;
                client.list_children(&self.dir).await
            }
            listed => listed,
        };
        let children = children.map_err(self.fail(operation))?;
        let nodes = match self.req.kind {
            LockKind::Exclusive => queue(children),
            _ => kinds::queue(children),
        };
        match nodes.iter().position(|(seq, _)| *seq == node.seq) {
            Some(index) => Ok((index, nodes)),
            None => {
                self.state = State::Idle; // nothing of ours left to delete
                Err(gone(
                    &self.req.name,
                    operation,
                    "its lock node vanished (its session ended, or it was deleted by someone else)".to_owned(),
                ))
            }
        }
    }

    /// Takes the lock: our node is the lowest (or, for the kinds, may hold). A holder that
    /// waited records its grant first (fixed leases, see [`LeaseRecord`], so that waiters count
    /// its lease from it; and every permit, so that the waiter behind it learns it is first).
    pub(super) async fn take(
        &mut self,
        session: Arc<Session>,
        node: Node,
        granted_at: Instant,
        waited: bool,
        operation: &'static str,
    ) -> Result<Grant, LockError> {
        let record = match (self.req.lease, self.req.kind) {
            _ if !waited => None,
            (Lease::Fixed(lease), _) => Some(LeaseRecord::granted(lease, &self.req.holder)),
            (Lease::Renewed(_), LockKind::Semaphore { .. }) => Some(LeaseRecord::granted_unleased(&self.req.holder)),
            (Lease::Renewed(_), _) => None,
        };
        if let Some(data) = record {
            if let Err(e) = record_grant(&session.client, &node.path, &data, self.patience()).await {
                if matches!(e, ZkError::NoNode) {
                    self.state = State::Idle;
                    return Err(gone(
                        &self.req.name,
                        operation,
                        "its lock node was taken away before it recorded its grant (a waiter judged it stale)"
                            .to_owned(),
                    ));
                }
                return Err(zk_error(&self.req.name, operation, e));
            }
        }
        // No await from here on: the grant reaches the runtime, or nothing happened.
        let lease_end = match self.req.lease {
            Lease::Fixed(d) => granted_at.checked_add(d),
            Lease::Renewed(_) => None,
        };
        if !register(&self.shared, &session, &node.path, lease_end, &self.lost) {
            return Err(session_gone(&self.req.name, operation));
        }
        self.state = State::Granted;
        let held = ZkHeld {
            shared: self.shared.clone(),
            session: Arc::downgrade(&session),
            name: self.req.name.clone(),
            path: node.path.clone(),
            holder: self.req.holder.clone(),
            released: false,
        };
        Ok(Grant {
            fencing_token: u64::try_from(node.czxid).unwrap_or(0),
            granted_at: Some(granted_at),
            lock: Held::new(held),
        })
    }

    async fn attempt_once(&mut self) -> Result<Attempt, LockError> {
        let (session, node, created) = self.node("acquire").await?;
        let checked_at = crate::clock::now();
        let (index, nodes) = self.lineup(&session, &node, "acquire").await?;
        if kinds::verdict(&self.req, index, &nodes)? != Verdict::Granted {
            return Ok(Attempt::Busy); // our node keeps our place; dropping us deletes it
        }
        // Granted in the attempt that created the node: the lease runs from before the create.
        let granted_at = created.unwrap_or(checked_at);
        Ok(Attempt::Acquired(self.take(session, node, granted_at, created.is_none(), "acquire").await?))
    }

    /// Lists, judges ([`kinds::verdict`]: a mutex's or writer's node waits for its predecessor,
    /// a reader's for the nearest writer ahead, a permit's for the holders or the waiter ahead),
    /// watches the nodes in its way, and lists again when one changes.
    async fn wait_until(&mut self, deadline: Instant) -> Result<Wake, LockError> {
        const OP: &str = "wait for";
        let (session, node, mut created) = self.node(OP).await?;
        let client = session.client.clone();
        let kind = self.req.kind;
        'list: loop {
            let checked_at = crate::clock::now();
            let (index, nodes) = self.lineup(&session, &node, OP).await?;
            let created = created.take();
            let (targets, behind) = match kinds::verdict(&self.req, index, &nodes)? {
                Verdict::Granted => {
                    let granted_at = created.unwrap_or(checked_at);
                    let grant = self.take(session.clone(), node.clone(), granted_at, created.is_none(), OP).await?;
                    return Ok(Wake::Acquired(grant));
                }
                Verdict::Blocked(targets) => (targets, false),
                Verdict::Behind(target) => (vec![target], true),
            };
            let listed_at = crate::clock::now();
            let mut watches: Vec<Watch> = Vec::with_capacity(targets.len());
            // The earliest a blocking holder's fixed lease is over (see `stale_at`): its node,
            // the version read, and when.
            let mut stale: Option<(Instant, String, i32)> = None;
            for target in targets {
                let Some((_, name)) = nodes.get(target) else { continue 'list };
                let path = format!("{}/{name}", self.dir);
                let holds = kinds::holds(kind, target, &nodes);
                if !holds && !behind {
                    // A waiter in the way: only its deletion matters.
                    match client.check_and_watch_stat(&path).await.map_err(self.fail(OP))? {
                        (Some(_), watcher) => watches.push(Box::pin(watcher.changed())),
                        (None, _) => continue 'list, // gone since the listing: look again
                    }
                    continue;
                }
                let (data, stat, watcher) = match client.get_and_watch_data(&path).await {
                    Ok(read) => read,
                    Err(ZkError::NoNode) => continue 'list, // gone since the listing: look again
                    Err(e) => return Err(self.fail(OP)(e)),
                };
                if behind && stat.version > 0 {
                    // Granted since the listing (it recorded its grant): nodes ahead of ours
                    // went, look again.
                    continue 'list;
                }
                if holds {
                    let at = LeaseRecord::parse(&data).and_then(|r| stale_at(r, &stat, &node, listed_at));
                    if let Some(at) = at.filter(|at| stale.as_ref().is_none_or(|(first, _, _)| at < first)) {
                        stale = Some((at, path, stat.version));
                    }
                }
                watches.push(Box::pin(watcher.changed()));
            }
            let stale_when = stale.as_ref().map(|(at, _, _)| *at).filter(|at| *at < deadline);
            let stale_timer = async {
                match stale_when {
                    Some(at) => tokio::time::sleep_until(at.into()).await,
                    None => std::future::pending().await,
                }
            };
            let waiting = Waiting::new(&self.shared.waiting);
            tokio::select! {
                biased;
                event = first(watches) => {
                    if event.event_type == EventType::Session {
                        if event.session_state.is_terminated() {
                            let why = format!("the ZooKeeper session ended ({}) while waiting", event.session_state);
                            return Err(gone(&self.req.name, OP, why));
                        }
                        continue;
                    }
                    let deleted = event.event_type == EventType::NodeDeleted;
                    // A mutex waiter is woken by its predecessor's deletion (the holder's data
                    // changing as it records its grant is only a reason to look again); the
                    // other kinds by any change of a node in their way.
                    if deleted || kind != LockKind::Exclusive {
                        self.shared.wakeups.fetch_add(1, Ordering::Relaxed);
                    }
                    if deleted && index == 1 && matches!(kind, LockKind::Exclusive | LockKind::Write) {
                        // The only node ahead of ours is gone, and later nodes get higher
                        // sequence numbers: ours is the lowest now, no need to list again.
                        drop(waiting);
                        let granted_at = crate::clock::now();
                        let grant = self.take(session.clone(), node.clone(), granted_at, true, OP).await?;
                        return Ok(Wake::Acquired(grant));
                    }
                }
                _ = session.lost() => return Err(session_gone(&self.req.name, OP)),
                _ = stale_timer => {
                    if let Some((_, path, version)) = &stale {
                        tracing::warn!(node = %path, "a holder's fixed lease is over but its node remains: deleting it");
                        // Conditional on the version read: a holder that recorded its grant
                        // since is judged again from its record.
                        match client.delete(path, Some(*version)).await {
                            Ok(()) | Err(ZkError::NoNode | ZkError::BadVersion) => {}
                            Err(e) => return Err(self.fail(OP)(e)),
                        }
                    }
                }
                _ = tokio::time::sleep_until(deadline.into()) => return Ok(Wake::TimedOut),
            }
        }
    }
}

/// A watch's event, boxed so that several can be awaited at once.
type Watch = Pin<Box<dyn Future<Output = WatchedEvent> + Send>>;

/// The first of `watches` to fire.
async fn first(mut watches: Vec<Watch>) -> WatchedEvent {
    std::future::poll_fn(move |cx| {
        for watch in watches.iter_mut() {
            if let Poll::Ready(event) = watch.as_mut().poll(cx) {
                return Poll::Ready(event);
            }
        }
        Poll::Pending
    })
    .await
}

/// Records a waited holder's grant in its node (conditional on the node's first version, so it
/// fails with `NoNode` if a waiter judged the unrecorded node stale and deleted it). After a
/// lost reply, the node's data tells whether the record was made; and since waiters only ever
/// delete a node, a retry refused with `BadVersion` means that our first write was applied
/// (a follower that had not applied it yet answered the look).
async fn record_grant(client: &Client, path: &str, data: &[u8], patience: Duration) -> Result<(), ZkError> {
    for retry in 0..3 {
        match client.set_data(path, data, Some(0)).await {
            Ok(_) => return Ok(()),
            Err(ZkError::BadVersion) if retry > 0 => return Ok(()),
            Err(ref e) if cut(e) => {
                wait_connected(client, patience).await?;
                let (now, _) = client.get_data(path).await?;
                if LeaseRecord::is_granted(&now) {
                    return Ok(());
                }
            }
            Err(e) => return Err(e),
        }
    }
    Err(ZkError::ConnectionLoss)
}

/// Records a granted lock: its lost signal (fired on session loss), and a task that deletes
/// the node when a fixed lease ends and fires `lost()` if the node is deleted by anyone else.
///
/// Returns `false` (registering nothing) when the session is already lost.
#[must_use]
fn register(
    shared: &Arc<Shared>,
    session: &Session,
    path: &Arc<str>,
    lease_end: Option<Instant>,
    lost: &LostSignal,
) -> bool {
    let mut holders = lock(&shared.holders);
    if session.is_dead() {
        return false;
    }
    let released = Arc::new(AtomicBool::new(false));
    let watch = Hold {
        shared: Arc::downgrade(shared),
        client: session.client.clone(),
        path: path.clone(),
        lease_end,
        lost: lost.clone(),
        released: released.clone(),
        patience: shared.options.get_operation_timeout(),
    };
    let task = tokio::spawn(watch.run()).abort_handle();
    let entry = HolderEntry { generation: session.generation, lost: lost.clone(), released, task: Some(task) };
    holders.insert(path.clone(), entry);
    true
}

/// A lock held on ZooKeeper: its node, in the session that created it.
struct ZkHeld {
    shared: Arc<Shared>,
    /// Weak: a lost session is closed at once (its nodes go with it), not kept open by guards.
    session: Weak<Session>,
    name: Arc<str>,
    path: Arc<str>,
    /// The process, as recorded in the node (kept when the remainder is recorded).
    holder: crate::backend::Holder,
    /// Whether `release` ran to its end (otherwise the drop deletes the node).
    released: bool,
}

impl ZkHeld {
    /// Forgets the lock locally; returns whether it was still registered (not lost, its lease
    /// not over).
    fn unregister(&self) -> bool {
        let entry = lock(&self.shared.holders).remove(&self.path);
        if let Some(entry) = &entry {
            entry.stop();
        }
        entry.is_some()
    }

    async fn release_node(&mut self) -> Result<(), LockError> {
        let registered = self.unregister();
        let Some(session) = self.session.upgrade().filter(|s| !s.is_dead()) else {
            self.released = true;
            return Err(LockError::lost(&*self.name, "its ZooKeeper session was lost"));
        };
        let client = session.client.clone();
        let path = self.path.clone();
        let deleted = async {
            let mut result = send_delete(&client, &path).await;
            if matches!(result, Err(ref e) if cut(e)) {
                let patience = self.shared.options.get_operation_timeout();
                result = match wait_connected(&client, patience).await {
                    // The first delete may have been applied with its reply lost.
                    Ok(()) => match send_delete(&client, &path).await {
                        Err(ZkError::NoNode) => Ok(()),
                        other => other,
                    },
                    Err(e) => Err(e),
                };
            }
            result
        };
        // A server that stops answering is noticed by the client only after its connection
        // timeout (`session::connection_timeout`), and the next one serves once the ensemble has
        // a leader again: longer than a release may take. The lock was held until now (the session was not reported lost),
        // and the outcome is the same whether the delete is done now or owed: the delete goes
        // on in the background (`purge`, across the reconnection) and the release succeeds.
        let within = self.shared.options.get_operation_timeout() * 3 / 5;
        let result = tokio::time::timeout(within, deleted).await.unwrap_or(Err(ZkError::ConnectionLoss));
        // Done, one way or another (cut before this, the drop sends the delete again: a node's
        // path is never reused, so a second delete is harmless).
        self.released = true;
        match result {
            Err(ref e) if cut(e) && registered && !session.is_dead() => {
                tracing::debug!(node = %self.path, "ZooKeeper unreachable at release: the node's delete is owed");
                purge(&self.shared, &session, Leftover::Node(self.path.clone()));
                Ok(())
            }
            Ok(()) if registered => Ok(()),
            Ok(()) => Err(LockError::lost(&*self.name, "its ZooKeeper session or lease had ended")),
            Err(ZkError::NoNode) => Err(LockError::lost(
                &*self.name,
                "its ZooKeeper node was already gone (the session expired, or the lease ended)",
            )),
            Err(e) => {
                purge(&self.shared, &session, Leftover::Node(self.path.clone()));
                Err(zk_error(&self.name, "release", e))
            }
        }
    }
}

impl ZkHeld {
    /// `hold_at_least`: records the remainder as the node's lease, from now by the server's
    /// clock (`holder=<h>;lease_ms=<remaining>;granted`: the write's `mtime` is the start,
    /// which the waiter watching the node counts from, see `stale_at`), then deletes the node
    /// once the remainder has passed (counted from the write's answer, so after the server's
    /// end), which wakes that waiter.
    async fn release_node_after(&mut self, remaining: Duration) -> Result<(), LockError> {
        let registered = self.unregister();
        let Some(session) = self.session.upgrade().filter(|s| !s.is_dead()) else {
            self.released = true;
            return Err(LockError::lost(&*self.name, "its ZooKeeper session was lost"));
        };
        if !registered {
            // Its lease ended (the node is being deleted) or it was taken away.
            return self.release_node().await;
        }
        let client = session.client.clone();
        let patience = self.shared.options.get_operation_timeout();
        let data = LeaseRecord::granted(remaining, &self.holder);
        let mut result = client.set_data(&self.path, &data, None).await;
        if matches!(result, Err(ref e) if cut(e)) {
            result = match wait_connected(&client, patience).await {
                Ok(()) => client.set_data(&self.path, &data, None).await,
                Err(e) => Err(e),
            };
        }
        let end = crate::clock::now().checked_add(remaining);
        self.released = true;
        match result {
            Ok(_) => {}
            Err(ZkError::NoNode) => {
                return Err(LockError::lost(&*self.name, "its ZooKeeper node was already gone (the session expired)"))
            }
            Err(e) => {
                // Not recorded: the node is still deleted when the remainder ends (below).
                tracing::warn!(node = %self.path, error = %e, "could not record the hold_at_least remainder");
            }
        }
        let (path, shared) = (self.path.clone(), Arc::downgrade(&self.shared));
        let task = async move {
            if let Some(end) = end {
                tokio::time::sleep_until(end.into()).await;
            }
            let hold = Hold {
                shared,
                client,
                path,
                lease_end: None,
                lost: LostSignal::never(),
                released: Arc::new(AtomicBool::new(true)),
                patience,
            };
            let bound = patience.saturating_mul(2);
            if tokio::time::timeout(bound, hold.delete_node()).await.is_err() {
                tracing::warn!(node = %hold.path, "could not delete a lock node whose hold_at_least ended within {bound:?}");
            }
        };
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => drop(runtime.spawn(task)),
            Err(_) => {
                tracing::warn!(node = %self.path, "released outside a tokio runtime: the lock node is deleted at once");
                purge(&self.shared, &session, Leftover::Node(self.path.clone()));
            }
        }
        Ok(())
    }
}

impl HeldLock for ZkHeld {
    fn release(&mut self) -> BoxFuture<'_, Result<(), LockError>> {
        Box::pin(self.release_node())
    }

    fn release_after(&mut self, remaining: Duration) -> BoxFuture<'_, Result<(), LockError>> {
        Box::pin(self.release_node_after(remaining))
    }
}

impl Drop for ZkHeld {
    fn drop(&mut self) {
        if self.released {
            return;
        }
        // Dropped without a release that ran to its end (the guard could not run one, or it was
        // cut by its time bound): delete the node anyway.
        self.unregister();
        if let Some(session) = self.session.upgrade() {
            purge(&self.shared, &session, Leftover::Node(self.path.clone()));
        }
    }
}

/// Runs while a lock is held: deletes the node when a fixed lease ends, and fires `lost()` if
/// the node disappears for any other reason. Aborted by the release (and when the backend
/// goes away, or the session is lost).
struct Hold {
    shared: Weak<Shared>,
    client: Client,
    path: Arc<str>,
    lease_end: Option<Instant>,
    lost: LostSignal,
    released: Arc<AtomicBool>,
    patience: Duration,
}

impl Hold {
    async fn run(self) {
        let lease_over = async {
            match self.lease_end {
                Some(at) => tokio::time::sleep_until(at.into()).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            deleted = self.watch_node() => {
                if !deleted {
                    // The session ended: its supervisor reports the loss to every lock still
                    // registered through it, this one included, and forgets them.
                    return;
                }
                if !self.released.load(Ordering::Acquire) {
                    self.lost.fire("its ZooKeeper node was deleted by someone else");
                }
            }
            _ = lease_over => {
                tracing::debug!(node = %self.path, "fixed lease over: deleting the lock node");
                if let Some(shared) = self.shared.upgrade() {
                    lock(&shared.holders).remove(&self.path);
                }
                let bound = self.patience.saturating_mul(2);
                if tokio::time::timeout(bound, self.delete_node()).await.is_err() {
                    tracing::warn!(node = %self.path, "could not delete a lock node whose lease ended within {bound:?}");
                }
                return;
            }
        }
        if let Some(shared) = self.shared.upgrade() {
            lock(&shared.holders).remove(&self.path);
        }
    }

    /// Watches our own node: `true` once it is deleted, `false` when the watch cannot be kept
    /// (the session ended, or the watch failed: only this extra detection is lost, the lease
    /// still ends).
    async fn watch_node(&self) -> bool {
        loop {
            match self.client.check_and_watch_stat(&self.path).await {
                Ok((None, _)) => return true,
                Ok((Some(_), watcher)) => match watcher.changed().await.event_type {
                    EventType::NodeDeleted => return true,
                    EventType::Session => return false,
                    _ => {} // a data change: watch again
                },
                Err(ref e) if cut(e) => {
                    // Connected again, or still trying: watch again (unless the session ended).
                    if let Err(ZkError::SessionExpired) = wait_connected(&self.client, self.patience).await {
                        return false;
                    }
                }
                Err(_) => return std::future::pending().await,
            }
        }
    }

    async fn delete_node(&self) {
        for _ in 0..4 {
            match send_delete(&self.client, &self.path).await {
                Ok(()) | Err(ZkError::NoNode) => return,
                Err(ref e) if cut(e) && wait_connected(&self.client, self.patience).await.is_ok() => {}
                Err(e) => {
                    tracing::warn!(node = %self.path, error = %e, "could not delete a lock node whose lease ended");
                    return;
                }
            }
        }
    }
}
