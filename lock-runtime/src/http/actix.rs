//! `LockError` as an Actix-web error response (feature `actix`).

use actix_web::http::{header, StatusCode};
use actix_web::{HttpResponse, ResponseError};

use crate::error::LockError;

/// Answers by the error's class: see [`crate::http`].
impl ResponseError for LockError {
    fn status_code(&self) -> StatusCode {
        StatusCode::from_u16(self.http_answer().status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR)
    }

    fn error_response(&self) -> HttpResponse {
        self.log_for_http();
        let answer = self.http_answer();
        let mut response = HttpResponse::build(self.status_code());
        response.content_type("text/plain; charset=utf-8");
        if let Some(seconds) = answer.retry_after {
            response.insert_header((header::RETRY_AFTER, seconds.to_string()));
        }
        response.body(answer.body)
    }
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
        }
    }
}
