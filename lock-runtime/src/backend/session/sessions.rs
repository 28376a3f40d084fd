//! What a store does on one connection ([`Sessions`]) and how an operation failed
//! ([`Failure`]): the contract between the session skeleton (`mod.rs`) and a store.

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use crate::backend::{Acquire, BoxFuture};
use crate::error::LockError;

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
    fn cancel_and_close(sessions: &Arc<Self>, idle: &Arc<Idle<Self::Conn>>, conn: Self::Conn);
    /// Completes once `conn` is known closed; cancel-safe.
    fn closed<'a>(&'a self, conn: &'a Self::Conn) -> BoxFuture<'a, ()>;
    /// How often a held lock's connection is asked whether it is [`alive`](Self::alive), if
    /// ever (a store whose client tells of a closed connection by itself needs no heartbeat).
    fn heartbeat(&self) -> Option<Duration> {
        None
    }
    /// The waits on the server this store allows at once, if bounded (an application's pool:
    /// a wait keeps one of its connections for as long as it waits). A wait beyond them gives
    /// its connection back and queues in the process, in arrival order, until one ends or its
    /// deadline comes.
    fn waits(&self) -> Option<&Arc<tokio::sync::Semaphore>> {
        None
    }
    /// Whether `conn` still answers, and whether its lock was asked to be freed.
    fn alive<'a>(&'a self, conn: &'a mut Self::Conn) -> BoxFuture<'a, Beat> {
        let _ = conn;
        Box::pin(std::future::ready(Beat::Alive))
    }
}

/// What a held lock's connection answered its heartbeat.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(not(any(feature = "mysql", feature = "sqlx")), allow(dead_code))] // PostgreSQL's own connections need none
pub(crate) enum Beat {
    Alive,
    /// Closed or not answering: its locks are gone.
    Dead,
    /// Answering, and an operator asked for its lock to be freed (a forced release the store
    /// cannot do from outside without ending other holders' locks: MySQL's).
    #[cfg_attr(not(feature = "mysql"), allow(dead_code))]
    Forced,
}

pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A backend's idle connections (from released locks), kept for the next acquisitions.
pub(crate) struct Idle<C> {
    conns: Mutex<Vec<C>>,
}

impl<C> Idle<C> {
    pub(crate) fn new() -> Self {
        Idle { conns: Mutex::new(Vec::new()) }
    }

    /// The last one kept, if any (the server may have closed it since).
    pub(crate) fn take(&self) -> Option<C> {
        lock(&self.conns).pop()
    }

    /// Keeps `conn` if fewer than `max` are kept.
    pub(crate) fn put(&self, conn: C, max: usize) {
        let mut conns = lock(&self.conns);
        if conns.len() < max {
            conns.push(conn);
        }
    }

    /// Drops every one kept.
    pub(crate) fn clear(&self) {
        let stale = std::mem::take(&mut *lock(&self.conns));
        drop(stale);
    }

    pub(crate) fn len(&self) -> usize {
        lock(&self.conns).len()
    }
}
