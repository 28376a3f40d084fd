//! Support for the code `#[distributed_locked]` expands to. Not a public API: anything here
//! may change in any release.

use std::borrow::Borrow;
use std::future::Future;
use std::marker::PhantomData;
use std::mem::ManuallyDrop;
use std::pin::Pin;
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll};
use std::time::Duration;

use crate::context;
pub use crate::error::LockError;
pub use crate::manager::LockManager;
pub use crate::options::LockOptions;
use crate::run::{self, Hold, Pending, Taking};

/// Locked fns of the other kinds (`mode`, `permits`, `names`).
pub use crate::kinds::private as kinds;

/// What to do with the body when the lease is lost while it runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnLost {
    /// Stop the body at its next await and return the lost error.
    Abort,
    /// Let the body run to its end.
    Ignore,
}

impl OnLost {
    /// [`Abort`](OnLost::Abort) when the lost error can be carried (`carry` is `Some`), else
    /// [`Ignore`](OnLost::Ignore).
    #[inline]
    pub fn carried<R>(carry: &Carry<R>) -> OnLost {
        if carry.is_some() {
            OnLost::Abort
        } else {
            OnLost::Ignore
        }
    }
}

/// A duration of `ms` milliseconds (the macro has already checked the literal).
pub const fn millis(ms: u64) -> Duration {
    Duration::from_millis(ms)
}

/// The default lock name: md5 hex of `"<module_path>::<fn_name>"`, computed once per fn.
pub fn default_name(cell: &'static OnceLock<Arc<str>>, module_path: &str, fn_name: &str) -> Fixed {
    Fixed(cell.get_or_init(|| Arc::from(format!("{:x}", md5::compute(format!("{module_path}::{fn_name}"))))).clone())
}

/// A lock name without parameters: allocated once per fn, shared by its calls.
#[inline]
pub fn fixed_name(cell: &'static OnceLock<Arc<str>>, name: &str) -> Fixed {
    Fixed(cell.get_or_init(|| Arc::from(name)).clone())
}

/// A lock name rendered from its template for one call (see [`render`]).
#[derive(Debug, Clone)]
pub struct Rendered(Arc<str>);

/// Renders a name template straight into the shared name: a short name goes through a buffer
/// on the stack rather than a `String` of its own (one allocation per call, not two).
#[inline]
pub fn render(args: std::fmt::Arguments<'_>) -> Rendered {
    let mut buf = NameBuf { bytes: [0; NAME_BUF], len: 0 };
    if std::fmt::write(&mut buf, args).is_ok() {
        if let Ok(name) = std::str::from_utf8(&buf.bytes[..buf.len]) {
            return Rendered(Arc::from(name));
        }
    }
    Rendered(Arc::from(std::fmt::format(args))) // longer (or a `Display` that failed: as `format!`)
}

const NAME_BUF: usize = 64;

/// Where [`render`] writes a short name.
struct NameBuf {
    bytes: [u8; NAME_BUF],
    len: usize,
}

impl std::fmt::Write for NameBuf {
    #[inline]
    fn write_str(&mut self, s: &str) -> std::fmt::Result {
        let end = self.len + s.len();
        let slot = self.bytes.get_mut(self.len..end).ok_or(std::fmt::Error)?;
        slot.copy_from_slice(s.as_bytes());
        self.len = end;
        Ok(())
    }
}

impl LockName for Rendered {
    #[inline]
    fn as_name(&self) -> &str {
        &self.0
    }
    #[inline]
    fn into_name(self) -> Arc<str> {
        self.0
    }
}

/// The lock name of a locked fn that has no parameter in it (see [`fixed_name`]).
#[derive(Debug, Clone)]
pub struct Fixed(Arc<str>);

/// A locked call's lock name: rendered for the call (`&str`, `String`), or [`Fixed`].
pub trait LockName {
    /// The name.
    fn as_name(&self) -> &str;
    /// The name, shared.
    fn into_name(self) -> Arc<str>;
}

impl LockName for &str {
    #[inline]
    fn as_name(&self) -> &str {
        self
    }
    #[inline]
    fn into_name(self) -> Arc<str> {
        Arc::from(self)
    }
}

impl LockName for String {
    #[inline]
    fn as_name(&self) -> &str {
        self
    }
    #[inline]
    fn into_name(self) -> Arc<str> {
        Arc::from(self)
    }
}

impl LockName for Fixed {
    #[inline]
    fn as_name(&self) -> &str {
        &self.0
    }
    #[inline]
    fn into_name(self) -> Arc<str> {
        self.0
    }
}

/// The manager set with [`set_default`](crate::set_default), if any (see [`enter_default`]).
#[inline]
pub fn default_manager() -> Option<LockManager> {
    crate::manager::default_manager()
}

/// Notes why a locked call is about to call its fallback instead of its body (an event and
/// `lock_fallbacks_total`). Called in the poll in which the call's entry failed.
pub fn falling_back(error: &LockError) {
    crate::telemetry::falling_back(error);
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

/// The value a `skip_if_locked` call returns when it does not run: `Default::default()`.
#[diagnostic::on_unimplemented(
    message = "`skip_if_locked` returns `Default::default()` when the lock is held elsewhere, but `{Self}` does not implement `Default`",
    label = "this return type has no `Default`",
    note = "return a type that implements `Default` (`()`, `Option<_>`, a number, `Result<T, E>` with `T: Default`, ...), or use `fallback = some_async_fn` instead of `skip_if_locked`"
)]
pub trait SkipDefault: Sized {
    /// `Default::default()`.
    fn skip_default() -> Self;
}

impl<T: Default> SkipDefault for T {
    #[inline]
    fn skip_default() -> Self {
        T::default()
    }
}

/// Chosen for `Result<T, E>` (which has no `Default`): a skipped call returns
/// `Ok(T::default())`. Called as `(&Probe::<R>::new()).skipped()` (autoref dispatch).
pub trait SkipWithOk<R> {
    /// `Ok(Default::default())`.
    fn skipped(&self) -> R;
}

impl<T: SkipDefault, E> SkipWithOk<Result<T, E>> for Probe<Result<T, E>> {
    #[inline]
    fn skipped(&self) -> Result<T, E> {
        Ok(T::skip_default())
    }
}

/// Chosen otherwise: a skipped call returns `R::default()` ([`SkipDefault`] names the missing
/// `Default`).
pub trait SkipWithDefault<R> {
    /// `Default::default()`.
    fn skipped(&self) -> R
    where
        R: SkipDefault;
}

impl<R> SkipWithDefault<R> for &Probe<R> {
    #[inline]
    fn skipped(&self) -> R
    where
        R: SkipDefault,
    {
        R::skip_default()
    }
}

/// The output of a `skip_if_locked` call that did not get its lock: `skipped()` when the lock
/// is held elsewhere; for any other failure (the backend, no manager) the error is logged at
/// `error` and returned through `carry` when the return type can carry it, else `skipped()`.
#[inline(never)]
pub fn skip<R>(error: LockError, carry: Carry<R>, skipped: impl FnOnce() -> R) -> R {
    if error.is_contended() {
        tracing::debug!(error = %error, "lock held elsewhere; skipping the call");
        return skipped();
    }
    tracing::error!(error = %error, "lock not acquired; skipping the call");
    match carry {
        Some(carry) => carry(error),
        None => skipped(),
    }
}

/// How a lost error becomes the locked fn's output; `None`: the body runs to its end.
pub type Carry<R> = Option<fn(LockError) -> R>;

pin_project_lite::pin_project! {
    /// The run of a locked call: what [`LockRequest::run`](crate::LockRequest::run) does, for
    /// a caller that enters the lock itself ([`enter`]) and only then gives the body
    /// ([`start`]). Pinned in the locked fn's own future, so the held lock is written once, in
    /// place; nothing of the request or of the acquisition stays in it.
    #[must_use = "futures do nothing unless polled"]
    pub struct Locked<F: Future> {
        // `None` until started, and once the body has completed or was stopped by the loss.
        #[pin]
        body: Option<F>,
        hold: Hold,
        abort_on_lost: bool,
        // A release being awaited (a networked backend's), with the output it holds back.
        releasing: Option<Box<Pending<F::Output>>>,
    }

    impl<F: Future> PinnedDrop for Locked<F> {
        fn drop(this: Pin<&mut Self>) {
            // As `Run`'s: a body dropped before completion drops in its context; the guard is
            // dropped after it, which releases.
            let this = this.project();
            let mut body = this.body;
            if body.is_some() && this.hold.frame.is_some() {
                context::within(&mut this.hold.frame, || body.set(None));
            }
        }
    }
}

impl<F: Future> std::fmt::Debug for Locked<F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Locked")
            .field("entered", &self.hold.frame.is_some())
            .field("releasing", &self.releasing.is_some())
            .finish_non_exhaustive()
    }
}

impl<F: Future> Future for Locked<F> {
    type Output = Result<F::Output, LockError>;

    #[inline(always)]
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let abort = *this.abort_on_lost;
        if let Some(pending) = this.releasing {
            let released = std::task::ready!(Pin::new(&mut pending.release).poll(cx));
            return Poll::Ready(match this.releasing.take() {
                Some(pending) => run::finish(pending.output, released, abort),
                None => Err(run::not_running()),
            });
        }
        let hold = this.hold;
        let output = std::task::ready!(run::poll_held(this.body, hold, abort, cx));
        let at_once = match &mut hold.guard {
            None => Some(Ok(())), // re-entered: the outermost releases
            Some(guard) => guard.release_at_once(),
        };
        // After an at-once release the spent guard and the frame go with the run (nothing of
        // the lock is left in them): one drop instead of two more here.
        match at_once {
            Some(Ok(())) => return Poll::Ready(output),
            Some(released) => return Poll::Ready(run::finish(output, released, abort)),
            None => {}
        }
        // A networked backend: its release is awaited.
        hold.frame = None;
        let Some(guard) = hold.guard.take() else { return Poll::Ready(run::finish(output, Ok(()), abort)) };
        let mut pending = Box::new(Pending { release: guard.release(), output });
        match Pin::new(&mut pending.release).poll(cx) {
            Poll::Ready(released) => Poll::Ready(run::finish(pending.output, released, abort)),
            Poll::Pending => {
                *this.releasing = Some(pending);
                Poll::Pending
            }
        }
    }
}

/// The [`Locked`] run of a locked call: empty until [`enter`] puts the lock into it and
/// [`start`] the body.
#[inline]
pub fn run<F: Future>() -> Locked<F> {
    // Field by field (not a constant copied in): only the few words that say `None` are written.
    Locked { body: None, hold: Hold { guard: None, frame: None, watch: None }, abort_on_lost: true, releasing: None }
}

/// Takes (or re-enters) the lock `name` on `manager` into `run`, for a locked call, before its
/// arguments move into the body (they go to the fallback if the lock cannot be taken).
///
/// Acquires through [`LockManager::lock`] (the small, allocation-free future of the
/// uncontended fast path), so a locked fn costs about what the programmatic API does.
#[inline]
pub fn enter<'a, 'r, M: Borrow<LockManager>, N: LockName, F: Future>(
    mut run: Pin<&'r mut Locked<F>>,
    manager: &'a M,
    name: N,
    options: LockOptions,
) -> Enter<'a, 'r, F> {
    let manager = manager.borrow();
    match run::reenter(manager.id(), name.as_name(), run.as_mut().project().hold) {
        Some(parent) => {
            let request = manager.lock_named(name.into_name()).options(options);
            let state = State::Taking(Some(ManuallyDrop::new(Taking::new(request, parent))));
            Enter { run, state, done: false, manager: Some(manager) }
        }
        None => Enter { run, state: State::Entered, done: true, manager: Some(manager) },
    }
}

/// [`enter`] on the default manager (see [`default_manager`]), or the not-configured error.
#[inline]
pub fn enter_default<'a, 'r, N: LockName, F: Future>(
    run: Pin<&'r mut Locked<F>>,
    manager: &'a Option<LockManager>,
    name: N,
    options: LockOptions,
) -> Enter<'a, 'r, F> {
    match manager {
        Some(manager) => enter(run, manager, name, options),
        None => {
            let refused = LockError::NotConfigured { name: name.as_name().to_owned() };
            Enter { run, state: State::Refused(Some(refused)), done: false, manager: None }
        }
    }
}

/// The future of [`enter`]: `Ok(())` once the lock is in the [`Locked`] run.
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
    /// The call cannot take a lock (no default manager); `None` once returned.
    Refused(Option<LockError>),
    Entered,
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

impl<F: Future> std::fmt::Debug for Enter<'_, '_, F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
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
                let taken = std::task::ready!(taking.poll(cx, this.run.as_mut().project().hold));
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
                Poll::Ready(Err(error
                    .take()
                    .unwrap_or_else(|| LockError::invalid("", "a locked call's entry was polled after it completed"))))
            }
            State::Entered => Poll::Ready(Ok(())),
        }
    }
}

/// Gives `body` to the `run` that [`enter`] put the lock into; await the result for the body's
/// output (`Err`: the lost error, when the loss aborts the body).
#[inline]
pub fn start<'r, F: Future>(mut run: Pin<&'r mut Locked<F>>, on_lost: OnLost, body: F) -> Started<'r, F> {
    let this = run.as_mut().project();
    *this.abort_on_lost = on_lost == OnLost::Abort;
    let mut slot = this.body;
    slot.set(Some(body));
    Started(run)
}

/// The future of [`start`]: the [`Locked`] run, polled inline in the locked fn's future.
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

/// The locked fn's output from its run's: a lost error converted by `carry`.
///
/// With `carry` `None` the body was run to its end ([`OnLost::Ignore`]), so the run has no
/// error to give once its lock was entered: only a run awaited again after it completed (a
/// bug of the caller, as resuming a completed `async fn` is) gets here with one, and panics.
#[inline]
pub fn carried<R>(result: Result<R, LockError>, carry: Carry<R>) -> R {
    match result {
        Ok(output) => output,
        Err(e) => match carry {
            Some(carry) => carry(e),
            None => ran_to_end_failed(e),
        },
    }
}

#[cold]
#[inline(never)]
fn ran_to_end_failed(e: LockError) -> ! {
    panic!("a locked call that runs its body to the end failed after taking its lock: {e}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rendered_names_are_formatted_names() {
        let long = "x".repeat(NAME_BUF + 1);
        for (args, expected) in [
            (render(format_args!("order:{}", 42)), "order:42".to_owned()),
            (render(format_args!("заказ/{}", "✓")), "заказ/✓".to_owned()),
            (render(format_args!("{}", "y".repeat(NAME_BUF))), "y".repeat(NAME_BUF)),
            (render(format_args!("{long}:{}", 7)), format!("{long}:7")),
            (render(format_args!("plain")), "plain".to_owned()),
        ] {
            assert_eq!(args.as_name(), expected);
            assert_eq!(&*args.into_name(), expected);
        }
    }
}
