//! A real `redis-server` for the Redis backend tests: started on a free loopback port with its
//! own temporary directory and no persistence, killed (by its own pid) when dropped.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{Read, Write};
use std::net::{Ipv4Addr, TcpStream};
use std::process::Command;
use std::time::{Duration, Instant};

use crate::server_process::ServerProcess;

/// Where a server runs: its address, and the command that runs a program there (in a member's
/// network namespace of a private network, `netns`), none on loopback.
#[derive(Debug, Clone)]
pub struct Place {
    /// The address it binds and is reached at.
    pub ip: Ipv4Addr,
    /// The program and arguments to run `redis-server` through (`nsenter --net=...`).
    pub prefix: Vec<String>,
}

impl Place {
    /// Loopback, on this machine's network.
    pub fn loopback() -> Place {
        Place { ip: Ipv4Addr::LOCALHOST, prefix: Vec::new() }
    }

    /// Member `i` of `net`: its namespace and address.
    pub fn member(net: &crate::netns::Net, i: usize) -> Place {
        let end = crate::netns::End::Member(i);
        let command = net.command(end, "true");
        let mut prefix = vec![command.get_program().to_string_lossy().into_owned()];
        prefix.extend(command.get_args().map(|a| a.to_string_lossy().into_owned()));
        prefix.pop(); // the program itself
        Place { ip: net.addr(end), prefix }
    }

    /// `program` run there.
    pub fn command(&self, program: &str) -> Command {
        match self.prefix.split_first() {
            None => Command::new(program),
            Some((first, rest)) => {
                let mut command = Command::new(first);
                command.args(rest).arg(program);
                command
            }
        }
    }
}

/// A `redis-server` process this test owns.
#[derive(Debug)]
pub struct RedisServer {
    ip: Ipv4Addr,
    port: u16,
    /// Whether it speaks TLS only.
    tls: bool,
    process: ServerProcess,
}

impl RedisServer {
    /// Starts a server on a free loopback port and waits until it answers `PING`.
    ///
    /// Panics (it is test support) when `redis-server` is not installed or does not come up.
    pub fn start() -> Self {
        Self::start_with(&[])
    }

    /// [`start`](Self::start) with extra `redis-server` arguments (e.g. `--replicaof`), given
    /// again on every restart.
    pub fn start_with(args: &[&str]) -> Self {
        Self::launch(args, false, Vec::new(), Place::loopback())
    }

    /// [`start_with`](Self::start_with) at `place` (a member of a private network).
    pub fn start_at(place: &Place, args: &[&str]) -> Self {
        Self::launch(args, false, Vec::new(), place.clone())
    }

    /// [`start`](Self::start) on `clock`: the server's wall clock (its keys' expiries, `TIME`)
    /// is the one the test sets, on every restart too.
    pub fn start_on_clock(clock: &crate::server_clock::ServerClock) -> Self {
        Self::launch(&[], false, clock.env(), Place::loopback())
    }

    /// A server that speaks TLS only (`--port 0 --tls-port ...`), with the server certificate
    /// of `certs`; with `client_certs`, clients must present a certificate signed by its CA
    /// (mutual TLS). Its [`url`](Self::url) is `rediss://localhost:<port>`.
    pub fn start_tls(certs: &crate::tls_certs::Certs, client_certs: bool, args: &[&str]) -> Self {
        Self::start_tls_as(certs, "server", client_certs, args)
    }

    /// [`start_tls`](Self::start_tls) with the certificate `<cert>.pem` of `certs` (`expired`,
    /// `elsewhere`).
    pub fn start_tls_as(certs: &crate::tls_certs::Certs, cert: &str, client_certs: bool, args: &[&str]) -> Self {
        let path = |file: &str| certs.path(file).to_string_lossy().into_owned();
        let mut all = vec![
            "--tls-cert-file".to_owned(),
            path(&format!("{cert}.pem")),
            "--tls-key-file".to_owned(),
            path(&format!("{cert}.key")),
            "--tls-ca-cert-file".to_owned(),
            path("ca.pem"),
            "--tls-auth-clients".to_owned(),
            if client_certs { "yes" } else { "no" }.to_owned(),
        ];
        all.extend(args.iter().map(|a| (*a).to_owned()));
        let all: Vec<&str> = all.iter().map(String::as_str).collect();
        Self::launch(&all, true, Vec::new(), Place::loopback())
    }

    fn launch(args: &[&str], tls: bool, env: Vec<(String, String)>, place: Place) -> Self {
        let mut last_error = String::new();
        for _ in 0..5 {
            let port = free_port();
            let args: Vec<String> = args.iter().map(|a| (*a).to_owned()).collect();
            let ports = if tls {
                ["--port".to_owned(), "0".to_owned(), "--tls-port".to_owned(), port.to_string()]
            } else {
                ["--port".to_owned(), port.to_string(), "--tls-port".to_owned(), "0".to_owned()]
            };
            let env = env.clone();
            let at = place.clone();
            let ip = place.ip;
            let bind = ip.to_string();
            let spawn = move |dir: &std::path::Path| {
                let mut redis = at.command("redis-server");
                redis
                    .envs(env.iter().map(|(k, v)| (k, v)))
                    .args(&ports)
                    .args(["--bind", &bind, "--save", "", "--appendonly", "no"])
                    .args(["--dir", &dir.to_string_lossy(), "--protected-mode", "no", "--daemonize", "no"])
                    .args(&args);
                redis
            };
            let dir = ServerProcess::temp_dir("redis");
            // A TLS-only server is ready when it accepts connections (a plaintext `PING` gets no answer).
            let ready = move || if tls { TcpStream::connect((ip, port)).is_ok() } else { ping_at(ip, port) };
            let mut process = ServerProcess::new("redis-server", dir, spawn, ready, Duration::from_secs(10));
            match process.try_start() {
                Ok(()) => return RedisServer { ip, port, tls, process },
                Err(e) => last_error = e,
            }
        }
        panic!("could not start redis-server: {last_error}");
    }

    /// Whether the server answers `PING` right now (a TLS one: accepts connections).
    pub fn ping(&self) -> bool {
        if self.tls {
            return TcpStream::connect((self.ip, self.port)).is_ok();
        }
        ping_at(self.ip, self.port)
    }

    /// The port it listens on.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The address it listens on (loopback, or its member's on a private network).
    pub fn ip(&self) -> Ipv4Addr {
        self.ip
    }

    /// `redis://<ip>:<port>`, or for a TLS one `rediss://localhost:<port>` (the name
    /// its certificate is for).
    pub fn url(&self) -> String {
        if self.tls {
            return format!("rediss://localhost:{}", self.port);
        }
        format!("redis://{}:{}", self.ip, self.port)
    }

    /// Its own temporary directory (removed when it is dropped).
    pub fn dir(&self) -> &std::path::Path {
        self.process.dir()
    }

    /// The process id, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.process.pid()
    }

    /// Kills the server with SIGKILL (its data is gone: no persistence).
    pub fn kill(&mut self) {
        self.process.kill();
    }

    /// Starts it again on the same port (after [`kill`](Self::kill)), with an empty dataset;
    /// the port may take a moment to be free again.
    pub fn restart(&mut self) {
        self.kill();
        let started = Instant::now();
        loop {
            match self.process.try_start() {
                Ok(()) => return,
                Err(e) if started.elapsed() > Duration::from_secs(10) => panic!("restart failed: {e}"),
                Err(_) => std::thread::sleep(Duration::from_millis(50)),
            }
        }
    }

    /// Freezes the server (SIGSTOP): connections stay open, nothing is answered.
    pub fn pause(&self) {
        self.process.pause();
    }

    /// Lets a paused server run again (SIGCONT).
    pub fn resume(&self) {
        self.process.resume();
    }
}

/// The minimal ACL of a lock user (password `lock-secret`), as the README gives it: the
/// library's keys and channels only, and the commands it runs.
pub const LOCK_USER_ACL: &[&str] = &[
    "on",
    ">lock-secret",
    "resetkeys",
    "~lock:*",
    "resetchannels",
    "&lock:*",
    "nocommands",
    "+ping",
    "+eval",
    "+evalsha",
    "+script|load",
    "+subscribe",
    "+unsubscribe",
    "+get",
    "+set",
    "+del",
    "+append",
    "+pexpire",
    "+pttl",
    "+time",
    "+hget",
    "+hset",
    "+hdel",
    "+hgetall",
    "+publish",
];

/// `calls` per command from the server's `INFO commandstats` (what a test or benchmark counts
/// the commands of an operation with).
pub async fn command_calls(conn: &mut redis::aio::MultiplexedConnection) -> std::collections::BTreeMap<String, u64> {
    let info: String = redis::cmd("INFO").arg("commandstats").query_async(conn).await.expect("INFO");
    info.lines()
        .filter_map(|line| {
            let (name, rest) = line.strip_prefix("cmdstat_")?.split_once(':')?;
            let calls = rest.split(',').find_map(|kv| kv.strip_prefix("calls="))?.parse().ok()?;
            Some((name.to_owned(), calls))
        })
        .collect()
}

/// Whether a server at `ip:port` answers `PING` (a server that wants a password answers
/// `-NOAUTH`: it serves too).
pub(crate) fn ping_at(ip: Ipv4Addr, port: u16) -> bool {
    let Ok(mut stream) = TcpStream::connect_timeout(&(ip, port).into(), Duration::from_millis(500)) else {
        return false;
    };
    let _ = stream.set_read_timeout(Some(Duration::from_millis(500)));
    if stream.write_all(b"PING\r\n").is_err() {
        return false;
    }
    let mut buf = [0u8; 7];
    stream.read_exact(&mut buf).is_ok() && (&buf == b"+PONG\r\n" || &buf == b"-NOAUTH")
}

pub use crate::free_port;

/// A TCP proxy for fault injection between a backend and its server.
#[path = "tcp_proxy.rs"]
pub mod tcp_proxy;
