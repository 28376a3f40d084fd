//! The attribute's overhead: a `#[distributed_locked]` fn against the same body written with the
//! programmatic API, same manager (in-memory: the lock path's own cost, no waiting), same name.

use std::hint::black_box;
use std::time::Instant;

use lock_runtime::{distributed_locked, LockError, LockManager};

use crate::report::Attribute;

async fn body(n: u64) -> u64 {
    black_box(n).wrapping_mul(31).wrapping_add(7)
}

#[distributed_locked(name = "bench:attribute", manager = m)]
async fn with_attribute(m: &LockManager, n: u64) -> Result<u64, LockError> {
    Ok(body(n).await)
}

async fn programmatic(m: &LockManager, n: u64) -> Result<u64, LockError> {
    let guard = m.lock("bench:attribute").await?;
    let out = body(n).await;
    guard.release().await?;
    Ok(out)
}

/// `rounds` alternating rounds of `batch` calls of each variant in one task, on `m` (after one
/// warm-up round); the least disturbed round of each is compared, and the median of the paired
/// rounds' ratios is kept beside it.
pub async fn overhead(m: LockManager, rounds: usize, batch: u64) -> Result<Attribute, String> {
    tokio::spawn(async move {
        let (mut attr, mut prog) = (f64::INFINITY, f64::INFINITY);
        let mut paired = Vec::with_capacity(rounds);
        for round in 0..=rounds {
            let t = Instant::now();
            for n in 0..batch {
                black_box(with_attribute(&m, n).await.map_err(|e| e.to_string())?);
            }
            let a = t.elapsed().as_nanos() as f64 / batch as f64;
            let t = Instant::now();
            for n in 0..batch {
                black_box(programmatic(&m, n).await.map_err(|e| e.to_string())?);
            }
            let p = t.elapsed().as_nanos() as f64 / batch as f64;
            if round > 0 {
                attr = attr.min(a);
                prog = prog.min(p);
                paired.push(a / p - 1.0);
            }
        }
        paired.sort_by(f64::total_cmp);
        let median_overhead = paired.get(paired.len() / 2).copied().unwrap_or(f64::NAN);
        Ok(Attribute { attribute_ns: attr, programmatic_ns: prog, median_overhead, rounds, batch })
    })
    .await
    .map_err(|e| format!("attribute task failed: {e}"))?
}
