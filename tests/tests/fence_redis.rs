//! The Redis fence (`lock_runtime::fence::redis`) against a real `redis-server`: a holder of
//! the Redis lock paused past its lease is refused, the current holder writes again, a value
//! and its recorded token expire together, a fenced delete keeps the fence, and concurrent
//! writers with interleaved tokens leave the highest token's value (checked).

#![cfg(feature = "redis")]
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

use lock_runtime::fence::redis::{del, fence_key, hset, set, set_expiring, RedisFences};
use lock_runtime::fence::FenceStore;
use lock_runtime::LockManager;
use lock_tests::redis_server::RedisServer;
use redis::aio::MultiplexedConnection;
use redis::AsyncCommands;

async fn connect(server: &RedisServer) -> MultiplexedConnection {
    let client = redis::Client::open(server.url()).expect("client");
    client.get_multiplexed_async_connection().await.expect("connect")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_paused_past_its_lease_is_refused() {
    let server = RedisServer::start();
    let mut conn = connect(&server).await;
    let manager = LockManager::redis(server.url()).await.expect("manager");

    let paused = manager.lock("orders:42").lease(Duration::from_millis(200)).await.expect("first holder");
    let stale = paused.fencing_token();
    paused.lost().await; // its lease ran out while it was paused
    let current = manager.lock("orders:42").lease(Duration::from_secs(30)).await.expect("next holder");
    assert!(current.fencing_token() > stale);

    set(&mut conn, "orders:42:state", "paid", current.fencing_token()).await.expect("the current holder writes");
    let err = set(&mut conn, "orders:42:state", "cancelled", stale).await.expect_err("the late write is refused");
    assert!(err.is_fenced(), "{err}");
    assert!(err.to_string().contains(&format!("token {stale} is stale")), "{err}");
    assert!(err.to_string().contains(&current.fencing_token().to_string()), "{err}");
    let state: String = conn.get("orders:42:state").await.expect("get");
    assert_eq!(state, "paid", "nothing of the refused write");

    set(&mut conn, "orders:42:state", "shipped", current.fencing_token()).await.expect("the same token again");
    set(&mut conn, "orders:43:state", "paid", stale).await.expect("another key has its own fence");
    let state: String = conn.get("orders:42:state").await.expect("get");
    assert_eq!(state, "shipped");
    current.release().await.expect("release");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_value_and_its_token_expire_together_and_a_delete_keeps_the_fence() {
    let server = RedisServer::start();
    let mut conn = connect(&server).await;
    set_expiring(&mut conn, "k", "v", 5, Duration::from_secs(100)).await.expect("set");
    let (value_ttl, fence_ttl): (i64, i64) =
        redis::pipe().pttl("k").pttl(fence_key("k")).query_async(&mut conn).await.expect("pttl");
    assert!(value_ttl > 90_000 && fence_ttl > 90_000, "both expire: {value_ttl} {fence_ttl}");
    assert!(set_expiring(&mut conn, "k", "v", 5, Duration::ZERO).await.expect_err("0 ms").is_invalid());
    // Past Redis' range: refused before Redis is asked (it was Redis' own error, `is_backend`).
    let err = set_expiring(&mut conn, "k", "v", 5, Duration::MAX).await.expect_err("Duration::MAX");
    assert!(err.is_invalid() && err.to_string().contains("100 years"), "{err}");

    assert!(del(&mut conn, "k", 4).await.expect_err("a stale delete").is_fenced());
    assert_eq!(conn.get::<_, Option<String>>("k").await.expect("get"), Some("v".to_owned()));
    del(&mut conn, "k", 6).await.expect("delete");
    assert_eq!(conn.get::<_, Option<String>>("k").await.expect("get"), None);
    // The fence stays: a holder older than the delete cannot write the value back.
    assert!(set(&mut conn, "k", "zombie", 5).await.expect_err("refused after the delete").is_fenced());
    assert_eq!(conn.get::<_, Option<String>>("k").await.expect("get"), None);
    // Tokens compare exactly over all of u64 (not as floating-point numbers).
    set(&mut conn, "big", "a", u64::MAX - 1).await.expect("set");
    assert!(set(&mut conn, "big", "b", u64::MAX - 2).await.expect_err("one below").is_fenced());
    set(&mut conn, "big", "c", u64::MAX).await.expect("one above");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_writers_leave_the_highest_tokens_value() {
    let server = RedisServer::start();
    const WRITERS: u64 = 64;
    let mut tasks = Vec::new();
    for i in 0..WRITERS {
        let token = (i * 37) % WRITERS + 1; // interleaved: unrelated to the start order
        let mut conn = connect(&server).await;
        tasks.push(tokio::spawn(async move { (token, set(&mut conn, "shared", token, token).await) }));
    }
    let mut refused = 0;
    for task in tasks {
        let (token, outcome) = task.await.expect("writer");
        if let Err(e) = outcome {
            let lock_runtime::LockError::Fenced { token: t, highest, .. } = e else { panic!("{token}: {e}") };
            assert!(t == token && highest > token, "refused only when stale: {t} < {highest}");
            refused += 1;
        }
    }
    let mut conn = connect(&server).await;
    let last: u64 = conn.get("shared").await.expect("get");
    assert_eq!(last, WRITERS, "the highest token's value is the one left");
    assert!(refused < WRITERS);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_redis_fence_store_admits_by_resource() {
    let server = RedisServer::start();
    let fences = RedisFences::new(connect(&server).await);
    fences.admit("orders:42", 7).await.expect("first");
    fences.admit("orders:42", 7).await.expect("the same token again");
    let err = fences.admit("orders:42", 6).await.expect_err("stale");
    assert!(
        matches!(err, lock_runtime::LockError::Fenced { ref name, token: 6, highest: 7 } if name == "orders:42"),
        "{err}"
    );
    fences.admit("orders:43", 1).await.expect("independent");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hash_field_is_written_under_the_keys_fence() {
    let server = RedisServer::start();
    let mut conn = connect(&server).await;
    hset(&mut conn, "order:9", "state", "paid", 7).await.expect("hset");
    hset(&mut conn, "order:9", "by", "worker-a", 7).await.expect("another field, the same token");
    let err = hset(&mut conn, "order:9", "state", "cancelled", 6).await.expect_err("stale");
    assert!(matches!(err, lock_runtime::LockError::Fenced { token: 6, highest: 7, .. }), "{err}");
    let state: String = conn.hget("order:9", "state").await.expect("hget");
    assert_eq!(state, "paid");
    // One record for the whole key: a fenced delete with a newer token, then the stale field write.
    del(&mut conn, "order:9", 8).await.expect("delete");
    assert!(hset(&mut conn, "order:9", "state", "x", 7).await.expect_err("refused").is_fenced());
    // The record takes the hash's TTL.
    hset(&mut conn, "ttl:1", "f", "v", 1).await.expect("hset");
    let _: () = conn.pexpire("ttl:1", 100_000).await.expect("pexpire");
    hset(&mut conn, "ttl:1", "g", "w", 2).await.expect("hset");
    let fence_ttl: i64 = conn.pttl(fence_key("ttl:1")).await.expect("pttl");
    assert!(fence_ttl > 90_000, "{fence_ttl}");
}
