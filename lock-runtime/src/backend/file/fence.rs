//! The fencing counter of a lock directory: the file `.fence`, one decimal number, raised under
//! its own file lock and written through to the disk (`fdatasync`) before a token is handed
//! out, so tokens keep increasing across processes, restarts and power loss. A token is also
//! never below the system clock in microseconds: tokens keep increasing even if `.fence` is
//! lost, as long as the clock does not step back.

use std::fs::{File, TryLockError};
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant, SystemTime};

use super::sharing::Sharing;

/// The counter's file name in the lock directory (lock files end in `.lock`).
pub(super) const FILE: &str = ".fence";

/// The open counter file. Threads of one process take turns on it (a file lock is shared by
/// everything using the same open file); processes, through its file lock.
pub(super) struct Fence {
    file: Mutex<File>,
    /// Its path, for errors.
    path: PathBuf,
}

impl Fence {
    /// Opens (or creates) `dir/.fence`: fails when the directory cannot be written.
    pub(super) fn open(dir: &Path, sharing: Sharing) -> io::Result<Fence> {
        let path = dir.join(FILE);
        let file = sharing.open(&path)?;
        Ok(Fence { file: Mutex::new(file), path })
    }

    /// The next token: above every token handed out from this directory before. Waits at most
    /// `bound` for another process's turn (held for a read, a write and a sync).
    pub(super) fn next(&self, bound: Duration) -> io::Result<u64> {
        let mut file = self.file.lock().unwrap_or_else(PoisonError::into_inner);
        let started = Instant::now();
        let mut pause = Duration::from_micros(50);
        loop {
            match file.try_lock() {
                Ok(()) => break,
                Err(TryLockError::WouldBlock) if started.elapsed() < bound => {
                    std::thread::sleep(pause);
                    pause = (pause * 2).min(Duration::from_millis(5));
                }
                Err(TryLockError::WouldBlock) => {
                    return Err(io::Error::new(
                        io::ErrorKind::TimedOut,
                        format!("the fencing counter `{FILE}` stayed locked by another process for {bound:?}"),
                    ))
                }
                Err(TryLockError::Error(e)) => return Err(e),
            }
        }
        let next = raise(&mut file, &self.path);
        let unlocked = file.unlock();
        let next = next?;
        unlocked?;
        Ok(next)
    }
}

/// Reads the counter, writes the next value and syncs it; the caller holds the file lock.
fn raise(file: &mut File, path: &Path) -> io::Result<u64> {
    let mut text = String::new();
    file.seek(SeekFrom::Start(0))?;
    file.read_to_string(&mut text)?;
    let last = match text.trim() {
        "" => 0,
        digits => digits.parse::<u64>().map_err(|_| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!("the fencing counter `{FILE}` holds {digits:?}, not a number"),
            )
        })?,
    };
    let clock = SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).map_or(0, |d| d.as_micros() as u64);
    // At the largest value there is no higher token: refused, never the same one again (equal
    // tokens pass every fence).
    let next = last.checked_add(1).ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!(
                "the fencing counter `{}` is at the largest token ({last}): no token above it exists; \
                 write a lower number there only once no token it handed out is in use",
                path.display()
            ),
        )
    })?;
    let next = next.max(clock);
    file.seek(SeekFrom::Start(0))?;
    // Fixed width: a shorter number never leaves digits of a longer one behind.
    file.write_all(format!("{next:020}\n").as_bytes())?;
    file.sync_data()?;
    Ok(next)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_increase_across_openings_and_refuse_garbage() {
        let dir = std::env::temp_dir().join(format!("lock-fence-{}", crate::backend::OwnerId::next()));
        std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("{e}"));
        let bound = Duration::from_secs(1);
        let first = Fence::open(&dir, Sharing::of(&dir).unwrap_or_else(|e| panic!("{e}")))
            .and_then(|f| f.next(bound))
            .unwrap_or_else(|e| panic!("{e}"));
        let fence =
            Fence::open(&dir, Sharing::of(&dir).unwrap_or_else(|e| panic!("{e}"))).unwrap_or_else(|e| panic!("{e}"));
        let second = fence.next(bound).unwrap_or_else(|e| panic!("{e}"));
        assert!(second > first);
        std::fs::write(dir.join(FILE), "99999999999999999999\n").unwrap_or_else(|e| panic!("{e}"));
        let err = fence.next(bound).expect_err("overflowing number");
        assert_eq!(err.kind(), io::ErrorKind::InvalidData, "{err}");
        std::fs::write(dir.join(FILE), "nonsense").unwrap_or_else(|e| panic!("{e}"));
        let err = fence.next(bound).expect_err("garbage");
        assert!(err.to_string().contains("nonsense"), "{err}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
