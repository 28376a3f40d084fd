//! What the Redis fault runs check once every worker exited.

use std::time::{Duration, Instant};

/// Waits (bounded by a lease and room) until no key but the fencing counters (kept on purpose)
/// and no pub/sub channel of the library's (`lock:…`; a Sentinel's own stay) is left on any of
/// the Redis servers at `urls`; panics naming what is left otherwise. A node that does not answer (a replica being resynchronised) is asked again.
pub(crate) async fn nothing_left_on(urls: &[String], replay: &str) {
    let started = Instant::now();
    for url in urls {
        let client = redis::Client::open(url.as_str()).expect("url");
        loop {
            let look = async {
                let mut conn = client.get_multiplexed_async_connection().await?;
                let keys: Vec<String> = redis::cmd("KEYS").arg("*").query_async(&mut conn).await?;
                let channels: Vec<String> = redis::cmd("PUBSUB").arg("CHANNELS").query_async(&mut conn).await?;
                Ok::<_, redis::RedisError>((keys, channels))
            };
            let (left, channels) = match look.await {
                Ok((keys, channels)) => (
                    keys.into_iter().filter(|k| !k.starts_with("lock:fence")).collect::<Vec<_>>(),
                    channels.into_iter().filter(|c| c.starts_with("lock:")).collect(),
                ),
                Err(e) => (vec![format!("(no answer: {e})")], Vec::new()),
            };
            if left.is_empty() && channels.is_empty() {
                break;
            }
            assert!(
                started.elapsed() < Duration::from_secs(5),
                "left behind on {url} ({replay}): keys {left:?}, channels {channels:?}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}
