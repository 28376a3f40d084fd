//! The fault suite's harness: starts the lock server and the witness server (PostgreSQL, with
//! the shipped fence installed: [`super::witness`]), one
//! [`TcpProxy`] and one `jepsen_worker` process per worker (so one worker can be cut off
//! alone), collects the workers' history lines, and drives a seeded schedule of faults, each
//! logged as `fault <kind> <target> start|end` by the actor `nemesis`.
//!
//! - **Seed**: `JEPSEN_SEED` if set, else derived from the clock; printed at the start with the
//!   line that replays it. Worker seeds derive from it.
//! - **Profile**: about [`SHORT_FAULT_SECS`] of faults by default; `JEPSEN_SECS=<n>` for `n`.
//!   The schedule alternates fault-free intervals and faults: every kind once (in a seeded
//!   order), then a mixed period (two faults at once), then, in a longer profile, random
//!   singles and pairs until the time is up.
//! - **Holds**: most last a few ms; one in ten 50..200 ms (a fault aimed at a holder catches
//!   it); one in ten from 300 ms to [`Config::long_hold`] (900 ms: across watchdog renewals,
//!   within a fixed lease of 1 s). `JEPSEN_LONG_HOLD_MS=<n>` changes that bound: above the
//!   lease, fixed-lease holders regularly hold past their lease's end, with no fault at all.
//! - **Stopping**: after the faults and a fault-free [`TAIL`], the workers' stdin is closed,
//!   which tells them to finish their current operation, drop their manager and log `exit`.
//! - **Bounds**: a worker that has not exited [`EXIT_GRACE`] after that is killed and
//!   reported; every worker is killed (SIGKILL, by pid) when the harness is dropped, so a
//!   failing test leaves no process behind.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use tokio::sync::watch;

use super::history::{process_of, Event, Record};
#[cfg(feature = "mysql")]
use crate::mysql_server::MysqlServer;
use crate::pg_server::PgServer;
use crate::redis_server::tcp_proxy::TcpProxy;
use crate::redis_server::RedisServer;
use crate::zk_server::ZkServer;

/// Seconds of faults in the default (short) profile.
pub const SHORT_FAULT_SECS: u64 = 16;
/// Fault-free time at the end of the run, before the workers stop: the system settles (leases
/// run out, sessions expire, waiters are served) so the final state can be checked.
pub const TAIL: Duration = Duration::from_secs(3);
/// How long after being told to stop a worker may take to log `exit` and end.
pub const EXIT_GRACE: Duration = Duration::from_secs(20);
/// A hold this old is one of the workers' long ones (most last a few ms): a fault aimed at it
/// catches the holder while it holds.
const LONG_HOLD: Duration = Duration::from_millis(25);
/// How long the first grant may take (servers and JVMs starting on a busy machine).
const FIRST_GRANT_BOUND: Duration = Duration::from_secs(30);

/// The lock service under test.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    /// `redis-server`, without persistence.
    Redis,
    /// Redlock over three `redis-server` primaries, without persistence.
    Redlock,
    /// A Redis Cluster of three primaries with a replica each, without persistence.
    RedisCluster,
    /// A primary with two replicas and three Sentinels, without persistence.
    RedisSentinel,
    /// A standalone ZooKeeper server, with its data directory.
    Zookeeper,
    /// Lock files in a directory of this host (no server).
    File,
    /// A PostgreSQL server (not the witness's), with its data directory.
    Postgres,
    /// One etcd server, with its data directory.
    #[cfg(feature = "etcd")]
    Etcd,
    /// A MariaDB server, with its data directory.
    #[cfg(feature = "mysql")]
    Mysql,
}

impl Backend {
    /// `redis`, `zookeeper`, `file` or `mysql` (the worker's `backend=` and the checker's
    /// `backend`).
    pub fn name(self) -> &'static str {
        match self {
            Backend::Redis => "redis",
            Backend::Redlock => "redlock",
            Backend::RedisCluster => "redis-cluster",
            Backend::RedisSentinel => "redis-sentinel",
            Backend::Zookeeper => "zookeeper",
            Backend::File => "file",
            Backend::Postgres => "postgres",
            #[cfg(feature = "etcd")]
            Backend::Etcd => "etcd",
            #[cfg(feature = "mysql")]
            Backend::Mysql => "mysql",
        }
    }
}

/// The settings of a run.
#[derive(Debug, Clone)]
pub struct Config {
    /// The lock service.
    pub backend: Backend,
    /// The `jepsen_worker` binary (`env!("CARGO_BIN_EXE_jepsen_worker")` in the test).
    pub worker_bin: PathBuf,
    /// Worker processes running at any time (a killed one is replaced).
    pub workers: usize,
    /// Lock names they share.
    pub names: usize,
    /// The `wait` of every acquisition.
    pub wait: Duration,
    /// The lease: workers with an odd number use the watchdog with this default lease, even
    /// ones a fixed lease of this length (ZooKeeper: the session keeps watchdog locks).
    pub lease: Duration,
    /// The backend's operation timeout (Redis command timeout, ZooKeeper operation timeout).
    pub op_timeout: Duration,
    /// ZooKeeper's session timeout.
    pub session_timeout: Duration,
    /// The longest hold (`JEPSEN_LONG_HOLD_MS`, else 900 ms).
    pub long_hold: Duration,
    /// Workers campaign in elections of the names (`Election::campaign`, a term per grant)
    /// instead of locking them.
    pub elect: bool,
    /// Workers wait for this many replicas to acknowledge each grant and renewal
    /// (`RedisOptions::wait_for_replicas`, a Sentinel run).
    pub wait_for_replicas: Option<usize>,
    /// The kind of each name (the worker's `kinds=`: `mutex`, `rw`, `sem<n>`); all mutexes when
    /// empty.
    pub kinds: Vec<&'static str>,
    /// Loops each worker process runs on its one manager (the worker's `tasks=`; 1 by default):
    /// with more, tasks of one process contend for a name and hand it to each other.
    pub tasks: usize,
}

impl Config {
    /// The suite's settings for `backend`: 4 workers on 2 names, a 1 s lease, 3 s waits, 1 s
    /// operation timeout, a 1.5 s ZooKeeper session.
    pub fn new(backend: Backend, worker_bin: impl Into<PathBuf>) -> Self {
        Config {
            backend,
            worker_bin: worker_bin.into(),
            workers: 4,
            names: 2,
            wait: Duration::from_secs(3),
            lease: Duration::from_secs(1),
            op_timeout: Duration::from_secs(1),
            session_timeout: Duration::from_millis(1500),
            long_hold: match std::env::var("JEPSEN_LONG_HOLD_MS") {
                Ok(ms) => {
                    Duration::from_millis(ms.trim().parse().unwrap_or_else(|_| panic!("JEPSEN_LONG_HOLD_MS={ms}")))
                }
                Err(_) => Duration::from_millis(900),
            },
            elect: false,
            wait_for_replicas: None,
            kinds: Vec::new(),
            tasks: 1,
        }
    }

    /// Three names: a mutex, a read-write lock (workers read two times in three) and a
    /// semaphore of two permits; the checker holds each to its kind's rule.
    pub fn with_kinds(mut self) -> Self {
        self.kinds = vec!["mutex", "rw", "sem2"];
        self.names = self.kinds.len();
        self
    }

    /// Each worker process runs `tasks` loops on its one manager (see [`Config::tasks`]).
    pub fn with_tasks(mut self, tasks: usize) -> Self {
        self.tasks = tasks;
        self
    }
}

/// Microseconds since the Unix epoch (the workers' clock too).
pub fn now_us() -> u64 {
    u64::try_from(SystemTime::now().duration_since(UNIX_EPOCH).expect("clock after 1970").as_micros())
        .expect("microseconds fit")
}

/// xorshift64*: the run's seeded generator.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    /// A generator from `seed` (0 is mapped to 1).
    pub fn new(seed: u64) -> Self {
        Rng(seed.max(1))
    }
    /// The next value.
    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    /// Uniform in `0..n` (`n` > 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n.max(1)
    }
    /// Uniform in `lo..=hi`.
    pub fn between(&mut self, lo: Duration, hi: Duration) -> Duration {
        let span = u64::try_from(hi.saturating_sub(lo).as_millis()).unwrap_or(0);
        lo + Duration::from_millis(self.below(span + 1))
    }
}

/// The run's seed: `JEPSEN_SEED`, else from the clock (printed with the replay line).
pub fn seed() -> u64 {
    let seed = match std::env::var("JEPSEN_SEED") {
        Ok(s) => s.trim().parse().unwrap_or_else(|_| panic!("JEPSEN_SEED={s} is not a u64")),
        Err(_) => {
            let mut rng = Rng::new(now_us() ^ (u64::from(std::process::id()) << 32));
            rng.next_u64() % 1_000_000_000
        }
    };
    eprintln!("jepsen seed: {seed} (replay: JEPSEN_SEED={seed})");
    seed
}

/// Seconds of faults: `JEPSEN_SECS`, else [`SHORT_FAULT_SECS`].
pub fn fault_secs() -> u64 {
    match std::env::var("JEPSEN_SECS") {
        Ok(s) => s.trim().parse().unwrap_or_else(|_| panic!("JEPSEN_SECS={s} is not a number of seconds")),
        Err(_) => SHORT_FAULT_SECS,
    }
}

/// One fault of the schedule.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// SIGKILL of a holder, replaced by a new worker.
    Kill,
    /// SIGSTOP of a holder past its lease, then SIGCONT.
    Pause,
    /// The lock server killed, then started again on the same port.
    ServerRestart,
    /// Redis `CLIENT KILL TYPE normal`: every command connection.
    ClientKillNormal,
    /// Redis `CLIENT KILL TYPE pubsub`: every pub/sub connection.
    ClientKillPubsub,
    /// One worker's traffic black-holed both ways (sockets kept open), then healed.
    Partition,
    /// Latency added to one worker's traffic.
    Delay,
    /// ZooKeeper: one worker black-holed past its session timeout, then healed.
    SessionExpiry,
    /// Redlock: one node killed, kept down for longer than a lease (as its docs ask of an
    /// operator), then started again empty.
    NodeRestart,
    /// Redlock: one node stopped (SIGSTOP) past a lease, then resumed.
    NodePause,
    /// Redlock: one node's fencing counters for the run's names set an hour ahead, as a node
    /// whose clock ran ahead mints (this machine has one clock; libfaketime and redis-server's
    /// allocator do not get along).
    NodeSkew,
    /// Redis Cluster or Sentinel: the primary (of a run's lock name) killed; the run waits until
    /// a replica is promoted, starts the old primary again (it rejoins as a replica) and waits
    /// until it is in sync.
    Failover,
    /// Redis Cluster: the slot of one of the run's lock names moved to another primary.
    Resharding,
}

impl Fault {
    /// The history's name of the fault kind.
    pub fn kind(self) -> &'static str {
        match self {
            Fault::Kill => "kill",
            Fault::Pause => "pause",
            Fault::ServerRestart => "server-restart",
            Fault::ClientKillNormal | Fault::ClientKillPubsub => "client-kill",
            Fault::Partition => "partition",
            Fault::Delay => "delay",
            Fault::SessionExpiry => "session-expiry",
            Fault::NodeRestart => "node-restart",
            Fault::NodePause => "node-pause",
            Fault::NodeSkew => "node-skew",
            Fault::Failover => "failover",
            Fault::Resharding => "resharding",
        }
    }

    /// Every fault that applies to `backend`.
    pub fn all(backend: Backend) -> Vec<Fault> {
        match backend {
            Backend::Redis => vec![
                Fault::Kill,
                Fault::Pause,
                Fault::ServerRestart,
                Fault::ClientKillNormal,
                Fault::ClientKillPubsub,
                Fault::Partition,
                Fault::Delay,
            ],
            Backend::Zookeeper => {
                vec![
                    Fault::Kill,
                    Fault::Pause,
                    Fault::ServerRestart,
                    Fault::Partition,
                    Fault::Delay,
                    Fault::SessionExpiry,
                ]
            }
            Backend::Redlock => {
                vec![
                    Fault::Kill,
                    Fault::Pause,
                    Fault::NodeRestart,
                    Fault::NodePause,
                    Fault::NodeSkew,
                    Fault::Partition,
                    Fault::Delay,
                ]
            }
            // The clients learn the nodes' own addresses: no proxy to cut or delay them.
            Backend::RedisCluster => vec![Fault::Kill, Fault::Pause, Fault::Failover, Fault::Resharding],
            Backend::RedisSentinel => vec![Fault::Kill, Fault::Pause, Fault::Failover],
            // No server, no network: a process dies or stops.
            Backend::File => vec![Fault::Kill, Fault::Pause],
            Backend::Postgres => vec![Fault::Kill, Fault::Pause, Fault::ServerRestart, Fault::Partition, Fault::Delay],
            #[cfg(feature = "etcd")]
            Backend::Etcd => vec![Fault::Kill, Fault::Pause, Fault::ServerRestart, Fault::Partition, Fault::Delay],
            #[cfg(feature = "mysql")]
            Backend::Mysql => vec![Fault::Kill, Fault::Pause, Fault::ServerRestart, Fault::Partition, Fault::Delay],
        }
    }

    /// Pairs that make sense at the same time (different targets, the server up for the
    /// second).
    fn pairs(backend: Backend) -> Vec<(Fault, Fault)> {
        match backend {
            Backend::Redis => vec![
                (Fault::Pause, Fault::Partition),
                (Fault::Kill, Fault::Delay),
                (Fault::ServerRestart, Fault::Pause),
                (Fault::Partition, Fault::ClientKillPubsub),
                (Fault::Delay, Fault::ClientKillNormal),
            ],
            Backend::Zookeeper => vec![
                (Fault::Pause, Fault::Partition),
                (Fault::SessionExpiry, Fault::Kill),
                (Fault::ServerRestart, Fault::Delay),
                (Fault::Partition, Fault::Kill),
            ],
            Backend::File => vec![(Fault::Pause, Fault::Kill)],
            Backend::RedisCluster => vec![(Fault::Pause, Fault::Failover), (Fault::Kill, Fault::Resharding)],
            Backend::RedisSentinel => vec![(Fault::Pause, Fault::Failover), (Fault::Kill, Fault::Failover)],
            // One node at a time: a minority.
            Backend::Redlock => vec![
                (Fault::Pause, Fault::NodePause),
                (Fault::Kill, Fault::NodeRestart),
                (Fault::Partition, Fault::NodePause),
                (Fault::Delay, Fault::NodeRestart),
                (Fault::Kill, Fault::NodeSkew),
            ],
            #[cfg(feature = "etcd")]
            Backend::Etcd => vec![
                (Fault::Pause, Fault::Partition),
                (Fault::Kill, Fault::Delay),
                (Fault::ServerRestart, Fault::Pause),
                (Fault::Partition, Fault::Kill),
            ],
            Backend::Postgres => vec![
                (Fault::Pause, Fault::Partition),
                (Fault::Kill, Fault::Delay),
                (Fault::ServerRestart, Fault::Pause),
                (Fault::Partition, Fault::Kill),
            ],
            #[cfg(feature = "mysql")]
            Backend::Mysql => vec![
                (Fault::Pause, Fault::Partition),
                (Fault::Kill, Fault::Delay),
                (Fault::ServerRestart, Fault::Pause),
                (Fault::Partition, Fault::Kill),
            ],
        }
    }
}

/// One step of the schedule: a fault-free interval, then one or two faults at once.
#[derive(Debug, Clone)]
pub struct Step {
    /// Fault-free time before it.
    pub quiet: Duration,
    /// The faults, run at the same time.
    pub faults: Vec<Fault>,
}

/// The seeded schedule: every kind once in a seeded order, one mixed pair, then (long
/// profile) random singles and pairs; `budget` is a rough total that [`run`] enforces.
pub fn schedule(backend: Backend, rng: &mut Rng, steps_beyond: usize) -> Vec<Step> {
    let mut kinds = Fault::all(backend);
    for i in (1..kinds.len()).rev() {
        let j = usize::try_from(rng.below(i as u64 + 1)).unwrap();
        kinds.swap(i, j);
    }
    let pairs = Fault::pairs(backend);
    let mut steps: Vec<Step> = Vec::new();
    let quiet = |rng: &mut Rng| rng.between(Duration::from_millis(400), Duration::from_millis(1000));
    for fault in kinds {
        steps.push(Step { quiet: quiet(rng), faults: vec![fault] });
    }
    let (a, b) = pairs[usize::try_from(rng.below(pairs.len() as u64)).unwrap()];
    steps.push(Step { quiet: quiet(rng), faults: vec![a, b] });
    let all = Fault::all(backend);
    for _ in 0..steps_beyond {
        let faults = if rng.below(3) == 0 {
            let (a, b) = pairs[usize::try_from(rng.below(pairs.len() as u64)).unwrap()];
            vec![a, b]
        } else {
            vec![all[usize::try_from(rng.below(all.len() as u64)).unwrap()]]
        };
        steps.push(Step { quiet: quiet(rng), faults });
    }
    steps
}

/// The lock server of a run.
#[derive(Debug)]
pub enum LockServer {
    /// A `redis-server` without persistence.
    Redis(RedisServer),
    /// Redlock's nodes: `redis-server`s without persistence.
    Redlock(Vec<RedisServer>),
    /// A Redis Cluster.
    Cluster(crate::redis_cluster::RedisCluster),
    /// A primary, its replicas and Sentinels.
    Sentinel(crate::redis_sentinel::SentinelSetup),
    /// A ZooKeeper server with its data directory.
    Zookeeper(ZkServer),
    /// The lock directory of a file run (removed on drop).
    Dir(LockDir),
    /// A PostgreSQL server with its data directory.
    Postgres(PgServer),
    /// An etcd server with its data directory.
    #[cfg(feature = "etcd")]
    Etcd(crate::etcd_server::EtcdServer),
    /// A MariaDB server with its data directory.
    #[cfg(feature = "mysql")]
    Mysql(MysqlServer),
}

/// A lock directory, removed when dropped.
#[derive(Debug)]
pub struct LockDir(pub PathBuf);

impl Drop for LockDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

impl LockServer {
    /// The ports workers reach it on (each through a proxy of its own); none for a directory.
    fn ports(&self) -> Vec<u16> {
        match self {
            LockServer::Redis(s) => vec![s.port()],
            LockServer::Redlock(nodes) => nodes.iter().map(RedisServer::port).collect(),
            // Workers connect to the nodes directly (clients learn the nodes' addresses).
            LockServer::Cluster(_) | LockServer::Sentinel(_) => Vec::new(),
            LockServer::Zookeeper(s) => vec![s.port()],
            LockServer::Dir(_) => Vec::new(),
            LockServer::Postgres(s) => vec![s.port()],
            #[cfg(feature = "etcd")]
            LockServer::Etcd(s) => vec![s.port()],
            #[cfg(feature = "mysql")]
            LockServer::Mysql(s) => vec![s.port()],
        }
    }

    /// Redlock's node `i`.
    fn node(&mut self, i: usize) -> &mut RedisServer {
        match self {
            LockServer::Redlock(nodes) => &mut nodes[i],
            other => panic!("not a Redlock run: {other:?}"),
        }
    }

    fn kill(&mut self) {
        match self {
            LockServer::Redis(s) => s.kill(),
            LockServer::Redlock(nodes) => nodes.iter_mut().for_each(RedisServer::kill),
            LockServer::Cluster(_) | LockServer::Sentinel(_) => {}
            LockServer::Zookeeper(s) => s.kill(),
            LockServer::Dir(_) => {}
            LockServer::Postgres(s) => s.kill(),
            #[cfg(feature = "etcd")]
            LockServer::Etcd(s) => s.kill(),
            #[cfg(feature = "mysql")]
            LockServer::Mysql(s) => s.kill(),
        }
    }

    fn restart(&mut self) {
        match self {
            LockServer::Redis(s) => s.restart(),
            LockServer::Redlock(nodes) => nodes.iter_mut().for_each(RedisServer::restart),
            LockServer::Cluster(_) | LockServer::Sentinel(_) => {}
            LockServer::Zookeeper(s) => s.restart(),
            LockServer::Dir(_) => {}
            LockServer::Postgres(s) => s.restart(),
            #[cfg(feature = "etcd")]
            LockServer::Etcd(s) => s.restart(),
            #[cfg(feature = "mysql")]
            LockServer::Mysql(s) => s.restart(),
        }
    }
}

/// What the workers' reader threads share with the nemesis.
#[derive(Debug, Default)]
struct Shared {
    records: Mutex<Vec<Record>>,
    /// Lock names each worker holds right now and since when (from its `granted` and
    /// `release` lines).
    holding: Mutex<BTreeMap<String, BTreeMap<String, Instant>>>,
    /// Lines that did not parse.
    garbage: Mutex<Vec<String>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// One worker process and its proxies (one per server: Redlock has several).
#[derive(Debug)]
struct Worker {
    actor: String,
    child: Child,
    proxies: Vec<Arc<TcpProxy>>,
    /// Killed by the nemesis (its history ends at the kill, it has no `exit`).
    killed: bool,
    /// How it ended, once it did.
    status: Option<std::process::ExitStatus>,
    readers: Vec<std::thread::JoinHandle<()>>,
}

impl Worker {
    fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        if self.status.is_none() {
            let _ = self.child.kill(); // SIGKILL by pid: also ends a stopped process
            let _ = self.child.wait();
        }
    }
}

/// The harness of one run (see the [module docs](self)).
#[derive(Debug)]
pub struct Nemesis {
    config: Config,
    seed: u64,
    rng: Mutex<Rng>,
    server: Arc<Mutex<LockServer>>,
    /// The server's ports (one proxy each per worker), read once: a failover holds the
    /// server for seconds.
    ports: Vec<u16>,
    /// What workers connect to directly (a Cluster's nodes, the Sentinels; the lock directory),
    /// when they do.
    direct: Option<String>,
    witness: PgServer,
    names: Vec<String>,
    root: String,
    shared: Arc<Shared>,
    changed: watch::Sender<u64>,
    workers: Mutex<Vec<Worker>>,
    /// The stdin of every worker still running: closing it tells the worker to stop.
    stdins: Mutex<Vec<std::process::ChildStdin>>,
    /// Workers some fault is acting on right now (not picked by another).
    busy: Mutex<BTreeSet<String>>,
    next_actor: Mutex<usize>,
    /// The latest a worker's run may end (a bound; workers are stopped through their stdin).
    end: Instant,
    workers_log: PathBuf,
    log_file: Arc<Mutex<std::fs::File>>,
}

/// A finished run: its history and the servers, kept for the final checks.
#[derive(Debug)]
pub struct Run {
    /// The run's seed.
    pub seed: u64,
    /// The lock service.
    pub backend: Backend,
    /// The history, in time order.
    pub records: Vec<Record>,
    /// The lock names the workers used.
    pub names: Vec<String>,
    /// Harness-side problems: workers that exited badly or hung, unparsable lines.
    pub problems: Vec<String>,
    /// Where the history was written.
    pub history_path: PathBuf,
    /// Where the workers' stderr went.
    pub workers_log: PathBuf,
    /// The ZooKeeper lock root of the run.
    pub root: String,
    server: Arc<Mutex<LockServer>>,
    witness: PgServer,
}

impl Run {
    /// The environment that replays this run: `JEPSEN_SEED=<seed>`, and `JEPSEN_SECS` and
    /// `JEPSEN_LONG_HOLD_MS` when they were set.
    pub fn replay(&self) -> String {
        let mut replay = format!("JEPSEN_SEED={}", self.seed);
        for var in ["JEPSEN_SECS", "JEPSEN_LONG_HOLD_MS"] {
            if let Ok(value) = std::env::var(var) {
                replay.push_str(&format!(" {var}={value}"));
            }
        }
        replay
    }

    /// The witness server's URL.
    pub fn witness_url(&self) -> String {
        self.witness.url()
    }

    /// The lock server's Redis URL (direct, not through a proxy), for a Redis run.
    pub fn redis_url(&self) -> Option<String> {
        match &*lock(&self.server) {
            LockServer::Redis(s) => Some(s.url()),
            _ => None,
        }
    }

    /// The Redlock nodes' URLs (direct, not through a proxy), for a Redlock run.
    pub fn redlock_urls(&self) -> Option<Vec<String>> {
        match &*lock(&self.server) {
            LockServer::Redlock(nodes) => Some(nodes.iter().map(RedisServer::url).collect()),
            _ => None,
        }
    }

    /// The data nodes' URLs (direct), for a Redis Cluster or Sentinel run.
    pub fn data_node_urls(&self) -> Option<Vec<String>> {
        match &*lock(&self.server) {
            LockServer::Cluster(cluster) => Some(cluster.urls()),
            LockServer::Sentinel(setup) => Some((0..setup.nodes()).map(|i| setup.node(i).url()).collect()),
            _ => None,
        }
    }

    /// The lock server's ZooKeeper hosts (direct), for a ZooKeeper run.
    pub fn zk_hosts(&self) -> Option<String> {
        match &*lock(&self.server) {
            LockServer::Zookeeper(s) => Some(s.hosts()),
            _ => None,
        }
    }

    /// The lock server's MySQL URL (direct, not through a proxy), for a MySQL run.
    #[cfg(feature = "mysql")]
    pub fn mysql_url(&self) -> Option<String> {
        match &*lock(&self.server) {
            LockServer::Mysql(s) => Some(s.url()),
            _ => None,
        }
    }

    /// The lock server's PostgreSQL URL (direct, not through a proxy), for a PostgreSQL run.
    pub fn postgres_url(&self) -> Option<String> {
        match &*lock(&self.server) {
            LockServer::Postgres(s) => Some(s.url()),
            _ => None,
        }
    }

    /// The lock server's endpoint (direct, not through a proxy), for an etcd run.
    #[cfg(feature = "etcd")]
    pub fn etcd_endpoint(&self) -> Option<String> {
        match &*lock(&self.server) {
            LockServer::Etcd(s) => Some(s.endpoint()),
            _ => None,
        }
    }

    /// The lock directory, for a file run.
    pub fn lock_dir(&self) -> Option<PathBuf> {
        match &*lock(&self.server) {
            LockServer::Dir(dir) => Some(dir.0.clone()),
            _ => None,
        }
    }

    /// The witness's accepted writes, `(token, value)` in order, for every lock name of the run.
    pub async fn witness_logs(&self) -> BTreeMap<String, Vec<(u64, u64)>> {
        let witness = super::witness::Witness::connect(&self.witness_url()).await.expect("connect to the witness");
        let mut logs = BTreeMap::new();
        for name in &self.names {
            let log = witness.log(name).await.unwrap_or_else(|e| panic!("witness log of {name}: {e}"));
            logs.insert(name.clone(), log);
        }
        logs
    }

    /// Faults started, by kind (from the history).
    pub fn faults(&self) -> BTreeMap<String, usize> {
        let mut faults = BTreeMap::new();
        for r in &self.records {
            if let Event::Fault { kind, start: true, .. } = &r.event {
                *faults.entry(kind.clone()).or_default() += 1;
            }
        }
        faults
    }
}

impl Nemesis {
    /// Starts the servers and the workers and waits for the first grant.
    pub async fn start(config: Config, seed: u64, fault_time: Duration) -> Nemesis {
        let backend = config.backend;
        let server = tokio::task::spawn_blocking(move || match backend {
            Backend::Redis => LockServer::Redis(RedisServer::start()),
            Backend::Redlock => LockServer::Redlock((0..3).map(|_| RedisServer::start()).collect()),
            Backend::RedisCluster => LockServer::Cluster(crate::redis_cluster::RedisCluster::start(3, 1)),
            Backend::RedisSentinel => LockServer::Sentinel(crate::redis_sentinel::SentinelSetup::start(2, 3)),
            Backend::Zookeeper => LockServer::Zookeeper(ZkServer::start()),
            Backend::File => LockServer::Dir(LockDir(crate::server_process::ServerProcess::temp_dir("jepsen-file"))),
            Backend::Postgres => LockServer::Postgres(PgServer::start()),
            #[cfg(feature = "etcd")]
            Backend::Etcd => LockServer::Etcd(crate::etcd_server::EtcdServer::start()),
            #[cfg(feature = "mysql")]
            Backend::Mysql => LockServer::Mysql(MysqlServer::start()),
        })
        .await
        .expect("start the lock server");
        let witness = tokio::task::spawn_blocking(PgServer::start).await.expect("start the witness server");
        let installing = super::witness::Witness::connect(&witness.url()).await.expect("connect to the witness");
        installing.install().await.expect("install the witness's fence");
        let run = format!("jepsen-{seed}-{}", std::process::id());
        let names = (0..config.names).map(|i| format!("{run}:{i}")).collect();
        let workers_log = std::env::temp_dir().join(format!("{run}-{}-workers.log", backend.name()));
        let log_file = Arc::new(Mutex::new(std::fs::File::create(&workers_log).expect("the workers' log")));
        let ports = server.ports();
        // The workers connect by URL (`LockManager::connect`).
        let hosts =
            |urls: Vec<String>| urls.iter().map(|u| u.trim_start_matches("redis://").to_owned()).collect::<Vec<_>>();
        let direct = match &server {
            LockServer::Dir(dir) => Some(format!("file://{}", dir.0.display())),
            LockServer::Cluster(cluster) => Some(format!("redis+cluster://{}", hosts(cluster.urls()).join(","))),
            LockServer::Sentinel(setup) => Some(format!(
                "redis+sentinel://{}/{}",
                hosts(setup.sentinel_urls()).join(","),
                crate::redis_sentinel::MASTER
            )),
            _ => None,
        };
        let nemesis = Nemesis {
            rng: Mutex::new(Rng::new(seed)),
            seed,
            server: Arc::new(Mutex::new(server)),
            ports,
            direct,
            witness,
            names,
            root: format!("/{run}"),
            shared: Arc::default(),
            changed: watch::Sender::new(0),
            workers: Mutex::default(),
            stdins: Mutex::default(),
            busy: Mutex::default(),
            next_actor: Mutex::new(1),
            end: Instant::now() + FIRST_GRANT_BOUND + fault_time * 2 + TAIL + Duration::from_secs(30),
            workers_log,
            log_file,
            config,
        };
        for _ in 0..nemesis.config.workers {
            nemesis.spawn_worker().await;
        }
        let granted = nemesis
            .wait_for(FIRST_GRANT_BOUND, |shared| {
                lock(&shared.records).iter().any(|r| matches!(r.event, Event::Granted { .. }))
            })
            .await;
        assert!(granted, "no worker was granted a lock within {FIRST_GRANT_BOUND:?} (see {:?})", nemesis.workers_log);
        nemesis
    }

    /// The run's seed.
    pub fn seed(&self) -> u64 {
        self.seed
    }

    fn rng(&self) -> MutexGuard<'_, Rng> {
        lock(&self.rng)
    }

    fn note(&self, kind: &str, target: &str, start: bool) {
        let record = Record {
            t_us: now_us(),
            actor: "nemesis".into(),
            event: Event::Fault { kind: kind.into(), target: target.into(), start },
        };
        eprintln!("{record}");
        lock(&self.shared.records).push(record);
    }

    /// Starts one more worker (a new actor id) whose run ends with everyone's.
    async fn spawn_worker(&self) {
        let n = {
            let mut next = lock(&self.next_actor);
            *next += 1;
            *next - 1
        };
        let actor = format!("w{n}");
        let mut proxies = Vec::new();
        for port in &self.ports {
            proxies.push(Arc::new(TcpProxy::start(*port).await));
        }
        let c = &self.config;
        let addr = match (c.backend, &self.direct, proxies.first()) {
            (_, Some(direct), _) => direct.clone(),
            (Backend::Redlock, ..) => {
                let hosts: Vec<String> = proxies.iter().map(|p| format!("127.0.0.1:{}", p.port())).collect();
                format!("redlock://{}", hosts.join(","))
            }
            (Backend::Zookeeper, _, Some(proxy)) => format!("zookeeper://127.0.0.1:{}", proxy.port()),
            (Backend::Postgres, _, Some(proxy)) => format!("postgres://postgres@127.0.0.1:{}/postgres", proxy.port()),
            #[cfg(feature = "etcd")]
            (Backend::Etcd, _, Some(proxy)) => format!("etcd://127.0.0.1:{}", proxy.port()),
            #[cfg(feature = "mysql")]
            (Backend::Mysql, _, Some(proxy)) => format!("mysql://app:secret@127.0.0.1:{}/app", proxy.port()),
            (_, _, Some(proxy)) => proxy.redis_url(),
            (backend, ..) => panic!("no address for a {backend:?} worker"),
        };
        let lease = if n % 2 == 1 { "watchdog" } else { "fixed" };
        let ms = |d: Duration| d.as_millis().to_string();
        let worker_seed = self.seed.wrapping_mul(0x9E37_79B9_7F4A_7C15).wrapping_add(n as u64);
        let mut child = Command::new(&c.worker_bin)
            .arg(format!("backend={}", c.backend.name()))
            .arg(format!("addr={addr}"))
            .arg(format!("witness={}", self.witness.url()))
            .arg(format!("actor={actor}"))
            .arg(format!("names={}", self.names.join(",")))
            .arg(format!("run_ms={}", ms(self.end.saturating_duration_since(Instant::now()))))
            .arg(format!("wait_ms={}", ms(c.wait)))
            .arg(format!("lease={lease}:{}", ms(c.lease)))
            .arg(format!("op_timeout_ms={}", ms(c.op_timeout)))
            .arg(format!("long_hold_ms={}", ms(c.long_hold)))
            .arg(format!("session_ms={}", ms(c.session_timeout)))
            .arg(format!("root={}", self.root))
            .arg(format!("seed={worker_seed}"))
            .arg(format!("mode={}", if c.elect { "elect" } else { "lock" }))
            .arg(format!("replicas={}", c.wait_for_replicas.unwrap_or(0)))
            .arg(format!("tasks={}", c.tasks))
            .args((!c.kinds.is_empty()).then(|| format!("kinds={}", c.kinds.join(","))))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("start {:?}: {e}", c.worker_bin));
        lock(&self.stdins).push(child.stdin.take().expect("stdin"));
        let stdout = child.stdout.take().expect("stdout");
        let stderr = child.stderr.take().expect("stderr");
        let (shared, changed, who) = (self.shared.clone(), self.changed.clone(), actor.clone());
        let out = std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                match line.parse::<Record>() {
                    Ok(record) => {
                        {
                            let mut holding = lock(&shared.holding);
                            let held = holding.entry(record.actor.clone()).or_default();
                            match &record.event {
                                Event::Granted { name, .. } => {
                                    held.insert(name.clone(), Instant::now());
                                }
                                Event::Release { name, .. } => {
                                    held.remove(name);
                                }
                                _ => {}
                            }
                        }
                        lock(&shared.records).push(record);
                    }
                    Err(e) => lock(&shared.garbage).push(format!("{who}: {e}")),
                }
                changed.send_modify(|v| *v += 1);
            }
        });
        let (file, who) = (self.log_file.clone(), actor.clone());
        let err = std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines() {
                let Ok(line) = line else { break };
                let _ = writeln!(lock(&file), "{who}: {line}");
            }
        });
        let readers = vec![out, err];
        lock(&self.workers).push(Worker { actor, child, proxies, killed: false, status: None, readers });
    }

    /// Waits until `condition` holds (checked on every history line), for at most `bound`.
    async fn wait_for(&self, bound: Duration, condition: impl Fn(&Shared) -> bool) -> bool {
        let mut changes = self.changed.subscribe();
        let deadline = tokio::time::Instant::now() + bound;
        loop {
            if condition(&self.shared) {
                return true;
            }
            match tokio::time::timeout_at(deadline, changes.changed()).await {
                Ok(Ok(())) => {}
                Ok(Err(_)) | Err(_) => return condition(&self.shared),
            }
        }
    }

    /// Live workers no fault acts on.
    fn eligible(&self) -> Vec<String> {
        let busy = lock(&self.busy);
        lock(&self.workers)
            .iter()
            .filter(|w| !w.killed && w.status.is_none() && !busy.contains(&w.actor))
            .map(|w| w.actor.clone())
            .collect()
    }

    /// Picks a target: a worker in a long hold (holding a lock for [`LONG_HOLD`] already), else
    /// one holding a lock, waiting up to 3 s for either, else any eligible worker; marks it
    /// busy.
    async fn pick(&self) -> Option<String> {
        let candidates = self.eligible();
        if candidates.is_empty() {
            return None;
        }
        let holders = |shared: &Shared, since: Duration| -> Vec<String> {
            let holding = lock(&shared.holding);
            let long = |h: &BTreeMap<String, Instant>| h.values().any(|t| t.elapsed() >= since);
            // Keyed by actor: a worker's tasks (`w3.0`, `w3.1`) hold for their process `w3`.
            let holds = |worker: &String| holding.iter().any(|(a, h)| process_of(a) == worker && long(h));
            candidates.iter().filter(|a| holds(a)).cloned().collect()
        };
        // Re-checked on every history line (the other workers write many a second).
        self.wait_for(Duration::from_secs(3), |s| !holders(s, LONG_HOLD).is_empty()).await;
        let mut pool = holders(&self.shared, LONG_HOLD);
        if pool.is_empty() {
            pool = holders(&self.shared, Duration::ZERO);
        }
        pool.retain(|a| !lock(&self.busy).contains(a));
        if pool.is_empty() {
            pool = self.eligible();
        }
        if pool.is_empty() {
            return None;
        }
        let actor = pool[usize::try_from(self.rng().below(pool.len() as u64)).unwrap()].clone();
        lock(&self.busy).insert(actor.clone());
        Some(actor)
    }

    fn done_with(&self, actor: &str) {
        lock(&self.busy).remove(actor);
    }

    /// The proxies of `actor`'s connections (one per server).
    fn proxies_of(&self, actor: &str) -> Vec<Arc<TcpProxy>> {
        lock(&self.workers).iter().find(|w| w.actor == actor).map(|w| w.proxies.clone()).expect("worker")
    }

    fn signal(&self, actor: &str, signal: &str) {
        let pid = lock(&self.workers).iter().find(|w| w.actor == actor).map(Worker::pid).expect("worker");
        let status = Command::new("kill").args([signal, &pid.to_string()]).status().expect("run kill");
        assert!(status.success(), "kill {signal} {pid} ({actor}) failed");
    }

    /// Runs one fault to its end.
    pub async fn inject(&self, fault: Fault) {
        if let Some(target) = self.target(fault).await {
            self.inject_at(fault, &target).await;
        }
    }

    /// The target of `fault`: `server`, or a worker (preferably one holding a lock), marked busy
    /// until the fault ends; `None` if no worker is available.
    pub async fn target(&self, fault: Fault) -> Option<String> {
        match fault {
            Fault::ServerRestart | Fault::ClientKillNormal | Fault::ClientKillPubsub => Some("server".to_owned()),
            // One Redlock node, drawn.
            Fault::NodeRestart | Fault::NodePause | Fault::NodeSkew => {
                let nodes = self.ports.len() as u64;
                Some(format!("node{}", self.rng().below(nodes)))
            }
            Fault::Failover | Fault::Resharding => Some("primary".to_owned()),
            Fault::Kill | Fault::Pause | Fault::Partition | Fault::Delay | Fault::SessionExpiry => self.pick().await,
        }
    }

    /// Runs `fault` on `target` (from [`target`](Self::target)) to its end.
    async fn inject_at(&self, fault: Fault, target: &str) {
        let c = &self.config;
        let kind = fault.kind();
        match fault {
            Fault::Kill => {
                let actor = target.to_owned();
                self.note(kind, &actor, true);
                {
                    let mut workers = lock(&self.workers);
                    let w = workers.iter_mut().find(|w| w.actor == actor).expect("worker");
                    let _ = w.child.kill();
                    w.status = w.child.wait().ok();
                    w.killed = true;
                }
                lock(&self.shared.holding).retain(|a, _| process_of(a) != actor);
                self.done_with(&actor);
                self.spawn_worker().await;
            }
            Fault::Pause => {
                let actor = target.to_owned();
                let pause = match c.backend {
                    Backend::Zookeeper => c.session_timeout * 2 + self.rng().between(Duration::ZERO, c.lease),
                    _ => c.lease * 2 + self.rng().between(Duration::ZERO, c.lease),
                };
                self.note(kind, &actor, true);
                self.signal(&actor, "-STOP");
                tokio::time::sleep(pause).await;
                self.signal(&actor, "-CONT");
                self.note(kind, &actor, false);
                self.done_with(&actor);
            }
            Fault::ServerRestart => {
                let down = self.rng().between(Duration::from_millis(300), Duration::from_millis(1000));
                self.note(kind, "server", true);
                lock(&self.server).kill();
                tokio::time::sleep(down).await;
                let server = self.server.clone();
                tokio::task::spawn_blocking(move || lock(&server).restart()).await.expect("restart the lock server");
                self.note(kind, "server", false);
            }
            Fault::NodeSkew => {
                let i: usize = target.trim_start_matches("node").parse().expect("a node target");
                let url = lock(&self.server).node(i).url();
                self.note(kind, target, true);
                let ahead = now_us() + 3_600_000_000;
                for name in &self.names {
                    let fence = lock_runtime::backend::redis::KeyLayout::of(name).fence;
                    if let Err(e) = raise_counter(&url, &fence, ahead).await {
                        eprintln!("nemesis: node-skew on {target}: {e}");
                    }
                }
                self.note(kind, target, false);
            }
            Fault::NodeRestart | Fault::NodePause => {
                let i: usize = target.trim_start_matches("node").parse().expect("a node target");
                self.note(kind, target, true);
                if fault == Fault::NodePause {
                    // Past a lease: its keys expire on it while it is stopped.
                    let pause = c.lease * 2 + self.rng().between(Duration::ZERO, c.lease);
                    lock(&self.server).node(i).pause();
                    tokio::time::sleep(pause).await;
                    lock(&self.server).node(i).resume();
                } else {
                    // Down for longer than a lease, so that nothing it granted is still held
                    // when it comes back empty (the Redlock docs' rule for a node that lost its
                    // data; without it two emptied nodes in a row could form a second quorum).
                    let down = c.lease + self.rng().between(Duration::from_millis(300), Duration::from_millis(1000));
                    lock(&self.server).node(i).kill();
                    tokio::time::sleep(down).await;
                    let server = self.server.clone();
                    tokio::task::spawn_blocking(move || lock(&server).node(i).restart())
                        .await
                        .expect("restart the node");
                }
                self.note(kind, target, false);
            }
            Fault::Failover | Fault::Resharding => {
                let name = self.names[usize::try_from(self.rng().below(self.names.len() as u64)).unwrap()].clone();
                let draw = self.rng().next_u64();
                self.note(kind, target, true);
                let server = self.server.clone();
                let bound = Duration::from_secs(30);
                let moved = tokio::task::spawn_blocking(move || match (fault, &mut *lock(&server)) {
                    (Fault::Failover, LockServer::Cluster(cluster)) => {
                        let old = cluster.primary_of(&name);
                        cluster.kill(old);
                        let new = cluster.wait_for_failover(old, bound);
                        cluster.restart(old);
                        cluster.wait_healthy(bound);
                        format!(
                            "{name}'s primary: node {old} killed, node {new} promoted, node {old} back as a replica"
                        )
                    }
                    (Fault::Failover, LockServer::Sentinel(setup)) => {
                        let old = setup.primary_index();
                        setup.kill(old);
                        let new = setup.wait_for_new_primary(old);
                        setup.restart(old);
                        setup.wait_for_replica(old);
                        format!("node {old} killed, node {new} promoted, node {old} back as a replica")
                    }
                    (_, LockServer::Cluster(cluster)) => {
                        let slot = crate::redis_cluster::slot_of(&name);
                        let from = cluster.slot_owner(slot);
                        let others: Vec<usize> = cluster.primaries().into_iter().filter(|&p| p != from).collect();
                        let to = others[usize::try_from(draw % others.len() as u64).unwrap()];
                        cluster.migrate_slot(slot, from, to);
                        format!("{name}'s slot {slot} moved from node {from} to node {to}")
                    }
                    (fault, other) => panic!("{fault:?} does not apply to {other:?}"),
                })
                .await
                .expect("the failover or resharding");
                eprintln!("nemesis: {kind}: {moved}");
                self.note(kind, target, false);
            }
            Fault::ClientKillNormal | Fault::ClientKillPubsub => {
                let which = if fault == Fault::ClientKillNormal { "normal" } else { "pubsub" };
                let url = match &*lock(&self.server) {
                    LockServer::Redis(s) => s.url(),
                    _ => return,
                };
                self.note(kind, "server", true);
                let killed = client_kill(&url, which).await;
                eprintln!("nemesis: CLIENT KILL TYPE {which}: {killed:?}");
            }
            Fault::Partition | Fault::SessionExpiry => {
                let actor = target.to_owned();
                let proxies = self.proxies_of(&actor);
                let length = match (fault, c.backend) {
                    // Past the client's own disconnect grace (half the session), within the session.
                    (Fault::Partition, Backend::Zookeeper) => {
                        self.rng().between(c.session_timeout * 2 / 5, c.session_timeout * 4 / 5)
                    }
                    // Past a Redis lease (the holder loses the lock, others take it), past a
                    // MySQL heartbeat and its timeout (the holder is told).
                    (Fault::Partition, _) => c.lease * 2 + self.rng().between(Duration::ZERO, c.lease),
                    // Well past the session timeout: the server expires the session.
                    _ => c.session_timeout * 2 + self.rng().between(Duration::ZERO, c.session_timeout),
                };
                self.note(kind, &actor, true);
                proxies.iter().for_each(|p| p.partition());
                tokio::time::sleep(length).await;
                proxies.iter().for_each(|p| p.heal());
                self.note(kind, &actor, false);
                self.done_with(&actor);
            }
            Fault::Delay => {
                let actor = target.to_owned();
                let proxies = self.proxies_of(&actor);
                let delay = self.rng().between(Duration::from_millis(20), Duration::from_millis(120));
                let length = self.rng().between(Duration::from_millis(1500), Duration::from_millis(2500));
                self.note(kind, &actor, true);
                proxies.iter().for_each(|p| p.set_delay(delay));
                tokio::time::sleep(length).await;
                proxies.iter().for_each(|p| p.set_delay(Duration::ZERO));
                self.note(kind, &actor, false);
                self.done_with(&actor);
            }
        }
    }

    /// Drives the schedule for `fault_time`, then lets the run end and collects it.
    pub async fn run(self, fault_time: Duration) -> Run {
        let steps_beyond = usize::try_from(fault_time.as_secs().saturating_sub(SHORT_FAULT_SECS) / 3).unwrap();
        let steps = schedule(self.config.backend, &mut self.rng(), steps_beyond);
        let faults_until = Instant::now() + fault_time;
        for (i, step) in steps.iter().enumerate() {
            // The first kinds always run (each once); later steps only while time is left.
            let first_round = i <= Fault::all(self.config.backend).len();
            if !first_round && Instant::now() + step.quiet >= faults_until {
                break;
            }
            tokio::time::sleep(step.quiet).await;
            match step.faults.as_slice() {
                [one] => self.inject(*one).await,
                [a, b] => {
                    // Both targets first, so that the two faults really overlap.
                    let (ta, tb) = (self.target(*a).await, self.target(*b).await);
                    let one = async {
                        if let Some(t) = ta {
                            self.inject_at(*a, &t).await;
                        }
                    };
                    let two = async {
                        if let Some(t) = tb {
                            self.inject_at(*b, &t).await;
                        }
                    };
                    tokio::join!(one, two);
                }
                _ => unreachable!(),
            }
        }
        self.finish().await
    }

    /// Lets the system settle for [`TAIL`], stops the workers and waits for them to exit, then
    /// assembles the history.
    async fn finish(self) -> Run {
        for w in lock(&self.workers).iter() {
            for proxy in &w.proxies {
                proxy.heal();
                proxy.set_delay(Duration::ZERO);
            }
        }
        tokio::time::sleep(TAIL).await;
        lock(&self.stdins).clear(); // EOF: stop
        let deadline = Instant::now() + EXIT_GRACE;
        let mut problems = Vec::new();
        loop {
            let running: Vec<String> = {
                let mut workers = lock(&self.workers);
                for w in workers.iter_mut().filter(|w| w.status.is_none()) {
                    w.status = w.child.try_wait().ok().flatten();
                }
                workers.iter().filter(|w| w.status.is_none()).map(|w| w.actor.clone()).collect()
            };
            if running.is_empty() {
                break;
            }
            if Instant::now() >= deadline {
                for w in lock(&self.workers).iter_mut().filter(|w| w.status.is_none()) {
                    problems.push(format!("{} still running {EXIT_GRACE:?} after the run's end: killed", w.actor));
                    let _ = w.child.kill();
                    w.status = w.child.wait().ok();
                }
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let workers = std::mem::take(&mut *lock(&self.workers));
        for mut w in workers {
            if !w.killed && !w.status.is_some_and(|s| s.success()) {
                problems.push(format!("{} exited with {:?} (see {:?})", w.actor, w.status, self.workers_log));
            }
            for reader in w.readers.drain(..) {
                let _ = reader.join();
            }
        }
        problems.extend(lock(&self.shared.garbage).drain(..));
        let mut records = std::mem::take(&mut *lock(&self.shared.records));
        records.sort_by_key(|r| r.t_us); // stable: one actor's lines keep their order
        let history_path = std::env::temp_dir().join(format!(
            "jepsen-{}-{}-{}.history",
            self.config.backend.name(),
            self.seed,
            std::process::id()
        ));
        write_history(&history_path, self.seed, self.config.backend, &records);
        eprintln!(
            "jepsen history: {} ({} records); workers' stderr: {}",
            history_path.display(),
            records.len(),
            self.workers_log.display()
        );
        Run {
            seed: self.seed,
            backend: self.config.backend,
            records,
            names: self.names,
            problems,
            history_path,
            workers_log: self.workers_log,
            root: self.root,
            server: self.server,
            witness: self.witness,
        }
    }
}

fn write_history(path: &Path, seed: u64, backend: Backend, records: &[Record]) {
    let mut text = format!("# jepsen {} seed {seed} (replay: JEPSEN_SEED={seed})\n", backend.name());
    for r in records {
        text.push_str(&r.to_string());
        text.push('\n');
    }
    std::fs::write(path, text).unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
}

/// Raises the counter `fence` on the Redis server at `url` to `ahead` (never lowers it).
async fn raise_counter(url: &str, fence: &str, ahead: u64) -> Result<(), String> {
    let client = redis::Client::open(url).map_err(|e| e.to_string())?;
    let mut conn = client.get_multiplexed_async_connection().await.map_err(|e| e.to_string())?;
    let have: Option<u64> = redis::cmd("GET").arg(fence).query_async(&mut conn).await.map_err(|e| e.to_string())?;
    if have.is_none_or(|h| h < ahead) {
        let () = redis::cmd("SET").arg(fence).arg(ahead).query_async(&mut conn).await.map_err(|e| e.to_string())?;
    }
    Ok(())
}

/// `CLIENT KILL TYPE <which>` on the server itself (not through a proxy); how many it killed.
async fn client_kill(url: &str, which: &str) -> Result<u64, String> {
    let client = redis::Client::open(url).map_err(|e| e.to_string())?;
    let mut conn = client.get_multiplexed_async_connection().await.map_err(|e| e.to_string())?;
    redis::cmd("CLIENT").arg("KILL").arg("TYPE").arg(which).query_async(&mut conn).await.map_err(|e| e.to_string())
}

/// Starts the servers and the workers, drives the faults (the seed and the profile from the
/// environment, see the [module docs](self)) and returns the finished run.
pub async fn run(config: Config) -> Run {
    let seed = seed();
    let fault_time = Duration::from_secs(fault_secs());
    let nemesis = Nemesis::start(config, seed, fault_time).await;
    nemesis.run(fault_time).await
}

/// Runs the nemesis (bounded by `extra` beyond the fault time), checks the history with the
/// checker's bounds and against GUARANTEES.md, prints the report and how to replay it, and
/// returns the finished run (for the backend's own "nothing left" checks) with its replay line.
/// Panics, failing the test, on a harness problem, a violation or a claim the run refutes.
pub async fn run_and_check(
    config: Config,
    test: &str,
    wait_slack: Duration,
    handoff_bound: Duration,
    extra: Duration,
) -> (Run, String) {
    let (backend, tasks) = (config.backend.name(), config.tasks);
    let bound = Duration::from_secs(fault_secs()) + extra;
    let run = tokio::time::timeout(bound, run(config))
        .await
        .unwrap_or_else(|_| panic!("the run took longer than {bound:?}; its workers were killed"));
    let witness = run.witness_logs().await;
    let report = super::checker::check(&super::checker::CheckInput {
        backend,
        records: &run.records,
        witness: &witness,
        wait_slack,
        handoff_bound,
    });
    eprintln!("{report}");
    crate::figure(test, &report.availability());
    eprintln!("faults by kind: {:?}", report.faults());
    eprintln!("overlaps by class: {:?}", report.overlap_classes());
    eprintln!("overlaps whose holder was never told (lost() did not fire): {:?}", report.silent_overlap_classes());
    let replay = format!("seed {} (replay: {}), history {}", run.seed, run.replay(), run.history_path.display());
    eprintln!("{test}: {replay}");
    assert!(run.problems.is_empty(), "harness problems ({replay}):\n{}", run.problems.join("\n"));
    assert!(
        report.violations().is_empty(),
        "{} violations ({replay}):\n{}",
        report.violations().len(),
        report.violations().join("\n")
    );
    // Workers of several tasks are there to exercise successions within a process.
    assert!(
        tasks == 1 || report.counts().successions_within_process > 0,
        "workers ran {tasks} tasks each, but no task was granted a name another task of its process released \
         while it waited ({replay})"
    );
    let mismatches = super::guarantees::verify(&report, include_str!("../../../GUARANTEES.md"), test);
    assert!(mismatches.is_empty(), "the run contradicts GUARANTEES.md ({replay}):\n{}", mismatches.join("\n"));
    (run, replay)
}
