//! [`LockRequest::run`]: a future run under a lock, with reentrancy and [`current()`].
//!
//! [`Run`] takes the lock (or re-enters it), runs the future in the lock's context, watches the
//! lease and releases. `#[distributed_locked]` expands to the same steps ([`begin`],
//! [`Taking`], [`poll_held`], [`release_held`]) in a leaner future of its own
//! (`__private::Locked`), which has no request or acquisition to keep.
//!
//! [`current()`]: crate::current

use std::fmt;
use std::future::{Future, IntoFuture};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use crate::context::{self, Frame};
use crate::error::LockError;
use crate::guard::{LockGuard, ReleaseFuture};
use crate::manager::{LockFuture, LockRequest};

impl<'m> LockRequest<'m> {
    /// Runs `fut` while this lock is held: the future of
    /// `#[distributed_locked]` without the attribute, like tracing's `Instrument`.
    ///
    /// Awaiting the returned [`Run`]:
    ///
    /// 1. takes the lock as awaiting the request would (`wait`, `lease`, `retry`); if it cannot
    ///    be taken, `fut` is dropped without being polled and the error is returned;
    /// 2. polls `fut` with [`current()`](crate::current) giving the lock's key and fencing
    ///    token;
    /// 3. releases the lock when `fut` completes and returns `Ok(output)`. A release that finds
    ///    the lock lost returns the [`is_lost`](LockError::is_lost) error instead.
    ///
    /// **Reentrancy:** inside a `run` (or a locked fn) of the same task, a `run` with the same
    /// manager and name runs its future at once, under the outer lock (whose key and token
    /// [`current()`](crate::current) keeps giving); the outermost one releases. Other tasks
    /// wait as usual; a task spawned from inside is another task.
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
        Run { body: Some(fut), hold: Hold::EMPTY, stage: Stage::Start(self), abort_on_lost: true }
    }
}

pin_project_lite::pin_project! {
    /// The future of [`LockRequest::run`]: `Ok(output)` of the future run under the lock, or
    /// the [`LockError`] of taking (or losing) the lock.
    ///
    /// `Send` when the future and its output are.
    #[must_use = "futures do nothing unless polled"]
    pub struct Run<'m, F: Future> {
        // `None` once the body has completed, was stopped by the loss of the lock, or was never
        // run because the lock could not be taken.
        #[pin]
        body: Option<F>,
        // The lock while the body runs, written in place when it is taken (never moved after).
        hold: Hold,
        stage: Stage<'m, F::Output>,
        abort_on_lost: bool,
    }

    impl<'m, F: Future> PinnedDrop for Run<'m, F> {
        fn drop(this: Pin<&mut Self>) {
            // A body dropped before completion (cancellation, or unwinding from a panic) drops
            // in its context, as it ran. The guard is dropped after it, which releases.
            let this = this.project();
            let mut body = this.body;
            if body.is_some() && this.hold.frame.is_some() {
                context::within(&mut this.hold.frame, || body.set(None));
            }
        }
    }
}

impl<F: Future> fmt::Debug for Run<'_, F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let stage = match &self.stage {
            Stage::Start(_) => "start",
            Stage::Taking(_) => "taking",
            Stage::Running if self.hold.frame.is_none() => "not entered",
            Stage::Running if self.hold.guard.is_none() => "re-entered",
            Stage::Running => "held",
            Stage::Releasing(_) => "releasing",
            Stage::Done => "done",
        };
        f.debug_struct("Run").field("stage", &stage).field("abort_on_lost", &self.abort_on_lost).finish()
    }
}

/// Where a [`Run`] is. Everything here is `Unpin`: only the body is pinned.
enum Stage<'m, T> {
    /// Not polled yet: the context is looked up on the first poll, in the polling task.
    Start(LockRequest<'m>),
    /// Taking the lock.
    Taking(Taking<'m>),
    /// The body runs under the lock in the [`Hold`].
    Running,
    /// A release being awaited (a networked backend's), with the output it holds back; boxed,
    /// so the common case stays small.
    Releasing(Box<Pending<T>>),
    /// Completed, or failed to take the lock.
    Done,
}

/// A lock being taken, for a run.
pub(crate) struct Taking<'m> {
    lock: LockFuture<'m>,
    manager: u64,
    /// The task's innermost frame, to hang the new one under.
    parent: Option<Arc<Frame>>,
}

/// A held lock while its body runs; empty before it is entered and after it is released.
pub(crate) struct Hold {
    /// `None` when re-entered: the outermost run releases.
    pub(crate) guard: Option<LockGuard>,
    /// The lock's frame (`None`: not entered); swapped into the task's context while the body
    /// is polled (or dropped), and holding the outer context meanwhile.
    pub(crate) frame: Option<Frame>,
    /// Completes with the lost error once the lock is lost; set up on the first poll of the
    /// body when the loss aborts it and the lock can be lost.
    pub(crate) watch: Option<Watch>,
}

impl Hold {
    pub(crate) const EMPTY: Hold = Hold { guard: None, frame: None, watch: None };
}

/// Completes with the lost error once the lock is lost. Boxed: the watch (a timer and a
/// notification) would otherwise make every `Run` as large as the watched one. A lock that can
/// be lost lives on a networked backend (or has a fixed lease), where one allocation is noise.
type Watch = Pin<Box<dyn Future<Output = LockError> + Send>>;

/// A release being awaited, with the output of the body (`Err`: the lost error it was stopped
/// with).
pub(crate) struct Pending<T> {
    pub(crate) release: ReleaseFuture,
    pub(crate) output: Result<T, LockError>,
}

/// Looks the lock of `request` up in the task's context: re-entered at once into `hold` when
/// the task holds it (`None`), else to be taken. Call it while polling, in the task that will
/// run the body.
#[inline(always)]
pub(crate) fn begin<'m>(request: LockRequest<'m>, hold: &mut Hold) -> Option<Taking<'m>> {
    let parent = reenter(request.manager.id(), &request.name, hold)?;
    Some(Taking::new(request, parent))
}

/// [`begin`] for a caller that makes its request only once it knows the lock must be taken:
/// `None` when the task holds it (re-entered into `hold` at once), else `Some(parent)`, the
/// task's innermost frame, for [`Taking::new`].
#[inline(always)]
pub(crate) fn reenter(manager: u64, name: &str, hold: &mut Hold) -> Option<Option<Arc<Frame>>> {
    let context::Lookup { held, parent } = context::lookup(manager, name);
    match held {
        Some(outer) => {
            hold.frame = Some(Frame { parent, ..outer });
            None
        }
        None => Some(parent),
    }
}

impl<'m> Taking<'m> {
    /// Takes the lock of `request` (see [`reenter`]).
    #[inline(always)]
    pub(crate) fn new(request: LockRequest<'m>, parent: Option<Arc<Frame>>) -> Self {
        Taking { manager: request.manager.id(), lock: request.into_future(), parent }
    }
}

impl Taking<'_> {
    /// Whether it owns nothing any more: its lock was taken (the future is done) and its parent
    /// frame handed on to the lock's.
    pub(crate) fn is_spent(&self) -> bool {
        self.parent.is_none() && self.lock.is_done()
    }

    /// Takes the lock into `hold`, with its frame under the task's innermost one. Once it has
    /// returned `Ok(())` the taking is spent ([`is_spent`](Self::is_spent)): a locked call's
    /// entry relies on it to let go of it without a drop.
    #[inline(always)]
    pub(crate) fn poll(&mut self, cx: &mut Context<'_>, hold: &mut Hold) -> Poll<Result<(), LockError>> {
        // The guard goes straight into the hold; the frame is made from it there.
        let guard = match Pin::new(&mut self.lock).poll(cx) {
            Poll::Ready(Ok(guard)) => hold.guard.insert(guard),
            Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
            Poll::Pending => return Poll::Pending,
        };
        let frame = Frame {
            manager: self.manager,
            name: guard.name().clone(),
            fencing_token: guard.fencing_token(),
            lost: guard.lost_signal().clone(),
            parent: self.parent.take(),
        };
        match &mut hold.frame {
            empty @ None => {
                empty.get_or_insert(frame); // nothing to drop
            }
            slot => *slot = Some(frame),
        }
        Poll::Ready(Ok(()))
    }
}

impl<T> Stage<'_, T> {
    /// Drives the stage until the lock is in `hold` (taken or re-entered): `Ok(())`, or the
    /// error of taking it (the stage is then `Done`).
    #[inline]
    fn poll_enter(&mut self, cx: &mut Context<'_>, hold: &mut Hold) -> Poll<Result<(), LockError>> {
        if let Stage::Start(_) = self {
            if let Stage::Start(request) = std::mem::replace(self, Stage::Running) {
                if let Some(taking) = begin(request, hold) {
                    *self = Stage::Taking(taking);
                }
            }
        }
        match self {
            Stage::Taking(taking) => {
                let taken = ready!(taking.poll(cx, hold));
                *self = if taken.is_ok() { Stage::Running } else { Stage::Done };
                Poll::Ready(taken)
            }
            Stage::Running => Poll::Ready(Ok(())),
            _ => Poll::Ready(Err(polled_after_completion())),
        }
    }

    /// Awaits the release of a `Releasing` stage; then `Done`, with the run's output.
    fn poll_release(&mut self, cx: &mut Context<'_>, abort_on_lost: bool) -> Poll<Result<T, LockError>> {
        let Stage::Releasing(pending) = self else { return Poll::Ready(Err(polled_after_completion())) };
        let released = ready!(Pin::new(&mut pending.release).poll(cx));
        Poll::Ready(match std::mem::replace(self, Stage::Done) {
            Stage::Releasing(pending) => finish(pending.output, released, abort_on_lost),
            _ => Err(polled_after_completion()),
        })
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
        self.abort_on_lost = false;
        self
    }
}

impl<F: Future> Future for Run<'_, F> {
    type Output = Result<F::Output, LockError>;

    #[inline]
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let mut body = this.body;
        let (stage, hold) = (this.stage, this.hold);
        let abort = *this.abort_on_lost;
        match stage {
            Stage::Running => {}
            Stage::Releasing(_) => return stage.poll_release(cx, abort),
            _ => {
                if let Err(e) = ready!(stage.poll_enter(cx, hold)) {
                    body.set(None); // never run: the lock was not taken
                    return Poll::Ready(Err(e));
                }
            }
        }
        let output = ready!(poll_held(body, hold, abort, cx));

        // The release: at once on an in-process backend, else awaited.
        match release_held(hold) {
            Released::Now(released) => {
                hold.frame = None;
                Poll::Ready(finish(output, released, abort))
            }
            Released::Later(guard) => {
                *stage = Stage::Releasing(Box::new(Pending { release: guard.release(), output }));
                hold.frame = None;
                stage.poll_release(cx, abort)
            }
        }
    }
}

/// Polls the body of an entered lock in the lock's context, raced against the loss of the lock
/// when that aborts it: `Ready` with its output, or the lost error that stopped it. Once it is
/// over the body is dropped (in its context) and the watch with it; the lock is still held.
#[inline(always)]
pub(crate) fn poll_held<F: Future>(
    mut body: Pin<&mut Option<F>>,
    hold: &mut Hold,
    abort: bool,
    cx: &mut Context<'_>,
) -> Poll<Result<F::Output, LockError>> {
    if hold.frame.is_none() || body.is_none() {
        return Poll::Ready(Err(not_running()));
    }
    if abort && hold.watch.is_none() {
        hold.watch = watch(hold.frame.as_ref());
    }
    let watch = &mut hold.watch;
    // The body runs in the lock's `lock.hold` span (when a subscriber wants it).
    let _in_hold = hold.guard.as_ref().and_then(LockGuard::hold_span).map(tracing::Span::enter);
    let polled = context::within(&mut hold.frame, || {
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

/// How the lock of a completed body is released ([`release_held`]).
pub(crate) enum Released {
    /// At once (an in-process backend, or nothing to release when re-entered): the verdict.
    Now(Result<(), LockError>),
    /// By awaiting the release of this guard (a networked backend).
    Later(LockGuard),
}

/// Releases the lock of `hold` after its body, at once if the backend can. The frame stays in
/// `hold`.
#[inline(always)]
pub(crate) fn release_held(hold: &mut Hold) -> Released {
    let Some(guard) = &mut hold.guard else { return Released::Now(Ok(())) }; // re-entered: the outermost releases
    match guard.release_at_once() {
        Some(Ok(())) => {
            hold.guard = None;
            Released::Now(Ok(()))
        }
        Some(Err(e)) => {
            hold.guard = None;
            Released::Now(Err(e))
        }
        None => match hold.guard.take() {
            Some(guard) => Released::Later(guard),
            None => Released::Now(Ok(())),
        },
    }
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

/// The watch of a lock that can be lost, if it can.
#[inline]
fn watch(frame: Option<&Frame>) -> Option<Watch> {
    let frame = frame.filter(|f| f.lost.can_fire())?;
    let lost = frame.lost.clone();
    let name = frame.name.clone();
    Some(Box::pin(async move {
        lost.wait().await;
        LockError::lost(&*name, lost.reason().unwrap_or_else(|| "its lease ran out".to_owned()))
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

/// A run polled after it completed, or (a locked call's) before its lock or body was given.
#[cold]
pub(crate) fn not_running() -> LockError {
    LockError::invalid("", "a lock run was polled after it completed (or before it was started)")
}
