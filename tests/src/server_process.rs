//! [`ServerProcess`]: one real server process a test owns, whatever the server. Every fixture
//! (`redis_server`, `redis_cluster`, `redis_sentinel`, `zk_server`, `etcd_server`, `pg_server`)
//! says how to start its server and how to tell that it serves; this does the rest: a
//! temporary directory of its own with the server's log in it, a reaper that kills the server
//! by its pid if the test process dies without dropping it, waiting until it is ready (failing
//! with the log when it exits first), kill, pause, resume, restart, and cleanup on drop.

#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

/// How a fixture starts its server: the command, given the server's directory.
type Spawn = Box<dyn Fn(&Path) -> Command + Send + Sync>;
/// How a fixture tells that its server serves.
type Ready = Box<dyn Fn() -> bool + Send + Sync>;

/// One server process, killed (and its directory removed) on drop.
pub struct ServerProcess {
    name: &'static str,
    dir: PathBuf,
    spawn: Spawn,
    ready: Ready,
    ready_within: Duration,
    child: Option<Child>,
    /// Whether a stop keeps the directory (a server restarted on its own data).
    keep_dir: bool,
}

impl std::fmt::Debug for ServerProcess {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerProcess")
            .field("name", &self.name)
            .field("dir", &self.dir)
            .field("pid", &self.pid())
            .finish()
    }
}

impl ServerProcess {
    /// A fresh temporary directory for a server of `label`, unique to this test process.
    pub fn temp_dir(label: &str) -> PathBuf {
        static SEQ: AtomicU32 = AtomicU32::new(0);
        let dir = std::env::temp_dir().join(format!(
            "lock-tests-{label}-{}-{}",
            std::process::id(),
            SEQ.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("temp dir for {label}: {e}"));
        dir
    }

    /// A fresh directory for this test process's data template of `label` (`initdb`,
    /// `mariadb-install-db`), made once per process: templates of earlier runs whose process is
    /// gone are removed first.
    pub fn template_dir(label: &str) -> PathBuf {
        let tmp = std::env::temp_dir();
        let prefix = format!("lock-tests-{label}-template-");
        for entry in std::fs::read_dir(&tmp).into_iter().flatten().flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if let Some(pid) = name.strip_prefix(&prefix) {
                if !Path::new("/proc").join(pid).exists() {
                    let _ = std::fs::remove_dir_all(entry.path());
                }
            }
        }
        let dir = tmp.join(format!("{prefix}{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("template dir for {label}: {e}"));
        dir
    }

    /// A server `name` (its program, for messages) in `dir`, not started yet: `spawn` makes its
    /// command (stdin, stdout and stderr are set here: none, and `<dir>/server.log`), `ready`
    /// tells when it serves, which must happen within `ready_within` of each start.
    pub fn new(
        name: &'static str,
        dir: PathBuf,
        spawn: impl Fn(&Path) -> Command + Send + Sync + 'static,
        ready: impl Fn() -> bool + Send + Sync + 'static,
        ready_within: Duration,
    ) -> Self {
        ServerProcess {
            name,
            dir,
            spawn: Box::new(spawn),
            ready: Box::new(ready),
            ready_within,
            child: None,
            keep_dir: false,
        }
    }

    /// Starts the server and waits until it is ready; panics with its log if it cannot.
    pub fn start(&mut self) {
        if let Err(e) = self.try_start() {
            panic!("{e}");
        }
    }

    /// [`start`](Self::start), returning why it failed (the server exited first, with its log,
    /// or was not ready in time) instead of panicking: a fixture may then try another port.
    pub fn try_start(&mut self) -> Result<(), String> {
        std::fs::create_dir_all(&self.dir).map_err(|e| format!("temp dir for {}: {e}", self.name))?;
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.log_path())
            .map_err(|e| format!("{} log: {e}", self.name))?;
        let child = (self.spawn)(&self.dir)
            .stdin(Stdio::null())
            .stdout(log.try_clone().map_err(|e| e.to_string())?)
            .stderr(log)
            .spawn()
            .map_err(|e| format!("cannot run `{}` (scripts/test installs it): {e}", self.name))?;
        // If this test process ends without dropping the server (a static, a crash), a small
        // reaper kills it by its pid: it lives while both processes do.
        let reaper = format!(
            "while kill -0 {test} 2>/dev/null && kill -0 {server} 2>/dev/null; do sleep 0.5; done; \
             kill -9 {server} 2>/dev/null; kill -0 {test} 2>/dev/null || rm -rf '{dir}'",
            test = std::process::id(),
            server = child.id(),
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
        while !(self.ready)() {
            if let Some(status) = self.child.as_mut().and_then(|c| c.try_wait().ok().flatten()) {
                self.child = None;
                return Err(format!("{} exited with {status} before it was ready:\n{}", self.name, self.log()));
            }
            if started.elapsed() > self.ready_within {
                self.kill();
                return Err(format!("{} was not ready within {:?}:\n{}", self.name, self.ready_within, self.log()));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(())
    }

    /// Kills the server at once (SIGKILL, as a crash) and waits for the process to end.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Stops the server with `signal` (e.g. `-INT` for a fast shutdown), waiting up to 10 s for
    /// it to end before killing it.
    pub fn stop(&mut self, signal: &str) {
        if let Some(mut child) = self.child.take() {
            let _ = Command::new("kill").args([signal, &child.id().to_string()]).status();
            let started = Instant::now();
            while started.elapsed() < Duration::from_secs(10) {
                if child.try_wait().ok().flatten().is_some() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts it again (after [`kill`](Self::kill), or kills it first), in the same directory.
    pub fn restart(&mut self) {
        self.kill();
        self.start();
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
        let pid = self.pid().unwrap_or_else(|| panic!("{} is not running", self.name));
        let status = Command::new("kill").args([signal, &pid.to_string()]).status().expect("run kill");
        assert!(status.success(), "kill {signal} {pid} failed");
    }

    /// The process id, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Whether it was started and not killed (it may have exited since).
    pub fn running(&self) -> bool {
        self.child.is_some()
    }

    /// Its own temporary directory (removed when it is dropped).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Keeps the directory when dropped (another owner removes it).
    pub fn keep_dir(&mut self) {
        self.keep_dir = true;
    }

    fn log_path(&self) -> PathBuf {
        self.dir.join("server.log")
    }

    /// What the server logged so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.log_path()).unwrap_or_default()
    }
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        self.kill(); // SIGKILL, which also ends a paused server
        if !self.keep_dir {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}
