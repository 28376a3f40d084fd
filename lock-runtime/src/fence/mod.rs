#![doc = include_str!("fence.md")]

mod http;
#[cfg(feature = "postgres")]
#[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
pub mod postgres;
#[cfg(feature = "redis")]
#[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
pub mod redis;

pub use http::{FenceRejection, FenceStore, Fenced, Fences, FencingToken, MemoryFences};
