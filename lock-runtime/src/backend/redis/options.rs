//! The settings of a Redis backend ([`RedisOptions`]) and their limits.

use std::time::Duration;

use crate::error::LockError;

/// The backend's name in errors and telemetry.
pub(super) const KIND: &str = "redis";

/// The largest accepted [`RedisOptions`] duration.
const MAX_OPTION: Duration = Duration::from_secs(3600);

/// The default [`RedisOptions::command_timeout`].
pub const DEFAULT_COMMAND_TIMEOUT: Duration = Duration::from_secs(2);
/// The default [`RedisOptions::unsubscribe_after`].
pub const DEFAULT_UNSUBSCRIBE_AFTER: Duration = Duration::from_millis(500);
/// The default [`RedisOptions::ping_interval`].
pub const DEFAULT_PING_INTERVAL: Duration = Duration::from_secs(5);

/// Settings of a [`RedisBackend`](super::RedisBackend), checked by
/// [`RedisBackend::connect_with`](super::RedisBackend::connect_with): every duration
/// must be at most one hour, and the command timeout and ping interval greater than zero
/// (otherwise the connection fails with an [`is_invalid`](crate::LockError::is_invalid) error).
///
/// ```
/// use std::time::Duration;
/// use lock_runtime::backend::redis::RedisOptions;
///
/// let options = RedisOptions::default().command_timeout(Duration::from_millis(500));
/// assert_eq!(options.get_command_timeout(), Duration::from_millis(500));
/// ```
#[derive(Debug, Clone)]
pub struct RedisOptions {
    pub(super) command_timeout: Duration,
    pub(super) unsubscribe_after: Duration,
    pub(super) ping_interval: Duration,
    pub(super) wait_for_replicas: Option<(usize, Duration)>,
    #[cfg(feature = "_tls")]
    pub(super) tls: Option<crate::tls::TlsOptions>,
}

impl Default for RedisOptions {
    fn default() -> Self {
        RedisOptions {
            command_timeout: DEFAULT_COMMAND_TIMEOUT,
            unsubscribe_after: DEFAULT_UNSUBSCRIBE_AFTER,
            ping_interval: DEFAULT_PING_INTERVAL,
            wait_for_replicas: None,
            #[cfg(feature = "_tls")]
            tls: None,
        }
    }
}

impl RedisOptions {
    /// The longest any single Redis command (a script call, a connection attempt, a
    /// (un)subscription, a ping of the pub/sub connection) may take; past it the operation
    /// fails with an [`is_backend`](crate::LockError::is_backend) error. Default
    /// [`DEFAULT_COMMAND_TIMEOUT`]; greater than zero and at most one hour. Keep it well under
    /// the leases you use, so the watchdog can retry a renewal in time.
    pub fn command_timeout(mut self, timeout: Duration) -> Self {
        self.command_timeout = timeout;
        self
    }

    /// How long a lock's release channel stays subscribed after the last local waiter left
    /// (so steady contention does not resubscribe on every hand-off). Default
    /// [`DEFAULT_UNSUBSCRIBE_AFTER`]; at most one hour.
    pub fn unsubscribe_after(mut self, grace: Duration) -> Self {
        self.unsubscribe_after = grace;
        self
    }

    /// How often the pub/sub connection is pinged. A ping not answered within the command
    /// timeout drops the connection (it may have died silently, e.g. in a network partition)
    /// and a new one is made and subscribed. Default [`DEFAULT_PING_INTERVAL`]; greater than
    /// zero and at most one hour.
    pub fn ping_interval(mut self, interval: Duration) -> Self {
        self.ping_interval = interval;
        self
    }

    /// After each granted mutex acquisition and each renewal, wait until `replicas` replicas
    /// acknowledged it (`WAIT`), at most `timeout`; a grant short of replicas is undone and
    /// refused with an [`is_backend`](crate::LockError::is_backend) error. For a primary with
    /// replicas (one server, or [Sentinel](super::RedisBackend::sentinel)); see the
    /// [sentinel docs](super::sentinel) for what it buys and what not, and what it costs. `replicas`
    /// at least one, `timeout` greater than zero and less than the command timeout. Not set
    /// by default. Mutexes (and `lock_all`) only: read-write locks and semaphores do not wait.
    /// Not for a Redis Cluster (each slot's primary has its own replicas).
    ///
    /// ```
    /// use std::time::Duration;
    /// use lock_runtime::backend::redis::RedisOptions;
    ///
    /// let options = RedisOptions::default().wait_for_replicas(1, Duration::from_millis(500));
    /// assert_eq!(options.get_wait_for_replicas(), Some((1, Duration::from_millis(500))));
    /// ```
    pub fn wait_for_replicas(mut self, replicas: usize, timeout: Duration) -> Self {
        self.wait_for_replicas = Some((replicas, timeout));
        self
    }

    crate::options::tls_setters!(
        "The URLs must be `rediss://` ones. Every connection of the backend uses the settings: \
         commands, pub/sub, a Cluster's nodes, the Sentinels and the primary they name, each \
         Redlock primary. A `rediss://` URL without them trusts the platform's roots alone.\n\n\
         ```\n\
         use lock_runtime::backend::redis::RedisOptions;\n\
         use lock_runtime::TlsOptions;\n\n\
         let tls = TlsOptions::new().ca_file(\"ca.pem\").client_cert_files(\"client.pem\", \"client.key\");\n\
         assert!(RedisOptions::default().tls(tls).get_tls().is_some());\n\
         ```"
    );

    /// The configured [`wait_for_replicas`](Self::wait_for_replicas), if any.
    pub fn get_wait_for_replicas(&self) -> Option<(usize, Duration)> {
        self.wait_for_replicas
    }

    /// The configured command timeout.
    pub fn get_command_timeout(&self) -> Duration {
        self.command_timeout
    }

    /// The configured unsubscription grace period.
    pub fn get_unsubscribe_after(&self) -> Duration {
        self.unsubscribe_after
    }

    /// The configured ping interval of the pub/sub connection.
    pub fn get_ping_interval(&self) -> Duration {
        self.ping_interval
    }

    /// Why these options cannot be used, if they cannot.
    pub(super) fn problem(&self) -> Option<String> {
        let check = |what: &str, d: Duration, zero_ok: bool| {
            if d.is_zero() && !zero_ok {
                Some(format!("the Redis {what} must be greater than zero"))
            } else if d > MAX_OPTION {
                Some(format!("the Redis {what} must be at most one hour (got {d:?})"))
            } else {
                None
            }
        };
        check("command timeout", self.command_timeout, false)
            .or_else(|| check("unsubscribe_after grace period", self.unsubscribe_after, true))
            .or_else(|| check("ping interval", self.ping_interval, false))
            .or_else(|| match self.wait_for_replicas {
                Some((0, _)) => Some("wait_for_replicas needs at least one replica".to_owned()),
                Some((_, t)) if t.is_zero() || t >= self.command_timeout => Some(format!(
                    "the wait_for_replicas timeout must be greater than zero and less than the command timeout \
                     ({:?}; got {t:?})",
                    self.command_timeout
                )),
                _ => None,
            })
    }

    /// Refuses options a backend on the application's own client cannot take: any out of
    /// range, and TLS settings (the client's own apply).
    pub(super) fn check_beside_client(&self, shown: &str) -> Result<(), LockError> {
        if let Some(problem) = self.problem() {
            return Err(LockError::invalid(shown, problem));
        }
        #[cfg(feature = "_tls")]
        if self.get_tls().is_some() {
            let why = "TLS settings were given beside a client (`RedisOptions::tls`): the client's own apply";
            return Err(LockError::invalid(shown, why));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_out_of_range_are_refused() {
        let hour = Duration::from_secs(3600);
        assert!(RedisOptions::default().problem().is_none());
        let edge = RedisOptions::default().command_timeout(hour).unsubscribe_after(hour).ping_interval(hour);
        assert!(edge.problem().is_none());
        assert!(RedisOptions::default().unsubscribe_after(Duration::ZERO).problem().is_none());
        assert!(RedisOptions::default().wait_for_replicas(2, Duration::from_millis(500)).problem().is_none());
        for bad in [
            RedisOptions::default().command_timeout(Duration::ZERO),
            RedisOptions::default().command_timeout(Duration::MAX),
            RedisOptions::default().unsubscribe_after(hour + Duration::from_nanos(1)),
            RedisOptions::default().ping_interval(Duration::ZERO),
            RedisOptions::default().ping_interval(Duration::MAX),
            RedisOptions::default().wait_for_replicas(0, Duration::from_millis(100)),
            RedisOptions::default().wait_for_replicas(1, Duration::ZERO),
            RedisOptions::default().wait_for_replicas(1, DEFAULT_COMMAND_TIMEOUT),
        ] {
            assert!(bad.problem().is_some(), "{bad:?}");
        }
    }
}
