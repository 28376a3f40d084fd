//! [`LockError`]: the one error type of the crate.

use std::time::Duration;

/// A boxed error from a backend's client library, kept as the [`source`](std::error::Error::source).
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// Everything that can go wrong when taking, holding or releasing a lock.
///
/// Every message names the lock and says what to do next. Match on the class with the
/// `is_*` methods rather than on the message:
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// let manager = lock_runtime::LockManager::memory();
/// let err = manager.lock("").await.unwrap_err();
/// assert!(err.is_invalid());
/// assert!(err.to_string().starts_with("invalid input: "));
/// # }
/// ```
#[derive(Debug)]
#[non_exhaustive]
pub enum LockError {
    /// The lock was not acquired within the whole `wait` (or all `retry` attempts): someone
    /// else held it, or (`held: false`) nobody did but contenders split a quorum store's votes.
    Contended {
        /// The lock's name (without the manager prefix).
        name: String,
        /// How long the call waited.
        waited: Duration,
        /// How many acquisition attempts were made.
        attempts: u32,
        /// Whether the last attempt found the lock held by another owner. `false` when the
        /// nodes of a quorum store (Redlock) that answered were split between contenders and no
        /// owner held a majority of them ([`Attempt::Split`](crate::backend::Attempt::Split)):
        /// nobody held it, and a later try may win.
        held: bool,
    },
    /// The lease ran out, or the lock was taken away, while it was held.
    Lost {
        /// The lock's name (without the manager prefix).
        name: String,
        /// What the runtime observed.
        reason: String,
    },
    /// The backend failed or could not be reached within its time bound.
    Backend {
        /// The lock's name (without the manager prefix).
        name: String,
        /// Which backend (`"memory"`, `"redis"`, `"zookeeper"`, …).
        backend: &'static str,
        /// What was being done (`"acquire"`, `"release"`, `"connect"`, …).
        operation: &'static str,
        /// The client library's error.
        source: BoxError,
    },
    /// Bad input: an empty or over-long name, a zero or absurd duration, a malformed URL, ….
    Invalid {
        /// The lock's name (without the manager prefix), or the URL/host string being parsed.
        name: String,
        /// What is wrong and what is accepted.
        reason: String,
    },
    /// A write was refused by a fence ([`crate::fence`]): a newer holder of the lock had already
    /// written to the resource with a higher fencing token, so this holder's lock is gone.
    Fenced {
        /// The resource the write was for (the name given to the fence).
        name: String,
        /// The token the refused write carried.
        token: u64,
        /// The highest token the fence had recorded for the resource.
        highest: u64,
    },
    /// A write's transaction conflicted with a concurrent one (PostgreSQL's
    /// `serialization_failure`, SQLSTATE 40001, or `deadlock_detected`, 40P01): at REPEATABLE
    /// READ or SERIALIZABLE, a fence row changed after the transaction's snapshot. Nothing of
    /// the transaction is kept: roll it back and run it again. A retry whose token is the
    /// newest is admitted; a stale one is then [`Fenced`](LockError::Fenced).
    Conflict {
        /// The resource the write was for (the name given to the fence).
        name: String,
        /// The server's code (`40001`, `40P01`).
        sqlstate: String,
        /// The server's message.
        message: String,
    },
    /// The manager was shut down ([`LockManager::shutdown`](crate::LockManager::shutdown)):
    /// it takes no lock any more, and a wait or a campaign under way ended.
    ShutDown {
        /// The lock's name.
        name: String,
    },
    /// The attribute found no manager.
    NotConfigured {
        /// The lock's name.
        name: String,
    },
}

/// One sentence that names what the error is about, the cause, and what to do next. The cause
/// of a backend failure is in it; [`source`](std::error::Error::source) goes on from the cause's
/// own source (as `std::io::Error` does), so a report that prints the chain (`anyhow`) does not
/// repeat it.
impl std::fmt::Display for LockError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LockError::Contended { name, waited, attempts, held: true } => write!(
                f,
                "lock `{name}` is held by someone else: not acquired after {attempts} attempt(s) in {waited:?}; \
                 retry later, raise `wait`, or give a `fallback`"
            ),
            LockError::Contended { name, waited, attempts, held: false } => write!(
                f,
                "lock `{name}` was not acquired after {attempts} attempt(s) in {waited:?}, though nobody held it: \
                 contenders split the votes of the store's nodes and none won a majority (nodes down leave fewer \
                 to split); retry later, raise `wait`, or give a `fallback`"
            ),
            LockError::Lost { name, reason } => write!(
                f,
                "lock `{name}` was lost while held ({reason}); work done since may not have been exclusive: \
                 use a longer lease, or the watchdog (no `lease`), and check fencing tokens downstream"
            ),
            LockError::Backend { name, backend, operation, source } => write!(
                f,
                "{}the {backend} backend failed to {operation}{}: {source}; {}",
                subject(name, operation),
                server(name, operation),
                hint(backend, source)
            ),
            LockError::Invalid { name, reason } => write!(f, "{}invalid input: {reason}", subject(name, "")),
            LockError::Fenced { name, token, highest } => write!(
                f,
                "write to `{name}` fenced: token {token} is stale, a newer holder already wrote with token {highest}; \
                 this holder lost its lock: stop, and do not retry with the same token"
            ),
            LockError::Conflict { name, sqlstate, message } => write!(
                f,
                "write to `{name}` conflicted with a concurrent transaction (SQLSTATE {sqlstate}: {message}); \
                 roll back and retry the whole transaction: a holder with the newest token is admitted on retry"
            ),
            LockError::ShutDown { name } => {
                write!(f, "lock `{name}`: the lock manager was shut down; it takes no lock any more")
            }
            LockError::NotConfigured { name } => write!(
                f,
                "lock `{name}`: no lock manager is configured; call `lock_runtime::set_default(manager)` at \
                 startup, or pass `manager = ..` to the attribute"
            ),
        }
    }
}

impl std::error::Error for LockError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            LockError::Backend { source, .. } => source.source(),
            _ => None,
        }
    }
}

impl LockError {
    /// A failure to connect that names no subject, named by `shown` (the URL connected to,
    /// its password masked): the message then says which server it was.
    #[cfg(any(feature = "postgres", feature = "mysql"))]
    pub(crate) fn connecting_to(self, shown: &str) -> Self {
        match self {
            LockError::Backend { name, backend, operation, source } if name.is_empty() => {
                LockError::Backend { name: shown.to_owned(), backend, operation, source }
            }
            other => other,
        }
    }

    /// The lock was not acquired within the whole `wait` / all `retry` attempts: held by
    /// someone else, or split between contenders ([`LockError::Contended`]'s `held`).
    pub fn is_contended(&self) -> bool {
        matches!(self, LockError::Contended { .. })
    }

    /// The lease was lost while the lock was held.
    pub fn is_lost(&self) -> bool {
        matches!(self, LockError::Lost { .. })
    }

    /// The backend failed or could not be reached (after the bounded time).
    pub fn is_backend(&self) -> bool {
        matches!(self, LockError::Backend { .. })
    }

    /// Bad input (empty or over-long name, zero lease, malformed URL, …).
    pub fn is_invalid(&self) -> bool {
        matches!(self, LockError::Invalid { .. })
    }

    /// A fence refused a write because a newer holder's token was seen ([`crate::fence`]).
    ///
    /// ```
    /// let err = lock_runtime::LockError::Fenced { name: "orders:42".into(), token: 7, highest: 9 };
    /// assert!(err.is_fenced());
    /// assert!(err.to_string().contains("token 7 is stale"));
    /// ```
    pub fn is_fenced(&self) -> bool {
        matches!(self, LockError::Fenced { .. })
    }

    /// A write's transaction conflicted with a concurrent one and should be retried whole
    /// ([`LockError::Conflict`]).
    ///
    /// ```
    /// let err = lock_runtime::LockError::Conflict {
    ///     name: "orders:42".into(),
    ///     sqlstate: "40001".into(),
    ///     message: "could not serialize access due to concurrent update".into(),
    /// };
    /// assert!(err.is_conflict() && err.is_retryable());
    /// assert!(err.to_string().contains("SQLSTATE 40001"));
    /// ```
    pub fn is_conflict(&self) -> bool {
        matches!(self, LockError::Conflict { .. })
    }

    /// Whether doing the same again may succeed: the lock was busy ([`is_contended`](Self::is_contended)),
    /// the store failed ([`is_backend`](Self::is_backend)), or a transaction conflicted
    /// ([`is_conflict`](Self::is_conflict)). Not for a lost lock, a fenced write or bad input.
    pub fn is_retryable(&self) -> bool {
        self.is_contended() || self.is_backend() || self.is_conflict()
    }

    /// The attribute found no manager (`set_default` never called and no `manager = ..`).
    pub fn is_not_configured(&self) -> bool {
        matches!(self, LockError::NotConfigured { .. })
    }

    /// The manager was shut down ([`LockManager::shutdown`](crate::LockManager::shutdown)):
    /// not retryable on this manager; a leader loop ([`Election::lead`](crate::Election::lead),
    /// the attribute's `leader`) ends with it.
    pub fn is_shut_down(&self) -> bool {
        matches!(self, LockError::ShutDown { .. })
    }

    /// The name of the lock this error is about (without the manager prefix).
    pub fn lock_name(&self) -> &str {
        match self {
            LockError::Contended { name, .. }
            | LockError::Lost { name, .. }
            | LockError::Backend { name, .. }
            | LockError::Invalid { name, .. }
            | LockError::Fenced { name, .. }
            | LockError::Conflict { name, .. }
            | LockError::ShutDown { name }
            | LockError::NotConfigured { name } => name,
        }
    }

    /// Builds an [`LockError::Invalid`].
    pub fn invalid(name: impl Into<String>, reason: impl Into<String>) -> Self {
        LockError::Invalid { name: name.into(), reason: reason.into() }
    }

    /// Builds an [`LockError::Lost`].
    pub fn lost(name: impl Into<String>, reason: impl Into<String>) -> Self {
        LockError::Lost { name: name.into(), reason: reason.into() }
    }

    /// Builds an [`LockError::Backend`] from a client library error.
    pub fn backend(
        name: impl Into<String>,
        backend: &'static str,
        operation: &'static str,
        source: impl Into<BoxError>,
    ) -> Self {
        LockError::Backend { name: name.into(), backend, operation, source: source.into() }
    }

    /// [`backend`](Self::backend) from a client error whose message alone may hide its cause
    /// (a client saying "transport error" or "error performing TLS handshake"): when it has
    /// causes, the message shows the whole chain.
    #[cfg(any(feature = "postgres", feature = "etcd"))]
    pub(crate) fn backend_with_causes<E>(name: &str, backend: &'static str, operation: &'static str, e: E) -> Self
    where
        E: std::error::Error + Send + Sync + 'static,
    {
        let Some(mut cause) = e.source() else { return Self::backend(name, backend, operation, e) };
        let mut shown = format!("{e}: {cause}");
        while let Some(next) = cause.source() {
            shown.push_str(&format!(": {next}"));
            cause = next;
        }
        Self::backend(name, backend, operation, shown)
    }

    /// Builds the error for an operation that did not finish within its time bound.
    pub fn timed_out(name: impl Into<String>, backend: &'static str, operation: &'static str, bound: Duration) -> Self {
        Self::backend(name, backend, operation, format!("no answer within {bound:?}"))
    }
}

/// What to check after a backend failure, from what its source says: the TLS settings after a
/// refused handshake, the credentials after a refused login or command, else the server.
/// What an error is about, as its message starts: `` lock `name`: ``, a server's address
/// (`` `redis://db:6379`: ``, said after the operation for a connect, see [`server`]), or
/// nothing when there is no name (a backend's setup).
fn subject(name: &str, operation: &str) -> String {
    match name {
        "" => String::new(),
        _ if name.contains("://") && operation == "connect" => String::new(),
        _ if name.contains("://") => format!("`{name}`: "),
        _ => format!("lock `{name}`: "),
    }
}

/// The server a connect failed to reach, when the error's name is one: `` to `redis://db` ``.
fn server(name: &str, operation: &str) -> String {
    match operation == "connect" && name.contains("://") {
        true => format!(" to `{name}`"),
        false => String::new(),
    }
}

fn hint(backend: &str, source: &BoxError) -> &'static str {
    let text = source.to_string();
    let has = |words: &[&str]| words.iter().any(|w| text.contains(w));
    if backend == "file" {
        "check the lock directory: that it exists, is on a local file system, and this process may write in it"
    } else if has(&["WRONGTYPE"]) {
        "a key this library uses holds a value of another type: check what else writes under the lock prefix"
    } else if has(&[
        "WRONGPASS",
        "NOAUTH",
        "NOPERM",
        "no permissions",
        "password",
        "authentication",
        "Authentication",
        "Access denied",
        "pg_hba.conf",
        "permission denied",
    ]) {
        // Before TLS: a refused login over plaintext may add that a TLS-only server refuses so.
        "check the credentials, and what the server lets this user do (its ACL or grants)"
    } else if has(&["certificate", "handshake", "TLS", "tls", "SSL", "CertificateRequired", "alert"]) {
        "check the TLS settings (the CA trusted, the client certificate, the host name in the URL) against the server's"
    } else if has(&["pool had no free connection"]) {
        "raise the pool's `max_connections`, or give the locks a pool (or connections) of their own"
    } else if has(&["3D000", "does not exist", "Unknown database"]) {
        "check the names in the URL (the database, the user) against the server's"
    } else {
        "check that the server is reachable and healthy, then retry"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_backend_failure_says_what_to_check_by_its_cause() {
        let shown = |source: &str| LockError::backend("n", "redis", "connect", source.to_owned()).to_string();
        assert!(shown("invalid peer certificate: UnknownIssuer").contains("TLS settings"));
        assert!(shown("WRONGPASS invalid username-password pair").contains("credentials"));
        assert!(shown("Connection refused (os error 111)").contains("reachable"));
        // What the audit found advising a reachable server where none is involved.
        assert!(shown("WRONGTYPE Operation against a key holding the wrong kind of value").contains("another type"));
        assert!(shown("Server does not have SSL").contains("TLS settings"));
        let file = LockError::backend("n", "file", "acquire", "Permission denied (os error 13)").to_string();
        assert!(file.contains("lock directory") && !file.contains("reachable"), "{file}");
    }

    /// A report that prints the error and its chain of sources (`anyhow`'s `{:#}`, `{:?}`)
    /// shows each cause once: the error's text holds the client's error, and `source()` goes on
    /// from that error's own source (it printed the client's error twice, or three times).
    #[test]
    fn a_report_of_the_chain_shows_each_cause_once() {
        use std::error::Error;
        #[derive(Debug)]
        struct Broken(std::io::Error);
        impl std::fmt::Display for Broken {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("the connection broke")
            }
        }
        impl Error for Broken {
            fn source(&self) -> Option<&(dyn Error + 'static)> {
                Some(&self.0)
            }
        }
        let e = LockError::backend("n", "redis", "acquire", Broken(std::io::Error::other("reset by peer")));
        let mut report = vec![e.to_string()];
        let mut next = e.source();
        while let Some(cause) = next {
            report.push(cause.to_string());
            next = cause.source();
        }
        let report = report.join(": ");
        assert_eq!(report.matches("the connection broke").count(), 1, "{report}");
        assert_eq!(report.matches("reset by peer").count(), 1, "{report}");
    }

    /// An error names what it is about once: a lock, a server (after the operation, for a
    /// connect), or nothing at all, never an empty ``lock ``: `` nor a URL called a lock.
    #[test]
    fn an_error_names_its_lock_or_its_server() {
        let refused = || "Connection refused (os error 111)".to_owned();
        let text = LockError::backend("redis://db:6379", "redis", "connect", refused()).to_string();
        assert!(text.starts_with("the redis backend failed to connect to `redis://db:6379`: "), "{text}");
        let text = LockError::backend("", "postgres", "connect", refused()).to_string();
        assert!(text.starts_with("the postgres backend failed to connect: "), "{text}");
        let text = LockError::backend("order:1", "postgres", "connect", refused()).to_string();
        assert!(text.starts_with("lock `order:1`: the postgres backend failed to connect: "), "{text}");
        assert_eq!(LockError::invalid("", "not a URL").to_string(), "invalid input: not a URL");
        assert_eq!(LockError::invalid("redis://x", "bad").to_string(), "`redis://x`: invalid input: bad");
        assert_eq!(LockError::invalid("order:1", "too long").to_string(), "lock `order:1`: invalid input: too long");
    }
}
