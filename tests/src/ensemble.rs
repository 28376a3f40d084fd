//! The faults of a three-member ensemble, the same for every store that runs as one (etcd,
//! ZooKeeper): one member killed (a follower, the leader), the leader stopped (SIGSTOP: its
//! sockets stay open, nothing is answered), and the quorum lost then healed, each with a
//! holder, a waiter queued before the fault and new callers, connected as a user does
//! (`LockManager::connect(url)` with every member's address).
//!
//! Each store's test binary gives its fixture ([`Ensemble`]) and runs these cases.
//!
//! Margins: an ensemble elects a leader in about a second; the managers' defaults are a lease
//! or session of 6 to 10 s and a 5 s operation bound. The waits below that only guard against
//! a hang are several times those.

#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)]
// The trait serves this crate's tests only, on their own runtimes: no `Send` bound is needed.
#![allow(async_fn_in_trait)]

use std::time::Duration;

use lock_runtime::{LockError, LockGuard, LockManager};

use crate::netns::{Client, Net};
use crate::server_process::ServerProcess;

/// An ensemble a fault case drives: its members by index.
pub trait Ensemble {
    /// The URL for `LockManager::connect` with member `first` first (the member the client
    /// talks to first), then the others.
    fn url_with_first(&self, first: usize) -> String;
    /// The index of the leader (waiting until there is one).
    fn leader(&self) -> usize;
    /// Member `i`'s server process.
    fn process(&mut self, i: usize) -> &mut ServerProcess;
    /// SIGKILL of member `i`.
    fn kill(&mut self, i: usize) {
        self.process(i).kill();
    }
    /// Member `i` started again on its data.
    fn restart(&mut self, i: usize) {
        self.process(i).restart();
    }
    /// SIGSTOP of member `i`.
    fn pause(&mut self, i: usize) {
        self.process(i).pause();
    }
    /// SIGCONT of member `i`.
    fn resume(&mut self, i: usize) {
        self.process(i).resume();
    }
    /// Waits until every running member serves with a leader.
    fn wait_serving(&self);
    /// How many members.
    fn size(&self) -> usize;
    /// The private network of a partitionable ensemble.
    fn net(&self) -> Option<&Net>;
    /// The URL the leader-stopped case connects with, member `first` first: by default
    /// [`url_with_first`](Self::url_with_first); a store whose sessions outlive an election
    /// only when they are long enough beside the time the followers take to notice says so here.
    fn url_through_a_leader_stall(&self, first: usize) -> String {
        self.url_with_first(first)
    }
    /// A manager whose connection is on member `i` (the member it talks to first), made on
    /// `client` (its sockets in the client's namespace) or, without one, on the caller's runtime.
    async fn manager_on(&self, i: usize, client: Option<&Client>) -> LockManager {
        self.manager_at(self.url_with_first(i), i, client).await
    }
    /// [`manager_on`](Self::manager_on) connected with `url`, a URL that lists member `i` first.
    async fn manager_at(&self, url: String, _i: usize, client: Option<&Client>) -> LockManager {
        connect_on(url, client).await
    }
}

/// `LockManager::connect(url)` on `client`, or on the caller's runtime.
pub async fn connect_on(url: String, client: Option<&Client>) -> LockManager {
    match client {
        Some(client) => client.spawn(async move { LockManager::connect(&url).await }).await.expect("client task"),
        None => LockManager::connect(&url).await,
    }
    .expect("connect")
}

impl Ensemble for crate::etcd_cluster::EtcdCluster {
    fn url_with_first(&self, first: usize) -> String {
        let mut endpoints = self.endpoints();
        endpoints.rotate_left(first);
        let hosts: Vec<&str> = endpoints.iter().map(|e| e.trim_start_matches("http://")).collect();
        format!("etcd://{}", hosts.join(","))
    }
    fn leader(&self) -> usize {
        crate::etcd_cluster::EtcdCluster::leader(self)
    }
    fn process(&mut self, i: usize) -> &mut ServerProcess {
        &mut self.member(i).process
    }
    fn wait_serving(&self) {
        self.wait_healthy(Duration::from_secs(60));
    }
    fn size(&self) -> usize {
        crate::etcd_cluster::EtcdCluster::size(self)
    }
    fn net(&self) -> Option<&Net> {
        crate::etcd_cluster::EtcdCluster::net(self)
    }
}

impl Ensemble for crate::zk_ensemble::ZkEnsemble {
    fn url_with_first(&self, first: usize) -> String {
        format!("zookeeper://{}", self.hosts_with_first(first))
    }
    fn leader(&self) -> usize {
        crate::zk_ensemble::ZkEnsemble::leader(self)
    }
    fn process(&mut self, i: usize) -> &mut ServerProcess {
        &mut self.member(i).process
    }
    fn wait_serving(&self) {
        crate::zk_ensemble::ZkEnsemble::wait_serving(self, Duration::from_secs(60));
    }
    fn size(&self) -> usize {
        crate::zk_ensemble::ZkEnsemble::size(self)
    }
    fn net(&self) -> Option<&Net> {
        crate::zk_ensemble::ZkEnsemble::net(self)
    }
    /// Followers notice a stopped leader after `syncLimit` ticks (2.5 s here), and a session
    /// outlives the election when it is confirmed again within 5/8 of its timeout (3.75 s for
    /// the default 6 s: too near on a loaded machine, where the election and the reconnection
    /// took the rest of it and a CI run saw the session lost). 10 s sessions leave 6.25 s, 3.75 s
    /// above the followers' 2.5 s: the margin the backend's documentation asks for.
    fn url_through_a_leader_stall(&self, first: usize) -> String {
        format!("{}?session_timeout=10s", self.url_with_first(first))
    }
    /// The client picks a member at random: managers are connected until one lands on member
    /// `i` (its count of client connections goes up), the others dropped.
    async fn manager_at(&self, url: String, i: usize, client: Option<&Client>) -> LockManager {
        for _ in 0..30 {
            let before = self.connections(i);
            let manager = connect_on(url.clone(), client).await;
            if self.connections(i) > before {
                return manager;
            }
        }
        panic!("no manager's session landed on member {i} in 30 tries");
    }
}

/// A lock of a fresh name right after a fault that began at `fault_at`, released: it must
/// succeed; reports (`figure`, as `<store>, <label>`) and returns the time from the fault to
/// its grant.
pub async fn first_lock_after(manager: &LockManager, fault_at: std::time::Instant, label: &str) -> Duration {
    let guard = manager.lock(crate::unique("first-after")).wait(Duration::from_secs(30)).await;
    let recovery = fault_at.elapsed();
    let guard = guard.unwrap_or_else(|e| panic!("{label}: the first new lock failed: {e}"));
    guard.release().await.unwrap_or_else(|e| panic!("{label}: its release failed: {e}"));
    let store = manager.backend_name();
    crate::figure(
        &format!("{store}, {label}"),
        &format!("first new lock granted {} ms after the fault", recovery.as_millis()),
    );
    recovery
}

/// Ten new lock-and-release calls on fresh names: every one must succeed.
pub async fn new_callers_succeed(manager: &LockManager, label: &str) {
    for i in 0..10 {
        let name = crate::unique(&format!("{label}-{i}"));
        let guard = manager.lock(&name).wait(Duration::from_secs(10)).await.unwrap_or_else(|e| {
            panic!("{label}: lock {i} failed while the ensemble serves: {e}");
        });
        guard.release().await.unwrap_or_else(|e| panic!("{label}: release {i} failed: {e}"));
    }
}

type Waiter = tokio::task::JoinHandle<Result<LockGuard, LockError>>;

/// A holder and a waiter queued behind it, each on its own manager connected to `url`.
async fn holder_and_waiter(url: &str, label: &str, wait: Duration) -> (LockManager, LockManager, LockGuard, Waiter) {
    let holder = LockManager::connect(url).await.expect("holder connects");
    let waiter = LockManager::connect(url).await.expect("waiter connects");
    let name = crate::unique(label);
    let held = holder.lock(&name).await.expect("holder");
    let queued = {
        let (waiter, name) = (waiter.clone(), name.clone());
        tokio::spawn(async move { waiter.lock(&name).wait(wait).await })
    };
    // The waiter queues (no signal crosses managers; 300 ms is many round trips on loopback,
    // and a waiter that queues later only makes the case easier).
    tokio::time::sleep(Duration::from_millis(300)).await;
    (holder, waiter, held, queued)
}

/// One member killed (`leader`: the leader, else a follower), the one the managers talk to
/// first: the holder keeps its lock (no `lost()`) and releases it, the waiter queued before the
/// fault is granted, new callers succeed.
pub async fn one_member_killed(ensemble: impl Ensemble, leader: bool) {
    let victim = if leader { ensemble.leader() } else { (ensemble.leader() + 1) % ensemble.size() };
    let label = if leader { "leader killed" } else { "follower killed" };
    members_killed(ensemble, &[victim], label).await;
}

/// The largest minority killed at once, the leader first (two of five): as
/// [`one_member_killed`], the managers talking to the leader first.
pub async fn the_largest_minority_killed(ensemble: impl Ensemble) {
    let (size, leader) = (ensemble.size(), ensemble.leader());
    let victims: Vec<usize> = (0..size.saturating_sub(1) / 2).map(|k| (leader + k) % size).collect();
    let label = format!("{} of {size} killed, the leader with them", victims.len());
    members_killed(ensemble, &victims, &label).await;
}

/// `victims` killed at once (a minority), the managers talking to the first one first: the
/// holder keeps its lock (no `lost()`) and releases it, the waiter queued before the fault is
/// granted, new callers succeed.
async fn members_killed(mut ensemble: impl Ensemble, victims: &[usize], label: &str) {
    let url = ensemble.url_with_first(victims[0]);
    let (holder, waiter, held, queued) = holder_and_waiter(&url, "member-killed", Duration::from_secs(60)).await;
    let fault_at = std::time::Instant::now();
    for &victim in victims {
        ensemble.kill(victim);
    }
    ensemble.wait_serving();
    first_lock_after(&holder, fault_at, label).await;
    new_callers_succeed(&holder, label).await;
    assert!(!held.is_lost(), "{label}: the holder was told lost() while the majority kept its lease");
    held.release().await.unwrap_or_else(|e| panic!("{label}: the holder's release failed: {e}"));
    let granted = tokio::time::timeout(Duration::from_secs(60), queued).await.expect("the waiter ends").unwrap();
    let granted = granted.unwrap_or_else(|e| panic!("{label}: the waiter failed: {e}"));
    granted.release().await.expect("the waiter releases");
    new_callers_succeed(&waiter, label).await;
}

/// The leader stopped (SIGSTOP), the member the managers talk to: a release sent at once
/// succeeds, the waiter (whose `wait` is long) outlives the stall, new callers succeed, the
/// holder's later release succeeds and the waiter is granted; after SIGCONT, new callers
/// succeed. The managers connect with [`Ensemble::url_through_a_leader_stall`].
pub async fn the_leader_stopped(mut ensemble: impl Ensemble) {
    let leader = ensemble.leader();
    let url = ensemble.url_through_a_leader_stall(leader);
    let holder = ensemble.manager_at(url.clone(), leader, None).await;
    let waiter = ensemble.manager_at(url, leader, None).await;
    let name = crate::unique("leader-stopped");
    let held = holder.lock(&name).await.expect("holder");
    let other = holder.lock(crate::unique("leader-stopped-other")).await.expect("holder of another");
    let queued = {
        let (waiter, name) = (waiter.clone(), name.clone());
        tokio::spawn(async move { waiter.lock(&name).wait(Duration::from_secs(90)).await })
    };
    tokio::time::sleep(Duration::from_millis(300)).await; // the waiter queues (see above)
    let fault_at = std::time::Instant::now();
    ensemble.pause(leader);
    other.release().await.unwrap_or_else(|e| panic!("a release sent as the leader stopped failed: {e}"));
    first_lock_after(&holder, fault_at, "leader stopped").await;
    // Longer than the operation bound (5 s): a waiter failing at its first look after the
    // stall fails by now.
    tokio::time::sleep(Duration::from_secs(8)).await;
    assert!(!queued.is_finished(), "the waiter ended while the lock was held: {:?}", queued.await);
    new_callers_succeed(&holder, "leader stopped").await;
    assert!(!held.is_lost(), "the holder was told lost() while the majority kept its lease");
    held.release().await.unwrap_or_else(|e| panic!("the holder's release failed during the stall: {e}"));
    let granted = tokio::time::timeout(Duration::from_secs(60), queued).await.expect("the waiter ends").unwrap();
    granted.unwrap_or_else(|e| panic!("the waiter failed during the stall: {e}")).release().await.expect("release");
    ensemble.resume(leader);
    ensemble.wait_serving();
    new_callers_succeed(&waiter, "leader resumed").await;
}

/// A majority killed (two of three, three of five), the leader with them: the holder is told
/// `lost()`, a new caller fails within its bound with a backend error; once they are back, the
/// next operations succeed, and the holder's release says its lock was lost.
pub async fn the_quorum_lost_and_healed(mut ensemble: impl Ensemble) {
    let manager = LockManager::connect(&ensemble.url_with_first(0)).await.expect("connect");
    let held = manager.lock(crate::unique("quorum")).await.expect("holder");
    let (size, leader) = (ensemble.size(), ensemble.leader());
    // Followers first, then the leader.
    let victims: Vec<usize> = (1..=size / 2).map(|k| (leader + k) % size).chain([leader]).collect();
    for &victim in &victims {
        ensemble.kill(victim);
    }
    tokio::time::timeout(Duration::from_secs(60), held.lost()).await.expect("lost() fired once the quorum was gone");
    let refused = tokio::time::timeout(Duration::from_secs(60), manager.try_lock(crate::unique("quorum-other")))
        .await
        .expect("try_lock ends within its bound");
    let err = refused.expect_err("no quorum, no lock");
    assert!(err.is_backend(), "{err}");
    for &victim in &victims {
        ensemble.restart(victim);
    }
    ensemble.wait_serving();
    // The first operation after the healing succeeds.
    new_callers_succeed(&manager, "healed").await;
    assert!(held.release().await.expect_err("its lease was lost").is_lost());
}

/// The four fault cases above, the partitions of [`partitions`](crate::partitions) and the
/// clock faults of [`clocks`](crate::clocks) (with this package's `hold_worker`), as
/// tests of the calling binary, each on an ensemble of its own: `$start` makes a fresh
/// three-member ensemble, `$partitionable` one on a private network with two clients,
/// `$minority` (if given; else `$partitionable`) the one the minority-side case runs on, and
/// `$five` a five-member one, on which two members are killed with the leader (the largest
/// minority) and then three (the quorum).
#[macro_export]
macro_rules! ensemble_faults {
    ($start:expr, $partitionable:expr, five: $five:expr) => {
        $crate::ensemble_faults!($start, $partitionable, $partitionable, five: $five);
    };
    ($start:expr, $partitionable:expr, $minority:expr, five: $five:expr) => {
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn five_members_two_killed_with_the_leader_change_nothing() {
            $crate::ensemble::the_largest_minority_killed($five).await;
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn five_members_three_killed_fail_within_the_bound_and_heal() {
            $crate::ensemble::the_quorum_lost_and_healed($five).await;
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn a_follower_killed_changes_nothing() {
            $crate::ensemble::one_member_killed($start, false).await;
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn the_leader_killed_changes_nothing_once_a_new_one_is_elected() {
            $crate::ensemble::one_member_killed($start, true).await;
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn the_leader_stopped_fails_no_operation_and_no_waiter() {
            $crate::ensemble::the_leader_stopped($start).await;
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn the_quorum_lost_fails_within_the_bound_and_heals() {
            $crate::ensemble::the_quorum_lost_and_healed($start).await;
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn partition_the_leader_isolated_fails_nothing() {
            $crate::partitions::a_minority_cut_off($partitionable, $crate::partitions::Cut::LeaderIsolated).await;
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn partition_the_leader_cut_from_its_peers_fails_nothing() {
            $crate::partitions::a_minority_cut_off($partitionable, $crate::partitions::Cut::LeaderCutFromPeers).await;
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn partition_a_follower_isolated_fails_nothing() {
            $crate::partitions::a_minority_cut_off($partitionable, $crate::partitions::Cut::FollowerIsolated).await;
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn partition_the_client_cut_from_its_member_fails_nothing() {
            $crate::partitions::a_minority_cut_off($partitionable, $crate::partitions::Cut::ClientCutFromItsMember)
                .await;
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn partition_the_client_cut_from_two_members_of_three_fails_nothing() {
            $crate::partitions::a_minority_cut_off($partitionable, $crate::partitions::Cut::ClientSeesOneMember).await;
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn partition_one_way_from_the_leader_fails_nothing() {
            $crate::partitions::a_minority_cut_off($partitionable, $crate::partitions::Cut::OneWayFromTheLeader).await;
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn partition_a_bridge_fails_nothing() {
            $crate::partitions::a_minority_cut_off($partitionable, $crate::partitions::Cut::Bridge).await;
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn contention_under_minority_faults_keeps_exclusion_and_fails_nothing_outside_them() {
            $crate::contention::contention_under_faults($partitionable).await;
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn clock_a_holders_wall_clock_stepped_changes_nothing() {
            $crate::clocks::the_wall_clock_of_a_holder_jumps($partitionable, env!("CARGO_BIN_EXE_hold_worker")).await;
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn clock_a_slow_holder_cut_off_is_told_lost_first() {
            $crate::clocks::a_slow_holder_clock_is_told_before_the_majority_grants(
                $partitionable,
                env!("CARGO_BIN_EXE_hold_worker"),
            )
            .await;
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn partition_the_client_on_the_minority_side_is_told_lost_first() {
            $crate::partitions::the_client_on_the_minority_side($minority).await;
        }
    };
}
