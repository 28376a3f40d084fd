//! The Redis backend as a user with the minimal ACL of the README (the library's keys and
//! channels only, and the commands it runs): the whole conformance suite, and a command the
//! ACL forbids named in the error.

#![cfg(feature = "redis")]
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;

use lock_runtime::LockManagerBuilder;
use lock_tests::redis_server::{RedisServer, LOCK_USER_ACL};

/// Gives `server` the user `user` with `acl`.
fn set_user(server: &RedisServer, user: &str, acl: &[&str]) {
    let mut conn = redis::Client::open(server.url()).unwrap().get_connection().expect("admin connection");
    redis::cmd("ACL").arg("SETUSER").arg(user).arg(acl).query::<()>(&mut conn).expect("ACL SETUSER");
}

lock_tests::conformance_suite!(
    {
        let server = Arc::new(RedisServer::start());
        // The README's least ACL, plus `+scan`, which it names for listing (`lockctl list`,
        // `LockManager::list`: the kinds' listing case lists).
        set_user(&server, "locker", &[LOCK_USER_ACL, &["+scan"]].concat());
        move |builder: LockManagerBuilder| {
            let url = format!("redis://locker:lock-secret@127.0.0.1:{}", server.port());
            let _keep = server.clone();
            async move { builder.redis(url).await.expect("connect as the lock user") }
        }
    },
    kinds = [
        lock_runtime::backend::LockKind::Read,
        lock_runtime::backend::LockKind::Write,
        lock_runtime::backend::LockKind::Semaphore { permits: 1 }
    ],
    inspect = true
);

/// A user whose ACL lacks the script commands: the lock attempt fails naming the command, with
/// a hint at the ACL (not at the server's health).
#[tokio::test]
async fn a_command_the_acl_forbids_is_named() {
    let server = RedisServer::start();
    let mut acl: Vec<&str> = LOCK_USER_ACL.to_vec();
    acl.extend(["-evalsha", "-eval"]);
    set_user(&server, "limited", &acl);
    let url = format!("redis://limited:lock-secret@127.0.0.1:{}", server.port());
    let m = lock_runtime::LockManager::redis(url).await.expect("connect (PING is allowed)");
    let e = m.lock("forbidden").await.expect_err("no script may run");
    assert!(e.is_backend(), "{e}");
    let shown = e.to_string();
    assert!(shown.contains("evalsha") && shown.contains("ACL"), "{shown}");
    assert!(!shown.contains("reachable"), "{shown}");
}

/// The queue of waiting processes in Redis (`lock:{<key>}:queue`, see the Redis backend's
/// docs) works as the least ACL's user: a waiter of another backend queues there, and the
/// release grants it the lock from the queue.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_least_acl_queues_waiting_processes() {
    use std::time::Duration;

    use lock_runtime::backend::redis::KeyLayout;
    use lock_runtime::LockManager;

    let server = RedisServer::start();
    set_user(&server, "locker", LOCK_USER_ACL);
    let url = format!("redis://locker:lock-secret@127.0.0.1:{}", server.port());
    let holder = LockManager::redis(url.clone()).await.expect("connect as the lock user");
    let waiter = LockManager::redis(url).await.expect("connect as the lock user");
    let lease = Duration::from_secs(30);
    let held = holder.lock("acl-queue").lease(lease).await.expect("lock");
    let task = tokio::spawn(async move {
        waiter.lock("acl-queue").wait(Duration::from_secs(20)).lease(lease).await.map(|g| g.fencing_token())
    });
    let client = redis::Client::open(server.url()).expect("url");
    let mut admin = client.get_multiplexed_async_connection().await.expect("admin connection");
    let queue = KeyLayout::of("acl-queue").queue();
    lock_tests::eventually("the waiter queued", Duration::from_secs(10), async || {
        let n: u64 = redis::cmd("HLEN").arg(&queue).query_async(&mut admin).await.expect("HLEN");
        lock_tests::reached(n, 1)
    })
    .await;
    let first = held.fencing_token();
    held.release().await.expect("release");
    let token = task.await.expect("task").expect("granted from the queue");
    assert!(token > first, "{token} after {first}");
}
