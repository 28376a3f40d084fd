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

use std::time::Duration;

use examples::bench;
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

    // Nothing tells that the waiter's server-side wait was sent: give it 3 ms.
    let mut handoff =
        bench::handoffs(&holder, &waiter, &name, (ROUNDS, WARMUP), None, |since| since >= Duration::from_millis(3))
            .await?;
    let mut uncontended = bench::uncontended(&holder, &name, ROUNDS).await?;
    bench::report("hand-off (release -> next waiter holds it)", &mut handoff);
    bench::report("uncontended acquire + release", &mut uncontended);
    Ok(())
}
