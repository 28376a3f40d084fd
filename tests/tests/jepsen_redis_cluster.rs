//! The fault suite against a Redis Cluster of three primaries with a replica each (no
//! persistence): worker processes lock, read-modify-write a counter in the fenced witness store
//! and release, while the nemesis kills and pauses workers, fails over the primary of a lock
//! name's slot (killed; the run waits for its replica's promotion, then starts it again as a
//! replica) and moves a lock name's slot to another primary (`MIGRATE`, as `redis-cli --cluster
//! reshard` does). The checker then reads the histories against GUARANTEES.md's Cluster rows;
//! nothing but the fencing counters may be left on any node. Workers connect to the nodes
//! directly (a cluster client learns their addresses), so no partition or delay is injected.
//! `JEPSEN_SEED=<n>` replays a run, `JEPSEN_SECS=<n>` makes it longer.
#![cfg(all(feature = "redis", feature = "postgres"))]
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

use lock_tests::jepsen::nemesis::{self, Backend, Config};

mod jepsen_support;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jepsen_redis_cluster() {
    let config = Config::new(Backend::RedisCluster, env!("CARGO_BIN_EXE_jepsen_worker")).with_kinds().with_tasks(4);
    // Bounds of the checker, from the workers' settings (1 s lease, 1 s command timeout):
    // - wait_slack: a `wait` may be overrun by one command still in flight at its deadline (the
    //   command timeout), plus 250 ms of scheduling on a busy 2-core machine.
    // - handoff_bound: as on one server (a release publishes, a lost notification is made up
    //   when the lease ends), plus 500 ms for a redirection to be followed.
    let wait_slack = config.op_timeout + Duration::from_millis(250);
    let handoff_bound = config.lease + config.op_timeout + Duration::from_millis(750);
    let (run, replay) =
        nemesis::run_and_check(config, "jepsen_redis_cluster", wait_slack, handoff_bound, Duration::from_secs(150))
            .await;
    let urls = run.data_node_urls().expect("a Cluster run");
    jepsen_support::nothing_left_on(&urls, &replay).await;
}
