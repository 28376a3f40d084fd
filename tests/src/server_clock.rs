//! A server's wall clock, stepped by the test: the server process starts with a small preload
//! of this crate (`server_clock/shift.c`, compiled with the system C compiler on first use)
//! that adds the whole seconds written in a file of its own to `CLOCK_REALTIME`,
//! `gettimeofday` and `time`, and leaves every monotonic clock, sleep and timer true: an NTP
//! step or a restored VM, on one server. The file is read at every call, so a step takes
//! effect at the server's next look at the clock.
//!
//! Why not libfaketime (which the client clock faults of [`clocks`](crate::clocks) use):
//! Debian's `redis-server` is linked with jemalloc, which reads the clock while libfaketime
//! initialises; libfaketime gives up ("Cannot recover from unexpected recursive calls to
//! clock_gettime()") and the server never answers. This preload allocates nothing and
//! resolves no symbol. An etcd member is a Go program, which reads its clocks through the vDSO
//! and its own system calls, so no preload reaches it.

#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)]

use std::path::PathBuf;
use std::process::Command;
use std::sync::OnceLock;

/// The preload's source.
const SOURCE: &str = include_str!("server_clock/shift.c");

/// The compiled preload, built once per source text (its name holds a hash of it) in the
/// system's temporary directory and kept there for later runs.
fn preload() -> &'static PathBuf {
    static PRELOAD: OnceLock<PathBuf> = OnceLock::new();
    PRELOAD.get_or_init(|| {
        use std::hash::{Hash, Hasher};
        let mut hasher = std::collections::hash_map::DefaultHasher::new();
        SOURCE.hash(&mut hasher);
        let tag = format!("{:016x}", hasher.finish());
        let library = std::env::temp_dir().join(format!("lock-tests-clock-shift-{tag}.so"));
        if library.exists() {
            return library;
        }
        let dir = crate::server_process::ServerProcess::temp_dir("clock-shift-build");
        let source = dir.join("shift.c");
        std::fs::write(&source, SOURCE).expect("write the clock preload's source");
        let built = dir.join("shift.so");
        let compiler = std::env::var("CC").unwrap_or_else(|_| "cc".to_owned());
        let status = Command::new(&compiler)
            .args(["-shared", "-fPIC", "-O2", "-o"])
            .arg(&built)
            .arg(&source)
            .status()
            .unwrap_or_else(|e| panic!("run the C compiler `{compiler}` for the clock preload: {e}"));
        assert!(status.success(), "the clock preload did not compile: {status}");
        // Another test binary may have built it meanwhile: a rename within one directory is atomic.
        let staged = std::env::temp_dir().join(format!("lock-tests-clock-shift-{tag}.{}.so", std::process::id()));
        std::fs::copy(&built, &staged).expect("stage the clock preload");
        std::fs::rename(&staged, &library).expect("install the clock preload");
        let _ = std::fs::remove_dir_all(&dir);
        library
    })
}

/// One server's clock: a file of seconds to add to its wall clock, and the environment that
/// makes a process read it.
#[derive(Debug)]
pub struct ServerClock {
    dir: PathBuf,
    file: PathBuf,
}

impl ServerClock {
    /// A clock at the true time (offset 0), the preload compiled if need be.
    pub fn new() -> ServerClock {
        preload();
        let dir = crate::server_process::ServerProcess::temp_dir("server-clock");
        let file = dir.join("offset");
        std::fs::write(&file, "0\n").expect("write the clock offset");
        ServerClock { dir, file }
    }

    /// What a server process needs in its environment to run on this clock.
    pub fn env(&self) -> Vec<(String, String)> {
        vec![
            ("LD_PRELOAD".to_owned(), preload().display().to_string()),
            ("LOCK_TESTS_CLOCK_FILE".to_owned(), self.file.display().to_string()),
        ]
    }

    /// Sets the server's wall clock `seconds` away from the true time (negative: behind), from
    /// its next look at the clock.
    pub fn set(&self, seconds: i64) {
        // Replaced, never rewritten in place: a read between a truncation and the write would
        // see no offset at all.
        let staged = self.dir.join("offset.next");
        std::fs::write(&staged, format!("{seconds:+}\n")).expect("write the server's clock offset");
        std::fs::rename(&staged, &self.file).expect("step the server's clock");
    }
}

impl Default for ServerClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Drop for ServerClock {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
