//! `MysqlBackend::from_pool`: locks on the connections of an application's sqlx pool, against a
//! real MariaDB: the conformance suite; a held lock keeps one of the pool's connections and
//! gives it back at the release; a killed holder connection is found by the heartbeat; a
//! dropped waiter's `GET_LOCK` is ended on the server.

#![cfg(all(feature = "sqlx", feature = "mysql"))]
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use lock_runtime::backend::mysql::MysqlBackend;
use lock_runtime::{LockManager, LockManagerBuilder};
use lock_tests::mysql_server::MysqlServer;
use sqlx::mysql::{MySqlPool, MySqlPoolOptions};

async fn pool(url: &str, connections: u32) -> MySqlPool {
    MySqlPoolOptions::new().max_connections(connections).connect(url).await.expect("the application's pool")
}

lock_tests::conformance_suite!(
    {
        let server = Arc::new(MysqlServer::start());
        move |builder: LockManagerBuilder| {
            let server = server.clone();
            async move {
                let pool = pool(&server.url(), 40).await;
                builder.backend(MysqlBackend::from_pool(pool).await.expect("from the pool"))
            }
        }
    },
    kinds = [],
    inspect = true
);

/// A count the observer `app` reads.
async fn count(app: &MySqlPool, sql: &str) -> i64 {
    sqlx::query_scalar::<_, i64>(sqlx::AssertSqlSafe(sql)).fetch_one(app).await.expect("count")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_applications_pool_carries_the_managers_locks() {
    let server = MysqlServer::start();
    let app = pool(&server.url(), 3).await;
    let observer = pool(&server.url(), 1).await;
    let manager = LockManager::builder().backend(MysqlBackend::from_pool(app.clone()).await.expect("from the pool"));
    let other = LockManager::mysql(server.url()).await.expect("own connections");
    let held = manager.lock("app:1").await.expect("lock");
    assert!(other.try_lock("app:1").await.expect("try").is_none(), "the pool's lock excludes");
    assert_eq!(app.size() as usize - app.num_idle(), 1, "one of the pool's connections holds it");
    held.release().await.expect("release");
    lock_tests::until_given_back(&app).await;
    other.try_lock("app:1").await.expect("try").expect("free").release().await.unwrap();

    // The holder's connection killed: lost() by the heartbeat (1 s; 30 s is the margin).
    let held = manager.lock("app:2").await.expect("lock");
    let id = count(&observer, "SELECT CAST(IS_USED_LOCK('app:2') AS SIGNED)").await;
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!("KILL {id}"))).execute(&observer).await.expect("kill");
    tokio::time::timeout(Duration::from_secs(30), held.lost()).await.expect("lost() fires");
    other.lock("app:2").wait(Duration::from_secs(10)).await.expect("free").release().await.unwrap();

    // A dropped waiter's GET_LOCK is ended on the server (KILL QUERY from another connection).
    let holder = other.lock("app:3").await.expect("held elsewhere");
    let running = "SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE INFO LIKE 'SELECT GET_LOCK(%'";
    {
        let waiting = manager.lock("app:3").wait(Duration::from_secs(600));
        let queued = async {
            while count(&observer, running).await == 0 {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        };
        tokio::select! {
            out = waiting => panic!("granted while held: {:?}", out.map(|g| g.fencing_token())),
            () = queued => {}
        }
    }
    let dropped = Instant::now();
    while count(&observer, running).await > 0 {
        assert!(dropped.elapsed() < Duration::from_secs(30), "the dropped waiter's GET_LOCK still runs");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    holder.release().await.expect("release");
    assert_eq!(count(&app, "SELECT CAST(1 AS SIGNED)").await, 1, "the application's pool still serves");
}

/// A forced release that names its owner frees a lock held on a connection of the
/// application's pool through its holder's heartbeat: the holder is told `lost()`, the name is
/// free, and a lock of the same pool beside it stays held (issue 56).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forced_release_asks_the_holder_on_the_applications_pool() {
    use lock_runtime::backend::{ForceRelease, Inspect};
    let server = MysqlServer::start();
    let app = pool(&server.url(), 4).await;
    let backend = MysqlBackend::from_pool(app.clone()).await.expect("from the pool");
    let manager = LockManager::builder().backend(backend.clone());
    let (victim, neighbour) = (manager.lock("victim").await.unwrap(), manager.lock("neighbour").await.unwrap());
    let owner = backend.inspect("victim").await.unwrap().expect("held").owner;
    assert_eq!(backend.force_release("victim", Some(&owner)).await.unwrap(), ForceRelease::Released(owner));
    tokio::time::timeout(std::time::Duration::from_secs(10), victim.lost()).await.expect("the holder is told");
    let other = LockManager::mysql(server.url()).await.expect("other");
    other.try_lock("victim").await.unwrap().expect("freed").release().await.unwrap();
    assert!(other.try_lock("neighbour").await.unwrap().is_none(), "its neighbour is still held");
    assert!(!neighbour.is_lost());
    neighbour.release().await.unwrap();
}
