#![doc = include_str!("cluster.md")]

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use redis::aio::{ConnectionLike, PubSub};
use redis::cluster::{ClusterClient, ClusterClientBuilder};
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{RoutingInfo, SingleNodeRoutingInfo};
use redis::{Cmd, ConnectionAddr, ConnectionInfo, RedisFuture, RedisResult, Value};

use super::options::RedisOptions;
use super::options::KIND;
use super::url::{self, redact};
use crate::error::LockError;

/// The shortest and longest pause of the cluster client before it repeats a request answered
/// `TRYAGAIN` or `CLUSTERDOWN`, in milliseconds.
const RETRY_WAIT_MS: (u64, u64) = (10, 250);

/// Connects to the Redis Cluster that the nodes at `given` belong to, with `options` (see
/// `RedisBackend::cluster`): its connection, the source of its pub/sub connections, the nodes
/// as shown in messages, and the runtime.
pub(super) async fn connect(given: &[&str], options: &RedisOptions) -> Result<Connected, LockError> {
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
    let seeds = seeds(given, options)?;
    let timeout = options.command_timeout;
    let builder = ClusterClientBuilder::new(seeds.clone());
    #[cfg(feature = "_tls")]
    let builder = match options.get_tls() {
        Some(settings) => builder.certs(url::certificates(settings, &shown)?),
        None => builder,
    };
    let client = builder
        .tcp_settings(url::tcp_settings(Default::default(), options))
        .connection_timeout(timeout)
        .response_timeout(timeout)
        .min_retry_wait(RETRY_WAIT_MS.0)
        .max_retry_wait(RETRY_WAIT_MS.1)
        .build()
        .map_err(|e| LockError::invalid(&shown, format!("not a usable Redis Cluster configuration ({e})")))?;
    on_cluster(client, seeds, options, shown).await
}

/// Connects on the application's own cluster `client`, with `given` node URLs for the pub/sub
/// connections (see `RedisBackend::cluster_from_client`).
pub(super) async fn connect_client(
    client: ClusterClient,
    given: &[&str],
    options: &RedisOptions,
) -> Result<Connected, LockError> {
    let shown = given.iter().map(|u| redact(u)).collect::<Vec<_>>().join(",");
    options.check_beside_client(&shown)?;
    if options.wait_for_replicas.is_some() {
        let why = "wait_for_replicas is not available on a Redis Cluster: leave it unset";
        return Err(LockError::invalid(shown, why));
    }
    if given.is_empty() {
        let why = "give the URL of at least one of the cluster's nodes, for the pub/sub connections";
        return Err(LockError::invalid(shown, why));
    }
    let seeds = seeds(given, options)?;
    on_cluster(client, seeds, options, shown).await
}

/// A connected cluster: its connection (with how long a command waits on one node), its nodes
/// (the source of pub/sub connections), the nodes as shown in messages, and the runtime.
pub(super) type Connected = ((ClusterConnection, Silence), Arc<Nodes>, String, tokio::runtime::Handle);

/// How long a command waits for the node serving its key before it is sent on to another
/// primary (see [`command`]), and how many times: a third of the command timeout, twice, so
/// that the third try still has a third.
#[derive(Debug, Clone, Copy)]
pub(super) struct Silence {
    after: Duration,
}

impl Silence {
    /// Tries sent on after a silence: the first one's, then one more.
    const TRIES: usize = 2;

    fn of(timeout: Duration) -> Silence {
        Silence { after: timeout / 3 }
    }
}

/// Connects on cluster `client`, with `seeds` for the pub/sub connections.
async fn on_cluster(
    client: ClusterClient,
    seeds: Vec<ConnectionInfo>,
    options: &RedisOptions,
    shown: String,
) -> Result<Connected, LockError> {
    let timeout = options.command_timeout;
    let runtime = tokio::runtime::Handle::try_current()
        .map_err(|e| LockError::invalid(&shown, format!("the Redis backend needs a tokio runtime ({e})")))?;
    let conn = match tokio::time::timeout(timeout, client.get_async_connection()).await {
        Ok(Ok(conn)) => conn,
        Ok(Err(e)) => return Err(LockError::backend(shown, KIND, "connect", e)),
        Err(_) => return Err(LockError::timed_out(shown, KIND, "connect", timeout)),
    };
    let source =
        Nodes { seeds, learned: Mutex::new(Vec::new()), next: AtomicUsize::new(spread()), conn: conn.clone(), timeout };
    Ok(((conn, Silence::of(timeout)), Arc::new(source), shown, runtime))
}

/// The connection settings of each node URL in `given` (TCP only).
fn seeds(given: &[&str], options: &RedisOptions) -> Result<Vec<ConnectionInfo>, LockError> {
    let mut seeds = Vec::with_capacity(given.len());
    for url in given {
        let info = url::connection_info(url, options, "`redis://127.0.0.1:7000` (a Cluster node)")?;
        if !matches!(info.addr(), ConnectionAddr::Tcp(..) | ConnectionAddr::TcpTls { .. }) {
            let why = "a Redis Cluster node URL must be a TCP one (`redis://host:port`)";
            return Err(LockError::invalid(redact(url), why));
        }
        seeds.push(info);
    }
    Ok(seeds)
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
            let learned = nodes.into_iter().map(|n| url::at(template, &n.host, n.port)).collect();
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

/// One command on the cluster. `SCRIPT LOAD` only records the source (answering its SHA1) and
/// an `EVALSHA` answered `NOSCRIPT` is sent again as `EVAL` of the recorded source, so a
/// script reaches exactly the node that runs it (see the [module docs](self)).
///
/// A node that does not answer within `silence` may be a primary cut off from the cluster and
/// replaced by its replica, while the cluster client's slot map still names it: nothing there
/// answers `MOVED`, the client waits on it and sends again to it, and the slot's new primary is
/// never asked. So the command goes on to a random primary, which runs it if it serves the slot
/// now or answers `MOVED` to the one that does; the client follows the redirect and rebuilds
/// its slot map (sending again is safe: `resend.rs`).
pub(super) fn command<'a>(conn: &'a mut ClusterConnection, silence: Silence, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
    Box::pin(async move {
        let args = super::resend::args(cmd);
        let verb = |i: usize, word: &str| args.get(i).is_some_and(|a| a.eq_ignore_ascii_case(word.as_bytes()));
        if verb(0, "SCRIPT") && verb(1, "LOAD") && args.len() == 3 {
            if let Ok(source) = std::str::from_utf8(args[2]) {
                let sha = redis::Script::new(source).get_hash().to_owned();
                super::resend::remember(&sha, args[2]);
                return Ok(Value::BulkString(sha.into_bytes()));
            }
        }
        let mut answer = tokio::time::timeout(silence.after, conn.req_packed_command(cmd)).await;
        for _ in 1..Silence::TRIES {
            if answer.is_ok() {
                break;
            }
            let elsewhere = RoutingInfo::SingleNode(SingleNodeRoutingInfo::RandomPrimary);
            answer = tokio::time::timeout(silence.after, conn.route_command(cmd.clone(), elsewhere)).await;
        }
        let answer = match answer {
            Ok(answer) => answer,
            // The last try has the rest of the caller's bound.
            Err(_) => {
                let elsewhere = RoutingInfo::SingleNode(SingleNodeRoutingInfo::RandomPrimary);
                conn.route_command(cmd.clone(), elsewhere).await
            }
        };
        match answer {
            _ if super::resend::noscript(&answer) && verb(0, "EVALSHA") && args.len() >= 3 => {
                let Some(source) = super::resend::source(args[1]) else { return answer };
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
}
