//! The `#[distributed_locked]` attribute of `lock-runtime`. Use it as
//! `lock_runtime::distributed_locked`; this crate only parses and generates code, the policy
//! (waiting, retries, lease renewal, reentrancy, release) lives in `lock-runtime`.
#![warn(missing_docs)]

use proc_macro::TokenStream;

mod expand;
mod options;
mod template;

/// Runs an async fn only while a distributed lock is held.
///
/// ```
/// use lock_runtime::{distributed_locked, LockError, LockManager};
///
/// #[distributed_locked(name = "invoice:{id}", wait = "2s")]
/// async fn send_invoice(id: u64) -> Result<u64, LockError> {
///     // Only one caller per invoice id runs this at a time, across every process that
///     // shares the backend.
///     Ok(id)
/// }
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), LockError> {
/// lock_runtime::set_default(LockManager::memory()); // once, at startup
/// assert_eq!(send_invoice(7).await?, 7);
/// # Ok(()) }
/// ```
///
/// A call to a locked fn:
///
/// 1. renders the lock name from its arguments (see `name`);
/// 2. takes the lock on the manager (the one given to `lock_runtime::set_default`, or
///    `manager = ..`), waiting up to `wait`, with at most `retry` further attempts;
/// 3. if the lock cannot be taken, calls the `fallback` with the same arguments and returns its
///    result, or, without a fallback, returns `Err(lock_error.into())`;
/// 4. otherwise runs the body (the arguments move into it only now), with
///    `lock_runtime::current()` giving the lock's key and fencing token, and releases the lock
///    when the body ends: on return, `?`, panic, or when the call's future is dropped.
///
/// The lock is kept alive by a watchdog while the body runs (or expires after a fixed
/// `lease`). If it is lost anyway, the body is stopped at its next await and the call returns
/// the `is_lost()` error (see `on_lost`).
///
/// **Reentrancy:** a locked call made inside a locked call, in the same task, with the same
/// manager and the same rendered name, enters at once instead of waiting for itself; the lock
/// is released when the outermost call ends. Other tasks wait as usual. (A task spawned from a
/// locked body is another task.)
///
/// ## The same code without the attribute
///
/// What the attribute does for a function, `LockRequest::run` does for a future you give it
/// (both run on the runtime's one run engine, the attribute through the runtime's
/// `__private` entry points, which also render the name and fall back): it runs the future
/// under the lock, with the same release on every exit (return, `?`, panic, cancellation),
/// stopping on a lost lease, task-scoped reentrancy and `current()`.
///
/// ```
/// use std::time::Duration;
/// use lock_runtime::{LockError, LockManager};
///
/// async fn send_invoice(manager: &LockManager, id: u64) -> Result<u64, LockError> {
///     manager
///         .lock(format!("invoice:{id}"))
///         .wait(Duration::from_secs(2))
///         .run(async {
///             // the body: `lock_runtime::current()` gives the lock's key and fencing token
///             Ok(id)
///         })
///         .await? // the error of taking (or losing) the lock
/// }
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), LockError> {
/// # assert_eq!(send_invoice(&LockManager::memory(), 7).await?, 7);
/// # Ok(()) }
/// ```
///
/// What the attribute adds on top: the name rendered from the arguments, the `fallback`
/// called with the same arguments when the lock cannot be taken (the arguments move into the
/// body only once it is), the lock error converted into the fn's error type, and compile-time
/// checks of every option.
///
/// # Options
///
/// All are optional: `name`, `wait`, `lease`, `retry`, `hold_at_least`, `skip_if_locked`,
/// `fallback`, `manager`, `on_lost`, `crate`, `mode`, `permits`, `names`, `leader`. Each is checked at compile time, with the error on the offending token; every
/// problem of a build is reported together.
///
/// ## `name`: which lock
///
/// A string literal. `{param}` interpolates a parameter with `Display`, `{param.field.field}` a
/// field of one, `{self.field}` a field of the receiver; `{{` and `}}` are literal braces.
/// Parameters bound by a pattern (`(a, b): (u32, u32)`, `Path(id): Path<u64>`) are named by
/// their bindings. A name that refers to anything else is a compile error.
///
/// Default: the md5 hex digest of `module_path!()` + `"::"` + the fn name, computed once per
/// fn, not per call. (Methods of different types in one module with the same name share that
/// default: give them a `name`.)
///
/// ```
/// use lock_runtime::{distributed_locked, LockError, LockManager};
///
/// pub struct Order { pub id: u64 }
///
/// #[distributed_locked(name = "order:{order.id}")]
/// async fn settle(order: &Order) -> Result<String, LockError> {
///     Ok(lock_runtime::current().map(|l| l.key().to_owned()).unwrap_or_default())
/// }
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), LockError> {
/// # lock_runtime::set_default(LockManager::memory());
/// assert_eq!(settle(&Order { id: 42 }).await?, "order:42");
/// # Ok(()) }
/// ```
///
/// Without the attribute: `manager.lock(format!("order:{}", order.id))`.
///
/// ## `wait`: how long to wait for the lock
///
/// `"250ms"`, `"2s"`, `"1m"`, `"1h"`, or an integer number of milliseconds (`wait = 250` is
/// 250 ms; prefer the string, which names its unit); at most 24 hours.
/// `"0s"` makes one attempt. Default: the manager's `default_wait` (3 s unless configured).
///
/// ```
/// use lock_runtime::{distributed_locked, LockError, LockManager};
///
/// #[distributed_locked(name = "report", wait = "0s")]
/// async fn build_report() -> Result<(), LockError> {
///     Ok(())
/// }
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), LockError> {
/// # let manager = LockManager::memory();
/// # lock_runtime::set_default(manager.clone());
/// let held = manager.lock("report").await?; // someone else is building it
/// assert!(build_report().await.unwrap_err().is_contended()); // one attempt, no waiting
/// # drop(held);
/// # Ok(()) }
/// ```
///
/// Without the attribute: `manager.lock("report").wait(Duration::ZERO).await?` (or
/// `manager.try_lock("report").await?` for an `Option`).
///
/// ## `lease`: a fixed lease instead of the watchdog
///
/// Same forms as `wait`; not zero, at most 24 hours. The lock expires after the lease unless
/// released, and is never renewed: a body that runs longer loses it (see `on_lost`). Leave it
/// out to have a watchdog renew the lock at a third of the manager's `default_lease` for as
/// long as the body runs, which is what most code wants.
///
/// ```
/// use lock_runtime::{distributed_locked, LockError, LockManager};
///
/// #[distributed_locked(name = "tick", lease = "30s")]
/// async fn tick() -> Result<(), LockError> {
///     Ok(()) // must finish well within 30 s
/// }
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), LockError> {
/// # lock_runtime::set_default(LockManager::memory());
/// tick().await?;
/// # Ok(()) }
/// ```
///
/// Without the attribute: `manager.lock("tick").lease(Duration::from_secs(30)).await?`.
///
/// ## `retry`: how many further attempts
///
/// An integer: at most this many further attempts after the first, all within `wait`. An
/// attempt is made each time the backend signals that the lock may be free (a release, or the
/// holder's lease running out), never on a timer. Default: unlimited within `wait`.
///
/// ```
/// use lock_runtime::{distributed_locked, LockError, LockManager};
///
/// #[distributed_locked(name = "sync", wait = "10s", retry = 3)]
/// async fn sync_accounts() -> Result<(), LockError> {
///     Ok(())
/// }
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), LockError> {
/// # lock_runtime::set_default(LockManager::memory());
/// sync_accounts().await?;
/// # Ok(()) }
/// ```
///
/// Without the attribute: `manager.lock("sync").wait(Duration::from_secs(10)).retry(3).await?`.
///
/// ## `hold_at_least`: keep the name taken after an early finish
///
/// A duration, as `wait`'s: the lock stays taken until this long after it was granted, even
/// when the fn returns earlier (ShedLock's `lockAtLeastFor`). The release then hands the
/// remainder to the store, which counts it on its own clock (Redis sets the key's expiry to it,
/// ZooKeeper deletes the node when it has passed, the in-process store keeps the entry held),
/// and waiters are woken when it ends. This is what keeps a short scheduled job from running
/// twice on instances whose clocks differ by less than it (see *Scheduled jobs* below). It
/// may not be longer than a fixed `lease` (a compile error on `hold_at_least`).
///
/// ```
/// use lock_runtime::{distributed_locked, LockError, LockManager};
///
/// #[distributed_locked(name = "digest", hold_at_least = "30s", wait = "0s")]
/// async fn send_digest() -> Result<(), LockError> {
///     Ok(()) // done in milliseconds; the name stays taken for 30 s
/// }
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), LockError> {
/// # let manager = LockManager::memory();
/// # lock_runtime::set_default(manager.clone());
/// send_digest().await?;
/// assert!(send_digest().await.unwrap_err().is_contended()); // within the 30 s
/// # Ok(()) }
/// ```
///
/// Without the attribute: `manager.lock("digest").hold_at_least(Duration::from_secs(30))`.
///
/// ## `skip_if_locked`: don't run when held elsewhere
///
/// A flag: when the lock is held elsewhere the call does not run its body and returns
/// `Default::default()` (for `Result<T, E>`, `Ok(T::default())`); a return type with no
/// default is a compile error that names `Default`. It implies `wait = "0s"` (one attempt)
/// unless `wait` is given. Any other failure to take the lock (the backend, no default
/// manager) is not skipped in silence: it is logged at `error` level, and returned as
/// `Err(lock_error.into())` when the return type can carry it (`Result<_, E>` with
/// `E: From<LockError>`), else the call returns `Default::default()` after the log. Not
/// together with `fallback` (both say what happens when the lock is held; a compile error).
/// `on_lost` defaults as with a `fallback`: abort if the return type can carry the error,
/// else run to the end.
///
/// ```
/// use lock_runtime::{distributed_locked, LockManager};
/// use std::sync::atomic::{AtomicU32, Ordering};
///
/// static RUNS: AtomicU32 = AtomicU32::new(0);
///
/// #[distributed_locked(name = "cleanup", skip_if_locked)]
/// async fn cleanup() {
///     RUNS.fetch_add(1, Ordering::SeqCst);
/// }
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), lock_runtime::LockError> {
/// # let manager = LockManager::memory();
/// # lock_runtime::set_default(manager.clone());
/// let held = manager.lock("cleanup").await?; // another instance runs it
/// cleanup().await; // skipped at once
/// assert_eq!(RUNS.load(Ordering::SeqCst), 0);
/// held.release().await?;
/// cleanup().await;
/// assert_eq!(RUNS.load(Ordering::SeqCst), 1);
/// # Ok(()) }
/// ```
///
/// Without the attribute: `match manager.try_lock("cleanup").await? { Some(guard) => ..,
/// None => return Default::default() }`.
///
/// ## `leader`: a singleton worker
///
/// A flag: the fn runs as the leader of the election `name`, through
/// [`Election::lead`](../lock_runtime/struct.Election.html#method.lead). A call campaigns
/// (without a bound on the wait), runs the body once elected, and, when leadership is lost (a
/// lease ran out unrenewed, a session or connection was lost), stops the body at its next
/// await, campaigns again and runs the body anew. It returns the output of the first body that
/// runs to its end; the term ends with it (resigned in the background).
///
/// - **Arguments:** each term's body gets clones of the arguments (references are copied), so
///   they must be `Clone`; methods take `&self`.
/// - **Return type:** `Result<_, E>` with `E: From<LockError>`: an error no campaign can mend
///   (no manager, an invalid name) is returned through it; a store that cannot be reached is
///   tried again (100 ms, doubling up to 5 s).
/// - **Options:** `name`, `manager`, `crate`, and `lease` (each term's fixed lease: leadership
///   rotates at most that often). `wait`, `retry`, `hold_at_least`, `skip_if_locked`,
///   `fallback`, `on_lost`, `mode`, `permits` and `names` say something a leader cannot do and
///   are compile errors.
/// - Inside, [`current()`](../lock_runtime/fn.current.html) gives the election's name and the
///   term's fencing token: pass it to the stores the leader writes to.
///
/// ```
/// use lock_runtime::{distributed_locked, LockError, LockManager};
///
/// #[distributed_locked(name = "scheduler:{region}", leader)]
/// async fn schedule(region: String) -> Result<u64, LockError> {
///     let term = lock_runtime::current().expect("leading");
///     // ... run the schedule, writing with `term.fencing_token()` ...
///     Ok(term.fencing_token())
/// }
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), LockError> {
/// # lock_runtime::set_default(LockManager::memory());
/// assert!(schedule("eu".to_owned()).await? > 0);
/// # Ok(()) }
/// ```
///
/// Without the attribute: `manager.election("scheduler:eu").lead(|leadership| async move { .. })`.
///
/// ## `fallback`: what to do when the lock cannot be taken
///
/// The path of an async fn, called with the same arguments (receiver included) when the lock
/// cannot be taken, for any reason: held by someone else for the whole `wait`, backend down,
/// no manager configured; its result is returned. In a method, a bare name (`fallback = busy`)
/// is a method: `Self::busy(self, ..)`; write `self::busy` for a free fn of the module. A
/// fallback whose signature does not match is a compile error at `fallback = ..`.
///
/// With a fallback, the return type need not carry a `LockError`.
///
/// ```
/// use lock_runtime::{distributed_locked, LockManager};
///
/// pub struct Cache { pub locks: LockManager }
///
/// impl Cache {
///     #[distributed_locked(name = "warm:{key}", wait = "0s", manager = &self.locks, fallback = Self::skip)]
///     async fn warm(&self, key: &str) -> bool {
///         true // warmed
///     }
///     async fn skip(&self, key: &str) -> bool {
///         false // someone else is warming it
///     }
/// }
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), lock_runtime::LockError> {
/// let cache = Cache { locks: LockManager::memory() };
/// assert!(cache.warm("home").await);
/// let held = cache.locks.lock("warm:home").await?;
/// assert!(!cache.warm("home").await);
/// # drop(held);
/// # Ok(()) }
/// ```
///
/// Without the attribute:
///
/// ```
/// # use std::time::Duration;
/// # use lock_runtime::LockManager;
/// # pub struct Cache { pub locks: LockManager }
/// impl Cache {
///     async fn warm(&self, key: &str) -> bool {
///         let Ok(guard) = self.locks.lock(format!("warm:{key}")).wait(Duration::ZERO).await else {
///             return self.skip(key).await;
///         };
///         let warmed = true; // the body
///         let _ = guard.release().await;
///         warmed
///     }
///     async fn skip(&self, key: &str) -> bool {
///         false
///     }
/// }
/// ```
///
/// ## `manager`: which manager
///
/// An expression giving a `LockManager` or a `&LockManager`, evaluated on each call before the
/// body runs; it may use the parameters (`manager = &self.locks`, `manager = &state.locks`
/// with `State(state): State<AppState>`). Default: the manager given to
/// `lock_runtime::set_default`; if none was, the call fails with an `is_not_configured()`
/// error (or calls its fallback).
///
/// ```
/// use std::sync::LazyLock;
/// use lock_runtime::{distributed_locked, LockError, LockManager};
///
/// static BILLING: LazyLock<LockManager> = LazyLock::new(|| LockManager::builder().prefix("billing:").memory());
///
/// #[distributed_locked(name = "run", manager = &*BILLING)]
/// async fn billing_run() -> Result<(), LockError> {
///     Ok(())
/// }
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), LockError> {
/// billing_run().await?;
/// # Ok(()) }
/// ```
///
/// Without the attribute: `BILLING.lock("run").await?`.
///
/// ## `on_lost`: what happens when the lock is lost while the body runs
///
/// `abort` (the default): the body is stopped at its next await (its future is dropped) and
/// the call returns the `is_lost()` error converted with `From`. `ignore`: the body runs to its
/// end and its result is returned. Either way, check fencing tokens downstream: a lost lock
/// means the work may not have been exclusive.
///
/// `abort` needs a return type that can carry the error. For a fn with a `fallback` whose
/// return type cannot (say `-> u32`), the default is to run to the end (there is no value to
/// stop with); writing `on_lost = abort` there is a compile error.
///
/// ```
/// use lock_runtime::{distributed_locked, LockError, LockManager};
///
/// #[distributed_locked(name = "export", lease = "50ms", on_lost = abort)]
/// async fn export() -> Result<(), LockError> {
///     std::future::pending::<()>().await; // outlives the lease
///     Ok(())
/// }
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// # lock_runtime::set_default(LockManager::memory());
/// assert!(export().await.unwrap_err().is_lost());
/// # }
/// ```
///
/// Without the attribute (`.ignore_lost()` on the run for `on_lost = ignore`):
///
/// ```
/// # use std::time::Duration;
/// # use lock_runtime::{LockError, LockManager};
/// async fn export(manager: &LockManager) -> Result<(), LockError> {
///     manager
///         .lock("export")
///         .lease(Duration::from_millis(50))
///         .run(async {
///             std::future::pending::<()>().await; // the body, stopped when the lease is lost
///         })
///         .await // the `is_lost()` error
/// }
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// # assert!(export(&LockManager::memory()).await.unwrap_err().is_lost());
/// # }
/// ```
///
/// ## `crate`: where `lock_runtime` is
///
/// A string path, for crates that re-export `lock_runtime` under another name. The expansion
/// names only items under that path. Default: `::lock_runtime`.
///
/// ```
/// mod facade {
///     pub use ::lock_runtime as locks;
/// }
/// use facade::locks::{distributed_locked, LockError, LockManager};
///
/// #[distributed_locked(name = "r", crate = "crate::facade::locks", manager = LockManager::memory())]
/// async fn through_facade() -> Result<(), LockError> {
///     Ok(())
/// }
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), LockError> {
/// # through_facade().await
/// # }
/// ```
///
/// ## `mode`: a read-write lock
///
/// `mode = read` takes the read side of the read-write lock `name`
/// (`manager.read_lock(name)`): any number of readers run at once, none while a writer does.
/// `mode = write` takes its write side (`manager.write_lock(name)`). Read-write locks are a
/// namespace apart from the plain lock of the same name. In one task, a read inside a read or
/// a write re-enters; a write inside a read is refused with an `is_invalid()` error (it would
/// deadlock). Backends: memory, Redis (one server, Cluster, Sentinel), ZooKeeper, etcd and
/// PostgreSQL.
///
/// ```
/// use lock_runtime::{distributed_locked, LockError, LockManager};
///
/// #[distributed_locked(name = "catalog", mode = read)]
/// async fn browse() -> Result<u32, LockError> {
///     Ok(7) // many at once
/// }
///
/// #[distributed_locked(name = "catalog", mode = write, wait = "5s")]
/// async fn reprice() -> Result<(), LockError> {
///     Ok(()) // alone: no reader, no other writer
/// }
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), LockError> {
/// # lock_runtime::set_default(LockManager::memory());
/// # assert_eq!(browse().await?, 7);
/// # reprice().await
/// # }
/// ```
///
/// ## `permits`: a semaphore
///
/// `permits = N` (an integer of at least 1) takes one of `N` permits of the semaphore `name`
/// (`manager.semaphore(name, N)`): at most `N` calls run at once. Every holder of a name must
/// agree on `N`. Backends: memory, Redis (one server, Cluster, Sentinel), ZooKeeper, etcd and
/// PostgreSQL (at most 64 permits).
///
/// ```
/// use lock_runtime::{distributed_locked, LockError, LockManager};
///
/// #[distributed_locked(name = "exports", permits = 4, wait = "30s")]
/// async fn export(id: u64) -> Result<u64, LockError> {
///     Ok(id) // at most 4 exports at a time
/// }
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), LockError> {
/// # lock_runtime::set_default(LockManager::memory());
/// # assert_eq!(export(1).await?, 1);
/// # Ok(()) }
/// ```
///
/// ## `names`: several locks at once
///
/// An array of name templates, instead of `name`: every rendered name is locked
/// (`manager.lock_all(names)`) before the body runs, or none. They are taken in one global
/// order whatever order they are written in, so `transfer(a, b)` and `transfer(b, a)` never
/// deadlock; any one lost stops the body. Works on every backend. `names` does not combine
/// with `name`, `mode` or `permits`, nor `mode` with `permits`: each conflict is a compile
/// error on the option given later.
///
/// ```
/// use lock_runtime::{distributed_locked, LockError, LockManager};
///
/// #[distributed_locked(names = ["acct:{from}", "acct:{to}"], wait = "2s")]
/// async fn transfer(from: u64, to: u64, amount: u64) -> Result<u64, LockError> {
///     Ok(amount) // both accounts are ours
/// }
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), LockError> {
/// # lock_runtime::set_default(LockManager::memory());
/// # assert_eq!(transfer(1, 2, 5).await?, 5);
/// # assert_eq!(transfer(2, 1, 3).await?, 3);
/// # Ok(()) }
/// ```
///
/// # Scheduled jobs
///
/// A job that runs on a timer on every instance of a service, and must run once per tick
/// across all of them, is what ShedLock's `@SchedulerLock` does in the JVM world. The same job
/// side by side:
///
/// ```text
/// // Spring + ShedLock                               // lock_runtime
/// @Scheduled(cron = "0 */15 * * * *")                // a tokio interval (or any scheduler)
/// @SchedulerLock(name = "report",                    #[distributed_locked(name = "report",
///     lockAtMostFor = "10m",                             lease = "10m",
///     lockAtLeastFor = "30s")                            hold_at_least = "30s",
/// public void report() { ... }                           skip_if_locked)]
///                                                    async fn report() { ... }
/// ```
///
/// - `lockAtMostFor` is a fixed `lease`: the lock is freed after it even if the holder hangs or
///   dies. Leaving `lease` out is usually better here: a watchdog renews the lock while the job
///   runs and a dead instance frees it after the manager's `default_lease`, so a job that runs
///   long is never run twice.
/// - `lockAtLeastFor` is `hold_at_least`: the lock stays taken that long after the grant even
///   if the job finished in milliseconds, so an instance whose timer fires a little later
///   (clock skew, a slow start) finds it taken. Choose it longer than the skew between your
///   instances and shorter than the interval.
/// - ShedLock skips a locked job; so does `skip_if_locked` (one attempt, `Default::default()`).
///   Unlike ShedLock, a store that cannot be reached is not a silent skip: it is logged at
///   `error` (and returned if the fn returns a `Result`).
/// - Lease ends are counted by the store's clock (Redis `PX`/`TIME`, ZooKeeper's session and
///   `mtime`), from durations sent by the instances: their clocks need not agree.
///
/// ```no_run
/// use std::time::Duration;
/// use lock_runtime::{distributed_locked, LockManager};
///
/// #[distributed_locked(name = "report", hold_at_least = "30s", skip_if_locked)]
/// async fn report() {
///     println!("this instance runs this tick's report");
/// }
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), lock_runtime::LockError> {
/// // Across processes: LockManager::redis("redis://127.0.0.1:6379").await? (feature `redis`).
/// lock_runtime::set_default(LockManager::memory());
/// let mut ticks = tokio::time::interval(Duration::from_secs(15 * 60));
/// loop {
///     ticks.tick().await;
///     report().await;
/// }
/// # }
/// ```
///
/// See `examples/examples/scheduled.rs` for several processes against one Redis.
///
/// # Return type
///
/// Without a `fallback` or `skip_if_locked`, the fn must return `Result<T, E>` with `E: From<LockError>`: a
/// failure to lock comes back as `Err(lock_error.into())`. Anything else is a compile error on
/// the return type that says so. `impl Trait` return types are not supported.
///
/// # Where it works
///
/// Free async fns, async methods (`&self`, `&mut self`, `self`, `self: Arc<Self>`), associated
/// fns, trait impl methods, generic fns, and parameters that are patterns; attributes,
/// visibility, generics and where clauses pass through untouched. The locked fn's future is
/// `Send` whenever the original's was, so it works as an Axum handler and under Actix-web's
/// `#[get(..)]` (put `#[distributed_locked]` below the route attribute):
///
/// ```
/// # mod axum { pub mod extract { pub struct Path<T>(pub T); } }
/// use axum::extract::Path;
/// use lock_runtime::{distributed_locked, LockManager};
///
/// #[distributed_locked(name = "item:{id}", wait = "0s", fallback = item_busy)]
/// async fn item(Path(id): Path<u64>) -> String {
///     format!("item {id}")
/// }
/// async fn item_busy(Path(id): Path<u64>) -> String {
///     format!("item {id} is busy, try again")
/// }
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// # lock_runtime::set_default(LockManager::memory());
/// # assert_eq!(item(Path(1)).await, "item 1");
/// # }
/// ```
#[proc_macro_attribute]
pub fn distributed_locked(attr: TokenStream, item: TokenStream) -> TokenStream {
    expand::expand(attr.into(), item.into()).into()
}
