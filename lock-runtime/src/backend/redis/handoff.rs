//! Hand-offs within one process in one round trip: a holder's release grants the lock to the
//! next waiter of its own process in the same script (`handoff.lua`).
//!
//! A mutex acquisition that waits in this process's queue offers a [`Ticket`]: its owner, its
//! slot's fencing counter and its lease. A release of the lock through this backend that finds
//! the head of the queue asleep with a ticket sends `handoff.lua` instead of `release.lua`:
//! the release, then acquire.lua's grant to the ticket's owner, atomically. The head then holds
//! the lock one round trip after the release was sent (the release reaching the server, the
//! answer coming back), without an attempt of its own.
//!
//! - **Safety** is acquire.lua's: the grant is an ordinary grant to the waiter's own owner, with
//!   a token of its own; its lease is counted from when the release was sent (before the grant).
//! - **The waiter owns the outcome**: while the script is on the wire the ticket is *pending*;
//!   then *granted* (with the token), *open* again (not granted: the head attempts as usual), or
//!   *maybe* (the script failed: the head attempts as usual, and acquire.lua grants again to the
//!   same owner). An acquisition dropped while its ticket is pending, granted but not taken, or
//!   maybe, undoes the grant with an owner-checked release, as it undoes an attempt whose answer
//!   it never saw: the release goes after the script on the same connection.
//! - Only mutexes, and not with `wait_for_replicas` (its grants wait for replicas, which a
//!   release does not); waiters of other processes are woken by the release's announcement as
//!   before, and find the lock taken.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Instant;

/// A waiting mutex acquisition's offer to be granted the lock by a release of this process.
pub(super) struct Ticket {
    /// The acquisition's owner (acquire.lua's ARGV[1]).
    pub(super) owner: Arc<str>,
    /// Its slot's fencing counter (acquire.lua's KEYS[2]).
    pub(super) fence: Arc<str>,
    /// Its lease in milliseconds.
    pub(super) lease: u64,
    /// Where it stands, and whether its acquisition is gone.
    state: Mutex<(Handed, bool)>,
}

/// Where a ticket stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Handed {
    /// Not used (or used, and not granted: the head attempts as usual).
    Open,
    /// A release is granting it the lock (`handoff.lua` on the wire).
    Pending,
    /// Granted with `token`, by a release sent at `sent`.
    Granted { token: i64, sent: Instant },
    /// The release failed: the lock may have been granted.
    Maybe,
}

impl Handed {
    /// Whether the lock may be held for the ticket's owner.
    pub(super) fn may_hold(self) -> bool {
        matches!(self, Handed::Granted { .. } | Handed::Maybe)
    }
}

impl Ticket {
    pub(super) fn new(owner: Arc<str>, fence: Arc<str>, lease: u64) -> Arc<Self> {
        Arc::new(Ticket { owner, fence, lease, state: Mutex::new((Handed::Open, false)) })
    }

    fn state(&self) -> std::sync::MutexGuard<'_, (Handed, bool)> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub(super) fn get(&self) -> Handed {
        self.state().0
    }

    /// A release takes it (`handoff.lua` about to be sent).
    pub(super) fn pend(&self) {
        self.state().0 = Handed::Pending;
    }

    /// The release's outcome. `true` when the acquisition is gone meanwhile: the caller undoes
    /// a grant (`handed.may_hold()`) itself, now that the script has run.
    #[must_use]
    pub(super) fn answer(&self, handed: Handed) -> bool {
        let mut state = self.state();
        if state.1 {
            return true;
        }
        state.0 = handed;
        false
    }

    /// The acquisition takes a grant or a failed release's doubt, leaving it open; a pending
    /// release is left as it is.
    pub(super) fn take(&self) -> Handed {
        let mut state = self.state();
        match state.0 {
            Handed::Pending => Handed::Pending,
            _ => std::mem::replace(&mut state.0, Handed::Open),
        }
    }

    /// The acquisition is dropped: where the ticket stood. A release still pending undoes its
    /// grant itself once answered (see [`answer`](Self::answer)); a grant already in is the
    /// acquisition's to undo.
    pub(super) fn abandon(&self) -> Handed {
        let mut state = self.state();
        state.1 = true;
        state.0
    }
}
