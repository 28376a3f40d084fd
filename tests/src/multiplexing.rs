//! What the SQL backends' multiplexing tests (`postgres_multiplexing`, `mysql_multiplexing`)
//! check the same way on either server: locks held side by side, a carrier's death, attempts
//! dropped after any poll.

#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)]

use std::future::IntoFuture;
use std::task::Poll;
use std::time::Duration;

use lock_runtime::{LockGuard, LockManager};

/// Holds distinct locks `<prefix><i>` on `m` until `target` are held (100 tries at a time).
pub async fn hold(m: &LockManager, prefix: &str, target: usize, held: &mut Vec<LockGuard>) {
    for chunk in (held.len()..target).collect::<Vec<_>>().chunks(100) {
        let taken = futures_util::future::join_all(chunk.iter().map(|i| m.try_lock(format!("{prefix}{i}")))).await;
        held.extend(taken.into_iter().map(|g| g.expect("try_lock").expect("uncontended")));
    }
}

/// After the carrier of `held` (locks named `<prefix><i>`) died: every one is told `lost()`
/// (20 s bounds a hang, not a speed), one is free for `other`, each release is `is_lost`, and
/// `m`'s next `lock()` succeeds.
pub async fn after_a_carriers_death(m: &LockManager, other: &LockManager, prefix: &str, held: Vec<LockGuard>) {
    for guard in &held {
        tokio::time::timeout(Duration::from_secs(20), guard.lost()).await.expect("lost() of a carried lock");
    }
    let freed = format!("{prefix}0");
    other.try_lock(&freed).await.unwrap().expect("freed with its carrier").release().await.unwrap();
    for guard in held {
        assert!(guard.release().await.expect_err("its carrier died").is_lost());
    }
    m.lock(format!("{prefix}after")).await.expect("the next lock()").release().await.expect("release");
}

/// `m.lock(name)` dropped after 1 to `polls` polls, for as many names: each name is free right
/// after for `other` and for `m` itself (what the carrier's undo left).
pub async fn dropped_attempts_leave_nothing(m: &LockManager, other: &LockManager, polls: usize) {
    for polls in 0..polls {
        let name = format!("dropped{polls}");
        let mut attempt = Box::pin(m.lock(&name).wait(Duration::from_secs(5)).into_future());
        let mut done = None;
        for _ in 0..=polls {
            if let Poll::Ready(out) = crate::poll_once(&mut attempt).await {
                done = Some(out);
                break;
            }
            tokio::task::yield_now().await;
        }
        drop(attempt);
        if let Some(guard) = done {
            guard.expect("granted").release().await.unwrap();
        }
        let again = other.lock(&name).wait(Duration::from_secs(5)).await.expect("free for another manager");
        again.release().await.unwrap();
        m.lock(&name).wait(Duration::from_secs(5)).await.expect("free for the same manager").release().await.unwrap();
    }
}

/// `m.lock(name)` dropped after its first poll (its attempt sent on a carrier, the caller gone)
/// `rounds` times over distinct names: each name is free for `other` right after (5 s bound a
/// hang: a lock left on the carrier stays held for good). The undo runs in the background
/// beside the attempt, so this is a race to repeat, not a case to hit once.
pub async fn attempts_dropped_at_once_are_undone(m: &LockManager, other: &LockManager, rounds: usize) {
    for round in 0..rounds {
        let name = format!("undone{round}");
        let mut attempt = Box::pin(m.lock(&name).wait(Duration::from_secs(5)).into_future());
        if let Poll::Ready(out) = crate::poll_once(&mut attempt).await {
            out.expect("granted").release().await.unwrap();
        }
        drop(attempt);
        let again = other.lock(&name).wait(Duration::from_secs(5)).await;
        again
            .unwrap_or_else(|e| panic!("round {round}: the dropped attempt's lock stayed taken: {e}"))
            .release()
            .await
            .unwrap();
    }
}
