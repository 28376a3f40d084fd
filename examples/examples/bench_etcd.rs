//! Hand-off latency of the etcd backend: from the holder's `release()` call to the moment the
//! waiter (through another manager, so another lease) holds the lock.
//!
//! ```text
//! cargo run --release -p examples --features etcd --example bench_etcd
//! ETCD_ENDPOINT=http://etcd1:2379 cargo run --release -p examples --features etcd --example bench_etcd
//! ```
//!
//! Without `ETCD_ENDPOINT` it starts an etcd of its own (the Debian `etcd-server` package) on
//! free loopback ports. Prints p50/p99/max of the hand-off and of an uncontended acquire +
//! release. Each release waits until the waiter watches the holder's key, so only the hand-off
//! is measured.

use std::time::{Duration, Instant};

use lock_runtime::backend::etcd::EtcdBackend;
use lock_runtime::{LockError, LockManager};

const ROUNDS: usize = 300;
const WARMUP: usize = 30;

#[tokio::main]
async fn main() -> Result<(), LockError> {
    let (_server, endpoint) = match std::env::var("ETCD_ENDPOINT") {
        Ok(endpoint) => (None, endpoint),
        Err(_) => {
            let server = lock_tests::etcd_server::EtcdServer::start();
            let endpoint = server.endpoint();
            (Some(server), endpoint)
        }
    };
    let holder = LockManager::builder().prefix("bench:").etcd([&endpoint]).await?;
    let waiter_store = EtcdBackend::connect([&endpoint]).await?;
    let waiter = LockManager::builder().prefix("bench:").backend(waiter_store.clone());
    let name = format!("handoff-{}", std::process::id());

    let mut handoff = Vec::with_capacity(ROUNDS);
    for round in 0..ROUNDS + WARMUP {
        let held = holder.lock(&name).await?;
        let (w, n) = (waiter.clone(), name.clone());
        let task = tokio::spawn(async move {
            let g = w.lock(&n).wait(Duration::from_secs(10)).await?;
            let at = Instant::now();
            g.release().await?;
            Ok::<Instant, LockError>(at)
        });
        while waiter_store.stats().waiting < 1 {
            tokio::time::sleep(Duration::from_micros(200)).await;
        }
        let released = Instant::now();
        held.release().await?;
        let acquired = task.await.expect("waiter task")?;
        if round >= WARMUP {
            handoff.push(acquired.saturating_duration_since(released));
        }
    }

    let mut uncontended = Vec::with_capacity(ROUNDS);
    for _ in 0..ROUNDS {
        let started = Instant::now();
        holder.lock(&name).await?.release().await?;
        uncontended.push(started.elapsed());
    }

    report("hand-off (release -> next waiter holds it)", &mut handoff);
    report("uncontended acquire + release", &mut uncontended);
    Ok(())
}

fn report(what: &str, samples: &mut [Duration]) {
    samples.sort_unstable();
    let pick = |q: f64| samples[((samples.len() as f64 - 1.0) * q).round() as usize];
    println!(
        "{what}: n={} p50={:?} p99={:?} max={:?}",
        samples.len(),
        pick(0.50),
        pick(0.99),
        samples[samples.len() - 1]
    );
}
