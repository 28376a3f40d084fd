//! A worker process of the fault suite (`tests/tests/jepsen_*.rs`, driven by
//! `lock_tests::jepsen::nemesis`): on the public API only, it locks a name, read-modify-writes
//! a counter in the fenced witness store under the lock's token, and releases, in a loop, until
//! its run ends. Every event is printed to stdout as one history line (see
//! `lock_tests::jepsen::history`) and flushed at once, so a SIGKILLed worker's history up to
//! the kill survives.
//!
//! ```text
//! jepsen_worker backend=redis|redlock|redis-cluster|redis-sentinel|zookeeper|postgres|file|mysql
//!               addr=<redis url | redis urls or sentinel urls, comma-separated | zk hosts |
//!                     postgres url | lock dir | mysql url>
//!               witness=<postgres url> actor=w3
//!               names=<n1,n2,..> run_ms=<ms> wait_ms=<ms> lease=watchdog:<ms>|fixed:<ms>
//!               op_timeout_ms=<ms> long_hold_ms=<ms> [session_ms=<ms> root=</znode>] seed=<u64>
//!               [mode=lock|elect] [replicas=<n>] [kinds=<mutex|rw|sem<n>,..>] [tasks=<n>]
//! ```
//!
//! `tasks=<n>` runs `n` loops in the process, on one manager, as the actors `w3.0` .. `w3.<n-1>`
//! (`lock_tests::jepsen::history::process_of` maps them back to the process `w3`, the target of
//! the nemesis' faults): tasks of one process contending for a name take the paths a single
//! task never does (its waiters' queue, the hand-offs of a release to the next of them). Each
//! logs its own `exit` once all are done and the manager is dropped.
//!
//! `kinds=` gives each name of `names=` its kind: `mutex` (the default), `rw` (two acquisitions
//! in three take a read lock, the others a write lock) or `sem<n>` (a permit of a semaphore of
//! `n`). Only mutex and write holders read-modify-write the witness; readers and permit holders
//! just hold.
//!
//! `mode=elect` campaigns in the election of the name (`Election::campaign`, bounded by the
//! `wait`) instead of locking it: each term is logged as a grant, its leadership's `lost()` as
//! the loss, its resignation as the release, so the checker holds terms to the rules of locks.
//!
//! The run ends after `run_ms` or when stdin reaches its end (the harness closes it), whichever
//! comes first: the current operation is finished first.
//!
//! `lease=watchdog:<ms>` sets the manager's `default_lease` (renewed by the watchdog; for
//! ZooKeeper the session keeps the lock); `fixed:<ms>` gives every request that fixed lease.
//! At the end the manager is dropped and the worker logs `exit <n>`, `n` the tokio tasks still
//! alive after a bounded moment on the runtime the library runs on. The worker spawns none of
//! its own there, and the witness client runs on a runtime of its own, so `n` is 0 when the
//! library cleaned up.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use lock_runtime::{LockError, LockManager};
use lock_tests::jepsen::held::Held;
use lock_tests::jepsen::history::{Event, Mode, ReadOutcome, Record, WriteOutcome};
use lock_tests::jepsen::witness::Witness;

/// How long the worker gives the library's background tasks to stop after the manager is
/// dropped.
const CLEANUP_BOUND: Duration = Duration::from_secs(5);

fn now_us() -> u64 {
    u64::try_from(SystemTime::now().duration_since(UNIX_EPOCH).expect("clock after 1970").as_micros())
        .expect("microseconds fit")
}

/// Prints one record and flushes; a closed stdout (the harness is gone) ends the process.
fn log(actor: &str, event: Event) {
    let record = Record { t_us: now_us(), actor: actor.to_owned(), event };
    let mut out = std::io::stdout().lock();
    if writeln!(out, "{record}").and_then(|()| out.flush()).is_err() {
        std::process::exit(3);
    }
}

/// xorshift64*: a small seeded generator (the run must replay from its seed).
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Self {
        Rng(seed.max(1))
    }
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

#[derive(Debug, Clone, Copy)]
enum Lease {
    Watchdog(Duration),
    Fixed(Duration),
}

struct Args {
    backend: String,
    addr: String,
    witness: String,
    actor: String,
    names: Vec<String>,
    run: Duration,
    wait: Duration,
    lease: Lease,
    op_timeout: Duration,
    long_hold: u64,
    session: Duration,
    root: String,
    seed: u64,
    elect: bool,
    /// `RedisOptions::wait_for_replicas` with this many replicas (0: not set).
    replicas: usize,
    /// The kind of lock each name is (`kinds=`, beside `names=`; all mutexes by default).
    kinds: Vec<Kind>,
    /// Loops run by this process on its one manager (`tasks=`, 1 by default).
    tasks: usize,
}

/// The kind of lock a name is taken as.
#[derive(Clone, Copy)]
enum Kind {
    Mutex,
    /// Read-write: two acquisitions in three read, the others write.
    ReadWrite,
    /// A semaphore of this many permits.
    Semaphore(u32),
}

fn parse_args() -> Args {
    let args: BTreeMap<String, String> = std::env::args()
        .skip(1)
        .map(|a| {
            let (k, v) = a.split_once('=').unwrap_or_else(|| panic!("argument {a:?} is not key=value"));
            (k.to_owned(), v.to_owned())
        })
        .collect();
    let get = |k: &str| args.get(k).cloned().unwrap_or_else(|| panic!("missing argument {k}="));
    let ms = |k: &str| Duration::from_millis(get(k).parse().unwrap_or_else(|_| panic!("{k}= is not a number")));
    let lease = get("lease");
    let lease = match lease.split_once(':') {
        Some(("watchdog", ms)) => Lease::Watchdog(Duration::from_millis(ms.parse().expect("lease ms"))),
        Some(("fixed", ms)) => Lease::Fixed(Duration::from_millis(ms.parse().expect("lease ms"))),
        _ => panic!("lease= must be watchdog:<ms> or fixed:<ms>, not {lease}"),
    };
    Args {
        backend: get("backend"),
        addr: get("addr"),
        witness: get("witness"),
        actor: get("actor"),
        names: get("names").split(',').map(str::to_owned).collect(),
        run: ms("run_ms"),
        wait: ms("wait_ms"),
        lease,
        op_timeout: ms("op_timeout_ms"),
        long_hold: get("long_hold_ms").parse().expect("long_hold_ms"),
        session: args
            .get("session_ms")
            .map_or(Duration::from_millis(1500), |v| Duration::from_millis(v.parse().expect("session_ms"))),
        root: args.get("root").cloned().unwrap_or_else(|| "/jepsen".to_owned()),
        seed: get("seed").parse().expect("seed"),
        elect: match args.get("mode").map(String::as_str) {
            None | Some("lock") => false,
            Some("elect") => true,
            Some(other) => panic!("mode= must be lock or elect, not {other}"),
        },
        replicas: args.get("replicas").map_or(0, |v| v.parse().expect("replicas")),
        kinds: match args.get("kinds") {
            None => vec![Kind::Mutex; get("names").split(',').count()],
            Some(kinds) => kinds
                .split(',')
                .map(|k| match k {
                    "mutex" => Kind::Mutex,
                    "rw" => Kind::ReadWrite,
                    k => Kind::Semaphore(
                        k.strip_prefix("sem").and_then(|n| n.parse().ok()).unwrap_or_else(|| panic!("kind {k}?")),
                    ),
                })
                .collect(),
        },
        tasks: args.get("tasks").map_or(1, |v| v.parse().expect("tasks")),
    }
}

/// The witness client on a runtime of its own, so that its connection's tasks are not counted
/// with the library's at exit.
struct WitnessClient {
    runtime: tokio::runtime::Runtime,
    witness: Witness,
}

impl WitnessClient {
    async fn connect(url: &str) -> Self {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .expect("the witness runtime");
        let url = url.to_owned();
        let witness = runtime
            .spawn(async move { Witness::connect(&url).await })
            .await
            .expect("witness connect task")
            .unwrap_or_else(|e| panic!("witness: {e}"));
        WitnessClient { runtime, witness }
    }

    async fn read(&self, name: &str, token: u64) -> ReadOutcome {
        let (witness, name) = (self.witness.clone(), name.to_owned());
        self.runtime.spawn(async move { witness.read(&name, token).await }).await.unwrap_or(ReadOutcome::Error)
    }

    async fn write(&self, name: &str, token: u64, value: u64) -> WriteOutcome {
        let (witness, name) = (self.witness.clone(), name.to_owned());
        self.runtime.spawn(async move { witness.write(&name, token, value).await }).await.unwrap_or(WriteOutcome::Error)
    }

    fn shutdown(self) {
        drop(self.witness);
        self.runtime.shutdown_background();
    }
}

fn reason(e: &LockError) -> &'static str {
    if e.is_contended() {
        "contended"
    } else if e.is_backend() {
        "backend"
    } else if e.is_lost() {
        "lost"
    } else if e.is_invalid() {
        "invalid"
    } else {
        "other"
    }
}

async fn connect(args: &Args) -> Result<LockManager, LockError> {
    let default_lease = match args.lease {
        Lease::Watchdog(lease) => lease,
        Lease::Fixed(_) => lock_runtime::DEFAULT_LEASE,
    };
    // `addr` is the store's URL; this worker's settings go in its query.
    let ms = |d: Duration| format!("{}ms", d.as_millis());
    let mut params = vec![format!("operation_timeout={}", ms(args.op_timeout))];
    match args.backend.as_str() {
        "redis-sentinel" if args.replicas > 0 => {
            params.push(format!("wait_for_replicas={}&replica_timeout={}", args.replicas, ms(args.op_timeout / 2)));
        }
        "zookeeper" => params.push(format!("session_timeout={}&root={}", ms(args.session), args.root)),
        // The shortest lease TTL etcd takes: a killed or cut-off holder's keys go with it, and
        // `lost()` fires after 2/3 of it without a keep-alive.
        "etcd" => params.push("lease_ttl=2s".to_owned()),
        // A heartbeat well inside the lease, so that a cut-off holder is told quickly.
        "mysql" => params.push("heartbeat=250ms".to_owned()),
        _ => {}
    }
    let separator = if args.addr.contains('?') { '&' } else { '?' };
    let url = format!("{}{separator}{}", args.addr, params.join("&"));
    LockManager::builder().default_lease(default_lease).connect(url).await
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let args = parse_args();
    let actor = args.actor.as_str();
    let started = Instant::now();
    let actors: Vec<String> = match args.tasks {
        0 => panic!("tasks= must be at least 1"),
        1 => vec![actor.to_owned()],
        n => (0..n).map(|i| format!("{actor}.{i}")).collect(),
    };
    let witness = WitnessClient::connect(&args.witness).await;
    // Stdin's end is the signal to stop (read on a plain thread, not a tokio task, so that it
    // is not counted at exit).
    static STOP: AtomicBool = AtomicBool::new(false);
    std::thread::spawn(|| {
        let _ = std::io::copy(&mut std::io::stdin().lock(), &mut std::io::sink());
        STOP.store(true, Ordering::SeqCst);
    });
    let running = || started.elapsed() < args.run && !STOP.load(Ordering::SeqCst);
    // The lock server may be down (a restart in progress) when a replacement worker starts.
    let manager = loop {
        match connect(&args).await {
            Ok(manager) => break Some(manager),
            Err(e) if e.is_invalid() => panic!("{actor}: {e}"),
            Err(_) if !running() => break None,
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    };
    let Some(manager) = manager else {
        eprintln!("{actor}: could not connect to the lock server during the run");
        witness.shutdown();
        let alive_tasks = alive_after_cleanup().await;
        for actor in &actors {
            log(actor, Event::Exit { alive_tasks });
        }
        return;
    };
    let loops = actors.iter().enumerate().map(|(i, actor)| {
        // Task 0 keeps the worker's seed (a one-task run replays as before); the others mix
        // their index in, so no two tasks of the run (the nemesis numbers workers' seeds
        // consecutively) draw the same sequence.
        let rng = Rng::new(args.seed ^ (i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15));
        work(actor, &args, &manager, &witness, rng, &running)
    });
    futures_util::future::join_all(loops).await;
    witness.shutdown();
    drop(manager);
    let alive_tasks = alive_after_cleanup().await;
    for actor in &actors {
        log(actor, Event::Exit { alive_tasks });
    }
}

/// One loop of the process (its actor `actor`): lock a name, work on the witness under the
/// token, release, until the run ends.
async fn work(
    actor: &str,
    args: &Args,
    manager: &LockManager,
    witness: &WitnessClient,
    mut rng: Rng,
    running: &impl Fn() -> bool,
) {
    while running() {
        let index = usize::try_from(rng.below(args.names.len() as u64)).expect("index");
        let name = &args.names[index];
        let mode = match args.kinds.get(index).copied().unwrap_or(Kind::Mutex) {
            Kind::Mutex => Mode::Exclusive,
            Kind::ReadWrite if rng.below(3) == 0 => Mode::Write,
            Kind::ReadWrite => Mode::Read,
            Kind::Semaphore(permits) => Mode::Permit(permits),
        };
        log(actor, Event::Acquire { name: name.clone(), wait_ms: u64::try_from(args.wait.as_millis()).unwrap() });
        let held = if args.elect {
            let mut campaign = manager.election(name).campaign().wait(args.wait);
            if let Lease::Fixed(lease) = args.lease {
                campaign = campaign.lease(lease);
            }
            campaign.await.map(Held::Term)
        } else {
            let mut request = match mode {
                Mode::Exclusive => manager.lock(name),
                Mode::Write => manager.write_lock(name),
                Mode::Read => manager.read_lock(name),
                Mode::Permit(permits) => manager.semaphore(name, permits),
            }
            .wait(args.wait);
            if let Lease::Fixed(lease) = args.lease {
                request = request.lease(lease);
            }
            request.await.map(Held::Lock)
        };
        let guard = match held {
            Ok(guard) => guard,
            Err(e) => {
                log(actor, Event::Failed { name: name.clone(), reason: reason(&e).to_owned() });
                tokio::time::sleep(Duration::from_millis(rng.below(20))).await;
                continue;
            }
        };
        let token = guard.fencing_token();
        log(actor, Event::Granted { name: name.clone(), token, mode });
        // Mostly a few ms. One in ten 50..200 ms, long enough for a fault to catch the holder;
        // one in ten 300..long_hold_ms, across watchdog renewals (every third of the lease), and
        // past a fixed lease's end when long_hold_ms exceeds it.
        let hold = Duration::from_millis(match rng.below(10) {
            0 => 300 + rng.below(args.long_hold.saturating_sub(300) + 1),
            1 => 50 + rng.below(150),
            _ => 1 + rng.below(10),
        });
        let work = async {
            // Readers and permit holders share the name: they hold, and touch no fenced state.
            if matches!(mode, Mode::Read | Mode::Permit(_)) {
                tokio::time::sleep(hold).await;
                return;
            }
            let read = witness.read(name, token).await;
            log(actor, Event::Read { name: name.clone(), token, outcome: read });
            tokio::time::sleep(hold).await;
            if let ReadOutcome::Value(value) = read {
                let outcome: WriteOutcome = witness.write(name, token, value + 1).await;
                log(actor, Event::Write { name: name.clone(), token, value: value + 1, outcome });
            }
        };
        // The loss watcher: `lost()` borrows the guard, so it is polled beside the work rather
        // than spawned (a spawned task would also count as the worker's own at exit).
        tokio::pin!(work);
        let mut lost_logged = false;
        loop {
            tokio::select! {
                () = &mut work => break,
                () = guard.lost(), if !lost_logged => {
                    log(actor, Event::Lost { name: name.clone(), token });
                    lost_logged = true;
                }
            }
        }
        if !lost_logged && guard.is_lost() {
            log(actor, Event::Lost { name: name.clone(), token });
        }
        log(actor, Event::Release { name: name.clone(), token });
        let released = guard.release().await;
        log(actor, Event::Released { name: name.clone(), token, ok: released.is_ok() });
        tokio::time::sleep(Duration::from_millis(rng.below(15))).await;
    }
}

/// The tokio tasks still alive on this runtime once they stopped, or after [`CLEANUP_BOUND`].
async fn alive_after_cleanup() -> u64 {
    let runtime = tokio::runtime::Handle::current();
    let cleanup = Instant::now();
    while runtime.metrics().num_alive_tasks() > 0 && cleanup.elapsed() < CLEANUP_BOUND {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    runtime.metrics().num_alive_tasks() as u64
}
