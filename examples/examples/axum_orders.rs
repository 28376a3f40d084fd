//! The orders service in Axum: `#[distributed_locked]` on request handlers.
//!
//! ```text
//! # in memory, on 127.0.0.1:3000 (another address: ORDERS_ADDR=127.0.0.1:8080, or pass it after `--`)
//! cargo run -p examples --features axum --example axum_orders
//!
//! # on Redis, so that several instances share their locks (start two on different ports)
//! REDIS_URL=redis://127.0.0.1:6379 ORDERS_ADDR=127.0.0.1:3000 cargo run -p examples --features axum,redis --example axum_orders
//! REDIS_URL=redis://127.0.0.1:6379 ORDERS_ADDR=127.0.0.1:3002 cargo run -p examples --features axum,redis --example axum_orders
//!
//! # payments recorded in PostgreSQL through the fence (examples::ledger): a request that lost its
//! # order's lock cannot record a payment after a newer holder did (409 Conflict, a problem body)
//! DATABASE_URL=postgres://postgres@127.0.0.1:5432/postgres cargo run -p examples --features axum,postgres --example axum_orders
//!
//! # with the locks' metrics at GET /metrics (Prometheus text format)
//! cargo run -p examples --features axum,metrics --example axum_orders
//! curl -s localhost:3000/metrics
//!
//! # try it: two payments of one order at once; one is charged, the other answers 409 + Retry-After
//! for i in 1 2; do curl -si -X POST localhost:3000/orders/42/pay -H 'content-type: application/json' -d '{"amount_cents":1250}' & done; wait
//! curl -si -X POST localhost:3000/stock/reserve -H 'content-type: application/json' -d '{"sku":"tea-42","quantity":2}'
//! ```
//!
//! The handlers are in `examples/src/orders_axum.rs`; the tests in `tests/tests/web_axum.rs`
//! serve the same router.

use std::sync::Arc;
use std::time::Duration;

use examples::orders::{self, AppState, Simulated};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // Before the manager takes its first lock: it registers its metrics with this recorder.
    #[cfg(feature = "metrics")]
    examples::metrics::install()?;
    let (addr, locks) = orders::from_env("127.0.0.1:3000").await?;
    let backend = locks.backend_name();
    // The payment provider and the warehouse take a moment, so concurrent requests overlap.
    let shop = orders::shop_from_env(Arc::new(Simulated { latency: Duration::from_millis(500) })).await?;
    let state = AppState::with_shop(locks, shop);
    let listener = tokio::net::TcpListener::bind(&addr).await?;
    println!("axum orders service on http://{} (locks: {backend})", listener.local_addr()?);
    examples::orders_axum::serve(listener, state).await?;
    Ok(())
}
