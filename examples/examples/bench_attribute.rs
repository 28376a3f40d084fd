//! Overhead of `#[distributed_locked]` against the same body with the programmatic API, on the
//! in-memory backend (uncontended: the cost of the lock path itself, not of waiting).
//!
//! ```text
//! cargo run --release -p examples --example bench_attribute [calls-per-round]
//! ```
//!
//! Both variants take and release the lock "bench" on the same manager around the same body;
//! the attribute adds the task-local context (`current()`, reentrancy) and the lost-lease
//! watch. Rounds alternate between the variants; the least disturbed (min) and the median
//! round are reported.

use std::future::Future;
use std::hint::black_box;
use std::pin::{pin, Pin};
use std::task::{Context, Poll};
use std::time::Instant;

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

/// Polls a variant's future through a named, never-inlined fn per variant, so an instruction
/// profile (`valgrind --tool=callgrind`, then `callgrind_annotate --inclusive=yes`) shows each
/// variant's cost per call under its own name.
macro_rules! measured {
    ($($name:ident),*) => {$(
        #[inline(never)]
        fn $name<F: Future>(fut: Pin<&mut F>, cx: &mut Context<'_>) -> Poll<F::Output> {
            fut.poll(cx)
        }
    )*};
}
measured!(
    measure_with_attribute,
    measure_programmatic,
    measure_with_attribute_templated,
    measure_programmatic_templated
);

/// Awaits `fut`, polling it through `poll`.
async fn run<F: Future>(poll: fn(Pin<&mut F>, &mut Context<'_>) -> Poll<F::Output>, fut: F) -> F::Output {
    let mut fut = pin!(fut);
    std::future::poll_fn(|cx| poll(fut.as_mut(), cx)).await
}

fn main() -> Result<(), LockError> {
    let batch: u64 = std::env::args().nth(1).and_then(|a| a.parse().ok()).unwrap_or(20_000);
    let rounds = 41;
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    rt.block_on(async {
        let m = LockManager::memory();
        println!(
            "memory backend, current-thread runtime; {rounds} rounds of {batch} calls per variant, alternating; \
             ns per call (min = least disturbed round, median)"
        );
        for (label, templated) in [("fixed name", false), ("templated name", true)] {
            let (mut attr, mut prog) = (Vec::new(), Vec::new());
            for round in 0..=rounds {
                let t = Instant::now();
                for n in 0..batch {
                    let out = if templated {
                        run(measure_with_attribute_templated, with_attribute_templated(&m, n % 64)).await?
                    } else {
                        run(measure_with_attribute, with_attribute(&m, n)).await?
                    };
                    black_box(out);
                }
                let a = t.elapsed();
                let t = Instant::now();
                for n in 0..batch {
                    let out = if templated {
                        run(measure_programmatic_templated, programmatic_templated(&m, n % 64)).await?
                    } else {
                        run(measure_programmatic, programmatic(&m, n)).await?
                    };
                    black_box(out);
                }
                let p = t.elapsed();
                if round > 0 {
                    // round 0 warms up
                    attr.push(a.as_nanos() as f64 / batch as f64);
                    prog.push(p.as_nanos() as f64 / batch as f64);
                }
            }
            attr.sort_by(f64::total_cmp);
            prog.sort_by(f64::total_cmp);
            let (amin, pmin, amed, pmed) = (attr[0], prog[0], attr[attr.len() / 2], prog[prog.len() / 2]);
            println!(
                "{label:>15}: attribute min {amin:7.1} median {amed:7.1} | programmatic min {pmin:7.1} median {pmed:7.1} \
                 | overhead min {:+.1}% ({:+.0} ns), median {:+.1}%",
                (amin / pmin - 1.0) * 100.0,
                amin - pmin,
                (amed / pmed - 1.0) * 100.0
            );
        }
        Ok(())
    })
}
