//! [`LockManagerBuilder`]: a manager's settings, then its backend.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use super::{Inner, LockManager, DEFAULT_LEASE, DEFAULT_WAIT};
use crate::backend::memory::MemoryBackend;
use crate::backend::{Holder, LockBackend};
use crate::telemetry::{self, TelemetryNames};

/// Configures a [`LockManager`]; the backend comes last.
///
/// ```
/// use std::time::Duration;
/// let manager = lock_runtime::LockManager::builder()
///     .prefix("myapp:")
///     .default_wait(Duration::from_secs(3))
///     .default_lease(Duration::from_secs(30))
///     .memory();
/// ```
#[derive(Debug, Clone)]
#[must_use = "a builder does nothing until its backend method (e.g. `.memory()`) is called"]
pub struct LockManagerBuilder {
    pub(crate) prefix: String,
    pub(crate) default_wait: Duration,
    pub(crate) default_lease: Duration,
    pub(crate) label: Option<String>,
    /// Its own methods are in `telemetry.rs`.
    pub(crate) telemetry: telemetry::Config,
}

impl Default for LockManagerBuilder {
    fn default() -> Self {
        LockManagerBuilder {
            prefix: String::new(),
            default_wait: DEFAULT_WAIT,
            default_lease: DEFAULT_LEASE,
            label: None,
            telemetry: telemetry::Config::default(),
        }
    }
}

impl LockManagerBuilder {
    /// Prepended to every lock name in the backend (not shown in [`LockGuard::key`](crate::LockGuard::key)).
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// Used when a call gives no `wait` (default [`DEFAULT_WAIT`]).
    pub fn default_wait(mut self, wait: Duration) -> Self {
        self.default_wait = wait;
        self
    }

    /// The watchdog lease used when a call gives no `lease` (default [`DEFAULT_LEASE`]): the
    /// lock is renewed at a third of it while its guard lives, and expires after it if the
    /// holder dies.
    pub fn default_lease(mut self, lease: Duration) -> Self {
        self.default_lease = lease;
        self
    }

    /// A label for this process's locks, stored with each of them next to the host name and
    /// the process id (see [`Holder`]), so that `lockctl` can tell who holds a lock, e.g.
    /// `"billing-worker"`. Characters other than ASCII letters, digits, `-`, `_`, `.` and `:`
    /// become `_`; at most 64 are kept. Default: none. (The text is kept for the life of the
    /// process, once per distinct label.)
    pub fn label(mut self, label: impl Into<String>) -> Self {
        self.label = Some(label.into());
        self
    }

    /// How lock names appear in telemetry (spans, events and metric labels); default
    /// [`TelemetryNames::Plain`].
    ///
    /// ```
    /// use lock_runtime::{LockManager, TelemetryNames};
    ///
    /// // Spans and events show `user:ada@example.com` as a 12-digit hash.
    /// let manager = LockManager::builder().telemetry_names(TelemetryNames::Hashed).memory();
    /// # let _ = manager;
    /// ```
    pub fn telemetry_names(mut self, names: TelemetryNames) -> Self {
        self.telemetry.names = names;
        self
    }

    /// Adds a `name` label to the per-lock metrics: `label` maps a lock name to a label
    /// value, which must come from a small set (each value is a time series of its own; names
    /// themselves are not a label, since there may be millions). A common choice is the name's
    /// prefix up to its first `:` (`order:42` → `order`), as below.
    ///
    /// At most 256 distinct values are kept per manager; further values are counted under
    /// `other`. The value goes through [`telemetry_names`](Self::telemetry_names) like a
    /// name: hashed when names are hashed, and the label left out when they are hidden.
    ///
    /// ```
    /// let manager = lock_runtime::LockManager::builder()
    ///     .metrics_name_label(|name| name.split_once(':').map_or(name, |(prefix, _)| prefix))
    ///     .memory();
    /// # let _ = manager;
    /// ```
    #[cfg(feature = "metrics")]
    #[cfg_attr(docsrs, doc(cfg(feature = "metrics")))]
    pub fn metrics_name_label(mut self, label: impl for<'a> Fn(&'a str) -> &'a str + Send + Sync + 'static) -> Self {
        self.telemetry.name_label = Some(Arc::new(label));
        self
    }

    /// A manager on the in-process backend, with its fast path: an uncontended mutex is taken
    /// in the caller's poll, the guard built in place. (A [`MemoryBackend`] passed to
    /// [`backend`](Self::backend), to keep a handle on it, works the same through the general
    /// path, at a little more cost a lock.)
    pub fn memory(self) -> LockManager {
        let memory = MemoryBackend::new();
        self.build(Arc::new(memory.clone()), Some(memory))
    }

    /// A manager on any [`LockBackend`].
    pub fn backend(self, backend: impl LockBackend) -> LockManager {
        self.build(Arc::new(backend), None)
    }

    /// A manager on a shared backend.
    pub fn backend_arc(self, backend: Arc<dyn LockBackend>) -> LockManager {
        self.build(backend, None)
    }

    fn build(self, backend: Arc<dyn LockBackend>, memory: Option<MemoryBackend>) -> LockManager {
        static IDS: AtomicU64 = AtomicU64::new(1);
        LockManager {
            inner: Arc::new(Inner {
                id: IDS.fetch_add(1, Ordering::Relaxed),
                prefix: self.prefix,
                default_wait: self.default_wait,
                default_lease: self.default_lease,
                holder: Holder::of_process(self.label.as_deref()),
                bound: backend.operation_timeout(),
                kind: backend.name(),
                telemetry: self.telemetry.build(backend.name()),
                backend,
                memory,
                shutdown: Default::default(),
            }),
        }
    }
}
