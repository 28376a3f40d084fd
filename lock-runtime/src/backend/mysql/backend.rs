//! [`MysqlBackend`], its connections, and the types it hands to the runtime: one
//! [`Acquisition`] per `lock()` call, owning its connection, and one [`HeldLock`] per granted
//! lock, whose connection a monitor task pings.

use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use mysql_async::prelude::Queryable;
use mysql_async::{Conn, Opts};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use super::{literal, lock_name, my_error, COUNTER, KIND};
use crate::backend::{Acquire, Acquisition, Attempt, BoxFuture, Grant, Held, HeldLock, Lease, LockBackend, Wake};
use crate::error::LockError;
use crate::lost::LostSignal;

/// Options of a [`MysqlBackend`].
///
/// ```
/// use std::time::Duration;
/// use lock_runtime::backend::mysql::MysqlOptions;
///
/// let options = MysqlOptions::new().operation_timeout(Duration::from_secs(2)).heartbeat(Duration::from_millis(500));
/// assert_eq!(options.get_operation_timeout(), Duration::from_secs(2));
/// ```
#[derive(Debug, Clone)]
pub struct MysqlOptions {
    operation_timeout: Duration,
    heartbeat: Duration,
    max_idle: usize,
    #[cfg(feature = "tls")]
    tls: Option<crate::tls::TlsOptions>,
}

impl Default for MysqlOptions {
    fn default() -> Self {
        MysqlOptions {
            operation_timeout: Duration::from_secs(5),
            heartbeat: Duration::from_secs(1),
            max_idle: 16,
            #[cfg(feature = "tls")]
            tls: None,
        }
    }
}

impl MysqlOptions {
    /// The defaults: operation timeout 5 s, heartbeat 1 s, 16 idle connections.
    pub fn new() -> Self {
        Self::default()
    }

    /// The longest one operation (connect, attempt, token, release) may take; a wait is
    /// bounded by its remaining time plus this. More than zero.
    pub fn operation_timeout(mut self, timeout: Duration) -> Self {
        self.operation_timeout = timeout;
        self
    }

    /// How often a held lock's connection is pinged: a connection found dead fires the lock's
    /// `lost()`. More than zero.
    pub fn heartbeat(mut self, heartbeat: Duration) -> Self {
        self.heartbeat = heartbeat;
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

    /// The heartbeat.
    pub fn get_heartbeat(&self) -> Duration {
        self.heartbeat
    }

    crate::options::tls_setters!(
        "The server's certificate and host name are checked; the URL's `verify_ca=false` or \
         `verify_identity=false` turn those checks off. A URL with `require_ssl=true` and no \
         settings here trusts the platform's roots.\n\n\
         ```\n\
         use lock_runtime::backend::mysql::MysqlOptions;\n\
         use lock_runtime::TlsOptions;\n\n\
         let options = MysqlOptions::new().tls(TlsOptions::new().ca_file(\"/etc/mysql/ca.pem\"));\n\
         assert!(options.get_tls().is_some());\n\
         ```"
    );
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

struct Shared {
    opts: Opts,
    options: MysqlOptions,
    idle: Mutex<Vec<Conn>>,
}

impl Shared {
    async fn connect(&self, name: &str) -> Result<Conn, LockError> {
        let bound = self.options.operation_timeout;
        match tokio::time::timeout(bound, Conn::new(self.opts.clone())).await {
            Ok(Ok(conn)) => Ok(conn),
            // MariaDB refuses a plaintext client with "Access denied" when it requires TLS.
            Ok(Err(mysql_async::Error::Server(e))) if e.code == 1045 && self.opts.ssl_opts().is_none() => {
                Err(LockError::backend(
                    name,
                    KIND,
                    "connect",
                    format!(
                        "{e} (over plaintext: a server that requires TLS, `require_secure_transport`, answers so too)"
                    ),
                ))
            }
            Ok(Err(e)) => Err(my_error(name, "connect", e)),
            Err(_) => Err(LockError::timed_out(name, KIND, "connect", bound)),
        }
    }

    /// An idle connection (`true`: reused, it may have been closed since) or a new one.
    async fn checkout(&self, name: &str) -> Result<(Conn, bool), LockError> {
        let idle = lock(&self.idle).pop();
        match idle {
            Some(conn) => Ok((conn, true)),
            None => Ok((self.connect(name).await?, false)),
        }
    }

    fn checkin(&self, conn: Conn) {
        let mut idle = lock(&self.idle);
        if idle.len() < self.options.max_idle {
            idle.push(conn);
        }
    }

    /// Ends connection `id`'s running query from another connection (a waiter that was
    /// dropped), then lets `conn` go (closing it ends its session and anything it holds).
    fn kill_and_close(self: &Arc<Self>, id: u32, conn: Conn) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else { return drop(conn) };
        let shared = self.clone();
        runtime.spawn(async move {
            let bound = shared.options.operation_timeout;
            let killed = tokio::time::timeout(bound, async {
                let (mut other, _) = shared.checkout("").await?;
                match other.query_drop(format!("KILL QUERY {id}")).await {
                    Ok(()) => shared.checkin(other),
                    Err(e) => tracing::debug!(error = %e, "KILL QUERY of a dropped MySQL lock waiter"),
                }
                Ok::<(), LockError>(())
            })
            .await;
            if !matches!(killed, Ok(Ok(()))) {
                tracing::debug!("could not end a dropped MySQL lock waiter's query; closing its connection");
            }
            drop(conn);
        });
    }

    /// The next fencing token, on `conn`: the counter row raised, its new value returned in
    /// the OK packet (`LAST_INSERT_ID(expr)`), one round trip.
    async fn token(&self, conn: &mut Conn) -> Result<Option<u64>, mysql_async::Error> {
        conn.query_drop(TOKEN_SQL).await?;
        Ok(conn.last_insert_id())
    }
}

/// The MySQL/MariaDB lock store. Cheap to clone: clones share the idle connections. See the
/// [module docs](super) for how locks, waits, tokens and leases map onto the server.
#[derive(Clone)]
pub struct MysqlBackend {
    shared: Arc<Shared>,
}

impl fmt::Debug for MysqlBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MysqlBackend")
            .field("host", &self.shared.opts.ip_or_hostname())
            .field("port", &self.shared.opts.tcp_port())
            .field("options", &self.shared.options)
            .finish()
    }
}

impl MysqlBackend {
    /// Connects to `url` (`mysql://user[:password]@host[:port]/database`) with the default
    /// [`MysqlOptions`].
    pub async fn connect(url: impl AsRef<str>) -> Result<Self, LockError> {
        Self::connect_with(url, MysqlOptions::new()).await
    }

    /// Connects to `url` with `options` and creates the fencing counter table if it is
    /// missing. Fails with an [`is_invalid`](LockError::is_invalid) error for a
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
        let shared = Shared { opts, options, idle: Mutex::new(Vec::new()) };
        let mut conn = shared.connect("").await?;
        setup(&shared, &mut conn).await?;
        shared.checkin(conn);
        Ok(MysqlBackend { shared: Arc::new(shared) })
    }

    /// The options this backend was built with.
    pub fn options(&self) -> &MysqlOptions {
        &self.shared.options
    }

    /// How many idle connections are kept right now.
    pub fn idle_connections(&self) -> usize {
        lock(&self.shared.idle).len()
    }
}

/// `opts` with the TLS settings of `options` (and of the URL, `require_ssl=true`) on one rustls
/// stack: the platform's roots and the CAs given (not the client's built-in roots), the client
/// identity given.
#[cfg(feature = "tls")]
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
#[cfg(not(feature = "tls"))]
fn tls_opts(opts: Opts, _: &MysqlOptions) -> Result<Opts, LockError> {
    match opts.ssl_opts() {
        Some(_) => {
            Err(LockError::invalid("", "the MySQL URL asks for TLS (`require_ssl`): build with the feature `tls`"))
        }
        None => Ok(opts),
    }
}

/// Raises the counter row, its new value in the OK packet's last insert id: above every
/// earlier token, and never below the server's clock in µs (so tokens keep increasing even if
/// the table is lost).
const TOKEN_SQL: &str = "UPDATE lock_runtime_fence_counter SET token = LAST_INSERT_ID(GREATEST(token + 1, \
                         CAST(UNIX_TIMESTAMP(NOW(6)) * 1000000 AS UNSIGNED))) WHERE id = 1";

/// Makes sure the counter table and its row exist (a least-privilege user needs them made
/// beforehand; then they are only used).
async fn setup(shared: &Shared, conn: &mut Conn) -> Result<(), LockError> {
    let bound = shared.options.operation_timeout;
    let exists = format!("SELECT COUNT(*) FROM {COUNTER} WHERE id = 1");
    let create = format!(
        "CREATE TABLE IF NOT EXISTS {COUNTER} (id TINYINT UNSIGNED PRIMARY KEY, token BIGINT UNSIGNED NOT NULL) \
         ENGINE=InnoDB; INSERT IGNORE INTO {COUNTER} VALUES (1, 0)"
    );
    let found = match tokio::time::timeout(bound, conn.query_first::<u64, _>(exists)).await {
        Ok(Ok(count)) => count == Some(1),
        Ok(Err(mysql_async::Error::Server(e))) if e.code == 1146 => false, // no such table yet
        Ok(Err(e)) => return Err(my_error("", "connect", e)),
        Err(_) => return Err(LockError::timed_out("", KIND, "connect", bound)),
    };
    if !found {
        match tokio::time::timeout(bound, conn.query_drop(create)).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => return Err(my_error("", "connect", e)),
            Err(_) => return Err(LockError::timed_out("", KIND, "connect", bound)),
        }
    }
    Ok(())
}

impl LockBackend for MysqlBackend {
    fn kind(&self) -> &'static str {
        KIND
    }

    fn begin(&self, req: Acquire, lost: LostSignal) -> Box<dyn Acquisition> {
        Box::new(MyAcquisition {
            shared: self.shared.clone(),
            literal: literal(&lock_name(&req.key)),
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

/// How a `GET_LOCK` on the acquisition's connection failed.
enum Failed {
    Server(mysql_async::Error),
    TimedOut(Duration),
    Connect(LockError),
}

/// One `lock()` call: owns its connection from the first attempt until it is granted (the
/// [`MyHeld`] owns it then) or dropped.
struct MyAcquisition {
    shared: Arc<Shared>,
    req: Acquire,
    /// The lock's server-side name as a SQL literal.
    literal: String,
    lost: Option<LostSignal>,
    conn: Option<Conn>,
    /// A query was sent and its answer not read (the future was dropped): the session may be
    /// waiting on the server, or hold the lock.
    in_flight: bool,
}

impl Drop for MyAcquisition {
    fn drop(&mut self) {
        if let Some(conn) = self.conn.take() {
            if self.in_flight {
                self.shared.kill_and_close(conn.id(), conn);
            } else {
                self.shared.checkin(conn);
            }
        }
    }
}

impl MyAcquisition {
    /// `GET_LOCK(name, timeout)` on the acquisition's connection, within `bound`: 1 granted,
    /// 0 not. A reused connection found closed is replaced once.
    async fn get_lock(&mut self, timeout: &str, bound: Duration) -> Result<bool, Failed> {
        let sql = format!("SELECT GET_LOCK({}, {timeout})", self.literal);
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
            let Some(conn) = self.conn.as_mut() else { continue };
            self.in_flight = true;
            let answer = tokio::time::timeout(bound, conn.query_first::<Option<i64>, _>(sql.as_str())).await;
            self.in_flight = false;
            match answer {
                Ok(Ok(Some(Some(1)))) => return Ok(true),
                Ok(Ok(Some(Some(_)))) => return Ok(false),
                Ok(Ok(_)) => {
                    // NULL: the query was killed or failed on the server.
                    self.conn = None;
                    return Err(Failed::Server(mysql_async::Error::Other("GET_LOCK answered NULL (killed?)".into())));
                }
                Err(_) => {
                    if let Some(conn) = self.conn.take() {
                        self.shared.kill_and_close(conn.id(), conn);
                    }
                    return Err(Failed::TimedOut(bound));
                }
                Ok(Err(e)) => {
                    self.conn = None; // unknown state: closing it frees whatever it holds
                    if e.is_fatal() && reused && !retried {
                        retried = true;
                        continue;
                    }
                    return Err(Failed::Server(e));
                }
            }
        }
    }

    fn error(&self, operation: &'static str, failed: Failed) -> LockError {
        match failed {
            Failed::Server(e) => my_error(&self.req.name, operation, e),
            Failed::TimedOut(bound) => LockError::timed_out(&*self.req.name, KIND, operation, bound),
            Failed::Connect(e) => e,
        }
    }

    /// Draws the token for the lock just taken and builds the grant; on failure the
    /// connection is closed, which frees the lock.
    async fn grant(&mut self, operation: &'static str) -> Result<Grant, LockError> {
        let granted_at = crate::clock::now();
        let Some(mut conn) = self.conn.take() else {
            return Err(LockError::backend(&*self.req.name, KIND, operation, "no connection after the grant"));
        };
        let bound = self.shared.options.operation_timeout;
        let token = match tokio::time::timeout(bound, self.shared.token(&mut conn)).await {
            Ok(Ok(Some(token))) => token,
            Ok(Ok(None)) => {
                return Err(LockError::backend(&*self.req.name, KIND, operation, "no fencing token in the answer"))
            }
            Ok(Err(e)) => return Err(my_error(&self.req.name, operation, e)),
            Err(_) => return Err(LockError::timed_out(&*self.req.name, KIND, operation, bound)),
        };
        let lease_end = match self.req.lease {
            Lease::Fixed(lease) => granted_at.checked_add(lease),
            Lease::Renewed(_) => None,
        };
        let lost = self.lost.take().unwrap_or_else(LostSignal::never);
        let monitor = Monitor::spawn(self.shared.clone(), conn, lease_end, lost);
        let held =
            MyHeld { shared: self.shared.clone(), name: self.req.name.clone(), literal: self.literal.clone(), monitor };
        Ok(Grant { fencing_token: token, granted_at: Some(granted_at), lock: Held::new(held) })
    }

    async fn attempt_once(&mut self) -> Result<Attempt, LockError> {
        match self.get_lock("0", self.shared.options.operation_timeout).await {
            Ok(true) => Ok(Attempt::Acquired(self.grant("attempt").await?)),
            Ok(false) => Ok(Attempt::Busy),
            Err(failed) => Err(self.error("attempt", failed)),
        }
    }

    async fn wait_until(&mut self, deadline: Instant) -> Result<Wake, LockError> {
        let remaining = deadline.saturating_duration_since(crate::clock::now());
        if remaining.is_zero() {
            return Ok(Wake::TimedOut);
        }
        let seconds = format!("{:.3}", remaining.as_secs_f64().max(0.001));
        let bound = remaining.saturating_add(self.shared.options.operation_timeout);
        match self.get_lock(&seconds, bound).await {
            Ok(true) => Ok(Wake::Acquired(self.grant("wait").await?)),
            Ok(false) if crate::clock::now() < deadline => Ok(Wake::Retry),
            Ok(false) => Ok(Wake::TimedOut),
            Err(failed) => Err(self.error("wait", failed)),
        }
    }
}

impl Acquisition for MyAcquisition {
    fn attempt(&mut self) -> BoxFuture<'_, Result<Attempt, LockError>> {
        Box::pin(self.attempt_once())
    }

    fn wait(&mut self, deadline: Instant) -> BoxFuture<'_, Result<Wake, LockError>> {
        Box::pin(self.wait_until(deadline))
    }
}

/// The task that keeps a held lock's connection: pings it every heartbeat (a dead one fires
/// `lost()`), closes it when a fixed lease ends, and gives it back to the release.
struct Monitor {
    stop: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<Option<Conn>>>,
}

impl Monitor {
    fn spawn(shared: Arc<Shared>, mut conn: Conn, lease_end: Option<Instant>, lost: LostSignal) -> Monitor {
        let (stop, mut stopped) = oneshot::channel::<()>();
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return Monitor { stop: None, task: None };
        };
        let task = runtime.spawn(async move {
            let (heartbeat, bound) = (shared.options.heartbeat, shared.options.operation_timeout);
            let lease_over = async {
                match lease_end {
                    Some(at) => tokio::time::sleep_until(at.into()).await,
                    None => std::future::pending().await,
                }
            };
            tokio::pin!(lease_over);
            loop {
                tokio::select! {
                    biased;
                    asked = &mut stopped => return asked.ok().map(|()| conn), // dropped: closing frees it
                    () = &mut lease_over => {
                        // Told before the session ends (a holder paused past its lease runs
                        // this late, and the runtime's own timer may not have run yet).
                        lost.fire("its fixed lease ended");
                        return None;
                    }
                    () = tokio::time::sleep(heartbeat) => {
                        if !matches!(tokio::time::timeout(bound, conn.ping()).await, Ok(Ok(()))) {
                            lost.fire("its MySQL connection was closed or stopped answering (the server frees the session's locks with it)");
                            return None;
                        }
                    }
                }
            }
        });
        Monitor { stop: Some(stop), task: Some(task) }
    }

    /// The connection back from the task, if it still holds the lock.
    async fn take(&mut self) -> Option<Conn> {
        let stop = self.stop.take()?;
        let _ = stop.send(());
        self.task.take()?.await.ok().flatten()
    }
}

impl Drop for Monitor {
    fn drop(&mut self) {
        // Unreleased: the task drops the connection (its sender is gone), which frees the lock.
        drop(self.stop.take());
    }
}

/// A granted lock: the monitor that keeps its connection.
struct MyHeld {
    shared: Arc<Shared>,
    name: Arc<str>,
    literal: String,
    monitor: Monitor,
}

impl MyHeld {
    async fn conn(&mut self) -> Result<Conn, LockError> {
        self.monitor.take().await.ok_or_else(|| {
            LockError::lost(
                &*self.name,
                "its fixed lease had ended or its MySQL connection was lost (the session's locks went with it)",
            )
        })
    }

    async fn release_lock(&mut self) -> Result<(), LockError> {
        let conn = self.conn().await?;
        unlock(&self.shared, &self.name, &self.literal, conn).await
    }

    async fn release_lock_after(&mut self, remaining: Duration) -> Result<(), LockError> {
        let conn = self.conn().await?;
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            drop(conn);
            return Ok(());
        };
        let (shared, name, literal) = (self.shared.clone(), self.name.clone(), self.literal.clone());
        runtime.spawn(async move {
            tokio::time::sleep(remaining).await;
            if let Err(e) = unlock(&shared, &name, &literal, conn).await {
                tracing::debug!(error = %e, "unlock after hold_at_least");
            }
        });
        Ok(())
    }
}

/// `RELEASE_LOCK` on the holder's connection; the connection goes back to the idle set when
/// all went well, and is closed (freeing the lock) otherwise.
async fn unlock(shared: &Shared, name: &str, literal: &str, mut conn: Conn) -> Result<(), LockError> {
    let bound = shared.options.operation_timeout;
    let sql = format!("SELECT RELEASE_LOCK({literal})");
    match tokio::time::timeout(bound, conn.query_first::<Option<i64>, _>(sql)).await {
        Ok(Ok(Some(Some(1)))) => {
            shared.checkin(conn);
            Ok(())
        }
        Ok(Ok(_)) => Err(LockError::lost(name, "its MySQL session no longer held the lock")),
        Ok(Err(e)) if e.is_fatal() => {
            Err(LockError::lost(name, format!("its MySQL connection was lost (the session's locks went with it): {e}")))
        }
        Ok(Err(e)) => Err(my_error(name, "release", e)),
        Err(_) => Err(LockError::timed_out(name, KIND, "release", bound)),
    }
}

impl HeldLock for MyHeld {
    fn release(&mut self) -> BoxFuture<'_, Result<(), LockError>> {
        Box::pin(self.release_lock())
    }

    fn release_after(&mut self, remaining: Duration) -> BoxFuture<'_, Result<(), LockError>> {
        Box::pin(self.release_lock_after(remaining))
    }
}
