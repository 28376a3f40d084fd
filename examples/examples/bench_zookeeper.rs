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

use std::time::Duration;

use examples::bench;

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

    let rounds = (ROUNDS, WARMUP);
    let waiting = |_| waiter_store.stats().waiting >= 1;
    let mut handoff = bench::handoffs(&holder, &waiter, &name, rounds, None, waiting).await?;
    // A waiter granted with a fixed lease records its grant in its node first (one more write).
    let fixed = Some(Duration::from_secs(30));
    let mut fixed = bench::handoffs(&holder, &waiter, &name, rounds, fixed, waiting).await?;
    let mut uncontended = bench::uncontended(&holder, &name, ROUNDS).await?;
    bench::report("hand-off (release -> next waiter holds it)", &mut handoff);
    bench::report("hand-off, fixed lease (the waiter records its grant)", &mut fixed);
    bench::report("uncontended acquire + release", &mut uncontended);
    Ok(())
}
