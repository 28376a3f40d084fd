//! Overhead of `#[distributed_locked]` against the same body with the programmatic API, on the
//! in-memory backend (uncontended: the cost of the lock path itself, not of waiting).
//!
//! ```text
//! cargo run --release -p examples --example bench_attribute [calls-per-round]
//! ```
//!
//! Both variants take and release the lock "bench" on the same manager around the same body;
//! the attribute adds the task-local context (`current()`, reentrancy) and the lost-lease
//! watch. Rounds alternate between the variants; the median round is reported.

use std::hint::black_box;
use std::time::{Duration, Instant};

use lock_runtime::{distributed_locked, LockError, LockManager};

async fn body(n: u64) -> u64 {
    black_box(n).wrapping_mul(31).wrapping_add(7)
}

#[distributed_locked(name = "bench", manager = m)]
async fn with_attribute(m: &LockManager, n: u64) -> Result<u64, LockError> {
    Ok(body(n).await)
}

async fn programmatic(m: &LockManager, n: u64) -> Result<u64, LockError> {
    let guard = m.lock("bench").await?;
    let out = body(n).await;
    guard.release().await?;
    Ok(out)
}

#[distributed_locked(name = "bench:{n}", manager = m)]
async fn with_attribute_templated(m: &LockManager, n: u64) -> Result<u64, LockError> {
    Ok(body(n).await)
}

async fn programmatic_templated(m: &LockManager, n: u64) -> Result<u64, LockError> {
    let guard = m.lock(format!("bench:{n}")).await?;
    let out = body(n).await;
    guard.release().await?;
    Ok(out)
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn main() -> Result<(), LockError> {
    let calls: u64 = std::env::args().nth(1).and_then(|a| a.parse().ok()).unwrap_or(200_000);
    let rounds = 11;
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    rt.block_on(async {
        let m = LockManager::memory();
        let mut report = Vec::new();
        for (label, templated) in [("fixed name", false), ("templated name", true)] {
            let (mut attr, mut prog) = (Vec::new(), Vec::new());
            for round in 0..rounds + 1 {
                let t = Instant::now();
                for n in 0..calls {
                    let out = if templated {
                        with_attribute_templated(&m, n % 64).await?
                    } else {
                        with_attribute(&m, n).await?
                    };
                    black_box(out);
                }
                let a = t.elapsed();
                let t = Instant::now();
                for n in 0..calls {
                    let out =
                        if templated { programmatic_templated(&m, n % 64).await? } else { programmatic(&m, n).await? };
                    black_box(out);
                }
                let p = t.elapsed();
                if round > 0 {
                    // round 0 warms up
                    attr.push(a);
                    prog.push(p);
                }
            }
            let (a, p) = (median(attr), median(prog));
            let per = |d: Duration| d.as_nanos() as f64 / calls as f64;
            report.push(format!(
                "{label:>15}: attribute {:8.1} ns/call, programmatic {:8.1} ns/call, overhead {:+.1}%",
                per(a),
                per(p),
                (per(a) / per(p) - 1.0) * 100.0
            ));
        }
        println!("{calls} calls per round, median of {rounds} rounds, memory backend, current-thread runtime");
        for line in report {
            println!("{line}");
        }
        Ok(())
    })
}
