//! When a command is sent again: one that finds its connection closed or reset (the server
//! closed it while idle, an operator killed it, the server restarted) goes out once more, on the
//! new connection the connection manager makes (Sentinel: on a connection to the primary
//! resolved again). `topology.rs` and `sentinel.rs` do it, with [`dropped`] as the one test.
//!
//! That is safe because every command the backend sends is idempotent for its owner: an
//! attempt whose key already holds its owner grants it again with a fresh token (`acquire.lua`,
//! `kind_acquire.lua`, and so a batch's attempts), a release, renewal or hand-off is
//! owner-checked (a second copy finds the key gone or another owner's and changes nothing), a
//! queue entry is keyed by its owner, and the rest only read. The one cost of an answer lost
//! with the connection: a release whose first copy ran reports the lock gone (`lost`), though
//! it was released.

use redis::RedisError;

/// Whether `e` says the connection was found closed or reset (not a server's answer, not a
/// timeout): the command may be sent again on a new connection.
pub(super) fn dropped(e: &RedisError) -> bool {
    e.is_connection_dropped() && !e.is_timeout()
}
