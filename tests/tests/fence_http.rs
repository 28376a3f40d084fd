//! The HTTP form of the fence over real HTTP, in Axum and Actix-web: a service behind the
//! `Fenced` extractor admits a token, the same token again and a newer one, refuses a stale
//! one with `409` and a problem body, a missing or malformed header with `400`, and a missing
//! store with `500`; a `LockError` answers as an `application/problem+json` problem with
//! `Retry-After` when contended; and the caller's header comes from the lock it holds.

use std::net::SocketAddr;
use std::time::Duration;

use lock_runtime::fence::{Fenced, Fences, FencingToken, MemoryFences};
use lock_runtime::{distributed_locked, LockError, LockManager};
use lock_tests::http::{request_with, Response};

const PROBLEM: &str = "application/problem+json";

async fn post(addr: SocketAddr, path: &str, token: Option<&str>) -> Response {
    let headers: Vec<(&str, &str)> = token.map(|t| vec![("Fencing-Token", t)]).unwrap_or_default();
    request_with(addr, "POST", path, &headers, None).await
}

fn busy() -> LockError {
    LockError::Contended { name: "orders:42".into(), waited: Duration::from_secs(2), attempts: 1, held: true }
}

/// The same checks against either framework's app, serving `/write` (fenced), `/unfenced`
/// (fenced, but the app has no store) and `/busy` (a contended `LockError`).
async fn the_fence_answers(addr: SocketAddr) {
    let ok = post(addr, "/write", Some("orders:42 7")).await;
    assert_eq!((ok.status, ok.body.as_str()), (200, "orders:42 7"), "{ok:?}");
    assert_eq!(post(addr, "/write", Some("orders:42 7")).await.status, 200, "the same token again");
    assert_eq!(post(addr, "/write", Some("orders:42 9")).await.status, 200, "a newer holder");

    let stale = post(addr, "/write", Some("orders:42 8")).await;
    assert_eq!(stale.status, 409, "{stale:?}");
    assert_eq!(stale.header("content-type"), Some(PROBLEM));
    let problem: serde_json::Value = serde_json::from_str(&stale.body).expect("a JSON problem");
    assert_eq!(problem["status"], 409);
    assert_eq!(problem["lock"], "orders:42");
    assert!(problem["type"].as_str().is_some_and(|t| t.ends_with("#fenced")), "{problem}");
    assert!(problem["detail"].as_str().is_some_and(|d| d.contains('8') && d.contains('9')), "{problem}");
    assert_eq!(post(addr, "/write", Some("orders:43 1")).await.status, 200, "resources are independent");

    for bad in [None, Some("orders:42"), Some("orders:42 x"), Some("%zz 1"), Some("orders 42 7")] {
        let answer = post(addr, "/write", bad).await;
        assert_eq!(answer.status, 400, "{bad:?}: {answer:?}");
        assert_eq!(answer.header("content-type"), Some(PROBLEM));
    }
    // What the audit found: a control character in the resource (503 with `Retry-After`
    // before), a sign in a %-escape and a token above `i64::MAX` (admitted before; PostgreSQL's
    // fences answered 500), an overflowing token called "not a whole number".
    for bad in ["orders%00 1", "orders%+F 1", "orders:44 9223372036854775808"] {
        let answer = post(addr, "/write", Some(bad)).await;
        assert_eq!(answer.status, 400, "{bad}: {answer:?}");
    }
    let overflow = post(addr, "/write", Some("orders:44 99999999999999999999999")).await;
    assert_eq!(overflow.status, 400);
    assert!(overflow.body.contains("out of range"), "{overflow:?}");
    // Two headers, `[fresh, stale]`: which one was meant cannot be known (only the first was
    // read: 200 before).
    let two = request_with(
        addr,
        "POST",
        "/write",
        &[("Fencing-Token", "orders:42 9"), ("Fencing-Token", "orders:42 1")],
        None,
    )
    .await;
    assert_eq!(two.status, 400, "{two:?}");
    assert!(two.body.contains("several"), "{two:?}");
    assert_eq!(post(addr, "/unfenced", Some("orders:42 10")).await.status, 500, "no store configured");

    let busy = post(addr, "/busy", None).await;
    assert_eq!(busy.status, 423);
    assert_eq!(busy.header("retry-after"), Some("1"));
    assert_eq!(busy.header("content-type"), Some(PROBLEM));
    let problem: serde_json::Value = serde_json::from_str(&busy.body).expect("a JSON problem");
    assert_eq!((problem["status"].as_u64(), problem["lock"].as_str()), (Some(423), Some("orders:42")));
}

#[tokio::test]
async fn axum_refuses_a_stale_token_with_a_problem() {
    use axum::routing::post;
    use axum::{Extension, Router};

    let fenced = Router::new()
        .route("/write", post(|Fenced(token): Fenced| async move { token.to_string() }))
        .route("/busy", post(|| async { Err::<(), _>(busy()) }))
        .layer(Extension(Fences::new(MemoryFences::default())));
    let app =
        fenced.merge(Router::new().route("/unfenced", post(|Fenced(token): Fenced| async move { token.to_string() })));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let server = tokio::spawn(async move { axum::serve(listener, app).await });
    the_fence_answers(addr).await;
    server.abort();
}

#[actix_web::test]
async fn actix_refuses_a_stale_token_with_a_problem() {
    use actix_web::{web, App, HttpServer};

    let fences = Fences::new(MemoryFences::default());
    let server = HttpServer::new(move || {
        let echo = |Fenced(token): Fenced| async move { token.to_string() };
        App::new()
            .route("/unfenced", web::post().to(echo)) // outside the scope that has the store
            .service(
                web::scope("")
                    .app_data(fences.clone())
                    .route("/write", web::post().to(echo))
                    .route("/busy", web::post().to(|| async { Err::<String, _>(busy()) })),
            )
    })
    .workers(1)
    .bind(("127.0.0.1", 0))
    .expect("bind");
    let addr = server.addrs()[0];
    let server = server.run();
    let handle = server.handle();
    actix_web::rt::spawn(server);
    the_fence_answers(addr).await;
    handle.stop(false).await;
}

#[distributed_locked(name = "orders:{id}", manager = LockManager::memory())]
async fn outgoing(id: u32) -> Result<(FencingToken, u64), LockError> {
    let lock = lock_runtime::current().expect("inside a locked call");
    let (name, value) = FencingToken::current_header().expect("the caller's header");
    assert_eq!(name, FencingToken::HEADER);
    assert_eq!(FencingToken::parse(&value).ok(), FencingToken::current());
    Ok((FencingToken::current().expect("the caller's token"), lock.fencing_token()))
}

#[tokio::test]
async fn the_callers_header_comes_from_the_lock_it_holds() {
    assert_eq!(FencingToken::current(), None, "outside a locked call");
    assert_eq!(FencingToken::current_header(), None);
    let (token, held) = outgoing(42).await.expect("locked call");
    assert_eq!(token, FencingToken { resource: "orders:42".into(), token: held });
    assert_eq!(token.header_value(), format!("orders:42 {held}"));
}
