//! A worker process of the lock-file tests (`tests/tests/file.rs`): one process of a host that
//! shares a lock directory with others; `hold` also takes a store's URL instead of a directory
//! (`LockManager::connect`), for another store's process tests (`tests/postgres_pgbouncer.rs`).
//!
//! ```text
//! file_worker hold  <dir|url> <name>        takes the lock, prints `held <token>`, then sleeps until killed
//! file_worker count <dir> <name> <rounds>   per round: takes the lock, adds one to <dir>/counter
//!                                           (read, yield, write: lost updates show an overlap), prints
//!                                           `token <token>`, releases; then `done`
//! ```
//!
//! Prints `error <e>` and exits with 1 on any failure.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::Write;
use std::time::Duration;

use lock_runtime::LockManager;

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if let Err(e) = run(&args).await {
        println!("error {e}");
        std::process::exit(1);
    }
}

async fn run(args: &[String]) -> Result<(), String> {
    let [mode, dir, name, rest @ ..] = args else {
        return Err("usage: file_worker hold|count DIR NAME [ROUNDS]".into());
    };
    let builder = LockManager::builder().label(format!("worker-{mode}"));
    let manager = match dir.contains("://") {
        true => builder.connect(dir).await,
        false => builder.file(dir),
    };
    let manager = manager.map_err(|e| e.to_string())?;
    let wait = Duration::from_secs(30);
    let mut out = std::io::stdout();
    match mode.as_str() {
        "hold" => {
            let guard = manager.lock(name).wait(wait).await.map_err(|e| e.to_string())?;
            writeln!(out, "held {}", guard.fencing_token()).and_then(|()| out.flush()).map_err(|e| e.to_string())?;
            std::future::pending::<()>().await;
            Ok(())
        }
        "count" => {
            let rounds: u32 = rest.first().and_then(|r| r.parse().ok()).ok_or("count needs ROUNDS")?;
            let counter = std::path::Path::new(dir).join("counter");
            for _ in 0..rounds {
                let guard = manager.lock(name).wait(wait).await.map_err(|e| e.to_string())?;
                let seen: u64 = std::fs::read_to_string(&counter).ok().and_then(|t| t.trim().parse().ok()).unwrap_or(0);
                tokio::task::yield_now().await;
                std::fs::write(&counter, format!("{}", seen + 1)).map_err(|e| e.to_string())?;
                writeln!(out, "token {}", guard.fencing_token()).map_err(|e| e.to_string())?;
                guard.release().await.map_err(|e| e.to_string())?;
            }
            writeln!(out, "done").and_then(|()| out.flush()).map_err(|e| e.to_string())
        }
        other => Err(format!("unknown mode {other}")),
    }
}
