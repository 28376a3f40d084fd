#![doc = include_str!("README.md")]
#![doc = ""]
#![cfg_attr(feature = "_tls", doc = "[`EtcdOptions::tls`]: EtcdOptions::tls")]
#![cfg_attr(
    not(feature = "_tls"),
    doc = "[`EtcdOptions::tls`]: https://docs.rs/lock-runtime/latest/lock_runtime/backend/etcd/struct.EtcdOptions.html#method.tls"
)]

use std::sync::{Mutex, MutexGuard, PoisonError};

use crate::error::LockError;

mod backend;
mod inspect;
mod members;
mod options;
mod recipe;
mod session;

pub use backend::{EtcdBackend, EtcdStats};
pub use options::EtcdOptions;

const KIND: &str = "etcd";

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

fn etcd_error(name: &str, operation: &'static str, e: etcd_client::Error) -> LockError {
    LockError::backend_with_causes(name, KIND, operation, e)
}

/// The error of a request no member answered within `bound`, or that failed.
fn failed(name: &str, operation: &'static str, bound: std::time::Duration, failure: members::Failure) -> LockError {
    match failure {
        members::Failure::NoAnswer => LockError::timed_out(name, KIND, operation, bound),
        members::Failure::Error(e) => etcd_error(name, operation, e),
    }
}

/// `key` with `%` and `/` percent-encoded: one path segment, never a prefix of another lock's.
fn encode(key: &str) -> String {
    let mut out = String::with_capacity(key.len());
    for c in key.chars() {
        match c {
            '%' => out.push_str("%25"),
            '/' => out.push_str("%2F"),
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encoded_keys_are_one_segment_and_distinct() {
        assert_eq!(encode("a/b"), "a%2Fb");
        assert_eq!(encode("a%2Fb"), "a%252Fb");
        assert_ne!(encode("a/b"), encode("a%2Fb"));
        assert_eq!(encode("plain:42"), "plain:42");
    }
}
