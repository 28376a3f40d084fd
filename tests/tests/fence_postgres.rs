//! The PostgreSQL fence (`lock_runtime::fence::postgres`) against a real `postgres` server:
//! a holder paused past its lease is refused and its transaction rolls back, the current
//! holder writes again with its token, resources are independent, the install is idempotent,
//! and concurrent writers with interleaved tokens serialise on the fence row (checked).

#![cfg(feature = "postgres")]
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

use lock_runtime::fence::postgres::{check, PostgresFences, INSTALL_SQL, SQLSTATE};
use lock_runtime::fence::FenceStore;
use lock_runtime::LockManager;
use lock_tests::pg_server::PgServer;
use tokio_postgres::{Client, NoTls};

async fn connect(server: &PgServer) -> Client {
    let (client, connection) = tokio_postgres::connect(&server.url(), NoTls).await.expect("connect");
    tokio::spawn(connection);
    client
}

/// A server with the fence installed (twice: the install is idempotent) and an `orders` table.
async fn installed() -> (PgServer, Client) {
    let server = PgServer::start();
    let client = connect(&server).await;
    client.batch_execute(INSTALL_SQL).await.expect("install");
    client.batch_execute(INSTALL_SQL).await.expect("install again");
    client
        .batch_execute(
            "CREATE TABLE orders (id int PRIMARY KEY, state text NOT NULL, token bigint NOT NULL);
             INSERT INTO orders VALUES (42, 'new', 0), (43, 'new', 0);
             CREATE TABLE writes (seq bigserial PRIMARY KEY, id int NOT NULL, token bigint NOT NULL);",
        )
        .await
        .expect("schema");
    (server, client)
}

/// One fenced write: check, update, log, commit. `Err` is the fence's (or the server's) error.
async fn write(client: &mut Client, id: i32, state: &str, token: u64) -> Result<(), lock_runtime::LockError> {
    let tx = client.transaction().await.expect("begin");
    check(&tx, &format!("orders:{id}"), token).await?;
    let signed = i64::try_from(token).expect("a bigint");
    tx.execute("UPDATE orders SET state = $2, token = $3 WHERE id = $1", &[&id, &state, &signed])
        .await
        .expect("update");
    tx.execute("INSERT INTO writes (id, token) VALUES ($1, $2)", &[&id, &signed]).await.expect("log");
    tx.commit().await.expect("commit");
    Ok(())
}

async fn order(client: &Client, id: i32) -> (String, i64) {
    let row = client.query_one("SELECT state, token FROM orders WHERE id = $1", &[&id]).await.expect("read");
    (row.get(0), row.get(1))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_paused_past_its_lease_is_refused_and_rolls_back() {
    let (server, _setup) = installed().await;
    let (mut paused_db, mut current_db) = (connect(&server).await, connect(&server).await);
    let manager = LockManager::memory();

    // The first holder takes the lock with a short fixed lease, then "pauses" past it.
    let paused = manager.lock("orders:42").lease(Duration::from_millis(100)).await.expect("first holder");
    let stale_token = paused.fencing_token();
    paused.lost().await; // the lease ran out while it was paused
    let current = manager.lock("orders:42").lease(Duration::from_secs(30)).await.expect("next holder");
    assert!(current.fencing_token() > stale_token);

    write(&mut current_db, 42, "paid", current.fencing_token()).await.expect("the current holder writes");
    // The paused holder wakes and writes late: refused, naming both tokens, nothing kept.
    let tx = paused_db.transaction().await.expect("begin");
    tx.execute("UPDATE orders SET state = 'cancelled' WHERE id = 42", &[]).await.expect("a write before the check");
    let err = check(&tx, "orders:42", stale_token).await.expect_err("a stale token is refused");
    assert!(err.is_fenced(), "{err}");
    assert!(err.to_string().contains(&format!("token {stale_token} is stale")), "{err}");
    assert!(err.to_string().contains(&current.fencing_token().to_string()), "{err}");
    // The transaction is aborted: its COMMIT rolls it back (PostgreSQL answers ROLLBACK).
    tx.commit().await.expect("the server answers the commit of an aborted transaction");
    assert_eq!(order(&current_db, 42).await, ("paid".to_owned(), current.fencing_token() as i64), "nothing of it");

    // The current holder writes again with the same token; another resource is independent.
    write(&mut current_db, 42, "shipped", current.fencing_token()).await.expect("the same token again");
    write(&mut paused_db, 43, "paid", stale_token).await.expect("orders:43 has its own fence");
    assert_eq!(order(&current_db, 42).await.0, "shipped");
    current.release().await.expect("release");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_refusal_is_a_dedicated_sqlstate_from_any_client() {
    let (_server, client) = installed().await;
    client.query_one("SELECT lock_runtime_fence('r', 10)", &[]).await.expect("recorded");
    let err = client.query_one("SELECT lock_runtime_fence('r', 9)", &[]).await.expect_err("stale");
    let db = err.as_db_error().expect("a server error");
    assert_eq!(db.code().code(), SQLSTATE);
    assert!(db.message().contains("fenced") && db.message().contains("stale"), "{}", db.message());
    assert!(db.message().contains("9") && db.message().contains("10"), "both tokens: {}", db.message());
    let null = client.query_one("SELECT lock_runtime_fence(NULL, 1)", &[]).await.expect_err("NULL refused");
    assert_eq!(null.as_db_error().map(|d| d.code().code()), Some("22004"));
    // A token PostgreSQL cannot hold is a clear invalid-input error, not a wrap-around.
    let err = check(&client, "r", u64::MAX).await.expect_err("too large");
    assert!(err.is_invalid(), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_writers_serialise_and_the_highest_token_wins() {
    let (server, client) = installed().await;
    const WRITERS: u64 = 24;
    // Interleaved tokens: started in an order unrelated to their tokens.
    let mut tasks = Vec::new();
    for i in 0..WRITERS {
        let token = (i * 7) % WRITERS + 1;
        let mut db = connect(&server).await;
        tasks.push(tokio::spawn(async move { (token, write(&mut db, 42, &format!("by {token}"), token).await) }));
    }
    let mut outcomes = Vec::new();
    for task in tasks {
        outcomes.push(task.await.expect("writer"));
    }
    // The checker: the final state is the highest token's write; every refusal was stale
    // against a token that had been recorded; the committed writes, in fence order, never
    // go back in token order.
    assert_eq!(order(&client, 42).await, (format!("by {WRITERS}"), WRITERS as i64));
    let committed: Vec<i64> = client
        .query("SELECT token FROM writes WHERE id = 42 ORDER BY seq", &[])
        .await
        .expect("log")
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert!(committed.windows(2).all(|w| w[0] <= w[1]), "committed in token order: {committed:?}");
    for (token, outcome) in &outcomes {
        match outcome {
            Ok(()) => assert!(committed.contains(&(*token as i64)), "{token} committed"),
            Err(e) => match e {
                lock_runtime::LockError::Fenced { token: t, highest, .. } => {
                    assert_eq!(t, token);
                    assert!(highest > token, "refused only when stale: {e}");
                    assert!(committed.contains(&(*highest as i64)), "against a recorded write: {e}");
                }
                other => panic!("writer {token} failed otherwise: {other}"),
            },
        }
    }
    assert!(outcomes.iter().any(|(_, o)| o.is_ok()));
}

/// Two holders' transactions, both begun (their snapshots taken) before either writes, race
/// on the fence: the first checks and holds the fence row, the second checks (and waits on
/// the row), the first writes and commits. At READ COMMITTED the second goes on at once; at
/// REPEATABLE READ and SERIALIZABLE it cannot (the row changed after its snapshot): it gets
/// a conflict that says so (SQLSTATE 40001), and its retry, in a new transaction, is admitted
/// if its token is the newer (or equal) and fenced if it is stale. Each order at each level:
/// the newer holder's write always ends committed, the fence always ends at the highest token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_every_isolation_level_the_newer_holder_wins() {
    use tokio_postgres::IsolationLevel::{ReadCommitted, RepeatableRead, Serializable};
    let (server, observer) = installed().await;
    let mut id = 100;
    for level in [ReadCommitted, RepeatableRead, Serializable] {
        for (first, second) in [(5u64, 10u64), (10, 5), (7, 7)] {
            id += 1;
            let case = format!("{level:?}, {first} then {second}");
            let resource = format!("orders:{id}");
            observer.execute("INSERT INTO orders VALUES ($1, 'new', 0)", &[&id]).await.expect("row");
            check(&observer, &resource, 1).await.expect("an earlier write's token");
            let (mut a, mut b) = (connect(&server).await, connect(&server).await);
            let b_pid: i32 = b.query_one("SELECT pg_backend_pid()", &[]).await.expect("pid").get(0);
            let tx_a = a.build_transaction().isolation_level(level).start().await.expect("begin a");
            let tx_b = b.build_transaction().isolation_level(level).start().await.expect("begin b");
            tx_a.query_one("SELECT count(*) FROM orders", &[]).await.expect("a's snapshot");
            tx_b.query_one("SELECT count(*) FROM orders", &[]).await.expect("b's snapshot");
            check(&tx_a, &resource, first).await.unwrap_or_else(|e| panic!("{case}: first: {e}"));
            let update = "UPDATE orders SET state = $2, token = $3 WHERE id = $1";
            let (second_checked, ()) = tokio::join!(check(&tx_b, &resource, second), async {
                PgServer::until_blocked(&observer, b_pid).await;
                tx_a.execute(update, &[&id, &"by first", &(first as i64)]).await.expect("a writes");
                tx_a.commit().await.expect("a commits");
            });
            let read_committed = matches!(level, ReadCommitted);
            let second_checked = match second_checked {
                Err(e) if e.is_conflict() && !read_committed => {
                    assert!(e.to_string().contains("40001") && e.to_string().contains("retry"), "{case}: {e}");
                    tx_b.rollback().await.expect("roll back");
                    let tx_b = b.build_transaction().isolation_level(level).start().await.expect("begin again");
                    let again = check(&tx_b, &resource, second).await;
                    if again.is_ok() {
                        tx_b.execute(update, &[&id, &"by second", &(second as i64)]).await.expect("b writes");
                        tx_b.commit().await.expect("b commits");
                    }
                    again
                }
                outcome if read_committed => {
                    if outcome.is_ok() {
                        tx_b.execute(update, &[&id, &"by second", &(second as i64)]).await.expect("b writes");
                        tx_b.commit().await.expect("b commits");
                    }
                    outcome
                }
                other => panic!("{case}: the second check, against a changed row, gave {other:?}"),
            };
            match second_checked {
                Ok(()) => assert!(second >= first, "{case}: a stale token admitted"),
                Err(e) => assert!(e.is_fenced() && second < first, "{case}: {e}"),
            }
            let (state, token) = order(&observer, id).await;
            let newest = first.max(second) as i64;
            assert_eq!(token, newest, "{case}: the newest holder's write ({state})");
            let fence: i64 = observer
                .query_one("SELECT token FROM lock_runtime_fences WHERE resource = $1", &[&resource])
                .await
                .expect("fence")
                .get(0);
            assert_eq!(fence, newest, "{case}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_postgres_fence_store_admits_by_resource() {
    let (server, _setup) = installed().await;
    let fences = PostgresFences::new(connect(&server).await);
    fences.admit("orders:42", 7).await.expect("first");
    fences.admit("orders:42", 7).await.expect("the same token again");
    let err = fences.admit("orders:42", 6).await.expect_err("stale");
    assert!(matches!(err, lock_runtime::LockError::Fenced { token: 6, highest: 7, .. }), "{err}");
    fences.admit("orders:43", 1).await.expect("independent");
}

/// A fence on a server where `INSTALL_SQL` was never run: an `is_backend` error that gives the
/// server's SQLSTATE and message (the client's own text was only "db error").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fence_never_installed_names_the_servers_error() {
    let server = PgServer::start();
    let client = connect(&server).await;
    let err = check(&client, "orders:42", 7).await.expect_err("no fence function");
    let text = err.to_string();
    assert!(err.is_backend(), "{text}");
    assert!(text.contains("42883") && text.contains("lock_runtime_fence"), "{text}");
    assert!(!text.contains("db error"), "{text}");
}

/// Regression (issue 57): two replicas running `INSTALL_SQL` at startup at once failed (`CREATE
/// … IF NOT EXISTS` is not safe against a concurrent create: `duplicate key value violates
/// unique constraint "pg_class_relname_nsp_index"`). Eight sessions install on a fresh database
/// at once, ten rounds (each on a database of its own): every install succeeds, and the fence
/// works after.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn installs_from_many_sessions_at_once_all_succeed() {
    let server = PgServer::start();
    let admin = server.admin().await;
    for round in 0..10 {
        let db = format!("install_{round}");
        admin.batch_execute(&format!("CREATE DATABASE {db}")).await.expect("a fresh database");
        let url = format!("postgres://postgres@127.0.0.1:{}/{db}", server.port());
        let mut sessions = Vec::new();
        for _ in 0..8 {
            let (client, connection) = tokio_postgres::connect(&url, NoTls).await.expect("connect");
            tokio::spawn(connection);
            sessions.push(client);
        }
        let start = std::sync::Arc::new(tokio::sync::Barrier::new(sessions.len()));
        let installs: Vec<_> = sessions
            .into_iter()
            .map(|client| {
                let start = start.clone();
                tokio::spawn(async move {
                    start.wait().await;
                    client.batch_execute(INSTALL_SQL).await.map(|()| client)
                })
            })
            .collect();
        let mut clients = Vec::new();
        for install in installs {
            clients.push(install.await.unwrap().unwrap_or_else(|e| panic!("round {round}: an install failed: {e:?}")));
        }
        let tx = clients[0].transaction().await.expect("begin");
        check(&tx, "orders:1", 5).await.expect("the fence works");
        tx.commit().await.expect("commit");
    }
}
