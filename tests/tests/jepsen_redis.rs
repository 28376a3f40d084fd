//! The fault suite against Redis: worker processes lock, read-modify-write a counter in the
//! fenced witness store and release, while the nemesis kills and pauses holders, restarts the
//! server (no persistence), kills its connections, partitions and delays workers
//! (`lock_tests::jepsen::nemesis`). The checker then reads the histories; nothing may be left
//! on the server. `JEPSEN_SEED=<n>` replays a run, `JEPSEN_SECS=<n>` makes it longer.
//!
//! `JEPSEN_LONG_HOLD_MS=1500` makes one hold in ten outlast the workers' fixed 1 s lease, with
//! no fault. It exposes a race the default run stays clear of: the holder's `lost()` is due
//! at the instant the key expires on the server (the lease counted from when the acquire was
//! sent, with no margin), and the waiter, which sleeps for the key's remaining TTL, is granted
//! at that same instant; a timer or a process a few ms late lets the next grant come before
//! `lost()` is observed (an `unexplained` overlap; the fenced witness still refuses the stale
//! holder's write).
#![cfg(all(feature = "redis", feature = "postgres"))]
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

use lock_tests::jepsen::nemesis::{self, Backend, Config};

mod jepsen_support;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jepsen_redis() {
    // Four loops per worker: enough for a process's locks and releases to go out in batches
    // (group commit: a third operation while two calls are on the wire) under the faults.
    let config = Config::new(Backend::Redis, env!("CARGO_BIN_EXE_jepsen_worker")).with_kinds().with_tasks(4);
    // Bounds of the checker, from the workers' settings (1 s lease, 1 s command timeout):
    // - wait_slack: a `wait` may be overrun by one command still in flight at its deadline (the
    //   command timeout), plus 250 ms of scheduling on a busy 2-core machine.
    // - handoff_bound: a free lock with a waiter is taken within one lease plus one command:
    //   a release publishes to the waiters, and a waiter whose notification was lost (killed
    //   pub/sub connection, crashed holder) looks again when the holder's lease runs out (at
    //   most one lease after its last renewal); its attempt then takes up to the command
    //   timeout; plus the same 250 ms of scheduling.
    let wait_slack = config.op_timeout + Duration::from_millis(250);
    let handoff_bound = config.lease + config.op_timeout + Duration::from_millis(250);
    let (run, replay) =
        nemesis::run_and_check(config, "jepsen_redis", wait_slack, handoff_bound, Duration::from_secs(120)).await;

    // Nothing left once every worker exited: no key but the fencing counters (which are kept
    // on purpose, see the backend's key layout), no channel; keys of a killed holder expire
    // with their lease.
    jepsen_support::nothing_left_on(&[run.redis_url().expect("a Redis run")], &replay).await;
}
