//! A separate OS process for the etcd cross-process tests.
//!
//! ```text
//! etcd_worker <endpoint> hold <lock> <lease-ttl-s>   # takes the lock, prints `held <token>`, sleeps
//! ```

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::io::Write;
use std::time::Duration;

use lock_runtime::backend::etcd::{EtcdBackend, EtcdOptions};
use lock_runtime::LockManager;

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [endpoint, mode, lock, ttl] = args.as_slice() else {
        panic!("usage: etcd_worker <endpoint> hold <lock> <ttl-s>")
    };
    assert_eq!(mode, "hold", "unknown mode {mode}");
    let ttl = Duration::from_secs(ttl.parse().expect("ttl"));
    let backend = EtcdBackend::connect_with([endpoint], EtcdOptions::new().lease_ttl(ttl)).await.expect("connect");
    let manager = LockManager::builder().backend(backend);
    let guard = manager.lock(lock).await.expect("lock");
    println!("held {}", guard.fencing_token());
    std::io::stdout().flush().expect("flush");
    std::future::pending::<()>().await;
}
