//! Locks inside the caller's transaction (`backend::postgres::lock_in_transaction`) against a
//! real PostgreSQL: the lock excludes a manager's lock of the same key and ends exactly at the
//! commit or the rollback; a wait is the server's and ends with the holder's transaction; a
//! wait that runs out is contended and leaves the transaction usable, with its `lock_timeout`;
//! a dropped wait leaves nothing queued; tokens increase across both kinds of holder; a handler
//! locks, fences and writes in one transaction.

#![cfg(feature = "postgres")]
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

use lock_runtime::backend::postgres::lock_in_transaction;
use lock_runtime::fence::postgres::{check, INSTALL_SQL};
use lock_runtime::LockManager;
use lock_tests::pg_server::PgServer;
use tokio_postgres::Client;

async fn installed() -> (PgServer, Client) {
    let server = PgServer::start();
    let client = server.admin().await;
    client.batch_execute(INSTALL_SQL).await.expect("install");
    (server, client)
}

async fn pid(client: &Client) -> i32 {
    client.query_one("SELECT pg_backend_pid()", &[]).await.expect("pid").get(0)
}

/// How many requests wait on an advisory lock, server-wide.
async fn advisory_waiters(observer: &Client) -> i64 {
    let row = observer.query_one("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted", &[]);
    row.await.expect("pg_locks").get(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_lock_is_the_managers_and_ends_with_the_transaction() {
    let (server, _setup) = installed().await;
    let manager = LockManager::postgres(server.url()).await.expect("manager");
    let mut db = server.admin().await;

    // Held by the transaction: busy for the manager until the commit.
    let tx = db.transaction().await.expect("begin");
    let first = lock_in_transaction(&tx, "orders:1", Duration::ZERO).await.expect("free");
    assert!(manager.try_lock("orders:1").await.expect("try").is_none(), "the manager got a key a transaction holds");
    tx.commit().await.expect("commit");
    let guard = manager.try_lock("orders:1").await.expect("try").expect("free after the commit");
    let second = guard.fencing_token();
    assert!(second > first, "tokens increase across holders: {first} then {second}");

    // Held by the manager: a transaction is contended, and stays usable.
    let tx = db.transaction().await.expect("begin");
    let err = lock_in_transaction(&tx, "orders:1", Duration::from_millis(100)).await.expect_err("held");
    assert!(err.is_contended(), "{err}");
    let err = lock_in_transaction(&tx, "orders:1", Duration::ZERO).await.expect_err("held");
    assert!(err.is_contended(), "{err}");
    let alive: i32 = tx.query_one("SELECT 1", &[]).await.expect("the transaction goes on").get(0);
    assert_eq!(alive, 1);
    guard.release().await.expect("release");
    let third = lock_in_transaction(&tx, "orders:1", Duration::from_millis(100)).await.expect("free");
    assert!(third > second, "{second} then {third}");
    // A rollback ends it as well.
    tx.rollback().await.expect("rollback");
    manager.try_lock("orders:1").await.expect("try").expect("free after the rollback").release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wait_is_granted_at_the_holders_commit_and_keeps_the_callers_lock_timeout() {
    let (server, observer) = installed().await;
    let (mut a, mut b) = (server.admin().await, server.admin().await);
    let b_pid = pid(&b).await;
    let tx_a = a.transaction().await.expect("begin a");
    let tx_b = b.transaction().await.expect("begin b");
    tx_b.batch_execute("SET LOCAL lock_timeout = '42s'").await.expect("the caller's lock_timeout");
    let first = lock_in_transaction(&tx_a, "ledger", Duration::ZERO).await.expect("a holds");
    let (second, ()) = tokio::join!(lock_in_transaction(&tx_b, "ledger", Duration::from_secs(30)), async {
        PgServer::until_blocked(&observer, b_pid).await;
        tx_a.commit().await.expect("a commits");
    });
    let second = second.expect("granted at a's commit");
    assert!(second > first);
    let shown: String = tx_b.query_one("SHOW lock_timeout", &[]).await.expect("show").get(0);
    assert_eq!(shown, "42s", "the caller's lock_timeout after a wait");
    // Ran out: contended, the transaction usable, its lock_timeout as it was.
    let mut c = server.admin().await;
    let tx_c = c.transaction().await.expect("begin c");
    tx_c.batch_execute("SET LOCAL lock_timeout = '7s'").await.expect("lock_timeout");
    let err = lock_in_transaction(&tx_c, "ledger", Duration::from_millis(50)).await.expect_err("b holds");
    assert!(err.is_contended(), "{err}");
    let shown: String = tx_c.query_one("SHOW lock_timeout", &[]).await.expect("usable").get(0);
    assert_eq!(shown, "7s");
    tx_b.commit().await.expect("b commits");
    assert!(lock_in_transaction(&tx_c, "ledger", Duration::from_millis(50)).await.expect("free") > second);
    tx_c.commit().await.expect("c commits");
}

/// A wait dropped in flight asks the server to cancel it: nothing stays queued on the key,
/// and once the caller rolls back, the key's next holder gets it at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_wait_leaves_nothing_queued() {
    let (server, observer) = installed().await;
    let manager = LockManager::postgres(server.url()).await.expect("manager");
    let holder = manager.lock("queue:1").await.expect("held");
    let mut b = server.admin().await;
    let b_pid = pid(&b).await;
    let tx = b.transaction().await.expect("begin");
    tokio::select! {
        out = lock_in_transaction(&tx, "queue:1", Duration::from_secs(3600)) => panic!("granted while held: {out:?}"),
        () = PgServer::until_blocked(&observer, b_pid) => {}
    }
    // Dropped (the select's other branch won): the server is asked to cancel the wait, which
    // leaves at once (without the cancel it would wait its hour: 60 s is the margin here).
    let asked = std::time::Instant::now();
    while advisory_waiters(&observer).await > 0 {
        assert!(asked.elapsed() < Duration::from_secs(60), "the dropped wait is still queued");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let err = tx.query_one("SELECT 1", &[]).await.expect_err("the transaction is aborted by the cancel");
    assert_eq!(err.code().map(|c| c.code()), Some("25P02"), "{err}");
    tx.rollback().await.expect("rollback");
    holder.release().await.expect("release");
    let again = manager.try_lock("queue:1").await.expect("try").expect("free");
    again.release().await.unwrap();
}

/// A handler's transaction: lock, fence, write, commit; once the next holder wrote with its
/// newer token, the first token is refused by the fence.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lock_fence_and_write_in_one_transaction() {
    let (server, setup) = installed().await;
    setup
        .batch_execute("CREATE TABLE orders (id int PRIMARY KEY, state text); INSERT INTO orders VALUES (42, 'new')")
        .await
        .expect("schema");
    let mut db = server.admin().await;
    let tx = db.transaction().await.expect("begin");
    let token = lock_in_transaction(&tx, "orders:42", Duration::from_secs(2)).await.expect("lock");
    check(&tx, "orders:42", token).await.expect("fresh token");
    tx.execute("UPDATE orders SET state = 'paid' WHERE id = 42", &[]).await.expect("write");
    tx.commit().await.expect("commit");

    // The next holder writes with its newer token; the first one's token is stale from then.
    let tx = db.transaction().await.expect("begin");
    let newer = lock_in_transaction(&tx, "orders:42", Duration::from_secs(2)).await.expect("lock");
    assert!(newer > token);
    check(&tx, "orders:42", newer).await.expect("newer token");
    tx.execute("UPDATE orders SET state = 'shipped' WHERE id = 42", &[]).await.expect("write");
    tx.commit().await.expect("commit");
    let tx = db.transaction().await.expect("begin");
    let err = check(&tx, "orders:42", token).await.expect_err("a stale token");
    assert!(err.is_fenced(), "{err}");
    tx.rollback().await.expect("rollback");
    let state: String = setup.query_one("SELECT state FROM orders WHERE id = 42", &[]).await.unwrap().get(0);
    assert_eq!(state, "shipped");
    // Bad input is named.
    let tx = db.transaction().await.expect("begin");
    assert!(lock_in_transaction(&tx, "", Duration::ZERO).await.expect_err("empty").is_invalid());
}
