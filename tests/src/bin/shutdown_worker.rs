//! A service that stops on SIGTERM the way the README says (`manager.shutdown()` before
//! returning from `main`), for `tests/shutdown.rs`.
//!
//! ```text
//! shutdown_worker <url> <lock> <dropped-lock> <election>
//! ```
//!
//! Takes `<lock>` and `<dropped-lock>`, leads `<election>` (a leader loop), prints `ready`;
//! on SIGTERM drops the guard of `<dropped-lock>` (its release goes on in the background),
//! shuts the manager down, and prints how the leader loop and the held guard ended:
//! `leader: shut down`, `guard: lost`, then `stopped`.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stdout)]

use std::io::Write;
use std::time::Duration;

use lock_runtime::LockManager;
use tokio::signal::unix::{signal, SignalKind};

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [url, name, dropped, election] = args.as_slice() else {
        panic!("usage: shutdown_worker <url> <lock> <dropped-lock> <election>")
    };
    let mut terminate = signal(SignalKind::terminate()).expect("SIGTERM handler");
    let manager = LockManager::builder().label("shutdown-worker").connect(url).await.expect("connect");
    let guard = manager.lock(name).wait(Duration::from_secs(30)).await.expect("lock");
    let dropped = manager.lock(dropped).wait(Duration::from_secs(30)).await.expect("the dropped lock");
    let (leading, elected) = tokio::sync::oneshot::channel();
    let mut leading = Some(leading);
    let election = manager.election(election);
    let leader = tokio::spawn(async move {
        election
            .lead(move |leadership| {
                if let Some(leading) = leading.take() {
                    let _ = leading.send(leadership.fencing_token());
                }
                // The term lasts as long as the body keeps its leadership.
                async move {
                    let _term = leadership;
                    std::future::pending::<()>().await
                }
            })
            .await
    });
    elected.await.expect("elected");
    say("ready");
    terminate.recv().await;
    drop(dropped);
    manager.shutdown().await;
    match leader.await.expect("leader task") {
        Err(e) if e.is_shut_down() => say("leader: shut down"),
        other => say(&format!("leader: {other:?}")),
    }
    match guard.release().await {
        Err(e) if e.is_lost() => say("guard: lost"),
        other => say(&format!("guard: {other:?}")),
    }
    say("stopped");
}

fn say(line: &str) {
    println!("{line}");
    std::io::stdout().flush().expect("flush");
}
