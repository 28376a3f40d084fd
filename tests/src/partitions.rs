//! Real network partitions of a three-member ensemble (etcd, ZooKeeper), on the private
//! network of [`netns`](crate::netns): members and clients in namespaces of their own, links
//! cut by `iptables` (packets dropped, nobody told). Every case here runs its managers on
//! client namespaces, so that what a cut cuts is exactly what the case names.
//!
//! Two shapes:
//! - [`a_minority_cut_off`]: any minority of the ensemble cut away from the rest (the leader
//!   isolated, the leader cut from its peers while its clients still reach it, a follower
//!   isolated, the client cut from the member it talks to (or from two of three), the leader's packets to its peers
//!   dropped one way, a bridge): the targets are those of a member killed, **no operation
//!   fails** (a release sent as the cut happens, new callers), a waiter queued before the cut
//!   outlives it, the holder keeps its lock (no `lost()`), and after healing new callers
//!   succeed. The time from the cut to the first new grant is reported (`figure`).
//! - [`the_client_on_the_minority_side`]: a client left with one member of three, a second
//!   client with the majority waiting for the first one's lock: the first is told `lost()`
//!   before the second is granted (measured, with the margin reported), a new caller on the
//!   minority side fails within its bound with a backend error, and after healing its next
//!   operations succeed.
//!
//! Margins: the ensembles elect within about a second (etcd's defaults; ZooKeeper at a 250 ms
//! tick); the managers' defaults are a lease or session of 6 to 10 s and a 5 s operation bound.

#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)]

use std::future::Future;
use std::time::{Duration, Instant};

use lock_runtime::LockManager;

use crate::ensemble::{first_lock_after, new_callers_succeed, Ensemble};
use crate::netns::{Client, End};

/// Which minority is cut away.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cut {
    /// The leader cut from every member and client (the client talks to it first).
    LeaderIsolated,
    /// The leader cut from both its peers; the client still reaches it and talks to it.
    LeaderCutFromPeers,
    /// A follower cut from every member and client (the client talks to it first).
    FollowerIsolated,
    /// The client cut from the leader, the member it talks to; the ensemble whole.
    ClientCutFromItsMember,
    /// The client cut from two members of three (the leader, which it talks to, and a
    /// follower): it reaches the third only; the ensemble whole.
    ClientSeesOneMember,
    /// Every packet the leader sends its peers dropped; what they send it arrives.
    OneWayFromTheLeader,
    /// The leader and a follower cut from each other; the third member sees both.
    Bridge,
}

impl Cut {
    fn label(self) -> &'static str {
        match self {
            Cut::LeaderIsolated => "leader isolated",
            Cut::LeaderCutFromPeers => "leader cut from its peers",
            Cut::FollowerIsolated => "follower isolated",
            Cut::ClientCutFromItsMember => "client cut from its member",
            Cut::ClientSeesOneMember => "client cut from two members of three",
            Cut::OneWayFromTheLeader => "leader's packets to its peers dropped",
            Cut::Bridge => "bridge",
        }
    }
}

/// Runs `future` on `client` and waits for it.
pub async fn on<T: Send + 'static>(client: &Client, future: impl Future<Output = T> + Send + 'static) -> T {
    client.spawn(future).await.expect("a client task panicked")
}

/// Ten new lock-and-release calls on `client` (see [`new_callers_succeed`]).
async fn new_callers_on(client: &Client, manager: &LockManager, label: String) {
    let manager = manager.clone();
    on(client, async move { new_callers_succeed(&manager, &label).await }).await;
}

/// A minority cut away (see the module's docs): no operation fails, no waiter, no holder.
pub async fn a_minority_cut_off(ensemble: impl Ensemble, cut: Cut) {
    let net = ensemble.net().expect("a partitionable ensemble");
    let size = ensemble.size();
    let leader = ensemble.leader();
    let (follower, third) = ((leader + 1) % size, (leader + 2) % size);
    let first = if cut == Cut::FollowerIsolated { follower } else { leader };
    let label = cut.label();
    let client = net.client(0);
    let holder = ensemble.manager_on(first, Some(&client)).await;
    let waiter = ensemble.manager_on(first, Some(&client)).await;
    let name = crate::unique("partition");
    let held = on(&client, {
        let (holder, name) = (holder.clone(), name.clone());
        async move { holder.lock(&name).await }
    })
    .await
    .expect("holder");
    let other = on(&client, {
        let holder = holder.clone();
        async move { holder.lock(crate::unique("partition-other")).await }
    })
    .await
    .expect("holder of another name");
    let queued = client.spawn({
        let (waiter, name) = (waiter.clone(), name.clone());
        async move { waiter.lock(&name).wait(Duration::from_secs(90)).await }
    });
    // The waiter queues (no signal crosses managers; 300 ms is many round trips here, and a
    // waiter that queues later only makes the case easier).
    tokio::time::sleep(Duration::from_millis(300)).await;

    let cut_at = Instant::now();
    match cut {
        Cut::LeaderIsolated => net.split(&[End::Member(leader)]),
        Cut::LeaderCutFromPeers => {
            net.cut(End::Member(leader), End::Member(follower));
            net.cut(End::Member(leader), End::Member(third));
        }
        Cut::FollowerIsolated => net.split(&[End::Member(follower)]),
        Cut::ClientCutFromItsMember => net.cut(End::Client(0), End::Member(leader)),
        Cut::ClientSeesOneMember => {
            net.cut(End::Client(0), End::Member(leader));
            net.cut(End::Client(0), End::Member(follower));
        }
        Cut::OneWayFromTheLeader => {
            net.cut_one_way(End::Member(leader), End::Member(follower));
            net.cut_one_way(End::Member(leader), End::Member(third));
        }
        Cut::Bridge => net.cut(End::Member(leader), End::Member(follower)),
    }
    on(&client, other.release()).await.unwrap_or_else(|e| panic!("{label}: a release sent at the cut failed: {e}"));
    on(&client, {
        let (holder, label) = (holder.clone(), format!("partition, {label}"));
        async move { first_lock_after(&holder, cut_at, &label).await }
    })
    .await;
    new_callers_on(&client, &holder, format!("{label}: new callers")).await;
    // Longer than the operation bound (5 s) since the cut: a waiter failing at its first look
    // after the cut has failed by now.
    tokio::time::sleep(Duration::from_secs(8).saturating_sub(cut_at.elapsed())).await;
    assert!(!queued.is_finished(), "{label}: the waiter ended while the lock was held: {:?}", queued.await);
    assert!(!held.is_lost(), "{label}: the holder was told lost() while the majority kept its lease");
    on(&client, held.release()).await.unwrap_or_else(|e| panic!("{label}: the holder's release failed: {e}"));
    let granted = tokio::time::timeout(Duration::from_secs(60), queued).await.expect("the waiter ends").unwrap();
    let granted = granted.unwrap_or_else(|e| panic!("{label}: the waiter failed: {e}"));
    on(&client, granted.release()).await.expect("the waiter releases");

    net.heal();
    ensemble.wait_serving();
    new_callers_on(&client, &waiter, format!("{label}: healed")).await;
}

/// A client left with one member of three while a second client, with the majority, waits for
/// its lock (see the module's docs).
pub async fn the_client_on_the_minority_side(ensemble: impl Ensemble) {
    let net = ensemble.net().expect("a partitionable ensemble");
    let leader = ensemble.leader();
    let lonely = (leader + 1) % ensemble.size();
    let (minority, majority) = (net.client(0), net.client(1));
    let holder = ensemble.manager_on(lonely, Some(&minority)).await;
    let other = ensemble.manager_on(leader, Some(&majority)).await;
    let name = crate::unique("minority");
    let held = on(&minority, {
        let (holder, name) = (holder.clone(), name.clone());
        async move { holder.lock(&name).await }
    })
    .await
    .expect("holder");
    let queued = majority.spawn({
        let (other, name) = (other.clone(), name.clone());
        async move {
            let guard = other.lock(&name).wait(Duration::from_secs(120)).await;
            (guard, Instant::now())
        }
    });
    tokio::time::sleep(Duration::from_millis(300)).await; // the waiter queues (see above)

    let cut_at = Instant::now();
    net.split(&[End::Member(lonely), End::Client(0)]);
    let lost = minority.spawn(async move {
        held.lost().await;
        (held, Instant::now())
    });
    let (granted, granted_at) =
        tokio::time::timeout(Duration::from_secs(120), queued).await.expect("the waiter ends").unwrap();
    let granted = granted.unwrap_or_else(|e| panic!("the majority's waiter failed: {e}"));
    let (held, lost_at) =
        tokio::time::timeout(Duration::from_secs(5), lost).await.expect("the holder was told lost()").unwrap();
    assert!(
        lost_at < granted_at,
        "the majority's waiter was granted {} ms after the cut, before the holder was told lost() ({} ms)",
        granted_at.duration_since(cut_at).as_millis(),
        lost_at.duration_since(cut_at).as_millis()
    );
    // A new caller on the minority side fails within its bound, naming the backend.
    let refused = tokio::time::timeout(
        Duration::from_secs(60),
        on(&minority, {
            let holder = holder.clone();
            async move { holder.try_lock(crate::unique("minority-other")).await.map(drop) }
        }),
    )
    .await
    .expect("a try_lock on the minority side ends within its bound");
    let err = refused.expect_err("no majority, no lock");
    assert!(err.is_backend(), "{err}");
    on(&majority, granted.release()).await.expect("the majority's holder releases");

    net.heal();
    ensemble.wait_serving();
    new_callers_on(&minority, &holder, "minority healed".to_owned()).await;
    let released = on(&minority, held.release()).await;
    assert!(released.expect_err("its lease was lost").is_lost());
    crate::figure(
        "partition, client on the minority side",
        &format!(
            "holder told lost() {} ms after the cut, the majority granted {} ms after it ({} ms later)",
            lost_at.duration_since(cut_at).as_millis(),
            granted_at.duration_since(cut_at).as_millis(),
            granted_at.duration_since(lost_at).as_millis()
        ),
    );
}

/// The lease of [`a_redis_primary_cut_off_with_its_clients`]'s managers.
pub const PRIMARY_CUT_LEASE: Duration = Duration::from_secs(3);

/// A Redis primary (member `primary_of(name)` of `net`, for the lock's name) cut off with its clients on its side (Jepsen's
/// Redis Sentinel case; a Redis Cluster's primary alike): a holder on client 0 with the
/// primary, another client on client 1 with the majority, each on a manager `connect` makes
/// (leases of [`PRIMARY_CUT_LEASE`]). Redis cannot keep mutual exclusion here, and this
/// measures what a user gets instead: the majority promotes a replica and the other client's
/// waiter is granted (the majority side stays available), with a token above the holder's
/// (the counter was replicated), so a fenced store refuses the stale holder; the holder is told
/// `lost()`, before or after the grant (reported as `label`: when, and for how long both
/// held), at the latest once the partition heals; then the next operations on both sides
/// succeed, on every primary (the partition held 6 s past the grant, long enough for the
/// retransmissions of a connection whose packets were dropped to back off past a command's
/// bound). Margins: every wait is bounded by 60 s, many times a failover.
pub async fn a_redis_primary_cut_off_with_its_clients<C, F>(
    net: &crate::netns::Net,
    primary_of: impl Fn(&str) -> usize,
    connect: C,
    label: &str,
) where
    C: Fn() -> F,
    F: Future<Output = LockManager> + Send + 'static,
{
    let (minority, majority) = (net.client(0), net.client(1));
    let holder = minority.spawn(connect()).await.expect("client task");
    let other = majority.spawn(connect()).await.expect("client task");
    let name = crate::unique("primary-cut-off");
    let held = on(&minority, {
        let (holder, name) = (holder.clone(), name.clone());
        async move { holder.lock(&name).await }
    })
    .await
    .expect("holder");
    let token = held.fencing_token();
    let queued = majority.spawn({
        let (other, name) = (other.clone(), name.clone());
        async move {
            let guard = other.lock(&name).wait(Duration::from_secs(60)).await;
            (guard, Instant::now())
        }
    });
    tokio::time::sleep(Duration::from_millis(300)).await; // the waiter queues (no signal crosses managers)

    let primary = primary_of(&name);
    // A name on each primary (as the topology is before the cut: the cut primary's slots are
    // its replica's after the failover), so that each side's first locks after the healing go
    // to every primary, the ones its packets were dropped by included.
    let mut names: Vec<(usize, String)> = Vec::new();
    for _ in 0..64 {
        let name = crate::unique("healed");
        let primary = primary_of(&name);
        if !names.iter().any(|(p, _)| *p == primary) {
            names.push((primary, name));
        }
    }
    let cut_at = Instant::now();
    net.split(&[End::Member(primary), End::Client(0)]);
    let lost = minority.spawn(async move {
        held.lost().await;
        (held, Instant::now())
    });
    let (granted, granted_at) = tokio::time::timeout(Duration::from_secs(60), queued).await.expect("granted").unwrap();
    let granted = granted.unwrap_or_else(|e| panic!("{label}: the majority's waiter failed: {e}"));
    assert!(granted.fencing_token() > token, "{label}: {} after {token}", granted.fencing_token());
    // Held on the majority side for a while, the holder's side renewing or failing to, its
    // requests to the majority's nodes dropped: their connections' retransmissions back off
    // (6 s more of the cut: the next one up to 3.2 s away at the healing, past a 1 s command).
    tokio::time::sleep(Duration::from_secs(6)).await;
    let healed_at = Instant::now();
    net.heal();
    let (held, lost_at) = tokio::time::timeout(Duration::from_secs(60), lost)
        .await
        .unwrap_or_else(|_| panic!("{label}: the holder was not told lost() within 60 s of the healing"))
        .unwrap();
    assert!(on(&minority, held.release()).await.expect_err("its lock was taken").is_lost());
    on(&majority, granted.release()).await.expect("the majority's holder releases");
    for (client, manager, side) in [(&minority, &holder, "minority"), (&majority, &other, "majority")] {
        for (primary, name) in &names {
            let (manager, name, primary) = (manager.clone(), name.clone(), *primary);
            let owned = label.to_owned();
            on(client, async move {
                let guard = manager.lock(&name).wait(Duration::from_secs(10)).await;
                let guard = guard.unwrap_or_else(|e| {
                    panic!("{owned}: the {side} side's first lock after healing on primary {primary} failed: {e}")
                });
                guard.release().await
            })
            .await
            .unwrap_or_else(|e| panic!("{label}: the {side} side's release failed: {e}"));
        }
    }
    let ms = |a: Instant, b: Instant| {
        if a >= b {
            format!("{} ms after", a.duration_since(b).as_millis())
        } else {
            format!("{} ms before", b.duration_since(a).as_millis())
        }
    };
    crate::figure(
        &format!("{label}, the primary cut off with its clients"),
        &format!(
            "the majority granted the lock {} ms after the cut; the holder told lost() {} the grant, {} the healing",
            granted_at.duration_since(cut_at).as_millis(),
            ms(lost_at, granted_at),
            ms(lost_at, healed_at)
        ),
    );
}
