//! The orders service in Actix-web: `#[distributed_locked]` under `#[post(..)]`.
//!
//! ```text
//! # in memory, on 127.0.0.1:3001 (another address: ORDERS_ADDR=127.0.0.1:8080, or pass it after `--`)
//! cargo run -p examples --features actix --example actix_orders
//!
//! # on Redis, so that several instances share their locks (start two on different ports)
//! REDIS_URL=redis://127.0.0.1:6379 ORDERS_ADDR=127.0.0.1:3001 cargo run -p examples --features actix,redis --example actix_orders
//! REDIS_URL=redis://127.0.0.1:6379 ORDERS_ADDR=127.0.0.1:3003 cargo run -p examples --features actix,redis --example actix_orders
//!
//! # try it: two payments of one order at once; one is charged, the other answers 409 + Retry-After
//! for i in 1 2; do curl -si -X POST localhost:3001/orders/42/pay -H 'content-type: application/json' -d '{"amount_cents":1250}' & done; wait
//! curl -si -X POST localhost:3001/stock/reserve -H 'content-type: application/json' -d '{"sku":"tea-42","quantity":2}'
//! ```
//!
//! The handlers are in `examples/src/orders_actix.rs`; the tests in `tests/tests/web_actix.rs`
//! serve the same app.

use std::sync::Arc;
use std::time::Duration;

use examples::orders::{self, AppState, Simulated};

#[actix_web::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let (addr, locks) = orders::from_env("127.0.0.1:3001").await?;
    let backend = locks.backend_name();
    // The payment provider and the warehouse take a moment, so concurrent requests overlap.
    let shop = orders::shop_from_env(Arc::new(Simulated { latency: Duration::from_millis(500) })).await?;
    let state = AppState::with_shop(locks, shop);
    let listener = std::net::TcpListener::bind(&addr)?;
    println!("actix-web orders service on http://{} (locks: {backend})", listener.local_addr()?);
    examples::orders_actix::server(listener, state)?.await?;
    Ok(())
}
