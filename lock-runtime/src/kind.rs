//! [`LockKind`]: which kind of lock a request asks for, and the namespace it lives in.

use std::fmt;

/// Which kind of lock an acquisition asks for ([`Acquire::kind`](crate::backend::Acquire::kind)).
///
/// Each kind has its own namespace in a backend: the mutex `catalog`
/// ([`LockManager::lock`](crate::manager::LockManager::lock)), the read-write lock `catalog` (its
/// [`Read`](LockKind::Read) and [`Write`](LockKind::Write) sides share one state) and the
/// semaphore `catalog` never exclude each other, whatever the backend stores them under. The
/// [`Acquire::key`](crate::backend::Acquire::key) is the same text for every kind: keeping the kinds apart is the backend's
/// job (a key suffix, a separate table, a separate node path, …).
///
/// A backend announces what it offers with [`LockBackend::supports`](crate::backend::LockBackend::supports); the runtime refuses any
/// other kind with an [`is_invalid`](crate::error::LockError::is_invalid) error naming the backend and the
/// kind, before [`LockBackend::begin`](crate::backend::LockBackend::begin) (so a backend is never handed a kind it did not
/// claim).
///
/// ```
/// use lock_runtime::backend::LockKind;
///
/// assert_eq!(LockKind::Semaphore { permits: 4 }.to_string(), "semaphore of 4 permits");
/// assert!(LockKind::Read.is_shared());
/// assert!(!LockKind::Write.is_shared());
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum LockKind {
    /// A mutex: one holder at a time ([`LockManager::lock`](crate::manager::LockManager::lock)).
    #[default]
    Exclusive,
    /// The shared side of a read-write lock: any number of readers at once, none while a writer
    /// holds it. A fair backend lets no new reader in while a writer waits (no writer
    /// starvation).
    Read,
    /// The exclusive side of a read-write lock: no other reader or writer.
    Write,
    /// One of `permits` permits: at most `permits` holders at once. Every holder and waiter of
    /// one name must ask with the same `permits`; a backend refuses a mismatch with an
    /// [`is_invalid`](crate::error::LockError::is_invalid) error rather than admitting more holders.
    Semaphore {
        /// How many holders the semaphore admits at once (at least 1).
        permits: u32,
    },
}

impl LockKind {
    /// Whether several holders may hold the name at once (a reader, a permit).
    pub fn is_shared(&self) -> bool {
        matches!(self, LockKind::Read | LockKind::Semaphore { .. })
    }
}

impl fmt::Display for LockKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LockKind::Exclusive => f.write_str("exclusive lock"),
            LockKind::Read => f.write_str("read lock"),
            LockKind::Write => f.write_str("write lock"),
            LockKind::Semaphore { permits } => write!(f, "semaphore of {permits} permits"),
        }
    }
}
