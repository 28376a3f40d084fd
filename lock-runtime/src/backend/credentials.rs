//! [`Credentials`]: a user and password a backend logs in with (etcd's users, ZooKeeper's
//! `digest` identities), never shown; and [`redact`], a URL with its password masked.

/// A user and its password; `Debug` shows the user only.
#[cfg(any(feature = "etcd", feature = "zookeeper"))]
#[derive(Clone, PartialEq, Eq)]
pub(crate) struct Credentials {
    pub(crate) user: String,
    pub(crate) password: String,
}

#[cfg(any(feature = "etcd", feature = "zookeeper"))]
impl Credentials {
    pub(crate) fn new(user: impl Into<String>, password: impl Into<String>) -> Self {
        Credentials { user: user.into(), password: password.into() }
    }
}

#[cfg(any(feature = "etcd", feature = "zookeeper"))]
impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credentials").field("user", &self.user).finish_non_exhaustive()
    }
}

/// `url` with its password masked, for messages and `Debug`.
pub(crate) fn redact(url: &str) -> String {
    let Some(scheme_end) = url.find("://") else { return url.to_owned() };
    let rest = &url[scheme_end + 3..];
    let authority_end = rest.find('/').unwrap_or(rest.len());
    match rest[..authority_end].rfind('@') {
        Some(at) => {
            let userinfo = &rest[..at];
            let user = userinfo.split(':').next().unwrap_or("");
            let masked = if userinfo.contains(':') { format!("{user}:***") } else { "***".to_owned() };
            format!("{}{}{}", &url[..scheme_end + 3], masked, &rest[at..])
        }
        None => url.to_owned(),
    }
}
