//! The fault suite against MariaDB: worker processes lock, read-modify-write a counter in the
//! fenced witness store (PostgreSQL behind the shipped fence; the workers are built with the
//! `redis`, `postgres` and `mysql` features) and release, while the nemesis kills and pauses
//! holders, kills and restarts the server (same data directory), partitions and delays workers
//! (`lock_tests::jepsen::nemesis`). The checker then reads the histories; no lock may be held
//! once every worker exited. `JEPSEN_SEED=<n>` replays a run, `JEPSEN_SECS=<n>` makes it longer.
#![cfg(all(feature = "redis", feature = "postgres", feature = "mysql"))]
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::{Duration, Instant};

use lock_tests::jepsen::nemesis::{self, Backend, Config};
use mysql_async::prelude::Queryable;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jepsen_mysql() {
    let config = Config::new(Backend::Mysql, env!("CARGO_BIN_EXE_jepsen_worker")).with_tasks(4);
    // Bounds of the checker, from the workers' settings (1 s operation timeout, 250 ms
    // heartbeat):
    // - wait_slack: a `wait` may be overrun by one query still in flight at its deadline (the
    //   operation timeout), plus 250 ms of scheduling on a busy 2-core machine.
    // - handoff_bound: a waiter in `GET_LOCK` is granted by the server at the release, or when
    //   the holder's session ends (its process killed, or its connection closed after a
    //   heartbeat found it dead), then draws a token (the operation timeout); plus 500 ms
    //   (scheduling, and the session's end reaching the server through the proxy).
    let wait_slack = config.op_timeout + Duration::from_millis(250);
    let handoff_bound = config.op_timeout + Duration::from_millis(500);
    let (run, replay) =
        nemesis::run_and_check(config, "jepsen_mysql", wait_slack, handoff_bound, Duration::from_secs(120)).await;

    // Every worker exited: no name is held on the server (the sessions of killed workers end
    // once the server sees their connections closed).
    let url = run.mysql_url().expect("a MySQL run");
    let mut conn = mysql_async::Conn::new(mysql_async::Opts::from_url(&url).unwrap()).await.expect("connect");
    let started = Instant::now();
    for name in &run.names {
        loop {
            let holder: Option<Option<u64>> = conn.exec_first("SELECT IS_USED_LOCK(?)", (name,)).await.unwrap();
            if holder.flatten().is_none() {
                break;
            }
            assert!(started.elapsed() < Duration::from_secs(5), "{name} still held ({replay})");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}
