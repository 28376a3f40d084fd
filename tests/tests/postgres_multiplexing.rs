//! Held PostgreSQL locks sharing a few connections (`PostgresOptions::multiplexing`, on by
//! default) against a real server: 1,000 held locks on at most 16 server connections, one
//! carrier's death reported to every lock on it, a lock never taken twice through a carrier's
//! re-entrant session, an attempt dropped after any poll leaving nothing behind, inspection and
//! a forced release of one carried lock; and the conformance suite with multiplexing off
//! (every lock on a connection of its own, as before).

#![cfg(feature = "postgres")]
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::Arc;
use std::time::Duration;

use lock_runtime::backend::postgres::{PostgresBackend, PostgresOptions};
use lock_runtime::backend::{ForceRelease, Inspect};
use lock_runtime::{LockGuard, LockManager, LockManagerBuilder};
use lock_tests::multiplexing::{
    after_a_carriers_death, attempts_dropped_at_once_are_undone, dropped_attempts_leave_nothing, hold,
};
use lock_tests::pg_server::PgServer;

/// The suite with every lock on a connection of its own (multiplexing off).
mod own_connections {
    use super::*;

    lock_tests::conformance_suite!(
        {
            let server = Arc::new(PgServer::start());
            move |builder: LockManagerBuilder| {
                let (url, _server) = (format!("{}?multiplexing=0", server.url()), server.clone());
                async move { builder.connect(url).await.expect("connect") }
            }
        },
        kinds = [
            lock_runtime::backend::LockKind::Read,
            lock_runtime::backend::LockKind::Write,
            lock_runtime::backend::LockKind::Semaphore { permits: 1 }
        ],
        inspect = true
    );
}

/// The sessions of the manager whose `application_name` is `holder` (a holder's session
/// shows it followed by its token), idle ones included.
async fn sessions(admin: &tokio_postgres::Client) -> i64 {
    admin
        .query_one("SELECT count(*) FROM pg_stat_activity WHERE application_name LIKE 'holder%'", &[])
        .await
        .expect("pg_stat_activity")
        .get(0)
}

/// The pids of the carriers' sessions.
async fn carriers(admin: &tokio_postgres::Client) -> Vec<i32> {
    admin
        .query("SELECT pid FROM pg_stat_activity WHERE query LIKE '/* lock-runtime carrier */%'", &[])
        .await
        .expect("pg_stat_activity")
        .iter()
        .map(|row| row.get(0))
        .collect()
}

/// 1,000 uncontended held locks from one manager on at most 16 server connections (the
/// default: 4 carriers), counted in `pg_stat_activity`; each still excludes another manager,
/// and every one is free after its release. The figures at 1, 100 and 1,000 held are printed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_held_locks_use_at_most_sixteen_connections() {
    let server = PgServer::start();
    let admin = server.admin().await;
    let m = LockManager::postgres(format!("{}?application_name=holder", server.url())).await.expect("connect");
    let other = LockManager::connect(format!("{}?multiplexing=0", server.url())).await.expect("other");
    let mut held = Vec::new();
    for target in [1, 100, 1000] {
        hold(&m, "many:", target, &mut held).await;
        assert_eq!(held.len(), target);
        let used = sessions(&admin).await;
        lock_tests::figure(
            "a_thousand_held_locks_use_at_most_sixteen_connections",
            &format!("{target} held locks: {used} server connections of the holder, idle ones included"),
        );
        assert!(used <= 16, "{target} held locks used {used} connections");
    }
    for name in ["many:0", "many:500", "many:999"] {
        assert!(other.try_lock(name).await.expect("try").is_none(), "{name} is held");
    }
    let tokens: std::collections::HashSet<u64> = held.iter().map(LockGuard::fencing_token).collect();
    assert_eq!(tokens.len(), held.len(), "every grant has its own token");
    for guard in held {
        guard.release().await.expect("release");
    }
    for name in ["many:0", "many:500", "many:999"] {
        other.try_lock(name).await.expect("try").expect("free after the release").release().await.unwrap();
    }
    let left: i64 =
        admin.query_one("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'", &[]).await.unwrap().get(0);
    assert_eq!(left, 0, "no advisory lock left after every release");
}

/// Ending one carrier's session fires `lost()` for every lock on it, and only those; each is
/// free for others at once, and the manager's next `lock()` succeeds (on a new carrier).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_carriers_death_reports_every_lock_on_it_lost() {
    let server = PgServer::start();
    let admin = server.admin().await;
    let backend = PostgresBackend::connect_with(server.url(), PostgresOptions::new().multiplexing(1)).await.unwrap();
    let m = LockManager::builder().backend(backend);
    let mut held = Vec::new();
    hold(&m, "dies:", 50, &mut held).await;
    let pids = carriers(&admin).await;
    assert_eq!(pids.len(), 1, "one carrier: {pids:?}");
    let ended: bool = admin.query_one("SELECT pg_terminate_backend($1)", &[&pids[0]]).await.unwrap().get(0);
    assert!(ended);
    let other = LockManager::postgres(server.url()).await.expect("other");
    after_a_carriers_death(&m, &other, "dies:", held).await;
}

/// A carrier's session could take a lock it holds again (advisory locks are re-entrant, and a
/// second shared lock passes a waiting writer): a second acquisition of a held name from the
/// same manager is refused, readers of the same manager share the name through different
/// sessions, and a waiting writer still blocks a new reader of that manager.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_carrier_never_takes_a_lock_twice() {
    let server = PgServer::start();
    let m = LockManager::postgres(server.url()).await.expect("connect");
    let held = m.lock("twice").await.expect("holder");
    assert!(m.try_lock("twice").await.expect("try").is_none(), "a held lock is not taken again");
    let waited = m.lock("twice").wait(Duration::from_millis(200)).await.expect_err("busy");
    assert!(waited.is_contended(), "{waited}");
    held.release().await.unwrap();

    let readers: Vec<LockGuard> = futures_util::future::join_all((0..6).map(|_| m.try_read_lock("shared")))
        .await
        .into_iter()
        .map(|r| r.expect("try_read_lock").expect("readers share"))
        .collect();
    let writer_side = LockManager::postgres(server.url()).await.expect("writer");
    let writer = tokio::spawn(async move {
        let w = writer_side.write_lock("shared").wait(Duration::from_secs(20)).await.expect("writer");
        w.release().await.unwrap();
    });
    let admin = server.admin().await;
    // No signal tells that the writer queued on the server: looked at every 10 ms, 30 s at most.
    lock_tests::eventually("the writer queued on the server", Duration::from_secs(30), async || {
        let sql = "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted";
        let queued: i64 = admin.query_one(sql, &[]).await.expect("pg_locks").get(0);
        lock_tests::reached(queued, 1)
    })
    .await;
    assert!(m.try_read_lock("shared").await.expect("try").is_none(), "a waiting writer blocks new readers");
    for r in readers {
        r.release().await.unwrap();
    }
    writer.await.unwrap();
}

/// An attempt dropped after any poll leaves nothing behind: the name is free for the same
/// manager and for another one right after (the carrier's undo runs in its own task).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_attempt_dropped_after_any_poll_leaves_nothing() {
    let server = PgServer::start();
    let m = LockManager::postgres(server.url()).await.expect("connect");
    let other = LockManager::connect(format!("{}?multiplexing=0", server.url())).await.expect("other");
    m.lock("warm").await.unwrap().release().await.unwrap();
    dropped_attempts_leave_nothing(&m, &other, 12).await;
}

/// An attempt dropped right after its first poll, 300 times, on a worker where a task spawned
/// last runs first: its undo never overtakes its attempt (as on MySQL).
#[tokio::test(flavor = "multi_thread", worker_threads = 1)]
async fn an_attempt_dropped_at_once_is_undone_after_it() {
    let server = PgServer::start();
    let m = LockManager::postgres(server.url()).await.expect("connect");
    let other = LockManager::connect(format!("{}?multiplexing=0", server.url())).await.expect("other");
    m.lock("warm").await.expect("a carrier opened").release().await.expect("release");
    let rounds = tokio::spawn(async move { attempts_dropped_at_once_are_undone(&m, &other, 300).await });
    rounds.await.expect("rounds");
}

/// A carried lock is inspected with its owner, token and process like any other; a forced
/// release frees it and fires its `lost()` alone: the other locks on its carrier stay held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forced_release_of_a_carried_lock_spares_its_neighbours() {
    let server = PgServer::start();
    let backend = PostgresBackend::connect_with(server.url(), PostgresOptions::new().multiplexing(1)).await.unwrap();
    let m = LockManager::builder().label("carrier-test").backend(backend.clone());
    let victim = m.lock("victim").await.expect("victim");
    let neighbour = m.lock("neighbour").await.expect("neighbour");
    let info = m.inspect("victim").await.expect("inspect").expect("held");
    assert_eq!(info.fencing_token, Some(victim.fencing_token()));
    assert_eq!(info.holder.as_ref().and_then(|h| h.label()), Some("carrier-test"));
    let owner = info.owner.clone();
    let listed = m.list("").await.expect("list");
    assert_eq!(listed.iter().map(|i| i.key.as_str()).collect::<Vec<_>>(), ["neighbour", "victim"]);

    let wrong = backend.force_release("victim", Some("someone-else")).await.expect("force");
    assert!(matches!(wrong, ForceRelease::OwnerChanged(ref o) if *o == owner), "{wrong:?}");
    let forced = backend.force_release("victim", Some(&owner)).await.expect("force");
    assert!(matches!(forced, ForceRelease::Released(ref o) if *o == owner), "{forced:?}");
    tokio::time::timeout(Duration::from_secs(10), victim.lost()).await.expect("the victim is told");
    let other = LockManager::postgres(server.url()).await.expect("other");
    other.try_lock("victim").await.unwrap().expect("freed").release().await.unwrap();
    assert!(other.try_lock("neighbour").await.unwrap().is_none(), "its neighbour is still held");
    assert!(!neighbour.is_lost());
    assert!(victim.release().await.expect_err("forced").is_lost());
    neighbour.release().await.expect("the neighbour's release");
}

/// A look never shows a carried grant half made (issue 56): while a holder takes and frees a
/// carried lock in a loop, another backend's inspections find the lock granted on the server
/// either with its owner and token or not at all, never as an unnamed advisory lock with no
/// owner (the carrier answered an inspection before its own attempt's answer was read).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_look_never_shows_a_carried_grant_half_made() {
    let server = PgServer::start();
    let backend = PostgresBackend::connect_with(server.url(), PostgresOptions::new().multiplexing(1)).await.unwrap();
    let holder = LockManager::builder().label("carrier-test").backend(backend);
    let inspector = PostgresBackend::connect(server.url()).await.unwrap();
    let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let cycling = tokio::spawn({
        let done = done.clone();
        async move {
            let mut cycles = 0u32;
            while !done.load(std::sync::atomic::Ordering::Relaxed) {
                holder.lock("busy").await.expect("lock").release().await.expect("release");
                cycles += 1;
            }
            cycles
        }
    });
    let (mut looks, mut half) = (0, Vec::new());
    while looks < 300 {
        for info in inspector.list("").await.expect("list") {
            if info.owner.is_empty() || info.fencing_token.is_none() {
                half.push(info);
            }
        }
        looks += 1;
    }
    done.store(true, std::sync::atomic::Ordering::Relaxed);
    let cycles = cycling.await.expect("holder");
    assert!(cycles > 0, "the holder never cycled");
    assert!(
        half.is_empty(),
        "{} of {looks} looks showed a grant half made ({cycles} grants): {:?}",
        half.len(),
        half.first()
    );
}
