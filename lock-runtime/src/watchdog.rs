//! The lease watchdog: keeps a lock taken without a fixed `lease` alive while its guard lives.
//!
//! Renews at a third of the lease. A renewal the backend refuses (the key is gone or someone
//! else's) fires `lost()` at once; renewals that cannot get through are retried until the
//! lease runs out locally, which fires `lost()`. The task ends when the guard is released or
//! dropped (its handle is aborted), or when the lock is lost.

use std::sync::Arc;
use std::time::Duration;

use tokio::task::AbortHandle;

use crate::backend::Renewal;
use crate::lost::LostSignal;

/// What the watchdog renews: the lock's renewal handle, its name (for logs) and the longest a
/// renewal may take.
pub(crate) struct Renewed {
    pub(crate) renewal: Box<dyn Renewal>,
    pub(crate) name: Arc<str>,
    pub(crate) bound: Duration,
}

/// Starts renewing every `lease / 3` until aborted or lost.
pub(crate) fn spawn(renewed: Renewed, lease: Duration, lost: LostSignal) -> AbortHandle {
    tokio::spawn(renew(renewed, lease, lost)).abort_handle()
}

async fn renew(renewed: Renewed, lease: Duration, lost: LostSignal) {
    let Renewed { renewal, name, bound } = renewed;
    let period = lease / 3;
    let mut next = crate::clock::now() + period;
    loop {
        tokio::select! {
            _ = lost.wait() => return,
            _ = tokio::time::sleep_until(next.into()) => {}
        }
        let sent = crate::clock::now();
        let bound = bound.min(lease);
        match tokio::time::timeout(bound, renewal.extend(lease)).await {
            Ok(Ok(())) if lost.is_lost() => {
                // The local lease ran out while this renewal was in flight, and `lost()` may
                // already have been observed: a lock reported lost stays lost (never revived).
                tracing::warn!(lock = %name, "lock lost: the lease ran out before the renewal was confirmed");
                lost.fire("its lease ran out before the watchdog's renewal was confirmed");
                return;
            }
            Ok(Ok(())) => {
                lost.set_deadline(sent.checked_add(lease));
                next = sent + period;
            }
            Ok(Err(e)) if e.is_lost() => {
                tracing::warn!(lock = %name, error = %e, "lock lost: renewal refused");
                lost.fire(format!("the watchdog's renewal was refused: {e}"));
                return;
            }
            outcome => {
                let why = match outcome {
                    Ok(Err(e)) => e.to_string(),
                    _ => format!("no answer within {bound:?}"),
                };
                if lost.is_lost() {
                    tracing::warn!(lock = %name, error = %why, "lock lost: could not renew before the lease ran out");
                    lost.fire(format!("the watchdog could not renew it before the lease ran out: {why}"));
                    return;
                }
                tracing::debug!(lock = %name, error = %why, "lease renewal failed; retrying");
                // Try again soon, well before the local lease deadline.
                next = crate::clock::now() + (period / 4).max(Duration::from_millis(5));
            }
        }
    }
}
