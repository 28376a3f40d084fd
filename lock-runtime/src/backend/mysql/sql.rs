//! The statements of the MySQL backend, whichever driver carries them (the backend's own
//! `mysql_async` connections, or the application's sqlx pool): a lock's name ([`MyKey`]),
//! `GET_LOCK`, the grant (the fencing counter and the holder's record, in the round trip after
//! `GET_LOCK` answered), `RELEASE_LOCK`, the tables and what inspection reads.

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
    /// time; `None` when holders are not recorded.
    record: Option<String>,
    /// The owner as a record keeps it (cut to its column's width).
    pub(super) owner: String,
    /// Equal for every two names the server could take as one (see [`MyKey::of`]).
    pub(super) id: u64,
}

impl MyKey {
    /// The server compares lock names without case (MariaDB's and MySQL's docs): the key's
    /// identity on a carrier folds ASCII case and takes every other character as one, so that
    /// two names the server may take as one are never held side by side on one session
    /// (where `GET_LOCK` is re-entrant).
    pub(super) fn of(req: &Acquire, record_holders: bool) -> Self {
        let server = lock_name(&req.key);
        let owner = cut(&req.owner.to_string(), OWNER_BYTES).to_owned();
        let record = record_holders.then(|| {
            format!(
                "X'{}', X'{}', X'{}'",
                hex(cut(&req.key, KEY_BYTES)),
                hex(&owner),
                hex(cut(req.holder.as_str(), HOLDER_BYTES))
            )
        });
        let id = id_of(&server);
        MyKey { name: req.name.clone(), literal: literal(&server), server: hex(&server), record, owner, id }
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

    /// What a grant does on the session that was granted, in one round trip: the counter
    /// raised (the first result's last insert id is the token: none when the counter row is
    /// missing), then the holder's record written (see [`holders_sql`]).
    pub(super) fn grant(&self) -> String {
        let counter = format!(
            "UPDATE {COUNTER} SET token = LAST_INSERT_ID(GREATEST(token + 1, \
             CAST(UNIX_TIMESTAMP(NOW(6)) * 1000000 AS UNSIGNED))) WHERE id = 1"
        );
        match &self.record {
            None => counter,
            Some(record) => format!(
                "{counter}; REPLACE INTO {HOLDERS} (name, lock_key, owner, holder, token, connection, since) \
                 SELECT X'{}', {record}, LAST_INSERT_ID(), CONNECTION_ID(), NOW(6) FROM DUAL WHERE ROW_COUNT() = 1",
                self.server
            ),
        }
    }

    /// `SELECT RELEASE_LOCK(..)` (`1` when the session held it), then the session's record of
    /// it deleted: the answer is the first result.
    pub(super) fn release_lock(&self) -> String {
        let release = format!("SELECT RELEASE_LOCK({})", self.literal);
        match self.record {
            None => release,
            Some(_) => format!(
                "{release}; DELETE FROM {HOLDERS} WHERE name = X'{}' AND connection = CONNECTION_ID()",
                self.server
            ),
        }
    }
}

/// A server-side name's identity on a carrier (see [`MyKey::of`]).
pub(super) fn id_of(server: &str) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut hasher = std::hash::DefaultHasher::new();
    for c in server.chars() {
        (if c.is_ascii() { c.to_ascii_lowercase() } else { '\u{fffd}' }).hash(&mut hasher);
    }
    hasher.finish()
}

/// A granted session's token, as [`MyKey::grant`]'s first result gave it: `None` is an error
/// (the counter table has no row 1).
pub(super) fn token(name: &str, operation: &'static str, token: Option<u64>) -> Result<u64, Failure> {
    match token {
        Some(token) if token > 0 => Ok(token),
        _ => Err(Failure::Failed(LockError::backend(
            name,
            KIND,
            operation,
            format!("no fencing token: the counter table `{COUNTER}` has no row 1"),
        ))),
    }
}

/// The longest key, owner and holder a record keeps, in bytes (the columns' widths: a row of
/// the in-memory table takes them whole).
const KEY_BYTES: usize = 512;
const OWNER_BYTES: usize = 128;
const HOLDER_BYTES: usize = 160;

/// `text` cut to at most `max` bytes, at a character's boundary.
fn cut(text: &str, max: usize) -> &str {
    let mut end = text.len().min(max);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

/// What makes the counter table and its row (each only if missing).
pub(super) fn counter_create_sql() -> String {
    format!(
        "CREATE TABLE IF NOT EXISTS {COUNTER} (id TINYINT UNSIGNED PRIMARY KEY, token BIGINT UNSIGNED NOT NULL) \
         ENGINE=InnoDB; INSERT IGNORE INTO {COUNTER} VALUES (1, 0)"
    )
}

/// Deletes the records no live session holds: of sessions that ended without releasing
/// (killed, disconnected, the process gone) and of grants undone after their record was
/// written. A record is valid while `IS_USED_LOCK(name)` is its connection; a grant writes its
/// record after `GET_LOCK` returned, so no record of a lock being granted is ever deleted.
pub(super) fn sweep_sql() -> String {
    format!("DELETE FROM {HOLDERS} WHERE NOT (IS_USED_LOCK(CONVERT(name USING utf8mb4)) <=> connection)")
}

/// The table of holders' records: one row per held lock, keyed by the server-side name and
/// valid while `IS_USED_LOCK(name)` is its `connection` (a session that ended without
/// releasing leaves a row that is never shown, replaced at the name's next grant or deleted
/// by the next sweep, [`sweep_sql`]).
/// In memory (`ENGINE=MEMORY`): a record means nothing once its session is gone, and every
/// session ends with the server, so nothing of it needs to reach the disk, and its writes cost
/// no commit (an InnoDB table made each lock and release 1.5 times as long: two more commits).
/// Made with room for 256 MiB of rows (about 250,000 held locks; `max_heap_table_size` at
/// creation bounds a memory table).
pub(super) fn holders_sql() -> String {
    format!(
        "SET SESSION max_heap_table_size = 268435456; \
         CREATE TABLE IF NOT EXISTS {HOLDERS} (name VARBINARY(256) NOT NULL PRIMARY KEY, \
         lock_key VARBINARY({KEY_BYTES}) NOT NULL, owner VARBINARY({OWNER_BYTES}) NOT NULL, \
         holder VARBINARY({HOLDER_BYTES}) NOT NULL, token BIGINT UNSIGNED NOT NULL, \
         connection BIGINT UNSIGNED NOT NULL, since DATETIME(6) NOT NULL) ENGINE=MEMORY"
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
        cut(prefix, KEY_BYTES).len(),
        // As recorded: a key of more than `KEY_BYTES` is kept cut.
        hex(cut(prefix, KEY_BYTES))
    )
}

/// The recorded holder of lock `key`, and a row with no token when the lock is held by a
/// session that recorded none (another client's `GET_LOCK` of the same name).
pub(super) fn inspect_sql(key: &str) -> String {
    let server = lock_name(key);
    format!(
        "SELECT {COLUMNS} FROM {HOLDERS} WHERE name = X'{name}' AND lock_key = X'{cut}' \
         AND IS_USED_LOCK(CONVERT(name USING utf8mb4)) = connection \
         UNION ALL SELECT CAST(X'{key}' AS BINARY), CAST('' AS BINARY), CAST('' AS BINARY), \
         CAST(NULL AS UNSIGNED), CAST(NULL AS SIGNED), \
         CAST(IS_USED_LOCK({lit}) AS UNSIGNED) FROM DUAL WHERE IS_USED_LOCK({lit}) IS NOT NULL",
        name = hex(&server),
        cut = hex(cut(key, KEY_BYTES)),
        key = hex(key),
        lit = literal(&server),
    )
}

/// A forced release's request to the holder (records on): the record of `key`'s holder
/// `owner`, while it holds the lock on `connection`, has its token set to 0, which the holder's
/// heartbeat finds ([`forced_sql`]); then it frees that one lock and fires its `lost()`. The
/// check and the mark are one statement: a record of another owner, or of the same owner's
/// lock released meanwhile, is never marked.
pub(super) fn mark_sql(key: &str, owner: &str, connection: u64) -> String {
    format!(
        "UPDATE {HOLDERS} SET token = 0 WHERE name = X'{}' AND owner = X'{}' AND connection = {connection} \
         AND IS_USED_LOCK(CONVERT(name USING utf8mb4)) = connection",
        hex(&lock_name(key)),
        hex(cut(owner, OWNER_BYTES))
    )
}

/// The marked record of `key`'s holder `owner`, while it still holds the lock.
pub(super) fn marked_sql(key: &str, owner: &str) -> String {
    format!(
        "SELECT {COLUMNS} FROM {HOLDERS} WHERE name = X'{}' AND owner = X'{}' AND token = 0 \
         AND IS_USED_LOCK(CONVERT(name USING utf8mb4)) = connection",
        hex(&lock_name(key)),
        hex(cut(owner, OWNER_BYTES))
    )
}

/// The server-side names and owners of the locks of this session whose release was asked for
/// ([`mark_sql`]): a heartbeat's question when records are on.
pub(super) fn forced_sql() -> String {
    format!("SELECT CAST(name AS BINARY), CAST(owner AS BINARY) FROM {HOLDERS} WHERE connection = CONNECTION_ID() AND token = 0")
}

/// A holder's record the server would not write: the lock is granted anyway (inspection shows
/// it held with no holder, as another client's `GET_LOCK`); said once per process, at `warn`.
pub(super) fn record_failed(why: &dyn std::fmt::Display) {
    static SAID: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    if !SAID.swap(true, std::sync::atomic::Ordering::Relaxed) {
        tracing::warn!(
            "a MySQL lock was granted without its holder's record in `{}` ({why}): inspection shows such locks \
             held with no holder; said once",
            super::HOLDERS
        );
    } else {
        tracing::debug!(error = %why, "a MySQL holder's record was not written");
    }
}
