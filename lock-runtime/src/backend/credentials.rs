//! [`Credentials`]: a user and password a backend logs in with (etcd's users, ZooKeeper's
//! `digest` identities), never shown.

/// A user and its password; `Debug` shows the user only.
#[derive(Clone, PartialEq, Eq)]
pub(crate) struct Credentials {
    pub(crate) user: String,
    pub(crate) password: String,
}

impl Credentials {
    pub(crate) fn new(user: impl Into<String>, password: impl Into<String>) -> Self {
        Credentials { user: user.into(), password: password.into() }
    }
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credentials").field("user", &self.user).finish_non_exhaustive()
    }
}
