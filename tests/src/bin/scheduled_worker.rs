//! A worker process of the scheduled-job test (`tests/tests/scheduled.rs`): one instance of a
//! service that runs the same job on a timer, as every instance does, with its clock's view
//! skewed by the test (the system clock cannot be changed here, so the offset is added to what
//! this process reads from it).
//!
//! ```text
//! scheduled_worker backend=redis|zookeeper addr=<redis url | zk hosts> prefix=<lock prefix>
//!                  skew_ms=<i64> tick_ms=<ms> ticks=<n> hold_ms=<ms> job_ms=<ms>
//! ```
//!
//! Once connected it prints `ready` and reads `epoch_ms` (Unix milliseconds) from stdin: the
//! test sends it when every worker is ready.
//!
//! Tick `n` (1..=ticks) is due when this process's skewed clock reads `epoch_ms + n * tick_ms`:
//! a worker whose clock is ahead fires early in real time, one behind fires late. At each tick
//! it runs two jobs at once, each `skip_if_locked` and taking `job_ms`:
//!
//! - `report`, with `hold_at_least = hold_ms` (what is under test): prints `ran report <n>`;
//! - `control`, the same without `hold_at_least`: prints `ran control <n>`. With skews wider
//!   than the job, it runs more than once per tick: the evidence that the skew is real and
//!   that `hold_at_least` is what keeps `report` to one run.
//!
//! Prints `ready` once connected, `done` at the end; `error <e>` for any failure.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use lock_runtime::{distributed_locked, LockManager};

#[distributed_locked(name = "report", skip_if_locked, hold_at_least = "250ms", manager = m)]
async fn report(m: &LockManager, tick: u64, job: Duration) {
    println!("ran report {tick}");
    tokio::time::sleep(job).await;
}

#[distributed_locked(name = "control", skip_if_locked, manager = m)]
async fn control(m: &LockManager, tick: u64, job: Duration) {
    println!("ran control {tick}");
    tokio::time::sleep(job).await;
}

/// This process's view of the wall clock, in Unix milliseconds: the system's plus the skew.
fn skewed_now_ms(skew_ms: i64) -> i64 {
    let real = SystemTime::now().duration_since(UNIX_EPOCH).expect("clock after 1970").as_millis();
    i64::try_from(real).expect("ms fit") + skew_ms
}

#[tokio::main]
async fn main() {
    let args: std::collections::HashMap<String, String> =
        std::env::args().skip(1).filter_map(|a| a.split_once('=').map(|(k, v)| (k.to_owned(), v.to_owned()))).collect();
    let arg = |k: &str| args.get(k).cloned().unwrap_or_else(|| panic!("missing {k}="));
    let num = |k: &str| arg(k).parse::<i64>().unwrap_or_else(|_| panic!("{k}= is not a number"));
    let (skew, tick_ms, ticks, job) =
        (num("skew_ms"), num("tick_ms"), num("ticks"), Duration::from_millis(num("job_ms") as u64));
    assert_eq!(num("hold_ms"), 250, "the attribute's hold_at_least is 250ms");
    let builder = LockManager::builder().prefix(arg("prefix")).label(format!("skew{skew}"));
    let manager = match arg("backend").as_str() {
        "redis" => builder.redis(arg("addr")).await,
        #[cfg(feature = "zookeeper")]
        "zookeeper" => builder.zookeeper(arg("addr")).await,
        other => panic!("unknown backend {other}"),
    };
    let manager = match manager {
        Ok(m) => m,
        Err(e) => {
            println!("error {e}");
            return;
        }
    };
    println!("ready");
    // The epoch comes on stdin once every worker is ready (`epoch_ms=` is left empty).
    let mut line = String::new();
    std::io::stdin().read_line(&mut line).expect("read the epoch");
    let epoch: i64 = line.trim().parse().expect("epoch in ms");
    for n in 1..=ticks {
        let due = epoch + n * tick_ms; // on this process's (skewed) clock
        let wait = due - skewed_now_ms(skew);
        if wait < -tick_ms / 2 {
            println!("late {n} {}", -wait); // overslept: this instance misses the tick
            continue;
        }
        if wait > 0 {
            tokio::time::sleep(Duration::from_millis(wait as u64)).await;
        }
        let tick = n as u64;
        tokio::join!(report(&manager, tick, job), control(&manager, tick, job));
    }
    // Let the last hold's release reach the store before the process ends.
    tokio::time::sleep(Duration::from_millis(300)).await;
    println!("done");
}
