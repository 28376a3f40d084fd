//! Support for the code `#[distributed_locked]` expands to. Not a public API: anything here
//! may change in any release.

use std::borrow::Borrow;
use std::future::Future;
use std::marker::PhantomData;
use std::sync::OnceLock;
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

/// Takes (or re-enters) the lock `name` on the default manager (see [`default_manager`]).
pub async fn enter_default<N: AsRef<str>>(name: N, options: LockOptions) -> Result<Entered, LockError> {
    let manager = default_manager(name.as_ref())?;
    enter(manager, name, options).await
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

/// Takes (or re-enters) the lock for a locked call.
///
/// Acquires through [`LockManager::lock`] (the small, allocation-free future of the
/// uncontended fast path), so a locked fn costs about what the programmatic API does.
pub async fn enter<M: Borrow<LockManager>, N: AsRef<str>>(
    manager: M,
    name: N,
    options: LockOptions,
) -> Result<Entered, LockError> {
    let manager = manager.borrow();
    let name = name.as_ref();
    let context::Lookup { held, parent } = context::lookup(manager.id(), name);
    if let Some(outer) = held {
        // Same task, same manager, same name: re-enter without waiting for ourselves.
        return Ok(Entered { guard: None, frame: Frame { parent, ..outer } });
    }
    let guard = manager.lock(name).options(options).await?;
    let frame = Frame {
        manager: manager.id(),
        name: guard.name().clone(),
        fencing_token: guard.fencing_token(),
        lost: guard.lost_signal().clone(),
        parent,
    };
    Ok(Entered { guard: Some(guard), frame })
}

/// How a lost error becomes the locked fn's output; `None`: the body runs to its end.
pub type Carry<R> = Option<fn(LockError) -> R>;

/// A lock taken (or re-entered) for one locked call; runs the body.
#[derive(Debug)]
#[must_use]
pub struct Entered {
    /// `None` when re-entered: the outermost call releases.
    guard: Option<LockGuard>,
    frame: Frame,
}

impl Entered {
    /// Runs `body` under the lock and releases it afterwards (and on panic or cancellation,
    /// through the guard's `Drop`). With [`OnLost::Abort`], a loss of the lease stops the body
    /// at its next await and returns the lost error.
    pub fn run<F: Future>(self, on_lost: OnLost, body: F) -> impl Future<Output = Result<F::Output, LockError>> {
        let carry: Carry<Result<F::Output, LockError>> = match on_lost {
            OnLost::Abort => Some(Err),
            OnLost::Ignore => None,
        };
        self.drive(body, Ok, carry)
    }

    /// [`run`](Entered::run) with [`OnLost::Abort`] converting the lost error with `carry` when
    /// it is `Some`, else [`run_to_end`](Entered::run_to_end).
    pub fn run_with<F: Future>(self, carry: Carry<F::Output>, body: F) -> impl Future<Output = F::Output> {
        self.drive(body, |output| output, carry)
    }

    /// Runs `body` to its end under the lock (for [`OnLost::Ignore`], or return types that
    /// cannot carry a [`LockError`]), then releases it.
    pub fn run_to_end<F: Future>(self, body: F) -> impl Future<Output = F::Output> {
        self.drive(body, |output| output, None)
    }

    /// The one state machine behind `run*` (one level, so a locked fn's future stays small):
    /// runs `body` in the lock's context, watched for loss when `carry` is given and the lock
    /// can be lost, then releases the lock.
    async fn drive<F: Future, R>(self, body: F, wrap: fn(F::Output) -> R, carry: Carry<R>) -> R {
        let Entered { guard, frame } = self;
        let output: Result<F::Output, R> = match carry {
            // Boxed: the watch (a timer and a notification) would otherwise make every locked
            // fn's future as large as the watched one. A lock that can be lost lives on a
            // networked backend, where one allocation is noise.
            Some(carry) if frame.lost.can_fire() => Box::pin(watched(frame, body)).await.map_err(carry),
            _ => Ok(context::scope(frame, body).await),
        };
        if let Some(guard) = guard {
            if let Err(e) = guard.release().await {
                if let (Some(carry), true, true) = (carry, e.is_lost(), output.is_ok()) {
                    return carry(e);
                }
                tracing::warn!(error = %e, "release after a locked call failed");
            }
        }
        match output {
            Ok(output) => wrap(output),
            Err(lost) => lost,
        }
    }
}

/// Runs `body` in `frame`'s context until it ends or the lock is lost.
async fn watched<F: Future>(frame: Frame, body: F) -> Result<F::Output, LockError> {
    let lost = frame.lost.clone();
    let name = frame.name.clone();
    context::scope(frame, async move {
        tokio::select! {
            biased;
            output = body => Ok(output),
            _ = lost.wait() => Err(LockError::lost(
                &*name,
                lost.reason().unwrap_or_else(|| "its lease ran out".to_owned()),
            )),
        }
    })
    .await
}
