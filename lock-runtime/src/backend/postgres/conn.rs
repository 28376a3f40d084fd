//! One PostgreSQL connection of the backend ([`Conn`]) and what makes, closes and bounds it
//! ([`PgSessions`]): shared by the session skeleton's lock steps (`backend.rs`) and the
//! semaphores' waiting (`semaphore.rs`).

use std::time::Duration;

use tokio::sync::watch;
use tokio_postgres::{Client, Config, SimpleQueryMessage};

use super::options::PostgresOptions;
use super::tls::Connector;
use super::{pg_error, KIND, SEQUENCE};
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
}

impl Conn {
    pub(super) fn is_closed(&self) -> bool {
        self.client.is_closed() || *self.closed.borrow()
    }
}

/// How PostgreSQL takes, releases and watches a lock on one connection (see `session.rs` for
/// the rest).
pub(super) struct PgSessions {
    pub(super) config: Config,
    /// The TLS client of the connections and cancel requests (see `tls.rs`).
    pub(super) tls: Connector,
    pub(super) options: PostgresOptions,
    /// The server's version (`server_version_num`), read by the setup: a wait turns off
    /// `transaction_timeout` where the server has it (PostgreSQL 17), and has the server check
    /// its client's connection (`client_connection_check_interval`, PostgreSQL 14).
    pub(super) version: std::sync::OnceLock<u32>,
    /// The connections' `application_name` (printable ASCII, at most 30 bytes, quotes doubled):
    /// a holder's session shows it followed by ` t=<token>` (see `inspect.rs`).
    pub(super) app_name: String,
    /// Each lock held in a transaction of its own ([`PostgresOptions::transaction_pooling`],
    /// or a pooler seen sharing sessions at connect).
    pub(super) pooled: std::sync::atomic::AtomicBool,
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
        // Told closed when the task ends, aborted or not (the sender is dropped with it).
        let task = tokio::spawn(async move {
            if let Err(e) = connection.await {
                tracing::debug!(error = %e, "a PostgreSQL lock connection ended");
            }
            let _ = tx.send(true);
        })
        .abort_handle();
        Ok(Conn { client, closed, task, semaphore: None })
    }

    /// The expression that draws a grant's token into the session's `application_name`
    /// (`<name> t=<token>`), where `lockctl` reads it.
    pub(super) fn token_sql(&self) -> String {
        // In a held transaction, the name is the transaction's own (the pooler's server
        // connection goes back to others with its own name at the commit).
        let local = self.pooled();
        format!("set_config('application_name', '{} t=' || nextval('{SEQUENCE}'), {local})", self.app_name)
    }

    /// Whether each lock is held in a transaction of its own.
    pub(super) fn pooled(&self) -> bool {
        self.pooled.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// The statements that bound the wait of the implicit transaction they start to `wait`:
    /// only `lock_timeout` does (at least 1 ms: 0 would mean no limit). A `statement_timeout`
    /// (or PostgreSQL 17's `transaction_timeout`) of the server, role, database or URL shorter
    /// than the wait must not cut it. A waiter dropped while its query is on its way (its
    /// cancel request may reach the server first, and be lost) closes its connection: the
    /// server, checking it during the wait (`client_connection_check_interval`, PostgreSQL 14),
    /// ends the session within the interval instead of keeping the request queued.
    pub(super) fn wait_settings(&self, wait: Duration) -> String {
        let ms = wait.as_millis().clamp(1, i32::MAX as u128);
        let version = self.version.get().copied().unwrap_or(0);
        let transaction = match version >= 170_000 {
            true => "SELECT set_config('transaction_timeout', '0', true); ",
            false => "",
        };
        let check = match version >= 140_000 {
            true => "SELECT set_config('client_connection_check_interval', '500', true); ",
            false => "",
        };
        format!(
            "{transaction}{check}SELECT set_config('statement_timeout', '0', true); \
             SELECT set_config('lock_timeout', '{ms}ms', true); "
        )
    }

    /// Closes `conn` at once (its task aborted: the socket closes even with a query in flight)
    /// and asks the server to cancel its running query (a wait): the session then ends,
    /// freeing anything it holds.
    pub(super) fn close_now(&self, conn: Conn) {
        let token = conn.client.cancel_token();
        conn.task.abort();
        drop(conn);
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
            Err(e) if e.is_closed() || conn.is_closed() => Err(Failure::Closed(pg_error(name, operation, e))),
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
