//! [`PostgresBackend`] and how it takes, releases and watches a lock on one connection
//! ([`Sessions`]); the acquisition and the held lock are the session skeleton's
//! (`backend/session.rs`).

use std::fmt;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio_postgres::error::SqlState;
use tokio_postgres::{Client, Config, SimpleQueryMessage};

use super::semaphore::Sem;
use super::tls::{self, Connector};
use super::{advisory_key, pg_error, KIND, SEQUENCE};
use crate::backend::session::{Failure, Pool, Sessions};
use crate::backend::{Acquire, Acquisition, BoxFuture, LockBackend, LockKind};
use crate::error::LockError;
use crate::lost::LostSignal;

/// Options of a [`PostgresBackend`].
///
/// ```
/// use std::time::Duration;
/// use lock_runtime::backend::postgres::PostgresOptions;
///
/// let options = PostgresOptions::new().operation_timeout(Duration::from_secs(2)).max_idle(4);
/// assert_eq!(options.get_operation_timeout(), Duration::from_secs(2));
/// ```
#[derive(Debug, Clone)]
pub struct PostgresOptions {
    operation_timeout: Duration,
    max_idle: usize,
    #[cfg(feature = "tls")]
    tls: Option<crate::tls::TlsOptions>,
}

impl Default for PostgresOptions {
    fn default() -> Self {
        PostgresOptions {
            operation_timeout: Duration::from_secs(5),
            max_idle: 16,
            #[cfg(feature = "tls")]
            tls: None,
        }
    }
}

impl PostgresOptions {
    /// The defaults: operation timeout 5 s, 16 idle connections.
    pub fn new() -> Self {
        Self::default()
    }

    /// The longest one operation (connect, attempt, release) may take; a wait is bounded by
    /// its remaining time plus this. More than zero.
    pub fn operation_timeout(mut self, timeout: Duration) -> Self {
        self.operation_timeout = timeout;
        self
    }

    /// How many idle connections (from released locks) are kept for the next acquisitions.
    pub fn max_idle(mut self, max_idle: usize) -> Self {
        self.max_idle = max_idle;
        self
    }

    /// The operation timeout.
    pub fn get_operation_timeout(&self) -> Duration {
        self.operation_timeout
    }

    crate::options::tls_setters!(
        "The server's certificate and host name are checked (`verify-full`) unless the URL's \
         `sslmode` says otherwise; the URL's `sslrootcert`, `sslcert` and `sslkey` are added to \
         the settings. See the [module docs](super) for each mode.\n\n\
         ```\n\
         use lock_runtime::backend::postgres::PostgresOptions;\n\
         use lock_runtime::TlsOptions;\n\n\
         let options = PostgresOptions::new().tls(TlsOptions::new().ca_file(\"/etc/ssl/rds-ca.pem\"));\n\
         assert!(options.get_tls().is_some());\n\
         ```"
    );
}

/// One connection (one server session).
pub(super) struct Conn {
    pub(super) client: Client,
    /// Becomes `true` when the connection's task ends (closed by either side, or failed).
    closed: watch::Receiver<bool>,
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
    config: Config,
    /// The TLS client of the connections and cancel requests (see `tls.rs`).
    tls: Connector,
    options: PostgresOptions,
    /// The server's version (`server_version_num`), read by the setup: a wait turns off
    /// `transaction_timeout` where the server has it (PostgreSQL 17), and has the server check
    /// its client's connection (`client_connection_check_interval`, PostgreSQL 14).
    version: std::sync::OnceLock<u32>,
    /// The connections' `application_name` (printable ASCII, at most 30 bytes, quotes doubled):
    /// a holder's session shows it followed by ` t=<token>` (see `inspect.rs`).
    app_name: String,
}

impl PgSessions {
    /// The TLS client for one more connection or cancel request.
    #[allow(clippy::clone_on_copy)] // `NoTls`, a `Copy`, without the feature `tls`
    fn tls(&self) -> Connector {
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
        format!("set_config('application_name', '{} t=' || nextval('{SEQUENCE}'), false)", self.app_name)
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
    async fn query(conn: &Conn, name: &str, operation: &'static str, sql: &str) -> Result<Option<String>, Failure> {
        match conn.client.simple_query(sql).await {
            Ok(rows) => Ok(last_value(&rows)),
            Err(e) if e.is_closed() || conn.is_closed() => Err(Failure::Closed(pg_error(name, operation, e))),
            Err(e) => Err(Failure::Failed(pg_error(name, operation, e))),
        }
    }
}

/// A lock's advisory key, with its name for errors.
#[derive(Clone)]
pub(super) struct PgKey {
    pub(super) name: Arc<str>,
    key: (i32, i32),
    /// The shared side of a read-write lock (`pg_advisory_lock_shared`).
    shared: bool,
    /// The comment the grant's query starts with, which `lockctl` reads back from
    /// `pg_stat_activity` (see `inspect.rs`).
    pub(super) record: Arc<str>,
    /// A semaphore's keys (`key` is then its queue).
    sem: Option<Arc<Sem>>,
}

/// Appended to a read-write lock's key before it is hashed: its own advisory key, apart from
/// the mutex of the same name.
const RW_SUFFIX: &str = "\u{0}rw";

impl Sessions for PgSessions {
    type Conn = Conn;
    type Key = PgKey;
    const KIND: &'static str = KIND;
    const LOST: &'static str =
        "its PostgreSQL connection was closed (the server ended the session and its advisory locks)";

    fn operation_timeout(&self) -> Duration {
        self.options.operation_timeout
    }

    fn max_idle(&self) -> usize {
        self.options.max_idle
    }

    fn key(&self, req: &Acquire) -> PgKey {
        let record = super::inspect::record(req).into();
        match req.kind {
            // A read-write lock's two sides share one key of their own, apart from the mutex's.
            LockKind::Read | LockKind::Write => PgKey {
                name: req.name.clone(),
                key: advisory_key(&format!("{}{RW_SUFFIX}", req.key)),
                shared: req.kind == LockKind::Read,
                record,
                sem: None,
            },
            LockKind::Semaphore { permits } => {
                let sem = Sem::new(&req.key, permits);
                PgKey { name: req.name.clone(), key: sem.queue, shared: false, record, sem: Some(Arc::new(sem)) }
            }
            _ => PgKey { name: req.name.clone(), key: advisory_key(&req.key), shared: false, record, sem: None },
        }
    }

    fn connect<'a>(&'a self, name: &'a str) -> BoxFuture<'a, Result<Conn, LockError>> {
        Box::pin(self.connect_once(name))
    }

    fn is_closed(conn: &Conn) -> bool {
        conn.is_closed()
    }

    fn lock<'a>(
        &'a self,
        conn: &'a mut Conn,
        key: &'a PgKey,
        wait: Option<Duration>,
    ) -> BoxFuture<'a, Result<Option<u64>, Failure>> {
        Box::pin(async move {
            if let Some(sem) = &key.sem {
                return super::semaphore::lock(self, conn, key, sem, wait).await;
            }
            let (a, b) = key.key;
            let shared = if key.shared { "_shared" } else { "" };
            // The token goes out as the session's `application_name` (`<name> t=<token>`), where
            // `lockctl` reads it; the query's leading comment stays in `pg_stat_activity`.
            let (record, token) = (&key.record, self.token_sql());
            let (sql, operation) = match wait {
                None => (
                    format!("{record}SELECT CASE WHEN pg_try_advisory_lock{shared}({a}, {b}) THEN {token} END"),
                    "attempt",
                ),
                Some(wait) => {
                    let settings = self.wait_settings(wait);
                    (format!("{record}{settings}SELECT pg_advisory_lock{shared}({a}, {b}); SELECT {token}"), "wait")
                }
            };
            match conn.client.simple_query(&sql).await {
                Ok(rows) => match last_value(&rows) {
                    None if wait.is_none() => Ok(None),
                    token => match token.as_deref().and_then(super::inspect::token) {
                        Some(token) => Ok(Some(token)),
                        // Cannot happen with a sane server; closing the connection frees the lock.
                        None => Err(Failure::Failed(LockError::backend(
                            &*key.name,
                            KIND,
                            operation,
                            "no fencing token in the answer",
                        ))),
                    },
                },
                Err(e) if e.code() == Some(&SqlState::LOCK_NOT_AVAILABLE) => Ok(None),
                Err(e) if e.is_closed() || conn.is_closed() => Err(Failure::Closed(pg_error(&key.name, operation, e))),
                Err(e) => Err(Failure::Failed(pg_error(&key.name, operation, e))),
            }
        })
    }

    fn unlock<'a>(&'a self, conn: &'a mut Conn, key: &'a PgKey) -> BoxFuture<'a, Result<bool, Failure>> {
        Box::pin(async move {
            let app = &self.app_name;
            let unlock = match (&key.sem, conn.semaphore.take()) {
                (None, _) => {
                    let (a, b) = key.key;
                    let shared = if key.shared { "_shared" } else { "" };
                    format!("pg_advisory_unlock{shared}({a}, {b})")
                }
                (Some(_), Some(((a, b), (m0, m1)))) => {
                    format!("pg_advisory_unlock({a}, {b}) AND pg_advisory_unlock_shared({m0}, {m1})")
                }
                (Some(_), None) => return Ok(false),
            };
            let sql = format!("SELECT {unlock}, set_config('application_name', '{app}', false)");
            Ok(Self::query(conn, &key.name, "release", &sql).await?.as_deref() == Some("t"))
        })
    }

    /// Closes the connection at once (its task aborted: the socket closes even with a query
    /// in flight) and asks the server to cancel its running query (a wait): the session then
    /// ends, freeing anything it holds. A cancel request that reaches the server before the
    /// query does is lost; the server then finds the connection closed during the wait
    /// (`client_connection_check_interval`, PostgreSQL 14 and later).
    fn cancel_and_close(pool: &Arc<Pool<Self>>, conn: Conn) {
        pool.sessions.close_now(conn);
    }

    fn closed<'a>(&'a self, conn: &'a Conn) -> BoxFuture<'a, ()> {
        let mut closed = conn.closed.clone();
        Box::pin(async move {
            let _ = closed.wait_for(|c| *c).await;
        })
    }
}

/// The PostgreSQL lock store. Cheap to clone: clones share the idle connections. See the
/// [module docs](super) for how locks, waits, tokens and leases map onto PostgreSQL.
#[derive(Clone)]
pub struct PostgresBackend {
    pool: Arc<Pool<PgSessions>>,
}

impl fmt::Debug for PostgresBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PostgresBackend")
            .field("hosts", &self.pool.sessions.config.get_hosts())
            .field("options", &self.pool.sessions.options)
            .finish()
    }
}

impl PostgresBackend {
    /// Connects to `url` (`postgres://user[:password]@host[:port]/db[?options]`) with the
    /// default [`PostgresOptions`].
    pub async fn connect(url: impl AsRef<str>) -> Result<Self, LockError> {
        Self::connect_with(url, PostgresOptions::new()).await
    }

    /// Connects to `url` with `options`: checks that the server keeps sessions (no
    /// transaction-mode pooler in between) and creates the fencing sequence if it is missing.
    /// Fails with an [`is_invalid`](LockError::is_invalid) error for a malformed URL, an option
    /// out of range or a transaction-mode pooler, and an [`is_backend`](LockError::is_backend)
    /// error when the server cannot be reached within the operation timeout.
    pub async fn connect_with(url: impl AsRef<str>, options: PostgresOptions) -> Result<Self, LockError> {
        let url = url.as_ref().trim();
        if options.operation_timeout.is_zero() {
            return Err(LockError::invalid("", "the PostgreSQL operation timeout must be more than zero"));
        }
        if !(url.starts_with("postgres://") || url.starts_with("postgresql://")) {
            return Err(LockError::invalid("", "not a PostgreSQL URL; give `postgres://user@host:port/db`"));
        }
        let (url, params) = tls::split_url(url).map_err(|e| LockError::invalid("", e))?;
        let (tls, mode) = tls::connector(&params, &options, "").map_err(|e| LockError::invalid("", e))?;
        let mut config =
            Config::from_str(&url).map_err(|e| LockError::invalid("", format!("not a valid PostgreSQL URL: {e}")))?;
        config.ssl_mode(tls::ssl_mode(mode));
        if config.get_hosts().is_empty() {
            return Err(LockError::invalid("", "the PostgreSQL URL names no host"));
        }
        if config.get_connect_timeout().is_none() {
            config.connect_timeout(options.operation_timeout);
        }
        if config.get_application_name().is_none() {
            config.application_name("lock-runtime");
        }
        config.keepalives(true).keepalives_idle(Duration::from_secs(10));
        let app_name: String = config
            .get_application_name()
            .unwrap_or("lock-runtime")
            .chars()
            .filter(|c| (c.is_ascii_graphic() && *c != '\\') || *c == ' ')
            .take(30)
            .collect::<String>()
            .replace('\'', "''");
        let sessions = PgSessions { config, tls, options, version: Default::default(), app_name };
        let backend = PostgresBackend { pool: Arc::new(Pool::new(sessions)) };
        backend.setup().await?;
        Ok(backend)
    }

    /// The first connection: detects a transaction-mode pooler, creates the sequence.
    async fn setup(&self) -> Result<(), LockError> {
        let conn = self.pool.sessions.connect_once("").await?;
        let bound = self.pool.sessions.options.operation_timeout;
        let (first, second) = (backend_pid(&conn, bound).await?, backend_pid(&conn, bound).await?);
        let version = match tokio::time::timeout(bound, conn.client.simple_query("SHOW server_version_num")).await {
            Ok(Ok(rows)) => last_value(&rows).and_then(|v| v.parse::<u32>().ok()).unwrap_or(0),
            Ok(Err(e)) => return Err(pg_error("", "connect", e)),
            Err(_) => return Err(LockError::timed_out("", KIND, "connect", bound)),
        };
        let _ = self.pool.sessions.version.set(version);
        if first != second {
            return Err(LockError::invalid(
                "",
                "successive transactions ran on different PostgreSQL sessions (a pooler in transaction mode?): \
                 session advisory locks need a direct connection or a session-mode pooler",
            ));
        }
        // A sequence made beforehand is only used: a least-privilege role (`USAGE` on it, no
        // `CREATE` on the schema) cannot run even `CREATE SEQUENCE IF NOT EXISTS`.
        let exists = format!("SELECT to_regclass('{SEQUENCE}') IS NOT NULL");
        match tokio::time::timeout(bound, conn.client.simple_query(&exists)).await {
            Ok(Ok(rows)) if last_value(&rows).as_deref() == Some("t") => {
                self.pool.checkin(conn);
                return Ok(());
            }
            Ok(Ok(_)) => {}
            Ok(Err(e)) => return Err(pg_error("", "connect", e)),
            Err(_) => return Err(LockError::timed_out("", KIND, "connect", bound)),
        }
        // Serialised by a transaction-scoped advisory lock (single-bigint key space, never one
        // of the locks' two-int keys): concurrent `CREATE SEQUENCE IF NOT EXISTS` can collide.
        let create = format!(
            "BEGIN; SELECT pg_advisory_xact_lock(7226519712410372941); CREATE SEQUENCE IF NOT EXISTS {SEQUENCE}; COMMIT"
        );
        match tokio::time::timeout(bound, conn.client.batch_execute(&create)).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => return Err(pg_error("", "connect", e)),
            Err(_) => return Err(LockError::timed_out("", KIND, "connect", bound)),
        }
        self.pool.checkin(conn);
        Ok(())
    }

    /// The options this backend was built with.
    pub fn options(&self) -> &PostgresOptions {
        &self.pool.sessions.options
    }

    /// Runs `sql` (simple protocol) on an idle or new connection, within the operation timeout:
    /// its rows (for inspection).
    pub(super) async fn rows(&self, sql: &str) -> Result<Vec<tokio_postgres::SimpleQueryRow>, LockError> {
        let (conn, _) = self.pool.checkout("").await?;
        let bound = self.pool.sessions.options.operation_timeout;
        let rows = match tokio::time::timeout(bound, conn.client.simple_query(sql)).await {
            Ok(Ok(messages)) => messages,
            Ok(Err(e)) => return Err(pg_error("", "inspect", e)),
            Err(_) => return Err(LockError::timed_out("", KIND, "inspect", bound)),
        };
        self.pool.checkin(conn);
        Ok(rows
            .into_iter()
            .filter_map(|m| match m {
                SimpleQueryMessage::Row(row) => Some(row),
                _ => None,
            })
            .collect())
    }

    /// How many idle connections are kept right now.
    pub fn idle_connections(&self) -> usize {
        self.pool.idle()
    }
}

/// The server's process id for the session `conn` is on right now (one transaction).
async fn backend_pid(conn: &Conn, bound: Duration) -> Result<Option<String>, LockError> {
    match tokio::time::timeout(bound, conn.client.simple_query("SELECT pg_backend_pid()")).await {
        Ok(Ok(rows)) => Ok(last_value(&rows)),
        Ok(Err(e)) => Err(pg_error("", "connect", e)),
        Err(_) => Err(LockError::timed_out("", KIND, "connect", bound)),
    }
}

/// The first column of the last row of a simple query's answer.
pub(super) fn last_value(rows: &[SimpleQueryMessage]) -> Option<String> {
    rows.iter().rev().find_map(|m| match m {
        SimpleQueryMessage::Row(row) => Some(row.get(0).map(str::to_owned)),
        _ => None,
    })?
}

impl LockBackend for PostgresBackend {
    fn kind(&self) -> &'static str {
        KIND
    }

    /// Every kind: mutexes and read-write locks (`pg_advisory_lock` and
    /// `pg_advisory_lock_shared`), semaphores of up to [`MAX_PERMITS`](super::MAX_PERMITS)
    /// permits (advisory keys tried in turn).
    fn supports(&self, kind: LockKind) -> bool {
        matches!(kind, LockKind::Exclusive | LockKind::Read | LockKind::Write | LockKind::Semaphore { .. })
    }

    fn begin(&self, req: Acquire, lost: LostSignal) -> Box<dyn Acquisition> {
        self.pool.begin(req, lost)
    }

    fn operation_timeout(&self) -> Duration {
        self.pool.sessions.options.operation_timeout
    }

    fn inspector(&self) -> Option<&dyn crate::backend::Inspect> {
        Some(self)
    }
}
