//! The backends a service on one host can use without a lock server, side by side in one run:
//! memory, lock files, PostgreSQL (feature `postgres`) and MySQL/MariaDB (feature `mysql`). Per backend: hand-off latency
//! (from the holder's `release()` to the waiter, through a manager of its own, holding the
//! lock) and uncontended acquire + release. Prints p50/p99/max.
//!
//! ```text
//! cargo run --release -p examples --example bench_local
//! cargo run --release -p examples --features postgres,mysql --example bench_local
//! LOCK_DIR=/var/lock/bench cargo run --release -p examples --example bench_local
//! ```
//!
//! The lock files go to `LOCK_DIR` (default: a fresh directory under the system's temporary
//! directory, whose file system decides the cost of the token's `fdatasync`). PostgreSQL and
//! MariaDB are servers of their own on free loopback ports (the Debian `postgresql` and
//! `mariadb-server` packages), with their default durability (MariaDB commits each token).

use std::time::Duration;

use examples::bench;
use lock_runtime::{LockError, LockManager};

const ROUNDS: usize = 300;
const WARMUP: usize = 30;

async fn measure(what: &str, holder: &LockManager, waiter: &LockManager) -> Result<(), LockError> {
    let name = format!("bench-{}", std::process::id());
    // Nothing tells that the waiter is queued (in the store, or on the OS): give it 3 ms.
    let mut handoff =
        bench::handoffs(holder, waiter, &name, (ROUNDS, WARMUP), None, |since| since >= Duration::from_millis(3))
            .await?;
    let _ = bench::uncontended(holder, &name, WARMUP).await?;
    let mut uncontended = bench::uncontended(holder, &name, ROUNDS).await?;
    bench::report(&format!("{what}: hand-off (release -> next waiter holds it)"), &mut handoff);
    bench::report(&format!("{what}: uncontended acquire + release"), &mut uncontended);
    Ok(())
}

#[tokio::main]
async fn main() -> Result<(), LockError> {
    let memory = LockManager::memory();
    measure("memory", &memory, &memory).await?;

    let dir = std::env::var("LOCK_DIR").map(std::path::PathBuf::from).unwrap_or_else(|_| {
        std::env::temp_dir().join(format!("lock-bench-{}", lock_runtime::backend::OwnerId::next()))
    });
    let (holder, waiter) = (LockManager::file(&dir)?, LockManager::file(&dir)?);
    measure("file", &holder, &waiter).await?;
    if std::env::var("LOCK_DIR").is_err() {
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[cfg(feature = "postgres")]
    {
        let server = lock_tests::pg_server::PgServer::start();
        let (holder, waiter) = (LockManager::postgres(server.url()).await?, LockManager::postgres(server.url()).await?);
        measure("postgres", &holder, &waiter).await?;
    }

    #[cfg(feature = "mysql")]
    {
        let server = lock_tests::mysql_server::MysqlServer::start();
        let (holder, waiter) = (LockManager::mysql(server.url()).await?, LockManager::mysql(server.url()).await?);
        measure("mysql", &holder, &waiter).await?;
    }
    Ok(())
}
