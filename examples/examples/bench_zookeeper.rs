//! Hand-off latency of the ZooKeeper backend: from the holder's `release()` call to the moment
//! the waiter (in another session) holds the lock.
//!
//! ```text
//! cargo run --release -p examples --features zookeeper --example bench_zookeeper
//! ZK_HOSTS=zk1:2181 cargo run --release -p examples --features zookeeper --example bench_zookeeper
//! ```
//!
//! Without `ZK_HOSTS` it starts a ZooKeeper of its own (the Debian `zookeeper` package) on a
//! free loopback port. Prints p50/p99/max of the hand-off (with a watchdog lease, and with a
//! fixed lease, where the waiter records its grant in its node), and of an uncontended
//! acquire + release for comparison.

use std::time::{Duration, Instant};

use lock_runtime::backend::zookeeper::ZookeeperBackend;
use lock_runtime::{LockError, LockManager};

const ROUNDS: usize = 500;
const WARMUP: usize = 50;

#[tokio::main]
async fn main() -> Result<(), LockError> {
    let (_server, hosts) = match std::env::var("ZK_HOSTS") {
        Ok(hosts) => (None, hosts),
        Err(_) => {
            let server = lock_tests::zk_server::ZkServer::start();
            let hosts = server.hosts();
            (Some(server), hosts)
        }
    };
    let holder_store = ZookeeperBackend::connect(&hosts).await?;
    let waiter_store = ZookeeperBackend::connect(&hosts).await?;
    let holder = LockManager::builder().prefix("bench:").backend(holder_store);
    let waiter = LockManager::builder().prefix("bench:").backend(waiter_store.clone());
    let name = format!("handoff-{}", std::process::id());

    let mut handoff = measure_handoff(&holder, &waiter, &waiter_store, &name, None).await?;
    // A waiter granted with a fixed lease records its grant in its node first (one more write).
    let mut fixed = measure_handoff(&holder, &waiter, &waiter_store, &name, Some(Duration::from_secs(30))).await?;

    let mut uncontended = Vec::with_capacity(ROUNDS);
    for _ in 0..ROUNDS {
        let started = Instant::now();
        holder.lock(&name).await?.release().await?;
        uncontended.push(started.elapsed());
    }

    report("hand-off (release -> next waiter holds it)", &mut handoff);
    report("hand-off, fixed lease (the waiter records its grant)", &mut fixed);
    report("uncontended acquire + release", &mut uncontended);
    Ok(())
}

/// Hand-off latencies: from the holder's `release()` call to the moment the waiter holds the
/// lock, the waiter asking for a fixed `lease` if given.
async fn measure_handoff(
    holder: &LockManager,
    waiter: &LockManager,
    waiter_store: &ZookeeperBackend,
    name: &str,
    lease: Option<Duration>,
) -> Result<Vec<Duration>, LockError> {
    let mut handoff = Vec::with_capacity(ROUNDS);
    for round in 0..ROUNDS + WARMUP {
        let held = holder.lock(name).await?;
        let w = waiter.clone();
        let n = name.to_owned();
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
        // Wait until the waiter watches the holder's node, so only the hand-off is measured.
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
    Ok(handoff)
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
