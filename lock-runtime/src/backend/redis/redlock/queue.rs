//! The local FIFO of one Redlock backend: acquisitions of this process waiting for the same
//! lock queue here, and only the head makes attempts. A new acquisition that finds others of
//! its process queued joins the back without an attempt (it does not race the head), so
//! within a process locks are handed over in arrival order; across processes the nodes
//! decide.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use tokio::sync::Notify;

type Queue = VecDeque<(u64, Arc<Notify>)>;

#[derive(Default)]
pub(super) struct Queues {
    state: Mutex<(HashMap<Arc<str>, Queue>, u64)>,
}

impl Queues {
    fn lock(&self) -> MutexGuard<'_, (HashMap<Arc<str>, Queue>, u64)> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Whether acquisitions of this process wait for `key` now.
    pub(super) fn any(&self, key: &str) -> bool {
        self.lock().0.contains_key(key)
    }

    /// Joins the back of `key`'s queue; the id to leave with, and whether it is the head.
    pub(super) fn join(&self, key: &Arc<str>, notify: &Arc<Notify>) -> (u64, bool) {
        let mut st = self.lock();
        st.1 += 1;
        let id = st.1;
        let queue = st.0.entry(key.clone()).or_default();
        queue.push_back((id, notify.clone()));
        (id, queue.len() == 1)
    }

    /// Whether `id` heads `key`'s queue.
    pub(super) fn is_head(&self, key: &str, id: u64) -> bool {
        self.lock().0.get(key).and_then(|q| q.front()).is_some_and(|(head, _)| *head == id)
    }

    /// Leaves `key`'s queue; a new head is woken (it attempts next).
    pub(super) fn leave(&self, key: &str, id: u64) {
        let mut st = self.lock();
        let Some(queue) = st.0.get_mut(key) else { return };
        let was_head = queue.front().is_some_and(|(head, _)| *head == id);
        queue.retain(|(i, _)| *i != id);
        match queue.front() {
            None => {
                st.0.remove(key);
            }
            Some((_, next)) if was_head => next.notify_one(),
            Some(_) => {}
        }
    }

    /// Wakes the head of `key`'s queue (a holder of this process let go).
    pub(super) fn wake_head(&self, key: &str) {
        if let Some((_, head)) = self.lock().0.get(key).and_then(|q| q.front()) {
            head.notify_one();
        }
    }
}
