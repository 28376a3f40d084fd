//! Measures the Redis backend against a local `redis-server`:
//!
//! - hand-off latency: from the start of a release to the acquisition by a task that was
//!   waiting for it, in another backend (as another process would) and in the same one;
//! - Redis commands per acquisition under contention (`INFO commandstats` deltas), with
//!   several backends ("processes") of several tasks each fighting for one lock;
//! - uncontended lock/release cycles per second (1 and 64 tasks on distinct names), and a
//!   timed contended run of 16 tasks of one process on one name: hand-offs per second (an
//!   acquisition by another task than the previous holder) and fairness (fewest over most
//!   acquisitions per task), as `scripts/bench` counts them.
//!
//! ```text
//! cargo run --release -p examples --features redis --example bench_redis
//! REDIS_URL=redis://127.0.0.1:6379 cargo run --release -p examples --features redis --example bench_redis
//! ```
//!
//! Without `REDIS_URL` it starts its own `redis-server` on a free loopback port (and kills it
//! at the end).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use examples::bench::report;
use lock_runtime::backend::redis::RedisBackend;
use lock_runtime::LockManager;
use lock_tests::redis_server::{command_calls, RedisServer};

const HANDOFFS: usize = 1000;
const PROCESSES: usize = 4;
const TASKS: usize = 8;
const ROUNDS: usize = 50;

/// The server: `REDIS_URL`'s, or one of its own (the test harness's, killed at the end).
fn server() -> (String, Option<RedisServer>) {
    if let Ok(url) = std::env::var("REDIS_URL") {
        return (url, None);
    }
    let server = RedisServer::start();
    (server.url(), Some(server))
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

#[tokio::main]
async fn main() {
    let (url, _server) = server();
    let client = redis::Client::open(url.as_str()).expect("url");
    let mut conn = client.get_multiplexed_async_connection().await.expect("connection");
    println!("redis-server at {url}");

    // Hand-off latency.
    let a = LockManager::builder().backend(RedisBackend::connect(&url).await.expect("connect"));
    let b = LockManager::builder().backend(RedisBackend::connect(&url).await.expect("connect"));
    report("hand-off, waiter in another backend (process)", &mut handoff(&a, &b, "bench:handoff:x").await);
    report("hand-off, waiter in the same backend", &mut handoff(&a, &a, "bench:handoff:same").await);

    // Commands per acquisition under contention.
    for processes in [1, PROCESSES] {
        contention(&url, &mut conn, processes).await;
    }

    // Uncontended cycles and timed contention.
    let m = LockManager::builder().backend(RedisBackend::connect(&url).await.expect("connect"));
    for tasks in [1, 64] {
        // Alternate with a baseline of rslock's cycle (`SET NX PX`, then a `GET` + `DEL`
        // script) on one multiplexed connection; best of 3 rounds each.
        let (mut ours, mut base) = (0f64, 0f64);
        for _ in 0..3 {
            ours = ours.max(uncontended(&m, tasks, WINDOW).await);
            base = base.max(baseline_uncontended(&client, tasks, WINDOW).await);
        }
        println!(
            "uncontended: {tasks} task(s) on distinct names: {ours:.0} cycles/s; rslock-like baseline {base:.0} ({:.2}x)",
            ours / base
        );
    }
    timed_contention(&m, 16, WINDOW).await;
}

const WINDOW: Duration = Duration::from_secs(1);

/// `tasks` tasks lock and release names of their own for `window`: cycles per second.
async fn uncontended(m: &LockManager, tasks: usize, window: Duration) -> f64 {
    let until = Instant::now() + window;
    let handles: Vec<_> = (0..tasks)
        .map(|t| {
            let m = m.clone();
            tokio::spawn(async move {
                let name = format!("bench:uncontended:{t}");
                let mut cycles = 0u64;
                while Instant::now() < until {
                    let g = m.lock(&name).lease(Duration::from_secs(10)).await.expect("lock");
                    g.release().await.expect("release");
                    cycles += 1;
                }
                cycles
            })
        })
        .collect();
    let mut total = 0;
    for h in handles {
        total += h.await.expect("task");
    }
    total as f64 / window.as_secs_f64()
}

/// The baseline: rslock's uncontended cycle with the `redis` crate directly.
async fn baseline_uncontended(client: &redis::Client, tasks: usize, window: Duration) -> f64 {
    let conn = client.get_multiplexed_async_connection().await.expect("connection");
    let unlock = Arc::new(redis::Script::new(
        "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) else return 0 end",
    ));
    let until = Instant::now() + window;
    let handles: Vec<_> = (0..tasks)
        .map(|t| {
            let (mut conn, unlock) = (conn.clone(), unlock.clone());
            tokio::spawn(async move {
                let key = format!("bench:baseline:{t}");
                let mut cycles = 0u64;
                while Instant::now() < until {
                    let value = format!("{t}-{cycles}");
                    let set: Option<String> = redis::cmd("SET")
                        .arg(&key)
                        .arg(&value)
                        .arg("NX")
                        .arg("PX")
                        .arg(10_000)
                        .query_async(&mut conn)
                        .await
                        .expect("SET");
                    assert!(set.is_some(), "uncontended");
                    let _: i64 = unlock.key(&key).arg(&value).invoke_async(&mut conn).await.expect("unlock");
                    cycles += 1;
                }
                cycles
            })
        })
        .collect();
    let mut total = 0;
    for h in handles {
        total += h.await.expect("task");
    }
    total as f64 / window.as_secs_f64()
}

/// `tasks` tasks of one backend fight for one name for `window`.
async fn timed_contention(m: &LockManager, tasks: usize, window: Duration) {
    let until = Instant::now() + window;
    let last = Arc::new(std::sync::atomic::AtomicUsize::new(usize::MAX));
    let handoffs = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let handles: Vec<_> = (0..tasks)
        .map(|t| {
            let (m, last, handoffs) = (m.clone(), last.clone(), handoffs.clone());
            tokio::spawn(async move {
                let mut acquired = 0u64;
                while Instant::now() < until {
                    let g = m.lock("bench:timed").wait(Duration::from_secs(10)).lease(Duration::from_secs(10)).await;
                    let g = g.expect("lock");
                    acquired += 1;
                    if last.swap(t, std::sync::atomic::Ordering::Relaxed) != t {
                        handoffs.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    }
                    g.release().await.expect("release");
                }
                acquired
            })
        })
        .collect();
    let mut counts = Vec::new();
    for h in handles {
        counts.push(h.await.expect("task"));
    }
    let total: u64 = counts.iter().sum();
    let (min, max) = (counts.iter().min().copied().unwrap_or(0), counts.iter().max().copied().unwrap_or(1));
    println!(
        "timed contention: {tasks} tasks, one name: {:.0} acquisitions/s, {:.0} hand-offs/s, fairness {:.2}",
        total as f64 / window.as_secs_f64(),
        handoffs.load(std::sync::atomic::Ordering::Relaxed) as f64 / window.as_secs_f64(),
        min as f64 / max.max(1) as f64
    );
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
    // (attempts, releases, a waiter's look at the lock), SCRIPT LOAD after a NOSCRIPT answer,
    // and (UN)SUBSCRIBE.
    let evalsha = delta("evalsha") - delta("script|load"); // a NOSCRIPT answer is sent again
    let (sub, unsub) = (delta("subscribe"), delta("unsubscribe"));
    let sent = evalsha + sub + unsub + delta("script|load") + delta("eval");
    println!(
        "contention: {processes} backend(s) x {TASKS} tasks, {n} acquisitions in {elapsed:?} ({:.0}/s)",
        n as f64 / elapsed.as_secs_f64()
    );
    println!(
        "  commands sent per acquisition: {:.2} (script calls {:.2}; subscribe {sub}, unsubscribe {unsub} in total)",
        sent as f64 / n as f64,
        evalsha as f64 / n as f64,
    );
    let all: u64 = after.iter().filter(|(c, _)| c.as_str() != "info").map(|(c, _)| delta(c)).sum();
    println!("  all commands executed (incl. inside scripts) per acquisition: {:.2}", all as f64 / n as f64);
    let mut by: Vec<(&str, f64)> = after
        .keys()
        .filter(|c| c.as_str() != "info")
        .map(|c| (c.as_str(), delta(c) as f64 / n as f64))
        .filter(|(_, per)| *per >= 0.005)
        .collect();
    by.sort_by(|a, b| b.1.total_cmp(&a.1));
    let by: Vec<String> = by.iter().map(|(c, per)| format!("{c} {per:.2}")).collect();
    println!("  by command: {}", by.join(", "));
}
