//! `LockError` as an Actix-web error response (feature `actix`).

use actix_web::http::{header, StatusCode};
use actix_web::{HttpResponse, ResponseError};

use crate::error::LockError;
use crate::http::HttpAnswer;

/// Answers by the error's class: see [`crate::http`].
impl ResponseError for LockError {
    fn status_code(&self) -> StatusCode {
        status(&self.http_answer())
    }

    fn error_response(&self) -> HttpResponse {
        self.log_for_http();
        respond(self.http_answer())
    }
}

/// The status of `answer`.
pub(crate) fn status(answer: &HttpAnswer) -> StatusCode {
    StatusCode::from_u16(answer.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR)
}

/// The response of `answer`: its status, `Retry-After` and problem body.
pub(crate) fn respond(answer: HttpAnswer) -> HttpResponse {
    let mut response = HttpResponse::build(status(&answer));
    response.content_type(crate::http::PROBLEM_JSON);
    if let Some(seconds) = answer.retry_after {
        response.insert_header((header::RETRY_AFTER, seconds.to_string()));
    }
    response.body(answer.problem_json())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn responses_carry_status_and_retry_after() {
        for e in crate::http::tests::samples() {
            let answer = e.http_answer();
            let response = e.error_response();
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
