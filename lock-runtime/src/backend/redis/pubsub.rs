//! The plumbing of a pub/sub connection kept for waiters, shared by the one-server waiters
//! (`waiters.rs`) and Redlock's per-node wake-ups (`redlock/wake.rs`): connecting with
//! backoff, (un)subscribing and pinging under the command timeout, and polling optional
//! futures inside `select!`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use redis::aio::{PubSub, PubSubSink};
use tokio::sync::mpsc;

use super::topology::Source;
use crate::backend::BoxFuture;

/// The first pause between two connection attempts.
const MIN_BACKOFF: Duration = Duration::from_millis(20);
/// The longest pause between two connection attempts.
const MAX_BACKOFF: Duration = Duration::from_secs(1);

/// A subscription change in flight: `(subscribe, channels, ok)`.
pub(super) type Op = BoxFuture<'static, (bool, Vec<Arc<str>>, bool)>;

/// Connects a pub/sub connection from `source`, trying again with backoff (doubling from 20 ms
/// to 1 s) until it works; `None` once `poke` is closed (the owner is gone), so the task ends.
/// Each try is bounded by `timeout`.
pub(super) async fn connect(
    source: &Source,
    timeout: Duration,
    poke: &mut mpsc::UnboundedReceiver<()>,
) -> Option<PubSub> {
    let mut backoff = MIN_BACKOFF;
    loop {
        let why = match tokio::time::timeout(timeout, source.pubsub()).await {
            Ok(Ok(pubsub)) => return Some(pubsub),
            Ok(Err(e)) => e.to_string(),
            Err(_) => format!("no answer within {timeout:?}"),
        };
        tracing::debug!(error = %why, "redis pub/sub connection failed; retrying in {backoff:?}");
        let until = tokio::time::Instant::now() + backoff;
        loop {
            tokio::select! {
                _ = tokio::time::sleep_until(until) => break,
                p = poke.recv() => p?,
            }
        }
        backoff = backoff.saturating_mul(2).min(MAX_BACKOFF);
    }
}

/// Awaits `fut` if there is one; never completes otherwise (a `select!` branch left idle).
pub(super) async fn run<T>(fut: &mut Option<BoxFuture<'static, T>>) -> T {
    match fut {
        Some(fut) => fut.await,
        None => std::future::pending().await,
    }
}

/// Sleeps until `at`, or forever without one.
pub(super) async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at.into()).await,
        None => std::future::pending().await,
    }
}

/// One `PING` on the pub/sub connection: `false` if it failed or got no answer in time.
pub(super) fn ping_once(mut sink: PubSubSink, timeout: Duration) -> BoxFuture<'static, bool> {
    Box::pin(async move {
        match tokio::time::timeout(timeout, sink.ping::<redis::Value>()).await {
            Ok(Ok(_)) => true,
            Ok(Err(e)) => {
                tracing::debug!(error = %e, "redis pub/sub ping failed");
                false
            }
            Err(_) => {
                tracing::debug!("redis pub/sub ping got no answer within {timeout:?}; reconnecting");
                false
            }
        }
    })
}

/// `SUBSCRIBE` (or `UNSUBSCRIBE`) `channels`, bounded by `timeout`.
pub(super) fn change(mut sink: PubSubSink, subscribe: bool, channels: Vec<Arc<str>>, timeout: Duration) -> Op {
    Box::pin(async move {
        let names: Vec<&str> = channels.iter().map(|c| &**c).collect();
        let result = if subscribe {
            tokio::time::timeout(timeout, sink.subscribe(&names)).await
        } else {
            tokio::time::timeout(timeout, sink.unsubscribe(&names)).await
        };
        let ok = match result {
            Ok(Ok(())) => true,
            Ok(Err(e)) => {
                tracing::debug!(error = %e, "redis pub/sub (un)subscribe failed");
                false
            }
            Err(_) => {
                tracing::debug!("redis pub/sub (un)subscribe got no answer within {timeout:?}");
                false
            }
        };
        drop(names);
        (subscribe, channels, ok)
    })
}
