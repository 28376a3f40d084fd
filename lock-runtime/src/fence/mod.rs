#![doc = include_str!("fence.md")]

mod http;
#[cfg(any(feature = "postgres", feature = "sqlx"))]
#[cfg_attr(docsrs, doc(cfg(any(feature = "postgres", feature = "sqlx"))))]
pub mod postgres;
#[cfg(feature = "redis")]
#[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
pub mod redis;

pub use http::{FenceRejection, FenceStore, Fenced, Fences, FencingToken, MemoryFences};
