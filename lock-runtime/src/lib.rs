//! Declarative distributed locks for async Rust.
//!
//! Put [`#[distributed_locked]`](distributed_locked) on an async fn and it runs only while
//! a lock is held, on whatever your system already runs: in-process memory (always
//! available), Redis (feature `redis`), ZooKeeper (feature `zookeeper`).
//!
//! # Quick start: the attribute
//!
//! ```
//! use lock_runtime::{distributed_locked, LockError, LockManager};
//!
//! struct Order { id: u64 }
//!
//! // Waits up to 2 s for `order:<id>`, holds it with a fixed 30 s lease,
//! // tries up to 3 more times when woken, and answers with `busy` when it cannot be taken.
//! #[distributed_locked(name = "order:{order.id}", wait = "2s", lease = "30s", retry = 3, fallback = busy)]
//! async fn settle(order: &Order) -> Result<u64, LockError> {
//!     // Runs only while the lock is held. Hand the fencing token to your store.
//!     Ok(lock_runtime::current().expect("inside").fencing_token())
//! }
//!
//! async fn busy(order: &Order) -> Result<u64, LockError> {
//!     Ok(0) // someone else is settling it
//! }
//!
//! # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), LockError> {
//! lock_runtime::set_default(LockManager::memory()); // or LockManager::redis(url).await?, ...
//! assert!(settle(&Order { id: 42 }).await? > 0);
//! # Ok(()) }
//! ```
//!
//! Every option (`name`, `wait`, `lease`, `retry`, `fallback`, `manager`, `on_lost`, ...) has a
//! section with an example in the [attribute's documentation](distributed_locked).
//!
//! # Without the attribute
//!
//! ```
//! use std::time::Duration;
//! use lock_runtime::LockManager;
//!
//! # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), lock_runtime::LockError> {
//! let manager = LockManager::memory();
//! // A guard: released explicitly, or in the background when dropped.
//! let guard = manager.lock("order:42").wait(Duration::from_secs(2)).await?;
//! // ... exclusive work; pass guard.fencing_token() to downstream stores ...
//! guard.release().await?;
//! // A future run under the lock, as the attribute does (reentrancy and current()).
//! let token = manager.lock("order:42").run(async { lock_runtime::current().map(|l| l.fencing_token()) }).await?;
//! assert!(token.is_some());
//! # Ok(()) }
//! ```
//!
//! # Pieces
//!
//! - [`LockManager`]: takes locks on one backend; [`set_default`] makes one process-wide.
//! - [`LockGuard`]: a held lock, with its fencing token and a [`lost`](LockGuard::lost) signal.
//! - [`LockRequest::run`]: runs a future under a lock, with reentrancy and [`current()`]
//!   (what the attribute expands to).
//! - Lock kinds: [`LockManager::read_lock`] / [`write_lock`](LockManager::write_lock)
//!   (read-write locks), [`LockManager::semaphore`] (permits), both on the in-process backend
//!   today (Redis and ZooKeeper refuse them with an [`is_invalid`](LockError::is_invalid)
//!   error; see [`LockManager::supports`]), and [`LockManager::lock_all`] (several names or
//!   none, in one global order, on every backend); the attribute's `mode`, `permits` and
//!   `names` options.
//! - [`LockError`]: the one error type, classified by `is_*` methods.
//! - [`current()`]: the innermost lock of the running locked call.
//! - [`backend`]: the [`LockBackend`](backend::LockBackend) trait and the backends.
//!
//! # Features
//!
//! - `macros` (default): re-exports the `#[distributed_locked]` attribute.
//! - `redis`: the Redis backend, [`LockManager::redis`] (see [`backend::redis`]).
//! - `zookeeper`: the ZooKeeper backend, [`LockManager::zookeeper`] (see
//!   [`backend::zookeeper`]).
//! - `conformance`: the backend conformance suite ([`conformance`]), to run against a backend
//!   of your own.
//! - `testing`: a testing kit for code that takes locks ([`testing`]): a backend that makes
//!   names busy, attempts fail and held locks lost on demand, and `assert_locked`.
//! - `axum`, `actix`: [`LockError`] converts to an HTTP response by its class (see [`http`]).
#![cfg_attr(docsrs, feature(doc_cfg))]
#![warn(missing_docs)]
#![cfg_attr(not(test), warn(clippy::unwrap_used, clippy::expect_used))]

pub mod backend;
mod bounded;
mod clock;
#[cfg(feature = "conformance")]
#[cfg_attr(docsrs, doc(cfg(feature = "conformance")))]
pub mod conformance;
mod context;
mod error;
mod guard;
pub mod http;
mod kinds;
mod lost;
mod manager;
mod options;
mod run;
#[cfg(feature = "testing")]
#[cfg_attr(docsrs, doc(cfg(feature = "testing")))]
pub mod testing;
mod watchdog;

#[doc(hidden)]
#[path = "private.rs"]
pub mod __private;

pub use context::{current, CurrentLock};
pub use error::{BoxError, LockError};
pub use guard::{LockGuard, ReleaseFuture};
pub use kinds::{KindRequest, LockAllGuard, LockAllRequest, MAX_NAMES};
pub use lost::LostSignal;
pub use manager::{
    default_manager, set_default, LockFuture, LockManager, LockManagerBuilder, LockRequest, DEFAULT_LEASE, DEFAULT_WAIT,
};
pub use options::{LockOptions, MAX_LEASE, MAX_NAME_LEN, MAX_RETRY, MAX_WAIT, MIN_DEFAULT_LEASE, MIN_LEASE};
pub use run::Run;

#[cfg(feature = "macros")]
pub use lock_macros::distributed_locked;
