//! The fault suite on the in-process backend, in virtual time (`tokio::time::pause`): worker
//! tasks lock a name, read-modify-write a counter in a fenced witness under the fencing token,
//! and release, while some holders stall past their lease (a paused process, seen from the lock's
//! side) or vanish without releasing (a crash: the guard is leaked). The checker then reads the
//! history. The schedule comes from a seed (printed; `JEPSEN_SEED=<n>` replays it), and one
//! thread with virtual time makes a run deterministic. `JEPSEN_SECS` sets the virtual length.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use lock_runtime::backend::memory::MemoryBackend;
use lock_runtime::LockManager;
use lock_tests::jepsen::checker::{check, CheckInput};
use lock_tests::jepsen::guarantees;
use lock_tests::jepsen::held::Held;
use lock_tests::jepsen::history::{Event, Mode, ReadOutcome, Record, WriteOutcome};
use tokio::time::Instant;

const NAMES: usize = 3;
const WORKERS: usize = 8;
const LEASE: Duration = Duration::from_millis(500);
const WAIT: Duration = Duration::from_millis(1500);

/// A fenced store, as the process suites run on a second Redis: it refuses any read or write
/// under a token below the highest it has seen for that name.
#[derive(Default)]
struct Witness {
    names: Mutex<HashMap<String, Register>>,
}

#[derive(Default)]
struct Register {
    highest: u64,
    value: u64,
    log: Vec<(u64, u64)>,
}

impl Witness {
    fn read(&self, name: &str, token: u64) -> ReadOutcome {
        let mut names = self.names.lock().unwrap();
        let r = names.entry(name.to_owned()).or_default();
        if token < r.highest {
            return ReadOutcome::Refused;
        }
        r.highest = token;
        ReadOutcome::Value(r.value)
    }

    fn write(&self, name: &str, token: u64, value: u64) -> WriteOutcome {
        let mut names = self.names.lock().unwrap();
        let r = names.entry(name.to_owned()).or_default();
        if token < r.highest {
            return WriteOutcome::Refused;
        }
        r.highest = token;
        r.value = value;
        r.log.push((token, value));
        WriteOutcome::Accepted
    }

    fn logs(&self) -> BTreeMap<String, Vec<(u64, u64)>> {
        self.names.lock().unwrap().iter().map(|(k, r)| (k.clone(), r.log.clone())).collect()
    }
}

/// xorshift64*: the schedule's only source of randomness.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

struct Run {
    manager: LockManager,
    /// Workers campaign in elections of the names (a term per grant) instead of locking them.
    elect: bool,
    witness: Witness,
    history: Mutex<Vec<Record>>,
    start: Instant,
    end: Instant,
}

impl Run {
    fn log(&self, actor: &str, event: Event) {
        let t_us = u64::try_from(self.start.elapsed().as_micros()).unwrap_or(u64::MAX);
        self.history.lock().unwrap().push(Record { t_us, actor: actor.to_owned(), event });
    }
}

enum Fate {
    /// Releases as it should.
    Normal,
    /// Stalls past its lease before writing (a paused process), then carries on.
    Stall,
    /// Vanishes while holding: the guard is leaked, nothing is released.
    Crash,
}

/// One worker until the end of the run, or until it "crashes" (returns false).
async fn worker(run: Arc<Run>, actor: String, mut rng: Rng) -> bool {
    while Instant::now() < run.end {
        let name = format!("jepsen:{}", rng.below(NAMES as u64));
        run.log(&actor, Event::Acquire { name: name.clone(), wait_ms: WAIT.as_millis() as u64 });
        let held = if run.elect {
            run.manager.election(&name).lease(LEASE).campaign().wait(WAIT).await.map(Held::Term)
        } else {
            run.manager.lock(&name).wait(WAIT).lease(LEASE).await.map(Held::Lock)
        };
        let guard = match held {
            Ok(guard) => guard,
            Err(e) => {
                let reason = if e.is_contended() {
                    "contended"
                } else if e.is_backend() {
                    "backend"
                } else {
                    "other"
                };
                run.log(&actor, Event::Failed { name: name.clone(), reason: reason.into() });
                continue;
            }
        };
        let token = guard.fencing_token();
        run.log(&actor, Event::Granted { name: name.clone(), token, mode: Mode::Exclusive });
        let fate = match rng.below(100) {
            0..=4 => Fate::Stall,
            5..=6 => Fate::Crash,
            _ => Fate::Normal,
        };
        let hold = Duration::from_millis(rng.below(20));
        let work = async {
            let read = run.witness.read(&name, token);
            run.log(&actor, Event::Read { name: name.clone(), token, outcome: read });
            tokio::time::sleep(hold).await;
            if let Fate::Stall = fate {
                let fault = |start| Event::Fault { kind: "pause".into(), target: actor.clone(), start };
                run.log("nemesis", fault(true));
                tokio::time::sleep(LEASE * 2).await;
                run.log("nemesis", fault(false));
            }
            if let ReadOutcome::Value(v) = read {
                let outcome = run.witness.write(&name, token, v + 1);
                run.log(&actor, Event::Write { name: name.clone(), token, value: v + 1, outcome });
            }
        };
        let mut work = std::pin::pin!(work);
        tokio::select! {
            () = &mut work => {}
            () = guard.lost() => {
                run.log(&actor, Event::Lost { name: name.clone(), token });
                work.await;
            }
        }
        if let Fate::Crash = fate {
            run.log("nemesis", Event::Fault { kind: "kill".into(), target: actor.clone(), start: true });
            std::mem::forget(guard);
            return false;
        }
        run.log(&actor, Event::Release { name: name.clone(), token });
        let ok = guard.release().await.is_ok();
        run.log(&actor, Event::Released { name: name.clone(), token, ok });
        tokio::time::sleep(Duration::from_millis(rng.below(10))).await;
    }
    run.log(&actor, Event::Exit { alive_tasks: 0 });
    true
}

#[tokio::test(start_paused = true)]
async fn jepsen_memory() {
    run_memory(false, "jepsen_memory").await;
}

/// The same with leader elections: workers campaign (`Election::campaign`, a fixed term
/// lease), and each term is held to the rules of a lock.
#[tokio::test(start_paused = true)]
async fn jepsen_memory_elections() {
    run_memory(true, "jepsen_memory_elections").await;
}

async fn run_memory(elect: bool, test: &str) {
    let seed: u64 = match std::env::var("JEPSEN_SEED") {
        Ok(s) => s.parse().expect("JEPSEN_SEED is a number"),
        Err(_) => std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as u64 | 1,
    };
    let secs: u64 = std::env::var("JEPSEN_SECS").ok().and_then(|s| s.parse().ok()).unwrap_or(300);
    eprintln!("jepsen seed: {seed} (replay: JEPSEN_SEED={seed})");
    let store = MemoryBackend::new();
    let start = Instant::now();
    let run = Arc::new(Run {
        manager: LockManager::builder().backend(store.clone()),
        elect,
        witness: Witness::default(),
        history: Mutex::new(Vec::new()),
        start,
        end: start + Duration::from_secs(secs),
    });
    let mut rng = Rng(seed);
    let mut tasks = tokio::task::JoinSet::new();
    let mut next_actor = 0;
    for _ in 0..WORKERS {
        tasks.spawn(worker(run.clone(), format!("w{next_actor}"), Rng(rng.next() | 1)));
        next_actor += 1;
    }
    // A crashed worker is replaced by a new one (a new process, a new actor id).
    while let Some(finished) = tasks.join_next().await {
        if !finished.expect("worker task") && Instant::now() < run.end {
            tasks.spawn(worker(run.clone(), format!("w{next_actor}"), Rng(rng.next() | 1)));
            next_actor += 1;
        }
    }
    // Leaked guards' leases run out; every name is then free and nothing is left in the store.
    tokio::time::sleep(LEASE * 2).await;
    let records = run.history.lock().unwrap().clone();
    let witness = run.witness.logs();
    let report = check(&CheckInput {
        backend: "memory",
        records: &records,
        witness: &witness,
        // Virtual time: an acquisition ends exactly at its deadline, and a hand-off is
        // immediate; a millisecond covers the rounding of timers.
        wait_slack: Duration::from_millis(1),
        handoff_bound: Duration::from_millis(1),
    });
    let path = std::env::temp_dir().join(format!("{test}-{seed}.history"));
    let text: String = records.iter().map(|r| format!("{r}\n")).collect();
    std::fs::write(&path, text).expect("write the history");
    eprintln!("jepsen seed: {seed}; history: {}\n{report}", path.display());
    lock_tests::figure(test, &report.availability());
    for overlap in report.overlaps() {
        eprintln!("{overlap:?}");
    }
    assert!(report.violations().is_empty(), "seed {seed}: {:#?}", report.violations());
    let doc = include_str!("../../GUARANTEES.md");
    let mismatches = guarantees::verify(&report, doc, test);
    assert!(mismatches.is_empty(), "GUARANTEES.md vs this run (seed {seed}): {mismatches:#?}");
    for name in witness.keys() {
        // A crashed (leaked) holder's entry stays until its name is next used, which reaps it:
        // use each name once.
        drop(run.manager.try_lock(name).await.expect("try_lock"));
    }
    assert_eq!(store.len(), 0, "entries left in the store");
    assert_eq!(tokio::runtime::Handle::current().metrics().num_alive_tasks(), 0, "tasks left");
}
