//! [`PostgresBackend`], its connections, and the types it hands to the runtime: one
//! [`Acquisition`] per `lock()` call, owning its connection, and one [`HeldLock`] per granted
//! lock.

use std::fmt;
use std::str::FromStr;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_postgres::error::SqlState;
use tokio_postgres::{Client, Config, SimpleQueryMessage};

use super::tls::{self, Connector};
use super::{advisory_key, pg_error, KIND, SEQUENCE};
use crate::backend::{Acquire, Acquisition, Attempt, BoxFuture, Grant, Held, HeldLock, Lease, LockBackend, Wake};
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

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// One connection (one server session).
struct Conn {
    client: Client,
    /// Becomes `true` when the connection's task ends (closed by either side, or failed).
    closed: watch::Receiver<bool>,
}

impl Conn {
    fn is_closed(&self) -> bool {
        self.client.is_closed() || *self.closed.borrow()
    }

    /// Drops the connection after asking the server to cancel its running query (a wait):
    /// the session then ends, freeing anything it holds.
    fn cancel_and_close(self, bound: Duration, tls: Connector) {
        let token = self.client.cancel_token();
        drop(self);
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                let _ = tokio::time::timeout(bound, token.cancel_query(tls)).await;
            });
        }
    }
}

struct Shared {
    config: Config,
    /// The TLS client of the connections and cancel requests (see `tls.rs`).
    tls: Connector,
    options: PostgresOptions,
    idle: Mutex<Vec<Conn>>,
}

impl Shared {
    /// The TLS client for one more connection or cancel request.
    #[allow(clippy::clone_on_copy)] // `NoTls`, a `Copy`, without the feature `tls`
    fn tls(&self) -> Connector {
        self.tls.clone()
    }

    async fn connect(&self, name: &str) -> Result<Conn, LockError> {
        let bound = self.options.operation_timeout;
        let (client, connection) = match tokio::time::timeout(bound, self.config.connect(self.tls())).await {
            Ok(Ok(pair)) => pair,
            Ok(Err(e)) => return Err(pg_error(name, "connect", e)),
            Err(_) => return Err(LockError::timed_out(name, KIND, "connect", bound)),
        };
        let (tx, closed) = watch::channel(false);
        tokio::spawn(async move {
            if let Err(e) = connection.await {
                tracing::debug!(error = %e, "a PostgreSQL lock connection ended");
            }
            let _ = tx.send(true);
        });
        Ok(Conn { client, closed })
    }

    /// An idle connection (`true`: reused, it may have been closed by the server since) or a
    /// new one.
    async fn checkout(&self, name: &str) -> Result<(Conn, bool), LockError> {
        loop {
            let conn = lock(&self.idle).pop();
            match conn {
                Some(conn) if conn.is_closed() => continue,
                Some(conn) => return Ok((conn, true)),
                None => return Ok((self.connect(name).await?, false)),
            }
        }
    }

    fn checkin(&self, conn: Conn) {
        if conn.is_closed() {
            return;
        }
        let mut idle = lock(&self.idle);
        if idle.len() < self.options.max_idle {
            idle.push(conn);
        }
    }
}

/// The PostgreSQL lock store. Cheap to clone: clones share the idle connections. See the
/// [module docs](super) for how locks, waits, tokens and leases map onto PostgreSQL.
#[derive(Clone)]
pub struct PostgresBackend {
    shared: Arc<Shared>,
}

impl fmt::Debug for PostgresBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PostgresBackend")
            .field("hosts", &self.shared.config.get_hosts())
            .field("options", &self.shared.options)
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
        let backend =
            PostgresBackend { shared: Arc::new(Shared { config, tls, options, idle: Mutex::new(Vec::new()) }) };
        backend.setup().await?;
        Ok(backend)
    }

    /// The first connection: detects a transaction-mode pooler, creates the sequence.
    async fn setup(&self) -> Result<(), LockError> {
        let conn = self.shared.connect("").await?;
        let bound = self.shared.options.operation_timeout;
        let (first, second) = (backend_pid(&conn, bound).await?, backend_pid(&conn, bound).await?);
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
                self.shared.checkin(conn);
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
        self.shared.checkin(conn);
        Ok(())
    }

    /// The options this backend was built with.
    pub fn options(&self) -> &PostgresOptions {
        &self.shared.options
    }

    /// How many idle connections are kept right now.
    pub fn idle_connections(&self) -> usize {
        lock(&self.shared.idle).len()
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
fn last_value(rows: &[SimpleQueryMessage]) -> Option<String> {
    rows.iter().rev().find_map(|m| match m {
        SimpleQueryMessage::Row(row) => Some(row.get(0).map(str::to_owned)),
        _ => None,
    })?
}

impl LockBackend for PostgresBackend {
    fn kind(&self) -> &'static str {
        KIND
    }

    fn begin(&self, req: Acquire, lost: LostSignal) -> Box<dyn Acquisition> {
        Box::new(PgAcquisition {
            shared: self.shared.clone(),
            key: advisory_key(&req.key),
            req,
            lost: Some(lost),
            conn: None,
            in_flight: false,
        })
    }

    fn operation_timeout(&self) -> Duration {
        self.shared.options.operation_timeout
    }
}

/// How a query on the acquisition's connection failed.
enum Failed {
    /// The server answered with an error (the connection was kept only for a lock timeout).
    Db(tokio_postgres::Error),
    /// Not answered within its bound (the connection was cancelled and closed).
    TimedOut(Duration),
    /// No connection could be had.
    Connect(LockError),
}

/// One `lock()` call: owns its connection from the first attempt until it is granted (the
/// [`PgHeld`] owns it then) or dropped.
struct PgAcquisition {
    shared: Arc<Shared>,
    req: Acquire,
    key: (i32, i32),
    lost: Option<LostSignal>,
    conn: Option<Conn>,
    /// A query was sent and its answer not read (the future was dropped): the session may be
    /// waiting on the server, or hold the lock.
    in_flight: bool,
}

impl Drop for PgAcquisition {
    fn drop(&mut self) {
        if let Some(conn) = self.conn.take() {
            if self.in_flight {
                conn.cancel_and_close(self.shared.options.operation_timeout, self.shared.tls());
            } else {
                self.shared.checkin(conn);
            }
        }
    }
}

impl PgAcquisition {
    /// Runs `sql` (simple protocol) on the acquisition's connection, within `bound`; the last
    /// row's first value. A reused connection found closed is replaced once.
    async fn query(&mut self, sql: &str, bound: Duration) -> Result<Option<String>, Failed> {
        let mut retried = false;
        loop {
            let reused = match self.conn {
                Some(_) => false,
                None => {
                    let (conn, reused) = self.shared.checkout(&self.req.name).await.map_err(Failed::Connect)?;
                    self.conn = Some(conn);
                    reused
                }
            };
            let Some(conn) = self.conn.as_ref() else { continue };
            self.in_flight = true;
            let answer = tokio::time::timeout(bound, conn.client.simple_query(sql)).await;
            self.in_flight = false;
            match answer {
                Ok(Ok(rows)) => return Ok(last_value(&rows)),
                Err(_) => {
                    if let Some(conn) = self.conn.take() {
                        conn.cancel_and_close(self.shared.options.operation_timeout, self.shared.tls());
                    }
                    return Err(Failed::TimedOut(bound));
                }
                Ok(Err(e)) => {
                    if e.code() == Some(&SqlState::LOCK_NOT_AVAILABLE) {
                        return Err(Failed::Db(e));
                    }
                    // Unknown state: closing the connection frees whatever its session holds.
                    self.conn = None;
                    if e.is_closed() && reused && !retried {
                        retried = true;
                        continue;
                    }
                    return Err(Failed::Db(e));
                }
            }
        }
    }

    fn error(&self, operation: &'static str, failed: Failed) -> LockError {
        match failed {
            Failed::Db(e) => pg_error(&self.req.name, operation, e),
            Failed::TimedOut(bound) => LockError::timed_out(&*self.req.name, KIND, operation, bound),
            Failed::Connect(e) => e,
        }
    }

    fn grant(&mut self, token: Option<String>, operation: &'static str) -> Result<Grant, LockError> {
        let granted_at = crate::clock::now();
        let token = token.and_then(|t| t.parse::<u64>().ok());
        let (Some(token), Some(conn)) = (token, self.conn.take()) else {
            // Cannot happen with a sane server; closing the connection frees the lock.
            self.conn = None;
            return Err(LockError::backend(&*self.req.name, KIND, operation, "no fencing token in the answer"));
        };
        let slot = Arc::new(Mutex::new(Some(conn)));
        let lease_end = match self.req.lease {
            Lease::Fixed(lease) => granted_at.checked_add(lease),
            Lease::Renewed(_) => None,
        };
        let lost = self.lost.take().unwrap_or_else(LostSignal::never);
        let monitor = spawn_monitor(slot.clone(), lease_end, lost);
        let held = PgHeld { shared: self.shared.clone(), name: self.req.name.clone(), key: self.key, slot, monitor };
        Ok(Grant { fencing_token: token, granted_at: Some(granted_at), lock: Held::new(held) })
    }

    async fn attempt_once(&mut self) -> Result<Attempt, LockError> {
        let (a, b) = self.key;
        let sql = format!("SELECT CASE WHEN pg_try_advisory_lock({a}, {b}) THEN nextval('{SEQUENCE}') END");
        let bound = self.shared.options.operation_timeout;
        match self.query(&sql, bound).await {
            Ok(Some(token)) => Ok(Attempt::Acquired(self.grant(Some(token), "attempt")?)),
            Ok(None) => Ok(Attempt::Busy),
            Err(failed) => Err(self.error("attempt", failed)),
        }
    }

    async fn wait_until(&mut self, deadline: Instant) -> Result<Wake, LockError> {
        let remaining = deadline.saturating_duration_since(crate::clock::now());
        if remaining.is_zero() {
            return Ok(Wake::TimedOut);
        }
        // `lock_timeout = 0` would mean "no limit": at least 1 ms.
        let ms = remaining.as_millis().clamp(1, i32::MAX as u128);
        let (a, b) = self.key;
        let sql = format!(
            "SELECT set_config('lock_timeout', '{ms}ms', true); SELECT pg_advisory_lock({a}, {b}); SELECT nextval('{SEQUENCE}')"
        );
        let bound = remaining.saturating_add(self.shared.options.operation_timeout);
        match self.query(&sql, bound).await {
            Ok(token) => Ok(Wake::Acquired(self.grant(token, "wait")?)),
            Err(Failed::Db(e)) if e.code() == Some(&SqlState::LOCK_NOT_AVAILABLE) => Ok(Wake::TimedOut),
            Err(failed) => Err(self.error("wait", failed)),
        }
    }
}

impl Acquisition for PgAcquisition {
    fn attempt(&mut self) -> BoxFuture<'_, Result<Attempt, LockError>> {
        Box::pin(self.attempt_once())
    }

    fn wait(&mut self, deadline: Instant) -> BoxFuture<'_, Result<Wake, LockError>> {
        Box::pin(self.wait_until(deadline))
    }
}

/// Watches a held lock's connection (its end fires `lost()`) and ends a fixed lease (closes
/// the connection, which frees the lock). Aborted by the release.
fn spawn_monitor(
    slot: Arc<Mutex<Option<Conn>>>,
    lease_end: Option<Instant>,
    lost: LostSignal,
) -> Option<JoinHandle<()>> {
    let mut closed = lock(&slot).as_ref()?.closed.clone();
    let runtime = tokio::runtime::Handle::try_current().ok()?;
    Some(runtime.spawn(async move {
        let lease_over = async {
            match lease_end {
                Some(at) => tokio::time::sleep_until(at.into()).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            _ = closed.wait_for(|c| *c) => {
                if lock(&slot).take().is_some() {
                    lost.fire("its PostgreSQL connection was closed (the server ended the session and its advisory locks)");
                }
            }
            _ = lease_over => {
                tracing::debug!("fixed lease over: closing the PostgreSQL lock connection");
                drop(lock(&slot).take());
            }
        }
    }))
}

/// A granted lock: its connection (the session that holds the advisory lock).
struct PgHeld {
    shared: Arc<Shared>,
    name: Arc<str>,
    key: (i32, i32),
    /// Taken by the release, by the monitor at the lease's end, or when the connection ends.
    slot: Arc<Mutex<Option<Conn>>>,
    monitor: Option<JoinHandle<()>>,
}

impl PgHeld {
    fn take(&mut self) -> Result<Conn, LockError> {
        if let Some(monitor) = self.monitor.take() {
            monitor.abort();
        }
        match lock(&self.slot).take() {
            Some(conn) if !conn.is_closed() => Ok(conn),
            _ => Err(LockError::lost(
                &*self.name,
                "its lease had ended or its PostgreSQL connection was closed (the session's locks went with it)",
            )),
        }
    }

    async fn release_lock(&mut self) -> Result<(), LockError> {
        let conn = self.take()?;
        unlock(&self.shared, &self.name, self.key, conn).await
    }

    async fn release_lock_after(&mut self, remaining: Duration) -> Result<(), LockError> {
        let conn = self.take()?;
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            tracing::warn!("released outside a tokio runtime: the PostgreSQL lock is freed at once");
            drop(conn);
            return Ok(());
        };
        let (shared, name, key) = (self.shared.clone(), self.name.clone(), self.key);
        runtime.spawn(async move {
            tokio::time::sleep(remaining).await;
            if let Err(e) = unlock(&shared, &name, key, conn).await {
                tracing::debug!(error = %e, "unlock after hold_at_least");
            }
        });
        Ok(())
    }
}

/// `pg_advisory_unlock` on the holder's connection; the connection goes back to the idle set
/// when all went well, and is closed (freeing the lock) otherwise.
async fn unlock(shared: &Shared, name: &str, (a, b): (i32, i32), conn: Conn) -> Result<(), LockError> {
    let bound = shared.options.operation_timeout;
    let sql = format!("SELECT pg_advisory_unlock({a}, {b})");
    match tokio::time::timeout(bound, conn.client.simple_query(&sql)).await {
        Ok(Ok(rows)) if last_value(&rows).as_deref() == Some("t") => {
            shared.checkin(conn);
            Ok(())
        }
        Ok(Ok(_)) => Err(LockError::lost(name, "its PostgreSQL session no longer held the advisory lock")),
        Ok(Err(e)) if e.is_closed() || conn.is_closed() => {
            Err(LockError::lost(name, "its PostgreSQL connection was closed (the session's locks went with it)"))
        }
        Ok(Err(e)) => Err(pg_error(name, "release", e)),
        Err(_) => Err(LockError::timed_out(name, KIND, "release", bound)),
    }
}

impl HeldLock for PgHeld {
    fn release(&mut self) -> BoxFuture<'_, Result<(), LockError>> {
        Box::pin(self.release_lock())
    }

    fn release_after(&mut self, remaining: Duration) -> BoxFuture<'_, Result<(), LockError>> {
        Box::pin(self.release_lock_after(remaining))
    }
}

impl Drop for PgHeld {
    fn drop(&mut self) {
        // Not released: closing the connection frees the lock.
        if let Some(monitor) = self.monitor.take() {
            monitor.abort();
        }
        drop(lock(&self.slot).take());
    }
}
