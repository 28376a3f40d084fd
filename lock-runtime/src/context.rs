//! The task-scoped lock context: [`current()`] and reentrancy.
//!
//! A locked call runs its body inside a scope that records which locks the task holds,
//! innermost first. A nested locked call with the same manager and name re-enters instead of
//! waiting for itself; `current()` reads the innermost entry. The scope belongs to the task: a
//! task spawned from a locked body starts with an empty context.
//!
//! The scope is a thread-local slot that the locked call's future fills on each poll of its
//! body and empties again after it (also on unwind): a swap of a few words each way, cheaper
//! than `tokio::task_local!`, and just as bound to the task, since only the task polling the
//! body can see it.

use std::cell::Cell;
use std::mem::ManuallyDrop;
use std::sync::Arc;

use crate::error::LockError;
use crate::kind::LockKind;
use crate::lost::LostSignal;

thread_local! {
    /// The innermost lock of the locked call being polled on this thread; outer ones hang off
    /// `parent`. Set only while a locked call polls (or drops) its body ([`within`]), so it belongs to the task
    /// doing the polling. Inline (not boxed), so the outermost locked call allocates nothing for
    /// its context.
    //
    // Kept as `ManuallyDrop` so that the slot has nothing to drop at thread exit (no destructor
    // to register, no liveness check on each access): a frame is only ever in it while a locked
    // call polls (or drops) its body, or reads it, and is always taken back out.
    static HELD: Cell<Option<ManuallyDrop<Frame>>> = const { Cell::new(None) };
}

/// One lock held by the current task.
#[derive(Debug, Clone)]
pub(crate) struct Frame {
    pub(crate) manager: u64,
    /// What it holds: a mutex ([`LockKind::Exclusive`]), a read or write lock, or a permit.
    pub(crate) kind: LockKind,
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
    with_innermost(|f| f.map(|f| CurrentLock { name: f.name.clone(), fencing_token: f.fencing_token }))
}

/// The names of every lock the running locked call holds, innermost first (empty outside one):
/// what [`testing::assert_locked`](crate::testing::assert_locked) checks against.
#[cfg(feature = "testing")]
pub(crate) fn held_names() -> Vec<Arc<str>> {
    with_innermost(|innermost| {
        let mut names = Vec::new();
        let mut frame = innermost;
        while let Some(f) = frame {
            names.push(f.name.clone());
            frame = f.parent.as_deref();
        }
        names
    })
}

/// Calls `f` with the innermost frame of the running locked call (`None` outside one).
#[inline]
fn with_innermost<T>(f: impl FnOnce(Option<&Frame>) -> T) -> T {
    let Some(innermost) = HELD.try_with(Cell::take).ok().flatten().map(ManuallyDrop::into_inner) else {
        return f(None);
    };
    // Put back by a guard, so a panic in `f` leaves the context as it was.
    let innermost = Restore(Some(innermost));
    f(innermost.0.as_ref())
}

/// Puts the innermost frame back into the thread's context when dropped.
struct Restore(Option<Frame>);

impl Drop for Restore {
    #[inline]
    fn drop(&mut self) {
        let frame = self.0.take();
        let _ = HELD.try_with(|held| held.set(frame.map(ManuallyDrop::new)));
    }
}

/// What a locked call finds in its task's context before taking its lock.
pub(crate) struct Lookup {
    /// The frame of the same manager and name, if this task already holds that lock.
    pub(crate) held: Option<Frame>,
    /// The innermost frame, to become the parent of the new one.
    pub(crate) parent: Option<Arc<Frame>>,
}

/// Looks `name` on `manager` up in the task's context, in the namespace of `kind` (one
/// thread-local access; none held: no allocation).
#[inline]
pub(crate) fn lookup(manager: u64, name: &str, kind: LockKind) -> Lookup {
    with_innermost(|innermost| match innermost {
        None => Lookup { held: None, parent: None },
        Some(innermost) => lookup_in(innermost, manager, name, kind),
    })
}

/// The namespace of a kind: read and write locks share one, semaphores and mutexes each have
/// their own. A frame is re-entered (or refused) only by a request of its namespace.
fn space(kind: LockKind) -> u8 {
    match kind {
        LockKind::Read | LockKind::Write => 1,
        LockKind::Semaphore { .. } => 2,
        _ => 0,
    }
}

/// A request of `kind` made where the task holds `outer` on the same name (and namespace):
/// re-enters, or is refused (a write inside a read; a semaphore's permits that differ from the
/// held one's).
#[cold]
pub(crate) fn check_reentry(name: &str, kind: LockKind, outer: &Frame) -> Result<(), LockError> {
    match (outer.kind, kind) {
        (LockKind::Read, LockKind::Write) => Err(LockError::invalid(
            name,
            "a write lock was asked for inside a read lock of the same name in this task: upgrading a read lock \
             would deadlock; take the write lock first (a read inside a write re-enters)",
        )),
        (LockKind::Semaphore { permits: held }, LockKind::Semaphore { permits }) if held != permits => {
            Err(LockError::invalid(
                name,
                format!(
                    "a permit of a semaphore of {permits} permits was asked for inside a held permit of the same \
                     name with {held} permits in this task; every holder and waiter must give the same permits"
                ),
            ))
        }
        _ => Ok(()),
    }
}

/// [`lookup`] inside a locked call (the nested, less common case).
#[inline(never)]
fn lookup_in(innermost: &Frame, manager: u64, name: &str, kind: LockKind) -> Lookup {
    let mut frame = Some(innermost);
    let mut held = None;
    while let Some(f) = frame {
        if f.manager == manager && *f.name == *name && space(f.kind) == space(kind) {
            held = Some(f.clone());
            break;
        }
        frame = f.parent.as_deref();
    }
    Lookup { held, parent: Some(Arc::new(innermost.clone())) }
}

/// Where a locked call keeps its innermost frame: swapped with the thread's slot while its body
/// is polled ([`within`]), so that meanwhile it holds the outer context. Dropping it drops the
/// frame it holds.
pub(crate) struct FrameSlot(Option<ManuallyDrop<Frame>>);

impl FrameSlot {
    pub(crate) const EMPTY: FrameSlot = FrameSlot(None);

    /// The frame held, if any.
    #[inline]
    pub(crate) fn get(&self) -> Option<&Frame> {
        self.0.as_deref()
    }

    #[inline]
    pub(crate) fn is_some(&self) -> bool {
        self.0.is_some()
    }

    /// Holds `frame`, dropping the one held before.
    #[inline]
    pub(crate) fn set(&mut self, frame: Frame) {
        *self = FrameSlot(Some(ManuallyDrop::new(frame)));
    }
}

impl Drop for FrameSlot {
    #[inline]
    fn drop(&mut self) {
        if let Some(frame) = self.0.take() {
            drop(ManuallyDrop::into_inner(frame));
        }
    }
}

/// Runs `f` with the frame of `slot` installed as the thread's innermost lock, then swaps it
/// back out and restores the outer context (also when `f` panics). While `f` runs, `slot`
/// holds the outer context: two swaps of the slots' words, nothing dropped.
#[inline(always)]
pub(crate) fn within<T>(slot: &mut FrameSlot, f: impl FnOnce() -> T) -> T {
    let slot = Cell::from_mut(&mut slot.0);
    if HELD.try_with(|held| held.swap(slot)).is_err() {
        return f(); // the thread is exiting: run without context
    }
    let _back = SwapBack(slot);
    f()
}

/// Swaps the scope's frame and the outer context back when dropped.
struct SwapBack<'a>(&'a Cell<Option<ManuallyDrop<Frame>>>);

impl Drop for SwapBack<'_> {
    #[inline]
    fn drop(&mut self) {
        let _ = HELD.try_with(|held| held.swap(self.0));
    }
}
