//! The orders service in Axum (feature `axum`); the `axum_orders` example serves it.
//!
//! - `POST /orders/{id}/pay` `{"amount_cents": 1250}`: locked on `order:{id}` without waiting;
//!   while another request pays the same order, the fallback answers `409 Conflict` with
//!   `Retry-After`.
//! - `POST /stock/reserve` `{"sku": "tea-42", "quantity": 2}`: locked on `stock:{sku}`, waiting
//!   up to the manager's `default_wait`; no fallback, so a lock error is answered by its class
//!   through `lock-runtime`'s `axum` feature: `423 Locked` with `Retry-After` when contended,
//!   `503` when the backend is down.
//! - `GET /metrics` (feature `metrics`): the locks' metrics in the Prometheus text format, from
//!   the recorder of [`crate::metrics`] (`503` when none is installed).

use std::time::Duration;

use axum::extract::{Path, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Json, Router};
use lock_runtime::{distributed_locked, LockError};

use crate::orders::{fencing_token, AppState, PayRequest, Problem, Receipt, Reservation, ReserveRequest};
use crate::orders::{OutOfStock, RETRY_AFTER_SECS};

/// The routes, on `state`, each request in a `request` span (as `tower-http`'s `TraceLayer`
/// would make): the locks' `lock.acquire` and `lock.hold` spans are its children, and a
/// handler's `#[tracing::instrument]` span, entered once its lock is held, is a child of
/// `lock.hold`.
pub fn router(state: AppState) -> Router {
    let router = Router::new().route("/orders/{id}/pay", post(pay)).route("/stock/reserve", post(reserve));
    #[cfg(feature = "metrics")]
    let router = router.route("/metrics", axum::routing::get(metrics));
    router.layer(axum::middleware::from_fn(traced)).with_state(state)
}

/// Runs a request in its `request` span.
async fn traced(request: axum::extract::Request, next: axum::middleware::Next) -> Response {
    use tracing::Instrument;
    let span = tracing::info_span!("request", method = %request.method(), path = %request.uri().path());
    next.run(request).instrument(span).await
}

/// `GET /metrics`: the Prometheus scrape endpoint.
#[cfg(feature = "metrics")]
pub async fn metrics() -> Response {
    match crate::metrics::render() {
        Some(text) => ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], text).into_response(),
        None => (StatusCode::SERVICE_UNAVAILABLE, "no metrics recorder is installed").into_response(),
    }
}

/// Serves [`router`] on `listener` until the process ends.
pub async fn serve(listener: tokio::net::TcpListener, state: AppState) -> std::io::Result<()> {
    let locks = state.locks.clone();
    axum::serve(listener, router(state)).with_graceful_shutdown(stop_signal()).await?;
    // The platform kills the process a grace period after SIGTERM (Kubernetes 30 s by
    // default, Docker 10 s, systemd 90 s): the requests' drain above and this hand-over must
    // end before it. A lock still held when the process is killed is freed by the store a
    // lease (or a session timeout) later.
    if tokio::time::timeout(Duration::from_secs(5), locks.shutdown()).await.is_err() {
        eprintln!("the locks' shutdown did not end within 5 s; the store frees what is left");
    }
    Ok(())
}

/// Ctrl-C, or SIGTERM (what containers and systemd send to stop a service).
pub async fn stop_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut term) => drop(term.recv().await),
            Err(_) => std::future::pending().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {}
        () = term => {}
    }
}

/// What a handler can fail with.
#[derive(Debug)]
pub enum ApiError {
    /// The order is being paid by another request right now.
    InProgress {
        /// The order.
        order_id: u64,
    },
    /// Not enough stock.
    OutOfStock(OutOfStock),
    /// The lock could not be taken (or was lost).
    Lock(LockError),
}

impl From<LockError> for ApiError {
    fn from(e: LockError) -> Self {
        ApiError::Lock(e)
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        match self {
            ApiError::InProgress { order_id } => (
                StatusCode::CONFLICT,
                [(header::RETRY_AFTER, RETRY_AFTER_SECS.to_string())],
                Json(Problem { error: format!("order {order_id} is being paid by another request") }),
            )
                .into_response(),
            ApiError::OutOfStock(OutOfStock { sku, left }) => {
                (StatusCode::CONFLICT, Json(Problem { error: format!("only {left} of {sku} left") })).into_response()
            }
            // `lock-runtime`'s `axum` feature: 423 + Retry-After, 503 + Retry-After, or 500.
            ApiError::Lock(e) => e.into_response(),
        }
    }
}

/// `POST /orders/{id}/pay`: charges the order once.
///
/// `#[axum::debug_handler]` and `#[tracing::instrument]` go above `#[distributed_locked]` (see
/// [`lock_runtime::http`]): they then see the parameters as written (`id`), and the span is
/// entered once the lock is held.
#[axum::debug_handler]
#[tracing::instrument(skip_all, fields(order_id = id))]
#[distributed_locked(name = "order:{id}", wait = "0s", manager = &state.locks, fallback = payment_in_progress)]
pub async fn pay(
    State(state): State<AppState>,
    Path(id): Path<u64>,
    Json(req): Json<PayRequest>,
) -> Result<Json<Receipt>, ApiError> {
    Ok(Json(state.shop.pay(id, req.amount_cents, fencing_token()).await?))
}

/// The fallback of [`pay`]: called with the same extractors when `order:{id}` cannot be taken.
///
/// A fallback runs whatever the reason, a backend outage included; [`reserve`] shows the
/// other way, answering by the error's class.
pub async fn payment_in_progress(
    State(_): State<AppState>,
    Path(id): Path<u64>,
    Json(_): Json<PayRequest>,
) -> Result<Json<Receipt>, ApiError> {
    Err(ApiError::InProgress { order_id: id })
}

/// `POST /stock/reserve`: sets stock aside; waits for the article's lock up to the manager's
/// `default_wait`, then answers `423 Locked`.
#[axum::debug_handler]
#[tracing::instrument(skip_all, fields(sku = %req.sku, quantity = req.quantity))]
#[distributed_locked(name = "stock:{req.sku}", manager = &state.locks)]
pub async fn reserve(
    State(state): State<AppState>,
    Json(req): Json<ReserveRequest>,
) -> Result<Json<Reservation>, ApiError> {
    let reservation =
        state.shop.reserve(&req.sku, req.quantity, fencing_token()).await.map_err(ApiError::OutOfStock)?;
    Ok(Json(reservation))
}
