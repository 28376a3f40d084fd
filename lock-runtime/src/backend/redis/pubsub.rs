//! The pub/sub connection kept for waiters (`waiters.rs`), one task per server releases are
//! announced on (one for a single server, Sentinel or Cluster, one per Redlock node): [`serve`] connects with
//! backoff, makes the (un)subscriptions the waiters' bookkeeping asks for, pings under the
//! command timeout, hands messages and confirmations back, and connects again when the
//! connection is lost. What the subscriptions are for is the [`Subscriptions`] of each.

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use redis::aio::{PubSub, PubSubSink};
use tokio::sync::mpsc;

use super::topology::Source;
use crate::backend::BoxFuture;

/// The first pause between two connection attempts.
const MIN_BACKOFF: Duration = Duration::from_millis(20);
/// The longest pause between two connection attempts.
const MAX_BACKOFF: Duration = Duration::from_secs(1);

/// A subscription change in flight: `(subscribe, channels, ok)`.
type Op = BoxFuture<'static, (bool, Vec<Arc<str>>, bool)>;

/// The pub/sub task's timings.
#[derive(Clone, Copy, Debug)]
pub(super) struct Timings {
    /// Bound on connecting, (un)subscribing and each ping's answer.
    pub(super) timeout: Duration,
    /// How long a channel nobody waits on any more stays subscribed.
    pub(super) grace: Duration,
    /// How often the connection is pinged.
    pub(super) ping: Duration,
}

/// A subscription change: `SUBSCRIBE` (`true`) or `UNSUBSCRIBE` these channels.
pub(super) type Change = (bool, Vec<Arc<str>>);

/// The bookkeeping a pub/sub task serves: which channels it wants, and what a message, a
/// confirmed subscription and a lost connection mean to the waiters.
pub(super) trait Subscriptions: Send + 'static {
    /// Whether nothing is waited on (no connection is made until something is); `false` keeps
    /// a connection while the owner lives.
    fn idle(&self) -> bool {
        false
    }

    /// The next change to make, or (none) when to look again for channels to let go of.
    fn next_change(&self, grace: Duration) -> (Option<Change>, Option<Instant>);

    /// A message on `channel`.
    fn message(&self, channel: &str, payload: &str);

    /// `channels` were subscribed (a release before that may have gone unheard).
    fn confirmed(&self, channels: &[Arc<str>]);

    /// The connection was lost: everything still waited on is to be subscribed again.
    fn lost(&self);
}

/// The pub/sub task: keeps one connection from `source` and the subscriptions `subs` asks for,
/// until `poke` (which the owner pokes when its wishes change) is closed.
pub(super) async fn serve(
    subs: impl Subscriptions,
    source: Source,
    mut poke: mpsc::UnboundedReceiver<()>,
    timings: Timings,
) {
    let Timings { timeout, grace, ping: ping_every } = timings;
    loop {
        // Connect only while someone waits (or wants to): an idle node costs no connection.
        while subs.idle() {
            if poke.recv().await.is_none() {
                return;
            }
        }
        let Some(pubsub) = connect(&source, timeout, &mut poke).await else { return };
        let (sink, mut stream) = pubsub.split();
        tracing::debug!("redis pub/sub connected");
        let mut op: Option<Op> = None;
        let mut ping: Option<BoxFuture<'static, bool>> = None;
        let mut ping_at = tokio::time::Instant::now() + ping_every;
        loop {
            let mut sweep_at = None;
            if op.is_none() {
                let (next, at) = subs.next_change(grace);
                op = next.map(|(subscribe, channels)| change(sink.clone(), subscribe, channels, timeout));
                sweep_at = at;
            }
            tokio::select! {
                msg = stream.next() => match msg {
                    Some(msg) => {
                        let payload: String = msg.get_payload().unwrap_or_default();
                        subs.message(msg.get_channel_name(), &payload);
                    }
                    None => break,
                },
                (subscribe, channels, ok) = run(&mut op) => {
                    op = None;
                    if !ok {
                        break;
                    }
                    if subscribe {
                        subs.confirmed(&channels);
                    }
                }
                alive = run(&mut ping) => {
                    ping = None;
                    if !alive {
                        break;
                    }
                    ping_at = tokio::time::Instant::now() + ping_every;
                }
                _ = tokio::time::sleep_until(ping_at), if ping.is_none() => {
                    ping = Some(ping_once(sink.clone(), timeout));
                }
                p = poke.recv() => if p.is_none() { return },
                _ = sleep_until(sweep_at) => {}
            }
        }
        tracing::debug!("redis pub/sub connection lost; reconnecting");
        subs.lost();
    }
}

/// Connects a pub/sub connection from `source`, trying again with backoff (doubling from 20 ms
/// to 1 s) until it works; `None` once `poke` is closed (the owner is gone), so the task ends.
/// Each try is bounded by `timeout`.
async fn connect(source: &Source, timeout: Duration, poke: &mut mpsc::UnboundedReceiver<()>) -> Option<PubSub> {
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
async fn run<T>(fut: &mut Option<BoxFuture<'static, T>>) -> T {
    match fut {
        Some(fut) => fut.await,
        None => std::future::pending().await,
    }
}

/// Sleeps until `at`, or forever without one.
async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at.into()).await,
        None => std::future::pending().await,
    }
}

/// One `PING` on the pub/sub connection: `false` if it failed or got no answer in time.
fn ping_once(mut sink: PubSubSink, timeout: Duration) -> BoxFuture<'static, bool> {
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
fn change(mut sink: PubSubSink, subscribe: bool, channels: Vec<Arc<str>>, timeout: Duration) -> Op {
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
