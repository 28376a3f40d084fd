//! Support for the code `#[distributed_locked]` expands to. Not a public API: anything here
//! may change in any release.

use std::borrow::Borrow;
use std::future::Future;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

pub use crate::error::LockError;
pub use crate::manager::LockManager;
pub use crate::options::LockOptions;

use crate::context::{self, Frame};
use crate::guard::LockGuard;

/// What to do with the body when the lease is lost while it runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnLost {
    /// Stop the body at its next await and return the lost error.
    Abort,
    /// Let the body run to its end.
    Ignore,
}

/// A duration of `ms` milliseconds (the macro has already checked the literal).
pub const fn millis(ms: u64) -> Duration {
    Duration::from_millis(ms)
}

/// The default lock name: md5 hex of `"<module_path>::<fn_name>"`, computed once per fn.
pub fn default_name(cell: &'static OnceLock<String>, module_path: &str, fn_name: &str) -> &'static str {
    cell.get_or_init(|| format!("{:x}", md5::compute(format!("{module_path}::{fn_name}"))))
}

/// The manager set with [`set_default`](crate::set_default), or the not-configured error.
pub fn default_manager(name: &str) -> Result<LockManager, LockError> {
    crate::manager::default_manager().ok_or_else(|| LockError::NotConfigured { name: name.to_owned() })
}

/// Takes (or re-enters) the lock for a locked call.
pub async fn enter<M: Borrow<LockManager>>(
    manager: M,
    name: impl Into<Arc<str>>,
    options: LockOptions,
) -> Result<Entered, LockError> {
    let manager = manager.borrow();
    let name = name.into();
    if let Some(outer) = context::find(manager.id(), &name) {
        // Same task, same manager, same name: re-enter without waiting for ourselves.
        let frame = Arc::new(Frame {
            manager: outer.manager,
            name: outer.name.clone(),
            fencing_token: outer.fencing_token,
            lost: outer.lost.clone(),
            parent: context::innermost(),
        });
        return Ok(Entered { guard: None, frame });
    }
    let guard = manager.acquire(name, options).await?;
    let frame = Arc::new(Frame {
        manager: manager.id(),
        name: guard.key().into(),
        fencing_token: guard.fencing_token(),
        lost: guard.lost_signal().clone(),
        parent: context::innermost(),
    });
    Ok(Entered { guard: Some(guard), frame })
}

/// A lock taken (or re-entered) for one locked call; runs the body.
#[derive(Debug)]
#[must_use]
pub struct Entered {
    /// `None` when re-entered: the outermost call releases.
    guard: Option<LockGuard>,
    frame: Arc<Frame>,
}

impl Entered {
    /// Runs `body` under the lock and releases it afterwards (and on panic or cancellation,
    /// through the guard's `Drop`). With [`OnLost::Abort`], a loss of the lease stops the body
    /// at its next await and returns the lost error.
    pub async fn run<F: Future>(self, on_lost: OnLost, body: F) -> Result<F::Output, LockError> {
        if on_lost == OnLost::Ignore {
            return Ok(self.run_to_end(body).await);
        }
        let Entered { guard, frame } = self;
        let lost = frame.lost.clone();
        let name = frame.name.clone();
        let output = context::scope(frame, async move {
            tokio::select! {
                biased;
                output = body => Ok(output),
                _ = lost.wait() => Err(LockError::lost(
                    &*name,
                    lost.reason().unwrap_or_else(|| "its lease ran out".to_owned()),
                )),
            }
        })
        .await;
        if let Some(guard) = guard {
            if let Err(e) = guard.release().await {
                if e.is_lost() && output.is_ok() {
                    return Err(e);
                }
                tracing::warn!(error = %e, "release after a locked call failed");
            }
        }
        output
    }

    /// Runs `body` to its end under the lock (for [`OnLost::Ignore`], or return types that
    /// cannot carry a [`LockError`]), then releases it.
    pub async fn run_to_end<F: Future>(self, body: F) -> F::Output {
        let Entered { guard, frame } = self;
        let output = context::scope(frame, body).await;
        if let Some(guard) = guard {
            if let Err(e) = guard.release().await {
                tracing::warn!(error = %e, "release after a locked call failed");
            }
        }
        output
    }
}
