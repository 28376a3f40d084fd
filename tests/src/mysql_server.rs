//! A real MariaDB server for the MySQL backend tests (the Debian `mariadb-server` package):
//! `mariadb-install-db` once per test process into a template, then each server as the
//! `mariadbd` process itself on a copy of it, on a free loopback port, stopped by its pid on
//! drop. At startup an init file creates the user `app` (password `secret`, every privilege, and the right to grant them)
//! and the database `app`.
//!
//! ```ignore
//! let mut server = lock_tests::mysql_server::MysqlServer::start();
//! let manager = lock_runtime::LockManager::mysql(server.url()).await?;
//! server.restart(); // the same port and data directory
//! ```

#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::Duration;

pub use crate::free_port;
use crate::server_process::ServerProcess;

const INIT: &str = "CREATE USER IF NOT EXISTS 'app'@'%' IDENTIFIED BY 'secret';\n\
                    GRANT ALL ON *.* TO 'app'@'%' WITH GRANT OPTION;\n\
                    CREATE DATABASE IF NOT EXISTS app;\n";

/// The `mariadb-install-db`-ed template data directory of this process.
fn template() -> &'static Path {
    static TEMPLATE: OnceLock<PathBuf> = OnceLock::new();
    TEMPLATE.get_or_init(|| {
        let dir = ServerProcess::template_dir("mariadb");
        let data = dir.join("data");
        // Its own temporary directory: the shared `/tmp` saw another server's temporary table
        // fail the install on a loaded machine.
        let tmp = dir.join("tmp");
        std::fs::create_dir_all(&tmp).expect("template tmpdir");
        let out = Command::new("mariadb-install-db")
            .arg("--no-defaults")
            .arg(format!("--datadir={}", data.display()))
            .arg(format!("--tmpdir={}", tmp.display()))
            .args(["--user=root", "--auth-root-authentication-method=normal", "--skip-test-db"])
            .output()
            .expect("run mariadb-install-db (scripts/test installs mariadb-server)");
        assert!(out.status.success(), "mariadb-install-db failed: {}", String::from_utf8_lossy(&out.stderr));
        data
    })
}

/// One MariaDB server process, stopped on drop.
#[derive(Debug)]
pub struct MysqlServer {
    port: u16,
    process: ServerProcess,
}

impl MysqlServer {
    /// Starts a server on a free loopback port and waits until it accepts connections. Panics
    /// (failing the test) if it does not.
    pub fn start() -> MysqlServer {
        Self::launch(Vec::new(), "")
    }

    /// A server that takes TLS connections only (`require_secure_transport`), with the server
    /// certificate of `certs`; with `client_certs`, the user `app` must also present a
    /// certificate signed by its CA (`REQUIRE X509`). Its [`url`](Self::url) is a plain one's:
    /// the client chooses TLS (`MysqlOptions::tls`, or `require_ssl=true` in the URL).
    pub fn start_tls(certs: &crate::tls_certs::Certs, client_certs: bool) -> MysqlServer {
        let file = |name: &str| certs.path(name).display().to_string();
        let args = vec![
            format!("--ssl-cert={}", file("server.pem")),
            format!("--ssl-key={}", file("server.key")),
            format!("--ssl-ca={}", file("ca.pem")),
            "--require-secure-transport=ON".to_owned(),
        ];
        Self::launch(args, if client_certs { "ALTER USER 'app'@'%' REQUIRE X509;\n" } else { "" })
    }

    fn launch(extra: Vec<String>, init: &str) -> MysqlServer {
        static N: AtomicU64 = AtomicU64::new(0);
        let dir = std::env::temp_dir().join(format!(
            "lock-tests-mariadb-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("server dir");
        let status = Command::new("cp").arg("-a").arg(template()).arg(dir.join("data")).status().expect("cp");
        assert!(status.success(), "copying the template data directory failed");
        std::fs::write(dir.join("init.sql"), format!("{INIT}{init}")).expect("init.sql");
        // Every server's temporary tables in its own directory, not the shared `/tmp`.
        std::fs::create_dir_all(dir.join("tmp")).expect("server tmpdir");
        let mut last = String::new();
        for _ in 0..5 {
            let port = free_port();
            let extra = extra.clone();
            let spawn = move |dir: &Path| {
                let mut server = Command::new("mariadbd");
                server
                    .arg("--no-defaults")
                    .arg(format!("--datadir={}", dir.join("data").display()))
                    .arg(format!("--socket={}", dir.join("sock").display()))
                    .arg(format!("--pid-file={}", dir.join("pid").display()))
                    .arg(format!("--tmpdir={}", dir.join("tmp").display()))
                    .arg(format!("--init-file={}", dir.join("init.sql").display()))
                    .args(["--user=root", "--bind-address=127.0.0.1", "--skip-name-resolve"])
                    .args(["--innodb-buffer-pool-size=32M", "--max-connections=200"])
                    .arg(format!("--port={port}"))
                    .args(&extra);
                server
            };
            let ready = move || std::net::TcpStream::connect(("127.0.0.1", port)).is_ok();
            let mut process = ServerProcess::new("mariadbd", dir.clone(), spawn, ready, Duration::from_secs(30));
            match process.try_start() {
                Ok(()) => return MysqlServer { port, process },
                Err(e) => {
                    last = e;
                    process.keep_dir(); // for the next try
                }
            }
        }
        panic!("mariadbd did not start on any of 5 ports: {last}");
    }

    /// `mysql://app:secret@127.0.0.1:<port>/app`.
    pub fn url(&self) -> String {
        format!("mysql://app:secret@127.0.0.1:{}/app", self.port)
    }

    /// The loopback port it listens on.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Kills the server at once (SIGKILL, as a crash).
    pub fn kill(&mut self) {
        self.process.kill();
    }

    /// Kills the server if it runs (SIGKILL) and starts it again on the same port and data
    /// directory (InnoDB recovers it).
    pub fn restart(&mut self) {
        self.process.kill();
        self.process.start();
    }

    /// The server's pid.
    pub fn pid(&self) -> Option<u32> {
        self.process.pid()
    }
}
