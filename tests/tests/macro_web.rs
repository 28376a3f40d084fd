//! The attribute composes with web frameworks: an Axum handler and an Actix-web `#[get(..)]`
//! handler, each served on a free loopback port and sent one real HTTP/1.1 request.
#![deny(warnings, clippy::all)]

use std::net::SocketAddr;
use std::sync::LazyLock;
use std::time::Duration;

use lock_runtime::{distributed_locked, LockError, LockManager};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const BOUND: Duration = Duration::from_secs(20);

static LOCKS: LazyLock<LockManager> = LazyLock::new(LockManager::memory);

fn locks() -> &'static LockManager {
    &LOCKS
}

/// Sends `GET path` and returns (status line, body).
async fn get(addr: SocketAddr, path: &str) -> (String, String) {
    let exchange = async {
        let mut stream = TcpStream::connect(addr).await.expect("connect");
        let request = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
        stream.write_all(request.as_bytes()).await.expect("send");
        let mut response = Vec::new();
        stream.read_to_end(&mut response).await.expect("receive");
        String::from_utf8(response).expect("utf-8 response")
    };
    let response = tokio::time::timeout(BOUND, exchange).await.expect("response in time");
    let status = response.lines().next().unwrap_or_default().to_owned();
    let body = response.split_once("\r\n\r\n").map(|(_, b)| b.to_owned()).unwrap_or_default();
    (status, body)
}

mod axum_app {
    use super::*;
    use axum::extract::{Path, State};
    use axum::http::StatusCode;
    use axum::response::{IntoResponse, Response};

    #[derive(Clone)]
    pub(super) struct AppState {
        pub(super) locks: LockManager,
    }

    pub(super) struct HttpError(LockError);

    impl From<LockError> for HttpError {
        fn from(e: LockError) -> Self {
            HttpError(e)
        }
    }

    impl IntoResponse for HttpError {
        fn into_response(self) -> Response {
            let status = if self.0.is_contended() { StatusCode::CONFLICT } else { StatusCode::SERVICE_UNAVAILABLE };
            (status, self.0.to_string()).into_response()
        }
    }

    #[distributed_locked(name = "axum:{id}", wait = "0s", manager = locks(), fallback = item_busy)]
    pub(super) async fn item(Path(id): Path<u64>) -> String {
        let lock = lock_runtime::current().expect("inside a locked call");
        format!("{id} under {} #{}", lock.key(), lock.fencing_token())
    }

    pub(super) async fn item_busy(Path(id): Path<u64>) -> String {
        format!("{id} is busy")
    }

    #[distributed_locked(name = "axum-state:{id}", wait = "0s", manager = &state.locks)]
    pub(super) async fn with_state(State(state): State<AppState>, Path(id): Path<u64>) -> Result<String, HttpError> {
        Ok(format!("{id} on {}", state.locks.backend_name()))
    }
}

#[tokio::test]
async fn axum_handler_serves_a_request() {
    use axum::routing::get as route_get;

    let state = axum_app::AppState { locks: LockManager::memory() };
    let app = axum::Router::new()
        .route("/item/{id}", route_get(axum_app::item))
        .route("/state/{id}", route_get(axum_app::with_state))
        .with_state(state.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let server = tokio::spawn(async move { axum::serve(listener, app).await });

    let (status, body) = get(addr, "/item/7").await;
    assert!(status.starts_with("HTTP/1.1 200"), "{status}");
    assert!(body.starts_with("7 under axum:7 #"), "{body}");

    let held = locks().lock("axum:8").await.expect("held");
    let (status, body) = get(addr, "/item/8").await;
    assert!(status.starts_with("HTTP/1.1 200"), "{status}");
    assert_eq!(body, "8 is busy", "the fallback answered with the same extractors");
    drop(held);

    let (status, body) = get(addr, "/state/3").await;
    assert!(status.starts_with("HTTP/1.1 200"), "{status}");
    assert_eq!(body, "3 on memory");
    let _held = state.locks.lock("axum-state:3").await.expect("held");
    let (status, body) = get(addr, "/state/3").await;
    assert!(status.starts_with("HTTP/1.1 409"), "{status}: {body}");
    assert!(body.contains("axum-state:3"), "{body}");

    server.abort();
}

mod actix_app {
    use super::*;
    use actix_web::{get, web};

    #[get("/item/{id}")]
    #[distributed_locked(name = "actix:{path}", wait = "0s", manager = locks(), fallback = item_busy)]
    pub(super) async fn item(path: web::Path<u64>) -> String {
        let lock = lock_runtime::current().expect("inside a locked call");
        format!("{} under {} #{}", path.into_inner(), lock.key(), lock.fencing_token())
    }

    pub(super) async fn item_busy(path: web::Path<u64>) -> String {
        format!("{} is busy", path.into_inner())
    }
}

#[actix_web::test]
async fn actix_get_handler_serves_a_request() {
    use actix_web::{App, HttpServer};

    let server =
        HttpServer::new(|| App::new().service(actix_app::item)).workers(1).bind(("127.0.0.1", 0)).expect("bind");
    let addr = server.addrs()[0];
    let server = server.run();
    let handle = server.handle();
    actix_web::rt::spawn(server);

    let (status, body) = get(addr, "/item/5").await;
    assert!(status.starts_with("HTTP/1.1 200"), "{status}");
    assert!(body.starts_with("5 under actix:5 #"), "{body}");

    let held = locks().lock("actix:6").await.expect("held");
    let (status, body) = get(addr, "/item/6").await;
    assert!(status.starts_with("HTTP/1.1 200"), "{status}");
    assert_eq!(body, "6 is busy");
    drop(held);

    handle.stop(false).await;
}
