//! [`PostgresBackend`] and how it takes, releases and watches a lock on one connection
//! ([`Sessions`]); the acquisition and the held lock are the session skeleton's
//! (`backend/session.rs`).

use std::fmt;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use tokio_postgres::error::SqlState;
use tokio_postgres::{Config, SimpleQueryMessage};

use super::carrier;
use super::conn::{last_value, Conn, PgSessions};
use super::options::PostgresOptions;
use super::sql::{PgKey, PgSql};
use super::tls;
use super::{pg_error, KIND};
use crate::backend::session::{Carrier, Carry, Failure, Idle, Pool, Sessions};
use crate::backend::{Acquire, Acquisition, BoxFuture, LockBackend, LockKind};
use crate::error::LockError;
use crate::lost::LostSignal;

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
        self.sql.key(req)
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
                return super::semaphore::lock(self, conn, (&key.name, &key.record), sem, wait).await;
            }
            let (sql, operation) = self.sql.lock(key, wait);
            let refused = |conn: &'a mut Conn| async move {
                match self.sql.refused() {
                    Some(end) => Self::query(conn, &key.name, operation, end).await.map(|_| None),
                    None => Ok(None),
                }
            };
            match conn.client.simple_query(&sql).await {
                Ok(rows) => match last_value(&rows) {
                    None if wait.is_none() => refused(conn).await,
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
                Err(e) if e.code() == Some(&SqlState::LOCK_NOT_AVAILABLE) => refused(conn).await,
                Err(e) if conn.ended_by(&e) => Err(Failure::Closed(pg_error(&key.name, operation, e))),
                Err(e) => Err(Failure::Failed(pg_error(&key.name, operation, e))),
            }
        })
    }

    fn unlock<'a>(&'a self, conn: &'a mut Conn, key: &'a PgKey) -> BoxFuture<'a, Result<bool, Failure>> {
        Box::pin(async move {
            let sql = match (&key.sem, conn.semaphore.take()) {
                (None, _) if self.pooled() => {
                    // The transaction that holds the lock, committed: its end is the lock's (and
                    // its `application_name`'s). Answered, it held the lock until now.
                    return Self::query(conn, &key.name, "release", "COMMIT").await.map(|_| true);
                }
                (None, _) => self.sql.unlock(key),
                (Some(_), Some(((a, b), (m0, m1)))) => format!(
                    "SELECT pg_advisory_unlock({a}, {b}) AND pg_advisory_unlock_shared({m0}, {m1}), \
                     set_config('application_name', '{}', false)",
                    self.app_name
                ),
                (Some(_), None) => return Ok(false),
            };
            Ok(Self::query(conn, &key.name, "release", &sql).await?.as_deref() == Some("t"))
        })
    }

    /// Closes the connection at once (its task aborted: the socket closes even with a query
    /// in flight) and asks the server to cancel its running query (a wait): the session then
    /// ends, freeing anything it holds. A cancel request that reaches the server before the
    /// query does is lost; the server then finds the connection closed during the wait
    /// (`client_connection_check_interval`, PostgreSQL 14 and later).
    fn cancel_and_close(sessions: &Arc<Self>, _: &Arc<Idle<Conn>>, conn: Conn) {
        sessions.close_now(conn);
    }

    fn closed<'a>(&'a self, conn: &'a Conn) -> BoxFuture<'a, ()> {
        let mut closed = conn.closed.clone();
        Box::pin(async move {
            let _ = closed.wait_for(|c| *c).await;
        })
    }
}

impl Carry for PgSessions {
    /// Up to [`PostgresOptions::multiplexing`] carriers; none in the transaction mode (a lock
    /// is a transaction there).
    fn carriers(&self) -> usize {
        if self.pooled() {
            0
        } else {
            self.options.multiplexing
        }
    }

    /// Mutexes and read-write locks; a semaphore's permits are tried in turn on a connection
    /// of its own.
    fn carried(&self, key: &PgKey) -> Option<u64> {
        (key.sem.is_none() && self.carriers() > 0).then(|| carrier::id(key))
    }

    fn open_carrier<'a>(&'a self, name: &'a str) -> BoxFuture<'a, Result<Conn, LockError>> {
        Box::pin(self.open_carrier_conn(name))
    }

    fn serve_carrier(sessions: &Arc<Self>, carrier: std::sync::Weak<Carrier<Self>>) {
        carrier::serve(sessions, carrier);
    }

    fn try_carried<'a>(&'a self, conn: &'a Conn, key: &'a PgKey) -> BoxFuture<'a, Result<Option<u64>, Failure>> {
        Box::pin(carrier::try_carried(conn, key))
    }

    fn unlock_carried<'a>(&'a self, conn: &'a Conn, key: &'a PgKey) -> BoxFuture<'a, Result<bool, Failure>> {
        Box::pin(carrier::unlock_carried(conn, key))
    }

    fn abort(conn: &Conn) {
        conn.abort();
    }
}

/// The PostgreSQL lock store. Cheap to clone: clones share the idle connections. See the
/// [module docs](super) for how locks, waits, tokens and leases map onto PostgreSQL.
#[derive(Clone)]
pub struct PostgresBackend {
    pools: Pools,
}

/// Whose connections the locks are taken on.
#[derive(Clone)]
enum Pools {
    /// The backend's own.
    Own(Arc<Pool<PgSessions>>),
    /// The application's sqlx pool's ([`PostgresBackend::from_pool`]).
    #[cfg(feature = "sqlx")]
    App(Arc<Pool<super::app_pool::AppSessions>>),
}

impl fmt::Debug for PostgresBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut shown = f.debug_struct("PostgresBackend");
        match &self.pools {
            Pools::Own(pool) => shown.field("hosts", &pool.sessions.config.get_hosts()),
            #[cfg(feature = "sqlx")]
            Pools::App(_) => shown.field("pool", &"the application's"),
        };
        shown.field("options", &self.sql().options).finish()
    }
}

impl PostgresBackend {
    /// Connects to `url` (`postgres://user[:password]@host[:port]/db[?options]`) with the
    /// default [`PostgresOptions`].
    pub async fn connect(url: impl AsRef<str>) -> Result<Self, LockError> {
        Self::connect_with(url, PostgresOptions::new()).await
    }

    /// Connects to `url` with `options`: holds each lock in a transaction of its own when the
    /// options say so ([`PostgresOptions::transaction_pooling`]) or the sessions are seen shared
    /// (a pooler in transaction mode), and creates the fencing sequence if it is missing. Fails
    /// with an [`is_invalid`](LockError::is_invalid) error for a malformed URL or an option out
    /// of range, and an [`is_backend`](LockError::is_backend) error when the server cannot be
    /// reached within the operation timeout.
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
        let sql = PgSql::new(options, config.get_application_name().unwrap_or("lock-runtime"));
        let sessions = PgSessions { config, tls, sql, listener: Default::default() };
        let pool = Arc::new(Pool::new(sessions));
        setup(&pool).await.map_err(|e| e.connecting_to(&crate::backend::credentials::redact(&url)))?;
        Ok(PostgresBackend { pools: Pools::Own(pool) })
    }

    /// Locks on connections of the application's sqlx `pool` (its TLS, credentials and
    /// limits), with the default [`PostgresOptions`]; features `postgres` and `sqlx`. See
    /// [`from_pool_with`](Self::from_pool_with).
    ///
    /// ```no_run
    /// # async fn demo(pool: sqlx::PgPool) -> Result<(), lock_runtime::LockError> {
    /// use lock_runtime::backend::postgres::PostgresBackend;
    ///
    /// let backend = PostgresBackend::from_pool(pool.clone()).await?;
    /// let manager = lock_runtime::LockManager::builder().backend(backend);
    /// let guard = manager.lock("order:42").await?;
    /// guard.release().await?;
    /// # Ok(()) }
    /// ```
    #[cfg(feature = "sqlx")]
    #[cfg_attr(docsrs, doc(cfg(feature = "sqlx")))]
    pub async fn from_pool(pool: sqlx::PgPool) -> Result<Self, LockError> {
        Self::from_pool_with(pool, PostgresOptions::new()).await
    }

    /// Locks on connections of the application's sqlx `pool`, with `options` (TLS settings
    /// there are refused: the pool's own apply). A held lock keeps one of the pool's connections
    /// until its release; a wait on the server keeps one while it waits, and **waits take at
    /// most half the pool** (`max_connections / 2`, at least one): a wait beyond them queues in
    /// the process, without a connection, in arrival order, until one ends or its own `wait`
    /// runs out (then it is busy, as any wait that ran out). The rest of the pool stays for the
    /// application and for held locks; a pool with none free is an error that says so. sqlx
    /// logs each statement slower than its `log_slow_statements` setting (1 s by default),
    /// which a wait on the server is: raise it on the pool's connect options, or filter the
    /// `sqlx::query` target. Every guarantee of [`connect_with`](Self::connect_with) holds (fencing from
    /// the same sequence, waiting on the server, read-write locks, inspection, the transaction
    /// mode for a pooler), but for what sqlx cannot do: `lost()` comes from a heartbeat
    /// (`SELECT 1` every second) instead of the connection's own notice, and a dropped waiter
    /// closes its connection instead of sending a cancel request (the server ends the wait
    /// within 500 ms on PostgreSQL 14 and later, at the wait's end before). No semaphores. A
    /// connection whose session may hold a lock is closed, never given back to the pool.
    #[cfg(feature = "sqlx")]
    #[cfg_attr(docsrs, doc(cfg(feature = "sqlx")))]
    pub async fn from_pool_with(pool: sqlx::PgPool, options: PostgresOptions) -> Result<Self, LockError> {
        use super::app_pool::{rows, AppSessions};
        if options.operation_timeout.is_zero() {
            return Err(LockError::invalid("", "the PostgreSQL operation timeout must be more than zero"));
        }
        #[cfg(feature = "_tls")]
        if options.get_tls().is_some() {
            return Err(LockError::invalid("", "TLS settings were given beside a pool: the pool's own apply"));
        }
        let bound = options.operation_timeout;
        let sql = PgSql::new(options, "lock-runtime");
        let setup = async {
            let mut conn = pool.acquire().await?;
            let _ = sql.version.set(conn.server_version_num().unwrap_or(0));
            let exists = rows(&mut conn, &PgSql::sequence_exists()).await?;
            if exists.first().and_then(|row| row.first()).map(String::as_str) != Some("t") {
                rows(&mut conn, &PgSql::create_sequence()).await?;
            }
            Ok::<_, sqlx::Error>(())
        };
        match tokio::time::timeout(bound, setup).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => return Err(super::app_pool::error("", "connect", e)),
            Err(_) => return Err(LockError::timed_out("", KIND, "connect", bound)),
        }
        let sessions = AppSessions { waits: crate::backend::app_conn::waits(&pool), pool, sql };
        Ok(PostgresBackend { pools: Pools::App(Arc::new(Pool::new(sessions))) })
    }

    /// The statements and their settings, whoever's the connections.
    fn sql(&self) -> &PgSql {
        match &self.pools {
            Pools::Own(pool) => &pool.sessions.sql,
            #[cfg(feature = "sqlx")]
            Pools::App(pool) => &pool.sessions.sql,
        }
    }
}

/// The first connection: detects a transaction-mode pooler, creates the sequence.
async fn setup(pool: &Arc<Pool<PgSessions>>) -> Result<(), LockError> {
    let conn = pool.sessions.connect_once("").await?;
    let bound = pool.sessions.options.operation_timeout;
    let (first, second) = (backend_pid(&conn, bound).await?, backend_pid(&conn, bound).await?);
    let version = match tokio::time::timeout(bound, conn.client.simple_query("SHOW server_version_num")).await {
        Ok(Ok(rows)) => last_value(&rows).and_then(|v| v.parse::<u32>().ok()).unwrap_or(0),
        Ok(Err(e)) => return Err(pg_error("", "connect", e)),
        Err(_) => return Err(LockError::timed_out("", KIND, "connect", bound)),
    };
    let _ = pool.sessions.version.set(version);
    // A pooler in transaction mode shares server sessions: one client's successive
    // transactions on different ones, or two clients on one (never so with a direct
    // connection). Seen, each lock is held by a transaction of its own. Not seen proves
    // nothing (a pooler may happen to keep each client on its own session here): say
    // `transaction_pooling` when a pooler is in between.
    let other = pool.sessions.connect_once("").await?;
    let third = backend_pid(&other, bound).await?;
    if (first != second || third == first || third == second) && !pool.sessions.pooled() {
        tracing::info!(
            "the PostgreSQL sessions are shared (a pooler in transaction mode): each lock is held by a \
                 transaction of its own"
        );
        pool.sessions.pooled.store(true, std::sync::atomic::Ordering::Relaxed);
    }
    pool.checkin(other);
    let exists = PgSql::sequence_exists();
    match tokio::time::timeout(bound, conn.client.simple_query(&exists)).await {
        Ok(Ok(rows)) if last_value(&rows).as_deref() == Some("t") => {
            pool.checkin(conn);
            return Ok(());
        }
        Ok(Ok(_)) => {}
        Ok(Err(e)) => return Err(pg_error("", "connect", e)),
        Err(_) => return Err(LockError::timed_out("", KIND, "connect", bound)),
    }
    let create = PgSql::create_sequence();
    match tokio::time::timeout(bound, conn.client.batch_execute(&create)).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => return Err(pg_error("", "connect", e)),
        Err(_) => return Err(LockError::timed_out("", KIND, "connect", bound)),
    }
    pool.checkin(conn);
    Ok(())
}

impl PostgresBackend {
    /// The options this backend was built with.
    pub fn options(&self) -> &PostgresOptions {
        &self.sql().options
    }

    /// Whether each lock is held by a transaction of its own: asked for
    /// ([`PostgresOptions::transaction_pooling`]), or a pooler was seen sharing sessions.
    pub fn transaction_pooling(&self) -> bool {
        self.sql().pooled()
    }

    /// Runs `sql` (simple protocol) on an idle or new connection, within the operation timeout:
    /// every row's columns as text (NULL as empty), for inspection.
    pub(super) async fn rows(&self, sql: &str) -> Result<Vec<Vec<String>>, LockError> {
        let bound = self.sql().options.operation_timeout;
        match &self.pools {
            Pools::Own(pool) => {
                let (conn, _) = pool.checkout("").await?;
                let rows = match tokio::time::timeout(bound, conn.client.simple_query(sql)).await {
                    Ok(Ok(messages)) => messages,
                    Ok(Err(e)) => return Err(pg_error("", "inspect", e)),
                    Err(_) => return Err(LockError::timed_out("", KIND, "inspect", bound)),
                };
                pool.checkin(conn);
                Ok(rows
                    .into_iter()
                    .filter_map(|m| match m {
                        SimpleQueryMessage::Row(row) => {
                            Some((0..row.len()).map(|i| row.get(i).unwrap_or_default().to_owned()).collect())
                        }
                        _ => None,
                    })
                    .collect())
            }
            #[cfg(feature = "sqlx")]
            Pools::App(pool) => {
                let asked = async {
                    let mut conn = pool.sessions.pool.acquire().await?;
                    super::app_pool::rows(&mut conn, sql).await
                };
                match tokio::time::timeout(bound, asked).await {
                    Ok(Ok(rows)) => Ok(rows),
                    Ok(Err(e)) => Err(super::app_pool::error("", "inspect", e)),
                    Err(_) => Err(LockError::timed_out("", KIND, "inspect", bound)),
                }
            }
        }
    }

    /// Every lock held on a carrier anywhere, with what its holder answered (none from an
    /// application's pool, which carries no locks).
    pub(super) async fn carried(&self) -> Result<Vec<carrier::CarriedRow>, LockError> {
        match &self.pools {
            Pools::Own(pool) => carrier::carried(&pool.sessions).await,
            #[cfg(feature = "sqlx")]
            Pools::App(_) => Ok(Vec::new()),
        }
    }

    /// A forced release of a carried lock (see `carrier.rs`).
    pub(super) async fn force_carried(
        &self,
        pid: i32,
        key: (i32, i32),
        owner: Option<&str>,
        shown: &str,
    ) -> Result<crate::backend::ForceRelease, LockError> {
        match &self.pools {
            Pools::Own(pool) => carrier::force(&pool.sessions, pid, key, owner, shown).await,
            #[cfg(feature = "sqlx")]
            Pools::App(_) => {
                Err(LockError::invalid("", "a carried lock is released by a backend of its own connections"))
            }
        }
    }

    /// How many idle connections are kept right now.
    pub fn idle_connections(&self) -> usize {
        match &self.pools {
            Pools::Own(pool) => pool.idle(),
            #[cfg(feature = "sqlx")]
            Pools::App(_) => 0,
        }
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

impl LockBackend for PostgresBackend {
    fn name(&self) -> &'static str {
        KIND
    }

    /// Every kind: mutexes and read-write locks (`pg_advisory_lock` and
    /// `pg_advisory_lock_shared`), semaphores of up to [`MAX_PERMITS`](super::MAX_PERMITS)
    /// permits (advisory keys tried in turn); no semaphores with
    /// [`transaction_pooling`](PostgresOptions::transaction_pooling).
    fn supports(&self, kind: LockKind) -> bool {
        match kind {
            LockKind::Exclusive | LockKind::Read | LockKind::Write => true,
            LockKind::Semaphore { .. } => matches!(self.pools, Pools::Own(_)) && !self.sql().pooled(),
        }
    }

    fn begin(&self, req: Acquire, lost: LostSignal) -> Box<dyn Acquisition> {
        match &self.pools {
            Pools::Own(pool) => pool.begin(req, lost),
            #[cfg(feature = "sqlx")]
            Pools::App(pool) => pool.begin(req, lost),
        }
    }

    /// Closes the idle connections and the carriers left empty (every lock's session ends).
    fn shutdown(&self) -> BoxFuture<'_, ()> {
        match &self.pools {
            Pools::Own(pool) => pool.shut_down(),
            #[cfg(feature = "sqlx")]
            Pools::App(pool) => pool.shut_down(),
        }
        Box::pin(std::future::ready(()))
    }

    fn operation_timeout(&self) -> Duration {
        self.sql().options.operation_timeout
    }

    fn inspector(&self) -> Option<&dyn crate::backend::Inspect> {
        Some(self)
    }
}
