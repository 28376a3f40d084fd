//! The fault suite against etcd: worker processes lock (one key per acquisition, with their
//! manager's 2 s lease), read-modify-write a counter in the fenced witness store (PostgreSQL
//! behind the shipped fence) and release, while the nemesis kills and pauses holders, kills and
//! restarts the server (same data directory), partitions and delays workers
//! (`lock_tests::jepsen::nemesis`). The checker then reads the histories; no lock key may be
//! left once every worker exited and their leases ran out. `JEPSEN_SEED=<n>` replays a run,
//! `JEPSEN_SECS=<n>` makes it longer.
#![cfg(all(feature = "redis", feature = "postgres", feature = "etcd"))]
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::{Duration, Instant};

use lock_tests::jepsen::nemesis::{self, Backend, Config};

/// The workers' lease TTL (`src/bin/jepsen_worker.rs`).
const TTL: Duration = Duration::from_secs(2);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jepsen_etcd() {
    let config = Config::new(Backend::Etcd, env!("CARGO_BIN_EXE_jepsen_worker")).with_kinds().with_tasks(4);
    // Bounds of the checker, from the workers' settings (1 s operation timeout, 2 s lease TTL):
    // - wait_slack: a `wait` may be overrun by one request still in flight at its deadline (the
    //   operation timeout), plus 250 ms of scheduling on a busy 2-core machine.
    // - handoff_bound: a waiter watching its predecessor's key is granted when it is deleted: at
    //   the release, or when a killed holder's lease runs out (at most a TTL after its last
    //   keep-alive); then one request (the operation timeout); plus 500 ms.
    let wait_slack = config.op_timeout + Duration::from_millis(250);
    let handoff_bound = TTL + config.op_timeout + Duration::from_millis(500);
    let (run, replay) =
        nemesis::run_and_check(config, "jepsen_etcd", wait_slack, handoff_bound, Duration::from_secs(120)).await;

    // No lock key left once the leases of every worker ran out.
    let endpoint = run.etcd_endpoint().expect("an etcd run");
    let mut client = etcd_client::Client::connect([endpoint], None).await.expect("connect");
    let started = Instant::now();
    loop {
        let options = etcd_client::GetOptions::new().with_prefix().with_count_only();
        let left = client.get("lock-runtime/", Some(options)).await.expect("get").count();
        if left == 0 {
            break;
        }
        assert!(started.elapsed() < TTL * 3, "{left} lock keys left ({replay})");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}
