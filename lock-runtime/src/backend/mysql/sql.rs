//! The statements of the MySQL backend, whichever driver carries them (the backend's own
//! `mysql_async` connections, or the application's sqlx pool): a lock's name ([`MyKey`]),
//! `GET_LOCK` and `RELEASE_LOCK`, the fencing counter.

use std::sync::Arc;
use std::time::Duration;

use super::{literal, lock_name, COUNTER};
use crate::backend::Acquire;

/// A lock's server-side name as a SQL literal, with its name for errors.
#[derive(Clone)]
pub(super) struct MyKey {
    pub(super) name: Arc<str>,
    literal: String,
    /// Equal for every two names the server could take as one (see [`MyKey::of`]).
    pub(super) id: u64,
}

impl MyKey {
    /// The server compares lock names without case (MariaDB's and MySQL's docs): the key's
    /// identity on a carrier folds ASCII case and takes every other character as one, so that
    /// two names the server may take as one are never held side by side on one session
    /// (where `GET_LOCK` is re-entrant).
    pub(super) fn of(req: &Acquire) -> Self {
        use std::hash::{Hash, Hasher};
        let server = lock_name(&req.key);
        let mut hasher = std::hash::DefaultHasher::new();
        for c in server.chars() {
            (if c.is_ascii() { c.to_ascii_lowercase() } else { '\u{fffd}' }).hash(&mut hasher);
        }
        MyKey { name: req.name.clone(), literal: literal(&server), id: hasher.finish() }
    }

    /// `SELECT GET_LOCK(..)` at once (`wait` is `None`) or waiting at most `wait`, with
    /// `also` selected after it; with the operation's name, for errors.
    pub(super) fn get_lock(&self, wait: Option<Duration>, also: &str) -> (String, &'static str) {
        let (timeout, operation) = match wait {
            None => ("0".to_owned(), "attempt"),
            Some(wait) => (format!("{:.3}", wait.as_secs_f64().max(0.001)), "wait"),
        };
        (format!("SELECT GET_LOCK({}, {timeout}){also}", self.literal), operation)
    }

    /// `SELECT RELEASE_LOCK(..)`: `1` when the session held it.
    pub(super) fn release_lock(&self) -> String {
        format!("SELECT RELEASE_LOCK({})", self.literal)
    }
}

/// Raises the counter row, its new value in the OK packet's last insert id: above every
/// earlier token, and never below the server's clock in µs (so tokens keep increasing even if
/// the table is lost).
pub(super) const TOKEN_SQL: &str = "UPDATE lock_runtime_fence_counter SET token = LAST_INSERT_ID(GREATEST(token + 1, \
                         CAST(UNIX_TIMESTAMP(NOW(6)) * 1000000 AS UNSIGNED))) WHERE id = 1";

/// Whether the counter row exists (`1`), and what creates the table and the row.
pub(super) fn counter_sql() -> (String, String) {
    let exists = format!("SELECT COUNT(*) FROM {COUNTER} WHERE id = 1");
    let create = format!(
        "CREATE TABLE IF NOT EXISTS {COUNTER} (id TINYINT UNSIGNED PRIMARY KEY, token BIGINT UNSIGNED NOT NULL) \
         ENGINE=InnoDB; INSERT IGNORE INTO {COUNTER} VALUES (1, 0)"
    );
    (exists, create)
}
