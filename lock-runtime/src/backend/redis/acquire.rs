//! One acquisition on Redis, of any kind: a mutex (`acquire.lua`) or a read lock, write lock or
//! permit (`kind_acquire.lua`), with one local queue, one wait loop and one cleanup when
//! dropped. What differs by kind is the keys ([`KeyLayout::of_kind`]), the scripts and their
//! mode arguments, and three rules: a writer's intent, a semaphore's agreed permits, and a
//! shared grant that passes a wake-up on (see the [module docs](super)).

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::attempt_call::AttemptCall;
use super::handoff::{Handed, Ticket};
use super::held::{release_call, undo_dropped, RedisHeld};
use super::layout::KeyLayout;
use super::options::KIND;
use super::scripts::WATCH;
use super::server::{bounded, lease_millis};
use super::shared::Shared;
use super::waiters::{Before, Capture, Outage, Slot, Step};
use crate::backend::{Acquire, Acquisition, Attempt, BoxFuture, Grant, Held, LockKind, Wake};
use crate::error::LockError;
use crate::lost::LostSignal;

/// One `lock()`, `read_lock()`, `write_lock()` or `semaphore()` call on Redis: owns its place
/// in the local queue (once it has one), any acquire in flight and (a writer) its intent.
/// Dropped, it leaves the queue (passing on a wake-up it was given) and removes whatever it may
/// have left in Redis with an owner-checked release script.
pub(super) struct RedisAcquisition {
    backend: Arc<Shared>,
    req: Acquire,
    layout: KeyLayout,
    owner: Arc<str>,
    slot: Option<Slot>,
    /// An acquire script was sent and its answer not seen: it may hold the lock server-side.
    in_flight: bool,
    /// A writer's intent was recorded (it keeps new readers out until removed or expired).
    intent: bool,
    /// This waiter's attempts or looks failing (a restart, a failover): retried with backoff.
    outage: Outage,
    /// What tells the holder that the lock was lost (fired at once when a check after a lost
    /// connection finds it gone: see `holdings.rs`).
    lost: LostSignal,
    /// A waiting mutex's offer to be granted the lock by a release of this process (see
    /// `handoff.rs`); made when it first waits.
    ticket: Option<Arc<Ticket>>,
    /// A mutex's claim window in milliseconds, when it registers in the lock's queue while it
    /// waits (see `handoff.rs`), and the queue's name once it does.
    queue: Option<(u64, Option<String>)>,
}

/// The mode argument of `kind_acquire.lua` and the permits of `kind`; `None` for a mutex.
fn mode(kind: LockKind) -> Option<(&'static str, u32)> {
    match kind {
        LockKind::Exclusive => None,
        LockKind::Read => Some(("R", 0)),
        LockKind::Semaphore { permits } => Some(("S", permits)),
        _ => Some(("W", 0)),
    }
}

impl RedisAcquisition {
    /// Begins an acquisition of `req`, for `owner` (`<owner id>@<holder>`).
    pub(super) fn new(backend: &Arc<Shared>, req: Acquire, owner: Arc<str>, lost: LostSignal) -> Self {
        let layout = KeyLayout::of_kind(&req.key, req.kind);
        let backend = backend.clone();
        let queue = match (req.kind, backend.options.wait_for_replicas) {
            (LockKind::Exclusive, None) if backend.queues() => claim_window(req.lease.duration()).map(|w| (w, None)),
            _ => None,
        };
        RedisAcquisition {
            backend,
            req,
            layout,
            owner,
            slot: None,
            in_flight: false,
            intent: false,
            outage: Outage::default(),
            lost,
            ticket: None,
            queue,
        }
    }

    /// Offers `slot` a ticket (a mutex without `wait_for_replicas`): a release of this process
    /// may grant it the lock in the release's own script.
    fn offer(&mut self, slot: &Slot) {
        if self.req.kind != LockKind::Exclusive || self.backend.options.wait_for_replicas.is_some() {
            return;
        }
        let window = self.queue.as_ref().map(|(window, _)| *window);
        let ticket = self.ticket.get_or_insert_with(|| {
            let fence = self.backend.fence(&self.layout.fence).into();
            let lease = lease_millis(self.req.lease.duration());
            Ticket::new(self.owner.clone(), fence, lease, window)
        });
        slot.offer(ticket.clone());
    }

    /// The lock granted by a release of this process (`handoff.lua`), with `token`, by a
    /// release sent at `sent`.
    fn handed(&mut self, token: i64, sent: Instant) -> Attempt {
        // `handoff.lua` removed its queue entry; nothing of the ticket is left to undo.
        self.ticket = None;
        let lease_end = sent.checked_add(self.req.lease.duration());
        if let Some(slot) = self.slot.take() {
            slot.granted(lease_end);
        }
        Attempt::Acquired(self.grant(token, sent))
    }

    async fn attempt_inner(&mut self) -> Result<Attempt, LockError> {
        if let LockKind::Semaphore { permits: 0 } = self.req.kind {
            return Err(LockError::invalid(&*self.req.name, "a semaphore of 0 permits admits nobody; give at least 1"));
        }
        let mode = mode(self.req.kind);
        let writer = self.req.kind == LockKind::Write;
        let waiters = &self.backend.waiters;
        if let Some(ticket) = &self.ticket {
            // Granted by a release of this process: no attempt of its own. (After a failed
            // hand-off, the attempt below is granted again if the hand-off was.)
            if let Handed::Granted { token, sent } = ticket.take() {
                return Ok(self.handed(token, sent));
            }
        }
        let capture = match &self.slot {
            Some(slot) => {
                slot.attempting();
                None
            }
            None => match waiters.before_attempt(&self.layout.channel, writer) {
                Before::Queued(slot) => {
                    // Local FIFO: behind this process's waiters (a waiting writer among them
                    // keeps a reader out), without racing their head.
                    self.offer(&slot);
                    self.slot = Some(slot);
                    return Ok(Attempt::Busy);
                }
                Before::Attempt(capture) => Some(capture),
            },
        };
        let lease = self.req.lease.duration();
        let sent = crate::clock::now();
        self.in_flight = true;
        let wait = self.backend.options.wait_for_replicas;
        // A waiter's attempts register it in the lock's queue (not a first attempt, which may
        // be a `try_lock`'s: a waiter registers once it has waited a third of its window).
        // The ticket says whether it may have an entry already (removed when it is granted).
        let registering = match (&self.slot, &mut self.queue, &self.ticket) {
            (Some(_), Some((_, name)), Some(ticket)) => {
                name.get_or_insert_with(|| self.layout.queue());
                Some(ticket.registering())
            }
            _ => None,
        };
        let call = AttemptCall {
            backend: &self.backend,
            name: &self.req.name,
            lock: &self.layout.lock,
            fence: self.backend.fence(&self.layout.fence),
            owner: &self.owner,
            lease,
            mode,
            queue: match (registering, &self.queue) {
                (Some(registered), Some((window, Some(queue)))) => Some((queue.as_str(), *window, registered)),
                _ => None,
            },
        };
        // Bounded here too (a connection being made again may not answer at all), so that the
        // outage is this backend's error, which a waiter waits out below.
        let timeout = self.backend.options.command_timeout;
        let reply = bounded(&self.req.name, "acquire", timeout, call.send(|| self.undo())).await;
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
        match status {
            1 => {
                if value <= 0 {
                    // Not ours to keep: undone when this acquisition is dropped.
                    self.in_flight = true;
                    let why = format!("the fencing counter returned {value}");
                    return Err(LockError::backend(&*self.req.name, KIND, "acquire", why));
                }
                self.intent = false; // the grant removed it
                self.ticket = None; // the grant removed its queue entry: nothing of it is left to undo
                if let (Some(acked), Some((replicas, timeout))) = (acked, wait) {
                    if acked < replicas {
                        // (Boxed: a rare call, kept out of the size of every attempt's future.)
                        return Err(Box::pin(self.undo_short_grant(acked, replicas, timeout)).await);
                    }
                }
                let lease_end = sent.checked_add(lease);
                match self.slot.take() {
                    Some(slot) => {
                        slot.granted(lease_end);
                        if mode.is_some() && !writer {
                            // There may be room for the next local waiter as well.
                            waiters.released(&self.layout.channel, &format!("{}+granted", self.owner));
                        }
                    }
                    None => waiters.acquired(&self.layout.channel, lease_end),
                }
                Ok(Attempt::Acquired(self.grant(value, sent)))
            }
            -1 if mode.is_some() => Err(LockError::invalid(
                &*self.req.name,
                format!(
                    "the semaphore is held with {value} permits; this call asked for {}: every holder of a \
                     semaphore must give the same number of permits",
                    mode.map_or(0, |(_, permits)| permits)
                ),
            )),
            _ => {
                self.intent = writer;
                match (&self.slot, capture) {
                    (Some(slot), _) => slot.busy(sent, value),
                    (None, capture) => {
                        let capture = capture.unwrap_or(Capture::NONE);
                        let slot = waiters.busy(&self.layout.channel, capture, sent, value, writer);
                        self.offer(&slot);
                        self.slot = Some(slot);
                    }
                }
                if let (Some(_), Some(ticket)) = (registering, &self.ticket) {
                    ticket.registered(sent);
                }
                Ok(Attempt::Busy)
            }
        }
    }

    /// Whether it may have an entry in the lock's queue (see `handoff.rs`).
    fn queued(&self) -> bool {
        self.ticket.as_ref().is_some_and(|ticket| ticket.may_be_queued())
    }

    fn grant(&self, token: i64, sent: Instant) -> Grant {
        let key: Arc<str> = self.layout.lock.as_str().into();
        let mutex = self.req.kind == LockKind::Exclusive;
        let holding = self.backend.holdings.register(&self.req.name, &key, &self.owner, mutex, &self.lost);
        let lock = RedisHeld {
            backend: self.backend.clone(),
            name: self.req.name.clone(),
            key,
            channel: self.layout.channel.as_str().into(),
            owner: self.owner.clone(),
            kind: self.req.kind,
            lease: self.req.lease.duration(),
            holding,
        };
        Grant { fencing_token: u64::try_from(token).unwrap_or(0), granted_at: Some(sent), lock: Held::new(lock) }
    }

    /// Undoes a grant that too few replicas acknowledged (owner-checked; left to `Drop` if
    /// the release fails) and says why it failed.
    async fn undo_short_grant(&mut self, acked: usize, replicas: usize, timeout: Duration) -> LockError {
        // Held until undone: dropped meanwhile (or the release failing), `Drop` undoes it.
        self.in_flight = true;
        if self.undo().call_bounded().await.is_ok() {
            self.in_flight = false;
            self.backend.waiters.released(&self.layout.channel, &self.owner);
        }
        let why = format!(
            "only {acked} of the {replicas} required replica(s) acknowledged the grant within {timeout:?} \
             (wait_for_replicas), so it was undone: check the replicas (`INFO replication`), or lower \
             wait_for_replicas / raise its timeout"
        );
        LockError::backend(&*self.req.name, KIND, "acquire", why)
    }

    /// The owner-checked undo of what this acquisition may hold; owed until done or its lease
    /// has ended, when it fails without an answer.
    fn undo(&self) -> super::held::ReleaseCall {
        let (key, channel) = (self.layout.lock.as_str().into(), self.layout.channel.as_str().into());
        release_call(&self.backend, &self.req.name, self.req.kind, key, channel, &self.owner, None)
            .owed_for(self.req.lease.duration())
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
                // The other kinds look by attempting (their attempt marks the state), and so
                // does a mutex waiter queued in Redis: a grant from the queue announced before
                // its channel was subscribed (again) may be its own, which its attempt claims.
                Step::Attempt => return Ok(Wake::Retry),
                Step::Check if self.req.kind != LockKind::Exclusive || self.queued() => return Ok(Wake::Retry),
                Step::Check => {
                    let sent = crate::clock::now();
                    let mut invocation = WATCH.prepare_invoke();
                    invocation.key(&self.layout.lock);
                    let look = self.backend.server.eval::<i64>(&self.req.name, "wait for", invocation);
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
        // A grant by a release of this process that this acquisition did not take (one still
        // on the wire is undone by that release, once answered).
        let handed = self.ticket.take().is_some_and(|ticket| {
            let (handed, queued) = ticket.abandon();
            handed.may_hold() || queued
        });
        if !self.in_flight && !self.intent && !handed {
            return;
        }
        // An acquire whose answer was never seen may have taken the lock, a waiting writer
        // keeps readers out, and a queue entry may be granted the lock: undo all three (only
        // what there is: the release is owner-checked, and removes the entry). A mutex's local
        // waiters are told when it was undone (or may have been), not when the lock is
        // someone else's: that holder's release tells them; the other kinds' always are.
        undo_dropped(self.undo(), self.req.kind != LockKind::Exclusive);
    }
}

/// The claim window of a mutex acquisition with `lease` (how long a grant from the lock's
/// queue waits to be claimed, and how long its queue entry lives unrenewed): at most 2 s, and
/// at most the lease; none below 300 ms (such a waiter does not register; see `handoff.rs`).
fn claim_window(lease: Duration) -> Option<u64> {
    (lease >= Duration::from_millis(300)).then(|| lease_millis(lease.min(Duration::from_secs(2))))
}
