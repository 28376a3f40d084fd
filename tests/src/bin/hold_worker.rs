//! A holder in a separate OS process: for the etcd cross-process tests, and for the clock
//! faults of a client (`lock_tests::clocks`), which run it under libfaketime with any store's
//! URL.
//!
//! ```text
//! hold_worker <endpoint> hold <lock> <lease-ttl-s>   # etcd: takes the lock, prints `held <token>`, sleeps
//! hold_worker <url> hold-until-lost <lock>           # `LockManager::connect(url)`, takes the lock,
//!                                                    # prints `held <token>`, then `lost` when
//!                                                    # told, or `released` at stdin's end
//! ```

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::io::Write;

use lock_runtime::LockManager;
use tokio::io::AsyncReadExt;

fn say(line: &str) {
    println!("{line}");
    std::io::stdout().flush().expect("flush");
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.as_slice() {
        #[cfg(feature = "etcd")]
        [endpoint, mode, lock, ttl] if mode == "hold" => {
            use lock_runtime::backend::etcd::{EtcdBackend, EtcdOptions};
            let ttl = std::time::Duration::from_secs(ttl.parse().expect("ttl"));
            let backend =
                EtcdBackend::connect_with([endpoint], EtcdOptions::new().lease_ttl(ttl)).await.expect("connect");
            let manager = LockManager::builder().backend(backend);
            let guard = manager.lock(lock).await.expect("lock");
            say(&format!("held {}", guard.fencing_token()));
            std::future::pending::<()>().await;
        }
        [url, mode, lock] if mode == "hold-until-lost" => {
            let manager = LockManager::connect(url).await.expect("connect");
            let guard = manager.lock(lock).await.expect("lock");
            say(&format!("held {}", guard.fencing_token()));
            let mut stdin = tokio::io::stdin();
            let mut rest = Vec::new();
            tokio::select! {
                () = guard.lost() => say("lost"),
                _ = stdin.read_to_end(&mut rest) => {
                    let released = guard.release().await;
                    say(if released.is_ok() { "released" } else { "release failed" });
                }
            }
        }
        _ => panic!("usage: hold_worker <endpoint> hold <lock> <ttl-s> | hold_worker <url> hold-until-lost <lock>"),
    }
}
