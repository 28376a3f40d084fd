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
use std::process::Command;
use std::time::Duration;

use crate::free_port;
use crate::server_process::ServerProcess;

/// One etcd server process, killed on drop.
#[derive(Debug)]
pub struct EtcdServer {
    port: u16,
    /// Whether the client port speaks TLS.
    tls: bool,
    /// The plaintext port of `/health` and `/metrics`.
    metrics_port: u16,
    process: ServerProcess,
}

impl EtcdServer {
    /// Starts a one-member cluster on free loopback ports and waits until it is healthy.
    /// Panics (failing the test) if `etcd` is missing or does not start.
    pub fn start() -> EtcdServer {
        Self::launch(None)
    }

    /// A server whose client port speaks TLS only, with the server certificate of `certs`;
    /// with `client_certs`, clients must present a certificate signed by its CA (mutual TLS).
    /// Its [`endpoint`](Self::endpoint) is `https://127.0.0.1:<port>`. Its health is asked on
    /// a plaintext metrics port.
    pub fn start_tls(certs: &crate::tls_certs::Certs, client_certs: bool) -> EtcdServer {
        let path = |f: &str| certs.path(f).to_string_lossy().into_owned();
        let mut args = vec!["--cert-file".to_owned(), path("server.pem"), "--key-file".to_owned(), path("server.key")];
        // (etcd 3.4 asks every client for a certificate once it has a trusted CA.)
        if client_certs {
            args.extend(["--trusted-ca-file".to_owned(), path("ca.pem"), "--client-cert-auth".to_owned()]);
        }
        Self::launch(Some(args))
    }

    fn launch(tls: Option<Vec<String>>) -> EtcdServer {
        let scheme = if tls.is_some() { "https" } else { "http" };
        // Free ports may be taken by another server starting meanwhile: new ones, a few times.
        let mut last_error = String::new();
        for _ in 0..5 {
            let (port, peer_port, metrics_port) = (free_port(), free_port(), free_port());
            let tls = tls.clone();
            let spawn = move |dir: &std::path::Path| {
                let client = format!("{scheme}://127.0.0.1:{port}");
                let peer = format!("http://127.0.0.1:{peer_port}");
                let metrics = format!("http://127.0.0.1:{metrics_port}");
                let mut etcd = Command::new("etcd");
                etcd.args(["--name", "t", "--data-dir", &dir.join("data").to_string_lossy()])
                    .args(["--listen-client-urls", &client, "--advertise-client-urls", &client])
                    .args(["--listen-peer-urls", &peer, "--initial-advertise-peer-urls", &peer])
                    .args(["--listen-metrics-urls", &metrics])
                    .args(["--initial-cluster", &format!("t={peer}"), "--log-level", "warn"])
                    .args(tls.iter().flatten());
                etcd
            };
            let dir = ServerProcess::temp_dir("etcd");
            let ready = move || healthy(metrics_port);
            let mut process = ServerProcess::new("etcd", dir, spawn, ready, Duration::from_secs(20));
            match process.try_start() {
                Ok(()) => return EtcdServer { port, tls: scheme == "https", metrics_port, process },
                Err(e) => last_error = e,
            }
        }
        panic!("could not start etcd: {last_error}");
    }

    /// Whether the server answers `GET /health` with a healthy status right now.
    pub fn healthy(&self) -> bool {
        healthy(self.metrics_port)
    }

    /// The client port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `http://127.0.0.1:<port>` (`https://` for a TLS one).
    pub fn endpoint(&self) -> String {
        let scheme = if self.tls { "https" } else { "http" };
        format!("{scheme}://127.0.0.1:{}", self.port)
    }

    /// The process id, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.process.pid()
    }

    /// Kills the server at once (SIGKILL, as a crash) and waits for the process to end.
    pub fn kill(&mut self) {
        self.process.kill();
    }

    /// Starts the server again on the same ports with the same data (after [`kill`](Self::kill)).
    pub fn restart(&mut self) {
        self.process.restart();
    }
}

fn healthy(port: u16) -> bool {
    let Ok(mut stream) = TcpStream::connect(("127.0.0.1", port)) else { return false };
    let _ = stream.set_read_timeout(Some(Duration::from_millis(1000)));
    if stream.write_all(b"GET /health HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").is_err() {
        return false;
    }
    let mut answer = String::new();
    let _ = stream.read_to_string(&mut answer);
    answer.contains("\"health\":\"true\"")
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

/// Turns etcd's authentication on through `admin`: a `root` user, and a user `locker`
/// (password `lock-secret`) whose role may read and write the library's key prefix
/// (`lock-runtime/`) only.
#[cfg(feature = "etcd")]
pub async fn enable_rbac(admin: &mut etcd_client::Client) {
    use etcd_client::Permission;
    admin.user_add("root", "root-secret", None).await.expect("user root");
    admin.user_grant_role("root", "root").await.expect("role root");
    admin.role_add("locker").await.expect("role locker");
    let prefix = Permission::read_write("lock-runtime/").with_prefix();
    admin.role_grant_permission("locker", prefix).await.expect("the prefix");
    admin.user_add("locker", "lock-secret", None).await.expect("user locker");
    admin.user_grant_role("locker", "locker").await.expect("grant");
    admin.auth_enable().await.expect("auth enable");
}

/// One server shared by the tests of a binary that neither kill nor restart it (killed by its
/// reaper when the binary exits). Tests that kill or restart a server start their own.
pub fn shared() -> &'static EtcdServer {
    static SERVER: std::sync::OnceLock<EtcdServer> = std::sync::OnceLock::new();
    SERVER.get_or_init(EtcdServer::start)
}
