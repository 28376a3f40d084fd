#![doc = include_str!("README.md")]
#![doc = ""]
#![cfg_attr(feature = "_tls", doc = "[`MysqlOptions::tls`]: MysqlOptions::tls")]
#![cfg_attr(
    not(feature = "_tls"),
    doc = "[`MysqlOptions::tls`]: https://docs.rs/lock-runtime/latest/lock_runtime/backend/mysql/struct.MysqlOptions.html#method.tls"
)]

use crate::error::LockError;

#[cfg(feature = "sqlx")]
mod app_pool;
mod backend;
mod conn;
mod inspect;
mod options;
mod setup;
mod sql;

pub use backend::{MysqlBackend, MysqlOptions};

const KIND: &str = "mysql";
/// The one-row table the fencing tokens are drawn from.
const COUNTER: &str = "lock_runtime_fence_counter";
/// The table of the holders' records (what inspection reads).
const HOLDERS: &str = "lock_runtime_holders";
/// The longest lock name `GET_LOCK` takes, in characters.
const MAX_NAME: usize = 64;

/// The server-side lock name of lock `key` (the manager's prefix followed by the name): the key
/// itself when it has at most 64 characters (the server's limit), else its first 31
/// characters, `~` and the 32 hex digits of its MD5. Two long keys sharing a name is false
/// contention, never two holders.
///
/// ```
/// use lock_runtime::backend::mysql::lock_name;
///
/// assert_eq!(lock_name("orders:42"), "orders:42");
/// let long = lock_name(&"x".repeat(100));
/// assert_eq!(long.chars().count(), 64);
/// assert_ne!(long, lock_name(&format!("{}y", "x".repeat(99))));
/// ```
pub fn lock_name(key: &str) -> String {
    if key.chars().count() <= MAX_NAME {
        return key.to_owned();
    }
    let head: String = key.chars().take(31).collect();
    format!("{head}~{:x}", md5::compute(key.as_bytes()))
}

/// `text`'s UTF-8 bytes in hex, for a SQL literal `X'…'` that needs no escaping.
fn hex(text: &str) -> String {
    use std::fmt::Write;
    let mut hex = String::with_capacity(text.len() * 2);
    for b in text.bytes() {
        let _ = write!(hex, "{b:02x}");
    }
    hex
}

/// `name` as a SQL string literal that needs no escaping: its UTF-8 bytes in hex.
fn literal(name: &str) -> String {
    format!("CONVERT(X'{}' USING utf8mb4)", hex(name))
}

fn my_error(name: &str, operation: &'static str, e: mysql_async::Error) -> LockError {
    LockError::backend(name, KIND, operation, e)
}
