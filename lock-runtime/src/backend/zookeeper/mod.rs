#![doc = include_str!("README.md")]

use std::sync::{Mutex, MutexGuard, PoisonError};

use crate::error::LockError;

mod backend;
mod inspect;
mod kinds;
mod options;
mod purge;
mod recipe;
mod session;

pub use backend::{ZookeeperBackend, ZookeeperStats};
pub use options::ZookeeperOptions;
pub use recipe::STALE_HOLDER_MARGIN;

const KIND: &str = "zookeeper";
/// The prefix of every lock node's name.
const NODE_PREFIX: &str = "lk-";

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Whether a request failed because its connection went, not because the server answered it:
/// `ConnectionLoss`, and the client's own errors (`Custom`: a connection silent past its timeout,
/// or an I/O error), which it hands every request in flight on the connection it drops. Its
/// outcome is unknown; the session may live on through another member.
fn cut(e: &zookeeper_client::Error) -> bool {
    matches!(e, zookeeper_client::Error::ConnectionLoss | zookeeper_client::Error::Custom(_))
}

fn zk_error(name: &str, operation: &'static str, e: zookeeper_client::Error) -> LockError {
    LockError::backend(name, KIND, operation, e)
}

fn gone(name: &str, operation: &'static str, what: String) -> LockError {
    LockError::backend(name, KIND, operation, what)
}

fn session_gone(name: &str, operation: &'static str) -> LockError {
    gone(name, operation, "the ZooKeeper session was lost (expired, or disconnected too long)".to_owned())
}
