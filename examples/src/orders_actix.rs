//! The orders service in Actix-web (feature `actix`); the `actix_orders` example serves it.
//!
//! The same two endpoints as [`orders_axum`](crate::orders_axum) (when both features are on):
//! `POST /orders/{id}/pay` answers `409 Conflict` with `Retry-After` through its fallback while
//! the order is being paid; `POST /stock/reserve` answers a lock error by its class through
//! `lock-runtime`'s `actix` feature (`423 Locked` with `Retry-After` when contended).

use actix_web::http::{header, StatusCode};
use actix_web::{post, web, App, HttpResponse, HttpServer, ResponseError};
use lock_runtime::{distributed_locked, LockError};

use crate::orders::{fencing_token, AppState, PayRequest, Problem, Receipt, Reservation, ReserveRequest};
use crate::orders::{OutOfStock, RETRY_AFTER_SECS};

/// Registers the routes; the app needs `web::Data<AppState>` (see [`server`]).
pub fn configure(cfg: &mut web::ServiceConfig) {
    cfg.service(pay).service(reserve);
}

/// An HTTP server for `state` on `listener`, with two workers; await it to serve.
pub fn server(listener: std::net::TcpListener, state: AppState) -> std::io::Result<actix_web::dev::Server> {
    let data = web::Data::new(state);
    let server = HttpServer::new(move || App::new().app_data(data.clone()).configure(configure))
        .workers(2)
        .listen(listener)?
        .run();
    Ok(server)
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

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ApiError::InProgress { order_id } => write!(f, "order {order_id} is being paid by another request"),
            ApiError::OutOfStock(OutOfStock { sku, left }) => write!(f, "only {left} of {sku} left"),
            ApiError::Lock(e) => e.fmt(f),
        }
    }
}

impl ResponseError for ApiError {
    fn status_code(&self) -> StatusCode {
        match self {
            ApiError::InProgress { .. } | ApiError::OutOfStock(_) => StatusCode::CONFLICT,
            ApiError::Lock(e) => e.status_code(),
        }
    }

    fn error_response(&self) -> HttpResponse {
        match self {
            ApiError::InProgress { .. } => HttpResponse::Conflict()
                .insert_header((header::RETRY_AFTER, RETRY_AFTER_SECS.to_string()))
                .json(Problem { error: self.to_string() }),
            ApiError::OutOfStock(_) => HttpResponse::Conflict().json(Problem { error: self.to_string() }),
            // `lock-runtime`'s `actix` feature: 423 + Retry-After, 503 + Retry-After, or 500.
            ApiError::Lock(e) => e.error_response(),
        }
    }
}

/// `POST /orders/{id}/pay`: charges the order once.
///
/// `#[post(..)]` is the outermost attribute, then `#[tracing::instrument]`, then
/// `#[distributed_locked]` (see [`lock_runtime::http`]).
#[post("/orders/{id}/pay")]
#[tracing::instrument(skip_all, fields(order_id = *id))]
#[distributed_locked(name = "order:{id}", wait = "0s", manager = &state.locks, fallback = payment_in_progress)]
pub async fn pay(
    state: web::Data<AppState>,
    id: web::Path<u64>,
    web::Json(req): web::Json<PayRequest>,
) -> Result<web::Json<Receipt>, ApiError> {
    Ok(web::Json(state.shop.pay(*id, req.amount_cents, fencing_token()).await?))
}

/// The fallback of [`pay`]: called with the same extractors when `order:{id}` cannot be taken
/// (for any reason, a backend outage included).
pub async fn payment_in_progress(
    _state: web::Data<AppState>,
    id: web::Path<u64>,
    _req: web::Json<PayRequest>,
) -> Result<web::Json<Receipt>, ApiError> {
    Err(ApiError::InProgress { order_id: id.into_inner() })
}

/// `POST /stock/reserve`: sets stock aside; waits for the article's lock up to the manager's
/// `default_wait`, then answers `423 Locked`.
#[post("/stock/reserve")]
#[tracing::instrument(skip_all, fields(sku = %req.sku, quantity = req.quantity))]
#[distributed_locked(name = "stock:{req.sku}", manager = &state.locks)]
pub async fn reserve(
    state: web::Data<AppState>,
    web::Json(req): web::Json<ReserveRequest>,
) -> Result<web::Json<Reservation>, ApiError> {
    let reservation =
        state.shop.reserve(&req.sku, req.quantity, fencing_token()).await.map_err(ApiError::OutOfStock)?;
    Ok(web::Json(reservation))
}
