//! Compares the three Redis deployments the Redis backend supports, measured in one run on
//! servers of its own: one `redis-server` (`LockManager::redis`), a Redis Cluster of 3
//! primaries without replicas (`LockManager::redis_cluster`), and Redlock on 3 independent
//! `redis-server`s (`LockManager::redlock`). For each it measures:
//!
//! - hand-off latency p50/p99: from the holder's `release()` to the moment a waiter in another
//!   manager (another backend, as another process would be) holds the same name;
//! - uncontended lock/release cycles per second, with 1 task and with 64 tasks on distinct
//!   names (on the cluster the 64 names fall in slots of all three primaries; the run prints
//!   how they spread), and the p50/p99 latency of one cycle;
//! - 16 tasks of one manager fighting for one name for a fixed window: hand-offs per second
//!   (acquisitions by another task than the previous holder).
//!
//! It ends with a table of the figures and of the ratios cluster / one server and
//! Redlock / one server.
//!
//! ```text
//! cargo run --release -p examples --features redis --example bench_redis_cluster
//! BENCH_SECS=5 cargo run --release -p examples --features redis --example bench_redis_cluster
//! ```
//!
//! Every server listens on a free loopback port, in a temporary directory of its own, without
//! persistence (the test harness's `RedisServer` and `RedisCluster`); each is killed by its pid
//! when the run ends, panics included (and, should the bench itself be killed, by its reaper).
//! `BENCH_SECS` (default 1) is the length of each timed window; the default run takes about
//! 30 s. Needs `redis-server` and `redis-cli` (`apt-get install redis-server`).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use examples::bench;
use lock_runtime::LockManager;
use lock_tests::redis_cluster::RedisCluster;
use lock_tests::redis_server::RedisServer;

/// Measured hand-offs per deployment (after `WARMUP` unmeasured ones).
const HANDOFFS: usize = 300;
const WARMUP: usize = 20;
/// Rounds of each timed measurement, interleaved across deployments; the median is kept.
const ROUNDS: usize = 3;
/// The figures of one deployment.
#[derive(Default)]
struct Figures {
    handoff_p50: Duration,
    handoff_p99: Duration,
    /// Cycles per second of each round, with 1 and with 64 tasks.
    uncontended: [Vec<f64>; 2],
    /// Hand-offs per second of each round.
    handoffs_per_s: Vec<f64>,
}

/// `tasks` tasks lock and release names of their own (`<label>:<task>`) for `window`:
/// cycles per second over all tasks, and the latency of every cycle.
async fn uncontended(m: &LockManager, label: &str, tasks: usize, window: Duration) -> (f64, Vec<Duration>) {
    let started = Instant::now();
    let until = started + window;
    let handles: Vec<_> = (0..tasks)
        .map(|t| {
            let (m, name) = (m.clone(), format!("{label}:{t}"));
            tokio::spawn(async move {
                let mut samples = Vec::new();
                while Instant::now() < until {
                    samples.extend(bench::uncontended(&m, &name, 8).await.expect("uncontended cycle"));
                }
                samples
            })
        })
        .collect();
    let mut samples = Vec::new();
    for h in handles {
        samples.extend(h.await.expect("uncontended task"));
    }
    (samples.len() as f64 / started.elapsed().as_secs_f64(), samples)
}

/// `tasks` tasks of one manager fight for `name` for `window`: hand-offs per second (an
/// acquisition by another task than the previous holder).
async fn contention(m: &LockManager, name: &str, tasks: usize, window: Duration) -> f64 {
    let started = Instant::now();
    let until = started + window;
    let last = Arc::new(AtomicUsize::new(usize::MAX));
    let handoffs = Arc::new(AtomicU64::new(0));
    let handles: Vec<_> = (0..tasks)
        .map(|t| {
            let (m, name, last, handoffs) = (m.clone(), name.to_owned(), last.clone(), handoffs.clone());
            tokio::spawn(async move {
                while Instant::now() < until {
                    let g = m.lock(&name).wait(Duration::from_secs(30)).await.expect("contended lock");
                    if last.swap(t, Ordering::Relaxed) != t {
                        handoffs.fetch_add(1, Ordering::Relaxed);
                    }
                    g.release().await.expect("release");
                }
            })
        })
        .collect();
    for h in handles {
        h.await.expect("contending task");
    }
    handoffs.load(Ordering::Relaxed) as f64 / started.elapsed().as_secs_f64()
}

#[tokio::main]
async fn main() {
    let secs: f64 = std::env::var("BENCH_SECS").ok().and_then(|s| s.parse().ok()).unwrap_or(1.0);
    let window = Duration::from_secs_f64(secs);
    let single = RedisServer::start();
    let cluster = RedisCluster::start(3, 0);
    let redlock: Vec<RedisServer> = (0..3).map(|_| RedisServer::start()).collect();
    let cluster_urls: Vec<String> = cluster.urls();
    let redlock_urls: Vec<String> = redlock.iter().map(RedisServer::url).collect();
    println!("one server: {}", single.url());
    println!("cluster (3 primaries): {}", cluster_urls.join(" "));
    println!("redlock (3 servers): {}", redlock_urls.join(" "));

    // Two managers per deployment: a holder and a waiter in "another process".
    let mut managers = Vec::new();
    for _ in 0..2 {
        managers.push([
            LockManager::redis(single.url()).await.expect("connect to the server"),
            LockManager::redis_cluster(&cluster_urls).await.expect("connect to the cluster"),
            LockManager::redlock(&redlock_urls).await.expect("connect to the Redlock servers"),
        ]);
    }
    let labels = ["one server", "cluster", "redlock"];
    let mut figures: [Figures; 3] = Default::default();

    // Where the 64 names of the uncontended run fall in the cluster.
    let mut per_node = vec![0usize; cluster.len()];
    for t in 0..64 {
        per_node[cluster.primary_of(&format!("bench:uncontended:64:{t}"))] += 1;
    }
    println!("the 64 names of the uncontended run per cluster primary: {per_node:?}");

    // (a) Hand-off latency between two managers. The waiter's wait is not observable from here
    // (its subscription is internal): a waiter is taken as waiting 3 ms after it started.
    for (k, label) in labels.iter().enumerate() {
        let waiting = |since: Duration| since >= Duration::from_millis(3);
        let mut samples =
            bench::handoffs(&managers[0][k], &managers[1][k], "bench:handoff", (HANDOFFS, WARMUP), None, waiting)
                .await
                .expect("hand-offs");
        bench::report(&format!("{label}: hand-off to another manager"), &mut samples);
        figures[k].handoff_p50 = bench::percentile(&samples, 0.50);
        figures[k].handoff_p99 = bench::percentile(&samples, 0.99);
    }

    // (b) and (c), rounds interleaved across deployments so that load elsewhere on the machine
    // weighs on all alike.
    for round in 0..ROUNDS {
        for (k, label) in labels.iter().enumerate() {
            for (i, tasks) in [1, 64].into_iter().enumerate() {
                let (rate, mut samples) =
                    uncontended(&managers[0][k], &format!("bench:uncontended:{tasks}"), tasks, window).await;
                figures[k].uncontended[i].push(rate);
                bench::report(
                    &format!("round {round}: {label}: uncontended, {tasks} task(s), {rate:.0} cycles/s, cycle"),
                    &mut samples,
                );
            }
            let rate = contention(&managers[0][k], "bench:contended", 16, window).await;
            figures[k].handoffs_per_s.push(rate);
            println!("round {round}: {label}: 16 tasks on one name: {rate:.0} hand-offs/s");
        }
    }

    println!();
    println!(
        "medians of {ROUNDS} rounds of {window:?} (hand-offs: {HANDOFFS} rounds); ratios to one server from this run"
    );
    println!(
        "{:<34} {:>12} {:>12} {:>12} {:>10} {:>10}",
        "", "one server", "cluster", "redlock", "cluster/1", "redlock/1"
    );
    let row = |what: &str, v: [f64; 3], unit: &str| {
        println!(
            "{:<34} {:>12} {:>12} {:>12} {:>10.2} {:>10.2}",
            what,
            format!("{:.0}{unit}", v[0]),
            format!("{:.0}{unit}", v[1]),
            format!("{:.0}{unit}", v[2]),
            v[1] / v[0],
            v[2] / v[0]
        );
    };
    let us = |d: Duration| d.as_secs_f64() * 1e6;
    row("hand-off p50", [0, 1, 2].map(|k| us(figures[k].handoff_p50)), " us");
    row("hand-off p99", [0, 1, 2].map(|k| us(figures[k].handoff_p99)), " us");
    row("uncontended, 1 task (cycles/s)", [0, 1, 2].map(|k| bench::median(&figures[k].uncontended[0])), "");
    row("uncontended, 64 tasks (cycles/s)", [0, 1, 2].map(|k| bench::median(&figures[k].uncontended[1])), "");
    row("16 tasks, one name (hand-offs/s)", [0, 1, 2].map(|k| bench::median(&figures[k].handoffs_per_s)), "");

    drop(managers);
    drop((single, cluster, redlock));
}
