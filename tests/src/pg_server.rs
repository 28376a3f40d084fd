//! A real PostgreSQL server for the PostgreSQL backend tests: the Debian `postgresql`
//! package's binaries (`/usr/lib/postgresql/<version>/bin`), started as the `postgres` process
//! itself (no `pg_ctl` daemon) on a free loopback port with a temporary data directory, and
//! stopped by its own pid on drop.
//!
//! PostgreSQL refuses to run as root: when the tests run as root, `initdb` and `postgres` run
//! as the `postgres` user (created by the Debian package), else `nobody`, through `setpriv`,
//! and the data directory is given to that user. `initdb` runs once per test process, into a
//! template directory (removed by the next run once this process is gone); each server starts
//! on a copy of it, in `/dev/shm` where there is one (milliseconds per server, not the second
//! of an `initdb`).
//!
//! ```ignore
//! let mut pg = lock_tests::pg_server::PgServer::start();
//! let manager = lock_runtime::LockManager::postgres(pg.url()).await?;
//! pg.restart(); // fast shutdown, then the same port and data directory
//! ```

#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)]

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

pub use crate::free_port;
use crate::server_process::ServerProcess;

/// The newest `/usr/lib/postgresql/<version>/bin` holding `initdb`.
pub fn bin_dir() -> PathBuf {
    let mut found: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let version = e.file_name().to_string_lossy().parse::<u32>().ok()?;
            let bin = e.path().join("bin");
            bin.join("initdb").exists().then_some((version, bin))
        })
        .collect();
    found.sort();
    found.pop().map(|(_, bin)| bin).expect(
        "no PostgreSQL under /usr/lib/postgresql/*/bin (install it: apt-get install postgresql; scripts/test does)",
    )
}

/// The user the server runs as: `None` (ourselves) unless we are root, then `postgres` if it
/// exists, else `nobody`.
fn run_as() -> Option<&'static str> {
    static USER: OnceLock<Option<&'static str>> = OnceLock::new();
    *USER.get_or_init(|| {
        let uid = Command::new("id").arg("-u").output().expect("run id");
        if String::from_utf8_lossy(&uid.stdout).trim() != "0" {
            return None;
        }
        let has_postgres = Command::new("id").arg("postgres").stdout(Stdio::null()).stderr(Stdio::null()).status();
        Some(if has_postgres.map(|s| s.success()).unwrap_or(false) { "postgres" } else { "nobody" })
    })
}

/// `program` run as [`run_as`]'s user.
fn command(program: &Path) -> Command {
    match run_as() {
        None => Command::new(program),
        Some(user) => {
            let mut c = Command::new("setpriv");
            // `setpriv` execs the program: the child's pid is the server's own.
            c.args([&format!("--reuid={user}"), &format!("--regid={user}"), "--init-groups"]).arg(program);
            c
        }
    }
}

fn give_to_user(dir: &Path) {
    if let Some(user) = run_as() {
        let status = Command::new("chown").args(["-R", &format!("{user}:")]).arg(dir).status().expect("chown");
        assert!(status.success(), "chown {} to {user} failed", dir.display());
    }
}

/// The `initdb`-ed template of this process (removed only by the next run, see below).
fn template() -> &'static Path {
    static TEMPLATE: OnceLock<PathBuf> = OnceLock::new();
    TEMPLATE.get_or_init(|| {
        let dir = ServerProcess::template_dir("pg");
        give_to_user(&dir);
        let data = dir.join("data");
        let out = command(&bin_dir().join("initdb"))
            .arg("-D")
            .arg(&data)
            .args(["-A", "trust", "-U", "postgres", "-E", "UTF8", "--no-sync", "--no-instructions", "--wal-segsize=1"])
            .output()
            .expect("run initdb");
        assert!(out.status.success(), "initdb failed: {}", String::from_utf8_lossy(&out.stderr));
        data
    })
}

/// Where the servers' data directories go: `/dev/shm` (memory: copying the template there
/// takes milliseconds, not a second) when it is there with room to spare (a container's is
/// often 64 MB, less than a few servers need), else the temporary directory.
fn server_base() -> PathBuf {
    let shm = Path::new("/dev/shm");
    let writable = shm.is_dir() && std::fs::metadata(shm).map(|m| !m.permissions().readonly()).unwrap_or(false);
    if writable && available_kib(shm).is_some_and(|kib| kib >= 1024 * 1024) {
        shm.to_owned()
    } else {
        std::env::temp_dir()
    }
}

/// Free space of the file system holding `path`, in KiB (from `df -Pk`).
fn available_kib(path: &Path) -> Option<u64> {
    let out = Command::new("df").arg("-Pk").arg(path).output().ok()?;
    let text = String::from_utf8_lossy(&out.stdout);
    text.lines().nth(1)?.split_whitespace().nth(3)?.parse().ok()
}

/// One PostgreSQL server process, stopped on drop.
#[derive(Debug)]
pub struct PgServer {
    port: u16,
    process: ServerProcess,
}

impl PgServer {
    /// Starts a server on a free loopback port (trust authentication, user `postgres`) and
    /// waits until it accepts connections. Panics (failing the test) if it does not.
    pub fn start() -> PgServer {
        Self::launch(Vec::new(), |_| {})
    }

    /// A server that speaks TLS only (`ssl=on`, `hostssl` lines alone in its `pg_hba.conf`)
    /// with the server certificate of `certs`; with `client_certs`, clients must present a
    /// certificate signed by its CA (`clientcert=verify-ca`). Its [`url`](Self::url) is the
    /// same as a plain one's; the client chooses TLS with `sslmode` (or `PostgresOptions::tls`).
    pub fn start_tls(certs: &crate::tls_certs::Certs, client_certs: bool) -> PgServer {
        Self::start_tls_as(certs, "server", client_certs)
    }

    /// [`start_tls`](Self::start_tls) with the certificate `<cert>.pem` of `certs` (`expired`,
    /// `elsewhere`).
    pub fn start_tls_as(certs: &crate::tls_certs::Certs, cert: &str, client_certs: bool) -> PgServer {
        let files = [
            (certs.path(&format!("{cert}.pem")), "server.pem"),
            (certs.path(&format!("{cert}.key")), "server.key"),
            (certs.path("ca.pem"), "ca.pem"),
        ];
        let clientcert = if client_certs { " clientcert=verify-ca" } else { "" };
        // The Unix socket stays open (without TLS) for the tests' own admin connection.
        let hba = format!("local all all trust\nhostssl all all 127.0.0.1/32 trust{clientcert}\n");
        let args = [
            "ssl=on",
            "ssl_cert_file={data}/tls/server.pem",
            "ssl_key_file={data}/tls/server.key",
            "ssl_ca_file={data}/tls/ca.pem",
            "hba_file={data}/tls/pg_hba.conf",
        ];
        Self::launch(args.iter().map(|a| (*a).to_owned()).collect(), move |data: &Path| {
            // In the data directory, owned by the server's user, the key readable by it alone
            // (PostgreSQL refuses it otherwise).
            let tls = data.join("tls");
            std::fs::create_dir_all(&tls).expect("tls dir");
            for (from, to) in &files {
                std::fs::copy(from, tls.join(to)).expect("copy certificate");
            }
            std::fs::write(tls.join("pg_hba.conf"), &hba).expect("pg_hba.conf");
            let status = Command::new("chmod").arg("600").arg(tls.join("server.key")).status().expect("chmod");
            assert!(status.success());
        })
    }

    fn launch(settings: Vec<String>, setup: impl FnOnce(&Path)) -> PgServer {
        static N: AtomicU64 = AtomicU64::new(0);
        let dir =
            server_base().join(format!("lock-tests-pg-{}-{}", std::process::id(), N.fetch_add(1, Ordering::Relaxed)));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("server dir");
        let status = Command::new("cp").arg("-a").arg(template()).arg(dir.join("data")).status().expect("cp");
        assert!(status.success(), "copying the template data directory failed");
        setup(&dir.join("data"));
        give_to_user(&dir);
        let mut last = String::new();
        for _ in 0..5 {
            let port = free_port();
            let settings = settings.clone();
            let spawn = move |dir: &Path| {
                let mut postgres = command(&bin_dir().join("postgres"));
                postgres
                    .arg("-D")
                    .arg(dir.join("data"))
                    .args(["-p", &port.to_string(), "-c", "listen_addresses=127.0.0.1", "-c"])
                    .arg(format!("unix_socket_directories={}", dir.display()))
                    .args(["-c", "fsync=off", "-c", "max_connections=100", "-c", "shared_buffers=16MB"])
                    .args(["-c", "autovacuum=off"]);
                for setting in &settings {
                    postgres.arg("-c").arg(setting.replace("{data}", &dir.join("data").to_string_lossy()));
                }
                postgres
            };
            let ready = move || ready(port);
            let mut process = ServerProcess::new("postgres", dir.clone(), spawn, ready, Duration::from_secs(15));
            match process.try_start() {
                Ok(()) => return PgServer { port, process },
                Err(e) => {
                    last = e;
                    process.keep_dir(); // for the next try
                }
            }
        }
        panic!("could not start postgres: {last}");
    }

    /// Whether the server accepts connections right now (`pg_isready`).
    pub fn ready(&self) -> bool {
        ready(self.port)
    }

    /// `postgres://postgres@127.0.0.1:<port>/postgres`.
    pub fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }

    /// The port it listens on.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The directory of the server's Unix socket.
    pub fn admin_socket_dir(&self) -> &Path {
        self.process.dir()
    }

    /// A connection as `postgres` over the server's Unix socket (open without TLS even on a
    /// TLS-only server), for a test's own queries.
    pub async fn admin(&self) -> tokio_postgres::Client {
        let mut config = tokio_postgres::Config::new();
        config.host_path(self.process.dir()).port(self.port).user("postgres").dbname("postgres");
        let (client, connection) = config.connect(tokio_postgres::NoTls).await.expect("admin connection");
        tokio::spawn(connection);
        client
    }

    /// Until the session `pid` waits on a lock (`pg_stat_activity`'s `wait_event_type`): a
    /// waiter seen queued on the server.
    pub async fn until_blocked(observer: &tokio_postgres::Client, pid: i32) {
        loop {
            let sql = "SELECT wait_event_type FROM pg_stat_activity WHERE pid = $1";
            let row = observer.query_one(sql, &[&pid]).await.expect("pg_stat_activity");
            if row.get::<_, Option<String>>(0).as_deref() == Some("Lock") {
                return;
            }
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
    }

    /// An immediate shutdown (`SIGQUIT`: every process ends at once, as in a crash; the next
    /// start recovers from the WAL).
    pub fn kill(&mut self) {
        self.process.stop("-QUIT");
    }

    /// A fast shutdown (every session is terminated), then the server again on the same port
    /// with the same data.
    pub fn restart(&mut self) {
        self.process.stop("-INT");
        let started = Instant::now();
        loop {
            match self.process.try_start() {
                Ok(()) => return,
                Err(e) if started.elapsed() > Duration::from_secs(15) => panic!("restart failed: {e}"),
                Err(_) => std::thread::sleep(Duration::from_millis(50)),
            }
        }
    }
}

/// Whether a server on `port` accepts connections right now (`pg_isready`).
fn ready(port: u16) -> bool {
    Command::new(bin_dir().join("pg_isready"))
        .args(["-q", "-h", "127.0.0.1", "-p", &port.to_string(), "-U", "postgres", "-t", "1"])
        .status()
        .map(|s| s.success())
        .unwrap_or(false)
}

impl Drop for PgServer {
    fn drop(&mut self) {
        // An immediate shutdown: the postmaster takes its backends down with it (a SIGKILL
        // would leave them running).
        self.process.stop("-QUIT");
    }
}

/// PgBouncer in front of a [`PgServer`], in `pool_mode = transaction` (the way most production
/// PostgreSQL is reached): each client transaction runs on any of its server connections.
#[derive(Debug)]
pub struct PgBouncer {
    port: u16,
    process: ServerProcess,
}

impl PgBouncer {
    /// Starts `pgbouncer` on a free loopback port, in transaction mode, in front of `server`
    /// (database `postgres`, trust authentication, at most `pool_size` server connections).
    pub fn start(server: &PgServer, pool_size: u32) -> PgBouncer {
        let program = ["/usr/sbin/pgbouncer", "/usr/bin/pgbouncer"]
            .into_iter()
            .map(PathBuf::from)
            .find(|p| p.exists())
            .expect("no pgbouncer (install it: apt-get install pgbouncer; scripts/test does)");
        static N: AtomicU64 = AtomicU64::new(0);
        let n = N.fetch_add(1, Ordering::Relaxed);
        let dir = server_base().join(format!("lock-tests-pgbouncer-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("pgbouncer dir");
        std::fs::write(dir.join("userlist.txt"), "\"postgres\" \"\"\n").expect("userlist");
        give_to_user(&dir);
        let upstream = server.port();
        let mut last = String::new();
        for _ in 0..5 {
            let port = free_port();
            let config = format!(
                "[databases]\npostgres = host=127.0.0.1 port={upstream} dbname=postgres\n\
                 [pgbouncer]\nlisten_addr = 127.0.0.1\nlisten_port = {port}\nunix_socket_dir =\n\
                 auth_type = trust\nauth_file = {dir}/userlist.txt\npool_mode = transaction\n\
                 default_pool_size = {pool_size}\nmax_client_conn = 2000\n\
                 logfile = {dir}/pgbouncer.log\npidfile = {dir}/pgbouncer.pid\n\
                 ignore_startup_parameters = extra_float_digits,options\n",
                dir = dir.display()
            );
            let ini = dir.join("pgbouncer.ini");
            std::fs::write(&ini, config).expect("pgbouncer.ini");
            give_to_user(&dir);
            let (program, ini) = (program.clone(), ini.clone());
            let spawn = move |_: &Path| {
                let mut c = command(&program);
                c.arg(&ini);
                c
            };
            let ready = move || std::net::TcpStream::connect(("127.0.0.1", port)).is_ok();
            let mut process = ServerProcess::new("pgbouncer", dir.clone(), spawn, ready, Duration::from_secs(15));
            match process.try_start() {
                Ok(()) => return PgBouncer { port, process },
                Err(e) => {
                    last = e;
                    process.keep_dir();
                }
            }
        }
        panic!("could not start pgbouncer: {last}");
    }

    /// `postgres://postgres@127.0.0.1:<port>/postgres`, through the pooler.
    pub fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }

    /// The port it listens on.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Kills the pooler at once (SIGKILL).
    pub fn kill(&mut self) {
        self.process.kill();
    }
}
