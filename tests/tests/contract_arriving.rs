//! Every name the contract lists as arriving with the lock-kinds and scheduled-jobs work, used
//! as a user would write it: the builders with `.wait/.lease/.retry`, awaited to guards with
//! fencing token(s), `lost()` and `release()`, `hold_at_least`, `run`, and the attribute's
//! `mode`, `permits`, `names`, `hold_at_least` and `skip_if_locked`.

use std::time::Duration;

use lock_runtime::{distributed_locked, LockError, LockManager};

#[distributed_locked(name = "catalog", mode = read)]
async fn browse() -> Result<u8, LockError> {
    Ok(1)
}

#[distributed_locked(name = "catalog", mode = write, wait = "2s")]
async fn reprice() -> Result<u8, LockError> {
    Ok(2)
}

#[distributed_locked(name = "exports", permits = 4)]
async fn export() -> Result<u8, LockError> {
    Ok(3)
}

#[distributed_locked(names = ["acct:{from}", "acct:{to}"])]
async fn transfer(from: u32, to: u32) -> Result<u32, LockError> {
    Ok(from + to)
}

#[distributed_locked(name = "nightly", hold_at_least = "30s", skip_if_locked)]
async fn nightly() -> u8 {
    5
}

#[tokio::test]
async fn the_arriving_names_compile_and_work() -> Result<(), LockError> {
    let manager = LockManager::memory();
    lock_runtime::set_default(manager.clone());
    let w = Duration::from_secs(1);
    let l = Duration::from_secs(10);

    let read = manager.read_lock("catalog").wait(w).lease(l).retry(1).await?;
    let read2 = manager.read_lock("catalog").wait(w).await?;
    assert!(read2.fencing_token() > read.fencing_token());
    assert!(!read.is_lost());
    read.release().await?;
    read2.release().await?;
    let write = manager.write_lock("catalog").wait(w).lease(l).retry(1).await?;
    write.release().await?;
    let permit = manager.semaphore("exports", 4).wait(w).lease(l).retry(1).await?;
    permit.release().await?;
    let all = manager.lock_all(["acct:2", "acct:1"]).wait(w).lease(l).retry(1).await?;
    assert_eq!(all.fencing_tokens().len(), 2);
    assert!(all.fencing_token() >= all.fencing_tokens()[0]);
    tokio::select! {
        () = all.lost() => panic!("not lost"),
        () = tokio::task::yield_now() => {}
    }
    all.release().await?;

    let held = manager.lock("nightly").hold_at_least(Duration::from_secs(30)).await?;
    held.release().await?;
    assert!(manager.try_lock("nightly").await?.is_none(), "held until 30 s after the grant");

    let token = manager.lock("order:42").run(async { lock_runtime::current().map(|c| c.fencing_token()) }).await?;
    assert!(token.is_some());

    assert_eq!(browse().await?, 1);
    assert_eq!(reprice().await?, 2);
    assert_eq!(export().await?, 3);
    assert_eq!(transfer(1, 2).await?, 3);
    assert_eq!(nightly().await, 0, "still held by hold_at_least above: skipped");
    Ok(())
}

/// The constructors of the Redis topologies beyond one node, as a user writes them (compiled,
/// not run here: `redis_cluster.rs`, `redis_sentinel.rs` and `redlock.rs` run them against real
/// servers).
#[cfg(feature = "redis")]
#[allow(dead_code)]
async fn more_redis_backends() -> Result<(), LockError> {
    let _ = LockManager::redis_cluster(&["redis://127.0.0.1:7000", "redis://127.0.0.1:7001"]).await?;
    let _ = LockManager::redis_sentinel(&["redis://127.0.0.1:26379", "redis://127.0.0.1:26380"], "mymaster").await?;
    let _ = LockManager::redlock(&["redis://a:6379", "redis://b:6379", "redis://c:6379"]).await?;
    let _ = LockManager::builder().prefix("app:").redis_cluster(&["redis://127.0.0.1:7000"]).await?;
    let _ = LockManager::builder().redis_sentinel(&["redis://127.0.0.1:26379"], "mymaster").await?;
    let _ = LockManager::builder().redlock(&["redis://a:6379", "redis://b:6379", "redis://c:6379"]).await?;
    Ok(())
}

#[distributed_locked(name = "scheduler", leader, manager = manager)]
async fn singleton(manager: &LockManager) -> Result<u64, LockError> {
    Ok(lock_runtime::current().map_or(0, |term| term.fencing_token()))
}

/// The leader-election names, as the contract lists them.
#[tokio::test]
async fn the_election_names_compile_and_work() -> Result<(), LockError> {
    use lock_runtime::{Election, LeaderInfo, Leadership};
    let manager = LockManager::builder().label("scheduler-1").memory();
    let election: Election = manager.election("scheduler");
    let mut watch = election.observe();
    assert!(watch.changed().await?.is_none());
    let leadership: Leadership = election.campaign().await?;
    let token: u64 = leadership.fencing_token();
    assert!(election.campaign().wait(Duration::from_millis(10)).await.unwrap_err().is_contended());
    let now: Option<LeaderInfo> = election.leader().await?;
    let now = now.expect("leads");
    assert_eq!(now.holder().to_string(), manager.holder().to_string());
    assert_eq!(now.fencing_token(), Some(token));
    let next: Option<LeaderInfo> = watch.changed().await?;
    assert_eq!(next.and_then(|l| l.fencing_token()), Some(token));
    tokio::select! {
        () = leadership.lost() => panic!("not lost"),
        () = tokio::task::yield_now() => {}
    }
    leadership.resign().await?;
    let out = election.lead(|leadership| async move { leadership.fencing_token() }).await?;
    assert!(out > token);
    assert!(singleton(&manager).await? > out);
    Ok(())
}
