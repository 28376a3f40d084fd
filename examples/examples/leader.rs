//! Leader election: three processes of one scheduler, of which one leads at a time. The
//! leader runs the schedule (`#[distributed_locked(name = "scheduler", leader)]`); the
//! parent follows the election without campaigning (`Election::observe`), prints every change
//! of leader, and kills the leader twice with SIGKILL to show the hand-over.
//!
//! ```text
//! # three processes against one Redis (the store is a URL: `--url URL` or LOCK_URL, default
//! # redis://127.0.0.1:6379; any scheme of `LockManager::connect`):
//! cargo run -p examples --features redis --example leader
//! # against PostgreSQL (a killed leader is replaced at once: its connection ends):
//! cargo run -p examples --features postgres --example leader -- --postgres postgres://postgres@127.0.0.1/postgres
//! # sharing lock files in a directory (one host, nothing to install):
//! cargo run -p examples --example leader -- --file /tmp/leader-locks
//! ```
//!
//! Prints, e.g.:
//!
//! ```text
//! leader: host/4242/b (term 1764190000123456)
//! b: tick 1 as leader (token 1764190000123456)
//! killing b (pid 4242)
//! leader: host/4243/c (term 1764190003456789)
//! ```

use std::time::Duration;

use lock_runtime::{distributed_locked, LockError, LockManager, LockManagerBuilder};

/// The term lease on Redis: a killed leader (whose watchdog stops renewing) is replaced within
/// it. Short for the demonstration; the default is 30 s.
const LEASE: Duration = Duration::from_secs(3);

/// The schedule, run by the leader only. A loss of leadership stops it at its next await;
/// the instance then campaigns again.
#[distributed_locked(name = "scheduler", leader, manager = manager)]
async fn schedule(manager: &LockManager, instance: &str) -> Result<(), LockError> {
    let token = lock_runtime::current().map_or(0, |term| term.fencing_token());
    for tick in 1.. {
        println!("{instance}: tick {tick} as leader (token {token})");
        tokio::time::sleep(Duration::from_millis(700)).await;
    }
    Ok(())
}

/// Where the locks live, from the command line, as the URL a manager connects to
/// (`LockManager::connect`): `--url URL`, `--postgres URL`, `--file DIR` (`file://DIR`), or
/// LOCK_URL (REDIS_URL), default `redis://127.0.0.1:6379`.
fn store_url(args: &[String]) -> String {
    let flag = |f: &str| args.iter().position(|a| a == f).and_then(|i| args.get(i + 1)).cloned();
    match (flag("--url").or_else(|| flag("--postgres")), flag("--file")) {
        (Some(url), _) => url,
        (None, Some(dir)) => format!("file://{dir}"),
        (None, None) => std::env::var("LOCK_URL")
            .or_else(|_| std::env::var("REDIS_URL"))
            .unwrap_or_else(|_| "redis://127.0.0.1:6379".to_owned()),
    }
}

async fn manager(url: &str, builder: LockManagerBuilder) -> Result<LockManager, LockError> {
    builder.prefix("leader-example:").default_lease(LEASE).connect(url).await
}

#[tokio::main]
async fn main() -> Result<(), LockError> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let url = store_url(&args);
    if let Some(i) = args.iter().position(|a| a == "--instance") {
        // One instance: campaign, lead, campaign again after a loss, until killed.
        let name = args.get(i + 1).cloned().unwrap_or_else(|| "x".to_owned());
        let manager = manager(&url, LockManager::builder().label(&name)).await?;
        return schedule(&manager, &name).await;
    }

    let manager = manager(&url, LockManager::builder()).await?;
    let me = std::env::current_exe().map_err(|e| LockError::invalid("leader", e.to_string()))?;
    let mut children: Vec<(String, std::process::Child)> = ["a", "b", "c"]
        .into_iter()
        .filter_map(|name| {
            std::process::Command::new(&me)
                .args(["--instance", name])
                .args(["--url", url.as_str()])
                .spawn()
                .map_err(|e| eprintln!("could not start {name}: {e}"))
                .ok()
                .map(|child| (name.to_owned(), child))
        })
        .collect();

    // Follow the election; after a leader has led for 2 s, kill it (twice), then stop.
    let mut watch = manager.election("scheduler").observe();
    let mut kills = 0;
    while kills < 2 {
        let Some(leader) = watch.changed().await? else {
            println!("leader: nobody");
            continue;
        };
        println!("leader: {} (term {})", leader.holder(), leader.fencing_token().unwrap_or(0));
        tokio::time::sleep(Duration::from_secs(2)).await;
        if let Some((name, child)) = children.iter_mut().find(|(_, c)| Some(c.id()) == leader.holder().pid()) {
            println!("killing {name} (pid {})", child.id());
            let _ = child.kill();
            let _ = child.wait();
            kills += 1;
        }
    }
    // The last hand-over, then the end.
    while watch.changed().await?.is_none() {
        println!("leader: nobody");
    }
    if let Some(leader) = manager.election("scheduler").leader().await? {
        println!("leader: {} (term {})", leader.holder(), leader.fencing_token().unwrap_or(0));
    }
    for (_, mut child) in children {
        let _ = child.kill();
        let _ = child.wait();
    }
    Ok(())
}
