//! Time bounds on backend operations that cost nothing when the operation is ready at once.

use std::future::Future;
use std::pin::pin;
use std::task::Poll;
use std::time::Duration;

/// Runs `fut` for at most `bound`: `None` if it did not finish in time. The timer is only
/// armed if the first poll leaves the operation pending (in-process backends finish at once).
pub(crate) async fn bounded<F: Future>(bound: Duration, fut: F) -> Option<F::Output> {
    let mut fut = pin!(fut);
    if let Poll::Ready(out) = std::future::poll_fn(|cx| Poll::Ready(fut.as_mut().poll(cx))).await {
        return Some(out);
    }
    tokio::time::timeout(bound, fut).await.ok()
}
