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
    ZkEnsemble::start_partitionable_slow_followers(3, 2),
    five: ZkEnsemble::start(5)
);

/// A node's `ctime` (the leader's wall clock when it was created), in ms since the epoch, and
/// the true time then.
async fn leaders_wall_clock(hosts: &str) -> (i64, i64) {
    let client = zookeeper_client::Client::connect(hosts).await.expect("connect a checking client");
    let mode = zookeeper_client::CreateMode::Ephemeral.with_acls(zookeeper_client::Acls::anyone_all());
    let path = format!("/clock-{}", lock_runtime::backend::OwnerId::next());
    let (stat, _) = client.create(&path, b"", &mode).await.expect("create a node");
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).expect("after 1970").as_millis();
    (stat.ctime, i64::try_from(now).expect("ms"))
}

/// The members' wall clocks stepped (an NTP step on each; `lock_tests::server_clock`): the
/// leader's an hour forward and a follower's an hour back (members two hours apart), then both
/// back. ZooKeeper counts sessions on the leader's monotonic clock, so nothing changes: the
/// holder keeps its lock (no `lost()`, another client refused for more than a session after
/// each step), new callers succeed, and the next token is above the holder's. The step is
/// checked to have taken effect: a node created after it carries the leader's `ctime` an hour
/// ahead. Margins: 6 s sessions, watched for 7 s after each step.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clock_the_members_wall_clocks_stepped_change_nothing() {
    use lock_tests::ensemble::Ensemble;
    use std::time::{Duration, Instant};
    let mut zk = ZkEnsemble::start_on_clocks(3);
    let leader = zk.leader();
    let follower = (leader + 1) % zk.size();
    let hosts = zk.hosts();
    let holder = lock_runtime::LockManager::connect(&zk.url_with_first(leader)).await.expect("connect the holder");
    let other = lock_runtime::LockManager::connect(&zk.url_with_first(follower)).await.expect("connect the other");
    let name = lock_tests::unique("member-clock");
    let held = holder.lock(&name).await.expect("holder");
    for (ahead, behind) in [(3600, -3600), (0, 0)] {
        zk.member(leader).clock.as_ref().expect("a clock").set(ahead);
        zk.member(follower).clock.as_ref().expect("a clock").set(behind);
        let (ctime, now) = leaders_wall_clock(&hosts).await;
        let offset = (ctime - now) / 1000;
        assert!((offset - ahead).abs() <= 5, "the leader's clock is {offset} s off, not {ahead} s");
        let stepped = Instant::now();
        while stepped.elapsed() < Duration::from_secs(7) {
            let taken = other.try_lock(&name).await.unwrap_or_else(|e| panic!("clocks {ahead:+}/{behind:+} s: {e}"));
            assert!(taken.is_none(), "clocks {ahead:+}/{behind:+} s: another client took the holder's lock");
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        assert!(!held.is_lost(), "clocks {ahead:+}/{behind:+} s: the holder was told lost()");
        lock_tests::ensemble::new_callers_succeed(&other, "members' clocks stepped").await;
    }
    let token = held.fencing_token();
    held.release().await.expect("the holder releases");
    let next = other.lock(&name).await.expect("the next holder");
    assert!(next.fencing_token() > token, "{} after {token}", next.fencing_token());
    next.release().await.expect("release");
    lock_tests::figure(
        "zookeeper, the leader's wall clock stepped +1 h and a follower's -1 h, then back",
        "lock kept, 0 operations failed",
    );
}

/// Every member's clocks at 11/10 of real time (monotonic included: the leader counts a 6 s
/// session out in 5.45 s) and a holder on a true clock cut from every member: it is still told
/// `lost()` before a client on the majority side is granted its lock (the holder gives up 3/4
/// of the session timeout after its last confirmed sync, so members' clocks up to 4/3 of real
/// time are covered; the margin is reported). The speed is checked first: the leader's wall
/// clock (the `ctime` of nodes it creates) runs more than 1.05 times as fast as the true one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clock_fast_members_clocks_still_tell_a_holder_cut_off_first() {
    let zk = ZkEnsemble::start_partitionable_at_speed(3, 2, 1.1);
    let (ctime, now) = leaders_wall_clock(&zk.hosts()).await;
    tokio::time::sleep(std::time::Duration::from_secs(2)).await;
    let (later_ctime, later) = leaders_wall_clock(&zk.hosts()).await;
    let speed = (later_ctime - ctime) as f64 / (later - now) as f64;
    assert!(speed > 1.05, "the leader's clock runs at {speed:.3} times real time, not 1.1");
    lock_tests::clocks::a_holder_cut_off_from_fast_members_is_told_before_the_majority_grants(
        zk,
        env!("CARGO_BIN_EXE_hold_worker"),
        1.1,
    )
    .await;
}
