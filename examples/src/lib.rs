//! Runnable examples of `lock-runtime`; see the `examples/` folder of this package.
//!
//! With the `axum` / `actix` features, the orders service of the `axum_orders` and
//! `actix_orders` examples (the tests in `lock-tests` serve the same code). With `metrics`,
//! the Prometheus recorder the Axum service serves at `/metrics`. With `postgres`, the payments
//! ledger those services write through the PostgreSQL fence.
#![warn(missing_docs)]

pub mod bench;
#[cfg(all(feature = "postgres", any(feature = "axum", feature = "actix")))]
pub mod ledger;
#[cfg(feature = "metrics")]
pub mod metrics;
#[cfg(any(feature = "axum", feature = "actix"))]
pub mod orders;
#[cfg(feature = "actix")]
pub mod orders_actix;
#[cfg(feature = "axum")]
pub mod orders_axum;
