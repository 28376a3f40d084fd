//! The Actix-web orders service of `examples` (`examples::orders_actix`, served by the
//! `actix_orders` example), started on free loopback ports and driven over real HTTP.

mod web_support;

use std::net::SocketAddr;

use actix_web::dev::ServerHandle;
use examples::orders::AppState;
use web_support::{gated_state, memory_locks, GateControl};

/// A running app (two workers); stop it with [`App::stop`].
struct App {
    addr: SocketAddr,
    handle: ServerHandle,
}

impl App {
    async fn stop(self) {
        self.handle.stop(false).await;
    }
}

fn start(state: AppState) -> App {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = listener.local_addr().expect("addr");
    let server = examples::orders_actix::server(listener, state).expect("server");
    let handle = server.handle();
    actix_web::rt::spawn(server);
    App { addr, handle }
}

fn start_gated() -> (App, GateControl) {
    let (state, gate) = gated_state(memory_locks());
    (start(state), gate)
}

#[actix_web::test]
async fn burst_on_one_order_pays_once_and_answers_409() {
    let (app, mut gate) = start_gated();
    web_support::burst_on_one_order(app.addr, &mut gate).await;
    app.stop().await;
}

#[actix_web::test]
async fn burst_on_one_article_reserves_once_and_answers_423() {
    let (app, mut gate) = start_gated();
    web_support::burst_on_one_article(app.addr, &mut gate).await;
    app.stop().await;
}

#[actix_web::test]
async fn different_orders_are_paid_in_parallel() {
    let (app, mut gate) = start_gated();
    web_support::different_orders_in_parallel(app.addr, &mut gate).await;
    app.stop().await;
}

#[cfg(feature = "redis")]
#[actix_web::test]
async fn two_instances_on_one_redis_exclude_each_other() {
    let redis = lock_tests::redis_server::RedisServer::start();
    let prefix = lock_tests::unique("orders-actix");
    let (state_a, mut gate_a) = gated_state(web_support::redis_locks(&redis.url(), &prefix).await);
    let (state_b, mut gate_b) = gated_state(web_support::redis_locks(&redis.url(), &prefix).await);
    let (a, b) = (start(state_a), start(state_b));
    web_support::two_instances_exclude_each_other((a.addr, &mut gate_a), (b.addr, &mut gate_b)).await;
    a.stop().await;
    b.stop().await;
}

#[cfg(feature = "redis")]
#[actix_web::test]
async fn redis_outage_answers_503_with_retry_after() {
    let mut redis = lock_tests::redis_server::RedisServer::start();
    let locks = web_support::redis_locks(&redis.url(), &lock_tests::unique("orders-actix")).await;
    let (state, mut gate) = gated_state(locks);
    let app = start(state);
    web_support::backend_outage_answers_503(app.addr, &mut gate, &mut redis).await;
    app.stop().await;
}
