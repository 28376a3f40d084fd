//! Lock kinds on the in-process backend: fair FIFO across readers and writers, entries removed
//! when free, and the runtime's refusal of kinds a backend does not offer.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use lock_runtime::backend::memory::MemoryBackend;
use lock_runtime::backend::{Acquire, Acquisition, LockBackend, LockKind};
use lock_runtime::{LockManager, LostSignal};

/// Readers and writers are served in arrival order: a writer queued behind a reader is served
/// before a reader that came after it, and consecutive readers at the head are granted together.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readers_and_writers_are_served_fifo() {
    let store = MemoryBackend::new();
    let m = LockManager::builder().backend(store.clone());
    let first = m.read_lock("fifo").await.expect("first reader");
    let order = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    // W1, R2, R3, W4 queue in that order behind the first reader.
    for (i, write) in [(1, true), (2, false), (3, false), (4, true)] {
        let (m, order) = (m.clone(), order.clone());
        tasks.push(tokio::spawn(async move {
            let request = if write { m.write_lock("fifo") } else { m.read_lock("fifo") };
            let g = request.wait(Duration::from_secs(10)).await.expect("waiter");
            order.lock().expect("order").push((i, "in"));
            tokio::time::sleep(Duration::from_millis(50)).await;
            order.lock().expect("order").push((i, "out"));
            g.release().await.expect("release");
        }));
        // The memory backend has no per-kind `waiting`; give each waiter time to queue.
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    first.release().await.expect("release");
    for t in tasks {
        t.await.expect("task");
    }
    let order = order.lock().expect("order").clone();
    // W1 alone; then R2 and R3 together; then W4 alone.
    assert_eq!(&order[..2], &[(1, "in"), (1, "out")], "{order:?}");
    // Granted by one hand-off, R2 and R3 run at once: which of the two is scheduled first (and
    // so records its entry first) is the runtime's choice, not the lock's.
    let mut together = order[2..4].to_vec();
    together.sort();
    assert_eq!(together, [(2, "in"), (3, "in")], "consecutive readers together: {order:?}");
    assert_eq!(&order[6..], &[(4, "in"), (4, "out")], "{order:?}");
    assert!(store.is_empty(), "entries removed when free");
}

/// `hold_at_least` on `lock_all` keeps every name taken after an early release.
#[tokio::test]
async fn lock_all_holds_every_name_at_least_as_long_as_asked() {
    let m = LockManager::memory();
    let all = m.lock_all(["held:1", "held:2"]).hold_at_least(Duration::from_secs(30)).await.expect("both");
    all.release().await.expect("release");
    for name in ["held:1", "held:2"] {
        assert!(m.try_lock(name).await.expect("try").is_none(), "{name} is still taken");
    }
}

/// Read-write locks and semaphores leave no entry behind: released, timed out, or cancelled.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kinds_leave_nothing_behind() {
    let store = MemoryBackend::new();
    let m = LockManager::builder().backend(store.clone());
    for i in 0..1000 {
        let r = m.read_lock(format!("r{i}")).await.expect("read");
        let s = m.semaphore(format!("s{i}"), 3).await.expect("permit");
        r.release().await.expect("release");
        s.release().await.expect("release");
    }
    assert!(store.is_empty(), "{} entries left", store.len());
    let w = m.write_lock("busy").await.expect("writer");
    let full = m.semaphore("full", 1).await.expect("permit");
    assert!(m.read_lock("busy").wait(Duration::from_millis(50)).await.expect_err("held").is_contended());
    let cancelled =
        tokio::time::timeout(Duration::from_millis(50), m.semaphore("full", 1).wait(Duration::from_secs(9)));
    assert!(cancelled.await.is_err(), "waits");
    assert_eq!(store.len(), 2, "only the held names");
    w.release().await.expect("release");
    full.release().await.expect("release");
    assert!(store.is_empty(), "{} entries left", store.len());
}

/// A backend that offers exclusive locks only (the default of `supports`).
struct MutexOnly(MemoryBackend);

impl LockBackend for MutexOnly {
    fn name(&self) -> &'static str {
        "mutex-only"
    }

    fn begin(&self, req: Acquire, lost: LostSignal) -> Box<dyn Acquisition> {
        assert_eq!(req.kind, LockKind::Exclusive, "the runtime began a kind the backend does not offer");
        self.0.begin(req, lost)
    }
}

/// The runtime refuses a kind the backend does not offer, before beginning it, with an
/// `is_invalid()` error naming the backend and the kind; `lock_all` still works.
#[tokio::test]
async fn unsupported_kinds_are_refused_by_the_runtime() {
    let m = LockManager::builder().backend(MutexOnly(MemoryBackend::new()));
    assert!(!m.supports(LockKind::Read));
    let err = m.read_lock("catalog").await.expect_err("refused");
    assert!(err.is_invalid(), "{err}");
    assert!(err.to_string().contains("mutex-only") && err.to_string().contains("read lock"), "{err}");
    assert!(m.write_lock("catalog").await.expect_err("refused").is_invalid());
    assert!(m.semaphore("exports", 4).await.expect_err("refused").is_invalid());
    assert!(m.try_read_lock("catalog").await.expect_err("refused").is_invalid());
    let all = m.lock_all(["acct:2", "acct:1"]).await.expect("lock_all on any backend");
    assert_eq!(all.keys().collect::<Vec<_>>(), ["acct:1", "acct:2"]);
    all.release().await.expect("release");
}

/// Guards, requests' futures and errors are `Send`; guards are `Sync`.
#[test]
fn kinds_are_send_and_sync() {
    fn send<T: Send>(_: &T) {}
    fn sync<T: Sync>() {}
    sync::<lock_runtime::LockAllGuard>();
    let m = LockManager::memory();
    send(&std::future::IntoFuture::into_future(m.read_lock("a")));
    send(&std::future::IntoFuture::into_future(m.lock_all(["a"])));
    send(&m.semaphore("a", 2).run(async {}));
    send(&m.lock_all(["a"]).run(async {}));
}

/// A `lock_all` guard is lost as soon as one of its locks is taken away (the other still held),
/// and a run under it is stopped with the lost error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lock_all_is_lost_when_one_name_is() {
    let backend = lock_runtime::testing::TestBackend::new();
    let m = LockManager::builder().backend(backend.clone());
    let all = m.lock_all(["a", "b"]).await.expect("free");
    assert!(!all.is_lost());
    assert!(backend.lose("b").await, "b was held");
    tokio::time::timeout(Duration::from_secs(5), all.lost()).await.expect("lost() fired for one name");
    assert!(all.is_lost());
    assert!(!all.guards()[0].is_lost(), "a is still held");
    assert!(all.release().await.expect_err("one was lost").is_lost());

    let m2 = m.clone();
    let run = tokio::spawn(async move {
        m2.lock_all(["c", "d"])
            .run(async {
                std::future::pending::<()>().await;
            })
            .await
    });
    // `d` is taken last (sorted order): once it is held, the run holds both.
    while !backend.is_held("d") {
        tokio::task::yield_now().await;
    }
    assert!(backend.lose("d").await, "d was held by the run");
    let stopped = tokio::time::timeout(Duration::from_secs(5), run).await.expect("stopped").expect("task");
    assert!(stopped.expect_err("lost").is_lost());
    assert!(m.try_lock("c").await.expect("try").is_some(), "c released when the run stopped");
}

/// `hold_at_least` on a read lock, a write lock and a permit released early: the name stays
/// taken until the hold ends, then is free (it was never freed before: the in-process store
/// refused the remainder and, with no lease, kept the lock for the life of the process).
#[tokio::test(start_paused = true)]
async fn hold_at_least_on_kinds_keeps_then_frees() {
    let m = LockManager::memory();
    let hold = Duration::from_secs(30);
    let with_hold = || lock_runtime::LockOptions::new().hold_at_least(hold);
    let started = tokio::time::Instant::now();
    let read = m.read_lock("rw").options(with_hold()).await.expect("reader");
    read.release().await.expect("released early");
    assert!(m.try_write_lock("rw").await.expect("try").is_none(), "kept until the hold ends");
    let write = m.write_lock("rw").wait(Duration::from_secs(60)).await.expect("a writer once the hold ends");
    assert!(started.elapsed() >= hold, "freed after {:?}", started.elapsed());
    write.release().await.expect("release");

    let permit = m.semaphore("sem", 1).options(with_hold()).await.expect("permit");
    drop(permit);
    assert!(m.try_semaphore("sem", 1).await.expect("try").is_none(), "kept until the hold ends");
    let again = m.semaphore("sem", 1).wait(Duration::from_secs(60)).await.expect("a permit once the hold ends");
    again.release().await.expect("release");
}

/// A `lock_all` rolled back (one name busy past the wait, or the call cancelled) frees the names
/// it took at once, even with `hold_at_least`: the hold is for a completed holding.
#[tokio::test(start_paused = true)]
async fn a_rolled_back_lock_all_frees_at_once_despite_hold_at_least() {
    let m = LockManager::memory();
    let busy = m.lock("b").await.expect("b");
    let options = lock_runtime::LockOptions::new().hold_at_least(Duration::from_secs(30)).wait(Duration::from_secs(1));
    let err = m.lock_all(["a", "b"]).options(options).await.expect_err("b is busy");
    assert!(err.is_contended(), "{err}");
    assert!(m.try_lock("a").await.expect("try").is_some(), "a rolled back at once");
    // Cancelled while waiting for b: a is freed with the future.
    let pending = m.lock_all(["a", "b"]).options(options.wait(Duration::from_secs(60)));
    assert!(tokio::time::timeout(Duration::from_secs(1), pending).await.is_err(), "still waiting for b");
    assert!(m.try_lock("a").await.expect("try").is_some(), "a freed with the cancelled future");
    drop(busy);
}
