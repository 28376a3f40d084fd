//! `mode`, `permits` and `names`: lint-clean, and they take the kind they name.
#![deny(warnings, clippy::all)]

use std::sync::LazyLock;

use lock_runtime::{distributed_locked, LockError, LockManager};

static LOCKS: LazyLock<LockManager> = LazyLock::new(LockManager::memory);

#[distributed_locked(name = "catalog:{id}", mode = read, manager = &*LOCKS)]
async fn read(id: u32) -> Result<bool, LockError> {
    // Readers share: another reader gets in at once, a writer (of another task) does not.
    let other = LOCKS.try_read_lock(format!("catalog:{id}")).await?.is_some();
    let name = format!("catalog:{id}");
    let writer = tokio::spawn(async move { LOCKS.try_write_lock(name).await.map(|w| w.is_some()) });
    let writer = writer.await.unwrap_or(Ok(true))?;
    // This task asking to write inside its read is refused (it would deadlock).
    let upgrade = LOCKS.try_write_lock(format!("catalog:{id}")).await.is_err_and(|e| e.is_invalid());
    Ok(other && !writer && upgrade)
}

#[distributed_locked(name = "catalog:{id}", mode = write, wait = "1s", manager = &*LOCKS)]
async fn write(id: u32) -> Result<bool, LockError> {
    // Nested read inside the write re-enters; nobody else reads meanwhile.
    let nested = read_nested(id).await?;
    Ok(nested && LOCKS.try_read_lock(format!("catalog:{id}")).await?.is_none())
}

#[distributed_locked(name = "catalog:{id}", mode = read, manager = &*LOCKS)]
async fn read_nested(id: u32) -> Result<bool, LockError> {
    Ok(lock_runtime::current().is_some_and(|l| l.key() == format!("catalog:{id}")))
}

#[distributed_locked(name = "exports", permits = 2, manager = LOCKS.clone())]
async fn export() -> Result<bool, LockError> {
    // One permit of two is ours: one more is free, then none.
    let second = LOCKS.try_semaphore("exports", 2).await?;
    let third = LOCKS.try_semaphore("exports", 2).await?;
    Ok(second.is_some() && third.is_none())
}

pub struct Transfer {
    pub from: u32,
    pub to: u32,
}

#[distributed_locked(names = ["acct:{t.from}", "acct:{t.to}"], wait = "1s", manager = &*LOCKS, fallback = busy)]
async fn transfer(t: &Transfer) -> Result<Vec<bool>, LockError> {
    let from = LOCKS.try_lock(format!("acct:{}", t.from)).await?.is_none();
    let to = LOCKS.try_lock(format!("acct:{}", t.to)).await?.is_none();
    Ok(vec![from, to])
}

async fn busy(_t: &Transfer) -> Result<Vec<bool>, LockError> {
    Ok(Vec::new())
}

fn main() {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    rt.block_on(async {
        assert!(read(1).await.expect("read"));
        assert!(write(1).await.expect("write"));
        assert!(export().await.expect("export"));
        assert_eq!(transfer(&Transfer { from: 2, to: 1 }).await.expect("transfer"), [true, true]);
        let held = LOCKS.lock("acct:1").await.expect("held");
        let busy = transfer(&Transfer { from: 2, to: 1 }).await.expect("fallback");
        assert!(busy.is_empty(), "the fallback ran");
        drop(held);
        assert!(LOCKS.try_lock("acct:2").await.expect("try").is_some(), "rolled back");
    });
}
