//! Hand-off latency of the PostgreSQL backend: from the holder's `release()` call to the moment
//! the waiter (queued on the server in `pg_advisory_lock`) holds the lock; and an uncontended
//! acquire + release.
//!
//! ```text
//! cargo run --release -p examples --features postgres --example bench_postgres
//! PG_URL=postgres://app@db:5432/app cargo run --release -p examples --features postgres --example bench_postgres
//! ```
//!
//! Without `PG_URL` it starts a PostgreSQL of its own (the Debian `postgresql` package) on a
//! free loopback port. Prints p50/p99/max.

use std::time::{Duration, Instant};

use lock_runtime::{LockError, LockManager};

const ROUNDS: usize = 300;
const WARMUP: usize = 30;

#[tokio::main]
async fn main() -> Result<(), LockError> {
    let (_server, url) = match std::env::var("PG_URL") {
        Ok(url) => (None, url),
        Err(_) => {
            let server = lock_tests::pg_server::PgServer::start();
            let url = server.url();
            (Some(server), url)
        }
    };
    let holder = LockManager::builder().prefix("bench:").postgres(&url).await?;
    let waiter = LockManager::builder().prefix("bench:").postgres(&url).await?;
    let name = format!("handoff-{}", std::process::id());

    let mut handoff = Vec::with_capacity(ROUNDS);
    for round in 0..ROUNDS + WARMUP {
        let held = holder.lock(&name).await?;
        let w = waiter.clone();
        let n = name.clone();
        let task = tokio::spawn(async move {
            let g = w.lock(&n).wait(Duration::from_secs(10)).await?;
            let at = Instant::now();
            g.release().await?;
            Ok::<Instant, LockError>(at)
        });
        // Long enough for the waiter's try and its server-side wait to be sent (nothing tells).
        tokio::time::sleep(Duration::from_millis(3)).await;
        let released = Instant::now();
        held.release().await?;
        let acquired = match task.await {
            Ok(acquired) => acquired?,
            Err(e) => return Err(LockError::invalid(&*name, format!("waiter task: {e}"))),
        };
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
