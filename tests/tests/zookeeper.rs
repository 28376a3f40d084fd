//! The ZooKeeper backend against a real ZooKeeper server started by the tests
//! (`lock_tests::zk_server`): the conformance suite and the recipe's own properties.
#![cfg(feature = "zookeeper")]
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod zk_support;

use std::future::IntoFuture;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use lock_runtime::backend::zookeeper::{ZookeeperBackend, ZookeeperOptions};
use lock_runtime::LockManager;
use lock_tests::zk_server::{self, op, ZkServer};
use zk_support::*;

lock_tests::conformance_suite!(
    |builder: lock_runtime::LockManagerBuilder| async move {
        builder.zookeeper(zk_server::shared().hosts()).await.expect("connect to the test ZooKeeper")
    },
    kinds = [
        lock_runtime::backend::LockKind::Read,
        lock_runtime::backend::LockKind::Write,
        lock_runtime::backend::LockKind::Semaphore { permits: 1 }
    ],
    inspect = true
);

/// Several sessions (one manager each) contend for one name: no two holders at once, no lost
/// update, and fencing tokens strictly increase in the order the lock was held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mutual_exclusion_and_fencing_across_sessions() {
    let hosts = zk_server::shared().hosts();
    let name = lock_tests::unique("shared");
    let mut managers = Vec::new();
    for _ in 0..4 {
        managers.push(LockManager::zookeeper(&hosts).await.expect("connect"));
    }
    let counter = Arc::new(AtomicU64::new(0));
    let inside = Arc::new(AtomicUsize::new(0));
    let last_token = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for m in &managers {
        for _ in 0..4 {
            let (m, name) = (m.clone(), name.clone());
            let (counter, inside, last_token) = (counter.clone(), inside.clone(), last_token.clone());
            tasks.push(tokio::spawn(async move {
                for _ in 0..5 {
                    let g = m.lock(&name).wait(Duration::from_secs(60)).await.expect("acquire");
                    assert_eq!(inside.fetch_add(1, Ordering::SeqCst), 0, "two holders at once");
                    let previous = last_token.swap(g.fencing_token(), Ordering::SeqCst);
                    assert!(g.fencing_token() > previous, "token {} after {previous}", g.fencing_token());
                    let read = counter.load(Ordering::SeqCst);
                    tokio::task::yield_now().await;
                    counter.store(read + 1, Ordering::SeqCst);
                    inside.fetch_sub(1, Ordering::SeqCst);
                    g.release().await.expect("release");
                }
            }));
        }
    }
    for t in tasks {
        t.await.expect("task");
    }
    assert_eq!(counter.load(Ordering::SeqCst), 4 * 4 * 5);
}

/// Tokens keep increasing when the lock's parent node is deleted and recreated in between
/// (the sequence suffix restarts then; the czxid does not).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fencing_tokens_survive_parent_recreation() {
    let hosts = zk_server::shared().hosts();
    let a = LockManager::zookeeper(&hosts).await.expect("a");
    let b = LockManager::zookeeper(&hosts).await.expect("b");
    let name = lock_tests::unique("recreated");
    let mut last = 0;
    for i in 0..10 {
        let m = if i % 2 == 0 { &a } else { &b };
        let g = m.lock(&name).await.expect("acquire");
        assert!(g.fencing_token() > last, "{} after {last}", g.fencing_token());
        last = g.fencing_token();
        g.release().await.expect("release"); // the parent is deleted with the last node
    }
}

/// No herd: 16 waiters each watch only their predecessor, so each release wakes exactly one.
/// When the k-th waiter gets the lock, exactly k watch wake-ups have happened in all sessions.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_release_wakes_one_waiter() {
    let hosts = zk_server::shared().hosts();
    let name = lock_tests::unique("herd");
    let mut backends = Vec::new();
    for _ in 0..4 {
        backends.push(ZookeeperBackend::connect(&hosts).await.expect("connect"));
    }
    let managers: Vec<LockManager> = backends.iter().map(|b| LockManager::builder().backend(b.clone())).collect();
    let wakeups = {
        let backends = backends.clone();
        move || backends.iter().map(|b| b.stats().wakeups).sum::<u64>()
    };
    let waiting = {
        let backends = backends.clone();
        move || backends.iter().map(|b| b.stats().waiting).sum::<u64>()
    };
    let holder = managers[0].lock(&name).await.expect("holder");
    let seen = Arc::new(Mutex::new(Vec::new()));
    let base = Arc::new(AtomicU64::new(u64::MAX));
    let mut tasks = Vec::new();
    for i in 0..16 {
        let (m, name, seen, base, wakeups) =
            (managers[i % 4].clone(), name.clone(), seen.clone(), base.clone(), wakeups.clone());
        tasks.push(tokio::spawn(async move {
            let g = m.lock(&name).wait(Duration::from_secs(60)).await.expect("waiter");
            seen.lock().unwrap().push(wakeups() - base.load(Ordering::SeqCst));
            g.release().await.expect("release");
        }));
    }
    // All 16 queued and watching (a condition, checked until it holds, bounded).
    lock_tests::eventually("16 waiters queued", Duration::from_secs(30), async || lock_tests::reached(waiting(), 16))
        .await;
    base.store(wakeups(), Ordering::SeqCst);
    holder.release().await.expect("release");
    for t in tasks {
        t.await.expect("task");
    }
    let seen = seen.lock().unwrap().clone();
    assert_eq!(seen, (1..=16).collect::<Vec<u64>>(), "wake-ups counted at each hand-off");
    assert_eq!(wakeups() - base.load(Ordering::SeqCst), 16, "one wake-up per release");
}

/// The server is killed while a lock is held: `lost()` fires within the session timeout, new
/// attempts fail with clear backend errors, and locking works again once the server is back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_killed_fires_lost_then_recovers() {
    let mut zk = ZkServer::start();
    let session_timeout = Duration::from_secs(2);
    let options = ZookeeperOptions::new().session_timeout(session_timeout).operation_timeout(Duration::from_secs(3));
    let store = ZookeeperBackend::connect_with(zk.hosts(), options).await.expect("connect");
    let m = LockManager::builder().backend(store.clone());
    let guard = m.lock("held").await.expect("holder");
    let fixed = m.lock("fixed").lease(Duration::from_secs(60)).await.expect("fixed-lease holder");

    let killed_at = Instant::now();
    zk.kill();
    tokio::time::timeout(session_timeout, guard.lost()).await.expect("lost() within the session timeout");
    tokio::time::timeout(Duration::from_secs(1), fixed.lost()).await.expect("every lock of the session is lost");
    let after = killed_at.elapsed();
    assert!(after <= session_timeout, "lost after {after:?}");

    let started = Instant::now();
    let err = m.lock("other").wait(Duration::from_secs(1)).await.expect_err("no server");
    assert!(err.is_backend(), "{err}");
    assert!(err.to_string().contains("zookeeper") && err.to_string().contains("other"), "{err}");
    assert!(started.elapsed() < Duration::from_secs(5), "failed after {:?}", started.elapsed());
    assert!(m.try_lock("other").await.expect_err("no server").is_backend());

    zk.restart();
    let again = m.lock("other").wait(Duration::from_secs(10)).await.expect("works after restart");
    again.release().await.expect("release");
    // The old session's node, if the server restored that session, goes when it expires.
    let held_again = m.lock("held").wait(session_timeout * 5).await.expect("the lost lock is free again");
    assert!(held_again.fencing_token() > guard.fencing_token());
    held_again.release().await.expect("release");
    assert!(guard.release().await.expect_err("was lost").is_lost());
    assert!(store.stats().sessions >= 2, "a new session was established");
    drop(fixed);
}

/// 1,000 distinct names locked and released (and a few busy attempts and timed-out waits)
/// leave no znode under the lock root.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_names_leave_no_znodes() {
    let hosts = zk_server::shared().hosts();
    let root = unique_root("names");
    let store = backend(&hosts, &root).await;
    let m = LockManager::builder().backend(store.clone());
    for i in 0..1000u32 {
        let g = m.lock(format!("name/{i}")).await.expect("acquire");
        g.release().await.expect("release");
    }
    for i in 0..10u32 {
        let g = m.lock(format!("busy/{i}")).await.expect("acquire");
        assert!(m.try_lock(format!("busy/{i}")).await.expect("try").is_none());
        let err = m.lock(format!("busy/{i}")).wait(Duration::from_millis(50)).await.expect_err("held");
        assert!(err.is_contended(), "{err}");
        drop(g); // released in the background
    }
    // Released in the background (dropped guards): wait for the root to empty out, bounded.
    emptied(&hosts, &root).await;
}

/// Any valid lock name, `/` and `..` included, is one znode under the root.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn odd_names_are_single_znodes() {
    let hosts = zk_server::shared().hosts();
    let root = unique_root("odd");
    let store = backend(&hosts, &root).await;
    let m = LockManager::builder().backend(store.clone());
    for name in ["a/b/c", "..", ".", "/", "zookeeper", "100%", "日本語 name", "x".repeat(1024).as_str()] {
        let g = m.lock(name).await.unwrap_or_else(|e| panic!("{name}: {e}"));
        let children = zk_server::children(&hosts, &root).await;
        assert_eq!(children.len(), 1, "{name}: {children:?}");
        assert!(!children[0].contains('/'));
        g.release().await.expect("release");
    }
}

/// A waiter whose future is dropped has its node deleted at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropped_waiter_leaves_no_node() {
    let hosts = zk_server::shared().hosts();
    let root = unique_root("dropped");
    let store = backend(&hosts, &root).await;
    let m = LockManager::builder().backend(store.clone());
    let held = m.lock("q").await.expect("holder");
    let dir = store.lock_path("q");
    let m2 = m.clone();
    let waiter = tokio::spawn(async move { m2.lock("q").wait(Duration::from_secs(30)).await });
    until("the waiter is queued", || store.stats().waiting == 1).await;
    assert_eq!(zk_server::children(&hosts, &dir).await.len(), 2, "holder and waiter nodes");
    waiter.abort();
    let _ = waiter.await;
    lock_tests::eventually("the dropped waiter's node deleted", Duration::from_secs(5), async || {
        let left = zk_server::children(&hosts, &dir).await;
        if left.len() == 1 {
            Ok(())
        } else {
            Err(left)
        }
    })
    .await;
    held.release().await.expect("release");
}

/// A holder in another process that hangs with its session alive: its fixed lease (recorded in
/// its node) still ends, and the next waiter frees the lock then, not before; a hung holder
/// without a fixed lease is kept (its session vouches for it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiter_frees_a_hung_holder_after_its_fixed_lease() {
    let hosts = zk_server::shared().hosts();
    let store = ZookeeperBackend::connect(&hosts).await.expect("connect");
    let m = LockManager::builder().backend(store.clone());
    let hung = HungHolder::connect(&hosts).await;

    let name = lock_tests::unique("hung");
    let lease = Duration::from_millis(300);
    let started = Instant::now();
    let czxid = hung.hold(&store.lock_path(&name), "lk-hung-", &format!("lease_ms={}", lease.as_millis())).await;
    let g = m.lock(&name).wait(Duration::from_secs(10)).await.expect("freed after the lease");
    assert_freed_after_lease("mutex", lease, started.elapsed());
    assert!(g.fencing_token() > u64::try_from(czxid).unwrap());
    g.release().await.expect("release");

    let name = lock_tests::unique("hung-watchdog");
    hung.hold(&store.lock_path(&name), "lk-hung-", "").await;
    let err = m.lock(&name).wait(Duration::from_millis(1500)).await.expect_err("kept while its session lives");
    assert!(err.is_contended(), "{err}");
    drop(hung); // closes its session: the lock is free
    m.lock(&name)
        .wait(Duration::from_secs(10))
        .await
        .expect("free once the session ends")
        .release()
        .await
        .expect("release");
}

/// The reply to a lock node's create is lost with the connection: after reconnecting, the
/// acquisition finds its node by its owner id instead of creating a second one, which would
/// leave an orphan that holds the lock and blocks everyone while the session lives.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lost_create_reply_is_found_again() {
    use zookeeper_client::{Acls, Client, CreateMode};
    let server = zk_server::shared();
    let proxy = zk_server::ReplyCutter::start(server.port()).await;
    let store = ZookeeperBackend::connect(proxy.hosts()).await.expect("connect through the proxy");
    let m = LockManager::builder().backend(store.clone());
    let other = LockManager::zookeeper(server.hosts()).await.expect("direct");

    let name = lock_tests::unique("lost-reply");
    let dir = store.lock_path(&name);
    // The lock's node exists, so the create whose reply is lost does succeed on the server.
    let raw = Client::connect(&server.hosts()).await.expect("raw client");
    raw.create(&dir, b"", &CreateMode::Container.with_acls(Acls::anyone_all())).await.expect("lock node");
    proxy.cut_next_lock_create();
    let g = m.try_lock(&name).await.expect("acquired despite the lost reply").expect("free");
    assert_eq!(proxy.cuts(), 1, "the reply was lost");
    let nodes = zk_server::children(&server.hosts(), &dir).await;
    assert_eq!(nodes.len(), 1, "one node, no orphan: {nodes:?}");
    assert!(other.try_lock(&name).await.expect("try").is_none(), "held");
    g.release().await.expect("release");
    let next = other.lock(&name).wait(Duration::from_secs(5)).await.expect("no orphan blocks the lock");
    next.release().await.expect("release");
    assert!(zk_server::children(&server.hosts(), &dir).await.is_empty());

    // The same while waiting in the queue.
    let held = other.lock(&name).await.expect("holder");
    proxy.cut_next_lock_create();
    let (m2, name2) = (m.clone(), name.clone());
    let waiter = tokio::spawn(async move { m2.lock(&name2).wait(Duration::from_secs(20)).await });
    until("a lock create went through the proxy", || proxy.cuts() >= 2).await;
    held.release().await.expect("release");
    let g = waiter.await.expect("task").expect("handed over");
    assert_eq!(zk_server::children(&server.hosts(), &dir).await.len(), 1, "no orphan");
    g.release().await.expect("release");
}

/// Bad host lists and options are `is_invalid()`; an unreachable server is `is_backend()`,
/// within the operation timeout.
#[tokio::test]
async fn bad_configuration_is_reported() {
    assert!(LockManager::zookeeper("").await.expect_err("empty").is_invalid());
    for hosts in ["127.0.0.1:notaport", "127.0.0.1:99999", "127.0.0.1:2181/chroot/"] {
        let err = LockManager::builder().zookeeper(hosts).await.expect_err(hosts);
        assert!(err.is_invalid(), "{hosts}: {err}");
        assert!(err.to_string().contains(hosts), "{err}");
    }
    let err = ZookeeperBackend::connect_with("127.0.0.1:2181", ZookeeperOptions::new().root("locks"))
        .await
        .expect_err("root");
    assert!(err.is_invalid(), "{err}");
    let started = Instant::now();
    let options = ZookeeperOptions::new().operation_timeout(Duration::from_secs(2));
    let err = ZookeeperBackend::connect_with("127.0.0.1:1", options).await.expect_err("nobody listens on port 1");
    assert!(err.is_backend(), "{err}");
    assert!(started.elapsed() < Duration::from_secs(4), "took {:?}", started.elapsed());
}

/// Regression (issue 1): a holder that waited has its fixed lease counted from its grant, by
/// the waiters too. A holds; B (a fixed lease of 2 s) waits 1.5 s, then is granted and its
/// process hangs with its session alive (its own runtime is stalled: its lease-end task cannot
/// delete its node); C, in another backend, arrives while B holds, waits right behind B and
/// judges B's lease. C must not get the lock before B's runtime has reported it lost (B's
/// grant + lease). The old recipe counted B's lease from its node's creation (when it queued),
/// and C took the lock 0.5 s early.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waited_holders_fixed_lease_counts_from_its_grant() {
    let hosts = zk_server::shared().hosts();
    let name = lock_tests::unique("waited-lease");
    let lease = Duration::from_secs(2);
    let a = LockManager::zookeeper(&hosts).await.expect("a");
    let c_store = ZookeeperBackend::connect(&hosts).await.expect("c");
    let c = LockManager::builder().backend(c_store);
    let holder = a.lock(&name).await.expect("A holds");

    let (store_tx, store_rx) = tokio::sync::oneshot::channel();
    let (granted_tx, granted_rx) = tokio::sync::oneshot::channel();
    let (resume_tx, resume_rx) = std::sync::mpsc::channel::<()>();
    let (finish_tx, finish_rx) = tokio::sync::oneshot::channel::<()>();
    let b_process = std::thread::spawn({
        let (hosts, name) = (hosts.clone(), name.clone());
        move || {
            let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
            // A long session: the stall below must not expire it (the server would free the node).
            let options = ZookeeperOptions::new().session_timeout(Duration::from_secs(20));
            let store = runtime.block_on(ZookeeperBackend::connect_with(&hosts, options)).expect("b");
            let _ = store_tx.send(store.clone());
            let b = LockManager::builder().backend(store);
            let guard =
                runtime.block_on(b.lock(&name).lease(lease).wait(Duration::from_secs(20)).into_future()).expect("B");
            let _ = granted_tx.send((Instant::now(), guard));
            let _ = resume_rx.recv(); // B's process hangs: nothing on its runtime runs
            runtime.block_on(async move {
                let _ = finish_rx.await;
            });
        }
    });
    let b_store = store_rx.await.expect("B connected");
    until("B is queued behind A", || b_store.stats().waiting == 1).await;
    // A holds on for a while (a condition: B waits about 1.5 s), then releases.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    holder.release().await.expect("A releases");
    let (b_granted, b_guard) = granted_rx.await.expect("B granted");

    // C arrives while B holds: it queues right behind B and judges B's lease.
    let c_task = tokio::spawn({
        let name = name.clone();
        async move {
            let guard = c.lock(&name).wait(Duration::from_secs(30)).await;
            (Instant::now(), guard)
        }
    });
    let b_lost = async {
        b_guard.lost().await;
        Instant::now()
    };
    let (b_lost_at, c_result) = tokio::join!(b_lost, c_task);
    let (c_granted, c_guard) = c_result.expect("C's task");
    let c_guard = c_guard.expect("C is granted once B's lease is over");
    assert!(
        b_lost_at <= c_granted,
        "C was granted {:?} after B's grant, {:?} before B's {lease:?} lease ended (B's lost() fired)",
        c_granted.saturating_duration_since(b_granted),
        b_lost_at.saturating_duration_since(c_granted),
    );
    assert!(c_guard.fencing_token() > b_guard.fencing_token());
    assert!(
        b_lost_at + Duration::from_millis(300) >= b_granted + lease,
        "B's lease was counted from before its grant: lost {:?} after it",
        b_lost_at.saturating_duration_since(b_granted)
    );

    let _ = resume_tx.send(()); // B's process runs again: its late release is reported lost
    let err = b_guard.release().await.expect_err("B's lease ended");
    assert!(err.is_lost(), "{err}");
    c_guard.release().await.expect("C releases");
    let _ = finish_tx.send(());
    tokio::task::spawn_blocking(move || b_process.join()).await.expect("join").expect("B's thread");
}

/// Regression (issue 4): a huge or zero duration option is `is_invalid()` when connecting,
/// never a panic (the old code accepted `Duration::MAX` and overflowed later, in a clean-up
/// task).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn huge_or_zero_options_are_invalid() {
    let hosts = zk_server::shared().hosts();
    for bad in [Duration::MAX, Duration::from_secs(u64::MAX / 2), Duration::from_secs(365 * 24 * 3600), Duration::ZERO]
    {
        let cases = [
            ("operation_timeout", ZookeeperOptions::new().operation_timeout(bad)),
            ("session_timeout", ZookeeperOptions::new().session_timeout(bad)),
            ("lost_after_disconnect", ZookeeperOptions::new().lost_after_disconnect(bad)),
        ];
        for (what, options) in cases {
            let connecting = tokio::spawn(ZookeeperBackend::connect_with(hosts.clone(), options));
            match connecting.await {
                Err(panic) => panic!("`{what}` = {bad:?} panicked: {panic}"),
                Ok(Ok(_)) => panic!("`{what}` = {bad:?} was accepted"),
                Ok(Err(err)) => {
                    assert!(err.is_invalid(), "`{what}` = {bad:?}: {err}");
                    assert!(err.to_string().contains(what), "{err}");
                }
            }
        }
    }
}

/// Regression (issue 5): after a create's reply is lost, the acquisition `sync`s before it lists
/// the children to find its node, and creates no second node. (On an ensemble the client may
/// reconnect to a follower that has not applied the create yet; a single test server cannot
/// lag, so this checks the requests the recovery sends, through the proxy, and that it finds
/// the one node.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lost_reply_recovery_syncs_before_listing() {
    use zookeeper_client::{Acls, Client, CreateMode};
    let server = zk_server::shared();
    let proxy = zk_server::ReplyCutter::start(server.port()).await;
    let store = ZookeeperBackend::connect(proxy.hosts()).await.expect("connect through the proxy");
    let m = LockManager::builder().backend(store.clone());
    let name = lock_tests::unique("lost-reply-sync");
    let dir = store.lock_path(&name);
    let raw = Client::connect(&server.hosts()).await.expect("raw client");
    raw.create(&dir, b"", &CreateMode::Container.with_acls(Acls::anyone_all())).await.expect("lock node");

    proxy.cut_next_lock_create();
    let g = m.try_lock(&name).await.expect("acquired despite the lost reply").expect("free");
    assert_eq!(proxy.cuts(), 1, "the reply was lost");
    let ops: Vec<i32> = proxy.ops_since_cut().into_iter().filter(|o| *o != op::PING).collect();
    let first_read = ops.iter().find(|o| matches!(**o, op::SYNC | op::GET_CHILDREN | op::GET_CHILDREN2));
    assert_eq!(first_read, Some(&op::SYNC), "the recovery must sync before it lists the children: {ops:?}");
    assert!(!ops.iter().any(|o| matches!(*o, op::CREATE | op::CREATE2)), "a second node was created: {ops:?}");
    let nodes = zk_server::children(&server.hosts(), &dir).await;
    assert_eq!(nodes.len(), 1, "one node, no orphan: {nodes:?}");
    g.release().await.expect("release");
}

/// FIFO: waiters are granted in the order they queued, each keeping its one node (its place)
/// from its first attempt through its wait. Five waiters, each in its own session, queue one
/// after the other; the lock then passes down the line.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_are_granted_in_arrival_order() {
    let hosts = zk_server::shared().hosts();
    let name = lock_tests::unique("fifo");
    let holder = LockManager::zookeeper(&hosts).await.expect("holder");
    let held = holder.lock(&name).await.expect("held");
    let order = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for i in 0..5 {
        let store = ZookeeperBackend::connect(&hosts).await.expect("connect");
        let m = LockManager::builder().backend(store.clone());
        let (name, order) = (name.clone(), order.clone());
        tasks.push(tokio::spawn(async move {
            let g = m.lock(&name).wait(Duration::from_secs(60)).lease(Duration::from_secs(60)).await.expect("waiter");
            order.lock().unwrap().push(i);
            g.release().await.expect("release");
        }));
        until("the waiter is queued", || store.stats().waiting == 1).await;
    }
    held.release().await.expect("release");
    for t in tasks {
        t.await.expect("task");
    }
    assert_eq!(*order.lock().unwrap(), [0, 1, 2, 3, 4]);
}

/// An acquisition owns one node for its whole life: a waiter creates its node in its first
/// attempt and keeps it (its FIFO place) through its wait; nothing is deleted and created
/// again. Counted on the requests its session sends, through the proxy.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_keeps_one_node_from_its_first_attempt() {
    let server = zk_server::shared();
    let proxy = zk_server::ReplyCutter::start(server.port()).await;
    let store = ZookeeperBackend::connect(proxy.hosts()).await.expect("connect through the proxy");
    let m = LockManager::builder().backend(store.clone());
    let other = LockManager::zookeeper(server.hosts()).await.expect("direct");
    let name = lock_tests::unique("one-node");
    let held = other.lock(&name).await.expect("held");
    proxy.reset_ops();
    let waiter = tokio::spawn({
        let (m, name) = (m.clone(), name.clone());
        async move { m.lock(&name).wait(Duration::from_secs(20)).lease(Duration::from_secs(20)).await }
    });
    until("the waiter is queued", || store.stats().waiting == 1).await;
    let queued = proxy.ops_since_cut();
    held.release().await.expect("release");
    let g = waiter.await.expect("task").expect("granted");
    let ops = proxy.ops_since_cut();
    let creates = ops.iter().filter(|o| matches!(**o, op::CREATE | op::CREATE2)).count();
    assert_eq!(creates, 1, "one node for the whole call: {ops:?}");
    assert!(!queued.contains(&op::DELETE), "its node was deleted before it was granted: {queued:?}");
    g.release().await.expect("release");
}

/// Every background task ends with what it serves: once the backend, its managers and its
/// guards are gone (after holding, waiting, giving up and releasing), nothing keeps its session
/// open, so the server sees its connection close.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_backend_closes_its_session() {
    let zk = ZkServer::start();
    let before = zk.connections().expect("mntr");
    {
        let store = ZookeeperBackend::connect(zk.hosts()).await.expect("connect");
        let m = LockManager::builder().backend(store.clone());
        let kept = m.lock("kept").await.expect("watchdog lease");
        let fixed = m.lock("fixed").lease(Duration::from_secs(60)).await.expect("fixed lease");
        assert!(m.try_lock("kept").await.expect("try").is_none());
        let err = m.lock("fixed").wait(Duration::from_millis(100)).await.expect_err("held");
        assert!(err.is_contended(), "{err}");
        let waiter = tokio::spawn({
            let m = m.clone();
            async move { m.lock("kept").wait(Duration::from_secs(30)).await }
        });
        until("the waiter is queued", || store.stats().waiting == 1).await;
        waiter.abort();
        let _ = waiter.await;
        kept.release().await.expect("release");
        drop(fixed); // released in the background
        assert!(zk.connections().expect("mntr") > before, "the backend's session is open");
    }
    lock_tests::eventually("the session closed", Duration::from_secs(10), async || {
        let open = zk.connections().expect("mntr");
        if open <= before {
            Ok(())
        } else {
            Err(open)
        }
    })
    .await;
}

/// An acquisition dropped after any number of polls (creating its node, listing, watching,
/// free or contended) leaves nothing behind: the next caller gets the lock at once, and no
/// znode is left under the root.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelled_after_any_poll_leaves_nothing_behind() {
    let hosts = zk_server::shared().hosts();
    let root = unique_root("cancelled");
    let m = LockManager::builder().backend(backend(&hosts, &root).await);
    let other = LockManager::builder().backend(backend(&hosts, &root).await);
    for contended in [false, true] {
        for polls in 1..=10 {
            let held = if contended { Some(other.lock("c").await.expect("held")) } else { None };
            let mut fut = Box::pin(m.lock("c").wait(Duration::from_secs(10)).into_future());
            for _ in 0..polls {
                match lock_tests::poll_once(&mut fut).await {
                    std::task::Poll::Ready(guard) => {
                        guard.expect("acquired").release().await.expect("release");
                        break;
                    }
                    // Lets its requests progress, so that the drop lands at another step.
                    std::task::Poll::Pending => tokio::time::sleep(Duration::from_millis(1)).await,
                }
            }
            drop(fut);
            if let Some(held) = held {
                held.release().await.expect("release");
            }
            let next = m.try_lock("c").await.expect("try").unwrap_or_else(|| {
                panic!("something was left ahead of the next caller (contended: {contended}, polls: {polls})")
            });
            next.release().await.expect("release");
        }
    }
    emptied(&hosts, &root).await;
}

/// A waiter whose node became the lowest (it was woken) but which is dropped before it took
/// the lock passes the lock on to the next waiter.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_woken_waiter_that_is_dropped_passes_the_lock_on() {
    let hosts = zk_server::shared().hosts();
    let name = lock_tests::unique("woken-dropped");
    let holder = LockManager::zookeeper(&hosts).await.expect("holder");
    let first_store = ZookeeperBackend::connect(&hosts).await.expect("first");
    let second_store = ZookeeperBackend::connect(&hosts).await.expect("second");
    let first = LockManager::builder().backend(first_store.clone());
    let second = LockManager::builder().backend(second_store.clone());
    let held = holder.lock(&name).await.expect("held");
    let mut woken = Box::pin(first.lock(&name).wait(Duration::from_secs(30)).into_future());
    let started = Instant::now();
    while first_store.stats().waiting == 0 {
        assert!(lock_tests::poll_once(&mut woken).await.is_pending(), "granted while held");
        assert!(started.elapsed() < Duration::from_secs(10), "the first waiter never queued");
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let next = tokio::spawn({
        let name = name.clone();
        async move { second.lock(&name).wait(Duration::from_secs(30)).await }
    });
    until("the second waiter is queued", || second_store.stats().waiting == 1).await;
    held.release().await.expect("release"); // the first waiter is next, and woken...
    drop(woken); // ...but gives up before it takes the lock
    let started = Instant::now();
    let g = next.await.expect("task").expect("the lock was passed on");
    assert!(started.elapsed() < Duration::from_secs(3), "passed on after {:?}", started.elapsed());
    g.release().await.expect("release");
}

/// Managers, guards and the backend are `Send + Sync`.
#[test]
fn types_are_send_and_sync() {
    fn check<T: Send + Sync + 'static>() {}
    check::<ZookeeperBackend>();
    check::<ZookeeperOptions>();
}

/// Regression (`lockctl watch` on ZooKeeper missed a lock taken between its look and its
/// wait): a change feed sees a change made after it was opened but before it is awaited,
/// after each change the next one, and after a wait dropped mid-way the change after it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_change_feed_sees_a_change_made_before_it_is_awaited() {
    use lock_runtime::backend::Inspect;

    let hosts = zk_server::shared().hosts();
    let store = backend(&hosts, &unique_root("feed")).await;
    let manager = LockManager::builder().backend(store.clone());
    let mut feed = store.changes("feed:").await.expect("a feed");
    // The change comes before `changed()` is called, as between a look and the wait after it.
    let guard = manager.lock("feed:1").await.expect("lock");
    let bound = Duration::from_secs(10);
    tokio::time::timeout(bound, feed.changed()).await.expect("the earlier change is seen").expect("feed");
    guard.release().await.expect("release");
    tokio::time::timeout(bound, feed.changed()).await.expect("the next change is seen").expect("feed");
    // A wait dropped after its first poll leaves the watches set: a change made before the
    // next wait is still seen.
    {
        let mut waiting = feed.changed();
        assert!(lock_tests::poll_once(&mut waiting).await.is_pending(), "nothing changed yet");
    }
    let again = manager.lock("feed:2").await.expect("lock");
    tokio::time::timeout(bound, feed.changed()).await.expect("seen after a dropped wait").expect("feed");
    again.release().await.expect("release");
}
