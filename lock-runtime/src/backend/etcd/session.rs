//! The manager's lease (a [`Session`]) and the task that keeps it alive, fires `lost()` on
//! every lock held through it when it is lost, and grants the next one.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use etcd_client::{Client, LeaseKeepAliveStream, LeaseKeeper};

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
    pub(super) client: Client,
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
}

impl Shared {
    /// Grants the first lease and starts the keep-alive task.
    pub(super) async fn start(
        mut client: Client,
        options: EtcdOptions,
        endpoints: Vec<String>,
    ) -> Result<Arc<Shared>, LockError> {
        let shown = endpoints.join(",");
        let granted_at = Instant::now();
        let (lease, ttl) =
            grant(&mut client, &options).await.map_err(|e| LockError::backend(shown, KIND, "connect", e))?;
        let shared = Arc::new(Shared {
            client: client.clone(),
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
        });
        tokio::spawn(keep_alive(Arc::downgrade(&shared), client, granted_at));
        Ok(shared)
    }

    /// The current lease, or an error while it is lost and no new one is granted yet.
    pub(super) fn session(&self, name: &str, operation: &'static str) -> Result<Arc<Session>, LockError> {
        let session = lock(&self.session).clone();
        if session.is_lost() {
            return Err(LockError::backend(
                name,
                KIND,
                operation,
                "the etcd lease of the manager was lost; a new one is not granted yet",
            ));
        }
        Ok(session)
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
        let session = lock(&self.session).clone();
        session.lose("the lock manager was shut down");
        let mut client = self.client.clone();
        let bound = self.options.get_operation_timeout();
        let failed = match tokio::time::timeout(bound, client.lease_revoke(session.lease)).await {
            Ok(Ok(_)) => return,
            Ok(Err(e)) => e.to_string(),
            Err(_) => format!("no answer within {bound:?}"),
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
        let (mut client, lease, bound) = (self.client.clone(), session.lease, self.options.get_operation_timeout());
        if let Ok(handle) = tokio::runtime::Handle::try_current() {
            handle.spawn(async move {
                let _ = tokio::time::timeout(bound, client.lease_revoke(lease)).await;
            });
        }
    }
}

async fn grant(client: &mut Client, options: &EtcdOptions) -> Result<(i64, Duration), String> {
    let ttl = i64::try_from(options.get_lease_ttl().as_secs()).unwrap_or(i64::MAX);
    match tokio::time::timeout(options.get_operation_timeout(), client.lease_grant(ttl, None)).await {
        Ok(Ok(resp)) => {
            let granted = u64::try_from(resp.ttl()).unwrap_or(0).max(options.get_lease_ttl().as_secs());
            Ok((resp.id(), Duration::from_secs(granted)))
        }
        Ok(Err(e)) => Err(format!("granting a lease: {e}")),
        Err(_) => Err(format!("granting a lease: no answer within {:?}", options.get_operation_timeout())),
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
async fn keep_alive(shared: Weak<Shared>, mut client: Client, mut granted_at: Instant) {
    loop {
        let Some((session, options, ttl)) =
            shared.upgrade().map(|s| (lock(&s.session).clone(), s.options.clone(), s.ttl))
        else {
            return;
        };
        keep_session(&shared, &mut client, &session, ttl, options.get_operation_timeout(), granted_at).await;
        if shared.upgrade().is_none_or(|s| s.is_shut()) {
            return;
        }
        // Free the old lease's keys (if the server still has them), then take a new lease.
        let _ = tokio::time::timeout(options.get_operation_timeout(), client.lease_revoke(session.lease)).await;
        loop {
            if shared.upgrade().is_none_or(|s| s.is_shut()) {
                return;
            }
            granted_at = Instant::now();
            match grant(&mut client, &options).await {
                Ok((lease, _)) => {
                    let Some(s) = shared.upgrade() else { return };
                    *lock(&s.session) = Arc::new(Session::new(lease));
                    s.sessions.fetch_add(1, Ordering::Relaxed);
                    break;
                }
                Err(e) => {
                    tracing::debug!("etcd: no new lease yet: {e}");
                    tokio::time::sleep(Duration::from_millis(250)).await;
                }
            }
        }
    }
}

/// Renews `session` every third of the TTL until it is lost (fired here) or the backend is gone.
async fn keep_session(
    shared: &Weak<Shared>,
    client: &mut Client,
    session: &Session,
    ttl: Duration,
    bound: Duration,
    granted_at: Instant,
) {
    let interval = ttl / 3;
    let lost_after = ttl * 2 / 3;
    let mut last_ok = granted_at;
    let mut next_try = granted_at + interval;
    let mut stream: Option<(LeaseKeeper, LeaseKeepAliveStream)> = None;
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
            (sent, renew(client, &mut stream, session.lease, bound.min(interval)).await)
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
                Renewed::Failed => next_try = Instant::now() + (interval / 4).max(Duration::from_millis(50)),
            }
        }
    }
}

/// One keep-alive round trip (opening the keep-alive stream first if needed).
async fn renew(
    client: &mut Client,
    stream: &mut Option<(LeaseKeeper, LeaseKeepAliveStream)>,
    lease: i64,
    bound: Duration,
) -> Renewed {
    let round = async {
        if stream.is_none() {
            // Opening the stream sends a keep-alive and reads its answer.
            return match client.lease_keep_alive(lease).await {
                Ok(opened) => {
                    *stream = Some(opened);
                    Renewed::Alive
                }
                Err(etcd_client::Error::LeaseKeepAliveError(e)) if e.contains("not found") => Renewed::Expired,
                Err(_) => Renewed::Failed,
            };
        }
        let Some((keeper, answers)) = stream.as_mut() else { return Renewed::Failed };
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
    }
    renewed
}
