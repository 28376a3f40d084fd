//! Cross-crate test support: the backend conformance suite (run against every backend) and
//! harnesses that start real servers for the backend tests.

pub mod conformance;
pub mod http;
#[cfg(feature = "redis")]
pub mod redis_server;
pub mod zk_server;

/// A name no other test (or earlier run against the same server) uses.
pub fn unique(label: &str) -> String {
    format!("{label}:{}", lock_runtime::backend::OwnerId::next())
}
