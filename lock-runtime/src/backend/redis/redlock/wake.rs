//! Release notifications of one Redlock node: one pub/sub connection (made with a
//! [`Source`]), the lock channels that waiting acquisitions registered on it, and their
//! [`Notify`]s.
//!
//! An acquisition that found a lock busy registers one `Notify` on the lock's channel at every
//! node; a message on the channel (the release script publishes when the value was marked
//! waited on) or a confirmed (re)subscription wakes every registered `Notify` of the channel.
//! The registration is dropped with the acquisition; a channel nobody waits on is unsubscribed
//! after the `unsubscribe_after` grace. The connection is pinged every `ping_interval`; a lost
//! connection is made again with backoff and every channel subscribed again, which wakes
//! everyone (a release may have gone unheard meanwhile). The task stops when the backend (every
//! [`Hub`] clone and every registration) is dropped.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use tokio::sync::{mpsc, Notify};

use crate::backend::redis::pubsub::{self, Change, Subscriptions, Timings};
use crate::backend::redis::topology::Source;

/// Channels (un)subscribed in one command at most.
const BATCH: usize = 64;

/// The pub/sub side of one node. Cheap to clone.
#[derive(Clone)]
pub(super) struct Hub {
    state: Arc<Mutex<State>>,
    poke: mpsc::UnboundedSender<()>,
}

#[derive(Default)]
struct State {
    channels: HashMap<Arc<str>, Chan>,
    next_id: u64,
}

struct Chan {
    waiters: Vec<(u64, Arc<Notify>)>,
    sub: Sub,
    /// Messages and confirmations seen on this channel (see [`Hub::capture`]).
    seen: u64,
    /// When the last waiter left, while nobody waits.
    idle_since: Option<Instant>,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Sub {
    Wanted,
    Sending,
    Confirmed,
}

/// What a channel looked like before an attempt: `Some(seen)` when it was subscribed.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) struct Capture(Option<u64>);

fn lock(state: &Mutex<State>) -> MutexGuard<'_, State> {
    state.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Hub {
    /// Starts the node's pub/sub task on `runtime`.
    pub(super) fn start(runtime: &tokio::runtime::Handle, source: Source, timings: Timings) -> Self {
        let state = Arc::new(Mutex::new(State::default()));
        let (poke, rx) = mpsc::unbounded_channel();
        runtime.spawn(pubsub::serve(Channels(state.clone()), source, rx, timings));
        Hub { state, poke }
    }

    /// Taken before an attempt: if the attempt finds the lock busy and its acquisition then
    /// registers, a release heard in between (by another waiter's subscription) wakes it at
    /// once instead of being missed.
    pub(super) fn capture(&self, channel: &str) -> Capture {
        let st = lock(&self.state);
        Capture(st.channels.get(channel).filter(|c| c.sub == Sub::Confirmed).map(|c| c.seen))
    }

    /// Registers `notify` on `channel` (subscribing it if needed); returns the id to
    /// [`deregister`](Hub::deregister) with. Wakes `notify` at once when the channel heard
    /// something since `before` was captured.
    pub(super) fn register(&self, channel: &Arc<str>, notify: &Arc<Notify>, before: Capture) -> u64 {
        let mut st = lock(&self.state);
        st.next_id += 1;
        let id = st.next_id;
        let chan = st.channels.entry(channel.clone()).or_insert_with(|| Chan {
            waiters: Vec::new(),
            sub: Sub::Wanted,
            seen: 0,
            idle_since: None,
        });
        chan.waiters.push((id, notify.clone()));
        chan.idle_since = None;
        if chan.sub == Sub::Confirmed && before != Capture(Some(chan.seen)) {
            notify.notify_one();
        }
        let wanted = chan.sub == Sub::Wanted;
        drop(st);
        if wanted {
            let _ = self.poke.send(());
        }
        id
    }

    /// Removes a registration; the channel is unsubscribed after the grace if nobody waits.
    pub(super) fn deregister(&self, channel: &str, id: u64) {
        let mut st = lock(&self.state);
        if let Some(chan) = st.channels.get_mut(channel) {
            chan.waiters.retain(|(i, _)| *i != id);
            if chan.waiters.is_empty() {
                chan.idle_since = Some(crate::clock::now());
                drop(st);
                let _ = self.poke.send(());
            }
        }
    }

    /// Channels subscribed, or to be, right now (for tests and metrics).
    pub(super) fn channels(&self) -> usize {
        lock(&self.state).channels.len()
    }
}

/// One acquisition's registrations on every node; dropped, it deregisters.
pub(super) struct Registration {
    channel: Arc<str>,
    ids: Vec<(Hub, u64)>,
}

impl Registration {
    /// Registers `notify` on `channel` at every hub (with the capture taken there).
    pub(super) fn new(hubs: impl Iterator<Item = (Hub, Capture)>, channel: Arc<str>, notify: Arc<Notify>) -> Self {
        let ids = hubs
            .map(|(hub, capture)| {
                let id = hub.register(&channel, &notify, capture);
                (hub, id)
            })
            .collect();
        Registration { channel, ids }
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        for (hub, id) in &self.ids {
            hub.deregister(&self.channel, *id);
        }
    }
}

/// Wakes every waiter of `channel` and counts the event.
fn wake(st: &mut State, channel: &str) {
    if let Some(chan) = st.channels.get_mut(channel) {
        chan.seen = chan.seen.wrapping_add(1);
        for (_, notify) in &chan.waiters {
            notify.notify_one();
        }
    }
}

/// One node's bookkeeping, served by [`pubsub::serve`]: a message or a confirmed
/// subscription wakes every registered waiter of the channel.
struct Channels(Arc<Mutex<State>>);

impl Subscriptions for Channels {
    fn idle(&self) -> bool {
        lock(&self.0).channels.is_empty()
    }

    fn next_change(&self, grace: Duration) -> (Option<Change>, Option<Instant>) {
        next_change(&self.0, grace)
    }

    fn message(&self, channel: &str, _owner: &str) {
        wake(&mut lock(&self.0), channel);
    }

    fn confirmed(&self, channels: &[Arc<str>]) {
        let mut st = lock(&self.0);
        for channel in channels {
            if let Some(chan) = st.channels.get_mut(channel) {
                if chan.sub == Sub::Sending {
                    chan.sub = Sub::Confirmed;
                }
            }
            // A release may have come before the subscription: look again.
            wake(&mut st, channel);
        }
    }

    fn lost(&self) {
        let mut st = lock(&self.0);
        st.channels.retain(|_, chan| !chan.waiters.is_empty());
        for chan in st.channels.values_mut() {
            chan.sub = Sub::Wanted;
        }
    }
}

/// The next (un)subscription to make, or when to look again for idle channels.
fn next_change(state: &Mutex<State>, grace: Duration) -> (Option<Change>, Option<Instant>) {
    let now = crate::clock::now();
    let mut st = lock(state);
    let mut subscribe = Vec::new();
    for (channel, chan) in st.channels.iter_mut() {
        if chan.sub == Sub::Wanted && !chan.waiters.is_empty() && subscribe.len() < BATCH {
            chan.sub = Sub::Sending;
            subscribe.push(channel.clone());
        }
    }
    if !subscribe.is_empty() {
        return (Some((true, subscribe)), None);
    }
    let mut leave = Vec::new();
    let mut next_due: Option<Instant> = None;
    st.channels.retain(|channel, chan| {
        let Some(since) = chan.idle_since.filter(|_| chan.waiters.is_empty()) else { return true };
        let due = since.checked_add(grace).unwrap_or(since);
        if now < due || leave.len() >= BATCH {
            next_due = Some(next_due.map_or(due, |d| d.min(due)));
            return true;
        }
        if chan.sub == Sub::Confirmed {
            leave.push(channel.clone());
        }
        // Forgotten once its unsubscription goes out (kept, it would go out again at every
        // turn); a subscription in flight is kept, and swept once confirmed.
        chan.sub == Sub::Sending
    });
    if leave.is_empty() {
        return (None, next_due);
    }
    (Some((false, leave)), None)
}
