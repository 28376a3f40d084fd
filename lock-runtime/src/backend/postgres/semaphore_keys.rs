//! [`Sem`]: the advisory keys and the attempt statement of one PostgreSQL semaphore (its
//! waiting is `semaphore.rs`'s).

use super::advisory_key;

/// The most permits a PostgreSQL semaphore may have: the waiter at the head of the queue waits
/// on every permit with a connection of its own.
pub const MAX_PERMITS: u32 = 64;

/// Appended to a semaphore's key before it is hashed: its permits (`\0sem`, then `+ i`), its
/// queue (`\0semq`) and its markers (`\0semn`, then `+ permits`).
const PERMITS: &str = "\u{0}sem";
const QUEUE: &str = "\u{0}semq";
const MARKERS: &str = "\u{0}semn";

/// The advisory keys of one semaphore.
pub(super) struct Sem {
    pub(super) permits: u32,
    /// The waiters' queue: the one holding it is the head, the others wait for it in the
    /// server's order.
    pub(super) queue: (i32, i32),
    /// Permit `i` is `(base.0, base.1 + i)` (wrapping).
    base: (i32, i32),
    /// The marker of `permits`: `(markers.0, markers.1 + permits)`, taken shared by every
    /// holder and by every attempt while it looks, so that an attempt with another count sees
    /// it in `pg_locks`.
    markers: (i32, i32),
}

impl Sem {
    pub(super) fn new(key: &str, permits: u32) -> Self {
        Sem {
            permits,
            queue: advisory_key(&format!("{key}{QUEUE}")),
            base: advisory_key(&format!("{key}{PERMITS}")),
            markers: advisory_key(&format!("{key}{MARKERS}")),
        }
    }

    pub(super) fn permit(&self, i: u32) -> (i32, i32) {
        (self.base.0, self.base.1.wrapping_add_unsigned(i))
    }

    pub(super) fn marker(&self) -> (i32, i32) {
        (self.markers.0, self.markers.1.wrapping_add_unsigned(self.permits))
    }

    /// One transaction that takes this count's marker for itself (released at its end), then
    /// answers `mismatch <n>` when a marker of another count `n` is held (by a holder, or an
    /// attempt looking now), or else tries the permits in turn and takes the first free one
    /// with the count's marker for the session, drawing the token into the application name
    /// (`<i> <application name>`), or NULL when every permit is taken. Two attempts with
    /// different counts cannot both miss each other: each takes its marker before it looks.
    pub(super) fn attempt_sql(&self, token: &str) -> String {
        let (m0, m1) = self.marker();
        let (b0, b1) = self.base;
        let (n, max) = (self.permits, MAX_PERMITS);
        let (c0, c1) = (self.markers.0 as u32, self.markers.1 as u32);
        format!(
            "BEGIN; SELECT pg_advisory_xact_lock_shared({m0}, {m1}); \
             SELECT COALESCE(\
               (SELECT 'mismatch ' || d FROM (SELECT ((l.objid::int8 - {c1}) % 4294967296 + 4294967296) % 4294967296 AS d \
                  FROM pg_locks l WHERE l.locktype = 'advisory' AND l.objsubid = 2 AND l.classid = {c0} \
                  AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())) o \
                WHERE d <> {n} AND d BETWEEN 1 AND {max} LIMIT 1), \
               (SELECT i || ' ' || pg_try_advisory_lock_shared({m0}, {m1})::text || ' ' || {token} \
                  FROM generate_series(0, {last}) AS i \
                  WHERE pg_try_advisory_lock({b0}, ((({b1}::int8 + i + 2147483648) % 4294967296) - 2147483648)::int4) \
                  LIMIT 1)); \
             COMMIT",
            last = n - 1,
        )
    }
}
