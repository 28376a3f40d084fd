//! What the order of `#[distributed_locked]` among other attributes changes, as documented in
//! `lock_runtime::http` ("Attribute order"): attributes expand outermost first, each on the
//! item as the ones above it left it, so the lowest attribute's wrapping ends up outermost at
//! run time.

use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::LazyLock;

use axum::extract::Path;
use lock_runtime::{distributed_locked, LockError, LockManager};
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Metadata, Subscriber};

static LOCKS: LazyLock<LockManager> = LazyLock::new(LockManager::memory);

/// A subscriber that only tracks which span is entered on this thread (see [`span`]).
#[derive(Default)]
struct Spans {
    next: AtomicU64,
}

thread_local! {
    static NAMES: RefCell<HashMap<u64, &'static str>> = RefCell::new(HashMap::new());
    static ENTERED: RefCell<Vec<Id>> = const { RefCell::new(Vec::new()) };
}

impl Subscriber for Spans {
    fn enabled(&self, _: &Metadata<'_>) -> bool {
        true
    }
    fn new_span(&self, attrs: &Attributes<'_>) -> Id {
        let id = self.next.fetch_add(1, Ordering::Relaxed) + 1;
        NAMES.with(|n| n.borrow_mut().insert(id, attrs.metadata().name()));
        Id::from_u64(id)
    }
    fn record(&self, _: &Id, _: &Record<'_>) {}
    fn record_follows_from(&self, _: &Id, _: &Id) {}
    fn event(&self, _: &Event<'_>) {}
    fn enter(&self, id: &Id) {
        ENTERED.with(|e| e.borrow_mut().push(id.clone()));
    }
    fn exit(&self, id: &Id) {
        ENTERED.with(|e| {
            let mut e = e.borrow_mut();
            if let Some(at) = e.iter().rposition(|x| x == id) {
                e.remove(at);
            }
        });
    }
}

/// (whether the body ran, the span the code ran in)
type Ran = (bool, Option<&'static str>);

/// The name of the innermost span entered on this thread, the lock's own `lock.hold` (which a
/// locked body runs in) aside.
fn span() -> Option<&'static str> {
    let entered = ENTERED.with(|e| e.borrow().iter().map(Id::into_u64).collect::<Vec<_>>());
    NAMES.with(|n| {
        let names = n.borrow();
        entered.iter().rev().filter_map(|id| names.get(id).copied()).find(|name| !name.starts_with("lock."))
    })
}

// `#[tracing::instrument]` above: it sees `Path(id)` as written (so `fields` can name `id`),
// and its span is entered once the lock is held: the fallback runs outside it.
#[tracing::instrument(skip_all, fields(order_id = id))]
#[distributed_locked(name = "above:{id}", wait = "0s", manager = &*LOCKS, fallback = instrument_above_busy)]
async fn instrument_above(Path(id): Path<u64>) -> Ran {
    (true, span())
}
async fn instrument_above_busy(Path(_): Path<u64>) -> Ran {
    (false, span())
}

// `#[tracing::instrument]` below: its span also covers waiting for the lock and the fallback,
// but it sees the parameters after `#[distributed_locked]` renamed its patterns, so it can
// only `skip_all` (`fields(order_id = id)` does not compile here).
#[distributed_locked(name = "below:{id}", wait = "0s", manager = &*LOCKS, fallback = instrument_below_busy)]
#[tracing::instrument(skip_all)]
async fn instrument_below(Path(id): Path<u64>) -> Ran {
    let _ = id;
    (true, span())
}
async fn instrument_below_busy(Path(_): Path<u64>) -> Ran {
    (false, span())
}

#[tokio::test]
async fn instrument_above_spans_the_locked_body_only() {
    let _subscriber = tracing::subscriber::set_default(Spans::default());
    assert_eq!(instrument_above(Path(1)).await, (true, Some("instrument_above")));
    let held = LOCKS.lock("above:2").await.expect("held");
    assert_eq!(instrument_above(Path(2)).await, (false, None), "the fallback runs outside the span");
    drop(held);
}

#[tokio::test]
async fn instrument_below_spans_the_wait_and_the_fallback() {
    let _subscriber = tracing::subscriber::set_default(Spans::default());
    assert_eq!(instrument_below(Path(1)).await, (true, Some("instrument_below")));
    let held = LOCKS.lock("below:2").await.expect("held");
    assert_eq!(instrument_below(Path(2)).await, (false, Some("instrument_below")), "the fallback runs in the span");
    drop(held);
}

// The documented order for handlers, and the reverse one: both compile and register.
mod handlers {
    use super::*;

    #[axum::debug_handler]
    #[distributed_locked(name = "dh-above:{id}", wait = "0s", manager = &*LOCKS)]
    pub(super) async fn debug_handler_above(Path(id): Path<u64>) -> Result<String, LockError> {
        Ok(id.to_string())
    }

    #[distributed_locked(name = "dh-below:{id}", wait = "0s", manager = &*LOCKS)]
    #[axum::debug_handler]
    pub(super) async fn debug_handler_below(Path(id): Path<u64>) -> Result<String, LockError> {
        Ok(id.to_string())
    }

    #[actix_web::get("/route-above/{id}")]
    #[distributed_locked(name = "route-above:{id}", wait = "0s", manager = &*LOCKS)]
    pub(super) async fn route_above(id: actix_web::web::Path<u64>) -> Result<String, LockError> {
        Ok(id.to_string())
    }

    #[distributed_locked(name = "route-below:{id}", wait = "0s", manager = &*LOCKS)]
    #[actix_web::get("/route-below/{id}")]
    pub(super) async fn route_below(id: actix_web::web::Path<u64>) -> Result<String, LockError> {
        Ok(id.to_string())
    }
}

#[test]
fn both_orders_register_with_the_frameworks() {
    use axum::routing::get;
    let _axum: axum::Router = axum::Router::new()
        .route("/a/{id}", get(handlers::debug_handler_above))
        .route("/b/{id}", get(handlers::debug_handler_below));
    let _actix = actix_web::App::new().service(handlers::route_above).service(handlers::route_below);
}
