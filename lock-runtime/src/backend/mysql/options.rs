//! [`MysqlOptions`]: the settings of a [`MysqlBackend`](super::MysqlBackend).

use std::time::Duration;

/// Options of a [`MysqlBackend`](super::MysqlBackend).
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
    pub(super) operation_timeout: Duration,
    pub(super) heartbeat: Duration,
    pub(super) max_idle: usize,
    pub(super) multiplexing: usize,
    pub(super) record_holders: bool,
    #[cfg(feature = "_tls")]
    pub(super) tls: Option<crate::tls::TlsOptions>,
}

impl Default for MysqlOptions {
    fn default() -> Self {
        MysqlOptions {
            operation_timeout: Duration::from_secs(5),
            heartbeat: Duration::from_secs(1),
            max_idle: 16,
            multiplexing: 4,
            record_holders: true,
            #[cfg(feature = "_tls")]
            tls: None,
        }
    }
}

impl MysqlOptions {
    /// The defaults: operation timeout 5 s, heartbeat 1 s, 16 idle connections, held locks
    /// sharing up to 4 connections.
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

    /// How many connections the uncontended locks a backend holds share (default 4): an
    /// acquisition is first tried on one of these carriers (`GET_LOCK(name, 0)` beside the
    /// locks they hold); one that finds its lock busy waits on a connection of its own, and
    /// keeps it while it holds the lock. Each carrier is pinged every heartbeat; one found
    /// dead fires `lost()` for every lock on it. `0` gives every lock a connection of its own.
    ///
    /// ```
    /// use lock_runtime::backend::mysql::MysqlOptions;
    ///
    /// assert_eq!(MysqlOptions::new().get_multiplexing(), 4);
    /// assert_eq!(MysqlOptions::new().multiplexing(0).get_multiplexing(), 0);
    /// ```
    pub fn multiplexing(mut self, carriers: usize) -> Self {
        self.multiplexing = carriers;
        self
    }

    /// Whether each grant records its holder for inspection (default `true`): the key, owner,
    /// holding process, token, connection and time, in the table `lock_runtime_holders`,
    /// written in the grant's second round trip (with the fencing counter) and deleted in the
    /// release's. It is what [`Inspect`](crate::backend::Inspect) reads (`lockctl --mysql`,
    /// an election's `leader()` and `observe()`): the server itself names no holder of a
    /// `GET_LOCK`. Off, a lock and release cost two statements fewer (about a fifth of their
    /// time in `examples/bench_local` on a loopback MariaDB), and the backend offers no
    /// inspection (`leader()` is refused with an `is_invalid()` error).
    ///
    /// ```
    /// use lock_runtime::backend::mysql::MysqlOptions;
    ///
    /// assert!(MysqlOptions::new().get_record_holders());
    /// assert!(!MysqlOptions::new().record_holders(false).get_record_holders());
    /// ```
    pub fn record_holders(mut self, record: bool) -> Self {
        self.record_holders = record;
        self
    }

    /// Whether grants record their holders (see [`record_holders`](Self::record_holders)).
    pub fn get_record_holders(&self) -> bool {
        self.record_holders
    }

    /// How many connections held locks share (see [`multiplexing`](Self::multiplexing)).
    pub fn get_multiplexing(&self) -> usize {
        self.multiplexing
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
