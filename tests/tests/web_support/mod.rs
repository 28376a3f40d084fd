//! What `web_axum.rs` and `web_actix.rs` share: a gated upstream that holds a handler inside
//! its lock until the test opens the gate, and the scenarios, driven over real HTTP.
//! The scenarios only see an address: the same assertions hold for both frameworks.

use std::collections::HashSet;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use examples::orders::{AppState, BoxFuture, Receipt, Reservation, Upstream};
use lock_runtime::LockManager;
use lock_tests::http::{post_json, Response, BOUND};
use tokio::sync::{mpsc, watch};

/// How long `/stock/reserve` waits for its lock in these tests (the manager's `default_wait`).
pub(crate) const RESERVE_WAIT: Duration = Duration::from_millis(300);

/// An [`Upstream`] whose calls report that they started (they run under the handler's lock),
/// then wait until the test opens the gate.
struct Gate {
    entered: mpsc::UnboundedSender<String>,
    open: watch::Receiver<bool>,
}

impl Gate {
    async fn pass(&self, what: String) {
        let _ = self.entered.send(what);
        let mut open = self.open.clone();
        let _ = open.wait_for(|open| *open).await;
    }
}

impl Upstream for Gate {
    fn charge(&self, order_id: u64, _amount_cents: u64) -> BoxFuture<'_, String> {
        Box::pin(async move {
            self.pass(format!("order:{order_id}")).await;
            format!("pay_{order_id}")
        })
    }

    fn set_aside<'a>(&'a self, sku: &'a str, _quantity: u32) -> BoxFuture<'a, ()> {
        Box::pin(self.pass(format!("stock:{sku}")))
    }
}

/// The test's side of a [`Gate`].
pub(crate) struct GateControl {
    entered: mpsc::UnboundedReceiver<String>,
    open: watch::Sender<bool>,
}

impl GateControl {
    /// The next call that reached the upstream (so holds its lock), e.g. `"order:7"`.
    pub(crate) async fn entered(&mut self) -> String {
        tokio::time::timeout(BOUND, self.entered.recv())
            .await
            .expect("a handler reached the upstream in time")
            .expect("gate alive")
    }

    /// Asserts that no further call reached the upstream.
    pub(crate) fn assert_no_entry(&mut self) {
        if let Ok(what) = self.entered.try_recv() {
            panic!("a second handler ran under `{what}` while its lock was held");
        }
    }

    /// Lets every call waiting at the gate (and every later one) through.
    pub(crate) fn open(&self) {
        self.open.send_replace(true);
    }
}

/// App state on `locks` whose upstream is a closed gate.
pub(crate) fn gated_state(locks: LockManager) -> (AppState, GateControl) {
    let (entered_tx, entered_rx) = mpsc::unbounded_channel();
    let (open_tx, open_rx) = watch::channel(false);
    let state = AppState::new(locks, Arc::new(Gate { entered: entered_tx, open: open_rx }));
    (state, GateControl { entered: entered_rx, open: open_tx })
}

/// The manager the memory-backed tests use.
pub(crate) fn memory_locks() -> LockManager {
    LockManager::builder().default_wait(RESERVE_WAIT).memory()
}

/// A manager on the Redis server at `url`, for one app instance.
#[cfg(feature = "redis")]
pub(crate) async fn redis_locks(url: &str, prefix: &str) -> LockManager {
    use lock_runtime::backend::redis::{RedisBackend, RedisOptions};
    let options = RedisOptions::default().command_timeout(Duration::from_millis(500));
    let backend = RedisBackend::connect_with(url, options).await.expect("redis backend");
    LockManager::builder().prefix(prefix).default_wait(RESERVE_WAIT).backend(backend)
}

/// `POST /orders/{id}/pay`.
pub(crate) async fn pay(addr: SocketAddr, id: u64) -> Response {
    post_json(addr, &format!("/orders/{id}/pay"), r#"{"amount_cents":1250}"#).await
}

/// `POST /stock/reserve` of one `sku`.
pub(crate) async fn reserve(addr: SocketAddr, sku: &str) -> Response {
    post_json(addr, "/stock/reserve", &format!(r#"{{"sku":"{sku}","quantity":1}}"#)).await
}

/// Starts `n` requests at once; their answers arrive on the returned channel as they come.
fn burst<F>(n: usize, send: impl Fn(usize) -> F) -> mpsc::UnboundedReceiver<Response>
where
    F: std::future::Future<Output = Response> + Send + 'static,
{
    let (tx, rx) = mpsc::unbounded_channel();
    for i in 0..n {
        let (tx, request) = (tx.clone(), send(i));
        tokio::spawn(async move {
            let _ = tx.send(request.await);
        });
    }
    rx
}

async fn next(answers: &mut mpsc::UnboundedReceiver<Response>) -> Response {
    tokio::time::timeout(BOUND, answers.recv()).await.expect("an answer in time").expect("requests alive")
}

/// The next answer, failing at once if meanwhile another handler reaches the upstream (which
/// means it ran under a lock that should have been held by someone else).
async fn next_while_held(answers: &mut mpsc::UnboundedReceiver<Response>, gate: &mut GateControl) -> Response {
    tokio::select! {
        answer = next(answers) => answer,
        what = gate.entered() => panic!("a second handler ran under `{what}` while its lock was held"),
    }
}

fn receipt(answer: &Response) -> Receipt {
    assert_eq!(answer.status, 200, "{answer:?}");
    serde_json::from_str(&answer.body).expect("a receipt")
}

/// Requests in one burst.
const BURST: usize = 8;

/// A burst of payments of one order: exactly one is charged; every other request is answered
/// `409 Conflict` + `Retry-After` by the fallback while the first still holds the lock.
pub(crate) async fn burst_on_one_order(addr: SocketAddr, gate: &mut GateControl) {
    let mut answers = burst(BURST, |_| pay(addr, 7));
    // One request took `order:7` and is held inside the payment provider until the gate opens.
    assert_eq!(gate.entered().await, "order:7");
    // All the others are answered while it is held there: the burst provably overlapped.
    for _ in 1..BURST {
        let answer = next_while_held(&mut answers, gate).await;
        assert_eq!(answer.status, 409, "{answer:?}");
        assert_eq!(answer.header("retry-after"), Some("1"), "{answer:?}");
        assert!(answer.body.contains("order 7 is being paid"), "{answer:?}");
    }
    gate.assert_no_entry();
    gate.open();
    let paid = receipt(&next(&mut answers).await);
    assert_eq!((paid.order_id, paid.payment_id.as_str(), paid.already_paid), (7, "pay_7", false));
    // The lock is free again: a later payment takes it and finds the order paid.
    let again = receipt(&pay(addr, 7).await);
    assert!(again.already_paid, "{again:?}");
}

/// A burst of reservations of one article: exactly one goes through; every other request waits
/// up to the manager's `default_wait` and is answered `423 Locked` + `Retry-After` by
/// `LockError`'s own response, while the first still holds the lock.
pub(crate) async fn burst_on_one_article(addr: SocketAddr, gate: &mut GateControl) {
    let mut answers = burst(BURST, |_| reserve(addr, "mug-7"));
    assert_eq!(gate.entered().await, "stock:mug-7");
    for _ in 1..BURST {
        let answer = next_while_held(&mut answers, gate).await;
        assert_eq!(answer.status, 423, "{answer:?}");
        assert_eq!(answer.header("retry-after"), Some("1"), "{answer:?}");
        assert!(answer.body.contains("stock:mug-7"), "the body names the lock: {answer:?}");
    }
    gate.assert_no_entry();
    gate.open();
    let answer = next(&mut answers).await;
    assert_eq!(answer.status, 200, "{answer:?}");
    let reserved: Reservation = serde_json::from_str(&answer.body).expect("a reservation");
    assert_eq!((reserved.sku.as_str(), reserved.quantity, reserved.left), ("mug-7", 1, 19));
}

/// Payments of different orders hold their locks at the same time.
pub(crate) async fn different_orders_in_parallel(addr: SocketAddr, gate: &mut GateControl) {
    let ids = [11, 12, 13, 14];
    let mut answers = burst(ids.len(), |i| pay(addr, ids[i]));
    // Every one of them is inside the (closed) gate at once, each under its own lock.
    let mut inside = HashSet::new();
    for _ in ids {
        inside.insert(gate.entered().await);
    }
    assert_eq!(inside, ids.iter().map(|id| format!("order:{id}")).collect());
    gate.open();
    let mut paid = HashSet::new();
    for _ in ids {
        let receipt = receipt(&next(&mut answers).await);
        assert!(!receipt.already_paid);
        paid.insert(receipt.order_id);
    }
    assert_eq!(paid, ids.into_iter().collect());
}

/// Two instances of the app, each with its own manager on one Redis: while instance A pays an
/// order, instance B's payment of it is answered 409; B pays other orders meanwhile; once A is
/// done, B takes the lock, with a greater fencing token.
#[cfg(feature = "redis")]
pub(crate) async fn two_instances_exclude_each_other(
    (a, gate_a): (SocketAddr, &mut GateControl),
    (b, gate_b): (SocketAddr, &mut GateControl),
) {
    gate_b.open();
    let mut answers = burst(1, |_| pay(a, 9));
    assert_eq!(gate_a.entered().await, "order:9");

    let answer = pay(b, 9).await;
    assert_eq!(answer.status, 409, "B sees A's lock: {answer:?}");
    assert_eq!(answer.header("retry-after"), Some("1"), "{answer:?}");
    gate_b.assert_no_entry();
    let other = receipt(&pay(b, 10).await);
    assert_eq!(gate_b.entered().await, "order:10");
    assert_eq!(other.order_id, 10);

    gate_a.open();
    let first = receipt(&next(&mut answers).await);
    assert_eq!(first.order_id, 9);
    let second = receipt(&pay(b, 9).await);
    assert_eq!(gate_b.entered().await, "order:9");
    assert!(
        second.fencing_token > first.fencing_token,
        "one fencing sequence across instances: {first:?} then {second:?}"
    );
}

/// The lock backend down: `/stock/reserve` (no fallback) answers `503 Service Unavailable` +
/// `Retry-After` by `LockError`'s own response; `/orders/{id}/pay` answers with its fallback,
/// which runs whatever the reason the lock could not be taken.
#[cfg(feature = "redis")]
pub(crate) async fn backend_outage_answers_503(
    addr: SocketAddr,
    gate: &mut GateControl,
    redis: &mut lock_tests::redis_server::RedisServer,
) {
    gate.open();
    let answer = reserve(addr, "tea-42").await;
    assert_eq!(answer.status, 200, "{answer:?}");
    assert_eq!(gate.entered().await, "stock:tea-42");

    redis.kill();
    let answer = reserve(addr, "tea-42").await;
    assert_eq!(answer.status, 503, "{answer:?}");
    assert_eq!(answer.header("retry-after"), Some("1"), "{answer:?}");
    assert!(answer.body.contains("stock:tea-42"), "{answer:?}");
    let answer = pay(addr, 5).await;
    assert_eq!(answer.status, 409, "{answer:?}");
    gate.assert_no_entry();
}
