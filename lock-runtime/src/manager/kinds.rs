//! The manager's requests for the lock kinds beside the mutex (the kinds themselves: `kind.rs`).

use std::sync::Arc;
use std::time::Duration;

use super::lock_all::{LockAllGuard, LockAllRequest};
use super::LockManager;
use super::LockRequest;
use crate::backend::LockKind;
use crate::error::LockError;
use crate::guard::LockGuard;
use crate::options::LockOptions;

impl LockManager {
    /// Asks for the read side of the read-write lock `name`: any number of readers at once,
    /// none while a writer holds it (and, on a fair backend, none while a writer waits).
    /// Read-write locks are a namespace apart from [`lock`](Self::lock): `read_lock("catalog")`
    /// and `lock("catalog")` never exclude each other. `.await` it for a [`LockGuard`].
    ///
    /// Backends: memory, Redis (one server, Cluster, Sentinel), ZooKeeper, etcd and
    /// PostgreSQL; one that does not offer it (Redlock, MySQL, lock files) refuses it with an
    /// [`is_invalid`](LockError::is_invalid) error.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), lock_runtime::LockError> {
    /// let manager = lock_runtime::LockManager::memory();
    /// let a = manager.read_lock("catalog").await?;
    /// let b = manager.read_lock("catalog").await?; // readers share
    /// assert!(manager.try_write_lock("catalog").await?.is_none()); // a writer waits for them
    /// a.release().await?;
    /// b.release().await?;
    /// assert!(manager.try_write_lock("catalog").await?.is_some());
    /// # Ok(()) }
    /// ```
    pub fn read_lock(&self, name: impl AsRef<str>) -> LockRequest<'_> {
        self.kind_request(name, LockKind::Read)
    }

    /// Asks for the write side of the read-write lock `name`: no other reader or writer at
    /// once. See [`read_lock`](Self::read_lock).
    ///
    /// ```
    /// # use std::time::Duration;
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), lock_runtime::LockError> {
    /// let manager = lock_runtime::LockManager::memory();
    /// let writer = manager.write_lock("catalog").wait(Duration::from_secs(1)).await?;
    /// assert!(manager.try_read_lock("catalog").await?.is_none());
    /// assert!(manager.try_lock("catalog").await?.is_some()); // another namespace
    /// writer.release().await?;
    /// # Ok(()) }
    /// ```
    pub fn write_lock(&self, name: impl AsRef<str>) -> LockRequest<'_> {
        self.kind_request(name, LockKind::Write)
    }

    /// Asks for one of `permits` permits of the semaphore `name`: at most `permits` holders at
    /// once. Every holder and waiter of `name` must give the same `permits`; a different one is
    /// an [`is_invalid`](LockError::is_invalid) error (never more holders than agreed), and so
    /// is zero. Semaphores are a namespace of their own.
    ///
    /// Backends: memory, Redis (one server, Cluster, Sentinel), ZooKeeper, etcd and
    /// PostgreSQL; one that does not offer it (Redlock, MySQL, lock files) refuses it with an
    /// [`is_invalid`](LockError::is_invalid) error.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), lock_runtime::LockError> {
    /// let manager = lock_runtime::LockManager::memory();
    /// let one = manager.semaphore("exports", 2).await?;
    /// let two = manager.semaphore("exports", 2).await?;
    /// assert!(manager.try_semaphore("exports", 2).await?.is_none()); // both permits taken
    /// assert!(manager.semaphore("exports", 3).await.unwrap_err().is_invalid()); // disagrees
    /// one.release().await?;
    /// two.release().await?;
    /// # Ok(()) }
    /// ```
    pub fn semaphore(&self, name: impl AsRef<str>, permits: u32) -> LockRequest<'_> {
        self.kind_request(name, LockKind::Semaphore { permits })
    }

    fn kind_request(&self, name: impl AsRef<str>, kind: LockKind) -> LockRequest<'_> {
        LockRequest { manager: self, name: Arc::from(name.as_ref()), kind, options: LockOptions::new() }
    }

    /// [`read_lock`](Self::read_lock) with one attempt, no waiting: `Ok(None)` when a writer
    /// holds or waits for it.
    pub async fn try_read_lock(&self, name: impl AsRef<str>) -> Result<Option<LockGuard>, LockError> {
        contended_is_none(self.read_lock(name).wait(Duration::ZERO).retry(0).await)
    }

    /// [`write_lock`](Self::write_lock) with one attempt, no waiting: `Ok(None)` when held.
    pub async fn try_write_lock(&self, name: impl AsRef<str>) -> Result<Option<LockGuard>, LockError> {
        contended_is_none(self.write_lock(name).wait(Duration::ZERO).retry(0).await)
    }

    /// [`semaphore`](Self::semaphore) with one attempt, no waiting: `Ok(None)` when every
    /// permit is taken.
    pub async fn try_semaphore(&self, name: impl AsRef<str>, permits: u32) -> Result<Option<LockGuard>, LockError> {
        contended_is_none(self.semaphore(name, permits).wait(Duration::ZERO).retry(0).await)
    }

    /// Asks for every one of `names` or none (exclusive locks, as [`lock`](Self::lock) takes
    /// them), within one `wait`. They are taken one by one in one global order (sorted, each
    /// once) whatever order they are given in, so two callers never deadlock; if one cannot
    /// be taken in time, or the future is dropped half-way, those already taken are released.
    /// Works on every backend. `.await` it for a [`LockAllGuard`].
    ///
    /// ```
    /// # use std::time::Duration;
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), lock_runtime::LockError> {
    /// let manager = lock_runtime::LockManager::memory();
    /// let both = manager.lock_all(["acct:2", "acct:1"]).wait(Duration::from_secs(2)).await?;
    /// assert_eq!(both.keys().collect::<Vec<_>>(), ["acct:1", "acct:2"]); // in the global order
    /// assert!(manager.try_lock("acct:2").await?.is_none());
    /// both.release().await?;
    /// # Ok(()) }
    /// ```
    pub fn lock_all<I>(&self, names: I) -> LockAllRequest<'_>
    where
        I: IntoIterator,
        I::Item: AsRef<str>,
    {
        let mut names: Vec<Arc<str>> = names.into_iter().map(|n| Arc::from(n.as_ref())).collect();
        names.sort();
        names.dedup();
        LockAllRequest { manager: self, names, options: LockOptions::new() }
    }

    /// [`lock_all`](Self::lock_all) with one attempt per name, no waiting: `Ok(None)` (and
    /// nothing held) when one of them is held.
    pub async fn try_lock_all<I>(&self, names: I) -> Result<Option<LockAllGuard>, LockError>
    where
        I: IntoIterator,
        I::Item: AsRef<str>,
    {
        contended_is_none(self.lock_all(names).wait(Duration::ZERO).retry(0).await)
    }
}

/// The error of a kind the backend does not offer.
pub(super) fn unsupported(name: &str, backend: &'static str, kind: LockKind) -> LockError {
    LockError::invalid(
        name,
        format!(
            "the {backend} backend does not support a {kind} (it offers exclusive locks); use `lock` or `lock_all`, \
             or a backend that offers it (memory, Redis on one server, Cluster or Sentinel, ZooKeeper, etcd, PostgreSQL)"
        ),
    )
}

/// A `try_*` form's answer: a contended lock is `None`.
fn contended_is_none<T>(result: Result<T, LockError>) -> Result<Option<T>, LockError> {
    match result {
        Ok(guard) => Ok(Some(guard)),
        Err(e) if e.is_contended() => Ok(None),
        Err(e) => Err(e),
    }
}
