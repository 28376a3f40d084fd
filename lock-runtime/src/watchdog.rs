//! The lease watchdog: keeps a lock taken without a fixed `lease` alive while its guard lives.
//!
//! Renews at a third of the lease. A renewal the backend refuses (the key is gone or someone
//! else's) fires `lost()` at once; renewals that cannot get through are retried until the
//! lease runs out locally, which fires `lost()`. The task ends when the guard is released or
//! dropped (its handle is aborted), or when the lock is lost.

use std::time::Duration;

use tokio::task::AbortHandle;

use crate::lost::LostSignal;
use crate::telemetry::{Renewal, Renewals};

/// What the watchdog renews: the lock's renewal handle, the longest a renewal may take, and
/// what it reports renewals and a loss with (the lock's name among them).
pub(crate) struct Renewed {
    pub(crate) renewal: Box<dyn crate::backend::Renewal>,
    pub(crate) bound: Duration,
    pub(crate) telemetry: Renewals,
}

/// Starts renewing every `lease / 3` until aborted or lost.
pub(crate) fn spawn(renewed: Renewed, lease: Duration, lost: LostSignal) -> AbortHandle {
    tokio::spawn(renew(renewed, lease, lost)).abort_handle()
}

async fn renew(renewed: Renewed, lease: Duration, lost: LostSignal) {
    let Renewed { renewal, bound, telemetry } = renewed;
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
                let reason = "its lease ran out before the watchdog's renewal was confirmed";
                telemetry.renewal(Renewal::Failed);
                telemetry.lost(reason);
                lost.fire(reason);
                return;
            }
            Ok(Ok(())) => {
                telemetry.renewal(Renewal::Renewed);
                lost.set_deadline(crate::clock::trusted_until(sent, lease));
                next = sent + period;
            }
            Ok(Err(e)) if e.is_lost() => {
                let reason = format!("the watchdog's renewal was refused: {e}");
                telemetry.renewal(Renewal::Refused);
                telemetry.lost(&reason);
                lost.fire(reason);
                return;
            }
            outcome => {
                let why = match outcome {
                    Ok(Err(e)) => e.to_string(),
                    _ => format!("no answer within {bound:?}"),
                };
                telemetry.renewal(Renewal::Failed);
                if lost.is_lost() {
                    let reason = format!("the watchdog could not renew it before the lease ran out: {why}");
                    telemetry.lost(&reason);
                    lost.fire(reason);
                    return;
                }
                telemetry.retrying(&why);
                // Try again soon, well before the local lease deadline.
                next = crate::clock::now() + (period / 4).max(Duration::from_millis(5));
            }
        }
    }
}
