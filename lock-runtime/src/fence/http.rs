//! The HTTP form of the fence: the `Fencing-Token` header, the stores a service checks it
//! against, and the extractor that refuses a stale one (`axum`, `actix` features).

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use crate::backend::BoxFuture;
use crate::error::LockError;

/// A fencing token for a resource, as sent in the `Fencing-Token` header:
/// `Fencing-Token: <resource> <token>`, the resource percent-encoded where it holds a space,
/// a `%` or anything outside visible ASCII (so any lock name fits a header), then one space and
/// the token in decimal.
///
/// ```
/// use lock_runtime::fence::FencingToken;
/// let t = FencingToken { resource: "café order:42".into(), token: 9 };
/// assert_eq!(t.header_value(), "caf%C3%A9%20order:42 9");
/// assert_eq!(FencingToken::parse(&t.header_value()).unwrap(), t);
/// assert!(FencingToken::parse("no-token-here").is_err());
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct FencingToken {
    /// The resource (by convention the lock's name).
    pub resource: String,
    /// The lock's fencing token.
    pub token: u64,
}

impl FencingToken {
    /// The header's name (lower case, as HTTP/2 sends it).
    pub const HEADER: &'static str = "fencing-token";

    /// The token of the innermost lock the running locked call holds, for its name
    /// ([`current()`](crate::current)); `None` outside a locked call.
    pub fn current() -> Option<FencingToken> {
        crate::current().map(|lock| FencingToken { resource: lock.key().to_owned(), token: lock.fencing_token() })
    }

    /// The header to add to an outgoing request from inside a locked call, for any HTTP client
    /// (`request.header(name, value)` in reqwest, hyper, awc): the innermost lock's
    /// [`current`](Self::current) token; `None` outside a locked call.
    ///
    /// ```
    /// use lock_runtime::{distributed_locked, fence::FencingToken, LockError, LockManager};
    ///
    /// #[distributed_locked(name = "orders:{id}", manager = LockManager::memory())]
    /// async fn call_downstream(id: u32) -> Result<(&'static str, String), LockError> {
    ///     Ok(FencingToken::current_header().expect("inside a locked call"))
    /// }
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), LockError> {
    /// let (name, value) = call_downstream(42).await?;
    /// assert_eq!(name, "fencing-token");
    /// assert!(value.starts_with("orders:42 "));
    /// # Ok(()) }
    /// ```
    pub fn current_header() -> Option<(&'static str, String)> {
        Self::current().map(|token| (Self::HEADER, token.header_value()))
    }

    /// The header's value.
    pub fn header_value(&self) -> String {
        let mut out = String::with_capacity(self.resource.len() + 21);
        for &b in self.resource.as_bytes() {
            if b.is_ascii_graphic() && b != b'%' {
                out.push(char::from(b));
            } else {
                out.push_str(&format!("%{b:02X}"));
            }
        }
        out.push_str(&format!(" {}", self.token));
        out
    }

    /// Parses a header value; a clear [`is_invalid`](LockError::is_invalid) error otherwise.
    pub fn parse(value: &str) -> Result<FencingToken, LockError> {
        let bad =
            |why: &str| LockError::invalid(value, format!("not a `Fencing-Token: <resource> <token>` value: {why}"));
        let (resource, token) = value.trim().rsplit_once(' ').ok_or_else(|| bad("no space before the token"))?;
        if token.is_empty() || !token.bytes().all(|b| b.is_ascii_digit()) {
            return Err(bad("the token is not a whole number"));
        }
        // Above `i64::MAX` no store agrees (PostgreSQL's `bigint` cannot hold it) and no lock
        // hands one out: refused here, the same for every store.
        let token = token
            .parse::<u64>()
            .ok()
            .filter(|t| i64::try_from(*t).is_ok())
            .ok_or_else(|| bad(&format!("the token is out of range (at most {})", i64::MAX)))?;
        if resource.contains(' ') {
            return Err(bad("a space in the resource is written `%20`"));
        }
        let mut bytes = Vec::with_capacity(resource.len());
        let mut rest = resource.as_bytes();
        while let Some((&b, tail)) = rest.split_first() {
            if b == b'%' {
                // Two hex digits exactly (`from_str_radix` alone takes a sign: `%+F`).
                let hex = tail.get(..2).filter(|h| h.iter().all(u8::is_ascii_hexdigit));
                let hex = hex.and_then(|h| std::str::from_utf8(h).ok());
                let byte = hex.and_then(|h| u8::from_str_radix(h, 16).ok()).ok_or_else(|| bad("a bad %-escape"))?;
                bytes.push(byte);
                rest = &tail[2..];
            } else {
                bytes.push(b);
                rest = tail;
            }
        }
        let resource = String::from_utf8(bytes).map_err(|_| bad("the resource is not UTF-8"))?;
        if resource.is_empty() {
            return Err(bad("the resource is empty"));
        }
        // A resource is named as a lock is (no control characters, a bounded length).
        crate::options::check_name(&resource).map_err(|e| match e {
            LockError::Invalid { reason, .. } => bad(&format!("the resource: {reason}")),
            other => other,
        })?;
        Ok(FencingToken { resource, token })
    }
}

impl fmt::Display for FencingToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.header_value())
    }
}

/// Where a service records the highest token seen per resource, to refuse lower ones.
///
/// Implemented by [`MemoryFences`] (one process), `fence::redis::RedisFences` and
/// `fence::postgres::PostgresFences` (shared by every replica of a service).
pub trait FenceStore: Send + Sync + 'static {
    /// Records `token` for `resource` unless a higher one was recorded; then
    /// [`LockError::Fenced`]. The same token again is admitted.
    fn admit<'a>(&'a self, resource: &'a str, token: u64) -> BoxFuture<'a, Result<(), LockError>>;
}

/// An in-process [`FenceStore`]: a map of the highest token per resource (forgotten on
/// restart; one entry per resource ever seen).
///
/// ```
/// use lock_runtime::fence::{FenceStore, MemoryFences};
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// let fences = MemoryFences::default();
/// assert!(fences.admit("orders:42", 7).await.is_ok());
/// assert!(fences.admit("orders:42", 7).await.is_ok()); // the same holder again
/// assert!(fences.admit("orders:42", 6).await.unwrap_err().is_fenced());
/// assert!(fences.admit("orders:43", 1).await.is_ok()); // resources are independent
/// # }
/// ```
#[derive(Debug, Default)]
pub struct MemoryFences {
    highest: Mutex<HashMap<String, u64>>,
}

impl FenceStore for MemoryFences {
    fn admit<'a>(&'a self, resource: &'a str, token: u64) -> BoxFuture<'a, Result<(), LockError>> {
        let mut map = self.highest.lock().unwrap_or_else(PoisonError::into_inner);
        let outcome = match map.get_mut(resource) {
            Some(highest) if *highest > token => {
                Err(LockError::Fenced { name: resource.to_owned(), token, highest: *highest })
            }
            Some(highest) => {
                *highest = token;
                Ok(())
            }
            None => {
                map.insert(resource.to_owned(), token);
                Ok(())
            }
        };
        Box::pin(std::future::ready(outcome))
    }
}

/// A shared [`FenceStore`], as a service keeps it for the [`Fenced`] extractor: in Axum's
/// request extensions (`.layer(axum::Extension(fences))`), in Actix-web's app data
/// (`.app_data(fences)`).
#[derive(Clone)]
pub struct Fences(Arc<dyn FenceStore>);

impl Fences {
    /// Shares `store`.
    pub fn new(store: impl FenceStore) -> Self {
        Fences(Arc::new(store))
    }

    /// The longest one admission may take before it fails with an
    /// [`is_backend`](LockError::is_backend) error (answered `503` with `Retry-After`).
    pub const BOUND: Duration = Duration::from_secs(5);

    /// Admits `token` (see [`FenceStore::admit`]), within [`BOUND`](Self::BOUND).
    ///
    /// ```
    /// use lock_runtime::fence::{Fences, FencingToken, MemoryFences};
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let fences = Fences::new(MemoryFences::default());
    /// let token = FencingToken { resource: "orders:42".into(), token: 7 };
    /// assert!(fences.admit(&token).await.is_ok());
    /// # }
    /// ```
    pub async fn admit(&self, token: &FencingToken) -> Result<(), LockError> {
        match tokio::time::timeout(Self::BOUND, self.0.admit(&token.resource, token.token)).await {
            Ok(admitted) => admitted,
            Err(_) => Err(LockError::timed_out(&*token.resource, "fence", "admit a fencing token", Self::BOUND)),
        }
    }
}

impl fmt::Debug for Fences {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Fences")
    }
}

/// An extractor (Axum and Actix-web): the request's `Fencing-Token`, admitted by the service's
/// [`Fences`]. A request without the header, or with a malformed one, is answered
/// `400 Bad Request`; a stale token `409 Conflict`; both with a problem body
/// (`application/problem+json`, see [`crate::http`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fenced(pub FencingToken);

/// Why a [`Fenced`] extractor refused a request: its HTTP answer.
#[derive(Debug)]
pub struct FenceRejection(pub crate::http::HttpAnswer);

impl fmt::Display for FenceRejection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0.detail)
    }
}

impl Fenced {
    /// Reads and admits the header value `header` (`None`: no header) against `fences`.
    pub async fn admit(header: Option<&[u8]>, fences: Option<&Fences>) -> Result<Fenced, FenceRejection> {
        let Some(fences) = fences else {
            let error = LockError::invalid("", "a `Fenced` extractor found no `Fences` in the app's state");
            tracing::error!(%error, "misconfigured fence");
            return Err(FenceRejection(error.http_answer()));
        };
        let Some(value) = header else { return Err(bad_request("the request has no `Fencing-Token` header")) };
        let value = std::str::from_utf8(value).map_err(|_| bad_request("the `Fencing-Token` header is not UTF-8"))?;
        let token = FencingToken::parse(value).map_err(|e| bad_request(&e.to_string()))?;
        match fences.admit(&token).await {
            Ok(()) => Ok(Fenced(token)),
            Err(e) => Err(FenceRejection(e.http_answer())),
        }
    }
}

/// A request with more than one `Fencing-Token` header: which one the caller meant cannot be
/// known (only the first was read, so `[fresh, stale]` passed).
#[cfg(any(feature = "axum", feature = "actix"))]
fn several_headers() -> FenceRejection {
    bad_request("the request has several `Fencing-Token` headers; send exactly one")
}

fn bad_request(detail: &str) -> FenceRejection {
    FenceRejection(crate::http::HttpAnswer {
        status: 400,
        retry_after: None,
        problem_type: "https://docs.rs/lock-runtime/latest/lock_runtime/fence/struct.FencingToken.html",
        title: "Bad fencing token",
        detail: detail.to_owned(),
        lock: String::new(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A store that never answers.
    struct Hung;

    impl FenceStore for Hung {
        fn admit<'a>(&'a self, _resource: &'a str, _token: u64) -> BoxFuture<'a, Result<(), LockError>> {
            Box::pin(std::future::pending())
        }
    }

    #[tokio::test(start_paused = true)]
    async fn an_admission_is_bounded() {
        let token = FencingToken { resource: "orders:42".into(), token: 7 };
        let err = Fences::new(Hung).admit(&token).await.expect_err("bounded");
        assert!(err.is_backend(), "{err}");
        assert_eq!(err.http_answer().status, 503);
    }
}

#[cfg(feature = "axum")]
mod axum {
    use axum_core::extract::FromRequestParts;
    use axum_core::response::{IntoResponse, Response};
    use http::request::Parts;

    use super::{FenceRejection, Fenced, Fences, FencingToken};

    /// `400` or `409` with a problem body: see [`Fenced`].
    impl IntoResponse for FenceRejection {
        fn into_response(self) -> Response {
            crate::http::axum::respond(self.0)
        }
    }

    /// The request's `Fencing-Token`, admitted by the [`Fences`] in the request's extensions
    /// (`.layer(axum::Extension(fences))`).
    impl<S: Send + Sync> FromRequestParts<S> for Fenced {
        type Rejection = FenceRejection;

        async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, Self::Rejection> {
            if parts.headers.get_all(FencingToken::HEADER).iter().nth(1).is_some() {
                return Err(super::several_headers());
            }
            let header = parts.headers.get(FencingToken::HEADER).map(|v| v.as_bytes());
            Fenced::admit(header, parts.extensions.get::<Fences>()).await
        }
    }
}

#[cfg(feature = "actix")]
mod actix {
    use actix_web::dev::Payload;
    use actix_web::http::StatusCode;
    use actix_web::{FromRequest, HttpRequest, HttpResponse, ResponseError};

    use super::{FenceRejection, Fenced, Fences, FencingToken};

    /// `400` or `409` with a problem body: see [`Fenced`].
    impl ResponseError for FenceRejection {
        fn status_code(&self) -> StatusCode {
            crate::http::actix::status(&self.0)
        }

        fn error_response(&self) -> HttpResponse {
            crate::http::actix::respond(self.0.clone())
        }
    }

    /// The request's `Fencing-Token`, admitted by the [`Fences`] in the app data
    /// (`.app_data(fences)`).
    impl FromRequest for Fenced {
        type Error = FenceRejection;
        type Future = std::pin::Pin<Box<dyn std::future::Future<Output = Result<Fenced, FenceRejection>>>>;

        fn from_request(req: &HttpRequest, _payload: &mut Payload) -> Self::Future {
            if req.headers().get_all(FencingToken::HEADER).nth(1).is_some() {
                return Box::pin(std::future::ready(Err(super::several_headers())));
            }
            let header = req.headers().get(FencingToken::HEADER).map(|v| v.as_bytes().to_vec());
            let fences = req.app_data::<Fences>().cloned();
            Box::pin(async move { Fenced::admit(header.as_deref(), fences.as_ref()).await })
        }
    }
}
