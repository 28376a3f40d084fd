//! A lock held in Redis, of any kind: its release (now, after a remainder, or finished in the
//! background when its future is dropped), its renewal, and the cleanup of what a dropped
//! acquisition may have left.

use std::sync::Arc;
use std::time::Duration;

use redis::Script;

use super::batch::Op;
use super::handoff::{Handed, Ticket};
use super::holdings::Holding;
use super::layout::{queue_of, SERVER_FENCE};
use super::options::KIND;
use super::scripts::{EXTEND, HANDOFF, KIND_EXTEND, KIND_RELEASE, RELEASE, RELEASE_AFTER};
use super::server::{bounded, connection_lost, lease_millis, lost_reason, still_held};
use super::shared::Shared;
use crate::backend::{BoxFuture, HeldLock, LockKind, Renewal};
use crate::background::{finish_in_background, Unabandoned};
use crate::error::LockError;

/// One owner-checked release script call (`release.lua`, `release_after.lua`,
/// `kind_release.lua`): key a lock's key (or a kind's state), arguments the owner, where the
/// script takes one a number of milliseconds, and the release channel.
#[derive(Clone)]
pub(super) struct ReleaseCall {
    backend: Arc<Shared>,
    script: &'static Script,
    name: Arc<str>,
    key: Arc<str>,
    channel: Arc<str>,
    owner: Arc<str>,
    millis: Option<u64>,
    /// A holder's release of a mutex, which may go out in a batch (see `batch.rs`).
    batched: bool,
    /// A holder's release now: how long its key may outlive a release that failed (the lease:
    /// the last renewal was before the release began). Such a release is owed to the store
    /// and tried again until done or that long has passed (see [`owe`](Self::owe)).
    owed_for: Option<Duration>,
}

impl ReleaseCall {
    pub(super) fn new(
        backend: &Arc<Shared>,
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
            batched: false,
            owed_for: None,
        }
    }

    /// A holder's release now of a lock whose lease is `lease`: owed until done (see
    /// [`owe`](Self::owe)).
    pub(super) fn owed_for(mut self, lease: Duration) -> Self {
        self.owed_for = Some(lease);
        self
    }

    /// The script's number of milliseconds (before the channel).
    pub(super) fn millis(mut self, millis: u64) -> Self {
        self.millis = Some(millis);
        self
    }

    /// Sends the script; its answer. One that meets a lost connection is sent again once, on
    /// the connection made anew (see [`again_after`](Self::again_after)).
    async fn call(&self) -> Result<i64, LockError> {
        match self.send().await {
            Err(e) if connection_lost(&e) => self.again_after(e).await.map(|()| 1),
            answer => answer.map_err(|e| self.backend.server.failed(&self.name, "release", e)),
        }
    }

    async fn send(&self) -> Result<i64, redis::RedisError> {
        match (&self.backend.lane, self.batched) {
            // A holder's release of a mutex: in a batch when another call is on the wire (see
            // `batch.rs`), behind the attempts made before it.
            (Some(lane), true) => {
                let op = || Op::Release { lock: self.key.clone(), owner: self.owner.clone() };
                let alone =
                    || -> BoxFuture<'_, _> { Box::pin(async { self.send_alone().await.map(|status| (status, 0)) }) };
                lane.run(op, alone).await.map(|(status, _)| status)
            }
            _ => self.send_alone().await,
        }
    }

    async fn send_alone(&self) -> Result<i64, redis::RedisError> {
        let mut invocation = self.script.prepare_invoke();
        invocation.key(&*self.key).arg(&*self.owner);
        if std::ptr::eq(self.script, &*RELEASE) && self.backend.queues() {
            // A mutex's: granted from its queue if someone waits there, its entry removed if
            // this is a dropped waiter's undo.
            // (Queues are kept where one server holds every lock: the server's counter.)
            invocation.key(queue_of(&self.key)).key(SERVER_FENCE);
        }
        if let Some(millis) = self.millis {
            invocation.arg(millis);
        }
        invocation.arg(&*self.channel);
        self.backend.server.eval_raw::<i64>(invocation).await
    }

    /// The script met a lost connection (`lost`: killed, the server restarted, a failover):
    /// it may or may not have run. Sent again once, so that a lock still held is freed now
    /// rather than when its lease runs out; released by this second call, it is `Ok` (the
    /// local queue told). Any other answer cannot tell whether the first call ran (the key
    /// gone: released by it, or expired; another owner's: granted after it, or after the
    /// lease), so the verdict is the first call's error.
    async fn again_after(&self, lost: redis::RedisError) -> Result<(), LockError> {
        let lost = self.backend.server.failed(&self.name, "release", lost);
        match self.send().await {
            Ok(1) => {
                self.tell();
                Ok(())
            }
            _ => Err(lost),
        }
    }

    /// Tells the local queue of the lock that its holder let go (or may have).
    fn tell(&self) {
        self.backend.waiters.released(&self.channel, &self.owner);
    }

    /// [`call`](Self::call) bounded by the command timeout, for work nobody awaits.
    pub(super) async fn call_bounded(&self) -> Result<i64, LockError> {
        bounded(&self.name, "release", self.backend.options.command_timeout, self.call()).await
    }

    /// A holder's release: `Ok` when the script found the lock still the owner's. Local
    /// waiters are told as soon as the script is on the wire, so that the head's attempt
    /// follows it on the same connection and is granted in the same round trip (a hand-off
    /// within this process in one round trip); and however it ends, if it ends first.
    /// Dropped before its answer (the caller's `select!` or timeout gave up), it still
    /// completes in the background: see [`Unabandoned`].
    pub(super) fn release(mut self) -> BoxFuture<'static, Result<(), LockError>> {
        // A mutex's (batched with the attempts and releases made before it, so it still goes
        // ahead of every command made after it).
        self.batched = std::ptr::eq(self.script, &*RELEASE) && self.backend.queues();
        let runtime = self.backend.runtime.clone();
        let timeout = self.backend.options.command_timeout;
        let name = self.name.clone();
        let release = Box::pin(async move {
            let started = crate::clock::now();
            // Bounded here (within the manager's own bound), so that one that got no answer
            // is owed (below) rather than dropped.
            let outcome = bounded(&self.name, "release", timeout, async {
                if std::ptr::eq(self.script, &*RELEASE) {
                    if let Some(ticket) = self.backend.waiters.hand_off(&self.channel, &self.owner) {
                        return self.hand_off(ticket).await;
                    }
                }
                let mut tell = Some(Tell(&self));
                let mut call = std::pin::pin!(self.call());
                let status = std::future::poll_fn(|cx| {
                    let polled = std::future::Future::poll(call.as_mut(), cx);
                    drop(tell.take()); // sent (or over): the head attempts behind it
                    polled
                })
                .await;
                still_held(&self.name, status?)
            })
            .await;
            match (&outcome, self.owed_for) {
                (Err(e), Some(lease)) if !e.is_lost() => self.owe(started + lease),
                _ => {}
            }
            outcome
        });
        Box::pin(Unabandoned::new(release, runtime, (timeout, KIND), name))
    }

    /// A release that failed without an answer (the server down or unreachable) is owed
    /// ([`owed`](crate::background::owed)): tried again in the background until the server
    /// answers it (released, or the key already gone or another owner's: nothing is owed any
    /// more) or `until`, when the key's lease has ended by itself. Without it, a release that
    /// fell in an outage left the key to block every other process for the rest of its lease.
    fn owe(&self, until: std::time::Instant) {
        let mut call = self.clone();
        call.batched = false;
        call.owed_for = None;
        let runtime = self.backend.runtime.clone();
        let timeout = self.backend.options.command_timeout;
        let over = tokio::time::sleep_until(until.into());
        let owed = crate::background::owed(over, move || {
            let call = call.clone();
            async move {
                match bounded(&call.name, "release", timeout, call.call()).await {
                    Ok(status) => {
                        if status == 1 {
                            call.tell();
                        }
                        true
                    }
                    Err(e) => e.is_lost(),
                }
            }
        });
        drop(runtime.spawn(owed));
    }
}

impl ReleaseCall {
    /// The release as `handoff.lua`: the lock granted, in the same script, to the waiter of
    /// this process whose `ticket` it took (see `handoff.rs`).
    async fn hand_off(&self, ticket: Arc<Ticket>) -> Result<(), LockError> {
        // Answered however it ends (dropped first: the grant may have been made).
        let mut answer = Answer { call: self, ticket: &ticket, handed: Handed::Maybe };
        let sent = crate::clock::now();
        let mut invocation = HANDOFF.prepare_invoke();
        invocation.key(&*self.key).key(&*ticket.fence);
        if self.backend.queues() {
            invocation.key(queue_of(&self.key));
        }
        invocation.arg(&*self.owner).arg(&*self.channel).arg(&*ticket.owner).arg(ticket.lease);
        match ticket.window {
            Some(window) => invocation.arg(window),
            None => invocation.arg(""),
        };
        invocation.arg(if ticket.may_be_queued() { "1" } else { "0" });
        let reply = self.backend.server.eval_raw::<(i64, i64, i64)>(invocation).await;
        answer.handed = match &reply {
            Ok((_, 1, token)) if *token > 0 => Handed::Granted { token: *token, sent },
            Ok((_, 0, pttl)) => Handed::Held { sent, pttl: *pttl },
            Ok(_) => Handed::Open,
            Err(_) => Handed::Maybe,
        };
        drop(answer);
        match reply {
            Ok((released, _, _)) => still_held(&self.name, released),
            // The waiter attempts on its own (`Maybe`): the lock is released as by `call`.
            Err(e) if connection_lost(&e) => self.again_after(e).await,
            Err(e) => Err(self.backend.server.failed(&self.name, "release", e)),
        }
    }
}

/// Gives a hand-off's ticket its outcome when dropped, wakes its waiter, and undoes the grant
/// of a waiter gone meanwhile.
struct Answer<'a> {
    call: &'a ReleaseCall,
    ticket: &'a Arc<Ticket>,
    handed: Handed,
}

impl Drop for Answer<'_> {
    fn drop(&mut self) {
        let call = self.call;
        if self.ticket.answer(self.handed) && (self.handed.may_hold() || self.ticket.queues(self.handed)) {
            let undo = ReleaseCall::new(
                &call.backend,
                &RELEASE,
                &call.name,
                call.key.clone(),
                call.channel.clone(),
                &self.ticket.owner,
            );
            undo_dropped(undo, false);
        }
        call.backend.waiters.handed(&call.channel, self.ticket);
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
    let runtime = call.backend.runtime.clone();
    let undo = async move {
        let shown = crate::telemetry::shown_name(&call.name);
        let started = crate::clock::now();
        match call.call_bounded().await {
            Ok(1) => {
                tracing::debug!(lock = %shown, "undid what a dropped acquisition left");
                call.tell();
            }
            Ok(_) if !always_tell => {}
            Ok(_) => call.tell(),
            Err(e) => {
                call.tell();
                match call.owed_for {
                    Some(lease) if !e.is_lost() => {
                        tracing::debug!(lock = %shown, error = %crate::telemetry::shown_error(&e), "could not undo what a dropped acquisition left yet; trying again");
                        call.owe(started + lease);
                    }
                    _ => {
                        tracing::warn!(lock = %shown, error = %crate::telemetry::shown_error(&e), "could not undo what a dropped acquisition left; its lease will free the lock");
                    }
                }
            }
        }
    };
    finish_in_background(
        &runtime,
        undo,
        "could not undo what a dropped acquisition left; its lease will free the lock",
    );
}

/// A lock held in Redis, of any kind: the mutex's key, or a read-write lock's or semaphore's
/// state with this holder's entry in it.
pub(super) struct RedisHeld {
    pub(super) backend: Arc<Shared>,
    pub(super) name: Arc<str>,
    /// The lock key, or the kind's state.
    pub(super) key: Arc<str>,
    pub(super) channel: Arc<str>,
    pub(super) owner: Arc<str>,
    pub(super) kind: LockKind,
    /// Its lease (a renewed one's, or a fixed one's): how long its key may outlive a release
    /// that failed.
    pub(super) lease: Duration,
    /// Its registration among the locks checked after a lost connection; removed when its
    /// release begins (the release reports what it finds).
    pub(super) holding: Option<Holding>,
}

impl RedisHeld {
    /// The owner-checked release of this lock, now or (`remainder`, in milliseconds) after a
    /// remainder.
    fn call(&self, remainder: Option<u64>) -> ReleaseCall {
        release_call(
            &self.backend,
            &self.name,
            self.kind,
            self.key.clone(),
            self.channel.clone(),
            &self.owner,
            remainder,
        )
    }
}

/// The owner-checked release script call of a lock of `kind`: `release.lua`, or
/// `release_after.lua` with a remainder, for a mutex; `kind_release.lua` (remainder 0: now)
/// for the other kinds.
pub(super) fn release_call(
    backend: &Arc<Shared>,
    name: &Arc<str>,
    kind: LockKind,
    key: Arc<str>,
    channel: Arc<str>,
    owner: &Arc<str>,
    remainder: Option<u64>,
) -> ReleaseCall {
    match (kind, remainder) {
        (LockKind::Exclusive, None) => ReleaseCall::new(backend, &RELEASE, name, key, channel, owner),
        (LockKind::Exclusive, Some(millis)) => {
            ReleaseCall::new(backend, &RELEASE_AFTER, name, key, channel, owner).millis(millis)
        }
        (_, remainder) => {
            ReleaseCall::new(backend, &KIND_RELEASE, name, key, channel, owner).millis(remainder.unwrap_or(0))
        }
    }
}

impl HeldLock for RedisHeld {
    fn release(&mut self) -> BoxFuture<'_, Result<(), LockError>> {
        drop(self.holding.take());
        self.call(None).owed_for(self.lease).release()
    }

    fn release_after(&mut self, remaining: Duration) -> BoxFuture<'_, Result<(), LockError>> {
        // Local waiters look again (and learn the new expiry), as remote ones do from the
        // publication.
        drop(self.holding.take());
        self.call(Some(lease_millis(remaining))).release()
    }

    fn renewal(&self) -> Option<Box<dyn Renewal>> {
        Some(Box::new(RedisRenewal {
            backend: self.backend.clone(),
            name: self.name.clone(),
            key: self.key.clone(),
            owner: self.owner.clone(),
            kind: self.kind,
        }))
    }
}

/// Renews a lock held in Redis (`extend.lua`; `kind_extend.lua` for a holder's entry of the
/// other kinds), waiting for replicas when [`RedisOptions::wait_for_replicas`] says so.
struct RedisRenewal {
    backend: Arc<Shared>,
    name: Arc<str>,
    key: Arc<str>,
    owner: Arc<str>,
    kind: LockKind,
}

impl Renewal for RedisRenewal {
    fn extend(&self, lease: Duration) -> BoxFuture<'_, Result<(), LockError>> {
        Box::pin(async move {
            let script = if self.kind == LockKind::Exclusive { &*EXTEND } else { &*KIND_EXTEND };
            let mut invocation = script.prepare_invoke();
            invocation.key(&*self.key).arg(&*self.owner).arg(lease_millis(lease));
            let Some((replicas, timeout)) = self.backend.options.wait_for_replicas else {
                return still_held(
                    &self.name,
                    self.backend.server.eval::<i64>(&self.name, "extend", invocation).await?,
                );
            };
            let lease = lease_millis(lease).to_string();
            let script = (script, &[&*self.key][..], &[&*self.owner, &*lease][..]);
            match self.backend.server.eval_then_wait::<i64>(&self.name, "extend", script, (replicas, timeout)).await? {
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
