//! The locks held through one Redis backend, checked at once when a connection to the server
//! was lost.
//!
//! A restart without persistence, a failover to a replica that had not received them or a
//! flush drops locks, and their holders would learn it only at their next renewal (up to a
//! third of the lease later), or never for a hold shorter than that. A lost connection is what
//! every one of those events shows a client first: a command (or the waiters' pub/sub
//! connection) finds the connection dropped or refused. Then one task asks the server, as soon
//! as it answers again, which of the locks held through this backend are still their owners'
//! (`check.lua`: one call per 256 locks, per hash slot on a Cluster), and fires `lost()` for
//! the others, so `run` and the attribute stop their bodies. A lock whose release has begun is
//! no longer asked about (its release reports what it finds).

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::Duration;

use super::layout::key_slot;
use super::scripts::CHECK;
use super::server::{bounded, Server};
use crate::error::LockError;
use crate::lost::LostSignal;

/// The most locks one `check.lua` call asks about.
const BATCH: usize = 256;
/// The first pause before checking again while the server does not answer.
const FIRST_RETRY: Duration = Duration::from_millis(20);
/// The longest pause between two checks while the server does not answer.
const MAX_RETRY: Duration = Duration::from_millis(500);

/// What `lost()` says of a lock the check found gone.
const REASON: &str = "the Redis server no longer holds it for this owner: found at once after a connection to the \
                      server was lost (a restart without persistence, a failover or a flush drops locks)";

/// The locks held through one backend (each registered while its [`Holding`] lives), and the
/// check of them after a lost connection.
pub(super) struct Holdings {
    entries: Mutex<Entries>,
    server: Arc<Server>,
    runtime: tokio::runtime::Handle,
    /// Checks asked for: bumped by every [`suspect`](Holdings::suspect).
    asked: AtomicU64,
    /// A check task runs (it checks again while `asked` moves on).
    running: AtomicBool,
}

#[derive(Default)]
struct Entries {
    next: u64,
    by_id: HashMap<u64, Entry>,
}

#[derive(Clone)]
struct Entry {
    name: Arc<str>,
    key: Arc<str>,
    /// `M<owner>` for a mutex, `K<owner>` for the other kinds (`check.lua`'s argument).
    owner: Arc<str>,
    lost: LostSignal,
}

/// One held lock's registration; dropping it (or [`HeldLock::release`] beginning) removes it.
///
/// [`HeldLock::release`]: crate::backend::HeldLock::release
pub(super) struct Holding {
    holdings: Arc<Holdings>,
    id: u64,
}

impl Drop for Holding {
    fn drop(&mut self) {
        lock(&self.holdings.entries).by_id.remove(&self.id);
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Holdings {
    pub(super) fn new(server: Arc<Server>, runtime: tokio::runtime::Handle) -> Arc<Self> {
        Arc::new(Holdings {
            entries: Mutex::default(),
            server,
            runtime,
            asked: AtomicU64::new(0),
            running: AtomicBool::new(false),
        })
    }

    /// Registers a granted lock: its key (the mutex's or the kind's state), owner and `lost`
    /// signal. `None` for a signal that cannot fire.
    pub(super) fn register(
        self: &Arc<Self>,
        name: &Arc<str>,
        key: &Arc<str>,
        owner: &str,
        mutex: bool,
        lost: &LostSignal,
    ) -> Option<Holding> {
        if !lost.can_fire() {
            return None;
        }
        let mut tagged = String::with_capacity(1 + owner.len());
        tagged.push(if mutex { 'M' } else { 'K' });
        tagged.push_str(owner);
        let owner: Arc<str> = tagged.into();
        let entry = Entry { name: name.clone(), key: key.clone(), owner, lost: lost.clone() };
        let mut entries = lock(&self.entries);
        let id = entries.next;
        entries.next += 1;
        entries.by_id.insert(id, entry);
        Some(Holding { holdings: self.clone(), id })
    }

    /// A connection to the server was lost: checks every lock held through this backend as
    /// soon as the server answers (one check task at a time; a suspicion during a check makes
    /// it check again). Nothing when no lock is held.
    pub(super) fn suspect(self: &Arc<Self>) {
        if lock(&self.entries).by_id.is_empty() {
            return;
        }
        self.asked.fetch_add(1, Ordering::SeqCst);
        if !self.running.swap(true, Ordering::SeqCst) {
            self.runtime.spawn(check_until_answered(Arc::downgrade(self)));
        }
    }

    /// Asks the server which registered locks are still held and fires `lost()` for the
    /// others; fails if any call failed (the whole check is then made again).
    async fn check(&self) -> Result<(), LockError> {
        let cluster = self.server.is_cluster();
        let mut groups: BTreeMap<u16, Vec<(u64, Entry)>> = BTreeMap::new();
        for (id, e) in lock(&self.entries).by_id.iter().filter(|(_, e)| !e.lost.is_lost()) {
            let slot = if cluster { key_slot(e.key.as_bytes()) } else { 0 };
            groups.entry(slot).or_default().push((*id, e.clone()));
        }
        let mut gone = Vec::new();
        let mut failed = None;
        for batch in groups.values().flat_map(|group| group.chunks(BATCH)) {
            let name = &*batch[0].1.name;
            let mut invocation = CHECK.prepare_invoke();
            for (_, entry) in batch {
                invocation.key(&*entry.key).arg(&*entry.owner);
            }
            let call = self.server.eval::<Vec<i64>>(name, "check", invocation);
            match bounded(name, "check", self.server.timeout(), call).await {
                Ok(answers) => {
                    gone.extend(batch.iter().zip(answers).filter(|(_, held)| *held == 0).map(|((id, ..), _)| *id))
                }
                Err(e) => failed = Some(e),
            }
        }
        if !gone.is_empty() {
            // Only those still registered: a release that began meanwhile reports for itself.
            let entries = lock(&self.entries);
            let fired: Vec<&Entry> = gone.iter().filter_map(|id| entries.by_id.get(id)).collect();
            if !fired.is_empty() {
                tracing::warn!(
                    count = fired.len(),
                    "the Redis server lost locks held through it; their holders are told"
                );
            }
            for entry in fired {
                entry.lost.fire(REASON);
            }
        }
        failed.map_or(Ok(()), Err)
    }
}

/// Checks until a check got every answer and no suspicion came meanwhile; stops when the
/// backend and every holding are gone.
async fn check_until_answered(holdings: Weak<Holdings>) {
    let mut retry = FIRST_RETRY;
    loop {
        let Some(this) = holdings.upgrade() else { return };
        let asked = this.asked.load(Ordering::SeqCst);
        match this.check().await {
            Ok(()) => {
                retry = FIRST_RETRY;
                if this.asked.load(Ordering::SeqCst) != asked {
                    continue;
                }
                this.running.store(false, Ordering::SeqCst);
                // A suspicion between the load and the store saw the task running and left the
                // check to it: take it up again, unless another task already did.
                if this.asked.load(Ordering::SeqCst) == asked || this.running.swap(true, Ordering::SeqCst) {
                    return;
                }
            }
            Err(e) => {
                tracing::debug!(error = %crate::telemetry::shown_error(&e), "checking the held locks after a lost Redis connection failed; retrying in {retry:?}");
                drop(this);
                tokio::time::sleep(retry).await;
                retry = (retry * 2).min(MAX_RETRY);
            }
        }
    }
}
