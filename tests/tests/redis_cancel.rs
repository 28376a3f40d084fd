//! Cancellation on a real `redis-server`: an acquisition or a release dropped after any poll
//! leaves no lock behind, passes its wake-up on, still completes, and never frees a later
//! owner's lock.
#![cfg(feature = "redis")]
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod redis_support;

use std::future::{Future, IntoFuture};
use std::time::{Duration, Instant};

use lock_runtime::backend::redis::{KeyLayout, RedisBackend};
use lock_runtime::LockManager;
use lock_tests::lock_after_outage;
use lock_tests::redis_server::RedisServer;
use redis_support::*;

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
    lock_tests::eventually("W1 queued", Duration::from_secs(10), async || {
        lock_tests::reached(store.local_waiters(), 1)
    })
    .await;
    let m2 = m.clone();
    let w2 = tokio::spawn(async move {
        let got = m2.lock(name).wait(Duration::from_secs(20)).retry(1).await;
        (Instant::now(), got)
    });
    lock_tests::eventually("W2 queued", Duration::from_secs(10), async || {
        lock_tests::reached(store.local_waiters(), 2)
    })
    .await;
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

/// Issue: a release whose future is dropped after its first poll (the caller's `select!` or
/// `timeout` gave up while the release script was on its way) still completes: the key is
/// gone within a couple of seconds, not at the end of its 60 s lease, and another manager
/// locks the name at once. Through the guard (`LockGuard::release`) and through the
/// backend's `HeldLock::release` directly, for a mutex and a read lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_dropped_after_its_first_poll_still_completes() {
    use lock_runtime::backend::{Attempt, LockBackend};
    let server = RedisServer::start();
    let lease = Duration::from_secs(60);
    let holder = backend(&server, Duration::from_secs(2)).await;
    let m = LockManager::builder().backend(holder.clone());
    let other = kinds_manager(&server).await;
    let mut conn = raw(&server).await;
    m.lock("warm-up").await.expect("lock").release().await.expect("release"); // scripts loaded
    m.read_lock("warm-up").await.expect("lock").release().await.expect("release");
    let mut dropped = 0;
    // Until 20 were dropped in flight: under load a release is now and then answered within
    // its first poll (the thread was preempted between sending and polling for the answer).
    for round in 0..40 {
        if dropped >= 20 {
            break;
        }
        // Through the guard.
        for read in [false, true] {
            let name = format!("dropped-guard-release-{read}-{round}");
            let (guard, key) = if read {
                (m.read_lock(&name).lease(lease).await.expect("lock"), rw_state(&name))
            } else {
                (m.lock(&name).lease(lease).await.expect("lock"), KeyLayout::of(&name).lock)
            };
            let mut release = Box::pin(guard.release());
            if lock_tests::poll_once(&mut release).await.is_ready() {
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
            let req = request(&name, lease, read);
            let key = if read { rw_state(&name) } else { KeyLayout::of(&name).lock };
            let mut acquisition = holder.begin(req, lock_runtime::LostSignal::new());
            let Attempt::Acquired(mut grant) = acquisition.attempt().await.expect("attempt") else {
                panic!("{name} is free")
            };
            drop(acquisition);
            {
                let mut release = grant.lock.release();
                if lock_tests::poll_once(&mut release).await.is_ready() {
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
    use lock_runtime::backend::{Attempt, LockBackend};
    let server = RedisServer::start();
    let first = backend(&server, Duration::from_secs(2)).await;
    let other = kinds_manager(&server).await;
    let mut conn = raw(&server).await;
    for read in [false, true] {
        let name = format!("late-release-{read}");
        let req = request(&name, Duration::from_secs(60), read);
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

/// A request made to a backend directly (no manager): `name` with no prefix, a fixed `lease`,
/// as a read lock or a mutex.
fn request(name: &str, lease: Duration, read: bool) -> lock_runtime::backend::Acquire {
    use lock_runtime::backend::{Acquire, Holder, Lease, LockKind, OwnerId};
    Acquire {
        name: name.into(),
        key: name.into(),
        owner: OwnerId::next(),
        holder: Holder::of_process(None),
        lease: Lease::Fixed(lease),
        kind: if read { LockKind::Read } else { LockKind::Exclusive },
    }
}

/// A guard dropped unreleased sends its release at once, from its drop: a `try_lock` made
/// right after it, on the same connection, finds the lock free. (Left to a task spawned for
/// it, the release went out only once this task yielded: behind the `try_lock`, which found the
/// lock still held.) On a current-thread runtime, where that order is certain.
#[tokio::test(flavor = "current_thread")]
async fn a_dropped_guard_releases_ahead_of_the_next_command() {
    let server = RedisServer::start();
    let m = LockManager::builder().backend(backend(&server, Duration::from_secs(2)).await);
    for kind in ["mutex", "read"] {
        // The scripts are loaded (a first call answered NOSCRIPT is sent again, later).
        let name = format!("warm-up-{kind}");
        let guard = if kind == "read" { m.read_lock(&name).await } else { m.lock(&name).await }.expect("lock");
        guard.release().await.expect("release");
        let name = format!("dropped-guard-{kind}");
        let guard = if kind == "read" { m.read_lock(&name).await } else { m.lock(&name).await }.expect("lock");
        drop(guard);
        let next = if kind == "read" { m.try_write_lock(&name).await } else { m.try_lock(&name).await };
        let next = next.expect("try").unwrap_or_else(|| panic!("{kind}: the dropped guard's lock is still held"));
        next.release().await.expect("release");
    }
}
