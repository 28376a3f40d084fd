//! The statements of the MySQL backend, whichever driver carries them (the backend's own
//! `mysql_async` connections, or the application's sqlx pool): a lock's name ([`MyKey`]), the
//! grant (`GET_LOCK`, the fencing counter and the holder's record in one round trip),
//! `RELEASE_LOCK`, the tables and what inspection reads.

use std::sync::Arc;
use std::time::Duration;

use super::{hex, literal, lock_name, COUNTER, HOLDERS, KIND};
use crate::backend::session::Failure;
use crate::backend::Acquire;
use crate::error::LockError;

/// A lock's server-side name as a SQL literal, with its name for errors and the record its
/// grant writes.
#[derive(Clone)]
pub(super) struct MyKey {
    pub(super) name: Arc<str>,
    literal: String,
    /// The server-side name's bytes in hex (the holders table's key).
    server: String,
    /// `X'key', X'owner', X'holder'`: the holder's record but for its token, connection and
    /// time.
    record: String,
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
        let record =
            format!("X'{}', X'{}', X'{}'", hex(&req.key), hex(&req.owner.to_string()), hex(req.holder.as_str()));
        MyKey { name: req.name.clone(), literal: literal(&server), server: hex(&server), record, id: hasher.finish() }
    }

    /// The grant, in one round trip: `GET_LOCK` at once (`wait` is `None`) or waiting at most
    /// `wait`; granted, the counter raised (its value in `LAST_INSERT_ID()`) and the holder's
    /// record written (see [`holders_sql`]). Its last result is one row: `GET_LOCK`'s answer
    /// (`1` granted, `0` not, `NULL` killed), the token (`0` when not granted, or when the
    /// counter row is missing) and the session's connection id. With the operation's name,
    /// for errors.
    pub(super) fn get_lock(&self, wait: Option<Duration>) -> (String, &'static str) {
        let (timeout, operation) = match wait {
            None => ("0".to_owned(), "attempt"),
            Some(wait) => (format!("{:.3}", wait.as_secs_f64().max(0.001)), "wait"),
        };
        let sql = format!(
            "SELECT GET_LOCK({lit}, {timeout}), LAST_INSERT_ID(0) INTO @lock_runtime_granted, @lock_runtime_none; \
             UPDATE {COUNTER} SET token = LAST_INSERT_ID(GREATEST(token + 1, \
             CAST(UNIX_TIMESTAMP(NOW(6)) * 1000000 AS UNSIGNED))) WHERE id = 1 AND @lock_runtime_granted = 1; \
             REPLACE INTO {HOLDERS} (name, lock_key, owner, holder, token, connection, since) \
             SELECT X'{server}', {record}, LAST_INSERT_ID(), CONNECTION_ID(), NOW(6) FROM DUAL \
             WHERE @lock_runtime_granted = 1 AND LAST_INSERT_ID() > 0; \
             SELECT @lock_runtime_granted, CAST(LAST_INSERT_ID() AS UNSIGNED), CAST(CONNECTION_ID() AS UNSIGNED)",
            lit = self.literal,
            server = self.server,
            record = self.record,
        );
        (sql, operation)
    }

    /// `SELECT RELEASE_LOCK(..)` (`1` when the session held it), then the session's record of
    /// it deleted: the answer is the first result.
    pub(super) fn release_lock(&self) -> String {
        format!(
            "SELECT RELEASE_LOCK({}); DELETE FROM {HOLDERS} WHERE name = X'{}' AND connection = CONNECTION_ID()",
            self.literal, self.server
        )
    }
}

/// What a grant's answer says: `GET_LOCK`'s (`1`, `0` or `NULL`) and the token.
pub(super) fn granted(
    name: &str,
    operation: &'static str,
    lock: Option<i64>,
    token: u64,
) -> Result<Option<u64>, Failure> {
    match (lock, token) {
        (Some(1), 0) => Err(Failure::Failed(LockError::backend(
            name,
            KIND,
            operation,
            format!("no fencing token: the counter table `{COUNTER}` has no row 1"),
        ))),
        (Some(1), token) => Ok(Some(token)),
        (Some(_), _) => Ok(None),
        (None, _) => {
            let why = "GET_LOCK answered NULL (the query was killed, or failed on the server)";
            Err(Failure::Failed(LockError::backend(name, KIND, operation, why)))
        }
    }
}

/// Whether both tables exist with the counter's row (`1`; an error 1146 when a table is
/// missing), and what creates them and the row.
pub(super) fn counter_sql() -> (String, String) {
    let exists =
        format!("SELECT COUNT(*) FROM {COUNTER} WHERE id = 1 AND NOT EXISTS (SELECT 1 FROM {HOLDERS} WHERE 1 = 0)");
    let create = format!(
        "CREATE TABLE IF NOT EXISTS {COUNTER} (id TINYINT UNSIGNED PRIMARY KEY, token BIGINT UNSIGNED NOT NULL) \
         ENGINE=InnoDB; INSERT IGNORE INTO {COUNTER} VALUES (1, 0); {}",
        holders_sql()
    );
    (exists, create)
}

/// The table of holders' records: one row per held lock, keyed by the server-side name and
/// valid while `IS_USED_LOCK(name)` is its `connection` (a session that ended without
/// releasing leaves a row that is never shown, and is replaced at the name's next grant).
pub(super) fn holders_sql() -> String {
    format!(
        "CREATE TABLE IF NOT EXISTS {HOLDERS} (name VARBINARY(256) PRIMARY KEY, lock_key BLOB NOT NULL, \
         owner VARBINARY(255) NOT NULL, holder VARBINARY(255) NOT NULL, token BIGINT UNSIGNED NOT NULL, \
         connection BIGINT UNSIGNED NOT NULL, since DATETIME(6) NOT NULL) ENGINE=InnoDB"
    )
}

/// One row inspection reads: key, owner, holder, token (none for a lock held by a session
/// that recorded none), age in µs, connection.
pub(super) type Recorded = (Vec<u8>, Vec<u8>, Vec<u8>, Option<u64>, Option<i64>, u64);

/// The columns inspection reads, in the order of [`Recorded`].
const COLUMNS: &str = "CAST(lock_key AS BINARY), CAST(owner AS BINARY), CAST(holder AS BINARY), \
                       CAST(token AS UNSIGNED), CAST(TIMESTAMPDIFF(MICROSECOND, since, NOW(6)) AS SIGNED), \
                       CAST(connection AS UNSIGNED)";

/// The recorded holders of the locks whose key starts with `prefix`.
pub(super) fn list_sql(prefix: &str) -> String {
    format!(
        "SELECT {COLUMNS} FROM {HOLDERS} WHERE IS_USED_LOCK(CONVERT(name USING utf8mb4)) = connection \
         AND LEFT(lock_key, {}) = X'{}' ORDER BY lock_key",
        prefix.len(),
        hex(prefix)
    )
}

/// The recorded holder of lock `key`, and a row with no token when the lock is held by a
/// session that recorded none (another client's `GET_LOCK` of the same name).
pub(super) fn inspect_sql(key: &str) -> String {
    let server = lock_name(key);
    format!(
        "SELECT {COLUMNS} FROM {HOLDERS} WHERE name = X'{name}' AND lock_key = X'{key}' \
         AND IS_USED_LOCK(CONVERT(name USING utf8mb4)) = connection \
         UNION ALL SELECT CAST(X'{key}' AS BINARY), CAST('' AS BINARY), CAST('' AS BINARY), \
         CAST(NULL AS UNSIGNED), CAST(NULL AS SIGNED), \
         CAST(IS_USED_LOCK({lit}) AS UNSIGNED) FROM DUAL WHERE IS_USED_LOCK({lit}) IS NOT NULL",
        name = hex(&server),
        key = hex(key),
        lit = literal(&server),
    )
}
