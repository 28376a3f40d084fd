#![doc = include_str!("waiters.md")]

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use tokio::sync::{mpsc, Notify};

use super::handoff::{Handed, Ticket};
use super::holdings::Holdings;
use super::pubsub::{self, Change, Subscriptions, Timings};
use super::topology::Source;
use crate::backend::Wake;
use crate::error::LockError;

/// First and longest pause between two failed tries of a waiter at the lock.
const RECHECK_MIN: Duration = Duration::from_millis(50);
const RECHECK_MAX: Duration = Duration::from_secs(1);
/// Most channels named in one `SUBSCRIBE` / `UNSUBSCRIBE`.
const BATCH: usize = 512;

/// The local queues and the handles of their pub/sub tasks (one per server releases are
/// announced on: one for a single server, Sentinel or Cluster, one per Redlock node).
pub(super) struct Waiters {
    state: Arc<Mutex<State>>,
    pokes: Pokes,
}

/// What tells each pub/sub task that the waiters' wishes changed; the tasks stop once every
/// clone is dropped (the [`Waiters`] and every [`Slot`]).
#[derive(Clone)]
struct Pokes(Arc<[mpsc::UnboundedSender<()>]>);

impl Pokes {
    fn all(&self) {
        for poke in self.0.iter() {
            let _ = poke.send(());
        }
    }
}

struct State {
    /// By release channel.
    keys: HashMap<Arc<str>, KeyState>,
    /// By feed (pub/sub connection): channels to subscribe (checked against `keys` when taken).
    wanted: Vec<VecDeque<Arc<str>>>,
    /// By feed: channels of keys let go of, subscribed there, to unsubscribe.
    leaving: Vec<Vec<Arc<str>>>,
    /// Channels whose queue emptied, and when (checked against `keys` when taken).
    idle: VecDeque<(Arc<str>, Instant)>,
    next_id: u64,
}

impl State {
    fn new(feeds: usize) -> Self {
        State {
            keys: HashMap::new(),
            wanted: vec![VecDeque::new(); feeds],
            leaving: vec![Vec::new(); feeds],
            idle: VecDeque::new(),
            next_id: 0,
        }
    }
}

struct KeyState {
    /// Tells this key state from an earlier one of the same channel.
    generation: u64,
    queue: VecDeque<Entry>,
    /// The channel's subscription on each feed.
    subs: Box<[Sub]>,
    /// When the holder's lease runs out, as last seen (`None`: unknown or no expiry).
    ttl_at: Option<Instant>,
    /// When the latest look at the lock (an attempt, or a head's `watch.lua`) whose answer
    /// came back was sent.
    looked: Option<Instant>,
    /// Releases observed while nobody was queued.
    unclaimed: u64,
    /// The owner id of the last release observed (a local release and its message are one).
    last_release: Option<Box<str>>,
    idle_since: Option<Instant>,
    /// Whether the key is in the state's `idle` list (once at most, however often its queue
    /// empties: steady contention does not grow the list).
    in_idle: bool,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Sub {
    Wanted,
    Sending,
    Confirmed(Instant),
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Phase {
    Waiting,
    Woken,
    Busy,
}

struct Entry {
    id: u64,
    /// A writer of a read-write lock: queued ahead of the sleeping readers (see
    /// [`Waiters::busy`]).
    writer: bool,
    phase: Phase,
    /// A release observed while busy: attempt again if the attempt found the lock held.
    again: bool,
    notify: Arc<Notify>,
    /// A mutex acquisition's offer to be granted the lock by a release of this process (see
    /// `handoff.rs`).
    ticket: Option<Arc<Ticket>>,
}

impl KeyState {
    fn new(generation: u64, feeds: usize) -> Self {
        KeyState {
            generation,
            queue: VecDeque::new(),
            subs: vec![Sub::Wanted; feeds].into(),
            ttl_at: None,
            looked: None,
            unclaimed: 0,
            last_release: None,
            idle_since: None,
            in_idle: false,
        }
    }

    /// Queues `entry`: at the back, or, a writer, ahead of the first sleeping reader.
    fn enqueue(&mut self, entry: Entry) {
        let at = match entry.writer {
            true => self.queue.iter().position(|e| !e.writer && e.phase == Phase::Waiting && !e.again),
            false => None,
        };
        match at {
            Some(at) => self.queue.insert(at, entry),
            None => self.queue.push_back(entry),
        }
    }

    /// A reader at the head went back to sleep (its attempt found no room, maybe because of
    /// the intent of a writer queued behind it): the first writer behind a sleeping reader
    /// moves ahead of it, and attempts at once if it is the head now (renewing its intent).
    fn writers_first(&mut self) {
        let Some(reader) = self.queue.iter().position(|e| !e.writer && e.phase == Phase::Waiting && !e.again) else {
            return;
        };
        let Some(writer) = self.queue.iter().skip(reader + 1).position(|e| e.writer) else { return };
        let Some(mut entry) = self.queue.remove(reader + 1 + writer) else { return };
        if reader == 0 && entry.phase == Phase::Waiting {
            entry.phase = Phase::Woken;
            entry.notify.notify_one();
        }
        self.queue.insert(reader, entry);
    }

    /// A release (or a wake-up passed on): the head attempts next.
    fn deliver(&mut self) {
        match self.queue.front_mut() {
            Some(head) => match head.phase {
                Phase::Waiting => {
                    head.phase = Phase::Woken;
                    head.notify.notify_one();
                }
                Phase::Woken => {}
                Phase::Busy => head.again = true,
            },
            None => self.unclaimed = self.unclaimed.wrapping_add(1),
        }
    }

    /// A release of `owner`'s lock was observed (by its message or a local release).
    fn released(&mut self, owner: &str) {
        if self.last_release.as_deref() == Some(owner) {
            // The same release, seen the other way. A head attempting on the first sighting
            // (a local release is told as it is sent) may have reached the server before the
            // release ran and find the old lease: it attempts once more. So may the first
            // attempt of an acquisition not queued yet: counted, it attempts again if it
            // finds the lock held (see `Waiters::busy`).
            match self.queue.front_mut() {
                Some(head) if head.phase == Phase::Busy => head.again = true,
                Some(_) => {}
                None => self.unclaimed = self.unclaimed.wrapping_add(1),
            }
            return;
        }
        self.last_release = Some(owner.into());
        self.deliver();
    }

    /// A release of `releaser`'s lock granted it from the lock's queue to `grantee` until its
    /// claim deadline, `left` ms from now (see `handoff.rs`): a waiter of this process granted
    /// attempts now (its attempt claims the grant); otherwise the head attempts at the claim
    /// deadline (an unclaimed grant runs out then, unannounced) or when the grantee's release
    /// is announced.
    fn granted_from_queue(&mut self, releaser: &str, grantee: &str, left: u64) {
        self.last_release = Some(releaser.into());
        let ours = self.queue.iter_mut().find(|e| e.ticket.as_ref().is_some_and(|t| *t.owner == *grantee));
        match ours {
            Some(entry) => match entry.phase {
                Phase::Busy => entry.again = true,
                _ => {
                    entry.phase = Phase::Woken;
                    entry.notify.notify_one();
                }
            },
            None => {
                self.ttl_at = crate::clock::now().checked_add(Duration::from_millis(left));
                if let Some(head) = self.queue.front().filter(|e| e.phase == Phase::Waiting) {
                    head.notify.notify_one(); // sleeps until the new deadline
                }
            }
        }
    }

    /// The lock was granted here, its lease ending at `lease_end`: a new term, whose release
    /// is a new one even when its owner released before (a Redlock acquisition undoes a split
    /// vote's grants and is granted later under the same owner; so may one whose grant too
    /// few replicas acknowledged).
    fn granted(&mut self, lease_end: Option<Instant>) {
        self.ttl_at = lease_end;
        self.last_release = None;
    }

    fn look(&mut self, sent: Instant, pttl: i64) {
        self.looked = self.looked.max(Some(sent));
        self.ttl_at =
            u64::try_from(pttl).ok().and_then(|ms| crate::clock::now().checked_add(Duration::from_millis(ms)));
    }
}

/// When a channel's latest subscription was confirmed, on any feed (a release announced before
/// that may have gone unheard).
fn confirmed_at(subs: &[Sub]) -> Option<Instant> {
    subs.iter()
        .filter_map(|sub| match sub {
            Sub::Confirmed(at) => Some(*at),
            _ => None,
        })
        .max()
}

fn lock(state: &Mutex<State>) -> MutexGuard<'_, State> {
    state.lock().unwrap_or_else(PoisonError::into_inner)
}

/// What a waiting slot does next.
pub(super) enum Step {
    /// Attempt (woken by a release or a wake-up passed on, or the holder's lease ran out).
    Attempt,
    /// Look at the lock (`watch.lua`): a release may have gone unannounced before the channel
    /// subscription was confirmed.
    Check,
    /// Sleep until notified, or until the instant (the holder's lease end).
    Sleep(Arc<Notify>, Option<Instant>),
}

/// Result of [`Waiters::before_attempt`].
pub(super) enum Before {
    /// Tasks of this process are queued for the lock: the caller joined the back of the queue
    /// without an attempt.
    Queued(Slot),
    /// Nobody here waits: attempt, and hand the capture to [`Waiters::busy`] if it finds the
    /// lock held.
    Attempt(Capture),
}

/// What the key's state was when an attempt was sent.
#[derive(Clone, Copy)]
pub(super) struct Capture(Option<(u64, u64)>);

impl Capture {
    /// No key state existed.
    pub(super) const NONE: Capture = Capture(None);
}

/// An acquisition's place in its key's queue. Dropping it leaves the queue and passes on any
/// wake-up it was given; [`Slot::granted`] leaves it with the lock.
pub(super) struct Slot {
    state: Arc<Mutex<State>>,
    pokes: Pokes,
    channel: Arc<str>,
    id: u64,
    notify: Arc<Notify>,
    done: bool,
}

impl Waiters {
    /// Starts one pub/sub task (on `runtime`) per source releases are announced on (a lock's
    /// channel is subscribed on each); they stop when this and every slot are dropped. Given
    /// `holdings`, each keeps its connection while the backend lives and a lost one makes them
    /// suspect (a restart shows there first when nothing else is being sent); without, a
    /// connection is made only while someone waits.
    pub(super) fn start(
        runtime: &tokio::runtime::Handle,
        sources: Vec<Source>,
        timings: Timings,
        holdings: Option<Arc<Holdings>>,
    ) -> Self {
        let state = Arc::new(Mutex::new(State::new(sources.len())));
        let mut pokes = Vec::with_capacity(sources.len());
        for (feed, source) in sources.into_iter().enumerate() {
            let (poke, rx) = mpsc::unbounded_channel();
            let subs = Feed { state: state.clone(), feed, holdings: holdings.clone() };
            runtime.spawn(pubsub::serve(subs, source, rx, timings));
            pokes.push(poke);
        }
        Waiters { state, pokes: Pokes(pokes.into()) }
    }

    /// Before an acquisition without a slot attempts: joins the queue if one exists (a writer
    /// of a read-write lock, `writer`, ahead of the sleeping readers).
    pub(super) fn before_attempt(&self, channel: &str, writer: bool) -> Before {
        let mut guard = lock(&self.state);
        let st = &mut *guard;
        let Some((key, ks)) = st.keys.get_key_value(channel) else { return Before::Attempt(Capture(None)) };
        if ks.queue.is_empty() {
            return Before::Attempt(Capture(Some((ks.generation, ks.unclaimed))));
        }
        let key = key.clone();
        st.next_id += 1;
        let id = st.next_id;
        let notify = Arc::new(Notify::new());
        if let Some(ks) = st.keys.get_mut(&key) {
            ks.enqueue(Entry { id, writer, phase: Phase::Waiting, again: false, notify: notify.clone(), ticket: None });
        }
        Before::Queued(self.slot(key, id, notify))
    }

    fn slot(&self, channel: Arc<str>, id: u64, notify: Arc<Notify>) -> Slot {
        Slot { state: self.state.clone(), pokes: self.pokes.clone(), channel, id, notify, done: false }
    }

    /// An attempt sent at `sent` (state captured by [`before_attempt`](Self::before_attempt))
    /// found the lock held for `pttl` ms more: joins the back of the queue. A writer of a
    /// read-write lock (`writer`) whose attempt found no room recorded its intent, which keeps
    /// readers out: it joins the queue ahead of the sleeping readers (behind other writers and
    /// behind a head that is attempting), so that it, not a reader its own intent keeps out,
    /// attempts next and renews that intent.
    pub(super) fn busy(&self, channel: &str, capture: Capture, sent: Instant, pttl: i64, writer: bool) -> Slot {
        let mut guard = lock(&self.state);
        let st = &mut *guard;
        st.next_id += 1;
        let id = st.next_id;
        let (key, created) = match st.keys.get_key_value(channel) {
            Some((k, _)) => (k.clone(), false),
            None => {
                let k: Arc<str> = Arc::from(channel);
                st.keys.insert(k.clone(), KeyState::new(id, st.wanted.len()));
                for wanted in &mut st.wanted {
                    wanted.push_back(k.clone());
                }
                self.pokes.all();
                (k, true)
            }
        };
        let notify = Arc::new(Notify::new());
        if let Some(ks) = st.keys.get_mut(&key) {
            ks.idle_since = None;
            ks.look(sent, pttl);
            // As in `Slot::busy`: a release told before it ran must wake the queue when it is
            // announced.
            ks.last_release = None;
            ks.enqueue(Entry { id, writer, phase: Phase::Waiting, again: false, notify: notify.clone(), ticket: None });
            // A release observed while this attempt was in flight and nobody was queued may
            // have been this lock's: the head attempts now. (A key state made since the capture
            // counts from zero. Before the subscription is confirmed nothing is observed, and
            // the head looks at the lock once it is.)
            let missed = match capture.0 {
                Some((generation, unclaimed)) if generation == ks.generation => ks.unclaimed != unclaimed,
                _ => !created && ks.unclaimed != 0,
            };
            if missed {
                ks.deliver();
            }
        }
        self.slot(key, id, notify)
    }

    /// A lock of this key was taken here (without a slot), its lease ending at `lease_end`.
    pub(super) fn acquired(&self, channel: &str, lease_end: Option<Instant>) {
        if let Some(ks) = lock(&self.state).keys.get_mut(channel) {
            ks.granted(lease_end);
        }
    }

    /// `owner`'s lock of this key was released through this backend (or may have been).
    pub(super) fn released(&self, channel: &str, owner: &str) {
        if let Some(ks) = lock(&self.state).keys.get_mut(channel) {
            ks.released(owner);
        }
    }

    /// A release of `owner`'s lock of this key is about to be sent: the ticket of the head of
    /// the queue, if it sleeps and offers one, now pending (`handoff.lua` grants it the lock
    /// with the release). The head sleeps until [`handed`](Self::handed); the release's
    /// announcement is not taken for another release.
    pub(super) fn hand_off(&self, channel: &str, owner: &str) -> Option<Arc<Ticket>> {
        let mut guard = lock(&self.state);
        let ks = guard.keys.get_mut(channel)?;
        let head = ks.queue.front_mut()?;
        let ticket = head.ticket.clone()?;
        if head.phase != Phase::Waiting || head.again {
            return None;
        }
        head.phase = Phase::Busy;
        ticket.pend();
        ks.last_release = Some(owner.into());
        Some(ticket)
    }

    /// The release that took `ticket` was answered (the ticket says how): its waiter, if still
    /// queued, attempts next (taking a grant, or attempting as usual), or, when the release
    /// found the lock someone else's and looked at it for the waiter (`Handed::Held`), sleeps
    /// as after a busy attempt of its own.
    pub(super) fn handed(&self, channel: &str, ticket: &Arc<Ticket>) {
        let mut guard = lock(&self.state);
        let Some(ks) = guard.keys.get_mut(channel) else { return };
        let Some(pos) = ks.queue.iter().position(|e| e.ticket.as_ref().is_some_and(|t| Arc::ptr_eq(t, ticket))) else {
            return;
        };
        if let Handed::Held { sent, pttl } = ticket.get() {
            if !ks.queue[pos].again {
                // The look was the script's: the holder's value marked waited on (its release
                // is announced) and the waiter queued in Redis (its entry renewed a third of
                // its window later). Another attempt now would only find the same holder.
                ticket.take();
                ticket.registered(sent);
                ks.look(sent, pttl);
                let entry = &mut ks.queue[pos];
                entry.phase = Phase::Waiting;
                entry.notify.notify_one(); // it sleeps until the holder's lease end now
                return;
            }
        }
        let entry = &mut ks.queue[pos];
        // Woken, and `again` too: a look of its own in flight (begun once the ticket was
        // answered) must not put it back to sleep when it finds the lock held.
        entry.phase = Phase::Woken;
        entry.again = true;
        entry.notify.notify_one();
    }

    /// Tasks queued right now, all keys together.
    pub(super) fn queued(&self) -> usize {
        lock(&self.state).keys.values().map(|ks| ks.queue.len()).sum()
    }

    /// Channel subscriptions made or being made right now, over every feed.
    pub(super) fn channels(&self) -> usize {
        let st = lock(&self.state);
        st.keys.len() * st.wanted.len()
    }
}

impl Slot {
    fn with<T>(&self, f: impl FnOnce(&mut KeyState, usize) -> T) -> Option<T> {
        let mut guard = lock(&self.state);
        let ks = guard.keys.get_mut(&self.channel)?;
        let pos = ks.queue.iter().position(|e| e.id == self.id)?;
        Some(f(ks, pos))
    }

    /// Offers `ticket`: a release of this process may grant this acquisition the lock.
    pub(super) fn offer(&self, ticket: Arc<Ticket>) {
        self.with(|ks, pos| {
            if let Some(entry) = ks.queue.get_mut(pos) {
                entry.ticket = Some(ticket);
            }
        });
    }

    /// What to do next.
    pub(super) fn step(&self) -> Step {
        let now = crate::clock::now();
        let step = self.with(|ks, pos| {
            let Some(entry) = ks.queue.get_mut(pos) else { return Step::Attempt };
            match entry.ticket.as_ref().map(|t| t.get()) {
                // A release is granting it the lock: until it is answered.
                Some(Handed::Pending) => return Step::Sleep(entry.notify.clone(), None),
                // Answered, and maybe granted: take it (or attempt) now, even before the
                // release's `handed` (it follows) marks it woken.
                Some(handed) if handed.may_hold() => {
                    entry.phase = Phase::Woken;
                    entry.again = false;
                    return Step::Attempt;
                }
                _ => {}
            }
            if entry.phase == Phase::Woken || entry.again {
                entry.phase = Phase::Woken;
                entry.again = false;
                return Step::Attempt;
            }
            if pos != 0 {
                return Step::Sleep(entry.notify.clone(), None);
            }
            if let Some(at) = confirmed_at(&ks.subs) {
                if ks.looked.is_none_or(|l| l < at) {
                    entry.phase = Phase::Busy;
                    return Step::Check;
                }
            }
            // Its queue entry is renewed (or made) by an attempt, a third of its window ahead.
            let renew_at = entry.ticket.as_ref().and_then(|t| t.renew_at(now));
            let until = match (ks.ttl_at, renew_at) {
                (Some(ttl), Some(renew)) => Some(ttl.min(renew)),
                (ttl, renew) => ttl.or(renew),
            };
            if until.is_some_and(|t| now >= t) {
                entry.phase = Phase::Woken;
                return Step::Attempt;
            }
            Step::Sleep(entry.notify.clone(), until)
        });
        step.unwrap_or(Step::Attempt)
    }

    /// Whether it heads its key's queue (the one of this process that attempts).
    pub(super) fn heads(&self) -> bool {
        self.with(|_, pos| pos == 0).unwrap_or(true)
    }

    /// An attempt is about to be sent (a release observed from now on is after it).
    pub(super) fn attempting(&self) {
        self.with(|ks, pos| {
            let Some(entry) = ks.queue.get_mut(pos) else { return };
            entry.phase = Phase::Busy;
            entry.again = false;
        });
    }

    /// The attempt or look sent at `sent` found the lock held for `pttl` ms more.
    pub(super) fn busy(&self, sent: Instant, pttl: i64) {
        self.with(|ks, pos| {
            ks.look(sent, pttl);
            // A release told before it ran (a local one is told once it is sent) may still be
            // announced: that announcement must wake the queue again, not be taken for the
            // same release seen twice.
            ks.last_release = None;
            let Some(entry) = ks.queue.get_mut(pos) else { return };
            entry.phase = if entry.again { Phase::Woken } else { Phase::Waiting };
            entry.again = false;
            ks.writers_first();
        });
    }

    /// A look at the lock found it free: attempt next.
    pub(super) fn free(&self) {
        self.with(|ks, pos| {
            let Some(entry) = ks.queue.get_mut(pos) else { return };
            entry.phase = Phase::Woken;
            entry.again = false;
        });
    }

    /// A look at the lock failed: back to waiting (it is retried with backoff).
    pub(super) fn look_failed(&self) {
        self.with(|ks, pos| {
            let Some(entry) = ks.queue.get_mut(pos) else { return };
            entry.phase = if entry.again { Phase::Woken } else { Phase::Waiting };
            entry.again = false;
        });
    }

    /// Waits out a failed try's backoff, until `until` or a notification, back in the queue's
    /// waiting state.
    pub(super) async fn back_off(&self, until: Instant) {
        self.look_failed();
        tokio::select! {
            _ = self.notify.notified() => {}
            _ = tokio::time::sleep_until(until.into()) => {}
        }
    }

    /// The lock was granted to this slot's acquisition, its lease ending at `lease_end`: leaves
    /// the queue (the next head waits for this holder's release).
    pub(super) fn granted(mut self, lease_end: Option<Instant>) {
        self.leave(Some(lease_end));
    }

    fn leave(&mut self, granted: Option<Option<Instant>>) {
        if std::mem::replace(&mut self.done, true) {
            return;
        }
        let now = crate::clock::now();
        let mut guard = lock(&self.state);
        let st = &mut *guard;
        let Some(ks) = st.keys.get_mut(&self.channel) else { return };
        let Some(pos) = ks.queue.iter().position(|e| e.id == self.id) else { return };
        let Some(entry) = ks.queue.remove(pos) else { return };
        let awake = entry.phase != Phase::Waiting || entry.again;
        if let Some(lease_end) = granted {
            ks.granted(lease_end);
        }
        if pos == 0 {
            if granted.is_none() && awake {
                // Dropped or failed while woken or attempting: the wake-up goes to the next one.
                ks.deliver();
            } else if let Some(head) = ks.queue.front() {
                head.notify.notify_one(); // the new head: lease timer, look after subscription
            }
        }
        if ks.queue.is_empty() {
            ks.idle_since = Some(now);
            if !std::mem::replace(&mut ks.in_idle, true) {
                st.idle.push_back((self.channel.clone(), now));
                self.pokes.all();
            }
        }
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.leave(None);
    }
}

/// One feed's side of the waiters' bookkeeping, served by [`pubsub::serve`]: a message is a
/// release, a confirmation makes the heads look at the lock again, and a lost connection makes
/// the held locks suspect (a restart shows there first when nothing else is being sent).
struct Feed {
    state: Arc<Mutex<State>>,
    /// This feed's index in the key states' subscriptions.
    feed: usize,
    holdings: Option<Arc<Holdings>>,
}

impl Subscriptions for Feed {
    fn idle(&self) -> bool {
        self.holdings.is_none() && lock(&self.state).keys.is_empty()
    }

    fn next_change(&self, grace: Duration) -> (Option<Change>, Option<Instant>) {
        next_change(&self.state, self.feed, grace)
    }

    fn message(&self, channel: &str, payload: &str) {
        on_release(&self.state, channel, payload);
    }

    fn confirmed(&self, channels: &[Arc<str>]) {
        confirmed(&self.state, self.feed, channels);
    }

    fn lost(&self) {
        if let Some(holdings) = &self.holdings {
            holdings.suspect();
        }
        let mut guard = lock(&self.state);
        let st = &mut *guard;
        let (wanted, leaving) = (&mut st.wanted[self.feed], &mut st.leaving[self.feed]);
        wanted.clear();
        leaving.clear(); // a new connection has no subscriptions
        for (channel, ks) in st.keys.iter_mut() {
            ks.subs[self.feed] = Sub::Wanted;
            wanted.push_back(channel.clone());
        }
    }
}

/// The next subscription change to make on `feed`, or when to look again for idle channels.
fn next_change(state: &Mutex<State>, feed: usize, grace: Duration) -> (Option<Change>, Option<Instant>) {
    let now = crate::clock::now();
    let mut guard = lock(state);
    let st = &mut *guard;
    let mut batch = Vec::new();
    while batch.len() < BATCH {
        let Some(channel) = st.wanted[feed].pop_front() else { break };
        if let Some(ks) = st.keys.get_mut(&channel) {
            if ks.subs[feed] == Sub::Wanted {
                ks.subs[feed] = Sub::Sending;
                batch.push(channel);
            }
        }
    }
    if !batch.is_empty() {
        return (Some((true, batch)), None);
    }
    // Keys nobody waited on for the grace are let go of (by whichever feed looks first), each
    // to be unsubscribed on every feed it is subscribed on.
    let mut due_next = None;
    while st.leaving[feed].len() < BATCH {
        let Some((channel, since)) = st.idle.front().cloned() else { break };
        let due = since.checked_add(grace).unwrap_or(since);
        if now < due {
            due_next = Some(due);
            break;
        }
        st.idle.pop_front();
        let Some(ks) = st.keys.get_mut(&channel) else { continue };
        match ks.idle_since {
            _ if !ks.queue.is_empty() => {
                ks.in_idle = false; // waited on again: listed anew once its queue empties
                continue;
            }
            Some(latest) if latest != since => {
                st.idle.push_back((channel, latest)); // idle again since: due later
                continue;
            }
            None => {
                ks.in_idle = false;
                continue;
            }
            Some(_) => {}
        }
        let Some(ks) = st.keys.remove(&channel) else { continue };
        for (leaving, sub) in st.leaving.iter_mut().zip(ks.subs.iter()) {
            if matches!(sub, Sub::Confirmed(_)) {
                leaving.push(channel.clone());
            }
        }
    }
    // A channel waited on again meanwhile stays subscribed (its new key state may have
    // subscribed it on this feed already: a second `SUBSCRIBE` changes nothing).
    let (leaving, keys) = (&mut st.leaving[feed], &st.keys);
    leaving.retain(|channel| !keys.contains_key(channel));
    if leaving.is_empty() {
        return (None, due_next);
    }
    let batch = leaving.split_off(leaving.len().saturating_sub(BATCH));
    (Some((false, batch)), None)
}

/// Subscriptions confirmed on `feed`: heads look at the lock again (a release may have gone
/// unheard).
fn confirmed(state: &Mutex<State>, feed: usize, channels: &[Arc<str>]) {
    let now = crate::clock::now();
    let mut st = lock(state);
    for channel in channels {
        if let Some(ks) = st.keys.get_mut(channel) {
            if ks.subs[feed] == Sub::Sending {
                ks.subs[feed] = Sub::Confirmed(now);
                if let Some(head) = ks.queue.front() {
                    head.notify.notify_one();
                }
            }
        }
    }
}

/// A release was announced on `channel`: `payload` is the releasing owner, or
/// `<releaser>#<grantee>#<ms>` when the release granted the lock from its queue (owners hold
/// no `#`).
fn on_release(state: &Mutex<State>, channel: &str, payload: &str) {
    let mut guard = lock(state);
    let Some(ks) = guard.keys.get_mut(channel) else { return };
    let grant = payload.split_once('#').and_then(|(releaser, rest)| {
        let (grantee, left) = rest.rsplit_once('#')?;
        Some((releaser, grantee, left.parse::<u64>().ok()?))
    });
    match grant {
        Some((releaser, grantee, left)) => ks.granted_from_queue(releaser, grantee, left),
        None => ks.released(payload),
    }
}

/// A waiter's run of failed attempts or looks at the lock (an outage: a restart, a failover):
/// the last error and when to try again, with backoff from 50 ms doubling to 1 s. A wait that
/// runs out during it answers with that error rather than a time-out.
#[derive(Default)]
pub(super) struct Outage(Option<(LockError, Instant, Duration)>);

impl Outage {
    /// A try failed with `e`: the next one waits for the backoff (logged against `name`).
    pub(super) fn failed(&mut self, name: &str, e: LockError) {
        let backoff = self.0.as_ref().map_or(RECHECK_MIN, |f| f.2.saturating_mul(2).min(RECHECK_MAX));
        tracing::debug!(lock = %crate::telemetry::shown_name(name), error = %crate::telemetry::shown_error(&e), "a waiter's try at the lock failed; again in {backoff:?}");
        let now = crate::clock::now();
        self.0 = Some((e, now.checked_add(backoff).unwrap_or(now), backoff));
    }

    /// A try got an answer: the outage is over.
    pub(super) fn ended(&mut self) {
        self.0 = None;
    }

    /// While the backoff lasts, when it ends.
    pub(super) fn backoff_until(&self) -> Option<Instant> {
        self.0.as_ref().map(|f| f.1).filter(|&again| crate::clock::now() < again)
    }

    /// The answer of a wait that ran out: the outage's error, or that it timed out.
    pub(super) fn timed_out(&mut self) -> Result<Wake, LockError> {
        match self.0.take() {
            Some((e, ..)) => Err(e),
            None => Ok(Wake::TimedOut),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const CHANNEL: &str = "lock:{k}:released";

    /// Queues without a pub/sub task: the subscription is marked confirmed by hand.
    fn waiters() -> (Waiters, mpsc::UnboundedReceiver<()>) {
        let (poke, rx) = mpsc::unbounded_channel();
        (Waiters { state: Arc::new(Mutex::new(State::new(1))), pokes: Pokes(Arc::new([poke])) }, rx)
    }

    fn confirm(w: &Waiters) {
        let mut st = lock(&w.state);
        for ks in st.keys.values_mut() {
            ks.subs[0] = Sub::Sending;
        }
        drop(st);
        confirmed(&w.state, 0, &[Arc::from(CHANNEL)]);
    }

    /// A slot that made its first attempt (busy, a 30 s lease left) and looked once since the
    /// subscription was confirmed, so it sleeps.
    fn queued(w: &Waiters) -> Slot {
        match w.before_attempt(CHANNEL, false) {
            Before::Queued(slot) => slot,
            Before::Attempt(capture) => w.busy(CHANNEL, capture, crate::clock::now(), 30_000, false),
        }
    }

    fn settled_head(w: &Waiters) -> Slot {
        let head = queued(w);
        confirm(w);
        assert!(matches!(head.step(), Step::Check));
        head.busy(crate::clock::now(), 30_000);
        assert!(matches!(head.step(), Step::Sleep(..)));
        head
    }

    /// A local release is told once it is sent, and the head attempts at once. That attempt
    /// may reach the server before the release runs (on a Cluster, a release script answered
    /// `NOSCRIPT` is sent again behind it) and find the holder's old lease. The release's
    /// announcement, arriving while the attempt is in flight, is the same release seen the
    /// other way, but it tells that the release ran: the head attempts once more rather than
    /// sleeping out the old lease (the conformance case `hold_at_least_keeps_the_name_taken_
    /// after_an_early_release` on a Cluster waited 20 s that way, about one run in 16).
    #[test]
    fn an_announcement_during_an_attempt_made_on_a_local_release_makes_the_head_attempt_again() {
        let (w, _rx) = waiters();
        let head = settled_head(&w);
        w.released(CHANNEL, "a"); // the holder's release, told as it is sent
        assert!(matches!(head.step(), Step::Attempt));
        head.attempting();
        on_release(&w.state, CHANNEL, "a"); // its announcement, the attempt still in flight
        head.busy(crate::clock::now(), 30_000); // the attempt ran first: the old lease
        assert!(matches!(head.step(), Step::Attempt), "the head sleeps out the old lease");
    }

    /// A queue that empties again and again (steady contention between two tasks) is listed
    /// for unsubscription once, not once per hand-off.
    #[test]
    fn a_queue_emptied_again_and_again_is_listed_idle_once() {
        let (w, _rx) = waiters();
        for _ in 0..1000 {
            drop(queued(&w));
        }
        let st = lock(&w.state);
        assert_eq!(st.idle.len(), 1, "one idle listing per key");
        assert!(st.keys.get(CHANNEL).is_some_and(|ks| ks.in_idle && ks.queue.is_empty()));
    }

    /// A writer (its intent recorded) never sleeps behind a sleeping reader of its process:
    /// queued ahead of them, or moved ahead of a head reader whose attempt found no room.
    #[test]
    fn a_waiting_writer_goes_ahead_of_sleeping_readers() {
        let (w, _rx) = waiters();
        let reader = settled_head(&w);
        let writer = w.busy(CHANNEL, Capture::NONE, crate::clock::now(), 30_000, true);
        assert!(matches!(reader.step(), Step::Sleep(_, None)), "the reader is no longer the head");
        assert!(!matches!(writer.step(), Step::Sleep(_, None)), "the writer is the head");
        drop(writer);
        // A reader attempting when the writer queues, then finding no room.
        on_release(&w.state, CHANNEL, "a");
        assert!(matches!(reader.step(), Step::Attempt));
        reader.attempting();
        let writer = w.busy(CHANNEL, Capture::NONE, crate::clock::now(), 30_000, true);
        assert!(matches!(writer.step(), Step::Sleep(_, None)), "behind the attempting head");
        reader.busy(crate::clock::now(), 30_000); // kept out by the writer's intent
        assert!(matches!(writer.step(), Step::Attempt), "the writer attempts (and renews its intent)");
        assert!(matches!(reader.step(), Step::Sleep(_, None)));
        let Before::Queued(late) = w.before_attempt(CHANNEL, false) else { panic!("queued") };
        let Before::Queued(second) = w.before_attempt(CHANNEL, true) else { panic!("queued") };
        let order: Vec<u64> = lock(&w.state).keys[CHANNEL].queue.iter().map(|e| e.id).collect();
        assert_eq!(order, [writer.id, second.id, reader.id, late.id], "writers first, then readers in order");
    }

    #[test]
    fn a_release_seen_during_the_heads_attempt_makes_it_attempt_again() {
        let (w, _rx) = waiters();
        let head = settled_head(&w);
        on_release(&w.state, CHANNEL, "a");
        assert!(matches!(head.step(), Step::Attempt));
        head.attempting();
        on_release(&w.state, CHANNEL, "b"); // arrives while the attempt is in flight
        head.busy(crate::clock::now(), 30_000); // the attempt found the lock held
        assert!(matches!(head.step(), Step::Attempt), "the release was lost");
    }

    /// A local release is told as soon as it is sent, so it may run after the attempt it woke:
    /// its announcement must then wake the queue again, not be taken for the release told.
    #[test]
    fn a_release_told_before_it_ran_wakes_the_queue_when_announced() {
        let (w, _rx) = waiters();
        let head = settled_head(&w);
        w.released(CHANNEL, "a"); // told when sent
        assert!(matches!(head.step(), Step::Attempt));
        head.attempting();
        head.busy(crate::clock::now(), 30_000); // the attempt ran first
        assert!(matches!(head.step(), Step::Sleep(..)));
        on_release(&w.state, CHANNEL, "a"); // the release ran, and is announced
        assert!(matches!(head.step(), Step::Attempt), "the head slept through the release");

        // The same for the first attempt of an acquisition (no slot yet; the key's state kept
        // from an earlier waiter).
        let (w, _rx) = waiters();
        drop(settled_head(&w));
        w.released(CHANNEL, "b");
        let Before::Attempt(capture) = w.before_attempt(CHANNEL, false) else { panic!("nobody queued") };
        let slot = w.busy(CHANNEL, capture, crate::clock::now(), 30_000, false);
        assert!(matches!(slot.step(), Step::Sleep(..)));
        on_release(&w.state, CHANNEL, "b");
        assert!(matches!(slot.step(), Step::Attempt), "the new waiter slept through the release");
    }

    /// A hand-off's ticket is answered before its release marks the waiter woken
    /// (`handed`): a waiter that looks in between takes the grant at once, and a look of its
    /// own that finds the lock held afterwards does not put it back to sleep (it slept until
    /// the holder's lease ran out: 10 s with a grant waiting for it).
    #[test]
    fn a_waiter_handed_the_lock_takes_it_whatever_it_was_doing() {
        let ticket = || Ticket::new(Arc::from("owner"), Arc::from("lock:fence:{k}"), 30_000, None);
        // Granted: between the answer and `handed`, the waiter attempts (takes it).
        let (w, _rx) = waiters();
        let head = settled_head(&w);
        let t = ticket();
        head.offer(t.clone());
        assert!(w.hand_off(CHANNEL, "holder").is_some_and(|h| Arc::ptr_eq(&h, &t)));
        assert!(matches!(head.step(), Step::Sleep(_, None)), "pending: it waits for the answer");
        assert!(!t.answer(Handed::Granted { token: 7, sent: crate::clock::now() }));
        assert!(matches!(head.step(), Step::Attempt), "granted, and it waits for `handed`");

        // Not granted: a look begun before `handed` finds the lock held; it attempts anyway.
        let (w, _rx) = waiters();
        let head = settled_head(&w);
        let t = ticket();
        head.offer(t.clone());
        assert!(w.hand_off(CHANNEL, "holder").is_some());
        assert!(!t.answer(Handed::Open));
        lock(&w.state).keys.get_mut(CHANNEL).expect("key").looked = None; // it looks next
        assert!(matches!(head.step(), Step::Check));
        w.handed(CHANNEL, &t);
        head.busy(crate::clock::now(), 30_000); // the look found the lock held
        assert!(matches!(head.step(), Step::Attempt), "back to sleep after a hand-off");
    }

    /// A hand-off that found the lock another's (granted from the lock's queue to another
    /// process) looked at it for the waiter and queued it in Redis: the waiter sleeps until the
    /// holder's lease end or its entry's renewal, without an attempt that would find the same
    /// holder (one more script per hand-off across processes); a release seen meanwhile still
    /// makes it attempt.
    #[test]
    fn a_waiter_the_hand_off_looked_for_sleeps() {
        let ticket = || Ticket::new(Arc::from("owner"), Arc::from("lock:fence:{k}"), 30_000, Some(2_000));
        let (w, _rx) = waiters();
        let head = settled_head(&w);
        let t = ticket();
        head.offer(t.clone());
        assert!(w.hand_off(CHANNEL, "holder").is_some());
        let sent = crate::clock::now();
        assert!(!t.answer(Handed::Held { sent, pttl: 2_000 }));
        w.handed(CHANNEL, &t);
        match head.step() {
            Step::Sleep(_, Some(until)) => assert!(until <= sent + Duration::from_millis(2_000)),
            _ => panic!("the waiter did not sleep after the hand-off's look"),
        }
        assert!(t.may_be_queued() && t.get() == Handed::Open);

        let (w, _rx) = waiters();
        let head = settled_head(&w);
        let t = ticket();
        head.offer(t.clone());
        assert!(w.hand_off(CHANNEL, "holder").is_some());
        on_release(&w.state, CHANNEL, "other"); // heard while the hand-off was pending
        assert!(!t.answer(Handed::Held { sent: crate::clock::now(), pttl: 2_000 }));
        w.handed(CHANNEL, &t);
        assert!(matches!(head.step(), Step::Attempt), "a release heard meanwhile was lost");
    }

    /// A release that granted the lock from the lock's queue wakes the waiter it was granted
    /// to (here not the head), and for another process's grantee wakes nobody but moves the
    /// head's next attempt to the claim deadline (an unclaimed grant runs out unannounced).
    #[test]
    fn a_grant_from_the_queue_wakes_its_grantee_only() {
        let (w, _rx) = waiters();
        let head = settled_head(&w);
        let second = queued(&w);
        second.offer(Ticket::new(Arc::from("second"), Arc::from("lock:fence:{k}"), 30_000, Some(2_000)));
        on_release(&w.state, CHANNEL, "holder#elsewhere#1500");
        match head.step() {
            Step::Sleep(_, Some(until)) => assert!(until <= crate::clock::now() + Duration::from_millis(1500)),
            _ => panic!("the head did not sleep until the claim deadline"),
        }
        on_release(&w.state, CHANNEL, "elsewhere#second#2000");
        assert!(matches!(second.step(), Step::Attempt), "the grantee slept through its grant");
        assert!(matches!(head.step(), Step::Sleep(..)), "the head woke for another's grant");
    }

    #[test]
    fn a_head_dropped_woken_or_attempting_wakes_the_next() {
        for attempting in [false, true] {
            let (w, _rx) = waiters();
            let head = settled_head(&w);
            let next = queued(&w);
            assert!(matches!(w.before_attempt(CHANNEL, false), Before::Queued(_)), "local FIFO");
            assert!(matches!(next.step(), Step::Sleep(_, None)));
            on_release(&w.state, CHANNEL, "a");
            assert!(matches!(head.step(), Step::Attempt));
            if attempting {
                head.attempting();
            }
            drop(head);
            assert!(matches!(next.step(), Step::Attempt), "wake-up not passed on (attempting: {attempting})");
        }
    }

    #[test]
    fn a_head_dropped_asleep_passes_nothing_and_a_granted_head_waits_for_its_release() {
        let (w, _rx) = waiters();
        let head = settled_head(&w);
        let next = queued(&w);
        drop(head);
        assert!(matches!(next.step(), Step::Sleep(..)), "woken for nothing");
        let third = queued(&w);
        on_release(&w.state, CHANNEL, "a");
        assert!(matches!(next.step(), Step::Attempt));
        next.attempting();
        next.granted(crate::clock::now().checked_add(Duration::from_secs(30)));
        assert!(matches!(third.step(), Step::Sleep(..)));
        // The local holder's release, then its message: one wake-up.
        w.released(CHANNEL, "next");
        on_release(&w.state, CHANNEL, "next");
        assert!(matches!(third.step(), Step::Attempt));
        third.attempting();
        third.busy(crate::clock::now(), 30_000);
        assert!(matches!(third.step(), Step::Sleep(..)), "one release, two wake-ups");
    }

    /// Two feeds (Redlock's nodes): a new key is subscribed on each, a confirmation on either
    /// makes the head look, a key let go of is unsubscribed on every feed where it was
    /// subscribed (whichever feed let it go), and not where it is waited on again by then.
    #[test]
    fn a_key_is_subscribed_and_let_go_of_on_every_feed() {
        let (a, _ra) = mpsc::unbounded_channel();
        let (b, _rb) = mpsc::unbounded_channel();
        let w = Waiters { state: Arc::new(Mutex::new(State::new(2))), pokes: Pokes(Arc::new([a, b])) };
        let head = queued(&w);
        assert_eq!(w.channels(), 2);
        let grace = Duration::ZERO;
        for feed in [0, 1] {
            let (change, _) = next_change(&w.state, feed, grace);
            assert!(matches!(change, Some((true, ref c)) if c.len() == 1), "feed {feed} subscribes");
        }
        confirmed(&w.state, 1, &[Arc::from(CHANNEL)]);
        assert!(matches!(head.step(), Step::Check), "a confirmation on feed 1 is not looked after");
        head.busy(crate::clock::now(), 30_000);
        confirmed(&w.state, 0, &[Arc::from(CHANNEL)]);
        assert!(matches!(head.step(), Step::Check), "a confirmation on feed 0 is not looked after");
        drop(head);
        // Feed 1 lets the key go; both unsubscribe it.
        let (change, _) = next_change(&w.state, 1, grace);
        assert!(matches!(change, Some((false, ref c)) if c.len() == 1), "feed 1 keeps it");
        assert_eq!(w.channels(), 0);
        let (change, _) = next_change(&w.state, 0, grace);
        assert!(matches!(change, Some((false, ref c)) if c.len() == 1), "feed 0 keeps it");

        // Let go of by feed 0, then waited on again before feed 1 unsubscribes it: kept there.
        let head = queued(&w);
        let _ = (next_change(&w.state, 0, grace), next_change(&w.state, 1, grace));
        confirmed(&w.state, 0, &[Arc::from(CHANNEL)]);
        confirmed(&w.state, 1, &[Arc::from(CHANNEL)]);
        drop(head);
        let (change, _) = next_change(&w.state, 0, grace);
        assert!(matches!(change, Some((false, _))));
        let again = queued(&w);
        let (change, _) = next_change(&w.state, 1, grace);
        assert!(matches!(change, Some((true, _))), "feed 1 subscribes the new key state");
        let (change, _) = next_change(&w.state, 1, grace);
        assert!(change.is_none(), "feed 1 unsubscribes a channel waited on again");
        drop(again);
    }

    /// An owner released (a Redlock split vote's grants undone, announced), was then granted
    /// the lock and released it: that second release wakes the queue (it was taken for the
    /// first one seen twice, and the queue slept out the 30 s lease).
    #[test]
    fn a_second_release_of_the_same_owner_after_a_new_grant_wakes_the_queue() {
        let (w, _rx) = waiters();
        let head = settled_head(&w);
        let next = queued(&w);
        on_release(&w.state, CHANNEL, "a"); // its split vote undone, announced
        assert!(matches!(head.step(), Step::Attempt));
        head.attempting();
        on_release(&w.state, CHANNEL, "a"); // the same, from another node
        head.granted(crate::clock::now().checked_add(Duration::from_secs(30)));
        assert!(matches!(next.step(), Step::Sleep(..)));
        w.released(CHANNEL, "a"); // the holder "a" (the same owner) releases
        assert!(matches!(next.step(), Step::Attempt), "the release was taken for the undone grant's");
    }

    /// A local release is told as it is sent; an acquisition's first attempt sent after that
    /// may still reach the server before the release runs (on a Cluster, a release answered
    /// `NOSCRIPT` is sent again behind it) and find the old lease. The release's announcement,
    /// arriving while that attempt is in flight and nobody is queued, must wake it (it slept
    /// out the 30 s lease: the Cluster's conformance case `aborted_holder_releases`).
    #[test]
    fn a_release_announced_during_a_first_attempt_made_after_it_was_told_wakes_it() {
        let (w, _rx) = waiters();
        drop(settled_head(&w)); // the key's state is kept (subscribed), nobody queued
        w.released(CHANNEL, "a"); // told as it is sent
        let Before::Attempt(capture) = w.before_attempt(CHANNEL, false) else { panic!("nobody queued") };
        on_release(&w.state, CHANNEL, "a"); // the release ran after the attempt, announced
        let slot = w.busy(CHANNEL, capture, crate::clock::now(), 30_000, false); // the old lease
        assert!(matches!(slot.step(), Step::Attempt), "the first attempt sleeps out the old lease");
    }

    #[test]
    fn a_release_seen_while_an_attempt_was_in_flight_and_nobody_queued_wakes_it() {
        let (w, _rx) = waiters();
        let head = settled_head(&w);
        on_release(&w.state, CHANNEL, "a");
        head.attempting();
        head.granted(None); // the queue is empty now, the channel still subscribed
        let Before::Attempt(capture) = w.before_attempt(CHANNEL, false) else { panic!("nobody queued") };
        on_release(&w.state, CHANNEL, "b"); // nobody to wake: counted
        let late = w.busy(CHANNEL, capture, crate::clock::now(), 30_000, false);
        assert!(matches!(late.step(), Step::Attempt), "the release during its attempt was lost");
    }
}
