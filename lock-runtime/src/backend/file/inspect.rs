//! The lock files as an inspection tool sees them ([`Inspect`], for `lockctl --file DIR`): each
//! holder writes a record into its file when it is granted (token, grant time, fixed lease,
//! owner, process, key), and a file is held when a shared lock on it cannot be had. A look
//! that finds a file held with no record yet (its holder is between taking the file lock and
//! writing the record, after syncing its token: a few milliseconds) looks again until the
//! record is there, for at most [`GRANTING`]; a holder stalled longer is shown with what is
//! known (owner `unknown`), never as a grant half made that is then reported again.

use std::fs::{File, TryLockError};
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::path::Path;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use super::{file_name, path, FileBackend, KIND};
use crate::backend::inspect::Unannounced;
use crate::backend::{BoxFuture, ChangeFeed, ForceRelease, Holder, Inspect, LockInfo};
use crate::error::LockError;

/// Records are padded to a multiple of this many bytes.
const RECORD_BLOCK: usize = 256;

/// Milliseconds since the Unix epoch.
fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

/// Writes the holder's record into its lock file (held): `token`, grant time (Unix ms), fixed
/// lease (ms, 0: none), owner, holder, key, tab-separated (keys hold no control characters).
pub(super) fn record(file: &File, token: u64, lease: Option<Duration>, owner: &str, holder: &Holder, key: &str) {
    let lease_ms = lease.map_or(0, |l| l.as_millis() as u64);
    let mut line = format!("{token}\t{}\t{lease_ms}\t{owner}\t{holder}\t{key}\n", now_ms());
    // Padded over an earlier holder's record rather than truncated first (a truncation costs a
    // journal transaction on ext4); a reader stops at the first line.
    let width = line.len().next_multiple_of(RECORD_BLOCK);
    line.extend(std::iter::repeat_n(' ', width - line.len()));
    let mut file = file;
    let written = file.seek(SeekFrom::Start(0)).and_then(|_| file.write_all(line.as_bytes()));
    if let Err(e) = written {
        tracing::debug!(error = %e, "could not write the holder's record into its lock file");
    }
}

/// Blanks the record of a holder that lets go of `file` while a waiter of its process takes it
/// next (the file stays): until the successor writes its own (after its token is synced), a
/// look sees a lock just taken, not the holder that let go (whose term an election's `leader()`
/// reported for up to 21 ms after `resign()` returned). One byte: the first line ends at once.
pub(super) fn clear(file: &File) {
    let mut file = file;
    let written = file.seek(SeekFrom::Start(0)).and_then(|_| file.write_all(b"\n"));
    if let Err(e) = written {
        tracing::debug!(error = %e, "could not blank the record of a lock file let go of");
    }
}

/// How long a look waits for the record of a holder that has the file lock but has not written
/// its record yet.
const GRANTING: Duration = Duration::from_secs(1);

/// What a lock file tells.
enum Look {
    Free,
    Held(LockInfo),
    /// Held, its record not written yet: what is known.
    Granting(LockInfo),
}

/// What the lock file at `path` tells, once its holder has written its record (or after
/// [`GRANTING`]).
async fn look(path: &Path) -> io::Result<Option<LockInfo>> {
    let deadline = crate::clock::now() + GRANTING;
    let mut pause = Duration::from_millis(1);
    loop {
        match look_once(path)? {
            Look::Free => return Ok(None),
            Look::Held(info) => return Ok(Some(info)),
            Look::Granting(info) if crate::clock::now() >= deadline => return Ok(Some(info)),
            // The file gives no signal when its record is written: looked at again, soon.
            Look::Granting(_) => tokio::time::sleep(pause).await,
        }
        pause = (pause * 2).min(Duration::from_millis(20));
    }
}

/// What the lock file at `path` tells now.
fn look_once(path: &Path) -> io::Result<Look> {
    let mut file = match File::open(path) {
        Ok(file) => file,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Look::Free),
        Err(e) => return Err(e),
    };
    match file.try_lock_shared() {
        Ok(()) => return Ok(Look::Free), // nobody holds it (closing the file lets go at once)
        Err(TryLockError::WouldBlock) => {}
        Err(TryLockError::Error(e)) => return Err(e),
    }
    let mut text = String::new();
    file.read_to_string(&mut text)?;
    let shown = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let fields: Vec<&str> = text.lines().next().unwrap_or_default().splitn(6, '\t').collect();
    let [token, granted, lease, owner, holder, key] = fields[..] else {
        // Taken a moment ago, its record not written yet.
        let mut info = LockInfo::new(path::unescape_name(&shown), "unknown");
        info.session_bound = true;
        return Ok(Look::Granting(info));
    };
    let mut info = LockInfo::new(key, owner);
    info.kind = Some(crate::backend::LockKind::Exclusive); // lock files are mutexes
    info.holder = Holder::parse(holder);
    info.fencing_token = token.parse().ok();
    let granted: Option<u64> = granted.parse().ok();
    info.age = granted.map(|g| Duration::from_millis(now_ms().saturating_sub(g)));
    match lease.parse::<u64>() {
        Ok(0) | Err(_) => info.session_bound = true, // held as long as its process lives
        Ok(lease) => {
            info.remaining_lease = granted.map(|g| Duration::from_millis((g + lease).saturating_sub(now_ms())));
        }
    }
    Ok(Look::Held(info))
}

impl Inspect for FileBackend {
    fn store(&self) -> &'static str {
        KIND
    }

    fn list<'a>(&'a self, prefix: &'a str) -> BoxFuture<'a, Result<Vec<LockInfo>, LockError>> {
        Box::pin(async move {
            let listed = async {
                let mut locks = Vec::new();
                for entry in std::fs::read_dir(self.dir())? {
                    let entry = entry?;
                    if !entry.file_name().to_string_lossy().ends_with(path::SUFFIX) {
                        continue;
                    }
                    if let Some(info) = look(&entry.path()).await? {
                        if info.key.starts_with(prefix) {
                            locks.push(info);
                        }
                    }
                }
                locks.sort_by(|a, b| a.key.cmp(&b.key));
                Ok::<_, io::Error>(locks)
            };
            listed.await.map_err(|e| LockError::backend(prefix, KIND, "list", e))
        })
    }

    fn inspect<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<Option<LockInfo>, LockError>> {
        Box::pin(async move {
            look(&self.dir().join(file_name(key))).await.map_err(|e| LockError::backend(key, KIND, "inspect", e))
        })
    }

    /// Refused: a file lock belongs to its holder's process until it lets go or ends.
    fn force_release<'a>(
        &'a self,
        key: &'a str,
        _expected_owner: Option<&'a str>,
    ) -> BoxFuture<'a, Result<ForceRelease, LockError>> {
        Box::pin(async move {
            match look(&self.dir().join(file_name(key))).await {
                Ok(None) => Ok(ForceRelease::NotHeld),
                Ok(Some(info)) => {
                    let pid = info
                        .holder
                        .as_ref()
                        .and_then(Holder::pid)
                        .map_or("its process".to_owned(), |p| format!("pid {p}"));
                    Err(LockError::invalid(
                    key,
                    format!("a lock file's lock belongs to its holder's process and cannot be taken from it: end {pid} (its locks go with it)"),
                ))
                }
                Err(e) => Err(LockError::backend(key, KIND, "release", e)),
            }
        })
    }

    fn changes<'a>(&'a self, _prefix: &'a str) -> BoxFuture<'a, Result<Box<dyn ChangeFeed>, LockError>> {
        Box::pin(std::future::ready(Ok(Box::new(Unannounced) as Box<dyn ChangeFeed>)))
    }
}
