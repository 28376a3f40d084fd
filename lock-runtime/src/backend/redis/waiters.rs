//! Local waiting: one queue per lock key, the one shared pub/sub connection, and wake-ups.
//!
//! Waiters of one process on one key form a FIFO queue; only its head is woken, by a release
//! message or by the holder's lease running out, so a release costs one attempt per process
//! however many tasks wait (no thundering herd). A woken waiter that loses the race to another
//! process comes back at the front. While a woken waiter makes its attempt, the rest of the
//! queue waits for its outcome (it takes the lock, or comes back with the new holder's lease)
//! instead of following it, so a lease running out does not set off the whole queue either;
//! if it never reports back (cancelled, or its attempt failed), the next head looks for itself
//! after a hand-off window of two command timeouts.
//!
//! One background task owns the pub/sub connection. It subscribes a key's release channel
//! when a queue appears, and unsubscribes it once the queue has stayed empty for a short
//! grace period (so steady contention does not churn subscriptions, and nothing is left
//! subscribed once nobody waits). When the connection drops it reconnects with backoff,
//! resubscribes everything still waited on, and makes each queue's head re-check the lock.
//!
//! A release can be missed only while its waiter's channel is not yet subscribed: a head whose
//! last look at the lock predates the subscription re-checks it (`PTTL`) once the
//! subscription is confirmed. A release that arrives while the queue is empty (its woken
//! waiter is racing) is kept, and hands an immediate retry to the next waiter whose last
//! attempt predates it.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use futures_util::future::BoxFuture;
use futures_util::StreamExt;
use tokio::sync::{mpsc, Notify};

use crate::backend::OwnerId;

/// Most channels named in one `SUBSCRIBE` / `UNSUBSCRIBE`.
const BATCH: usize = 512;
/// Most owners remembered as "woken, may come back to the front" per key.
const FRONT: usize = 16;
/// Longest pause between two reconnection attempts of the pub/sub connection.
const MAX_BACKOFF: Duration = Duration::from_secs(1);

pub(super) struct Waiters {
    state: Arc<Mutex<State>>,
    poke: mpsc::UnboundedSender<()>,
    /// How long the rest of a queue gives a waiter that left it to make its attempt, before
    /// its new head looks at the lock itself (the leaver may have been cancelled or failed).
    handoff: Duration,
}

#[derive(Default)]
struct State {
    /// By release channel.
    keys: HashMap<Arc<str>, KeyState>,
    /// Channels to subscribe (checked against `keys` when taken).
    wanted: VecDeque<Arc<str>>,
    /// Channels whose queue emptied, and when (checked against `keys` when taken).
    idle: VecDeque<(Arc<str>, Instant)>,
    next_id: u64,
}

struct KeyState {
    queue: VecDeque<Slot>,
    /// Owners woken recently: if they wait again, they go first.
    front: VecDeque<OwnerId>,
    sub: Sub,
    /// When the holder's lease runs out, as last seen.
    ttl_at: Option<Instant>,
    /// A release announced while nobody here waited for it.
    unclaimed: Option<Instant>,
    /// When each owner's last attempt that found the lock busy was sent.
    tries: HashMap<OwnerId, Instant>,
    idle_since: Option<Instant>,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Sub {
    Wanted,
    Sending,
    Confirmed(Instant),
}

struct Slot {
    id: u64,
    owner: OwnerId,
    woken: bool,
    /// When this waiter last learnt the lock's state from Redis.
    checked: Option<Instant>,
    notify: Arc<Notify>,
}

impl KeyState {
    fn new() -> Self {
        KeyState {
            queue: VecDeque::new(),
            front: VecDeque::new(),
            sub: Sub::Wanted,
            ttl_at: None,
            unclaimed: None,
            tries: HashMap::new(),
            idle_since: None,
        }
    }

    /// Wakes the first waiter not yet woken; returns whether there was one.
    fn wake_one(&mut self) -> bool {
        match self.queue.iter_mut().find(|s| !s.woken) {
            Some(slot) => {
                slot.woken = true;
                slot.notify.notify_one();
                true
            }
            None => false,
        }
    }

    fn remember_front(&mut self, owner: OwnerId) {
        self.front.retain(|o| *o != owner);
        if self.front.len() >= FRONT {
            self.front.pop_back();
        }
        self.front.push_front(owner);
    }
}

fn lock(state: &Mutex<State>) -> MutexGuard<'_, State> {
    state.lock().unwrap_or_else(PoisonError::into_inner)
}

/// What a waiter does next.
pub(super) enum Step {
    /// Make another attempt (woken by a release, or the holder's lease ran out).
    Retry,
    /// Look at the lock (`PTTL`): a release may have gone unannounced to this waiter. Carries
    /// what to sleep on if the look must wait (it failed recently), and the holder's lease end.
    Check(Arc<Notify>, Option<Instant>),
    /// Sleep until notified, or until the instant (the holder's lease end).
    Sleep(Arc<Notify>, Option<Instant>),
}

/// Result of [`Waiters::register`].
pub(super) enum Joined<'a> {
    /// A release was announced since this owner's last attempt: retry at once.
    Retry,
    /// Queued.
    Queued(Registration<'a>),
}

/// A waiter's place in its key's queue; leaving it (drop) hands on any wake-up it received.
pub(super) struct Registration<'a> {
    waiters: &'a Waiters,
    channel: Arc<str>,
    id: u64,
    done: bool,
}

impl Waiters {
    /// Starts the pub/sub task (on the current tokio runtime); it stops when this is dropped.
    pub(super) fn start(client: redis::Client, timeout: Duration, grace: Duration) -> Self {
        let state = Arc::new(Mutex::new(State::default()));
        let (poke, rx) = mpsc::unbounded_channel();
        tokio::spawn(subscriber(state.clone(), client, rx, timeout, grace));
        Waiters { state, poke, handoff: timeout * 2 }
    }

    fn poke(&self) {
        let _ = self.poke.send(());
    }

    /// An attempt sent at `sent` by `owner` found the lock busy.
    pub(super) fn note_busy(&self, channel: &str, owner: OwnerId, sent: Instant) {
        let mut st = lock(&self.state);
        if let Some(ks) = st.keys.get_mut(channel) {
            if ks.tries.len() >= 64 {
                ks.tries.retain(|_, at| sent.saturating_duration_since(*at) < Duration::from_secs(10));
            }
            ks.tries.insert(owner, sent);
        }
    }

    /// `owner` took the lock, with a lease ending at `lease_end`.
    pub(super) fn note_acquired(&self, channel: &str, owner: OwnerId, lease_end: Option<Instant>) {
        let mut st = lock(&self.state);
        if let Some(ks) = st.keys.get_mut(channel) {
            ks.front.retain(|o| *o != owner);
            ks.tries.remove(&owner);
            ks.ttl_at = lease_end;
        }
    }

    /// Joins the queue of `channel` for `owner`, whose last attempt said the holder's lease
    /// ends in `expires_in`.
    pub(super) fn register(&self, channel: &str, owner: OwnerId, expires_in: Option<Duration>) -> Joined<'_> {
        let now = Instant::now();
        let mut guard = lock(&self.state);
        let st = &mut *guard;
        st.next_id += 1;
        let id = st.next_id;
        let channel: Arc<str> = match st.keys.get_key_value(channel) {
            Some((k, _)) => k.clone(),
            None => {
                let k: Arc<str> = Arc::from(channel);
                st.keys.insert(k.clone(), KeyState::new());
                st.wanted.push_back(k.clone());
                self.poke();
                k
            }
        };
        let Some(ks) = st.keys.get_mut(&channel) else { return Joined::Retry };
        ks.idle_since = None;
        let checked = ks.tries.remove(&owner);
        if let Some(d) = expires_in {
            ks.ttl_at = now.checked_add(d);
        }
        if let Some(u) = ks.unclaimed {
            if checked.is_none_or(|c| c < u) {
                ks.unclaimed = None;
                ks.remember_front(owner);
                ks.ttl_at = now.checked_add(self.handoff);
                if ks.queue.is_empty() {
                    ks.idle_since = Some(now);
                    st.idle.push_back((channel, now));
                    self.poke();
                }
                return Joined::Retry;
            }
        }
        let slot = Slot { id, owner, woken: false, checked, notify: Arc::new(Notify::new()) };
        match ks.front.iter().position(|o| *o == owner) {
            Some(i) => {
                ks.front.remove(i);
                ks.queue.push_front(slot);
            }
            None => ks.queue.push_back(slot),
        }
        Joined::Queued(Registration { waiters: self, channel, id, done: false })
    }

    /// Channels subscribed or being subscribed right now (for tests and metrics).
    pub(super) fn channels(&self) -> usize {
        lock(&self.state).keys.len()
    }
}

impl Registration<'_> {
    /// What to do next.
    pub(super) fn step(&mut self) -> Step {
        let now = Instant::now();
        let mut guard = lock(&self.waiters.state);
        let Some(ks) = guard.keys.get_mut(&self.channel) else { return Step::Retry };
        let Some(pos) = ks.queue.iter().position(|s| s.id == self.id) else { return Step::Retry };
        let slot = &ks.queue[pos];
        if slot.woken {
            drop(guard);
            self.leave(false);
            return Step::Retry;
        }
        let notify = slot.notify.clone();
        if pos != 0 {
            return Step::Sleep(notify, None);
        }
        if let Sub::Confirmed(at) = ks.sub {
            if slot.checked.is_none_or(|c| c < at) {
                return Step::Check(notify, ks.ttl_at);
            }
        }
        if ks.ttl_at.is_some_and(|t| now >= t) {
            drop(guard);
            self.leave(false);
            return Step::Retry;
        }
        Step::Sleep(notify, ks.ttl_at)
    }

    /// A look at the lock sent at `sent` found it held for `pttl` more (`None`: no expiry).
    pub(super) fn checked(&mut self, sent: Instant, pttl: Option<Duration>) {
        let mut guard = lock(&self.waiters.state);
        if let Some(ks) = guard.keys.get_mut(&self.channel) {
            ks.ttl_at = pttl.and_then(|d| Instant::now().checked_add(d));
            if let Some(slot) = ks.queue.iter_mut().find(|s| s.id == self.id) {
                slot.checked = Some(sent);
            }
        }
    }

    /// Leaves the queue to make an attempt (it comes back at the front if it waits again).
    pub(super) fn retry(mut self) {
        self.leave(false);
    }

    fn leave(&mut self, pass_wake: bool) {
        if self.done {
            return;
        }
        self.done = true;
        let now = Instant::now();
        let mut guard = lock(&self.waiters.state);
        let st = &mut *guard;
        let Some(ks) = st.keys.get_mut(&self.channel) else { return };
        let Some(pos) = ks.queue.iter().position(|s| s.id == self.id) else { return };
        let Some(slot) = ks.queue.remove(pos) else { return };
        if !pass_wake {
            // Off to make an attempt: the rest of the queue waits for its outcome (it takes the
            // lock, or comes back at the front with the new holder's lease) rather than
            // following it (no cascade when a lease runs out), but not forever.
            ks.remember_front(slot.owner);
            ks.ttl_at = now.checked_add(self.waiters.handoff);
        } else if slot.woken && !ks.wake_one() {
            // Gave up just as it was woken: keep the release for whoever comes next.
            ks.unclaimed = Some(now);
        }
        if pos == 0 {
            if let Some(head) = ks.queue.front() {
                head.notify.notify_one();
            }
        }
        if ks.queue.is_empty() {
            ks.idle_since = Some(now);
            st.idle.push_back((self.channel.clone(), now));
            self.waiters.poke();
        }
    }
}

impl Drop for Registration<'_> {
    fn drop(&mut self) {
        self.leave(true);
    }
}

/// A subscription change in flight: what it was, for which channels, and whether it worked.
type Op = BoxFuture<'static, (bool, Vec<Arc<str>>, bool)>;

async fn run_op(op: &mut Option<Op>) -> (bool, Vec<Arc<str>>, bool) {
    match op {
        Some(fut) => fut.await,
        None => std::future::pending().await,
    }
}

/// The pub/sub task: keeps one connection, the subscriptions the queues need, and wakes heads.
async fn subscriber(
    state: Arc<Mutex<State>>,
    client: redis::Client,
    mut poke: mpsc::UnboundedReceiver<()>,
    timeout: Duration,
    grace: Duration,
) {
    let mut backoff = Duration::from_millis(20);
    loop {
        let pubsub = match tokio::time::timeout(timeout, client.get_async_pubsub()).await {
            Ok(Ok(pubsub)) => pubsub,
            outcome => {
                let why = match outcome {
                    Ok(Err(e)) => e.to_string(),
                    _ => format!("no answer within {timeout:?}"),
                };
                tracing::debug!(error = %why, "redis pub/sub connection failed; retrying in {backoff:?}");
                let until = tokio::time::Instant::now() + backoff;
                loop {
                    tokio::select! {
                        _ = tokio::time::sleep_until(until) => break,
                        p = poke.recv() => if p.is_none() { return },
                    }
                }
                backoff = (backoff * 2).min(MAX_BACKOFF);
                continue;
            }
        };
        backoff = Duration::from_millis(20);
        let (sink, mut stream) = pubsub.split();
        tracing::debug!("redis pub/sub connected");
        let mut op: Option<Op> = None;
        loop {
            let mut sweep_at = None;
            if op.is_none() {
                let (next, at) = next_op(&state, &sink, timeout, grace);
                op = next;
                sweep_at = at;
            }
            tokio::select! {
                msg = stream.next() => match msg {
                    Some(msg) => on_release(&state, msg.get_channel_name()),
                    None => break,
                },
                (subscribe, channels, ok) = run_op(&mut op) => {
                    op = None;
                    if !ok {
                        break;
                    }
                    if subscribe {
                        confirmed(&state, &channels);
                    }
                }
                p = poke.recv() => if p.is_none() { return },
                _ = sleep_until(sweep_at) => {}
            }
        }
        tracing::debug!("redis pub/sub connection lost; reconnecting");
        let mut guard = lock(&state);
        let st = &mut *guard;
        st.wanted.clear();
        for (channel, ks) in st.keys.iter_mut() {
            ks.sub = Sub::Wanted;
            st.wanted.push_back(channel.clone());
        }
    }
}

async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at.into()).await,
        None => std::future::pending().await,
    }
}

/// The next subscription change to make, or when to look again for idle channels.
fn next_op(
    state: &Mutex<State>,
    sink: &redis::aio::PubSubSink,
    timeout: Duration,
    grace: Duration,
) -> (Option<Op>, Option<Instant>) {
    let now = Instant::now();
    let mut guard = lock(state);
    let st = &mut *guard;
    let mut batch = Vec::new();
    while batch.len() < BATCH {
        let Some(channel) = st.wanted.pop_front() else { break };
        if let Some(ks) = st.keys.get_mut(&channel) {
            if ks.sub == Sub::Wanted {
                ks.sub = Sub::Sending;
                batch.push(channel);
            }
        }
    }
    if !batch.is_empty() {
        return (Some(change(sink.clone(), true, batch, timeout)), None);
    }
    while batch.len() < BATCH {
        let Some((channel, since)) = st.idle.front().cloned() else { break };
        if now < since + grace {
            if !batch.is_empty() {
                break;
            }
            return (None, Some(since + grace));
        }
        st.idle.pop_front();
        let Some(ks) = st.keys.get(&channel) else { continue };
        if !ks.queue.is_empty() || ks.idle_since != Some(since) {
            continue;
        }
        let sub = ks.sub;
        st.keys.remove(&channel);
        if matches!(sub, Sub::Confirmed(_)) {
            batch.push(channel);
        }
    }
    if batch.is_empty() {
        return (None, None);
    }
    (Some(change(sink.clone(), false, batch, timeout)), None)
}

fn change(mut sink: redis::aio::PubSubSink, subscribe: bool, channels: Vec<Arc<str>>, timeout: Duration) -> Op {
    Box::pin(async move {
        let names: Vec<&str> = channels.iter().map(|c| &**c).collect();
        let result = if subscribe {
            tokio::time::timeout(timeout, sink.subscribe(&names)).await
        } else {
            tokio::time::timeout(timeout, sink.unsubscribe(&names)).await
        };
        let ok = match result {
            Ok(Ok(())) => true,
            Ok(Err(e)) => {
                tracing::debug!(error = %e, "redis pub/sub (un)subscribe failed");
                false
            }
            Err(_) => {
                tracing::debug!("redis pub/sub (un)subscribe got no answer within {timeout:?}");
                false
            }
        };
        drop(names);
        (subscribe, channels, ok)
    })
}

/// Subscriptions confirmed: heads whose last look predates them re-check the lock.
fn confirmed(state: &Mutex<State>, channels: &[Arc<str>]) {
    let now = Instant::now();
    let mut st = lock(state);
    for channel in channels {
        if let Some(ks) = st.keys.get_mut(channel) {
            if ks.sub == Sub::Sending {
                ks.sub = Sub::Confirmed(now);
                if let Some(head) = ks.queue.front() {
                    head.notify.notify_one();
                }
            }
        }
    }
}

/// A release was announced on `channel`: wake one local waiter, or keep it for the next one.
fn on_release(state: &Mutex<State>, channel: &str) {
    let mut st = lock(state);
    if let Some(ks) = st.keys.get_mut(channel) {
        if !ks.wake_one() {
            ks.unclaimed = Some(Instant::now());
        }
    }
}
