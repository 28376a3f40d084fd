//! Work that must run to its end though nobody awaits it any more, for every backend: the
//! cleanup of a dropped acquisition, the release of a dropped guard, the rest of a dropped
//! release ([`Unabandoned`]), and what the store is owed after an outage ([`owed`]).
#![cfg_attr(not(all(feature = "redis", feature = "etcd")), allow(dead_code))]

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use crate::error::LockError;

/// A release being finished: its verdict.
type Release = Pin<Box<dyn Future<Output = Result<(), LockError>> + Send>>;

/// The first pause between two tries of work owed to the store ([`owed`]).
const FIRST_RETRY: Duration = Duration::from_millis(50);
/// The longest pause between two tries of work owed to the store.
const MAX_RETRY: Duration = Duration::from_secs(1);

/// Work the library owes the store (a release, a deletion) that failed without an answer,
/// done by `attempt` until it reports done (`true`: done, or nothing is owed any more), with
/// pauses growing from 50 ms to 1 s between tries, across reconnections. Given up only when
/// `over` completes: the state it would delete went by itself (its lease ended, the session it
/// was made in was lost). Every caller's `attempt` is owner-checked, so repeating it is safe.
pub(crate) async fn owed<Fut: Future<Output = bool>>(over: impl Future<Output = ()>, mut attempt: impl FnMut() -> Fut) {
    tokio::pin!(over);
    let mut pause = FIRST_RETRY;
    loop {
        tokio::select! {
            biased;
            () = &mut over => return,
            done = attempt() => if done { return },
        }
        tokio::select! {
            biased;
            () = &mut over => return,
            () = tokio::time::sleep(pause) => {}
        }
        pause = (pause * 2).min(MAX_RETRY);
    }
}

/// [`finish_in_background`] on the current runtime; outside one, `failed` is logged.
pub(crate) fn finish(work: impl Future<Output = ()> + Send + 'static, failed: &'static str) {
    match tokio::runtime::Handle::try_current() {
        Ok(runtime) => finish_in_background(&runtime, work, failed),
        Err(_) => tracing::warn!("{failed} (outside a tokio runtime)"),
    }
}

/// Runs `work` to its end though nobody awaits it any more. Polled once here, so that its
/// command is queued on the connection now: behind the commands it follows up on, and ahead
/// of any command sent after this call (a `try_lock` made right after a dropped acquisition or
/// release finds the lock free). The rest runs on `runtime`. `failed` is logged when it cannot
/// even be polled (its runtime shuts down, say).
pub(crate) fn finish_in_background(
    runtime: &tokio::runtime::Handle,
    work: impl Future<Output = ()> + Send + 'static,
    failed: &'static str,
) {
    let mut work = Box::pin(work);
    if std::thread::panicking() {
        drop(runtime.spawn(work)); // no polling here while unwinding
        return;
    }
    let _entered = runtime.enter();
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| work.as_mut().poll(&mut cx))) {
        Ok(std::task::Poll::Pending) => drop(runtime.spawn(work)),
        Ok(std::task::Poll::Ready(())) => {}
        Err(_) => tracing::warn!("{failed}"),
    }
}

/// A holder's release that completes even when its future is dropped before the answer: the
/// rest runs in the background (polled once at the drop, then spawned on the backend's
/// runtime), bounded by `timeout`. The release must stay owner-checked (a revision, an owner
/// id), so that one that lands late never touches a later owner's lock.
pub(crate) struct Unabandoned {
    release: Option<Release>,
    runtime: tokio::runtime::Handle,
    timeout: Duration,
    name: Arc<str>,
    /// The backend's short name, for the time-out's message.
    kind: &'static str,
}

impl Future for Unabandoned {
    type Output = Result<(), LockError>;

    fn poll(mut self: std::pin::Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> std::task::Poll<Self::Output> {
        let Some(release) = &mut self.release else { return std::task::Poll::Ready(Ok(())) };
        let done = std::task::ready!(release.as_mut().poll(cx));
        self.release = None;
        std::task::Poll::Ready(done)
    }
}

impl Drop for Unabandoned {
    fn drop(&mut self) {
        let Some(release) = self.release.take() else { return };
        let (name, timeout, kind) = (self.name.clone(), self.timeout, self.kind);
        let rest = async move {
            let outcome = crate::bounded::bounded(timeout, release)
                .await
                .unwrap_or_else(|| Err(LockError::timed_out(&*name, kind, "release", timeout)));
            let shown = crate::telemetry::shown_name(&name);
            match outcome {
                Ok(()) => tracing::debug!(lock = %shown, "finished a release whose future was dropped"),
                Err(e) if e.is_lost() => {
                    tracing::debug!(lock = %shown, error = %crate::telemetry::shown_error(&e), "a release whose future was dropped found the lock gone")
                }
                Err(e) => {
                    tracing::warn!(lock = %shown, error = %crate::telemetry::shown_error(&e), "could not finish a release whose future was dropped; its lease will free the lock")
                }
            }
        };
        finish_in_background(
            &self.runtime,
            rest,
            "could not finish a release whose future was dropped; its lease will free the lock",
        );
    }
}

impl Unabandoned {
    /// `release` of lock `name` on backend `kind`, finished on `runtime` (bounded by
    /// `timeout`) if dropped before its answer.
    pub(crate) fn new(
        release: Release,
        runtime: tokio::runtime::Handle,
        (timeout, kind): (Duration, &'static str),
        name: Arc<str>,
    ) -> Self {
        Unabandoned { release: Some(release), runtime, timeout, name, kind }
    }
}
