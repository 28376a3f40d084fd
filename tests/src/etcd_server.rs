//! A real etcd server for the etcd backend tests: the Debian `etcd-server` package's `etcd`,
//! started on free loopback ports (client and peer) with a temporary data directory, stopped by
//! its pid.
//!
//! ```ignore
//! let mut etcd = lock_tests::etcd_server::EtcdServer::start();
//! let manager = lock_runtime::LockManager::etcd(&[etcd.endpoint()]).await?;
//! etcd.kill();     // SIGKILL, like a crash
//! etcd.restart();  // same ports, same data directory
//! ```

#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)]

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use crate::free_port;

/// One etcd server process, killed on drop.
#[derive(Debug)]
pub struct EtcdServer {
    port: u16,
    peer_port: u16,
    dir: PathBuf,
    child: Option<Child>,
}

impl EtcdServer {
    /// Starts a one-member cluster on free loopback ports and waits until it is healthy.
    /// Panics (failing the test) if `etcd` is missing or does not start.
    pub fn start() -> EtcdServer {
        static SEQ: AtomicU32 = AtomicU32::new(0);
        let dir = std::env::temp_dir().join(format!(
            "lock-tests-etcd-{}-{}",
            std::process::id(),
            SEQ.fetch_add(1, Ordering::Relaxed)
        ));
        let mut server = EtcdServer { port: free_port(), peer_port: free_port(), dir, child: None };
        server.spawn();
        server
    }

    fn spawn(&mut self) {
        std::fs::create_dir_all(&self.dir).expect("temp dir for etcd");
        let log =
            std::fs::OpenOptions::new().create(true).append(true).open(self.dir.join("etcd.log")).expect("etcd log");
        let client = format!("http://127.0.0.1:{}", self.port);
        let peer = format!("http://127.0.0.1:{}", self.peer_port);
        let child = Command::new("etcd")
            .args(["--name", "t", "--data-dir", &self.dir.join("data").to_string_lossy()])
            .args(["--listen-client-urls", &client, "--advertise-client-urls", &client])
            .args(["--listen-peer-urls", &peer, "--initial-advertise-peer-urls", &peer])
            .args(["--initial-cluster", &format!("t={peer}"), "--log-level", "warn"])
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log"))
            .stderr(log)
            .spawn()
            .expect("start `etcd` (install it: apt-get install etcd-server)");
        // If this test process ends without dropping the server (a static, a crash), a small
        // reaper kills etcd by its pid: it lives while both processes do.
        let reaper = format!(
            "while kill -0 {test} 2>/dev/null && kill -0 {etcd} 2>/dev/null; do sleep 0.5; done; \
             kill -9 {etcd} 2>/dev/null; kill -0 {test} 2>/dev/null || rm -rf '{dir}'",
            test = std::process::id(),
            etcd = child.id(),
            dir = self.dir.display(),
        );
        let _ = Command::new("sh")
            .args(["-c", &reaper])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn();
        self.child = Some(child);
        let started = Instant::now();
        while !self.healthy() {
            if let Some(status) = self.child.as_mut().and_then(|c| c.try_wait().ok().flatten()) {
                let log = std::fs::read_to_string(self.dir.join("etcd.log")).unwrap_or_default();
                panic!("etcd exited with {status} before it was ready:\n{log}");
            }
            assert!(started.elapsed() < Duration::from_secs(20), "etcd was not healthy within 20 s");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Whether the server answers `GET /health` with a healthy status right now.
    pub fn healthy(&self) -> bool {
        let Ok(mut stream) = TcpStream::connect(("127.0.0.1", self.port)) else { return false };
        let _ = stream.set_read_timeout(Some(Duration::from_millis(1000)));
        if stream.write_all(b"GET /health HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").is_err() {
            return false;
        }
        let mut answer = String::new();
        let _ = stream.read_to_string(&mut answer);
        answer.contains("\"health\":\"true\"")
    }

    /// The client port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `http://127.0.0.1:<port>`.
    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// The process id, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Kills the server at once (SIGKILL, as a crash) and waits for the process to end.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts the server again on the same ports with the same data (after [`kill`](Self::kill)).
    pub fn restart(&mut self) {
        self.kill();
        self.spawn();
    }
}

impl Drop for EtcdServer {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A TCP proxy for fault injection between a backend and its server (the Redis harness's,
/// when it is compiled in: the file is loaded as a module once).
#[cfg(feature = "redis")]
pub use crate::redis_server::tcp_proxy;
/// A TCP proxy for fault injection between a backend and its server.
#[cfg(not(feature = "redis"))]
#[path = "tcp_proxy.rs"]
pub mod tcp_proxy;

/// The keys under `prefix`, read through a fresh client.
#[cfg(feature = "etcd")]
pub async fn keys(endpoint: &str, prefix: &str) -> Vec<String> {
    let mut client = etcd_client::Client::connect([endpoint], None).await.expect("connect a checking client");
    let options = etcd_client::GetOptions::new().with_prefix().with_keys_only();
    let resp = client.get(prefix, Some(options)).await.expect("list keys");
    resp.kvs().iter().map(|kv| String::from_utf8_lossy(kv.key()).into_owned()).collect()
}

/// One server shared by the tests of a binary that neither kill nor restart it (killed by its
/// reaper when the binary exits). Tests that kill or restart a server start their own.
pub fn shared() -> &'static EtcdServer {
    static SERVER: std::sync::OnceLock<EtcdServer> = std::sync::OnceLock::new();
    SERVER.get_or_init(EtcdServer::start)
}
