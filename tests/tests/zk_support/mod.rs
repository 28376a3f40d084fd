//! What the ZooKeeper test binaries (`zookeeper.rs`, `zookeeper_kinds.rs`) share: backends
//! with a lock root of their own, and waits for states that have no signal.
#![allow(dead_code)]

use std::time::{Duration, Instant};

use lock_runtime::backend::zookeeper::{ZookeeperBackend, ZookeeperOptions};

use lock_tests::zk_server::{self};

/// A backend with its own lock root, so a test can inspect what it leaves behind.
pub(crate) async fn backend(hosts: &str, root: &str) -> ZookeeperBackend {
    ZookeeperBackend::connect_with(hosts, ZookeeperOptions::new().root(root)).await.expect("connect")
}

/// `n` sessions (each a backend on the shared root) and a manager on each.
pub(crate) async fn sessions(hosts: &str, n: usize) -> (Vec<ZookeeperBackend>, Vec<lock_runtime::LockManager>) {
    let mut stores = Vec::new();
    for _ in 0..n {
        stores.push(ZookeeperBackend::connect(hosts).await.expect("connect"));
    }
    let managers = stores.iter().map(|s| lock_runtime::LockManager::builder().backend(s.clone())).collect();
    (stores, managers)
}

pub(crate) fn unique_root(label: &str) -> String {
    format!("/t-{}", lock_tests::unique(label).replace(':', "-"))
}

/// Waits (bounded) until `condition` holds: for conditions nothing signals, such as another
/// session's node being queued.
pub(crate) async fn until(what: &str, condition: impl Fn() -> bool) {
    let started = Instant::now();
    while !condition() {
        assert!(started.elapsed() < Duration::from_secs(20), "timed out waiting until {what}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Waits (bounded, 10 s) until nothing is left under `root`: releases that run in the
/// background (dropped guards, cancelled waiters) delete their nodes on their own time, and
/// nothing signals when they are done.
pub(crate) async fn emptied(hosts: &str, root: &str) {
    let started = Instant::now();
    loop {
        let left = zk_server::children(hosts, root).await;
        if left.is_empty() {
            return;
        }
        assert!(started.elapsed() < Duration::from_secs(10), "left behind: {left:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The children of a read-write lock's container (`<lock path>.rw`), lowest sequence first,
/// each as its kind's prefix (`read` or `write`).
pub(crate) async fn rw_line(hosts: &str, store: &ZookeeperBackend, name: &str) -> Vec<String> {
    let mut children = zk_server::children(hosts, &format!("{}.rw", store.lock_path(name))).await;
    children.sort_by_key(|c| c.rsplit_once('-').map(|(_, seq)| seq.to_owned()));
    children.into_iter().map(|c| c.split('-').next().unwrap_or_default().to_owned()).collect()
}
