//! [`PostgresOptions`]: the settings of a [`PostgresBackend`](super::PostgresBackend).

use std::time::Duration;

/// Options of a [`PostgresBackend`](super::PostgresBackend).
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
    pub(super) operation_timeout: Duration,
    pub(super) max_idle: usize,
    pub(super) transaction_pooling: bool,
    pub(super) multiplexing: usize,
    #[cfg(feature = "_tls")]
    pub(super) tls: Option<crate::tls::TlsOptions>,
}

impl Default for PostgresOptions {
    fn default() -> Self {
        PostgresOptions {
            operation_timeout: Duration::from_secs(5),
            max_idle: 16,
            transaction_pooling: false,
            multiplexing: 4,
            #[cfg(feature = "_tls")]
            tls: None,
        }
    }
}

impl PostgresOptions {
    /// The defaults: operation timeout 5 s, 16 idle connections, session locks, held locks
    /// sharing up to 4 connections.
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

    /// Holds each lock in a transaction of its own (`pg_advisory_xact_lock`, the transaction
    /// open on the lock's connection until the release commits it), instead of in a session:
    /// for a pooler in transaction mode (PgBouncer's `pool_mode = transaction`), which hands
    /// every transaction to any server connection. Mutexes and read-write locks; semaphores
    /// need sessions and are refused. Default `false`; turned on by itself when
    /// [`connect_with`](super::PostgresBackend::connect_with) sees a pooler share sessions. See
    /// the [module docs](super) for what it guarantees and costs.
    ///
    /// ```
    /// use lock_runtime::backend::postgres::PostgresOptions;
    ///
    /// let options = PostgresOptions::new().transaction_pooling(true);
    /// assert!(options.get_transaction_pooling());
    /// ```
    pub fn transaction_pooling(mut self, on: bool) -> Self {
        self.transaction_pooling = on;
        self
    }

    /// Whether each lock is held in a transaction of its own (see
    /// [`transaction_pooling`](Self::transaction_pooling)).
    pub fn get_transaction_pooling(&self) -> bool {
        self.transaction_pooling
    }

    /// How many connections the uncontended locks a backend holds share (default 4): an
    /// acquisition is first tried on one of these carriers, beside the locks they hold; one
    /// that finds its lock busy waits on a connection of its own, and keeps it while it holds
    /// the lock. `0` gives every lock a connection of its own, as
    /// [`transaction_pooling`](Self::transaction_pooling) and semaphores always do. A carrier
    /// that closes (a server restart, an operator's kill) fires `lost()` for every lock on
    /// it. See the [module docs](super) for what each mode guarantees and costs.
    ///
    /// ```
    /// use lock_runtime::backend::postgres::PostgresOptions;
    ///
    /// assert_eq!(PostgresOptions::new().get_multiplexing(), 4);
    /// assert_eq!(PostgresOptions::new().multiplexing(0).get_multiplexing(), 0);
    /// ```
    pub fn multiplexing(mut self, carriers: usize) -> Self {
        self.multiplexing = carriers;
        self
    }

    /// How many connections held locks share (see [`multiplexing`](Self::multiplexing)).
    pub fn get_multiplexing(&self) -> usize {
        self.multiplexing
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
