//! [`EtcdBackend`]: connects, owns the manager's lease, begins acquisitions.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use etcd_client::ConnectOptions;

use super::members::Members;

use super::options::{check_endpoints, EtcdOptions};
use super::recipe::EtcdAcquisition;
use super::session::Shared;
use super::{encode, KIND};
use crate::backend::{Acquire, Acquisition, LockBackend, LockKind};
use crate::error::LockError;
use crate::lost::LostSignal;

/// Counters of an [`EtcdBackend`], for metrics and tests.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct EtcdStats {
    /// Acquisitions watching their predecessor's key right now.
    pub waiting: u64,
    /// Watches opened on a predecessor's key (one per predecessor a waiter waits behind, plus
    /// one per watch stream the server ended).
    pub watches: u64,
    /// Waiters woken by their predecessor's deletion (with no herd, one per release that had a
    /// waiter behind it).
    pub wakeups: u64,
    /// Leases granted: 1, plus one after each lease lost.
    pub leases: u64,
}

/// The etcd lock store. Cheap to clone: clones share one client and one lease. See the
/// [module docs](super) for the recipe.
#[derive(Clone)]
pub struct EtcdBackend {
    pub(super) shared: Arc<Shared>,
}

impl fmt::Debug for EtcdBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EtcdBackend")
            .field("endpoints", &self.shared.endpoints)
            .field("options", &self.shared.options)
            .field("lease", &format_args!("{:016x}", self.shared.lease_id()))
            .field("stats", &self.stats())
            .finish()
    }
}

impl EtcdBackend {
    /// Connects to `endpoints` (`http://host:port`, or `host:port`) with the default
    /// [`EtcdOptions`].
    pub async fn connect<E: AsRef<str>, S: AsRef<[E]>>(endpoints: S) -> Result<Self, LockError> {
        Self::connect_with(endpoints, EtcdOptions::new()).await
    }

    /// Connects to `endpoints` with `options` and grants the manager's lease. Fails with an
    /// [`is_invalid`](LockError::is_invalid) error for a malformed endpoint (or `https://`
    /// without the feature `tls`) or an option out of range, and an
    /// [`is_backend`](LockError::is_backend) error when no server grants the lease within the
    /// operation timeout.
    pub async fn connect_with<E: AsRef<str>, S: AsRef<[E]>>(
        endpoints: S,
        options: EtcdOptions,
    ) -> Result<Self, LockError> {
        let given: Vec<&str> = endpoints.as_ref().iter().map(AsRef::as_ref).collect();
        let endpoints = check_endpoints(&given)?;
        let shown = endpoints.join(",");
        options.check(&shown)?;
        let bound = options.get_operation_timeout();
        // No per-request timeout in the client: it would also end the long-lived watch and
        // keep-alive streams (the server honours `grpc-timeout`). Every request is bounded here
        // instead. HTTP/2 pings notice a dead connection under a silent watch (not more often
        // than etcd's default `--grpc-keepalive-min-time` of 5 s allows).
        let connect = ConnectOptions::new()
            .with_connect_timeout(bound)
            .with_keep_alive(Duration::from_secs(10), bound)
            .with_keep_alive_while_idle(true);
        let connect = match options.get_credentials() {
            Some(c) => connect.with_user(&c.user, &c.password).with_auto_token_refresh(true),
            None => connect,
        };
        #[cfg(feature = "_tls")]
        let connect = match endpoints[0].starts_with("https://") {
            true => connect.with_tls(tls(&options, &shown)?),
            false => connect,
        };
        // A member that refuses, has no leader (a member cut off from the others) or does not
        // answer is left for the next one (see `members.rs`).
        let connect = connect.with_require_leader(true);
        let members = Members::new(endpoints.clone(), connect, bound);
        Ok(EtcdBackend { shared: Shared::start(members, options, endpoints).await? })
    }

    /// The options this backend was built with.
    pub fn options(&self) -> &EtcdOptions {
        &self.shared.options
    }

    /// The TTL of the manager's lease, as the server granted it.
    pub fn lease_ttl(&self) -> Duration {
        self.shared.ttl
    }

    /// The id of the manager's current lease.
    pub fn lease_id(&self) -> i64 {
        self.shared.lease_id()
    }

    /// How many leases this backend was granted: 1, plus one after each lease lost.
    pub fn leases_granted(&self) -> u64 {
        self.shared.sessions()
    }

    /// The counters of this backend.
    pub fn stats(&self) -> EtcdStats {
        use std::sync::atomic::Ordering::Relaxed;
        EtcdStats {
            waiting: self.shared.waiting.load(Relaxed),
            watches: self.shared.watches.load(Relaxed),
            wakeups: self.shared.wakeups.load(Relaxed),
            leases: self.shared.sessions(),
        }
    }

    /// The prefix under which the keys of lock `key` (the manager prefix followed by the name)
    /// live, `/` included.
    pub fn lock_prefix(&self, key: &str) -> String {
        format!("{}/{}/", self.shared.options.get_root().trim_matches('/'), encode(key))
    }

    /// The prefix of the read-write lock (`kind` `rw`) or semaphore (`sem`) `key`: the encoded
    /// key followed by `%rw` or `%sem` (which no encoded key holds: a `%` is always escaped as
    /// `%25`), `/` included.
    pub(super) fn kind_prefix(&self, key: &str, kind: &str) -> String {
        format!("{}/{}%{kind}/", self.shared.options.get_root().trim_matches('/'), encode(key))
    }
}

impl LockBackend for EtcdBackend {
    fn name(&self) -> &'static str {
        KIND
    }

    /// Every kind: mutexes, read-write locks and semaphores (see the module docs).
    fn supports(&self, kind: LockKind) -> bool {
        matches!(kind, LockKind::Exclusive | LockKind::Read | LockKind::Write | LockKind::Semaphore { .. })
    }

    fn begin(&self, req: Acquire, lost: LostSignal) -> Box<dyn Acquisition> {
        let prefix = match req.kind {
            // A read-write lock's and a semaphore's keys live apart from the mutex's of the
            // same name.
            LockKind::Read | LockKind::Write => self.kind_prefix(&req.key, "rw"),
            LockKind::Semaphore { .. } => self.kind_prefix(&req.key, "sem"),
            _ => self.lock_prefix(&req.key),
        };
        Box::new(EtcdAcquisition::new(self.shared.clone(), Arc::from(prefix), req, lost))
    }

    fn operation_timeout(&self) -> Duration {
        self.shared.options.get_operation_timeout()
    }

    fn inspector(&self) -> Option<&dyn crate::backend::Inspect> {
        Some(self)
    }

    /// Revokes the manager's lease: every key it still holds is deleted at once.
    fn shutdown(&self) -> crate::backend::BoxFuture<'_, ()> {
        Box::pin(self.shared.shut_down())
    }
}

/// The client's TLS settings for `options`: the CAs given and the platform's roots, and the
/// client identity.
#[cfg(feature = "_tls")]
fn tls(options: &EtcdOptions, shown: &str) -> Result<etcd_client::TlsOptions, LockError> {
    crate::tls::install_provider();
    let loaded = options.get_tls().cloned().unwrap_or_default().load(shown)?;
    let tls = etcd_client::TlsOptions::new().ca_certificate(etcd_client::Certificate::from_pem(loaded.roots_pem()));
    Ok(match &loaded.identity {
        Some((cert, key)) => tls.identity(etcd_client::Identity::from_pem(&**cert, &**key)),
        None => tls,
    })
}
