//! A real Redis Cluster for the cluster backend tests: `redis-server` processes in cluster
//! mode on free loopback ports (client and bus ports both picked free), one temporary
//! directory, no persistence, joined with `redis-cli --cluster create`. Every node is killed
//! by its own pid when the cluster is dropped (or, for a cluster kept in a static, by a small
//! reaper when the test binary exits).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashSet;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use lock_runtime::backend::redis::{key_slot, KeyLayout};

use crate::free_port;
use crate::redis_server::Place;
use crate::server_process::ServerProcess;

/// How long a node may take to answer one command of the harness.
const NODE_TIMEOUT: Duration = Duration::from_secs(2);
/// Keys moved per `MIGRATE` by [`RedisCluster::migrate_slot`].
const MIGRATE_BATCH: usize = 100;

/// One node of a [`RedisCluster`].
#[derive(Debug)]
struct Node {
    ip: std::net::Ipv4Addr,
    port: u16,
    /// The TLS port of a node of [`RedisCluster::start_tls`].
    tls_port: Option<u16>,
    process: ServerProcess,
}

/// A Redis Cluster this test owns.
#[derive(Debug)]
pub struct RedisCluster {
    nodes: Vec<Node>,
    /// The private network of a partitionable cluster (after the nodes: dropped after them).
    net: Option<crate::netns::Net>,
}

/// A primary as a node sees it in `CLUSTER NODES`: its port and the slots it owns.
#[derive(Debug, Clone)]
struct Owner {
    port: u16,
    slots: Vec<(u16, u16)>,
}

impl RedisCluster {
    /// Starts `primaries` primaries with `replicas_per_primary` replicas each, creates the
    /// cluster and waits until every node sees every slot served and every other node
    /// connected (so a `PUBLISH` anywhere reaches every node).
    ///
    /// Panics (it is test support) when `redis-server` / `redis-cli` are missing or the cluster
    /// does not form within 30 s.
    pub fn start(primaries: usize, replicas_per_primary: usize) -> Self {
        Self::launch(primaries, replicas_per_primary, None, None)
    }

    /// [`start`](Self::start) on a private network with `clients` client namespaces
    /// (`netns`): node `i` in the namespace of member `i` (a machine of its own; the first
    /// `primaries` are the primaries), so that links can be cut.
    pub fn start_partitionable(primaries: usize, replicas_per_primary: usize, clients: usize) -> Self {
        let net = crate::netns::Net::new(primaries * (1 + replicas_per_primary), clients);
        Self::launch(primaries, replicas_per_primary, None, Some(net))
    }

    /// The private network, in a partitionable cluster.
    pub fn net(&self) -> Option<&crate::netns::Net> {
        self.net.as_ref()
    }

    /// [`start`](Self::start) with a TLS port beside each node's plaintext one (the tests'
    /// own queries keep using the plaintext ports) and the cluster bus over TLS, so that a
    /// client connected over TLS is told the nodes' TLS ports; clients need no certificate.
    pub fn start_tls(certs: &crate::tls_certs::Certs, primaries: usize) -> Self {
        Self::launch(primaries, 0, Some(certs), None)
    }

    fn launch(
        primaries: usize,
        replicas_per_primary: usize,
        tls: Option<&crate::tls_certs::Certs>,
        net: Option<crate::netns::Net>,
    ) -> Self {
        assert!(primaries >= 1, "a cluster needs a primary");
        let total = primaries * (1 + replicas_per_primary);
        let mut taken = HashSet::new();
        let mut port = || loop {
            let p = free_port();
            if taken.insert(p) {
                return p;
            }
        };
        let tls_args = |tls_port: u16| {
            let certs = tls?;
            let path = |f: &str| certs.path(f).to_string_lossy().into_owned();
            Some(vec![
                "--tls-port".to_owned(),
                tls_port.to_string(),
                "--tls-cluster".to_owned(),
                "yes".to_owned(),
                "--tls-auth-clients".to_owned(),
                "no".to_owned(),
                "--tls-cert-file".to_owned(),
                path("server.pem"),
                "--tls-key-file".to_owned(),
                path("server.key"),
                "--tls-ca-cert-file".to_owned(),
                path("ca.pem"),
            ])
        };
        let nodes = (0..total)
            .map(|i| {
                let (p, bus, tls_port) = (port(), port(), port());
                let place = net.as_ref().map_or_else(Place::loopback, |n| Place::member(n, i));
                node(&place, p, bus, tls_args(tls_port).map(|args| (tls_port, args)))
            })
            .collect();
        let cluster = RedisCluster { nodes, net };
        let addresses: Vec<String> = cluster.nodes.iter().map(|n| format!("{}:{}", n.ip, n.port)).collect();
        // Bounded: `redis-cli` waits for the nodes to join for as long as it takes.
        let out = Command::new("timeout")
            .args(["60", "redis-cli"])
            .arg("--cluster")
            .arg("create")
            .args(&addresses)
            .args(["--cluster-replicas", &replicas_per_primary.to_string(), "--cluster-yes"])
            .stdin(Stdio::null())
            .output()
            .expect("run `redis-cli --cluster create` (install redis-tools)");
        assert!(
            out.status.success(),
            "redis-cli --cluster create failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        cluster.wait_healthy(Duration::from_secs(30));
        cluster
    }

    /// One command on node `i`, bounded by `NODE_TIMEOUT`.
    pub fn query<T: redis::FromRedisValue>(&self, i: usize, args: &[&str]) -> Result<T, String> {
        let client = redis::Client::open(self.url(i)).map_err(|e| e.to_string())?;
        let mut conn = client.get_connection_with_timeout(NODE_TIMEOUT).map_err(|e| e.to_string())?;
        conn.set_read_timeout(Some(NODE_TIMEOUT)).map_err(|e| e.to_string())?;
        conn.set_write_timeout(Some(NODE_TIMEOUT)).map_err(|e| e.to_string())?;
        let mut cmd = redis::cmd(args[0]);
        for arg in &args[1..] {
            cmd.arg(*arg);
        }
        cmd.query(&mut conn).map_err(|e| e.to_string())
    }

    /// The URLs of every node (killed ones included), in index order.
    pub fn urls(&self) -> Vec<String> {
        (0..self.nodes.len()).map(|i| self.url(i)).collect()
    }

    /// `redis://<ip>:<port>` of node `i` (loopback, or its member's address on a private
    /// network).
    pub fn url(&self, i: usize) -> String {
        format!("redis://{}:{}", self.nodes[i].ip, self.nodes[i].port)
    }

    /// `rediss://localhost:<TLS port>` of node `i` of a [`start_tls`](Self::start_tls) cluster.
    pub fn tls_url(&self, i: usize) -> String {
        format!("rediss://localhost:{}", self.nodes[i].tls_port.expect("a TLS cluster"))
    }

    /// The client port of node `i`.
    pub fn port(&self, i: usize) -> u16 {
        self.nodes[i].port
    }

    /// How many nodes the cluster was started with.
    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    /// Whether the cluster has no node (never: [`start`](Self::start) refuses that).
    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    /// Whether node `i` runs (not killed; maybe paused).
    pub fn running(&self, i: usize) -> bool {
        self.nodes[i].process.running()
    }

    fn index_of(&self, port: u16) -> usize {
        self.nodes.iter().position(|n| n.port == port).expect("a node of this cluster")
    }

    /// Kills node `i` with SIGKILL (its data is gone: no persistence).
    pub fn kill(&mut self, i: usize) {
        self.nodes[i].process.kill();
    }

    /// Starts node `i` again on its ports with its cluster configuration (it rejoins; a
    /// primary that was failed over comes back as a replica), with an empty dataset.
    pub fn restart(&mut self, i: usize) {
        self.nodes[i].process.restart();
    }

    /// Freezes node `i` (SIGSTOP): connections stay open, nothing is answered.
    pub fn pause(&self, i: usize) {
        self.nodes[i].process.pause();
    }

    /// Lets a paused node run again (SIGCONT).
    pub fn resume(&self, i: usize) {
        self.nodes[i].process.resume();
    }

    /// The node index of the primary serving `slot`, as the first running node that answers
    /// sees it.
    pub fn slot_owner(&self, slot: u16) -> usize {
        let owners = (0..self.nodes.len())
            .filter(|&i| self.running(i))
            .find_map(|i| self.owners(i).ok())
            .expect("a running node answers CLUSTER NODES");
        let owner = owners.iter().find(|o| o.slots.iter().any(|&(a, b)| (a..=b).contains(&slot)));
        self.index_of(owner.expect("every slot is served").port)
    }

    /// The node index of the primary serving the lock of backend key `key` (the manager
    /// prefix followed by the lock name).
    pub fn primary_of(&self, key: &str) -> usize {
        self.slot_owner(slot_of(key))
    }

    /// The node indexes of the running primaries.
    pub fn primaries(&self) -> Vec<usize> {
        let owners = (0..self.nodes.len())
            .filter(|&i| self.running(i))
            .find_map(|i| self.owners(i).ok())
            .expect("a running node answers CLUSTER NODES");
        owners.iter().filter(|o| !o.slots.is_empty()).map(|o| self.index_of(o.port)).collect()
    }

    /// The primaries node `i` sees (failed ones left out), with their slots.
    fn owners(&self, i: usize) -> Result<Vec<Owner>, String> {
        let text: String = self.query(i, &["CLUSTER", "NODES"])?;
        Ok(text
            .lines()
            .filter_map(|line| {
                let fields: Vec<&str> = line.split_whitespace().collect();
                let flags = *fields.get(2)?;
                if !flags.split(',').any(|f| f == "master") || flags.split(',').any(|f| f.starts_with("fail")) {
                    return None;
                }
                let port = fields[1].split(['@', ',']).next()?.rsplit_once(':')?.1.parse().ok()?;
                let slots = fields[8..]
                    .iter()
                    .filter(|s| !s.starts_with('['))
                    .filter_map(|s| match s.split_once('-') {
                        Some((a, b)) => Some((a.parse().ok()?, b.parse().ok()?)),
                        None => s.parse().ok().map(|a| (a, a)),
                    })
                    .collect();
                Some(Owner { port, slots })
            })
            .collect())
    }

    /// The node id of node `i`.
    pub fn node_id(&self, i: usize) -> String {
        self.query(i, &["CLUSTER", "MYID"]).expect("CLUSTER MYID")
    }

    /// Whether every running node reports `cluster_state:ok`, sees every slot served by a
    /// running primary, and sees every other running node connected, and every replica is in
    /// sync with its primary.
    fn healthy(&self) -> bool {
        let running: Vec<usize> = (0..self.nodes.len()).filter(|&i| self.running(i)).collect();
        let live: HashSet<u16> = running.iter().map(|&i| self.nodes[i].port).collect();
        running.iter().all(|&i| {
            let info: String = match self.query(i, &["CLUSTER", "INFO"]) {
                Ok(info) => info,
                Err(_) => return false,
            };
            if !info.lines().any(|l| l.trim() == "cluster_state:ok") {
                return false;
            }
            let Ok(owners) = self.owners(i) else { return false };
            let covered: usize = owners
                .iter()
                .filter(|o| live.contains(&o.port))
                .flat_map(|o| o.slots.iter())
                .map(|&(a, b)| usize::from(b - a) + 1)
                .sum();
            let Ok(text) = self.query::<String>(i, &["CLUSTER", "NODES"]) else { return false };
            let connected = text
                .lines()
                .filter(|l| l.split_whitespace().nth(7) == Some("connected"))
                .filter(|l| !l.split_whitespace().nth(2).unwrap_or("").contains("fail"))
                .count();
            // A replica that never synced cannot take over: wait for its link.
            let Ok(replication) = self.query::<String>(i, &["INFO", "replication"]) else { return false };
            let synced = !replication.lines().any(|l| l.trim() == "role:slave")
                || replication.lines().any(|l| l.trim() == "master_link_status:up");
            covered == 16_384 && connected == running.len() && synced
        })
    }

    /// Waits (polling the nodes: there is no signal) until the cluster is healthy: every
    /// running node reports `cluster_state:ok`, every slot is served by a running primary,
    /// every running node sees the others connected, and every replica's link to its primary
    /// is up. Panics after `within`.
    pub fn wait_healthy(&self, within: Duration) {
        let started = Instant::now();
        while !self.healthy() {
            if started.elapsed() > within {
                let views: Vec<String> = (0..self.nodes.len())
                    .filter(|&i| self.running(i))
                    .map(|i| {
                        let info: String = self.query(i, &["CLUSTER", "INFO"]).unwrap_or_default();
                        let state = info.lines().find(|l| l.starts_with("cluster_state")).unwrap_or("").to_owned();
                        let nodes: String = self.query(i, &["CLUSTER", "NODES"]).unwrap_or_default();
                        format!("node {i} ({state}):\n{nodes}")
                    })
                    .collect();
                panic!("the cluster did not become healthy within {within:?}:\n{}", views.join("\n"));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Waits until the slots of the killed primary `killed` are served by a replica promoted
    /// in its place and the cluster is healthy again (see [`wait_healthy`](Self::wait_healthy));
    /// returns the promoted node's index. Panics after `within`.
    pub fn wait_for_failover(&self, killed: usize, within: Duration) -> usize {
        assert!(!self.running(killed), "kill node {killed} first");
        self.wait_healthy(within);
        let killed_port = self.nodes[killed].port;
        let promoted: Vec<usize> =
            self.primaries().into_iter().filter(|&i| self.nodes[i].port != killed_port).collect();
        // The promoted replica won an election: its config epoch is above every other's.
        *promoted.iter().max_by_key(|&&i| self.config_epoch(i)).expect("a promoted primary")
    }

    /// The config epoch of node `i` (a promotion raises it above every other).
    fn config_epoch(&self, i: usize) -> u64 {
        let info: String = self.query(i, &["CLUSTER", "INFO"]).unwrap_or_default();
        info.lines().find_map(|l| l.trim().strip_prefix("cluster_my_epoch:")).and_then(|e| e.parse().ok()).unwrap_or(0)
    }

    /// Moves `slot` from primary `from` to primary `to` as `redis-cli --cluster reshard` does:
    /// `CLUSTER SETSLOT IMPORTING` / `MIGRATING`, its keys moved in batches (`CLUSTER
    /// GETKEYSINSLOT`, `MIGRATE`), then `CLUSTER SETSLOT NODE` on every primary.
    pub fn migrate_slot(&self, slot: u16, from: usize, to: usize) {
        let slot_text = slot.to_string();
        let (from_id, to_id) = (self.node_id(from), self.node_id(to));
        let _: String = self.query(to, &["CLUSTER", "SETSLOT", &slot_text, "IMPORTING", &from_id]).expect("IMPORTING");
        let _: String = self.query(from, &["CLUSTER", "SETSLOT", &slot_text, "MIGRATING", &to_id]).expect("MIGRATING");
        let (to_ip, to_port) = (self.nodes[to].ip.to_string(), self.port(to).to_string());
        let batch = MIGRATE_BATCH.to_string();
        loop {
            let keys: Vec<String> =
                self.query(from, &["CLUSTER", "GETKEYSINSLOT", &slot_text, &batch]).expect("GETKEYSINSLOT");
            if keys.is_empty() {
                break;
            }
            let mut args = vec!["MIGRATE", &to_ip, &to_port, "", "0", "5000", "KEYS"];
            args.extend(keys.iter().map(String::as_str));
            let _: String = self.query(from, &args).expect("MIGRATE");
        }
        let _: String = self.query(to, &["CLUSTER", "SETSLOT", &slot_text, "NODE", &to_id]).expect("SETSLOT NODE");
        let _: String = self.query(from, &["CLUSTER", "SETSLOT", &slot_text, "NODE", &to_id]).expect("SETSLOT NODE");
        for other in self.primaries() {
            if other != from && other != to {
                let _: Result<String, _> = self.query(other, &["CLUSTER", "SETSLOT", &slot_text, "NODE", &to_id]);
            }
        }
    }
}

/// The hash slot of the lock of backend key `key`.
pub fn slot_of(key: &str) -> u16 {
    key_slot(KeyLayout::of(key).lock.as_bytes())
}

/// Starts a cluster-mode node on `port` (cluster bus on `bus`; with `tls`, a TLS port and its
/// arguments too), in a directory of its own with its cluster configuration, and waits until
/// it answers `PING`.
fn node(place: &Place, port: u16, bus: u16, tls: Option<(u16, Vec<String>)>) -> Node {
    let tls_port = tls.as_ref().map(|(p, _)| *p);
    let tls_args = tls.map(|(_, args)| args).unwrap_or_default();
    let (at, ip) = (place.clone(), place.ip);
    let spawn = move |dir: &std::path::Path| {
        let mut redis = at.command("redis-server");
        redis
            .args(["--port", &port.to_string(), "--bind", &ip.to_string(), "--cluster-enabled", "yes"])
            .args(["--cluster-port", &bus.to_string()])
            .args(["--cluster-config-file", &dir.join("nodes.conf").to_string_lossy()])
            .args(["--cluster-node-timeout", "1000", "--save", "", "--appendonly", "no"])
            // Replicas sync at once (the default waits 5 s for more replicas to share a transfer).
            .args(["--repl-diskless-sync-delay", "0"])
            .args(["--protected-mode", "no", "--daemonize", "no", "--dir", &dir.to_string_lossy()])
            .args(&tls_args);
        redis
    };
    let dir = ServerProcess::temp_dir("redis-cluster-node");
    let ready = move || crate::redis_server::ping_at(ip, port);
    let mut process = ServerProcess::new("redis-server (cluster)", dir, spawn, ready, Duration::from_secs(10));
    process.start();
    Node { ip, port, tls_port, process }
}

/// One 3-primary cluster (no replicas) shared by the tests of a binary that neither kill,
/// pause nor reshard it (killed by its reapers when the binary exits). Tests that do start
/// their own.
pub fn shared() -> &'static RedisCluster {
    static CLUSTER: std::sync::OnceLock<RedisCluster> = std::sync::OnceLock::new();
    CLUSTER.get_or_init(|| RedisCluster::start(3, 0))
}
