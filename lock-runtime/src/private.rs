//! Support for the code `#[distributed_locked]` expands to. Not a public API: anything here
//! may change in any release.

use std::borrow::Borrow;
use std::future::{Future, IntoFuture};
use std::marker::PhantomData;
use std::pin::Pin;
use std::sync::{Arc, OnceLock};
use std::task::{ready, Context, Poll};
use std::time::Duration;

pub use crate::error::LockError;
pub use crate::manager::LockManager;
pub use crate::options::LockOptions;

use crate::context::{self, Frame};
use crate::guard::{LockGuard, ReleaseFuture};
use crate::manager::LockFuture;

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

/// The manager set with [`set_default`](crate::set_default), if any (see [`enter_default`]).
#[inline]
pub fn default_manager() -> Option<LockManager> {
    crate::manager::default_manager()
}

/// Notes why a locked call is about to call its fallback instead of its body.
pub fn falling_back(error: &LockError) {
    if error.is_contended() {
        tracing::debug!(error = %error, "lock busy; calling the fallback");
    } else {
        tracing::warn!(error = %error, "lock not acquired; calling the fallback");
    }
}

/// A return type that a lock failure can be returned through: `Result<_, E>` with
/// `E: From<LockError>`. Required of locked fns without a `fallback`.
#[diagnostic::on_unimplemented(
    message = "`#[distributed_locked]` without a `fallback` must return `Result<_, E>` with `E: From<LockError>`, not `{Self}`",
    label = "this return type cannot carry a `LockError`",
    note = "a lock that cannot be taken (or, with `on_lost = abort`, is lost) is returned as `Err(lock_error.into())`",
    note = "return `Result<_, E>` where `E: From<lock_runtime::LockError>`, or add `fallback = some_async_fn` (called with the same arguments)"
)]
pub trait CarryLockError: Sized {
    /// `Err(error.into())`.
    fn from_lock_error(error: LockError) -> Self;
}

impl<T, E: From<LockError>> CarryLockError for Result<T, E> {
    #[inline]
    fn from_lock_error(error: LockError) -> Self {
        Err(E::from(error))
    }
}

/// A return type that the lost error of `on_lost = abort` can be returned through.
#[diagnostic::on_unimplemented(
    message = "`on_lost = abort` needs a return type that can carry the lost error: `Result<_, E>` with `E: From<LockError>`, not `{Self}`",
    label = "this return type cannot carry a `LockError`",
    note = "leave `on_lost` out (a function with a `fallback` whose return type cannot carry the error runs to its end) or write `on_lost = ignore`; or return `Result<_, E>` where `E: From<lock_runtime::LockError>`"
)]
pub trait CarryLostError: Sized {
    /// `Err(error.into())`.
    fn from_lost_error(error: LockError) -> Self;
}

impl<T, E: From<LockError>> CarryLostError for Result<T, E> {
    #[inline]
    fn from_lost_error(error: LockError) -> Self {
        Err(E::from(error))
    }
}

/// Picks the default `on_lost` of a locked fn with a `fallback`, by its return type `R`:
/// abort when `R` can carry the lost error ([`AbortIfCarried`]), else run to the end
/// ([`RunToEndOtherwise`]). Called as `(&Probe::<R>::new()).on_lost()` (autoref dispatch).
#[derive(Debug)]
pub struct Probe<R>(PhantomData<fn() -> R>);

impl<R> Probe<R> {
    /// The probe for return type `R`.
    #[allow(clippy::new_without_default)]
    pub const fn new() -> Self {
        Probe(PhantomData)
    }
}

/// Chosen when `R` can carry a [`LockError`]: abort on loss, converting the error.
pub trait AbortIfCarried<R> {
    /// `Some(conversion)`: abort on loss.
    fn on_lost(&self) -> Option<fn(LockError) -> R>;
}

impl<R: CarryLockError> AbortIfCarried<R> for Probe<R> {
    #[inline]
    fn on_lost(&self) -> Option<fn(LockError) -> R> {
        Some(R::from_lock_error)
    }
}

/// Chosen otherwise: run the body to its end.
pub trait RunToEndOtherwise<R> {
    /// `None`: run to the end.
    fn on_lost(&self) -> Option<fn(LockError) -> R>;
}

impl<R> RunToEndOtherwise<R> for &Probe<R> {
    #[inline]
    fn on_lost(&self) -> Option<fn(LockError) -> R> {
        None
    }
}

/// Where a locked call keeps its lock while the body runs: filled by [`enter`], used and
/// emptied by [`Hold::run`]. Lives in the locked fn's own future, so the guard is written once
/// and never moved until it is released.
#[derive(Debug, Default)]
#[must_use]
pub struct Hold {
    /// `None` when re-entered: the outermost call releases.
    guard: Option<LockGuard>,
    /// The lock's frame; swapped into the task's context while the body is polled.
    frame: Option<Frame>,
}

impl Hold {
    /// An empty hold.
    #[inline]
    pub const fn new() -> Self {
        Hold { guard: None, frame: None }
    }
}

/// Takes (or re-enters) the lock `name` on `manager` into `hold`, for a locked call.
///
/// Acquires through [`LockManager::lock`] (the small, allocation-free future of the
/// uncontended fast path), so a locked fn costs about what the programmatic API does.
#[inline]
pub fn enter<'a, M: Borrow<LockManager>, N: AsRef<str>>(
    hold: &'a mut Hold,
    manager: &'a M,
    name: N,
    options: LockOptions,
) -> Enter<'a> {
    let manager = manager.borrow();
    let name = name.as_ref();
    let context::Lookup { held, parent } = context::lookup(manager.id(), name);
    let stage = match held {
        Some(outer) => {
            // Same task, same manager, same name: re-enter without waiting for ourselves.
            hold.frame = Some(Frame { parent, ..outer });
            Stage::Entered
        }
        None => {
            Stage::Taking { lock: manager.lock(name).options(options).into_future(), manager: manager.id(), parent }
        }
    };
    Enter { hold, stage }
}

/// [`enter`] on the default manager (see [`default_manager`]), or the not-configured error.
#[inline]
pub fn enter_default<'a, N: AsRef<str>>(
    hold: &'a mut Hold,
    manager: &'a Option<LockManager>,
    name: N,
    options: LockOptions,
) -> Enter<'a> {
    match manager {
        Some(manager) => enter(hold, manager, name, options),
        None => Enter { hold, stage: Stage::Refused(LockError::NotConfigured { name: name.as_ref().to_owned() }) },
    }
}

/// The future of [`enter`]: `Ok(())` once the lock is in the [`Hold`].
#[derive(Debug)]
#[must_use = "futures do nothing unless polled"]
pub struct Enter<'a> {
    hold: &'a mut Hold,
    stage: Stage<'a>,
}

#[derive(Debug)]
enum Stage<'a> {
    Taking { lock: LockFuture<'a>, manager: u64, parent: Option<Arc<Frame>> },
    Refused(LockError),
    Entered,
}

impl Future for Enter<'_> {
    type Output = Result<(), LockError>;

    #[inline]
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = &mut *self;
        match &mut this.stage {
            Stage::Taking { lock, manager, parent } => {
                let guard = match ready!(Pin::new(lock).poll(cx)) {
                    Ok(guard) => guard,
                    Err(e) => {
                        this.stage = Stage::Entered;
                        return Poll::Ready(Err(e));
                    }
                };
                let frame = Frame {
                    manager: *manager,
                    name: guard.name().clone(),
                    fencing_token: guard.fencing_token(),
                    lost: guard.lost_signal().clone(),
                    parent: parent.take(),
                };
                this.hold.frame = Some(frame);
                this.hold.guard = Some(guard);
                // (The stage stays: its finished lock future is dropped with `Enter`.)
                Poll::Ready(Ok(()))
            }
            Stage::Refused(_) => match std::mem::replace(&mut this.stage, Stage::Entered) {
                Stage::Refused(e) => Poll::Ready(Err(e)),
                _ => Poll::Ready(Ok(())), // unreachable: matched above
            },
            Stage::Entered => Poll::Ready(Ok(())),
        }
    }
}

/// How a lost error becomes the locked fn's output; `None`: the body runs to its end.
pub type Carry<R> = Option<fn(LockError) -> R>;

impl Hold {
    /// Runs `body` under the lock and releases it afterwards (and on panic or cancellation,
    /// through the guard's `Drop`). With [`OnLost::Abort`], a loss of the lease stops the body
    /// at its next await and returns the lost error.
    #[inline]
    pub fn run<'a, F: Future + 'a>(
        &'a mut self,
        on_lost: OnLost,
        body: F,
    ) -> impl Future<Output = Result<F::Output, LockError>> + 'a {
        let carry: Carry<Result<F::Output, LockError>> = match on_lost {
            OnLost::Abort => Some(Err),
            OnLost::Ignore => None,
        };
        self.drive(body, Ok, carry)
    }

    /// [`run`](Hold::run) with [`OnLost::Abort`] converting the lost error with `carry` when
    /// it is `Some`, else [`run_to_end`](Hold::run_to_end).
    #[inline]
    pub fn run_with<'a, F: Future + 'a>(
        &'a mut self,
        carry: Carry<F::Output>,
        body: F,
    ) -> impl Future<Output = F::Output> + 'a {
        self.drive(body, identity, carry)
    }

    /// Runs `body` to its end under the lock (for [`OnLost::Ignore`], or return types that
    /// cannot carry a [`LockError`]), then releases it.
    #[inline]
    pub fn run_to_end<'a, F: Future + 'a>(&'a mut self, body: F) -> impl Future<Output = F::Output> + 'a {
        self.drive(body, identity, None)
    }

    /// The one future behind `run*`: watched for loss when `carry` is given and the lock can be
    /// lost.
    #[inline]
    fn drive<F: Future, R, W: FnOnce(F::Output) -> R + Copy>(
        &mut self,
        body: F,
        wrap: W,
        carry: Carry<R>,
    ) -> Run<'_, F, R, W> {
        let watch = match (carry, &self.frame) {
            // Boxed: the watch (a timer and a notification) would otherwise make every locked
            // fn's future as large as the watched one. A lock that can be lost lives on a
            // networked backend (or has a fixed lease), where one allocation is noise.
            (Some(_), Some(frame)) if frame.lost.can_fire() => {
                let lost = frame.lost.clone();
                let name = frame.name.clone();
                let watch: Watch = Box::pin(async move {
                    lost.wait().await;
                    LockError::lost(&*name, lost.reason().unwrap_or_else(|| "its lease ran out".to_owned()))
                });
                Some(watch)
            }
            _ => None,
        };
        Run { hold: self, body: Some(body), watch, pending: None, wrap, carry }
    }
}

fn identity<T>(t: T) -> T {
    t
}

/// Completes with the lost error once the lock is lost.
type Watch = Pin<Box<dyn Future<Output = LockError> + Send>>;

pin_project_lite::pin_project! {
    /// The future of [`Hold::run`]: the body in the lock's context (each poll swaps the frame
    /// into the task's context and back, also on unwind), raced against the loss of the lock
    /// when watched, then the release.
    #[must_use = "futures do nothing unless polled"]
    pub struct Run<'a, F: Future, R, W> {
        hold: &'a mut Hold,
        // `None` once the body has completed (or was stopped by the loss of the lock).
        #[pin]
        body: Option<F>,
        watch: Option<Watch>,
        // A release that must be awaited (a networked backend's) and the output it holds back;
        // boxed, so the common case stays small.
        pending: Option<Box<Pending<F::Output, R>>>,
        // How the body's output becomes the locked fn's (`Ok`, or as is); a zero-sized fn item.
        wrap: W,
        carry: Carry<R>,
    }

    impl<'a, F: Future, R, W> PinnedDrop for Run<'a, F, R, W> {
        fn drop(this: Pin<&mut Self>) {
            // A body dropped before completion (cancellation) drops in its context, as it ran.
            let this = this.project();
            let mut body = this.body;
            if body.is_some() {
                context::within(&mut this.hold.frame, || body.set(None));
            }
        }
    }
}

/// A release being awaited, with the output of the body (`Err`: the carried lost error).
struct Pending<T, R> {
    release: ReleaseFuture,
    output: Result<T, R>,
}

impl<F: Future, R, W: FnOnce(F::Output) -> R + Copy> Future for Run<'_, F, R, W> {
    type Output = R;

    #[inline]
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<R> {
        let this = self.project();
        let (carry, wrap) = (*this.carry, *this.wrap);
        if let Some(pending) = this.pending {
            let released = ready!(Pin::new(&mut pending.release).poll(cx));
            let Some(pending) = this.pending.take() else { return Poll::Pending };
            return Poll::Ready(finish(pending.output, released, carry, wrap));
        }
        let mut output = None;
        let mut body = this.body;
        let watch = this.watch.as_mut().filter(|_| carry.is_some());
        context::within(&mut this.hold.frame, || {
            let Some(fut) = body.as_mut().as_pin_mut() else { return };
            if let Poll::Ready(out) = fut.poll(cx) {
                output = Some(Ok(out));
            } else if let (Some(watch), Some(carry)) = (watch, carry) {
                if let Poll::Ready(lost) = watch.as_mut().poll(cx) {
                    output = Some(Err(carry(lost)));
                }
            }
            if output.is_some() {
                body.set(None); // in its context, like the rest of the body
            }
        });
        // (`None` also when polled after completion: the caller's bug; never wakes.)
        let Some(output) = output else { return Poll::Pending };
        *this.watch = None;
        let released = match &mut this.hold.guard {
            None => Ok(()), // re-entered: the outermost call releases
            Some(guard) => match guard.release_at_once() {
                Some(released) => {
                    this.hold.guard = None;
                    released
                }
                None => {
                    let Some(guard) = this.hold.guard.take() else { return Poll::Pending };
                    let pending = this.pending.insert(Box::new(Pending { release: guard.release(), output }));
                    let released = ready!(Pin::new(&mut pending.release).poll(cx));
                    let Some(pending) = this.pending.take() else { return Poll::Pending };
                    return Poll::Ready(finish(pending.output, released, carry, wrap));
                }
            },
        };
        Poll::Ready(finish(output, released, carry, wrap))
    }
}

/// The locked fn's output, from the body's and the release's.
#[inline]
fn finish<T, R>(
    output: Result<T, R>,
    released: Result<(), LockError>,
    carry: Carry<R>,
    wrap: impl FnOnce(T) -> R,
) -> R {
    if let Err(e) = released {
        if let Some(lost) = released_lost(e, carry, output.is_ok()) {
            return lost;
        }
    }
    match output {
        Ok(output) => wrap(output),
        Err(lost) => lost,
    }
}

/// A failed release after a locked call: a loss found by the release of a body that completed
/// becomes the output when the loss is carried; other failures are logged.
#[cold]
fn released_lost<R>(e: LockError, carry: Carry<R>, completed: bool) -> Option<R> {
    if let (Some(carry), true, true) = (carry, e.is_lost(), completed) {
        return Some(carry(e));
    }
    tracing::warn!(error = %e, "release after a locked call failed");
    None
}
