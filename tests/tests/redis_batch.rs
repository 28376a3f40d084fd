//! Group commit on a real `redis-server`: mutex attempts and releases made while another call
//! is on the wire go out together in one script call, each with its own fencing token, and an
//! attempt dropped while its batch is on the wire leaves no lock behind.
#![cfg(feature = "redis")]
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod redis_support;

use std::future::{Future, IntoFuture};
use std::pin::Pin;
use std::task::Poll;
use std::time::Duration;

use lock_runtime::backend::redis::KeyLayout;
use lock_runtime::{LockError, LockGuard, LockManager};
use lock_tests::redis_server::RedisServer;
use redis_support::*;

/// The server's clock in microseconds.
async fn server_micros(conn: &mut redis::aio::MultiplexedConnection) -> u64 {
    let (secs, micros): (u64, u64) = redis::cmd("TIME").query_async(conn).await.expect("TIME");
    secs * 1_000_000 + micros
}

/// How many times the server ran `command` between two `command_calls` snapshots.
fn delta(
    before: &std::collections::BTreeMap<String, u64>,
    after: &std::collections::BTreeMap<String, u64>,
    command: &str,
) -> u64 {
    after.get(command).copied().unwrap_or(0) - before.get(command).copied().unwrap_or(0)
}

/// 32 tasks locking and releasing their own names 10 times each at once: the server runs
/// fewer script calls (and `TIME`s) than there are operations, and every grant still has its
/// own token, above the server's clock when the run began and above the name's earlier ones;
/// the server's fencing counter is read and written once per batch, not per grant, and ends at
/// or above every token handed out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_locks_go_out_in_batches_each_with_its_own_token() {
    let server = RedisServer::start();
    let m = LockManager::builder().backend(backend(&server, Duration::from_secs(5)).await);
    let mut conn = raw(&server).await;
    m.lock("warm-up").await.expect("lock").release().await.expect("release");
    let (tasks, cycles) = (32u64, 10);
    let began = server_micros(&mut conn).await;
    let before = command_calls(&mut conn).await;
    let runs: Vec<_> = (0..tasks)
        .map(|i| {
            let m = m.clone();
            tokio::spawn(async move {
                let mut tokens = Vec::new();
                for _ in 0..cycles {
                    let guard = m.lock(batch_name(i)).lease(Duration::from_secs(10)).await.expect("lock");
                    tokens.push(guard.fencing_token());
                    guard.release().await.expect("release");
                }
                tokens
            })
        })
        .collect();
    let mut highest = 0;
    for (i, run) in runs.into_iter().enumerate() {
        let tokens = run.await.expect("task");
        assert!(tokens[0] >= began, "batch:{i}: token {} below the server's clock {began}", tokens[0]);
        assert!(tokens.windows(2).all(|w| w[0] < w[1]), "batch:{i}: tokens not increasing: {tokens:?}");
        highest = highest.max(tokens[tokens.len() - 1]);
    }
    let after = command_calls(&mut conn).await;
    let operations = 2 * tasks * cycles;
    let (calls, times) = (delta(&before, &after, "evalsha"), delta(&before, &after, "time"));
    assert!(calls < operations, "{calls} script calls for {operations} operations: nothing was batched");
    assert!(times < operations / 2, "{times} TIME calls for {} attempts: nothing was batched", operations / 2);
    // The server's one counter is read at most once per script call (a release reads its
    // lock once, the rest of the GETs): it was read once per grant before.
    let counter_reads = delta(&before, &after, "get") - operations / 2;
    assert!(counter_reads <= calls, "the counter read {counter_reads} times in {calls} script calls");
    let counter: u64 =
        redis::cmd("GET").arg(KeyLayout::SERVER_FENCE).query_async(&mut conn).await.expect("GET the counter");
    assert!(counter >= highest, "the counter {counter} below a token handed out, {highest}");
    for i in 0..tasks {
        assert!(!key_exists(&mut conn, &batch_name(i)).await, "{}: a lock key was left behind", batch_name(i));
    }
}

/// The name of task `i`'s lock: every fourth begins with `}` (an empty hash tag: its queue is
/// named apart from its key, and a batch carries that name).
fn batch_name(i: u64) -> String {
    if i.is_multiple_of(4) {
        format!("}}batch:{i}")
    } else {
        format!("batch:{i}")
    }
}

/// The server loses its scripts (`SCRIPT FLUSH`, as after a restart without persistence)
/// while a process locks in batches: the first batch answered `NOSCRIPT` loads the batch
/// script and is sent again, so every lock and release after it still succeeds, in batches.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batches_after_the_server_lost_its_scripts_load_them_and_go_on() {
    let server = RedisServer::start();
    let m = LockManager::builder().backend(backend(&server, Duration::from_secs(5)).await);
    let mut conn = raw(&server).await;
    let (tasks, cycles) = (32, 10);
    let round = |round: usize| {
        let runs: Vec<_> = (0..tasks)
            .map(|i| {
                let m = m.clone();
                tokio::spawn(async move {
                    for _ in 0..cycles {
                        let name = format!("flushed:{round}:{i}");
                        let guard = m.lock(name).lease(Duration::from_secs(10)).await.expect("lock");
                        guard.release().await.expect("release");
                    }
                })
            })
            .collect();
        async move {
            for run in runs {
                run.await.expect("task");
            }
        }
    };
    round(0).await;
    let _: () = redis::cmd("SCRIPT").arg("FLUSH").query_async(&mut conn).await.expect("SCRIPT FLUSH");
    let before = command_calls(&mut conn).await;
    round(1).await;
    let after = command_calls(&mut conn).await;
    let operations = 2 * tasks * cycles;
    let calls = delta(&before, &after, "evalsha");
    assert!(calls < operations, "{calls} script calls for {operations} operations: nothing was batched");
    assert!(delta(&before, &after, "script|load") >= 1, "no script was loaded again");
    for i in 0..tasks {
        assert!(!key_exists(&mut conn, &format!("flushed:1:{i}")).await, "flushed:1:{i}: a lock key was left behind");
    }
}

type Acquiring<'a> = Pin<Box<dyn Future<Output = Result<LockGuard, LockError>> + Send + 'a>>;

/// Polls `fut` once.
async fn poll_once(fut: &mut Acquiring<'_>) -> Poll<Result<LockGuard, LockError>> {
    std::future::poll_fn(|cx| Poll::Ready(fut.as_mut().poll(cx))).await
}

/// On a frozen server: two attempts go out on their own (the lane's two calls on the wire),
/// four wait for a batch. Two of those are dropped before the batch is sent (left out of it);
/// the first attempt is dropped (its call ends: the batch of the two others is sent); those
/// two are dropped with their batch on the wire. Once the server runs again, nothing is left
/// held: the batch's grants, which nobody took, are undone. The server ran three `TIME`s
/// (two attempts on their own and one batch), and no attempt left out of the batch.
#[tokio::test]
async fn an_attempt_dropped_while_its_batch_is_on_the_wire_leaves_no_lock_behind() {
    let server = RedisServer::start();
    let m = LockManager::builder().backend(backend(&server, Duration::from_secs(5)).await);
    let mut conn = raw(&server).await;
    let before = command_calls(&mut conn).await;
    let lease = Duration::from_secs(60);
    let names = ["alone-1", "alone-2", "left-out-1", "left-out-2", "sent-1", "sent-2"];
    server.pause();
    let mut attempts: Vec<Option<Acquiring<'_>>> = names
        .iter()
        .map(|name| {
            Some(Box::pin(m.lock(*name).lease(lease).wait(Duration::from_secs(30)).into_future()) as Acquiring<'_>)
        })
        .collect();
    for attempt in attempts.iter_mut().flatten() {
        assert!(poll_once(attempt).await.is_pending(), "answered by a frozen server");
    }
    // The connection's task writes the two calls on their own to the socket.
    tokio::task::yield_now().await;
    drop(attempts[2].take());
    drop(attempts[3].take());
    drop(attempts[0].take());
    // The batch's sender (spawned on this single-threaded runtime) takes "sent-1" and "sent-2".
    tokio::task::yield_now().await;
    drop(attempts[4].take());
    drop(attempts[5].take());
    server.resume();
    let alone = attempts[1].take().expect("alone-2").await.expect("alone-2 granted");
    alone.release().await.expect("release");
    for name in ["alone-1", "sent-1", "sent-2"] {
        await_key_gone(&mut conn, &KeyLayout::of(name).lock, "dropped attempt undone").await;
    }
    let after = command_calls(&mut conn).await;
    assert_eq!(delta(&before, &after, "time"), 3, "two attempts on their own, one batch");
    // Each of the four attempts sent ran a `SET NX`, each script call one counter `SET` (the
    // batch reserves its tokens at once); none of the two left out of the batch ran anything.
    assert_eq!(delta(&before, &after, "set"), 4 + 3, "an attempt left out of its batch was sent");
}

/// With 16 other tasks keeping the lane busy (their operations going out in batches), a
/// guard dropped without awaiting its release is still released before the next lock call
/// of the same task reaches the server: a `try_lock` right after the drop gets the lock,
/// every time, from the backend's first batch on (its scripts were loaded as it connected: a
/// first batch answered `NOSCRIPT` would be sent again behind what was sent after it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_guard_is_released_ahead_of_the_next_lock_while_batches_go_out() {
    let server = RedisServer::start();
    let m = LockManager::builder().backend(backend(&server, Duration::from_secs(5)).await);
    let mut conn = raw(&server).await;
    let before = command_calls(&mut conn).await;
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let load: Vec<_> = (0..16)
        .map(|i| {
            let (m, stop) = (m.clone(), stop.clone());
            tokio::spawn(async move {
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    m.lock(format!("load:{i}")).await.expect("lock").release().await.expect("release");
                }
            })
        })
        .collect();
    for round in 0..300 {
        let guard = m.lock("ordered").lease(Duration::from_secs(60)).await.expect("lock");
        drop(guard);
        let again = m.try_lock("ordered").await.expect("try_lock");
        assert!(again.is_some(), "round {round}: the dropped guard's release went out after the next attempt");
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for task in load {
        task.await.expect("load task");
    }
    let after = command_calls(&mut conn).await;
    let attempts = delta(&before, &after, "time");
    assert!(delta(&before, &after, "evalsha") < 2 * attempts, "nothing was batched");
}

/// A frozen server past the command timeout fails the calls on the wire and the batch behind
/// them (each caller gets a backend error in time); once it runs again, the lane has given
/// back every call slot: new locks go out and are granted at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batches_that_time_out_leave_the_lane_usable() {
    let server = RedisServer::start();
    let timeout = Duration::from_millis(300);
    let m = LockManager::builder().backend(backend(&server, timeout).await);
    let mut conn = raw(&server).await;
    m.lock("warm-up").await.expect("lock").release().await.expect("release");
    server.pause();
    let frozen: Vec<_> =
        (0..6).map(|i| m.lock(format!("frozen:{i}")).lease(Duration::from_secs(60)).into_future()).collect();
    let started = std::time::Instant::now();
    for outcome in futures_util::future::join_all(frozen).await {
        assert!(outcome.expect_err("granted by a frozen server").is_backend());
    }
    assert!(started.elapsed() < Duration::from_secs(3), "failed only after {:?}", started.elapsed());
    server.resume();
    lock_tests::lock_after_outage(&m, "warm-up").await.release().await.expect("release"); // connection back
    let again: Vec<_> =
        (0..6).map(|i| m.lock(format!("again:{i}")).wait(Duration::from_secs(5)).into_future()).collect();
    for guard in futures_util::future::join_all(again).await {
        guard.expect("granted after the outage").release().await.expect("release");
    }
    // The frozen attempts, which may have run once the server did, were undone.
    for i in 0..6 {
        await_key_gone(&mut conn, &KeyLayout::of(&format!("frozen:{i}")).lock, "a timed-out attempt undone").await;
    }
}
