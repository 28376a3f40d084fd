//! Support for the code `#[distributed_locked]` expands to. Not a public API: anything here
//! may change in any release.

use std::borrow::Borrow;
use std::future::Future;
use std::marker::PhantomData;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use crate::backend::LockKind;
pub use crate::error::LockError;
pub use crate::manager::LockManager;
use crate::manager::LockRequest;
pub use crate::name::{default_name, fixed_name, render, LockName};
pub use crate::options::LockOptions;
use crate::run;
pub use crate::run::{Enter, Locked, Started};

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
        // The error's own advice (`wait`, a `fallback`) is for a caller that handles it; a
        // skipped call is the outcome asked for.
        tracing::debug!(target: "lock_runtime", lock = %crate::telemetry::shown_name(error.lock_name()), "lock held elsewhere; skipping the call (skip_if_locked)");
        return skipped();
    }
    tracing::error!(target: "lock_runtime", error = %error, "lock not acquired; skipping the call");
    match carry {
        Some(carry) => carry(error),
        None => skipped(),
    }
}

/// How a lost error becomes the locked fn's output; `None`: the body runs to its end.
pub type Carry<R> = Option<fn(LockError) -> R>;

/// Takes (or re-enters) the lock `name` of `kind` on `manager` into `run`, for a locked call,
/// before its arguments move into the body (they go to the fallback if the lock cannot be
/// taken): what [`Locked::enter`] does with `manager.lock(name)`, with the request made only
/// when the lock must be taken.
#[inline(always)]
pub fn enter<'a, 'r, M: Borrow<LockManager>, F: Future>(
    mut run: Pin<&'r mut Locked<F>>,
    manager: &'a M,
    name: LockName,
    kind: LockKind,
    options: LockOptions,
) -> Enter<'a, 'r, F> {
    let manager = manager.borrow();
    match run::reenter(manager.id(), name.as_name(), kind, run.as_mut().hold()) {
        Some(parent) => {
            let request = LockRequest { manager, name: name.into_name(), kind, options };
            Enter::taking(run, request, parent)
        }
        None => Enter::entered(run, manager),
    }
}

/// [`enter`] on the default manager (see [`default_manager`]), or the not-configured error.
#[inline(always)]
pub fn enter_default<'a, 'r, F: Future>(
    run: Pin<&'r mut Locked<F>>,
    manager: &'a Option<LockManager>,
    name: LockName,
    kind: LockKind,
    options: LockOptions,
) -> Enter<'a, 'r, F> {
    match manager {
        Some(manager) => enter(run, manager, name, kind, options),
        None => Enter::refused(run, LockError::NotConfigured { name: name.as_name().to_owned() }),
    }
}

/// Takes (or re-enters) every one of `names` into `run` (the attribute's `names`), on the
/// `manager = ..` given (a `LockManager` or a reference to one) or the default one.
pub async fn enter_all<F: Future, M: Borrow<LockManager>>(
    run: Pin<&mut Locked<F>>,
    manager: Option<&M>,
    names: Vec<Arc<str>>,
    options: LockOptions,
) -> Result<(), LockError> {
    let Some(manager) = manager.map(Borrow::borrow) else {
        let joined: Vec<&str> = names.iter().map(|n| &**n).collect();
        return Err(LockError::NotConfigured { name: joined.join(", ") });
    };
    manager.lock_all(names).options(options).enter(run).await
}

/// Runs a `leader` fn: [`Election::lead`](crate::Election::lead) of the election `name` on
/// `manager` (the `manager = ..` given, or the default one), its terms with the fixed `lease`
/// given; the not-configured error without a manager.
pub async fn lead<M: Borrow<LockManager>, F, Fut>(
    manager: Option<&M>,
    name: LockName,
    lease: Option<Duration>,
    body: F,
) -> Result<Fut::Output, LockError>
where
    F: FnMut(crate::Leadership) -> Fut,
    Fut: Future,
{
    let Some(manager) = manager.map(Borrow::borrow) else {
        return Err(LockError::NotConfigured { name: name.as_name().to_owned() });
    };
    let mut election = manager.election(name.as_name());
    if let Some(lease) = lease {
        election = election.lease(lease);
    }
    election.lead(body).await
}

/// Gives `body` to the `run` that [`enter`] put the lock into: [`Locked::start`], with the
/// locked fn's `on_lost`.
#[inline]
pub fn start<'r, F: Future>(run: Pin<&'r mut Locked<F>>, on_lost: OnLost, body: F) -> Started<'r, F> {
    match on_lost {
        OnLost::Abort => run.start(body),
        OnLost::Ignore => run.ignore_lost().start(body),
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
