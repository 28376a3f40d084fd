//! The soak profile: lock, try_lock and cancelled-waiter churn on every networked backend at
//! once (Redis, PostgreSQL, MySQL/MariaDB, etcd, ZooKeeper), with every server restarted every
//! 20 s, for `LOCK_SOAK_SECS` seconds (60 by default, CI's profile; 600 for the long one). The
//! figures are taken after a warm-up and again at the end, each once the churn stopped and the
//! clean-up it left settled: the process's open file descriptors, its runtime's live tasks, and
//! each server's client connections and lock keys. The end must be back within a small constant
//! of the start (stated at each assertion); the figures are printed.

#![cfg(all(feature = "redis", feature = "postgres", feature = "mysql", feature = "etcd", feature = "zookeeper"))]
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use lock_runtime::LockManager;
use lock_tests::etcd_server::EtcdServer;
use lock_tests::mysql_server::MysqlServer;
use lock_tests::pg_server::PgServer;
use lock_tests::redis_server::RedisServer;
use lock_tests::zk_server::ZkServer;
use mysql_async::prelude::Queryable;

/// Churning tasks per backend.
const TASKS: usize = 4;
/// Names each backend's tasks share.
const NAMES: u64 = 6;
/// How often every server is restarted.
const RESTART_EVERY: Duration = Duration::from_secs(20);
/// How long after the last server answers again an operation may still fail: the first
/// operation after a restart must succeed, this covers one that began while the server was
/// down and ends just after.
const RECOVERY: Duration = Duration::from_secs(2);

/// Failed operations: while the servers restart (or within [`RECOVERY`] after), and outside.
#[derive(Default)]
struct Failures {
    /// Set while the servers restart, and until [`RECOVERY`] after.
    restarting: AtomicBool,
    during: AtomicU64,
    outside: AtomicU64,
}

impl Failures {
    /// Counts a failed operation that began at `began`.
    fn count(&self, began: Instant, window: &Mutex<Vec<(Instant, Instant)>>) {
        let in_window = self.restarting.load(Ordering::SeqCst)
            || window.lock().unwrap().iter().any(|(from, to)| began <= *to && Instant::now() >= *from);
        let counter = if in_window { &self.during } else { &self.outside };
        counter.fetch_add(1, Ordering::Relaxed);
    }
}

fn soak_time() -> Duration {
    let secs = std::env::var("LOCK_SOAK_SECS").ok().and_then(|s| s.parse().ok()).unwrap_or(60);
    Duration::from_secs(secs)
}

/// The backends soaked: `LOCK_SOAK_BACKENDS` (a comma-separated list, to find which one a
/// figure grows with), every one by default.
fn soaked(backend: &str) -> bool {
    std::env::var("LOCK_SOAK_BACKENDS").map_or(true, |list| list.split(',').any(|b| b.trim() == backend))
}

/// The servers of the backends soaked, each restartable.
#[derive(Default)]
struct Servers {
    redis: Option<RedisServer>,
    pg: Option<PgServer>,
    mysql: Option<MysqlServer>,
    etcd: Option<EtcdServer>,
    zk: Option<ZkServer>,
}

impl Servers {
    fn start() -> Self {
        Servers {
            redis: soaked("redis").then(RedisServer::start),
            pg: soaked("postgres").then(PgServer::start),
            mysql: soaked("mysql").then(MysqlServer::start),
            etcd: soaked("etcd").then(EtcdServer::start),
            zk: soaked("zookeeper").then(ZkServer::start),
        }
    }

    fn restart_all(&mut self) {
        self.redis.as_mut().map(RedisServer::restart);
        self.pg.as_mut().map(PgServer::restart);
        self.mysql.as_mut().map(MysqlServer::restart);
        self.etcd.as_mut().map(EtcdServer::restart);
        self.zk.as_mut().map(ZkServer::restart);
    }

    async fn managers(&self) -> Vec<(&'static str, LockManager)> {
        let mut managers = Vec::new();
        if let Some(s) = &self.redis {
            managers.push(("redis", LockManager::redis(s.url()).await.expect("redis")));
        }
        if let Some(s) = &self.pg {
            managers.push(("postgres", LockManager::postgres(s.url()).await.expect("postgres")));
        }
        if let Some(s) = &self.mysql {
            managers.push(("mysql", LockManager::mysql(s.url()).await.expect("mysql")));
        }
        if let Some(s) = &self.etcd {
            managers.push(("etcd", LockManager::etcd([s.endpoint()]).await.expect("etcd")));
        }
        if let Some(s) = &self.zk {
            managers.push(("zookeeper", LockManager::zookeeper(s.hosts()).await.expect("zookeeper")));
        }
        managers
    }
}

/// What is measured: process-wide, then per server `(connections, keys)`.
#[derive(Debug, Clone, PartialEq)]
struct Figures {
    fds: usize,
    tasks: usize,
    per_server: Vec<(&'static str, u64, u64)>,
}

fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd").map(|d| d.count()).unwrap_or(0)
}

/// The figures as the servers and the process give them now.
async fn figures(servers: &Servers) -> Figures {
    let mut per_server = Vec::new();
    // Redis: clients other than the asking one; every key (locks, queues, fencing counters).
    if let Some(server) = &servers.redis {
        let mut redis =
            redis::Client::open(server.url()).unwrap().get_multiplexed_async_connection().await.expect("redis");
        let info: String = redis::cmd("INFO").arg("clients").query_async(&mut redis).await.unwrap();
        let clients: u64 = info
            .lines()
            .find_map(|l| l.strip_prefix("connected_clients:"))
            .and_then(|n| n.trim().parse().ok())
            .unwrap_or(0);
        let keys: u64 = redis::cmd("DBSIZE").query_async(&mut redis).await.unwrap();
        per_server.push(("redis", clients.saturating_sub(1), keys));
    }
    // PostgreSQL: client sessions other than the asking one; advisory locks held.
    if let Some(server) = &servers.pg {
        let pg = server.admin().await;
        let sessions: i64 = pg
            .query_one(
                "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend' AND pid <> pg_backend_pid()",
                &[],
            )
            .await
            .unwrap()
            .get(0);
        let advisory: i64 =
            pg.query_one("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'", &[]).await.unwrap().get(0);
        per_server.push(("postgres", u64::try_from(sessions).unwrap(), u64::try_from(advisory).unwrap()));
    }
    // MySQL: client connections other than the asking one (its locks go with its sessions).
    if let Some(server) = &servers.mysql {
        let mut my = mysql_async::Conn::new(mysql_async::Opts::from_url(&server.url()).unwrap()).await.unwrap();
        let conns: Option<u64> = my
            .query_first(
                "SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE USER = 'app' AND ID <> CONNECTION_ID()",
            )
            .await
            .unwrap();
        let _ = my.disconnect().await;
        per_server.push(("mysql", conns.unwrap_or(0), 0));
    }
    // etcd: keys under the library's root (the connection is one HTTP/2 channel: in `fds`).
    if let Some(server) = &servers.etcd {
        let mut etcd = etcd_client::Client::connect([server.endpoint()], None).await.expect("etcd");
        let count = etcd
            .get("lock-runtime/", Some(etcd_client::GetOptions::new().with_prefix().with_count_only()))
            .await
            .map(|r| u64::try_from(r.count()).unwrap_or(0))
            .unwrap_or(0);
        per_server.push(("etcd", 0, count));
    }
    // ZooKeeper: live connections (the lock nodes are ephemeral: they go with the sessions).
    if let Some(server) = &servers.zk {
        let zk = tokio::task::block_in_place(|| server.connections()).unwrap_or(0);
        per_server.push(("zookeeper", zk, 0));
    }
    let tasks = tokio::runtime::Handle::current().metrics().num_alive_tasks();
    Figures { fds: open_fds(), tasks, per_server }
}

/// A small xorshift: the churn's choices, reproducible from the task's seed.
fn next(seed: &mut u64) -> u64 {
    *seed ^= *seed << 13;
    *seed ^= *seed >> 7;
    *seed ^= *seed << 17;
    *seed
}

/// The restart windows so far (each from its start to [`RECOVERY`] after its end), and the
/// failures.
struct Record {
    windows: Mutex<Vec<(Instant, Instant)>>,
    failures: Failures,
}

/// One task's churn on `manager` until `until`: a lock held a moment and released, a try_lock,
/// or a waiter dropped after a few milliseconds. Failed operations are counted.
async fn churn(manager: LockManager, label: &'static str, mut seed: u64, until: Instant, record: Arc<Record>) {
    let failed = |began: Instant| record.failures.count(began, &record.windows);
    while Instant::now() < until {
        let name = format!("soak:{label}:{}", next(&mut seed) % NAMES);
        let began = Instant::now();
        match next(&mut seed) % 3 {
            0 => match manager.lock(&name).wait(Duration::from_millis(300)).await {
                Ok(guard) => {
                    tokio::time::sleep(Duration::from_millis(1)).await;
                    let _ = guard.release().await;
                }
                Err(e) if e.is_contended() => {}
                Err(_) => failed(began),
            },
            1 => match manager.try_lock(&name).await {
                Ok(Some(guard)) => {
                    let _ = guard.release().await;
                }
                Ok(None) => {}
                Err(_) => failed(began),
            },
            _ => {
                // Cancelled at some poll: the waiter's clean-up is the backend's.
                let cancel_after = Duration::from_millis(next(&mut seed) % 5);
                let _ = tokio::time::timeout(
                    cancel_after,
                    std::future::IntoFuture::into_future(manager.lock(&name).wait(Duration::from_secs(2))),
                )
                .await;
            }
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Runs every backend's churn for `time`, restarting every server each [`RESTART_EVERY`]
/// when `restarts`: the operations that failed during the restarts and outside them.
async fn run(
    managers: &[(&'static str, LockManager)],
    servers: &mut Servers,
    time: Duration,
    restarts: bool,
) -> (u64, u64) {
    let until = Instant::now() + time;
    let record = Arc::new(Record { windows: Mutex::new(Vec::new()), failures: Failures::default() });
    let mut tasks = tokio::task::JoinSet::new();
    for (i, (label, manager)) in managers.iter().enumerate() {
        for t in 0..TASKS {
            let seed = 0x9E37_79B9_7F4A_7C15 ^ ((i * TASKS + t) as u64 + 1);
            tasks.spawn(churn(manager.clone(), label, seed, until, record.clone()));
        }
    }
    let mut restarted = 0;
    while restarts && Instant::now() + RESTART_EVERY < until {
        tokio::time::sleep(RESTART_EVERY).await;
        let from = Instant::now();
        record.failures.restarting.store(true, Ordering::SeqCst);
        tokio::task::block_in_place(|| servers.restart_all());
        record.windows.lock().unwrap().push((from, Instant::now() + RECOVERY));
        record.failures.restarting.store(false, Ordering::SeqCst);
        restarted += 1;
    }
    while tasks.join_next().await.is_some() {}
    if restarts {
        eprintln!("soak: {restarted} restarts of every server");
    }
    (record.failures.during.load(Ordering::Relaxed), record.failures.outside.load(Ordering::Relaxed))
}

/// Waits until the figures stop falling (the clean-up left by the churn settled): two looks
/// a second apart that agree, within 30 s.
async fn settled(servers: &Servers) -> Figures {
    let mut last = figures(servers).await;
    for _ in 0..30 {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let now = figures(servers).await;
        if now == last {
            return now;
        }
        last = now;
    }
    last
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resources_stay_flat_under_churn_and_server_restarts() {
    let mut servers = Servers::start();
    let managers = servers.managers().await;
    // Warm-up: the same churn without restarts, so that pools, subscriptions and sessions
    // exist at the start as they do at the end.
    run(&managers, &mut servers, Duration::from_secs(3), false).await;
    let start = settled(&servers).await;
    let time = soak_time();
    let (during, outside) = run(&managers, &mut servers, time, true).await;
    let failures = format!(
        "{time:?}: {during} operations failed while the servers restarted (or within {RECOVERY:?} after), \
         {outside} outside"
    );
    lock_tests::figure("soak", &failures);
    lock_tests::figure("soak", &format!("start {start:?}"));
    // Back within the margins once the clean-up the churn left (a dropped waiter's key deleted
    // again after the operation timeout, say) is done: looked at every 10 ms for 30 s.
    // Margins: a pooled SQL backend keeps up to TASKS idle connections, which it may hold more
    // or fewer of at the end; each of those is an fd of ours, and the runtime may run a task
    // per held-lock monitor still stopping. A lock's fencing counter may be made again after a
    // restart lost it, one per name. Nothing may grow with the soak's length.
    let slack = TASKS + 4;
    let mut end = None;
    lock_tests::eventually("the figures back within their margins", Duration::from_secs(30), async || {
        let now = figures(&servers).await;
        let mut grown = Vec::new();
        if now.fds > start.fds + 2 * slack {
            grown.push(format!("open fds {} -> {}", start.fds, now.fds));
        }
        if now.tasks > start.tasks + slack {
            grown.push(format!("live tasks {} -> {}", start.tasks, now.tasks));
        }
        for ((name, conns0, keys0), (_, conns1, keys1)) in start.per_server.iter().zip(&now.per_server) {
            if *conns1 > conns0 + slack as u64 {
                grown.push(format!("{name} connections {conns0} -> {conns1}"));
            }
            if *keys1 > keys0 + NAMES {
                grown.push(format!("{name} keys {keys0} -> {keys1}"));
            }
        }
        end = Some(now);
        if grown.is_empty() {
            Ok(())
        } else {
            Err(grown)
        }
    })
    .await;
    lock_tests::figure("soak", &format!("end   {:?}", end.expect("looked")));
    assert_eq!(outside, 0, "operations failed while every server answered");
}
