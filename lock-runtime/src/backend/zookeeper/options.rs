//! [`ZookeeperOptions`]: the backend's settings, validated once when the backend is built.

use std::time::Duration;

use crate::backend::credentials::Credentials;
use crate::error::LockError;

/// Settings of a [`ZookeeperBackend`](super::ZookeeperBackend): build with
/// [`ZookeeperOptions::new`] and its setters. Every duration is checked when the backend
/// connects ([`connect_with`](super::ZookeeperBackend::connect_with)): zero, or more than
/// [`MAX_TIMEOUT`](ZookeeperOptions::MAX_TIMEOUT), is an [`is_invalid`](LockError::is_invalid)
/// error.
///
/// ```
/// use std::time::Duration;
/// use lock_runtime::backend::zookeeper::ZookeeperOptions;
///
/// let options = ZookeeperOptions::new()
///     .session_timeout(Duration::from_secs(10))
///     .operation_timeout(Duration::from_secs(2))
///     .root("/myapp/locks");
/// assert_eq!(options.get_root(), "/myapp/locks");
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ZookeeperOptions {
    session_timeout: Duration,
    operation_timeout: Duration,
    root: String,
    lost_after_disconnect: Option<Duration>,
    digest: Option<Credentials>,
    #[cfg(feature = "_tls")]
    tls: Option<crate::tls::TlsOptions>,
}

impl Default for ZookeeperOptions {
    fn default() -> Self {
        ZookeeperOptions {
            session_timeout: Self::DEFAULT_SESSION_TIMEOUT,
            operation_timeout: Self::DEFAULT_OPERATION_TIMEOUT,
            root: Self::DEFAULT_ROOT.to_owned(),
            lost_after_disconnect: None,
            digest: None,
            #[cfg(feature = "_tls")]
            tls: None,
        }
    }
}

impl ZookeeperOptions {
    /// The session timeout asked for by default.
    pub const DEFAULT_SESSION_TIMEOUT: Duration = Duration::from_secs(6);
    /// The operation timeout used by default.
    pub const DEFAULT_OPERATION_TIMEOUT: Duration = Duration::from_secs(5);
    /// The znode under which lock nodes live by default.
    pub const DEFAULT_ROOT: &'static str = "/lock-runtime";
    /// The longest accepted session timeout, operation timeout and `lost_after_disconnect`
    /// (one hour). ZooKeeper servers cap sessions far lower (`maxSessionTimeout`, 40 s by
    /// default).
    pub const MAX_TIMEOUT: Duration = Duration::from_secs(60 * 60);
    /// The shortest accepted session timeout, operation timeout and `lost_after_disconnect`
    /// (one millisecond: the protocol's unit).
    pub const MIN_TIMEOUT: Duration = Duration::from_millis(1);

    /// The defaults: a 6 s session, 5 s operations, locks under `/lock-runtime`.
    pub fn new() -> Self {
        Self::default()
    }

    /// The session timeout to ask the server for (it may adjust it into its
    /// `minSessionTimeout..=maxSessionTimeout`, by default 2 to 20 ticks). A holder whose
    /// process dies keeps its watchdog-leased locks until the session expires, this long after
    /// the server last heard from it.
    pub fn session_timeout(mut self, timeout: Duration) -> Self {
        self.session_timeout = timeout;
        self
    }

    /// The longest a single operation (one attempt, one release, connecting) may take before it
    /// fails with an [`is_backend`](LockError::is_backend) error.
    pub fn operation_timeout(mut self, timeout: Duration) -> Self {
        self.operation_timeout = timeout;
        self
    }

    /// The znode under which lock nodes are created (an absolute path, created if missing).
    pub fn root(mut self, root: impl Into<String>) -> Self {
        self.root = root.into();
        self
    }

    /// How long the client may stay disconnected before every lock held through the session is
    /// reported lost and the session is abandoned, if that is sooner than the session's own
    /// deadline. Default: unset: locks are reported lost when the ensemble's leader has not
    /// confirmed the session for 3/4 of the negotiated session timeout, connected or not (see
    /// the [module docs](super)).
    pub fn lost_after_disconnect(mut self, grace: Duration) -> Self {
        self.lost_after_disconnect = Some(grace);
        self
    }

    /// Authenticates the session as `user` with `password` (ZooKeeper's `digest` scheme), and
    /// creates every lock node, and the container of each name, with an ACL that lets only that
    /// identity write or delete (everyone may read, so `lockctl` still lists the locks). A client
    /// with other credentials, or none, then cannot delete a held lock's node (in ZooKeeper,
    /// deleting a node is a right on its parent: the container). A name whose container was made
    /// before, by another identity, keeps that identity's ACL. `user` may not hold a `:`.
    ///
    /// ```
    /// use lock_runtime::backend::zookeeper::ZookeeperOptions;
    ///
    /// let options = ZookeeperOptions::new().digest_auth("billing", "secret");
    /// assert_eq!(options.get_digest_user(), Some("billing"));
    /// assert!(!format!("{options:?}").contains("secret"));
    /// ```
    pub fn digest_auth(mut self, user: impl Into<String>, password: impl Into<String>) -> Self {
        self.digest = Some(Credentials::new(user, password));
        self
    }

    crate::options::tls_setters!(
        "Every host of the list is then reached on its secure client port (ZooKeeper's \
         `secureClientPort`, a Netty connection factory). Needs the feature `tls-aws-lc`: the \
         ZooKeeper client's TLS is built on aws-lc-rs, so with `tls` alone (ring) connecting is \
         an [`is_invalid`](LockError::is_invalid) error naming the feature, rather than a second \
         crypto library in every build.\n\n\
         ```\n\
         use lock_runtime::backend::zookeeper::ZookeeperOptions;\n\
         use lock_runtime::TlsOptions;\n\n\
         let options = ZookeeperOptions::new().tls(TlsOptions::new().ca_file(\"ca.pem\"));\n\
         assert!(options.get_tls().is_some());\n\
         ```"
    );

    /// The user of [`digest_auth`](Self::digest_auth), if any.
    pub fn get_digest_user(&self) -> Option<&str> {
        self.digest.as_ref().map(|d| d.user.as_str())
    }

    pub(super) fn get_digest(&self) -> Option<&Credentials> {
        self.digest.as_ref()
    }

    /// The session timeout asked for.
    pub fn get_session_timeout(&self) -> Duration {
        self.session_timeout
    }

    /// The operation timeout.
    pub fn get_operation_timeout(&self) -> Duration {
        self.operation_timeout
    }

    /// The lock root.
    pub fn get_root(&self) -> &str {
        &self.root
    }

    /// `lost_after_disconnect`, if set.
    pub fn get_lost_after_disconnect(&self) -> Option<Duration> {
        self.lost_after_disconnect
    }

    /// Validates every option (the one place they are checked: the code after it relies on
    /// every duration being within `MIN_TIMEOUT..=MAX_TIMEOUT`).
    pub(super) fn check(&self, hosts: &str) -> Result<(), LockError> {
        #[cfg(all(feature = "_tls", not(feature = "tls-aws-lc")))]
        if self.tls.is_some() {
            let why = "ZooKeeper over TLS (`ZookeeperOptions::tls`) needs the feature `tls-aws-lc` of lock-runtime \
                       (the ZooKeeper client's TLS is built on aws-lc-rs; `tls` alone is ring)";
            return Err(LockError::invalid(hosts, why));
        }
        if let Some(digest) = &self.digest {
            if digest.user.is_empty() || digest.user.contains(':') {
                let why = "the ZooKeeper digest user must not be empty nor hold a `:` (digest identities are `user:password`)";
                return Err(LockError::invalid(hosts, why));
            }
        }
        let root = &self.root;
        if !root.starts_with('/') || root.len() < 2 || root.ends_with('/') || root.contains("//") {
            return Err(LockError::invalid(
                hosts,
                format!("the ZooKeeper lock root `{root}` must be an absolute znode path such as `/locks`, not `/`"),
            ));
        }
        if root.chars().any(char::is_control) || root.split('/').any(|part| part == "." || part == "..") {
            return Err(LockError::invalid(
                hosts,
                format!("the ZooKeeper lock root `{root}` is not a valid znode path"),
            ));
        }
        let durations = [
            ("session_timeout", Some(self.session_timeout)),
            ("operation_timeout", Some(self.operation_timeout)),
            ("lost_after_disconnect", self.lost_after_disconnect),
        ];
        for (what, value) in durations {
            let Some(value) = value else { continue };
            if !(Self::MIN_TIMEOUT..=Self::MAX_TIMEOUT).contains(&value) {
                return Err(LockError::invalid(
                    hosts,
                    format!(
                        "the ZooKeeper `{what}` is {value:?}; give between {:?} and {:?}",
                        Self::MIN_TIMEOUT,
                        Self::MAX_TIMEOUT
                    ),
                ));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_options_are_invalid() {
        for root in ["", "/", "locks", "/locks/", "/a//b", "/a/../b"] {
            let err = ZookeeperOptions::new().root(root).check("h:1").expect_err(root);
            assert!(err.is_invalid(), "{root}: {err}");
        }
        for bad in [Duration::ZERO, Duration::from_nanos(1), Duration::MAX, ZookeeperOptions::MAX_TIMEOUT * 2] {
            let cases = [
                ZookeeperOptions::new().session_timeout(bad),
                ZookeeperOptions::new().operation_timeout(bad),
                ZookeeperOptions::new().lost_after_disconnect(bad),
            ];
            for options in cases {
                let err = options.check("h:1").expect_err("out of range");
                assert!(err.is_invalid(), "{bad:?}: {err}");
            }
        }
        let edge = ZookeeperOptions::MAX_TIMEOUT;
        assert!(ZookeeperOptions::new().operation_timeout(edge).session_timeout(edge).check("h:1").is_ok());
        assert!(ZookeeperOptions::new().check("h:1").is_ok());
    }

    /// With TLS on ring alone (`tls`), the ZooKeeper client has no TLS: a clear refusal naming
    /// the feature that has it (`tls-aws-lc`). Built only without `tls-aws-lc`
    /// (`cargo test -p lock-runtime --features zookeeper,tls --lib`).
    #[cfg(all(feature = "_tls", not(feature = "tls-aws-lc")))]
    #[test]
    fn tls_without_aws_lc_names_the_feature() {
        let err = ZookeeperOptions::new().tls(crate::TlsOptions::new()).check("h:1").expect_err("refused");
        assert!(err.is_invalid() && err.to_string().contains("tls-aws-lc"), "{err}");
    }
}
