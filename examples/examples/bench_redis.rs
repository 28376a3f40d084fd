//! Measures the Redis backend against a local `redis-server`:
//!
//! - hand-off latency: from the start of a release to the acquisition by a task that was
//!   waiting for it, in another backend (as another process would) and in the same one;
//! - Redis commands per acquisition under contention (`INFO commandstats` deltas), with
//!   several backends ("processes") of several tasks each fighting for one lock.
//!
//! ```text
//! cargo run --release -p examples --features redis --example bench_redis
//! REDIS_URL=redis://127.0.0.1:6379 cargo run --release -p examples --features redis --example bench_redis
//! ```
//!
//! Without `REDIS_URL` it starts its own `redis-server` on a free loopback port (and kills it
//! at the end).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use lock_runtime::backend::redis::RedisBackend;
use lock_runtime::LockManager;

const HANDOFFS: usize = 1000;
const PROCESSES: usize = 4;
const TASKS: usize = 8;
const ROUNDS: usize = 50;

struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn start_server() -> (String, Option<Server>) {
    if let Ok(url) = std::env::var("REDIS_URL") {
        return (url, None);
    }
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let child = Command::new("redis-server")
        .args(["--port", &port.to_string(), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
        .stdout(Stdio::null())
        .spawn()
        .expect("redis-server (apt-get install redis-server)");
    let server = Server(child);
    let started = Instant::now();
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(started.elapsed() < Duration::from_secs(10), "redis-server did not start");
        std::thread::sleep(Duration::from_millis(10));
    }
    (format!("redis://127.0.0.1:{port}"), Some(server))
}

async fn command_calls(conn: &mut redis::aio::MultiplexedConnection) -> BTreeMap<String, u64> {
    let info: String = redis::cmd("INFO").arg("commandstats").query_async(conn).await.expect("INFO");
    info.lines()
        .filter_map(|line| {
            let (name, rest) = line.strip_prefix("cmdstat_")?.split_once(':')?;
            let calls = rest.split(',').find_map(|kv| kv.strip_prefix("calls="))?.parse().ok()?;
            Some((name.to_owned(), calls))
        })
        .collect()
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

/// Hand-off latency from `holder`'s release to `waiter`'s acquisition.
async fn handoff(holder: &LockManager, waiter: &LockManager, name: &str) -> Vec<Duration> {
    let lease = Duration::from_secs(30);
    let mut samples = Vec::with_capacity(HANDOFFS);
    for _ in 0..HANDOFFS {
        let held = holder.lock(name).lease(lease).await.expect("holder");
        let w = waiter.clone();
        let name2 = name.to_owned();
        let task = tokio::spawn(async move {
            let g = w.lock(name2).wait(Duration::from_secs(10)).lease(lease).await.expect("waiter");
            (Instant::now(), g)
        });
        // Let the waiter make its attempt and start waiting (it is a benchmark: no signal needed).
        tokio::time::sleep(Duration::from_millis(3)).await;
        let released = Instant::now();
        held.release().await.expect("release");
        let (acquired, g) = task.await.expect("task");
        samples.push(acquired.duration_since(released));
        g.release().await.expect("release");
    }
    samples.sort();
    samples
}

fn report(label: &str, samples: &[Duration]) {
    println!(
        "{label}: n={} p50={:?} p99={:?} max={:?}",
        samples.len(),
        percentile(samples, 0.50),
        percentile(samples, 0.99),
        samples[samples.len() - 1]
    );
}

#[tokio::main]
async fn main() {
    let (url, _server) = start_server();
    let client = redis::Client::open(url.as_str()).expect("url");
    let mut conn = client.get_multiplexed_async_connection().await.expect("connection");
    println!("redis-server at {url}");

    // Hand-off latency.
    let a = LockManager::builder().backend(RedisBackend::connect(&url).await.expect("connect"));
    let b = LockManager::builder().backend(RedisBackend::connect(&url).await.expect("connect"));
    report("hand-off, waiter in another backend (process)", &handoff(&a, &b, "bench:handoff:x").await);
    report("hand-off, waiter in the same backend", &handoff(&a, &a, "bench:handoff:same").await);

    // Commands per acquisition under contention.
    for processes in [1, PROCESSES] {
        contention(&url, &mut conn, processes).await;
    }
}

/// `processes` backends of `TASKS` tasks each take one lock `ROUNDS` times each.
async fn contention(url: &str, conn: &mut redis::aio::MultiplexedConnection, processes: usize) {
    let mut managers = Vec::new();
    for _ in 0..processes {
        managers.push(LockManager::builder().backend(RedisBackend::connect(url).await.expect("connect")));
    }
    let name = format!("bench:contended:{processes}");
    let before = command_calls(conn).await;
    let started = Instant::now();
    let acquisitions = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let mut tasks = Vec::new();
    for m in &managers {
        for _ in 0..TASKS {
            let (m, acquisitions, name) = (m.clone(), acquisitions.clone(), name.clone());
            tasks.push(tokio::spawn(async move {
                for _ in 0..ROUNDS {
                    let g = m.lock(&name).wait(Duration::from_secs(60)).lease(Duration::from_secs(30)).await;
                    let g = g.expect("lock");
                    acquisitions.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    tokio::task::yield_now().await;
                    g.release().await.expect("release");
                }
            }));
        }
    }
    for t in tasks {
        t.await.expect("task");
    }
    let elapsed = started.elapsed();
    let after = command_calls(conn).await;
    let n = acquisitions.load(std::sync::atomic::Ordering::Relaxed);
    let delta = |cmd: &str| after.get(cmd).copied().unwrap_or(0) - before.get(cmd).copied().unwrap_or(0);
    // `INFO commandstats` also counts the commands scripts run; what clients send is EVALSHA
    // (acquire and release scripts), PTTL (waiter re-checks) and (UN)SUBSCRIBE.
    let evalsha = delta("evalsha");
    let busy = delta("set") - delta("incr"); // acquire attempts that found the lock held
    let client_pttl = delta("pttl") - busy; // the acquire script runs PTTL on each busy attempt
    let (sub, unsub) = (delta("subscribe"), delta("unsubscribe"));
    let sent = evalsha + client_pttl + sub + unsub + delta("script|load") + delta("eval");
    println!(
        "contention: {processes} backend(s) x {TASKS} tasks, {n} acquisitions in {elapsed:?} ({:.0}/s)",
        n as f64 / elapsed.as_secs_f64()
    );
    println!(
        "  commands sent per acquisition: {:.2} (evalsha {:.2} = 1 acquire + {:.2} busy attempts + 1 release; \
         pttl {:.3}; subscribe {sub}, unsubscribe {unsub} in total)",
        sent as f64 / n as f64,
        evalsha as f64 / n as f64,
        busy as f64 / n as f64,
        client_pttl as f64 / n as f64,
    );
    let all: u64 = after.iter().filter(|(c, _)| c.as_str() != "info").map(|(c, _)| delta(c)).sum();
    println!("  all commands executed (incl. inside scripts) per acquisition: {:.2}", all as f64 / n as f64);
}
