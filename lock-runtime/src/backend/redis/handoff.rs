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
//!   then *granted* (with the token), *held* (the lock someone else's: the script's look
//!   stands for the head's, which sleeps as after a busy attempt), *open* again (not granted:
//!   the head attempts as usual), or
//!   *maybe* (the script failed: the head attempts as usual, and acquire.lua grants again to the
//!   same owner). An acquisition dropped while its ticket is pending, granted but not taken, or
//!   maybe, undoes the grant with an owner-checked release, as it undoes an attempt whose answer
//!   it never saw: the release goes after the script on the same connection.
//! - Only mutexes, and not with `wait_for_replicas` (its grants wait for replicas, which a
//!   release does not).
#![doc = include_str!("queue.md")]

use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

/// A waiting mutex acquisition's offer to be granted the lock by a release of this process.
pub(super) struct Ticket {
    /// The acquisition's owner (acquire.lua's ARGV[1]).
    pub(super) owner: Arc<str>,
    /// Its slot's fencing counter (acquire.lua's KEYS[2]).
    pub(super) fence: Arc<str>,
    /// Its lease in milliseconds.
    pub(super) lease: u64,
    /// Its claim window in milliseconds, if it registers in the lock's queue (see below).
    pub(super) window: Option<u64>,
    state: Mutex<State>,
}

struct State {
    handed: Handed,
    /// The acquisition is gone.
    gone: bool,
    /// When its queue entry is renewed next (`None`: not asked yet).
    renew_at: Option<Instant>,
    /// It may have an entry in the lock's queue (an attempt registering it was sent, or a
    /// release not granting it the lock queued it: `handoff.lua` does). A grant removes it,
    /// and the acquisition then drops its ticket.
    entry: bool,
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
    /// Not granted: the release, sent at `sent`, found the lock someone else's (or granted it
    /// from the lock's queue to another process), and the waiter's look in the same script
    /// found it held for `pttl` ms more, marked it waited on and queued the waiter in Redis:
    /// the waiter sleeps as after a busy attempt of its own.
    Held { sent: Instant, pttl: i64 },
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
    pub(super) fn new(owner: Arc<str>, fence: Arc<str>, lease: u64, window: Option<u64>) -> Arc<Self> {
        let state = State { handed: Handed::Open, gone: false, renew_at: None, entry: false };
        Arc::new(Ticket { owner, fence, lease, window, state: Mutex::new(state) })
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub(super) fn get(&self) -> Handed {
        self.state().handed
    }

    /// An attempt sent at `sent` registered (or renewed) the acquisition's queue entry: it is
    /// renewed a third of the window later, while the acquisition waits at the head.
    pub(super) fn registered(&self, sent: Instant) {
        if let Some(window) = self.window {
            self.state().renew_at = sent.checked_add(Duration::from_millis(window / 3));
        }
    }

    /// An attempt that may register it in the lock's queue is about to be sent: whether it
    /// may have had an entry before.
    pub(super) fn registering(&self) -> bool {
        std::mem::replace(&mut self.state().entry, true)
    }

    /// Whether it may have an entry in the lock's queue (a grant by `handoff.lua` removes it).
    pub(super) fn may_be_queued(&self) -> bool {
        self.state().entry
    }

    /// When the waiter at the head attempts to renew its queue entry (or, never registered,
    /// to register: a third of the window after it first asks).
    pub(super) fn renew_at(&self, now: Instant) -> Option<Instant> {
        let window = self.window?;
        let mut state = self.state();
        Some(*state.renew_at.get_or_insert_with(|| now.checked_add(Duration::from_millis(window / 3)).unwrap_or(now)))
    }

    /// A release takes it (`handoff.lua` about to be sent).
    pub(super) fn pend(&self) {
        self.state().handed = Handed::Pending;
    }

    /// The release's outcome. `true` when the acquisition is gone meanwhile: the caller undoes
    /// a grant (`handed.may_hold()`) or a queue entry ([`queues`](Self::queues)) itself, now
    /// that the script has run.
    #[must_use]
    pub(super) fn answer(&self, handed: Handed) -> bool {
        let mut state = self.state();
        if state.gone {
            return true;
        }
        state.entry |= self.queues(handed);
        state.handed = handed;
        false
    }

    /// Whether a release answered `handed` may have queued the acquisition in the lock's queue.
    pub(super) fn queues(&self, handed: Handed) -> bool {
        self.window.is_some() && !matches!(handed, Handed::Granted { .. })
    }

    /// The acquisition takes a grant or a failed release's doubt, leaving it open; a pending
    /// release is left as it is.
    pub(super) fn take(&self) -> Handed {
        let mut state = self.state();
        match state.handed {
            Handed::Pending => Handed::Pending,
            _ => std::mem::replace(&mut state.handed, Handed::Open),
        }
    }

    /// The acquisition is dropped: where the ticket stood, and whether it may have a queue
    /// entry. A release still pending undoes its grant itself once answered (see
    /// [`answer`](Self::answer)); a grant already in, and an entry, are the acquisition's to
    /// undo.
    pub(super) fn abandon(&self) -> (Handed, bool) {
        let mut state = self.state();
        state.gone = true;
        (state.handed, state.entry)
    }
}
