//! The task-scoped lock context: [`current()`] and reentrancy.
//!
//! A locked call runs its body inside a task-local scope that records which locks the task
//! holds, innermost first. A nested locked call with the same manager and name re-enters
//! instead of waiting for itself; `current()` reads the innermost entry. The scope belongs to
//! the task: a task spawned from a locked body starts with an empty context.

use std::future::Future;
use std::sync::Arc;

use crate::lost::LostSignal;

tokio::task_local! {
    static HELD: Option<Arc<Frame>>;
}

/// One lock held by the current task.
#[derive(Debug)]
pub(crate) struct Frame {
    pub(crate) manager: u64,
    pub(crate) name: Arc<str>,
    pub(crate) fencing_token: u64,
    pub(crate) lost: LostSignal,
    pub(crate) parent: Option<Arc<Frame>>,
}

/// The innermost lock held by the current locked call, as seen by [`current()`].
///
/// ```
/// assert!(lock_runtime::current().is_none()); // outside a locked call
/// ```
#[derive(Debug, Clone)]
pub struct CurrentLock {
    name: Arc<str>,
    fencing_token: u64,
}

impl CurrentLock {
    /// The rendered lock name, e.g. `"order:42"` (without the manager prefix).
    pub fn key(&self) -> &str {
        &self.name
    }

    /// The fencing token the lock was granted with: strictly greater than every earlier token
    /// for this name. Pass it to downstream stores so they can reject a stale holder.
    pub fn fencing_token(&self) -> u64 {
        self.fencing_token
    }
}

/// The innermost lock held by the locked call this task is running, or `None` outside one.
///
/// ```
/// use lock_runtime::{distributed_locked, LockError, LockManager};
///
/// #[distributed_locked(name = "report:{day}", manager = LockManager::memory())]
/// async fn build_report(day: u32) -> Result<String, LockError> {
///     let lock = lock_runtime::current().expect("inside a locked call");
///     Ok(format!("{} #{}", lock.key(), lock.fencing_token()))
/// }
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), LockError> {
/// assert!(build_report(7).await?.starts_with("report:7 #"));
/// # Ok(()) }
/// ```
pub fn current() -> Option<CurrentLock> {
    innermost().map(|f| CurrentLock { name: f.name.clone(), fencing_token: f.fencing_token })
}

pub(crate) fn innermost() -> Option<Arc<Frame>> {
    HELD.try_with(|held| held.clone()).ok().flatten()
}

/// The frame of `name` on `manager` if this task already holds it.
pub(crate) fn find(manager: u64, name: &str) -> Option<Arc<Frame>> {
    let mut frame = innermost();
    while let Some(f) = frame {
        if f.manager == manager && *f.name == *name {
            return Some(f);
        }
        frame = f.parent.clone();
    }
    None
}

/// Runs `body` with `frame` pushed on the task's context.
pub(crate) fn scope<F: Future>(frame: Arc<Frame>, body: F) -> impl Future<Output = F::Output> {
    HELD.scope(Some(frame), body)
}
