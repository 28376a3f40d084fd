//! In-memory backend: uncontended lock+release cost next to a keyed-map baseline
//! (`DashMap<String, Arc<tokio::sync::Mutex<()>>>`), measured in the same run, plus the memory
//! left after a million distinct names; then 16 tasks on one name: read locks next to the
//! mutex, and semaphore hand-offs.
//!
//! ```text
//! cargo run --release -p examples --example bench_memory
//! ```

use std::sync::Arc;
use std::time::{Duration, Instant};

use dashmap::DashMap;
use lock_runtime::backend::memory::MemoryBackend;
use lock_runtime::LockManager;

const NAMES: u32 = 1024;

/// Operations per round (`BENCH_OPS` overrides; e.g. a small count under callgrind).
fn ops() -> u32 {
    std::env::var("BENCH_OPS").ok().and_then(|v| v.parse().ok()).unwrap_or(1_000_000)
}

fn names() -> Vec<String> {
    (0..NAMES).map(|i| format!("order:{i}")).collect()
}

async fn ours(manager: &LockManager, names: &[String]) -> Duration {
    let started = Instant::now();
    for i in 0..ops() {
        let guard = manager.lock(&names[(i % NAMES) as usize]).await.expect("uncontended");
        guard.release().await.expect("release");
    }
    started.elapsed()
}

async fn ours_drop(manager: &LockManager, names: &[String]) -> Duration {
    let started = Instant::now();
    for i in 0..ops() {
        let guard = manager.lock(&names[(i % NAMES) as usize]).await.expect("uncontended");
        drop(guard);
    }
    started.elapsed()
}

async fn keyed_map(map: &DashMap<String, Arc<tokio::sync::Mutex<()>>>, names: &[String]) -> Duration {
    let started = Instant::now();
    for i in 0..ops() {
        let name = &names[(i % NAMES) as usize];
        let mutex = map.entry(name.clone()).or_default().clone();
        let guard = mutex.lock_owned().await;
        drop(guard);
    }
    started.elapsed()
}

/// What the 16 tasks of [`contended`] take.
#[derive(Clone, Copy)]
enum Take {
    Mutex,
    Read,
    Semaphore(u32),
}

/// 16 tasks take one name `ops()` times in all, each holding it across a yield (so holders
/// can overlap where the kind allows); returns the time per operation.
async fn contended(manager: &LockManager, take: Take) -> f64 {
    const TASKS: u32 = 16;
    let per_task = ops() / TASKS;
    let started = Instant::now();
    let tasks: Vec<_> = (0..TASKS)
        .map(|_| {
            let manager = manager.clone();
            tokio::spawn(async move {
                for _ in 0..per_task {
                    let wait = Duration::from_secs(60);
                    let guard = match take {
                        Take::Mutex => manager.lock("hot").wait(wait).await,
                        Take::Read => manager.read_lock("hot").wait(wait).await,
                        Take::Semaphore(permits) => manager.semaphore("hot", permits).wait(wait).await,
                    }
                    .expect("taken");
                    tokio::task::yield_now().await;
                    guard.release().await.expect("release");
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.expect("task");
    }
    started.elapsed().as_nanos() as f64 / f64::from(per_task * TASKS)
}

fn per_op(d: Duration) -> f64 {
    d.as_nanos() as f64 / f64::from(ops())
}

fn main() {
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime");
    rt.block_on(async {
        let names = names();
        // `memory()` is the in-process fast path; a store passed to `backend` is the same
        // store through the general path, kept here to look into its table afterwards.
        let manager = LockManager::builder().memory();
        let store = MemoryBackend::new();
        let observed = LockManager::builder().backend(store.clone());
        let map = DashMap::new();
        // Warm up both, then alternate rounds so neither gets a warmer machine.
        ours(&manager, &names).await;
        keyed_map(&map, &names).await;
        let (mut a, mut b, mut c) = (Vec::new(), Vec::new(), Vec::new());
        for _ in 0..3 {
            a.push(per_op(ours(&manager, &names).await));
            c.push(per_op(ours_drop(&manager, &names).await));
            b.push(per_op(keyed_map(&map, &names).await));
        }
        let best = |v: &[f64]| v.iter().cloned().fold(f64::INFINITY, f64::min);
        let (a, b, c) = (best(&a), best(&b), best(&c));
        println!("uncontended lock+release, 1 task, best of 3 x {} ops:", ops());
        println!("  lock-runtime (memory), release().await  {a:8.1} ns/op   {:.2}x baseline", a / b);
        println!("  lock-runtime (memory), drop(guard)      {c:8.1} ns/op   {:.2}x baseline", c / b);
        println!(
            "  DashMap<String, Arc<Mutex<()>>>         {b:8.1} ns/op   1.00x (keeps {} entries forever)",
            map.len()
        );

        let (mut mutex, mut read, mut sem) = (Vec::new(), Vec::new(), Vec::new());
        for _ in 0..3 {
            mutex.push(contended(&manager, Take::Mutex).await);
            read.push(contended(&manager, Take::Read).await);
            sem.push(contended(&manager, Take::Semaphore(4)).await);
        }
        let (mutex, read, sem) = (best(&mutex), best(&read), best(&sem));
        println!("16 tasks on one name, each holding it across a yield, best of 3 x {} ops:", ops());
        println!("  lock (mutex, FIFO hand-offs)            {mutex:8.1} ns/op   1.00x");
        println!("  read_lock (readers share)               {read:8.1} ns/op   {:.2}x faster", mutex / read);
        println!("  semaphore of 4 permits (hand-offs)      {sem:8.1} ns/op   {:.2}x faster", mutex / sem);
        for take in [Take::Mutex, Take::Read, Take::Semaphore(4)] {
            contended(&observed, take).await;
        }
        assert!(store.is_empty(), "the kinds left entries behind");

        let before = store.capacity();
        for i in 0..ops() {
            observed.lock(format!("distinct:{i}")).await.expect("acquire").release().await.expect("release");
        }
        println!(
            "after {} distinct names: {} entries, capacity {} -> {} slots (baseline map would hold as many entries)",
            ops(),
            store.len(),
            before,
            store.capacity()
        );
    });
}
