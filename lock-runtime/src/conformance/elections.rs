//! Conformance cases of leader election ([`Election`](crate::Election)): campaigns, resigning
//! and succession, bounded campaigns, observation, `lead` after a loss, cancellation and drop.
//! The cases that read the leader from the store check, on a store declared without
//! inspection, that it refuses with `is_invalid()` (see [`inspection_is_offered_as_declared`]).

use std::future::IntoFuture;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::{builder, poll_then_drop, until_parked, Factory, Polled};
use crate::{LeaderInfo, LeaderWatch, LockManager};

/// How long a watch may take to see a change (the longest staleness a built-in store states,
/// with room for a loaded machine).
const SEEN_WITHIN: Duration = Duration::from_secs(10);

/// The next thing `watch` reports, within [`SEEN_WITHIN`].
async fn next(watch: &mut LeaderWatch, what: &str) -> Option<LeaderInfo> {
    match tokio::time::timeout(SEEN_WITHIN, watch.changed()).await {
        Ok(seen) => seen.unwrap_or_else(|e| panic!("watch failed while waiting for {what}: {e}")),
        Err(_) => panic!("the watch did not see {what} within {SEEN_WITHIN:?}"),
    }
}

/// Whether the store of `m` can tell who leads; when not, `leader()` and `observe()` must be
/// refused with `is_invalid()` (checked here), and the caller's case stops.
async fn observable(m: &LockManager) -> bool {
    if m.can_inspect() {
        return true;
    }
    let election = m.election("unobservable");
    let refused = election.leader().await.expect_err("leader() on a store without inspection");
    assert!(refused.is_invalid(), "{refused}");
    let refused = election.observe().changed().await.expect_err("observe() on a store without inspection");
    assert!(refused.is_invalid(), "{refused}");
    eprintln!("skipped: the {} backend cannot tell who leads", m.backend_name());
    false
}

/// The backend offers inspection (what `leader()` and `observe()` read) exactly as its suite
/// declares, so that a broken `inspector()` cannot skip the observation cases unseen.
pub async fn inspection_is_offered_as_declared(make: &impl Factory, declared: bool) {
    let m = make(builder()).await;
    assert_eq!(
        m.can_inspect(),
        declared,
        "the {} backend's inspection differs from its suite's declaration ({declared})",
        m.backend_name()
    );
}

/// A campaign leads; the others queue behind it and are elected one after the other as each
/// leader resigns, in the order they started, each term's token above the last; `leader()`
/// tells who leads with the leading manager's label.
pub async fn campaign_resign_and_succession_in_order(make: &impl Factory) {
    let m = make(builder().default_lease(Duration::from_secs(30)).label("first")).await;
    let election = m.election("succession");
    let first = election.campaign().await.expect("first campaign");
    if observable(&m).await {
        let now = election.leader().await.expect("leader").expect("a leader");
        assert_eq!(now.fencing_token(), Some(first.fencing_token()));
        assert_eq!(now.holder().label(), Some("first"), "{}", now.holder());
        assert_eq!(now.holder().pid(), Some(std::process::id()));
    }
    // Two campaigns of one manager, the second started once the first waits.
    let order = Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut campaigns = Vec::new();
    for label in ["second", "third"] {
        let (election, order) = (election.clone(), order.clone());
        let polled = Polled::new(async move {
            let leadership = election.campaign().await.expect("campaign");
            order.lock().unwrap().push((label, leadership.fencing_token()));
            leadership
        });
        let polls = polled.polls.clone();
        campaigns.push(tokio::spawn(polled));
        until_parked(&polls).await;
    }
    let mut last = first.fencing_token();
    first.resign().await.expect("resign");
    for (i, campaign) in campaigns.into_iter().enumerate() {
        let super::Driven::Done(leadership) = campaign.await.expect("campaign task") else { panic!("dropped") };
        let (label, token) = order.lock().unwrap()[i];
        assert_eq!(label, ["second", "third"][i], "elected out of order: {:?}", order.lock().unwrap());
        assert!(token > last, "term tokens went {last} -> {token}");
        last = token;
        leadership.resign().await.expect("resign");
    }
}

/// A campaign bounded with `wait` gives up with `is_contended()` while someone leads, after
/// about `wait`; once the leader resigns, it is elected.
pub async fn bounded_campaign_is_contended(make: &impl Factory) {
    let m = make(builder().default_lease(Duration::from_secs(30))).await;
    let election = m.election("bounded");
    let leader = election.campaign().await.expect("leader");
    let started = Instant::now();
    let err = election.campaign().wait(Duration::from_millis(300)).await.expect_err("someone leads");
    assert!(err.is_contended(), "{err}");
    assert!(started.elapsed() >= Duration::from_millis(290), "gave up early: {:?}", started.elapsed());
    leader.resign().await.expect("resign");
    let next = election.campaign().wait(Duration::from_secs(10)).await.expect("elected once free");
    next.resign().await.expect("resign");
}

/// A watch reports how it is at once (nobody leads), then every change: a leader (with its
/// manager's label and its token), nobody once it resigns, the next term (a higher token),
/// nobody once that one's leadership is dropped, and nobody once a term's fixed lease runs out. (One manager: a factory may build each
/// manager on a store of its own, as the in-process one does.)
pub async fn observe_sees_every_change(make: &impl Factory) {
    let a = make(builder().default_lease(Duration::from_secs(30)).label("a")).await;
    if !observable(&a).await {
        return;
    }
    let mut watch = a.election("observed").observe();
    assert!(next(&mut watch, "nobody leading").await.is_none());

    let first = a.election("observed").campaign().await.expect("a leads");
    let seen = next(&mut watch, "a's term").await.expect("a leads");
    assert_eq!((seen.holder().label(), seen.fencing_token()), (Some("a"), Some(first.fencing_token())));
    let first_token = first.fencing_token();
    first.resign().await.expect("resign");
    assert!(next(&mut watch, "the end of a's term").await.is_none());

    let second = a.election("observed").campaign().await.expect("a leads again");
    let seen = next(&mut watch, "a's second term").await.expect("a leads");
    assert_eq!((seen.holder().label(), seen.fencing_token()), (Some("a"), Some(second.fencing_token())));
    assert!(second.fencing_token() > first_token);
    drop(second); // resigns in the background
    assert!(next(&mut watch, "the end of the dropped term").await.is_none());

    // A term whose fixed lease runs out, never resigned: the watch sees it end (no store
    // announces that at once; the watch looks again at the lease's end).
    let third = a.election("observed").lease(Duration::from_millis(300)).campaign().await.expect("a leads");
    let seen = next(&mut watch, "a's leased term").await.expect("a leads");
    assert_eq!(seen.fencing_token(), Some(third.fencing_token()));
    assert!(next(&mut watch, "the end of the leased term").await.is_none());
    third.lost().await;
}

/// `lead` runs its body as leader, stops it when leadership is lost (here a fixed term lease
/// runs out), campaigns again and runs a new body under a new term with a higher token,
/// returning that body's output; inside, `current()` gives the election and the term's token.
pub async fn lead_campaigns_again_after_a_loss(make: &impl Factory) {
    let m = make(builder()).await;
    let election = m.election("lead").lease(Duration::from_millis(600));
    let calls = Arc::new(AtomicUsize::new(0));
    let tokens = Arc::new(std::sync::Mutex::new(Vec::new()));
    let (c, t) = (calls.clone(), tokens.clone());
    let out = tokio::time::timeout(
        Duration::from_secs(30),
        election.lead(move |leadership| {
            let (calls, tokens) = (c.clone(), t.clone());
            async move {
                let term = crate::current().expect("inside the term");
                assert_eq!((term.key(), term.fencing_token()), ("lead", leadership.fencing_token()));
                tokens.lock().unwrap().push(leadership.fencing_token());
                if calls.fetch_add(1, Ordering::SeqCst) == 0 {
                    std::future::pending::<()>().await; // stopped by the loss
                }
                leadership.resign().await.map(|()| term.fencing_token())
            }
        }),
    )
    .await
    .expect("lead finished within 30 s")
    .expect("lead");
    let tokens = tokens.lock().unwrap().clone();
    assert_eq!(calls.load(Ordering::SeqCst), 2, "one body stopped by the loss, one run to its end");
    assert!(tokens[1] > tokens[0], "the second term's token {} is not above the first's {}", tokens[1], tokens[0]);
    // Resigned inside the body, or lost (a fixed lease may run out before the resign).
    if let Ok(token) = out {
        assert_eq!(token, tokens[1]);
    }
}

/// A campaign dropped after any of its polls while someone leads leaves nothing behind: once
/// the leader resigns, the next campaign is elected at once.
pub async fn cancelled_campaign_after_any_poll_leaves_nothing(make: &impl Factory) {
    let m = make(builder().default_lease(Duration::from_secs(30))).await;
    let election = m.election("cancelled-campaign");
    let mut leader = election.campaign().await.expect("leader");
    for polls in 1..=64 {
        let (got, parked) = poll_then_drop(election.campaign().into_future(), polls).await;
        assert!(got.is_none(), "a campaign was elected while someone led (poll {polls})");
        let resigned_at = Instant::now();
        leader.resign().await.expect("resign");
        leader = election
            .campaign()
            .wait(Duration::from_secs(10))
            .await
            .unwrap_or_else(|e| panic!("after dropping a campaign at poll {polls}, nobody could lead: {e}"));
        assert!(
            resigned_at.elapsed() < Duration::from_secs(2),
            "after dropping a campaign at poll {polls}, the next election took {:?}",
            resigned_at.elapsed()
        );
        if parked {
            leader.resign().await.expect("resign");
            return;
        }
    }
    panic!("a campaign was still being polled after 64 polls without parking");
}

/// Dropping a `Leadership` resigns: the next campaign is elected well before any lease, and
/// the store tells nobody leads.
pub async fn dropped_leadership_resigns(make: &impl Factory) {
    let m = make(builder().default_lease(Duration::from_secs(30))).await;
    let election = m.election("dropped-leadership");
    drop(election.campaign().await.expect("leader"));
    let started = Instant::now();
    let next = election.campaign().wait(Duration::from_secs(10)).await.expect("elected after the drop");
    assert!(started.elapsed() < Duration::from_secs(3), "took {:?}", started.elapsed());
    drop(next);
    if observable(&m).await {
        let mut watch = election.observe();
        loop {
            if next_leader_is_none(&mut watch).await {
                break;
            }
        }
    }
}

async fn next_leader_is_none(watch: &mut LeaderWatch) -> bool {
    next(watch, "nobody leading after the drop").await.is_none()
}
