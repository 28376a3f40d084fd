//! A real ZooKeeper server for the tests: the Debian `zookeeper` package's jar, started as its
//! own JVM on a free loopback port with a temporary data directory, stopped by its pid.
//!
//! ```ignore
//! let mut zk = lock_tests::zk_server::ZkServer::start();
//! let manager = lock_runtime::LockManager::zookeeper(zk.hosts()).await?;
//! zk.kill();     // SIGKILL, like a crash
//! zk.restart();  // same port, same data directory
//! ```

#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)]

use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use crate::server_process::ServerProcess;

/// The ZooKeeper jar the Debian package installs (its manifest names its dependencies).
pub const ZOOKEEPER_JAR: &str = "/usr/share/java/zookeeper.jar";
/// Netty's codec, which the secure client port needs besides the jars the ZooKeeper jar names.
pub const NETTY_CODEC_JAR: &str = "/usr/share/java/netty-codec.jar";
/// The packaged configuration directory (log configuration) put on the class path.
pub const ZOOKEEPER_CONF_DIR: &str = "/etc/zookeeper/conf";

/// How long an empty container node may live before the server reaps it, in this test server.
pub const CONTAINER_CHECK_INTERVAL: Duration = Duration::from_millis(100);

/// One ZooKeeper server process, killed on drop.
#[derive(Debug)]
pub struct ZkServer {
    port: u16,
    process: ServerProcess,
    /// Serves TLS only (its secure client port): no four-letter words in plain text.
    tls: bool,
}

impl ZkServer {
    /// Starts a standalone server on a free loopback port and waits until it serves clients.
    /// Panics (failing the test) if `java` or the jar is missing or the server does not start.
    pub fn start() -> ZkServer {
        Self::start_with(None)
    }

    /// Starts a server that speaks TLS only: a secure client port (Netty) and no plain one, its
    /// certificate `server.pem` (key `server.key`) from `certs` (see
    /// [`Certs`](crate::tls_certs::Certs)); with `mutual`, it also asks clients for a
    /// certificate signed by `ca.pem`. Ready once the port accepts TCP connections.
    pub fn start_tls(certs: &std::path::Path, mutual: bool) -> ZkServer {
        Self::start_with(Some((certs, mutual)))
    }

    fn start_with(tls: Option<(&std::path::Path, bool)>) -> ZkServer {
        assert!(
            std::path::Path::new(ZOOKEEPER_JAR).exists(),
            "{ZOOKEEPER_JAR} is missing: install the `zookeeper` package (scripts/test does)"
        );
        let dir = ServerProcess::temp_dir("zk");
        std::fs::create_dir_all(dir.join("data")).expect("create the ZooKeeper data directory");
        let port = free_port();
        let listen = match tls {
            None => format!("clientPort={port}\nclientPortAddress=127.0.0.1\n"),
            Some((certs, mutual)) => {
                // ZooKeeper reads the key and the certificate chain from one PEM file.
                let bundle = dir.join("server-bundle.pem");
                let read = |f: &str| std::fs::read_to_string(certs.join(f)).expect("a certificate file");
                std::fs::write(&bundle, read("server.key") + &read("server.pem")).expect("write the key store");
                format!(
                    "secureClientPort={port}\n\
                     secureClientPortAddress=127.0.0.1\n\
                     serverCnxnFactory=org.apache.zookeeper.server.NettyServerCnxnFactory\n\
                     ssl.keyStore.location={bundle}\n\
                     ssl.keyStore.type=PEM\n\
                     ssl.trustStore.location={ca}\n\
                     ssl.trustStore.type=PEM\n\
                     ssl.clientAuth={auth}\n",
                    bundle = bundle.display(),
                    ca = certs.join("ca.pem").display(),
                    auth = if mutual { "need" } else { "none" },
                )
            }
        };
        let config = format!(
            "tickTime=250\n\
             minSessionTimeout=500\n\
             maxSessionTimeout=30000\n\
             dataDir={data}\n\
             {listen}\
             maxClientCnxns=0\n\
             admin.enableServer=false\n\
             4lw.commands.whitelist=ruok,srvr,mntr\n\
             forceSync=no\n",
            data = dir.join("data").display(),
        );
        std::fs::write(dir.join("zoo.cfg"), config).expect("write zoo.cfg");
        let spawn = |dir: &std::path::Path| {
            let mut java = Command::new("java");
            java.args([
                "-Xmx256m",
                "-XX:+UseSerialGC",
                "-XX:TieredStopAtLevel=1",
                "-Xshare:auto",
                "-Dzookeeper.admin.enableServer=false",
                "-Dzookeeper.jmx.log4j.disable=true",
                &format!("-Dznode.container.checkIntervalMs={}", CONTAINER_CHECK_INTERVAL.as_millis()),
                "-Dznode.container.maxPerMinute=1000000",
                "-cp",
                // Netty's codec jar: the jar's manifest leaves it out, and the secure client
                // port's TLS handler needs it (`libnetty-java`, a dependency of the package).
                &format!("{ZOOKEEPER_JAR}:{NETTY_CODEC_JAR}:{ZOOKEEPER_CONF_DIR}"),
                "org.apache.zookeeper.server.ZooKeeperServerMain",
            ])
            .arg(dir.join("zoo.cfg"));
            java
        };
        let secure = tls.is_some();
        let ready = move || if secure { accepting(port) } else { serving(port) };
        let mut process = ServerProcess::new("java (ZooKeeper)", dir, spawn, ready, Duration::from_secs(60));
        process.start();
        ZkServer { port, process, tls: secure }
    }

    /// `127.0.0.1:<port>`: the host list to give the client.
    pub fn hosts(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// The port the server listens on.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Kills the server at once (SIGKILL, as a crash) and waits for the process to end.
    pub fn kill(&mut self) {
        self.process.kill();
    }

    /// Starts the server again on the same port with the same data (after [`kill`](Self::kill)).
    pub fn restart(&mut self) {
        self.process.restart();
    }

    /// Whether the server serves clients: its `srvr` four-letter word reports a mode (`ruok`
    /// answers `imok` as soon as the process listens, before sessions can be opened).
    pub fn serving(&self) -> bool {
        if self.tls {
            accepting(self.port)
        } else {
            serving(self.port)
        }
    }

    /// How many client connections the server has open, the asking one included (its `mntr`
    /// four-letter word's `zk_num_alive_connections`); `None` if it does not answer.
    pub fn connections(&self) -> Option<u64> {
        let answer = four_letter_word(self.port, "mntr")?;
        let line = answer.lines().find_map(|line| line.strip_prefix("zk_num_alive_connections"))?;
        line.trim().parse().ok()
    }
}

fn serving(port: u16) -> bool {
    four_letter_word(port, "srvr").is_some_and(|answer| answer.contains("Mode: "))
}

/// Whether something accepts TCP connections on `port` (a TLS-only server answers no word in
/// plain text).
fn accepting(port: u16) -> bool {
    TcpStream::connect_timeout(&SocketAddr::from((Ipv4Addr::LOCALHOST, port)), Duration::from_millis(500)).is_ok()
}

fn four_letter_word(port: u16, word: &str) -> Option<String> {
    let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
    let mut stream = TcpStream::connect_timeout(&addr, Duration::from_millis(500)).ok()?;
    let _ = stream.set_read_timeout(Some(Duration::from_secs(2)));
    stream.write_all(word.as_bytes()).ok()?;
    let mut answer = String::new();
    let _ = stream.read_to_string(&mut answer);
    Some(answer)
}

use crate::free_port;

/// One server shared by every test of a test binary (started on first use; the reaper stops it
/// when the binary exits). Tests that kill or restart a server start their own.
pub fn shared() -> &'static ZkServer {
    static SERVER: std::sync::OnceLock<ZkServer> = std::sync::OnceLock::new();
    SERVER.get_or_init(ZkServer::start)
}

/// The children of `path` (empty if it does not exist), read through a fresh client session.
#[cfg(feature = "zookeeper")]
pub async fn children(hosts: &str, path: &str) -> Vec<String> {
    let client = zookeeper_client::Client::connect(hosts).await.expect("connect a checking client");
    match client.list_children(path).await {
        Ok(children) => children,
        Err(zookeeper_client::Error::NoNode) => Vec::new(),
        Err(e) => panic!("list the children of {path}: {e}"),
    }
}

/// A loopback TCP proxy in front of a ZooKeeper server that can lose the reply to one lock-node
/// create: it forwards the request (the server applies it), then cuts the connection instead of
/// forwarding the reply, as a network failure at the worst moment would. The client reconnects
/// through it with the same session.
#[derive(Debug)]
pub struct ReplyCutter {
    port: u16,
    armed: std::sync::Arc<std::sync::atomic::AtomicBool>,
    cuts: std::sync::Arc<AtomicU32>,
    log: OpLog,
    task: tokio::task::JoinHandle<()>,
}

/// The op codes of the requests relayed since the last cut (connection handshakes excluded).
type OpLog = std::sync::Arc<std::sync::Mutex<Vec<i32>>>;

/// ZooKeeper request op codes, as seen by [`ReplyCutter::ops_since_cut`].
pub mod op {
    /// `create` (before 3.5).
    pub const CREATE: i32 = 1;
    /// `delete`.
    pub const DELETE: i32 = 2;
    /// `getChildren`.
    pub const GET_CHILDREN: i32 = 8;
    /// `sync`: brings the server up to date with the leader.
    pub const SYNC: i32 = 9;
    /// `ping`.
    pub const PING: i32 = 11;
    /// `getChildren2` (with a stat).
    pub const GET_CHILDREN2: i32 = 12;
    /// `create2` (3.5 and later: with a stat).
    pub const CREATE2: i32 = 15;
}

impl ReplyCutter {
    /// Starts the proxy in front of `upstream` (a port on 127.0.0.1).
    pub async fn start(upstream: u16) -> ReplyCutter {
        use std::sync::atomic::AtomicBool;
        use std::sync::Arc;
        let listener = tokio::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).await.expect("bind the proxy");
        let port = listener.local_addr().expect("addr").port();
        let armed = Arc::new(AtomicBool::new(false));
        let cuts = Arc::new(AtomicU32::new(0));
        let log = OpLog::default();
        let (a, c, l) = (armed.clone(), cuts.clone(), log.clone());
        let task = tokio::spawn(async move {
            let mut connections = tokio::task::JoinSet::new();
            while let Ok((client, _)) = listener.accept().await {
                let Ok(server) = tokio::net::TcpStream::connect((Ipv4Addr::LOCALHOST, upstream)).await else {
                    continue;
                };
                connections.spawn(relay(client, server, a.clone(), c.clone(), l.clone()));
            }
        });
        ReplyCutter { port, armed, cuts, log, task }
    }

    /// `127.0.0.1:<proxy port>`.
    pub fn hosts(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// Loses the reply to the next create of a lock node (`…/lk-…`).
    pub fn cut_next_lock_create(&self) {
        self.armed.store(true, Ordering::SeqCst);
    }

    /// How many replies were lost so far.
    pub fn cuts(&self) -> u32 {
        self.cuts.load(Ordering::SeqCst)
    }

    /// The op codes (see [`op`]) of the requests the client sent since the last lost reply (or
    /// [`reset_ops`](Self::reset_ops)), in order (pings included, session handshakes not).
    pub fn ops_since_cut(&self) -> Vec<i32> {
        self.log.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clone()
    }

    /// Forgets the requests relayed so far (see [`ops_since_cut`](Self::ops_since_cut)).
    pub fn reset_ops(&self) {
        self.log.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clear();
    }
}

impl Drop for ReplyCutter {
    fn drop(&mut self) {
        self.task.abort(); // drops the listener and every relay with it
    }
}

/// Relays one client connection, frame by frame (4-byte length, then the payload).
async fn relay(
    client: tokio::net::TcpStream,
    server: tokio::net::TcpStream,
    armed: std::sync::Arc<std::sync::atomic::AtomicBool>,
    cuts: std::sync::Arc<AtomicU32>,
    log: OpLog,
) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    async fn frame(from: &mut (impl AsyncReadExt + Unpin)) -> Option<Vec<u8>> {
        let len = from.read_u32().await.ok()?;
        let mut payload = vec![0; usize::try_from(len).ok()?];
        from.read_exact(&mut payload).await.ok()?;
        Some(payload)
    }
    fn xid(payload: &[u8]) -> Option<i32> {
        Some(i32::from_be_bytes(payload.get(0..4)?.try_into().ok()?))
    }
    let (mut client_rx, mut client_tx) = client.into_split();
    let (mut server_rx, mut server_tx) = server.into_split();
    // The xid of the create whose reply is to be lost (0: none; client xids start at 1).
    let doomed = std::sync::Arc::new(std::sync::atomic::AtomicI32::new(0));
    let record = |op: Option<i32>, log: &OpLog| {
        if let Some(op) = op {
            log.lock().unwrap_or_else(std::sync::PoisonError::into_inner).push(op);
        }
    };
    let to_server = {
        let doomed = doomed.clone();
        let log = log.clone();
        async move {
            let mut handshake = true; // the first frame of a connection is the session handshake
            while let Some(payload) = frame(&mut client_rx).await {
                // Request header: xid, op code (1 create, 15 create2), then the path.
                let op = payload.get(4..8).map(|b| i32::from_be_bytes(b.try_into().unwrap_or_default()));
                if !std::mem::take(&mut handshake) {
                    record(op, &log);
                }
                let is_lock_create = matches!(op, Some(1 | 15)) && payload.windows(4).any(|w| w == b"/lk-");
                if is_lock_create && armed.swap(false, Ordering::SeqCst) {
                    doomed.store(xid(&payload).unwrap_or(0), Ordering::SeqCst);
                }
                let len = u32::try_from(payload.len()).unwrap_or(u32::MAX);
                if server_tx.write_u32(len).await.is_err() || server_tx.write_all(&payload).await.is_err() {
                    return;
                }
            }
        }
    };
    let to_client = async move {
        while let Some(payload) = frame(&mut server_rx).await {
            let lose = doomed.load(Ordering::SeqCst);
            if lose != 0 && xid(&payload) == Some(lose) {
                log.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clear();
                cuts.fetch_add(1, Ordering::SeqCst);
                return; // the server applied the create; its reply is lost with the connection
            }
            let len = u32::try_from(payload.len()).unwrap_or(u32::MAX);
            if client_tx.write_u32(len).await.is_err() || client_tx.write_all(&payload).await.is_err() {
                return;
            }
        }
    };
    // Whichever direction ends first closes both sockets (they are dropped here).
    tokio::select! {
        _ = to_server => {}
        _ = to_client => {}
    }
}
