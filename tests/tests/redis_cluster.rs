//! The Redis backend on a real Redis Cluster (`redis-server --cluster-enabled yes` processes
//! this binary starts): the conformance suite on a shared 3-primary cluster, locks spread over
//! primaries, wake-ups across nodes, a primary killed under contention (failover), a slot
//! migrated under contention, a slot left half-migrated (`ASK`, `TRYAGAIN`), a failover that loses
//! a just-granted lock, the application's own `ClusterClient`, and bad input.

#![cfg(feature = "redis")]
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use lock_runtime::backend::redis::{KeyLayout, RedisBackend, RedisOptions};
use lock_runtime::{LockManager, LockManagerBuilder};
use lock_tests::redis_cluster::{self, slot_of, RedisCluster};

lock_tests::conformance_suite!(
    {
        let cluster = redis_cluster::shared();
        move |builder: LockManagerBuilder| {
            let urls = cluster.urls();
            async move { builder.redis_cluster(&urls).await.expect("connect") }
        }
    },
    kinds = [
        lock_runtime::backend::LockKind::Read,
        lock_runtime::backend::LockKind::Write,
        lock_runtime::backend::LockKind::Semaphore { permits: 1 }
    ],
    inspect = true
);

async fn manager(urls: &[String], timeout: Duration) -> LockManager {
    let backend = RedisBackend::cluster(urls, RedisOptions::default().command_timeout(timeout)).await.expect("connect");
    LockManager::builder().backend(backend)
}

/// A name (unique to this run) whose lock lives on primary `node` of `cluster`.
fn name_on(cluster: &RedisCluster, node: usize, label: &str) -> String {
    (0..)
        .map(|i| format!("{}-{i}", lock_tests::unique(label)))
        .find(|name| cluster.primary_of(name) == node)
        .expect("some name lands on every primary")
}

/// The node whose pub/sub connections listen on `channel` right now (`PUBSUB NUMSUB` counts a
/// node's own subscribers only), polled (no signal exists) until one does.
async fn subscriber_node(cluster: &RedisCluster, channel: &str) -> usize {
    let mut node = 0;
    lock_tests::eventually(&format!("a subscriber to {channel}"), Duration::from_secs(10), async || {
        let nodes = subscribed_nodes(cluster, channel);
        node = *nodes.first().ok_or("nobody")?;
        Ok::<(), &str>(())
    })
    .await;
    node
}

/// The nodes with a subscriber to `channel` now.
fn subscribed_nodes(cluster: &RedisCluster, channel: &str) -> Vec<usize> {
    (0..cluster.len())
        .filter(|&i| {
            let (_, n): (String, u64) = cluster.query(i, &["PUBSUB", "NUMSUB", channel]).expect("NUMSUB");
            n > 0
        })
        .collect()
}

/// Polls the lock's key (no signal exists) until a waiter marked it waited on.
async fn await_marked(cluster: &RedisCluster, name: &str) {
    let key = KeyLayout::of(name).lock;
    let owner = cluster.primary_of(name);
    lock_tests::eventually(&format!("{name} marked waited on"), Duration::from_secs(10), async || {
        let value: Option<String> = cluster.query(owner, &["GET", &key]).expect("GET");
        if value.as_ref().is_some_and(|v| v.ends_with('+')) {
            Ok(())
        } else {
            Err(value)
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn locks_on_different_primaries_are_held_at_once_and_listed() {
    let cluster = redis_cluster::shared();
    let urls = cluster.urls();
    let m = manager(&urls, Duration::from_secs(2)).await;
    let names: Vec<String> = (0..3).map(|node| name_on(cluster, node, "spread")).collect();
    let mut guards = Vec::new();
    for name in &names {
        guards.push(m.lock(name).wait(Duration::ZERO).await.expect("each primary grants its lock"));
    }
    // Every lock is where its slot says, and held at once.
    for (node, name) in names.iter().enumerate() {
        let value: Option<String> = cluster.query(node, &["GET", &KeyLayout::of(name).lock]).expect("GET");
        assert!(value.is_some(), "{name} is held on primary {node}");
        assert!(m.try_lock(name).await.expect("try_lock").is_none(), "{name} is held");
    }
    // `list` scans every primary, `inspect` finds each.
    let backend = RedisBackend::cluster(&urls, RedisOptions::default()).await.expect("connect");
    let prefix = names[0].split(':').next().expect("label");
    let listed: Vec<String> = backend.list(prefix).await.expect("list").into_iter().map(|l| l.key).collect();
    for name in &names {
        assert!(listed.contains(name), "{name} listed in {listed:?}");
        let info = backend.inspect(name).await.expect("inspect").expect("held");
        assert!(info.fencing_token.is_some());
    }
    for guard in guards {
        guard.release().await.expect("release");
    }
    for name in &names {
        assert!(backend.inspect(name).await.expect("inspect").is_none(), "{name} released");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_on_one_node_wakes_a_waiter_subscribed_on_another() {
    let cluster = redis_cluster::shared();
    let urls = cluster.urls();
    let holder = manager(&urls, Duration::from_secs(2)).await;
    let waiter = Arc::new(manager(&urls, Duration::from_secs(2)).await);
    // Find the node the waiter's pub/sub connection went to, with a first lock...
    let first = lock_tests::unique("warmup");
    let guard = holder.lock(&first).lease(Duration::from_secs(30)).await.expect("lock");
    let task = {
        let (waiter, first) = (waiter.clone(), first.clone());
        tokio::spawn(async move { waiter.lock(&first).wait(Duration::from_secs(10)).await.map(|g| g.release()) })
    };
    let subscribed_on = subscriber_node(cluster, &KeyLayout::of(&first).channel).await;
    guard.release().await.expect("release");
    task.await.expect("task").expect("granted").await.expect("release");
    // ... then hold one whose primary is another node.
    let other = (0..3).find(|&n| n != subscribed_on).expect("another primary");
    let name = name_on(cluster, other, "across");
    let guard = holder.lock(&name).lease(Duration::from_secs(30)).await.expect("lock");
    let started = Instant::now();
    let task = {
        let (waiter, name) = (waiter.clone(), name.clone());
        tokio::spawn(async move { waiter.lock(&name).wait(Duration::from_secs(10)).await })
    };
    await_marked(cluster, &name).await;
    assert_eq!(subscriber_node(cluster, &KeyLayout::of(&name).channel).await, subscribed_on, "same connection");
    guard.release().await.expect("release");
    // The lease (30 s) would end after the wait (10 s): only the publication can grant it.
    let granted = task.await.expect("task").expect("woken by the release published on another node");
    assert!(started.elapsed() < Duration::from_secs(10));
    granted.release().await.expect("release");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_pubsub_connection_moves_to_another_node_and_still_wakes_waiters() {
    let cluster = RedisCluster::start(3, 0);
    let urls = cluster.urls();
    let holder = manager(&urls, Duration::from_secs(1)).await;
    let waiter = Arc::new(manager(&urls, Duration::from_secs(1)).await);
    let name = lock_tests::unique("moved");
    let channel = KeyLayout::of(&name).channel;
    let guard = holder.lock(&name).lease(Duration::from_secs(30)).await.expect("lock");
    let task = {
        let (waiter, name) = (waiter.clone(), name.clone());
        tokio::spawn(async move { waiter.lock(&name).wait(Duration::from_secs(10)).await })
    };
    let first = subscriber_node(&cluster, &channel).await;
    let killed: i64 = cluster.query(first, &["CLIENT", "KILL", "TYPE", "pubsub"]).expect("CLIENT KILL");
    assert!(killed >= 1, "the waiter's pub/sub connection (and maybe the holder's)");
    // It comes back on the next node in turn, subscribed again (polled: no signal exists).
    let mut second = first;
    lock_tests::eventually("resubscribed on another node", Duration::from_secs(5), async || {
        match subscribed_nodes(&cluster, &channel)[..] {
            [node] if node != first => {
                second = node;
                Ok(())
            }
            ref on => Err(on.to_vec()),
        }
    })
    .await;
    guard.release().await.expect("release");
    // The lease (30 s) would end after the wait (10 s): only the publication can grant it.
    let granted = task.await.expect("task").expect("woken through the new connection");
    granted.release().await.expect("release");
    println!("pub/sub moved from node {first} to node {second}");
}

/// The application's own `ClusterClient` carries the locks: a lock held through it excludes a
/// manager made from the URLs (and the other way round), a waiter on it is woken by the
/// release (its pub/sub connections go to the nodes given; the lease, 30 s, outlasts the wait,
/// so only the publication can grant it), and a client given with no node URL is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_applications_cluster_client_carries_the_locks() {
    let cluster = redis_cluster::shared();
    let urls = cluster.urls();
    let client = redis::cluster::ClusterClient::new(urls.clone()).expect("the application's client");
    let backend = RedisBackend::cluster_from_client(client.clone(), &urls[..1], RedisOptions::default())
        .await
        .expect("on the client");
    let theirs = Arc::new(LockManager::builder().backend(backend));
    let ours = manager(&urls, Duration::from_secs(2)).await;
    let name = lock_tests::unique("app-client");
    let held = theirs.lock(&name).lease(Duration::from_secs(30)).await.expect("lock through the client");
    assert!(ours.try_lock(&name).await.expect("try").is_none(), "held through the client");
    held.release().await.expect("release");
    let held = ours.lock(&name).lease(Duration::from_secs(30)).await.expect("lock through the URLs");
    let waiter = {
        let (theirs, name) = (theirs.clone(), name.clone());
        tokio::spawn(async move { theirs.lock(&name).wait(Duration::from_secs(10)).await })
    };
    await_marked(cluster, &name).await;
    held.release().await.expect("release");
    let granted = waiter.await.expect("task").expect("woken by the release");
    granted.release().await.expect("release");
    let none: [&str; 0] = [];
    let err = RedisBackend::cluster_from_client(client, none, RedisOptions::default()).await.expect_err("no nodes");
    assert!(err.is_invalid() && err.to_string().contains("pub/sub"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_is_invalid_and_nothing_listening_is_a_backend_error() {
    let none: [&str; 0] = [];
    let err = LockManager::redis_cluster(none).await.expect_err("no node");
    assert!(err.is_invalid(), "{err}");
    for bad in ["not a url", "http://127.0.0.1:7000", "redis+unix:///tmp/redis.sock"] {
        let err = LockManager::redis_cluster([bad]).await.expect_err(bad);
        assert!(err.is_invalid(), "{bad}: {err}");
    }
    let err =
        RedisBackend::cluster(["redis://127.0.0.1:7000"], RedisOptions::default().command_timeout(Duration::ZERO))
            .await
            .expect_err("zero timeout");
    assert!(err.is_invalid(), "{err}");
    let wait = RedisOptions::default().wait_for_replicas(1, Duration::from_millis(100));
    let err = RedisBackend::cluster(["redis://127.0.0.1:7000"], wait).await.expect_err("WAIT on a cluster");
    assert!(err.is_invalid() && err.to_string().contains("wait_for_replicas"), "{err}");
    let timeout = Duration::from_millis(500);
    let nobody = [format!("redis://127.0.0.1:{}", lock_tests::free_port())];
    let started = Instant::now();
    let err = RedisBackend::cluster(&nobody, RedisOptions::default().command_timeout(timeout))
        .await
        .expect_err("nothing listens");
    assert!(err.is_backend(), "{err}");
    assert!(started.elapsed() < timeout + Duration::from_millis(250), "bounded by the command timeout");
    // Must accept a slice of literals.
    let literals = &["redis://127.0.0.1:1", "redis://127.0.0.1:2"];
    let err = LockManager::builder().redis_cluster(literals).await.expect_err("nothing listens");
    assert!(err.is_backend(), "{err}");
}

/// Every valid name works on every kind: a name that begins with `}` gives its state key an
/// empty hash tag (`lock:rw:{}…}`), so the key is hashed whole; its fencing counter must still be
/// in the key's slot (it was the mutex key's, another slot: CROSSSLOT, shown as a backend error).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn names_with_an_empty_hash_tag_work_on_every_kind() {
    let cluster = redis_cluster::shared();
    let m = manager(&cluster.urls(), Duration::from_secs(2)).await;
    let unique = lock_tests::unique("tag");
    for name in [format!("}}{unique}"), format!("}}{{{unique}}}"), format!("{{}}{unique}"), format!("a}}{unique}{{")] {
        let read = m.read_lock(&name).wait(Duration::ZERO).await.unwrap_or_else(|e| panic!("read {name}: {e}"));
        let again = m.try_read_lock(&name).await.expect("a second reader").expect("readers share");
        assert!(m.try_write_lock(&name).await.expect("try write").is_none(), "{name}: readers exclude a writer");
        read.release().await.expect("release");
        again.release().await.expect("release");
        let write = m.write_lock(&name).wait(Duration::ZERO).await.unwrap_or_else(|e| panic!("write {name}: {e}"));
        assert!(write.fencing_token() > 0);
        write.release().await.expect("release");
        let permit = m.semaphore(&name, 1).wait(Duration::ZERO).await.unwrap_or_else(|e| panic!("permit {name}: {e}"));
        assert!(m.try_semaphore(&name, 1).await.expect("try permit").is_none(), "{name}: one permit");
        permit.release().await.expect("release");
        let mutex = m.lock(&name).wait(Duration::ZERO).await.unwrap_or_else(|e| panic!("lock {name}: {e}"));
        mutex.release().await.expect("release");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_are_granted_after_their_holders_primary_fails_over() {
    let mut cluster = RedisCluster::start(3, 1);
    let urls = cluster.urls();
    let timeout = Duration::from_millis(1000);
    let wait = Duration::from_secs(25);
    let name = lock_tests::unique("failover");
    let victim = cluster.primary_of(&name);
    // Renewed by the watchdog every second (a 3 s lease).
    let backend =
        RedisBackend::cluster(&urls, RedisOptions::default().command_timeout(timeout)).await.expect("connect");
    let holder = LockManager::builder().default_lease(Duration::from_secs(3)).backend(backend);
    let guard = holder.lock(&name).await.expect("lock");
    let first_token = guard.fencing_token();
    let granted = Arc::new(AtomicUsize::new(0));
    let key = KeyLayout::of(&name).lock;
    let mut waiters = Vec::new();
    for i in 0..3 {
        if i > 0 {
            // The mark of the waiter before is taken off, so that the mark seen again below is
            // this waiter's first attempt: every waiter waits before the primary is killed (a
            // first attempt meeting the outage fails at once, as documented).
            let marked: String = cluster.query(victim, &["GET", &key]).expect("GET");
            let unmarked = marked.strip_suffix('+').expect("marked");
            let _: String = cluster.query(victim, &["SET", &key, unmarked, "KEEPTTL", "XX"]).expect("SET");
        }
        let backend =
            RedisBackend::cluster(&urls, RedisOptions::default().command_timeout(timeout)).await.expect("connect");
        let m = LockManager::builder().backend(backend.clone());
        let (waiting, granted) = (name.clone(), granted.clone());
        waiters.push(tokio::spawn(async move {
            let started = Instant::now();
            let outcome = m.lock(&waiting).wait(wait).await;
            let took = started.elapsed();
            let guard = outcome.map_err(|e| format!("{e} after {took:?}"))?;
            let token = guard.fencing_token();
            granted.fetch_add(1, Ordering::SeqCst);
            guard.release().await.map_err(|e| e.to_string())?;
            Ok::<_, String>((took, token))
        }));
        // Its first attempt was answered busy: it waits in its backend's queue. (The mark alone
        // may be an earlier waiter's look at the lock, made while this one still connected.)
        lock_tests::eventually("the waiter queued", Duration::from_secs(10), async || match backend.local_waiters() {
            1 => Ok(()),
            n => Err(n),
        })
        .await;
        await_marked(&cluster, &name).await;
    }
    let held: String = cluster.query(victim, &["GET", &key]).expect("GET");
    let owner = held.split('#').next().expect("owner").to_owned();
    let killed_at = Instant::now();
    cluster.kill(victim);
    let promoted = tokio::task::block_in_place(|| cluster.wait_for_failover(victim, Duration::from_secs(20)));
    assert_ne!(promoted, victim);
    let failed_over = killed_at.elapsed();
    // Async replication: the promoted replica kept the lock, or not. Kept, its holder renews
    // and releases it; lost, the holder's next renewal finds it gone (or a waiter's) and says so.
    let kept: Option<String> = cluster.query(promoted, &["GET", &key]).expect("GET");
    let kept = kept.is_some_and(|v| v.split('#').next() == Some(owner.as_str()));
    if !kept {
        tokio::time::timeout(Duration::from_secs(5), guard.lost())
            .await
            .expect("a lock lost with its primary fires lost()");
    }
    match guard.release().await {
        Ok(()) => assert!(kept, "a lost lock cannot be released"),
        Err(e) => assert!(e.is_lost(), "{e}"),
    }
    let mut tokens = Vec::new();
    for w in waiters {
        let (took, token) = w.await.expect("task").expect("every waiter is granted after the failover");
        assert!(took < wait + timeout, "bounded by its wait: {took:?}");
        assert!(token > first_token, "tokens still increase: {token} after {first_token}");
        tokens.push(token);
    }
    assert_eq!(granted.load(Ordering::SeqCst), 3);
    tokens.sort_unstable();
    tokens.dedup();
    assert_eq!(tokens.len(), 3, "distinct tokens");
    // New locks work, on the promoted primary too.
    let fresh = name_on(&cluster, promoted, "after-failover");
    let g = holder.lock(&fresh).wait(Duration::from_secs(2)).await.expect("new lock on the promoted primary");
    g.release().await.expect("release");
    println!(
        "failover took {failed_over:?}; the lock was {} by the promoted replica; all waiters granted {:?} after the kill",
        if kept { "kept" } else { "lost" },
        killed_at.elapsed()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slot_migrated_under_contention_keeps_mutual_exclusion() {
    let cluster = Arc::new(RedisCluster::start(3, 0));
    let urls = cluster.urls();
    let name = lock_tests::unique("migrate");
    let from = cluster.primary_of(&name);
    let to = (from + 1) % 3;
    let slot = slot_of(&name);
    let stop = Arc::new(AtomicBool::new(false));
    let inside = Arc::new(AtomicUsize::new(0));
    let counter = Arc::new(AtomicU64::new(0));
    let last_token = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for t in 0..6 {
        // Two processes' worth of backends: local queues and pub/sub both in play.
        let m = Arc::new(manager(&urls, Duration::from_secs(2)).await);
        let (name, stop, inside, counter, last_token) =
            (name.clone(), stop.clone(), inside.clone(), counter.clone(), last_token.clone());
        tasks.push(tokio::spawn(async move {
            let mut rounds = 0u64;
            while !stop.load(Ordering::SeqCst) || rounds == 0 {
                let guard = m.lock(&name).wait(Duration::from_secs(20)).await.map_err(|e| format!("task {t}: {e}"))?;
                let token = guard.fencing_token();
                let previous = last_token.swap(token, Ordering::SeqCst);
                assert!(token > previous, "tokens strictly increase: {token} after {previous}");
                assert_eq!(inside.fetch_add(1, Ordering::SeqCst), 0, "two holders at once");
                let seen = counter.load(Ordering::SeqCst);
                tokio::task::yield_now().await;
                counter.store(seen + 1, Ordering::SeqCst);
                inside.fetch_sub(1, Ordering::SeqCst);
                guard.release().await.map_err(|e| format!("task {t}: release: {e}"))?;
                rounds += 1;
            }
            Ok::<u64, String>(rounds)
        }));
    }
    // Contention is running: wait until some hand-offs happened, then migrate the slot.
    hand_offs_reach(&counter, 20, "hand-offs before the migration").await;
    let before = counter.load(Ordering::SeqCst);
    let c = cluster.clone();
    tokio::task::spawn_blocking(move || c.migrate_slot(slot, from, to)).await.expect("migration");
    assert_eq!(cluster.primary_of(&name), to, "the slot moved");
    // More hand-offs on the new primary, then stop.
    let moved_at = counter.load(Ordering::SeqCst);
    hand_offs_reach(&counter, moved_at + 20, "hand-offs after the migration").await;
    stop.store(true, Ordering::SeqCst);
    let mut total = 0;
    for task in tasks {
        total += task.await.expect("task").expect("every task finishes");
    }
    assert_eq!(counter.load(Ordering::SeqCst), total, "no lost update");
    let key = KeyLayout::of(&name).lock;
    let exists: i64 = cluster.query(to, &["EXISTS", &key]).expect("EXISTS");
    assert_eq!(exists, 0, "released on the new primary");
    println!("{total} acquisitions, {before} before the migration, {} during it", moved_at - before);
}

/// A counter of node `i`'s `INFO <section>`: field `field` of line `<line>:...` (e.g.
/// `cmdstat_asking` / `calls`, `errorstat_TRYAGAIN` / `count`); 0 when absent.
fn stat(cluster: &RedisCluster, i: usize, section: &str, line: &str, field: &str) -> u64 {
    let info: String = cluster.query(i, &["INFO", section]).expect("INFO");
    info.lines()
        .find_map(|l| l.trim().strip_prefix(line)?.strip_prefix(':').map(str::to_owned))
        .and_then(|rest| rest.split(',').find_map(|kv| kv.strip_prefix(field)?.strip_prefix('=')?.parse().ok()))
        .unwrap_or(0)
}

fn setslot(cluster: &RedisCluster, node: usize, slot: u16, state: &str, id: Option<&str>) {
    let slot = slot.to_string();
    let mut args = vec!["CLUSTER", "SETSLOT", &slot, state];
    args.extend(id);
    let _: String = cluster.query(node, &args).expect("CLUSTER SETSLOT");
}

/// A lock's slot left half-migrated by hand (`SETSLOT IMPORTING` on the target, `MIGRATING`
/// on the source), with real `ASK` and `TRYAGAIN` answers:
/// (a) nothing of the slot on the source: the source answers `ASK`, the client follows it to
/// the target (`ASKING` counted there), and the target answers the two-key acquire script
/// `TRYAGAIN` (Redis serves a multi-key command on an importing slot only when all its keys
/// are there): the attempt ends within the command timeout with a backend error, and leaves
/// no key anywhere;
/// (b) a lock held, its fencing counter moved to the target but not the lock: a second
/// attempt gets `TRYAGAIN` from the source, ends within the command timeout as a backend
/// error (never a second grant); once the migration is finished, the holder still holds and
/// releases, and the next lock's token is above the holder's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slot_left_mid_migration_is_redirected_and_never_grants_twice() {
    let cluster = RedisCluster::start(3, 0);
    let urls = cluster.urls();
    let timeout = Duration::from_millis(1000);
    let name = lock_tests::unique("halfway");
    let layout = KeyLayout::of(&name);
    let slot = slot_of(&name);
    let (src, dst) = (cluster.primary_of(&name), (cluster.primary_of(&name) + 1) % 3);
    let (src_id, dst_id) = (cluster.node_id(src), cluster.node_id(dst));
    let holder = manager(&urls, timeout).await;
    let other = manager(&urls, timeout).await;
    let bound = timeout + Duration::from_millis(500);

    // (a) An empty slot, half-migrated.
    setslot(&cluster, dst, slot, "IMPORTING", Some(&src_id));
    setslot(&cluster, src, slot, "MIGRATING", Some(&dst_id));
    let asking = stat(&cluster, dst, "commandstats", "cmdstat_asking", "calls");
    let tryagain = stat(&cluster, dst, "errorstats", "errorstat_TRYAGAIN", "count");
    let started = Instant::now();
    let outcome = other.try_lock(&name).await;
    let took = started.elapsed();
    println!(
        "(a) a new lock on an empty half-migrated slot: {:?} after {took:?}",
        outcome.as_ref().map(Option::is_some)
    );
    assert!(took < bound, "bounded by the command timeout: {took:?}");
    assert!(stat(&cluster, dst, "commandstats", "cmdstat_asking", "calls") > asking, "ASK followed to the target");
    match outcome {
        Ok(Some(guard)) => {
            let on_target: i64 = cluster.query(dst, &["EXISTS", &layout.lock]).expect("EXISTS");
            assert_eq!(on_target, 1, "granted on the target");
            guard.release().await.expect("release");
        }
        Ok(None) => panic!("nobody holds {name}"),
        Err(e) => {
            assert!(e.is_backend(), "{e}");
            assert!(
                stat(&cluster, dst, "errorstats", "errorstat_TRYAGAIN", "count") > tryagain,
                "the target refused the two-key script with TRYAGAIN: {e}"
            );
            for node in [src, dst] {
                let n: i64 =
                    cluster.query(node, &["CLUSTER", "COUNTKEYSINSLOT", &slot.to_string()]).expect("COUNTKEYSINSLOT");
                assert_eq!(n, 0, "nothing granted on node {node}");
            }
        }
    }
    // The slot back to stable on the source.
    setslot(&cluster, dst, slot, "STABLE", None);
    setslot(&cluster, src, slot, "STABLE", None);

    // (b) A lock held, then the slot half-migrated with only its counter moved.
    let guard = holder.lock(&name).lease(Duration::from_secs(30)).await.expect("lock");
    let first = guard.fencing_token();
    setslot(&cluster, dst, slot, "IMPORTING", Some(&src_id));
    setslot(&cluster, src, slot, "MIGRATING", Some(&dst_id));
    let dst_port = cluster.port(dst).to_string();
    let _: String = cluster
        .query(src, &["MIGRATE", "127.0.0.1", &dst_port, "", "0", "5000", "KEYS", &layout.fence])
        .expect("MIGRATE the counter");
    let tryagain = stat(&cluster, src, "errorstats", "errorstat_TRYAGAIN", "count");
    let started = Instant::now();
    let outcome = other.try_lock(&name).await;
    let took = started.elapsed();
    println!("(b) a second lock, counter moved: {:?} after {took:?}", outcome.as_ref().map(Option::is_some));
    assert!(took < bound, "bounded by the command timeout: {took:?}");
    match outcome {
        Ok(Some(_)) => panic!("a second holder of {name}"),
        Ok(None) => {}
        Err(e) => assert!(e.is_backend(), "{e}"),
    }
    assert!(stat(&cluster, src, "errorstats", "errorstat_TRYAGAIN", "count") > tryagain, "TRYAGAIN answered");
    assert!(!guard.is_lost());

    // The migration finished: the rest of the slot moved, every primary told.
    let rest: Vec<String> =
        cluster.query(src, &["CLUSTER", "GETKEYSINSLOT", &slot.to_string(), "100"]).expect("GETKEYSINSLOT");
    assert_eq!(rest, std::slice::from_ref(&layout.lock), "the lock key is what is left");
    let _: String = cluster
        .query(src, &["MIGRATE", "127.0.0.1", &dst_port, "", "0", "5000", "KEYS", &layout.lock])
        .expect("MIGRATE the lock");
    setslot(&cluster, dst, slot, "NODE", Some(&dst_id));
    setslot(&cluster, src, slot, "NODE", Some(&dst_id));
    setslot(&cluster, (dst + 1) % 3, slot, "NODE", Some(&dst_id));
    assert_eq!(cluster.primary_of(&name), dst);
    assert!(other.try_lock(&name).await.expect("try_lock").is_none(), "still held, on the target");
    assert!(!guard.is_lost());
    guard.release().await.expect("the holder still held it");
    let next = other.lock(&name).wait(Duration::from_secs(2)).await.expect("the next lock");
    assert!(next.fencing_token() > first, "tokens increase: {} after {first}", next.fencing_token());
    next.release().await.expect("release");

    // (c) A lock held while its slot starts migrating (nothing moved yet): its release still
    // works, since the release script declares the lock key only (the channel, which is no
    // key, is an argument; declared as a key it would be refused with TRYAGAIN).
    let guard = holder.lock(&name).lease(Duration::from_secs(30)).await.expect("lock");
    setslot(&cluster, src, slot, "IMPORTING", Some(&dst_id));
    setslot(&cluster, dst, slot, "MIGRATING", Some(&src_id));
    let started = Instant::now();
    guard.release().await.expect("released while its slot migrates");
    assert!(started.elapsed() < bound, "{:?}", started.elapsed());
    let left: Vec<String> =
        cluster.query(dst, &["CLUSTER", "GETKEYSINSLOT", &slot.to_string(), "100"]).expect("GETKEYSINSLOT");
    assert!(!left.contains(&layout.lock), "the key is gone: {left:?}");
    setslot(&cluster, src, slot, "STABLE", None);
    setslot(&cluster, dst, slot, "STABLE", None);
}

/// The replica of primary `primary` (its `INFO replication` names the primary's port).
fn replica_of(cluster: &RedisCluster, primary: usize) -> usize {
    let port = format!("master_port:{}", cluster.port(primary));
    (0..cluster.len())
        .find(|&i| {
            let info: String = cluster.query(i, &["INFO", "replication"]).unwrap_or_default();
            info.lines().any(|l| l.trim() == "role:slave") && info.lines().any(|l| l.trim() == port)
        })
        .expect("the primary has a replica")
}

/// Writes `FILL_MB` MB (values of 8 MB, each well within the harness's 2 s per command, keys of
/// the lock's slot) on its primary, so that the
/// replication stream to a frozen replica overflows the kernel's socket buffers (a few MB on
/// loopback) and what is written next waits in the primary's own memory. (Without it, the
/// grant sits in the frozen replica's socket buffer and is read on resume: the lock is kept.)
const FILL_MB: usize = 64;
const FILL: &str = "redis.call('set', KEYS[1], string.rep('x', tonumber(ARGV[1]))) return 1";

/// A lock granted while its primary's replica was frozen behind a full replication stream:
/// the primary killed, the replica resumed and promoted (without the lock: it never got it),
/// the holder's guard reports `lost()`, a second manager is granted the name, with a token
/// above the first holder's (minted from the promoted node's clock; its counter was not
/// replicated either).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failover_that_loses_a_just_granted_lock_reports_it_lost_and_tokens_still_increase() {
    let mut cluster = RedisCluster::start(3, 1);
    let urls = cluster.urls();
    let timeout = Duration::from_millis(1000);
    let name = lock_tests::unique("lostgrant");
    let key = KeyLayout::of(&name).lock;
    let victim = cluster.primary_of(&name);
    let replica = replica_of(&cluster, victim);
    // The stream to the frozen replica may grow past the default limits (64 MB for 60 s).
    let _: String =
        cluster.query(victim, &["CONFIG", "SET", "client-output-buffer-limit", "replica 0 0 0"]).expect("CONFIG SET");
    let backend =
        RedisBackend::cluster(&urls, RedisOptions::default().command_timeout(timeout)).await.expect("connect");
    let holder = LockManager::builder().default_lease(Duration::from_secs(3)).backend(backend);

    cluster.pause(replica);
    let frozen = Instant::now();
    let size = (8 << 20).to_string();
    for i in 0..FILL_MB / 8 {
        let filler = format!("filler:{{{name}}}:{i}");
        let _: i64 = cluster.query(victim, &["EVAL", FILL, "1", &filler, &size]).expect("fill");
    }
    let guard = holder.lock(&name).await.expect("lock");
    let first = guard.fencing_token();
    cluster.kill(victim);
    cluster.resume(replica);
    println!("replica frozen for {:?}", frozen.elapsed());
    let killed_at = Instant::now();
    let promoted = tokio::task::block_in_place(|| cluster.wait_for_failover(victim, Duration::from_secs(20)));
    assert_eq!(promoted, replica, "the only replica of the killed primary took over");
    let failed_over = killed_at.elapsed();
    let kept: Option<String> = cluster.query(promoted, &["GET", &key]).expect("GET");
    assert_eq!(kept, None, "the promoted replica never got the grant");

    tokio::time::timeout(Duration::from_secs(10), guard.lost()).await.expect("the holder is told it lost the lock");
    let second = manager(&urls, timeout).await;
    let took = Instant::now();
    let again = second.lock(&name).wait(Duration::from_secs(5)).await.expect("granted on the promoted primary");
    assert!(again.fencing_token() > first, "tokens increase: {} after {first}", again.fencing_token());
    let err = guard.release().await.expect_err("a lost lock is not released");
    assert!(err.is_lost(), "{err}");
    again.release().await.expect("release");
    println!("failover took {failed_over:?}; the second lock {:?} after it", took.elapsed());
}

/// Waits (10 s at most) until the hand-off `counter` reaches `want`.
async fn hand_offs_reach(counter: &AtomicU64, want: u64, what: &str) {
    lock_tests::eventually(what, Duration::from_secs(10), async || {
        let done = counter.load(Ordering::SeqCst);
        if done >= want {
            Ok(())
        } else {
            Err(done)
        }
    })
    .await;
}

/// A primary cut off with its clients on its side, on a private network (`lock_tests::netns`):
/// three primaries with a replica each, every node in a namespace of its own; see
/// `lock_tests::partitions::a_redis_primary_cut_off_with_its_clients` for what is checked. A
/// primary that cannot reach the majority of primaries for `cluster-node-timeout` (1 s here)
/// stops taking writes, so the holder's renewals fail on its side.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn partition_a_primary_cut_off_with_its_clients_lets_the_majority_grant_and_tokens_fence_it() {
    let cluster = tokio::task::block_in_place(|| RedisCluster::start_partitionable(3, 1, 2));
    let net = cluster.net().expect("a private network");
    let urls = cluster.urls();
    let connect = move || {
        let urls = urls.clone();
        async move {
            let options = RedisOptions::default().command_timeout(Duration::from_secs(1));
            let backend = RedisBackend::cluster(&urls, options).await.expect("connect");
            LockManager::builder().default_lease(lock_tests::partitions::PRIMARY_CUT_LEASE).backend(backend)
        }
    };
    let primary_of = |name: &str| cluster.primary_of(name);
    lock_tests::partitions::a_redis_primary_cut_off_with_its_clients(net, primary_of, connect, "redis-cluster").await;
}
