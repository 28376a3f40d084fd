//! Clock faults of a client, on a partitionable three-member ensemble (etcd, ZooKeeper): a
//! holder in a process of its own (`hold_worker`), in a client namespace, under libfaketime
//! (Debian's `faketime`, preloaded), so that its clocks, and only its clocks, are wrong.
//!
//! - [`the_wall_clock_of_a_holder_jumps`]: its wall clock is stepped an hour forward, then two
//!   hours back (an NTP step, a VM restored), its monotonic clock untouched: it keeps its lock
//!   (no `lost()`, another client is refused the name throughout, for more than a lease or
//!   session after each step), and the next holder's token is above its own.
//! - [`a_slow_holder_clock_is_told_before_the_majority_grants`]: every clock of the holder runs
//!   at 9/10 of real time (monotonic included: its timers fire late) while it is cut from every
//!   member: it is still told `lost()` before a client on the majority side is granted its
//!   lock (the margins: etcd's `lost()` comes 2/3 of the TTL after the last answered keep-alive,
//!   ZooKeeper's 3/4 of the session timeout after the last confirmed sync, both counted on the
//!   holder's clock, so a clock slower than 2/3 (etcd) or 3/4 (ZooKeeper) of real time would
//!   be told after; the figure is reported).
//!
//! Server members' clocks: an etcd member is a Go program, which reads its clocks through the
//! vDSO and its own system calls, never the C library, so libfaketime cannot reach it (and etcd
//! counts leases on the leader's monotonic clock, reset at each election). ZooKeeper counts
//! sessions on the leader's `System.nanoTime`, also reset at each election.

#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)]

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use lock_runtime::LockManager;

use crate::ensemble::Ensemble;
use crate::netns::End;

/// Debian's libfaketime (package `faketime`), the multi-threaded build.
pub const LIBFAKETIME: &str = "/usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1";

/// A `hold_worker` process: its lines as they arrive, with the instant each was read.
struct Holder {
    child: Child,
    lines: tokio::sync::mpsc::UnboundedReceiver<(String, Instant)>,
    dir: PathBuf,
}

impl Holder {
    /// Starts `worker hold-until-lost` on `url` for `name` in client `k`'s namespace, with
    /// libfaketime given `env` (none: the true clocks).
    fn start(
        worker: &str,
        ensemble: &impl Ensemble,
        k: usize,
        url: &str,
        name: &str,
        env: &[(&str, String)],
    ) -> Holder {
        assert!(Path::new(LIBFAKETIME).exists(), "{LIBFAKETIME} is missing: install `faketime` (scripts/test does)");
        let net = ensemble.net().expect("a partitionable ensemble");
        let dir = crate::server_process::ServerProcess::temp_dir("clock");
        let mut command = net.command(End::Client(k), worker);
        command.args([url, "hold-until-lost", name]);
        if !env.is_empty() {
            command.env("LD_PRELOAD", LIBFAKETIME);
        }
        for (key, value) in env {
            command.env(key, value);
        }
        let mut child = command
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start the holder process");
        let stdout = child.stdout.take().expect("its stdout");
        let (tx, lines) = tokio::sync::mpsc::unbounded_channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                let _ = tx.send((line, Instant::now()));
            }
        });
        Holder { child, lines, dir }
    }

    /// The next line, within `within`.
    async fn line(&mut self, within: Duration) -> (String, Instant) {
        tokio::time::timeout(within, self.lines.recv())
            .await
            .unwrap_or_else(|_| panic!("the holder process said nothing within {within:?}"))
            .unwrap_or_else(|| panic!("the holder process ended: {:?}", self.child.try_wait()))
    }

    /// Its token, from its first line (`held <token>`).
    async fn held(&mut self) -> u64 {
        let (line, _) = self.line(Duration::from_secs(60)).await;
        let token = line.strip_prefix("held ").unwrap_or_else(|| panic!("expected `held <token>`, got {line:?}"));
        token.parse().expect("a token")
    }

    /// Whether it said something (`lost`) since.
    fn said(&mut self) -> Option<String> {
        self.lines.try_recv().ok().map(|(line, _)| line)
    }

    /// Closes its stdin: it releases and says so.
    async fn release(&mut self) -> String {
        drop(self.child.stdin.take());
        self.line(Duration::from_secs(30)).await.0
    }
}

impl Drop for Holder {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// How long a holder would be told `lost()` after an outage, at the latest: more than etcd's
/// lease TTL and ZooKeeper's session timeout by default (6 s each here).
const LEASE: Duration = Duration::from_secs(7);

/// The wall clock of a holder stepped forward and back (see the module's docs).
pub async fn the_wall_clock_of_a_holder_jumps(ensemble: impl Ensemble, worker: &str) {
    let name = crate::unique("clock-jump");
    let clock_dir = crate::server_process::ServerProcess::temp_dir("clock-file");
    let clock = clock_dir.join("offset");
    std::fs::write(&clock, "+0\n").expect("write the clock offset");
    let env = [
        ("FAKETIME_TIMESTAMP_FILE", clock.display().to_string()),
        ("FAKETIME_NO_CACHE", "1".to_owned()),
        ("FAKETIME_DONT_FAKE_MONOTONIC", "1".to_owned()),
    ];
    let url = ensemble.url_with_first(ensemble.leader());
    let mut holder = Holder::start(worker, &ensemble, 0, &url, &name, &env);
    let token = holder.held().await;
    let other = LockManager::connect(&ensemble.url_with_first(0)).await.expect("connect the other client");
    for step in ["+3600", "-3600"] {
        let mut file = std::fs::File::create(&clock).expect("step the clock");
        writeln!(file, "{step}").expect("write the step");
        let stepped = Instant::now();
        while stepped.elapsed() < LEASE {
            let taken = other.try_lock(&name).await.unwrap_or_else(|e| panic!("wall clock stepped {step}: {e}"));
            assert!(taken.is_none(), "wall clock stepped {step}: another client took the holder's lock");
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        assert_eq!(holder.said(), None, "wall clock stepped {step}: the holder said something");
    }
    assert_eq!(holder.release().await, "released");
    let next = other.lock(&name).await.expect("the next holder");
    assert!(next.fencing_token() > token, "{} after {token}", next.fencing_token());
    next.release().await.expect("release");
    let _ = std::fs::remove_dir_all(&clock_dir);
    crate::figure("clock, a holder's wall clock stepped +1 h then -1 h", "lock kept, 0 operations failed");
}

/// A holder whose clocks run at 9/10 of real time, cut from every member (see the module's
/// docs).
pub async fn a_slow_holder_clock_is_told_before_the_majority_grants(ensemble: impl Ensemble, worker: &str) {
    let env = [("FAKETIME", "+0 x0.9".to_owned())];
    a_holder_cut_off_is_told_before_the_majority_grants(ensemble, worker, &env, "a holder's clocks at 9/10 speed")
        .await;
}

/// A holder on a true clock cut from every member of an ensemble whose members' clocks run
/// fast ([`ZkEnsemble::start_partitionable_at_speed`](crate::zk_ensemble::ZkEnsemble)): the
/// leader ends the session early by its clock, and the holder must still be told first.
pub async fn a_holder_cut_off_from_fast_members_is_told_before_the_majority_grants(
    ensemble: impl Ensemble,
    worker: &str,
    speed: f64,
) {
    a_holder_cut_off_is_told_before_the_majority_grants(
        ensemble,
        worker,
        &[],
        &format!("the members' clocks at {speed}x speed"),
    )
    .await;
}

/// A holder process (its libfaketime settings `env`) cut from every member: told `lost()`
/// before a client on the majority side is granted its lock; reported as `label`.
async fn a_holder_cut_off_is_told_before_the_majority_grants(
    ensemble: impl Ensemble,
    worker: &str,
    env: &[(&str, String)],
    label: &str,
) {
    let net = ensemble.net().expect("a partitionable ensemble");
    let name = crate::unique("clock-cut-off");
    let url = ensemble.url_with_first(ensemble.leader());
    let mut holder = Holder::start(worker, &ensemble, 0, &url, &name, env);
    holder.held().await;
    let other = LockManager::connect(&ensemble.url_with_first(0)).await.expect("connect the other client");
    let queued = {
        let (other, name) = (other.clone(), name.clone());
        tokio::spawn(async move {
            let guard = other.lock(&name).wait(Duration::from_secs(120)).await;
            (guard, Instant::now())
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await; // the waiter queues
    let cut_at = Instant::now();
    net.split(&[End::Client(0)]);
    let (granted, granted_at) = tokio::time::timeout(Duration::from_secs(120), queued).await.expect("granted").unwrap();
    let granted = granted.unwrap_or_else(|e| panic!("the other client's wait failed: {e}"));
    let (said, lost_at) = holder.line(Duration::from_secs(10)).await;
    assert_eq!(said, "lost");
    assert!(
        lost_at < granted_at,
        "the other client was granted {} ms after the cut, before the slow holder was told lost() ({} ms)",
        granted_at.duration_since(cut_at).as_millis(),
        lost_at.duration_since(cut_at).as_millis()
    );
    granted.release().await.expect("release");
    net.heal();
    crate::figure(
        &format!("clock, {label}, the holder cut off"),
        &format!(
            "told lost() {} ms after the cut, the other side granted {} ms after it ({} ms later)",
            lost_at.duration_since(cut_at).as_millis(),
            granted_at.duration_since(cut_at).as_millis(),
            granted_at.duration_since(lost_at).as_millis()
        ),
    );
}
