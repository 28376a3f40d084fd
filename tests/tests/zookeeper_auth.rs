//! The ZooKeeper backend with `digest` authentication, against the test ZooKeeper: the
//! conformance suite with every node created under the identity's ACL, and a held lock's node
//! that a client with other credentials, or none, can read but neither delete nor rewrite.

#![cfg(feature = "zookeeper")]
#![allow(clippy::unwrap_used, clippy::expect_used)]

use lock_runtime::backend::zookeeper::{ZookeeperBackend, ZookeeperOptions};
use lock_runtime::LockManager;
use lock_tests::zk_server;

lock_tests::conformance_suite!(
    |builder: lock_runtime::LockManagerBuilder| async move {
        let options = ZookeeperOptions::new().digest_auth("conformance", "secret");
        let backend = ZookeeperBackend::connect_with(zk_server::shared().hosts(), options).await;
        builder.backend(backend.expect("connect with digest authentication"))
    },
    kinds = [
        lock_runtime::backend::LockKind::Read,
        lock_runtime::backend::LockKind::Write,
        lock_runtime::backend::LockKind::Semaphore { permits: 1 }
    ],
    inspect = true
);

/// A client of the given `user:password` (or none) on the test ZooKeeper.
async fn client(credentials: Option<&str>) -> zookeeper_client::Client {
    let connector = zookeeper_client::Client::connector();
    let connector = match credentials {
        Some(c) => connector.with_auth("digest", c.as_bytes()),
        None => connector,
    };
    connector.connect(&zk_server::shared().hosts()).await.expect("connect a raw client")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_identity_cannot_delete_or_rewrite_a_held_lock() {
    let hosts = zk_server::shared().hosts();
    let options = ZookeeperOptions::new().digest_auth("billing", "billing-secret");
    let m = LockManager::builder().backend(ZookeeperBackend::connect_with(&hosts, options).await.expect("connect"));
    let name = lock_tests::unique("guarded").replace(':', "-");
    let guard = m.lock(&name).await.expect("lock");
    let root = ZookeeperOptions::DEFAULT_ROOT;
    let dir = format!("{root}/{name}");
    let nodes = zk_server::children(&hosts, &dir).await;
    assert_eq!(nodes.len(), 1, "{nodes:?}");
    let node = format!("{dir}/{}", nodes[0]);
    for credentials in [Some("intruder:intruder-secret"), Some("billing:wrong"), None] {
        let other = client(credentials).await;
        assert!(other.get_data(&node).await.is_ok(), "{credentials:?}: everyone may read (lockctl lists)");
        let deleted = other.delete(&node, None).await;
        assert!(matches!(deleted, Err(zookeeper_client::Error::NoAuth)), "{credentials:?}: {deleted:?}");
        let rewritten = other.set_data(&node, b"holder=intruder", None).await;
        assert!(matches!(rewritten, Err(zookeeper_client::Error::NoAuth)), "{credentials:?}: {rewritten:?}");
        // Nor may it queue for the name: its node could not be deleted again.
        let queued = other
            .create(
                &format!("{dir}/lk-x-"),
                b"",
                &zookeeper_client::CreateMode::EphemeralSequential.with_acls(zookeeper_client::Acls::anyone_all()),
            )
            .await;
        assert!(matches!(queued, Err(zookeeper_client::Error::NoAuth)), "{credentials:?}: {queued:?}");
    }
    assert!(!guard.is_lost());
    guard.release().await.expect("the owner releases");
    // The same identity from another manager takes it.
    let options = ZookeeperOptions::new().digest_auth("billing", "billing-secret");
    let again = LockManager::builder().backend(ZookeeperBackend::connect_with(&hosts, options).await.expect("connect"));
    again.lock(&name).await.expect("the same identity locks again").release().await.expect("release");
}

#[tokio::test]
async fn a_user_with_a_colon_is_invalid() {
    let options = ZookeeperOptions::new().digest_auth("a:b", "secret");
    let e = ZookeeperBackend::connect_with(zk_server::shared().hosts(), options).await.expect_err("refused");
    assert!(e.is_invalid() && e.to_string().contains(':'), "{e}");
}
