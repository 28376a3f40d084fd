//! Lock kinds beside the mutex: read-write locks ([`LockManager::read_lock`],
//! [`LockManager::write_lock`]), semaphores ([`LockManager::semaphore`]) and multi-name locks
//! ([`LockManager::lock_all`]).
//!
//! Read-write locks and semaphores are acquisitions of a [`LockKind`] other than
//! [`LockKind::Exclusive`], offered by the backends that [`support`](LockBackend::supports)
//! them (the in-process, Redis and ZooKeeper backends); a backend of your own that does not
//! refuses them at once with an [`is_invalid`](LockError::is_invalid) error. Multi-name locks are exclusive locks taken one
//! by one in one global order, so they work on every backend.
//!
//! [`LockBackend::supports`]: crate::backend::LockBackend::supports

use std::future::{Future, IntoFuture};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use crate::backend::{BoxFuture, LockKind};
use crate::context::{self, Frame};
use crate::error::LockError;
use crate::guard::LockGuard;
use crate::manager::LockManager;
use crate::options::{self, LockOptions};

/// The most names one [`lock_all`](LockManager::lock_all) takes.
pub const MAX_NAMES: usize = 1024;

/// The tag of a kind's frames in the task's context, in the top byte of the frame's manager id
/// (exclusive locks, the attribute's and `lock_all`'s, carry none).
fn tag(kind: LockKind) -> u64 {
    match kind {
        LockKind::Read => 1,
        LockKind::Write => 2,
        LockKind::Semaphore { .. } => 3,
        _ => 0,
    }
}

fn tagged(manager: u64, kind: LockKind) -> u64 {
    manager | (tag(kind) << 56)
}

/// The error of a kind the backend does not offer.
pub(crate) fn unsupported(name: &str, backend: &'static str, kind: LockKind) -> LockError {
    LockError::invalid(
        name,
        format!(
            "the {backend} backend does not support a {kind} (it offers exclusive locks; read-write locks and \
             semaphores are offered by the memory backend today); use `lock` or `lock_all`, or a backend that offers it"
        ),
    )
}

impl LockManager {
    /// Asks for the read side of the read-write lock `name`: any number of readers at once,
    /// none while a writer holds it (and, on a fair backend, none while a writer waits).
    /// Read-write locks are a namespace apart from [`lock`](Self::lock): `read_lock("catalog")`
    /// and `lock("catalog")` never exclude each other. `.await` it for a [`LockGuard`].
    ///
    /// Backends: memory, Redis, ZooKeeper; one that does not offer it refuses it with an
    /// [`is_invalid`](LockError::is_invalid) error.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), lock_runtime::LockError> {
    /// let manager = lock_runtime::LockManager::memory();
    /// let a = manager.read_lock("catalog").await?;
    /// let b = manager.read_lock("catalog").await?; // readers share
    /// assert!(manager.try_write_lock("catalog").await?.is_none()); // a writer waits for them
    /// a.release().await?;
    /// b.release().await?;
    /// assert!(manager.try_write_lock("catalog").await?.is_some());
    /// # Ok(()) }
    /// ```
    pub fn read_lock(&self, name: impl AsRef<str>) -> KindRequest<'_> {
        self.kind_request(name, LockKind::Read)
    }

    /// Asks for the write side of the read-write lock `name`: no other reader or writer at
    /// once. See [`read_lock`](Self::read_lock).
    ///
    /// ```
    /// # use std::time::Duration;
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), lock_runtime::LockError> {
    /// let manager = lock_runtime::LockManager::memory();
    /// let writer = manager.write_lock("catalog").wait(Duration::from_secs(1)).await?;
    /// assert!(manager.try_read_lock("catalog").await?.is_none());
    /// assert!(manager.try_lock("catalog").await?.is_some()); // another namespace
    /// writer.release().await?;
    /// # Ok(()) }
    /// ```
    pub fn write_lock(&self, name: impl AsRef<str>) -> KindRequest<'_> {
        self.kind_request(name, LockKind::Write)
    }

    /// Asks for one of `permits` permits of the semaphore `name`: at most `permits` holders at
    /// once. Every holder and waiter of `name` must give the same `permits`; a different one is
    /// an [`is_invalid`](LockError::is_invalid) error (never more holders than agreed), and so
    /// is zero. Semaphores are a namespace of their own.
    ///
    /// Backends: memory, Redis, ZooKeeper; one that does not offer it refuses it with an
    /// [`is_invalid`](LockError::is_invalid) error.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), lock_runtime::LockError> {
    /// let manager = lock_runtime::LockManager::memory();
    /// let one = manager.semaphore("exports", 2).await?;
    /// let two = manager.semaphore("exports", 2).await?;
    /// assert!(manager.try_semaphore("exports", 2).await?.is_none()); // both permits taken
    /// assert!(manager.semaphore("exports", 3).await.unwrap_err().is_invalid()); // disagrees
    /// one.release().await?;
    /// two.release().await?;
    /// # Ok(()) }
    /// ```
    pub fn semaphore(&self, name: impl AsRef<str>, permits: u32) -> KindRequest<'_> {
        self.kind_request(name, LockKind::Semaphore { permits })
    }

    fn kind_request(&self, name: impl AsRef<str>, kind: LockKind) -> KindRequest<'_> {
        KindRequest { manager: self, name: Arc::from(name.as_ref()), kind, options: LockOptions::new() }
    }

    /// [`read_lock`](Self::read_lock) with one attempt, no waiting: `Ok(None)` when a writer
    /// holds or waits for it.
    pub async fn try_read_lock(&self, name: impl AsRef<str>) -> Result<Option<LockGuard>, LockError> {
        contended_is_none(self.read_lock(name).wait(Duration::ZERO).retry(0).await)
    }

    /// [`write_lock`](Self::write_lock) with one attempt, no waiting: `Ok(None)` when held.
    pub async fn try_write_lock(&self, name: impl AsRef<str>) -> Result<Option<LockGuard>, LockError> {
        contended_is_none(self.write_lock(name).wait(Duration::ZERO).retry(0).await)
    }

    /// [`semaphore`](Self::semaphore) with one attempt, no waiting: `Ok(None)` when every
    /// permit is taken.
    pub async fn try_semaphore(&self, name: impl AsRef<str>, permits: u32) -> Result<Option<LockGuard>, LockError> {
        contended_is_none(self.semaphore(name, permits).wait(Duration::ZERO).retry(0).await)
    }

    /// Asks for every one of `names` or none (exclusive locks, as [`lock`](Self::lock) takes
    /// them), within one `wait`. They are taken one by one in one global order (sorted, each
    /// once) whatever order they are given in, so two callers never deadlock; if one cannot
    /// be taken in time, or the future is dropped half-way, those already taken are released.
    /// Works on every backend. `.await` it for a [`LockAllGuard`].
    ///
    /// ```
    /// # use std::time::Duration;
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), lock_runtime::LockError> {
    /// let manager = lock_runtime::LockManager::memory();
    /// let both = manager.lock_all(["acct:2", "acct:1"]).wait(Duration::from_secs(2)).await?;
    /// assert_eq!(both.keys().collect::<Vec<_>>(), ["acct:1", "acct:2"]); // in the global order
    /// assert!(manager.try_lock("acct:2").await?.is_none());
    /// both.release().await?;
    /// # Ok(()) }
    /// ```
    pub fn lock_all<I>(&self, names: I) -> LockAllRequest<'_>
    where
        I: IntoIterator,
        I::Item: AsRef<str>,
    {
        let mut names: Vec<Arc<str>> = names.into_iter().map(|n| Arc::from(n.as_ref())).collect();
        names.sort();
        names.dedup();
        LockAllRequest { manager: self, names, options: LockOptions::new() }
    }

    /// [`lock_all`](Self::lock_all) with one attempt per name, no waiting: `Ok(None)` (and
    /// nothing held) when one of them is held.
    pub async fn try_lock_all<I>(&self, names: I) -> Result<Option<LockAllGuard>, LockError>
    where
        I: IntoIterator,
        I::Item: AsRef<str>,
    {
        contended_is_none(self.lock_all(names).wait(Duration::ZERO).retry(0).await)
    }
}

fn contended_is_none<T>(result: Result<T, LockError>) -> Result<Option<T>, LockError> {
    match result {
        Ok(guard) => Ok(Some(guard)),
        Err(e) if e.is_contended() => Ok(None),
        Err(e) => Err(e),
    }
}

/// A request for a read lock, a write lock or a semaphore permit: `.await` it for a
/// [`LockGuard`], or [`run`](KindRequest::run) a future under it. Created by
/// [`LockManager::read_lock`], [`write_lock`](LockManager::write_lock) and
/// [`semaphore`](LockManager::semaphore).
#[derive(Debug)]
#[must_use = "a lock request does nothing until it is awaited"]
pub struct KindRequest<'m> {
    manager: &'m LockManager,
    name: Arc<str>,
    kind: LockKind,
    options: LockOptions,
}

impl<'m> KindRequest<'m> {
    /// The longest time to wait; `Duration::ZERO` makes one attempt.
    pub fn wait(mut self, wait: Duration) -> Self {
        self.options = self.options.wait(wait);
        self
    }

    /// A fixed lease: the holding expires after it unless released; no watchdog renewal.
    pub fn lease(mut self, lease: Duration) -> Self {
        self.options = self.options.lease(lease);
        self
    }

    /// At most this many further attempts after the first, within `wait`.
    pub fn retry(mut self, retry: u32) -> Self {
        self.options = self.options.retry(retry);
        self
    }

    /// Replaces all options at once.
    pub fn options(mut self, options: LockOptions) -> Self {
        self.options = options;
        self
    }

    /// Which kind of lock it asks for.
    pub fn kind(&self) -> LockKind {
        self.kind
    }

    /// Runs `fut` while the lock is held, as [`LockRequest::run`](crate::LockRequest::run)
    /// does for a mutex: [`current()`](crate::current) gives its name and token, the lock is
    /// released on every exit, and the loss of the lock stops `fut` with the lost error.
    ///
    /// **Reentrancy** (same task, same manager, same name): a read inside a read or a write
    /// enters at once, as does a write inside a write and a permit inside a permit; a write
    /// inside a read is refused at once with an [`is_invalid`](LockError::is_invalid) error
    /// (upgrading a read lock would deadlock).
    ///
    /// ```
    /// use lock_runtime::{LockError, LockManager};
    ///
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), LockError> {
    /// let manager = LockManager::memory();
    /// manager
    ///     .read_lock("catalog")
    ///     .run(async {
    ///         let nested = manager.read_lock("catalog").run(async { 1 }).await?; // re-enters
    ///         let upgrade = manager.write_lock("catalog").run(async { 2 }).await;
    ///         assert!(upgrade.unwrap_err().is_invalid()); // never a hang
    ///         Ok::<_, LockError>(nested)
    ///     })
    ///     .await??;
    /// # Ok(()) }
    /// ```
    pub async fn run<F: Future>(self, fut: F) -> Result<F::Output, LockError> {
        let hold = self.enter().await?;
        hold.run(fut, true).await
    }

    /// Looks the lock up in the task's context, then re-enters it or takes it.
    async fn enter(self) -> Result<KindHold, LockError> {
        let KindRequest { manager, name, kind, options } = self;
        let id = manager.id();
        let context::Lookup { held, parent } = lookup(id, &name, kind);
        if let Some(outer) = held {
            check_reentry(&name, kind, &outer, id)?;
            return Ok(KindHold { guards: Vec::new(), frame: Some(Frame { parent, ..outer }) });
        }
        let guard = manager.acquire_kind(name, kind, options).await?;
        let frame = frame_of(&guard, tagged(id, kind), parent);
        Ok(KindHold { guards: vec![guard], frame: Some(frame) })
    }
}

/// The frame of the task's context that a request of `kind` for `name` would re-enter (or be
/// refused by), if any.
fn lookup(manager: u64, name: &str, kind: LockKind) -> context::Lookup {
    let read = tagged(manager, LockKind::Read);
    let write = tagged(manager, LockKind::Write);
    let mine = tagged(manager, kind);
    context::find(|f| {
        *f.name == *name
            && match kind {
                LockKind::Read | LockKind::Write => f.manager == read || f.manager == write,
                _ => f.manager == mine,
            }
    })
}

/// A request of `kind` made where the task holds `outer` on the same name: re-enters, or is
/// refused (a write inside a read).
fn check_reentry(name: &str, kind: LockKind, outer: &Frame, manager: u64) -> Result<(), LockError> {
    if kind == LockKind::Write && outer.manager == tagged(manager, LockKind::Read) {
        return Err(LockError::invalid(
            name,
            "a write lock was asked for inside a read lock of the same name in this task: upgrading a read lock \
             would deadlock; take the write lock first (a read inside a write re-enters)",
        ));
    }
    Ok(())
}

fn frame_of(guard: &LockGuard, manager: u64, parent: Option<Arc<Frame>>) -> Frame {
    Frame {
        manager,
        name: guard.name().clone(),
        fencing_token: guard.fencing_token(),
        lost: guard.lost_signal().clone(),
        parent,
    }
}

impl<'m> IntoFuture for KindRequest<'m> {
    type Output = Result<LockGuard, LockError>;
    type IntoFuture = BoxFuture<'m, Result<LockGuard, LockError>>;

    fn into_future(self) -> Self::IntoFuture {
        Box::pin(async move {
            let KindRequest { manager, name, kind, options } = self;
            if let LockKind::Semaphore { permits: 0 } = kind {
                return Err(LockError::invalid(&*name, "a semaphore of 0 permits admits nobody; give at least 1"));
            }
            // A write asked for inside a read of the same name in this task would wait for
            // itself: refused at once.
            if kind == LockKind::Write {
                if let Some(outer) = lookup(manager.id(), &name, kind).held {
                    check_reentry(&name, kind, &outer, manager.id())?;
                }
            }
            manager.acquire_kind(name, kind, options).await
        })
    }
}

/// A request for several exclusive locks at once: `.await` it for a [`LockAllGuard`], or
/// [`run`](LockAllRequest::run) a future under them. Created by [`LockManager::lock_all`].
#[derive(Debug)]
#[must_use = "a lock request does nothing until it is awaited"]
pub struct LockAllRequest<'m> {
    manager: &'m LockManager,
    /// Sorted, each once.
    names: Vec<Arc<str>>,
    options: LockOptions,
}

impl<'m> LockAllRequest<'m> {
    /// The longest time to wait for all of them together; `Duration::ZERO` makes one attempt
    /// per name.
    pub fn wait(mut self, wait: Duration) -> Self {
        self.options = self.options.wait(wait);
        self
    }

    /// A fixed lease for each lock: it expires after it unless released; no watchdog renewal.
    pub fn lease(mut self, lease: Duration) -> Self {
        self.options = self.options.lease(lease);
        self
    }

    /// At most this many further attempts per name after its first, within `wait`.
    pub fn retry(mut self, retry: u32) -> Self {
        self.options = self.options.retry(retry);
        self
    }

    /// Replaces all options at once.
    pub fn options(mut self, options: LockOptions) -> Self {
        self.options = options;
        self
    }

    /// The names it takes, in the order it takes them (sorted, each once).
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.names.iter().map(|n| &**n)
    }

    /// Runs `fut` while every lock is held, as [`LockRequest::run`](crate::LockRequest::run)
    /// does for one: inside, [`current()`](crate::current) gives the last name (in the global
    /// order), and a nested `lock(..).run(..)` (or locked fn) of any of the names re-enters.
    /// Names the task already holds are re-entered rather than taken. Released on every exit;
    /// the loss of any one stops `fut` with the lost error.
    ///
    /// ```
    /// use lock_runtime::{LockError, LockManager};
    ///
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), LockError> {
    /// let manager = LockManager::memory();
    /// let moved = manager
    ///     .lock_all(["acct:1", "acct:2"])
    ///     .run(async {
    ///         // Re-enters: the task holds acct:1 already.
    ///         manager.lock("acct:1").run(async { 100 }).await
    ///     })
    ///     .await??;
    /// assert_eq!(moved, 100);
    /// # Ok(()) }
    /// ```
    pub async fn run<F: Future>(self, fut: F) -> Result<F::Output, LockError> {
        let hold = self.enter().await?;
        hold.run(fut, true).await
    }

    /// Re-enters the names the task holds, takes the others, and chains one frame per name.
    async fn enter(self) -> Result<KindHold, LockError> {
        let LockAllRequest { manager, names, options } = self;
        let id = manager.id();
        let mut outer: Vec<Option<Frame>> = Vec::with_capacity(names.len());
        let mut parent = None;
        for (i, name) in names.iter().enumerate() {
            let lookup = context::find(|f| f.manager == id && *f.name == **name);
            if i == 0 {
                parent = lookup.parent;
            }
            outer.push(lookup.held);
        }
        let to_take: Vec<Arc<str>> =
            names.iter().zip(&outer).filter(|(_, held)| held.is_none()).map(|(n, _)| n.clone()).collect();
        let guards = if to_take.is_empty() && !names.is_empty() {
            Vec::new()
        } else {
            acquire_all(manager, to_take, options).await?
        };
        let mut frame: Option<Frame> = None;
        let mut taken = guards.iter();
        for held in outer {
            let parent = match frame.take() {
                Some(f) => Some(Arc::new(f)),
                None => parent.take(),
            };
            frame = match held {
                Some(outer) => Some(Frame { parent, ..outer }),
                None => taken.next().map(|g| frame_of(g, id, parent)),
            };
        }
        Ok(KindHold { guards, frame })
    }
}

impl<'m> IntoFuture for LockAllRequest<'m> {
    type Output = Result<LockAllGuard, LockError>;
    type IntoFuture = BoxFuture<'m, Result<LockAllGuard, LockError>>;

    fn into_future(self) -> Self::IntoFuture {
        Box::pin(async move {
            let LockAllRequest { manager, names, options } = self;
            Ok(LockAllGuard { guards: acquire_all(manager, names, options).await? })
        })
    }
}

/// Takes every one of `names` (sorted, each once) within the request's `wait`, or none.
async fn acquire_all(
    manager: &LockManager,
    names: Vec<Arc<str>>,
    options: LockOptions,
) -> Result<Vec<LockGuard>, LockError> {
    if names.is_empty() {
        return Err(LockError::invalid("", "`lock_all` was given no names; give at least one"));
    }
    if names.len() > MAX_NAMES {
        return Err(LockError::invalid(
            &*names[0],
            format!("`lock_all` was given {} names; the most accepted is {MAX_NAMES}", names.len()),
        ));
    }
    // Every name is checked before any is taken.
    for name in &names {
        options::check_name(name)?;
    }
    let wait = options.wait_for().unwrap_or_else(|| manager.default_wait());
    options::check_wait(&names[0], wait)?;
    let started = crate::clock::now();
    let deadline = started.checked_add(wait).unwrap_or(started);
    // Dropped with the future (cancelled half-way): every guard in it releases at once.
    let mut taken = Partial(Vec::with_capacity(names.len()));
    for name in names {
        let remaining = deadline.saturating_duration_since(crate::clock::now());
        match manager.lock_named(name).options(options.wait(remaining)).await {
            Ok(guard) => taken.0.push(guard),
            Err(e) => {
                release_all(std::mem::take(&mut taken.0)).await;
                return Err(e);
            }
        }
    }
    Ok(std::mem::take(&mut taken.0))
}

/// The locks a `lock_all` took so far: a rollback frees them at once, whatever `hold_at_least`
/// said (that is for a completed holding, released by its holder).
struct Partial(Vec<LockGuard>);

impl Drop for Partial {
    fn drop(&mut self) {
        for guard in self.0.drain(..) {
            drop(guard.without_hold());
        }
    }
}

/// Releases every guard, awaiting each (errors only logged: the caller reports its own).
async fn release_all(guards: Vec<LockGuard>) {
    for guard in guards {
        let name = guard.key().to_owned();
        if let Err(e) = guard.without_hold().release().await {
            tracing::debug!(lock = %name, error = %e, "release of a partial lock_all failed");
        }
    }
}

/// Every lock of a [`LockManager::lock_all`]: released together, lost if any one is lost.
/// Dropping it releases them all in the background.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), lock_runtime::LockError> {
/// let manager = lock_runtime::LockManager::memory();
/// let all = manager.lock_all(["b", "a", "b"]).await?;
/// assert_eq!(all.len(), 2);
/// let tokens = all.fencing_tokens();
/// assert_eq!(all.fencing_token(), tokens.iter().copied().max().unwrap_or(0));
/// all.release().await?;
/// # Ok(()) }
/// ```
#[derive(Debug)]
#[must_use = "the locks are released as soon as the guard is dropped"]
pub struct LockAllGuard {
    /// In the global order (sorted by name).
    guards: Vec<LockGuard>,
}

impl LockAllGuard {
    /// The names held, in the global order (sorted, each once), without the manager prefix.
    pub fn keys(&self) -> impl Iterator<Item = &str> {
        self.guards.iter().map(LockGuard::key)
    }

    /// How many names are held.
    pub fn len(&self) -> usize {
        self.guards.len()
    }

    /// Whether it holds no name (never, for a granted `lock_all`).
    pub fn is_empty(&self) -> bool {
        self.guards.is_empty()
    }

    /// The fencing token of each name, in the order of [`keys`](Self::keys).
    pub fn fencing_tokens(&self) -> Vec<u64> {
        self.guards.iter().map(LockGuard::fencing_token).collect()
    }

    /// The greatest of the [`fencing_tokens`](Self::fencing_tokens).
    pub fn fencing_token(&self) -> u64 {
        self.guards.iter().map(LockGuard::fencing_token).max().unwrap_or(0)
    }

    /// The guard of each name, in the order of [`keys`](Self::keys).
    pub fn guards(&self) -> &[LockGuard] {
        &self.guards
    }

    /// Completes when any one of the locks is lost.
    pub async fn lost(&self) {
        let mut lost: Vec<Pin<Box<dyn Future<Output = ()> + Send + '_>>> =
            self.guards.iter().map(|g| Box::pin(g.lost()) as Pin<Box<dyn Future<Output = ()> + Send + '_>>).collect();
        std::future::poll_fn(|cx| {
            for l in &mut lost {
                if l.as_mut().poll(cx).is_ready() {
                    return Poll::Ready(());
                }
            }
            Poll::Pending
        })
        .await
    }

    /// Whether any one of the locks is known to be lost.
    pub fn is_lost(&self) -> bool {
        self.guards.iter().any(LockGuard::is_lost)
    }

    /// Releases every lock. An [`is_lost`](LockError::is_lost) error (the first, if several)
    /// means one of them was no longer held; every one is released either way.
    pub async fn release(self) -> Result<(), LockError> {
        let mut verdict = Ok(());
        for guard in self.guards {
            if let Err(e) = guard.release().await {
                if verdict.is_ok() {
                    verdict = Err(e);
                }
            }
        }
        verdict
    }
}

/// The locks of a run: the guards it took (none when re-entered) and the innermost of its
/// frames, swapped into the task's context while the body is polled.
pub(crate) struct KindHold {
    guards: Vec<LockGuard>,
    frame: Option<Frame>,
}

impl KindHold {
    /// Runs `fut` under the locks: in their context, stopped by the loss of any one when
    /// `abort`, then releases.
    pub(crate) async fn run<F: Future>(self, fut: F, abort: bool) -> Result<F::Output, LockError> {
        let KindHold { guards, frame } = self;
        let body = InFrame { body: Some(fut), frame };
        let output = {
            let signals: Vec<_> = guards.iter().filter(|g| abort && g.lost_signal().can_fire()).collect();
            if signals.is_empty() {
                Ok(body.await)
            } else {
                let lost = std::pin::pin!(any_lost(&signals));
                let body = std::pin::pin!(body);
                match futures_select(body, lost).await {
                    Either::Body(out) => Ok(out),
                    Either::Lost(e) => Err(e),
                }
            }
        };
        let mut released = Ok(());
        for guard in guards {
            if let Err(e) = guard.release().await {
                if released.is_ok() {
                    released = Err(e);
                }
            }
        }
        crate::run::finish(output, released, abort)
    }
}

/// The lost error of the first of `guards` found lost.
async fn any_lost(guards: &[&LockGuard]) -> LockError {
    let mut lost: Vec<Pin<Box<dyn Future<Output = ()> + Send + '_>>> =
        guards.iter().map(|g| Box::pin(g.lost()) as Pin<Box<dyn Future<Output = ()> + Send + '_>>).collect();
    let which = std::future::poll_fn(|cx| {
        for (i, l) in lost.iter_mut().enumerate() {
            if l.as_mut().poll(cx).is_ready() {
                return Poll::Ready(i);
            }
        }
        Poll::Pending
    })
    .await;
    let guard = guards.get(which).or_else(|| guards.first());
    let name = guard.map(|g| g.key().to_owned()).unwrap_or_default();
    let reason = guard.and_then(|g| g.lost_signal().reason()).unwrap_or_else(|| "its lease ran out".to_owned());
    LockError::lost(name, reason)
}

enum Either<A, B> {
    Body(A),
    Lost(B),
}

/// The first of the body and the loss to complete (the body polled first).
async fn futures_select<A: Future, B: Future>(mut a: Pin<&mut A>, mut b: Pin<&mut B>) -> Either<A::Output, B::Output> {
    std::future::poll_fn(|cx| {
        if let Poll::Ready(out) = a.as_mut().poll(cx) {
            return Poll::Ready(Either::Body(out));
        }
        b.as_mut().poll(cx).map(Either::Lost)
    })
    .await
}

pin_project_lite::pin_project! {
    /// A body polled (and dropped) with its locks' frame in the task's context.
    struct InFrame<F> {
        #[pin]
        body: Option<F>,
        frame: Option<Frame>,
    }

    impl<F> PinnedDrop for InFrame<F> {
        fn drop(this: Pin<&mut Self>) {
            let this = this.project();
            let mut body = this.body;
            if body.is_some() {
                context::within(this.frame, || body.set(None));
            }
        }
    }
}

impl<F: Future> Future for InFrame<F> {
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let this = self.project();
        let mut body = this.body;
        let polled = context::within(this.frame, || match body.as_mut().as_pin_mut() {
            Some(fut) => fut.poll(cx),
            None => Poll::Pending, // not reached: set to `None` only once ready
        });
        if polled.is_ready() {
            context::within(this.frame, || body.set(None));
        }
        polled
    }
}

/// What `#[distributed_locked(mode = .., permits = .., names = [..])]` expands to (through
/// `__private::kinds`). Not a public API.
#[doc(hidden)]
pub mod private {
    use std::borrow::Borrow;
    use std::future::Future;
    use std::sync::Arc;

    use super::{KindHold, KindRequest, LockAllRequest};
    use crate::__private::{LockName, OnLost};
    use crate::backend::LockKind;
    use crate::error::LockError;
    use crate::manager::LockManager;
    use crate::options::LockOptions;

    /// The read side of a read-write lock.
    pub const READ: LockKind = LockKind::Read;
    /// The write side of a read-write lock.
    pub const WRITE: LockKind = LockKind::Write;

    /// One of `permits` permits.
    pub const fn semaphore(permits: u32) -> LockKind {
        LockKind::Semaphore { permits }
    }

    /// The manager of `manager = ..` (a `LockManager` or a reference to one).
    #[inline]
    pub fn manager_of<M: Borrow<LockManager>>(manager: &M) -> Option<&LockManager> {
        Some(manager.borrow())
    }

    /// The locks of a locked call, taken (or re-entered) before its arguments move into its
    /// body.
    #[must_use = "the locks are released as soon as this is dropped"]
    pub struct Held(KindHold);

    impl std::fmt::Debug for Held {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.debug_struct("Held").field("locks", &self.0.guards.len()).finish()
        }
    }

    impl Held {
        /// Runs the body under the locks, then releases them.
        pub async fn run<F: Future>(self, on_lost: OnLost, body: F) -> Result<F::Output, LockError> {
            self.0.run(body, on_lost == OnLost::Abort).await
        }
    }

    /// Takes (or re-enters) a read lock, write lock or permit of `name`.
    pub async fn enter<N: LockName>(
        manager: Option<&LockManager>,
        name: N,
        kind: LockKind,
        options: LockOptions,
    ) -> Result<Held, LockError> {
        let Some(manager) = manager else {
            return Err(LockError::NotConfigured { name: name.as_name().to_owned() });
        };
        if let LockKind::Semaphore { permits: 0 } = kind {
            return Err(LockError::invalid(name.as_name(), "a semaphore of 0 permits admits nobody; give at least 1"));
        }
        let request = KindRequest { manager, name: name.into_name(), kind, options };
        Ok(Held(request.enter().await?))
    }

    /// Takes (or re-enters) every one of `names`.
    pub async fn enter_all(
        manager: Option<&LockManager>,
        names: Vec<Arc<str>>,
        options: LockOptions,
    ) -> Result<Held, LockError> {
        let Some(manager) = manager else {
            let joined: Vec<&str> = names.iter().map(|n| &**n).collect();
            return Err(LockError::NotConfigured { name: joined.join(", ") });
        };
        let request: LockAllRequest<'_> = manager.lock_all(names).options(options);
        Ok(Held(request.enter().await?))
    }
}
