//! HTTP responses for [`LockError`], so web handlers can return lock errors directly.
//!
//! With the `axum` feature, `LockError` implements `axum::response::IntoResponse`; with the
//! `actix` feature, `actix_web::ResponseError`. Both answer by the error's class:
//!
//! | class | status | headers |
//! |---|---|---|
//! | [`is_contended`](LockError::is_contended) | `423 Locked` | `Retry-After: 1` |
//! | [`is_backend`](LockError::is_backend) | `503 Service Unavailable` | `Retry-After: 1` |
//! | [`is_fenced`](LockError::is_fenced) | `409 Conflict` | |
//! | [`is_lost`](LockError::is_lost) | `500 Internal Server Error` | |
//! | [`is_shut_down`](LockError::is_shut_down) | `503 Service Unavailable` | `Retry-After: 1` |
//! | [`is_invalid`](LockError::is_invalid), [`is_not_configured`](LockError::is_not_configured) | `500 Internal Server Error` | |
//!
//! The body is an RFC 9457 problem (`Content-Type: application/problem+json`), so JSON APIs
//! answer JSON:
//!
//! ```json
//! {"type":"https://docs.rs/lock-runtime/latest/lock_runtime/http/#contended","title":"Lock busy",
//!  "status":423,"detail":"`order:42` is busy with another request; retry shortly","lock":"order:42"}
//! ```
//!
//! `type` names the class (an anchor of these docs), `detail` is one short sentence naming the
//! lock, `lock` is the lock's name. The full error (with the backend's details) is logged with
//! `tracing` instead of being sent to the client. Contention is `423 Locked` rather than
//! `409 Conflict`: the request was fine and may succeed as is once the holder is done, which is
//! what `Retry-After` says; `409` is kept for a write a fence refused (a stale holder: retrying
//! it cannot succeed). Invalid input is a `500`, not a `400`: lock names and durations come
//! from the server's own code (a template rendered from a request that the handler already
//! accepted).
//!
//! <a id="contended"></a><a id="backend"></a><a id="fenced"></a><a id="lost"></a>
//! <a id="misconfigured"></a><a id="shut-down"></a><a id="conflict"></a>
#![doc = include_str!("handlers.md")]

use crate::error::LockError;

#[cfg(feature = "actix")]
pub(crate) mod actix;
#[cfg(feature = "axum")]
pub(crate) mod axum;

/// How a [`LockError`] is answered over HTTP (see the [module docs](self)).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpAnswer {
    /// The status code.
    pub status: u16,
    /// The `Retry-After` header in seconds, if any.
    pub retry_after: Option<u32>,
    /// The problem's `type`: a URI naming the error's class.
    pub problem_type: &'static str,
    /// The problem's `title`: the class in a few words.
    pub title: &'static str,
    /// The problem's `detail`: one short sentence naming the lock.
    pub detail: String,
    /// The lock's name (the problem's `lock` member).
    pub lock: String,
}

/// A problem `type`: the anchor of a class in these docs.
macro_rules! type_uri {
    ($class:literal) => {
        concat!("https://docs.rs/lock-runtime/latest/lock_runtime/http/#", $class)
    };
}

/// The `Content-Type` of a problem body (RFC 9457).
pub const PROBLEM_JSON: &str = "application/problem+json";

impl HttpAnswer {
    /// The RFC 9457 problem body (`application/problem+json`).
    ///
    /// ```
    /// let err = lock_runtime::LockError::Fenced { name: "orders:42".into(), token: 7, highest: 9 };
    /// let body = err.http_answer().problem_json();
    /// assert!(body.starts_with(r#"{"type":"https://docs.rs/lock-runtime/latest/lock_runtime/http/#fenced""#));
    /// assert!(body.contains(r#""status":409"#) && body.contains(r#""lock":"orders:42""#));
    /// ```
    pub fn problem_json(&self) -> String {
        let mut out = String::with_capacity(160 + self.detail.len() + self.lock.len());
        out.push_str("{\"type\":");
        json_string(&mut out, self.problem_type);
        out.push_str(",\"title\":");
        json_string(&mut out, self.title);
        out.push_str(&format!(",\"status\":{},\"detail\":", self.status));
        json_string(&mut out, &self.detail);
        out.push_str(",\"lock\":");
        json_string(&mut out, &self.lock);
        out.push('}');
        out
    }
}

/// Appends `text` as a JSON string.
fn json_string(out: &mut String, text: &str) {
    out.push('"');
    for c in text.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if u32::from(c) < 0x20 => out.push_str(&format!("\\u{:04x}", u32::from(c))),
            c => out.push(c),
        }
    }
    out.push('"');
}

impl LockError {
    /// How this error is answered over HTTP: status, `Retry-After` and the problem's members.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let manager = lock_runtime::LockManager::memory();
    /// let _held = manager.lock("order:42").await.unwrap();
    /// let err = manager.lock("order:42").wait(std::time::Duration::ZERO).await.unwrap_err();
    /// let answer = err.http_answer();
    /// assert_eq!((answer.status, answer.retry_after), (423, Some(1)));
    /// assert_eq!(answer.lock, "order:42");
    /// # }
    /// ```
    pub fn http_answer(&self) -> HttpAnswer {
        let name = self.lock_name();
        let (status, retry_after, problem_type, title, detail) = match self {
            LockError::Contended { .. } => (
                423,
                Some(1),
                type_uri!("contended"),
                "Lock busy",
                format!("`{name}` is busy with another request; retry shortly"),
            ),
            LockError::Backend { .. } => (
                503,
                Some(1),
                type_uri!("backend"),
                "Lock service unavailable",
                format!("the lock service is unavailable for `{name}`; retry shortly"),
            ),
            LockError::Fenced { token, highest, .. } => (
                409,
                None,
                type_uri!("fenced"),
                "Stale fencing token",
                format!(
                    "a write to `{name}` with fencing token {token} was refused: a newer holder wrote with {highest}"
                ),
            ),
            LockError::Conflict { .. } => (
                503,
                Some(1),
                type_uri!("conflict"),
                "Concurrent update",
                format!("a write to `{name}` met a concurrent one; retry shortly"),
            ),
            LockError::ShutDown { .. } => (
                503,
                Some(1),
                type_uri!("shut-down"),
                "Shutting down",
                format!("this server is shutting down and takes no lock on `{name}`; retry shortly"),
            ),
            LockError::Lost { .. } => (
                500,
                None,
                type_uri!("lost"),
                "Lock lost",
                format!("the lock on `{name}` was lost while the request ran"),
            ),
            LockError::Invalid { .. } | LockError::NotConfigured { .. } => (
                500,
                None,
                type_uri!("misconfigured"),
                "Lock misconfigured",
                format!("the lock `{name}` is misconfigured on the server"),
            ),
        };
        HttpAnswer { status, retry_after, problem_type, title, detail, lock: name.to_owned() }
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
            LockError::Contended { name: "order:42".into(), waited: Duration::from_secs(2), attempts: 3, held: true },
            LockError::backend("order:42", "redis", "acquire", "connection refused"),
            LockError::lost("order:42", "its lease ran out"),
            LockError::invalid("order:42", "lease 0ns is shorter than the least accepted, 1ms"),
            LockError::NotConfigured { name: "order:42".into() },
            LockError::ShutDown { name: "order:42".into() },
            LockError::Fenced { name: "order:42".into(), token: 7, highest: 9 },
            LockError::Conflict {
                name: "order:42".into(),
                sqlstate: "40001".into(),
                message: "concurrent update".into(),
            },
        ]
    }

    #[test]
    fn answers_by_class() {
        let answers: Vec<_> = samples().iter().map(|e| (e.http_answer().status, e.http_answer().retry_after)).collect();
        assert_eq!(
            answers,
            [
                (423, Some(1)),
                (503, Some(1)),
                (500, None),
                (500, None),
                (500, None),
                (503, Some(1)),
                (409, None),
                (503, Some(1))
            ]
        );
        for e in samples() {
            let body = e.http_answer().problem_json();
            assert!(body.contains(r#""lock":"order:42""#), "{body}");
            assert!(!body.contains("connection refused"), "backend details stay in the log: {body}");
        }
    }

    #[test]
    fn problem_bodies_escape_names() {
        let err = LockError::lost("a\"b\\c\n", "gone");
        let body = err.http_answer().problem_json();
        assert!(body.ends_with(r#","lock":"a\"b\\c\u000a"}"#), "{body}");
    }
}
