//! Redlock ([`RedlockBackend`]) against independent `redis-server` processes this binary starts:
//! the conformance suite on three shared servers, then faults on servers of each test's own
//! (a minority or a majority of nodes killed, a node paused), fencing tokens across quorums
//! with counters set far apart, cancellation and bad input.

#![cfg(feature = "redis")]
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod redis_support;

use std::future::{Future, IntoFuture};
use std::pin::Pin;
use std::sync::OnceLock;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use lock_runtime::backend::redis::{KeyLayout, RedisOptions, RedlockBackend};
use lock_runtime::{LockManager, LockManagerBuilder};
use lock_tests::redis_server::RedisServer;
use redis_support::{await_numsub, raw};

/// Three servers shared by the conformance cases (never killed by a test). A static is never
/// dropped: each server's own reaper kills it once this test process is gone.
fn shared() -> &'static [RedisServer] {
    static SERVERS: OnceLock<Vec<RedisServer>> = OnceLock::new();
    SERVERS.get_or_init(|| (0..3).map(|_| RedisServer::start()).collect())
}

lock_tests::conformance_suite!(
    |builder: LockManagerBuilder| {
        let urls: Vec<String> = shared().iter().map(RedisServer::url).collect();
        async move { builder.redlock(&urls).await.expect("connect") }
    },
    kinds = [],
    inspect = false
);

fn start(n: usize) -> Vec<RedisServer> {
    (0..n).map(|_| RedisServer::start()).collect()
}

fn urls(servers: &[RedisServer]) -> Vec<String> {
    servers.iter().map(RedisServer::url).collect()
}

async fn manager(servers: &[RedisServer], timeout: Duration, prefix: &str) -> LockManager {
    let backend = RedlockBackend::connect(urls(servers), RedisOptions::default().command_timeout(timeout))
        .await
        .expect("connect");
    LockManager::builder().prefix(prefix).default_lease(Duration::from_secs(30)).backend(backend)
}

/// Polls each server (no push signal exists for this) until none holds `key`.
async fn await_no_key(servers: &[&RedisServer], key: &str, what: &str) {
    for server in servers {
        let mut conn = raw(server).await;
        let gone = format!("{what}: {key} gone from {}", server.url());
        lock_tests::eventually(&gone, Duration::from_secs(10), async || {
            let exists: u64 = redis::cmd("EXISTS").arg(key).query_async(&mut conn).await.expect("EXISTS");
            lock_tests::reached(exists, 0)
        })
        .await;
    }
}

/// Two nodes of five killed: locks still work (a quorum of three is left), with contention
/// across two backends (two processes, as far as the nodes can tell) and increasing tokens.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_minority_of_nodes_down_changes_nothing() {
    let mut servers = start(5);
    let a = manager(&servers, Duration::from_secs(1), "minority:").await;
    servers[1].kill();
    servers[3].kill();
    let b = manager_after_kill(&servers).await;
    let mut last = 0;
    for _ in 0..5 {
        let guard = a.lock("job").await.expect("acquire with 3 of 5");
        assert!(guard.fencing_token() > last, "{} after {last}", guard.fencing_token());
        last = guard.fencing_token();
        // Busy, never an error: the answers of the dead nodes come first (connection refused),
        // and the attempt must still wait for a quorum of answers before it calls it busy.
        for _ in 0..4 {
            assert!(b.try_lock("job").await.expect("try").is_none(), "another backend got a held lock");
        }
        guard.release().await.expect("release with 3 of 5");
    }
    // Contention: b waits (its wait is far shorter than the 30 s lease, so only the release
    // notification can hand it the lock in time).
    let held = a.lock("job").await.expect("holder");
    let waiter = tokio::spawn(async move {
        let g = b.lock("job").wait(Duration::from_secs(10)).await.expect("woken by the release");
        (g.fencing_token(), g)
    });
    tokio::time::sleep(Duration::from_millis(100)).await; // let it reach its wait (not needed for correctness)
    let held_token = held.fencing_token();
    held.release().await.expect("release");
    let (token, guard) = waiter.await.expect("waiter");
    assert!(token > held_token);
    guard.release().await.expect("release");
}

/// A backend made while two of five nodes are down connects (a quorum answers).
async fn manager_after_kill(servers: &[RedisServer]) -> LockManager {
    manager(servers, Duration::from_secs(1), "minority:").await
}

/// Three nodes of five killed: `lock()` fails with a backend error naming the quorum, within
/// the command timeout and some slack; once they are back, locks work again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_majority_of_nodes_down_is_a_backend_error_naming_the_quorum() {
    let timeout = Duration::from_secs(1);
    let mut servers = start(5);
    let m = manager(&servers, timeout, "majority:").await;
    m.lock("job").await.expect("all up").release().await.expect("release");
    for i in [0, 2, 4] {
        servers[i].kill();
    }
    for _ in 0..2 {
        let started = Instant::now();
        let err = m.lock("job").wait(Duration::from_secs(5)).await.expect_err("no quorum");
        let took = started.elapsed();
        assert!(err.is_backend(), "{err}");
        assert!(err.to_string().contains("3 of 5"), "the message names the quorum: {err}");
        assert!(took < timeout + Duration::from_secs(1), "failed after {took:?}");
    }
    let refused = RedlockBackend::connect(urls(&servers), RedisOptions::default().command_timeout(timeout)).await;
    let refused = refused.expect_err("connect without a quorum");
    assert!(refused.is_backend() && refused.to_string().contains("3 of 5"), "{refused}");
    for i in [0, 2, 4] {
        servers[i].restart();
    }
    let started = Instant::now();
    let guard = loop {
        match m.lock("job").await {
            Ok(guard) => break guard,
            Err(e) => {
                assert!(started.elapsed() < Duration::from_secs(15), "no lock after the restart: {e}");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    };
    guard.release().await.expect("release");
}

/// One node of three paused (SIGSTOP): acquisitions decide on the two others, without waiting
/// for the paused one's timeout; releases work; once resumed, the paused node runs its queued
/// acquires and releases in order, and holds nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_node_does_not_slow_acquisitions_and_is_left_clean() {
    let timeout = Duration::from_secs(2);
    let servers = start(3);
    let m = manager(&servers, timeout, "paused:").await;
    m.lock("job").await.expect("all up").release().await.expect("release");
    servers[0].pause();
    let mut last = 0;
    for _ in 0..5 {
        let started = Instant::now();
        let guard = m.lock("job").await.expect("acquire with 2 of 3");
        let took = started.elapsed();
        assert!(took < Duration::from_secs(1), "the acquisition waited for the paused node: {took:?}");
        assert!(guard.fencing_token() > last);
        last = guard.fencing_token();
        guard.release().await.expect("release with 2 of 3");
    }
    servers[0].resume();
    let key = KeyLayout::of("paused:job").lock;
    await_no_key(&[&servers[0], &servers[1], &servers[2]], &key, "after the resume").await;
}

/// Tokens strictly increase across quorums even when the nodes' counters are far apart: one
/// node's counter is set far ahead by hand, then quorums with and without that node take turns
/// (the third node paused each time). Without the fence raise, the quorum without the advanced
/// node would mint a token far below the one before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fencing_tokens_strictly_increase_across_quorums_with_skewed_counters() {
    let servers = start(3);
    let m = manager(&servers, Duration::from_secs(1), "fence:").await;
    let layout = KeyLayout::of("fence:job");
    let now_us =
        u64::try_from(std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_micros()).unwrap();
    let ahead = now_us + 1_000_000_000_000; // about 11.6 days of microseconds ahead
    let mut a = raw(&servers[0]).await;
    let () = redis::cmd("SET").arg(&layout.fence).arg(ahead).query_async(&mut a).await.expect("SET");

    // {A, B} with C paused: the token comes from A's counter.
    servers[2].pause();
    let first = m.lock("job").await.expect("A and B");
    let t1 = first.fencing_token();
    assert!(t1 > ahead, "{t1} not above A's counter {ahead}");
    first.release().await.expect("release");
    servers[2].resume();

    // {B, C} with A paused: neither minted near A's counter on its own; B was raised to it.
    servers[0].pause();
    let second = m.lock("job").await.expect("B and C");
    let t2 = second.fencing_token();
    assert!(t2 > t1, "{t2} after {t1}");
    second.release().await.expect("release");
    servers[0].resume();

    // {A, C} with B paused.
    servers[1].pause();
    let third = m.lock("job").await.expect("A and C");
    let t3 = third.fencing_token();
    assert!(t3 > t2, "{t3} after {t2}");
    third.release().await.expect("release");
    servers[1].resume();

    // All three, many times.
    let mut last = t3;
    for _ in 0..10 {
        let g = m.lock("job").await.expect("all three");
        assert!(g.fencing_token() > last);
        last = g.fencing_token();
        g.release().await.expect("release");
    }
}

/// Several backends (processes, as far as the nodes can tell) with several tasks each fight
/// over one lock: split votes happen (each contender takes a minority) and are resolved by the
/// random delay; never two holders at once, and every task gets its turns.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn contention_across_backends_never_overlaps_and_makes_progress() {
    use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
    use std::sync::Arc;
    let servers = start(3);
    let inside = Arc::new(AtomicUsize::new(0));
    let done = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for _ in 0..4 {
        let m = manager(&servers, Duration::from_secs(1), "split:").await;
        for _ in 0..4 {
            let (m, inside, done) = (m.clone(), inside.clone(), done.clone());
            tasks.push(tokio::spawn(async move {
                let mut last = 0;
                for _ in 0..10 {
                    let g = m.lock("hot").wait(Duration::from_secs(30)).await.expect("acquire");
                    assert_eq!(inside.fetch_add(1, Ordering::SeqCst), 0, "two holders at once");
                    assert!(g.fencing_token() > last);
                    last = g.fencing_token();
                    tokio::task::yield_now().await;
                    inside.fetch_sub(1, Ordering::SeqCst);
                    g.release().await.expect("release");
                    done.fetch_add(1, Ordering::SeqCst);
                }
            }));
        }
    }
    for t in tasks {
        t.await.expect("task");
    }
    assert_eq!(done.load(Ordering::SeqCst), 160);
}

/// The nodes drop every pub/sub connection (`CLIENT KILL TYPE pubsub`) while a waiter of
/// another backend waits: its subscriptions are made again, and the release still wakes it
/// long before the holder's 30 s lease would.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lost_pubsub_connections_are_made_again() {
    let servers = start(3);
    let a = manager(&servers, Duration::from_secs(1), "pubsub:").await;
    let b = manager(&servers, Duration::from_secs(1), "pubsub:").await;
    let held = a.lock("job").await.expect("holder");
    let waiter =
        tokio::spawn(async move { b.lock("job").wait(Duration::from_secs(10)).await.map(|g| g.fencing_token()) });
    // Wait (bounded) until the waiter subscribed on every node, then cut those connections.
    let channel = KeyLayout::of("pubsub:job").channel;
    for server in &servers {
        let mut conn = raw(server).await;
        await_numsub(&mut conn, &channel, 1).await;
        let _: redis::Value =
            redis::cmd("CLIENT").arg("KILL").arg("TYPE").arg("pubsub").query_async(&mut conn).await.expect("KILL");
    }
    let held_token = held.fencing_token();
    held.release().await.expect("release");
    let token = waiter.await.expect("waiter").expect("woken after its subscriptions were made again");
    assert!(token > held_token);
}

/// A node restarted empty (no persistence) while a lock is held: the watchdog keeps the lock
/// on the two others (a quorum), it is never reported lost, and the next holder's token is
/// still above the held one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_restarted_empty_keeps_the_lock_on_the_quorum() {
    let mut servers = start(3);
    let backend =
        RedlockBackend::connect(urls(&servers), RedisOptions::default().command_timeout(Duration::from_secs(1)))
            .await
            .expect("connect");
    let m = LockManager::builder().prefix("restart:").default_lease(Duration::from_millis(600)).backend(backend);
    let held = m.lock("job").await.expect("holder");
    servers[0].restart();
    tokio::select! {
        _ = held.lost() => panic!("lost although two of three nodes still hold it"),
        _ = tokio::time::sleep(Duration::from_millis(1500)) => {}
    }
    assert!(m.try_lock("job").await.expect("try").is_none(), "held on the quorum after the restart");
    let held_token = held.fencing_token();
    held.release().await.expect("release on the quorum");
    let next = m.lock("job").wait(Duration::from_secs(10)).await.expect("next holder");
    assert!(next.fencing_token() > held_token, "{} after {held_token}", next.fencing_token());
    next.release().await.expect("release");
}

/// Regression (issue 24's audit): the counter of a node that answered an attempt without
/// granting it (it held a stray key of the name) was not raised to the quorum's token, so after
/// the node whose counter was ahead left and another granting node restarted empty, the next
/// quorum (the restarted node and the one that had refused) minted far below the token before.
/// Every node that answers an attempt that wins is raised now: the next token is above.
/// Regression (a CI run under load): a node whose refusal arrived after the quorum had granted
/// was not raised either. Every node that had not answered is raised too now, behind its
/// attempt: the second round has C answer late (frozen until the attempt is decided).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_that_refused_is_raised_too_so_tokens_survive_a_restart_behind_it() {
    for late in [false, true] {
        refused_node_raised(late).await;
    }
}

async fn refused_node_raised(late: bool) {
    let mut servers = start(3);
    let m = manager(&servers, Duration::from_secs(1), "raise:").await;
    let layout = KeyLayout::of("raise:job");
    let now_us =
        u64::try_from(std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_micros()).unwrap();
    let ahead = now_us + 3_600_000_000; // an hour ahead, as a node whose clock ran ahead mints
    let mut a = raw(&servers[0]).await;
    let () = redis::cmd("SET").arg(&layout.fence).arg(ahead).query_async(&mut a).await.expect("SET");
    // C holds a stray key of the name (another owner's, on C alone: a lost split vote).
    let stray = LockManager::builder()
        .prefix("raise:")
        .backend(lock_runtime::backend::redis::RedisBackend::connect(&servers[2].url()).await.expect("C alone"));
    let stray = stray.lock("job").lease(Duration::from_secs(60)).await.expect("stray key on C");
    // {A, B} grant, C refuses (after the attempt is decided, when `late`): the token comes
    // from A's counter.
    if late {
        servers[2].pause();
    }
    let first = m.lock("job").await.expect("A and B");
    if late {
        servers[2].resume();
    }
    let t1 = first.fencing_token();
    assert!(t1 > ahead, "{t1} not above A's counter {ahead}");
    first.release().await.expect("release");
    stray.release().await.expect("release the stray key");
    // B restarts empty; A leaves. The next quorum is {B, C}: B minted from its clock alone, C
    // only if it was not raised.
    servers[1].restart();
    servers[0].kill();
    let second = lock_tests::lock_after_outage(&m, "job").await;
    let t2 = second.fencing_token();
    assert!(t2 > t1, "late {late}: the token went back by {} s: {t2} after {t1}", (t1 - t2.min(t1)) / 1_000_000);
    second.release().await.expect("release");
}

/// `EVALSHA` calls a node has served so far (`INFO commandstats`).
async fn script_calls(server: &RedisServer) -> u64 {
    let mut conn = raw(server).await;
    let info: String = redis::cmd("INFO").arg("commandstats").query_async(&mut conn).await.expect("INFO");
    info.lines()
        .filter_map(|line| line.strip_prefix("cmdstat_evalsha:"))
        .flat_map(|rest| rest.split(','))
        .find_map(|kv| kv.strip_prefix("calls="))
        .map_or(0, |n| n.parse().expect("calls"))
}

/// With the nodes' clocks together (one machine), the nodes of a quorum mint the token the
/// client proposed, so an uncontended cycle is two script calls per node (acquire, release):
/// no fence raise. (Counters apart make the raise come back: see the skewed-counters test.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_uncontended_cycle_is_two_script_calls_per_node() {
    let servers = start(3);
    let m = manager(&servers, Duration::from_secs(1), "cost:").await;
    // Scripts loaded by a first cycle.
    m.lock("job").await.expect("warm-up").release().await.expect("release");
    // A node that runs its acquire late under load (past the proposed token's clock) mints a
    // higher token, and the others are raised to it: up to ten tries of 10 cycles, one of
    // which must cost exactly two script calls per node (a protocol that always raised, or
    // sent more, fails all ten). Three tries were not enough beside a release build on a
    // 2-core machine: a CI run saw a raise in each.
    let mut seen = Vec::new();
    for _ in 0..10 {
        let mut before = Vec::new();
        for s in &servers {
            before.push(script_calls(s).await);
        }
        let mut last = 0;
        for _ in 0..10 {
            let g = m.lock("job").await.expect("acquire");
            assert!(g.fencing_token() > last);
            last = g.fencing_token();
            g.release().await.expect("release");
        }
        // A release decides on a quorum: the last one may still be running on a node. Wait
        // (bounded) until every node served at least the 20 calls, then count.
        let mut calls = Vec::new();
        for (s, b) in servers.iter().zip(&before) {
            lock_tests::eventually("every node served the 20 calls", Duration::from_secs(5), async || {
                let calls = script_calls(s).await - b;
                if calls >= 20 {
                    Ok(())
                } else {
                    Err(calls)
                }
            })
            .await;
            calls.push(script_calls(s).await - b);
        }
        if calls.iter().all(|&c| c == 20) {
            return;
        }
        seen.push(calls);
    }
    panic!("script calls per node for 10 cycles, ten tries: {seen:?} (20 each expected)");
}

/// Polls `fut` until it is ready or has been polled `polls` times, then drops it.
struct PollThenDrop<F> {
    fut: Option<Pin<Box<F>>>,
    left: usize,
}

impl<F: Future> Future for PollThenDrop<F> {
    type Output = Option<F::Output>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let Some(fut) = self.fut.as_mut() else { return Poll::Ready(None) };
        if let Poll::Ready(out) = fut.as_mut().poll(cx) {
            return Poll::Ready(Some(out));
        }
        self.left -= 1;
        if self.left == 0 {
            self.fut = None;
            return Poll::Ready(None);
        }
        Poll::Pending
    }
}

/// An acquisition (free lock) or a waiter (held lock) dropped after any poll leaves no key of
/// its own on any node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_acquisition_leaves_nothing_on_any_node() {
    let servers = start(3);
    let m = manager(&servers, Duration::from_secs(1), "cancel:").await;
    let all: Vec<&RedisServer> = servers.iter().collect();
    let key = KeyLayout::of("cancel:job").lock;
    let mut finished = false;
    for polls in 1..=64 {
        let fut = m.lock("job").wait(Duration::from_secs(5)).into_future();
        match (PollThenDrop { fut: Some(Box::pin(fut)), left: polls }).await {
            Some(got) => {
                got.expect("free").release().await.expect("release");
                finished = true;
                break;
            }
            None => await_no_key(&all, &key, &format!("acquisition dropped after {polls} polls")).await,
        }
    }
    assert!(finished, "an uncontended acquisition was still pending after 64 polls");
    // A waiter dropped after any poll: once the holder releases, nothing is left. The last
    // round's waiter parks (its wait runs out with no further poll point): every point was cut.
    for polls in 1..=32 {
        let held = m.lock("job").await.expect("holder");
        let fut = m.lock("job").wait(Duration::from_millis(500)).into_future();
        let got = (PollThenDrop { fut: Some(Box::pin(fut)), left: polls }).await;
        held.release().await.expect("release");
        await_no_key(&all, &key, &format!("waiter dropped after {polls} polls")).await;
        match got {
            None => {}
            Some(Err(e)) if e.is_contended() => return,
            Some(other) => panic!("a waiter got a held lock: {:?}", other.map(|g| g.fencing_token())),
        }
    }
    panic!("a waiter was still being polled after 32 polls without parking");
}

/// An empty list, an empty, malformed or repeated URL: `is_invalid()`, never a panic; the
/// builder and `LockManager::redlock` take a plain array of URLs; read-write locks are refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_urls_are_invalid() {
    let none: [&str; 0] = [];
    let cases = [
        LockManager::redlock(none).await.map(drop),
        LockManager::redlock(&[""]).await.map(drop),
        LockManager::redlock(&["redis://127.0.0.1:1", "not a url"]).await.map(drop),
        LockManager::redlock(&["redis://127.0.0.1:7001", "redis://127.0.0.1:7001/2"]).await.map(drop),
        LockManager::builder().redlock(&["redis://a:6379", "redis://b:6379", "redis://a:6379"]).await.map(drop),
        RedlockBackend::connect(["redis://x:1"], RedisOptions::default().command_timeout(Duration::ZERO))
            .await
            .map(drop),
    ];
    for (i, case) in cases.into_iter().enumerate() {
        let err = case.expect_err("bad input accepted");
        assert!(err.is_invalid(), "case {i}: {err}");
    }
    let urls = urls(shared());
    let m = LockManager::redlock(&[urls[0].as_str(), urls[1].as_str(), urls[2].as_str()]).await.expect("connect");
    let refused = m.read_lock("rw").await.map(drop).expect_err("read-write locks are not offered");
    assert!(refused.is_invalid(), "{refused}");
}

/// Regression (issue 24's audit): one server listed under two spellings (`localhost:P` and
/// `127.0.0.1:P`) counted as two nodes, so one machine could be a quorum. Nodes are told apart
/// by the server's `run_id` at connect: a server listed twice is `is_invalid()`, naming both.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_server_under_two_spellings_is_invalid() {
    let servers = shared();
    let port = servers[0].port();
    let (a, b) = (format!("redis://127.0.0.1:{port}"), format!("redis://localhost:{port}"));
    let err = LockManager::redlock(&[a.as_str(), b.as_str(), urls(servers)[1].as_str()]).await.map(drop).unwrap_err();
    assert!(err.is_invalid(), "{err}");
    assert!(err.to_string().contains("same Redis server") && err.to_string().contains("localhost"), "{err}");
}

/// A new Redlock backend loads its scripts on every node it reaches as it connects (with the
/// `INFO` it asks each node anyway, in the same wait): its first lock and release are one
/// script call per script on each node, none answered `NOSCRIPT`, loaded and sent again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_backend_loads_its_scripts_on_every_node_so_its_first_lock_is_one_call_per_script() {
    let servers = start(3);
    let m = manager(&servers, Duration::from_secs(2), "first").await;
    let mut conns = Vec::new();
    for server in &servers {
        conns.push(raw(server).await);
    }
    let mut before = Vec::new();
    for conn in &mut conns {
        before.push(lock_tests::redis_server::command_calls(conn).await);
    }
    m.lock("job").await.expect("lock").release().await.expect("release");
    let all: Vec<&RedisServer> = servers.iter().collect();
    await_no_key(&all, &KeyLayout::of("first:job").lock, "released").await;
    for (i, conn) in conns.iter_mut().enumerate() {
        let after = lock_tests::redis_server::command_calls(conn).await;
        let delta = |c: &str| after.get(c).copied().unwrap_or(0) - before[i].get(c).copied().unwrap_or(0);
        assert_eq!(
            (delta("script|load"), delta("eval")),
            (0, 0),
            "node {i}: scripts loaded (SCRIPT LOAD, EVAL) for a new backend's first lock and release"
        );
        assert!(delta("evalsha") >= 2, "node {i}: {} script calls for a lock and its release", delta("evalsha"));
    }
}

/// Regression: a release channel left idle past its grace was unsubscribed, but kept in the
/// node's table, so it was unsubscribed again at every turn of the pub/sub task: about 10,000
/// `UNSUBSCRIBE` a second on every node, for as long as the process lived, after the first
/// waiter of any lock left. Now the channel is forgotten once unsubscribed: one `UNSUBSCRIBE`
/// per node, and none after.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_release_channel_is_unsubscribed_once() {
    let servers = start(3);
    let backend = RedlockBackend::connect(urls(&servers), RedisOptions::default()).await.expect("connect");
    let m = LockManager::builder().backend(backend.clone());
    let holder = m.lock("idle-channel").await.expect("holder");
    let waiter = {
        let m = m.clone();
        tokio::spawn(async move { m.lock("idle-channel").wait(Duration::from_secs(10)).await })
    };
    lock_tests::eventually("the waiter subscribed", Duration::from_secs(10), async || {
        lock_tests::reached(backend.subscribed_channels(), 3)
    })
    .await;
    holder.release().await.expect("release");
    waiter.await.expect("waiter task").expect("granted").release().await.expect("release");
    // The default grace is 500 ms; then the channel is forgotten on every node.
    lock_tests::eventually("the channel unsubscribed and forgotten", Duration::from_secs(10), async || {
        lock_tests::reached(backend.subscribed_channels(), 0)
    })
    .await;
    let mut conns = Vec::new();
    for server in &servers {
        conns.push(raw(server).await);
    }
    let mut before = Vec::new();
    for conn in &mut conns {
        before.push(lock_tests::redis_server::command_calls(conn).await.get("unsubscribe").copied().unwrap_or(0));
    }
    // Nothing signals a command not sent: 200 ms was about 2,000 needless UNSUBSCRIBE per node.
    tokio::time::sleep(Duration::from_millis(200)).await;
    for (conn, before) in conns.iter_mut().zip(before) {
        let after = lock_tests::redis_server::command_calls(conn).await.get("unsubscribe").copied().unwrap_or(0);
        assert!(before <= 1, "{before} UNSUBSCRIBE on a node for one channel");
        assert_eq!(after, before, "UNSUBSCRIBE sent again for a channel unsubscribed already");
    }
}

/// Grants of one name by 3 managers (processes, as far as the nodes can tell) × 6 tasks each
/// during `window`: how many, and how many waits of 10 s ran out. Every grant is checked
/// alone (never two holders at once).
async fn contended_grants(managers: &[LockManager], window: Duration) -> (u64, u64) {
    use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
    use std::sync::Arc;
    let inside = Arc::new(AtomicUsize::new(0));
    let (grants, timeouts) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let end = Instant::now() + window;
    let mut tasks = Vec::new();
    for m in managers {
        for _ in 0..6 {
            let (m, inside, grants, timeouts) = (m.clone(), inside.clone(), grants.clone(), timeouts.clone());
            tasks.push(tokio::spawn(async move {
                while Instant::now() < end {
                    match m.lock("hot").wait(Duration::from_secs(10)).await {
                        Ok(guard) => {
                            assert_eq!(inside.fetch_add(1, Ordering::SeqCst), 0, "two holders at once");
                            if Instant::now() < end {
                                grants.fetch_add(1, Ordering::SeqCst);
                            }
                            inside.fetch_sub(1, Ordering::SeqCst);
                            guard.release().await.expect("release");
                        }
                        Err(e) if e.is_contended() => {
                            timeouts.fetch_add(1, Ordering::SeqCst);
                        }
                        Err(e) => panic!("a wait failed: {e}"),
                    }
                }
            }));
        }
    }
    for t in tasks {
        t.await.expect("task");
    }
    (grants.load(Ordering::SeqCst), timeouts.load(Ordering::SeqCst))
}

/// Regression (issue 56): under contention, a minority of nodes down must not stall the lock.
/// With every contender needing every live node, their attempts split the vote, and undoing
/// the split woke the others' heads together, so they split again: grants fell from ~420/s to
/// ~2/s for the whole outage and waits of 20 s ran out. The rate with `down` of `n` nodes
/// killed is measured against the rate with all of them up, in the same run: at least half,
/// and no wait of 10 s runs out. Margins: 4 s windows (thousands of grants with all up).
async fn contention_with_nodes_down(n: usize, down: usize) {
    let mut servers = start(n);
    let mut managers = Vec::new();
    for _ in 0..3 {
        managers.push(manager(&servers, Duration::from_secs(1), "contended:").await);
    }
    let window = Duration::from_secs(4);
    let (up, up_timeouts) = contended_grants(&managers, window).await;
    for server in servers.iter_mut().take(down) {
        server.kill();
    }
    let (with_down, down_timeouts) = contended_grants(&managers, window).await;
    let rate = |grants: u64| grants as f64 / window.as_secs_f64();
    lock_tests::figure(
        &format!("redlock, 3 managers x 6 tasks on one name, {down} of {n} nodes down"),
        &format!(
            "{:.0} grants/s with every node up, {:.0} with {down} down ({:.2}x); waits run out: {up_timeouts} and {down_timeouts}",
            rate(up),
            rate(with_down),
            rate(with_down) / rate(up).max(f64::MIN_POSITIVE)
        ),
    );
    assert_eq!(up_timeouts + down_timeouts, 0, "waits of 10 s ran out");
    assert!(with_down * 2 >= up, "{with_down} grants with {down} of {n} nodes down against {up} with all up");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn contention_with_one_node_of_three_down_keeps_granting() {
    contention_with_nodes_down(3, 1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn contention_with_two_nodes_of_five_down_keeps_granting() {
    contention_with_nodes_down(5, 2).await;
}

/// Regression (issue 56): a wait that ran out while nobody held the lock said "held by someone
/// else". Two other owners each hold the name on one node of three (a split vote, frozen):
/// nobody holds a majority, and the error says so (`held: false`), through the first vote and
/// the waits after it, which ask the first node alone; then one owner holding it on every node
/// makes the same wait say that it is held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wait_run_out_on_split_votes_says_that_nobody_held_the_lock() {
    use lock_runtime::backend::redis::RedisBackend;
    use lock_runtime::LockError;
    let servers = start(3);
    let m = manager(&servers, Duration::from_secs(1), "split:").await;
    let mut strays = Vec::new();
    for server in &servers[..2] {
        let one = RedisBackend::connect(&server.url()).await.expect("one node");
        let one = LockManager::builder().prefix("split:").backend(one);
        strays.push(one.lock("job").lease(Duration::from_secs(60)).await.expect("a stray key on one node"));
    }
    for wait in [Duration::ZERO, Duration::from_millis(400)] {
        let err = m.lock("job").wait(wait).await.expect_err("nobody can win the vote");
        assert!(err.is_contended(), "{err}");
        assert!(matches!(err, LockError::Contended { held: false, .. }), "wait {wait:?}: {err:?}");
        assert!(err.to_string().contains("nobody held it"), "{err}");
    }
    for stray in strays {
        stray.release().await.expect("release a stray key");
    }
    let holder = m.lock("job").await.expect("a quorum");
    let other = manager(&servers, Duration::from_secs(1), "split:").await;
    for wait in [Duration::ZERO, Duration::from_millis(400)] {
        let err = other.lock("job").wait(wait).await.expect_err("held");
        assert!(matches!(err, LockError::Contended { held: true, .. }), "wait {wait:?}: {err:?}");
        assert!(err.to_string().contains("held by someone else"), "{err}");
    }
    holder.release().await.expect("release");
}
