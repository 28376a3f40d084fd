//! [`MysqlBackend`] and how it takes, releases and watches a lock on one connection
//! ([`Sessions`]: `GET_LOCK`, a token from the counter row, a ping every heartbeat); the
//! acquisition and the held lock are the session skeleton's (`backend/session.rs`).

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use mysql_async::prelude::Queryable;
use mysql_async::{Conn, Opts};
use tokio::sync::OwnedMutexGuard;

use super::conn::MyConn;
pub use super::options::MysqlOptions;
use super::sql::{forced_sql, id_of, sweep_sql, token as token_of, MyKey, Recorded};
use super::{my_error, KIND};
use crate::backend::session::{Beat, Carrier, Carry, Failure, Idle, Pool, Sessions};
use crate::backend::{Acquire, Acquisition, BoxFuture, LockBackend};
use crate::error::LockError;
use crate::lost::LostSignal;

/// How MySQL takes, releases and watches a lock on one connection (see `session.rs` for the
/// rest).
pub(super) struct MySessions {
    opts: Opts,
    options: MysqlOptions,
    /// Dropped with the backend: the records sweeper ([`sweep_while_alive`]) stops at once.
    _sweeping: Option<tokio::sync::oneshot::Sender<()>>,
}

impl MySessions {
    async fn connect_once(&self, name: &str) -> Result<Conn, LockError> {
        match Conn::new(self.opts.clone()).await {
            Ok(conn) => Ok(conn),
            // MariaDB refuses a plaintext client with "Access denied" when it requires TLS.
            Err(mysql_async::Error::Server(e)) if e.code == 1045 && self.opts.ssl_opts().is_none() => {
                Err(LockError::backend(
                    name,
                    KIND,
                    "connect",
                    format!(
                        "{e} (over plaintext: a server that requires TLS, `require_secure_transport`, answers so too)"
                    ),
                ))
            }
            Err(e) => Err(my_error(name, "connect", e)),
        }
    }
}

impl MySessions {
    /// The rows `sql` answers, on an idle connection of `pool` (given back after) or a new one;
    /// an idle one the server closed meanwhile is replaced once.
    pub(super) async fn inspect(&self, pool: &Pool<MySessions>, sql: String) -> Result<Vec<Recorded>, LockError> {
        loop {
            let (conn, reused) = pool.checkout("").await?;
            let rows = match conn.lock().await.as_mut() {
                Some(open) => rows::<Recorded>(open, sql.clone()).await,
                None => continue,
            };
            match rows {
                Ok(rows) => {
                    pool.checkin(conn);
                    return Ok(rows);
                }
                Err(e) if reused && e.is_fatal() => continue,
                Err(e) => return Err(my_error("", "inspect", e)),
            }
        }
    }
}

/// The rows of the first result of `sql`.
async fn rows<T: mysql_async::prelude::FromRow + Send + 'static>(
    conn: &mut Conn,
    sql: String,
) -> Result<Vec<T>, mysql_async::Error> {
    let mut result = conn.query_iter(sql).await?;
    let rows = result.try_collect::<T>().await?;
    result.drop_result().await?;
    rows.into_iter()
        .map(|row| row.map_err(|e| mysql_async::Error::Other(format!("an unexpected answer: {e}").into())))
        .collect()
}

/// The connection a lock's query runs on, or [`Failure::Closed`] when it was closed.
fn open<'a>(conn: &'a mut Option<Conn>, name: &str, operation: &'static str) -> Result<&'a mut Conn, Failure> {
    conn.as_mut().ok_or_else(|| Failure::Closed(LockError::backend(name, KIND, operation, "the connection was closed")))
}

/// `GET_LOCK` on `conn` and, granted, the token and the holder's record, drawn on the same
/// session in one more round trip ([`MyKey::grant`]): `Some(token)`, `None` (not granted).
async fn get_lock(conn: &mut Conn, key: &MyKey, wait: Option<Duration>) -> Result<Option<u64>, Failure> {
    let (sql, operation) = key.get_lock(wait, "");
    match conn.query_first::<Option<i64>, _>(sql).await {
        Ok(Some(Some(1))) => {}
        Ok(Some(Some(_))) => return Ok(None),
        Ok(_) => {
            let why = "GET_LOCK answered NULL (the query was killed, or failed on the server)";
            return Err(Failure::Failed(LockError::backend(&*key.name, KIND, operation, why)));
        }
        Err(e) => return Err(failure(&key.name, operation, e)),
    }
    // Granted: the token and the record, on the same connection (a failure closes it, freeing
    // the lock).
    let granted = async {
        let result = conn.query_iter(key.grant()).await?;
        let token = result.last_insert_id();
        // The record's statement: the server refusing it (the table full, missing, not
        // allowed) does not fail the grant; a broken connection does.
        match result.drop_result().await {
            Err(mysql_async::Error::Server(e)) => super::sql::record_failed(&e),
            other => other?,
        }
        Ok::<_, mysql_async::Error>(token)
    };
    match granted.await {
        Ok(token) => token_of(&key.name, operation, token).map(Some),
        Err(e) => Err(failure(&key.name, operation, e)),
    }
}

/// `RELEASE_LOCK` on `conn` (and the session's record deleted): `true` when its session held
/// the lock.
async fn release_lock(conn: &mut Conn, key: &MyKey) -> Result<bool, Failure> {
    let answer = async {
        let mut result = conn.query_iter(key.release_lock()).await?;
        let released: Vec<Option<i64>> = result.collect().await?;
        result.drop_result().await?;
        Ok::<_, mysql_async::Error>(released.first() == Some(&Some(1)))
    };
    answer.await.map_err(|e| failure(&key.name, "release", e))
}

/// Runs `query` on `conn` in a task of its own, to its end even if the caller goes away. The
/// connection is taken in the caller's task before that task starts, so queries sent one after
/// another run in that order: an undo sent after a dropped attempt (from a task spawned later,
/// which may well run first) runs after the attempt's own query, never before it.
async fn to_the_end<T, Q>(
    conn: &MyConn,
    name: Arc<str>,
    operation: &'static str,
    query: impl FnOnce(OwnedMutexGuard<Option<Conn>>) -> Q,
) -> Result<T, Failure>
where
    T: Send + 'static,
    Q: std::future::Future<Output = Result<T, Failure>> + Send + 'static,
{
    let turn = conn.take_turn().await;
    match tokio::spawn(query(turn)).await {
        Ok(answer) => answer,
        Err(e) => Err(Failure::Failed(LockError::backend(&*name, KIND, operation, e))),
    }
}

/// How often a carrier that holds locks sweeps the holders' records of ended sessions (beside
/// the sweep of every new connection): records of killed carriers and cancelled grants are gone
/// within this, however long the service runs.
const SWEEP_EVERY: Duration = Duration::from_secs(30);

/// Deletes the holders' records no live session holds ([`sweep_sql`]): whether the server
/// answered (a refusal, such as a missing table, is said at `debug` only).
async fn sweep(conn: &mut Conn) -> bool {
    match conn.query_drop(sweep_sql()).await {
        Ok(()) => true,
        Err(mysql_async::Error::Server(e)) => {
            tracing::debug!(error = %e, "could not sweep the MySQL holders' records");
            true
        }
        Err(e) => {
            tracing::debug!(error = %e, "the MySQL holders' records sweep failed");
            false
        }
    }
}

/// The locks of `conn`'s session whose release an operator asked for, by server-side name and
/// owner ([`forced_sql`]); `None` when the connection did not answer (a refusal of the server,
/// such as a missing table, is an answer: none asked).
async fn forced(conn: &mut Conn) -> Option<Vec<(String, String)>> {
    match rows::<(Vec<u8>, Vec<u8>)>(conn, forced_sql()).await {
        Ok(rows) => Some(
            rows.into_iter()
                .map(|(name, owner)| {
                    (String::from_utf8_lossy(&name).into_owned(), String::from_utf8_lossy(&owner).into_owned())
                })
                .collect(),
        ),
        Err(mysql_async::Error::Server(_)) => Some(Vec::new()),
        Err(_) => None,
    }
}

/// Sweeps the holders' records every [`SWEEP_EVERY`] on an idle connection of `pool` (none is
/// opened for it, so a backend shut down or never used sweeps nothing), until the backend is
/// dropped (`stopped` then fires): the records of carriers killed while this process holds
/// nothing else go too.
fn sweep_while_alive(pool: &Arc<Pool<MySessions>>, mut stopped: tokio::sync::oneshot::Receiver<()>) {
    let Ok(runtime) = tokio::runtime::Handle::try_current() else { return };
    let pool = Arc::downgrade(pool);
    runtime.spawn(async move {
        loop {
            tokio::select! {
                _ = tokio::time::sleep(SWEEP_EVERY) => {}
                _ = &mut stopped => return,
            }
            let Some(pool) = pool.upgrade() else { return };
            let Some(conn) = pool.take_idle() else { continue };
            let bound = pool.sessions.options.operation_timeout;
            let swept = tokio::time::timeout(bound, async {
                match conn.lock().await.as_mut() {
                    Some(open) => sweep(open).await,
                    None => false,
                }
            })
            .await;
            if matches!(swept, Ok(true)) {
                pool.checkin(conn);
            }
        }
    });
}

/// A failed query: [`Failure::Closed`] when the connection is broken.
fn failure(name: &str, operation: &'static str, e: mysql_async::Error) -> Failure {
    if e.is_fatal() {
        Failure::Closed(my_error(name, operation, e))
    } else {
        Failure::Failed(my_error(name, operation, e))
    }
}

impl Sessions for MySessions {
    type Conn = MyConn;
    type Key = MyKey;
    const KIND: &'static str = KIND;
    const LOST: &'static str =
        "its MySQL connection was closed or stopped answering (the server frees the session's locks with it)";

    fn operation_timeout(&self) -> Duration {
        self.options.operation_timeout
    }

    fn max_idle(&self) -> usize {
        self.options.max_idle
    }

    fn key(&self, req: &Acquire) -> MyKey {
        MyKey::of(req, self.options.record_holders)
    }

    /// A new connection first sweeps the holders' records of sessions that ended (a carrier or
    /// connection opens after others were lost, so that is when stale records are likely).
    fn connect<'a>(&'a self, name: &'a str) -> BoxFuture<'a, Result<MyConn, LockError>> {
        Box::pin(async move {
            let mut conn = self.connect_once(name).await?;
            if self.options.record_holders {
                sweep(&mut conn).await;
            }
            Ok(MyConn::new(conn))
        })
    }

    fn is_closed(conn: &MyConn) -> bool {
        conn.is_closed()
    }

    fn lock<'a>(
        &'a self,
        conn: &'a mut MyConn,
        key: &'a MyKey,
        wait: Option<Duration>,
    ) -> BoxFuture<'a, Result<Option<u64>, Failure>> {
        Box::pin(async move {
            let mut conn = conn.lock().await;
            get_lock(open(&mut conn, &key.name, "attempt")?, key, wait).await
        })
    }

    fn unlock<'a>(&'a self, conn: &'a mut MyConn, key: &'a MyKey) -> BoxFuture<'a, Result<bool, Failure>> {
        Box::pin(async move {
            let mut conn = conn.lock().await;
            release_lock(open(&mut conn, &key.name, "release")?, key).await
        })
    }

    /// Ends connection `conn`'s running query from another connection (a waiter that was
    /// dropped: an idle one at once, else a new one), then lets `conn` go (closing it ends its
    /// session and anything it holds).
    fn cancel_and_close(sessions: &Arc<Self>, idle: &Arc<Idle<MyConn>>, conn: MyConn) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else { return drop(conn) };
        let (sessions, idle) = (sessions.clone(), idle.clone());
        runtime.spawn(async move {
            let bound = sessions.options.operation_timeout;
            let id = conn.id();
            let killed = tokio::time::timeout(bound, async {
                let other = match idle.take().filter(|c| !c.is_closed()) {
                    Some(other) => other,
                    None => MyConn::new(sessions.connect_once("").await?),
                };
                let answer = match other.lock().await.as_mut() {
                    Some(open) => open.query_drop(format!("KILL QUERY {id}")).await,
                    None => Ok(()),
                };
                match answer {
                    Ok(()) => idle.put(other, sessions.options.max_idle),
                    Err(e) => tracing::debug!(error = %e, "KILL QUERY of a dropped MySQL lock waiter"),
                }
                Ok::<(), LockError>(())
            })
            .await;
            if !matches!(killed, Ok(Ok(()))) {
                tracing::debug!("could not end a dropped MySQL lock waiter's query; closing its connection");
            }
            // Closed, not merely dropped: a grant that raced the kill is freed with the session
            // (the driver reads the waiter's answer, then says goodbye), within the bound.
            let open = conn.take_turn().await.take();
            if let Some(open) = open {
                let _ = tokio::time::timeout(bound, open.disconnect()).await;
            }
        });
    }

    /// The client tells nothing of a connection closed while idle: the heartbeat finds it (a
    /// carrier's own heartbeat, for the locks it carries, which closes it).
    fn closed<'a>(&'a self, conn: &'a MyConn) -> BoxFuture<'a, ()> {
        Box::pin(conn.ended())
    }

    fn heartbeat(&self) -> Option<Duration> {
        Some(self.options.heartbeat)
    }

    /// With records on, the heartbeat asks whether an operator asked for the lock to be freed
    /// (see `sql::mark_sql`): a connection of its own holds one lock, which is then freed.
    fn alive<'a>(&'a self, conn: &'a mut MyConn) -> BoxFuture<'a, Beat> {
        let records = self.options.record_holders;
        Box::pin(async move {
            match conn.lock().await.as_mut() {
                Some(open) if records => match forced(open).await {
                    Some(asked) if asked.is_empty() => Beat::Alive,
                    Some(_) => Beat::Forced,
                    None => Beat::Dead,
                },
                Some(open) => match open.ping().await {
                    Ok(()) => Beat::Alive,
                    Err(_) => Beat::Dead,
                },
                None => Beat::Dead,
            }
        })
    }
}

impl Carry for MySessions {
    fn carriers(&self) -> usize {
        self.options.multiplexing
    }

    fn carried(&self, key: &MyKey) -> Option<u64> {
        (self.options.multiplexing > 0).then_some(key.id)
    }

    /// Pings the carrier every heartbeat while it holds a lock; one found dead is closed,
    /// which fires `lost()` for every lock on it. An empty carrier is left alone (the server
    /// may close it when idle; the next attempt then opens another).
    fn serve_carrier(sessions: &Arc<Self>, carrier: std::sync::Weak<Carrier<Self>>) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else { return };
        let (every, bound) = (sessions.options.heartbeat, sessions.options.operation_timeout);
        let records = sessions.options.record_holders;
        // Every `SWEEP_EVERY` the beat sweeps the holders' records of ended sessions too.
        let sweep_every = (SWEEP_EVERY.as_millis() / every.as_millis().max(1)).max(1);
        let sessions = Arc::downgrade(sessions);
        runtime.spawn(async move {
            let mut beats = 0u128;
            loop {
                tokio::time::sleep(every).await;
                let Some(carrier) = carrier.upgrade() else { return };
                if !carrier.is_usable() {
                    return;
                }
                if !carrier.holds_any() {
                    continue;
                }
                beats += 1;
                let alive = tokio::time::timeout(bound, async {
                    match carrier.conn.lock().await.as_mut() {
                        Some(open) if records => {
                            let asked = forced(open).await;
                            if asked.is_some() && beats.is_multiple_of(sweep_every) {
                                sweep(open).await;
                            }
                            asked
                        }
                        Some(open) => open.ping().await.ok().map(|()| Vec::new()),
                        None => None,
                    }
                })
                .await;
                let Ok(Some(asked)) = alive else {
                    carrier.close();
                    return;
                };
                // An operator asked for these locks to be freed: each one alone, and only while
                // its holder is the owner asked about.
                let Some(sessions) = sessions.upgrade() else { return };
                for (name, owner) in asked {
                    let _ = carrier.force(&sessions, id_of(&name), |key| key.owner == owner).await;
                }
            }
        });
    }

    /// In a task of its own: the driver reads an answer in the query's future, so a caller
    /// that went away midway would leave the shared connection with an answer half read.
    fn try_carried<'a>(&'a self, conn: &'a MyConn, key: &'a MyKey) -> BoxFuture<'a, Result<Option<u64>, Failure>> {
        let key = key.clone();
        Box::pin(to_the_end(conn, key.name.clone(), "attempt", |mut conn| async move {
            get_lock(open(&mut conn, &key.name, "attempt")?, &key, None).await
        }))
    }

    /// In a task of its own, as [`try_carried`](Self::try_carried).
    fn unlock_carried<'a>(&'a self, conn: &'a MyConn, key: &'a MyKey) -> BoxFuture<'a, Result<bool, Failure>> {
        let key = key.clone();
        Box::pin(to_the_end(conn, key.name.clone(), "release", |mut conn| async move {
            release_lock(open(&mut conn, &key.name, "release")?, &key).await
        }))
    }

    fn abort(conn: &MyConn) {
        conn.abort();
    }
}

/// The MySQL/MariaDB lock store. Cheap to clone: clones share the idle connections. See the
/// [module docs](super) for how locks, waits, tokens and leases map onto the server.
#[derive(Clone)]
pub struct MysqlBackend {
    pub(super) pools: Pools,
}

/// Whose connections the locks are taken on.
#[derive(Clone)]
pub(super) enum Pools {
    /// The backend's own.
    Own(Arc<Pool<MySessions>>),
    /// The application's sqlx pool's ([`MysqlBackend::from_pool`]).
    #[cfg(feature = "sqlx")]
    App(Arc<Pool<super::app_pool::AppSessions>>),
}

impl fmt::Debug for MysqlBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut shown = f.debug_struct("MysqlBackend");
        match &self.pools {
            Pools::Own(pool) => {
                shown.field("host", &pool.sessions.opts.ip_or_hostname()).field("port", &pool.sessions.opts.tcp_port())
            }
            #[cfg(feature = "sqlx")]
            Pools::App(_) => shown.field("pool", &"the application's"),
        };
        shown.field("options", self.options()).finish()
    }
}

impl MysqlBackend {
    /// Connects to `url` (`mysql://user[:password]@host[:port]/database`) with the default
    /// [`MysqlOptions`].
    pub async fn connect(url: impl AsRef<str>) -> Result<Self, LockError> {
        Self::connect_with(url, MysqlOptions::new()).await
    }

    /// Connects to `url` with `options` and creates the fencing counter table and the holders'
    /// table if they are missing. Fails with an [`is_invalid`](LockError::is_invalid) error for a
    /// malformed URL, one without a database, or an option out of range, and an
    /// [`is_backend`](LockError::is_backend) error (with the server's message) when the server
    /// cannot be reached within the operation timeout or refuses.
    pub async fn connect_with(url: impl AsRef<str>, options: MysqlOptions) -> Result<Self, LockError> {
        let url = url.as_ref().trim();
        if options.operation_timeout.is_zero() || options.heartbeat.is_zero() {
            return Err(LockError::invalid("", "the MySQL operation timeout and heartbeat must be more than zero"));
        }
        if !(url.starts_with("mysql://") || url.starts_with("mariadb://")) {
            return Err(LockError::invalid("", "not a MySQL URL; give `mysql://user:password@host:port/database`"));
        }
        let url = url.replacen("mariadb://", "mysql://", 1);
        let opts = Opts::from_url(&url).map_err(|e| LockError::invalid("", format!("not a valid MySQL URL: {e}")))?;
        if opts.db_name().is_none_or(str::is_empty) {
            return Err(LockError::invalid(
                "",
                "the MySQL URL names no database (the fencing counter table lives in one)",
            ));
        }
        let opts = tls_opts(opts, &options)?;
        // Keep-alive on, no statement cache (text queries only), TCP as the URL says.
        let opts: Opts = mysql_async::OptsBuilder::from_opts(opts)
            .tcp_keepalive(Some(Duration::from_secs(10)))
            .stmt_cache_size(0)
            .prefer_socket(false)
            .into();
        let mut sessions = MySessions { opts, options, _sweeping: None };
        let bound = sessions.options.operation_timeout;
        let made = async {
            let mut conn = sessions.connect_once("").await?;
            let records = super::setup::setup(&mut conn, sessions.options.record_holders).await?;
            Ok::<_, LockError>((conn, records))
        };
        let shown = crate::backend::credentials::redact(&url);
        let (conn, records) = match tokio::time::timeout(bound, made).await {
            Ok(made) => made.map_err(|e| e.connecting_to(&shown))?,
            Err(_) => return Err(LockError::timed_out(&shown, KIND, "connect", bound)),
        };
        sessions.options.record_holders = records;
        let (sweeping, stopped) = tokio::sync::oneshot::channel();
        sessions._sweeping = records.then_some(sweeping);
        let pool = Arc::new(Pool::new(sessions));
        pool.checkin(MyConn::new(conn));
        if records {
            sweep_while_alive(&pool, stopped);
        }
        Ok(MysqlBackend { pools: Pools::Own(pool) })
    }

    /// Locks on connections of the application's sqlx `pool` (its TLS, credentials and
    /// limits), with the default [`MysqlOptions`]; features `mysql` and `sqlx`. See
    /// [`from_pool_with`](Self::from_pool_with).
    ///
    /// ```no_run
    /// # async fn demo(pool: sqlx::MySqlPool) -> Result<(), lock_runtime::LockError> {
    /// use lock_runtime::backend::mysql::MysqlBackend;
    ///
    /// let backend = MysqlBackend::from_pool(pool.clone()).await?;
    /// let manager = lock_runtime::LockManager::builder().backend(backend);
    /// # Ok(()) }
    /// ```
    #[cfg(feature = "sqlx")]
    #[cfg_attr(docsrs, doc(cfg(feature = "sqlx")))]
    pub async fn from_pool(pool: sqlx::MySqlPool) -> Result<Self, LockError> {
        Self::from_pool_with(pool, MysqlOptions::new()).await
    }

    /// Locks on connections of the application's sqlx `pool`, with `options` (TLS settings
    /// there are refused: the pool's own apply; `max_idle` does not apply: connections go back
    /// to the pool). A held lock keeps one of the pool's connections until its release (one whose
    /// session may hold a lock is closed instead of given back); a wait on the server keeps one
    /// while it waits, and **waits take at most half the pool** (`max_connections / 2`, at
    /// least one): a wait beyond them queues in the process, without a connection, in arrival
    /// order, until one ends or its own `wait` runs out. The rest stays for the application and
    /// for held locks. Every guarantee of [`connect_with`](Self::connect_with)
    /// holds: the same statements, heartbeat and `KILL QUERY` of a dropped waiter. Creates the
    /// fencing counter table and the holders' table if they are missing.
    #[cfg(feature = "sqlx")]
    #[cfg_attr(docsrs, doc(cfg(feature = "sqlx")))]
    pub async fn from_pool_with(pool: sqlx::MySqlPool, options: MysqlOptions) -> Result<Self, LockError> {
        if options.operation_timeout.is_zero() || options.heartbeat.is_zero() {
            return Err(LockError::invalid("", "the MySQL operation timeout and heartbeat must be more than zero"));
        }
        #[cfg(feature = "_tls")]
        if options.tls.is_some() {
            return Err(LockError::invalid("", "TLS settings were given beside a pool: the pool's own apply"));
        }
        let bound = options.operation_timeout;
        let setup = async {
            let mut conn = pool.acquire().await.map_err(|e| super::app_pool::error("", "connect", e))?;
            super::setup::setup(&mut conn, options.record_holders).await
        };
        let records = match tokio::time::timeout(bound, setup).await {
            Ok(records) => records?,
            Err(_) => return Err(LockError::timed_out("", KIND, "connect", bound)),
        };
        let options = options.record_holders(records);
        let sessions = super::app_pool::AppSessions { waits: crate::backend::app_conn::waits(&pool), pool, options };
        Ok(MysqlBackend { pools: Pools::App(Arc::new(Pool::new(sessions))) })
    }

    /// The options this backend was built with.
    pub fn options(&self) -> &MysqlOptions {
        match &self.pools {
            Pools::Own(pool) => &pool.sessions.options,
            #[cfg(feature = "sqlx")]
            Pools::App(pool) => &pool.sessions.options,
        }
    }

    /// How many idle connections are kept right now (none on the application's pool: its
    /// connections go back to it).
    pub fn idle_connections(&self) -> usize {
        match &self.pools {
            Pools::Own(pool) => pool.idle(),
            #[cfg(feature = "sqlx")]
            Pools::App(_) => 0,
        }
    }
}

/// `opts` with the TLS settings of `options` (and of the URL, `require_ssl=true`) on one rustls
/// stack: the platform's roots and the CAs given (not the client's built-in roots), the client
/// identity given.
#[cfg(feature = "_tls")]
fn tls_opts(opts: Opts, options: &MysqlOptions) -> Result<Opts, LockError> {
    use mysql_async::ClientIdentity;
    if options.tls.is_none() && opts.ssl_opts().is_none() {
        return Ok(opts);
    }
    let loaded = options.tls.clone().unwrap_or_default().load("")?;
    let pem = |text: &[u8]| text.to_vec().into();
    let identity = loaded.identity.as_ref().map(|(cert, key)| ClientIdentity::new(pem(cert), pem(key)));
    let ssl = opts
        .ssl_opts()
        .cloned()
        .unwrap_or_default()
        .with_disable_built_in_roots(true)
        .with_root_certs(vec![pem(&loaded.roots_pem())])
        .with_client_identity(identity);
    Ok(mysql_async::OptsBuilder::from_opts(opts).ssl_opts(Some(ssl)).into())
}

/// Without the feature `tls`, a URL that asks for TLS is refused.
#[cfg(not(feature = "_tls"))]
fn tls_opts(opts: Opts, _: &MysqlOptions) -> Result<Opts, LockError> {
    match opts.ssl_opts() {
        Some(_) => {
            Err(LockError::invalid("", "the MySQL URL asks for TLS (`require_ssl`): build with the feature `tls`"))
        }
        None => Ok(opts),
    }
}

impl LockBackend for MysqlBackend {
    fn name(&self) -> &'static str {
        KIND
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
        self.options().operation_timeout
    }

    /// With holders recorded (the default, [`MysqlOptions::record_holders`]).
    fn inspector(&self) -> Option<&dyn crate::backend::Inspect> {
        self.options().record_holders.then_some(self as &dyn crate::backend::Inspect)
    }
}
