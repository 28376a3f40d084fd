//! Looking at the in-process store's mutexes from outside their holders ([`Inspect`]): who
//! holds a name (with the holding manager's label), its token, lease and waiters, forced
//! releases, and a change feed that announces every change of holder.
//!
//! The feed costs the lock path one relaxed load while nobody watches: a change of holder is
//! counted only while a feed is open. Read-write locks and semaphores are listed (one record
//! per holder) and shown (the first holder, for a name held as no mutex); the feed does not
//! announce their changes.

use super::{lock, MemoryBackend, Shard};
use crate::backend::{BoxFuture, ChangeFeed, ForceRelease, Inspect, LockInfo};
use crate::error::LockError;

impl MemoryBackend {
    /// Tells the open change feeds that a mutex changed holder (nothing while none is open).
    #[inline(always)]
    pub(super) fn announce(&self) {
        if self.inner.changes.receiver_count() != 0 {
            self.announce_now();
        }
    }

    #[cold]
    #[inline(never)]
    fn announce_now(&self) {
        self.inner.changes.send_modify(|n| *n = n.wrapping_add(1));
    }

    fn info(&self, key: &str, shard: &Shard, hash: u64) -> Option<LockInfo> {
        let entry = shard.entries.find(hash, |e| e.key.is(key))?;
        let holder = entry.holder.as_ref()?;
        let now = crate::clock::now();
        if holder.expired(now) {
            return None; // taken away at the next look of anyone
        }
        let mut info = LockInfo::new(key, holder.owner.to_string());
        info.holder = Some(holder.process.clone());
        info.kind = Some(crate::backend::LockKind::Exclusive); // the mutexes' table only is read
        info.fencing_token = Some(holder.token);
        info.remaining_lease = holder.expires_at.map(|at| at.saturating_duration_since(now));
        // A watchdog-leased mutex lives exactly as long as its guard.
        info.session_bound = holder.expires_at.is_none();
        info.waiters = Some(entry.waiters.len() as u64);
        Some(info)
    }
}

impl Inspect for MemoryBackend {
    fn store(&self) -> &'static str {
        "memory"
    }

    fn list<'a>(&'a self, prefix: &'a str) -> BoxFuture<'a, Result<Vec<LockInfo>, LockError>> {
        let mut keys: Vec<String> = Vec::new();
        for shard in self.inner.shards.iter() {
            let shard = lock(shard);
            keys.extend(
                shard.entries.iter().map(|e| e.key.as_str()).filter(|k| k.starts_with(prefix)).map(str::to_owned),
            );
        }
        keys.sort_unstable();
        let mut locks: Vec<LockInfo> = keys
            .iter()
            .filter_map(|key| {
                let (hash, shard) = self.shard(key);
                self.info(key, &shard, hash)
            })
            .collect();
        locks.extend(self.inner.kinds.list(prefix));
        locks.sort_by(|a, b| a.key.cmp(&b.key).then(a.fencing_token.cmp(&b.fencing_token)));
        Box::pin(std::future::ready(Ok(locks)))
    }

    fn inspect<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<Option<LockInfo>, LockError>> {
        let (hash, shard) = self.shard(key);
        let info = self.info(key, &shard, hash);
        drop(shard);
        let info = info.or_else(|| self.inner.kinds.list(key).into_iter().find(|i| i.key == key));
        Box::pin(std::future::ready(Ok(info)))
    }

    /// Takes the mutex `key` from its holder and hands it to its longest waiter. The holder is
    /// not told (an in-process lock has no lease to run out): its release reports the lock
    /// lost.
    fn force_release<'a>(
        &'a self,
        key: &'a str,
        expected_owner: Option<&'a str>,
    ) -> BoxFuture<'a, Result<ForceRelease, LockError>> {
        let outcome = {
            let (hash, mut shard) = self.shard(key);
            let Shard { entries, tokens } = &mut *shard;
            match entries.find_entry(hash, |e| e.key.is(key)) {
                Err(_) => ForceRelease::NotHeld,
                Ok(mut slot) => {
                    let entry = slot.get_mut();
                    match entry.holder.as_ref().map(|h| h.owner.to_string()) {
                        None => ForceRelease::NotHeld,
                        Some(owner) if expected_owner.is_some_and(|e| e != owner) => ForceRelease::OwnerChanged(owner),
                        Some(owner) => {
                            entry.holder = None;
                            if !MemoryBackend::hand_off(entry, tokens, crate::clock::now()) {
                                slot.remove();
                            }
                            ForceRelease::Released(owner)
                        }
                    }
                }
            }
        };
        if matches!(outcome, ForceRelease::Released(_)) {
            self.announce();
        }
        Box::pin(std::future::ready(Ok(outcome)))
    }

    fn changes<'a>(&'a self, _prefix: &'a str) -> BoxFuture<'a, Result<Box<dyn ChangeFeed>, LockError>> {
        let feed = Changes { seen: self.inner.changes.subscribe() };
        Box::pin(std::future::ready(Ok(Box::new(feed) as Box<dyn ChangeFeed>)))
    }
}

/// Every change of a mutex's holder in the store (whatever its name), as it happens. A fixed
/// lease that runs out with nobody waiting is taken away, and announced, at the next look at
/// its name: a watcher that knows a lease (`LockInfo::remaining_lease`) looks again at its end.
struct Changes {
    seen: tokio::sync::watch::Receiver<u64>,
}

impl ChangeFeed for Changes {
    fn changed(&mut self) -> BoxFuture<'_, Result<(), LockError>> {
        // The sender lives as long as the store, which the manager keeps: never closed here.
        Box::pin(async move {
            let _ = self.seen.changed().await;
            Ok(())
        })
    }

    fn complete(&self) -> bool {
        true
    }
}
