//! [`Leadership`]: one term of an election, held.

use crate::error::LockError;
use crate::guard::LockGuard;

use super::Election;

/// One term of an [`Election`]: this manager leads while it lives. Made by
/// [`Election::campaign`] (or handed to [`Election::lead`]'s body).
///
/// **Dropping it resigns** in the background, as a dropped [`LockGuard`] releases; the lease
/// is the safety net if even that cannot run.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), lock_runtime::LockError> {
/// let manager = lock_runtime::LockManager::memory();
/// let election = manager.election("scheduler");
/// let first = election.campaign().await?;
/// let token = first.fencing_token();
/// first.resign().await?; // the next campaigner is elected at once
/// let second = election.campaign().await?;
/// assert!(second.fencing_token() > token); // terms' tokens strictly increase
/// # Ok(()) }
/// ```
#[must_use = "leadership is resigned as soon as it is dropped"]
pub struct Leadership {
    election: Election,
    guard: LockGuard,
}

impl std::fmt::Debug for Leadership {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Leadership")
            .field("election", &self.election.name())
            .field("fencing_token", &self.fencing_token())
            .field("lost", &self.is_lost())
            .finish()
    }
}

impl Leadership {
    pub(super) fn new(election: Election, guard: LockGuard) -> Self {
        Leadership { election, guard }
    }

    /// The election it leads.
    pub fn election(&self) -> &Election {
        &self.election
    }

    /// This term's fencing token: strictly greater than every earlier term's. Hand it to the
    /// stores the leader writes to, so that they refuse a deposed leader's writes
    /// ([`crate::fence`]).
    pub fn fencing_token(&self) -> u64 {
        self.guard.fencing_token()
    }

    /// Completes when leadership is lost: the term's lease ran out unrenewed, a renewal was
    /// refused, or the store reported the loss (a ZooKeeper session, an etcd lease, a
    /// PostgreSQL connection). It fires a margin before the store lets the next campaigner in
    /// (see `GUARANTEES.md`). Never completes while this manager leads, nor after a
    /// [`resign`](Self::resign).
    pub async fn lost(&self) {
        self.guard.lost().await
    }

    /// Whether leadership is known to be lost (see [`lost`](Self::lost)).
    pub fn is_lost(&self) -> bool {
        self.guard.is_lost()
    }

    pub(super) fn guard(&self) -> &LockGuard {
        &self.guard
    }

    /// Steps down: the next campaigner is elected at once. An [`is_lost`](LockError::is_lost)
    /// error means the term had ended already (its lease ran out, or it was taken away): what
    /// was done as leader since may not have been exclusive.
    pub async fn resign(self) -> Result<(), LockError> {
        self.guard.release().await
    }
}
