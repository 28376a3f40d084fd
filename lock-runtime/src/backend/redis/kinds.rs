//! Read-write locks and semaphores on Redis ([`LockKind::Read`], [`LockKind::Write`],
//! [`LockKind::Semaphore`]).
//!
//! # Keys
//!
//! Each kind has its own namespace: a read-write lock's state is the hash `lock:rw:{<key>}`,
//! a semaphore's `lock:sem:{<key>}`, each with its release channel `<state>:released`. The
//! hash tag is the mutex's (`lock:{<key>}`), so a name's keys, channels and its slot's fencing
//! counter share one Redis Cluster slot, and every script touches one slot. A name that begins
//! with `}` leaves the tag empty (`lock:rw:{}…`): Redis then hashes the state whole, and the
//! fencing counter is that slot's (the channel is a script argument, not a key).
//!
//! The hash holds one field per holder, `h:<owner>` → `<expiry ms>#<R|W|S>#<token>#<granted
//! ms>`, one per waiting writer, `w:<owner>` → `<expiry ms>` (its intent), the semaphore's
//! `permits`, and `mark` once someone waits. Expiries are the server's clock (`TIME`): every
//! script prunes the entries past theirs, so a crashed holder (or waiting writer) blocks
//! nobody past its lease, and the key itself expires with its last entry (no key is left
//! behind, whatever crashed; only the fencing counters stay).
//!
//! # Scripts
//!
//! `kind_acquire.lua` (one attempt: room is checked and the holder added, or the state marked
//! waited on), `kind_release.lua` (release, `hold_at_least`, and the cleanup of a dropped
//! acquisition) and `kind_extend.lua` (the watchdog's renewal, per holder), each stating its
//! keys, arguments and answers.
//!
//! # Fairness
//!
//! A writer that finds no room records its intent (`w:<owner>`, living for its lease and
//! renewed by each of its attempts, which come at least every third of its lease): while an
//! intent lives, no new reader gets in, in any process, so a stream of readers cannot starve a
//! writer. A writer dropped while waiting (cancelled at any poll, timed out) removes its intent
//! and wakes the waiters; one that crashed stops renewing it, and it expires.
//!
//! # Waiting
//!
//! As for the mutex: a local FIFO queue per name (shared with nothing: its channel is the
//! kind's), one pub/sub subscription per name while tasks of this process wait, a release that
//! publishes only when the state is marked waited on, and a waiter that also wakes when the
//! earliest entry in its way expires. A reader or permit holder granted from the queue passes
//! a wake-up to the next local waiter (there may be room for it too). In the local queue a
//! writer goes ahead of the sleeping readers (they are kept out by its intent anyway), so the
//! writer, not a reader its own intent keeps out, is the head that attempts and renews the
//! intent.
//!
//! # Permits
//!
//! A semaphore's state records its `permits`; an attempt with another number while it has
//! holders is refused with an [`is_invalid`](crate::LockError::is_invalid) error (never more
//! holders than agreed). Once free, the next holder sets the number anew.

use std::sync::{Arc, LazyLock};
use std::time::{Duration, Instant};

use redis::Script;

use super::layout::fence_of;
use super::waiters::{Before, Capture, Outage, Slot, Step};
use super::{bounded, lease_millis, still_held, undo_dropped, RedisBackend, ReleaseCall, KIND};
use crate::backend::{Acquire, Acquisition, Attempt, BoxFuture, Grant, Held, HeldLock, LockKind, Renewal, Wake};
use crate::error::LockError;

static ACQUIRE: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("kind_acquire.lua")));
static RELEASE: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("kind_release.lua")));
static EXTEND: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("kind_extend.lua")));

/// The Redis names of one read-write lock or semaphore.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct KindKeys {
    /// The state, `lock:rw:{<key>}` or `lock:sem:{<key>}`.
    pub(super) state: String,
    /// The release channel, `<state>:released`.
    pub(super) channel: String,
    /// The fencing counter of the name's hash slot (the mutex's).
    pub(super) fence: String,
}

impl KindKeys {
    /// The names of `kind` for the backend key `key`.
    pub(super) fn of(key: &str, kind: LockKind) -> Self {
        let space = if matches!(kind, LockKind::Semaphore { .. }) { "sem" } else { "rw" };
        let state = format!("lock:{space}:{{{key}}}");
        let channel = format!("{state}:released");
        // The state's own slot: a name beginning with `}` leaves the state's hash tag empty, so
        // the state is hashed whole, to another slot than the mutex key of the same name.
        let fence = fence_of(&state);
        KindKeys { state, channel, fence }
    }
}

/// The mode argument of `kind_acquire.lua` and the permits of `kind`.
fn mode(kind: LockKind) -> (&'static str, u32) {
    match kind {
        LockKind::Read => ("R", 0),
        LockKind::Semaphore { permits } => ("S", permits),
        _ => ("W", 0),
    }
}

/// Begins an acquisition of a read lock, a write lock or a permit.
pub(super) fn begin(backend: &RedisBackend, req: Acquire, owner: Arc<str>) -> Box<dyn Acquisition> {
    let keys = KindKeys::of(&req.key, req.kind);
    Box::new(KindAcquisition {
        backend: backend.clone(),
        req,
        keys,
        owner,
        slot: None,
        in_flight: false,
        intent: false,
        outage: Outage::default(),
    })
}

/// One `read_lock()`, `write_lock()` or `semaphore()` call on Redis: owns its place in the
/// local queue, any acquire in flight and (a writer) its intent. Dropped, it leaves the queue
/// and removes whatever it may have left in Redis with an owner-checked `kind_release.lua`.
struct KindAcquisition {
    backend: RedisBackend,
    req: Acquire,
    keys: KindKeys,
    owner: Arc<str>,
    slot: Option<Slot>,
    /// An acquire was sent and its answer not seen: it may hold an entry server-side.
    in_flight: bool,
    /// A writer's intent was recorded (it keeps new readers out until removed or expired).
    intent: bool,
    /// This waiter's attempts failing (a restart, a failover): retried with backoff.
    outage: Outage,
}

impl KindAcquisition {
    async fn attempt_inner(&mut self) -> Result<Attempt, LockError> {
        let (mode, permits) = mode(self.req.kind);
        if mode == "S" && permits == 0 {
            return Err(LockError::invalid(&*self.req.name, "a semaphore of 0 permits admits nobody; give at least 1"));
        }
        let waiters = &self.backend.inner.waiters;
        let capture = match &self.slot {
            Some(slot) => {
                slot.attempting();
                None
            }
            None => match waiters.before_attempt_as(&self.keys.channel, mode == "W") {
                Before::Queued(slot) => {
                    // Local FIFO: behind this process's waiters (a waiting writer among them
                    // keeps this reader out), without racing their head.
                    self.slot = Some(slot);
                    return Ok(Attempt::Busy);
                }
                Before::Attempt(capture) => Some(capture),
            },
        };
        let lease = self.req.lease.duration();
        let sent = crate::clock::now();
        let mut invocation = ACQUIRE.prepare_invoke();
        invocation
            .key(&self.keys.state)
            .key(&self.keys.fence)
            .arg(&*self.owner)
            .arg(lease_millis(lease))
            .arg(mode)
            .arg(permits);
        self.in_flight = true;
        let timeout = self.backend.inner.options.get_command_timeout();
        let call = self.backend.eval(&self.req.name, "acquire", invocation);
        let (status, value): (i64, i64) = match (bounded(&self.req.name, "acquire", timeout, call).await, &self.slot) {
            (Ok(reply), _) => {
                self.outage.ended();
                reply
            }
            // A waiter rides out an outage while its wait lasts (see the mutex's attempt).
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
                    self.in_flight = true; // not ours to keep: undone when dropped
                    let why = format!("the fencing counter returned {value}");
                    return Err(LockError::backend(&*self.req.name, KIND, "acquire", why));
                }
                self.intent = false; // the grant removed it
                let lease_end = sent.checked_add(lease);
                match self.slot.take() {
                    Some(slot) => {
                        slot.granted(lease_end);
                        if mode != "W" {
                            // There may be room for the next local waiter as well.
                            waiters.released(&self.keys.channel, &format!("{}+granted", self.owner));
                        }
                    }
                    None => waiters.acquired(&self.keys.channel, lease_end),
                }
                Ok(Attempt::Acquired(self.grant(value, sent)))
            }
            -1 => Err(LockError::invalid(
                &*self.req.name,
                format!(
                    "the semaphore is held with {value} permits; this call asked for {permits}: every holder of \
                     a semaphore must give the same number of permits"
                ),
            )),
            _ => {
                if mode == "W" {
                    self.intent = true;
                }
                match (&self.slot, capture) {
                    (Some(slot), _) => slot.busy(sent, value),
                    (None, capture) => {
                        let capture = capture.unwrap_or(Capture::NONE);
                        self.slot = Some(waiters.busy_as(&self.keys.channel, capture, sent, value, mode == "W"));
                    }
                }
                Ok(Attempt::Busy)
            }
        }
    }

    fn grant(&self, token: i64, sent: Instant) -> Grant {
        let lock = KindHeld {
            backend: self.backend.clone(),
            name: self.req.name.clone(),
            state: self.keys.state.as_str().into(),
            channel: self.keys.channel.as_str().into(),
            owner: self.owner.clone(),
        };
        Grant { fencing_token: u64::try_from(token).unwrap_or(0), granted_at: Some(sent), lock: Held::new(lock) }
    }

    async fn wait_inner(&mut self, deadline: Instant) -> Result<Wake, LockError> {
        let Some(slot) = &self.slot else { return Ok(Wake::Retry) };
        loop {
            if crate::clock::now() >= deadline {
                // An outage that outlasted the wait is its answer.
                return self.outage.timed_out();
            }
            let step = slot.step();
            if let (Step::Attempt | Step::Check, Some(again)) = (&step, self.outage.backoff_until()) {
                // Not before the backoff has passed (a notification may wake it earlier).
                slot.back_off(again.min(deadline)).await;
                continue;
            }
            let (notify, until) = match step {
                // The look after a confirmed subscription is an attempt (it marks the state).
                Step::Attempt | Step::Check => return Ok(Wake::Retry),
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

impl Acquisition for KindAcquisition {
    fn attempt(&mut self) -> BoxFuture<'_, Result<Attempt, LockError>> {
        Box::pin(self.attempt_inner())
    }

    fn wait(&mut self, deadline: Instant) -> BoxFuture<'_, Result<Wake, LockError>> {
        Box::pin(self.wait_inner(deadline))
    }
}

impl Drop for KindAcquisition {
    fn drop(&mut self) {
        // Leave the queue first: a wake-up this acquisition held goes to the next waiter now.
        drop(self.slot.take());
        if !self.in_flight && !self.intent {
            return;
        }
        // An acquire whose answer was never seen may have been granted, and a waiting writer
        // keeps readers out: remove both (owner-checked), and wake the waiters.
        let (state, channel) = (std::mem::take(&mut self.keys.state), std::mem::take(&mut self.keys.channel));
        let call = ReleaseCall::new(&self.backend, &RELEASE, &self.req.name, state.into(), channel.into(), &self.owner);
        undo_dropped(call.millis(0), true);
    }
}

/// A reader's, writer's or permit holder's entry in Redis.
struct KindHeld {
    backend: RedisBackend,
    name: Arc<str>,
    state: Arc<str>,
    channel: Arc<str>,
    owner: Arc<str>,
}

impl KindHeld {
    /// `kind_release.lua` with `remainder` (0: now). Local waiters attempt (or look again),
    /// as remote ones do from the publication; dropped before its answer, it still completes.
    fn release_with(&self, remainder: u64) -> BoxFuture<'static, Result<(), LockError>> {
        let call = ReleaseCall::new(
            &self.backend,
            &RELEASE,
            &self.name,
            self.state.clone(),
            self.channel.clone(),
            &self.owner,
        );
        call.millis(remainder).release()
    }
}

impl HeldLock for KindHeld {
    fn release(&mut self) -> BoxFuture<'_, Result<(), LockError>> {
        self.release_with(0)
    }

    fn release_after(&mut self, remaining: Duration) -> BoxFuture<'_, Result<(), LockError>> {
        self.release_with(lease_millis(remaining))
    }

    fn renewal(&self) -> Option<Box<dyn Renewal>> {
        Some(Box::new(KindRenewal {
            backend: self.backend.clone(),
            name: self.name.clone(),
            state: self.state.clone(),
            owner: self.owner.clone(),
        }))
    }
}

/// Renews one holder's entry (`kind_extend.lua`).
struct KindRenewal {
    backend: RedisBackend,
    name: Arc<str>,
    state: Arc<str>,
    owner: Arc<str>,
}

impl Renewal for KindRenewal {
    fn extend(&self, lease: Duration) -> BoxFuture<'_, Result<(), LockError>> {
        Box::pin(async move {
            let mut invocation = EXTEND.prepare_invoke();
            invocation.key(&*self.state).arg(&*self.owner).arg(lease_millis(lease));
            still_held(&self.name, self.backend.eval::<i64>(&self.name, "extend", invocation).await?)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::super::{key_slot, KeyLayout};
    use super::*;

    #[test]
    fn kind_keys_share_a_slot_with_their_counter_and_namespaces_differ() {
        for key in ["order:42", "myapp:x", "a{b}c", "é", "a}b", "}x", "{}x", "}{x}", "a}b{", "}"] {
            let lock = KeyLayout::of(key);
            let rw = KindKeys::of(key, LockKind::Read);
            let sem = KindKeys::of(key, LockKind::Semaphore { permits: 3 });
            assert_eq!(rw, KindKeys::of(key, LockKind::Write), "readers and writers share one state");
            assert_ne!(rw.state, sem.state);
            assert_ne!(rw.state, lock.lock);
            // The keys of one script (state and counter) share a slot, for every name.
            for keys in [&rw, &sem] {
                assert_eq!(key_slot(keys.fence.as_bytes()), key_slot(keys.state.as_bytes()), "{key}");
            }
            // With a hash tag (any name not beginning with `}`), the channels and the mutex too.
            if !key.starts_with('}') {
                let slot = key_slot(lock.lock.as_bytes());
                for name in [&rw.state, &rw.channel, &rw.fence, &sem.state, &sem.channel, &sem.fence] {
                    assert_eq!(key_slot(name.as_bytes()), slot, "{name} of {key}");
                }
            }
            assert_eq!(KeyLayout::key_of(&rw.state), None, "not taken for a mutex by inspection");
        }
    }

    #[test]
    fn kind_scripts_state_their_interface() {
        for src in [include_str!("kind_acquire.lua"), include_str!("kind_release.lua"), include_str!("kind_extend.lua")]
        {
            assert!(src.contains("KEYS[1]") && src.contains("ARGV[1]") && src.contains("Returns"));
        }
    }
}
