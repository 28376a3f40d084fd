//! The etcd backend against three-member clusters (`lock_tests::etcd_cluster`), connected as a
//! user does (`LockManager::connect("etcd://h:p,h:p,h:p")`): the conformance suite, then one
//! member killed, the leader killed, the leader stopped (SIGSTOP) and the quorum lost, each
//! with a holder, a waiter and new callers, and the next operations after it heals.
//!
//! Margins: the cluster's election takes about a second (etcd's default 1 s election timeout);
//! the manager's defaults are a 10 s lease TTL and a 5 s operation bound. The waits below that
//! only guard against a hang are several times those.
#![cfg(feature = "etcd")]
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::OnceLock;
use std::time::Duration;

use lock_runtime::LockManager;
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

/// `etcd://` with member `first` first (the member the manager talks to first), then the others.
fn url_with_first(cluster: &EtcdCluster, first: usize) -> String {
    let mut endpoints = cluster.endpoints();
    endpoints.rotate_left(first);
    let hosts: Vec<&str> = endpoints.iter().map(|e| e.trim_start_matches("http://")).collect();
    format!("etcd://{}", hosts.join(","))
}

/// Ten new lock-and-release calls on fresh names: every one must succeed.
async fn new_callers_succeed(manager: &LockManager, label: &str) {
    for i in 0..10 {
        let name = lock_tests::unique(&format!("{label}-{i}"));
        let guard = manager.lock(&name).wait(Duration::from_secs(10)).await.unwrap_or_else(|e| {
            panic!("{label}: lock {i} failed while the cluster serves: {e}");
        });
        guard.release().await.unwrap_or_else(|e| panic!("{label}: release {i} failed: {e}"));
    }
}

/// One member down (`leader`: the leader, else a follower), the one the manager talks to
/// first: the holder keeps its lock and releases it, the waiter queued before the fault is
/// granted, new callers succeed.
async fn one_member_killed(leader: bool) {
    let mut cluster = EtcdCluster::start(3);
    let victim = if leader { cluster.leader() } else { cluster.follower() };
    let url = url_with_first(&cluster, victim);
    let holder = LockManager::connect(&url).await.expect("holder connects");
    let waiter = LockManager::connect(&url).await.expect("waiter connects");
    let name = lock_tests::unique("member-killed");
    let held = holder.lock(&name).await.expect("holder");
    let queued = {
        let (waiter, name) = (waiter.clone(), name.clone());
        tokio::spawn(async move { waiter.lock(&name).wait(Duration::from_secs(60)).await })
    };
    tokio::time::sleep(Duration::from_millis(300)).await; // the waiter puts its key
    cluster.member(victim).kill();
    cluster.wait_healthy(Duration::from_secs(30));
    let label = if leader { "leader killed" } else { "follower killed" };
    new_callers_succeed(&holder, label).await;
    assert!(!held.is_lost(), "{label}: the holder was told lost() while the majority kept its lease");
    held.release().await.unwrap_or_else(|e| panic!("{label}: the holder's release failed: {e}"));
    let granted = tokio::time::timeout(Duration::from_secs(60), queued).await.expect("the waiter ends").unwrap();
    let granted = granted.unwrap_or_else(|e| panic!("{label}: the waiter failed: {e}"));
    granted.release().await.expect("the waiter releases");
    new_callers_succeed(&waiter, label).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_killed_changes_nothing() {
    one_member_killed(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_leader_killed_changes_nothing_once_a_new_one_is_elected() {
    one_member_killed(true).await;
}

/// The leader stopped (SIGSTOP: its sockets stay open, nothing is answered), the member the
/// manager talks to first: the holder's release succeeds, the waiter (whose `wait` is long) is
/// granted, new callers succeed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_leader_stopped_fails_no_operation_and_no_waiter() {
    let mut cluster = EtcdCluster::start(3);
    let leader = cluster.leader();
    let url = url_with_first(&cluster, leader);
    let holder = LockManager::connect(&url).await.expect("holder connects");
    let waiter = LockManager::connect(&url).await.expect("waiter connects");
    let name = lock_tests::unique("leader-stopped");
    let held = holder.lock(&name).await.expect("holder");
    let queued = {
        let (waiter, name) = (waiter.clone(), name.clone());
        tokio::spawn(async move { waiter.lock(&name).wait(Duration::from_secs(90)).await })
    };
    tokio::time::sleep(Duration::from_millis(300)).await; // the waiter puts its key and watches
    cluster.member(leader).pause();
    // The waiter outlives the stall (its wait is 90 s): nothing is released for a while.
    tokio::time::sleep(Duration::from_secs(8)).await;
    assert!(!queued.is_finished(), "the waiter ended while the lock was held: {:?}", queued.await);
    new_callers_succeed(&holder, "leader stopped").await;
    assert!(!held.is_lost(), "the holder was told lost() while the majority kept its lease");
    held.release().await.unwrap_or_else(|e| panic!("the holder's release failed during the stall: {e}"));
    let granted = tokio::time::timeout(Duration::from_secs(60), queued).await.expect("the waiter ends").unwrap();
    granted.unwrap_or_else(|e| panic!("the waiter failed during the stall: {e}")).release().await.expect("release");
    cluster.member(leader).resume();
    cluster.wait_healthy(Duration::from_secs(30));
    new_callers_succeed(&waiter, "leader resumed").await;
}

/// Two of three members down: the holder is told `lost()`, a new caller fails within its
/// bound with a backend error; once both are back, the next operations succeed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_quorum_lost_fails_within_the_bound_and_heals() {
    let mut cluster = EtcdCluster::start(3);
    let url = cluster.url();
    let manager = LockManager::connect(&url).await.expect("connect");
    let name = lock_tests::unique("quorum");
    let held = manager.lock(&name).await.expect("holder");
    let follower = cluster.follower();
    let leader = cluster.leader();
    cluster.member(follower).kill();
    cluster.member(leader).kill();
    tokio::time::timeout(Duration::from_secs(60), held.lost()).await.expect("lost() fired once the quorum was gone");
    let other = lock_tests::unique("quorum-other");
    let refused = tokio::time::timeout(Duration::from_secs(60), manager.try_lock(&other))
        .await
        .expect("try_lock ends within its bound");
    let err = refused.expect_err("no quorum, no lock");
    assert!(err.is_backend(), "{err}");
    cluster.member(follower).restart();
    cluster.member(leader).restart();
    cluster.wait_healthy(Duration::from_secs(30));
    // The first operation after the healing succeeds (a member still starting is left for
    // another, and the manager's next lease is waited for).
    new_callers_succeed(&manager, "healed").await;
    assert!(held.release().await.expect_err("its lease was lost").is_lost());
}
