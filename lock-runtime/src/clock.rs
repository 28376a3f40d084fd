//! The runtime's clock: tokio's. Deadlines, leases and waits are measured on it, so that they
//! follow a paused clock in tests (`tokio::time::pause`, `#[tokio::test(start_paused = true)]`):
//! a `wait` of two seconds then takes two seconds of virtual time and none of real time, and a
//! fixed lease runs out when virtual time passes its end. Without tokio's `test-util` feature
//! this is the system's monotonic clock, at no cost.

use std::time::{Duration, Instant};

/// Now, on tokio's clock (the system's monotonic clock unless tokio's clock is paused).
#[inline(always)]
pub(crate) fn now() -> Instant {
    tokio::time::Instant::now().into_std()
}

/// Until when a holder trusts a lease that started at `start` (when its request was sent):
/// a little before the lease ends, by the allowance Redlock makes for clock drift and timer
/// granularity (1% of the lease plus 2 ms, at most half the lease). Its `lost()` thus fires
/// before the store lets the next holder in, even when its timer fires late by a tick.
pub(crate) fn trusted_until(start: Instant, lease: Duration) -> Option<Instant> {
    let margin = (lease / 100 + Duration::from_millis(2)).min(lease / 2);
    start.checked_add(lease - margin)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lease_is_trusted_until_a_margin_before_its_end() {
        let start = now();
        let ms = Duration::from_millis;
        assert_eq!(trusted_until(start, ms(1000)), Some(start + ms(988)));
        assert_eq!(trusted_until(start, Duration::from_secs(30)), Some(start + ms(29_698)));
        assert_eq!(trusted_until(start, ms(2)), Some(start + ms(1)), "at most half the lease");
    }
}
