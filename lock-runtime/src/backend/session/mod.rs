//! The skeleton of the backends whose locks live in a server session, one connection per
//! acquisition (PostgreSQL's advisory locks, MySQL's `GET_LOCK`): the idle connections, one
//! [`Acquisition`] that owns its connection until it is granted or dropped, and one
//! [`HeldLock`] whose connection a monitor task keeps. A store says how to connect, take,
//! release and watch a lock on one connection ([`Sessions`]); the rest is here, once. Held
//! locks may share a few connections ([`carrier`]).

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use crate::backend::{Acquire, Acquisition, Attempt, BoxFuture, Grant, Held, HeldLock, Lease, Wake};
use crate::error::LockError;
use crate::lost::LostSignal;

pub(crate) mod carrier;
mod sessions;

use carrier::{Carried, CarriedLock, Carriers};
pub(crate) use carrier::{Carrier, Carry};
pub(crate) use sessions::{Beat, Failure, Idle, Sessions};

/// What a lock's holder is told when an operator forced its release.
pub(crate) const FORCED: &str = "an operator forced its release";

/// A store and its idle connections (from released locks), shared by a backend's clones.
pub(crate) struct Pool<S: Carry> {
    pub(crate) sessions: Arc<S>,
    idle: Arc<Idle<S::Conn>>,
    /// The connections held locks share ([`carrier`]).
    carriers: Arc<Carriers<S>>,
}

impl<S: Carry> Pool<S> {
    pub(crate) fn new(sessions: S) -> Self {
        let sessions = Arc::new(sessions);
        Pool { carriers: Arc::new(Carriers::new(sessions.clone())), sessions, idle: Arc::new(Idle::new()) }
    }

    /// The manager's shutdown: closes the idle connections and the carriers that hold no lock
    /// (a carrier still holding one, a lock of another manager on this backend, is left).
    pub(crate) fn shut_down(&self) {
        self.idle.clear();
        self.carriers.close_idle();
    }

    /// An idle connection (`true`: reused, the server may have closed it since) or a new one.
    pub(crate) async fn checkout(&self, name: &str) -> Result<(S::Conn, bool), LockError> {
        loop {
            let conn = self.idle.take();
            match conn {
                Some(conn) if S::is_closed(&conn) => continue,
                Some(conn) => return Ok((conn, true)),
                None => {
                    let bound = self.sessions.operation_timeout();
                    return match tokio::time::timeout(bound, self.sessions.connect(name)).await {
                        Ok(conn) => Ok((conn?, false)),
                        Err(_) => Err(LockError::timed_out(name, S::KIND, "connect", bound)),
                    };
                }
            }
        }
    }

    /// An idle connection, if one is kept and open (none is made): for a backend's own
    /// housekeeping, which gives it back with [`checkin`](Self::checkin).
    #[cfg_attr(not(all(feature = "mysql", feature = "sqlx")), allow(dead_code))]
    pub(crate) fn take_idle(&self) -> Option<S::Conn> {
        std::iter::from_fn(|| self.idle.take()).find(|conn| !S::is_closed(conn))
    }

    /// Keeps `conn` for the next acquisitions, if there is room.
    pub(crate) fn checkin(&self, conn: S::Conn) {
        if S::is_closed(&conn) {
            return;
        }
        self.idle.put(conn, self.sessions.max_idle());
    }

    /// Drops every idle connection (one was found closed: the others are suspect).
    fn drop_idle(&self) {
        self.idle.clear();
    }

    /// How many idle connections are kept right now.
    pub(crate) fn idle(&self) -> usize {
        self.idle.len()
    }

    /// The acquisition of `req`.
    pub(crate) fn begin(self: &Arc<Self>, req: Acquire, lost: LostSignal) -> Box<dyn Acquisition> {
        Box::new(SessionAcquisition {
            key: self.sessions.key(&req),
            pool: self.clone(),
            req,
            lost: Some(lost),
            conn: None,
            in_flight: false,
            waiting: None,
        })
    }
}

/// One `lock()` call: owns its connection from the first attempt until it is granted (the
/// [`SessionHeld`] owns it then) or dropped.
struct SessionAcquisition<S: Carry> {
    pool: Arc<Pool<S>>,
    req: Acquire,
    key: S::Key,
    lost: Option<LostSignal>,
    conn: Option<S::Conn>,
    /// A query was sent and its answer not read (the future was dropped): the session may be
    /// waiting on the server, or hold the lock.
    in_flight: bool,
    /// Its place among the waits the store allows at once ([`Sessions::waits`]), while it
    /// waits.
    waiting: Option<tokio::sync::OwnedSemaphorePermit>,
}

impl<S: Carry> Drop for SessionAcquisition<S> {
    fn drop(&mut self) {
        if let Some(conn) = self.conn.take() {
            if self.in_flight {
                S::cancel_and_close(&self.pool.sessions, &self.pool.idle, conn);
            } else {
                self.pool.checkin(conn);
            }
        }
    }
}

impl<S: Carry> SessionAcquisition<S> {
    /// [`Sessions::lock`] on the acquisition's connection, within `bound`. A reused
    /// connection found closed is replaced by a new one (and every idle connection is dropped
    /// with it: the event that closed it, an idle timeout, an operator's kill or a restart,
    /// closed them too); a failed or timed-out one is closed.
    ///
    /// Sending the attempt again on the new connection is safe: a closed connection's
    /// session is gone on the server, and every lock it held or waited for with it.
    async fn lock(
        &mut self,
        wait: Option<Duration>,
        bound: Duration,
        operation: &'static str,
    ) -> Result<Option<u64>, LockError> {
        // Each replacement follows a reused connection found closed; the idle set is emptied
        // each time, so a second one takes another acquisition's check-in in between, a
        // third a server that closes connections as fast as they are made.
        let mut replaced = 0;
        loop {
            let reused = match self.conn {
                Some(_) => false,
                None => {
                    let (conn, reused) = self.pool.checkout(&self.req.name).await?;
                    self.conn = Some(conn);
                    reused
                }
            };
            let Some(conn) = self.conn.as_mut() else { continue };
            self.in_flight = true;
            let answer = tokio::time::timeout(bound, self.pool.sessions.lock(conn, &self.key, wait)).await;
            self.in_flight = false;
            match answer {
                Ok(Ok(granted)) => return Ok(granted),
                Err(_) => {
                    if let Some(conn) = self.conn.take() {
                        S::cancel_and_close(&self.pool.sessions, &self.pool.idle, conn);
                    }
                    return Err(LockError::timed_out(&*self.req.name, S::KIND, operation, bound));
                }
                Ok(Err(failure)) => {
                    self.conn = None; // unknown state: closing it frees whatever its session holds
                    match failure {
                        Failure::Closed(_) if reused && replaced < 3 => {
                            replaced += 1;
                            self.pool.drop_idle();
                        }
                        Failure::Closed(e) | Failure::Failed(e) => return Err(e),
                    }
                }
            }
        }
    }

    fn grant(&mut self, token: u64, granted_at: Instant) -> Result<Grant, LockError> {
        self.waiting = None; // a held lock is not a wait
        let Some(conn) = self.conn.take() else {
            return Err(LockError::backend(&*self.req.name, S::KIND, "grant", "no connection after the grant"));
        };
        Ok(self.grant_kept(Kept::Own(conn), token, granted_at))
    }

    /// The grant of a lock kept by `kept` (its own connection, or a carrier).
    fn grant_kept(&mut self, kept: Kept<S>, token: u64, granted_at: Instant) -> Grant {
        let lease_end = match self.req.lease {
            Lease::Fixed(lease) => granted_at.checked_add(lease),
            Lease::Renewed(_) => None,
        };
        let lost = self.lost.take().unwrap_or_else(LostSignal::never);
        let monitor = Monitor::spawn(self.pool.clone(), kept, lease_end, lost);
        let held = SessionHeld { pool: self.pool.clone(), name: self.req.name.clone(), key: self.key.clone(), monitor };
        Grant { fencing_token: token, granted_at: Some(granted_at), lock: Held::new(held) }
    }

    async fn attempt_once(&mut self) -> Result<Attempt, LockError> {
        let granted_at = crate::clock::now();
        // Uncontended locks share a few connections; a lock held on this acquisition's own
        // connection (it waited) is not tried there again.
        if let (Some(id), None) = (self.pool.sessions.carried(&self.key), &self.conn) {
            let lost = self.lost.clone().unwrap_or_else(LostSignal::never);
            match self.pool.carriers.attempt(&self.req.name, id, &self.key, &lost).await? {
                Carried::Granted(token, lock) => {
                    return Ok(Attempt::Acquired(self.grant_kept(Kept::Carried(lock), token, granted_at)))
                }
                Carried::Busy => return Ok(Attempt::Busy),
                Carried::Elsewhere => {}
            }
        }
        match self.lock(None, self.pool.sessions.operation_timeout(), "attempt").await? {
            Some(token) => Ok(Attempt::Acquired(self.grant(token, granted_at)?)),
            None => Ok(Attempt::Busy),
        }
    }

    async fn wait_until(&mut self, deadline: Instant) -> Result<Wake, LockError> {
        let remaining = deadline.saturating_duration_since(crate::clock::now());
        if remaining.is_zero() {
            return Ok(Wake::TimedOut);
        }
        if !self.wait_turn(deadline).await {
            return Ok(Wake::TimedOut);
        }
        let remaining = deadline.saturating_duration_since(crate::clock::now());
        let bound = remaining.saturating_add(self.pool.sessions.operation_timeout());
        match self.lock(Some(remaining), bound, "wait").await? {
            Some(token) => Ok(Wake::Acquired(self.grant(token, crate::clock::now())?)),
            None if crate::clock::now() < deadline => Ok(Wake::Retry),
            None => Ok(Wake::TimedOut),
        }
    }
}

impl<S: Carry> SessionAcquisition<S> {
    /// A place among the waits the store allows at once, if it bounds them: at once, or,
    /// with its connection given back meanwhile, in arrival order until `deadline` (`false`:
    /// the deadline came first).
    async fn wait_turn(&mut self, deadline: Instant) -> bool {
        let Some(waits) = self.pool.sessions.waits() else { return true };
        if self.waiting.is_some() {
            return true;
        }
        let waits = waits.clone();
        if let Ok(turn) = waits.clone().try_acquire_owned() {
            self.waiting = Some(turn);
            return true;
        }
        if let Some(conn) = self.conn.take() {
            self.pool.checkin(conn); // none in flight: it holds and waits for nothing
        }
        match tokio::time::timeout_at(deadline.into(), waits.acquire_owned()).await {
            Ok(Ok(turn)) => {
                self.waiting = Some(turn);
                true
            }
            Ok(Err(_)) | Err(_) => false,
        }
    }
}

impl<S: Carry> Acquisition for SessionAcquisition<S> {
    fn attempt(&mut self) -> BoxFuture<'_, Result<Attempt, LockError>> {
        Box::pin(self.attempt_once())
    }

    fn wait(&mut self, deadline: Instant) -> BoxFuture<'_, Result<Wake, LockError>> {
        Box::pin(self.wait_until(deadline))
    }
}

/// What keeps a held lock: its own connection, or its place on a carrier.
enum Kept<S: Carry> {
    Own(S::Conn),
    Carried(CarriedLock<S>),
}

impl<S: Carry> Kept<S> {
    /// The connection whose end is the lock's.
    fn conn(&self) -> &S::Conn {
        match self {
            Kept::Own(conn) => conn,
            Kept::Carried(lock) => &lock.carrier.conn,
        }
    }

    fn is_usable(&self) -> bool {
        match self {
            Kept::Own(conn) => !S::is_closed(conn),
            Kept::Carried(lock) => lock.is_usable(),
        }
    }
}

/// The task that keeps a held lock: fires `lost()` when its connection closes (or stops
/// answering its heartbeat), ends a fixed lease (firing `lost()`, then freeing the lock: its
/// own connection closed, or its carrier's unlock), and gives the lock back to the release.
/// Dropped, what it keeps frees the lock (a connection closes, a carried lock unlocks).
struct Monitor<S: Carry> {
    stop: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<Option<Kept<S>>>>,
}

/// Why the monitor's wait ended.
enum Woke {
    Stop(bool),
    LeaseOver,
    Closed,
    Heartbeat,
}

impl<S: Carry> Monitor<S> {
    fn spawn(pool: Arc<Pool<S>>, mut kept: Kept<S>, lease_end: Option<Instant>, lost: LostSignal) -> Self {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return Monitor { stop: None, task: None };
        };
        let (stop, mut stopped) = oneshot::channel::<()>();
        let task = runtime.spawn(async move {
            let sessions = &pool.sessions;
            let lease_over = async {
                match lease_end {
                    Some(at) => tokio::time::sleep_until(at.into()).await,
                    None => std::future::pending().await,
                }
            };
            tokio::pin!(lease_over);
            loop {
                // A carrier's connection is not asked by each of its locks.
                let heartbeat = async {
                    match (sessions.heartbeat(), &kept) {
                        (Some(every), Kept::Own(_)) => tokio::time::sleep(every).await,
                        _ => std::future::pending().await,
                    }
                };
                // Only cancel-safe waits here: a heartbeat's query runs below, to its end.
                let woke = tokio::select! {
                    biased;
                    asked = &mut stopped => Woke::Stop(asked.is_ok()),
                    () = &mut lease_over => Woke::LeaseOver,
                    () = sessions.closed(kept.conn()) => Woke::Closed,
                    () = heartbeat => Woke::Heartbeat,
                };
                match woke {
                    // Asked for by the release; a dropped lock is freed.
                    Woke::Stop(asked) => return asked.then_some(kept),
                    Woke::LeaseOver => {
                        // Told before the lock is freed (a holder paused past its lease runs
                        // this late, and the runtime's own timer may not have run yet).
                        lost.fire("its fixed lease ended");
                        return None;
                    }
                    Woke::Closed => {
                        lost.fire(S::LOST);
                        return None;
                    }
                    Woke::Heartbeat => {
                        let bound = sessions.operation_timeout();
                        let Kept::Own(conn) = &mut kept else { continue };
                        match tokio::time::timeout(bound, sessions.alive(conn)).await {
                            Ok(Beat::Alive) => {}
                            // Its own connection closed (dropped) frees the lock.
                            Ok(Beat::Forced) => {
                                lost.fire(FORCED);
                                return None;
                            }
                            Ok(Beat::Dead) | Err(_) => {
                                lost.fire(S::LOST);
                                return None;
                            }
                        }
                    }
                }
            }
        });
        Monitor { stop: Some(stop), task: Some(task) }
    }

    /// The lock back from the task, if it still holds it.
    async fn take(&mut self) -> Option<Kept<S>> {
        let stop = self.stop.take()?;
        let _ = stop.send(());
        let kept = self.task.take()?.await.ok().flatten()?;
        kept.is_usable().then_some(kept)
    }
}

impl<S: Carry> Drop for Monitor<S> {
    fn drop(&mut self) {
        // Not released: the task drops what it keeps (its sender is gone), which frees the
        // lock.
        drop(self.stop.take());
    }
}

/// A granted lock: the monitor that keeps it.
struct SessionHeld<S: Carry> {
    pool: Arc<Pool<S>>,
    name: Arc<str>,
    key: S::Key,
    monitor: Monitor<S>,
}

impl<S: Carry> SessionHeld<S> {
    async fn kept(&mut self) -> Result<Kept<S>, LockError> {
        self.monitor.take().await.ok_or_else(|| {
            LockError::lost(
                &*self.name,
                format!("its fixed lease had ended or {} (the session's locks went with it)", S::LOST),
            )
        })
    }

    async fn release_lock(&mut self) -> Result<(), LockError> {
        let kept = self.kept().await?;
        free(&self.pool, &self.name, &self.key, kept).await
    }

    async fn release_lock_after(&mut self, remaining: Duration) -> Result<(), LockError> {
        let kept = self.kept().await?;
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            tracing::warn!("released outside a tokio runtime: the lock is freed at once");
            drop(kept);
            return Ok(());
        };
        let (pool, name, key) = (self.pool.clone(), self.name.clone(), self.key.clone());
        runtime.spawn(async move {
            tokio::time::sleep(remaining).await;
            if let Err(e) = free(&pool, &name, &key, kept).await {
                tracing::debug!(error = %e, "unlock after hold_at_least");
            }
        });
        Ok(())
    }
}

/// Frees a held lock: [`unlock`] on its own connection, or its carrier's.
async fn free<S: Carry>(pool: &Pool<S>, name: &str, key: &S::Key, kept: Kept<S>) -> Result<(), LockError> {
    match kept {
        Kept::Own(conn) => unlock(pool, name, key, conn).await,
        // Bounded by the operation timeout; dropped midway, the lock frees itself.
        Kept::Carried(lock) => match lock.release().await {
            Ok(true) => Ok(()),
            Ok(false) => Err(LockError::lost(name, "its session no longer held the lock")),
            Err(Failure::Closed(e)) => {
                Err(LockError::lost(name, format!("{} (the session's locks went with it): {e}", S::LOST)))
            }
            Err(Failure::Failed(e)) => Err(e),
        },
    }
}

/// [`Sessions::unlock`] on the holder's connection; the connection goes back to the idle set
/// when all went well, and is closed (freeing the lock) otherwise.
async fn unlock<S: Carry>(pool: &Pool<S>, name: &str, key: &S::Key, mut conn: S::Conn) -> Result<(), LockError> {
    let bound = pool.sessions.operation_timeout();
    match tokio::time::timeout(bound, pool.sessions.unlock(&mut conn, key)).await {
        Ok(Ok(true)) => {
            pool.checkin(conn);
            Ok(())
        }
        Ok(Ok(false)) => Err(LockError::lost(name, "its session no longer held the lock")),
        Ok(Err(Failure::Closed(e))) => {
            Err(LockError::lost(name, format!("{} (the session's locks went with it): {e}", S::LOST)))
        }
        Ok(Err(Failure::Failed(e))) => Err(e),
        Err(_) => Err(LockError::timed_out(name, S::KIND, "release", bound)),
    }
}

impl<S: Carry> HeldLock for SessionHeld<S> {
    fn release(&mut self) -> BoxFuture<'_, Result<(), LockError>> {
        Box::pin(self.release_lock())
    }

    fn release_after(&mut self, remaining: Duration) -> BoxFuture<'_, Result<(), LockError>> {
        Box::pin(self.release_lock_after(remaining))
    }
}
