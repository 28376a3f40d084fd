//! [`PostgresBackend`] and how it takes, releases and watches a lock on one connection
//! ([`Sessions`]); the acquisition and the held lock are the session skeleton's
//! (`backend/session.rs`).

use std::fmt;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use tokio_postgres::error::SqlState;
use tokio_postgres::{Config, SimpleQueryMessage};

use super::conn::{last_value, Conn, PgSessions};
use super::options::PostgresOptions;
use super::semaphore::Sem;
use super::tls;
use super::{advisory_key, pg_error, KIND, SEQUENCE};
use crate::backend::session::{Failure, Pool, Sessions};
use crate::backend::{Acquire, Acquisition, BoxFuture, LockBackend, LockKind};
use crate::error::LockError;
use crate::lost::LostSignal;

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
                return super::semaphore::lock(self, conn, (&key.name, &key.record), sem, wait).await;
            }
            let (a, b) = key.key;
            let shared = if key.shared { "_shared" } else { "" };
            // The token goes out as the session's `application_name` (`<name> t=<token>`), where
            // `lockctl` reads it; the query's leading comment stays in `pg_stat_activity`.
            let (record, token) = (&key.record, self.token_sql());
            // Held by a transaction of its own (for a transaction-mode pooler): opened here,
            // kept open while held, committed by the release; a refusal rolls it back.
            let pooled = self.pooled();
            let (begin, xact) = match pooled {
                true => ("BEGIN; SELECT set_config('idle_in_transaction_session_timeout', '0', true); ", "_xact"),
                false => ("", ""),
            };
            let (sql, operation) = match wait {
                None => (
                    format!(
                        "{record}{begin}SELECT CASE WHEN pg_try_advisory{xact}_lock{shared}({a}, {b}) THEN {token} END"
                    ),
                    "attempt",
                ),
                Some(wait) => {
                    let settings = self.wait_settings(wait);
                    let lock = format!("SELECT pg_advisory{xact}_lock{shared}({a}, {b}); SELECT {token}");
                    (format!("{record}{begin}{settings}{lock}"), "wait")
                }
            };
            let refused = |conn: &'a mut Conn| async move {
                match pooled {
                    true => Self::query(conn, &key.name, operation, "ROLLBACK").await.map(|_| None),
                    false => Ok(None),
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
                Err(e) if e.is_closed() || conn.is_closed() => Err(Failure::Closed(pg_error(&key.name, operation, e))),
                Err(e) => Err(Failure::Failed(pg_error(&key.name, operation, e))),
            }
        })
    }

    fn unlock<'a>(&'a self, conn: &'a mut Conn, key: &'a PgKey) -> BoxFuture<'a, Result<bool, Failure>> {
        Box::pin(async move {
            if self.pooled() {
                // The transaction that holds the lock, committed: its end is the lock's (and
                // its `application_name`'s). Answered, it held the lock until now.
                return Self::query(conn, &key.name, "release", "COMMIT").await.map(|_| true);
            }
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
        let app_name: String = config
            .get_application_name()
            .unwrap_or("lock-runtime")
            .chars()
            .filter(|c| (c.is_ascii_graphic() && *c != '\\') || *c == ' ')
            .take(30)
            .collect::<String>()
            .replace('\'', "''");
        let pooled = options.transaction_pooling.into();
        let sessions = PgSessions { config, tls, options, version: Default::default(), app_name, pooled };
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
        // A pooler in transaction mode shares server sessions: one client's successive
        // transactions on different ones, or two clients on one (never so with a direct
        // connection). Seen, each lock is held by a transaction of its own. Not seen proves
        // nothing (a pooler may happen to keep each client on its own session here): say
        // `transaction_pooling` when a pooler is in between.
        let other = self.pool.sessions.connect_once("").await?;
        let third = backend_pid(&other, bound).await?;
        if (first != second || third == first || third == second) && !self.pool.sessions.pooled() {
            tracing::info!(
                "the PostgreSQL sessions are shared (a pooler in transaction mode): each lock is held by a \
                 transaction of its own"
            );
            self.pool.sessions.pooled.store(true, std::sync::atomic::Ordering::Relaxed);
        }
        self.pool.checkin(other);
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

    /// Whether each lock is held by a transaction of its own: asked for
    /// ([`PostgresOptions::transaction_pooling`]), or a pooler was seen sharing sessions.
    pub fn transaction_pooling(&self) -> bool {
        self.pool.sessions.pooled()
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

impl LockBackend for PostgresBackend {
    fn kind(&self) -> &'static str {
        KIND
    }

    /// Every kind: mutexes and read-write locks (`pg_advisory_lock` and
    /// `pg_advisory_lock_shared`), semaphores of up to [`MAX_PERMITS`](super::MAX_PERMITS)
    /// permits (advisory keys tried in turn); no semaphores with
    /// [`transaction_pooling`](PostgresOptions::transaction_pooling).
    fn supports(&self, kind: LockKind) -> bool {
        match kind {
            LockKind::Exclusive | LockKind::Read | LockKind::Write => true,
            LockKind::Semaphore { .. } => !self.pool.sessions.pooled(),
        }
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
