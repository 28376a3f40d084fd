//! The Redis backend on a Sentinel-managed primary, against real `redis-server` and
//! `redis-sentinel` processes this binary starts: the conformance suite, plain and with
//! `wait_for_replicas` (one shared setup),
//! failovers followed (a killed primary, a demoted one restarted, a manual failover with the
//! old primary alive, a primary demoted by hand under open connections: `READONLY`),
//! `wait_for_replicas`, a failover that loses a just-granted lock (tokens still increase), and
//! bad input.

#![cfg(feature = "redis")]
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod redis_support;

use std::time::{Duration, Instant};

use lock_runtime::backend::redis::{KeyLayout, RedisBackend, RedisOptions};
use lock_runtime::{LockError, LockManager, LockManagerBuilder};
use lock_tests::redis_sentinel::{SentinelSetup, MASTER};
use lock_tests::redis_server::{free_port, RedisServer};
use lock_tests::unique;
use redis_support::raw;

lock_tests::conformance_suite!(
    {
        let urls = tokio::task::block_in_place(|| SentinelSetup::shared().sentinel_urls());
        move |builder: LockManagerBuilder| {
            let urls = urls.clone();
            async move { builder.redis_sentinel(&urls, MASTER).await.expect("connect") }
        }
    },
    kinds = [
        lock_runtime::backend::LockKind::Read,
        lock_runtime::backend::LockKind::Write,
        lock_runtime::backend::LockKind::Semaphore { permits: 1 }
    ],
    inspect = true
);

/// The conformance suite again with every grant and renewal waiting for the replica.
mod waiting_for_replicas {
    use super::*;

    lock_tests::conformance_suite!(
        {
            let urls = tokio::task::block_in_place(|| SentinelSetup::shared().sentinel_urls());
            move |builder: LockManagerBuilder| {
                let urls = urls.clone();
                async move {
                    let options = RedisOptions::default().wait_for_replicas(1, Duration::from_millis(500));
                    builder.backend(RedisBackend::sentinel(&urls, MASTER, options).await.expect("connect"))
                }
            }
        },
        kinds = [
            lock_runtime::backend::LockKind::Read,
            lock_runtime::backend::LockKind::Write,
            lock_runtime::backend::LockKind::Semaphore { permits: 1 }
        ],
        inspect = true
    );
}

/// The bound on every command in the failover tests.
const TIMEOUT: Duration = Duration::from_secs(1);

async fn backend(setup: &SentinelSetup, options: RedisOptions) -> RedisBackend {
    RedisBackend::sentinel(setup.sentinel_urls(), MASTER, options).await.expect("connect")
}

async fn exists(server: &RedisServer, name: &str) -> bool {
    let n: i64 =
        redis::cmd("EXISTS").arg(KeyLayout::of(name).lock).query_async(&mut raw(server).await).await.expect("EXISTS");
    n == 1
}

/// Locks `name` through `m`, again and again (each attempt bounded by the command timeout)
/// while the backend reports a backend error, for at most `bound`: how long it took.
async fn lock_within(m: &LockManager, name: &str, bound: Duration) -> Duration {
    let started = Instant::now();
    loop {
        match m.lock(name).wait(Duration::from_secs(5)).await {
            Ok(guard) => {
                guard.release().await.expect("release");
                return started.elapsed();
            }
            Err(e) if e.is_backend() && started.elapsed() < bound => {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(e) => panic!("no lock within {bound:?} after the failover: {e}"),
        }
    }
}

/// A lock held, the primary killed: new acquisitions through the same manager succeed within
/// 10 s of the promotion; a waiter of another backend that waited across the failover is
/// granted after the holder lets go on the new primary (pub/sub followed the switch), with a
/// higher token; the holder's release succeeds (its key was replicated) or reports it lost
/// (it was not), and nothing hangs. Then the old primary restarted comes back as a replica,
/// and new locks land on the new primary.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_primary_is_followed_and_the_demoted_one_is_not_written_to() {
    let mut setup = tokio::task::block_in_place(|| SentinelSetup::start(1, 3));
    let options = RedisOptions::default().command_timeout(TIMEOUT).ping_interval(Duration::from_millis(500));
    let holder_m = LockManager::builder().backend(backend(&setup, options.clone()).await);
    let waiter_backend = backend(&setup, options).await;
    let waiter_m = LockManager::builder().backend(waiter_backend.clone());
    let name = unique("failover");

    let held = holder_m.lock(&name).await.expect("first");
    let token = held.fencing_token();
    let waiter = {
        let (m, name) = (waiter_m.clone(), name.clone());
        tokio::spawn(async move { m.lock(&name).wait(Duration::from_secs(40)).await })
    };
    lock_tests::eventually("the waiter queued", Duration::from_secs(5), async || {
        lock_tests::reached(waiter_backend.local_waiters(), 1)
    })
    .await;

    let old = setup.primary_index();
    setup.kill(old);
    let new = tokio::task::block_in_place(|| setup.wait_for_new_primary(old));
    assert_ne!(new, old);

    // New acquisitions through the same manager.
    let took = lock_within(&holder_m, &unique("after"), Duration::from_secs(10)).await;
    println!("first lock after the promotion took {took:?}");

    // The old holder: released cleanly (its key made it to the replica) or lost (it did not).
    let released = tokio::time::timeout(Duration::from_secs(10), held.release()).await.expect("release hangs");
    match &released {
        Ok(()) => {}
        Err(e) => assert!(e.is_lost() || e.is_backend(), "unexpected release error: {e}"),
    }
    let guard = tokio::time::timeout(Duration::from_secs(45), waiter)
        .await
        .expect("the waiter hangs")
        .expect("waiter task")
        .expect("the waiter across the failover is granted");
    assert!(guard.fencing_token() > token, "tokens increase across the failover");
    guard.release().await.expect("release");

    // The old primary comes back (empty, as a primary) and is demoted by the sentinels (on a
    // loaded machine they may then fail over once more, back to it: either way, one node is
    // a replica in sync and the lock goes to the other).
    setup.restart(old);
    let replica = tokio::task::block_in_place(|| setup.wait_for_replica_of(&[old, new]));
    let primary = setup.primary_index();
    assert_ne!(primary, replica);
    let name = unique("demoted");
    let guard = holder_m.lock(&name).wait(Duration::from_secs(5)).await.expect("lock after the restart");
    assert!(exists(setup.node(primary), &name).await, "the lock is on the current primary");
    guard.release().await.expect("release");
    assert!(!exists(setup.node(primary), &name).await);
}

/// A manual failover leaves the old primary alive (demoted to a replica): commands and the
/// waiters' subscription move to the new primary. A waiter of another backend, waiting across
/// it, is woken by a release published on the new primary long before its holder's 60 s lease
/// would run out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_manual_failover_moves_commands_and_subscriptions() {
    let setup = tokio::task::block_in_place(|| SentinelSetup::start(1, 3));
    let options = RedisOptions::default().command_timeout(TIMEOUT);
    let holder_m = LockManager::builder().backend(backend(&setup, options.clone()).await);
    let waiter_backend = backend(&setup, options).await;
    let waiter_m = LockManager::builder().backend(waiter_backend.clone());
    let name = unique("manual");

    let held = holder_m.lock(&name).lease(Duration::from_secs(60)).await.expect("first");
    let waiter = {
        let (m, name) = (waiter_m.clone(), name.clone());
        tokio::spawn(async move { m.lock(&name).wait(Duration::from_secs(40)).await })
    };
    lock_tests::eventually("the waiter queued", Duration::from_secs(5), async || {
        lock_tests::reached(waiter_backend.local_waiters(), 1)
    })
    .await;
    // Its subscription is confirmed on the old primary.
    let old = setup.primary_index();
    let mut conn = raw(setup.node(old)).await;
    redis_support::await_numsub(&mut conn, &KeyLayout::of(&name).channel, 1).await;

    let sentinel = redis::Client::open(setup.sentinel_urls()[0].as_str()).expect("url");
    let mut sentinel = sentinel.get_multiplexed_async_connection().await.expect("sentinel");
    let _: String =
        redis::cmd("SENTINEL").arg("FAILOVER").arg(MASTER).query_async(&mut sentinel).await.expect("FAILOVER");
    let new = tokio::task::block_in_place(|| setup.wait_for_new_primary(old));
    tokio::task::block_in_place(|| setup.wait_for_replica(old));

    // The sentinels end the clients of the demoted primary: the holder's manager finds the
    // new one (a command may fail meanwhile), then releases there (a manual failover waits
    // for the replica to catch up, so the key is there).
    lock_within(&holder_m, &unique("after"), Duration::from_secs(10)).await;
    let released_at = Instant::now();
    tokio::time::timeout(Duration::from_secs(10), held.release())
        .await
        .expect("release hangs")
        .expect("released on the new primary");
    let guard = tokio::time::timeout(Duration::from_secs(45), waiter)
        .await
        .expect("the waiter hangs")
        .expect("waiter task")
        .expect("the waiter across the failover is granted");
    let handed = released_at.elapsed();
    assert!(handed < Duration::from_secs(30), "woken by its holder's lease, not the release: {handed:?}");
    assert!(exists(setup.node(new), &name).await, "the waiter's lock is on the new primary");
    guard.release().await.expect("release");
}

/// `wait_for_replicas(1, 500 ms)`: a granted lock's key is on the replica when the acquisition
/// returns; with the replica frozen the acquisition fails with a backend error naming the
/// replicas, and its grant is undone (the key is not left held). The same for a read lock. On
/// Sentinel and on one server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wait_for_replicas_covers_the_grant_or_undoes_it() {
    let setup = tokio::task::block_in_place(|| SentinelSetup::start(1, 1));
    let options = RedisOptions::default().command_timeout(TIMEOUT).wait_for_replicas(1, Duration::from_millis(500));
    let on_sentinel = LockManager::builder().backend(backend(&setup, options.clone()).await);
    let primary = setup.primary_index();
    let on_server = LockManager::builder()
        .backend(RedisBackend::connect_with(&setup.node(primary).url(), options).await.expect("connect"));
    let replica = 1 - primary;
    for m in [&on_sentinel, &on_server] {
        let name = unique("waited");
        let guard = m.lock(&name).await.expect("granted with one replica");
        assert!(exists(setup.node(replica), &name).await, "the key is on the replica when the lock returns");
        guard.release().await.expect("release");

        setup.pause(replica);
        let name = unique("short");
        let err: LockError = m.lock(&name).wait(Duration::from_secs(3)).await.expect_err("no replica acknowledges");
        setup.resume(replica);
        assert!(err.is_backend(), "{err}");
        assert!(err.to_string().contains("0 of the 1 required replica"), "{err}");
        assert!(!exists(setup.node(primary), &name).await, "the grant was undone");
        // And the name is free again for the next one.
        m.lock(&name).await.expect("after resume").release().await.expect("release");

        // Read-write locks wait for the replica too, and undo a grant it did not acknowledge:
        // a writer gets in at once after the resume (a reader's entry left behind would block it).
        setup.pause(replica);
        let name = unique("short-reader");
        let err = m.read_lock(&name).wait(Duration::from_secs(3)).await.expect_err("no replica acknowledges");
        setup.resume(replica);
        assert!(err.is_backend(), "{err}");
        assert!(err.to_string().contains("0 of the 1 required replica"), "{err}");
        let writer = m.write_lock(&name).wait(Duration::ZERO).await.expect("the reader's grant was undone");
        writer.release().await.expect("release");
    }
}

/// Bad input: `is_invalid` at once; an unknown master or no sentinel reachable: `is_backend`
/// within the command timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_is_refused() {
    let none: [&str; 0] = [];
    let invalid = [
        LockManager::redis_sentinel(none, MASTER).await.expect_err("empty list"),
        LockManager::redis_sentinel(["not a url"], MASTER).await.expect_err("malformed"),
        LockManager::redis_sentinel(["redis://127.0.0.1:26379"], "").await.expect_err("empty name"),
        RedisBackend::sentinel(
            ["redis://127.0.0.1:26379"],
            MASTER,
            RedisOptions::default().wait_for_replicas(0, TIMEOUT / 2),
        )
        .await
        .expect_err("no replicas"),
        RedisBackend::sentinel(
            ["redis://127.0.0.1:26379"],
            MASTER,
            RedisOptions::default().command_timeout(TIMEOUT).wait_for_replicas(1, TIMEOUT),
        )
        .await
        .expect_err("WAIT as long as the command timeout"),
    ];
    for err in invalid {
        assert!(err.is_invalid(), "{err}");
    }

    let options = RedisOptions::default().command_timeout(TIMEOUT);
    let urls = tokio::task::block_in_place(|| SentinelSetup::shared().sentinel_urls());
    let started = Instant::now();
    let err = RedisBackend::sentinel(&urls, "nosuchmaster", options.clone()).await.expect_err("unknown master");
    assert!(err.is_backend(), "{err}");
    assert!(err.to_string().contains("nosuchmaster"), "{err}");
    assert!(started.elapsed() < TIMEOUT * 3, "took {:?}", started.elapsed());

    let started = Instant::now();
    let nobody = [format!("redis://127.0.0.1:{}", free_port()), format!("redis://127.0.0.1:{}", free_port())];
    let err = RedisBackend::sentinel(&nobody, MASTER, options).await.expect_err("no sentinel");
    assert!(err.is_backend(), "{err}");
    assert!(started.elapsed() < TIMEOUT * 3, "took {:?}", started.elapsed());
}

/// The watchdog's renewals wait for the replica too: while it acknowledges, a lock outlives
/// twice its lease; with the replica frozen, renewals are not confirmed, and the guard reports
/// `lost()` once its lease ran out (the key itself is still extended on the primary).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renewals_wait_for_replicas_too() {
    let setup = tokio::task::block_in_place(|| SentinelSetup::start(1, 1));
    let options = RedisOptions::default().command_timeout(TIMEOUT).wait_for_replicas(1, Duration::from_millis(200));
    let lease = Duration::from_millis(1500);
    let m = LockManager::builder().default_lease(lease).backend(backend(&setup, options).await);
    let replica = 1 - setup.primary_index();
    let guard = m.lock(unique("renewed")).await.expect("granted");
    let outlived = tokio::time::timeout(lease * 2, guard.lost()).await;
    assert!(outlived.is_err(), "renewals acknowledged by the replica keep the lock");

    setup.pause(replica);
    let lost = tokio::time::timeout(lease * 3, guard.lost()).await;
    setup.resume(replica);
    assert!(lost.is_ok(), "renewals no replica acknowledged were not taken as confirmed");
    assert!(guard.is_lost());
}

/// `total_connections_received` of a sentinel (every resolution opens a connection to ask).
async fn sentinel_connections(url: &str) -> u64 {
    let client = redis::Client::open(url).expect("url");
    let mut conn = client.get_multiplexed_async_connection().await.expect("sentinel");
    let info: String = redis::cmd("INFO").arg("stats").query_async(&mut conn).await.expect("INFO");
    info.lines()
        .find_map(|l| l.strip_prefix("total_connections_received:"))
        .and_then(|n| n.trim().parse().ok())
        .expect("total_connections_received")
}

/// After a failover, 16 concurrent acquisitions through one backend find the new primary
/// with one resolution between them (the sentinel sees a handful of new connections, not one
/// per acquisition).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_commands_share_one_resolution() {
    let mut setup = tokio::task::block_in_place(|| SentinelSetup::start(1, 1));
    let m = LockManager::builder().backend(backend(&setup, RedisOptions::default().command_timeout(TIMEOUT)).await);
    m.lock(unique("warm")).await.expect("lock").release().await.expect("release");
    let old = setup.primary_index();
    setup.kill(old);
    tokio::task::block_in_place(|| setup.wait_for_new_primary(old));

    let sentinel = setup.sentinel_urls()[0].clone();
    let before = sentinel_connections(&sentinel).await;
    let tasks: Vec<_> = (0..16)
        .map(|_| {
            let m = m.clone();
            tokio::spawn(async move { lock_within(&m, &unique("together"), Duration::from_secs(10)).await })
        })
        .collect();
    for task in tasks {
        task.await.expect("task");
    }
    // Our own INFO connection counts one; the resolution(s) the rest.
    let opened = sentinel_connections(&sentinel).await - before - 1;
    assert!(opened <= 3, "{opened} connections to the sentinel for 16 concurrent acquisitions");
}

/// The ids of the clients of `conn`'s server that are neither `conn` itself, a replica nor a
/// sentinel (the backend's own connections), from `CLIENT LIST`.
async fn foreign_clients(conn: &mut redis::aio::MultiplexedConnection) -> Vec<u64> {
    let me: u64 = redis::cmd("CLIENT").arg("ID").query_async(conn).await.expect("CLIENT ID");
    let list: String = redis::cmd("CLIENT").arg("LIST").query_async(conn).await.expect("CLIENT LIST");
    list.lines()
        .filter_map(|line| {
            let field = |k: &str| line.split_whitespace().find_map(|f| f.strip_prefix(k));
            let id: u64 = field("id=")?.parse().ok()?;
            let replica = field("flags=").is_some_and(|f| f.contains('S') || f.contains('M'));
            let sentinel = field("name=").is_some_and(|n| n.starts_with("sentinel-"));
            (id != me && !replica && !sentinel).then_some(id)
        })
        .collect()
}

/// `errorstat_READONLY` of `conn`'s server: how many commands it refused as a replica.
async fn readonly_errors(conn: &mut redis::aio::MultiplexedConnection) -> u64 {
    let info: String = redis::cmd("INFO").arg("errorstats").query_async(conn).await.expect("INFO errorstats");
    info.lines()
        .find_map(|l| l.strip_prefix("errorstat_READONLY:count="))
        .map_or(0, |n| n.trim().parse().expect("a count"))
}

/// The primary is demoted by hand while the backend's connection to it stays open: `REPLICAOF`
/// (unlike a Sentinel failover, which ends the demoted node's clients) leaves the clients
/// connected, and the sentinels are pointed at the new primary with `SENTINEL REMOVE` /
/// `MONITOR`, which announces no `+switch-master`. The backend's next acquisition is refused
/// `READONLY` by the demoted node; the backend resolves the primary again and the same
/// acquisition is granted on the new primary.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_primary_demoted_under_open_connections_answers_readonly_and_is_left() {
    let setup = tokio::task::block_in_place(|| SentinelSetup::start(1, 1));
    let m = LockManager::builder().backend(backend(&setup, RedisOptions::default().command_timeout(TIMEOUT)).await);
    m.lock(unique("warm")).await.expect("lock").release().await.expect("release");
    let old = setup.primary_index();
    let new = 1 - old;
    let mut on_old = raw(setup.node(old)).await;
    let backend_clients = foreign_clients(&mut on_old).await;
    assert!(!backend_clients.is_empty(), "the backend is connected to the primary");

    // Swap the roles by hand, then tell the sentinel.
    let mut on_new = raw(setup.node(new)).await;
    let _: String = redis::cmd("REPLICAOF").arg("NO").arg("ONE").query_async(&mut on_new).await.expect("REPLICAOF");
    let _: String = redis::cmd("REPLICAOF")
        .arg("127.0.0.1")
        .arg(setup.node(new).port())
        .query_async(&mut on_old)
        .await
        .expect("REPLICAOF");
    tokio::task::block_in_place(|| setup.wait_for_replica(old));
    for url in setup.sentinel_urls() {
        let client = redis::Client::open(url.as_str()).expect("url");
        let mut sentinel = client.get_multiplexed_async_connection().await.expect("sentinel");
        let _: String =
            redis::cmd("SENTINEL").arg("REMOVE").arg(MASTER).query_async(&mut sentinel).await.expect("REMOVE");
        let _: String = redis::cmd("SENTINEL")
            .arg("MONITOR")
            .arg(MASTER)
            .arg("127.0.0.1")
            .arg(setup.node(new).port())
            .arg(1)
            .query_async(&mut sentinel)
            .await
            .expect("MONITOR");
    }
    assert_eq!(setup.primary_index(), new);
    assert_eq!(setup.role(old).as_deref(), Some("slave"));
    // The backend's connections to the demoted node are still open.
    let still = foreign_clients(&mut on_old).await;
    assert!(
        backend_clients.iter().all(|id| still.contains(id)),
        "the backend's connections {backend_clients:?} to the demoted node were closed: {still:?}"
    );

    let refused = readonly_errors(&mut on_old).await;
    let name = unique("demoted-by-hand");
    let guard = m.lock(&name).wait(Duration::from_secs(5)).await.expect("granted on the new primary");
    assert!(readonly_errors(&mut on_old).await > refused, "the acquisition went to the demoted node first");
    assert!(exists(setup.node(new), &name).await, "the lock is on the new primary");
    guard.release().await.expect("release on the new primary");
    assert!(!exists(setup.node(new), &name).await);
}

/// A lock granted (without `wait_for_replicas`) while the only replica was frozen behind a
/// full replication stream (64 MB written first: a few MB fit in the kernel's socket buffers,
/// the rest, and the grant after it, wait in the primary's memory), the primary killed, the
/// replica resumed and promoted without the lock: the holder's guard reports `lost()`, a
/// second manager is granted the name, with a token above the first holder's.
/// (`wait_for_replicas` refuses such a grant: `wait_for_replicas_covers_the_grant_or_undoes_it`.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failover_that_loses_a_just_granted_lock_reports_it_lost_and_tokens_still_increase() {
    let mut setup = tokio::task::block_in_place(|| SentinelSetup::start(1, 3));
    let old = setup.primary_index();
    let replica = 1 - old;
    // Writing 16 MB values takes longer than the default response timeout on a busy machine.
    let config = redis::AsyncConnectionConfig::new().set_response_timeout(Some(Duration::from_secs(10)));
    let client = redis::Client::open(setup.node(old).url()).expect("url");
    let mut primary = client.get_multiplexed_async_connection_with_config(&config).await.expect("connect");
    let _: String = redis::cmd("CONFIG")
        .arg("SET")
        .arg("client-output-buffer-limit")
        .arg("replica 0 0 0")
        .query_async(&mut primary)
        .await
        .expect("CONFIG SET");
    let options = RedisOptions::default().command_timeout(TIMEOUT).ping_interval(Duration::from_millis(500));
    let holder =
        LockManager::builder().default_lease(Duration::from_secs(3)).backend(backend(&setup, options.clone()).await);
    let name = unique("lostgrant");

    setup.pause(replica);
    let fill = "redis.call('set', KEYS[1], string.rep('x', tonumber(ARGV[1]))) return 1";
    for i in 0..4 {
        let _: i64 = redis::cmd("EVAL")
            .arg(fill)
            .arg(1)
            .arg(format!("filler:{i}"))
            .arg(16 << 20)
            .query_async(&mut primary)
            .await
            .expect("fill");
    }
    let guard = holder.lock(&name).await.expect("lock");
    let first = guard.fencing_token();
    setup.kill(old);
    setup.resume(replica);
    let killed_at = Instant::now();
    let new = tokio::task::block_in_place(|| setup.wait_for_new_primary(old));
    assert_eq!(new, replica);
    let failed_over = killed_at.elapsed();
    assert!(!exists(setup.node(new), &name).await, "the promoted replica never got the grant");

    tokio::time::timeout(Duration::from_secs(10), guard.lost()).await.expect("the holder is told it lost the lock");
    let second = LockManager::builder().backend(backend(&setup, options).await);
    let again = second.lock(&name).wait(Duration::from_secs(5)).await.expect("granted on the new primary");
    assert!(again.fencing_token() > first, "tokens increase: {} after {first}", again.fencing_token());
    let err = guard.release().await.expect_err("a lost lock is not released");
    assert!(err.is_lost(), "{err}");
    again.release().await.expect("release");
    println!("failover took {failed_over:?}");
}

/// A primary cut off with its clients on its side (Jepsen's Redis Sentinel case), on a private
/// network (`lock_tests::netns`): three nodes, each with a sentinel beside it in a namespace of
/// its own (node 0 the primary); see `lock_tests::partitions::a_redis_primary_cut_off_with_its_clients`
/// for what is checked. Here, in the end, a replica of the majority side is the primary.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn partition_a_primary_cut_off_with_its_clients_lets_the_majority_grant_and_tokens_fence_it() {
    let setup = tokio::task::block_in_place(|| SentinelSetup::start_partitionable(3, 2));
    let net = setup.net().expect("a private network");
    let urls = setup.sentinel_urls();
    let connect = move || {
        let (urls, lease) = (urls.clone(), lock_tests::partitions::PRIMARY_CUT_LEASE);
        async move {
            let options = RedisOptions::default().command_timeout(TIMEOUT).ping_interval(Duration::from_millis(500));
            let backend = RedisBackend::sentinel(&urls, MASTER, options).await.expect("connect");
            LockManager::builder().default_lease(lease).backend(backend)
        }
    };
    lock_tests::partitions::a_redis_primary_cut_off_with_its_clients(net, |_| 0, connect, "redis-sentinel").await;
    let new = tokio::task::block_in_place(|| setup.wait_for_new_primary(0));
    assert_ne!(new, 0, "a replica of the majority side is primary");
}
