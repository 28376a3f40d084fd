//! `LockError` as an Axum response (feature `axum`).

use axum_core::extract::FromRequestParts;
use axum_core::response::{IntoResponse, Response};
use http::request::Parts;
use http::{header, HeaderValue, StatusCode};

use crate::error::LockError;
use crate::fence::{FenceRejection, Fenced, Fences, FencingToken};
use crate::http::HttpAnswer;

/// Answers by the error's class: see [`crate::http`].
impl IntoResponse for LockError {
    fn into_response(self) -> Response {
        self.log_for_http();
        respond(self.http_answer())
    }
}

/// `400` or `409` with a problem body: see [`Fenced`].
impl IntoResponse for FenceRejection {
    fn into_response(self) -> Response {
        respond(self.0)
    }
}

/// The request's `Fencing-Token`, admitted by the [`Fences`] in the request's extensions
/// (`.layer(axum::Extension(fences))`).
impl<S: Send + Sync> FromRequestParts<S> for Fenced {
    type Rejection = FenceRejection;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, Self::Rejection> {
        let header = parts.headers.get(FencingToken::HEADER).map(|v| v.as_bytes());
        Fenced::admit(header, parts.extensions.get::<Fences>()).await
    }
}

fn respond(answer: HttpAnswer) -> Response {
    let status = StatusCode::from_u16(answer.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let mut response = (status, answer.problem_json()).into_response();
    response.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static(crate::http::PROBLEM_JSON));
    if let Some(seconds) = answer.retry_after {
        response.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from(seconds));
    }
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn responses_carry_status_and_retry_after() {
        for e in crate::http::tests::samples() {
            let answer = e.http_answer();
            let response = e.into_response();
            assert_eq!(response.status().as_u16(), answer.status);
            let retry = response.headers().get(header::RETRY_AFTER).map(|v| v.to_str().unwrap_or("?").to_owned());
            assert_eq!(retry, answer.retry_after.map(|s| s.to_string()));
            assert_eq!(
                response.headers().get(header::CONTENT_TYPE).map(|v| v.as_bytes()),
                Some(&b"application/problem+json"[..])
            );
        }
    }
}
