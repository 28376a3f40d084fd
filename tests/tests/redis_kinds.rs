//! Read-write locks and semaphores on a real `redis-server`: crashed and renewed readers, a
//! waiting writer that blocks new readers of another backend, permits agreed across backends,
//! `hold_at_least`, and nothing left behind.
#![cfg(feature = "redis")]
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod redis_support;

use std::future::IntoFuture;
use std::time::{Duration, Instant};

use lock_runtime::LockManager;
use lock_tests::redis_server::RedisServer;
use redis_support::*;

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
    readers_kept_out(&c, "shelf").await;
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
    readers_kept_out(&c, "shelf").await;
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
    lock_tests::eventually("no key but the counters, no subscription", Duration::from_secs(10), async || {
        let keys: Vec<String> = redis::cmd("KEYS").arg("*").query_async(&mut conn).await.expect("KEYS");
        let strays: Vec<String> = keys.iter().filter(|k| !k.starts_with("lock:fence")).cloned().collect();
        let channels: Vec<String> =
            redis::cmd("PUBSUB").arg("CHANNELS").arg("*").query_async(&mut conn).await.expect("PUBSUB");
        lock_tests::reached((strays, channels), (vec![], vec![]))
    })
    .await;
    let keys: Vec<String> = redis::cmd("KEYS").arg("lock:fence*").query_async(&mut conn).await.expect("KEYS");
    assert!(!keys.is_empty(), "the fencing counters stay");
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

/// Waits (5 s at most) until a writer waiting in another backend keeps `m`'s new readers of
/// `name` out: its intent reached the server (nothing signals that here).
async fn readers_kept_out(m: &LockManager, name: &str) {
    lock_tests::eventually("readers kept out by the waiting writer", Duration::from_secs(5), async || {
        match m.try_read_lock(name).await.expect("try") {
            None => Ok(()),
            Some(reader) => Err(reader.release().await),
        }
    })
    .await;
}
