//! Read-write locks and semaphores on a real ZooKeeper server: readers of two sessions, a
//! waiting writer that blocks new readers, a reader's session end, permits agreed across
//! backends (and a zero-permit or nested one refused), hung holders freed after their lease,
//! releases that wake only whom they unblock, and nothing left behind.
#![cfg(feature = "zookeeper")]
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod zk_support;

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use lock_runtime::backend::zookeeper::{ZookeeperBackend, ZookeeperOptions};
use lock_runtime::LockManager;
use lock_tests::zk_server::{self};
use zk_support::*;

/// Readers of two sessions hold one name at once; a writer of a third waits, and a reader that
/// comes after it queues behind it (FIFO by sequence), though only readers hold: it gets in
/// after the writer, whose fencing token lies between theirs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readers_of_two_sessions_overlap_and_a_waiting_writer_blocks_new_readers() {
    let hosts = zk_server::shared().hosts();
    let root = unique_root("rw");
    let (a_store, b_store, w_store) =
        (backend(&hosts, &root).await, backend(&hosts, &root).await, backend(&hosts, &root).await);
    let (a, b) = (LockManager::builder().backend(a_store.clone()), LockManager::builder().backend(b_store.clone()));
    let w = LockManager::builder().backend(w_store.clone());
    let first = a.read_lock("doc").await.expect("reader in a");
    let second = b.read_lock("doc").wait(Duration::ZERO).await.expect("a reader of another session at once");
    assert!(w.try_write_lock("doc").await.expect("try").is_none(), "a writer beside readers");
    let writer = tokio::spawn({
        let w = w.clone();
        async move { w.write_lock("doc").wait(Duration::from_secs(30)).await }
    });
    until("the writer is queued", || w_store.stats().waiting == 1).await;
    assert!(b.try_read_lock("doc").await.expect("try").is_none(), "a new reader overtook the waiting writer");
    let late = tokio::spawn({
        let b = b.clone();
        async move { b.read_lock("doc").wait(Duration::from_secs(30)).await }
    });
    until("the late reader is queued", || b_store.stats().waiting == 1).await;
    assert_eq!(rw_line(&hosts, &a_store, "doc").await, ["read", "read", "write", "read"]);
    let readers_token = first.fencing_token().max(second.fencing_token());
    first.release().await.expect("release");
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!writer.is_finished(), "the writer got in beside a reader");
    second.release().await.expect("release");
    let writer = writer.await.expect("task").expect("the writer after the readers");
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!late.is_finished(), "the late reader got in beside the writer");
    let writer_token = writer.fencing_token();
    assert!(writer_token > readers_token);
    writer.release().await.expect("release");
    let late = late.await.expect("task").expect("the late reader after the writer");
    assert!(late.fencing_token() > writer_token);
    late.release().await.expect("release");
}

/// A reader whose process goes away without releasing (its runtime and backend dropped, the
/// guard never released): its node stays until its session ends, then the waiting writer of
/// another session gets in.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_readers_session_end_lets_a_writer_in() {
    let hosts = zk_server::shared().hosts();
    let name = lock_tests::unique("reader-gone");
    let (held_tx, held_rx) = std::sync::mpsc::channel();
    let reader = std::thread::spawn({
        let (hosts, name) = (hosts.clone(), name.clone());
        move || {
            let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
            runtime.block_on(async {
                let options = ZookeeperOptions::new().session_timeout(Duration::from_secs(1));
                let store = ZookeeperBackend::connect_with(&hosts, options).await.expect("connect");
                let m = LockManager::builder().backend(store);
                let guard = m.read_lock(&name).await.expect("reader");
                held_tx.send(guard.fencing_token()).expect("send");
                std::mem::forget(guard); // never released: only the session's end frees it
            });
            drop(runtime); // the process "dies": its connection is gone, its session expires
        }
    });
    let reader_token =
        tokio::task::spawn_blocking(move || held_rx.recv().expect("the reader holds")).await.expect("task");
    reader.join().expect("reader thread");
    let store = ZookeeperBackend::connect(&hosts).await.expect("connect");
    let m = LockManager::builder().backend(store.clone());
    assert!(m.try_write_lock(&name).await.expect("try").is_none(), "the reader's node outlives its process");
    let started = Instant::now();
    let writer = m.write_lock(&name).wait(Duration::from_secs(20)).await.expect("the writer after the session");
    assert!(started.elapsed() < Duration::from_secs(10), "took {:?}", started.elapsed());
    assert!(writer.fencing_token() > reader_token);
    writer.release().await.expect("release");
}

/// Two backends disagree on a semaphore's permits: the later one is refused with
/// `is_invalid()` (its node deleted), never admitted beside the holders, whether the
/// semaphore is full or not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn permits_mismatch_across_two_backends_is_refused() {
    let hosts = zk_server::shared().hosts();
    let root = unique_root("permits");
    let (a_store, b_store) = (backend(&hosts, &root).await, backend(&hosts, &root).await);
    let (a, b) = (LockManager::builder().backend(a_store.clone()), LockManager::builder().backend(b_store));
    let dir = format!("{}.sem", a_store.lock_path("pool"));
    let one = a.semaphore("pool", 2).await.expect("first permit");
    let err = b.semaphore("pool", 3).wait(Duration::from_secs(5)).await.expect_err("3 permits against 2");
    assert!(err.is_invalid() && err.to_string().contains("permits"), "{err}");
    assert_eq!(zk_server::children(&hosts, &dir).await.len(), 1, "the refused node was deleted");
    let two = b.semaphore("pool", 2).wait(Duration::ZERO).await.expect("second permit, agreed");
    let err = b.try_semaphore("pool", 1).await.expect_err("1 permit against 2, while full");
    assert!(err.is_invalid(), "{err}");
    assert!(a.try_semaphore("pool", 2).await.expect("try").is_none(), "2 permits only");
    for g in [one, two] {
        g.release().await.expect("release");
    }
    let agreed_anew = b.semaphore("pool", 3).await.expect("3 agreed once nobody holds 2");
    agreed_anew.release().await.expect("release");
}

/// A semaphore of 0 permits is refused at once with `is_invalid()` on every path: awaited,
/// tried, and run (`run` skipped the check, waited out its whole `wait` on ZooKeeper and then
/// reported contention).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_zero_permit_semaphore_is_invalid_on_every_path() {
    let hosts = zk_server::shared().hosts();
    let m = LockManager::builder().backend(backend(&hosts, &unique_root("zero")).await);
    let wait = Duration::from_secs(30);
    let err = m.semaphore("pool", 0).wait(wait).await.expect_err("awaited");
    assert!(err.is_invalid(), "awaited: {err}");
    let err = m.try_semaphore("pool", 0).await.expect_err("tried");
    assert!(err.is_invalid(), "tried: {err}");
    let ran = std::sync::atomic::AtomicBool::new(false);
    let err = tokio::time::timeout(
        wait / 2,
        m.semaphore("pool", 0).wait(wait).run(async { ran.store(true, Ordering::SeqCst) }),
    )
    .await
    .expect("refused at once, not after the wait")
    .expect_err("run");
    assert!(err.is_invalid(), "run: {err}");
    assert!(!ran.load(Ordering::SeqCst), "the body never runs");
    // Inside a held permit of the same name, too: no re-entry into a different count.
    let err = m
        .semaphore("pool", 2)
        .run(async { m.semaphore("pool", 0).run(async {}).await })
        .await
        .expect("outer permit")
        .expect_err("inner run of 0 permits");
    assert!(err.is_invalid(), "nested: {err}");
}

/// A task holding a permit of a semaphore of 2 asks for one of the same name with 3 permits:
/// refused with `is_invalid()`, as the same request from another task is, never re-entered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_nested_permit_with_other_permits_is_refused_not_reentered() {
    let hosts = zk_server::shared().hosts();
    let m = LockManager::builder().backend(backend(&hosts, &unique_root("reenter")).await);
    let (outer_token, inner) = m
        .semaphore("pool", 2)
        .run(async {
            let outer = lock_runtime::current().expect("inside").fencing_token();
            let other_task = {
                let m = m.clone();
                tokio::spawn(async move { m.semaphore("pool", 3).wait(Duration::from_secs(5)).await.map(drop) })
            };
            let err = other_task.await.expect("task").expect_err("3 permits against 2 from another task");
            assert!(err.is_invalid(), "another task: {err}");
            let same = m.semaphore("pool", 2).run(async { lock_runtime::current().map(|l| l.fencing_token()) }).await;
            assert_eq!(same.expect("same permits re-enter"), Some(outer));
            (outer, m.semaphore("pool", 3).run(async { "re-entered" }).await)
        })
        .await
        .expect("outer permit");
    assert!(outer_token > 0);
    let err = inner.expect_err("3 permits inside a permit of 2");
    assert!(err.is_invalid() && err.to_string().contains("permits"), "{err}");
}

/// Many read, write and semaphore operations (held, contended, timed out, dropped guards and
/// cancelled waiters) leave no znode under the lock root.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kind_operations_leave_no_znodes() {
    let hosts = zk_server::shared().hosts();
    let root = unique_root("kinds-left");
    let store = backend(&hosts, &root).await;
    let m = LockManager::builder().backend(store.clone());
    for i in 0..100u32 {
        let name = format!("k/{i}");
        let r1 = m.read_lock(&name).await.expect("reader");
        let r2 = m.read_lock(&name).await.expect("second reader");
        assert!(m.try_write_lock(&name).await.expect("try").is_none());
        let p = m.semaphore(&name, 1).await.expect("permit");
        assert!(m.try_semaphore(&name, 1).await.expect("try").is_none());
        if i % 10 == 0 {
            let err = m.write_lock(&name).wait(Duration::from_millis(30)).await.expect_err("held");
            assert!(err.is_contended(), "{err}");
            assert!(m.semaphore(&name, 2).await.expect_err("mismatch").is_invalid());
            let waiter = tokio::spawn({
                let (m, name) = (m.clone(), name.clone());
                async move { m.semaphore(&name, 1).wait(Duration::from_secs(30)).await }
            });
            until("the permit waiter is queued", || store.stats().waiting == 1).await;
            waiter.abort();
            let _ = waiter.await;
        }
        r1.release().await.expect("release");
        drop(r2); // released in the background
        drop(p);
        let w = m.write_lock(&name).wait(Duration::from_secs(10)).await.expect("writer");
        w.release().await.expect("release");
    }
    emptied(&hosts, &root).await;
}

/// No herd on a semaphore: 2 permits held, 12 waiters in 4 sessions. Each release wakes the
/// first waiter (which is granted) and, through its grant's record, the one behind it (now
/// first): at most 2 watch wake-ups per release, however many wait (a herd would wake all).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_semaphore_release_wakes_one_waiter_not_the_herd() {
    const WAITERS: usize = 12;
    let hosts = zk_server::shared().hosts();
    let name = lock_tests::unique("sem-herd");
    let (stores, managers) = sessions(&hosts, 4).await;
    let wakeups = || stores.iter().map(|s| s.stats().wakeups).sum::<u64>();
    let waiting = || stores.iter().map(|s| s.stats().waiting).sum::<u64>();
    let held = Arc::new(Mutex::new(vec![
        managers[0].semaphore(&name, 2).await.expect("holder"),
        managers[1].semaphore(&name, 2).await.expect("holder"),
    ]));
    let mut tasks = Vec::new();
    for i in 0..WAITERS {
        let (m, name, held) = (managers[i % 4].clone(), name.clone(), held.clone());
        tasks.push(tokio::spawn(async move {
            let g = m.semaphore(&name, 2).wait(Duration::from_secs(60)).await.expect("waiter");
            held.lock().unwrap().push(g);
        }));
    }
    until("every waiter is queued", || waiting() == WAITERS as u64).await;
    for round in 0..WAITERS {
        let before = wakeups();
        let oldest = held.lock().unwrap().remove(0);
        oldest.release().await.expect("release");
        until("the first waiter is granted", || held.lock().unwrap().len() == 2).await;
        tokio::time::sleep(Duration::from_millis(100)).await; // any stray wake-up lands
        assert_eq!(held.lock().unwrap().len(), 2, "two permits held after round {round}");
        assert_eq!(waiting(), (WAITERS - round - 1) as u64, "round {round}: the others still wait");
        let woken = wakeups() - before;
        assert!((1..=2).contains(&woken), "round {round}: a release woke {woken} waiters");
    }
    for t in tasks {
        t.await.expect("task");
    }
    let rest: Vec<_> = std::mem::take(&mut *held.lock().unwrap());
    for g in rest {
        g.release().await.expect("release");
    }
}

/// A reader and a permit holder in another process that hang with their session alive: their
/// fixed leases (recorded in their nodes) still end, and the writer or permit waiter they block
/// frees the name then, not before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_frees_a_hung_reader_or_permit_after_its_fixed_lease() {
    let hosts = zk_server::shared().hosts();
    let store = ZookeeperBackend::connect(&hosts).await.expect("connect");
    let m = LockManager::builder().backend(store.clone());
    let hung = HungHolder::connect(&hosts).await;
    let lease = Duration::from_millis(300);
    for (suffix, node) in [(".rw", "read-hung-"), (".sem", "sem1-hung-")] {
        let name = lock_tests::unique("hung-kind");
        let dir = format!("{}{suffix}", store.lock_path(&name));
        let started = Instant::now();
        let czxid = hung.hold(&dir, node, &format!("holder=hung/1;lease_ms={}", lease.as_millis())).await;
        let g = match suffix {
            ".rw" => m.write_lock(&name).wait(Duration::from_secs(10)).await.expect("writer after the lease"),
            _ => m.semaphore(&name, 1).wait(Duration::from_secs(10)).await.expect("permit after the lease"),
        };
        assert_freed_after_lease(node, lease, started.elapsed());
        assert!(g.fencing_token() > u64::try_from(czxid).unwrap());
        g.release().await.expect("release");
    }
}

/// Who a read-write release wakes: a writer's release wakes each reader it lets in (once), not
/// the writer queued behind them; that writer watches only the last reader ahead of it, so the
/// other readers' releases wake nobody, and the last one's wakes it alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_write_release_wakes_only_whom_it_unblocks() {
    const READERS: usize = 4;
    let hosts = zk_server::shared().hosts();
    let name = lock_tests::unique("rw-herd");
    let (stores, managers) = sessions(&hosts, 2).await;
    let wakeups = || stores.iter().map(|s| s.stats().wakeups).sum::<u64>();
    let waiting = || stores.iter().map(|s| s.stats().waiting).sum::<u64>();
    let holder = managers[0].write_lock(&name).await.expect("writer");
    let mut readers = Vec::new();
    for i in 0..READERS {
        let (m, name) = (managers[i % 2].clone(), name.clone());
        readers.push(tokio::spawn(async move { m.read_lock(&name).wait(Duration::from_secs(30)).await }));
        until("the reader is queued", || waiting() == i as u64 + 1).await;
    }
    let writer = tokio::spawn({
        let (m, name) = (managers[1].clone(), name.clone());
        async move { m.write_lock(&name).wait(Duration::from_secs(30)).await }
    });
    until("the second writer is queued", || waiting() == READERS as u64 + 1).await;
    let before = wakeups();
    holder.release().await.expect("release");
    let mut guards = Vec::new();
    for r in readers {
        guards.push(r.await.expect("task").expect("reader after the writer"));
    }
    tokio::time::sleep(Duration::from_millis(100)).await; // any stray wake-up lands
    assert_eq!(wakeups() - before, READERS as u64, "each reader woken once, the second writer not at all");
    assert_eq!(waiting(), 1, "the second writer still waits");
    let last = guards.pop().expect("the last reader");
    let before = wakeups();
    for g in guards {
        g.release().await.expect("release");
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(wakeups() - before, 0, "releases of readers the writer does not watch woke someone");
    assert!(!writer.is_finished(), "the writer got in beside a reader");
    last.release().await.expect("release");
    let writer = writer.await.expect("task").expect("the writer after the readers");
    assert_eq!(wakeups() - before, 1, "the last reader's release wakes the writer alone");
    writer.release().await.expect("release");
}
