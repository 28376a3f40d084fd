//! The Axum orders service of `examples` (`examples::orders_axum`, served by the `axum_orders`
//! example), started on free loopback ports and driven over real HTTP.

mod web_support;

use std::net::SocketAddr;

use examples::orders::AppState;
use web_support::{gated_state, memory_locks, GateControl};

/// A running app; stopped when dropped.
struct App {
    addr: SocketAddr,
    task: tokio::task::JoinHandle<std::io::Result<()>>,
}

impl Drop for App {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn start(state: AppState) -> App {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    App { addr, task: tokio::spawn(examples::orders_axum::serve(listener, state)) }
}

async fn start_gated() -> (App, GateControl) {
    let (state, gate) = gated_state(memory_locks());
    (start(state).await, gate)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn burst_on_one_order_pays_once_and_answers_409() {
    let (app, mut gate) = start_gated().await;
    web_support::burst_on_one_order(app.addr, &mut gate).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn burst_on_one_article_reserves_once_and_answers_423() {
    let (app, mut gate) = start_gated().await;
    web_support::burst_on_one_article(app.addr, &mut gate).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn different_orders_are_paid_in_parallel() {
    let (app, mut gate) = start_gated().await;
    web_support::different_orders_in_parallel(app.addr, &mut gate).await;
}

#[cfg(feature = "redis")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_instances_on_one_redis_exclude_each_other() {
    let redis = lock_tests::redis_server::RedisServer::start();
    let prefix = lock_tests::unique("orders-axum");
    let (state_a, mut gate_a) = gated_state(web_support::redis_locks(&redis.url(), &prefix).await);
    let (state_b, mut gate_b) = gated_state(web_support::redis_locks(&redis.url(), &prefix).await);
    let (a, b) = (start(state_a).await, start(state_b).await);
    web_support::two_instances_exclude_each_other((a.addr, &mut gate_a), (b.addr, &mut gate_b)).await;
}

#[cfg(feature = "redis")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_outage_answers_503_with_retry_after() {
    let mut redis = lock_tests::redis_server::RedisServer::start();
    let locks = web_support::redis_locks(&redis.url(), &lock_tests::unique("orders-axum")).await;
    let (state, mut gate) = gated_state(locks);
    let app = start(state).await;
    web_support::backend_outage_answers_503(app.addr, &mut gate, &mut redis).await;
}

/// The `axum_orders` example with `DATABASE_URL`: payments are recorded in PostgreSQL through
/// the fence of the order's lock; a request whose token is below one a newer holder already
/// recorded is refused with `409` and a problem body, and nothing of it is recorded.
#[cfg(feature = "postgres")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn payments_are_written_through_the_postgres_fence() {
    use std::sync::Arc;
    use std::time::Duration;

    use examples::ledger::Ledger;
    use examples::orders::{Receipt, Shop, Simulated};

    let pg = lock_tests::pg_server::PgServer::start();
    let ledger = Ledger::connect(&pg.url()).await.expect("ledger");
    let shop = Shop::new(Arc::new(Simulated { latency: Duration::ZERO })).with_ledger(ledger);
    let app = start(AppState::with_shop(memory_locks(), shop)).await;
    let (db, connection) = tokio_postgres::connect(&pg.url(), tokio_postgres::NoTls).await.expect("connect");
    tokio::spawn(connection);

    let paid = web_support::pay(app.addr, 5).await;
    assert_eq!(paid.status, 200, "{paid:?}");
    let receipt: Receipt = serde_json::from_str(&paid.body).expect("a receipt");
    let row = db.query_one("SELECT fencing_token FROM payments WHERE order_id = 5", &[]).await.expect("recorded");
    assert_eq!(row.get::<_, i64>(0), receipt.fencing_token as i64);

    // A newer holder of `order:6` (another instance) has already written with a higher token.
    db.query_one("SELECT lock_runtime_fence('order:6', 1000000)", &[]).await.expect("the newer holder");
    let stale = web_support::pay(app.addr, 6).await;
    assert_eq!(stale.status, 409, "{stale:?}");
    assert_eq!(stale.header("content-type"), Some("application/problem+json"));
    let problem: serde_json::Value = serde_json::from_str(&stale.body).expect("a problem");
    assert!(problem["type"].as_str().is_some_and(|t| t.ends_with("#fenced")), "{problem}");
    assert_eq!(problem["lock"], "order:6");
    let rows = db.query("SELECT 1 FROM payments WHERE order_id = 6", &[]).await.expect("query");
    assert!(rows.is_empty(), "nothing of the refused payment is recorded");
}
