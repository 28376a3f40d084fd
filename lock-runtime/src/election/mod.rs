//! Leader election: [`Election`] (campaign, lead, who leads, observe), its term
//! ([`Leadership`]), what a store tells of its leader ([`LeaderInfo`]) and the observer
//! ([`LeaderWatch`]). An election is the exclusive lock of its name: a term is one grant of it,
//! so every guarantee of a lock (fencing, leases, `lost()`, release on drop, FIFO waiting) is a
//! guarantee of a term.

use std::future::IntoFuture;
use std::sync::Arc;
use std::time::Duration;

use crate::backend::BoxFuture;
use crate::error::LockError;
use crate::manager::LockManager;
use crate::options::MAX_WAIT;

mod lead;
mod leadership;
mod watch;

pub use leadership::Leadership;
pub use watch::{LeaderInfo, LeaderWatch};

#[doc = include_str!("election.md")]
#[derive(Clone)]
pub struct Election {
    manager: LockManager,
    name: Arc<str>,
    /// A fixed lease for its terms ([`Election::lease`]).
    lease: Option<Duration>,
}

impl std::fmt::Debug for Election {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Election").field("name", &self.name).field("backend", &self.manager.backend_name()).finish()
    }
}

impl LockManager {
    /// The election `name` on this manager's store: cheap to create and to clone, no I/O
    /// until used. An election is the exclusive lock of its name (under the manager's
    /// prefix), so `lockctl show NAME` shows its leader.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), lock_runtime::LockError> {
    /// let manager = lock_runtime::LockManager::builder().label("scheduler-1").memory();
    /// let election = manager.election("scheduler");
    /// let leadership = election.campaign().await?;
    /// let now = election.leader().await?.expect("someone leads");
    /// assert_eq!(now.fencing_token(), Some(leadership.fencing_token()));
    /// assert_eq!(now.holder().label(), Some("scheduler-1"));
    /// leadership.resign().await?;
    /// assert!(election.leader().await?.is_none());
    /// # Ok(()) }
    /// ```
    pub fn election(&self, name: impl AsRef<str>) -> Election {
        Election { manager: self.clone(), name: Arc::from(name.as_ref()), lease: None }
    }
}

impl Election {
    /// The election's name (without the manager's prefix).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Gives this election's terms a fixed `lease` (as
    /// [`LockRequest::lease`](crate::LockRequest::lease)): a term ends when it runs out, its
    /// [`Leadership::lost`] firing, and [`lead`](Self::lead) campaigns again; leadership then
    /// rotates at most every `lease`. Without it (the default) a term's watchdog lease is
    /// renewed for as long as its [`Leadership`] lives.
    ///
    /// ```
    /// # use std::time::Duration;
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), lock_runtime::LockError> {
    /// let election = lock_runtime::LockManager::memory().election("rotating").lease(Duration::from_millis(20));
    /// let term = election.campaign().await?;
    /// term.lost().await; // the term's lease ran out
    /// # Ok(()) }
    /// ```
    pub fn lease(mut self, lease: Duration) -> Self {
        self.lease = Some(lease);
        self
    }

    /// The manager it campaigns with.
    pub fn manager(&self) -> &LockManager {
        &self.manager
    }

    /// Asks to lead: `.await` it for a [`Leadership`] once this campaign is elected. Waits
    /// without limit unless bounded with [`Campaign::wait`] (then an
    /// [`is_contended`](LockError::is_contended) error when someone else still leads).
    /// Campaigners are elected in the order they started on stores that queue waiters (memory,
    /// ZooKeeper, etcd, PostgreSQL, lock files within a process); see the crate's
    /// `GUARANTEES.md` for Redis.
    ///
    /// **Cancellation:** dropping the campaign at any point leaves nothing behind (its place in
    /// the queue is given up, as a dropped lock request's is).
    ///
    /// ```
    /// # use std::time::Duration;
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), lock_runtime::LockError> {
    /// let manager = lock_runtime::LockManager::memory();
    /// let election = manager.election("scheduler");
    /// let leader = election.campaign().await?;
    /// let other = election.campaign().wait(Duration::from_millis(10)).await;
    /// assert!(other.unwrap_err().is_contended());
    /// # drop(leader);
    /// # Ok(()) }
    /// ```
    pub fn campaign(&self) -> Campaign {
        Campaign { election: self.clone(), wait: None, lease: self.lease }
    }

    /// Who leads now, read from the store; `None` while nobody does (also while a term granted
    /// to a waiting campaigner by the store's queue is not claimed yet: see
    /// [`LockInfo::unclaimed`](crate::backend::LockInfo::unclaimed)). Refused with an
    /// [`is_invalid`](LockError::is_invalid) error on a store that cannot tell who holds a lock
    /// (Redlock, MySQL; see [`LockBackend::inspector`](crate::backend::LockBackend::inspector)):
    /// campaigning works there, but nobody else can tell who leads.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), lock_runtime::LockError> {
    /// let election = lock_runtime::LockManager::memory().election("scheduler");
    /// assert!(election.leader().await?.is_none());
    /// # Ok(()) }
    /// ```
    pub async fn leader(&self) -> Result<Option<LeaderInfo>, LockError> {
        let inspector = self.manager.inspector(&self.name)?;
        let key = self.key();
        let bound = self.manager.bound_and_kind().0;
        let info = self.manager.bounded(&key, "inspect", bound, inspector.inspect(&key)).await?;
        Ok(info.and_then(|info| LeaderInfo::new(&self.name, info)))
    }

    /// Follows the leader without campaigning: each [`LeaderWatch::changed`] completes with
    /// the next different leader. No I/O until the first call.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), lock_runtime::LockError> {
    /// let manager = lock_runtime::LockManager::memory();
    /// let election = manager.election("scheduler");
    /// let mut watch = election.observe();
    /// assert!(watch.changed().await?.is_none()); // the first call tells how it is: nobody leads
    /// let leadership = election.campaign().await?;
    /// let next = watch.changed().await?.expect("a leader");
    /// assert_eq!(next.fencing_token(), Some(leadership.fencing_token()));
    /// # Ok(()) }
    /// ```
    pub fn observe(&self) -> LeaderWatch {
        LeaderWatch::new(self.clone())
    }

    /// The backend key: the manager's prefix followed by the name.
    fn key(&self) -> String {
        format!("{}{}", self.manager.prefix(), self.name)
    }
}

/// A campaign being configured ([`Election::campaign`]): `.await` it for a [`Leadership`].
/// Owns a handle of its election (no borrow), so it can be kept, configured and spawned.
#[derive(Debug)]
#[must_use = "a campaign does nothing until it is awaited"]
pub struct Campaign {
    election: Election,
    wait: Option<Duration>,
    lease: Option<Duration>,
}

impl Campaign {
    /// Gives up after `wait` with an [`is_contended`](LockError::is_contended) error when
    /// someone else still leads (`Duration::ZERO`: one attempt).
    pub fn wait(mut self, wait: Duration) -> Self {
        self.wait = Some(wait);
        self
    }

    /// The term's lease, as [`LockRequest::lease`](crate::LockRequest::lease): a fixed lease
    /// ends the term when it runs out. Without it (nor [`Election::lease`]) the manager's
    /// watchdog lease is renewed for as long as the [`Leadership`] lives.
    pub fn lease(mut self, lease: Duration) -> Self {
        self.lease = Some(lease);
        self
    }
}

impl IntoFuture for Campaign {
    type Output = Result<Leadership, LockError>;
    type IntoFuture = BoxFuture<'static, Result<Leadership, LockError>>;

    fn into_future(self) -> Self::IntoFuture {
        Box::pin(async move {
            let Campaign { election, wait, lease } = self;
            let manager = &election.manager;
            let deadline = wait.map(|w| crate::clock::now().checked_add(w));
            loop {
                // Without a bound: one longest wait after another (a queue-based store keeps
                // the place only within one, so a campaign longer than a day queues again).
                let chunk = match deadline {
                    None => MAX_WAIT,
                    Some(None) => MAX_WAIT,
                    Some(Some(at)) => at.saturating_duration_since(crate::clock::now()).min(MAX_WAIT),
                };
                let mut request = manager.lock(&*election.name).wait(chunk);
                if let Some(lease) = lease {
                    request = request.lease(lease);
                }
                match request.await {
                    Ok(guard) => return Ok(Leadership::new(election, guard)),
                    // Unbounded, or bounded beyond the longest single wait: wait again.
                    Err(e)
                        if e.is_contended()
                            && deadline.is_none_or(|at| at.is_none_or(|at| crate::clock::now() < at)) =>
                    {
                        continue
                    }
                    Err(e) => return Err(e),
                }
            }
        })
    }
}
