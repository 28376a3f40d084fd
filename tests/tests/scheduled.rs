//! Scheduled jobs across processes: four worker processes (`scheduled_worker`), each ticking
//! the same `skip_if_locked` job every 400 ms for 12 s with its clock's view skewed by the test
//! (0, +30, +60 and −40 ms), against a real Redis and a real ZooKeeper. Every tick runs exactly
//! once, although the job (10 ms) is shorter than the skew: `hold_at_least` (250 ms) keeps the
//! name taken until every instance's timer for that tick has fired, and frees it before the
//! next tick's first one. A control job without `hold_at_least`, run by the same workers at
//! the same ticks, runs more than once in some ticks: the skew is real, and without the
//! feature the assertion on `report` would fail the same way.
//!
//! The margins are wide enough for a loaded 2-core machine: a worker's attempt may come up to
//! 150 ms after its timer (the skew's spread is 100 ms, the hold 250 ms, the tick 400 ms)
//! before a tick could run twice or not at all. (With 200 ms ticks and a 150 ms hold, a stall
//! of 150 ms while a JVM started beside the run made a tick run nowhere.) The Redis and
//! ZooKeeper runs take turns, so their eight workers do not compete for the two cores.
//!
//! No tick of the window is partial: every worker is connected before the first tick is due
//! (the epoch is set after they all print `ready`) and each runs ticks 1..=30 of its own clock,
//! so every tick is fired by all four.
#![cfg(feature = "redis")]
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

const SKEWS_MS: [i64; 4] = [0, 30, 60, -40];
const TICK_MS: i64 = 400;
const TICKS: i64 = 30; // 12 s
const HOLD_MS: i64 = 250;

/// Held by the run under way: the Redis and ZooKeeper runs take turns.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());
const JOB_MS: i64 = 10;

/// Runs the workers against `backend` at `addr`; returns each job's runs per tick.
fn run(backend: &str, addr: &str) -> (BTreeMap<u64, usize>, BTreeMap<u64, usize>) {
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let started = Instant::now();
    let prefix = lock_tests::unique("sched");
    let mut children = Vec::new();
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    let mut readers = Vec::new();
    for skew in SKEWS_MS {
        let mut child = Command::new(env!("CARGO_BIN_EXE_scheduled_worker"))
            .args([
                format!("backend={backend}"),
                format!("addr={addr}"),
                format!("prefix={prefix}:"),
                format!("skew_ms={skew}"),
                format!("tick_ms={TICK_MS}"),
                format!("ticks={TICKS}"),
                format!("hold_ms={HOLD_MS}"),
                format!("job_ms={JOB_MS}"),
            ])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("start a worker");
        let stdout = child.stdout.take().expect("stdout");
        let ready = ready_tx.clone();
        readers.push(std::thread::spawn(move || {
            let mut lines = Vec::new();
            for line in BufReader::new(stdout).lines() {
                let line = line.expect("read a worker's line");
                if line == "ready" {
                    ready.send(()).expect("the test waits");
                }
                lines.push(line);
            }
            lines
        }));
        children.push(child);
    }
    for _ in SKEWS_MS {
        ready_rx.recv_timeout(Duration::from_secs(30)).expect("every worker connects");
    }
    // The first tick is due 500 ms from now: every worker is connected and waiting.
    let epoch = SystemTime::now().duration_since(UNIX_EPOCH).expect("clock").as_millis() as i64 + 500 - TICK_MS;
    for child in &mut children {
        let mut stdin = child.stdin.take().expect("stdin");
        writeln!(stdin, "{epoch}").expect("send the epoch");
    }
    let (mut report, mut control) = (BTreeMap::new(), BTreeMap::new());
    for (child, reader) in children.iter_mut().zip(readers) {
        let lines = reader.join().expect("reader");
        let status = child.wait().expect("worker exits");
        assert!(status.success(), "a worker failed ({status}): {lines:?}");
        assert_eq!(lines.last().map(String::as_str), Some("done"), "{lines:?}");
        for line in &lines {
            let fields: Vec<&str> = line.split(' ').collect();
            match fields.as_slice() {
                ["ran", job, tick] => {
                    let runs = if *job == "report" { &mut report } else { &mut control };
                    *runs.entry(tick.parse::<u64>().expect("tick")).or_insert(0) += 1;
                }
                ["late", ..] => eprintln!("{backend}: a worker missed a tick: {line}"),
                ["error", ..] => panic!("{backend}: {line}"),
                _ => {}
            }
        }
    }
    eprintln!("{backend}: {TICKS} ticks in {:?}", started.elapsed());
    (report, control)
}

fn check(backend: &str, (report, control): (BTreeMap<u64, usize>, BTreeMap<u64, usize>)) {
    let twice: Vec<_> = report.iter().filter(|(_, runs)| **runs != 1).collect();
    let missing: Vec<u64> = (1..=TICKS as u64).filter(|t| !report.contains_key(t)).collect();
    assert!(twice.is_empty() && missing.is_empty(), "{backend}: ticks run more than once {twice:?}, never {missing:?}");
    assert_eq!(report.len(), TICKS as usize, "{backend}: {report:?}");
    // The control (no hold_at_least) shows the skew is wide enough to matter.
    let doubled = control.values().filter(|runs| **runs > 1).count();
    assert!(doubled > 0, "{backend}: without hold_at_least no tick ran twice; the skew did not matter: {control:?}");
    eprintln!("{backend}: report ran once in each of {TICKS} ticks; the control ran more than once in {doubled}");
}

#[test]
fn redis_every_tick_runs_once_across_skewed_processes() {
    let server = lock_tests::redis_server::RedisServer::start();
    check("redis", run("redis", &server.url()));
}

#[cfg(feature = "zookeeper")]
#[test]
fn zookeeper_every_tick_runs_once_across_skewed_processes() {
    let hosts = lock_tests::zk_server::shared().hosts();
    check("zookeeper", run("zookeeper", &hosts));
}
