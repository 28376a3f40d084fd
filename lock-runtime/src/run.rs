//! The run engine: a future run under held locks, with reentrancy and [`current()`].
//!
//! [`Locked`] is the engine. It takes (or re-enters) its lock in place ([`Locked::enter`]),
//! then runs the body it is given ([`Locked::start`]) in the lock's context, stops it when the
//! lock is lost, and releases. [`LockRequest::run`] is the same engine in one step ([`Run`]);
//! `#[distributed_locked]` uses the two steps, since a call's arguments go to its fallback when
//! the lock is not taken; [`LockAllRequest::run`] enters several locks into one engine.
//!
//! [`current()`]: crate::context::current

use std::fmt;
use std::future::{Future, IntoFuture};
use std::mem::ManuallyDrop;
use std::pin::{pin, Pin};
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use std::time::Duration;

use crate::backend::{BoxFuture, Held, HeldLock, LockKind};
use crate::context::{check_reentry, lookup, within, Frame, FrameSlot, Lookup};
use crate::error::LockError;
use crate::guard::{LockGuard, ReleaseFuture};
use crate::manager::{acquire_all, LockAllRequest, LockFuture, LockManager, LockRequest};
use crate::telemetry::Holding;

impl<'m> LockRequest<'m> {
    /// Runs `fut` while this lock is held: the future of
    /// `#[distributed_locked]` without the attribute, like tracing's `Instrument`.
    ///
    /// Awaiting the returned [`Run`]:
    ///
    /// 1. takes the lock as awaiting the request would (`wait`, `lease`, `retry`); if it cannot
    ///    be taken, `fut` is dropped without being polled and the error is returned;
    /// 2. polls `fut` with [`current()`](crate::context::current) giving the lock's key and fencing
    ///    token;
    /// 3. releases the lock when `fut` completes and returns `Ok(output)`. A release that finds
    ///    the lock lost returns the [`is_lost`](LockError::is_lost) error instead.
    ///
    /// **Reentrancy:** inside a `run` (or a locked fn) of the same task, a `run` with the same
    /// manager and name runs its future at once, under the outer lock (whose key and token
    /// [`current()`](crate::context::current) keeps giving); the outermost one releases. Other tasks
    /// wait as usual; a task spawned from inside is another task.
    ///
    /// **Kinds:** a read lock, write lock or permit re-enters the same way (same task, manager
    /// and name, in its namespace): a read inside a read or a write
    /// enters at once, as does a write inside a write and a permit inside a permit; a write
    /// inside a read is refused at once with an [`is_invalid`](LockError::is_invalid) error
    /// (upgrading a read lock would deadlock).
    ///
    /// ```
    /// use lock_runtime::{LockError, LockManager};
    ///
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), LockError> {
    /// let manager = LockManager::memory();
    /// manager
    ///     .read_lock("catalog")
    ///     .run(async {
    ///         let nested = manager.read_lock("catalog").run(async { 1 }).await?; // re-enters
    ///         let upgrade = manager.write_lock("catalog").run(async { 2 }).await;
    ///         assert!(upgrade.unwrap_err().is_invalid()); // never a hang
    ///         Ok::<_, LockError>(nested)
    ///     })
    ///     .await??;
    /// # Ok(()) }
    /// ```
    ///
    /// **Loss:** if the lock is lost while `fut` runs (a fixed `lease` ran out, a renewal was
    /// refused), `fut` is dropped at its next poll and the lost error returned; with
    /// [`ignore_lost`](Run::ignore_lost), `fut` runs to its end instead and its output is
    /// returned.
    ///
    /// **Release on every exit:** dropping the `Run` (cancellation) or a panic in `fut` drops
    /// the guard, which releases the lock, and leaves the task's context as it was.
    ///
    /// **Tracing:** `fut` is polled inside the lock's `lock.hold` span (a child of the span
    /// current when the lock was taken), so its spans and events nest under the lock; see the
    /// crate docs' *Telemetry*.
    ///
    /// ```
    /// use lock_runtime::{LockError, LockManager};
    ///
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), LockError> {
    /// let manager = LockManager::memory();
    /// let token = manager
    ///     .lock("order:42")
    ///     .run(async {
    ///         let lock = lock_runtime::current().expect("inside the run");
    ///         assert_eq!(lock.key(), "order:42");
    ///         // Same task, same manager, same name: enters at once instead of waiting.
    ///         let nested = manager.lock("order:42").run(async { lock_runtime::current() }).await?;
    ///         assert_eq!(nested.map(|l| l.fencing_token()), Some(lock.fencing_token()));
    ///         assert!(manager.try_lock("order:42").await?.is_none()); // still held
    ///         Ok::<_, LockError>(lock.fencing_token())
    ///     })
    ///     .await??;
    /// assert!(token > 0);
    /// assert!(lock_runtime::current().is_none());
    /// assert!(manager.try_lock("order:42").await?.is_some()); // released
    /// # Ok(()) }
    /// ```
    pub fn run<F: Future>(self, fut: F) -> Run<'m, F> {
        let mut locked = Locked::new();
        locked.body = Some(fut);
        Run { locked, entry: Entry::Start(self) }
    }
}

pin_project_lite::pin_project! {
    /// The future of [`LockRequest::run`]: `Ok(output)` of the future run under the lock, or
    /// the [`LockError`] of taking (or losing) the lock. A [`Locked`] run entered by its first
    /// poll.
    ///
    /// `Send` when the future and its output are.
    #[must_use = "futures do nothing unless polled"]
    pub struct Run<'m, F: Future> {
        // The engine, with the body given; dropped first (the body in its context, then the
        // lock, which releases).
        #[pin]
        locked: Locked<F>,
        entry: Entry<'m>,
    }
}

/// How far a [`Run`] is in taking its lock. `Unpin`: only the body is pinned.
enum Entry<'m> {
    /// Not polled yet: the context is looked up on the first poll, in the polling task.
    Start(LockRequest<'m>),
    /// Taking the lock.
    Taking(Taking<'m>),
    /// Entered, or failed to: the engine has it from here.
    Entered,
}

impl<F: Future> fmt::Debug for Run<'_, F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let stage = match &self.entry {
            Entry::Start(_) => "start",
            Entry::Taking(_) => "taking",
            Entry::Entered => return self.locked.fmt(f),
        };
        f.debug_struct("Run").field("stage", &stage).field("abort_on_lost", &self.locked.abort_on_lost).finish()
    }
}

impl<'m, F: Future> Run<'m, F> {
    /// Lets the future run to its end when the lock is lost while it runs (the default is to
    /// drop it at its next poll and return the lost error). Its output is returned either way,
    /// and a release that finds the lock lost is only logged: check fencing tokens downstream,
    /// since a lost lock means the work may not have been exclusive.
    ///
    /// ```
    /// use std::time::Duration;
    /// use lock_runtime::LockManager;
    ///
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), lock_runtime::LockError> {
    /// let manager = LockManager::memory();
    /// let done = manager
    ///     .lock("export")
    ///     .lease(Duration::from_millis(20))
    ///     .run(async {
    ///         tokio::time::sleep(Duration::from_millis(50)).await; // outlives the lease
    ///         "done"
    ///     })
    ///     .ignore_lost()
    ///     .await?;
    /// assert_eq!(done, "done");
    /// # Ok(()) }
    /// ```
    pub fn ignore_lost(mut self) -> Self {
        self.locked.abort_on_lost = false;
        self
    }
}

impl<F: Future> Future for Run<'_, F> {
    type Output = Result<F::Output, LockError>;

    #[inline]
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let mut locked = this.locked;
        if !matches!(this.entry, Entry::Entered) {
            let entered = ready!(poll_entry(this.entry, cx, locked.as_mut().project().hold));
            if let Err(e) = entered {
                locked.project().body.set(None); // never run: the lock was not taken
                return Poll::Ready(Err(e));
            }
        }
        locked.poll(cx)
    }
}

/// Drives a run's entry until its lock is in `hold` (taken or re-entered), or failed.
#[inline]
fn poll_entry(entry: &mut Entry<'_>, cx: &mut Context<'_>, hold: &mut Hold) -> Poll<Result<(), LockError>> {
    if let Entry::Start(_) = entry {
        if let Entry::Start(request) = std::mem::replace(entry, Entry::Entered) {
            let manager = request.manager.id();
            if let Some(parent) = reenter(manager, &request.name, request.kind, hold) {
                *entry = Entry::Taking(Taking::new(request, parent));
            }
        }
    }
    match entry {
        Entry::Taking(taking) => {
            let taken = ready!(taking.poll(cx, hold));
            *entry = Entry::Entered;
            Poll::Ready(taken)
        }
        _ => Poll::Ready(Ok(())),
    }
}

/// A lock being taken, for a run.
pub(crate) struct Taking<'m> {
    lock: LockFuture<'m>,
    manager: u64,
    kind: LockKind,
    /// The task's innermost frame, to hang the new one under.
    parent: Option<Arc<Frame>>,
}

/// The locks of a run while its body runs; empty before it is entered and after it is
/// released.
pub(crate) struct Hold {
    /// `None` when re-entered: the outermost run releases. A run of several locks holds them
    /// as one ([`several`]).
    pub(crate) guard: Option<LockGuard>,
    /// The innermost lock's frame (`None`: not entered); swapped into the task's context while
    /// the body is polled (or dropped), and holding the outer context meanwhile.
    pub(crate) frame: FrameSlot,
    /// Completes with the lost error once a lock is lost; set up on the first poll of the
    /// body when the loss aborts it and a lock can be lost.
    pub(crate) watch: Option<Watch>,
}

/// Completes with the lost error once the lock is lost. Boxed: the watch (a timer and a
/// notification) would otherwise make every run as large as the watched one. A lock that can
/// be lost lives on a networked backend (or has a fixed lease), where one allocation is noise.
type Watch = Pin<Box<dyn Future<Output = LockError> + Send>>;

/// A release being awaited (a networked backend's, or those of a run of several locks), with
/// the output of the body (`Err`: the lost error it was stopped with).
struct Pending<T> {
    release: ReleaseFuture,
    output: Result<T, LockError>,
}

/// Looks `name` up in the task's context: re-entered at once into `hold` when the task holds it
/// (`None`), else `Some(parent)`, the task's innermost frame, for [`Taking::new`]. Call it while
/// polling, in the task that will run the body.
///
/// A held lock of the name's namespace that this `kind` cannot re-enter (a write inside a read,
/// a semaphore's other permits) is left to the taking, whose checks refuse it at once.
#[inline(always)]
pub(crate) fn reenter(manager: u64, name: &str, kind: LockKind, hold: &mut Hold) -> Option<Option<Arc<Frame>>> {
    let Lookup { held, parent } = lookup(manager, name, kind);
    match held {
        Some(outer) if kind == LockKind::Exclusive || check_reentry(name, kind, &outer).is_ok() => {
            hold.frame.set(Frame { parent, ..outer });
            None
        }
        _ => Some(parent),
    }
}

impl<'m> Taking<'m> {
    /// Takes the lock of `request` (see [`reenter`]).
    #[inline(always)]
    pub(crate) fn new(request: LockRequest<'m>, parent: Option<Arc<Frame>>) -> Self {
        Taking { manager: request.manager.id(), kind: request.kind, lock: request.into_future(), parent }
    }
}

impl Taking<'_> {
    /// Whether it owns nothing any more: its lock was taken (the future is done) and its parent
    /// frame handed on to the lock's.
    fn is_spent(&self) -> bool {
        self.parent.is_none() && self.lock.is_done()
    }

    /// Takes the lock into `hold`, with its frame under the task's innermost one. Once it has
    /// returned `Ok(())` the taking is spent ([`is_spent`](Self::is_spent)): an [`Enter`]
    /// relies on it to let go of it without a drop.
    #[inline(always)]
    fn poll(&mut self, cx: &mut Context<'_>, hold: &mut Hold) -> Poll<Result<(), LockError>> {
        // The guard goes straight into the hold; the frame is made from it there.
        let guard = match Pin::new(&mut self.lock).poll(cx) {
            Poll::Ready(Ok(guard)) => hold.guard.insert(guard),
            Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
            Poll::Pending => return Poll::Pending,
        };
        let frame = frame_of(guard, self.manager, self.kind, self.parent.take());
        hold.frame.set(frame);
        Poll::Ready(Ok(()))
    }
}

/// The frame of a lock taken as `kind` on `manager`, under `parent`.
#[inline(always)]
pub(crate) fn frame_of(guard: &LockGuard, manager: u64, kind: LockKind, parent: Option<Arc<Frame>>) -> Frame {
    Frame {
        manager,
        kind,
        name: guard.name().clone(),
        fencing_token: guard.fencing_token(),
        lost: guard.lost_signal().clone(),
        parent,
    }
}

pin_project_lite::pin_project! {
    /// The run engine, in two steps: [`enter`](Locked::enter) takes (or re-enters) a lock into
    /// it, then [`start`](Locked::start) runs a body under that lock, as
    /// [`LockRequest::run`] does in one. For a caller that must know whether the lock was taken
    /// before it gives up what the body would own (`#[distributed_locked]` passes a call's
    /// arguments to its fallback when the lock is not taken). Pin it where it is used: the lock
    /// is written into it in place.
    ///
    /// Dropping it (cancellation, a panic in the body) drops the body in the lock's context,
    /// then the guard, which releases the lock.
    ///
    /// ```
    /// use std::pin::pin;
    /// use lock_runtime::{LockError, LockManager, Locked};
    ///
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), LockError> {
    /// let manager = LockManager::memory();
    /// let order = String::from("order:42");
    /// let mut locked = pin!(Locked::new());
    /// match locked.as_mut().enter(manager.lock(&order)).await {
    ///     // Taken: the body may own `order` now.
    ///     Ok(()) => {
    ///         let token = locked.start(async move { (order, lock_runtime::current().map(|l| l.fencing_token())) }).await?;
    ///         assert!(token.1.is_some());
    ///     }
    ///     // Not taken: `order` is still here, for whatever comes instead.
    ///     Err(e) => println!("{order} is busy: {e}"),
    /// }
    /// # Ok(()) }
    /// ```
    #[must_use = "futures do nothing unless polled"]
    pub struct Locked<F: Future> {
        // `None` until started, and once the body has completed or was stopped by the loss.
        #[pin]
        body: Option<F>,
        hold: Hold,
        abort_on_lost: bool,
        // Releases being awaited (a networked backend's), with the output they hold back.
        releasing: Option<Box<Pending<F::Output>>>,
    }

    impl<F: Future> PinnedDrop for Locked<F> {
        fn drop(this: Pin<&mut Self>) {
            // A body dropped before completion (cancellation, or unwinding from a panic) drops
            // in its context, as it ran. The guard is dropped after it, which releases.
            let this = this.project();
            let mut body = this.body;
            if body.is_some() && this.hold.frame.is_some() {
                within(&mut this.hold.frame, || body.set(None));
            }
        }
    }
}

impl<F: Future> fmt::Debug for Locked<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let stage = match (self.hold.frame.is_some(), &self.hold.guard, &self.releasing) {
            (_, _, Some(_)) => "releasing",
            (false, _, None) if self.body.is_some() => "not entered",
            (false, _, None) => "done",
            (true, None, None) => "re-entered",
            (true, _, None) => "held",
        };
        f.debug_struct("Locked").field("stage", &stage).field("abort_on_lost", &self.abort_on_lost).finish()
    }
}

impl<F: Future> Default for Locked<F> {
    fn default() -> Self {
        Self::new()
    }
}

impl<F: Future> Locked<F> {
    /// An empty run: no lock, no body.
    #[inline]
    pub fn new() -> Self {
        // Field by field (not a constant copied in): only the few words that say `None` are written.
        let hold = Hold { guard: None, frame: FrameSlot::EMPTY, watch: None };
        Locked { body: None, hold, abort_on_lost: true, releasing: None }
    }

    /// Takes (or re-enters) the lock of `request` into this run; await it for `Ok(())` once
    /// the lock is held, or the error of taking it. Reentrancy is that of
    /// [`LockRequest::run`]: the task's own lock of the same manager and name enters at once.
    #[inline]
    pub fn enter<'a, 'r>(mut self: Pin<&'r mut Self>, request: LockRequest<'a>) -> Enter<'a, 'r, F> {
        let hold = self.as_mut().project().hold;
        match reenter(request.manager.id(), &request.name, request.kind, hold) {
            Some(parent) => Enter::taking(self, request, parent),
            None => Enter::entered(self, request.manager),
        }
    }

    /// Runs `body` under the lock [`enter`](Self::enter) put into this run; await it for the
    /// body's output, or the lost error when the lock is lost while the body runs (see
    /// [`ignore_lost`](Self::ignore_lost)). Released when the body ends.
    #[inline]
    pub fn start<'r>(mut self: Pin<&'r mut Self>, body: F) -> Started<'r, F> {
        let mut slot = self.as_mut().project().body;
        slot.set(Some(body));
        Started(self)
    }

    /// Lets the body run to its end when the lock is lost, as [`Run::ignore_lost`] does. Call
    /// it before [`start`](Self::start).
    #[inline]
    pub fn ignore_lost(mut self: Pin<&mut Self>) -> Pin<&mut Self> {
        *self.as_mut().project().abort_on_lost = false;
        self
    }

    /// Puts a lock held by someone else into this run (an election's term, whose
    /// [`Leadership`](crate::Leadership) the body owns): the body runs in its context and is
    /// stopped when it is lost; the run does not release it.
    pub(crate) fn adopt(self: Pin<&mut Self>, manager: &LockManager, guard: &LockGuard) {
        let id = manager.id();
        let parent = lookup(id, guard.key(), LockKind::Exclusive).parent;
        self.hold().frame.set(frame_of(guard, id, LockKind::Exclusive, parent));
    }

    /// Where the locks of a run of several are entered ([`crate::LockAllRequest::run`]).
    pub(crate) fn hold(self: Pin<&mut Self>) -> &mut Hold {
        self.project().hold
    }
}

impl<F: Future> Future for Locked<F> {
    type Output = Result<F::Output, LockError>;

    #[inline(always)]
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let abort = *this.abort_on_lost;
        if let Some(pending) = this.releasing {
            let released = ready!(Pin::new(&mut pending.release).poll(cx));
            return Poll::Ready(match this.releasing.take() {
                Some(pending) => finish(pending.output, released, abort),
                None => Err(not_running()),
            });
        }
        let hold = this.hold;
        let polled = poll_held(this.body, hold, abort, cx);
        if polled.is_pending() {
            return Poll::Pending;
        }
        let at_once = match &mut hold.guard {
            None => Some(Ok(())), // re-entered: the outermost releases
            Some(guard) => guard.release_at_once(),
        };
        // After an at-once release the spent guard and the frame go with the run (nothing of
        // the lock is left in them): one drop instead of two more here. The output is returned
        // as polled (not taken out and wrapped again: a copy less).
        match (at_once, polled) {
            (Some(Ok(())), polled) => polled,
            (_, Poll::Pending) => Poll::Pending,
            (Some(released), Poll::Ready(output)) => Poll::Ready(finish(output, released, abort)),
            (None, Poll::Ready(output)) => await_release(hold, output, abort, this.releasing, cx),
        }
    }
}

/// Starts the release of a networked backend's lock, to be awaited: polls it once, and keeps it
/// in `releasing` (with the body's output) until it is done.
#[inline(never)]
fn await_release<T>(
    hold: &mut Hold,
    output: Result<T, LockError>,
    abort: bool,
    releasing: &mut Option<Box<Pending<T>>>,
    cx: &mut Context<'_>,
) -> Poll<Result<T, LockError>> {
    hold.frame = FrameSlot::EMPTY;
    let Some(guard) = hold.guard.take() else { return Poll::Ready(finish(output, Ok(()), abort)) };
    let mut pending = Box::new(Pending { release: guard.release(), output });
    match Pin::new(&mut pending.release).poll(cx) {
        Poll::Ready(released) => Poll::Ready(finish(pending.output, released, abort)),
        Poll::Pending => {
            *releasing = Some(pending);
            Poll::Pending
        }
    }
}

/// The future of [`Locked::enter`]: `Ok(())` once the lock is in the run.
#[must_use = "futures do nothing unless polled"]
pub struct Enter<'a, 'r, F: Future> {
    run: Pin<&'r mut Locked<F>>,
    state: State<'a>,
    /// Returned `Ok(())` (or the error of taking): the state is left as it is, to be dropped
    /// once, with the future.
    done: bool,
    /// Its telemetry settings go to the fallback, if the lock cannot be taken.
    manager: Option<&'a LockManager>,
}

enum State<'a> {
    /// Taking the lock. Once it is taken the taking is spent (its future done, its parent frame
    /// handed on to the lock's): it owns nothing, and is let go of without a drop; otherwise
    /// [`Enter`]'s drop drops it.
    Taking(Option<ManuallyDrop<Taking<'a>>>),
    /// The entry fails at once (a locked call with no manager); `None` once returned.
    Refused(Option<LockError>),
    Entered,
}

impl<'a, 'r, F: Future> Enter<'a, 'r, F> {
    /// An entry that takes the lock of `request` under `parent` ([`reenter`]).
    #[inline(always)]
    pub(crate) fn taking(run: Pin<&'r mut Locked<F>>, request: LockRequest<'a>, parent: Option<Arc<Frame>>) -> Self {
        let manager = Some(request.manager);
        let state = State::Taking(Some(ManuallyDrop::new(Taking::new(request, parent))));
        Enter { run, state, done: false, manager }
    }

    /// An entry re-entered already ([`reenter`]).
    #[inline(always)]
    pub(crate) fn entered(run: Pin<&'r mut Locked<F>>, manager: &'a LockManager) -> Self {
        Enter { run, state: State::Entered, done: true, manager: Some(manager) }
    }

    /// An entry that fails with `error` when awaited.
    #[cold]
    pub(crate) fn refused(run: Pin<&'r mut Locked<F>>, error: LockError) -> Self {
        Enter { run, state: State::Refused(Some(error)), done: false, manager: None }
    }
}

impl<F: Future> Drop for Enter<'_, '_, F> {
    #[inline]
    fn drop(&mut self) {
        if let State::Taking(slot) = &mut self.state {
            if let Some(taking) = slot.take() {
                drop(ManuallyDrop::into_inner(taking)); // not taken (failed, or cancelled)
            }
        }
    }
}

impl<F: Future> fmt::Debug for Enter<'_, '_, F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Enter").field("done", &self.done).finish_non_exhaustive()
    }
}

impl<F: Future> Future for Enter<'_, '_, F> {
    type Output = Result<(), LockError>;

    #[inline(always)]
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = &mut *self;
        if this.done {
            return Poll::Ready(Ok(()));
        }
        match &mut this.state {
            State::Taking(slot) => {
                let Some(taking) = slot else { return Poll::Ready(Ok(())) }; // let go of: taken
                let taken = ready!(taking.poll(cx, this.run.as_mut().project().hold));
                this.done = true;
                match &taken {
                    Ok(()) => {
                        debug_assert!(taking.is_spent());
                        *slot = None; // spent: nothing in it to drop
                    }
                    Err(e) => {
                        if let Some(manager) = this.manager {
                            manager.telemetry().entry_failed(e);
                        }
                    }
                }
                Poll::Ready(taken)
            }
            State::Refused(error) => {
                crate::telemetry::entry_refused();
                Poll::Ready(Err(error.take().unwrap_or_else(polled_after_completion)))
            }
            State::Entered => Poll::Ready(Ok(())),
        }
    }
}

/// The future of [`Locked::start`]: the run, polled in place.
#[must_use = "futures do nothing unless polled"]
#[derive(Debug)]
pub struct Started<'r, F: Future>(Pin<&'r mut Locked<F>>);

impl<F: Future> Future for Started<'_, F> {
    type Output = Result<F::Output, LockError>;

    #[inline(always)]
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        self.0.as_mut().poll(cx)
    }
}

impl LockAllRequest<'_> {
    /// Runs `fut` while every lock is held, as [`LockRequest::run`](crate::LockRequest::run)
    /// does for one: inside, [`current()`](crate::context::current) gives the last name (in the global
    /// order), and a nested `lock(..).run(..)` (or locked fn) of any of the names re-enters.
    /// Names the task already holds are re-entered rather than taken. Released on every exit;
    /// the loss of any one stops `fut` with the lost error.
    ///
    /// ```
    /// use lock_runtime::{LockError, LockManager};
    ///
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), LockError> {
    /// let manager = LockManager::memory();
    /// let moved = manager
    ///     .lock_all(["acct:1", "acct:2"])
    ///     .run(async {
    ///         // Re-enters: the task holds acct:1 already.
    ///         manager.lock("acct:1").run(async { 100 }).await
    ///     })
    ///     .await??;
    /// assert_eq!(moved, 100);
    /// # Ok(()) }
    /// ```
    pub async fn run<F: Future>(self, fut: F) -> Result<F::Output, LockError> {
        let mut locked = pin!(Locked::new());
        self.enter(locked.as_mut()).await?;
        locked.start(fut).await
    }

    /// Re-enters the names the task holds and takes the others into `locked`, one frame per
    /// name chained in the global order.
    pub(crate) async fn enter<F: Future>(self, mut locked: Pin<&mut Locked<F>>) -> Result<(), LockError> {
        let LockAllRequest { manager, names, options } = self;
        let id = manager.id();
        let mut outer: Vec<Option<Frame>> = Vec::with_capacity(names.len());
        let mut parent = None;
        for (i, name) in names.iter().enumerate() {
            let lookup = lookup(id, name, LockKind::Exclusive);
            if i == 0 {
                parent = lookup.parent;
            }
            outer.push(lookup.held);
        }
        let to_take: Vec<Arc<str>> =
            names.iter().zip(&outer).filter(|(_, held)| held.is_none()).map(|(n, _)| n.clone()).collect();
        let mut guards = if to_take.is_empty() && !names.is_empty() {
            Vec::new()
        } else {
            acquire_all(manager, to_take, options).await?
        };
        let mut frame: Option<Frame> = None;
        let mut taken = guards.iter();
        for held in outer {
            let parent = match frame.take() {
                Some(f) => Some(Arc::new(f)),
                None => parent.take(),
            };
            frame = match held {
                Some(outer) => Some(Frame { parent, ..outer }),
                None => taken.next().map(|g| frame_of(g, id, LockKind::Exclusive, parent)),
            };
        }
        // Every taken lock is watched and released, whichever is the innermost frame (a name the
        // task held already may be): the watch is set up now, the locks held as one.
        let hold = locked.as_mut().hold();
        match frame {
            Some(frame) => hold.frame.set(frame),
            None => hold.frame = FrameSlot::EMPTY,
        }
        if !guards.is_empty() {
            hold.watch = watch_all(&guards);
            let bound = manager.bound_and_kind();
            hold.guard = Some(if guards.len() == 1 { guards.remove(0) } else { several(guards, bound) });
        }
        Ok(())
    }
}

/// The locks of a `lock_all` run, held as one guard ([`several`]).
struct Several {
    guards: Vec<LockGuard>,
    /// The first error of the releases made so far.
    verdict: Result<(), LockError>,
}

impl Several {
    fn keep(&mut self, released: Result<(), LockError>) {
        if let (Ok(()), Err(e)) = (&self.verdict, released) {
            self.verdict = Err(e);
        }
    }
}

impl HeldLock for Several {
    fn release(&mut self) -> BoxFuture<'_, Result<(), LockError>> {
        Box::pin(async move {
            for guard in std::mem::take(&mut self.guards) {
                let released = guard.release().await;
                self.keep(released);
            }
            std::mem::replace(&mut self.verdict, Ok(()))
        })
    }

    fn release_now(&mut self) -> Option<Result<(), LockError>> {
        let mut later = Vec::new();
        for mut guard in std::mem::take(&mut self.guards) {
            match guard.release_at_once() {
                Some(released) => self.keep(released),
                None => later.push(guard),
            }
        }
        if later.is_empty() {
            return Some(std::mem::replace(&mut self.verdict, Ok(())));
        }
        self.guards = later; // released in turn by `release`
        None
    }
}

/// One guard standing for several (the locks of a `lock_all` run), released as one: the
/// in-process ones at once, the others in turn; its verdict is the first error. Each keeps
/// its own lease, watchdog, telemetry and `hold_at_least`; `bound` bounds one release.
fn several(guards: Vec<LockGuard>, (bound, kind): (Duration, &'static str)) -> LockGuard {
    let name = guards.last().map_or_else(|| Arc::from(""), |g| g.name().clone());
    let fencing_token = guards.iter().map(LockGuard::fencing_token).max().unwrap_or(0);
    let bound = bound.saturating_mul(u32::try_from(guards.len()).unwrap_or(u32::MAX).max(1));
    let lock = Held::new(Several { guards, verdict: Ok(()) });
    LockGuard::new(name, fencing_token, lock, (bound, kind), crate::lost::LostSignal::never(), Holding::none())
}

/// Polls the body of an entered lock in the lock's context, raced against the loss of the lock
/// when that aborts it: `Ready` with its output, or the lost error that stopped it. Once it is
/// over the body is dropped (in its context) and the watch with it; the lock is still held.
#[inline(always)]
fn poll_held<F: Future>(
    mut body: Pin<&mut Option<F>>,
    hold: &mut Hold,
    abort: bool,
    cx: &mut Context<'_>,
) -> Poll<Result<F::Output, LockError>> {
    if !hold.frame.is_some() || body.is_none() {
        return Poll::Ready(Err(not_running()));
    }
    if abort && hold.watch.is_none() {
        hold.watch = watch(hold);
    }
    let watch = &mut hold.watch;
    // The body runs in the lock's `lock.hold` span (when a subscriber wants it).
    let _in_hold = hold.guard.as_ref().and_then(LockGuard::hold_span).map(tracing::Span::enter);
    let polled = within(&mut hold.frame, || {
        let Some(fut) = body.as_mut().as_pin_mut() else { return Poll::Ready(Err(not_running())) };
        let over = match fut.poll(cx) {
            Poll::Ready(out) => Ok(out),
            Poll::Pending => match watched(abort, watch, cx) {
                Some(lost) => Err(lost),
                None => return Poll::Pending, // the body waits, the lock is held
            },
        };
        body.set(None); // in its context, like the rest of the body
        Poll::Ready(over)
    });
    if polled.is_ready() && hold.watch.is_some() {
        hold.watch = None;
    }
    polled
}

/// The lost error once the watched lock is lost, when its loss aborts the body.
#[inline]
fn watched(abort: bool, watch: &mut Option<Watch>, cx: &mut Context<'_>) -> Option<LockError> {
    match watch {
        Some(watch) if abort => match watch.as_mut().poll(cx) {
            Poll::Ready(lost) => Some(lost),
            Poll::Pending => None,
        },
        _ => None,
    }
}

/// The watch of the lock of `hold`, if it can be lost (a run of several locks has its watch
/// set up when entered: [`watch_all`]).
#[inline(always)]
fn watch(hold: &Hold) -> Option<Watch> {
    let frame = hold.frame.get().filter(|f| f.lost.can_fire())?;
    Some(watch_one(frame))
}

/// [`watch`] of one lock that can be lost.
#[inline(never)]
fn watch_one(frame: &Frame) -> Watch {
    let (name, lost) = (frame.name.clone(), frame.lost.clone());
    Box::pin(async move {
        lost.wait().await;
        LockError::lost(&*name, lost.reason().unwrap_or_else(|| "its lease ran out".to_owned()))
    })
}

/// The watch of a run of several locks: the first of `guards` to be lost.
#[cold]
fn watch_all(guards: &[LockGuard]) -> Option<Watch> {
    let signals: Vec<(Arc<str>, crate::lost::LostSignal)> = guards
        .iter()
        .filter(|g| g.lost_signal().can_fire())
        .map(|g| (g.name().clone(), g.lost_signal().clone()))
        .collect();
    if signals.is_empty() {
        return None;
    }
    Some(Box::pin(async move {
        let (name, lost) = crate::lost::first_lost(&signals).await;
        LockError::lost(&**name, lost.reason().unwrap_or_else(|| "its lease ran out".to_owned()))
    }))
}

/// The run's output, from the body's and the release's.
#[inline(always)]
pub(crate) fn finish<T>(
    output: Result<T, LockError>,
    released: Result<(), LockError>,
    abort_on_lost: bool,
) -> Result<T, LockError> {
    match released {
        Ok(()) => output,
        Err(e) => released_failed(output, e, abort_on_lost),
    }
}

/// A failed release after a run: a loss found by the release of a body that completed becomes
/// the output when the loss aborts; other failures are logged.
#[cold]
fn released_failed<T>(output: Result<T, LockError>, e: LockError, abort_on_lost: bool) -> Result<T, LockError> {
    if abort_on_lost && e.is_lost() && output.is_ok() {
        return Err(e);
    }
    if e.is_lost() {
        // Already reported, once, as the lock's loss.
        tracing::debug!(error = %crate::telemetry::shown_error(&e), "release after a locked call found the lock lost");
    } else {
        tracing::warn!(error = %crate::telemetry::shown_error(&e), "release after a locked call failed");
    }
    output
}

#[cold]
fn polled_after_completion() -> LockError {
    LockError::invalid("", "a lock run was polled after it completed")
}

/// A run polled after it completed, or before its lock or body was given.
#[cold]
fn not_running() -> LockError {
    LockError::invalid("", "a lock run was polled after it completed (or before it was started)")
}
