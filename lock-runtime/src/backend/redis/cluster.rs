//! The Redis backend on a Redis Cluster: [`RedisBackend::cluster`],
//! [`LockManager::redis_cluster`](crate::LockManager::redis_cluster), [`LockManagerBuilder::redis_cluster`](crate::LockManagerBuilder::redis_cluster).
//!
//! ```no_run
//! # async fn demo() -> Result<(), lock_runtime::LockError> {
//! use std::time::Duration;
//! use lock_runtime::backend::redis::{RedisBackend, RedisOptions};
//! use lock_runtime::LockManager;
//!
//! let seeds = ["redis://127.0.0.1:7000", "redis://127.0.0.1:7001"];
//! let manager = LockManager::redis_cluster(&seeds).await?;
//!
//! let backend = RedisBackend::cluster(
//!     &seeds,
//!     RedisOptions::default().command_timeout(Duration::from_millis(500)),
//! )
//! .await?;
//! let manager = LockManager::builder().prefix("myapp:").backend(backend);
//! # Ok(()) }
//! ```
//!
//! # How it works
//!
//! The protocol is the single server's, unchanged (see the [parent module](super)): every
//! script touches one hash slot only (the lock key, its release channel and the slot's fencing
//! counter share a hash tag, see [`KeyLayout`](super::KeyLayout)), so each script runs whole
//! on the primary that owns the lock's slot, atomically, as on one server.
//!
//! - **Commands** go through the `redis` crate's cluster client, which keeps a connection per
//!   node and routes each script call by its first key. Its connection and response timeouts,
//!   and its overall bound per request (redirections and retries included), are the
//!   [command timeout](super::RedisOptions::command_timeout); connecting is bounded by it too.
//! - **Redirections.** `MOVED` (a slot moved for good: the client follows it and refreshes its
//!   slot map), `ASK` (a slot being migrated, the key not on the source: it repeats the call
//!   once on the target, preceded by `ASKING`), `TRYAGAIN` and `CLUSTERDOWN` (a failover in
//!   progress) are handled by the cluster client: the first two at once, the last two after a
//!   short pause (10 to 250 ms), all within the command timeout, past which the operation
//!   fails with an [`is_backend`](crate::LockError::is_backend) error. A key is on exactly one
//!   node at any time (`MIGRATE` moves it atomically, with its expiry), so a migration never
//!   lets two owners in.
//! - **Scripts during a migration.** While a slot migrates, Redis runs a script only on a node
//!   that has every key the script declares (otherwise `TRYAGAIN`). Releases, renewals and
//!   waiters' looks declare the lock's key only (a release channel is an argument: it is no
//!   key), so they run wherever that key is, before or after it moved. An acquisition
//!   declares the lock's key and the slot's fencing counter: while only one of them has moved,
//!   or the lock is free (its key is on neither node), it cannot run until the migration ends.
//!   A first attempt then fails with an `is_backend` error within the command timeout; a
//!   waiter keeps waiting, trying again with backoff, and is granted once the slot is settled
//!   (a lock slot holds few keys, so its migration takes milliseconds).
//! - **Scripts.** A node that does not know a script (`NOSCRIPT`: a new primary after a
//!   failover, a restarted node, a slot just moved) gets it with `EVAL` of the source, sent to
//!   the same node as the failed `EVALSHA` (routed by the same key); `SCRIPT LOAD` is not sent
//!   to every node (it would fail, or wait, while one is down). Later calls use `EVALSHA` again.
//! - **Waiting (pub/sub).** A Redis Cluster broadcasts every classic `PUBLISH` (a release
//!   script's included) to every node over its cluster bus, so one classic subscription on
//!   any node, primary or replica, hears the releases of every slot. The waiters' one pub/sub
//!   connection is therefore made to one node (backends start their turns at different nodes,
//!   so connections spread over the cluster); after it is lost (the node killed, paused past
//!   the ping, failed over) the next connection goes to the next known node in turn. The known
//!   nodes are the seed URLs and those the cluster reports (`CLUSTER NODES`, asked again
//!   before each connection, failed nodes left out), so a cluster whose seeds are all gone
//!   still serves waiters. Sharded pub/sub (`SSUBSCRIBE` on the slot's primary) would carry
//!   less traffic, but needs a connection per primary, moved with every slot migration and
//!   failover, with the risk of missing a release meanwhile; a missed release only delays a
//!   waiter until the holder's lease ends, but the broadcast keeps it rarer, and simpler.
//! - **Inspection.** [`RedisBackend::list`] scans every primary (`SCAN` on each, in turn);
//!   a lock taken, released or migrated during the scan may or may not be listed.
//!   [`RedisBackend::inspect`] counts the subscribers of the lock's channel on the node that
//!   holds its key only: connections subscribed through another node are not counted.
//!
//! # Failover and resharding
//!
//! - **Failover.** Redis replicates asynchronously: a lock granted just before its primary
//!   fails may be missing on the replica that takes over, and then be granted again while its
//!   first holder still believes it holds (until its next renewal, which finds the key gone
//!   or someone else's and fires the guard's [`lost`](crate::LockGuard::lost)). Fencing tokens
//!   still strictly increase: the acquire script raises the slot's counter to the server's
//!   clock (`TIME`) in microseconds, so the first token on the new primary is above every
//!   earlier one, even when the counter was not replicated either. Check tokens downstream
//!   where a double grant matters. While a primary is failing over (about the cluster's
//!   `cluster-node-timeout` plus an election), operations on its slots fail within the
//!   command timeout with [`is_backend`](crate::LockError::is_backend) errors; waiters keep
//!   looking (with backoff) until their wait runs out, and are granted once the slot has a
//!   primary again.
//! - **Resharding.** While a lock's slot migrates, its scripts follow `ASK`/`TRYAGAIN` as
//!   above; a held lock keeps its holder, its remaining lease and its token (the key and the
//!   counter move together with their slot).
//!
//! # Cost
//!
//! The same script calls as on one server, each routed to the lock's primary. Measured with
//! `examples/examples/bench_redis_cluster.rs`, which starts one server, a 3-primary cluster and
//! three Redlock nodes on one busy 2-core machine and compares them in one run (rounds vary by
//! 30 to 50%): a hand-off between two backends p50 0.47 ms (one server 0.40 ms); uncontended
//! cycles 3,000 a second for one task (0.78x one server) and 42,000 for 64 tasks on names
//! spread over the three primaries (0.81x; 1.46x in another run); 16 tasks on one name hand it
//! over 3,000 times a second (0.84x).

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, LazyLock, Mutex};
use std::time::Duration;

use redis::aio::{ConnectionLike, PubSub};
use redis::cluster::ClusterClientBuilder;
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{RoutingInfo, SingleNodeRoutingInfo};
use redis::{Cmd, ConnectionAddr, ConnectionInfo, IntoConnectionInfo, RedisFuture, RedisResult, Value};

use super::topology::{Conn, Source};
use super::{redact, RedisBackend, RedisOptions, KIND};
use crate::error::LockError;

/// The shortest and longest pause of the cluster client before it repeats a request answered
/// `TRYAGAIN` or `CLUSTERDOWN`, in milliseconds.
const RETRY_WAIT_MS: (u64, u64) = (10, 250);

impl RedisBackend {
    /// Connects to the Redis Cluster that the nodes at `urls` belong to (any nodes of it: the
    /// rest is discovered), with `options`. See the [cluster module docs](self).
    ///
    /// An empty list, a malformed URL (or a `redis+unix://` one: a cluster announces TCP
    /// addresses), options out of range or [`wait_for_replicas`](RedisOptions::wait_for_replicas)
    /// are an [`is_invalid`](crate::LockError::is_invalid)
    /// error; a cluster none of whose nodes answers within the command timeout is an
    /// [`is_backend`](crate::LockError::is_backend) error.
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), lock_runtime::LockError> {
    /// use lock_runtime::backend::redis::{RedisBackend, RedisOptions};
    /// let backend =
    ///     RedisBackend::cluster(&["redis://127.0.0.1:7000", "redis://127.0.0.1:7001"], RedisOptions::default())
    ///         .await?;
    /// # Ok(()) }
    /// ```
    pub async fn cluster<E: AsRef<str>, S: AsRef<[E]>>(urls: S, options: RedisOptions) -> Result<Self, LockError> {
        let given: Vec<&str> = urls.as_ref().iter().map(AsRef::as_ref).collect();
        let shown = given.iter().map(|u| redact(u)).collect::<Vec<_>>().join(",");
        if let Some(problem) = options.problem() {
            return Err(LockError::invalid(shown, problem));
        }
        if options.wait_for_replicas.is_some() {
            let why = "wait_for_replicas is not available on a Redis Cluster (the cluster client routes `WAIT` \
                       to no particular primary): leave it unset, or use one server or Sentinel";
            return Err(LockError::invalid(shown, why));
        }
        if given.is_empty() {
            return Err(LockError::invalid(shown, "a Redis Cluster needs at least one node URL; none was given"));
        }
        let mut seeds = Vec::with_capacity(given.len());
        for url in &given {
            let info = url.into_connection_info().map_err(|e| {
                LockError::invalid(
                    redact(url),
                    format!("not a usable Redis Cluster node URL ({e}); expected e.g. `redis://127.0.0.1:7000`"),
                )
            })?;
            if !matches!(info.addr(), ConnectionAddr::Tcp(..) | ConnectionAddr::TcpTls { .. }) {
                let why = "a Redis Cluster node URL must be a TCP one (`redis://host:port`)";
                return Err(LockError::invalid(redact(url), why));
            }
            seeds.push(info);
        }
        let timeout = options.command_timeout;
        let client = ClusterClientBuilder::new(seeds.clone())
            .connection_timeout(timeout)
            .response_timeout(timeout)
            .min_retry_wait(RETRY_WAIT_MS.0)
            .max_retry_wait(RETRY_WAIT_MS.1)
            .build()
            .map_err(|e| LockError::invalid(&shown, format!("not a usable Redis Cluster configuration ({e})")))?;
        let runtime = tokio::runtime::Handle::try_current()
            .map_err(|e| LockError::invalid(&shown, format!("the Redis backend needs a tokio runtime ({e})")))?;
        let conn = match tokio::time::timeout(timeout, client.get_async_connection()).await {
            Ok(Ok(conn)) => conn,
            Ok(Err(e)) => return Err(LockError::backend(shown, KIND, "connect", e)),
            Err(_) => return Err(LockError::timed_out(shown, KIND, "connect", timeout)),
        };
        let source = Nodes {
            seeds,
            learned: Mutex::new(Vec::new()),
            next: AtomicUsize::new(spread()),
            conn: conn.clone(),
            timeout,
        };
        Ok(Self::from_parts(Conn::Cluster(conn), Source::Cluster(Arc::new(source)), options, shown, &runtime))
    }
}

/// The nodes of a cluster that pub/sub connections are made to, in turn.
pub(super) struct Nodes {
    seeds: Vec<ConnectionInfo>,
    /// The nodes the cluster reported last (`CLUSTER NODES`), failed ones left out.
    learned: Mutex<Vec<ConnectionInfo>>,
    /// The node the next connection tries first (modulo the number of known nodes).
    next: AtomicUsize,
    conn: ClusterConnection,
    timeout: Duration,
}

impl Nodes {
    /// A pub/sub connection to the next node that takes one. The caller bounds the whole call
    /// by the command timeout; asking the cluster for its nodes, and each node tried, get a
    /// quarter of it.
    pub(super) async fn pubsub(&self) -> RedisResult<PubSub> {
        let share = self.timeout / 4;
        let mut conn = self.conn.clone();
        if let Ok(Ok(mut nodes)) = tokio::time::timeout(share, cluster_nodes(&mut conn)).await {
            // In a stable order (each node lists them in its own), so turns go round them all.
            nodes.sort_by(|a, b| (&a.host, a.port).cmp(&(&b.host, b.port)));
            let template = &self.seeds[0];
            let learned = nodes.into_iter().map(|n| node_info(template, &n.host, n.port)).collect();
            *self.learned.lock().unwrap_or_else(|e| e.into_inner()) = learned;
        }
        let mut known = self.learned.lock().unwrap_or_else(|e| e.into_inner()).clone();
        for seed in &self.seeds {
            if !known.iter().any(|k| k.addr() == seed.addr()) {
                known.push(seed.clone());
            }
        }
        let mut last = None;
        for _ in 0..known.len() {
            let node = known[self.next.fetch_add(1, Ordering::Relaxed) % known.len()].clone();
            let shown = node.addr().to_string();
            let connect = async { redis::Client::open(node)?.get_async_pubsub().await };
            match tokio::time::timeout(share, connect).await {
                Ok(Ok(pubsub)) => {
                    tracing::debug!(node = %shown, "redis cluster pub/sub connection made");
                    return Ok(pubsub);
                }
                Ok(Err(e)) => last = Some(e),
                Err(_) => {
                    let why = format!("no connection to {shown} within {share:?}");
                    last = Some(redis::RedisError::from(std::io::Error::new(std::io::ErrorKind::TimedOut, why)));
                }
            }
        }
        Err(last.unwrap_or_else(|| redis::RedisError::from((redis::ErrorKind::Client, "no Redis Cluster node known"))))
    }
}

/// Where a backend's turns over the nodes start: varies between backends and processes, so
/// their pub/sub connections spread over the cluster instead of all going to one node.
fn spread() -> usize {
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.subsec_nanos());
    (nanos as usize) ^ (std::process::id() as usize)
}

/// A node of the cluster as `CLUSTER NODES` reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Node {
    host: String,
    port: u16,
    primary: bool,
}

/// The reachable-looking nodes of the cluster (`CLUSTER NODES` asked of any node): those
/// flagged failing, in handshake or without an address are left out.
async fn cluster_nodes(conn: &mut ClusterConnection) -> RedisResult<Vec<Node>> {
    let text: String = redis::cmd("CLUSTER").arg("NODES").query_async(conn).await?;
    Ok(parse_nodes(&text))
}

fn parse_nodes(text: &str) -> Vec<Node> {
    text.lines()
        .filter_map(|line| {
            let mut fields = line.split_whitespace();
            let (_id, addr, flags) = (fields.next()?, fields.next()?, fields.next()?);
            if flags.split(',').any(|f| matches!(f, "fail" | "fail?" | "handshake" | "noaddr")) {
                return None;
            }
            // `host:port@cport[,hostname]`
            let addr = addr.split(['@', ',']).next()?;
            let (host, port) = addr.rsplit_once(':')?;
            let port: u16 = port.parse().ok().filter(|p| *p != 0)?;
            if host.is_empty() {
                return None;
            }
            let primary = flags.split(',').any(|f| f == "master");
            Some(Node { host: host.to_owned(), port, primary })
        })
        .collect()
}

/// `template` (credentials, TLS, protocol) at `host:port`.
fn node_info(template: &ConnectionInfo, host: &str, port: u16) -> ConnectionInfo {
    let addr = match template.addr() {
        ConnectionAddr::TcpTls { insecure, tls_params, .. } => {
            ConnectionAddr::TcpTls { host: host.to_owned(), port, insecure: *insecure, tls_params: tls_params.clone() }
        }
        _ => ConnectionAddr::Tcp(host.to_owned(), port),
    };
    template.clone().set_addr(addr)
}

/// The keys matching `pattern` on every primary of the cluster (`SCAN` on each in turn).
pub(super) async fn scan_primaries(conn: &ClusterConnection, pattern: &str, count: usize) -> RedisResult<Vec<String>> {
    let mut conn = conn.clone();
    let primaries: Vec<Node> = cluster_nodes(&mut conn).await?.into_iter().filter(|n| n.primary).collect();
    let mut keys = Vec::new();
    for node in primaries {
        let mut cursor: u64 = 0;
        loop {
            let mut scan = redis::cmd("SCAN");
            scan.arg(cursor).arg("MATCH").arg(pattern).arg("COUNT").arg(count);
            let route = SingleNodeRoutingInfo::ByAddress { host: node.host.clone(), port: node.port };
            let value = conn.route_command(scan, RoutingInfo::SingleNode(route)).await?;
            let (next, batch): (u64, Vec<String>) = redis::from_redis_value(value)?;
            keys.extend(batch);
            if next == 0 {
                break;
            }
            cursor = next;
        }
    }
    Ok(keys)
}

/// The sources of the scripts sent on cluster connections, by SHA1 (a handful: the backend's
/// scripts).
static SOURCES: LazyLock<Mutex<HashMap<String, Arc<[u8]>>>> = LazyLock::new(Default::default);

/// One command on the cluster. `SCRIPT LOAD` only records the source (answering its SHA1) and
/// an `EVALSHA` answered `NOSCRIPT` is sent again as `EVAL` of the recorded source, so a
/// script reaches exactly the node that runs it (see the [module docs](self)).
pub(super) fn command<'a>(conn: &'a mut ClusterConnection, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
    Box::pin(async move {
        let args: Vec<&[u8]> = cmd
            .args_iter()
            .filter_map(|a| match a {
                redis::Arg::Simple(a) => Some(a),
                _ => None,
            })
            .collect();
        let verb = |i: usize, word: &str| args.get(i).is_some_and(|a| a.eq_ignore_ascii_case(word.as_bytes()));
        if verb(0, "SCRIPT") && verb(1, "LOAD") && args.len() == 3 {
            if let Ok(source) = std::str::from_utf8(args[2]) {
                let sha = redis::Script::new(source).get_hash().to_owned();
                SOURCES.lock().unwrap_or_else(|e| e.into_inner()).insert(sha.clone(), Arc::from(args[2]));
                return Ok(Value::BulkString(sha.into_bytes()));
            }
        }
        let answer = conn.req_packed_command(cmd).await;
        // A server's error comes back as a value (or, from some paths, as an error).
        let noscript = match &answer {
            Ok(Value::ServerError(e)) => e.kind() == Some(redis::ServerErrorKind::NoScript),
            Err(e) => e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript),
            Ok(_) => false,
        };
        match answer {
            _ if noscript && verb(0, "EVALSHA") && args.len() >= 3 => {
                let source = std::str::from_utf8(args[1]).ok().and_then(|sha| {
                    SOURCES.lock().unwrap_or_else(|e| e.into_inner()).get(&sha.to_ascii_lowercase()).cloned()
                });
                let Some(source) = source else { return answer };
                let mut eval = redis::cmd("EVAL");
                eval.arg(&*source);
                for arg in &args[2..] {
                    eval.arg(*arg);
                }
                conn.req_packed_command(&eval).await
            }
            other => other,
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cluster_nodes_are_read() {
        let text = "\
07c3 127.0.0.1:30004@31004,host-a slave e7d1 0 1426238317239 4 connected
67ed 127.0.0.1:30002@31002 master - 0 1426238316232 2 connected 5461-10922
292f 127.0.0.1:30003@31003 master,fail - 0 1426238318243 3 disconnected 10923-16383
6ec2 127.0.0.1:30005@31005 handshake - 0 0 0 connected
824f :0@0 myself,master - 0 0 1 connected
e7d1 127.0.0.1:30001@31001 myself,master - 0 0 1 connected 0-5460
";
        let nodes = parse_nodes(text);
        let shown: Vec<(u16, bool)> = nodes.iter().map(|n| (n.port, n.primary)).collect();
        assert_eq!(shown, [(30004, false), (30002, true), (30001, true)]);
        assert!(nodes.iter().all(|n| n.host == "127.0.0.1"));
    }

    #[test]
    fn learned_nodes_keep_the_seed_credentials() {
        let seed = "redis://user:pw@10.0.0.1:7000".into_connection_info().expect("url");
        let node = node_info(&seed, "10.0.0.2", 7001);
        assert_eq!(node.addr(), &ConnectionAddr::Tcp("10.0.0.2".into(), 7001));
        assert_eq!(node.redis_settings().password(), Some("pw"));
    }
}
