//! What the clones of one Redis backend share ([`Shared`]): the server (`server.rs`: the
//! connection, its scripts and how one is called), where pub/sub connections come from, the
//! local waiters, the batch lane, the held locks checked after a lost connection, the options
//! and the runtime. Attempts, held locks, batches and inspection work on a `Shared`, never on
//! the public `RedisBackend`, which only composes it.

use std::sync::Arc;

use super::batch::Lane;
use super::holdings::Holdings;
use super::layout;
use super::options::RedisOptions;
use super::pubsub::Timings;
use super::server::Server;
use super::topology::{Conn, Source};
use super::waiters::Waiters;

/// What a backend's clones share.
pub(super) struct Shared {
    /// The connection, its scripts and how one is called.
    pub(super) server: Arc<Server>,
    /// Where pub/sub connections are made (the waiters', inspection tools' subscriptions).
    pub(super) source: Source,
    pub(super) waiters: Waiters,
    pub(super) options: RedisOptions,
    /// The store as shown in messages (passwords hidden).
    pub(super) url: String,
    /// Where the cleanup of dropped acquisitions and the rest of dropped releases run.
    pub(super) runtime: tokio::runtime::Handle,
    /// The locks held through this backend, checked at once after a lost connection.
    pub(super) holdings: Arc<Holdings>,
    /// Where mutex attempts and releases made while another is on the wire wait, to go out
    /// together (see `batch.rs`); none on a Cluster.
    pub(super) lane: Option<Lane>,
}

impl Shared {
    /// A backend's state on `conn` and `source`, whatever the topology behind them.
    /// (A topology's module hands over its own connection and source, which `topology.rs`
    /// turns into a [`Conn`] and a [`Source`]: it does not name those.)
    pub(super) fn new(
        conn: Conn,
        source: Source,
        options: RedisOptions,
        url: String,
        runtime: &tokio::runtime::Handle,
    ) -> Self {
        let timings =
            Timings { timeout: options.command_timeout, grace: options.unsubscribe_after, ping: options.ping_interval };
        let server = Arc::new(Server::new(conn, options.command_timeout));
        let lane = (!server.is_cluster()).then(|| Lane::new(server.clone(), runtime.clone()));
        let holdings = Holdings::new(server.clone(), runtime.clone());
        let suspect = Arc::downgrade(&holdings);
        server.on_connection_lost(move || {
            if let Some(holdings) = suspect.upgrade() {
                holdings.suspect();
            }
        });
        let waiters = Waiters::start(runtime, vec![source.clone()], timings, Some(holdings.clone()));
        Shared { server, source, waiters, options, url, runtime: runtime.clone(), holdings, lane }
    }

    /// Whether mutex waiters queue in Redis and releases grant from that queue (see
    /// `handoff.rs`): not on a Cluster, where a release declares the lock's key only, so that
    /// it runs while the slot migrates (see `cluster.rs`).
    pub(super) fn queues(&self) -> bool {
        !self.server.is_cluster()
    }

    /// The fencing counter of a lock's grants, given its slot's (`layout.fence`): the
    /// server's one counter where one server holds every lock (one server, Sentinel), so that
    /// a batch reads and writes it once; the slot's on a Cluster. Every grant of a name takes
    /// the same one, so its tokens keep increasing.
    pub(super) fn fence<'a>(&self, slot_fence: &'a str) -> &'a str {
        if self.server.is_cluster() {
            slot_fence
        } else {
            layout::SERVER_FENCE
        }
    }
}
