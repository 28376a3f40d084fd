//! The two loops every contender runs: uncontended cycles on distinct names, and many tasks
//! fighting over one name.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::watch;

use crate::contenders::{Contender, Key};

/// Uncontended throughput.
#[derive(Clone, Copy, Debug)]
pub struct Cycles {
    /// Lock+release cycles per second, all tasks together.
    pub per_sec: f64,
}

impl Cycles {
    /// Nanoseconds per cycle (meaningful for one task).
    pub fn ns_per_cycle(&self) -> f64 {
        1e9 / self.per_sec
    }
}

/// `tasks` tasks, each locking and releasing its own name in a loop, for `run`.
///
/// With `Clock::Cpu` and one task whose lock never waits (in process), the figure is taken from
/// the on-CPU time of the worker thread running it (`/proc/thread-self/schedstat`) when the task
/// stayed on that thread: on a shared machine the wall clock also counts the time other
/// processes held the CPU. Otherwise wall-clock time.
pub async fn cycles<C: Contender>(c: &Arc<C>, names: &[Key], run: Duration, clock: Clock) -> Result<Cycles, String> {
    let stop = Arc::new(AtomicBool::new(false));
    let total = Arc::new(AtomicU64::new(0));
    let mut handles = Vec::with_capacity(names.len());
    let started = Instant::now();
    for key in names {
        let (c, stop, total, key) = (c.clone(), stop.clone(), total.clone(), key.clone());
        handles.push(tokio::spawn(async move {
            let (thread, cpu0) = (std::thread::current().id(), thread_cpu_ns());
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let guard = c.lock(&key).await?;
                c.unlock(guard).await?;
                n += 1;
            }
            let cpu = match (cpu0, thread_cpu_ns()) {
                (Some(a), Some(b)) if std::thread::current().id() == thread && b > a => Some(b - a),
                _ => None,
            };
            total.fetch_add(n, Ordering::Relaxed);
            Ok::<_, String>(cpu)
        }));
    }
    // A std thread closes the window: an always-ready lock never yields, and tasks that never
    // yield on every worker would starve the runtime's own timers.
    let timer = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            std::thread::sleep(run);
            stop.store(true, Ordering::Relaxed);
        })
    };
    let mut cpu = Vec::with_capacity(handles.len());
    for h in handles {
        cpu.push(h.await.map_err(|e| format!("task failed: {e}"))??);
    }
    timer.join().map_err(|_| "timer thread panicked".to_string())?;
    let wall = started.elapsed().as_secs_f64();
    let ops = total.load(Ordering::Relaxed) as f64;
    let on_cpu = match (clock, cpu.as_slice()) {
        (Clock::Cpu, [Some(ns)]) => Some(*ns as f64 / 1e9),
        _ => None,
    };
    Ok(Cycles { per_sec: ops / on_cpu.unwrap_or(wall) })
}

/// How `cycles` times a single task.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Clock {
    /// Wall-clock time (anything that waits on I/O).
    Wall,
    /// The worker thread's on-CPU time (in-process locks that never wait).
    Cpu,
}

/// Nanoseconds the current thread has run on a CPU (Linux), if readable.
fn thread_cpu_ns() -> Option<u64> {
    schedstat_ns("/proc/thread-self/schedstat")
}

/// Nanoseconds this process's threads have run on a CPU so far (Linux; threads that ended
/// are not counted, and the runtime's workers do not end), if readable.
pub fn process_cpu_ns() -> Option<u64> {
    let tasks = std::fs::read_dir("/proc/self/task").ok()?;
    Some(tasks.filter_map(|t| schedstat_ns(&t.ok()?.path().join("schedstat").to_string_lossy())).sum())
}

fn schedstat_ns(path: &str) -> Option<u64> {
    std::fs::read_to_string(path).ok()?.split_whitespace().next()?.parse().ok()
}

/// Many tasks on one name.
#[derive(Clone, Debug)]
pub struct Contended {
    /// Acquisitions that went to a different task than the previous holder, per second.
    pub handoffs_per_sec: f64,
    /// All acquisitions per second (hand-offs plus re-acquisitions by the same task).
    pub acquisitions_per_sec: f64,
    /// Release -> the next (different) task's acquisition.
    pub wait_p50: Duration,
    pub wait_p99: Duration,
    /// Fewest over most acquisitions per task.
    pub fairness: f64,
    /// Every acquisition made, including the ones completed after the window closed.
    pub acquisitions_total: u64,
}

/// `tasks` tasks lock one name in a loop for `run` (empty critical section). Each task records
/// when it got the lock and when it let it go; merged in acquisition order, a change of task is
/// a hand-off and its wait is the gap from the previous release to this acquisition.
pub async fn contended<C: Contender>(c: &Arc<C>, name: &str, tasks: usize, run: Duration) -> Result<Contended, String> {
    contended_across(std::slice::from_ref(c), name, tasks, run).await
}

/// [`contended`] with the tasks spread over several contenders in turn (each its own client,
/// as processes are).
pub async fn contended_across<C: Contender>(
    cs: &[Arc<C>],
    name: &str,
    tasks: usize,
    run: Duration,
) -> Result<Contended, String> {
    let (stop_tx, stop_rx) = watch::channel(false);
    let key = Key { idx: 0, name: name.to_string() };
    let started = Instant::now();
    let mut handles = Vec::with_capacity(tasks);
    for i in 0..tasks {
        let (c, key, mut stop) = (cs[i % cs.len()].clone(), key.clone(), stop_rx.clone());
        handles.push(tokio::spawn(async move {
            let mut log: Vec<(Instant, Instant)> = Vec::with_capacity(1 << 14);
            loop {
                if *stop.borrow() {
                    break;
                }
                // A waiter still queued when the window closes gives up (rslock would otherwise
                // loop on until it gets its turn).
                let guard = tokio::select! {
                    biased;
                    guard = c.lock(&key) => guard?,
                    _ = stop.wait_for(|s| *s) => break,
                };
                let acquired = Instant::now();
                let released = Instant::now();
                c.unlock(guard).await?;
                log.push((acquired, released));
            }
            Ok::<_, String>(log)
        }));
    }
    // Closed from a std thread, as in `cycles`.
    let timer = std::thread::spawn(move || {
        std::thread::sleep(run);
        let closed = Instant::now();
        let _ = stop_tx.send(true);
        closed
    });
    let mut events: Vec<(Instant, Instant, usize)> = Vec::new();
    let mut per_task = Vec::with_capacity(tasks);
    let mut acquisitions_total = 0u64;
    let mut logs = Vec::with_capacity(tasks);
    for h in handles {
        logs.push(h.await.map_err(|e| format!("task failed: {e}"))??);
    }
    let closed = timer.join().map_err(|_| "timer thread panicked".to_string())?;
    for (task, log) in logs.into_iter().enumerate() {
        acquisitions_total += log.len() as u64;
        let in_window: Vec<_> = log.into_iter().filter(|(a, _)| *a < closed).collect();
        per_task.push(in_window.len() as u64);
        events.extend(in_window.into_iter().map(|(a, r)| (a, r, task)));
    }
    events.sort_unstable_by_key(|e| e.0);
    let mut waits: Vec<Duration> =
        events.windows(2).filter(|w| w[0].2 != w[1].2).map(|w| w[1].0.saturating_duration_since(w[0].1)).collect();
    waits.sort_unstable();
    let window = closed.duration_since(started).as_secs_f64();
    let most = per_task.iter().copied().max().unwrap_or(0);
    let fewest = per_task.iter().copied().min().unwrap_or(0);
    Ok(Contended {
        handoffs_per_sec: waits.len() as f64 / window,
        acquisitions_per_sec: events.len() as f64 / window,
        wait_p50: percentile(&waits, 0.50),
        wait_p99: percentile(&waits, 0.99),
        fairness: if most == 0 { 0.0 } else { fewest as f64 / most as f64 },
        acquisitions_total,
    })
}

fn percentile(sorted: &[Duration], q: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let rank = ((sorted.len() as f64 * q).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1]
}

/// `n` keys named `prefix0`, `prefix1`, ...
pub fn keys(prefix: &str, n: usize) -> Vec<Key> {
    (0..n).map(|idx| Key { idx, name: format!("{prefix}{idx}") }).collect()
}
