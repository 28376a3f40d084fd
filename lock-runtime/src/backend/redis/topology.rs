//! Where a Redis backend's commands and subscriptions go: one server, or (behind their
//! features) a Redis Cluster or the primary a set of Sentinels names.
//!
//! Everything else in the backend (scripts, waiting, watchdog, inspection) talks to a
//! [`Conn`] for commands and asks the [`Source`] for a pub/sub connection, so every topology
//! runs the same protocol.
//!
//! A command that finds its connection closed or reset, or its script unknown to the server,
//! is sent again (see `resend.rs`).

use redis::aio::{ConnectionLike, ConnectionManager, PubSub};
use redis::{Cmd, Pipeline, RedisFuture, RedisResult, Value};

use super::resend;

/// The connection commands are sent on. Cheap to clone (clones share the connection).
#[derive(Clone)]
pub(super) enum Conn {
    /// One server, through the `redis` crate's connection manager (reconnects by itself).
    Single(ConnectionManager),
    /// A Redis Cluster, through the `redis` crate's cluster client (routes by key, follows
    /// redirections, reconnects); scripts reach the node that runs them (see `cluster.rs`).
    Cluster(redis::cluster_async::ClusterConnection, super::cluster::Silence),
    /// The primary a set of Sentinels names, followed across failovers.
    Sentinel(super::sentinel::SentinelConn),
}

impl ConnectionLike for Conn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            // The manager starts a new connection as it reports a dropped one; a second send
            // waits for it (see `resend.rs`).
            Conn::Single(conn) => Box::pin(resend::command(conn, cmd, true)),
            Conn::Cluster(conn, silence) => super::cluster::command(conn, *silence, cmd),
            // Sent again on a dropped connection by the Sentinel client itself, after it
            // resolved the primary again.
            Conn::Sentinel(conn) => Box::pin(resend::command(conn, cmd, false)),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Conn::Single(conn) => Box::pin(resend::commands(conn, pipeline, (offset, count), true)),
            Conn::Cluster(conn, _) => conn.req_packed_commands(pipeline, offset, count),
            Conn::Sentinel(conn) => Box::pin(resend::commands(conn, pipeline, (offset, count), false)),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Conn::Single(conn) => conn.get_db(),
            Conn::Cluster(conn, _) => conn.get_db(),
            Conn::Sentinel(conn) => conn.get_db(),
        }
    }
}

/// Where a pub/sub connection (the waiters' one, an inspection tool's) is made, again after
/// every loss.
#[derive(Clone)]
pub(super) enum Source {
    /// One server.
    Single(Box<redis::Client>),
    /// A Redis Cluster: any node hears every release (classic pub/sub is broadcast), so one
    /// node, the next known one after each loss (see `cluster.rs`).
    Cluster(std::sync::Arc<super::cluster::Nodes>),
    /// The current primary of a set of Sentinels (resolved again on every connection).
    Sentinel(super::sentinel::SentinelConn),
}

impl Source {
    /// A new pub/sub connection. Unbounded: callers bound it with their command timeout.
    pub(super) async fn pubsub(&self) -> RedisResult<PubSub> {
        match self {
            Source::Single(client) => client.get_async_pubsub().await,
            Source::Cluster(nodes) => nodes.pubsub().await,
            Source::Sentinel(conn) => conn.pubsub().await,
        }
    }
}

impl From<super::sentinel::SentinelConn> for Conn {
    fn from(conn: super::sentinel::SentinelConn) -> Self {
        Conn::Sentinel(conn)
    }
}

impl From<std::sync::Arc<super::cluster::Nodes>> for Source {
    fn from(nodes: std::sync::Arc<super::cluster::Nodes>) -> Self {
        Source::Cluster(nodes)
    }
}

impl From<super::sentinel::SentinelConn> for Source {
    fn from(conn: super::sentinel::SentinelConn) -> Self {
        Source::Sentinel(conn)
    }
}
