//! One MySQL connection of the backend ([`MyConn`]): the driver's connection behind an async
//! mutex, so that a carrier (a connection shared by held locks, see `session/carrier.rs`) runs
//! one query at a time, and told ended when the backend closes it (the client tells nothing of
//! a connection closed while idle: heartbeats find those).

use std::sync::Arc;

use mysql_async::Conn;
use tokio::sync::{watch, Mutex, MutexGuard, OwnedMutexGuard};

pub(super) struct MyConn {
    /// `None` once closed by [`abort`](Self::abort).
    inner: Arc<Mutex<Option<Conn>>>,
    /// `true` once closed by [`abort`](Self::abort).
    ended: watch::Sender<bool>,
    /// The server's connection id (for `KILL QUERY`).
    id: u32,
}

impl MyConn {
    pub(super) fn new(conn: Conn) -> Self {
        let id = conn.id();
        MyConn { inner: Arc::new(Mutex::new(Some(conn))), ended: watch::Sender::new(false), id }
    }

    pub(super) fn id(&self) -> u32 {
        self.id
    }

    /// The connection, once the query before is done; `None` inside once closed.
    pub(super) async fn lock(&self) -> MutexGuard<'_, Option<Conn>> {
        self.inner.lock().await
    }

    /// The connection once the query before is done, for a task of its own: queries run in
    /// the order their callers asked (waiting turns are first come, first served).
    pub(super) async fn take_turn(&self) -> OwnedMutexGuard<Option<Conn>> {
        self.inner.clone().lock_owned().await
    }

    /// Whether it is known closed (a connection busy with a query is taken as open).
    pub(super) fn is_closed(&self) -> bool {
        *self.ended.borrow() || self.inner.try_lock().is_ok_and(|conn| conn.as_ref().is_none_or(Conn::is_disconnected))
    }

    /// Closes it as soon as the query on it (if any) is done, which ends its session and frees
    /// its locks; [`ended`](Self::ended) completes at once.
    pub(super) fn abort(&self) {
        self.ended.send_replace(true);
        let inner = self.inner.clone();
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                runtime.spawn(async move { drop(inner.lock().await.take()) });
            }
            Err(_) => {
                if let Ok(mut conn) = inner.try_lock() {
                    drop(conn.take());
                }
            }
        }
    }

    /// Completes once [`abort`](Self::abort) was called; cancel-safe.
    pub(super) async fn ended(&self) {
        let mut ended = self.ended.subscribe();
        let _ = ended.wait_for(|e| *e).await;
    }
}
