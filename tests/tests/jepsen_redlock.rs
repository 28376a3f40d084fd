//! The fault suite against Redlock over three `redis-server` primaries (no persistence): worker
//! processes lock, read-modify-write a counter in the fenced witness store and release, while
//! the nemesis kills, pauses, partitions and delays workers (each worker's connections to all
//! three nodes at once) and faults one node at a time: stopped past a lease (`node-pause`),
//! killed and started again empty after more than a lease (`node-restart`, as the Redlock docs
//! ask of a node that lost its data), or its counters set ahead (`node-skew`). The checker
//! then reads the histories against GUARANTEES.md's Redlock rows; nothing but the fencing
//! counters may be left on any node.
//! `JEPSEN_SEED=<n>` replays a run, `JEPSEN_SECS=<n>` makes it longer.
//!
//! A node whose clock runs ahead is stood for by its fencing counters set an hour ahead
//! (`node-skew`): that is what a clock ahead does to the tokens it mints (leases are counted
//! on each node's own clock, in durations); libfaketime cannot run redis-server here.
#![cfg(all(feature = "redis", feature = "postgres"))]
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

use lock_tests::jepsen::nemesis::{self, Backend, Config};

mod jepsen_support;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jepsen_redlock() {
    let config = Config::new(Backend::Redlock, env!("CARGO_BIN_EXE_jepsen_worker")).with_tasks(4);
    // Bounds of the checker, from the workers' settings (1 s lease, 1 s command timeout):
    // - wait_slack: a `wait` may be overrun by one round of commands still in flight at its
    //   deadline (the command timeout), plus 250 ms of scheduling on a busy 2-core machine.
    // - handoff_bound: a free lock with a waiter is taken within one lease plus one round: a
    //   release publishes on every node, and a waiter whose notification was lost looks again
    //   when the holder's lease runs out; its attempt takes up to the command timeout (a
    //   stopped node is not waited for once a quorum answered); plus 500 ms (the split-vote
    //   delay a contended attempt may draw).
    let wait_slack = config.op_timeout + Duration::from_millis(250);
    let handoff_bound = config.lease + config.op_timeout + Duration::from_millis(500);
    let (run, replay) =
        nemesis::run_and_check(config, "jepsen_redlock", wait_slack, handoff_bound, Duration::from_secs(120)).await;

    // Nothing left on any node once every worker exited and the leases ran out.
    let urls = run.redlock_urls().expect("a Redlock run");
    jepsen_support::nothing_left_on(&urls, &replay).await;
}
