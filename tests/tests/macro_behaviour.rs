//! Behaviour of real `#[distributed_locked]` fns on the in-memory backend: names, options,
//! reentrancy, release on every exit, `on_lost`, `current()`, methods, generics, patterns,
//! fallbacks, `manager = ..`, and `Send` futures. Compiled under `deny(warnings, clippy::all)`
//! so that the expansion itself is lint-clean.
#![deny(warnings, clippy::all)]

use std::fmt::Display;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, LazyLock};
use std::time::Duration;

use lock_runtime::{distributed_locked, LockError, LockManager};
use tokio::sync::{oneshot, Barrier};

/// Generous bound for anything that should happen "at once" on a loaded CI box.
const BOUND: Duration = Duration::from_secs(20);

#[derive(Debug)]
struct AppError(LockError);

impl From<LockError> for AppError {
    fn from(e: LockError) -> Self {
        AppError(e)
    }
}

/// The process-wide default manager, set once for the fns that give no `manager`.
static DEFAULT: LazyLock<LockManager> = LazyLock::new(|| {
    let m = LockManager::builder().default_wait(Duration::from_secs(10)).memory();
    lock_runtime::set_default(m.clone());
    m
});

fn default_manager() -> &'static LockManager {
    &DEFAULT
}

async fn is_free(m: &LockManager, name: &str) -> bool {
    m.try_lock(name).await.expect("try_lock").is_some()
}

fn assert_send<T: Send>(_: &T) {}

// ---------------------------------------------------------------------------------------------
// Names

#[distributed_locked]
async fn default_named() -> Result<String, AppError> {
    Ok(lock_runtime::current().expect("inside").key().to_owned())
}

#[tokio::test]
async fn default_name_is_md5_of_module_path_and_fn_name() {
    default_manager();
    let key = default_named().await.expect("locked");
    assert_eq!(key, format!("{:x}", md5::compute("macro_behaviour::default_named")));
    // Computed once: a second call renders the same name.
    assert_eq!(default_named().await.expect("locked"), key);
}

struct Order {
    id: u64,
    customer: Customer,
}
struct Customer {
    region: &'static str,
}

#[distributed_locked(name = "order:{order.id}:{order.customer.region}:{n}{{x}}", manager = m)]
async fn templated(m: &LockManager, order: &Order, n: u32) -> Result<String, AppError> {
    Ok(lock_runtime::current().expect("inside").key().to_owned())
}

#[tokio::test]
async fn template_renders_params_and_nested_fields() {
    let m = LockManager::memory();
    let order = Order { id: 42, customer: Customer { region: "eu" } };
    assert_eq!(templated(&m, &order, 7).await.expect("locked"), "order:42:eu:7{x}");
}

// ---------------------------------------------------------------------------------------------
// wait, retry, lease, on_lost

#[distributed_locked(name = "busy:{id}", wait = "0s", manager = m)]
async fn try_once(m: &LockManager, id: u32) -> Result<u32, AppError> {
    Ok(id)
}

#[distributed_locked(name = "busy:{id}", wait = "1h", retry = 0, manager = m)]
async fn no_retry(m: &LockManager, id: u32) -> Result<u32, AppError> {
    Ok(id)
}

#[distributed_locked(name = "busy:{id}", wait = "10s", manager = m)]
async fn waits(m: &LockManager, id: u32) -> Result<u64, AppError> {
    Ok(lock_runtime::current().expect("inside").fencing_token())
}

#[tokio::test]
async fn wait_zero_tries_once_and_failure_comes_back_through_from() {
    let m = LockManager::memory();
    let held = m.lock("busy:1").await.expect("held");
    let err = try_once(&m, 1).await.expect_err("busy").0;
    assert!(err.is_contended(), "{err}");
    assert!(err.to_string().contains("busy:1"), "{err}");
    drop(held);
    assert_eq!(try_once(&m, 1).await.expect("free now"), 1);
}

#[tokio::test]
async fn retry_bounds_the_attempts_within_wait() {
    let m = LockManager::memory();
    let _held = m.lock("busy:2").await.expect("held");
    let err = tokio::time::timeout(BOUND, no_retry(&m, 2)).await.expect("no hour-long wait").expect_err("busy").0;
    assert!(err.is_contended(), "{err}");
    assert!(err.to_string().contains("after 1 attempt(s)"), "{err}");
}

#[tokio::test]
async fn wait_waits_for_the_holder_to_release() {
    let m = LockManager::memory();
    let held = m.lock("busy:3").await.expect("held");
    let first = held.fencing_token();
    let call = tokio::spawn({
        let m = m.clone();
        async move { waits(&m, 3).await }
    });
    held.release().await.expect("release");
    let token = tokio::time::timeout(BOUND, call).await.expect("in time").expect("task").expect("locked");
    assert!(token > first);
}

#[distributed_locked(name = "lease:{tag}", lease = "50ms", manager = m)]
async fn aborted_on_loss(m: &LockManager, tag: &str, started: oneshot::Sender<()>) -> Result<(), AppError> {
    let _ = started.send(());
    std::future::pending::<()>().await;
    Ok(())
}

#[distributed_locked(name = "lease:{tag}", lease = "50ms", on_lost = ignore, manager = m)]
async fn finishes_despite_loss(m: &LockManager, tag: &str) -> Result<&'static str, AppError> {
    // Outlive the fixed lease: the body is the work, not a synchronisation.
    tokio::time::sleep(Duration::from_millis(300)).await;
    Ok("finished")
}

#[tokio::test]
async fn on_lost_abort_stops_the_body_and_returns_the_lost_error() {
    let m = LockManager::memory();
    let (tx, rx) = oneshot::channel();
    let result = tokio::time::timeout(BOUND, aborted_on_loss(&m, "a", tx)).await.expect("aborted, not pending");
    assert!(rx.await.is_ok(), "the body ran");
    let err = result.expect_err("lost").0;
    assert!(err.is_lost(), "{err}");
    assert!(is_free(&m, "lease:a").await);
}

#[distributed_locked(name = "lease:{tag}", lease = "50ms", manager = m, fallback = not_taken)]
async fn fallback_and_result(m: &LockManager, tag: &str) -> Result<(), AppError> {
    std::future::pending::<()>().await;
    Ok(())
}
async fn not_taken(_m: &LockManager, _tag: &str) -> Result<(), AppError> {
    Ok(())
}

#[tokio::test]
async fn with_a_fallback_and_a_result_the_default_on_lost_is_abort() {
    let m = LockManager::memory();
    let result = tokio::time::timeout(BOUND, fallback_and_result(&m, "f")).await.expect("aborted, not pending");
    let err = result.expect_err("lost").0;
    assert!(err.is_lost(), "{err}");
}

#[tokio::test]
async fn on_lost_ignore_runs_to_the_end() {
    let m = LockManager::memory();
    assert_eq!(finishes_despite_loss(&m, "i").await.expect("ran to the end"), "finished");
    assert!(is_free(&m, "lease:i").await);
}

// ---------------------------------------------------------------------------------------------
// Reentrancy and current()

#[distributed_locked(name = "re:{id}", wait = "0s", manager = m)]
async fn inner(m: &LockManager, id: u32) -> Result<(String, u64), AppError> {
    let cur = lock_runtime::current().expect("inside");
    Ok((cur.key().to_owned(), cur.fencing_token()))
}

#[distributed_locked(name = "re:{id}", manager = m)]
async fn outer(m: &LockManager, id: u32, other_task: bool) -> Result<(u64, u64, bool), AppError> {
    let mine = lock_runtime::current().expect("inside").fencing_token();
    let (key, nested) = inner(m, id).await?; // same task, same name: enters at once
    assert_eq!(key, format!("re:{id}"));
    let still_held = lock_runtime::current().is_some();
    if other_task {
        // Another task is not the owner: it must not get in.
        let m2 = m.clone();
        let err = tokio::spawn(async move { inner(&m2, id).await }).await.expect("task").expect_err("busy").0;
        assert!(err.is_contended(), "{err}");
    }
    Ok((mine, nested, still_held))
}

#[tokio::test]
async fn reentrant_in_the_same_task_exclusive_across_tasks() {
    let m = LockManager::memory();
    let (mine, nested, still_held) = outer(&m, 1, true).await.expect("locked");
    assert_eq!(mine, nested, "the nested call re-entered the outer lock");
    assert!(still_held, "the nested call's end did not release the outer lock");
    assert!(is_free(&m, "re:1").await, "released when the outermost call ended");
    assert!(lock_runtime::current().is_none());
}

#[distributed_locked(name = "cur:b", manager = m)]
async fn current_b(m: &LockManager) -> Result<String, AppError> {
    Ok(lock_runtime::current().expect("inside").key().to_owned())
}

#[distributed_locked(name = "cur:a", manager = m)]
async fn current_a(m: &LockManager) -> Result<(String, String, String), AppError> {
    let before = lock_runtime::current().expect("inside").key().to_owned();
    let nested = current_b(m).await?;
    let after = lock_runtime::current().expect("inside").key().to_owned();
    Ok((before, nested, after))
}

#[tokio::test]
async fn current_is_the_innermost_lock_and_none_outside() {
    let m = LockManager::memory();
    assert!(lock_runtime::current().is_none());
    let (before, nested, after) = current_a(&m).await.expect("locked");
    assert_eq!((before.as_str(), nested.as_str(), after.as_str()), ("cur:a", "cur:b", "cur:a"));
    assert!(lock_runtime::current().is_none());
}

#[distributed_locked(name = "cur:paused", manager = m)]
async fn paused(m: &LockManager, go: oneshot::Receiver<()>, entered: oneshot::Sender<()>) -> Result<String, AppError> {
    let _ = entered.send(());
    go.await.expect("go");
    Ok(lock_runtime::current().expect("inside, after the pause").key().to_owned())
}

#[tokio::test(flavor = "current_thread")]
async fn current_belongs_to_the_task_not_the_thread() {
    // Both tasks run on this one thread: the paused locked call's frame must not show in the
    // other task, and must be back when the locked call resumes.
    let m = LockManager::memory();
    let (go_tx, go_rx) = oneshot::channel();
    let (entered_tx, entered_rx) = oneshot::channel();
    let m2 = m.clone();
    let locked = tokio::spawn(async move { paused(&m2, go_rx, entered_tx).await.expect("locked") });
    entered_rx.await.expect("entered");
    assert!(lock_runtime::current().is_none(), "another task's lock is not ours");
    let other = tokio::spawn(async { lock_runtime::current().map(|c| c.key().to_owned()) });
    assert_eq!(other.await.expect("task"), None);
    go_tx.send(()).expect("send");
    assert_eq!(locked.await.expect("task"), "cur:paused");
    assert!(lock_runtime::current().is_none());
}

#[tokio::test(flavor = "current_thread")]
async fn a_panicking_body_leaves_no_context_behind() {
    let m = LockManager::memory();
    let m2 = m.clone();
    let joined = tokio::spawn(async move { exits(&m2, "panic").await }).await;
    assert!(joined.expect_err("panicked").is_panic());
    // Same thread: the panic unwound through the poll that had installed the frame.
    assert!(lock_runtime::current().is_none());
    let seen = tokio::spawn(async { lock_runtime::current().is_none() }).await.expect("task");
    assert!(seen, "a later task on the thread sees no lock");
}

/// Records what `current()` says when it is dropped.
struct SeesOnDrop(Option<oneshot::Sender<Option<String>>>);

impl Drop for SeesOnDrop {
    fn drop(&mut self) {
        if let Some(tx) = self.0.take() {
            let _ = tx.send(lock_runtime::current().map(|c| c.key().to_owned()));
        }
    }
}

#[distributed_locked(name = "cur:dropped", manager = m)]
async fn dropped_in_context(m: &LockManager, probe: SeesOnDrop, entered: oneshot::Sender<()>) -> Result<(), AppError> {
    let _probe = probe;
    let _ = entered.send(());
    std::future::pending::<()>().await;
    Ok(())
}

#[tokio::test]
async fn a_cancelled_body_is_dropped_in_its_context() {
    let m = LockManager::memory();
    let (seen_tx, seen_rx) = oneshot::channel();
    let (entered_tx, entered_rx) = oneshot::channel();
    let m2 = m.clone();
    let task = tokio::spawn(async move { dropped_in_context(&m2, SeesOnDrop(Some(seen_tx)), entered_tx).await });
    entered_rx.await.expect("entered");
    task.abort();
    assert!(task.await.expect_err("aborted").is_cancelled());
    assert_eq!(seen_rx.await.expect("dropped").as_deref(), Some("cur:dropped"));
    assert!(is_free(&m, "cur:dropped").await);
}

// ---------------------------------------------------------------------------------------------
// Release on every exit

#[distributed_locked(name = "exit:{how}", manager = m)]
async fn exits(m: &LockManager, how: &str) -> Result<u32, AppError> {
    if how == "return" {
        return Ok(1);
    }
    if how == "question" {
        let parsed: u32 = "x".parse().map_err(|_| AppError(LockError::invalid("x", "not a number")))?;
        return Ok(parsed);
    }
    if how == "panic" {
        panic!("boom");
    }
    Ok(0)
}

#[tokio::test]
async fn released_on_return_and_question_mark() {
    let m = LockManager::memory();
    assert_eq!(exits(&m, "return").await.expect("ok"), 1);
    assert!(is_free(&m, "exit:return").await);
    assert!(exits(&m, "question").await.is_err());
    assert!(is_free(&m, "exit:question").await);
}

#[tokio::test]
async fn released_on_panic() {
    let m = LockManager::memory();
    let m2 = m.clone();
    let joined = tokio::spawn(async move { exits(&m2, "panic").await }).await;
    assert!(joined.expect_err("panicked").is_panic());
    let again = tokio::time::timeout(BOUND, m.lock("exit:panic").wait(BOUND)).await.expect("in time");
    assert!(again.is_ok(), "the panicking call released its lock");
}

#[distributed_locked(name = "cancel", manager = m)]
async fn cancelled(m: &LockManager, entered: oneshot::Sender<()>) -> Result<(), AppError> {
    let _ = entered.send(());
    std::future::pending::<()>().await;
    Ok(())
}

#[tokio::test]
async fn released_on_cancellation() {
    let m = LockManager::memory();
    let (tx, rx) = oneshot::channel();
    let m2 = m.clone();
    let task = tokio::spawn(async move { cancelled(&m2, tx).await });
    rx.await.expect("entered");
    assert!(!is_free(&m, "cancel").await, "held while the body runs");
    task.abort();
    assert!(task.await.expect_err("aborted").is_cancelled());
    let again = tokio::time::timeout(BOUND, m.lock("cancel").wait(BOUND)).await.expect("in time");
    assert!(again.is_ok(), "the cancelled call released its lock");
}

// ---------------------------------------------------------------------------------------------
// Same name serialises, different names run in parallel

#[distributed_locked(name = "ser:{name}", wait = "20s", manager = m)]
async fn serial(
    m: &LockManager,
    name: &str,
    inside: &AtomicBool,
    entered: oneshot::Sender<()>,
    go: oneshot::Receiver<()>,
) -> Result<(), AppError> {
    assert!(!inside.swap(true, Ordering::SeqCst), "two calls inside the same lock at once");
    let _ = entered.send(());
    let _ = go.await;
    inside.store(false, Ordering::SeqCst);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn same_name_serialises() {
    let m = LockManager::memory();
    let inside = Arc::new(AtomicBool::new(false));
    let (a_in, a_entered) = oneshot::channel();
    let (a_go, a_wait) = oneshot::channel();
    let a = tokio::spawn({
        let (m, inside) = (m.clone(), inside.clone());
        async move { serial(&m, "x", &inside, a_in, a_wait).await }
    });
    a_entered.await.expect("a entered");
    let (b_in, b_entered) = oneshot::channel();
    let (b_go, b_wait) = oneshot::channel();
    let b = tokio::spawn({
        let (m, inside) = (m.clone(), inside.clone());
        async move { serial(&m, "x", &inside, b_in, b_wait).await }
    });
    assert!(!is_free(&m, "ser:x").await, "a holds it");
    a_go.send(()).expect("a waiting");
    tokio::time::timeout(BOUND, b_entered).await.expect("b entered after a").expect("b entered");
    b_go.send(()).expect("b waiting");
    a.await.expect("a").expect("a locked");
    b.await.expect("b").expect("b locked");
}

#[distributed_locked(name = "par:{name}", wait = "0s", manager = m)]
async fn parallel(m: &LockManager, name: &str, meet: &Barrier) -> Result<(), AppError> {
    meet.wait().await; // both must be inside at once to pass
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn different_names_run_in_parallel() {
    let m = LockManager::memory();
    let meet = Arc::new(Barrier::new(2));
    let calls = ["p", "q"].map(|name| {
        let (m, meet) = (m.clone(), meet.clone());
        tokio::spawn(async move { parallel(&m, name, &meet).await })
    });
    for call in calls {
        tokio::time::timeout(BOUND, call).await.expect("both inside at once").expect("task").expect("locked");
    }
}

// ---------------------------------------------------------------------------------------------
// Methods, fallbacks, generics, patterns

static METHODS: LazyLock<LockManager> = LazyLock::new(LockManager::memory);

struct Service {
    shard: u32,
    calls: AtomicU32,
    locks: LockManager,
}

impl Service {
    #[distributed_locked(name = "svc:{self.shard}:{id}", wait = "0s", manager = &self.locks, fallback = Self::busy)]
    async fn by_ref(&self, id: u32) -> u32 {
        self.calls.fetch_add(1, Ordering::SeqCst);
        id
    }
    async fn busy(&self, id: u32) -> u32 {
        id + 1000
    }

    #[distributed_locked(name = "svc-mut:{id}", wait = "0s", manager = &*METHODS, fallback = busy_mut)]
    async fn by_mut(&mut self, id: u32) -> Result<u32, AppError> {
        self.shard += 1;
        Ok(self.shard)
    }
    async fn busy_mut(&mut self, id: u32) -> Result<u32, AppError> {
        Ok(id + 2000)
    }

    #[distributed_locked(name = "svc-arc:{self.shard}", wait = "0s", manager = METHODS.clone())]
    async fn by_arc(self: Arc<Self>, n: u32) -> Result<u32, AppError> {
        Ok(self.shard * n)
    }

    #[distributed_locked(name = "svc-lease:{self.shard}", lease = "50ms", manager = &self.locks, fallback = Self::busy)]
    async fn outlives_lease(&self, id: u32) -> u32 {
        tokio::time::sleep(Duration::from_millis(300)).await; // the work outlives the lease
        id
    }
}

#[tokio::test]
async fn methods_with_ref_mut_and_arc_receivers_and_method_fallbacks() {
    let locks = LockManager::memory();
    let svc = Service { shard: 3, calls: AtomicU32::new(0), locks: locks.clone() };
    assert_eq!(svc.by_ref(5).await, 5);
    let held = locks.lock("svc:3:5").await.expect("held");
    assert_eq!(svc.by_ref(5).await, 1005, "`Self::busy` called with the same arguments");
    drop(held);
    assert_eq!(svc.calls.load(Ordering::SeqCst), 1);

    let mut svc = svc;
    assert_eq!(svc.by_mut(9).await.expect("locked"), 4);
    let held = METHODS.lock("svc-mut:9").await.expect("held");
    assert_eq!(svc.by_mut(9).await.expect("fallback"), 2009, "bare method name resolves to `Self::busy_mut`");
    drop(held);

    let svc = Arc::new(svc);
    assert_eq!(svc.clone().by_arc(2).await.expect("locked"), 8);
    let _held = METHODS.lock("svc-arc:4").await.expect("held");
    assert!(svc.clone().by_arc(2).await.expect_err("busy").0.is_contended());
}

#[tokio::test]
async fn fallback_fn_whose_return_cannot_carry_the_error_runs_to_the_end_on_loss() {
    let locks = LockManager::memory();
    let svc = Service { shard: 8, calls: AtomicU32::new(0), locks: locks.clone() };
    assert_eq!(svc.outlives_lease(6).await, 6, "default on_lost with a `u32` return: ran to the end");
    assert!(is_free(&locks, "svc-lease:8").await);
}

#[distributed_locked(name = "gen:{item}:{tag}", wait = "0s", manager = m, fallback = generic_busy)]
async fn generic<T: Display + Send + Sync, U>(m: &LockManager, item: T, tag: U) -> Result<String, AppError>
where
    U: Display + Send,
{
    Ok(format!("{item}/{tag}:{}", lock_runtime::current().expect("inside").key()))
}
async fn generic_busy<T: Display + Send + Sync, U: Display + Send>(
    _m: &LockManager,
    item: T,
    tag: U,
) -> Result<String, AppError> {
    Ok(format!("busy {item}/{tag}"))
}

#[tokio::test]
async fn generic_fns() {
    let m = LockManager::memory();
    assert_eq!(generic(&m, 1.5, "t").await.expect("locked"), "1.5/t:gen:1.5:t");
    let _held = m.lock("gen:x:7").await.expect("held");
    assert_eq!(generic(&m, "x", 7u8).await.expect("fallback"), "busy x/7");
}

#[derive(Debug, PartialEq)]
struct Wrap(u32);

#[derive(Debug, PartialEq)]
struct Named {
    key: String,
    n: u32,
}

#[distributed_locked(name = "pat:{a}:{w}:{key}", wait = "0s", manager = m, fallback = patterns_busy)]
async fn patterns(
    m: &LockManager,
    (a, b): (u32, u32),
    Wrap(w): Wrap,
    Named { key, n }: Named,
    mut count: u32,
) -> Result<(u32, String), AppError> {
    count += a + b + w + n;
    Ok((count, format!("{key}@{}", lock_runtime::current().expect("inside").key())))
}
async fn patterns_busy(
    _m: &LockManager,
    pair: (u32, u32),
    wrap: Wrap,
    named: Named,
    count: u32,
) -> Result<(u32, String), AppError> {
    Ok((count + pair.0 + pair.1 + wrap.0 + named.n, format!("busy {}", named.key)))
}

#[tokio::test]
async fn pattern_parameters_in_templates_body_and_fallback() {
    let m = LockManager::memory();
    let named = || Named { key: "k".to_owned(), n: 4 };
    assert_eq!(patterns(&m, (1, 2), Wrap(3), named(), 10).await.expect("locked"), (20, "k@pat:1:3:k".to_owned()));
    let _held = m.lock("pat:1:3:k").await.expect("held");
    assert_eq!(
        patterns(&m, (1, 2), Wrap(3), named(), 10).await.expect("fallback"),
        (20, "busy k".to_owned()),
        "the fallback got the same (whole) arguments"
    );
}

// ---------------------------------------------------------------------------------------------
// manager = .., Send

fn shared() -> LockManager {
    static SHARED: LazyLock<LockManager> = LazyLock::new(LockManager::memory);
    SHARED.clone()
}

#[distributed_locked(name = "shared", wait = "0s", manager = shared())]
async fn on_shared() -> Result<(), AppError> {
    Ok(())
}

#[tokio::test]
async fn manager_expression_is_used_instead_of_the_default() {
    on_shared().await.expect("free");
    let _held = shared().lock("shared").await.expect("held");
    assert!(on_shared().await.expect_err("busy on that manager").0.is_contended());
    // The default manager is not involved.
    assert!(default_manager().try_lock("shared").await.expect("try").is_some());
}

#[test]
fn locked_futures_are_send() {
    let m = LockManager::memory();
    let order = Order { id: 1, customer: Customer { region: "eu" } };
    let svc = Service { shard: 1, calls: AtomicU32::new(0), locks: m.clone() };
    let inside = AtomicBool::new(false);
    let meet = Barrier::new(1);
    let (tx, _rx) = oneshot::channel();
    let (_tx2, rx2) = oneshot::channel();
    assert_send(&default_named());
    assert_send(&templated(&m, &order, 1));
    assert_send(&outer(&m, 1, false));
    assert_send(&serial(&m, "s", &inside, tx, rx2));
    assert_send(&parallel(&m, "p", &meet));
    assert_send(&svc.by_ref(1));
    assert_send(&Arc::new(Service { shard: 1, calls: AtomicU32::new(0), locks: m.clone() }).by_arc(1));
    assert_send(&generic(&m, 1, 2));
    assert_send(&patterns(&m, (1, 2), Wrap(3), Named { key: String::new(), n: 1 }, 0));
    assert_send(&on_shared());
}

// ---------------------------------------------------------------------------------------------
// A backend whose release must be awaited (as a networked one's)

/// The in-memory backend without its synchronous fast paths, and with a release that yields
/// once before releasing: the locked call takes the path of a networked backend.
struct Awaited {
    inner: lock_runtime::backend::memory::MemoryBackend,
    releases: Arc<AtomicU32>,
}

use lock_runtime::backend::{Acquire, Acquisition, Attempt, BoxFuture, Grant, Held, HeldLock, LockBackend, Wake};

impl LockBackend for Awaited {
    fn name(&self) -> &'static str {
        "awaited-memory"
    }

    fn begin(&self, req: Acquire, lost: lock_runtime::LostSignal) -> Box<dyn Acquisition> {
        Box::new(AwaitedAcquisition { inner: self.inner.begin(req, lost), releases: self.releases.clone() })
    }
}

struct AwaitedAcquisition {
    inner: Box<dyn Acquisition>,
    releases: Arc<AtomicU32>,
}

impl AwaitedAcquisition {
    fn wrap(&self, grant: Grant) -> Grant {
        let lock = Held::new(AwaitedHeld { inner: grant.lock, releases: self.releases.clone() });
        Grant { lock, ..grant }
    }
}

impl Acquisition for AwaitedAcquisition {
    fn attempt(&mut self) -> BoxFuture<'_, Result<Attempt, LockError>> {
        Box::pin(async move {
            Ok(match self.inner.attempt().await? {
                Attempt::Acquired(grant) => Attempt::Acquired(self.wrap(grant)),
                refused => refused,
            })
        })
    }

    fn wait(&mut self, deadline: std::time::Instant) -> BoxFuture<'_, Result<Wake, LockError>> {
        Box::pin(async move {
            Ok(match self.inner.wait(deadline).await? {
                Wake::Acquired(grant) => Wake::Acquired(self.wrap(grant)),
                other => other,
            })
        })
    }
}

struct AwaitedHeld {
    inner: Held,
    releases: Arc<AtomicU32>,
}

impl HeldLock for AwaitedHeld {
    fn release(&mut self) -> BoxFuture<'_, Result<(), LockError>> {
        Box::pin(async move {
            tokio::task::yield_now().await;
            self.releases.fetch_add(1, Ordering::SeqCst);
            self.inner.release().await
        })
    }
}

#[distributed_locked(name = "awaited:{id}", manager = m)]
async fn on_awaited(m: &LockManager, id: u32) -> Result<(u32, String), AppError> {
    tokio::task::yield_now().await;
    Ok((id, lock_runtime::current().expect("inside").key().to_owned()))
}

#[tokio::test]
async fn a_release_that_must_be_awaited_is_awaited_before_returning() {
    let backend =
        Arc::new(Awaited { inner: lock_runtime::backend::memory::MemoryBackend::new(), releases: Arc::default() });
    let m = LockManager::builder().backend_arc(backend.clone());
    assert_eq!(on_awaited(&m, 7).await.expect("locked"), (7, "awaited:7".to_owned()));
    assert_eq!(backend.releases.load(Ordering::SeqCst), 1, "released before the call returned");
    assert!(m.try_lock("awaited:7").await.expect("try_lock").is_some(), "free again");
}

// --- Scheduled jobs: `skip_if_locked` and `hold_at_least`.

#[distributed_locked(name = "job:{tag}", skip_if_locked, manager = m)]
async fn skipped_unit(m: &LockManager, tag: &str, runs: &AtomicU32) {
    runs.fetch_add(1, Ordering::SeqCst);
}

#[distributed_locked(name = "job:{tag}", skip_if_locked, manager = m)]
async fn skipped_result(m: &LockManager, tag: &str, runs: &AtomicU32) -> Result<u32, AppError> {
    Ok(runs.fetch_add(1, Ordering::SeqCst) + 1)
}

#[distributed_locked(name = "job:{tag}", skip_if_locked, hold_at_least = "400ms", manager = m)]
async fn held_at_least(m: &LockManager, tag: &str, runs: &AtomicU32) -> Option<u32> {
    Some(runs.fetch_add(1, Ordering::SeqCst) + 1)
}

#[tokio::test]
async fn skip_if_locked_on_a_unit_fn_skips_at_once_when_held_elsewhere() {
    // A manager that would wait 10 s: `skip_if_locked` makes one attempt.
    let m = LockManager::builder().default_wait(Duration::from_secs(10)).memory();
    let runs = AtomicU32::new(0);
    skipped_unit(&m, "unit", &runs).await;
    assert_eq!(runs.load(Ordering::SeqCst), 1, "runs when the lock is free");
    let held = m.lock("job:unit").await.expect("held elsewhere");
    let started = std::time::Instant::now();
    skipped_unit(&m, "unit", &runs).await;
    assert_eq!(runs.load(Ordering::SeqCst), 1, "skipped while held elsewhere");
    assert!(started.elapsed() < Duration::from_secs(2), "did not wait: {:?}", started.elapsed());
    held.release().await.expect("release");
    skipped_unit(&m, "unit", &runs).await;
    assert_eq!(runs.load(Ordering::SeqCst), 2);
    // A failure other than "held" is not a skip in disguise for a Result (below); a unit fn
    // logs it and does not run.
    skipped_unit(&m, "bad\tname", &runs).await;
    assert_eq!(runs.load(Ordering::SeqCst), 2, "not run without its lock");
}

#[tokio::test]
async fn skip_if_locked_on_a_result_returns_ok_default_and_carries_other_errors() {
    let m = LockManager::builder().default_wait(Duration::from_secs(10)).memory();
    let runs = AtomicU32::new(0);
    assert_eq!(skipped_result(&m, "res", &runs).await.expect("ran"), 1);
    let held = m.lock("job:res").await.expect("held elsewhere");
    assert_eq!(skipped_result(&m, "res", &runs).await.expect("skipped"), 0, "Ok(Default::default())");
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    held.release().await.expect("release");
    // An invalid name is an error, returned (not skipped).
    let err = skipped_result(&m, "bad\tname", &runs).await.expect_err("the error is returned");
    assert!(err.0.is_invalid(), "{:?}", err.0);
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn hold_at_least_skips_a_second_run_until_it_has_passed() {
    let m = LockManager::memory();
    let runs = AtomicU32::new(0);
    let started = std::time::Instant::now();
    assert_eq!(held_at_least(&m, "hold", &runs).await, Some(1));
    assert_eq!(held_at_least(&m, "hold", &runs).await, None, "the first run's hold keeps the name taken");
    assert!(!is_free(&m, "job:hold").await || started.elapsed() >= Duration::from_millis(400));
    tokio::time::sleep(Duration::from_millis(450).saturating_sub(started.elapsed())).await;
    assert_eq!(held_at_least(&m, "hold", &runs).await, Some(2), "runs again once the hold is over");
}

/// Calls of the `leader` fn below, and the fencing tokens their terms saw.
static LEADER_CALLS: AtomicU32 = AtomicU32::new(0);
static LEADER_TOKENS: std::sync::Mutex<Vec<u64>> = std::sync::Mutex::new(Vec::new());

/// A singleton worker whose terms last 300 ms: its first body never ends (stopped by the
/// loss), the second returns at once.
#[distributed_locked(name = "leader:{shard}", leader, lease = "300ms", manager = m)]
async fn lead_shard(m: &LockManager, shard: u32, tag: String) -> Result<String, AppError> {
    let term = lock_runtime::current().expect("inside the term");
    assert_eq!(term.key(), format!("leader:{shard}"));
    LEADER_TOKENS.lock().unwrap().push(term.fencing_token());
    if LEADER_CALLS.fetch_add(1, Ordering::SeqCst) == 0 {
        std::future::pending::<()>().await;
    }
    Ok(format!("{shard}:{tag}"))
}

/// `leader`: the fn runs as the leader of the election `name`; when leadership is lost (here
/// the fixed term lease runs out) its body is stopped, it campaigns again and runs the body
/// anew with the same arguments under a term with a higher token, returning that output; the
/// term ends with the call (resigned), and nobody leads afterwards.
#[tokio::test]
async fn leader_runs_again_after_a_loss_with_the_same_arguments() {
    let m = LockManager::memory();
    let out = tokio::time::timeout(BOUND, lead_shard(&m, 7, "x".to_owned())).await.expect("in time").expect("led");
    assert_eq!(out, "7:x");
    assert_eq!(LEADER_CALLS.load(Ordering::SeqCst), 2);
    let tokens = LEADER_TOKENS.lock().unwrap().clone();
    assert!(tokens[1] > tokens[0], "{tokens:?}");
    let election = m.election("leader:7");
    let mut watch = election.observe();
    while tokio::time::timeout(BOUND, watch.changed()).await.expect("in time").expect("watch").is_some() {}
}

#[distributed_locked(name = "leader-default", leader)]
async fn lead_default() -> Result<u64, AppError> {
    Ok(lock_runtime::current().expect("term").fencing_token())
}

/// Without a `manager`, a `leader` fn campaigns on the default one.
#[tokio::test]
async fn leader_uses_the_default_manager() {
    let m = default_manager();
    let held = m.lock("leader-default").await.expect("held first");
    let call = tokio::spawn(lead_default());
    tokio::task::yield_now().await;
    let token = held.fencing_token();
    held.release().await.expect("release");
    let led = tokio::time::timeout(BOUND, call).await.expect("in time").expect("task").expect("led");
    assert!(led > token);
}
