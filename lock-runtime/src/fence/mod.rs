#![doc = include_str!("fence.md")]
#![doc = ""]
#![cfg_attr(any(feature = "postgres", feature = "sqlx"), doc = "[`postgres`]: postgres")]
#![cfg_attr(
    not(any(feature = "postgres", feature = "sqlx")),
    doc = "[`postgres`]: https://docs.rs/lock-runtime/latest/lock_runtime/fence/postgres/index.html"
)]
#![cfg_attr(any(feature = "postgres", feature = "sqlx"), doc = "[`postgres::check`]: postgres::check")]
#![cfg_attr(
    not(any(feature = "postgres", feature = "sqlx")),
    doc = "[`postgres::check`]: https://docs.rs/lock-runtime/latest/lock_runtime/fence/postgres/fn.check.html"
)]
#![cfg_attr(any(feature = "postgres", feature = "sqlx"), doc = "[`postgres::INSTALL_SQL`]: postgres::INSTALL_SQL")]
#![cfg_attr(
    not(any(feature = "postgres", feature = "sqlx")),
    doc = "[`postgres::INSTALL_SQL`]: https://docs.rs/lock-runtime/latest/lock_runtime/fence/postgres/constant.INSTALL_SQL.html"
)]
#![cfg_attr(feature = "redis", doc = "[`redis`]: redis")]
#![cfg_attr(
    not(feature = "redis"),
    doc = "[`redis`]: https://docs.rs/lock-runtime/latest/lock_runtime/fence/redis/index.html"
)]

mod http;
#[cfg(any(feature = "postgres", feature = "sqlx"))]
#[cfg_attr(docsrs, doc(cfg(any(feature = "postgres", feature = "sqlx"))))]
pub mod postgres;
#[cfg(feature = "redis")]
#[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
pub mod redis;

pub use http::{FenceRejection, FenceStore, Fenced, Fences, FencingToken, MemoryFences};
