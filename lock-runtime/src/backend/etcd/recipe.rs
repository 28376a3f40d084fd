//! One `lock()` call on etcd ([`EtcdAcquisition`], owning its one key) and one granted lock
//! ([`EtcdHeld`]).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use etcd_client::{
    Compare, CompareOp, EventType, GetOptions, PutOptions, SortOrder, SortTarget, Txn, TxnOp, TxnOpResponse,
    TxnResponse, WatchOptions,
};
use tokio::task::JoinHandle;

use super::members::{Failure, Members};
use super::session::{Session, Shared};
use super::{failed, lock, KIND};
use crate::backend::{Acquire, Acquisition, Attempt, BoxFuture, Grant, Held, HeldLock, Lease, LockKind, Wake};
use crate::error::LockError;
use crate::lost::LostSignal;

/// What a put of the acquisition's key learnt: its create revision, and where it stands.
struct Put {
    revision: i64,
    verdict: Verdict,
}

/// The last segment of a key: its name under the lock's prefix.
fn tail(key: &[u8]) -> &[u8] {
    key.rsplit(|b| *b == b'/').next().unwrap_or_default()
}

/// The role of a key of a read-write lock's prefix, from its name: `r-…` a reader, `w-…` a
/// writer. A mutex's keys (`<lease>-<owner>`) have none.
fn is_reader(key: &[u8]) -> bool {
    tail(key).starts_with(b"r-")
}

/// The permits a semaphore's key (`s<permits>-<lease>-<owner>`) asked for.
fn permits_of(key: &[u8]) -> Option<u32> {
    let rest = tail(key).strip_prefix(b"s")?;
    let digits = rest.split(|b| *b == b'-').next()?;
    std::str::from_utf8(digits).ok()?.parse().ok()
}

/// Where an acquisition stands, from the keys ahead of it.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Verdict {
    /// It holds the lock.
    Holds,
    /// Blocked: wake when this key changes (is deleted, or, a semaphore waiter's, marked granted).
    Watch(Vec<u8>),
    /// The first waiter of a semaphore: wake when any key of the prefix changes (a holder
    /// leaving is what it waits for).
    WatchPrefix,
    /// A semaphore acquisition whose `permits` differs from one ahead of it (which asked for
    /// this many).
    Mismatch(u32),
}

/// Where an acquisition of `kind` stands, from the keys ahead of it (nearest first): a mutex
/// or a writer holds when none is ahead and waits for its predecessor; a reader holds when no
/// writer is ahead and waits for the nearest writer (readers share; a waiting writer blocks the
/// readers behind it); a permit holds when fewer than `permits` are ahead; the first waiter
/// (exactly `permits` ahead) waits for any of them to leave, each later waiter for its
/// predecessor (which marks its own grant, so that the release of a permit wakes two waiters
/// at most, however many wait).
fn verdict(kind: LockKind, ahead_nearest_first: &[etcd_client::KeyValue]) -> Verdict {
    let watch = |kv: Option<&etcd_client::KeyValue>| kv.map_or(Verdict::Holds, |kv| Verdict::Watch(kv.key().to_vec()));
    match kind {
        LockKind::Read => watch(ahead_nearest_first.iter().find(|kv| !is_reader(kv.key()))),
        LockKind::Semaphore { permits } => {
            let other = ahead_nearest_first.iter().filter_map(|kv| permits_of(kv.key())).find(|p| *p != permits);
            match (other, ahead_nearest_first.len()) {
                (Some(other), _) => Verdict::Mismatch(other),
                (None, n) if n < permits as usize => Verdict::Holds,
                (None, n) if n == permits as usize => Verdict::WatchPrefix,
                (None, _) => watch(ahead_nearest_first.first()),
            }
        }
        _ => watch(ahead_nearest_first.first()),
    }
}

/// The keys of the lock's prefix created before `revision`, nearest first (names only); for a
/// mutex or a writer only the nearest is needed.
fn ahead(prefix: &str, kind: LockKind, revision: Option<i64>) -> TxnOp {
    let mut options =
        GetOptions::new().with_prefix().with_keys_only().with_sort(SortTarget::Create, SortOrder::Descend);
    if let Some(revision) = revision {
        options = options.with_max_create_revision(revision - 1);
    }
    if matches!(kind, LockKind::Exclusive | LockKind::Write) {
        options = options.with_limit(if revision.is_some() { 1 } else { 2 });
    }
    TxnOp::get(prefix, Some(options))
}

enum State {
    /// No key.
    Idle,
    /// The put of `key` runs in its own task (so that a dropped acquisition can wait for its
    /// end and delete what it made).
    Putting { key: String, session: Arc<Session>, task: JoinHandle<Result<Put, LockError>>, sent: Instant },
    /// Our key, in the queue.
    Queued { key: String, session: Arc<Session>, revision: i64 },
    /// Handed to an [`EtcdHeld`].
    Granted,
}

/// One `lock()` call on etcd: owns its key from the first attempt until it is granted (the
/// [`EtcdHeld`] owns it then) or dropped (the key is deleted).
pub(super) struct EtcdAcquisition {
    shared: Arc<Shared>,
    prefix: Arc<str>,
    req: Acquire,
    lost: LostSignal,
    state: State,
}

impl EtcdAcquisition {
    pub(super) fn new(shared: Arc<Shared>, prefix: Arc<str>, req: Acquire, lost: LostSignal) -> Self {
        EtcdAcquisition { shared, prefix, req, lost, state: State::Idle }
    }

    fn bound(&self) -> Duration {
        self.shared.options.get_operation_timeout()
    }

    /// Until no key of this lock is being deleted by this process (the keys of its acquisitions
    /// that were not granted), for at most the operation timeout: a key still there would be
    /// ahead of the one about to be put.
    async fn after_cleanups(&self) {
        let until = Instant::now() + self.bound();
        loop {
            let cleaned = self.shared.cleaned.notified();
            tokio::pin!(cleaned);
            cleaned.as_mut().enable();
            if !lock(&self.shared.cleaning).iter().any(|k| k.starts_with(&*self.prefix)) {
                return;
            }
            if tokio::time::timeout_at(until.into(), cleaned).await.is_err() {
                return;
            }
        }
    }

    async fn attempt_once(&mut self) -> Result<Attempt, LockError> {
        if matches!(self.state, State::Idle) {
            self.after_cleanups().await;
            let session = self.shared.session(&self.req.name, "acquire", Instant::now() + self.bound()).await?;
            let role = match self.req.kind {
                LockKind::Read => "r-".to_owned(),
                LockKind::Write => "w-".to_owned(),
                LockKind::Semaphore { permits } => format!("s{permits}-"),
                _ => String::new(),
            };
            let key = format!("{}{role}{:016x}-{}", self.prefix, session.lease, self.req.owner);
            let sent = Instant::now();
            let task = tokio::spawn(put(
                self.shared.members.clone(),
                self.req.name.clone(),
                self.req.kind,
                self.prefix.clone(),
                key.clone(),
                self.req.holder.to_string(),
                session.lease,
                self.bound(),
            ));
            self.state = State::Putting { key, session, task, sent };
        }
        if let State::Putting { task, .. } = &mut self.state {
            let outcome = task.await;
            let State::Putting { key, session, sent, .. } = std::mem::replace(&mut self.state, State::Idle) else {
                return Err(LockError::backend(&*self.req.name, KIND, "acquire", "unexpected state"));
            };
            let put = match outcome {
                Ok(Ok(put)) => put,
                Ok(Err(e)) => {
                    // The put may have been applied without its answer: delete the key.
                    cleanup(&self.shared, key, session, self.bound(), true);
                    return Err(e);
                }
                Err(e) => {
                    cleanup(&self.shared, key, session, self.bound(), true);
                    return Err(LockError::backend(&*self.req.name, KIND, "acquire", e));
                }
            };
            self.state = State::Queued { key, session, revision: put.revision };
            return match put.verdict {
                Verdict::Holds => Ok(Attempt::Acquired(self.grant(sent))),
                Verdict::Mismatch(other) => Err(self.mismatch(other).await),
                Verdict::Watch(_) | Verdict::WatchPrefix => Ok(Attempt::Busy),
            };
        }
        // Queued: are we the lowest now?
        let State::Queued { key, session, revision } = &self.state else {
            return Err(LockError::backend(&*self.req.name, KIND, "acquire", "the acquisition was already granted"));
        };
        if session.is_lost() {
            return Err(self.lease_lost("acquire"));
        }
        let before = Instant::now();
        let txn = Txn::new().and_then([
            TxnOp::get(key.as_str(), Some(GetOptions::new().with_keys_only())),
            ahead(&self.prefix, self.req.kind, Some(*revision)),
        ]);
        let resp = self
            .shared
            .members
            .call(before + self.bound(), |mut client| {
                let txn = txn.clone();
                async move { client.txn(txn).await }
            })
            .await
            .map_err(|f| failed(&self.req.name, "acquire", self.bound(), f))?;
        if get_at(&resp, 0).is_none_or(|kvs| kvs.is_empty()) {
            self.state = State::Idle;
            return Err(self.lease_lost("acquire"));
        }
        match verdict(self.req.kind, &get_at(&resp, 1).unwrap_or_default()) {
            Verdict::Holds => {
                self.mark_granted().await?;
                Ok(Attempt::Acquired(self.grant(before)))
            }
            Verdict::Mismatch(other) => Err(self.mismatch(other).await),
            Verdict::Watch(_) | Verdict::WatchPrefix => Ok(Attempt::Busy),
        }
    }

    async fn wait_until(&mut self, deadline: Instant) -> Result<Wake, LockError> {
        loop {
            let State::Queued { key, session, revision } = &self.state else { return Ok(Wake::Retry) };
            if session.is_lost() {
                return Err(self.lease_lost("wait"));
            }
            let (key, revision) = (key.clone(), *revision);
            let before = Instant::now();
            // Our key, and the keys before ours (for a mutex or a writer, the one just before).
            let txn = Txn::new().and_then([
                TxnOp::get(key.as_str(), Some(GetOptions::new().with_keys_only())),
                ahead(&self.prefix, self.req.kind, Some(revision)),
            ]);
            let bound = deadline.min(before + self.bound());
            let look = self.shared.members.call(bound, |mut client| {
                let txn = txn.clone();
                async move { client.txn(txn).await }
            });
            let resp = match look.await {
                Ok(resp) => resp,
                Err(_) if Instant::now() >= deadline => return Ok(Wake::TimedOut),
                Err(f) => return Err(failed(&self.req.name, "wait", self.bound(), f)),
            };
            let ours = get_at(&resp, 0).and_then(|kvs| kvs.first().map(|kv| kv.create_revision()));
            if ours.is_none() {
                self.state = State::Idle;
                return Err(self.lease_lost("wait"));
            }
            let ahead = get_at(&resp, 1).unwrap_or_default();
            let (watched, prefix) = match verdict(self.req.kind, &ahead) {
                Verdict::Holds => {
                    self.mark_granted().await?;
                    return Ok(Wake::Acquired(self.grant(before)));
                }
                Verdict::Mismatch(other) => return Err(self.mismatch(other).await),
                Verdict::Watch(key) => (key, false),
                Verdict::WatchPrefix => (self.prefix.as_bytes().to_vec(), true),
            };
            let from = resp.header().map_or(0, |h| h.revision()) + 1;
            match self.watch_change(watched, prefix, from, deadline).await? {
                true => continue,
                false => return Ok(Wake::TimedOut),
            }
        }
    }

    /// Waits for a change of `key` (of the keys under it when `prefix`), from revision `from`,
    /// until `deadline`: `true` when it changed (deleted, or a semaphore waiter's key marked
    /// granted; or the watch ended: look again), `false` when the deadline passed.
    ///
    /// The watch lives on one member's connection: when the backend leaves that member (a
    /// request found it refusing, without a leader, or silent), the wait looks again through
    /// the member it went to, and watches there.
    async fn watch_change(&self, key: Vec<u8>, prefix: bool, from: i64, deadline: Instant) -> Result<bool, LockError> {
        let mut options = WatchOptions::new().with_start_revision(from);
        if prefix {
            options = options.with_prefix();
        }
        let members = &self.shared.members;
        let generation = members.generation();
        let open = members.call(deadline.min(Instant::now() + self.bound()), |mut client| {
            let (key, options) = (key.clone(), options.clone());
            async move { client.watch(key, Some(options)).await }
        });
        let mut stream = match open.await {
            Ok(stream) => stream,
            Err(_) if Instant::now() >= deadline => return Ok(false),
            Err(f) => return Err(failed(&self.req.name, "wait", self.bound(), f)),
        };
        let session = match &self.state {
            State::Queued { session, .. } => session.clone(),
            _ => return Ok(true),
        };
        self.shared.watches.fetch_add(1, Ordering::Relaxed);
        let _waiting = Waiting::new(&self.shared.waiting);
        loop {
            tokio::select! {
                message = stream.message() => match message {
                    Ok(Some(resp)) => {
                        if resp.events().iter().any(|e| matches!(e.event_type(), EventType::Delete | EventType::Put)) {
                            self.shared.wakeups.fetch_add(1, Ordering::Relaxed);
                            return Ok(true);
                        }
                        if resp.canceled() {
                            return Ok(true);
                        }
                    }
                    Ok(None) | Err(_) => return Ok(true),
                },
                // The lease's loss deletes our key too; the watch would not tell.
                _ = session.until_lost() => return Ok(true),
                _ = members.until_moved(generation) => return Ok(true),
                _ = tokio::time::sleep_until(deadline.into()) => return Ok(false),
            }
        }
    }

    /// A semaphore permit granted after waiting marks its key (puts it again, unchanged, while
    /// it is still ours): the waiter right behind it, which watches it, wakes as the first
    /// waiter now. Nothing for the other kinds.
    async fn mark_granted(&mut self) -> Result<(), LockError> {
        let (LockKind::Semaphore { .. }, State::Queued { key, session, revision }) = (self.req.kind, &self.state)
        else {
            return Ok(());
        };
        let put =
            TxnOp::put(key.as_str(), self.req.holder.to_string(), Some(PutOptions::new().with_lease(session.lease)));
        let txn =
            Txn::new().when([Compare::create_revision(key.as_str(), CompareOp::Equal, *revision)]).and_then([put]);
        self.shared
            .members
            .call(Instant::now() + self.bound(), |mut client| {
                let txn = txn.clone();
                async move { client.txn(txn).await }
            })
            .await
            .map_err(|f| failed(&self.req.name, "acquire", self.bound(), f))?;
        Ok(())
    }

    /// A semaphore acquisition whose `permits` differs from those ahead of it: its key is
    /// deleted before the error is returned (a later acquisition must not find it ahead of
    /// its own and be refused in turn), and the error names both counts.
    async fn mismatch(&mut self, other: u32) -> LockError {
        if let State::Queued { key, session, revision } = std::mem::replace(&mut self.state, State::Idle) {
            // In a task of its own, so that it runs to its end even if this future is dropped.
            let (members, bound) = (self.shared.members.clone(), self.bound());
            let owed = Owed { members, key, revision: Some(revision), session, bound };
            let delete = tokio::spawn(async move { owed.delete().await });
            // Waited for at most one try: a later acquisition must not find the key ahead of
            // its own, but an outage must not hold this error back (the task goes on).
            let _ = tokio::time::timeout(bound, delete).await;
        }
        let permits = match self.req.kind {
            LockKind::Semaphore { permits } => permits,
            _ => 0,
        };
        LockError::invalid(
            &*self.req.name,
            format!("the semaphore is used with {other} permits by other holders or waiters, not {permits}"),
        )
    }

    fn lease_lost(&self, operation: &'static str) -> LockError {
        LockError::backend(
            &*self.req.name,
            KIND,
            operation,
            "the acquisition's key is gone: the etcd lease of the manager was lost",
        )
    }

    /// Hands the queued key to an [`EtcdHeld`].
    fn grant(&mut self, granted_at: Instant) -> Grant {
        let State::Queued { key, session, revision } = std::mem::replace(&mut self.state, State::Granted) else {
            // Only called in the Queued state.
            return Grant {
                fencing_token: 0,
                granted_at: Some(granted_at),
                lock: Held::new(Gone { name: self.req.name.clone() }),
            };
        };
        let registration = session.register(self.lost.clone());
        let expiry = match self.req.lease {
            Lease::Fixed(lease) => Some(tokio::spawn(delete_at(
                self.shared.members.clone(),
                key.clone(),
                revision,
                session.clone(),
                granted_at + lease,
                self.bound(),
            ))),
            Lease::Renewed(_) => None,
        };
        Grant {
            fencing_token: u64::try_from(revision).unwrap_or(0),
            granted_at: Some(granted_at),
            lock: Held::new(EtcdHeld {
                shared: self.shared.clone(),
                name: self.req.name.clone(),
                key,
                revision,
                session,
                registration,
                expiry,
                unconfirmed: None,
            }),
        }
    }
}

impl Acquisition for EtcdAcquisition {
    fn attempt(&mut self) -> BoxFuture<'_, Result<Attempt, LockError>> {
        Box::pin(self.attempt_once())
    }

    fn wait(&mut self, deadline: Instant) -> BoxFuture<'_, Result<Wake, LockError>> {
        Box::pin(self.wait_until(deadline))
    }
}

impl Drop for EtcdAcquisition {
    fn drop(&mut self) {
        let bound = self.bound();
        match std::mem::replace(&mut self.state, State::Idle) {
            State::Putting { key, session, task, .. } => {
                let shared = self.shared.clone();
                let undo = async move {
                    let failed = !matches!(task.await, Ok(Ok(_)));
                    cleanup(&shared, key, session, bound, failed);
                };
                crate::background::finish(
                    undo,
                    "could not remove the key of a dropped acquisition; its lease will remove it",
                );
            }
            State::Queued { key, session, .. } => cleanup(&self.shared, key, session, bound, false),
            State::Idle | State::Granted => {}
        }
    }
}

/// Counts one waiting acquisition while it lives.
struct Waiting<'a>(&'a AtomicU64);

impl<'a> Waiting<'a> {
    fn new(count: &'a AtomicU64) -> Self {
        count.fetch_add(1, Ordering::Relaxed);
        Waiting(count)
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Puts `key` with `lease` and reads the lowest key of the lock, in one transaction.
#[allow(clippy::too_many_arguments)] // one put, its settings spelled out
async fn put(
    members: Arc<Members>,
    name: Arc<str>,
    kind: LockKind,
    prefix: Arc<str>,
    key: String,
    value: String,
    lease: i64,
    bound: Duration,
) -> Result<Put, LockError> {
    // Where the key is absent, the put, then every key of the prefix nearest first: ours, then
    // those ahead of it. Where it is there (the put was sent before, to a member that applied
    // it without its answer reaching us), the key.
    let txn = Txn::new()
        .when([Compare::create_revision(key.as_str(), CompareOp::Equal, 0)])
        .and_then([
            TxnOp::put(key.as_str(), value, Some(PutOptions::new().with_lease(lease))),
            ahead(&prefix, kind, None),
        ])
        .or_else([TxnOp::get(key.as_str(), Some(GetOptions::new().with_keys_only()))]);
    let until = Instant::now() + bound;
    let send = |txn: Txn| {
        members.call(until, move |mut client| {
            let txn = txn.clone();
            async move { client.txn(txn).await }
        })
    };
    let resp = send(txn).await.map_err(|f| failed(&name, "acquire", bound, f))?;
    if !resp.succeeded() {
        // Put before: its create revision, and the keys ahead of it.
        let revision = get_at(&resp, 0).and_then(|kvs| kvs.first().map(|kv| kv.create_revision())).unwrap_or(0);
        let look = Txn::new().and_then([ahead(&prefix, kind, Some(revision))]);
        let resp = send(look).await.map_err(|f| failed(&name, "acquire", bound, f))?;
        return match get_at(&resp, 0) {
            Some(ahead) if revision > 0 => Ok(Put { revision, verdict: verdict(kind, &ahead) }),
            _ => Err(LockError::backend(&*name, KIND, "acquire", "etcd answered the put without its key or revision")),
        };
    }
    // A put of a new key in a transaction: the key's create revision is the transaction's.
    let revision = resp.header().map_or(0, |h| h.revision());
    let keys = get_at(&resp, 1).unwrap_or_default();
    match keys.split_first() {
        Some((ours, ahead)) if revision > 0 && ours.create_revision() == revision => {
            Ok(Put { revision, verdict: verdict(kind, ahead) })
        }
        _ => Err(LockError::backend(&*name, KIND, "acquire", "etcd answered the put without its key or revision")),
    }
}

/// The key-values of the `i`th operation of a transaction, if it was a get.
fn get_at(resp: &TxnResponse, i: usize) -> Option<Vec<etcd_client::KeyValue>> {
    match resp.op_responses().into_iter().nth(i) {
        Some(TxnOpResponse::Get(get)) => Some(get.kvs().to_vec()),
        _ => None,
    }
}

/// Deletes `key` (of an acquisition that was not granted) in a spawned task, until done (see
/// [`Owed`]); when `again`, once more after the operation timeout (for a put whose
/// answer was lost and that may still be applied).
///
/// Until the first delete is done, the key is in [`Shared::cleaning`]: the next acquisition of
/// the lock waits for it (at most the operation timeout) before putting its own key.
fn cleanup(shared: &Arc<Shared>, key: String, session: Arc<Session>, bound: Duration, again: bool) {
    lock(&shared.cleaning).push(key.clone());
    let shared = shared.clone();
    let delete = async move {
        let owed = Owed { members: shared.members.clone(), key, revision: None, session, bound };
        owed.delete().await;
        lock(&shared.cleaning).retain(|k| *k != owed.key);
        shared.cleaned.notify_waiters();
        if again {
            tokio::time::sleep(bound).await;
            owed.delete().await;
        }
    };
    crate::background::finish(delete, "could not remove the key of a dropped acquisition; its lease will remove it");
}

/// A deletion the library owes the store: a release, a dropped guard's or acquisition's key,
/// a fixed lease's or `hold_at_least`'s end, a resignation. Never given up while the key
/// could outlive it: the manager's keep-alive renews the lease the key was put with for as
/// long as the process lives, so a key left behind would block its lock for as long.
struct Owed {
    members: Arc<Members>,
    key: String,
    /// Delete only while the key has this create revision (a granted key: never a later
    /// owner's key of the same name); `None`, whatever it holds (a key of this acquisition's
    /// own, named after its lease and owner id).
    revision: Option<i64>,
    /// The manager's lease the key was put with: once it is lost (it ran out, or the backend
    /// was dropped and revoked it) the key is gone with it, and nothing is owed any more.
    session: Arc<Session>,
    bound: Duration,
}

impl Owed {
    /// Tries until the server confirms the deletion (or that the key is no longer ours), each
    /// try bounded by the operation timeout, across reconnections (the client connects again
    /// by itself), or until the lease is lost ([`owed`](crate::background::owed)).
    async fn delete(&self) {
        let attempt = || async move {
            match self.revision {
                Some(revision) => delete_if(&self.members, &self.key, revision, self.bound).await.is_ok(),
                None => {
                    let until = Instant::now() + self.bound;
                    let key = self.key.as_str();
                    let deleted = self.members.call(until, |mut client| async move { client.delete(key, None).await });
                    deleted.await.is_ok()
                }
            }
        };
        crate::background::owed(self.session.until_lost(), attempt).await;
    }
}

/// Deletes `key` if it still has create revision `revision`, within `bound`: `Ok(true)` when
/// it did. A delete resent to another member after one whose answer was lost finds the key
/// gone: that counts as deleted (the first one may have done it).
async fn delete_if(members: &Members, key: &str, revision: i64, bound: Duration) -> Result<bool, Failure> {
    let txn = Txn::new()
        .when([Compare::create_revision(key, CompareOp::Equal, revision)])
        .and_then([TxnOp::delete(key, None)]);
    let mut sent = 0u32;
    let resp = members
        .call(Instant::now() + bound, |mut client| {
            sent += 1;
            let txn = txn.clone();
            async move { client.txn(txn).await }
        })
        .await?;
    Ok(resp.succeeded() || sent > 1)
}

/// At `at`, deletes `key` if it is still ours (a fixed lease's end, or a `hold_at_least`'s),
/// until done (see [`Owed`]).
async fn delete_at(
    members: Arc<Members>,
    key: String,
    revision: i64,
    session: Arc<Session>,
    at: Instant,
    bound: Duration,
) {
    tokio::time::sleep_until(at.into()).await;
    Owed { members, key, revision: Some(revision), session, bound }.delete().await;
}

/// A granted lock: its key, deleted on release.
struct EtcdHeld {
    shared: Arc<Shared>,
    name: Arc<str>,
    key: String,
    revision: i64,
    session: Arc<Session>,
    registration: u64,
    /// The task that ends a fixed lease.
    expiry: Option<JoinHandle<()>>,
    /// A release was started and not yet confirmed (its delete failed, or its future was
    /// dropped before the answer): when the key is to go, now or at the end of a
    /// `hold_at_least`. `Drop` deletes it then, in the background.
    unconfirmed: Option<Instant>,
}

impl EtcdHeld {
    fn bound(&self) -> Duration {
        self.shared.options.get_operation_timeout()
    }

    fn gone(&self) -> LockError {
        LockError::lost(
            &*self.name,
            "the lock's etcd key is gone (its lease ran out, the manager's lease was lost, or it was deleted)",
        )
    }

    /// Stops the fixed-lease task and the lease-loss registration.
    fn settle(&mut self) {
        if let Some(expiry) = self.expiry.take() {
            expiry.abort();
        }
        self.session.unregister(self.registration);
    }

    async fn release_key(&mut self) -> Result<(), LockError> {
        self.unconfirmed = Some(Instant::now());
        self.settle();
        if self.session.is_lost() {
            self.unconfirmed = None; // the key went with the lease
            return Err(self.gone());
        }
        let deleted = delete_if(&self.shared.members, &self.key, self.revision, self.bound()).await;
        if deleted.is_ok() {
            self.unconfirmed = None; // deleted, or gone already
        }
        match deleted {
            Ok(true) => Ok(()),
            Ok(false) => Err(self.gone()),
            Err(f) => Err(failed(&self.name, "release", self.bound(), f)),
        }
    }

    async fn release_later(&mut self, remaining: Duration) -> Result<(), LockError> {
        let started = Instant::now();
        self.unconfirmed = Some(started + remaining);
        self.settle();
        if self.session.is_lost() {
            self.unconfirmed = None; // the key went with the lease
            return Err(self.gone());
        }
        let members = self.shared.members.clone();
        let txn = Txn::new().when([Compare::create_revision(self.key.as_str(), CompareOp::Equal, self.revision)]);
        let still_ours = members
            .call(started + self.bound(), |mut client| {
                let txn = txn.clone();
                async move { client.txn(txn).await }
            })
            .await
            .map_err(|f| failed(&self.name, "release", self.bound(), f))?
            .succeeded();
        if !still_ours {
            self.unconfirmed = None;
            return Err(self.gone());
        }
        self.unconfirmed = None; // the task below deletes it when the remainder ends
        let session = self.session.clone();
        tokio::spawn(delete_at(members, self.key.clone(), self.revision, session, started + remaining, self.bound()));
        Ok(())
    }
}

impl HeldLock for EtcdHeld {
    fn release(&mut self) -> BoxFuture<'_, Result<(), LockError>> {
        Box::pin(self.release_key())
    }

    fn release_after(&mut self, remaining: Duration) -> BoxFuture<'_, Result<(), LockError>> {
        Box::pin(self.release_later(remaining))
    }
}

impl Drop for EtcdHeld {
    fn drop(&mut self) {
        // The fixed-lease task (if any) keeps running: it ends the lease of a lock whose
        // release never came.
        self.session.unregister(self.registration);
        // A release that did not confirm its delete (it failed, or its future was dropped
        // before the answer): the key goes in the background (if still ours: the delete
        // checks its revision), now or when its `hold_at_least` ends, not with the
        // manager's lease (which its keep-alive postpones for as long as the manager lives).
        if let Some(at) = self.unconfirmed.take() {
            let members = self.shared.members.clone();
            let session = self.session.clone();
            let delete = delete_at(members, std::mem::take(&mut self.key), self.revision, session, at, self.bound());
            crate::background::finish(
                delete,
                "could not finish a release whose answer never came; its lease will free the lock",
            );
        }
    }
}

/// The lock of a grant made in a state that cannot make one (never happens): reports it lost.
struct Gone {
    name: Arc<str>,
}

impl HeldLock for Gone {
    fn release(&mut self) -> BoxFuture<'_, Result<(), LockError>> {
        Box::pin(std::future::ready(Err(LockError::lost(&*self.name, "no etcd key was held"))))
    }
}
