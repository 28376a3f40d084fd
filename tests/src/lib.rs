//! Cross-crate test support: the backend conformance suite (run against every backend) and
//! harnesses that start real servers for the backend tests.

pub use lock_runtime::{conformance, conformance_suite};
pub mod etcd_server;
pub mod http;
pub mod jepsen;
#[cfg(feature = "postgres")]
pub mod pg_server;
#[cfg(feature = "redis")]
pub mod redis_cluster;
#[cfg(feature = "redis")]
pub mod redis_sentinel;
#[cfg(feature = "redis")]
pub mod redis_server;
pub mod server_process;
pub mod zk_server;

/// A loopback port nobody listens on right now (for the servers the tests start).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind(("127.0.0.1", 0)).and_then(|l| l.local_addr()).map(|a| a.port()).expect("free port")
}

/// A name no other test (or earlier run against the same server) uses.
pub fn unique(label: &str) -> String {
    format!("{label}:{}", lock_runtime::backend::OwnerId::next())
}

/// Polls `fut` exactly once, with this task's waker: `Ready` with its output, or `Pending`.
/// For tests that drop a future after a given number of polls.
pub async fn poll_once<F: std::future::Future + Unpin>(fut: &mut F) -> std::task::Poll<F::Output> {
    std::future::poll_fn(|cx| std::task::Poll::Ready(std::pin::Pin::new(&mut *fut).poll(cx))).await
}
