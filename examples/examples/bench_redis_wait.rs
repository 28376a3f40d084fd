//! The cost of `RedisOptions::wait_for_replicas`: uncontended lock/release cycles per second
//! and their p50/p99 latency on a primary with one replica, without and with
//! `wait_for_replicas(1, 500 ms)` (`WAIT 1 500` after every grant), and the ratio.
//!
//! ```text
//! cargo run --release -p examples --features redis --example bench_redis_wait
//! ```
//!
//! It starts its own primary and replica (`redis-server`, no persistence) on free loopback
//! ports, and kills them at the end.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use examples::bench::{report, uncontended};
use lock_runtime::backend::redis::{RedisBackend, RedisOptions};
use lock_runtime::LockManager;
use lock_tests::redis_server::RedisServer;

const ROUNDS: usize = 3000;
const WARMUP: usize = 200;
/// Alternating runs per mode (the best is reported), so that a burst of other work on the
/// machine does not decide the ratio.
const RUNS: usize = 3;

async fn run(manager: &LockManager, name: &str) -> (f64, Vec<Duration>) {
    uncontended(manager, name, WARMUP).await.expect("warm-up");
    let started = Instant::now();
    let samples = uncontended(manager, name, ROUNDS).await.expect("cycles");
    (ROUNDS as f64 / started.elapsed().as_secs_f64(), samples)
}

#[tokio::main]
async fn main() {
    let primary_server = RedisServer::start();
    let primary = primary_server.port();
    let _replica = RedisServer::start_with(&["--replicaof", "127.0.0.1", &primary.to_string()]);
    let url = format!("redis://127.0.0.1:{primary}");
    let client = redis::Client::open(url.as_str()).expect("url");
    let mut conn = client.get_multiplexed_async_connection().await.expect("connection");
    let started = Instant::now();
    loop {
        let info: String = redis::cmd("INFO").arg("replication").query_async(&mut conn).await.expect("INFO");
        if info.contains("connected_slaves:1") && info.contains("state=online") {
            break;
        }
        assert!(started.elapsed() < Duration::from_secs(10), "the replica did not sync");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    println!("primary at {url}, one replica in sync; {ROUNDS} cycles per run, best of {RUNS}");

    let plain = LockManager::builder().backend(RedisBackend::connect(&url).await.expect("connect"));
    let options = RedisOptions::default().wait_for_replicas(1, Duration::from_millis(500));
    let waited = LockManager::builder().backend(RedisBackend::connect_with(&url, options).await.expect("connect"));
    let (mut best_plain, mut best_waited): ((f64, Vec<Duration>), (f64, Vec<Duration>)) =
        ((0.0, Vec::new()), (0.0, Vec::new()));
    for _ in 0..RUNS {
        let run_plain = run(&plain, "bench:wait:plain").await;
        if run_plain.0 > best_plain.0 {
            best_plain = run_plain;
        }
        let run_waited = run(&waited, "bench:wait:waited").await;
        if run_waited.0 > best_waited.0 {
            best_waited = run_waited;
        }
    }
    println!("without WAIT: {:.0} cycles/s", best_plain.0);
    report("without WAIT, cycle latency", &mut best_plain.1);
    println!("wait_for_replicas(1, 500ms): {:.0} cycles/s", best_waited.0);
    report("wait_for_replicas(1, 500ms), cycle latency", &mut best_waited.1);
    println!("ratio (with / without): {:.2}", best_waited.0 / best_plain.0);
}
