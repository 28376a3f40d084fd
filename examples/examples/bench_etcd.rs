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

use examples::bench;
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

    let waiting = |_| waiter_store.stats().waiting >= 1;
    let mut handoff = bench::handoffs(&holder, &waiter, &name, (ROUNDS, WARMUP), None, waiting).await?;
    let mut uncontended = bench::uncontended(&holder, &name, ROUNDS).await?;
    bench::report("hand-off (release -> next waiter holds it)", &mut handoff);
    bench::report("uncontended acquire + release", &mut uncontended);
    Ok(())
}
