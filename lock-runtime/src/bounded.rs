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

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn ready_futures_need_no_timer_and_slow_ones_are_cut() {
        assert_eq!(bounded(Duration::ZERO, async { 7 }).await, Some(7));
        assert_eq!(bounded(Duration::from_millis(10), std::future::pending::<()>()).await, None);
        let slow = async {
            tokio::time::sleep(Duration::from_millis(1)).await;
            8
        };
        assert_eq!(bounded(Duration::from_secs(5), slow).await, Some(8));
    }
}
