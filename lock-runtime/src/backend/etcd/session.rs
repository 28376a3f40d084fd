//! The manager's lease (a [`Session`]) and the task that keeps it alive, fires `lost()` on
//! every lock held through it when it is lost, and grants the next one.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use etcd_client::{LeaseKeepAliveStream, LeaseKeeper};

use super::members::{Failure, Members};
use super::options::EtcdOptions;
use super::{lock, KIND};
use crate::error::LockError;
use crate::lost::LostSignal;

/// One lease of the manager, and the locks held through it.
pub(super) struct Session {
    pub(super) lease: i64,
    lost: AtomicBool,
    holders: Mutex<HashMap<u64, LostSignal>>,
    next: AtomicU64,
    /// Woken when the lease is lost.
    lost_notify: tokio::sync::Notify,
}

impl Session {
    fn new(lease: i64) -> Self {
        Session {
            lease,
            lost: AtomicBool::new(false),
            holders: Mutex::new(HashMap::new()),
            next: AtomicU64::new(0),
            lost_notify: tokio::sync::Notify::new(),
        }
    }

    pub(super) fn is_lost(&self) -> bool {
        self.lost.load(Ordering::SeqCst)
    }

    /// Completes once the lease is lost.
    pub(super) async fn until_lost(&self) {
        loop {
            let notified = self.lost_notify.notified();
            if self.is_lost() {
                return;
            }
            notified.await;
        }
    }

    /// Fires `signal` when this lease is lost (at once if it already is); the id unregisters it.
    pub(super) fn register(&self, signal: LostSignal) -> u64 {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        lock(&self.holders).insert(id, signal.clone());
        if self.is_lost() {
            lock(&self.holders).remove(&id);
            signal.fire("the etcd lease of the manager was lost");
        }
        id
    }

    pub(super) fn unregister(&self, id: u64) {
        lock(&self.holders).remove(&id);
    }

    /// Marks the lease lost and fires every registered lock's signal.
    fn lose(&self, reason: &str) {
        self.lost.store(true, Ordering::SeqCst);
        self.lost_notify.notify_waiters();
        let holders: Vec<LostSignal> = lock(&self.holders).drain().map(|(_, s)| s).collect();
        if !holders.is_empty() {
            tracing::warn!(lease = self.lease, locks = holders.len(), "etcd lease lost: {reason}");
        }
        for signal in holders {
            signal.fire(format!("the etcd lease of the manager was lost: {reason}"));
        }
    }
}

/// What the backend's clones share.
pub(super) struct Shared {
    /// The cluster's members, one client each.
    pub(super) members: Arc<Members>,
    pub(super) options: EtcdOptions,
    pub(super) endpoints: Vec<String>,
    /// The TTL the server granted (it may raise the one asked for).
    pub(super) ttl: Duration,
    session: Mutex<Arc<Session>>,
    sessions: AtomicU64,
    /// Acquisitions watching their predecessor right now.
    pub(super) waiting: AtomicU64,
    /// Watches opened on a predecessor.
    pub(super) watches: AtomicU64,
    /// Waiters woken by their predecessor's deletion.
    pub(super) wakeups: AtomicU64,
    /// The keys of acquisitions that were not granted, still being deleted (see `cleanup` in
    /// `recipe.rs`): a new acquisition of the same lock waits for them before it puts its own
    /// key, or it would find them ahead of it (a `try_lock` right after a busy one).
    pub(super) cleaning: Mutex<Vec<String>>,
    /// Told whenever a key leaves [`cleaning`](Self::cleaning).
    pub(super) cleaned: tokio::sync::Notify,
    /// Set by [`shut_down`](Self::shut_down): no lease is granted after it.
    shut: AtomicBool,
    /// Told when a new lease replaces a lost one.
    granted: tokio::sync::Notify,
}

impl Shared {
    /// Grants the first lease and starts the keep-alive task.
    pub(super) async fn start(
        members: Members,
        options: EtcdOptions,
        endpoints: Vec<String>,
    ) -> Result<Arc<Shared>, LockError> {
        let shown = endpoints.join(",");
        let granted_at = Instant::now();
        let members = Arc::new(members);
        let (lease, ttl) = grant(&members, &options).await.map_err(|e| match e {
            Failure::Error(e @ (etcd_client::Error::InvalidUri(_) | etcd_client::Error::InvalidArgs(_))) => {
                LockError::invalid(&*shown, format!("not a valid etcd endpoint list: {e}"))
            }
            Failure::Error(e) => super::etcd_error(&shown, "connect", e),
            Failure::NoAnswer => LockError::timed_out(&*shown, KIND, "connect", options.get_operation_timeout()),
        })?;
        let shared = Arc::new(Shared {
            members: members.clone(),
            options,
            endpoints,
            ttl,
            session: Mutex::new(Arc::new(Session::new(lease))),
            sessions: AtomicU64::new(1),
            waiting: AtomicU64::new(0),
            watches: AtomicU64::new(0),
            wakeups: AtomicU64::new(0),
            cleaning: Mutex::new(Vec::new()),
            cleaned: tokio::sync::Notify::new(),
            shut: AtomicBool::new(false),
            granted: tokio::sync::Notify::new(),
        });
        tokio::spawn(keep_alive(Arc::downgrade(&shared), members, granted_at));
        Ok(shared)
    }

    /// The current lease; while it is lost, the next one, waited for until `until` (the
    /// keep-alive task grants it as soon as a member answers: the first operation after an
    /// outage waits for it rather than failing), then an error.
    pub(super) async fn session(
        &self,
        name: &str,
        operation: &'static str,
        until: Instant,
    ) -> Result<Arc<Session>, LockError> {
        loop {
            let granted = self.granted.notified();
            tokio::pin!(granted);
            granted.as_mut().enable();
            let session = lock(&self.session).clone();
            if !session.is_lost() {
                return Ok(session);
            }
            if self.is_shut() || tokio::time::timeout_at(until.into(), granted).await.is_err() {
                return Err(LockError::backend(
                    name,
                    KIND,
                    operation,
                    "the etcd lease of the manager was lost; a new one is not granted yet",
                ));
            }
        }
    }

    /// How many leases were granted (1 plus one per lease lost).
    pub(super) fn sessions(&self) -> u64 {
        self.sessions.load(Ordering::Relaxed)
    }

    /// The id of the current lease.
    pub(super) fn lease_id(&self) -> i64 {
        lock(&self.session).lease
    }
}

impl Shared {
    /// The manager's shutdown: the lease is revoked (the server deletes every key it still
    /// holds, waiters' too, and their successors' watches fire at once) and none is granted
    /// after it.
    pub(super) async fn shut_down(&self) {
        self.shut.store(true, Ordering::SeqCst);
        self.granted.notify_waiters();
        let session = lock(&self.session).clone();
        session.lose("the lock manager was shut down");
        let bound = self.options.get_operation_timeout();
        let failed = match revoke(&self.members, session.lease, bound).await {
            Ok(()) => return,
            Err(Failure::Error(e)) => e.to_string(),
            Err(Failure::NoAnswer) => format!("no answer within {bound:?}"),
        };
        tracing::warn!(lease = session.lease, error = %failed, "etcd: the lease was not revoked at shutdown; its keys go when its TTL ends");
    }

    /// Whether [`shut_down`](Self::shut_down) was called.
    fn is_shut(&self) -> bool {
        self.shut.load(Ordering::SeqCst)
    }
}

impl Drop for Shared {
    fn drop(&mut self) {
        let session = lock(&self.session).clone();
        session.lose("the backend was dropped");
        let (members, lease, bound) = (self.members.clone(), session.lease, self.options.get_operation_timeout());
        if let Ok(handle) = tokio::runtime::Handle::try_current() {
            handle.spawn(async move {
                let _ = revoke(&members, lease, bound).await;
            });
        }
    }
}

/// Grants a lease of the TTL of `options` on whichever member answers.
async fn grant(members: &Members, options: &EtcdOptions) -> Result<(i64, Duration), Failure> {
    let ttl = i64::try_from(options.get_lease_ttl().as_secs()).unwrap_or(i64::MAX);
    let until = Instant::now() + options.get_operation_timeout();
    let resp = members.call(until, |mut client| async move { client.lease_grant(ttl, None).await }).await?;
    let granted = u64::try_from(resp.ttl()).unwrap_or(0).max(options.get_lease_ttl().as_secs());
    Ok((resp.id(), Duration::from_secs(granted)))
}

/// Revokes `lease` (its keys are deleted at once), within `bound`. A lease the cluster no
/// longer knows counts as revoked.
async fn revoke(members: &Members, lease: i64, bound: Duration) -> Result<(), Failure> {
    let revoked = members.call(Instant::now() + bound, |mut client| async move { client.lease_revoke(lease).await });
    match revoked.await {
        Ok(_) => Ok(()),
        Err(Failure::Error(etcd_client::Error::GRpcStatus(s))) if s.code() == tonic::Code::NotFound => Ok(()),
        Err(e) => Err(e),
    }
}

/// How a keep-alive round trip ended.
enum Renewed {
    /// Answered with the TTL left.
    Alive,
    /// The server no longer knows the lease.
    Expired,
    /// No answer (or an error): try again.
    Failed,
}

/// Keeps the current lease alive while the backend lives; on loss, fires `lost()` on its locks,
/// revokes it (when it can) and grants the next.
async fn keep_alive(shared: Weak<Shared>, members: Arc<Members>, mut granted_at: Instant) {
    loop {
        let Some((session, options, ttl)) =
            shared.upgrade().map(|s| (lock(&s.session).clone(), s.options.clone(), s.ttl))
        else {
            return;
        };
        keep_session(&shared, &members, &session, ttl, options.get_operation_timeout(), granted_at).await;
        if shared.upgrade().is_none_or(|s| s.is_shut()) {
            return;
        }
        // Free the old lease's keys (if the server still has them), then take a new lease.
        let _ = revoke(&members, session.lease, options.get_operation_timeout()).await;
        loop {
            if shared.upgrade().is_none_or(|s| s.is_shut()) {
                return;
            }
            granted_at = Instant::now();
            match grant(&members, &options).await {
                Ok((lease, _)) => {
                    let Some(s) = shared.upgrade() else { return };
                    *lock(&s.session) = Arc::new(Session::new(lease));
                    s.sessions.fetch_add(1, Ordering::Relaxed);
                    s.granted.notify_waiters();
                    break;
                }
                Err(e) => {
                    tracing::debug!("etcd: no new lease yet: {e:?}");
                    tokio::time::sleep(Duration::from_millis(250)).await;
                }
            }
        }
    }
}

/// Renews `session` every third of the TTL until it is lost (fired here) or the backend is gone.
async fn keep_session(
    shared: &Weak<Shared>,
    members: &Members,
    session: &Session,
    ttl: Duration,
    bound: Duration,
    granted_at: Instant,
) {
    let interval = ttl / 3;
    let lost_after = ttl * 2 / 3;
    // A renewal may find the time left before `lost_after` as short as `interval`: within it,
    // every member must get its try (one member: the whole interval), and a failed try goes on
    // to the next member at once (regression: a client cut from two members of three lost its
    // lease, each silent member holding the renewal for 1.7 s and then 0.8 s more).
    let members_count = u32::try_from(members.len().max(1)).unwrap_or(u32::MAX);
    let per_try =
        bound.min(interval).min(members.share()).min((interval / members_count).max(Duration::from_millis(200)));
    let retry_after =
        if members_count > 1 { Duration::from_millis(10) } else { (interval / 4).max(Duration::from_millis(50)) };
    let mut last_ok = granted_at;
    let mut next_try = granted_at + interval;
    let mut stream: Option<KeepAlive> = None;
    loop {
        if shared.strong_count() == 0 || session.is_lost() {
            return;
        }
        let lost_at = last_ok + lost_after;
        let attempt_at = next_try;
        let round = async {
            tokio::time::sleep_until(attempt_at.into()).await;
            if shared.strong_count() == 0 {
                return (Instant::now(), Renewed::Failed);
            }
            let sent = Instant::now();
            (sent, renew(members, &mut stream, session.lease, per_try).await)
        };
        tokio::select! {
            _ = tokio::time::sleep_until(lost_at.into()) => {
                session.lose(&format!("no keep-alive answered for {lost_after:?} (TTL {ttl:?})"));
                return;
            }
            (sent, renewed) = round => match renewed {
                Renewed::Alive => {
                    last_ok = sent;
                    next_try = sent + interval;
                }
                Renewed::Expired => {
                    session.lose("the server no longer knows the lease (it expired)");
                    return;
                }
                Renewed::Failed => next_try = Instant::now() + retry_after,
            }
        }
    }
}

/// The keep-alive stream of the lease, on one member's connection (its index).
type KeepAlive = (usize, LeaseKeeper, LeaseKeepAliveStream);

/// One keep-alive round trip (opening the keep-alive stream on the current member first if
/// needed). A round that fails leaves the member for the next (the next round opens the stream
/// there), and so does a round on a member the backend has left meanwhile.
async fn renew(members: &Members, stream: &mut Option<KeepAlive>, lease: i64, bound: Duration) -> Renewed {
    let mut on = None;
    let round = async {
        if stream.is_none() {
            // Opening the stream sends a keep-alive and reads its answer.
            let (i, mut client) = match members.current().await {
                Ok(current) => current,
                Err(_) => return Renewed::Failed,
            };
            on = Some(i);
            return match client.lease_keep_alive(lease).await {
                Ok((keeper, answers)) => {
                    *stream = Some((i, keeper, answers));
                    Renewed::Alive
                }
                Err(etcd_client::Error::LeaseKeepAliveError(e)) if e.contains("not found") => Renewed::Expired,
                Err(etcd_client::Error::GRpcStatus(s)) if s.code() == tonic::Code::NotFound => Renewed::Expired,
                Err(_) => Renewed::Failed,
            };
        }
        let Some((i, keeper, answers)) = stream.as_mut() else { return Renewed::Failed };
        on = Some(*i);
        if keeper.keep_alive().await.is_err() {
            return Renewed::Failed;
        }
        match answers.message().await {
            Ok(Some(answer)) if answer.ttl() > 0 => Renewed::Alive,
            Ok(Some(_)) => Renewed::Expired,
            Ok(None) | Err(_) => Renewed::Failed,
        }
    };
    let renewed = tokio::time::timeout(bound, round).await.unwrap_or(Renewed::Failed);
    if matches!(renewed, Renewed::Failed) {
        *stream = None;
        if let Some(i) = on {
            members.leave(i);
        }
    } else if let Some((i, ..)) = stream.as_ref() {
        // The backend left this member (another request found it failing): the next round
        // opens the stream on the member it went to.
        if members.current_index() != *i {
            *stream = None;
        }
    }
    renewed
}
