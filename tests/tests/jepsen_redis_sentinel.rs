//! The fault suite against a primary with two replicas and three Sentinels (no persistence),
//! once without and once with `wait_for_replicas(1)`: worker processes lock, read-modify-write a
//! counter in the fenced witness store and release, while the nemesis kills and pauses workers
//! and fails the primary over (killed; the run waits until the Sentinels promote a replica, then
//! starts the old primary again, which they make a replica). The checker then reads the
//! histories against GUARANTEES.md's Sentinel rows; nothing but the fencing counters may be left
//! on any node. Workers reach the nodes the Sentinels name directly, so no partition or delay
//! is injected. `JEPSEN_SEED=<n>` replays a run, `JEPSEN_SECS=<n>` makes it longer.
#![cfg(all(feature = "redis", feature = "postgres"))]
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

use lock_tests::jepsen::nemesis::{self, Backend, Config};

mod jepsen_support;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jepsen_redis_sentinel() {
    for wait_for_replicas in [None, Some(1)] {
        let mut config =
            Config::new(Backend::RedisSentinel, env!("CARGO_BIN_EXE_jepsen_worker")).with_kinds().with_tasks(4);
        config.wait_for_replicas = wait_for_replicas;
        eprintln!("jepsen_redis_sentinel: wait_for_replicas {wait_for_replicas:?}");
        // Bounds of the checker, from the workers' settings (1 s lease, 1 s command timeout):
        // - wait_slack: a `wait` may be overrun by one command still in flight at its deadline
        //   (the command timeout, which bounds a `WAIT` too), plus 250 ms of scheduling.
        // - handoff_bound: as on one server, plus 500 ms to follow a `+switch-master`.
        let wait_slack = config.op_timeout + Duration::from_millis(250);
        let handoff_bound = config.lease + config.op_timeout + Duration::from_millis(750);
        let (run, replay) = nemesis::run_and_check(
            config,
            "jepsen_redis_sentinel",
            wait_slack,
            handoff_bound,
            Duration::from_secs(150),
        )
        .await;
        let urls = run.data_node_urls().expect("a Sentinel run");
        jepsen_support::nothing_left_on(&urls, &replay).await;
    }
}
