//! The etcd backend against three-member clusters (`lock_tests::etcd_cluster`), connected as a
//! user does (`LockManager::connect("etcd://h:p,h:p,h:p")`): the conformance suite, then the
//! ensemble faults of `lock_tests::ensemble` (a follower killed, the leader killed, the leader
//! stopped, the quorum lost and healed), each on a cluster of its own.
#![cfg(feature = "etcd")]
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::OnceLock;

use lock_tests::etcd_cluster::EtcdCluster;

/// One cluster shared by the conformance cases (none of them kills a member).
fn shared() -> &'static EtcdCluster {
    static CLUSTER: OnceLock<EtcdCluster> = OnceLock::new();
    CLUSTER.get_or_init(|| EtcdCluster::start(3))
}

lock_tests::conformance_suite!(
    |builder: lock_runtime::LockManagerBuilder| async move {
        builder.etcd(shared().endpoints()).await.expect("connect to the test etcd cluster")
    },
    kinds = [
        lock_runtime::backend::LockKind::Read,
        lock_runtime::backend::LockKind::Write,
        lock_runtime::backend::LockKind::Semaphore { permits: 1 }
    ],
    inspect = true
);

lock_tests::ensemble_faults!(EtcdCluster::start(3), EtcdCluster::start_partitionable(3, 2), five: EtcdCluster::start(5));
