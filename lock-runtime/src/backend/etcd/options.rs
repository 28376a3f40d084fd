//! [`EtcdOptions`] and the check of an endpoint list.

use std::time::Duration;

use crate::backend::credentials::Credentials;
use crate::error::LockError;

/// Settings of an [`EtcdBackend`](super::EtcdBackend), checked when it connects.
///
/// ```
/// use std::time::Duration;
/// use lock_runtime::backend::etcd::EtcdOptions;
///
/// let options = EtcdOptions::new().lease_ttl(Duration::from_secs(4)).root("myapp/locks");
/// assert_eq!(options.get_lease_ttl(), Duration::from_secs(4));
/// assert_eq!(options.get_root(), "myapp/locks");
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EtcdOptions {
    lease_ttl: Duration,
    operation_timeout: Duration,
    root: String,
    credentials: Option<Credentials>,
    #[cfg(feature = "_tls")]
    tls: Option<crate::tls::TlsOptions>,
}

impl Default for EtcdOptions {
    fn default() -> Self {
        EtcdOptions {
            lease_ttl: Duration::from_secs(10),
            operation_timeout: Duration::from_secs(5),
            root: "lock-runtime".to_owned(),
            credentials: None,
            #[cfg(feature = "_tls")]
            tls: None,
        }
    }
}

impl EtcdOptions {
    /// The defaults: lease TTL 10 s, operation timeout 5 s, root `lock-runtime`.
    pub fn new() -> Self {
        Self::default()
    }

    /// The TTL of the manager's lease, in whole seconds, from 2 s to 1 hour (etcd raises a
    /// shorter TTL to its own minimum). Every lock held through the manager is reported lost
    /// when no keep-alive was answered for two thirds of it; another client gets the lock once
    /// the server has heard nothing for all of it.
    pub fn lease_ttl(mut self, ttl: Duration) -> Self {
        self.lease_ttl = ttl;
        self
    }

    /// The longest one request may take (from 10 ms to 10 minutes).
    pub fn operation_timeout(mut self, timeout: Duration) -> Self {
        self.operation_timeout = timeout;
        self
    }

    /// The key prefix under which every lock's keys live (no leading or trailing `/`
    /// needed; not empty).
    pub fn root(mut self, root: impl Into<String>) -> Self {
        self.root = root.into();
        self
    }

    /// Logs in as `user` with `password` (etcd's authentication, with RBAC on): the client
    /// gets a token at connect and a new one whenever the server has expired it. The role of
    /// `user` needs read and write on the keys under the [`root`](Self::root) (a range
    /// `<root>/` to its prefix end); see the [module docs](super) for a least-privilege role.
    ///
    /// ```
    /// use lock_runtime::backend::etcd::EtcdOptions;
    ///
    /// let options = EtcdOptions::new().credentials("locker", "secret");
    /// assert_eq!(options.get_user(), Some("locker"));
    /// assert!(!format!("{options:?}").contains("secret"));
    /// ```
    pub fn credentials(mut self, user: impl Into<String>, password: impl Into<String>) -> Self {
        self.credentials = Some(Credentials::new(user, password));
        self
    }

    crate::options::tls_setters!(
        "The endpoints must be `https://` ones. An `https://` endpoint without the settings \
         trusts the platform's roots alone.\n\n\
         ```\n\
         use lock_runtime::backend::etcd::EtcdOptions;\n\
         use lock_runtime::TlsOptions;\n\n\
         let tls = TlsOptions::new().ca_file(\"ca.pem\").client_cert_files(\"client.pem\", \"client.key\");\n\
         let options = EtcdOptions::new().tls(tls).credentials(\"locker\", \"secret\");\n\
         assert!(options.get_tls().is_some());\n\
         ```"
    );

    /// The user of [`credentials`](Self::credentials), if any.
    pub fn get_user(&self) -> Option<&str> {
        self.credentials.as_ref().map(|c| c.user.as_str())
    }

    pub(super) fn get_credentials(&self) -> Option<&Credentials> {
        self.credentials.as_ref()
    }

    /// The lease TTL.
    pub fn get_lease_ttl(&self) -> Duration {
        self.lease_ttl
    }

    /// The operation timeout.
    pub fn get_operation_timeout(&self) -> Duration {
        self.operation_timeout
    }

    /// The root prefix.
    pub fn get_root(&self) -> &str {
        &self.root
    }

    pub(super) fn check(&self, endpoints: &str) -> Result<(), LockError> {
        if self.lease_ttl < Duration::from_secs(2) || self.lease_ttl > Duration::from_secs(3600) {
            return Err(LockError::invalid(
                endpoints,
                format!("etcd lease TTL {:?} is not within 2 s ..= 1 h", self.lease_ttl),
            ));
        }
        if self.lease_ttl.subsec_nanos() != 0 {
            return Err(LockError::invalid(
                endpoints,
                format!("etcd lease TTL {:?} is not a whole number of seconds", self.lease_ttl),
            ));
        }
        if self.operation_timeout < Duration::from_millis(10) || self.operation_timeout > Duration::from_secs(600) {
            return Err(LockError::invalid(
                endpoints,
                format!("etcd operation timeout {:?} is not within 10 ms ..= 10 min", self.operation_timeout),
            ));
        }
        #[cfg(feature = "_tls")]
        if self.tls.is_some() && !endpoints.starts_with("https://") {
            let why = "TLS settings were given (`EtcdOptions::tls`) but the endpoints are not TLS ones: use `https://host:port`";
            return Err(LockError::invalid(endpoints, why));
        }
        if self.credentials.as_ref().is_some_and(|c| c.user.is_empty()) {
            return Err(LockError::invalid(endpoints, "the etcd user of `credentials` is empty"));
        }
        if self.root.trim_matches('/').is_empty() || self.root.contains('\0') {
            return Err(LockError::invalid(endpoints, format!("etcd root {:?} is empty or holds a NUL", self.root)));
        }
        Ok(())
    }
}

/// Checks `endpoints` (`http://host:port` or `host:port`) and returns them with their scheme.
pub(super) fn check_endpoints(endpoints: &[&str]) -> Result<Vec<String>, LockError> {
    let shown = endpoints.join(",");
    if endpoints.is_empty() {
        return Err(LockError::invalid(shown, "the etcd endpoint list is empty; give `http://host:port`"));
    }
    let mut out = Vec::with_capacity(endpoints.len());
    for endpoint in endpoints {
        let endpoint = endpoint.trim();
        let (scheme, rest) = match endpoint.split_once("://") {
            Some(("http", rest)) => ("http", rest),
            Some(("https", rest)) if cfg!(feature = "_tls") => ("https", rest),
            Some(("https", _)) => {
                let why = format!(
                    "etcd endpoint `{endpoint}`: TLS needs the `tls` feature of lock-runtime, which this build leaves out"
                );
                return Err(LockError::invalid(shown, why));
            }
            Some(_) => ("", endpoint),
            None => ("http", endpoint),
        };
        let rest = rest.trim_end_matches('/');
        let valid = !scheme.is_empty()
            && rest.rsplit_once(':').is_some_and(|(host, port)| {
                let host_ok = !host.is_empty()
                    && host
                        .chars()
                        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '.' | '_' | '[' | ']' | ':'));
                host_ok && port.parse::<u16>().is_ok_and(|p| p > 0)
            });
        if !valid {
            return Err(LockError::invalid(
                shown,
                format!("not a valid etcd endpoint: `{endpoint}`; give `http://host:port` (or `https://host:port`)"),
            ));
        }
        out.push(format!("{scheme}://{rest}"));
    }
    let tls = out.iter().filter(|e| e.starts_with("https://")).count();
    if tls != 0 && tls != out.len() {
        return Err(LockError::invalid(shown, "the etcd endpoints mix `http://` and `https://`: give one kind"));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_are_checked() {
        assert_eq!(check_endpoints(&["127.0.0.1:2379"]).ok(), Some(vec!["http://127.0.0.1:2379".to_owned()]));
        assert_eq!(check_endpoints(&["http://etcd-1:2379/"]).ok(), Some(vec!["http://etcd-1:2379".to_owned()]));
        for bad in [&[][..], &["nonsense"], &["http://:2379"], &["host:0"], &["host:99999"], &["ftp://h:1"], &["a b:1"]]
        {
            let err = check_endpoints(bad).expect_err("refused");
            assert!(err.is_invalid(), "{err}");
        }
        let https = check_endpoints(&["https://h:1"]);
        assert_eq!(https.is_ok(), cfg!(feature = "_tls"), "{https:?}");
        assert!(check_endpoints(&["https://h:1", "http://h:2"]).is_err());
    }

    #[test]
    fn options_are_checked() {
        assert!(EtcdOptions::new().check("e").is_ok());
        assert!(EtcdOptions::new().lease_ttl(Duration::from_secs(1)).check("e").is_err());
        assert!(EtcdOptions::new().lease_ttl(Duration::from_millis(2500)).check("e").is_err());
        assert!(EtcdOptions::new().operation_timeout(Duration::ZERO).check("e").is_err());
        assert!(EtcdOptions::new().root("/").check("e").is_err());
    }
}
