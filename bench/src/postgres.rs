//! PostgreSQL: the backend's held locks sharing a few connections (multiplexing, its default)
//! against a connection per lock (`?multiplexing=0`), in one run on one server (`--pg-url`):
//! the uncontended lock+release cycle of one task, and the server connections a manager uses
//! while it holds 1, 100 and 1,000 locks (counted in `pg_stat_activity` by the manager's
//! `application_name`, its idle connections included).

use std::time::{Duration, Instant};

use lock_runtime::{LockGuard, LockManager};

/// What the PostgreSQL part measured.
pub struct PgFigures {
    /// µs per uncontended lock+release, 1 task (best of alternating rounds): multiplexed, and
    /// a connection per lock.
    pub cycle_us: (f64, f64),
    /// Held locks, and the server connections of the manager then: multiplexed, and a
    /// connection per lock (`None`: not measured, past the server's `max_connections`).
    pub connections: Vec<(usize, i64, Option<i64>)>,
    /// Rounds the cycle figures are the best of.
    pub rounds: usize,
}

impl PgFigures {
    /// Multiplexed cycle time over a connection per lock's.
    pub fn cycle_ratio(&self) -> f64 {
        self.cycle_us.0 / self.cycle_us.1.max(1e-9)
    }
}

/// `url` with `query` added.
fn with(url: &str, query: &str) -> String {
    let sep = if url.contains('?') { '&' } else { '?' };
    format!("{url}{sep}{query}")
}

/// µs per lock+release on 64 rotating names, for `window`.
async fn cycle(m: &LockManager, window: Duration) -> Result<f64, String> {
    let started = Instant::now();
    let mut n = 0u64;
    while started.elapsed() < window {
        let guard = m.lock(format!("cycle:{}", n % 64)).await.map_err(|e| e.to_string())?;
        guard.release().await.map_err(|e| e.to_string())?;
        n += 1;
    }
    Ok(started.elapsed().as_secs_f64() * 1e6 / n.max(1) as f64)
}

async fn sessions(admin: &tokio_postgres::Client, app: &str) -> Result<i64, String> {
    let row = admin
        .query_one("SELECT count(*) FROM pg_stat_activity WHERE application_name LIKE $1", &[&format!("{app}%")])
        .await
        .map_err(|e| e.to_string())?;
    Ok(row.get(0))
}

/// Holds distinct locks (`<prefix>:<i>`) on `m` until `target` are held (50 attempts at a time).
async fn hold(m: &LockManager, prefix: &str, held: &mut Vec<LockGuard>, target: usize) -> Result<(), String> {
    for chunk in (held.len()..target).collect::<Vec<_>>().chunks(50) {
        let mut set = tokio::task::JoinSet::new();
        for i in chunk {
            let (m, name) = (m.clone(), format!("{prefix}:{i}"));
            set.spawn(async move { m.try_lock(name).await });
        }
        while let Some(taken) = set.join_next().await {
            let guard = taken.map_err(|e| e.to_string())?.map_err(|e| e.to_string())?;
            held.push(guard.ok_or("an uncontended lock was busy")?);
        }
    }
    Ok(())
}

/// The PostgreSQL part: `url` names a server this run may fill with up to 1,100 locks and
/// about 110 connections.
pub async fn run(url: &str, quick: bool) -> Result<PgFigures, String> {
    let (admin, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls).await.map_err(|e| e.to_string())?;
    tokio::spawn(connection);
    let muxed = LockManager::connect(with(url, "application_name=bench-mux")).await.map_err(|e| e.to_string())?;
    let own = LockManager::connect(with(url, "application_name=bench-own&multiplexing=0"))
        .await
        .map_err(|e| e.to_string())?;

    let (rounds, window) = if quick { (2, Duration::from_millis(150)) } else { (5, Duration::from_millis(500)) };
    cycle(&muxed, window / 2).await?;
    cycle(&own, window / 2).await?;
    let mut best = (f64::INFINITY, f64::INFINITY);
    for round in 0..rounds {
        eprintln!("postgres: uncontended round {}/{rounds} ...", round + 1);
        best.0 = best.0.min(cycle(&muxed, window).await?);
        best.1 = best.1.min(cycle(&own, window).await?);
    }

    let mut connections = Vec::new();
    let (mut held_mux, mut held_own) = (Vec::new(), Vec::new());
    for target in [1usize, 100, 1000] {
        hold(&muxed, "mux", &mut held_mux, target).await?;
        let mux = sessions(&admin, "bench-mux").await?;
        let own_count = if target <= 100 {
            hold(&own, "own", &mut held_own, target).await?;
            Some(sessions(&admin, "bench-own").await?)
        } else {
            None
        };
        eprintln!("postgres: {target} held: {mux} connections multiplexed, {own_count:?} with one each");
        connections.push((target, mux, own_count));
        if target == 100 {
            for guard in held_own.drain(..) {
                guard.release().await.map_err(|e| e.to_string())?;
            }
        }
    }
    for guard in held_mux {
        guard.release().await.map_err(|e| e.to_string())?;
    }
    Ok(PgFigures { cycle_us: best, connections, rounds })
}
