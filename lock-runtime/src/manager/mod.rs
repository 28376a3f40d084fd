//! [`LockManager`]: the entry point, closed to backends: its builder ([`builder`]), the
//! constructors for the built-in backends ([`connect`]), the requests it makes ([`request`],
//! [`kinds`]) and the acquisition policy behind them ([`acquire`]). Backends plug in through
//! [`LockManagerBuilder::backend`]; none adds a method here.

use std::sync::{Arc, PoisonError, RwLock};
use std::time::Duration;

use crate::backend::memory::MemoryBackend;
use crate::backend::{Holder, Inspect, LockBackend, LockInfo, LockKind};
use crate::error::LockError;
use crate::guard::LockGuard;
use crate::options::LockOptions;
use crate::telemetry;

mod acquire;
mod builder;
mod connect;
mod kinds;
mod lock_all;
mod request;
mod shutdown;

pub use builder::LockManagerBuilder;
pub(crate) use lock_all::acquire_all;
pub use lock_all::{LockAllGuard, LockAllRequest, MAX_NAMES};
pub use request::{LockFuture, LockRequest};

/// The default `wait`: how long a call waits for a held lock when it gives no `wait`.
pub const DEFAULT_WAIT: Duration = Duration::from_secs(3);
/// The default watchdog lease; renewed at a third of it while the guard lives.
pub const DEFAULT_LEASE: Duration = Duration::from_secs(30);

/// Takes locks on one backend. Cheap to clone (shared inside), `Send + Sync + 'static`.
///
/// ```
/// use std::time::Duration;
/// use lock_runtime::LockManager;
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), lock_runtime::LockError> {
/// let manager = LockManager::builder().prefix("myapp:").default_wait(Duration::from_secs(2)).memory();
/// let guard = manager.lock("order:42").wait(Duration::from_millis(500)).await?;
/// assert_eq!(guard.key(), "order:42");
/// assert!(manager.try_lock("order:42").await?.is_none()); // held
/// guard.release().await?;
/// assert!(manager.try_lock("order:42").await?.is_some()); // free again
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct LockManager {
    inner: Arc<Inner>,
}

pub(crate) struct Inner {
    pub(crate) id: u64,
    pub(crate) prefix: String,
    pub(crate) default_wait: Duration,
    pub(crate) default_lease: Duration,
    /// Stored with every lock taken (host, pid, label).
    holder: Holder,
    pub(crate) backend: Arc<dyn LockBackend>,
    /// The in-process store when the manager was built by [`LockManagerBuilder::memory`]: its
    /// fast path takes the request by value (a specialisation; no downcast).
    memory: Option<MemoryBackend>,
    /// The backend's operation timeout and kind, read once.
    pub(crate) bound: Duration,
    pub(crate) kind: &'static str,
    pub(crate) telemetry: telemetry::Telemetry,
    /// What [`LockManager::shutdown`] closes and releases.
    pub(crate) shutdown: shutdown::Shutdown,
}

impl std::fmt::Debug for LockManager {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LockManager")
            .field("backend", &self.inner.backend.name())
            .field("prefix", &self.inner.prefix)
            .field("default_wait", &self.inner.default_wait)
            .field("default_lease", &self.inner.default_lease)
            .finish()
    }
}

static DEFAULT: RwLock<Option<LockManager>> = RwLock::new(None);

/// Sets the process-wide manager that `#[distributed_locked]` uses when it is given no
/// `manager = ..`; returns the previous one.
///
/// ```
/// let previous = lock_runtime::set_default(lock_runtime::LockManager::memory());
/// # let _ = previous;
/// assert!(lock_runtime::default_manager().is_some());
/// ```
pub fn set_default(manager: LockManager) -> Option<LockManager> {
    DEFAULT.write().unwrap_or_else(PoisonError::into_inner).replace(manager)
}

/// The manager set by [`set_default`], if any.
pub fn default_manager() -> Option<LockManager> {
    DEFAULT.read().unwrap_or_else(PoisonError::into_inner).clone()
}

impl LockManager {
    /// Starts configuring a manager.
    pub fn builder() -> LockManagerBuilder {
        LockManagerBuilder::default()
    }

    /// A manager on the in-process backend with default settings; same as
    /// `LockManager::builder().memory()`.
    pub fn memory() -> LockManager {
        Self::builder().memory()
    }

    /// Asks for the lock `name`; configure the request, then `.await` it for a [`LockGuard`].
    ///
    /// ```
    /// # use std::time::Duration;
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), lock_runtime::LockError> {
    /// let manager = lock_runtime::LockManager::memory();
    /// let guard = manager.lock("order:42").wait(Duration::from_secs(2)).lease(Duration::from_secs(10)).retry(3).await?;
    /// assert!(guard.fencing_token() > 0);
    /// # Ok(()) }
    /// ```
    pub fn lock(&self, name: impl AsRef<str>) -> LockRequest<'_> {
        self.lock_named(Arc::from(name.as_ref()))
    }

    /// [`lock`](Self::lock) with the name already shared.
    #[inline]
    pub(crate) fn lock_named(&self, name: Arc<str>) -> LockRequest<'_> {
        LockRequest { manager: self, name, kind: LockKind::Exclusive, options: LockOptions::new() }
    }

    /// One attempt, no waiting: `Ok(None)` when someone else holds the lock.
    pub async fn try_lock(&self, name: impl AsRef<str>) -> Result<Option<LockGuard>, LockError> {
        match self.lock(name).wait(Duration::ZERO).retry(0).await {
            Ok(guard) => Ok(Some(guard)),
            Err(e) if e.is_contended() => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// The prefix prepended to every lock name in the backend.
    pub fn prefix(&self) -> &str {
        &self.inner.prefix
    }

    /// The `wait` used when a call gives none.
    pub fn default_wait(&self) -> Duration {
        self.inner.default_wait
    }

    /// The watchdog lease used when a call gives no `lease`.
    pub fn default_lease(&self) -> Duration {
        self.inner.default_lease
    }

    /// The process identity stored with this manager's locks (host, pid, label).
    pub fn holder(&self) -> &Holder {
        &self.inner.holder
    }

    /// The backend's short name (`"memory"`, `"redis"`, …: [`LockBackend::name`]).
    pub fn backend_name(&self) -> &'static str {
        self.inner.backend.name()
    }

    /// Whether the backend offers `kind` ([`LockBackend::supports`]): the others are refused
    /// with an [`is_invalid`](LockError::is_invalid) error.
    ///
    /// ```
    /// use lock_runtime::{backend::LockKind, LockManager};
    /// assert!(LockManager::memory().supports(LockKind::Semaphore { permits: 3 }));
    /// ```
    pub fn supports(&self, kind: LockKind) -> bool {
        self.inner.backend.supports(kind)
    }

    /// What the store tells of the lock `name` (under this manager's prefix) if it is held:
    /// holder with its label, fencing token, lease left, waiters, as far as the store knows
    /// ([`LockInfo`]). What `lockctl show` prints, for services that expose it themselves.
    /// Refused with an [`is_invalid`](LockError::is_invalid) error on a store that cannot be
    /// inspected ([`LockBackend::inspector`]).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), lock_runtime::LockError> {
    /// let manager = lock_runtime::LockManager::builder().label("billing").memory();
    /// let guard = manager.lock("invoice:7").await?;
    /// let info = manager.inspect("invoice:7").await?.expect("held");
    /// assert_eq!(info.fencing_token, Some(guard.fencing_token()));
    /// assert_eq!(info.holder.as_ref().and_then(|h| h.label()), Some("billing"));
    /// # Ok(()) }
    /// ```
    pub async fn inspect(&self, name: impl AsRef<str>) -> Result<Option<LockInfo>, LockError> {
        let key = format!("{}{}", self.inner.prefix, name.as_ref());
        let inspector = self.inspector(name.as_ref())?;
        self.bounded(&key, "inspect", self.inner.bound, inspector.inspect(&key)).await
    }

    /// The held locks whose name starts with `prefix` (under this manager's prefix), as
    /// [`inspect`](Self::inspect) tells each; what `lockctl list` prints.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), lock_runtime::LockError> {
    /// let manager = lock_runtime::LockManager::memory();
    /// let _a = manager.lock("order:1").await?;
    /// let _b = manager.lock("order:2").await?;
    /// let _c = manager.lock("invoice:1").await?;
    /// let orders = manager.list("order:").await?;
    /// assert_eq!(orders.iter().map(|l| l.key.as_str()).collect::<Vec<_>>(), ["order:1", "order:2"]);
    /// # Ok(()) }
    /// ```
    pub async fn list(&self, prefix: impl AsRef<str>) -> Result<Vec<LockInfo>, LockError> {
        let key = format!("{}{}", self.inner.prefix, prefix.as_ref());
        let inspector = self.inspector(prefix.as_ref())?;
        self.bounded(&key, "list", self.inner.bound, inspector.list(&key)).await
    }

    /// Whether the store can tell who holds a lock ([`LockBackend::inspector`]): what
    /// [`inspect`](Self::inspect), [`list`](Self::list) and an election's
    /// [`leader`](crate::Election::leader) and [`observe`](crate::Election::observe) need.
    ///
    /// ```
    /// assert!(lock_runtime::LockManager::memory().can_inspect());
    /// ```
    pub fn can_inspect(&self) -> bool {
        self.inner.backend.inspector().is_some()
    }

    /// The store's inspection capability, or the error that names the backend without one.
    pub(crate) fn inspector(&self, name: &str) -> Result<&dyn Inspect, LockError> {
        self.inner.backend.inspector().ok_or_else(|| {
            LockError::invalid(
                name,
                format!(
                    "the {} backend cannot tell who holds a lock (it offers no inspection: \
                     `LockBackend::inspector` is `None`)",
                    self.inner.backend.name()
                ),
            )
        })
    }

    pub(crate) fn id(&self) -> u64 {
        self.inner.id
    }

    /// The backend's operation timeout and short name, read once.
    pub(crate) fn bound_and_kind(&self) -> (Duration, &'static str) {
        (self.inner.bound, self.inner.kind)
    }

    pub(crate) fn telemetry(&self) -> &telemetry::Telemetry {
        &self.inner.telemetry
    }
}
