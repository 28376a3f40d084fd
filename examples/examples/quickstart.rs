//! The main example, on the in-memory backend (nothing to install):
//!
//! ```text
//! cargo run -p examples --example quickstart
//! ```
//!
//! Eight workers try to settle the same order at once; the lock lets exactly one settle it at
//! a time, and the fencing token shows the order in which they held it.

use std::sync::Arc;
use std::time::Duration;

use lock_runtime::{LockError, LockManager};
use tokio::sync::Mutex;

#[tokio::main]
async fn main() -> Result<(), LockError> {
    let manager = LockManager::builder().prefix("shop:").default_wait(Duration::from_secs(5)).memory();
    let ledger = Arc::new(Mutex::new(Vec::new()));

    let mut workers = Vec::new();
    for worker in 0..8 {
        let (manager, ledger) = (manager.clone(), ledger.clone());
        workers.push(tokio::spawn(async move {
            let guard = manager.lock("order:42").await?;
            ledger.lock().await.push((guard.fencing_token(), worker));
            tokio::time::sleep(Duration::from_millis(10)).await; // the exclusive work
            guard.release().await
        }));
    }
    for w in workers {
        w.await.expect("worker panicked")?;
    }

    // A second caller that does not want to wait.
    let held = manager.lock("order:42").await?;
    match manager.try_lock("order:42").await? {
        Some(_) => println!("unexpected: got a held lock"),
        None => println!("try_lock: order:42 is busy, as expected"),
    }
    held.release().await?;

    for (token, worker) in ledger.lock().await.iter() {
        println!("worker {worker} held order:42 with fencing token {token}");
    }
    Ok(())
}
