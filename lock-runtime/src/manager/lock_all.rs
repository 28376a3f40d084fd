//! Multi-name locks ([`LockManager::lock_all`]): every name or none, taken one by one in one
//! global order (so two callers never deadlock), as exclusive locks, on every backend. Run a
//! future under them with [`LockAllRequest::run`] (the run engine).

use std::future::IntoFuture;
use std::sync::Arc;

use super::LockManager;
use crate::backend::BoxFuture;
use crate::error::LockError;
use crate::guard::LockGuard;
use crate::lost::LostSignal;
use crate::options::{self, LockOptions};

/// The most names one [`lock_all`](LockManager::lock_all) takes.
pub const MAX_NAMES: usize = 1024;

/// A request for several exclusive locks at once: `.await` it for a [`LockAllGuard`], or
/// [`run`](LockAllRequest::run) a future under them. Created by [`LockManager::lock_all`].
/// `wait` is for every name together, `lease`, `retry` and `hold_at_least` for each.
#[derive(Debug)]
#[must_use = "a lock request does nothing until it is awaited"]
pub struct LockAllRequest<'m> {
    pub(crate) manager: &'m LockManager,
    /// Sorted, each once.
    pub(crate) names: Vec<Arc<str>>,
    pub(crate) options: LockOptions,
}

impl<'m> LockAllRequest<'m> {
    options::option_setters!();

    /// The names it takes, in the order it takes them (sorted, each once).
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.names.iter().map(|n| &**n)
    }
}

impl<'m> IntoFuture for LockAllRequest<'m> {
    type Output = Result<LockAllGuard, LockError>;
    type IntoFuture = BoxFuture<'m, Result<LockAllGuard, LockError>>;

    fn into_future(self) -> Self::IntoFuture {
        Box::pin(async move {
            let LockAllRequest { manager, names, options } = self;
            Ok(LockAllGuard { guards: acquire_all(manager, names, options).await? })
        })
    }
}

/// Takes every one of `names` (sorted, each once) within the request's `wait`, or none.
pub(crate) async fn acquire_all(
    manager: &LockManager,
    names: Vec<Arc<str>>,
    options: LockOptions,
) -> Result<Vec<LockGuard>, LockError> {
    if names.is_empty() {
        return Err(LockError::invalid("", "`lock_all` was given no names; give at least one"));
    }
    if names.len() > MAX_NAMES {
        return Err(LockError::invalid(
            &*names[0],
            format!("`lock_all` was given {} names; the most accepted is {MAX_NAMES}", names.len()),
        ));
    }
    // Every name is checked before any is taken.
    for name in &names {
        options::check_name(name)?;
    }
    let wait = options.wait_for().unwrap_or_else(|| manager.default_wait());
    options::check_wait(&names[0], wait)?;
    let started = crate::clock::now();
    let deadline = started.checked_add(wait).unwrap_or(started);
    // Dropped with the future (cancelled half-way): every guard in it releases at once.
    let mut taken = Partial(Vec::with_capacity(names.len()));
    for name in names {
        let remaining = deadline.saturating_duration_since(crate::clock::now());
        match manager.lock_named(name).options(options.wait(remaining)).await {
            Ok(guard) => taken.0.push(guard),
            Err(e) => {
                release_all(std::mem::take(&mut taken.0)).await;
                return Err(e);
            }
        }
    }
    Ok(std::mem::take(&mut taken.0))
}

/// The locks a `lock_all` took so far: a rollback frees them at once, whatever `hold_at_least`
/// said (that is for a completed holding, released by its holder).
struct Partial(Vec<LockGuard>);

impl Drop for Partial {
    fn drop(&mut self) {
        for guard in self.0.drain(..) {
            drop(guard.without_hold());
        }
    }
}

/// Releases every guard, awaiting each (errors only logged: the caller reports its own).
async fn release_all(guards: Vec<LockGuard>) {
    for guard in guards {
        let name = guard.key().to_owned();
        if let Err(e) = guard.without_hold().release().await {
            tracing::debug!(lock = %name, error = %e, "release of a partial lock_all failed");
        }
    }
}

/// Every lock of a [`LockManager::lock_all`]: released together, lost if any one is lost.
/// Dropping it releases them all in the background.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), lock_runtime::LockError> {
/// let manager = lock_runtime::LockManager::memory();
/// let all = manager.lock_all(["b", "a", "b"]).await?;
/// assert_eq!(all.len(), 2);
/// let tokens = all.fencing_tokens();
/// assert_eq!(all.fencing_token(), tokens.iter().copied().max().unwrap_or(0));
/// all.release().await?;
/// # Ok(()) }
/// ```
#[derive(Debug)]
#[must_use = "the locks are released as soon as the guard is dropped"]
pub struct LockAllGuard {
    /// In the global order (sorted by name).
    guards: Vec<LockGuard>,
}

impl LockAllGuard {
    /// The names held, in the global order (sorted, each once), without the manager prefix.
    pub fn keys(&self) -> impl Iterator<Item = &str> {
        self.guards.iter().map(LockGuard::key)
    }

    /// How many names are held.
    pub fn len(&self) -> usize {
        self.guards.len()
    }

    /// Whether it holds no name (never, for a granted `lock_all`).
    pub fn is_empty(&self) -> bool {
        self.guards.is_empty()
    }

    /// The fencing token of each name, in the order of [`keys`](Self::keys).
    pub fn fencing_tokens(&self) -> Vec<u64> {
        self.guards.iter().map(LockGuard::fencing_token).collect()
    }

    /// The greatest of the [`fencing_tokens`](Self::fencing_tokens).
    pub fn fencing_token(&self) -> u64 {
        self.guards.iter().map(LockGuard::fencing_token).max().unwrap_or(0)
    }

    /// The guard of each name, in the order of [`keys`](Self::keys).
    pub fn guards(&self) -> &[LockGuard] {
        &self.guards
    }

    /// Completes when any one of the locks is lost.
    pub async fn lost(&self) {
        let signals: Vec<((), LostSignal)> = self.guards.iter().map(|g| ((), g.lost_signal().clone())).collect();
        crate::lost::first_lost(&signals).await;
    }

    /// Whether any one of the locks is known to be lost.
    pub fn is_lost(&self) -> bool {
        self.guards.iter().any(LockGuard::is_lost)
    }

    /// Releases every lock. An [`is_lost`](LockError::is_lost) error (the first, if several)
    /// means one of them was no longer held; every one is released either way.
    pub async fn release(self) -> Result<(), LockError> {
        let mut verdict = Ok(());
        for guard in self.guards {
            if let Err(e) = guard.release().await {
                if verdict.is_ok() {
                    verdict = Err(e);
                }
            }
        }
        verdict
    }
}
