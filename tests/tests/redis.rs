//! The Redis backend against real `redis-server` processes this test binary starts (each test
//! its own, on a free loopback port): the conformance suite, cross-process exclusion, and
//! fault injection (deleted keys, killed holders, a paused / killed / restarted server, killed
//! pub/sub connections), plus leak checks.

#![cfg(feature = "redis")]
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashMap;
use std::future::{Future, IntoFuture};
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use lock_runtime::backend::redis::{KeyLayout, RedisBackend, RedisOptions};
use lock_runtime::{LockManager, LockManagerBuilder};
use lock_tests::redis_server::{free_port, RedisServer};

lock_tests::conformance_suite!({
    let server = Arc::new(RedisServer::start());
    move |builder: LockManagerBuilder| {
        let url = server.url();
        async move { builder.redis(url).await.expect("connect") }
    }
});

async fn raw(server: &RedisServer) -> redis::aio::MultiplexedConnection {
    let client = redis::Client::open(server.url()).expect("url");
    client.get_multiplexed_async_connection().await.expect("raw connection")
}

async fn backend(server: &RedisServer, timeout: Duration) -> RedisBackend {
    RedisBackend::connect_with(&server.url(), RedisOptions::default().command_timeout(timeout)).await.expect("connect")
}

/// `calls` per command from `INFO commandstats`.
async fn command_calls(conn: &mut redis::aio::MultiplexedConnection) -> HashMap<String, u64> {
    let info: String = redis::cmd("INFO").arg("commandstats").query_async(conn).await.expect("INFO");
    info.lines()
        .filter_map(|line| {
            let (name, rest) = line.strip_prefix("cmdstat_")?.split_once(':')?;
            let calls = rest.split(',').find_map(|kv| kv.strip_prefix("calls="))?.parse().ok()?;
            Some((name.to_owned(), calls))
        })
        .collect()
}

async fn numsub(conn: &mut redis::aio::MultiplexedConnection, channel: &str) -> u64 {
    let (_, n): (String, u64) =
        redis::cmd("PUBSUB").arg("NUMSUB").arg(channel).query_async(conn).await.expect("NUMSUB");
    n
}

/// Polls the server (no push signal exists for this) until `numsub(channel) == want`.
async fn await_numsub(conn: &mut redis::aio::MultiplexedConnection, channel: &str, want: u64) {
    let started = Instant::now();
    while numsub(conn, channel).await != want {
        assert!(started.elapsed() < Duration::from_secs(10), "{channel} never had {want} subscriber(s)");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Retries `lock` until the backend answers again (after an outage), within 15 s.
async fn lock_after_outage(m: &LockManager, name: &str) -> lock_runtime::LockGuard {
    let started = Instant::now();
    loop {
        match m.lock(name).wait(Duration::from_secs(2)).await {
            Ok(guard) => return guard,
            Err(e) if e.is_backend() && started.elapsed() < Duration::from_secs(15) => {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(e) => panic!("no recovery after {:?}: {e}", started.elapsed()),
        }
    }
}

#[tokio::test]
async fn malformed_url_is_invalid() {
    for url in ["", "nonsense", "http://127.0.0.1:6379", "redis://127.0.0.1:notaport", "redis://[::1"] {
        let err = LockManager::redis(url).await.expect_err(url);
        assert!(err.is_invalid(), "{url}: {err}");
    }
    let err = LockManager::redis("redis://:hunter2@127.0.0.1:notaport").await.expect_err("bad port");
    assert!(!err.to_string().contains("hunter2"), "password leaked: {err}");
    let zero = RedisOptions::default().command_timeout(Duration::ZERO);
    let err = RedisBackend::connect_with("redis://127.0.0.1:6379", zero).await.expect_err("zero timeout");
    assert!(err.is_invalid(), "{err}");
}

#[tokio::test]
async fn unreachable_or_stalled_server_is_backend_within_the_timeout() {
    let timeout = Duration::from_millis(400);
    let bound = timeout + Duration::from_secs(1);
    // Nothing listens.
    let started = Instant::now();
    let url = format!("redis://127.0.0.1:{}", free_port());
    let err =
        RedisBackend::connect_with(&url, RedisOptions::default().command_timeout(timeout)).await.expect_err("refused");
    assert!(err.is_backend(), "{err}");
    assert!(started.elapsed() < bound, "took {:?}", started.elapsed());
    // The server accepts connections but answers nothing.
    let server = RedisServer::start();
    let m = LockManager::builder().backend(backend(&server, timeout).await);
    server.pause();
    let started = Instant::now();
    let err = RedisBackend::connect_with(&server.url(), RedisOptions::default().command_timeout(timeout))
        .await
        .expect_err("stalled");
    assert!(err.is_backend(), "{err}");
    assert!(started.elapsed() < bound, "connect took {:?}", started.elapsed());
    let started = Instant::now();
    let err = m.try_lock("stalled").await.expect_err("stalled");
    assert!(err.is_backend(), "{err}");
    assert!(err.to_string().contains("stalled"), "{err}");
    assert!(started.elapsed() < bound, "try_lock took {:?}", started.elapsed());
    server.resume();
    lock_after_outage(&m, "stalled").await.release().await.expect("release");
}

/// Four OS processes increment one Redis counter with GET then SET under one lock: no update
/// is lost.
#[test]
fn cross_process_mutual_exclusion() {
    let server = RedisServer::start();
    const WORKERS: usize = 4;
    const TIMES: u64 = 50;
    let counter = lock_tests::unique("counter");
    let children: Vec<_> = (0..WORKERS)
        .map(|_| {
            Command::new(env!("CARGO_BIN_EXE_redis_worker"))
                .args([&server.url(), "increment", "xproc", &counter, &TIMES.to_string()])
                .stdout(Stdio::null())
                .spawn()
                .expect("spawn worker")
        })
        .collect();
    for mut child in children {
        assert!(child.wait().expect("worker").success(), "a worker failed");
    }
    let client = redis::Client::open(server.url()).expect("url");
    let mut conn = client.get_connection().expect("connection");
    let value: u64 = redis::cmd("GET").arg(&counter).query(&mut conn).expect("GET");
    assert_eq!(value, WORKERS as u64 * TIMES, "lost updates");
}

/// Deleting a held lock's key is noticed by the watchdog's next renewal: `lost()` fires within
/// a third of the lease plus a round trip.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleted_key_fires_lost() {
    let server = RedisServer::start();
    let lease = Duration::from_millis(900);
    let m = LockManager::builder()
        .prefix("del:")
        .default_lease(lease)
        .backend(backend(&server, Duration::from_secs(1)).await);
    let guard = m.lock("victim").await.expect("lock");
    let mut conn = raw(&server).await;
    let deleted: u64 =
        redis::cmd("DEL").arg(KeyLayout::of("del:victim").lock).query_async(&mut conn).await.expect("DEL");
    assert_eq!(deleted, 1, "the lock key is where the layout says");
    let started = Instant::now();
    tokio::time::timeout(Duration::from_secs(5), guard.lost()).await.expect("lost() fired");
    let noticed = started.elapsed();
    assert!(noticed <= lease / 3 + Duration::from_millis(500), "noticed after {noticed:?}");
    let err = guard.release().await.expect_err("released a lost lock");
    assert!(err.is_lost(), "{err}");
}

/// Another owner's value in the key: release and renewal report the lock lost.
#[tokio::test]
async fn foreign_owner_is_lost() {
    let server = RedisServer::start();
    let m = LockManager::builder()
        .default_lease(Duration::from_millis(600))
        .backend(backend(&server, Duration::from_secs(1)).await);
    let mut conn = raw(&server).await;
    let fixed = m.lock("fixed").lease(Duration::from_secs(30)).await.expect("lock");
    let _: () =
        redis::cmd("SET").arg(KeyLayout::of("fixed").lock).arg("intruder").query_async(&mut conn).await.expect("SET");
    let err = fixed.release().await.expect_err("foreign");
    assert!(err.is_lost() && err.to_string().contains("another owner"), "{err}");
    let value: String = redis::cmd("GET").arg(KeyLayout::of("fixed").lock).query_async(&mut conn).await.expect("GET");
    assert_eq!(value, "intruder", "a foreign lock is left untouched");
    let renewed = m.lock("renewed").await.expect("lock");
    let _: () =
        redis::cmd("SET").arg(KeyLayout::of("renewed").lock).arg("intruder").query_async(&mut conn).await.expect("SET");
    tokio::time::timeout(Duration::from_secs(3), renewed.lost()).await.expect("renewal noticed the intruder");
}

/// A holder process killed with SIGKILL: a waiter in another process gets the lock within the
/// lease plus one second (woken by the lease running out: the dead holder publishes nothing).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_holder_process_frees_the_lock_within_the_lease() {
    let server = RedisServer::start();
    let lease = Duration::from_millis(1500);
    let mut child = Command::new(env!("CARGO_BIN_EXE_redis_worker"))
        .args([&server.url(), "hold", "crash", &lease.as_millis().to_string()])
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn worker");
    let stdout = child.stdout.take().expect("stdout");
    let line = tokio::task::spawn_blocking(move || {
        let mut line = String::new();
        BufReader::new(stdout).read_line(&mut line).expect("read");
        line
    })
    .await
    .expect("reader");
    let their_token: u64 = line.trim().strip_prefix("held ").expect("held line").parse().expect("token");
    let m = LockManager::redis(server.url()).await.expect("connect");
    assert!(m.try_lock("crash").await.expect("try").is_none(), "the worker holds it");
    let m2 = m.clone();
    let waiter = tokio::spawn(async move {
        let guard = m2.lock("crash").wait(Duration::from_secs(20)).await.expect("waiter");
        (Instant::now(), guard)
    });
    // Let the holder renew a couple of times while the waiter waits.
    tokio::time::sleep(lease).await;
    assert!(!waiter.is_finished(), "acquired while the holder lived");
    child.kill().expect("SIGKILL");
    let killed_at = Instant::now();
    child.wait().expect("reaped");
    let (acquired_at, guard) = waiter.await.expect("waiter");
    let took = acquired_at.duration_since(killed_at);
    assert!(took <= lease + Duration::from_secs(1), "acquired {took:?} after the kill");
    assert!(guard.fencing_token() > their_token);
    guard.release().await.expect("release");
}

/// The server frozen (SIGSTOP) past the lease, then resumed: clear errors meanwhile, the lost
/// lock reported lost, and new locks work.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paused_server_past_the_lease_then_resumed() {
    let server = RedisServer::start();
    let timeout = Duration::from_millis(300);
    let lease = Duration::from_millis(900);
    let m = LockManager::builder().default_lease(lease).backend(backend(&server, timeout).await);
    let guard = m.lock("paused").await.expect("lock");
    server.pause();
    let started = Instant::now();
    let err = m.try_lock("other").await.expect_err("paused");
    assert!(err.is_backend(), "{err}");
    assert!(started.elapsed() < timeout + Duration::from_secs(1), "took {:?}", started.elapsed());
    tokio::time::timeout(lease + Duration::from_secs(2), guard.lost()).await.expect("lost() while paused");
    server.resume();
    let again = lock_after_outage(&m, "paused").await;
    assert!(guard.is_lost(), "a lock reported lost stays lost");
    assert!(again.fencing_token() > guard.fencing_token());
    let err = guard.release().await.expect_err("its lease ran out while the server was frozen");
    assert!(err.is_lost(), "{err}");
    again.release().await.expect("release");
}

/// The server killed and restarted on the same port: clear errors while it is down, the lock
/// that vanished is reported lost, and the same manager works again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_and_restarted_server_is_survived() {
    let mut server = RedisServer::start();
    let timeout = Duration::from_millis(300);
    let m = LockManager::builder().default_lease(Duration::from_millis(900)).backend(backend(&server, timeout).await);
    let guard = m.lock("restart").await.expect("lock");
    // A task waiting across the outage, for a lock whose 60 s lease vanishes with the restart.
    let span = m.lock("span").lease(Duration::from_secs(60)).await.expect("lock");
    let m2 = m.clone();
    let spanning = tokio::spawn(async move { m2.lock("span").wait(Duration::from_secs(20)).await });
    let mut conn = raw(&server).await;
    await_numsub(&mut conn, &KeyLayout::of("span").channel, 1).await;
    server.kill();
    let started = Instant::now();
    let err = m.try_lock("down").await.expect_err("down");
    assert!(err.is_backend(), "{err}");
    assert!(started.elapsed() < timeout + Duration::from_secs(1), "took {:?}", started.elapsed());
    tokio::time::timeout(Duration::from_secs(5), guard.lost()).await.expect("lost() while down");
    server.restart();
    let restarted = Instant::now();
    let again = lock_after_outage(&m, "restart").await;
    let err = guard.release().await.expect_err("vanished with the restart");
    assert!(err.is_lost(), "{err}");
    again.release().await.expect("release");
    // The waiter re-checked once the server was back, and took the vanished lock.
    let got = spanning.await.expect("task").expect("the spanning waiter acquired");
    assert!(restarted.elapsed() < Duration::from_secs(15), "long after the restart: {:?}", restarted.elapsed());
    got.release().await.expect("release");
    assert!(span.release().await.expect_err("vanished").is_lost());
    // Waiting works again too (the pub/sub connection came back).
    let held = m.lock("after").lease(Duration::from_secs(60)).await.expect("lock");
    let m2 = m.clone();
    let waiter = tokio::spawn(async move { m2.lock("after").wait(Duration::from_secs(20)).await.map(drop) });
    let mut conn = raw(&server).await;
    await_numsub(&mut conn, &KeyLayout::of("after").channel, 1).await;
    held.release().await.expect("release");
    waiter.await.expect("task").expect("woken by the release, not the 60 s lease");
}

/// A waiter whose attempt falls while the server is down (a restart, a failover: the holder's
/// lease ran out meanwhile) keeps waiting, with backoff, and is granted once the server is back,
/// within its `wait`; it does not end its call with the outage's error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_whose_attempt_meets_an_outage_keeps_waiting() {
    let mut server = RedisServer::start();
    let timeout = Duration::from_millis(300);
    let m = LockManager::builder().backend(backend(&server, timeout).await);
    let lease = Duration::from_millis(800);
    let held = m.lock("outage").lease(lease).await.expect("lock");
    let waiter = {
        let m = m.clone();
        tokio::spawn(async move { m.lock("outage").wait(Duration::from_secs(20)).await })
    };
    let mut conn = raw(&server).await;
    await_numsub(&mut conn, &KeyLayout::of("outage").channel, 1).await;
    server.kill();
    // The fault schedule, not a synchronisation: the server stays down past the holder's lease,
    // when the waiter attempts.
    tokio::time::sleep(lease + Duration::from_millis(700)).await;
    assert!(!waiter.is_finished(), "the waiter gave up during the outage: {:?}", waiter.await);
    server.restart();
    let got = waiter.await.expect("task").expect("granted once the server is back");
    got.release().await.expect("release");
    assert!(held.release().await.expect_err("vanished with the restart").is_lost());
}

/// The same for a read-write lock: a reader waiting for a writer rides out an outage.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reader_whose_attempt_meets_an_outage_keeps_waiting() {
    let mut server = RedisServer::start();
    let timeout = Duration::from_millis(300);
    let m = LockManager::builder().backend(backend(&server, timeout).await);
    let lease = Duration::from_millis(800);
    let held = m.write_lock("outage-rw").lease(lease).await.expect("write lock");
    let waiter = {
        let m = m.clone();
        tokio::spawn(async move { m.read_lock("outage-rw").wait(Duration::from_secs(20)).await })
    };
    let mut conn = raw(&server).await;
    await_numsub(&mut conn, "lock:rw:{outage-rw}:released", 1).await;
    server.kill();
    // The fault schedule: the server stays down past the writer's lease, when the reader attempts.
    tokio::time::sleep(lease + Duration::from_millis(700)).await;
    assert!(!waiter.is_finished(), "the reader gave up during the outage: {:?}", waiter.await);
    server.restart();
    let got = waiter.await.expect("task").expect("granted once the server is back");
    got.release().await.expect("release");
    assert!(held.release().await.expect_err("vanished with the restart").is_lost());
}

/// `CLIENT KILL TYPE pubsub` while tasks wait: they still get the lock once it is free, both
/// when the release comes before and after the subscription is back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_pubsub_connection_still_wakes_waiters() {
    let server = RedisServer::start();
    let m = LockManager::builder().backend(backend(&server, Duration::from_secs(1)).await);
    let mut conn = raw(&server).await;
    for (round, wait_for_resubscribe) in [(0, false), (1, true)] {
        let name = format!("pubsub-{round}");
        let channel = KeyLayout::of(&name).channel;
        // A fixed 60 s lease: only a release notification (or a re-check) can wake the waiters in time.
        let held = m.lock(&name).lease(Duration::from_secs(60)).await.expect("lock");
        let waiters: Vec<_> = (0..4)
            .map(|_| {
                let (m, name) = (m.clone(), name.clone());
                tokio::spawn(async move {
                    let g = m.lock(&name).wait(Duration::from_secs(20)).lease(Duration::from_secs(60)).await?;
                    g.release().await
                })
            })
            .collect();
        await_numsub(&mut conn, &channel, 1).await;
        let killed: u64 =
            redis::cmd("CLIENT").arg("KILL").arg("TYPE").arg("pubsub").query_async(&mut conn).await.expect("KILL");
        assert!(killed >= 1, "no pub/sub client killed");
        if wait_for_resubscribe {
            await_numsub(&mut conn, &channel, 1).await;
        }
        let started = Instant::now();
        held.release().await.expect("release");
        for w in waiters {
            w.await.expect("task").expect("waiter acquired and released");
        }
        assert!(started.elapsed() < Duration::from_secs(15), "round {round} took {:?}", started.elapsed());
    }
}

/// Runs `per_backend` waiters in each of `backends` backends (as in as many processes) behind
/// one holder, lets the lock pass through all of them, and returns the script runs (`EVALSHA`
/// not answered NOSCRIPT) and `PTTL` calls the server saw.
async fn hand_through(server: &RedisServer, backends: usize, per_backend: u64) -> (u64, u64) {
    let mut stores = Vec::new();
    for _ in 0..backends {
        stores.push(backend(server, Duration::from_secs(1)).await);
    }
    let managers: Vec<_> = stores.iter().map(|b| LockManager::builder().backend(b.clone())).collect();
    let mut conn = raw(server).await;
    let before = command_calls(&mut conn).await;
    let held = managers[0].lock("herd").lease(Duration::from_secs(60)).await.expect("lock");
    let waiters: Vec<_> = managers
        .iter()
        .flat_map(|m| std::iter::repeat_n(m.clone(), per_backend as usize))
        .map(|m| {
            tokio::spawn(async move {
                let g = m.lock("herd").wait(Duration::from_secs(20)).lease(Duration::from_secs(60)).await?;
                g.release().await
            })
        })
        .collect();
    // Every waiter is queued in its backend before the release.
    let started = Instant::now();
    while stores.iter().map(RedisBackend::local_waiters).sum::<usize>() < (backends as u64 * per_backend) as usize {
        assert!(started.elapsed() < Duration::from_secs(10), "waiters never queued");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    held.release().await.expect("release");
    for w in waiters {
        w.await.expect("task").expect("waiter");
    }
    let after = command_calls(&mut conn).await;
    let delta = |c: &str| after.get(c).copied().unwrap_or(0) - before.get(c).copied().unwrap_or(0);
    // A script's first call on a fresh server is answered NOSCRIPT and made again after a
    // SCRIPT LOAD: count script runs.
    (delta("evalsha") - delta("script|load"), delta("pttl"))
}

/// A release wakes one waiter per process, not all of them: eight local waiters handed the
/// lock one after the other cost one acquire-script call each after their first attempt.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_wakes_one_local_waiter() {
    let server = RedisServer::start();
    const WAITERS: u64 = 8;
    let (evalsha, pttl) = hand_through(&server, 1, WAITERS).await;
    // 1 + 8 first attempts (fewer: a task that finds others queued joins them without one),
    // one look at the lock once the channel is subscribed, 8 successful attempts, 9 releases;
    // a herd would add up to 28 more.
    let expected = 1 + WAITERS + 1 + WAITERS + (WAITERS + 1);
    assert!(evalsha <= expected + 2, "evalsha calls: {evalsha} (expected {expected})");
    // `pttl` counts the acquire script's own call on each busy attempt, plus at most one
    // re-check per waiter once the channel subscription is confirmed.
    assert!(pttl <= 2 * WAITERS, "pttl calls: {pttl}");
}

/// With waiters in two processes, each release costs at most one attempt per process.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_wakes_one_waiter_per_process() {
    let server = RedisServer::start();
    const PER: u64 = 4;
    let (evalsha, _) = hand_through(&server, 2, PER).await;
    // 1 + 8 first attempts, a look at the lock per process once its channel is subscribed,
    // and 9 releases, then per release at most one attempt from each of the two processes
    // (9 x 2); a herd would cost up to 8 attempts per release.
    let bound = 1 + 2 * PER + 2 + (2 * PER + 1) + (2 * PER + 1) * 2;
    assert!(evalsha <= bound + 2, "evalsha calls: {evalsha} (at most {bound})");
}

/// A holder whose lease runs out (it publishes nothing) wakes one local waiter, not the whole
/// queue; the rest follow one release at a time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lease_expiry_wakes_one_local_waiter() {
    let server = RedisServer::start();
    let other = LockManager::builder().backend(backend(&server, Duration::from_secs(1)).await);
    let m = LockManager::builder().backend(backend(&server, Duration::from_secs(1)).await);
    let mut conn = raw(&server).await;
    let before = command_calls(&mut conn).await;
    let evalsha = |calls: &HashMap<String, u64>| {
        calls.get("evalsha").copied().unwrap_or(0) - before.get("evalsha").copied().unwrap_or(0)
    };
    let expiring = other.lock("expiry").lease(Duration::from_millis(700)).await.expect("lock");
    const WAITERS: u64 = 8;
    let waiters: Vec<_> = (0..WAITERS)
        .map(|_| {
            let m = m.clone();
            tokio::spawn(async move {
                let g = m.lock("expiry").wait(Duration::from_secs(20)).lease(Duration::from_secs(60)).await?;
                g.release().await
            })
        })
        .collect();
    for w in waiters {
        w.await.expect("task").expect("waiter");
    }
    let after = command_calls(&mut conn).await;
    let loads = after.get("script|load").copied().unwrap_or(0) - before.get("script|load").copied().unwrap_or(0);
    let calls = evalsha(&after) - loads; // a first call answered NOSCRIPT is made again
                                         // 1 + 8 first attempts, one look at the lock once the channel is subscribed, 8 successful
                                         // attempts, 8 releases (+2 for a wake-up a hair early); a cascade at the expiry would add
                                         // up to 7 more.
    let expected = 1 + WAITERS + 1 + WAITERS + WAITERS;
    assert!(calls <= expected + 2, "evalsha calls: {calls} (expected {expected})");
    assert!(expiring.release().await.expect_err("expired").is_lost());
}

/// Connections open on the server, by `CLIENT LIST TYPE <kind>`.
async fn clients(conn: &mut redis::aio::MultiplexedConnection, kind: &str) -> usize {
    let list: String = redis::cmd("CLIENT").arg("LIST").arg("TYPE").arg(kind).query_async(conn).await.expect("CLIENT");
    list.lines().filter(|l| !l.is_empty()).count()
}

/// Polls the server (no push signal exists for this) until `kind` has `want` connections.
async fn await_clients(conn: &mut redis::aio::MultiplexedConnection, kind: &str, want: usize) {
    let started = Instant::now();
    while clients(conn, kind).await != want {
        assert!(started.elapsed() < Duration::from_secs(10), "never {want} {kind} connection(s)");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// A backend keeps one command and one pub/sub connection, and dropping the last manager
/// (and guard) using it closes both: its background tasks stop.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropping_the_manager_stops_its_tasks_and_connections() {
    let server = RedisServer::start();
    let mut conn = raw(&server).await;
    let m = LockManager::redis(server.url()).await.expect("connect");
    let guard = m.lock("owned").await.expect("lock");
    // Ours, the backend's command connection, and its pub/sub connection (typed `normal`
    // while it has no subscription).
    await_clients(&mut conn, "normal", 3).await;
    drop(m);
    guard.release().await.expect("release");
    await_clients(&mut conn, "pubsub", 0).await;
    await_clients(&mut conn, "normal", 1).await;
}

/// `SCRIPT FLUSH` (as after a failover): scripts are loaded again transparently.
#[tokio::test]
async fn flushed_scripts_are_reloaded() {
    let server = RedisServer::start();
    let m = LockManager::redis(server.url()).await.expect("connect");
    let first = m.lock("flush").await.expect("lock");
    let first_token = first.fencing_token();
    first.release().await.expect("release");
    let mut conn = raw(&server).await;
    let _: () = redis::cmd("SCRIPT").arg("FLUSH").query_async(&mut conn).await.expect("SCRIPT FLUSH");
    let second = m.lock("flush").await.expect("lock after flush");
    assert!(second.fencing_token() > first_token);
    second.release().await.expect("release after flush");
}

/// 10,000 distinct names locked and released (some contended): no lock key is left, only the
/// bounded per-slot fencing counters, and no channel stays subscribed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_names_leave_no_keys_and_no_subscriptions() {
    let server = RedisServer::start();
    let backend = backend(&server, Duration::from_secs(2)).await;
    let m = LockManager::builder().prefix("tenk:").backend(backend.clone());
    const NAMES: usize = 10_000;
    const TASKS: usize = 16;
    let tasks: Vec<_> = (0..TASKS)
        .map(|t| {
            let m = m.clone();
            tokio::spawn(async move {
                for i in (t..NAMES).step_by(TASKS) {
                    let name = format!("n{i}");
                    let guard = m.lock(&name).await.expect("lock");
                    if i % 100 == 0 {
                        // Contended: a waiter subscribes to this name's channel.
                        let m2 = m.clone();
                        let waiter = tokio::spawn(async move { m2.lock(name).wait(Duration::from_secs(20)).await });
                        tokio::task::yield_now().await;
                        guard.release().await.expect("release");
                        waiter.await.expect("task").expect("waiter").release().await.expect("release");
                    } else {
                        guard.release().await.expect("release");
                    }
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.expect("task");
    }
    let mut conn = raw(&server).await;
    let keys: Vec<String> = redis::cmd("KEYS").arg("*").query_async(&mut conn).await.expect("KEYS");
    let strays: Vec<&String> = keys.iter().filter(|k| !k.starts_with("lock:fence:{")).collect();
    assert!(strays.is_empty(), "keys left behind: {:?}", &strays[..strays.len().min(10)]);
    assert!(keys.len() <= 16_384, "{} counters", keys.len());
    // Unsubscribed once the grace period passes.
    let started = Instant::now();
    loop {
        let channels: Vec<String> =
            redis::cmd("PUBSUB").arg("CHANNELS").arg("*").query_async(&mut conn).await.expect("PUBSUB");
        if channels.is_empty() && backend.subscribed_channels() == 0 {
            break;
        }
        assert!(started.elapsed() < Duration::from_secs(10), "still subscribed: {channels:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(numsub(&mut conn, &KeyLayout::of("tenk:n0").channel).await, 0);
}

/// Whether the lock key of `name` (no prefix) exists on the server.
async fn key_exists(conn: &mut redis::aio::MultiplexedConnection, name: &str) -> bool {
    let n: u64 = redis::cmd("EXISTS").arg(KeyLayout::of(name).lock).query_async(conn).await.expect("EXISTS");
    n == 1
}

/// Issue #2: an acquisition whose future is dropped (or whose call times out client-side)
/// after its acquire was sent leaves no lock behind: the next caller gets it at once, not
/// after the stray acquire's 60 s lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acquire_dropped_in_flight_leaves_no_lock_behind() {
    let server = RedisServer::start();
    let timeout = Duration::from_millis(500);
    let m = LockManager::builder().backend(backend(&server, timeout).await);
    let mut conn = raw(&server).await;
    let lease = Duration::from_secs(60);
    // The scripts are loaded (a first call answered NOSCRIPT would run nothing).
    m.lock("warm-up").await.expect("lock").release().await.expect("release");
    // (a) The caller gives up (drops the future) while the frozen server holds its acquire;
    // (b) the acquire gets no answer within the command timeout.
    for (name, give_up) in [("orphan-dropped", Some(Duration::from_millis(200))), ("orphan-timed-out", None)] {
        server.pause();
        let acquire = m.lock(name).lease(lease).wait(Duration::from_secs(10));
        match give_up {
            Some(after) => assert!(tokio::time::timeout(after, acquire).await.is_err(), "answered while frozen"),
            None => assert!(acquire.await.expect_err("frozen").is_backend()),
        }
        server.resume();
        let started = Instant::now();
        let guard = m.lock(name).wait(Duration::from_secs(10)).await.expect("the dropped acquire left the lock held");
        assert!(started.elapsed() < Duration::from_secs(2), "{name}: took {:?}", started.elapsed());
        guard.release().await.expect("release");
        assert!(!key_exists(&mut conn, name).await, "{name}: a lock key was left behind");
    }
    // (c) Dropped right after its first poll (its acquire is on its way): a `try_lock` made
    // right after the drop finds the lock free, every time.
    lock_after_outage(&m, "warm-up").await.release().await.expect("release"); // connection back
    for round in 0..20 {
        {
            let mut acquire = std::pin::pin!(m.lock("orphan-polled").lease(lease).into_future());
            let first = std::future::poll_fn(|cx| std::task::Poll::Ready(acquire.as_mut().poll(cx))).await;
            if let std::task::Poll::Ready(done) = first {
                // Answered within the first poll (this thread was descheduled meanwhile):
                // nothing was dropped in flight this round.
                done.expect("acquire").release().await.expect("release");
                continue;
            }
        } // dropped here
        let guard = m.try_lock("orphan-polled").await.expect("try");
        let guard = guard.unwrap_or_else(|| panic!("round {round}: left held by a dropped acquire"));
        guard.release().await.expect("release");
    }
    assert!(!key_exists(&mut conn, "orphan-polled").await, "a lock key was left behind");
}

/// Issue #3: the woken head of the local queue cancelled while its attempt is on the wire
/// passes the wake-up on: the next local waiter attempts at once, not after a hand-off window
/// or the holder's lease. The lock is taken again by another process before the cancelled
/// attempt reaches the server, so nothing else (the undo of the cancelled attempt finds the
/// lock someone else's) can wake the next waiter: W2 (one retry allowed) must make its second
/// attempt, and give up contended, right away.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_woken_waiter_cancelled_mid_attempt_passes_the_wake_up_on() {
    use lock_tests::redis_server::tcp_proxy::TcpProxy;
    let server = RedisServer::start();
    let proxy = TcpProxy::start(server.port()).await;
    let holder = LockManager::builder().backend(backend(&server, Duration::from_secs(2)).await);
    let store = RedisBackend::connect(&proxy.redis_url()).await.expect("connect through the proxy");
    let m = LockManager::builder().backend(store.clone());
    let name = "handed-on";
    let held = holder.lock(name).lease(Duration::from_secs(30)).await.expect("holder");
    // W1, first in the queue, can be cancelled from here; W2 queues behind it.
    let (cancel, cancelled) = tokio::sync::oneshot::channel::<()>();
    let m1 = m.clone();
    let w1 = tokio::spawn(async move {
        tokio::select! {
            got = m1.lock(name).wait(Duration::from_secs(20)) => Some(got),
            _ = cancelled => None,
        }
    });
    let started = Instant::now();
    while store.local_waiters() < 1 {
        assert!(started.elapsed() < Duration::from_secs(10), "W1 never queued");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let m2 = m.clone();
    let w2 = tokio::spawn(async move {
        let got = m2.lock(name).wait(Duration::from_secs(20)).retry(1).await;
        (Instant::now(), got)
    });
    while store.local_waiters() < 2 {
        assert!(started.elapsed() < Duration::from_secs(10), "W2 never queued");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // The release wakes W1, whose attempt then sits in the proxy: cancel W1 right there.
    proxy.hold();
    held.release().await.expect("release");
    tokio::time::timeout(Duration::from_secs(10), proxy.await_held(1)).await.expect("W1 was woken and attempted");
    cancel.send(()).expect("W1 still waiting");
    assert!(w1.await.expect("W1 task").is_none(), "W1 got an answer through a holding proxy");
    let again = holder.lock(name).lease(Duration::from_secs(30)).wait(Duration::ZERO).await.expect("taken again");
    let released = Instant::now();
    proxy.release();
    let (answered, got) = w2.await.expect("W2 task");
    let err = got.expect_err("W2 cannot have the lock: another process holds it");
    assert!(err.is_contended(), "{err}");
    assert!(err.to_string().contains("2 attempt"), "W2 was never woken to attempt again: {err}");
    let took = answered.duration_since(released);
    assert!(took < Duration::from_secs(1), "W2 attempted {took:?} after W1 was cancelled");
    again.release().await.expect("release");
    let mut conn = raw(&server).await;
    assert!(!key_exists(&mut conn, name).await, "a lock key was left behind");
}

/// Issue #4: options out of range are `is_invalid()` (never a panic, never a dead task), and
/// the largest accepted ones work.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_options_out_of_range_are_invalid() {
    let hour = Duration::from_secs(3600);
    let url = format!("redis://127.0.0.1:{}", free_port()); // never reached: checked first
    let bad = [
        RedisOptions::default().command_timeout(Duration::MAX),
        RedisOptions::default().command_timeout(hour + Duration::from_millis(1)),
        RedisOptions::default().command_timeout(Duration::ZERO),
        RedisOptions::default().unsubscribe_after(Duration::MAX),
        RedisOptions::default().unsubscribe_after(hour + Duration::from_millis(1)),
    ];
    for (i, options) in bad.into_iter().enumerate() {
        let err = RedisBackend::connect_with(&url, options).await.expect_err("accepted");
        assert!(err.is_invalid(), "case {i}: {err}");
    }
    // The largest accepted values: the lock works, a waiter is woken, nothing overflows.
    let server = RedisServer::start();
    let store = RedisBackend::connect_with(
        &server.url(),
        RedisOptions::default().command_timeout(hour).unsubscribe_after(hour),
    )
    .await
    .expect("an hour is accepted");
    let m = LockManager::builder().backend(store.clone());
    let held = m.lock("edge").await.expect("lock");
    let m2 = m.clone();
    let waiter = tokio::spawn(async move { m2.lock("edge").wait(Duration::from_secs(10)).await });
    let started = Instant::now();
    while store.subscribed_channels() == 0 {
        assert!(started.elapsed() < Duration::from_secs(10), "never waited");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    held.release().await.expect("release");
    waiter.await.expect("task").expect("woken").release().await.expect("release");
}

/// The ping interval is checked too.
#[tokio::test]
async fn redis_ping_interval_out_of_range_is_invalid() {
    let url = format!("redis://127.0.0.1:{}", free_port());
    for interval in [Duration::ZERO, Duration::from_secs(3601), Duration::MAX] {
        let options = RedisOptions::default().ping_interval(interval);
        let err = RedisBackend::connect_with(&url, options).await.expect_err("accepted");
        assert!(err.is_invalid(), "{interval:?}: {err}");
    }
}

/// Issue #6: a pub/sub connection that dies silently (no FIN, no RST: a partition) is noticed
/// by its ping, replaced and resubscribed, so a waiter is woken by the release that went
/// unheard, long before the holder's 30 s lease would have freed it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silently_dead_pubsub_connection_is_noticed_and_replaced() {
    use lock_tests::redis_server::tcp_proxy::TcpProxy;
    let server = RedisServer::start();
    let proxy = TcpProxy::start(server.port()).await;
    let holder = LockManager::builder().backend(backend(&server, Duration::from_secs(2)).await);
    let store = RedisBackend::connect_with(
        &proxy.redis_url(),
        RedisOptions::default().command_timeout(Duration::from_millis(500)),
    )
    .await
    .expect("connect through the proxy");
    let m = LockManager::builder().backend(store);
    let name = "partitioned";
    let held = holder.lock(name).lease(Duration::from_secs(30)).await.expect("holder");
    let mut conn = raw(&server).await;
    let pttl = |calls: &HashMap<String, u64>| calls.get("pttl").copied().unwrap_or(0);
    let before = pttl(&command_calls(&mut conn).await);
    let waiter = tokio::spawn(async move {
        let got = m.lock(name).wait(Duration::from_secs(25)).await;
        (Instant::now(), got)
    });
    await_numsub(&mut conn, &KeyLayout::of(name).channel, 1).await;
    // The waiter's look at the lock once its subscription is confirmed (the second `PTTL`
    // after that of its first attempt) says the confirmation came through: it waits.
    let started = Instant::now();
    while pttl(&command_calls(&mut conn).await) < before + 2 {
        assert!(started.elapsed() < Duration::from_secs(10), "the waiter never looked again");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(proxy.silence_subscribers(), 1, "one pub/sub connection");
    let released = Instant::now();
    held.release().await.expect("release"); // its message goes nowhere
    let (acquired, got) = waiter.await.expect("task");
    let guard = got.expect("the waiter was never woken");
    let took = acquired.duration_since(released);
    // The default ping interval (5 s) plus the command timeout, and a resubscription.
    assert!(took < Duration::from_secs(10), "woken {took:?} after the release");
    guard.release().await.expect("release");
}

/// Data loss on the server (a restart without persistence, `FLUSHALL`, the counter evicted):
/// the first holder afterwards still gets a token above every token handed out before, so a
/// fenced store refuses only the stale holder, never the new one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fencing_tokens_stay_above_every_earlier_token_across_data_loss() {
    let mut server = RedisServer::start();
    let timeout = Duration::from_millis(300);
    let m = LockManager::builder().default_lease(Duration::from_secs(5)).backend(backend(&server, timeout).await);
    let name = "fenced";
    let fence = KeyLayout::of(name).fence;
    for loss in ["restart", "flushall", "counter evicted"] {
        // Some traffic first, so that a counter restarting from zero would fall far behind.
        for _ in 0..20 {
            m.lock(name).await.expect("lock").release().await.expect("release");
        }
        let stale = m.lock(name).lease(Duration::from_secs(60)).await.expect("lock");
        let highest = stale.fencing_token();
        match loss {
            "restart" => server.restart(),
            "flushall" => {
                let _: () = redis::cmd("FLUSHALL").query_async(&mut raw(&server).await).await.expect("FLUSHALL");
            }
            _ => {
                // As `allkeys-*` eviction would: the counter goes, the lock key stays, and
                // then the lock key goes too (its holder is gone).
                let _: () = redis::cmd("DEL").arg(&fence).query_async(&mut raw(&server).await).await.expect("DEL");
                m.lock("other").await.expect("lock").release().await.expect("release");
                let _: () = redis::cmd("DEL")
                    .arg(KeyLayout::of(name).lock)
                    .query_async(&mut raw(&server).await)
                    .await
                    .expect("DEL");
            }
        }
        let fresh = lock_after_outage(&m, name).await;
        // A fenced store has seen `highest` from the stale holder: it must accept the new one.
        assert!(
            fresh.fencing_token() > highest,
            "after {loss}: the new holder's token {} is not above the stale holder's {highest}",
            fresh.fencing_token()
        );
        fresh.release().await.expect("release");
        drop(stale);
    }
}

/// A holder is told its fixed lease ended (`lost()`) before the server lets anyone else in:
/// when `lost()` completes, the key is still there. (Counted from when the acquire was sent,
/// minus an allowance for clock drift and timers that fire a tick late: 12 ms of a 1 s lease.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lost_fires_before_the_servers_lease_ends() {
    let server = RedisServer::start();
    let m = LockManager::redis(server.url()).await.expect("connect");
    let mut rounds = tokio::task::JoinSet::new();
    for i in 0..10 {
        let (m, mut conn) = (m.clone(), raw(&server).await);
        rounds.spawn(async move {
            let name = format!("told-first:{i}");
            let guard = m.lock(&name).lease(Duration::from_secs(1)).await.expect("lock");
            guard.lost().await;
            let key = KeyLayout::of(&name).lock;
            let pttl: i64 = redis::cmd("PTTL").arg(key).query_async(&mut conn).await.expect("PTTL");
            (i, pttl)
        });
    }
    while let Some(round) = rounds.join_next().await {
        let (i, pttl) = round.expect("round");
        assert!(pttl >= 0, "{i}: lost() fired after the key expired (PTTL {pttl})");
    }
}

/// A manager on its own [`RedisBackend`] (its own connections, pub/sub and local queues: a
/// separate process as far as the locks can tell).
async fn kinds_manager(server: &RedisServer) -> LockManager {
    LockManager::builder().default_lease(Duration::from_secs(30)).backend(backend(server, Duration::from_secs(2)).await)
}

/// A reader that crashed (its guard never released nor renewed, its backend gone) blocks a
/// writer of another backend only until its fixed lease ends: the writer, woken by the lease
/// (the dead reader publishes nothing), gets in within the lease plus a second.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crashed_reader_does_not_block_a_writer_past_its_lease() {
    let server = RedisServer::start();
    let lease = Duration::from_millis(1200);
    let crashed = kinds_manager(&server).await;
    let started = Instant::now();
    let reader = crashed.read_lock("doc").lease(lease).await.expect("reader");
    let reader_token = reader.fencing_token();
    std::mem::forget(reader); // no release, ever
    drop(crashed);
    let other = kinds_manager(&server).await;
    assert!(other.try_write_lock("doc").await.expect("try").is_none(), "the crashed reader still holds");
    let writer = other.write_lock("doc").wait(Duration::from_secs(20)).await.expect("writer after the lease");
    let took = started.elapsed();
    assert!(took >= lease - Duration::from_millis(100), "a writer beside a live reader after {took:?}");
    assert!(took <= lease + Duration::from_secs(1), "the writer got in {took:?} after the reader's grant");
    assert!(writer.fencing_token() > reader_token);
    writer.release().await.expect("release");
}

/// A writer waiting in one backend keeps new readers of another backend out (its intent is in
/// Redis, not only in its process's queue); it gets in as soon as the old reader releases (a
/// published wake-up, not its 30 s lease); a waiting writer that gives up lets the readers of
/// the other backend in at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_writer_blocks_new_readers_of_another_backend() {
    let server = RedisServer::start();
    let (a, b, c) = (kinds_manager(&server).await, kinds_manager(&server).await, kinds_manager(&server).await);
    let old = a.read_lock("shelf").await.expect("reader");
    let early = c.try_read_lock("shelf").await.expect("try").expect("readers share while no writer waits");
    early.release().await.expect("release");
    let b2 = b.clone();
    let writer = tokio::spawn(async move { b2.write_lock("shelf").wait(Duration::from_secs(20)).await });
    let blocked = async {
        while c.try_read_lock("shelf").await.expect("try").is_some_and(|g| {
            drop(g);
            true
        }) {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(5), blocked)
        .await
        .expect("a waiting writer blocks other backends' readers");
    let err = c.read_lock("shelf").wait(Duration::from_millis(300)).await.expect_err("kept out");
    assert!(err.is_contended(), "{err}");
    let released_at = Instant::now();
    old.release().await.expect("release");
    let writer = writer.await.expect("task").expect("writer");
    assert!(released_at.elapsed() < Duration::from_secs(2), "hand-off took {:?}", released_at.elapsed());
    assert!(c.try_read_lock("shelf").await.expect("try").is_none(), "a reader beside the writer");
    writer.release().await.expect("release");

    // A writer that gives up while waiting leaves no intent behind.
    let old = a.read_lock("shelf").await.expect("reader");
    let b2 = b.clone();
    let waiting = tokio::spawn(async move { b2.write_lock("shelf").wait(Duration::from_secs(20)).await });
    let blocked = async {
        while c.try_read_lock("shelf").await.expect("try").is_some_and(|g| {
            drop(g);
            true
        }) {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(5), blocked).await.expect("blocked again");
    waiting.abort();
    let _ = waiting.await;
    let started = Instant::now();
    let reader = c.read_lock("shelf").wait(Duration::from_secs(10)).await.expect("readers get in");
    assert!(started.elapsed() < Duration::from_secs(2), "took {:?}", started.elapsed());
    for g in [reader, old] {
        g.release().await.expect("release");
    }
}

/// Two backends that disagree on a semaphore's permits: the second is refused with
/// `is_invalid()` (never a third holder of two permits), and agrees anew once it is free.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn semaphore_permits_mismatch_across_backends_is_refused() {
    let server = RedisServer::start();
    let (a, b) = (kinds_manager(&server).await, kinds_manager(&server).await);
    let first = a.semaphore("pool", 2).await.expect("first permit");
    let err = b.semaphore("pool", 3).wait(Duration::from_secs(5)).await.expect_err("disagrees");
    assert!(err.is_invalid() && err.to_string().contains("permits"), "{err}");
    let second = b.semaphore("pool", 2).wait(Duration::ZERO).await.expect("second permit");
    assert!(second.fencing_token() > first.fencing_token());
    assert!(b.try_semaphore("pool", 2).await.expect("try").is_none(), "two permits only");
    let err = a.try_semaphore("pool", 5).await.expect_err("disagrees, full");
    assert!(err.is_invalid(), "{err}");
    for g in [first, second] {
        g.release().await.expect("release");
    }
    let three = b.semaphore("pool", 3).await.expect("agreed anew once free");
    three.release().await.expect("release");
}

/// Many read, write and semaphore acquisitions over two backends (contended, timed out,
/// cancelled, held past a fixed lease) leave no key behind but the fencing counters, and no
/// subscription once the grace period passes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kind_operations_leave_no_keys_behind() {
    let server = RedisServer::start();
    let (a, b) = (kinds_manager(&server).await, kinds_manager(&server).await);
    let mut tasks = Vec::new();
    for t in 0..8usize {
        let m = if t % 2 == 0 { a.clone() } else { b.clone() };
        tasks.push(tokio::spawn(async move {
            for i in 0..40usize {
                let name = format!("n{}", i % 5);
                let wait = Duration::from_millis(if i % 7 == 0 { 1 } else { 5_000 });
                let got = match (t + i) % 4 {
                    0 => m.write_lock(&name).wait(wait).await,
                    1 | 2 => m.read_lock(&name).wait(wait).await,
                    _ => m.semaphore(&name, 2).wait(wait).await,
                };
                match got {
                    Ok(g) => {
                        tokio::task::yield_now().await;
                        g.release().await.expect("release");
                    }
                    Err(e) => assert!(e.is_contended(), "{e}"),
                }
                if i % 9 == 0 {
                    // Cancelled at its first await.
                    let fut = m.write_lock(&name).wait(Duration::from_secs(5)).into_future();
                    let _ = tokio::time::timeout(Duration::from_millis(2), fut).await;
                }
            }
        }));
    }
    for t in tasks {
        tokio::time::timeout(Duration::from_secs(120), t).await.expect("stuck").expect("task");
    }
    // Holders that never release: their entries, and the keys, go with their fixed leases.
    for kind in 0..2 {
        let g = if kind == 0 {
            a.read_lock("crash").lease(Duration::from_millis(300)).await
        } else {
            b.semaphore("crash", 3).lease(Duration::from_millis(300)).await
        };
        std::mem::forget(g.expect("held"));
    }
    let mut conn = raw(&server).await;
    let keys: Vec<String> = redis::cmd("KEYS").arg("lock:*:{crash}").query_async(&mut conn).await.expect("KEYS");
    assert_eq!(keys.len(), 2, "where the state lives: {keys:?}");
    let started = Instant::now();
    loop {
        let keys: Vec<String> = redis::cmd("KEYS").arg("*").query_async(&mut conn).await.expect("KEYS");
        let strays: Vec<&String> = keys.iter().filter(|k| !k.starts_with("lock:fence:{")).collect();
        let channels: Vec<String> =
            redis::cmd("PUBSUB").arg("CHANNELS").arg("*").query_async(&mut conn).await.expect("PUBSUB");
        if strays.is_empty() && channels.is_empty() {
            assert!(!keys.is_empty(), "the fencing counters stay");
            break;
        }
        assert!(started.elapsed() < Duration::from_secs(10), "left behind: {strays:?}, subscribed: {channels:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Readers kept by the watchdog (a 600 ms lease, renewed per reader) hold past many leases,
/// keeping a writer of another backend out; once they release, it gets in at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renewed_readers_keep_a_writer_out_past_their_lease() {
    let server = RedisServer::start();
    let lease = Duration::from_millis(600);
    let readers = LockManager::builder().default_lease(lease).backend(backend(&server, Duration::from_secs(1)).await);
    let first = readers.read_lock("kept").await.expect("reader");
    let second = readers.read_lock("kept").await.expect("reader");
    let writers = kinds_manager(&server).await;
    let err = writers.write_lock("kept").wait(lease * 4).await.expect_err("readers renewed");
    assert!(err.is_contended(), "{err}");
    assert!(!first.is_lost() && !second.is_lost());
    let w = writers.clone();
    let writer = tokio::spawn(async move { w.write_lock("kept").wait(Duration::from_secs(10)).await });
    tokio::time::sleep(lease).await;
    assert!(!writer.is_finished(), "a writer beside renewed readers");
    let released_at = Instant::now();
    for g in [first, second] {
        g.release().await.expect("release within the renewed lease");
    }
    let writer = writer.await.expect("task").expect("writer");
    assert!(released_at.elapsed() < Duration::from_millis(500), "hand-off took {:?}", released_at.elapsed());
    writer.release().await.expect("release");
}

/// A waiting writer that crashed (its acquisition never polled again, never dropped) keeps
/// new readers out only until its intent's lease ends: a reader of another backend waiting
/// meanwhile gets in then, woken by that expiry.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crashed_waiting_writer_blocks_readers_only_for_its_lease() {
    let server = RedisServer::start();
    let lease = Duration::from_millis(1200);
    let (a, b, c) = (kinds_manager(&server).await, kinds_manager(&server).await, kinds_manager(&server).await);
    let old = a.read_lock("page").await.expect("reader");
    let mut writer = Box::pin(b.write_lock("page").lease(lease).wait(Duration::from_secs(60)).into_future());
    assert!(tokio::time::timeout(Duration::from_millis(300), &mut writer).await.is_err(), "the writer waits");
    assert!(c.try_read_lock("page").await.expect("try").is_none(), "its intent keeps readers out");
    std::mem::forget(writer); // crashed: never polled nor dropped again
    let crashed_at = Instant::now();
    let reader = c.read_lock("page").wait(Duration::from_secs(20)).await.expect("reader after the intent's lease");
    let took = crashed_at.elapsed();
    assert!(took <= lease + Duration::from_secs(1), "the reader got in {took:?} after the crash");
    for g in [reader, old] {
        g.release().await.expect("release");
    }
}

/// `hold_at_least` on a writer released early: the entry stays until the remainder ends (a
/// reader of another backend waiting meanwhile is kept out), then the reader gets in, woken
/// by the shorter expiry it learns from the release's announcement.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_writer_released_early_with_hold_at_least_keeps_readers_out_until_it_ends() {
    let server = RedisServer::start();
    let (a, b) = (kinds_manager(&server).await, kinds_manager(&server).await);
    let hold = Duration::from_millis(1200);
    let granted = Instant::now();
    let writer =
        a.write_lock("held").options(lock_runtime::LockOptions::new().hold_at_least(hold)).await.expect("writer");
    let b2 = b.clone();
    let reader = tokio::spawn(async move {
        let g = b2.read_lock("held").wait(Duration::from_secs(20)).await.expect("reader");
        (Instant::now(), g)
    });
    tokio::time::sleep(Duration::from_millis(200)).await; // the reader waits, told a 30 s lease
    writer.release().await.expect("an early release");
    assert!(b.try_read_lock("held").await.expect("try").is_none(), "free before hold_at_least ended");
    let (got_at, g) = reader.await.expect("task");
    assert!(got_at >= granted + hold - Duration::from_millis(50), "in {:?} after the grant", got_at - granted);
    assert!(got_at <= granted + hold + Duration::from_millis(750), "in {:?} after the grant", got_at - granted);
    g.release().await.expect("release");
}

/// Polls `fut` exactly once: `Some(output)` if it was ready, `None` if it was pending.
async fn poll_once<F: Future + Unpin>(fut: &mut F) -> Option<F::Output> {
    match std::future::poll_fn(|cx| std::task::Poll::Ready(std::pin::Pin::new(&mut *fut).poll(cx))).await {
        std::task::Poll::Ready(output) => Some(output),
        std::task::Poll::Pending => None,
    }
}

/// Polls the server (no signal exists for a background release) until `key` is gone, within 2 s.
async fn await_key_gone(conn: &mut redis::aio::MultiplexedConnection, key: &str, what: &str) {
    let started = Instant::now();
    loop {
        let n: u64 = redis::cmd("EXISTS").arg(key).query_async(conn).await.expect("EXISTS");
        if n == 0 {
            return;
        }
        assert!(started.elapsed() < Duration::from_secs(2), "{what}: {key} still held after {:?}", started.elapsed());
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// The key of a read-write lock's state (see the kinds module docs).
fn rw_state(name: &str) -> String {
    format!("lock:rw:{{{name}}}")
}

/// Issue: a release whose future is dropped after its first poll (the caller's `select!` or
/// `timeout` gave up while the release script was on its way) still completes: the key is
/// gone within a couple of seconds, not at the end of its 60 s lease, and another manager
/// locks the name at once. Through the guard (`LockGuard::release`) and through the
/// backend's `HeldLock::release` directly, for a mutex and a read lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_dropped_after_its_first_poll_still_completes() {
    use lock_runtime::backend::{Acquire, Attempt, Holder, Lease, LockBackend, LockKind, OwnerId};
    let server = RedisServer::start();
    let lease = Duration::from_secs(60);
    let holder = backend(&server, Duration::from_secs(2)).await;
    let m = LockManager::builder().backend(holder.clone());
    let other = kinds_manager(&server).await;
    let mut conn = raw(&server).await;
    m.lock("warm-up").await.expect("lock").release().await.expect("release"); // scripts loaded
    m.read_lock("warm-up").await.expect("lock").release().await.expect("release");
    let mut dropped = 0;
    for round in 0..10 {
        // Through the guard.
        for read in [false, true] {
            let name = format!("dropped-guard-release-{read}-{round}");
            let (guard, key) = if read {
                (m.read_lock(&name).lease(lease).await.expect("lock"), rw_state(&name))
            } else {
                (m.lock(&name).lease(lease).await.expect("lock"), KeyLayout::of(&name).lock)
            };
            let mut release = Box::pin(guard.release());
            if poll_once(&mut release).await.is_some() {
                continue; // answered within the first poll: nothing was dropped in flight
            }
            drop(release);
            dropped += 1;
            let started = Instant::now();
            await_key_gone(&mut conn, &key, "a guard's release dropped after one poll").await;
            let next = if read {
                other.write_lock(&name).wait(Duration::from_secs(2)).await
            } else {
                other.lock(&name).wait(Duration::from_secs(2)).await
            };
            next.expect("the name is free long before the 60 s lease").release().await.expect("release");
            assert!(started.elapsed() < Duration::from_secs(3), "took {:?}", started.elapsed());
        }
        // Through the backend's `HeldLock` directly (what every guard relies on).
        for read in [true, false] {
            let name = format!("dropped-held-release-{read}-{round}");
            let req = Acquire {
                name: name.as_str().into(),
                key: name.as_str().into(),
                owner: OwnerId::next(),
                holder: Holder::of_process(None),
                lease: Lease::Fixed(lease),
                kind: if read { LockKind::Read } else { LockKind::Exclusive },
            };
            let key = if read { rw_state(&name) } else { KeyLayout::of(&name).lock };
            let mut acquisition = holder.begin(req, lock_runtime::LostSignal::new());
            let Attempt::Acquired(mut grant) = acquisition.attempt().await.expect("attempt") else {
                panic!("{name} is free")
            };
            drop(acquisition);
            {
                let mut release = grant.lock.release();
                if poll_once(&mut release).await.is_some() {
                    continue;
                }
            } // dropped here
            dropped += 1;
            await_key_gone(&mut conn, &key, "a HeldLock release dropped after one poll").await;
            let next = if read { other.try_write_lock(&name).await } else { other.try_lock(&name).await };
            next.expect("try").expect("the name is free long before the 60 s lease").release().await.expect("release");
        }
    }
    assert!(dropped >= 20, "only {dropped} releases were pending after their first poll");
}

/// A release that lands late (its reply was lost and it is sent again, or a dropped release
/// finishing in the background after the lock changed hands) never frees a later owner's
/// lock: the scripts are owner-checked. Mutex and read lock, through `HeldLock` directly.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_release_never_frees_a_later_owners_lock() {
    use lock_runtime::backend::{Acquire, Attempt, Holder, Lease, LockBackend, LockKind, OwnerId};
    let server = RedisServer::start();
    let first = backend(&server, Duration::from_secs(2)).await;
    let other = kinds_manager(&server).await;
    let mut conn = raw(&server).await;
    for read in [false, true] {
        let name = format!("late-release-{read}");
        let req = Acquire {
            name: name.as_str().into(),
            key: name.as_str().into(),
            owner: OwnerId::next(),
            holder: Holder::of_process(None),
            lease: Lease::Fixed(Duration::from_secs(60)),
            kind: if read { LockKind::Read } else { LockKind::Exclusive },
        };
        let Attempt::Acquired(mut grant) =
            first.begin(req, lock_runtime::LostSignal::new()).attempt().await.expect("attempt")
        else {
            panic!("{name} is free")
        };
        grant.lock.release().await.expect("release");
        let later = if read { other.write_lock(&name).await } else { other.lock(&name).await }.expect("later owner");
        let key = if read { rw_state(&name) } else { KeyLayout::of(&name).lock };
        let dump = |conn: &mut redis::aio::MultiplexedConnection| {
            let mut conn = conn.clone();
            let key = key.clone();
            async move { redis::cmd("DUMP").arg(&key).query_async::<Option<Vec<u8>>>(&mut conn).await.expect("DUMP") }
        };
        let before = dump(&mut conn).await.expect("the later owner's key");
        let err = grant.lock.release().await.expect_err("the same release again");
        assert!(err.is_lost(), "{err}");
        let after = grant.lock.release_after(Duration::from_secs(30)).await.expect_err("a late release_after");
        assert!(after.is_lost(), "{after}");
        assert_eq!(dump(&mut conn).await, Some(before), "{name}: a late release touched the later owner's key");
        assert!(!later.is_lost());
        later.release().await.expect("the later owner still holds it");
    }
}
