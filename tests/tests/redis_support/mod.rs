//! What the Redis test binaries (`redis.rs`, `redis_waiting.rs`, `redis_kinds.rs`,
//! `redis_cancel.rs`) share: connections to the test server, its statistics, and waits for
//! server states that have no signal.
#![allow(dead_code)]

use std::time::Duration;

use lock_runtime::backend::redis::{KeyLayout, RedisBackend, RedisOptions};
use lock_runtime::LockManager;
pub(crate) use lock_tests::redis_server::command_calls;
use lock_tests::redis_server::RedisServer;

pub(crate) async fn raw(server: &RedisServer) -> redis::aio::MultiplexedConnection {
    let client = redis::Client::open(server.url()).expect("url");
    client.get_multiplexed_async_connection().await.expect("raw connection")
}

pub(crate) async fn backend(server: &RedisServer, timeout: Duration) -> RedisBackend {
    RedisBackend::connect_with(&server.url(), RedisOptions::default().command_timeout(timeout)).await.expect("connect")
}

pub(crate) async fn numsub(conn: &mut redis::aio::MultiplexedConnection, channel: &str) -> u64 {
    let (_, n): (String, u64) =
        redis::cmd("PUBSUB").arg("NUMSUB").arg(channel).query_async(conn).await.expect("NUMSUB");
    n
}

/// Polls the server (no push signal exists for this) until `numsub(channel) == want`.
pub(crate) async fn await_numsub(conn: &mut redis::aio::MultiplexedConnection, channel: &str, want: u64) {
    let what = format!("{want} subscriber(s) on {channel}");
    lock_tests::eventually(&what, Duration::from_secs(10), async || {
        lock_tests::reached(numsub(conn, channel).await, want)
    })
    .await;
}

/// Connections open on the server, by `CLIENT LIST TYPE <kind>`.
pub(crate) async fn clients(conn: &mut redis::aio::MultiplexedConnection, kind: &str) -> usize {
    let list: String = redis::cmd("CLIENT").arg("LIST").arg("TYPE").arg(kind).query_async(conn).await.expect("CLIENT");
    list.lines().filter(|l| !l.is_empty()).count()
}

/// Polls the server (no push signal exists for this) until `kind` has `want` connections.
pub(crate) async fn await_clients(conn: &mut redis::aio::MultiplexedConnection, kind: &str, want: usize) {
    let what = format!("{want} {kind} connection(s)");
    lock_tests::eventually(&what, Duration::from_secs(10), async || {
        lock_tests::reached(clients(conn, kind).await, want)
    })
    .await;
}

/// Whether the lock key of `name` (no prefix) exists on the server.
pub(crate) async fn key_exists(conn: &mut redis::aio::MultiplexedConnection, name: &str) -> bool {
    let n: u64 = redis::cmd("EXISTS").arg(KeyLayout::of(name).lock).query_async(conn).await.expect("EXISTS");
    n == 1
}

/// Polls the server (no signal exists for a background release) until `key` is gone, within 2 s.
pub(crate) async fn await_key_gone(conn: &mut redis::aio::MultiplexedConnection, key: &str, what: &str) {
    let gone = format!("{what}: {key} gone");
    lock_tests::eventually(&gone, Duration::from_secs(2), async || {
        let exists: u64 = redis::cmd("EXISTS").arg(key).query_async(conn).await.expect("EXISTS");
        lock_tests::reached(exists, 0)
    })
    .await;
}

/// Polls the server (no signal exists for a registration) until the lock `name`'s queue in
/// Redis holds `want` waiting processes.
pub(crate) async fn await_queued(conn: &mut redis::aio::MultiplexedConnection, name: &str, want: u64) {
    let queue = KeyLayout::of(name).queue();
    let what = format!("{want} process(es) in {queue}");
    lock_tests::eventually(&what, Duration::from_secs(10), async || {
        let n: u64 = redis::cmd("HLEN").arg(&queue).query_async(conn).await.expect("HLEN");
        lock_tests::reached(n, want)
    })
    .await;
}

/// The key of a read-write lock's state (see the kinds module docs).
pub(crate) fn rw_state(name: &str) -> String {
    format!("lock:rw:{{{name}}}")
}

/// A manager on its own [`RedisBackend`] (its own connections, pub/sub and local queues: a
/// separate process as far as the locks can tell).
pub(crate) async fn kinds_manager(server: &RedisServer) -> LockManager {
    LockManager::builder().default_lease(Duration::from_secs(30)).backend(backend(server, Duration::from_secs(2)).await)
}

/// Runs `per_backend` waiters in each of `backends` backends (as in as many processes) behind
/// one holder, lets the lock pass through all of them, and returns the script runs (`EVALSHA`
/// not answered NOSCRIPT) and `PTTL` calls the server saw.
pub(crate) async fn hand_through(server: &RedisServer, backends: usize, per_backend: u64) -> (u64, u64) {
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
    let queued = (backends as u64 * per_backend) as usize;
    lock_tests::eventually("every waiter queued", Duration::from_secs(10), async || {
        lock_tests::reached(stores.iter().map(RedisBackend::local_waiters).sum::<usize>(), queued)
    })
    .await;
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
