//! Declarative distributed locks for async Rust.
//!
//! Put [`#[distributed_locked]`][distributed_locked] on an async fn and it runs only while
//! a lock is held, on whatever your system already runs: in-process memory and lock files of
//! one host ([`LockManager::file`]) (always available), Redis (feature `redis`), ZooKeeper
//! (feature `zookeeper`), PostgreSQL (feature `postgres`), MySQL/MariaDB (feature `mysql`),
//! etcd (feature `etcd`). With the feature `tls` (rustls on ring), the Redis, PostgreSQL, MySQL
//! and etcd backends connect over TLS (mutual TLS included) with `TlsOptions`; with
//! `tls-aws-lc` (rustls on aws-lc-rs) ZooKeeper too. Pick one: each gives one crypto library.
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
//! section with an example in the [attribute's documentation][distributed_locked].
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
//! - [`LockRequest::run`]: runs a future under a lock, with reentrancy and [`current()`]; the
//!   same engine in two steps, [`Locked`] (take the lock, then give the body), is what the
//!   attribute expands to.
//! - Lock kinds: [`LockManager::read_lock`] / [`write_lock`](LockManager::write_lock)
//!   (read-write locks), [`LockManager::semaphore`] (permits), both on memory, Redis,
//!   ZooKeeper, etcd and PostgreSQL (a backend that does not offer them refuses them with an
//!   [`is_invalid`](LockError::is_invalid) error; see [`LockManager::supports`]), and [`LockManager::lock_all`] (several names or
//!   none, in one global order, on every backend); the attribute's `mode`, `permits` and
//!   `names` options.
//! - [`Election`] ([`LockManager::election`]): leader election on any store, each term
//!   fenced by its own token: [`campaign`](Election::campaign) for a [`Leadership`],
//!   [`lead`](Election::lead) for a singleton worker (the attribute's `leader`),
//!   [`leader`](Election::leader) and [`observe`](Election::observe) to follow who leads.
//! - [`LockManager::inspect`] and [`list`](LockManager::list): who holds a lock, as the store
//!   tells it (what `lockctl` prints).
//! - [`LockError`]: the one error type, classified by `is_*` methods.
//! - [`current()`]: the innermost lock of the running locked call.
//! - [`fence`]: fencing enforced downstream: the store refuses a stale holder's write
//!   (PostgreSQL, Redis, HTTP services), a refusal being [`is_fenced`](LockError::is_fenced).
//! - [`backend`]: the [`LockBackend`](backend::LockBackend) trait and the backends, and the
//!   [`Inspect`](backend::Inspect) capability that inspection tools (`lockctl`) use.
//!
//! # Features
//!
//! - `macros` (default): re-exports the `#[distributed_locked]` attribute.
//! - `redis`: the Redis backend, [`LockManager::redis`] (see [`backend::redis`]).
//! - `zookeeper`: the ZooKeeper backend, [`LockManager::zookeeper`] (see
//!   [`backend::zookeeper`]).
//! - `postgres`: the PostgreSQL backend, [`LockManager::postgres`] (see
//!   [`backend::postgres`]).
//! - `mysql`: the MySQL/MariaDB backend, [`LockManager::mysql`] (see [`backend::mysql`]).
//! - `etcd`: the etcd backend, [`LockManager::etcd`] (see [`backend::etcd`]); building it
//!   needs `protoc` (`apt-get install protobuf-compiler libprotobuf-dev`).
//! - `conformance`: the backend conformance suite ([`conformance`]), to run against a backend
//!   of your own.
//! - `testing`: a testing kit for code that takes locks ([`testing`]): a backend that makes
//!   names busy, attempts fail and held locks lost on demand, and `assert_locked`.
//! - `axum`, `actix`: [`LockError`] converts to an HTTP response by its class (see [`http`]).
//! - `metrics`: metrics through the [`metrics`](https://docs.rs/metrics) facade (see
//!   [Telemetry](#telemetry)); without it, nothing of them is compiled.
//!
//! # Telemetry
//!
//! **Tracing.** Every acquisition is a `lock.acquire` span and every held lock a `lock.hold`
//! span, both at `debug` and both created in the caller's context, so they are children of the
//! caller's current span (a handler's `#[tracing::instrument]` span, say):
//!
//! - `lock.acquire`, from the first poll of the request to its outcome: `lock` (the name),
//!   `backend`, `wait_ms`, `lease` (`renewed` or `fixed`), `lease_ms`, `attempts`, `outcome`
//!   (`acquired`, `contended`, `error`, `invalid`, or `cancelled` when the request was dropped)
//!   and, once granted, `fencing_token`;
//! - `lock.hold`, from the grant to the release (or the drop of the guard): `lock`, `backend`,
//!   `fencing_token`. Renewals that fail are `debug` events in it, and a loss a `warn` event.
//!   The body of [`LockRequest::run`] and of a `#[distributed_locked]` fn runs inside it, so
//!   its own spans and events nest under the lock.
//!
//! Nothing above `debug` is emitted while all goes well. `warn` is kept for what needs a look:
//! a lock lost while held (one event per lock, with the reason), a fallback called because of
//! a backend error (not because the lock was busy), a release that failed. With no subscriber
//! interested in `debug`, a span costs one relaxed atomic load.
//!
//! Lock names may carry personal data (`user:{email}`):
//! [`LockManagerBuilder::telemetry_names`] shows them hashed or not at all
//! ([`TelemetryNames`]), in spans, events (error messages included) and metric labels. Events
//! that belong to no manager (an error answered over HTTP, a backend's own events) follow the
//! strictest setting of the managers built in the process.
//!
//! **Metrics** (feature `metrics`), through the [`metrics`](https://docs.rs/metrics) facade:
//! install a recorder (e.g. `metrics-exporter-prometheus`) before the first lock is taken;
//! each manager registers its series on first use, with the recorder in force then. A manager
//! that found no recorder then records nothing and costs what it costs without the feature (no
//! clock read, no handle in the guard). (The `metrics` facade's stand-in for a missing
//! recorder is zero-sized, and so is taken for none any recorder type of size zero: give a
//! forwarding recorder a field.)
//!
//! | name | kind | labels | what |
//! |---|---|---|---|
//! | `lock_acquisitions_total` | counter | `backend`, `outcome` | acquisitions by outcome: `acquired`, `contended`, `error`, `invalid` (a dropped request is not counted) |
//! | `lock_wait_seconds` | histogram | `backend` | from the request to its outcome, for every acquisition counted but `invalid` ones (0 when granted at once) |
//! | `lock_hold_seconds` | histogram | `backend` | from the grant to the release (or drop) of the guard |
//! | `lock_lost_total` | counter | `backend` | locks lost while held |
//! | `lock_fallbacks_total` | counter | `backend`, `reason` | locked calls that ran their fallback: `contended`, `error`, `invalid`, `not_configured` |
//! | `lock_renewals_total` | counter | `backend`, `outcome` | watchdog renewals: `renewed`, `refused` (the lock is lost), `failed` (retried, or too late) |
//! | `lock_held` | gauge | `backend` | guards alive |
//! | `lock_waiting` | gauge | `backend` | requests waiting for a held lock |
//!
//! The lock name is not a label (there may be millions of names); a bounded one can be added
//! with [`LockManagerBuilder::metrics_name_label`] (e.g. the name up to its first `:`).
// Links to what a feature brings, to docs.rs when the feature is off (`cargo doc` of one
// feature alone stays clean).
#![doc = ""]
#![cfg_attr(feature = "macros", doc = "[distributed_locked]: distributed_locked")]
#![cfg_attr(
    not(feature = "macros"),
    doc = "[distributed_locked]: https://docs.rs/lock-runtime/latest/lock_runtime/attr.distributed_locked.html"
)]
#![cfg_attr(feature = "redis", doc = "[`LockManager::redis`]: LockManager::redis")]
#![cfg_attr(
    not(feature = "redis"),
    doc = "[`LockManager::redis`]: https://docs.rs/lock-runtime/latest/lock_runtime/struct.LockManager.html#method.redis"
)]
#![cfg_attr(feature = "redis", doc = "[`backend::redis`]: backend::redis")]
#![cfg_attr(
    not(feature = "redis"),
    doc = "[`backend::redis`]: https://docs.rs/lock-runtime/latest/lock_runtime/backend/redis/index.html"
)]
#![cfg_attr(feature = "zookeeper", doc = "[`LockManager::zookeeper`]: LockManager::zookeeper")]
#![cfg_attr(
    not(feature = "zookeeper"),
    doc = "[`LockManager::zookeeper`]: https://docs.rs/lock-runtime/latest/lock_runtime/struct.LockManager.html#method.zookeeper"
)]
#![cfg_attr(feature = "zookeeper", doc = "[`backend::zookeeper`]: backend::zookeeper")]
#![cfg_attr(
    not(feature = "zookeeper"),
    doc = "[`backend::zookeeper`]: https://docs.rs/lock-runtime/latest/lock_runtime/backend/zookeeper/index.html"
)]
#![cfg_attr(feature = "postgres", doc = "[`LockManager::postgres`]: LockManager::postgres")]
#![cfg_attr(
    not(feature = "postgres"),
    doc = "[`LockManager::postgres`]: https://docs.rs/lock-runtime/latest/lock_runtime/struct.LockManager.html#method.postgres"
)]
#![cfg_attr(any(feature = "postgres", feature = "sqlx"), doc = "[`backend::postgres`]: backend::postgres")]
#![cfg_attr(
    not(any(feature = "postgres", feature = "sqlx")),
    doc = "[`backend::postgres`]: https://docs.rs/lock-runtime/latest/lock_runtime/backend/postgres/index.html"
)]
#![cfg_attr(feature = "mysql", doc = "[`LockManager::mysql`]: LockManager::mysql")]
#![cfg_attr(
    not(feature = "mysql"),
    doc = "[`LockManager::mysql`]: https://docs.rs/lock-runtime/latest/lock_runtime/struct.LockManager.html#method.mysql"
)]
#![cfg_attr(feature = "mysql", doc = "[`backend::mysql`]: backend::mysql")]
#![cfg_attr(
    not(feature = "mysql"),
    doc = "[`backend::mysql`]: https://docs.rs/lock-runtime/latest/lock_runtime/backend/mysql/index.html"
)]
#![cfg_attr(feature = "etcd", doc = "[`LockManager::etcd`]: LockManager::etcd")]
#![cfg_attr(
    not(feature = "etcd"),
    doc = "[`LockManager::etcd`]: https://docs.rs/lock-runtime/latest/lock_runtime/struct.LockManager.html#method.etcd"
)]
#![cfg_attr(feature = "etcd", doc = "[`backend::etcd`]: backend::etcd")]
#![cfg_attr(
    not(feature = "etcd"),
    doc = "[`backend::etcd`]: https://docs.rs/lock-runtime/latest/lock_runtime/backend/etcd/index.html"
)]
#![cfg_attr(feature = "conformance", doc = "[`conformance`]: conformance")]
#![cfg_attr(
    not(feature = "conformance"),
    doc = "[`conformance`]: https://docs.rs/lock-runtime/latest/lock_runtime/conformance/index.html"
)]
#![cfg_attr(feature = "testing", doc = "[`testing`]: testing")]
#![cfg_attr(
    not(feature = "testing"),
    doc = "[`testing`]: https://docs.rs/lock-runtime/latest/lock_runtime/testing/index.html"
)]
#![cfg_attr(
    feature = "metrics",
    doc = "[`LockManagerBuilder::metrics_name_label`]: LockManagerBuilder::metrics_name_label"
)]
#![cfg_attr(
    not(feature = "metrics"),
    doc = "[`LockManagerBuilder::metrics_name_label`]: https://docs.rs/lock-runtime/latest/lock_runtime/struct.LockManagerBuilder.html#method.metrics_name_label"
)]
#![cfg_attr(docsrs, feature(doc_cfg))]
#![warn(missing_docs)]
#![cfg_attr(not(test), warn(clippy::unwrap_used, clippy::expect_used))]

pub mod backend;
mod background;
mod bounded;
mod clock;
#[cfg(feature = "conformance")]
#[cfg_attr(docsrs, doc(cfg(feature = "conformance")))]
pub mod conformance;
mod context;
mod election;
mod error;
pub mod fence;
mod guard;
pub mod http;
mod kind;
mod lost;
mod manager;
mod name;
mod options;
mod run;
mod telemetry;
#[cfg(feature = "testing")]
#[cfg_attr(docsrs, doc(cfg(feature = "testing")))]
pub mod testing;
#[cfg(feature = "_tls")]
#[cfg_attr(docsrs, doc(cfg(any(feature = "tls", feature = "tls-aws-lc"))))]
mod tls;
mod watchdog;

#[doc(hidden)]
#[path = "private.rs"]
pub mod __private;

pub use context::{current, CurrentLock};
pub use election::{Campaign, Election, LeaderInfo, LeaderWatch, Leadership};
pub use error::{BoxError, LockError};
pub use guard::{LockGuard, ReleaseFuture};
pub use lost::LostSignal;
pub use manager::{
    default_manager, set_default, LockAllGuard, LockAllRequest, LockFuture, LockManager, LockManagerBuilder,
    LockRequest, DEFAULT_LEASE, DEFAULT_WAIT, MAX_NAMES,
};
pub use options::{LockOptions, MAX_LEASE, MAX_NAME_LEN, MAX_RETRY, MAX_WAIT, MIN_DEFAULT_LEASE, MIN_LEASE};
pub use run::{Enter, Locked, Run, Started};
pub use telemetry::TelemetryNames;
#[cfg(feature = "_tls")]
#[cfg_attr(docsrs, doc(cfg(any(feature = "tls", feature = "tls-aws-lc"))))]
pub use tls::TlsOptions;

#[cfg(feature = "macros")]
pub use lock_macros::distributed_locked;
