//! A separate OS process for the Redis cross-process tests.
//!
//! ```text
//! redis_worker <url> increment <lock> <counter-key> <times>   # non-atomic GET/SET increments under the lock
//! redis_worker <url> hold <lock> <default-lease-ms>            # takes the lock (waiting up to 60 s; watchdog), prints `held <token>`, sleeps
//! ```

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::Write;
use std::time::Duration;

use lock_runtime::LockManager;

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [url, mode, rest @ ..] = args.as_slice() else { panic!("usage: redis_worker <url> <mode> ...") };
    match (mode.as_str(), rest) {
        ("increment", [lock, counter, times]) => {
            let times: u32 = times.parse().expect("times");
            let manager = LockManager::redis(url).await.expect("connect");
            let client = redis::Client::open(url.as_str()).expect("url");
            let mut conn = client.get_multiplexed_async_connection().await.expect("raw connection");
            for _ in 0..times {
                let guard = manager.lock(lock).wait(Duration::from_secs(60)).await.expect("lock");
                let value: Option<u64> = redis::cmd("GET").arg(counter).query_async(&mut conn).await.expect("GET");
                // Widen the race window: without the lock, concurrent increments would be lost.
                tokio::task::yield_now().await;
                let _: () = redis::cmd("SET")
                    .arg(counter)
                    .arg(value.unwrap_or(0) + 1)
                    .query_async(&mut conn)
                    .await
                    .expect("SET");
                guard.release().await.expect("release");
            }
            println!("done");
        }
        ("hold", [lock, lease_ms]) => {
            let lease = Duration::from_millis(lease_ms.parse().expect("lease"));
            let manager = LockManager::builder().default_lease(lease).redis(url).await.expect("connect");
            let guard = manager.lock(lock).wait(Duration::from_secs(60)).await.expect("lock");
            println!("held {}", guard.fencing_token());
            std::io::stdout().flush().expect("flush");
            tokio::time::sleep(Duration::from_secs(3600)).await;
            drop(guard);
        }
        _ => panic!("unknown mode {mode} {rest:?}"),
    }
}
