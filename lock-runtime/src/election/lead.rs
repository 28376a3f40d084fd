//! [`Election::lead`]: campaign, run a body while leading, campaign again after a loss.

use std::future::Future;
use std::pin::pin;
use std::time::Duration;

use crate::error::LockError;
use crate::run::Locked;

use super::{Election, Leadership};

/// The first pause after a campaign failed to reach the store; doubled up to [`MAX_PAUSE`].
const FIRST_PAUSE: Duration = Duration::from_millis(100);
const MAX_PAUSE: Duration = Duration::from_secs(5);

impl Election {
    /// Campaigns, runs `body` while leading, and campaigns again when leadership is lost;
    /// returns the body's output once a body runs to its end. The way to run a singleton
    /// worker (what `#[distributed_locked(name = "…", leader)]` expands to).
    ///
    /// - `body` gets this term's [`Leadership`]. Inside it,
    ///   [`current()`](crate::current) gives the election's name and the term's fencing token.
    /// - **Loss:** when leadership is lost (its lease ran out unrenewed, a renewal was refused,
    ///   the store's session or connection was lost), the body is dropped at its next poll,
    ///   before the store lets another campaigner in (see `GUARANTEES.md`), and a new campaign
    ///   starts; the next body runs under a new term, with a higher token.
    /// - **End:** when the body completes, its output is returned. The leadership it was given
    ///   resigns when dropped (in the background, as a guard releases); call
    ///   [`Leadership::resign`] inside the body to step down first and learn how it went.
    /// - **Store outages:** a campaign that cannot reach the store (an
    ///   [`is_backend`](LockError::is_backend) error) is tried again after a pause (100 ms,
    ///   doubling up to 5 s), logged as a warning; errors that another try cannot mend (an
    ///   [`is_invalid`](LockError::is_invalid) name) are returned.
    /// - **Shutdown:** [`LockManager::shutdown`](crate::LockManager::shutdown) ends it with an
    ///   [`is_shut_down`](LockError::is_shut_down) error: the term under way is stopped and
    ///   resigned, a campaign under way leaves the queue, no new campaign starts.
    /// - **Cancellation:** dropping the returned future drops the body (in its context) and its
    ///   leadership, which resigns, or leaves the campaign's queue.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), lock_runtime::LockError> {
    /// let manager = lock_runtime::LockManager::memory();
    /// let election = manager.election("scheduler");
    /// let token = election
    ///     .lead(|leadership| async move {
    ///         let term = lock_runtime::current().expect("inside the term");
    ///         assert_eq!((term.key(), term.fencing_token()), ("scheduler", leadership.fencing_token()));
    ///         leadership.resign().await?;
    ///         Ok::<_, lock_runtime::LockError>(term.fencing_token())
    ///     })
    ///     .await??;
    /// assert!(token > 0);
    /// # Ok(()) }
    /// ```
    pub async fn lead<F, Fut>(&self, mut body: F) -> Result<Fut::Output, LockError>
    where
        F: FnMut(Leadership) -> Fut,
        Fut: Future,
    {
        let mut pause = FIRST_PAUSE;
        loop {
            let leadership = match self.campaign().await {
                Ok(leadership) => leadership,
                Err(e) if e.is_backend() => {
                    tracing::warn!(election = %self.name, error = %e, "campaign failed; trying again in {pause:?}");
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(MAX_PAUSE);
                    continue;
                }
                Err(e) => return Err(e),
            };
            pause = FIRST_PAUSE;
            let token = leadership.fencing_token();
            // The term runs in the engine of locked calls: in its context, stopped by its loss.
            // The leadership (which owns the lock) goes to the body; the engine only watches.
            let mut locked = pin!(Locked::new());
            locked.as_mut().adopt(&self.manager, leadership.guard());
            match locked.start(body(leadership)).await {
                Ok(output) => return Ok(output),
                // Taken by the manager's shutdown: no new campaign.
                Err(e) if e.is_lost() && self.manager.is_shut_down() => {
                    return Err(LockError::ShutDown { name: self.name.to_string() });
                }
                Err(e) if e.is_lost() => {
                    tracing::warn!(election = %self.name, token, reason = %e, "leadership lost; campaigning again");
                }
                Err(e) => return Err(e),
            }
        }
    }
}
