//! The fault suite against ZooKeeper: worker processes lock, read-modify-write a counter in the
//! fenced witness store (PostgreSQL behind the shipped fence; the workers are built with the
//! `redis` and `postgres` features) and release, while the
//! nemesis kills and pauses holders, restarts the server (same data directory), partitions
//! and delays workers, and expires a worker's session by cutting it off past its timeout
//! (`lock_tests::jepsen::nemesis`). The checker then reads the histories; no lock znode may be
//! left. `JEPSEN_SEED=<n>` replays a run, `JEPSEN_SECS=<n>` makes it longer.
#![cfg(all(feature = "redis", feature = "zookeeper", feature = "postgres"))]
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::{Duration, Instant};

use lock_runtime::backend::zookeeper::STALE_HOLDER_MARGIN;
use lock_tests::jepsen::nemesis::{self, Backend, Config};
use lock_tests::zk_server::{self, CONTAINER_CHECK_INTERVAL};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jepsen_zookeeper() {
    let config = Config::new(Backend::Zookeeper, env!("CARGO_BIN_EXE_jepsen_worker")).with_kinds().with_tasks(4);
    // Bounds of the checker, from the workers' settings (1.5 s session, 1 s operation timeout,
    // 1 s fixed leases for half the workers):
    // - wait_slack: a `wait` may be overrun by one operation still in flight at its deadline
    //   (the operation timeout), plus 250 ms of scheduling on a busy 2-core machine.
    // - handoff_bound: a free lock with a waiter is taken at once (the waiter watches its
    //   predecessor's node). The longest legitimate gap is a hung holder with a fixed lease:
    //   the next waiter deletes its node once the lease plus STALE_HOLDER_MARGIN is over, then
    //   takes the lock in one more operation; plus the same 250 ms.
    let wait_slack = config.op_timeout + Duration::from_millis(250);
    let handoff_bound = config.lease + STALE_HOLDER_MARGIN + config.op_timeout + Duration::from_millis(250);
    let session = config.session_timeout;
    let (run, replay) =
        nemesis::run_and_check(config, "jepsen_zookeeper", wait_slack, handoff_bound, Duration::from_secs(150)).await;

    // No lock znode left once every worker exited. A killed worker's nodes go with its session
    // (expired long before: it was killed at least the run's tail earlier), and the server
    // reaps empty lock containers every CONTAINER_CHECK_INTERVAL; allow both, with room.
    let hosts = run.zk_hosts().expect("a ZooKeeper run");
    let reap_bound = session + CONTAINER_CHECK_INTERVAL * 10 + Duration::from_secs(5);
    let started = Instant::now();
    loop {
        let left = zk_server::children(&hosts, &run.root).await;
        if left.is_empty() {
            break;
        }
        assert!(started.elapsed() < reap_bound, "znodes left under {} ({replay}): {left:?}", run.root);
        tokio::time::sleep(CONTAINER_CHECK_INTERVAL).await;
    }
}
