//! A real etcd cluster of three (or five) members for the ensemble tests: each member an `etcd`
//! process of its own on free loopback ports (client, peer, metrics) with its own data
//! directory, any member killed, stopped (SIGSTOP: cut off from its peers and clients with its
//! sockets open), continued or restarted on its own data, and the leader found from the
//! members' metrics.
//!
//! ```ignore
//! let mut cluster = lock_tests::etcd_cluster::EtcdCluster::start(3);
//! let manager = lock_runtime::LockManager::etcd(&cluster.endpoints()).await?;
//! let leader = cluster.leader();
//! cluster.member(leader).process.pause();   // SIGSTOP
//! cluster.member(leader).process.resume();  // SIGCONT
//! ```

#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)]

use std::io::{Read, Write};
use std::net::{Ipv4Addr, TcpStream};
use std::process::Command;
use std::time::{Duration, Instant};

use crate::free_port;
use crate::netns::{End, Net};
use crate::server_process::ServerProcess;

/// One member of an [`EtcdCluster`].
#[derive(Debug)]
pub struct Member {
    /// Its address: loopback, or its own in a partitionable cluster.
    pub ip: Ipv4Addr,
    /// The client port.
    pub port: u16,
    metrics_port: u16,
    /// Its server process: `kill` (SIGKILL, as a crash), `restart` on its ports and data
    /// (waiting until it serves, when the ensemble has a quorum with it), `pause` (SIGSTOP),
    /// `resume` (SIGCONT).
    pub process: ServerProcess,
}

impl Member {
    /// `http://<ip>:<port>`.
    pub fn endpoint(&self) -> String {
        format!("http://{}:{}", self.ip, self.port)
    }

    /// Whether the member answers `/health` as healthy (it has a leader) right now.
    pub fn healthy(&self) -> bool {
        metrics_get(self.ip, self.metrics_port, "/health").is_some_and(|a| a.contains("\"health\":\"true\""))
    }

    /// Whether the member says it is the leader right now.
    pub fn is_leader(&self) -> bool {
        metrics_get(self.ip, self.metrics_port, "/metrics")
            .is_some_and(|a| a.lines().any(|l| l == "etcd_server_is_leader 1"))
    }
}

/// A cluster of etcd members on loopback, each killed on drop.
#[derive(Debug)]
pub struct EtcdCluster {
    members: Vec<Member>,
    /// The private network of a partitionable cluster (after `members`: dropped after them).
    net: Option<Net>,
}

impl EtcdCluster {
    /// Starts `size` members (3 or 5) and waits until every one is healthy. Panics (failing
    /// the test) if `etcd` is missing or the cluster does not form within 30 s.
    pub fn start(size: usize) -> EtcdCluster {
        Self::start_in(size, None)
    }

    /// A cluster whose members each run in a network namespace of their own on a private
    /// network with `clients` client namespaces (`netns`): links can be cut.
    pub fn start_partitionable(size: usize, clients: usize) -> EtcdCluster {
        Self::start_in(size, Some(Net::new(size, clients)))
    }

    /// The private network, in a partitionable cluster.
    pub fn net(&self) -> Option<&Net> {
        self.net.as_ref()
    }

    fn start_in(size: usize, net: Option<Net>) -> EtcdCluster {
        assert!(size >= 1, "a cluster has members");
        let ips: Vec<Ipv4Addr> =
            (0..size).map(|i| net.as_ref().map_or(Ipv4Addr::LOCALHOST, |n| n.addr(End::Member(i)))).collect();
        let ports: Vec<(u16, u16, u16)> = (0..size).map(|_| (free_port(), free_port(), free_port())).collect();
        let token = format!("lock-tests-{}-{}", std::process::id(), ports[0].0);
        let initial: Vec<String> =
            ports.iter().enumerate().map(|(i, (_, peer, _))| format!("m{i}=http://{}:{peer}", ips[i])).collect();
        let initial = initial.join(",");
        let mut members = Vec::with_capacity(size);
        for (i, &(port, peer_port, metrics_port)) in ports.iter().enumerate() {
            let (initial, token, ip) = (initial.clone(), token.clone(), ips[i]);
            let command = net.as_ref().map_or_else(|| Command::new("etcd"), |n| n.command(End::Member(i), "etcd"));
            let (program, args): (String, Vec<String>) = (
                command.get_program().to_string_lossy().into_owned(),
                command.get_args().map(|a| a.to_string_lossy().into_owned()).collect(),
            );
            let spawn = move |dir: &std::path::Path| {
                let client = format!("http://{ip}:{port}");
                let peer = format!("http://{ip}:{peer_port}");
                let metrics = format!("http://{ip}:{metrics_port}");
                let mut etcd = Command::new(&program);
                etcd.args(&args);
                etcd.args(["--name", &format!("m{i}"), "--data-dir", &dir.join("data").to_string_lossy()])
                    .args(["--listen-client-urls", &client, "--advertise-client-urls", &client])
                    .args(["--listen-peer-urls", &peer, "--initial-advertise-peer-urls", &peer])
                    .args(["--listen-metrics-urls", &metrics])
                    .args(["--initial-cluster", &initial, "--initial-cluster-token", &token])
                    .args(["--initial-cluster-state", "new", "--log-level", "warn"]);
                etcd
            };
            let dir = ServerProcess::temp_dir(&format!("etcd-m{i}"));
            // A member listens before the cluster has a leader: it is "started" once its client
            // port takes connections; the cluster waits for health below.
            let ready = move || TcpStream::connect((ip, port)).is_ok();
            let mut process = ServerProcess::new("etcd", dir, spawn, ready, Duration::from_secs(20));
            process.start();
            members.push(Member { ip, port, metrics_port, process });
        }
        let cluster = EtcdCluster { members, net };
        cluster.wait_healthy(Duration::from_secs(60));
        cluster
    }

    /// Every member's client endpoint, in member order.
    pub fn endpoints(&self) -> Vec<String> {
        self.members.iter().map(Member::endpoint).collect()
    }

    /// `etcd://h:p,h:p,h:p`, for `LockManager::connect`.
    pub fn url(&self) -> String {
        let hosts: Vec<String> = self.members.iter().map(|m| format!("{}:{}", m.ip, m.port)).collect();
        format!("etcd://{}", hosts.join(","))
    }

    /// Member `i`.
    pub fn member(&mut self, i: usize) -> &mut Member {
        &mut self.members[i]
    }

    /// How many members.
    pub fn size(&self) -> usize {
        self.members.len()
    }

    /// The index of the leader, waiting (up to 30 s) until exactly one running member says it
    /// leads.
    pub fn leader(&self) -> usize {
        let started = Instant::now();
        loop {
            let leaders: Vec<usize> = (0..self.members.len())
                .filter(|&i| self.members[i].process.running() && self.members[i].is_leader())
                .collect();
            if let [one] = leaders[..] {
                return one;
            }
            assert!(started.elapsed() < Duration::from_secs(30), "no single etcd leader within 30 s: {leaders:?}");
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// A member that is not the leader.
    pub fn follower(&self) -> usize {
        let leader = self.leader();
        (leader + 1) % self.members.len()
    }

    /// Waits until every running member is healthy (has a leader); panics after `within`.
    pub fn wait_healthy(&self, within: Duration) {
        let started = Instant::now();
        while !self.members.iter().filter(|m| m.process.running()).all(Member::healthy) {
            assert!(started.elapsed() < within, "the etcd cluster was not healthy within {within:?}");
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// `GET path` on a member's plaintext metrics port: the whole answer, or `None`.
fn metrics_get(ip: Ipv4Addr, port: u16, path: &str) -> Option<String> {
    let mut stream = TcpStream::connect_timeout(&(ip, port).into(), Duration::from_millis(500)).ok()?;
    let _ = stream.set_read_timeout(Some(Duration::from_millis(1000)));
    stream.write_all(format!("GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").as_bytes()).ok()?;
    let mut answer = String::new();
    let _ = stream.read_to_string(&mut answer);
    Some(answer)
}
