//! Waiting for a lock file: this process's waiters for a name form one FIFO line; only a
//! helper thread per line waits on the OS (a blocking file lock, woken by the kernel the moment
//! the holder's file is closed, even by a process that died), and hands each lock it gets to
//! the head of the line. A waiter that leaves only leaves the line; the helper ends once the
//! line is empty and it holds the lock (which it frees at once).

use std::collections::{HashMap, VecDeque};
use std::fs::{File, TryLockError};
use std::io;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use tokio::sync::oneshot;

use super::{path, Shared};

/// A lock file this process holds, with the token drawn for it.
pub(super) struct Handed {
    pub(super) file: File,
    pub(super) token: u64,
}

/// What the helper sends a waiter: the lock, or why it cannot wait for it.
pub(super) type Sent = Result<Handed, String>;

/// One name's line of waiters in this process.
#[derive(Default)]
struct Line {
    waiters: VecDeque<(u64, oneshot::Sender<Sent>)>,
    /// A helper thread serves this line (it ends only with the line empty, under the lock).
    helper: bool,
}

/// Every name's line, by lock file name.
#[derive(Default)]
pub(super) struct Lines(Mutex<HashMap<String, Line>>);

impl Lines {
    fn lock(&self) -> MutexGuard<'_, HashMap<String, Line>> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Whether some waiter of this process is in line for `name` (a new attempt queues behind).
    pub(super) fn queued(&self, name: &str) -> bool {
        self.lock().get(name).is_some_and(|line| !line.waiters.is_empty())
    }
}

/// Takes the lock file `name`: at once or not at all, or (`blocking`) when it is free. A lock
/// granted on a file its last holder removed meanwhile (see [`path::names`]) is let go: an
/// attempt tries again on the new file at once; a blocking take returns `None`, so that the
/// helper looks at its line before it blocks again (its waiters may all have left: it must
/// not take the lock for nobody).
pub(super) fn take(shared: &Shared, name: &str, blocking: bool) -> io::Result<Option<Handed>> {
    let path = shared.dir.join(name);
    loop {
        let file = shared.sharing.open(&path)?;
        if blocking {
            file.lock()?;
        } else {
            if !try_exclusive(&file, shared.options.operation_timeout)? {
                return Ok(None);
            }
        }
        if path::names(&path, &file)? {
            let token = shared.fence.next(shared.options.operation_timeout)?;
            return Ok(Some(Handed { file, token }));
        }
        if blocking {
            return Ok(None);
        }
    }
}

/// Takes `file`'s lock at once: `false` when a holder has it. An inspection looks with a shared
/// lock for a moment (`inspect.rs`); a holder's lock is always exclusive. So a refusal while a
/// shared lock is still to be had came from lookers only, and the exclusive lock is tried again
/// (within `bound`): looking at a lock never denies it.
fn try_exclusive(file: &File, bound: Duration) -> io::Result<bool> {
    let started = Instant::now();
    loop {
        match file.try_lock() {
            Ok(()) => return Ok(true),
            Err(TryLockError::WouldBlock) => {}
            Err(TryLockError::Error(e)) => return Err(e),
        }
        match file.try_lock_shared() {
            Ok(()) => file.unlock()?,                          // only lookers: again
            Err(TryLockError::WouldBlock) => return Ok(false), // a holder
            Err(TryLockError::Error(e)) => return Err(e),
        }
        if started.elapsed() >= bound {
            return Ok(false);
        }
        std::thread::yield_now();
    }
}

/// Frees a lock file this process holds: removes it first, while still locked, unless a
/// waiter of this process is about to take it again (the removal is what keeps the directory
/// from growing; a waiter elsewhere then finds its lock on a removed file and opens the new
/// one).
pub(super) fn free(shared: &Shared, name: &str, file: File) {
    if cfg!(unix) && !shared.lines.queued(name) {
        let path = shared.dir.join(name);
        // In a sticky directory another user's file cannot be removed: it stays, blanked
        // (`sharing.rs`).
        if matches!(path::names(&path, &file), Ok(true)) && std::fs::remove_file(&path).is_err() {
            super::inspect::clear(&file);
        }
    } else {
        super::inspect::clear(&file);
    }
    drop(file);
}

/// Puts waiter `id` in line for `name`; starts the line's helper if it has none.
pub(super) fn join(shared: &Arc<Shared>, name: &str, id: u64, tx: oneshot::Sender<Sent>) -> Result<(), String> {
    let start = {
        let mut lines = shared.lines.lock();
        let line = lines.entry(name.to_owned()).or_default();
        line.waiters.push_back((id, tx));
        !std::mem::replace(&mut line.helper, true)
    };
    if start {
        let (helped, owned) = (shared.clone(), name.to_owned());
        let spawned = std::thread::Builder::new().name("lock-file-wait".into()).spawn(move || helper(&helped, &owned));
        if let Err(e) = spawned {
            let why = format!("cannot start the thread that waits for the lock file: {e}");
            fail(shared, name, &why);
            return Err(why);
        }
    }
    Ok(())
}

/// Leaves the line (a waiter that gave up or was dropped); passes on a lock handed to it
/// meanwhile.
pub(super) fn leave(shared: &Shared, name: &str, id: u64, mut rx: oneshot::Receiver<Sent>) {
    if let Some(line) = shared.lines.lock().get_mut(name) {
        line.waiters.retain(|(waiter, _)| *waiter != id);
    }
    rx.close();
    if let Ok(Ok(handed)) = rx.try_recv() {
        hand(shared, name, handed);
    }
}

/// Gives `handed` to the first waiter in line still there, or frees it.
fn hand(shared: &Shared, name: &str, mut handed: Handed) {
    {
        let mut lines = shared.lines.lock();
        if let Some(line) = lines.get_mut(name) {
            while let Some((_, tx)) = line.waiters.pop_front() {
                match tx.send(Ok(handed)) {
                    Ok(()) => return,
                    Err(Ok(back)) => handed = back,
                    Err(Err(_)) => return,
                }
            }
        }
    }
    free(shared, name, handed.file);
}

/// Tells every waiter of `name` why waiting failed, and ends the line.
fn fail(shared: &Shared, name: &str, why: &str) {
    if let Some(line) = shared.lines.lock().remove(name) {
        for (_, tx) in line.waiters {
            let _ = tx.send(Err(why.to_owned()));
        }
    }
}

/// The helper thread of `name`'s line: waits for the lock on the OS, hands it to the head of the
/// line, and again while the line has waiters.
fn helper(shared: &Shared, name: &str) {
    loop {
        {
            let mut lines = shared.lines.lock();
            if lines.get(name).is_none_or(|line| line.waiters.is_empty()) {
                lines.remove(name);
                return;
            }
        }
        match take(shared, name, true) {
            Ok(Some(handed)) => hand(shared, name, handed),
            Ok(None) => {}
            Err(e) => return fail(shared, name, &format!("waiting for the lock file failed: {e}")),
        }
    }
}
