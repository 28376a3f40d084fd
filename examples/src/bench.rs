//! The measurements the networked backends' benchmarks share (`bench_zookeeper`,
//! `bench_postgres`, `bench_etcd`, `bench_redis*`): hand-off latency between two managers,
//! uncontended acquire + release, and a percentile report. Their servers come from the test
//! harness (`lock_tests`: one `ServerProcess` under every fixture).

use std::time::{Duration, Instant};

use lock_runtime::{LockError, LockManager};

/// Hand-off latencies of `rounds` rounds (after `warmup` unmeasured ones): from the holder's
/// `release()` call to the moment the waiter, through its own manager, holds `name` (with a
/// fixed `lease` if given). Each release waits until `waiting(since the waiter started)` says
/// the waiter is queued, so only the hand-off is measured.
pub async fn handoffs(
    holder: &LockManager,
    waiter: &LockManager,
    name: &str,
    (rounds, warmup): (usize, usize),
    lease: Option<Duration>,
    waiting: impl Fn(Duration) -> bool,
) -> Result<Vec<Duration>, LockError> {
    let mut handoff = Vec::with_capacity(rounds);
    for round in 0..rounds + warmup {
        let held = holder.lock(name).await?;
        let (w, n) = (waiter.clone(), name.to_owned());
        let started = Instant::now();
        let task = tokio::spawn(async move {
            let request = w.lock(&n).wait(Duration::from_secs(10));
            let g = match lease {
                Some(lease) => request.lease(lease).await?,
                None => request.await?,
            };
            let at = Instant::now();
            g.release().await?;
            Ok::<Instant, LockError>(at)
        });
        while !waiting(started.elapsed()) {
            tokio::time::sleep(Duration::from_micros(200)).await;
        }
        let released = Instant::now();
        held.release().await?;
        let acquired = match task.await {
            Ok(acquired) => acquired?,
            Err(e) => return Err(LockError::invalid(name, format!("waiter task: {e}"))),
        };
        if round >= warmup {
            handoff.push(acquired.saturating_duration_since(released));
        }
    }
    Ok(handoff)
}

/// Latencies of `rounds` uncontended acquire + release cycles of `name`.
pub async fn uncontended(manager: &LockManager, name: &str, rounds: usize) -> Result<Vec<Duration>, LockError> {
    let mut samples = Vec::with_capacity(rounds);
    for _ in 0..rounds {
        let started = Instant::now();
        manager.lock(name).await?.release().await?;
        samples.push(started.elapsed());
    }
    Ok(samples)
}

/// The `q` quantile (0 to 1) of `sorted` (not empty), nearest rank.
pub fn percentile(sorted: &[Duration], q: f64) -> Duration {
    sorted[((sorted.len() - 1) as f64 * q).round() as usize]
}

/// The median of `values` (not empty).
pub fn median(values: &[f64]) -> f64 {
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Prints `n`, p50, p99 and max of `samples` (sorted in place).
pub fn report(what: &str, samples: &mut [Duration]) {
    if samples.is_empty() {
        println!("{what}: no samples");
        return;
    }
    samples.sort_unstable();
    println!(
        "{what}: n={} p50={:?} p99={:?} max={:?}",
        samples.len(),
        percentile(samples, 0.50),
        percentile(samples, 0.99),
        samples[samples.len() - 1]
    );
}
