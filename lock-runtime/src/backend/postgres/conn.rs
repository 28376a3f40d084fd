//! One PostgreSQL connection of the backend ([`Conn`]) and what makes, closes and bounds it
//! ([`PgSessions`]): shared by the session skeleton's lock steps (`backend.rs`) and the
//! semaphores' waiting (`semaphore.rs`).

use tokio::sync::{mpsc, watch};
use tokio_postgres::{AsyncMessage, Client, Config, Notification, SimpleQueryMessage};

use super::sql::PgSql;
use super::tls::Connector;
use super::{pg_error, KIND};
use crate::backend::session::Failure;
use crate::error::LockError;

/// One connection (one server session).
pub(super) struct Conn {
    pub(super) client: Client,
    /// Becomes `true` when the connection's task ends (closed by either side, or failed).
    pub(super) closed: watch::Receiver<bool>,
    /// The connection's task: aborted to close the socket at once (a dropped waiter's, whose
    /// query would otherwise keep it open until the server answers).
    task: tokio::task::AbortHandle,
    /// The permit and the count's marker a semaphore holder's session holds (see
    /// `semaphore.rs`), for its release.
    pub(super) semaphore: Option<((i32, i32), (i32, i32))>,
    /// The notifications of the channels its session listens to (a carrier's, an
    /// inspection's: see `carrier.rs`); taken by whoever listens.
    pub(super) notifications: std::sync::Mutex<Option<mpsc::UnboundedReceiver<Notification>>>,
}

impl Conn {
    pub(super) fn is_closed(&self) -> bool {
        self.client.is_closed() || *self.closed.borrow()
    }

    /// Whether `e` (an answer on this connection) says that its session is gone: the
    /// connection closed, or the server's `FATAL` that ends a session (an operator's
    /// `pg_terminate_backend`, `57P01`; a shutdown), which can arrive as the answer to the
    /// next query before the connection is seen closed.
    pub(super) fn ended_by(&self, e: &tokio_postgres::Error) -> bool {
        e.is_closed()
            || self.is_closed()
            || e.as_db_error().is_some_and(|db| db.severity() == "FATAL" || db.code().code().starts_with("57P"))
    }

    /// Closes it at once (its task aborted: the socket closes even with queries in flight).
    pub(super) fn abort(&self) {
        self.task.abort();
    }

    /// The notifications of the channels its session listens to (once).
    pub(super) fn take_notifications(&self) -> Option<mpsc::UnboundedReceiver<Notification>> {
        self.notifications.lock().unwrap_or_else(std::sync::PoisonError::into_inner).take()
    }
}

/// The connection an inspection asks carriers on (see `carrier.rs`), with the notifications
/// of the channel it listens to (their answers).
pub(super) struct Listener {
    pub(super) conn: Conn,
    pub(super) answers: mpsc::UnboundedReceiver<Notification>,
}

/// How PostgreSQL takes, releases and watches a lock on one connection of its own (see
/// `session.rs` for the rest); the statements are [`PgSql`]'s.
pub(super) struct PgSessions {
    pub(super) config: Config,
    /// The TLS client of the connections and cancel requests (see `tls.rs`).
    pub(super) tls: Connector,
    pub(super) sql: PgSql,
    /// The connection inspections ask carriers on (see `carrier.rs`), made at the first.
    pub(super) listener: tokio::sync::Mutex<Option<Listener>>,
}

impl std::ops::Deref for PgSessions {
    type Target = PgSql;

    fn deref(&self) -> &PgSql {
        &self.sql
    }
}

impl PgSessions {
    /// The TLS client for one more connection or cancel request.
    #[allow(clippy::clone_on_copy)] // `NoTls`, a `Copy`, without the feature `tls`
    pub(super) fn tls(&self) -> Connector {
        self.tls.clone()
    }

    pub(super) async fn connect_once(&self, name: &str) -> Result<Conn, LockError> {
        let bound = self.options.operation_timeout;
        let (client, connection) = match tokio::time::timeout(bound, self.config.connect(self.tls())).await {
            Ok(Ok(pair)) => pair,
            Ok(Err(e)) => return Err(pg_error(name, "connect", e)),
            Err(_) => return Err(LockError::timed_out(name, KIND, "connect", bound)),
        };
        let (tx, closed) = watch::channel(false);
        let (notify, notifications) = mpsc::unbounded_channel();
        // Told closed when the task ends, aborted or not (the sender is dropped with it).
        let task = tokio::spawn(async move {
            let mut connection = connection;
            loop {
                match std::future::poll_fn(|cx| connection.poll_message(cx)).await {
                    Some(Ok(AsyncMessage::Notification(n))) => {
                        let _ = notify.send(n);
                    }
                    Some(Ok(_)) => {} // a notice (an unlock of a lock not held warns)
                    Some(Err(e)) => {
                        tracing::debug!(error = %e, "a PostgreSQL lock connection ended");
                        break;
                    }
                    None => break,
                }
            }
            let _ = tx.send(true);
        })
        .abort_handle();
        Ok(Conn { client, closed, task, semaphore: None, notifications: std::sync::Mutex::new(Some(notifications)) })
    }

    /// Closes `conn` at once (its task aborted: the socket closes even with a query in flight)
    /// and asks the server to cancel its running query (a wait): the session then ends,
    /// freeing anything it holds.
    pub(super) fn close_now(&self, conn: Conn) {
        let token = conn.client.cancel_token();
        conn.task.abort();
        drop(conn);
        if self.pooled() {
            // Through a transaction-mode pooler a cancel request can reach a server connection
            // already handed to another client, and cancel its query (PgBouncer #245, #684):
            // none is sent. The pooler closes the server connection of the closed client, and
            // the server ends the wait when it checks the client (500 ms).
            return;
        }
        let (bound, tls) = (self.options.operation_timeout, self.tls());
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                let _ = tokio::time::timeout(bound, token.cancel_query(tls)).await;
            });
        }
    }

    /// Runs `sql` (simple protocol) on `conn`: the last row's first value.
    pub(super) async fn query(
        conn: &Conn,
        name: &str,
        operation: &'static str,
        sql: &str,
    ) -> Result<Option<String>, Failure> {
        match conn.client.simple_query(sql).await {
            Ok(rows) => Ok(last_value(&rows)),
            Err(e) if conn.ended_by(&e) => Err(Failure::Closed(pg_error(name, operation, e))),
            Err(e) => Err(Failure::Failed(pg_error(name, operation, e))),
        }
    }
}

/// The first column of the last row of a simple query's answer.
pub(super) fn last_value(rows: &[SimpleQueryMessage]) -> Option<String> {
    rows.iter().rev().find_map(|m| match m {
        SimpleQueryMessage::Row(row) => Some(row.get(0).map(str::to_owned)),
        _ => None,
    })?
}
