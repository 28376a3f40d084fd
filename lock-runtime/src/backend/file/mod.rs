#![doc = include_str!("README.md")]

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use crate::backend::{Acquire, Acquisition, Attempt, BoxFuture, Grant, Held, HeldLock, Lease, LockBackend, Wake};
use crate::error::LockError;
use crate::lost::LostSignal;

mod fence;
mod inspect;
mod path;
mod queue;
mod sharing;

pub use path::file_name;
use queue::{Handed, Lines, Sent};

const KIND: &str = "file";

/// Options of a [`FileBackend`].
///
/// ```
/// use std::time::Duration;
/// use lock_runtime::backend::file::FileOptions;
///
/// let options = FileOptions::new().operation_timeout(Duration::from_secs(2));
/// assert_eq!(options.get_operation_timeout(), Duration::from_secs(2));
/// assert!(!options.get_allow_network_file_system());
/// ```
#[derive(Debug, Clone)]
pub struct FileOptions {
    operation_timeout: Duration,
    allow_network_file_system: bool,
}

impl Default for FileOptions {
    fn default() -> Self {
        FileOptions { operation_timeout: Duration::from_secs(5), allow_network_file_system: false }
    }
}

impl FileOptions {
    /// The defaults: operation timeout 5 s, network file systems refused.
    pub fn new() -> Self {
        Self::default()
    }

    /// The longest one attempt may take (opening the file, its lock, drawing a token). More
    /// than zero.
    pub fn operation_timeout(mut self, timeout: Duration) -> Self {
        self.operation_timeout = timeout;
        self
    }

    /// Accepts a directory on a network file system (NFS, SMB/CIFS, 9p, sshfs, AFS), whose
    /// advisory locks may not exclude processes on other hosts (see the [module docs](self)).
    /// Only for processes that all run on one host.
    pub fn allow_network_file_system(mut self, allow: bool) -> Self {
        self.allow_network_file_system = allow;
        self
    }

    /// The operation timeout.
    pub fn get_operation_timeout(&self) -> Duration {
        self.operation_timeout
    }

    /// Whether a network file system is accepted.
    pub fn get_allow_network_file_system(&self) -> bool {
        self.allow_network_file_system
    }
}

/// What the clones of one backend share.
struct Shared {
    dir: PathBuf,
    options: FileOptions,
    fence: fence::Fence,
    /// How its files are created (a directory shared by several users).
    sharing: sharing::Sharing,
    lines: Lines,
}

/// The lock-file store: one file per lock name in a directory, locked with the OS's advisory
/// file locks. Cheap to clone. See the [module docs](self).
#[derive(Clone)]
pub struct FileBackend {
    shared: Arc<Shared>,
}

impl fmt::Debug for FileBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FileBackend").field("dir", &self.shared.dir).field("options", &self.shared.options).finish()
    }
}

impl FileBackend {
    /// Opens the lock directory `dir` (creating it and its parents if missing) with the
    /// default [`FileOptions`].
    ///
    /// ```
    /// # fn main() -> Result<(), lock_runtime::LockError> {
    /// let dir = std::env::temp_dir().join("lock-runtime-doc");
    /// let backend = lock_runtime::backend::file::FileBackend::open(&dir)?;
    /// assert_eq!(backend.dir(), dir.as_path());
    /// # Ok(()) }
    /// ```
    pub fn open(dir: impl AsRef<Path>) -> Result<Self, LockError> {
        Self::open_with(dir, FileOptions::new())
    }

    /// Opens the lock directory `dir` with `options`. An [`is_invalid`](LockError::is_invalid)
    /// error names the cause when the directory cannot be created or written, is a file, is on
    /// a network file system (unless allowed), or an option is out of range.
    pub fn open_with(dir: impl AsRef<Path>, options: FileOptions) -> Result<Self, LockError> {
        let dir = dir.as_ref();
        let shown = dir.display();
        if options.operation_timeout.is_zero() {
            return Err(LockError::invalid("", "the lock-file operation timeout must be more than zero"));
        }
        if dir.as_os_str().is_empty() {
            return Err(LockError::invalid("", "the lock directory is empty; give a path such as /var/lock/myapp"));
        }
        std::fs::create_dir_all(dir)
            .map_err(|e| LockError::invalid("", format!("cannot create the lock directory {shown}: {e}")))?;
        let cannot_write = |e| LockError::invalid("", format!("cannot write in the lock directory {shown}: {e}"));
        let sharing = sharing::Sharing::of(dir).map_err(cannot_write)?;
        let fence = fence::Fence::open(dir, sharing).map_err(cannot_write)?;
        if let Some(fs_type) = path::network_file_system(dir) {
            if !options.allow_network_file_system {
                return Err(LockError::invalid(
                    "",
                    format!(
                        "the lock directory {shown} is on a network file system ({fs_type}), whose file locks may not \
                         exclude processes on other hosts; use a local directory, a lock server, or \
                         FileOptions::allow_network_file_system(true) if every process runs on this host"
                    ),
                ));
            }
        }
        let dir = dir.to_path_buf();
        Ok(FileBackend { shared: Arc::new(Shared { dir, options, fence, sharing, lines: Lines::default() }) })
    }

    /// The lock directory.
    pub fn dir(&self) -> &Path {
        &self.shared.dir
    }

    /// The options this backend was opened with.
    pub fn options(&self) -> &FileOptions {
        &self.shared.options
    }
}

impl LockBackend for FileBackend {
    fn name(&self) -> &'static str {
        KIND
    }

    fn begin(&self, req: Acquire, lost: LostSignal) -> Box<dyn Acquisition> {
        static IDS: AtomicU64 = AtomicU64::new(1);
        Box::new(FileAcquisition {
            shared: self.shared.clone(),
            name: file_name(&req.key),
            req,
            id: IDS.fetch_add(1, Ordering::Relaxed),
            queued: None,
            lost,
        })
    }

    fn operation_timeout(&self) -> Duration {
        self.shared.options.operation_timeout
    }

    fn inspector(&self) -> Option<&dyn crate::backend::Inspect> {
        Some(self)
    }
}

/// A failure on the lock directory `dir`, which it names (an I/O error names no path).
fn io_error(dir: &Path, name: &str, operation: &'static str, e: impl std::fmt::Display) -> LockError {
    LockError::backend(name, KIND, operation, format!("{e} (in the lock directory `{}`)", dir.display()))
}

/// One `lock()` call: owns its place in this process's line for the name while it waits.
struct FileAcquisition {
    shared: Arc<Shared>,
    req: Acquire,
    /// The lock file's name in the directory.
    name: String,
    /// Our id in the line.
    id: u64,
    /// Our place in the line: the helper hands the lock here.
    queued: Option<oneshot::Receiver<Sent>>,
    /// Fired when a fixed lease ends, before the file is freed (a lock file is lost only with
    /// its process otherwise).
    lost: LostSignal,
}

impl FileAcquisition {
    async fn attempt_once(&mut self) -> Result<Attempt, LockError> {
        if self.queued.is_some() || self.shared.lines.queued(&self.name) {
            return Ok(Attempt::Busy); // behind this process's waiters (FIFO)
        }
        let granted_at = crate::clock::now();
        let (shared, name) = (self.shared.clone(), self.name.clone());
        match tokio::task::spawn_blocking(move || queue::take(&shared, &name, false)).await {
            Ok(Ok(Some(handed))) => Ok(Attempt::Acquired(self.grant(handed, granted_at))),
            Ok(Ok(None)) => Ok(Attempt::Busy),
            Ok(Err(e)) => Err(io_error(&self.shared.dir, &self.req.name, "attempt", e)),
            Err(e) => Err(io_error(&self.shared.dir, &self.req.name, "attempt", e)),
        }
    }

    async fn wait_until(&mut self, deadline: Instant) -> Result<Wake, LockError> {
        if crate::clock::now() >= deadline {
            return Ok(Wake::TimedOut);
        }
        if self.queued.is_none() {
            let (tx, rx) = oneshot::channel();
            queue::join(&self.shared, &self.name, self.id, tx)
                .map_err(|e| io_error(&self.shared.dir, &self.req.name, "wait", e))?;
            self.queued = Some(rx);
        }
        let Some(queued) = self.queued.as_mut() else { return Ok(Wake::Retry) };
        tokio::select! {
            sent = queued => {
                self.queued = None;
                match sent {
                    Ok(Ok(handed)) => Ok(Wake::Acquired(self.grant(handed, crate::clock::now()))),
                    Ok(Err(why)) => Err(io_error(&self.shared.dir, &self.req.name, "wait", why)),
                    Err(_) => Ok(Wake::Retry),
                }
            }
            // Still in line: leaves it when dropped.
            _ = tokio::time::sleep_until(deadline.into()) => Ok(Wake::TimedOut),
        }
    }

    fn grant(&self, handed: Handed, granted_at: Instant) -> Grant {
        let lease = match self.req.lease {
            Lease::Fixed(lease) => Some(lease),
            Lease::Renewed(_) => None,
        };
        let owner = self.req.owner.to_string();
        inspect::record(&handed.file, handed.token, lease, &owner, &self.req.holder, &self.req.key);
        let slot = Arc::new(Mutex::new(Some(handed.file)));
        let timer = match self.req.lease {
            Lease::Fixed(lease) => granted_at.checked_add(lease).and_then(|end| {
                let (shared, name, slot, lost) =
                    (self.shared.clone(), self.name.clone(), slot.clone(), self.lost.clone());
                let runtime = tokio::runtime::Handle::try_current().ok()?;
                Some(runtime.spawn(async move {
                    tokio::time::sleep_until(end.into()).await;
                    if let Some(file) = take(&slot) {
                        // Told before anyone else can take it (a holder paused past its lease
                        // runs this late, and the runtime's own timer may not have run yet).
                        lost.fire("its fixed lease ended");
                        queue::free(&shared, &name, file);
                    }
                }))
            }),
            Lease::Renewed(_) => None,
        };
        let held = FileHeld {
            shared: self.shared.clone(),
            name: self.name.clone(),
            lock_name: self.req.name.clone(),
            slot,
            timer,
        };
        Grant { fencing_token: handed.token, granted_at: Some(granted_at), lock: Held::new(held) }
    }
}

impl Acquisition for FileAcquisition {
    fn attempt(&mut self) -> BoxFuture<'_, Result<Attempt, LockError>> {
        Box::pin(self.attempt_once())
    }

    fn wait(&mut self, deadline: Instant) -> BoxFuture<'_, Result<Wake, LockError>> {
        Box::pin(self.wait_until(deadline))
    }
}

impl Drop for FileAcquisition {
    fn drop(&mut self) {
        if let Some(rx) = self.queued.take() {
            queue::leave(&self.shared, &self.name, self.id, rx);
        }
    }
}

fn take(slot: &Mutex<Option<std::fs::File>>) -> Option<std::fs::File> {
    slot.lock().unwrap_or_else(PoisonError::into_inner).take()
}

/// A granted lock: its open, locked file (taken by the release, or by a fixed lease's end).
struct FileHeld {
    shared: Arc<Shared>,
    name: String,
    lock_name: Arc<str>,
    slot: Arc<Mutex<Option<std::fs::File>>>,
    timer: Option<JoinHandle<()>>,
}

impl FileHeld {
    fn take(&mut self) -> Result<std::fs::File, LockError> {
        if let Some(timer) = self.timer.take() {
            timer.abort();
        }
        take(&self.slot).ok_or_else(|| LockError::lost(&*self.lock_name, "its fixed lease had ended"))
    }
}

impl HeldLock for FileHeld {
    fn release(&mut self) -> BoxFuture<'_, Result<(), LockError>> {
        let released = self.take().map(|file| queue::free(&self.shared, &self.name, file));
        Box::pin(std::future::ready(released))
    }

    /// Freeing a lock file is a removal and a close, done at once.
    fn release_now(&mut self) -> Option<Result<(), LockError>> {
        Some(self.take().map(|file| queue::free(&self.shared, &self.name, file)))
    }

    fn release_after(&mut self, remaining: Duration) -> BoxFuture<'_, Result<(), LockError>> {
        let released = self.take().map(|file| {
            let (shared, name) = (self.shared.clone(), self.name.clone());
            match tokio::runtime::Handle::try_current() {
                Ok(runtime) => drop(runtime.spawn(async move {
                    tokio::time::sleep(remaining).await;
                    queue::free(&shared, &name, file);
                })),
                Err(_) => queue::free(&shared, &name, file),
            }
        });
        Box::pin(std::future::ready(released))
    }
}

impl Drop for FileHeld {
    fn drop(&mut self) {
        if let Ok(file) = self.take() {
            queue::free(&self.shared, &self.name, file);
        }
    }
}
