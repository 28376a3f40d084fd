//! The runtime's clock: tokio's. Deadlines, leases and waits are measured on it, so that they
//! follow a paused clock in tests (`tokio::time::pause`, `#[tokio::test(start_paused = true)]`):
//! a `wait` of two seconds then takes two seconds of virtual time and none of real time, and a
//! fixed lease runs out when virtual time passes its end. Without tokio's `test-util` feature
//! this is the system's monotonic clock, at no cost.

use std::time::Instant;

/// Now, on tokio's clock (the system's monotonic clock unless tokio's clock is paused).
#[inline(always)]
pub(crate) fn now() -> Instant {
    tokio::time::Instant::now().into_std()
}
