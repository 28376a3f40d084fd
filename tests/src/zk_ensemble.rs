//! A real ZooKeeper ensemble of three (or five) members for the ensemble tests: each member a
//! JVM of its own (`QuorumPeerMain`, the Debian `zookeeper` package's jar) on free loopback
//! ports (client, quorum, election) with its own data directory and `myid`; any member killed,
//! stopped (SIGSTOP), continued or restarted on its own data, and the leader found with the
//! `srvr` four-letter word.
//!
//! ```ignore
//! let mut zk = lock_tests::zk_ensemble::ZkEnsemble::start(3);
//! let manager = lock_runtime::LockManager::zookeeper(zk.hosts()).await?;
//! let leader = zk.leader();
//! zk.member(leader).process.pause();
//! ```

#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)]

use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::process::Command;
use std::time::{Duration, Instant};

use crate::free_port;
use crate::netns::{End, Net};
use crate::server_process::ServerProcess;
use crate::zk_server::{ZOOKEEPER_CONF_DIR, ZOOKEEPER_JAR};

/// Ticks (of 250 ms) a follower waits for its leader before it gives up on it.
const SYNC_LIMIT: u32 = 10;

/// One member of a [`ZkEnsemble`].
#[derive(Debug)]
pub struct Member {
    /// Its address: loopback, or its own in a partitionable ensemble.
    pub ip: Ipv4Addr,
    /// The client port.
    pub port: u16,
    /// Its server process: `kill` (SIGKILL, as a crash), `restart` on its ports and data
    /// (waiting until it serves, when the ensemble has a quorum with it), `pause` (SIGSTOP),
    /// `resume` (SIGCONT).
    pub process: ServerProcess,
    /// Its wall clock, in an ensemble [started on clocks](ZkEnsemble::start_on_clocks).
    pub clock: Option<crate::server_clock::ServerClock>,
}

impl Member {
    /// `<ip>:<port>`.
    pub fn host(&self) -> String {
        format!("{}:{}", self.ip, self.port)
    }

    /// The member's mode (`leader`, `follower`), if it serves.
    pub fn mode(&self) -> Option<String> {
        mode(self.ip, self.port)
    }
}

/// The clocks of an ensemble's members.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Clocks {
    /// The machine's.
    True,
    /// A wall clock of its own for each, which the test sets (`server_clock`).
    Own,
    /// Every clock of every member (monotonic included) at this speed, under libfaketime.
    Speed(f64),
}

/// An ensemble of ZooKeeper members on loopback, each killed on drop.
#[derive(Debug)]
pub struct ZkEnsemble {
    members: Vec<Member>,
    /// The private network of a partitionable ensemble (after `members`: dropped after them).
    net: Option<Net>,
}

impl ZkEnsemble {
    /// Starts `size` members and waits until each serves as leader or follower. Panics
    /// (failing the test) if `java` or the jar is missing or the ensemble does not form
    /// within 60 s.
    pub fn start(size: usize) -> ZkEnsemble {
        Self::start_in(size, None, SYNC_LIMIT, Clocks::True)
    }

    /// [`start`](Self::start) with each member's JVM on a wall clock of its own, which the test
    /// sets ([`Member::clock`], `lock_tests::server_clock`).
    pub fn start_on_clocks(size: usize) -> ZkEnsemble {
        Self::start_in(size, None, SYNC_LIMIT, Clocks::Own)
    }

    /// An ensemble whose members each run in a network namespace of their own on a private
    /// network with `clients` client namespaces (`netns`): links can be cut.
    pub fn start_partitionable(size: usize, clients: usize) -> ZkEnsemble {
        Self::start_in(size, Some(Net::new(size, clients)), SYNC_LIMIT, Clocks::True)
    }

    /// [`start_partitionable`](Self::start_partitionable) with followers that notice a lost
    /// leader only after 40 ticks (10 s), longer than the clients' 6 s sessions: a follower cut
    /// from its leader answers its clients' pings past the moment the leader ends their sessions
    /// (ZooKeeper's usual `tickTime=2000`, `syncLimit=5` beside 6 s sessions).
    pub fn start_partitionable_slow_followers(size: usize, clients: usize) -> ZkEnsemble {
        Self::start_in(size, Some(Net::new(size, clients)), 40, Clocks::True)
    }

    /// [`start_partitionable`](Self::start_partitionable) with every clock of every member
    /// (monotonic included: the leader's count of session timeouts) running at `speed` times
    /// real time, under libfaketime.
    pub fn start_partitionable_at_speed(size: usize, clients: usize, speed: f64) -> ZkEnsemble {
        Self::start_in(size, Some(Net::new(size, clients)), SYNC_LIMIT, Clocks::Speed(speed))
    }

    /// The private network, in a partitionable ensemble.
    pub fn net(&self) -> Option<&Net> {
        self.net.as_ref()
    }

    fn start_in(size: usize, net: Option<Net>, sync_limit: u32, clocks: Clocks) -> ZkEnsemble {
        let ips: Vec<Ipv4Addr> =
            (0..size).map(|i| net.as_ref().map_or(Ipv4Addr::LOCALHOST, |n| n.addr(End::Member(i)))).collect();
        assert!(
            std::path::Path::new(ZOOKEEPER_JAR).exists(),
            "{ZOOKEEPER_JAR} is missing: install the `zookeeper` package (scripts/test does)"
        );
        let ports: Vec<(u16, u16, u16)> = (0..size).map(|_| (free_port(), free_port(), free_port())).collect();
        let servers: String = ports
            .iter()
            .enumerate()
            .map(|(i, (_, quorum, election))| format!("server.{}={}:{quorum}:{election}\n", i + 1, ips[i]))
            .collect();
        let mut members = Vec::with_capacity(size);
        for (i, &(port, _, _)) in ports.iter().enumerate() {
            let dir = ServerProcess::temp_dir(&format!("zk-m{i}"));
            std::fs::create_dir_all(dir.join("data")).expect("create the ZooKeeper data directory");
            std::fs::write(dir.join("data").join("myid"), format!("{}\n", i + 1)).expect("write myid");
            // A tick of 250 ms: elections and session timeouts in the test's time scale
            // (sessions from 500 ms; a follower that misses 10 ticks, 2.5 s, drops out).
            let config = format!(
                "tickTime=250\n\
                 initLimit=40\n\
                 syncLimit={sync_limit}\n\
                 minSessionTimeout=500\n\
                 maxSessionTimeout=30000\n\
                 dataDir={data}\n\
                 clientPort={port}\n\
                 clientPortAddress={ip}\n\
                 maxClientCnxns=0\n\
                 admin.enableServer=false\n\
                 4lw.commands.whitelist=ruok,srvr,mntr\n\
                 forceSync=no\n\
                 {servers}",
                data = dir.join("data").display(),
                ip = ips[i],
            );
            std::fs::write(dir.join("zoo.cfg"), config).expect("write zoo.cfg");
            let command = net.as_ref().map_or_else(|| Command::new("java"), |n| n.command(End::Member(i), "java"));
            let (program, args): (String, Vec<String>) = (
                command.get_program().to_string_lossy().into_owned(),
                command.get_args().map(|a| a.to_string_lossy().into_owned()).collect(),
            );
            let clock = (clocks == Clocks::Own).then(crate::server_clock::ServerClock::new);
            let env = match clocks {
                Clocks::True => Vec::new(),
                Clocks::Own => clock.as_ref().map(crate::server_clock::ServerClock::env).unwrap_or_default(),
                Clocks::Speed(speed) => vec![
                    ("LD_PRELOAD".to_owned(), crate::clocks::LIBFAKETIME.to_owned()),
                    ("FAKETIME".to_owned(), format!("+0 x{speed}")),
                ],
            };
            let spawn = move |dir: &std::path::Path| {
                let mut java = Command::new(&program);
                java.envs(env.iter().map(|(k, v)| (k, v))).args(&args);
                java.args([
                    "-Xmx192m",
                    "-XX:+UseSerialGC",
                    "-XX:TieredStopAtLevel=1",
                    "-Xshare:auto",
                    "-Dzookeeper.admin.enableServer=false",
                    "-Dzookeeper.jmx.log4j.disable=true",
                    "-cp",
                    &format!("{ZOOKEEPER_JAR}:{ZOOKEEPER_CONF_DIR}"),
                    "org.apache.zookeeper.server.quorum.QuorumPeerMain",
                ])
                .arg(dir.join("zoo.cfg"));
                java
            };
            // A member alone does not serve: "started" once its client port takes connections;
            // the ensemble waits below until every member has a mode.
            let ip = ips[i];
            let ready =
                move || TcpStream::connect_timeout(&SocketAddr::from((ip, port)), Duration::from_millis(200)).is_ok();
            let mut process = ServerProcess::new("java (ZooKeeper)", dir, spawn, ready, Duration::from_secs(120));
            process.start();
            members.push(Member { ip, port, process, clock });
        }
        let ensemble = ZkEnsemble { members, net };
        // Three JVMs starting at once beside other test binaries on a loaded 2-core machine:
        // a CI run with a CPU hog beside it saw an ensemble not serving after 60 s.
        ensemble.wait_serving(Duration::from_secs(120));
        ensemble
    }

    /// `h:p,h:p,h:p`, the host list for the client.
    pub fn hosts(&self) -> String {
        self.members.iter().map(Member::host).collect::<Vec<_>>().join(",")
    }

    /// The host list with member `first` first (the member the client tries first).
    pub fn hosts_with_first(&self, first: usize) -> String {
        let mut hosts: Vec<String> = self.members.iter().map(Member::host).collect();
        hosts.rotate_left(first);
        hosts.join(",")
    }

    /// Member `i`.
    pub fn member(&mut self, i: usize) -> &mut Member {
        &mut self.members[i]
    }

    /// How many members.
    pub fn size(&self) -> usize {
        self.members.len()
    }

    /// The index of the leader, waiting (up to 60 s) until one running member says it leads.
    pub fn leader(&self) -> usize {
        let started = Instant::now();
        loop {
            let leader = (0..self.members.len())
                .find(|&i| self.members[i].process.running() && self.members[i].mode().as_deref() == Some("leader"));
            if let Some(leader) = leader {
                return leader;
            }
            assert!(started.elapsed() < Duration::from_secs(60), "no ZooKeeper leader within 60 s");
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Member `i`'s count of client connections (`mntr`), 0 when it does not answer.
    pub fn connections(&self, i: usize) -> u64 {
        let answer = four_letter_word(self.members[i].ip, self.members[i].port, "mntr").unwrap_or_default();
        let line = answer.lines().find_map(|l| l.strip_prefix("zk_num_alive_connections"));
        line.and_then(|l| l.trim().parse().ok()).unwrap_or(0)
    }

    /// A member that is not the leader.
    pub fn follower(&self) -> usize {
        (self.leader() + 1) % self.members.len()
    }

    /// Waits until every running member serves (as leader or follower); panics after `within`.
    pub fn wait_serving(&self, within: Duration) {
        let started = Instant::now();
        while !self.members.iter().filter(|m| m.process.running()).all(|m| m.mode().is_some()) {
            assert!(started.elapsed() < within, "the ZooKeeper ensemble did not serve within {within:?}");
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// A four-letter word's answer, if the member answers.
fn four_letter_word(ip: Ipv4Addr, port: u16, word: &str) -> Option<String> {
    let addr = SocketAddr::from((ip, port));
    let mut stream = TcpStream::connect_timeout(&addr, Duration::from_millis(500)).ok()?;
    let _ = stream.set_read_timeout(Some(Duration::from_secs(1)));
    stream.write_all(word.as_bytes()).ok()?;
    let mut answer = String::new();
    let _ = stream.read_to_string(&mut answer);
    Some(answer)
}

/// `srvr`'s `Mode:` line, when the member serves.
fn mode(ip: Ipv4Addr, port: u16) -> Option<String> {
    let answer = four_letter_word(ip, port, "srvr")?;
    answer.lines().find_map(|l| l.strip_prefix("Mode: ")).map(|m| m.trim().to_owned())
}
