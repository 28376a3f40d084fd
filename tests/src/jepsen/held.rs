//! What a fault-suite worker holds: a lock, or a term of an election (`mode=elect`), with the
//! operations the workers use on either.

use lock_runtime::{Leadership, LockError, LockGuard};

/// A lock, or a term of an election: a term is held to the rules of a lock.
pub enum Held {
    /// A lock taken with `lock()`.
    Lock(LockGuard),
    /// A term won with `Election::campaign()`.
    Term(Leadership),
}

impl Held {
    /// The lock's or the term's fencing token.
    pub fn fencing_token(&self) -> u64 {
        match self {
            Held::Lock(guard) => guard.fencing_token(),
            Held::Term(term) => term.fencing_token(),
        }
    }

    /// Completes when the lock or the leadership is lost.
    pub async fn lost(&self) {
        match self {
            Held::Lock(guard) => guard.lost().await,
            Held::Term(term) => term.lost().await,
        }
    }

    /// Whether it is known to be lost.
    pub fn is_lost(&self) -> bool {
        match self {
            Held::Lock(guard) => guard.is_lost(),
            Held::Term(term) => term.is_lost(),
        }
    }

    /// Releases the lock, or resigns.
    pub async fn release(self) -> Result<(), LockError> {
        match self {
            Held::Lock(guard) => guard.release().await,
            Held::Term(term) => term.resign().await,
        }
    }
}
