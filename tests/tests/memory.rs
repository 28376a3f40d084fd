//! The conformance suite and memory-specific properties on the in-process backend.

use std::time::Duration;

use lock_runtime::backend::memory::MemoryBackend;
use lock_runtime::LockManager;

lock_tests::conformance_suite!(
    |builder: lock_runtime::LockManagerBuilder| async move { builder.memory() },
    kinds = [
        lock_runtime::backend::LockKind::Read,
        lock_runtime::backend::LockKind::Write,
        lock_runtime::backend::LockKind::Semaphore { permits: 1 }
    ],
    inspect = true
);

/// A million distinct names locked and released leave no entry and no capacity behind.
#[tokio::test]
async fn a_million_names_leave_nothing_behind() {
    let store = MemoryBackend::new();
    let m = LockManager::builder().backend(store.clone());
    for i in 0..1_000_000u32 {
        let g = m.lock(format!("n{i}")).await.expect("acquire");
        g.release().await.expect("release");
    }
    assert_eq!(store.len(), 0);
    // Hold many at once, then release: the shards give their memory back.
    let mut held = Vec::new();
    for i in 0..100_000u32 {
        held.push(m.lock(format!("h{i}")).await.expect("acquire"));
    }
    assert!(store.capacity() >= 100_000);
    drop(held);
    assert_eq!(store.len(), 0);
    assert!(store.capacity() < 10_000, "capacity left: {}", store.capacity());
}

/// Waiters are served in arrival order (fair FIFO hand-off).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_are_served_fifo() {
    let store = MemoryBackend::new();
    let m = LockManager::builder().backend(store.clone());
    let held = m.lock("fifo").await.expect("holder");
    let order = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for i in 0..8 {
        let (m, order) = (m.clone(), order.clone());
        tasks.push(tokio::spawn(async move {
            let g = m.lock("fifo").wait(Duration::from_secs(10)).await.expect("waiter");
            order.lock().expect("order").push(i);
            g.release().await.expect("release");
        }));
        // Each waiter must be queued before the next arrives: wait until the queue grows.
        while store.waiting("fifo") < i + 1 {
            tokio::task::yield_now().await;
        }
    }
    held.release().await.expect("release");
    for t in tasks {
        t.await.expect("task");
    }
    assert_eq!(*order.lock().expect("order"), (0..8).collect::<Vec<_>>());
    assert!(store.is_empty());
}

/// One manager works from several tokio runtimes (Actix-web runs one per worker thread).
#[test]
fn one_manager_across_runtimes() {
    let m = LockManager::memory();
    let rt1 = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("rt1");
    let guard = rt1.block_on(std::future::IntoFuture::into_future(m.lock("shared"))).expect("held on rt1");
    let m2 = m.clone();
    let other = std::thread::spawn(move || {
        let rt2 = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("rt2");
        rt2.block_on(async move { m2.lock("shared").wait(Duration::from_secs(10)).await.map(|g| g.fencing_token()) })
    });
    std::thread::sleep(Duration::from_millis(50));
    rt1.block_on(guard.release()).expect("release on rt1");
    let token = other.join().expect("thread").expect("acquired on rt2");
    assert!(token > 0);
}

/// An uncontended in-process lock never waits, so a loop of lock/release must still yield to
/// the other tasks of its worker (tokio's cooperative budget): on a current-thread runtime the
/// sleeping main task would otherwise never run again.
#[test]
fn a_tight_lock_loop_does_not_starve_its_worker() {
    let (done, finished) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
        rt.block_on(async {
            let m = LockManager::memory();
            let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
            let looping = tokio::spawn({
                let (m, stop) = (m.clone(), stop.clone());
                async move {
                    let mut n = 0u64;
                    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                        m.lock("hot").await.expect("uncontended").release().await.expect("release");
                        drop(m.try_lock("hot2").await.expect("try").expect("free"));
                        n += 1;
                    }
                    n
                }
            });
            tokio::task::yield_now().await; // let the loop start
            tokio::time::sleep(Duration::from_millis(10)).await;
            stop.store(true, std::sync::atomic::Ordering::Relaxed);
            let _ = done.send(looping.await.expect("loop"));
        });
    });
    let rounds = finished.recv_timeout(Duration::from_secs(20)).expect("the lock loop starved the runtime");
    assert!(rounds > 0);
}

/// The runtime's clock is tokio's: under a paused clock a fixed lease ends, a waiter behind it
/// is granted and the holder's `lost()` fires, all on virtual time (no real waiting).
#[tokio::test(start_paused = true)]
async fn fixed_leases_and_waits_run_on_a_paused_clock() {
    let m = LockManager::memory();
    let wall = std::time::Instant::now();
    // Tokio's clock runs an hour ahead of the system's from here: a lease or deadline taken on
    // the wrong clock would be over at once.
    tokio::time::sleep(Duration::from_secs(3600)).await;
    let started = tokio::time::Instant::now();
    let held = m.lock("virtual").lease(Duration::from_secs(600)).await.expect("holder");
    assert!(!held.is_lost(), "a fresh lease is not over");
    let err = m.lock("virtual").wait(Duration::from_secs(60)).await.expect_err("busy for the whole wait");
    assert!(err.is_contended(), "{err}");
    assert_eq!(started.elapsed(), Duration::from_secs(60));
    let next = m.lock("virtual").wait(Duration::from_secs(3600)).await.expect("granted when the lease ends");
    // (To tokio's timer resolution, a millisecond.)
    let waited = started.elapsed();
    assert!(waited >= Duration::from_secs(600) && waited <= Duration::from_millis(600_001), "{waited:?}");
    assert!(held.is_lost(), "the holder is told its lease ended");
    held.lost().await;
    drop(next);
    assert!(wall.elapsed() < Duration::from_secs(5), "real time spent: {:?}", wall.elapsed());
}
