//! The ZooKeeper backend against three-member ensembles (`lock_tests::zk_ensemble`), connected
//! as a user does (`LockManager::connect("zookeeper://h:p,h:p,h:p")`): the conformance suite,
//! then the ensemble faults of `lock_tests::ensemble` (a follower killed, the leader killed, the
//! leader stopped, the quorum lost and healed), each on an ensemble of its own.
#![cfg(feature = "zookeeper")]
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::OnceLock;

use lock_tests::zk_ensemble::ZkEnsemble;

/// One ensemble shared by the conformance cases (none of them kills a member).
fn shared() -> &'static ZkEnsemble {
    static CLUSTER: OnceLock<ZkEnsemble> = OnceLock::new();
    CLUSTER.get_or_init(|| ZkEnsemble::start(3))
}

lock_tests::conformance_suite!(
    |builder: lock_runtime::LockManagerBuilder| async move {
        builder.zookeeper(shared().hosts()).await.expect("connect to the test ZooKeeper ensemble")
    },
    kinds = [
        lock_runtime::backend::LockKind::Read,
        lock_runtime::backend::LockKind::Write,
        lock_runtime::backend::LockKind::Semaphore { permits: 1 }
    ],
    inspect = true
);

// The client on the minority side is cut off with a follower that notices only after its
// clients' sessions could have ended on the majority (`start_partitionable_slow_followers`).
lock_tests::ensemble_faults!(
    ZkEnsemble::start(3),
    ZkEnsemble::start_partitionable(3, 2),
    ZkEnsemble::start_partitionable_slow_followers(3, 2)
);
