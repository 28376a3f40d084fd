//! The fault suite on lock files: worker processes of this host lock names in one directory,
//! read-modify-write a counter in the fenced witness store (PostgreSQL behind the shipped
//! fence; the workers are built with the `redis` and `postgres` features) and release, while
//! the nemesis kills holders (`SIGKILL`: the kernel frees their locks) and pauses them
//! (`SIGSTOP` past their lease: the lock stays held, since no lease is kept outside the holder)
//! (`lock_tests::jepsen::nemesis`). The checker then reads the histories; no lock may be held
//! once every worker exited. `JEPSEN_SEED=<n>` replays a run, `JEPSEN_SECS=<n>` makes it longer.
#![cfg(all(feature = "redis", feature = "postgres"))]
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

use lock_tests::jepsen::nemesis::{self, Backend, Config};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jepsen_file() {
    let config = Config::new(Backend::File, env!("CARGO_BIN_EXE_jepsen_worker")).with_tasks(4);
    // Bounds of the checker, from the workers' settings (1 s operation timeout):
    // - wait_slack: a `wait` may be overrun by one attempt still in flight at its deadline (the
    //   operation timeout), plus 250 ms of scheduling on a busy 2-core machine.
    // - handoff_bound: a freed lock file is taken at once (the kernel wakes the waiter blocked on
    //   its lock, also when the holder died), then one token is drawn (the operation timeout);
    //   plus the same 250 ms.
    let wait_slack = config.op_timeout + Duration::from_millis(250);
    let handoff_bound = config.op_timeout + Duration::from_millis(250);
    let (run, replay) =
        nemesis::run_and_check(config, "jepsen_file", wait_slack, handoff_bound, Duration::from_secs(90)).await;

    // Every worker exited: no lock file is held (files a killed holder left are free).
    let dir = run.lock_dir().expect("a file run");
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "lock") {
            let file = std::fs::File::open(&path).unwrap();
            assert!(file.try_lock().is_ok(), "{} is still locked ({replay})", path.display());
        }
    }
}
