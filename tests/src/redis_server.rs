//! A real `redis-server` for the Redis backend tests: started on a free loopback port with its
//! own temporary directory and no persistence, killed (by its own pid) when dropped.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// A `redis-server` process this test owns.
#[derive(Debug)]
pub struct RedisServer {
    port: u16,
    dir: PathBuf,
    child: Option<Child>,
    /// Extra `redis-server` arguments, given again on every restart.
    args: Vec<String>,
}

impl RedisServer {
    /// Starts a server on a free loopback port and waits until it answers `PING`.
    ///
    /// Panics (it is test support) when `redis-server` is not installed or does not come up.
    pub fn start() -> Self {
        Self::start_with(&[])
    }

    /// [`start`](Self::start) with extra `redis-server` arguments (e.g. `--replicaof`).
    pub fn start_with(args: &[&str]) -> Self {
        static N: AtomicU64 = AtomicU64::new(0);
        let dir = std::env::temp_dir().join(format!(
            "lock-tests-redis-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&dir).expect("temp dir for redis-server");
        let mut last_error = String::new();
        for _ in 0..5 {
            let port = free_port();
            let mut server = RedisServer {
                port,
                dir: dir.clone(),
                child: None,
                args: args.iter().map(|a| (*a).to_owned()).collect(),
            };
            match server.spawn() {
                Ok(()) => return server,
                Err(e) => last_error = e,
            }
        }
        panic!("could not start redis-server: {last_error}");
    }

    fn spawn(&mut self) -> Result<(), String> {
        // (Again on every try: a failed try's server, dropped, removed the directory.)
        std::fs::create_dir_all(&self.dir).map_err(|e| format!("temp dir for redis-server: {e}"))?;
        let log = std::fs::File::create(self.dir.join("redis.log")).map_err(|e| e.to_string())?;
        let child = Command::new("redis-server")
            .args(["--port", &self.port.to_string(), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
            .args(["--dir", &self.dir.to_string_lossy(), "--protected-mode", "no", "--daemonize", "no"])
            .args(&self.args)
            .stdin(Stdio::null())
            .stdout(log.try_clone().map_err(|e| e.to_string())?)
            .stderr(log)
            .spawn()
            .map_err(|e| format!("cannot run `redis-server` (install it: apt-get install redis-server): {e}"))?;
        self.child = Some(child);
        let started = Instant::now();
        while started.elapsed() < Duration::from_secs(10) {
            if let Some(status) = self.child.as_mut().and_then(|c| c.try_wait().ok().flatten()) {
                self.child = None;
                let log = std::fs::read_to_string(self.dir.join("redis.log")).unwrap_or_default();
                return Err(format!("redis-server exited with {status}: {log}"));
            }
            if self.ping() {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        self.kill();
        Err("redis-server did not answer PING within 10 s".into())
    }

    /// Whether the server answers `PING` right now.
    pub fn ping(&self) -> bool {
        let Ok(mut stream) = TcpStream::connect(("127.0.0.1", self.port)) else { return false };
        let _ = stream.set_read_timeout(Some(Duration::from_millis(500)));
        if stream.write_all(b"PING\r\n").is_err() {
            return false;
        }
        let mut buf = [0u8; 7];
        stream.read_exact(&mut buf).is_ok() && &buf == b"+PONG\r\n"
    }

    /// The port it listens on.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `redis://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// Its own temporary directory (removed when it is dropped).
    pub fn dir(&self) -> &std::path::Path {
        &self.dir
    }

    /// The process id, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Kills the server with SIGKILL (its data is gone: no persistence).
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts it again on the same port (after [`kill`](Self::kill)), with an empty dataset.
    pub fn restart(&mut self) {
        self.kill();
        let started = Instant::now();
        loop {
            match self.spawn() {
                Ok(()) => return,
                Err(e) if started.elapsed() > Duration::from_secs(10) => panic!("restart failed: {e}"),
                Err(_) => std::thread::sleep(Duration::from_millis(50)),
            }
        }
    }

    /// Freezes the server (SIGSTOP): connections stay open, nothing is answered.
    pub fn pause(&self) {
        self.signal("-STOP");
    }

    /// Lets a paused server run again (SIGCONT).
    pub fn resume(&self) {
        self.signal("-CONT");
    }

    fn signal(&self, signal: &str) {
        let pid = self.pid().expect("server running");
        let status = Command::new("kill").args([signal, &pid.to_string()]).status().expect("run kill");
        assert!(status.success(), "kill {signal} {pid} failed");
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill(); // SIGKILL, which also ends a paused server
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

pub use crate::free_port;

/// A TCP proxy for fault injection between a backend and its server.
#[path = "tcp_proxy.rs"]
pub mod tcp_proxy;
