//! HTTP responses for [`LockError`], so web handlers can return lock errors directly.
//!
//! With the `axum` feature, `LockError` implements `axum::response::IntoResponse`; with the
//! `actix` feature, `actix_web::ResponseError`. Both answer by the error's class:
//!
//! | class | status | headers |
//! |---|---|---|
//! | [`is_contended`](LockError::is_contended) | `423 Locked` | `Retry-After: 1` |
//! | [`is_backend`](LockError::is_backend) | `503 Service Unavailable` | `Retry-After: 1` |
//! | [`is_lost`](LockError::is_lost) | `500 Internal Server Error` | |
//! | [`is_invalid`](LockError::is_invalid), [`is_not_configured`](LockError::is_not_configured) | `500 Internal Server Error` | |
//!
//! The body is one short line of plain text naming the lock; the full error (with the
//! backend's details) is logged with `tracing` instead of being sent to the client.
//! Contention is `423 Locked` rather than `409 Conflict`: the request was fine and may
//! succeed as is once the holder is done, which is what `Retry-After` says. Invalid input is a
//! `500`, not a `400`: lock names and durations come from the server's own code (a template
//! rendered from a request that the handler already accepted).
#![doc = include_str!("handlers.md")]

use crate::error::LockError;

#[cfg(feature = "actix")]
mod actix;
#[cfg(feature = "axum")]
mod axum;

/// How a [`LockError`] is answered over HTTP (see the [module docs](self)).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpAnswer {
    /// The status code.
    pub status: u16,
    /// The `Retry-After` header in seconds, if any.
    pub retry_after: Option<u32>,
    /// A short plain-text body naming the lock.
    pub body: String,
}

impl LockError {
    /// How this error is answered over HTTP: status, `Retry-After` and a short body.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let manager = lock_runtime::LockManager::memory();
    /// let _held = manager.lock("order:42").await.unwrap();
    /// let err = manager.lock("order:42").wait(std::time::Duration::ZERO).await.unwrap_err();
    /// let answer = err.http_answer();
    /// assert_eq!((answer.status, answer.retry_after), (423, Some(1)));
    /// # }
    /// ```
    pub fn http_answer(&self) -> HttpAnswer {
        let name = self.lock_name();
        let (status, retry_after, body) = match self {
            LockError::Contended { .. } => {
                (423, Some(1), format!("`{name}` is busy with another request; retry shortly"))
            }
            LockError::Backend { .. } => {
                (503, Some(1), format!("the lock service is unavailable for `{name}`; retry shortly"))
            }
            LockError::Lost { .. } => (500, None, format!("the lock on `{name}` was lost while the request ran")),
            LockError::Invalid { .. } | LockError::NotConfigured { .. } => {
                (500, None, format!("the lock `{name}` is misconfigured on the server"))
            }
        };
        HttpAnswer { status, retry_after, body }
    }

    #[cfg(any(feature = "axum", feature = "actix"))]
    pub(crate) fn log_for_http(&self) {
        match self {
            LockError::Contended { .. } => {
                tracing::debug!(error = %crate::telemetry::shown_error(self), "answering a request with 423 Locked")
            }
            _ => tracing::warn!(error = %crate::telemetry::shown_error(self), "a lock error failed a request"),
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use std::time::Duration;

    /// One error of each class.
    pub(crate) fn samples() -> Vec<LockError> {
        vec![
            LockError::Contended { name: "order:42".into(), waited: Duration::from_secs(2), attempts: 3 },
            LockError::backend("order:42", "redis", "acquire", "connection refused"),
            LockError::lost("order:42", "its lease ran out"),
            LockError::invalid("order:42", "lease 0ns is shorter than the least accepted, 1ms"),
            LockError::NotConfigured { name: "order:42".into() },
        ]
    }

    #[test]
    fn answers_by_class() {
        let answers: Vec<_> = samples().iter().map(|e| (e.http_answer().status, e.http_answer().retry_after)).collect();
        assert_eq!(answers, [(423, Some(1)), (503, Some(1)), (500, None), (500, None), (500, None)]);
        for e in samples() {
            let body = e.http_answer().body;
            assert!(body.contains("order:42"), "{body}");
            assert!(!body.contains("connection refused"), "backend details stay in the log: {body}");
        }
    }
}
