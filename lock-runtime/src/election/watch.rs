//! Who leads: [`LeaderInfo`] as a store tells it, and [`LeaderWatch`], which follows it.

use std::time::Duration;

use crate::backend::{ChangeFeed, Holder, LockInfo};
use crate::error::LockError;

use super::Election;

/// The leader of an election as the store tells it ([`Election::leader`],
/// [`LeaderWatch::changed`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaderInfo {
    name: String,
    owner: String,
    holder: Holder,
    fencing_token: Option<u64>,
    remaining_lease: Option<Duration>,
}

impl LeaderInfo {
    /// The leader a store's record names; `None` for a grant not claimed yet (nobody leads).
    pub(super) fn new(name: &str, info: LockInfo) -> Option<Self> {
        if info.unclaimed {
            return None;
        }
        Some(LeaderInfo {
            name: name.to_owned(),
            owner: info.owner,
            holder: info.holder.unwrap_or_else(Holder::unknown),
            fencing_token: info.fencing_token,
            remaining_lease: if info.session_bound { None } else { info.remaining_lease },
        })
    }

    /// The election's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The leading process as `lockctl` shows it: `host/pid[/label]`, the label being the
    /// leader's [`LockManagerBuilder::label`](crate::LockManagerBuilder::label)
    /// (`unknown/0` for a term taken by a version that stored none).
    pub fn holder(&self) -> &Holder {
        &self.holder
    }

    /// The term's fencing token, where the store can tell (every built-in store that can
    /// be inspected does).
    pub fn fencing_token(&self) -> Option<u64> {
        self.fencing_token
    }

    /// The term's owner id: unique to one campaign, so two terms never share it.
    pub fn owner(&self) -> &str {
        &self.owner
    }

    /// The lease left before the store ends the term by itself, where the store has one and
    /// tells it (Redis, a fixed lease in memory); `None` for a term held as long as its
    /// holder's session lives (ZooKeeper, etcd, PostgreSQL, lock files).
    pub fn remaining_lease(&self) -> Option<Duration> {
        self.remaining_lease
    }

    /// Whether `other` is the same term: the same owner id where the store names it (one per
    /// campaign), else the same token.
    fn same_term(&self, other: &LeaderInfo) -> bool {
        let named = |owner: &str| !owner.is_empty() && owner != "unknown";
        if named(&self.owner) && named(&other.owner) {
            self.owner == other.owner
        } else {
            self.fencing_token == other.fencing_token
        }
    }
}

/// Follows an election's leader without campaigning ([`Election::observe`]).
///
/// Each [`changed`](Self::changed) completes with the leader when it differs from the one this
/// watch last returned: a new term, or `None` once nobody leads. A new watch has returned
/// nothing yet, so its first call tells how it is at once. Terms that begin and end between
/// two calls may be skipped; the leader returned is always the one the store holds at the
/// time of the look.
///
/// **Event-driven.** The watch listens to the store's change feed (a ZooKeeper watch, an etcd
/// watch, the in-process store's notifications, Redis's release announcements) and looks again
/// when it speaks. Where the feed does not announce every change (Redis announces releases but
/// not takes; PostgreSQL and lock files announce nothing), it also looks again every
/// [`relook`](Self::relook) (500 ms by default), and sooner (from 10 ms, doubling) after a
/// change while the store settles. The staleness per store is stated in `GUARANTEES.md`.
///
/// **A grant being recorded.** Some stores record a new holder in two steps (a lock file's
/// holder writes its record after its lock is granted; a PostgreSQL session puts its token into
/// its `application_name` after its grant): a leader seen without its token is looked at again
/// shortly, and reported as it is only if it stays so for a `relook`. A term is known by its
/// owner id (unique to one campaign), so it is reported once.
///
/// **Errors and reconnection.** A failure to reach the store is returned as it happens; the
/// watch stays usable: the next call subscribes again and reports the leader as it is then, if
/// it differs from the last one returned. Refused with an [`is_invalid`](LockError::is_invalid)
/// error on a store that cannot tell who holds a lock.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), lock_runtime::LockError> {
/// let manager = lock_runtime::LockManager::builder().label("node-a").memory();
/// let election = manager.election("scheduler");
/// let mut watch = election.observe();
/// assert!(watch.changed().await?.is_none());
/// let leadership = election.campaign().await?;
/// assert_eq!(watch.changed().await?.map(|l| l.holder().to_string()), Some(manager.holder().to_string()));
/// leadership.resign().await?;
/// assert!(watch.changed().await?.is_none());
/// # Ok(()) }
/// ```
pub struct LeaderWatch {
    election: Election,
    feed: Option<Box<dyn ChangeFeed>>,
    /// What the last call returned: `None` before the first.
    last: Option<Option<LeaderInfo>>,
    relook: Duration,
}

impl std::fmt::Debug for LeaderWatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LeaderWatch")
            .field("election", &self.election.name())
            .field("subscribed", &self.feed.is_some())
            .field("last", &self.last)
            .finish()
    }
}

/// The first look again after a change, on a store whose feed is not complete.
const SETTLE: Duration = Duration::from_millis(10);

impl LeaderWatch {
    pub(super) fn new(election: Election) -> Self {
        LeaderWatch { election, feed: None, last: None, relook: Duration::from_millis(500) }
    }

    /// How often the watch looks again on a store whose change feed does not announce every
    /// change (Redis, PostgreSQL, lock files): the bound on how stale it can be there. At
    /// least 10 ms.
    pub fn relook(mut self, every: Duration) -> Self {
        self.relook = every.max(SETTLE);
        self
    }

    /// The next different leader (`None` while nobody leads); see [`LeaderWatch`].
    pub async fn changed(&mut self) -> Result<Option<LeaderInfo>, LockError> {
        let manager = &self.election.manager;
        let inspector = manager.inspector(&self.election.name)?;
        let key = self.election.key();
        let bound = manager.bound_and_kind().0;
        let mut settle = SETTLE;
        let mut partial_since: Option<std::time::Instant> = None;
        loop {
            // Subscribed before looking: a change between the look and the wait is announced.
            let feed = match &mut self.feed {
                Some(feed) => feed,
                None => self.feed.insert(manager.bounded(&key, "watch", bound, inspector.changes_of(&key)).await?),
            };
            let mut complete = feed.complete();
            let now = match manager.bounded(&key, "inspect", bound, inspector.inspect(&key)).await {
                Ok(info) => info,
                Err(e) => {
                    self.feed = None;
                    return Err(e);
                }
            };
            // A grant the store has not fully recorded yet (a lock file whose new holder has not
            // written its record, a PostgreSQL session that has not put its token into its
            // `application_name`): looked at again shortly, and reported as it is only if it
            // stays so for a `relook`.
            let partial = now.as_ref().is_some_and(|i| i.fencing_token.is_none());
            let since = *partial_since.get_or_insert_with(crate::clock::now);
            if !partial {
                partial_since = None;
            }
            let unnamed = partial && since.elapsed() < self.relook;
            complete &= !unnamed;
            let now = now.and_then(|info| LeaderInfo::new(&self.election.name, info));
            let differs = !unnamed
                && match &self.last {
                    None => true,
                    Some(None) => now.is_some(),
                    Some(Some(last)) => now.as_ref().is_none_or(|now| !now.same_term(last)),
                };
            if differs {
                self.last = Some(now.clone());
                return Ok(now);
            }
            let Some(feed) = &mut self.feed else { continue };
            // A lease that runs out is a change no store announces at once (Redis expires the
            // key silently; in memory it is taken away at the next look): look again just after.
            let lease_end = now.as_ref().and_then(LeaderInfo::remaining_lease);
            let lease_end = async {
                match lease_end {
                    Some(left) => tokio::time::sleep(left + Duration::from_millis(1)).await,
                    None => std::future::pending().await,
                }
            };
            let relook = async {
                match complete {
                    true => std::future::pending().await,
                    false => tokio::time::sleep(settle.min(self.relook)).await,
                }
            };
            tokio::select! {
                changed = feed.changed() => {
                    if let Err(e) = changed {
                        self.feed = None;
                        return Err(e);
                    }
                    settle = SETTLE; // a change: the store may settle on a leader soon
                }
                () = lease_end => {}
                () = relook => settle = settle.saturating_mul(2),
            }
        }
    }
}
