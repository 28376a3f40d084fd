//! The skeleton of the backends whose locks live in a server session, one connection per
//! acquisition (PostgreSQL's advisory locks, MySQL's `GET_LOCK`): the idle connections, one
//! [`Acquisition`] that owns its connection until it is granted or dropped, and one
//! [`HeldLock`] whose connection a monitor task keeps. A store says how to connect, take,
//! release and watch a lock on one connection ([`Sessions`]); the rest is here, once. Held
//! locks may share a few connections ([`carrier`]).

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use crate::backend::{Acquire, Acquisition, Attempt, BoxFuture, Grant, Held, HeldLock, Lease, Wake};
use crate::error::LockError;
use crate::lost::LostSignal;

pub(crate) mod carrier;

use carrier::{Carried, CarriedLock, Carrier};

/// How one operation on a connection failed.
pub(crate) enum Failure {
    /// The connection was found closed (a reused idle one is replaced, with every idle one).
    Closed(LockError),
    /// Anything else; the connection's state is unknown.
    Failed(LockError),
}

/// What a store does on one connection. Every future is bounded by the skeleton.
pub(crate) trait Sessions: Send + Sync + Sized + 'static {
    /// One connection: one server session.
    type Conn: Send + Sync + 'static;
    /// A lock's name on the server, computed once per acquisition.
    type Key: Send + Sync + Clone + 'static;
    /// The backend's kind, for errors.
    const KIND: &'static str;
    /// Why a held lock was lost when its connection died.
    const LOST: &'static str;

    /// The longest one operation may take.
    fn operation_timeout(&self) -> Duration;
    /// How many idle connections are kept.
    fn max_idle(&self) -> usize;
    /// The server-side name of `req`'s lock.
    fn key(&self, req: &Acquire) -> Self::Key;
    /// A new connection.
    fn connect<'a>(&'a self, name: &'a str) -> BoxFuture<'a, Result<Self::Conn, LockError>>;
    /// Whether `conn` is known to be closed.
    fn is_closed(conn: &Self::Conn) -> bool;
    /// Takes the lock on `conn`, at once (`wait` is `None`) or waiting on the server for at
    /// most `wait`, and draws its token: `Some(token)` granted, `None` not (the connection is
    /// fine). On an error the skeleton closes the connection, which frees anything it holds.
    fn lock<'a>(
        &'a self,
        conn: &'a mut Self::Conn,
        key: &'a Self::Key,
        wait: Option<Duration>,
    ) -> BoxFuture<'a, Result<Option<u64>, Failure>>;
    /// Releases the lock held on `conn`: `false` when the session no longer held it.
    fn unlock<'a>(&'a self, conn: &'a mut Self::Conn, key: &'a Self::Key) -> BoxFuture<'a, Result<bool, Failure>>;
    /// Ends the query running on `conn` (a dropped waiter) and closes it, in the background.
    fn cancel_and_close(pool: &Arc<Pool<Self>>, conn: Self::Conn);
    /// Completes once `conn` is known closed; cancel-safe.
    fn closed<'a>(&'a self, conn: &'a Self::Conn) -> BoxFuture<'a, ()>;
    /// How often a held lock's connection is asked whether it is [`alive`](Self::alive), if
    /// ever (a store whose client tells of a closed connection by itself needs no heartbeat).
    fn heartbeat(&self) -> Option<Duration> {
        None
    }
    /// Whether `conn` still answers.
    fn alive<'a>(&'a self, conn: &'a mut Self::Conn) -> BoxFuture<'a, bool> {
        let _ = conn;
        Box::pin(std::future::ready(true))
    }

    /// How many connections held locks share ([`carrier`]); 0 (the default): every lock
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
    fn serve_carrier(pool: &Arc<Pool<Self>>, carrier: std::sync::Weak<Carrier<Self>>) {
        let _ = (pool, carrier);
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

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A store and its idle connections (from released locks), shared by a backend's clones.
pub(crate) struct Pool<S: Sessions> {
    pub(crate) sessions: S,
    idle: Mutex<Vec<S::Conn>>,
    /// The connections held locks share, by slot ([`carrier`]).
    carriers: Mutex<Vec<Option<Arc<Carrier<S>>>>>,
    /// Held while a carrier is opened.
    opening: tokio::sync::Mutex<()>,
}

impl<S: Sessions> Pool<S> {
    pub(crate) fn new(sessions: S) -> Self {
        Pool {
            sessions,
            idle: Mutex::new(Vec::new()),
            carriers: Mutex::new(Vec::new()),
            opening: tokio::sync::Mutex::new(()),
        }
    }

    /// An idle connection (`true`: reused, the server may have closed it since) or a new one.
    pub(crate) async fn checkout(&self, name: &str) -> Result<(S::Conn, bool), LockError> {
        loop {
            let conn = lock(&self.idle).pop();
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

    /// Keeps `conn` for the next acquisitions, if there is room.
    pub(crate) fn checkin(&self, conn: S::Conn) {
        if S::is_closed(&conn) {
            return;
        }
        let mut idle = lock(&self.idle);
        if idle.len() < self.sessions.max_idle() {
            idle.push(conn);
        }
    }

    /// Drops every idle connection (one was found closed: the others are suspect).
    fn drop_idle(&self) {
        let stale = std::mem::take(&mut *lock(&self.idle));
        drop(stale);
    }

    /// How many idle connections are kept right now.
    pub(crate) fn idle(&self) -> usize {
        lock(&self.idle).len()
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
        })
    }
}

/// One `lock()` call: owns its connection from the first attempt until it is granted (the
/// [`SessionHeld`] owns it then) or dropped.
struct SessionAcquisition<S: Sessions> {
    pool: Arc<Pool<S>>,
    req: Acquire,
    key: S::Key,
    lost: Option<LostSignal>,
    conn: Option<S::Conn>,
    /// A query was sent and its answer not read (the future was dropped): the session may be
    /// waiting on the server, or hold the lock.
    in_flight: bool,
}

impl<S: Sessions> Drop for SessionAcquisition<S> {
    fn drop(&mut self) {
        if let Some(conn) = self.conn.take() {
            if self.in_flight {
                S::cancel_and_close(&self.pool, conn);
            } else {
                self.pool.checkin(conn);
            }
        }
    }
}

impl<S: Sessions> SessionAcquisition<S> {
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
                        S::cancel_and_close(&self.pool, conn);
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
            match self.pool.attempt_carried(&self.req.name, id, &self.key, &lost).await? {
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
        let bound = remaining.saturating_add(self.pool.sessions.operation_timeout());
        match self.lock(Some(remaining), bound, "wait").await? {
            Some(token) => Ok(Wake::Acquired(self.grant(token, crate::clock::now())?)),
            None if crate::clock::now() < deadline => Ok(Wake::Retry),
            None => Ok(Wake::TimedOut),
        }
    }
}

impl<S: Sessions> Acquisition for SessionAcquisition<S> {
    fn attempt(&mut self) -> BoxFuture<'_, Result<Attempt, LockError>> {
        Box::pin(self.attempt_once())
    }

    fn wait(&mut self, deadline: Instant) -> BoxFuture<'_, Result<Wake, LockError>> {
        Box::pin(self.wait_until(deadline))
    }
}

/// What keeps a held lock: its own connection, or its place on a carrier.
enum Kept<S: Sessions> {
    Own(S::Conn),
    Carried(CarriedLock<S>),
}

impl<S: Sessions> Kept<S> {
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
struct Monitor<S: Sessions> {
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

impl<S: Sessions> Monitor<S> {
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
                        if !matches!(tokio::time::timeout(bound, sessions.alive(conn)).await, Ok(true)) {
                            lost.fire(S::LOST);
                            return None;
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

impl<S: Sessions> Drop for Monitor<S> {
    fn drop(&mut self) {
        // Not released: the task drops what it keeps (its sender is gone), which frees the
        // lock.
        drop(self.stop.take());
    }
}

/// A granted lock: the monitor that keeps it.
struct SessionHeld<S: Sessions> {
    pool: Arc<Pool<S>>,
    name: Arc<str>,
    key: S::Key,
    monitor: Monitor<S>,
}

impl<S: Sessions> SessionHeld<S> {
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
async fn free<S: Sessions>(pool: &Pool<S>, name: &str, key: &S::Key, kept: Kept<S>) -> Result<(), LockError> {
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
async fn unlock<S: Sessions>(pool: &Pool<S>, name: &str, key: &S::Key, mut conn: S::Conn) -> Result<(), LockError> {
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

impl<S: Sessions> HeldLock for SessionHeld<S> {
    fn release(&mut self) -> BoxFuture<'_, Result<(), LockError>> {
        Box::pin(self.release_lock())
    }

    fn release_after(&mut self, remaining: Duration) -> BoxFuture<'_, Result<(), LockError>> {
        Box::pin(self.release_lock_after(remaining))
    }
}
