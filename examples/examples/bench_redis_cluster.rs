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
//! Every server listens on a free loopback port, in a temporary directory of this run, without
//! persistence; each is killed by its pid when the run ends, panics included (and, should the
//! bench itself be killed, by a small watcher that outlives it only until it sees it gone).
//! `BENCH_SECS` (default 1) is the length of each timed window; the default run takes about
//! 30 s. Needs `redis-server` and `redis-cli` (`apt-get install redis-server`).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use examples::bench;
use lock_runtime::backend::redis::{key_slot, KeyLayout};
use lock_runtime::LockManager;

/// Measured hand-offs per deployment (after `WARMUP` unmeasured ones).
const HANDOFFS: usize = 300;
const WARMUP: usize = 20;
/// Rounds of each timed measurement, interleaved across deployments; the median is kept.
const ROUNDS: usize = 3;
/// How long a server may take to start or a cluster to form.
const START_TIMEOUT: Duration = Duration::from_secs(30);

/// A `redis-server` of this run, killed by its pid when dropped.
struct Server {
    port: u16,
    child: Child,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Server {
    fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }
}

/// The temporary directory of this run, removed when dropped (after the servers: declared
/// before them).
struct TempDir(PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Free loopback ports, none handed out twice in this run.
#[derive(Default)]
struct Ports(HashSet<u16>);

impl Ports {
    fn next(&mut self) -> u16 {
        loop {
            let port = std::net::TcpListener::bind(("127.0.0.1", 0)).unwrap().local_addr().unwrap().port();
            if self.0.insert(port) {
                return port;
            }
        }
    }
}

/// One command on the server at `port`, each step bounded.
fn query<T: redis::FromRedisValue>(port: u16, args: &[&str]) -> Result<T, String> {
    let timeout = Duration::from_secs(2);
    let client = redis::Client::open(format!("redis://127.0.0.1:{port}")).map_err(|e| e.to_string())?;
    let mut conn = client.get_connection_with_timeout(timeout).map_err(|e| e.to_string())?;
    conn.set_read_timeout(Some(timeout)).map_err(|e| e.to_string())?;
    conn.set_write_timeout(Some(timeout)).map_err(|e| e.to_string())?;
    let mut cmd = redis::cmd(args[0]);
    for arg in &args[1..] {
        cmd.arg(*arg);
    }
    cmd.query(&mut conn).map_err(|e| e.to_string())
}

/// Starts `redis-server` on `port` with `extra` arguments, logging to `<dir>/redis-<port>.log`,
/// and waits (bounded) until it answers `PING`.
fn start_server(dir: &Path, port: u16, extra: &[&str]) -> Server {
    let log = std::fs::File::create(dir.join(format!("redis-{port}.log"))).expect("log file");
    let child = Command::new("redis-server")
        .args(["--port", &port.to_string(), "--bind", "127.0.0.1", "--protected-mode", "no"])
        .args(["--save", "", "--appendonly", "no", "--daemonize", "no", "--dir", &dir.to_string_lossy()])
        .args(extra)
        .stdin(Stdio::null())
        .stdout(log.try_clone().expect("log"))
        .stderr(log)
        .spawn()
        .expect("run `redis-server` (apt-get install redis-server)");
    // Should this process die without dropping the server (SIGKILL, abort), a watcher kills
    // the server by its pid once this process is gone.
    let watcher = format!(
        "while kill -0 {me} 2>/dev/null && kill -0 {pid} 2>/dev/null; do sleep 0.5; done; kill -9 {pid} 2>/dev/null",
        me = std::process::id(),
        pid = child.id()
    );
    let _ = Command::new("sh")
        .args(["-c", &watcher])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn();
    let mut server = Server { port, child };
    let started = Instant::now();
    while query::<String>(port, &["PING"]).is_err() {
        if let Ok(Some(status)) = server.child.try_wait() {
            let log = std::fs::read_to_string(dir.join(format!("redis-{port}.log"))).unwrap_or_default();
            panic!("redis-server {port} exited with {status}: {log}");
        }
        assert!(started.elapsed() < START_TIMEOUT, "redis-server {port} did not answer PING");
        std::thread::sleep(Duration::from_millis(10));
    }
    server
}

/// Starts a Redis Cluster of `n` primaries without replicas and waits (bounded) until every
/// node reports `cluster_state:ok` and sees all `n` nodes connected.
fn start_cluster(dir: &Path, ports: &mut Ports, n: usize) -> Vec<Server> {
    let nodes: Vec<Server> = (0..n)
        .map(|_| {
            let (port, bus) = (ports.next(), ports.next());
            let config = dir.join(format!("nodes-{port}.conf"));
            let extra = ["--cluster-enabled", "yes", "--cluster-config-file", &config.to_string_lossy()];
            let bus = bus.to_string();
            start_server(dir, port, &[&extra[..], &["--cluster-port", &bus, "--cluster-node-timeout", "1000"]].concat())
        })
        .collect();
    let addresses: Vec<String> = nodes.iter().map(|s| format!("127.0.0.1:{}", s.port)).collect();
    let out = Command::new("redis-cli")
        .args(["--cluster", "create"])
        .args(&addresses)
        .args(["--cluster-replicas", "0", "--cluster-yes"])
        .stdin(Stdio::null())
        .output()
        .expect("run `redis-cli --cluster create` (apt-get install redis-tools)");
    assert!(
        out.status.success(),
        "redis-cli --cluster create failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let formed = |port: u16| {
        let ok = query::<String>(port, &["CLUSTER", "INFO"])
            .is_ok_and(|i| i.lines().any(|l| l.trim() == "cluster_state:ok"));
        let connected = query::<String>(port, &["CLUSTER", "NODES"])
            .map(|t| t.lines().filter(|l| l.split_whitespace().nth(7) == Some("connected")).count())
            .unwrap_or(0);
        ok && connected == n
    };
    let started = Instant::now();
    while !nodes.iter().all(|s| formed(s.port)) {
        assert!(started.elapsed() < START_TIMEOUT, "the cluster did not reach cluster_state:ok");
        std::thread::sleep(Duration::from_millis(50));
    }
    nodes
}

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

fn median(values: &[f64]) -> f64 {
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn percentile(sorted: &[Duration], q: f64) -> Duration {
    sorted[((sorted.len() - 1) as f64 * q).round() as usize]
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
    let tmp = TempDir(std::env::temp_dir().join(format!("bench-redis-cluster-{}", std::process::id())));
    std::fs::create_dir_all(&tmp.0).expect("temp dir");
    let dir = tmp.0.clone();
    let mut ports = Ports::default();

    let single = start_server(&dir, ports.next(), &[]);
    let cluster = start_cluster(&dir, &mut ports, 3);
    let redlock: Vec<Server> = (0..3).map(|_| start_server(&dir, ports.next(), &[])).collect();
    let cluster_urls: Vec<String> = cluster.iter().map(Server::url).collect();
    let redlock_urls: Vec<String> = redlock.iter().map(Server::url).collect();
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
    let owners: String = query(cluster[0].port, &["CLUSTER", "NODES"]).expect("CLUSTER NODES");
    for t in 0..64 {
        let slot = key_slot(KeyLayout::of(&format!("bench:uncontended:64:{t}")).lock.as_bytes());
        for line in owners.lines() {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let owns = fields.iter().skip(8).any(|r| match r.split_once('-') {
                Some((a, b)) => (a.parse::<u16>().unwrap_or(1)..=b.parse().unwrap_or(0)).contains(&slot),
                None => r.parse() == Ok(slot),
            });
            if owns {
                let port: u16 =
                    fields[1].split(['@', ',']).next().and_then(|a| a.rsplit_once(':')).unwrap().1.parse().unwrap();
                per_node[cluster.iter().position(|s| s.port == port).unwrap()] += 1;
            }
        }
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
        figures[k].handoff_p50 = percentile(&samples, 0.50);
        figures[k].handoff_p99 = percentile(&samples, 0.99);
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
    row("uncontended, 1 task (cycles/s)", [0, 1, 2].map(|k| median(&figures[k].uncontended[0])), "");
    row("uncontended, 64 tasks (cycles/s)", [0, 1, 2].map(|k| median(&figures[k].uncontended[1])), "");
    row("16 tasks, one name (hand-offs/s)", [0, 1, 2].map(|k| median(&figures[k].handoffs_per_s)), "");

    drop(managers);
    drop((single, cluster, redlock));
}
