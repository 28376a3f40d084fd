//! A scheduled job that every instance of a service runs on its own timer, and that runs once
//! per tick across all of them: `skip_if_locked` (an instance that finds the job taken skips
//! it) and `hold_at_least` (the job stays taken for a second after its start, so an instance
//! whose timer fires a little later, its clock a little behind, does not run it again).
//!
//! ```text
//! # three instances (processes) against one Redis, five ticks (the store is a URL: `--url URL`
//! # or LOCK_URL, default redis://127.0.0.1:6379; any scheme of `LockManager::connect`):
//! cargo run -p examples --features redis --example scheduled
//! cargo run -p examples --features postgres --example scheduled -- --url postgres://postgres@127.0.0.1/postgres
//! # or start instances yourself, in several terminals:
//! cargo run -p examples --features redis --example scheduled -- --instance a
//! # the same API on the in-process backend, instances as tasks of one process:
//! cargo run -p examples --features redis --example scheduled -- --memory
//! # three processes sharing lock files in a directory (one host, nothing to install; the same
//! # as `--url file:///tmp/scheduled-locks`):
//! cargo run -p examples --example scheduled -- --file /tmp/scheduled-locks
//! ```
//!
//! Each tick prints which instance ran it, e.g. `tick 881412305: report by instance b (pid 4242)`.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use lock_runtime::{distributed_locked, LockError, LockManager};

/// Seconds between ticks (aligned to the wall clock, as a cron schedule is).
const EVERY: u64 = 2;

/// The job. `hold_at_least` below the tick interval and above the skew between instances'
/// clocks; no `lease`: a watchdog keeps the lock while the job runs, however long it takes.
#[distributed_locked(name = "report", skip_if_locked, hold_at_least = "1s", manager = manager)]
async fn report(manager: &LockManager, instance: &str, tick: u64) {
    println!("tick {tick}: report by instance {instance} (pid {})", std::process::id());
    tokio::time::sleep(Duration::from_millis(50)).await; // the work: much shorter than the hold
}

/// Sleeps until the next multiple of `EVERY` seconds on this machine's clock; returns it.
async fn next_tick() -> u64 {
    let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default();
    let tick = now.as_secs() / EVERY + 1;
    tokio::time::sleep(Duration::from_secs(tick * EVERY).saturating_sub(now)).await;
    tick
}

/// One instance: runs the job at each of `ticks` ticks (forever with `None`).
async fn instance(manager: LockManager, name: String, ticks: Option<u32>) {
    let mut done = 0;
    while ticks.is_none_or(|t| done < t) {
        let tick = next_tick().await;
        report(&manager, &name, tick).await;
        done += 1;
    }
}

#[tokio::main]
async fn main() -> Result<(), LockError> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let flag = |f: &str| args.iter().position(|a| a == f).and_then(|i| args.get(i + 1)).cloned();
    let ticks = flag("--ticks").and_then(|t| t.parse().ok());
    if args.iter().any(|a| a == "--memory") {
        // One process, three instances as tasks sharing an in-process store.
        let manager = LockManager::memory();
        let tasks: Vec<_> = ["a", "b", "c"]
            .into_iter()
            .map(|name| tokio::spawn(instance(manager.clone(), name.to_owned(), Some(ticks.unwrap_or(5)))))
            .collect();
        for task in tasks {
            let _ = task.await;
        }
        return Ok(());
    }
    // The store, by URL (`LockManager::connect`): `--url URL`, `--file DIR`, or LOCK_URL.
    let url = match (flag("--url"), flag("--file")) {
        (Some(url), _) => url,
        (None, Some(dir)) => format!("file://{dir}"),
        (None, None) => std::env::var("LOCK_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".to_owned()),
    };
    if let Some(name) = flag("--instance") {
        let builder = LockManager::builder().prefix("scheduled-example:").label(&name);
        let manager = builder.connect(&url).await?;
        instance(manager, name, ticks).await;
        return Ok(());
    }
    // Start three instances of this program as separate processes, five ticks each.
    println!("three instances against {url}, one report per tick:");
    let me = std::env::current_exe().map_err(|e| LockError::invalid("scheduled", e.to_string()))?;
    let children: Vec<_> = ["a", "b", "c"]
        .into_iter()
        .filter_map(|name| {
            let args = ["--instance", name, "--ticks", "5", "--url", url.as_str()];
            std::process::Command::new(&me)
                .args(args)
                .spawn()
                .map_err(|e| eprintln!("could not start {name}: {e}"))
                .ok()
        })
        .collect();
    for mut child in children {
        let _ = child.wait();
    }
    Ok(())
}
