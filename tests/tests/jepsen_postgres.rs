//! The fault suite against PostgreSQL: worker processes lock (session advisory locks, on a
//! server of their own), read-modify-write a counter in the fenced witness store (another
//! PostgreSQL, behind the shipped fence) and release, while the nemesis kills and pauses
//! holders, crashes and restarts the server (immediate shutdown, same data directory),
//! partitions and delays workers (`lock_tests::jepsen::nemesis`). The checker then reads the
//! histories; no advisory lock may be held once every worker exited. `JEPSEN_SEED=<n>` replays a
//! run, `JEPSEN_SECS=<n>` makes it longer.
#![cfg(all(feature = "redis", feature = "postgres"))]
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::{Duration, Instant};

use lock_tests::jepsen::nemesis::{self, Backend, Config};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jepsen_postgres() {
    let config = Config::new(Backend::Postgres, env!("CARGO_BIN_EXE_jepsen_worker")).with_kinds().with_tasks(4);
    // Bounds of the checker, from the workers' settings (1 s operation timeout):
    // - wait_slack: a `wait` may be overrun by one query still in flight at its deadline (the
    //   operation timeout), plus 250 ms of scheduling on a busy 2-core machine.
    // - handoff_bound: a waiter queued on the server is granted at the release, or as soon as
    //   the holder's session ends (its process killed, its connection closed at a fixed lease's
    //   end), drawing its token in the same round trip; plus 500 ms (scheduling, and the
    //   session's end reaching the server through the proxy).
    let wait_slack = config.op_timeout + Duration::from_millis(250);
    let handoff_bound = config.op_timeout + Duration::from_millis(500);
    let (run, replay) =
        nemesis::run_and_check(config, "jepsen_postgres", wait_slack, handoff_bound, Duration::from_secs(120)).await;

    // Every worker exited: no advisory lock is held (the sessions of killed workers end once
    // the server sees their connections closed).
    let url = run.postgres_url().expect("a PostgreSQL run");
    let (client, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls).await.expect("connect");
    tokio::spawn(connection);
    let started = Instant::now();
    loop {
        let held: i64 = client
            .query_one("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'", &[])
            .await
            .expect("pg_locks")
            .get(0);
        if held == 0 {
            break;
        }
        assert!(started.elapsed() < Duration::from_secs(5), "{held} advisory locks still held ({replay})");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
