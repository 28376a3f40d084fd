//! `LockError` as an Axum response (feature `axum`).

use axum_core::response::{IntoResponse, Response};
use http::{header, HeaderValue, StatusCode};

use crate::error::LockError;
use crate::http::HttpAnswer;

/// Answers by the error's class: see [`crate::http`].
impl IntoResponse for LockError {
    fn into_response(self) -> Response {
        self.log_for_http();
        respond(self.http_answer())
    }
}

/// The response of `answer`: its status, `Retry-After` and problem body.
pub(crate) fn respond(answer: HttpAnswer) -> Response {
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
