//! What the ZooKeeper test binaries (`zookeeper.rs`, `zookeeper_kinds.rs`) share: backends
//! with a lock root of their own, and waits for states that have no signal.
#![allow(dead_code)]

use std::time::Duration;

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
    lock_tests::eventually(what, Duration::from_secs(20), async || if condition() { Ok(()) } else { Err("not yet") })
        .await;
}

/// Waits (bounded, 10 s) until nothing is left under `root`: releases that run in the
/// background (dropped guards, cancelled waiters) delete their nodes on their own time, and
/// nothing signals when they are done.
pub(crate) async fn emptied(hosts: &str, root: &str) {
    let what = format!("nothing left under {root}");
    lock_tests::eventually(&what, Duration::from_secs(10), async || {
        lock_tests::reached(zk_server::children(hosts, root).await, vec![])
    })
    .await;
}

/// The children of a read-write lock's container (`<lock path>.rw`), lowest sequence first,
/// each as its kind's prefix (`read` or `write`).
pub(crate) async fn rw_line(hosts: &str, store: &ZookeeperBackend, name: &str) -> Vec<String> {
    let mut children = zk_server::children(hosts, &format!("{}.rw", store.lock_path(name))).await;
    children.sort_by_key(|c| c.rsplit_once('-').map(|(_, seq)| seq.to_owned()));
    children.into_iter().map(|c| c.split('-').next().unwrap_or_default().to_owned()).collect()
}

/// A holder in another ZooKeeper session that hangs with its session alive: it plants lock
/// nodes as the recipe does and never renews or deletes them. Dropping it closes the session.
pub(crate) struct HungHolder(zookeeper_client::Client);

impl HungHolder {
    pub(crate) async fn connect(hosts: &str) -> Self {
        HungHolder(zookeeper_client::Client::connect(hosts).await.expect("the hung holder's session"))
    }

    /// Creates the lock's container `dir` and, in it, the ephemeral sequential node `node`
    /// holding `data` (a lease record, or nothing); gives the node's creation zxid.
    pub(crate) async fn hold(&self, dir: &str, node: &str, data: &str) -> i64 {
        use zookeeper_client::{Acls, CreateMode};
        let container = CreateMode::Container.with_acls(Acls::anyone_all());
        self.0.create(dir, b"", &container).await.expect("lock node");
        let ephemeral = CreateMode::EphemeralSequential.with_acls(Acls::anyone_all());
        let (stat, _) =
            self.0.create(&format!("{dir}/{node}"), data.as_bytes(), &ephemeral).await.expect("the hung holder's node");
        stat.czxid
    }
}

/// A name that a hung holder's fixed `lease` kept was freed `waited` after the holder took it:
/// once the lease ended, and not much later.
pub(crate) fn assert_freed_after_lease(what: &str, lease: Duration, waited: Duration) {
    assert!(waited >= lease, "{what}: freed before the holder's lease ended: {waited:?}");
    assert!(waited < lease + Duration::from_secs(5), "{what}: freed late: {waited:?}");
}
