//! Locks and fences in an application's own sqlx transactions (feature `sqlx`), against a real
//! PostgreSQL and a real transaction-mode PgBouncer: an axum handler that locks, checks the
//! fence and writes in one transaction; a manager's lock of the same key excludes it; two
//! transactions through the pooler exclude each other; a serialization failure is a conflict.

#![cfg(feature = "sqlx")]
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::net::SocketAddr;
use std::time::Duration;

use axum::extract::{Path, State};
use axum::routing::post;
use axum::Router;
use lock_runtime::backend::postgres::{lock_in_transaction, PostgresBackend};
use lock_runtime::fence::postgres::{check, INSTALL_SQL};
use lock_runtime::{LockError, LockManager};
use lock_tests::pg_server::{PgBouncer, PgServer};
use sqlx::postgres::{PgPool, PgPoolOptions};

// The whole conformance suite on the application's pool (`PostgresBackend::from_pool`).
lock_tests::conformance_suite!(
    {
        let server = std::sync::Arc::new(PgServer::start());
        move |builder: lock_runtime::LockManagerBuilder| {
            let server = server.clone();
            async move {
                let pool = pool(&server.url(), 40).await;
                builder.backend(PostgresBackend::from_pool(pool).await.expect("from the pool"))
            }
        }
    },
    kinds = [lock_runtime::backend::LockKind::Read, lock_runtime::backend::LockKind::Write],
    inspect = true
);

async fn pool(url: &str, connections: u32) -> PgPool {
    PgPoolOptions::new().max_connections(connections).connect(url).await.expect("the application's pool")
}

/// A server with the fence installed and an `orders` table.
async fn installed() -> (PgServer, PgPool) {
    let server = PgServer::start();
    let pool = pool(&server.url(), 4).await;
    sqlx::raw_sql(INSTALL_SQL).execute(&pool).await.expect("install");
    sqlx::raw_sql(
        "CREATE TABLE orders (id int PRIMARY KEY, state text NOT NULL, token bigint NOT NULL);
         INSERT INTO orders VALUES (42, 'new', 0);",
    )
    .execute(&pool)
    .await
    .expect("schema");
    (server, pool)
}

/// The handler: one transaction of the application's pool locks the order, checks the fence
/// with the lock's token, writes, commits (which ends the lock). A busy order answers 423.
async fn pay(State(pool): State<PgPool>, Path(id): Path<i32>) -> Result<String, LockError> {
    let mut tx = pool.begin().await.map_err(|e| LockError::backend("orders", "postgres", "begin", e))?;
    let name = format!("orders:{id}");
    let token = lock_in_transaction(&mut *tx, &name, Duration::from_millis(300)).await?;
    check(&mut *tx, &name, token).await?;
    sqlx::query("UPDATE orders SET state = 'paid', token = $2 WHERE id = $1")
        .bind(id)
        .bind(token as i64)
        .execute(&mut *tx)
        .await
        .map_err(|e| LockError::backend(&name, "postgres", "write", e))?;
    tx.commit().await.map_err(|e| LockError::backend(&name, "postgres", "commit", e))?;
    Ok(token.to_string())
}

async fn serve(pool: PgPool) -> SocketAddr {
    let app = Router::new().route("/orders/{id}/pay", post(pay)).with_state(pool);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move { axum::serve(listener, app).await });
    addr
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_axum_handler_locks_fences_and_writes_in_one_transaction() {
    let (server, pool) = installed().await;
    let addr = serve(pool.clone()).await;
    let first = lock_tests::http::request(addr, "POST", "/orders/42/pay", None).await;
    assert_eq!(first.status, 200, "{}", first.body);
    let token: u64 = first.body.parse().expect("a token");
    let (state, written): (String, i64) =
        sqlx::query_as("SELECT state, token FROM orders WHERE id = 42").fetch_one(&pool).await.unwrap();
    assert_eq!((state.as_str(), written), ("paid", token as i64));

    // A manager's guard on the same key: the handler's lock is busy, 423 Locked.
    let manager = LockManager::postgres(server.url()).await.expect("manager");
    let guard = manager.lock("orders:42").await.expect("lock");
    let busy = lock_tests::http::request(addr, "POST", "/orders/42/pay", None).await;
    assert_eq!(busy.status, 423, "{}", busy.body);
    // The guard's token is newer than the handler's: written with it, the handler's is stale.
    let mut conn = pool.acquire().await.expect("conn");
    check(&mut *conn, "orders:42", guard.fencing_token()).await.expect("the guard's token");
    let err = check(&mut *conn, "orders:42", token).await.expect_err("stale");
    assert!(err.is_fenced(), "{err}");
    let guards = guard.fencing_token();
    guard.release().await.expect("release");
    let again = lock_tests::http::request(addr, "POST", "/orders/42/pay", None).await;
    assert_eq!(again.status, 200, "{}", again.body);
    assert!(again.body.parse::<u64>().expect("a token") > guards);
}

/// Through a transaction-mode PgBouncer (one server connection per transaction, none kept):
/// two sqlx transactions exclude each other; the waiter is granted at the holder's commit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn through_pgbouncer_two_transactions_exclude_each_other() {
    let (server, _pool) = installed().await;
    let bouncer = PgBouncer::start(&server, 4);
    let pool = pool(&bouncer.url(), 4).await;
    let mut a = pool.begin().await.expect("begin a");
    let first = lock_in_transaction(&mut *a, "ledger", Duration::ZERO).await.expect("a holds");
    let mut b = pool.begin().await.expect("begin b");
    let busy = lock_in_transaction(&mut *b, "ledger", Duration::from_millis(100)).await.expect_err("held");
    assert!(busy.is_contended(), "{busy}");
    // The server session b's transaction runs on (pinned by the pooler until it ends).
    let b_pid: i32 = sqlx::query_scalar("SELECT pg_backend_pid()").fetch_one(&mut *b).await.expect("pid");
    let admin = server.admin().await;
    let (second, ()) = tokio::join!(lock_in_transaction(&mut *b, "ledger", Duration::from_secs(30)), async {
        PgServer::until_blocked(&admin, b_pid).await;
        a.commit().await.expect("a commits");
    });
    let second = second.expect("granted at a's commit");
    assert!(second > first);
    check(&mut *b, "ledger", second).await.expect("fence through the pooler");
    b.commit().await.expect("b commits");
}

/// Under REPEATABLE READ, a fence row another holder wrote after the snapshot is a conflict
/// (40001) that says to retry, and the retry of the newer token is admitted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_serialization_failure_is_a_conflict_to_retry() {
    let (_server, pool) = installed().await;
    let mut conn = pool.acquire().await.expect("conn");
    check(&mut *conn, "orders:7", 1).await.expect("an earlier write");
    drop(conn);
    let mut older = pool.begin().await.expect("begin");
    let mut newer = pool.begin().await.expect("begin");
    for tx in [&mut older, &mut newer] {
        sqlx::raw_sql("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ; SELECT count(*) FROM orders")
            .execute(&mut **tx)
            .await
            .expect("snapshot");
    }
    check(&mut *older, "orders:7", 5).await.expect("the older holder first");
    older.commit().await.expect("commit");
    let err = check(&mut *newer, "orders:7", 10).await.expect_err("the row changed after the snapshot");
    assert!(err.is_conflict() && err.to_string().contains("40001"), "{err}");
    newer.rollback().await.expect("rollback");
    let mut retry = pool.begin().await.expect("begin again");
    check(&mut *retry, "orders:7", 10).await.expect("the newer token on retry");
    retry.commit().await.expect("commit");
}

/// `PostgresBackend::from_pool`: a held lock keeps one of the pool's connections and gives it
/// back at the release; the server ending the holder's session is found by the heartbeat
/// (`lost()`), and the connection is not given back; a dropped waiter leaves nothing queued.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_applications_pool_carries_the_managers_locks() {
    let server = PgServer::start();
    let app = pool(&server.url(), 3).await;
    let manager = LockManager::builder().backend(PostgresBackend::from_pool(app.clone()).await.expect("from the pool"));
    let other = LockManager::postgres(server.url()).await.expect("own connections");
    let held = manager.lock("app:1").await.expect("lock");
    assert!(other.try_lock("app:1").await.expect("try").is_none(), "the pool's lock excludes");
    assert_eq!(app.size() as usize - app.num_idle(), 1, "one of the pool's connections holds it");
    held.release().await.expect("release");
    lock_tests::until_given_back(&app).await;
    other.try_lock("app:1").await.expect("try").expect("free").release().await.unwrap();

    // The server ends the holder's session: lost() by the heartbeat (every second; 30 s is the
    // margin), the lock free for others.
    let held = manager.lock("app:2").await.expect("lock");
    let admin = server.admin().await;
    let sql = "SELECT pg_terminate_backend(pid) FROM pg_locks WHERE locktype = 'advisory' AND granted";
    admin.execute(sql, &[]).await.expect("terminate");
    tokio::time::timeout(Duration::from_secs(30), held.lost()).await.expect("lost() fires");
    other.lock("app:2").wait(Duration::from_secs(10)).await.expect("free").release().await.unwrap();

    // A dropped waiter's connection is closed: the server ends its wait.
    let holder = other.lock("app:3").await.expect("held elsewhere");
    {
        let waiting = manager.lock("app:3").wait(Duration::from_secs(600));
        let queued = async {
            loop {
                let row = admin.query_one("SELECT count(*) FROM pg_locks WHERE NOT granted", &[]).await.unwrap();
                if row.get::<_, i64>(0) > 0 {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        };
        tokio::select! {
            out = waiting => panic!("granted while held: {:?}", out.map(|g| g.fencing_token())),
            () = queued => {}
        }
    }
    let dropped = std::time::Instant::now();
    loop {
        let row = admin.query_one("SELECT count(*) FROM pg_locks WHERE NOT granted", &[]).await.unwrap();
        if row.get::<_, i64>(0) == 0 {
            break;
        }
        assert!(dropped.elapsed() < Duration::from_secs(30), "the dropped waiter is still queued");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    holder.release().await.expect("release");
    // The application's pool still serves its own work.
    let one: i32 = sqlx::query_scalar("SELECT 1").fetch_one(&app).await.expect("the pool works");
    assert_eq!(one, 1);
}

/// Regression (issue 57): a lock held through `from_pool` vanished from inspection (and from
/// `lockctl list`, `show`, `watch`) at the first heartbeat, whose `SELECT 1` replaced the grant's
/// query, and its comment, in `pg_stat_activity`. Looked at from another process's backend
/// (as `lockctl` does) once the holder's session has run a heartbeat (its last query ends in
/// `SELECT 1`; heartbeats come every second, 30 s is the margin): still held, by its owner.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_held_through_the_pool_stays_visible_to_inspection_past_its_heartbeats() {
    use lock_runtime::backend::Inspect;
    let server = PgServer::start();
    let app = pool(&server.url(), 3).await;
    let manager = LockManager::builder().backend(PostgresBackend::from_pool(app.clone()).await.expect("from the pool"));
    let held = manager.lock("visible:1").await.expect("lock");
    let admin = server.admin().await;
    let beat = "SELECT a.query FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid \
                WHERE l.locktype = 'advisory' AND l.granted";
    let started = std::time::Instant::now();
    loop {
        let rows = admin.query(beat, &[]).await.expect("the holder's last query");
        if rows.iter().any(|r| r.get::<_, String>(0).trim_end().ends_with("SELECT 1")) {
            break;
        }
        assert!(started.elapsed() < Duration::from_secs(30), "no heartbeat within 30 s");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let looker = PostgresBackend::connect(&server.url()).await.expect("another process's backend");
    let info = looker.inspect("visible:1").await.expect("inspect").expect("still held after a heartbeat");
    assert_eq!(info.fencing_token, Some(held.fencing_token()), "{info:?}");
    assert!(info.holder.is_some() && !info.owner.is_empty(), "the holder is named: {info:?}");
    let listed = looker.list("visible:").await.expect("list");
    assert_eq!(listed.len(), 1, "{listed:?}");
    held.release().await.expect("release");
}

/// Regression (issue 57): `lock_in_transaction(&mut *tx, "order:42", ..)` took the name without
/// the manager's prefix, so it was granted while a manager with `prefix("shop:")` held
/// `order:42`. Through the manager (`manager.lock(name).in_transaction(&mut *tx)`) the
/// transaction's lock has the prefix: it waits out the manager's holder, is granted once it
/// goes (a token above the holder's), excludes the manager's locks until the commit, and a
/// kind other than a mutex is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_in_the_callers_transaction_has_the_managers_prefix() {
    let (server, app) = installed().await;
    let backend = PostgresBackend::connect(&server.url()).await.expect("connect");
    let manager = LockManager::builder().prefix("shop:").backend(backend);
    let held = manager.lock("order:42").await.expect("the attribute's lock");
    let mut tx = app.begin().await.expect("begin");
    let busy = manager.lock("order:42").wait(Duration::ZERO).in_transaction(&mut *tx).await;
    assert!(busy.as_ref().is_err_and(LockError::is_contended), "granted beside the manager's holder: {busy:?}");
    let raw = lock_in_transaction(&mut *tx, "order:42", Duration::ZERO).await.expect("no prefix, another lock");
    assert!(raw > 0);
    let first = held.fencing_token();
    let pid: i32 = sqlx::query_scalar("SELECT pg_backend_pid()").fetch_one(&mut *tx).await.expect("pid");
    let waiting = {
        let manager = manager.clone();
        tokio::spawn(async move {
            let mut tx = tx;
            let token = manager.lock("order:42").wait(Duration::from_secs(30)).in_transaction(&mut *tx).await;
            (tx, token)
        })
    };
    PgServer::until_blocked(&server.admin().await, pid).await;
    held.release().await.expect("release");
    let (tx, token) = waiting.await.unwrap();
    let token = token.expect("granted once the holder went");
    assert!(token > first, "{token} after {first}");
    assert!(manager.try_lock("order:42").await.expect("try").is_none(), "the transaction's lock excludes");
    tx.commit().await.expect("commit");
    manager.try_lock("order:42").await.expect("try").expect("free after the commit").release().await.unwrap();
    let mut tx = app.begin().await.expect("begin");
    let read = manager.read_lock("order:42").in_transaction(&mut *tx).await;
    assert!(read.as_ref().is_err_and(LockError::is_invalid), "{read:?}");
    // Refused after the manager's shutdown, as its other acquisitions are (it was granted).
    manager.shutdown().await;
    let late = manager.lock("order:43").in_transaction(&mut *tx).await;
    assert!(late.as_ref().is_err_and(LockError::is_shut_down), "{late:?}");
}

/// Regression (issue 57): a manager on an application's pool with no connection free failed
/// with "check that the server is reachable" after its whole bound. Now, before the bound, it
/// says that the pool had none free (and how many it has), and what to do; once the
/// application gives a connection back, the next lock succeeds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_exhausted_pool_is_reported_as_exactly_that() {
    let server = PgServer::start();
    let app = PgPoolOptions::new()
        .max_connections(2)
        .acquire_timeout(Duration::from_secs(30))
        .connect(&server.url())
        .await
        .expect("the application's pool");
    let options = lock_runtime::backend::postgres::PostgresOptions::new().operation_timeout(Duration::from_secs(1));
    let manager = LockManager::builder()
        .backend(PostgresBackend::from_pool_with(app.clone(), options).await.expect("from the pool"));
    let (first, second) = (app.acquire().await.expect("one"), app.acquire().await.expect("two"));
    let e = manager.lock("exhausted:1").await.expect_err("no connection free");
    let text = e.to_string();
    assert!(e.is_backend(), "{text}");
    assert!(text.contains("no free connection") && text.contains("all 2"), "{text}");
    assert!(text.contains("max_connections") && !text.contains("reachable"), "{text}");
    drop((first, second));
    manager.lock("exhausted:1").await.expect("a connection is free again").release().await.unwrap();
}

/// Regression (issue 57): every waiter through `from_pool` kept one of the application's
/// connections for its whole wait, so waiters drained the pool (40 waiting requests against a
/// pool of 10: the handlers' own queries found none free). Now waits on the server take at most
/// half the pool (here 3 of 6); the others queue in the process without a connection. With one
/// holder and six waiters on one name: three wait on the server, never more, the application
/// still gets two connections of its own, and once the holder goes every waiter is granted in
/// turn.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_take_at_most_half_of_the_applications_pool() {
    let server = PgServer::start();
    let app = PgPoolOptions::new()
        .max_connections(6)
        .acquire_timeout(Duration::from_secs(30))
        .connect(&server.url())
        .await
        .expect("the application's pool");
    let manager = LockManager::builder().backend(PostgresBackend::from_pool(app.clone()).await.expect("from the pool"));
    let held = manager.lock("share:1").await.expect("the holder");
    let waiters: Vec<_> = (0..6)
        .map(|_| {
            let manager = manager.clone();
            tokio::spawn(async move {
                let guard = manager.lock("share:1").wait(Duration::from_secs(120)).await?;
                guard.release().await
            })
        })
        .collect();
    let admin = server.admin().await;
    let on_server = || async {
        let row = admin.query_one("SELECT count(*) FROM pg_locks WHERE NOT granted", &[]).await.unwrap();
        row.get::<_, i64>(0)
    };
    let started = std::time::Instant::now();
    while on_server().await < 3 {
        assert!(started.elapsed() < Duration::from_secs(60), "three waits on the server within 60 s");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // Every waiter has had its attempt (each a round trip of its own) when the application asks:
    // with the waits bounded, two of its six connections are free for it.
    let mine = tokio::time::timeout(Duration::from_secs(10), async {
        (app.acquire().await.expect("one"), app.acquire().await.expect("two"))
    })
    .await
    .expect("the application still gets two connections of its own while six wait");
    assert_eq!(on_server().await, 3, "at most half the pool waits on the server");
    drop(mine);
    held.release().await.expect("release");
    for waiter in waiters {
        waiter.await.unwrap().expect("each waiter granted in turn");
    }
}

/// Issue 57: the fence ships as a migration. The crate's `migrations/` folder, copied beside an
/// application's own migration into the folder its sqlx `Migrator` reads, runs from four
/// replicas starting at once (each its own pool): every run succeeds, the fence works after,
/// and a replica that also runs `INSTALL_SQL` at startup (the same text) changes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_fence_installs_as_a_sqlx_migration_from_replicas_at_once() {
    let server = PgServer::start();
    let dir = lock_tests::server_process::ServerProcess::temp_dir("migrations");
    let shipped = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../lock-runtime/migrations");
    for entry in std::fs::read_dir(&shipped).expect("the crate's migrations") {
        let path = entry.expect("entry").path();
        std::fs::copy(&path, dir.join(path.file_name().unwrap())).expect("copy");
    }
    std::fs::write(
        dir.join("20260601000000_orders.sql"),
        "CREATE TABLE orders (id int PRIMARY KEY, state text NOT NULL, token bigint NOT NULL);",
    )
    .expect("the application's own migration");
    let migrator = std::sync::Arc::new(sqlx::migrate::Migrator::new(dir.clone()).await.expect("the migrations"));
    assert_eq!(migrator.iter().count(), 2);
    let start = std::sync::Arc::new(tokio::sync::Barrier::new(4));
    let replicas: Vec<_> = (0..4)
        .map(|_| {
            let (migrator, start, url) = (migrator.clone(), start.clone(), server.url());
            tokio::spawn(async move {
                let replica = pool(&url, 2).await;
                start.wait().await;
                migrator.run(&replica).await.map(|()| replica)
            })
        })
        .collect();
    let mut pools = Vec::new();
    for replica in replicas {
        pools.push(replica.await.unwrap().expect("every replica's migration run succeeds"));
    }
    sqlx::raw_sql(INSTALL_SQL).execute(&pools[0]).await.expect("INSTALL_SQL after the migration");
    let mut tx = pools[1].begin().await.expect("begin");
    check(&mut *tx, "orders:7", 3).await.expect("the fence works");
    tx.commit().await.expect("commit");
    let mut tx = pools[2].begin().await.expect("begin");
    let stale = check(&mut *tx, "orders:7", 2).await;
    assert!(stale.as_ref().is_err_and(LockError::is_fenced), "{stale:?}");
    std::fs::remove_dir_all(&dir).expect("the folder removed");
}
