//! Telemetry: the `lock.acquire` and `lock.hold` spans under the Axum example's handler spans
//! (driven over real HTTP), a locked body inside `lock.hold`, names kept out of spans and
//! events, the levels of the happy path and of a lost lock, and (feature `metrics`) the
//! metrics scraped from the Axum example's `/metrics` over HTTP.
//!
//! One capturing `tracing` subscriber is installed for the whole binary (the handlers run on
//! the runtime's workers); each test picks out its own records by its own lock names or by a
//! root span of its own.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use examples::orders::{AppState, Simulated};
use lock_runtime::testing::TestBackend;
use lock_runtime::{distributed_locked, LockError, LockManager, TelemetryNames};
use lock_tests::http::{post_json, Response};
use tracing::Instrument;

/// The capturing subscriber: every span (name, parent, fields) and event (level, parent,
/// fields), parents resolved as `tracing` defines them (explicit, else the thread's current
/// span).
mod capture {
    use std::cell::RefCell;
    use std::collections::BTreeMap;
    use std::fmt;
    use std::sync::{Mutex, Once, PoisonError};

    use tracing::field::{Field, Visit};
    use tracing::level_filters::LevelFilter;
    use tracing::span::{Attributes, Id, Record};
    use tracing::{Event, Level, Metadata, Subscriber};

    /// A span as recorded.
    #[derive(Debug, Clone)]
    pub(crate) struct SpanRec {
        pub(crate) id: u64,
        pub(crate) name: &'static str,
        pub(crate) parent: Option<u64>,
        pub(crate) fields: BTreeMap<String, String>,
    }

    /// An event as recorded.
    #[derive(Debug, Clone)]
    pub(crate) struct EventRec {
        pub(crate) level: Level,
        pub(crate) target: &'static str,
        pub(crate) parent: Option<u64>,
        pub(crate) fields: BTreeMap<String, String>,
    }

    struct Records {
        spans: Vec<SpanRec>,
        events: Vec<EventRec>,
    }

    static RECORDS: Mutex<Records> = Mutex::new(Records { spans: Vec::new(), events: Vec::new() });

    thread_local! {
        static ENTERED: RefCell<Vec<u64>> = const { RefCell::new(Vec::new()) };
    }

    fn records() -> std::sync::MutexGuard<'static, Records> {
        RECORDS.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn current() -> Option<u64> {
        ENTERED.with(|e| e.borrow().last().copied())
    }

    struct Fields<'a>(&'a mut BTreeMap<String, String>);

    impl Visit for Fields<'_> {
        fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
            self.0.insert(field.name().to_owned(), format!("{value:?}"));
        }
        fn record_str(&mut self, field: &Field, value: &str) {
            self.0.insert(field.name().to_owned(), value.to_owned());
        }
    }

    struct Capture;

    impl Subscriber for Capture {
        fn enabled(&self, _: &Metadata<'_>) -> bool {
            true
        }
        fn max_level_hint(&self) -> Option<LevelFilter> {
            Some(LevelFilter::TRACE)
        }
        fn new_span(&self, attrs: &Attributes<'_>) -> Id {
            let parent = attrs.parent().map(Id::into_u64).or_else(|| attrs.is_contextual().then(current).flatten());
            let mut fields = BTreeMap::new();
            attrs.record(&mut Fields(&mut fields));
            let mut records = records();
            let id = records.spans.len() as u64 + 1;
            records.spans.push(SpanRec { id, name: attrs.metadata().name(), parent, fields });
            Id::from_u64(id)
        }
        fn record(&self, span: &Id, values: &Record<'_>) {
            let mut records = records();
            if let Some(rec) = records.spans.get_mut(span.into_u64() as usize - 1) {
                values.record(&mut Fields(&mut rec.fields));
            }
        }
        fn record_follows_from(&self, _: &Id, _: &Id) {}
        fn event(&self, event: &Event<'_>) {
            let parent = event.parent().map(Id::into_u64).or_else(|| event.is_contextual().then(current).flatten());
            let mut fields = BTreeMap::new();
            event.record(&mut Fields(&mut fields));
            records().events.push(EventRec {
                level: *event.metadata().level(),
                target: event.metadata().target(),
                parent,
                fields,
            });
        }
        fn enter(&self, span: &Id) {
            ENTERED.with(|e| e.borrow_mut().push(span.into_u64()));
        }
        fn exit(&self, span: &Id) {
            ENTERED.with(|e| {
                let mut e = e.borrow_mut();
                if let Some(i) = e.iter().rposition(|&id| id == span.into_u64()) {
                    e.remove(i);
                }
            });
        }
    }

    /// Installs the capturing subscriber as the global default (once).
    pub(crate) fn install() {
        static ONCE: Once = Once::new();
        ONCE.call_once(|| tracing::subscriber::set_global_default(Capture).expect("no other global subscriber"));
    }

    /// Everything recorded so far.
    pub(crate) fn snapshot() -> (Vec<SpanRec>, Vec<EventRec>) {
        let records = records();
        (records.spans.clone(), records.events.clone())
    }
}

use capture::{EventRec, SpanRec};

/// The spans named `name` whose parent is `parent`.
fn children<'a>(spans: &'a [SpanRec], parent: u64, name: &str) -> Vec<&'a SpanRec> {
    spans.iter().filter(|s| s.parent == Some(parent) && s.name == name).collect()
}

/// Whether `id` is `root` or below it.
fn under(spans: &[SpanRec], mut id: Option<u64>, root: u64) -> bool {
    while let Some(i) = id {
        if i == root {
            return true;
        }
        id = spans.get(i as usize - 1).and_then(|s| s.parent);
    }
    false
}

/// The one span named `name` with field `key` = `value`.
fn the_span<'a>(spans: &'a [SpanRec], name: &str, key: &str, value: &str) -> &'a SpanRec {
    let found: Vec<_> =
        spans.iter().filter(|s| s.name == name && s.fields.get(key).map(String::as_str) == Some(value)).collect();
    assert_eq!(found.len(), 1, "one `{name}` span with {key} = {value}: {found:#?}");
    found[0]
}

/// A root span of a test's own, and its id once it has been entered.
fn root(test: &'static str) -> tracing::Span {
    tracing::info_span!("test", test)
}

fn root_id(spans: &[SpanRec], test: &str) -> u64 {
    the_span(spans, "test", "test", test).id
}

/// A running Axum orders app; stopped when dropped.
struct App {
    addr: SocketAddr,
    task: tokio::task::JoinHandle<std::io::Result<()>>,
}

impl Drop for App {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn start(state: AppState) -> App {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    App { addr, task: tokio::spawn(examples::orders_axum::serve(listener, state)) }
}

async fn pay(addr: SocketAddr, id: u64) -> Response {
    post_json(addr, &format!("/orders/{id}/pay"), r#"{"amount_cents":1250}"#).await
}

async fn reserve(addr: SocketAddr, sku: &str) -> Response {
    post_json(addr, "/stock/reserve", &format!(r#"{{"sku":"{sku}","quantity":1}}"#)).await
}

/// A request through the Axum example (its `request` span, as a framework's trace layer makes
/// one): `lock.acquire` and `lock.hold` are children of the span current when the lock is
/// taken, and carry the name, the backend, the outcome and the fencing token; the handler's
/// `#[tracing::instrument]` span (above `#[distributed_locked]`, as the example has it, so
/// entered once the lock is held) is a child of `lock.hold`. A contended request's
/// `lock.acquire` says so, and has no hold and no handler span.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lock_spans_nest_in_the_axum_request_and_the_handlers_span_in_lock_hold() {
    capture::install();
    let locks = LockManager::builder().default_wait(Duration::from_millis(50)).memory();
    let state = AppState::new(locks.clone(), Arc::new(Simulated { latency: Duration::ZERO }));
    let app = start(state).await;

    assert_eq!(pay(app.addr, 7101).await.status, 200);
    let busy = locks.lock("stock:trace-sku").await.expect("held by the test");
    assert_eq!(reserve(app.addr, "trace-sku").await.status, 423);
    busy.release().await.expect("release");

    let (spans, _) = capture::snapshot();
    let request = the_span(&spans, "request", "path", "/orders/7101/pay");
    let acquire = children(&spans, request.id, "lock.acquire");
    let hold = children(&spans, request.id, "lock.hold");
    assert_eq!((acquire.len(), hold.len()), (1, 1), "under the request's span: {spans:#?}");
    let (hold_id, acquire, hold) = (hold[0].id, &acquire[0].fields, &hold[0].fields);
    for (key, value) in [("lock", "order:7101"), ("backend", "memory"), ("outcome", "acquired"), ("attempts", "1")] {
        assert_eq!(acquire.get(key).map(String::as_str), Some(value), "{key} of lock.acquire: {acquire:?}");
    }
    assert_eq!(acquire.get("lease").map(String::as_str), Some("renewed"));
    assert_eq!(acquire.get("wait_ms").map(String::as_str), Some("0"), "pay takes its lock with wait = 0s");
    let token = acquire.get("fencing_token").expect("lock.acquire has the fencing token once granted");
    assert!(token.parse::<u64>().is_ok_and(|t| t > 0), "{token}");
    assert_eq!(hold.get("lock").map(String::as_str), Some("order:7101"));
    assert_eq!(hold.get("backend").map(String::as_str), Some("memory"));
    assert_eq!(hold.get("fencing_token"), Some(token), "lock.hold has the token it was granted with");
    let handler = the_span(&spans, "pay", "order_id", "7101");
    assert_eq!(handler.parent, Some(hold_id), "the handler's span is in lock.hold");

    let contended: Vec<_> = spans
        .iter()
        .filter(|s| s.name == "lock.acquire" && s.fields.get("lock").is_some_and(|l| l == "stock:trace-sku"))
        .filter(|s| s.parent.is_some_and(|p| spans[p as usize - 1].name == "request"))
        .collect();
    assert_eq!(contended.len(), 1, "{spans:#?}");
    let (request, acquire) = (contended[0].parent.expect("parent"), &contended[0].fields);
    assert_eq!(acquire.get("outcome").map(String::as_str), Some("contended"));
    assert_eq!(acquire.get("wait_ms").map(String::as_str), Some("50"));
    assert!(!acquire.contains_key("fencing_token"), "not granted: no token");
    assert!(children(&spans, request, "lock.hold").is_empty(), "not granted: no hold");
    assert!(!spans.iter().any(|s| s.name == "reserve" && s.fields.get("sku").is_some_and(|k| k == "trace-sku")));
}

#[distributed_locked(name = "trace:attr", manager = manager)]
async fn locked_work(manager: &LockManager) -> Result<(), LockError> {
    tracing::debug!(marker = "attribute body", "working");
    Ok(())
}

/// The body of `LockRequest::run` and of a locked fn runs inside `lock.hold`, which is a child
/// of the caller's span (as `lock.acquire` is).
#[tokio::test]
async fn a_locked_body_runs_inside_lock_hold() {
    capture::install();
    let manager = LockManager::memory();
    async {
        manager.lock("trace:run").run(async { tracing::debug!(marker = "run body", "working") }).await.expect("run");
        locked_work(&manager).await.expect("locked fn");
    }
    .instrument(root("locked body"))
    .await;

    let (spans, events) = capture::snapshot();
    let root = root_id(&spans, "locked body");
    for (marker, lock) in [("run body", "trace:run"), ("attribute body", "trace:attr")] {
        let event = events
            .iter()
            .find(|e| e.fields.get("marker").map(String::as_str) == Some(marker))
            .unwrap_or_else(|| panic!("the {marker} event"));
        let hold = &spans[event.parent.expect("in a span") as usize - 1];
        assert_eq!(hold.name, "lock.hold", "the {marker} runs in lock.hold");
        assert_eq!(hold.fields.get("lock").map(String::as_str), Some(lock));
        assert_eq!(hold.parent, Some(root), "lock.hold is a child of the caller's span");
        let acquire = children(&spans, root, "lock.acquire");
        assert!(acquire.iter().any(|s| s.fields.get("lock").map(String::as_str) == Some(lock)), "{acquire:#?}");
    }
}

#[distributed_locked(name = "{name}", wait = "0s", manager = manager, fallback = not_now)]
async fn guarded(manager: &LockManager, name: &str) -> &'static str {
    "ran"
}

async fn not_now(_: &LockManager, _: &str) -> &'static str {
    "fallback"
}

#[distributed_locked(name = "{name}", manager = manager, skip_if_locked)]
async fn nightly(manager: &LockManager, name: &str) -> u32 {
    1
}

/// A `skip_if_locked` call that finds its lock held logs one debug event under the crate's
/// target (`lock_runtime`, not its private module's path), naming the lock and the skip, with
/// none of the error's advice (raise `wait`, give a `fallback`), which that mode refuses.
#[tokio::test]
async fn a_skipped_call_logs_under_the_crates_target_without_advice() {
    capture::install();
    let backend = TestBackend::new();
    let manager = LockManager::builder().backend(backend.clone());
    let test = "skipped call";
    async {
        let _held = backend.hold("nightly-report");
        assert_eq!(nightly(&manager, "nightly-report").await, 0, "skipped");
    }
    .instrument(root(test))
    .await;
    let (spans, events) = capture::snapshot();
    let root = root_id(&spans, test);
    let mine: Vec<&EventRec> = events.iter().filter(|e| under(&spans, e.parent, root)).collect();
    let skipped = mine
        .iter()
        .find(|e| e.fields.get("message").is_some_and(|m| m.contains("skipping the call")))
        .unwrap_or_else(|| panic!("the skip's event: {mine:#?}"));
    assert_eq!(skipped.target, "lock_runtime", "{skipped:?}");
    assert_eq!(skipped.fields.get("lock").map(String::as_str), Some("nightly-report"), "{skipped:?}");
    let text = format!("{:?}", skipped.fields);
    assert!(!text.contains("`fallback`"), "{text}");
    assert!(!text.contains("raise `wait`"), "{text}");
    assert!(mine.iter().all(|e| !e.target.contains("__private") && !e.target.ends_with("::private")), "{mine:#?}");
}

/// With hashed or hidden names, the raw name (`user:…@example.com`) appears in no span field
/// and no event, through a grant, a busy lock and a backend error answered by fallbacks, a
/// contended wait and a lost lock; hashed, the `lock` field is the name's hash; hidden, there
/// is no `lock` field.
#[tokio::test]
async fn hashed_and_hidden_names_stay_out_of_spans_and_events() {
    capture::install();
    for (names, test) in [(TelemetryNames::Hashed, "hashed names"), (TelemetryNames::Hidden, "hidden names")] {
        let backend = TestBackend::new();
        let manager = LockManager::builder().telemetry_names(names).backend(backend.clone());
        let name = format!("user:{}-ada@example.com", test.replace(' ', "-"));
        async {
            manager.lock(&name).await.expect("free").release().await.expect("released");
            let other = backend.hold(&name);
            assert_eq!(guarded(&manager, &name).await, "fallback", "busy");
            let err = manager.lock(&name).wait(Duration::from_millis(5)).await.expect_err("busy");
            assert!(err.is_contended());
            other.release();
            backend.fail_next(1);
            assert_eq!(guarded(&manager, &name).await, "fallback", "outage");
            let guard = manager.lock(&name).lease(Duration::from_secs(60)).await.expect("free");
            assert!(backend.lose(&name).await);
            assert!(guard.release().await.expect_err("lost").is_lost());
        }
        .instrument(root(test))
        .await;

        let (spans, events) = capture::snapshot();
        let root = root_id(&spans, test);
        let mine: Vec<&SpanRec> = spans.iter().filter(|s| under(&spans, Some(s.id), root)).collect();
        let my_events: Vec<&EventRec> = events.iter().filter(|e| under(&spans, e.parent, root)).collect();
        assert!(mine.iter().filter(|s| s.name == "lock.acquire").count() >= 5, "{mine:#?}");
        assert!(my_events.iter().any(|e| e.level == tracing::Level::WARN), "the loss and the outage: {my_events:#?}");
        let acquire = mine.iter().find(|s| s.name == "lock.acquire").expect("a lock.acquire span");
        match names {
            TelemetryNames::Hidden => assert!(!acquire.fields.contains_key("lock"), "{acquire:?}"),
            _ => assert_eq!(acquire.fields.get("lock").map(|s| s.as_str()), names.render(&name).as_deref()),
        }
    }
    let (spans, events) = capture::snapshot();
    let fields = spans.iter().flat_map(|s| s.fields.values()).chain(events.iter().flat_map(|e| e.fields.values()));
    for value in fields {
        assert!(!value.contains("ada@example.com"), "a raw name in telemetry: {value}");
    }
}

/// Taking and releasing locks (a guard, a run, a locked fn) emits nothing above `debug`.
#[tokio::test]
async fn the_happy_path_emits_nothing_above_debug() {
    capture::install();
    let manager = LockManager::builder().memory();
    let timed = LockManager::builder().backend(TestBackend::new());
    async {
        for manager in [&manager, &timed] {
            manager.lock("level:happy").await.expect("free").release().await.expect("released");
            drop(manager.lock("level:happy").lease(Duration::from_secs(5)).await.expect("free"));
            manager.lock("level:happy").run(async {}).await.expect("run");
            guarded(manager, "level:happy").await;
        }
    }
    .instrument(root("happy path"))
    .await;
    tokio::task::yield_now().await; // a dropped guard's release in the background

    let (spans, events) = capture::snapshot();
    let root = root_id(&spans, "happy path");
    assert!(children(&spans, root, "lock.hold").len() >= 8, "the locks were taken under the root");
    let loud: Vec<_> = events
        .iter()
        .filter(|e| under(&spans, e.parent, root) || e.fields.get("lock").is_some_and(|l| l == "level:happy"))
        .filter(|e| e.level < tracing::Level::DEBUG) // WARN < INFO < DEBUG in tracing's order
        .collect();
    assert!(loud.is_empty(), "above debug on the happy path: {loud:#?}");
}

/// A lost lock is one `warn` event, in its `lock.hold` span, whoever notices it (a release
/// after the fixed lease ran out, a run stopped by the loss, the backend taking it away).
#[tokio::test]
async fn a_lost_lock_emits_one_warn() {
    capture::install();
    let manager = LockManager::memory();
    let backend = TestBackend::new();
    let taken = LockManager::builder().backend(backend.clone());
    async {
        let guard = manager.lock("lost:lease").lease(Duration::from_millis(20)).await.expect("free");
        guard.lost().await;
        assert!(guard.release().await.expect_err("lost").is_lost());

        let stopped = manager
            .lock("lost:run")
            .lease(Duration::from_millis(20))
            .run(tokio::time::sleep(Duration::from_secs(5)))
            .await
            .expect_err("stopped by the loss");
        assert!(stopped.is_lost());

        let guard = taken.lock("lost:taken").await.expect("free");
        assert!(backend.lose("lost:taken").await);
        guard.lost().await;
        drop(guard);
    }
    .instrument(root("lost"))
    .await;

    let (spans, events) = capture::snapshot();
    let root = root_id(&spans, "lost");
    for lock in ["lost:lease", "lost:run", "lost:taken"] {
        let warns: Vec<_> = events
            .iter()
            .filter(|e| e.level <= tracing::Level::WARN)
            .filter(|e| e.fields.get("lock").is_some_and(|l| l == lock) || under(&spans, e.parent, root))
            .filter(|e| e.fields.get("lock").is_none_or(|l| l == lock))
            .collect();
        assert_eq!(warns.len(), 1, "one warn for {lock}: {warns:#?}");
        let warn = warns[0];
        assert_eq!(warn.fields.get("message").map(String::as_str), Some("lock lost"));
        let hold = &spans[warn.parent.expect("in a span") as usize - 1];
        assert_eq!((hold.name, hold.fields.get("lock").map(String::as_str)), ("lock.hold", Some(lock)));
    }
}

/// (Feature `metrics`.) What the metrics test needs: a gated upstream, the scrape parser.
#[cfg(feature = "metrics")]
mod metrics {
    use std::collections::{BTreeMap, HashSet};
    use std::sync::{Arc, Mutex, PoisonError};
    use std::time::Duration;

    use examples::orders::{AppState, BoxFuture, Upstream};
    use lock_runtime::testing::TestBackend;
    use lock_runtime::LockManager;

    use super::{pay, reserve, start};

    /// An upstream that holds the calls of the names the test closes (`order:7`, `stock:tea-42`)
    /// inside their handler's lock until it opens them; other calls pass at once.
    #[derive(Default)]
    struct Gate {
        closed: Mutex<HashSet<String>>,
        opened: tokio::sync::Notify,
        entered: tokio::sync::Notify,
        inside: Mutex<Vec<String>>,
    }

    impl Gate {
        fn is_closed(&self, what: &str) -> bool {
            self.closed.lock().unwrap_or_else(PoisonError::into_inner).contains(what)
        }

        async fn pass(&self, what: String) {
            if !self.is_closed(&what) {
                return;
            }
            self.inside.lock().unwrap_or_else(PoisonError::into_inner).push(what.clone());
            self.entered.notify_waiters();
            loop {
                let opened = self.opened.notified();
                tokio::pin!(opened);
                opened.as_mut().enable();
                if !self.is_closed(&what) {
                    return;
                }
                opened.await;
            }
        }

        fn close(&self, what: &str) {
            self.closed.lock().unwrap_or_else(PoisonError::into_inner).insert(what.to_owned());
        }

        fn open(&self, what: &str) {
            self.closed.lock().unwrap_or_else(PoisonError::into_inner).remove(what);
            self.opened.notify_waiters();
        }

        /// Waits until a call of `what` is held at the gate (so holds its lock).
        async fn entered(&self, what: &str) {
            let wait = async {
                loop {
                    let entered = self.entered.notified();
                    tokio::pin!(entered);
                    entered.as_mut().enable();
                    if self.inside.lock().unwrap_or_else(PoisonError::into_inner).iter().any(|w| w == what) {
                        return;
                    }
                    entered.await;
                }
            };
            tokio::time::timeout(Duration::from_secs(20), wait).await.expect("a handler reached the gate in time");
        }
    }

    impl Upstream for Gate {
        fn charge(&self, order_id: u64, _amount_cents: u64) -> BoxFuture<'_, String> {
            Box::pin(async move {
                self.pass(format!("order:{order_id}")).await;
                format!("pay_{order_id}")
            })
        }

        fn set_aside<'a>(&'a self, sku: &'a str, _quantity: u32) -> BoxFuture<'a, ()> {
            Box::pin(self.pass(format!("stock:{sku}")))
        }
    }

    /// The metrics of traffic through the Axum example, scraped from its `/metrics` over HTTP and
    /// parsed: acquisitions by outcome, waits and holds, fallbacks, a loss, and gauges back to 0
    /// after a cancelled wait and a guard dropped unreleased. (One test: the recorder is global.)
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn metrics_scraped_from_the_axum_example_over_http() {
        use lock_tests::http::request;

        examples::metrics::install().expect("the Prometheus recorder");
        let backend = TestBackend::new();
        let locks = LockManager::builder()
            .default_wait(Duration::from_secs(2))
            .metrics_name_label(|name| name.split_once(':').map_or(name, |(prefix, _)| prefix))
            .backend(backend.clone());
        let gate = Arc::new(Gate::default());
        let app = start(AppState::new(locks.clone(), gate.clone())).await;
        let addr = app.addr;
        let scrape = || async move {
            let answer = request(addr, "GET", "/metrics", None).await;
            assert_eq!(answer.status, 200, "{}", answer.body);
            Scrape::parse(&answer.body)
        };

        // Uncontended: three orders paid, one article reserved.
        for id in [1, 2, 3] {
            assert_eq!(pay(addr, id).await.status, 200);
        }
        assert_eq!(reserve(addr, "mug-7").await.status, 200);

        // Contended payment: the fallback answers 409 while the first one holds the lock.
        gate.close("order:10");
        let first = tokio::spawn(pay(addr, 10));
        gate.entered("order:10").await;
        assert_eq!(pay(addr, 10).await.status, 409);
        let now = scrape().await;
        assert_eq!(now.get("lock_held", &[("name", "order")]), 1.0, "held while the gate is closed");

        // Contended reservation: it waits (counted as waiting), then answers 423; a request
        // cancelled while waiting gives its place back.
        gate.close("stock:tea-42");
        let holder = tokio::spawn(reserve(addr, "tea-42"));
        gate.entered("stock:tea-42").await;
        let waiter = tokio::spawn(reserve(addr, "tea-42"));
        let cancelled = tokio::spawn({
            let locks = locks.clone();
            async move { locks.lock("stock:tea-42").await.map(drop) }
        });
        lock_tests::eventually("both wait", Duration::from_secs(20), async || {
            lock_tests::reached(backend.waiting("stock:tea-42"), 2)
        })
        .await;
        assert_eq!(scrape().await.get("lock_waiting", &[("name", "stock")]), 2.0);
        cancelled.abort();
        assert!(cancelled.await.expect_err("cancelled").is_cancelled());
        assert_eq!(waiter.await.expect("answer").status, 423, "after the 2 s wait");
        gate.open("stock:tea-42");
        gate.open("order:10");
        assert_eq!(holder.await.expect("answer").status, 200);
        assert_eq!(first.await.expect("answer").status, 200);

        // A backend error: the fallback answers.
        backend.fail_next(1);
        assert_eq!(pay(addr, 20).await.status, 409);

        // A loss: the handler is stopped, the lock error answers 500.
        gate.close("order:30");
        let lost = tokio::spawn(pay(addr, 30));
        gate.entered("order:30").await;
        assert!(backend.lose("order:30").await);
        assert_eq!(lost.await.expect("answer").status, 500);

        // A guard dropped without release (released in the background).
        drop(locks.lock("order:99").await.expect("free"));
        lock_tests::eventually("lock_held back to 0", Duration::from_secs(2), async || {
            lock_tests::reached(scrape().await.get("lock_held", &[("name", "order")]), 0.0)
        })
        .await;
        let m = scrape().await;
        let order = |outcome| m.get("lock_acquisitions_total", &[("name", "order"), ("outcome", outcome)]);
        let stock = |outcome| m.get("lock_acquisitions_total", &[("name", "stock"), ("outcome", outcome)]);
        assert_eq!(
            (order("acquired"), order("contended"), order("error")),
            (6.0, 1.0, 1.0),
            "orders 1, 2, 3, 10, 30, 99"
        );
        assert_eq!((stock("acquired"), stock("contended"), stock("error")), (2.0, 1.0, 0.0));
        assert_eq!(m.get("lock_wait_seconds_count", &[("name", "order")]), 8.0, "one wait per acquisition");
        assert_eq!(m.get("lock_wait_seconds_count", &[("name", "stock")]), 3.0, "not the cancelled one");
        assert!(m.get("lock_wait_seconds_sum", &[("name", "stock")]) >= 2.0, "the 423 waited 2 s");
        assert_eq!(m.get("lock_hold_seconds_count", &[("name", "order")]), 6.0, "one hold per grant");
        assert_eq!(m.get("lock_hold_seconds_count", &[("name", "stock")]), 2.0);
        assert_eq!(m.get("lock_lost_total", &[("name", "order")]), 1.0);
        assert_eq!(m.get("lock_fallbacks_total", &[("name", "order"), ("reason", "contended")]), 1.0);
        assert_eq!(m.get("lock_fallbacks_total", &[("name", "order"), ("reason", "error")]), 1.0);
        for name in ["order", "stock"] {
            assert_eq!(m.get("lock_held", &[("name", name)]), 0.0, "{name}: every guard gone");
            assert_eq!(m.get("lock_waiting", &[("name", name)]), 0.0, "{name}: no one waiting");
        }
        assert!(m.series.iter().all(|(_, labels, _)| labels.get("name").is_none_or(|n| n == "order" || n == "stock")));
    }

    /// A parsed Prometheus text exposition: `(metric, labels, value)` per sample.
    struct Scrape {
        series: Vec<(String, BTreeMap<String, String>, f64)>,
    }

    impl Scrape {
        fn parse(text: &str) -> Self {
            let series = text
                .lines()
                .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
                .map(|line| {
                    let (key, value) = line.rsplit_once(' ').unwrap_or_else(|| panic!("a sample: {line}"));
                    let value: f64 = value.parse().unwrap_or_else(|_| panic!("a value: {line}"));
                    let (name, labels) = match key.split_once('{') {
                        Some((name, labels)) => {
                            let labels = labels.trim_end_matches('}');
                            let labels = labels
                                .split(',')
                                .filter(|l| !l.is_empty())
                                .map(|l| {
                                    let (k, v) = l.split_once('=').unwrap_or_else(|| panic!("a label: {l}"));
                                    (k.to_owned(), v.trim_matches('"').to_owned())
                                })
                                .collect();
                            (name, labels)
                        }
                        None => (key, BTreeMap::new()),
                    };
                    (name.to_owned(), labels, value)
                })
                .collect();
            Scrape { series }
        }

        /// The one sample of `metric` on the memory backend whose labels include `labels`.
        fn get(&self, metric: &str, labels: &[(&str, &str)]) -> f64 {
            let found: Vec<_> = self
                .series
                .iter()
                .filter(|(name, l, _)| {
                    name == metric
                        && l.get("backend").map(String::as_str) == Some("memory")
                        && labels.iter().all(|(k, v)| l.get(*k).map(String::as_str) == Some(*v))
                })
                .collect();
            assert_eq!(found.len(), 1, "one sample of {metric} {labels:?}: {found:?}");
            found[0].2
        }
    }
}
