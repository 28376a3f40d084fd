//! The main example, on the in-memory backend (nothing to install):
//!
//! ```text
//! cargo run -p examples --example quickstart
//! ```
//!
//! First the attribute: eight tasks settle the same order at once, and `settle` runs for one of
//! them at a time; each sees its fencing token through `lock_runtime::current()`, and a caller
//! that finds the order busy gets the fallback's answer instead of waiting. Then the same lock
//! taken by hand: a guard, `try_lock`, and `run`.

use std::sync::Arc;
use std::time::Duration;

use lock_runtime::{distributed_locked, LockError, LockManager};
use tokio::sync::Mutex;

/// An order, and the ledger where settlements land (a stand-in for your database).
struct Order {
    id: u64,
    ledger: Arc<Mutex<Vec<String>>>,
}

/// Runs only while `order:<id>` is held: waits up to 5 s for it, with a 30 s lease.
#[distributed_locked(name = "order:{order.id}", wait = "5s", lease = "30s")]
async fn settle(order: &Order, by: usize) -> Result<u64, LockError> {
    let lock = lock_runtime::current().expect("inside a locked call");
    // Hand the fencing token to the store, so it can refuse a holder whose lock ran out.
    let token = lock.fencing_token();
    tokio::time::sleep(Duration::from_millis(10)).await; // the exclusive work
    order.ledger.lock().await.push(format!(
        "task {by} settled order {} under {} (token {token})",
        order.id,
        lock.key()
    ));
    Ok(token)
}

/// Does not wait: when the order is busy, `busy` answers instead.
#[distributed_locked(name = "order:{order.id}", wait = "0s", fallback = busy)]
async fn settle_now(order: &Order) -> String {
    format!("settled order {} at once", order.id)
}

async fn busy(order: &Order) -> String {
    format!("order {} is busy: try again later", order.id)
}

#[tokio::main]
async fn main() -> Result<(), LockError> {
    // The manager the attribute uses (a Redis or ZooKeeper one works the same way).
    let manager = LockManager::builder().prefix("shop:").memory();
    lock_runtime::set_default(manager.clone());

    let ledger = Arc::new(Mutex::new(Vec::new()));
    let order = Arc::new(Order { id: 42, ledger: ledger.clone() });
    let mut tasks = Vec::new();
    for by in 0..8 {
        let order = order.clone();
        tasks.push(tokio::spawn(async move { settle(&order, by).await }));
    }
    for task in tasks {
        task.await.expect("task panicked")?;
    }
    for line in ledger.lock().await.iter() {
        println!("{line}");
    }

    // The fallback: answered at once while someone else holds the order.
    let held = manager.lock("order:42").await?;
    println!("{}", settle_now(&order).await);
    held.release().await?;
    println!("{}", settle_now(&order).await);

    // Without the attribute: a guard (released explicitly, or in the background on drop) ...
    let guard = manager.lock("order:42").wait(Duration::from_secs(2)).await?;
    println!("guard: {} held with token {}", guard.key(), guard.fencing_token());
    match manager.try_lock("order:42").await? {
        Some(_) => println!("unexpected: got a held lock"),
        None => println!("try_lock: order:42 is busy"),
    }
    guard.release().await?;

    // ... or a future run under the lock, as the attribute does (reentrancy and current()).
    let token =
        manager.lock("order:42").run(async { lock_runtime::current().map(|lock| lock.fencing_token()) }).await?;
    println!("run: the body saw token {token:?}");
    Ok(())
}
