//! Contention under ensemble faults: two client processes' worth of contenders (two client
//! namespaces, three tasks each, one manager per client) take one name in a loop on a
//! partitionable three-member ensemble, while a nemesis goes through the minority faults one
//! after another (a follower killed, the leader killed, the leader stopped, the leader
//! isolated, a follower isolated, a client cut from its member), each held for a while, then
//! healed.
//!
//! Checked, over the whole run: **no overlap** (a grant while another contender holds the
//! name and has not been told `lost()`), **no token regression** (each grant's fencing token
//! above every earlier one), and **no failed operation outside the fault windows** (a window
//! runs from the fault until the ensemble serves again after healing, plus 2 s); the failures
//! inside the windows, the grant rate inside and outside them and the recovery time of each
//! fault (from the fault to the next grant) are reported (`figure`).
//!
//! The short profile (CI) holds each fault 3 s; `ENSEMBLE_FAULT_SECS=<n>` holds each for `n`
//! seconds and `ENSEMBLE_FAULT_ROUNDS=<n>` goes through them `n` times.

#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)]

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::ensemble::Ensemble;
use crate::netns::{Client, End};

/// A fault of the nemesis.
#[derive(Debug, Clone, Copy)]
enum Fault {
    FollowerKilled,
    LeaderKilled,
    LeaderStopped,
    LeaderIsolated,
    FollowerIsolated,
    ClientCut,
}

impl Fault {
    const ALL: [Fault; 6] = [
        Fault::FollowerKilled,
        Fault::LeaderKilled,
        Fault::LeaderStopped,
        Fault::LeaderIsolated,
        Fault::FollowerIsolated,
        Fault::ClientCut,
    ];

    fn label(self) -> &'static str {
        match self {
            Fault::FollowerKilled => "follower killed",
            Fault::LeaderKilled => "leader killed",
            Fault::LeaderStopped => "leader stopped",
            Fault::LeaderIsolated => "leader isolated",
            Fault::FollowerIsolated => "follower isolated",
            Fault::ClientCut => "client cut from its member",
        }
    }
}

#[derive(Default)]
struct Record {
    /// The contender holding the name now: (task, token, told lost).
    holder: Option<(usize, u64, bool)>,
    max_token: u64,
    grants: Vec<Instant>,
    overlaps: Vec<String>,
    regressions: Vec<String>,
    /// Failed operations: (started, ended, what).
    failures: Vec<(Instant, Instant, String)>,
    lost: usize,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// One contender: lock, hold a few ms (told `lost()` meanwhile: recorded), release, again.
async fn contend(
    task: usize,
    manager: lock_runtime::LockManager,
    name: String,
    record: Arc<Mutex<Record>>,
    stop: Arc<AtomicBool>,
) {
    while !stop.load(Ordering::Relaxed) {
        let started = Instant::now();
        let guard = match manager.lock(&name).wait(Duration::from_secs(10)).await {
            Ok(guard) => guard,
            Err(e) => {
                lock(&record).failures.push((started, Instant::now(), format!("task {task}: lock: {e}")));
                continue;
            }
        };
        let token = guard.fencing_token();
        {
            let mut r = lock(&record);
            if let Some((other, other_token, false)) = r.holder {
                r.overlaps
                    .push(format!("task {task} granted token {token} while task {other} held token {other_token}"));
            }
            if token <= r.max_token {
                let max = r.max_token;
                r.regressions.push(format!("task {task} granted token {token} after token {max}"));
            }
            r.max_token = r.max_token.max(token);
            r.holder = Some((task, token, false));
            r.grants.push(Instant::now());
        }
        let lost = tokio::select! {
            () = guard.lost() => true,
            () = tokio::time::sleep(Duration::from_millis(5)) => false,
        };
        {
            let mut r = lock(&record);
            if lost {
                r.lost += 1;
            }
            if r.holder.is_some_and(|(t, ..)| t == task) {
                r.holder = None;
            }
        }
        let released_at = Instant::now();
        if let Err(e) = guard.release().await {
            if !e.is_lost() {
                lock(&record).failures.push((released_at, Instant::now(), format!("task {task}: release: {e}")));
            }
        }
    }
}

/// The run (see the module's docs).
pub async fn contention_under_faults(mut ensemble: impl Ensemble) {
    assert!(ensemble.net().expect("a partitionable ensemble").members() >= 3, "three members");
    let hold = Duration::from_secs(env_u64("ENSEMBLE_FAULT_SECS", 3));
    let rounds = env_u64("ENSEMBLE_FAULT_ROUNDS", 1);
    let name = crate::unique("contended");
    let record = Arc::new(Mutex::new(Record::default()));
    let stop = Arc::new(AtomicBool::new(false));
    let leader = ensemble.leader();
    let clients: Vec<Client> = (0..2).map(|k| ensemble.net().unwrap().client(k)).collect();
    let mut tasks = Vec::new();
    let mut kind = "";
    for (k, client) in clients.iter().enumerate() {
        // Client 0 talks to the leader first, client 1 to a follower.
        let manager = ensemble.manager_on((leader + k) % ensemble.size(), Some(client)).await;
        kind = manager.backend_name();
        for t in 0..3 {
            let (manager, name, record, stop) = (manager.clone(), name.clone(), record.clone(), stop.clone());
            tasks.push(client.spawn(contend(k * 3 + t, manager, name, record, stop)));
        }
    }
    let started = Instant::now();
    let mut windows: Vec<(Fault, Instant, Instant)> = Vec::new();
    for _ in 0..rounds {
        for fault in Fault::ALL {
            tokio::time::sleep(Duration::from_secs(2)).await; // a quiet stretch before each fault
            let leader = ensemble.leader();
            let follower = (leader + 1) % ensemble.size();
            let begun = Instant::now();
            match fault {
                Fault::FollowerKilled => ensemble.kill(follower),
                Fault::LeaderKilled => ensemble.kill(leader),
                Fault::LeaderStopped => ensemble.pause(leader),
                Fault::LeaderIsolated => ensemble.net().unwrap().split(&[End::Member(leader)]),
                Fault::FollowerIsolated => ensemble.net().unwrap().split(&[End::Member(follower)]),
                Fault::ClientCut => ensemble.net().unwrap().cut(End::Client(0), End::Member(leader)),
            }
            tokio::time::sleep(hold).await;
            match fault {
                Fault::FollowerKilled => ensemble.restart(follower),
                Fault::LeaderKilled => ensemble.restart(leader),
                Fault::LeaderStopped => ensemble.resume(leader),
                _ => ensemble.net().unwrap().heal(),
            }
            ensemble.wait_serving();
            windows.push((fault, begun, Instant::now() + Duration::from_secs(2)));
        }
    }
    tokio::time::sleep(Duration::from_secs(3)).await; // a quiet stretch at the end
    stop.store(true, Ordering::Relaxed);
    for task in tasks {
        tokio::time::timeout(Duration::from_secs(60), task).await.expect("a contender ends").expect("contender");
    }
    let ended = Instant::now();
    let r = lock(&record);
    let in_window = |at: Instant| windows.iter().any(|&(_, from, to)| at >= from && at <= to);
    let outside: Vec<&String> =
        r.failures.iter().filter(|(s, e, _)| !in_window(*s) && !in_window(*e)).map(|(.., what)| what).collect();
    let inside = r.failures.len() - outside.len();
    let window_secs: f64 = windows.iter().map(|&(_, from, to)| to.duration_since(from).as_secs_f64()).sum();
    let total_secs = ended.duration_since(started).as_secs_f64();
    let grants_inside = r.grants.iter().filter(|&&g| in_window(g)).count();
    let grants_outside = r.grants.len() - grants_inside;
    let recoveries: Vec<String> = windows
        .iter()
        .map(|&(fault, from, _)| {
            let next = r.grants.iter().find(|&&g| g >= from).map(|g| g.duration_since(from).as_millis());
            format!("{} {}", fault.label(), next.map_or("never".to_owned(), |ms| format!("{ms} ms")))
        })
        .collect();
    crate::figure(
        &format!("{kind}, contention under ensemble faults"),
        &format!(
            "{} grants, {} overlaps, {} token regressions, {} failed operations outside the fault windows, {inside} \
             inside, {} told lost(); grants/s {:.0} outside the windows, {:.0} inside; recovery: {}",
            r.grants.len(),
            r.overlaps.len(),
            r.regressions.len(),
            outside.len(),
            r.lost,
            grants_outside as f64 / (total_secs - window_secs).max(1.0),
            grants_inside as f64 / window_secs.max(1.0),
            recoveries.join(", ")
        ),
    );
    assert!(r.overlaps.is_empty(), "overlaps: {:?}", r.overlaps);
    assert!(r.regressions.is_empty(), "token regressions: {:?}", r.regressions);
    assert!(outside.is_empty(), "operations failed outside the fault windows: {outside:?}");
    assert!(grants_outside > 0 && grants_inside > 0, "the contenders made no progress");
}
