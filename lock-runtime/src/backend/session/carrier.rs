//! Carriers: a few connections shared by many held locks (multiplexing, as the .NET
//! DistributedLock does for PostgreSQL). An uncontended acquisition is tried on a carrier, a
//! connection that already holds other locks; one that finds its lock busy waits on a
//! connection of its own, as before (a wait blocks its session).
//!
//! A session may take a lock it already holds (PostgreSQL's advisory locks, MySQL's
//! `GET_LOCK` are re-entrant, and a session's second shared lock passes a waiting writer), so
//! each carrier keeps the set of keys it holds or is taking: at most one acquisition per key
//! per carrier. A lock's key starts on its own carrier (a hash of the key picks it) and moves
//! on to the next one that has not got it; with every carrier taken for that key, the attempt
//! goes on a connection of its own.
//!
//! A key taken on a carrier has one owner from the moment its attempt is sent
//! ([`CarriedLock`]), which frees it when dropped: an attempt or a release whose caller went
//! away with its query in flight unlocks in the background (the key stays reserved until then,
//! so a second unlock harms nobody). The queries run in the caller's task (no hop to another
//! task on the fast path). A carrier whose state is unknown (an operation failed or ran out of
//! time) is closed, which frees every lock on it and fires each one's `lost()`.

// What one store's carriers use and the other's do not (PostgreSQL answers inspections from
// the held set; MySQL's heartbeat skips an empty carrier).
#![cfg_attr(not(all(feature = "postgres", feature = "mysql")), allow(dead_code))]

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::sessions::{lock, Failure, Sessions};
use crate::backend::BoxFuture;
use crate::error::LockError;
use crate::lost::LostSignal;

/// What a store does to carry locks side by side on shared connections: a capability of its
/// own beside [`Sessions`]; the defaults carry none.
pub(crate) trait Carry: Sessions {
    /// How many connections held locks share (see the module docs); 0 (the default): every lock
    /// holds a connection of its own.
    fn carriers(&self) -> usize {
        0
    }
    /// The identity of `key`'s lock on a carrier (equal for two locks a session cannot hold
    /// apart), or `None` when it is never carried (a semaphore's).
    fn carried(&self, key: &Self::Key) -> Option<u64> {
        let _ = key;
        None
    }
    /// A new carrier's connection.
    fn open_carrier<'a>(&'a self, name: &'a str) -> BoxFuture<'a, Result<Self::Conn, LockError>> {
        self.connect(name)
    }
    /// Starts what a carrier's connection needs beside its locks (PostgreSQL: answering
    /// inspections); ends when the carrier is gone.
    fn serve_carrier(sessions: &Arc<Self>, carrier: std::sync::Weak<Carrier<Self>>) {
        let _ = (sessions, carrier);
    }
    /// Takes `key`'s lock at once on a carrier's connection (shared: other operations may be
    /// on it at the same time) and draws its token: `Some(token)` granted, `None` busy.
    fn try_carried<'a>(
        &'a self,
        conn: &'a Self::Conn,
        key: &'a Self::Key,
    ) -> BoxFuture<'a, Result<Option<u64>, Failure>> {
        let _ = (conn, key);
        Box::pin(std::future::ready(Err(Failure::Failed(LockError::invalid("", "this store carries no locks")))))
    }
    /// Releases `key`'s lock on a carrier's connection: `false` when its session did not hold
    /// it.
    fn unlock_carried<'a>(&'a self, conn: &'a Self::Conn, key: &'a Self::Key) -> BoxFuture<'a, Result<bool, Failure>> {
        let _ = (conn, key);
        Box::pin(std::future::ready(Ok(false)))
    }
    /// Closes a shared connection at once (its session's locks are freed by the server).
    fn abort(conn: &Self::Conn) {
        let _ = conn;
    }
}

/// One connection shared by held locks, and the keys it holds or is taking.
pub(crate) struct Carrier<S: Carry> {
    pub(crate) conn: S::Conn,
    keys: Mutex<HashMap<u64, Entry<S>>>,
    /// Closed by us (its state unknown): no acquisition is tried on it any more.
    dead: AtomicBool,
    /// Told whenever an attempt ends (its key held, or forgotten).
    settled: tokio::sync::Notify,
}

/// A key on a carrier.
struct Entry<S: Carry> {
    key: S::Key,
    state: State,
}

enum State {
    /// An attempt is on its way.
    Taking,
    /// Held since `since`, with `token`; `lost` is its holder's signal.
    Held { token: u64, since: Instant, lost: LostSignal },
    /// Freed by a forced release; the entry stays until its holder lets go, so that no other
    /// acquisition takes the key on this carrier while the holder may still send its release.
    Forced,
}

/// A held lock on a carrier, as an inspection sees it.
pub(crate) struct CarriedInfo<K> {
    pub(crate) key: K,
    pub(crate) token: u64,
    pub(crate) age: Duration,
}

impl<S: Carry> Carrier<S> {
    fn new(conn: S::Conn) -> Self {
        Carrier {
            conn,
            keys: Mutex::new(HashMap::new()),
            dead: AtomicBool::new(false),
            settled: tokio::sync::Notify::new(),
        }
    }

    /// Whether acquisitions may still be tried on it.
    pub(crate) fn is_usable(&self) -> bool {
        !self.dead.load(Ordering::Relaxed) && !S::is_closed(&self.conn)
    }

    /// Closes it at once: the server frees every lock on it, and each one's monitor fires its
    /// `lost()`.
    pub(crate) fn close(&self) {
        self.dead.store(true, Ordering::Relaxed);
        S::abort(&self.conn);
    }

    /// Takes `id` for one attempt: `false` when the carrier holds or is taking it already.
    fn reserve(&self, id: u64, key: &S::Key) -> bool {
        let mut keys = lock(&self.keys);
        if keys.contains_key(&id) {
            return false;
        }
        keys.insert(id, Entry { key: key.clone(), state: State::Taking });
        true
    }

    fn forget(&self, id: u64) {
        lock(&self.keys).remove(&id);
        self.settled.notify_waiters();
    }

    /// Whether it holds or is taking any key.
    pub(crate) fn holds_any(&self) -> bool {
        !lock(&self.keys).is_empty()
    }

    /// The locks it holds now.
    pub(crate) fn held(&self) -> Vec<CarriedInfo<S::Key>> {
        let now = crate::clock::now();
        lock(&self.keys)
            .values()
            .filter_map(|e| match &e.state {
                State::Held { token, since, .. } => {
                    Some(CarriedInfo { key: e.key.clone(), token: *token, age: now.saturating_duration_since(*since) })
                }
                _ => None,
            })
            .collect()
    }

    /// The locks it holds once the attempts on their way now are answered (a round trip each),
    /// waiting at most `bound` for them: an inspection that found a lock granted on the server
    /// sees it with its token, not as a grant half made.
    pub(crate) async fn held_settled(&self, bound: Duration) -> Vec<CarriedInfo<S::Key>> {
        let deadline = tokio::time::Instant::now() + bound;
        // The attempts on their way now (later ones were not seen granted by the asker).
        let taking = |only: Option<&[u64]>| -> Vec<u64> {
            lock(&self.keys)
                .iter()
                .filter(|(id, e)| matches!(e.state, State::Taking) && only.is_none_or(|o| o.contains(id)))
                .map(|(id, _)| *id)
                .collect()
        };
        let mut waited = taking(None);
        loop {
            let settled = self.settled.notified();
            tokio::pin!(settled);
            settled.as_mut().enable();
            waited = taking(Some(&waited));
            if waited.is_empty() || tokio::time::timeout_at(deadline, settled).await.is_err() {
                return self.held();
            }
        }
    }

    /// A forced release of the lock held under `id` (by `owner`, if given, checked by
    /// `owned`): its holder's `lost()` fires and the lock is freed on the server. `None` when
    /// it does not hold it (or not for that owner).
    pub(crate) async fn force(
        self: &Arc<Self>,
        sessions: &S,
        id: u64,
        owned: impl Fn(&S::Key) -> bool,
    ) -> Option<Result<bool, Failure>> {
        let key = {
            let mut keys = lock(&self.keys);
            let entry = keys.get_mut(&id).filter(|e| owned(&e.key))?;
            let State::Held { lost, .. } = &entry.state else { return None };
            lost.fire(super::FORCED);
            entry.state = State::Forced;
            entry.key.clone()
        };
        let bound = sessions.operation_timeout();
        let freed = match tokio::time::timeout(bound, sessions.unlock_carried(&self.conn, &key)).await {
            Ok(answer) => answer,
            Err(_) => Err(Failure::Failed(LockError::timed_out("", S::KIND, "force release", bound))),
        };
        if freed.is_err() {
            self.close();
        }
        Some(freed)
    }
}

/// A key taken on a carrier, from the attempt on: frees it when dropped (in the background),
/// so that an attempt or a release dropped with its query in flight leaves nothing behind.
/// Its key stays reserved on the carrier until the unlock is answered: an unlock sent again
/// (the first one's answer unread) finds nothing and harms no other acquisition.
pub(crate) struct CarriedLock<S: Carry> {
    carriers: Arc<Carriers<S>>,
    pub(crate) carrier: Arc<Carrier<S>>,
    id: u64,
    key: S::Key,
    armed: bool,
}

impl<S: Carry> CarriedLock<S> {
    /// Frees the lock: `Ok(true)` when the carrier held it until now. Dropped before its
    /// answer, the lock frees itself again in the background.
    pub(crate) async fn release(mut self) -> Result<bool, Failure> {
        let answer = free(&*self.carriers.sessions, &self.carrier, self.id, &self.key).await;
        self.armed = false;
        answer
    }

    /// Whether its carrier may still hold it.
    pub(crate) fn is_usable(&self) -> bool {
        self.carrier.is_usable()
    }
}

impl<S: Carry> Drop for CarriedLock<S> {
    fn drop(&mut self) {
        if !std::mem::take(&mut self.armed) {
            return;
        }
        let (carriers, carrier, id, key) = (self.carriers.clone(), self.carrier.clone(), self.id, self.key.clone());
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                runtime.spawn(async move {
                    let _ = free(&*carriers.sessions, &carrier, id, &key).await;
                });
            }
            // No runtime to send the unlock on: closing the carrier frees the lock (with the
            // others it carries, whose monitors report them lost).
            Err(_) => carrier.close(),
        }
    }
}

/// Unlocks `id` on `carrier` and forgets it there; a carrier whose answer is unknown is
/// closed. A lock whose release was forced is only forgotten (`Ok(false)`).
async fn free<S: Carry>(sessions: &S, carrier: &Arc<Carrier<S>>, id: u64, key: &S::Key) -> Result<bool, Failure> {
    let forced = matches!(lock(&carrier.keys).get(&id).map(|e| &e.state), Some(State::Forced));
    if forced {
        carrier.forget(id);
        return Ok(false);
    }
    let bound = sessions.operation_timeout();
    let answer = match tokio::time::timeout(bound, sessions.unlock_carried(&carrier.conn, key)).await {
        Ok(answer) => answer,
        Err(_) => Err(Failure::Failed(LockError::timed_out("", S::KIND, "release", bound))),
    };
    if answer.is_err() {
        carrier.close();
    }
    carrier.forget(id);
    answer
}

/// What an attempt on a carrier gave.
pub(crate) enum Carried<S: Carry> {
    /// Granted, with its token.
    Granted(u64, CarriedLock<S>),
    /// Someone holds it.
    Busy,
    /// Every carrier holds or is taking this key: try on a connection of its own.
    Elsewhere,
}

/// A backend's carriers, by slot.
pub(crate) struct Carriers<S: Carry> {
    sessions: Arc<S>,
    slots: Mutex<Vec<Option<Arc<Carrier<S>>>>>,
    /// Held while a carrier is opened.
    opening: tokio::sync::Mutex<()>,
}

impl<S: Carry> Carriers<S> {
    pub(crate) fn new(sessions: Arc<S>) -> Self {
        Carriers { sessions, slots: Mutex::new(Vec::new()), opening: tokio::sync::Mutex::new(()) }
    }

    /// Closes and forgets every carrier that holds no lock (a shutdown).
    pub(crate) fn close_idle(&self) {
        let mut slots = lock(&self.slots);
        for slot in slots.iter_mut() {
            if slot.as_ref().is_some_and(|carrier| !carrier.holds_any()) {
                if let Some(carrier) = slot.take() {
                    carrier.close();
                }
            }
        }
    }

    /// One attempt on a carrier for the lock `key` (carrier identity `id`), whose holder's
    /// signal is `lost`.
    pub(crate) async fn attempt(
        self: &Arc<Self>,
        name: &str,
        id: u64,
        key: &S::Key,
        lost: &LostSignal,
    ) -> Result<Carried<S>, LockError> {
        let bound = self.sessions.operation_timeout();
        // A carrier found closed is replaced once (an idle timeout or an operator's kill
        // closed it; its locks went with it and were reported lost).
        for round in 0..2 {
            let Some(carrier) = self.reserve(name, id, key).await? else { return Ok(Carried::Elsewhere) };
            // Armed before the query goes: dropped from here on, it unlocks in the background.
            let mut taken = CarriedLock { carriers: self.clone(), carrier, id, key: key.clone(), armed: true };
            let carrier = taken.carrier.clone();
            let answer = match tokio::time::timeout(bound, self.sessions.try_carried(&carrier.conn, key)).await {
                Ok(answer) => answer,
                Err(_) => Err(Failure::Failed(LockError::timed_out(name, S::KIND, "attempt", bound))),
            };
            match answer {
                Ok(Some(token)) => {
                    if let Some(entry) = lock(&carrier.keys).get_mut(&id) {
                        entry.state = State::Held { token, since: crate::clock::now(), lost: lost.clone() };
                    }
                    carrier.settled.notify_waiters();
                    return Ok(Carried::Granted(token, taken));
                }
                Ok(None) => {
                    taken.armed = false;
                    carrier.forget(id);
                    return Ok(Carried::Busy);
                }
                Err(Failure::Closed(e)) => {
                    // Seen ended (maybe by the server's answer, before the socket closes): its
                    // locks went with it.
                    taken.armed = false;
                    carrier.close();
                    carrier.forget(id);
                    if round > 0 {
                        return Err(e);
                    }
                }
                // It may have been taken: dropping `taken` unlocks it (or closes the carrier)
                // before the key is given to another attempt.
                Err(Failure::Failed(e)) => return Err(e),
            }
        }
        Ok(Carried::Elsewhere)
    }

    /// A carrier that has taken `id` for this attempt: the key's own first, then the next
    /// ones, opened as needed; `None` when every one holds or is taking it.
    async fn reserve(
        self: &Arc<Self>,
        name: &str,
        id: u64,
        key: &S::Key,
    ) -> Result<Option<Arc<Carrier<S>>>, LockError> {
        let n = self.sessions.carriers();
        for i in 0..n {
            let slot = (id as usize).wrapping_add(i) % n;
            let found = lock(&self.slots).get(slot).cloned().flatten().filter(|c| c.is_usable());
            let carrier = match found {
                Some(carrier) => carrier,
                None => self.open_carrier(name, slot).await?,
            };
            if carrier.reserve(id, key) {
                return Ok(Some(carrier));
            }
        }
        Ok(None)
    }

    /// The carrier of `slot`, opened now (or by another acquisition meanwhile: one opens at a
    /// time, so that a burst of first acquisitions opens one connection, not one each).
    async fn open_carrier(self: &Arc<Self>, name: &str, slot: usize) -> Result<Arc<Carrier<S>>, LockError> {
        let bound = self.sessions.operation_timeout();
        let opened = async {
            let _opening = self.opening.lock().await;
            if let Some(theirs) = lock(&self.slots).get(slot).cloned().flatten().filter(|c| c.is_usable()) {
                return Ok(Err(theirs));
            }
            self.sessions.open_carrier(name).await.map(Ok)
        };
        let conn = match tokio::time::timeout(bound, opened).await {
            Ok(Ok(Ok(conn))) => conn,
            Ok(Ok(Err(theirs))) => return Ok(theirs),
            Ok(Err(e)) => return Err(e),
            Err(_) => return Err(LockError::timed_out(name, S::KIND, "connect", bound)),
        };
        let carrier = {
            let mut carriers = lock(&self.slots);
            if carriers.len() <= slot {
                carriers.resize(slot + 1, None);
            }
            let carrier = Arc::new(Carrier::new(conn));
            carriers[slot] = Some(carrier.clone());
            carrier
        };
        S::serve_carrier(&self.sessions, Arc::downgrade(&carrier));
        Ok(carrier)
    }
}
