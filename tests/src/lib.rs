//! Cross-crate test support: the backend conformance suite (run against every backend) and
//! harnesses that start real servers for the backend tests.

pub use lock_runtime::{conformance, conformance_suite};
pub mod clocks;
pub mod contention;
pub mod ensemble;
pub mod etcd_cluster;
pub mod etcd_server;
pub mod http;
pub mod jepsen;
pub mod lifecycle;
#[cfg(any(feature = "postgres", feature = "mysql"))]
pub mod multiplexing;
#[cfg(feature = "mysql")]
pub mod mysql_server;
pub mod netns;
pub mod partitions;
#[cfg(feature = "postgres")]
pub mod pg_server;
#[cfg(feature = "redis")]
pub mod redis_cluster;
#[cfg(feature = "redis")]
pub mod redis_sentinel;
#[cfg(feature = "redis")]
pub mod redis_server;
pub mod server_clock;
pub mod server_process;
pub mod tls_certs;
pub mod zk_ensemble;
pub mod zk_server;

/// A loopback port nobody listens on right now (for the servers the tests start).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind(("127.0.0.1", 0)).and_then(|l| l.local_addr()).map(|a| a.port()).expect("free port")
}

/// Prints a figure a test measured (a fault suite's availability, the soak's resources) and,
/// when `LOCK_TEST_FIGURES` names a file (`scripts/run_tests.py` sets it), appends it there, so
/// that the test run shows it although the test passed and its output was captured.
pub fn figure(test: &str, line: &str) {
    eprintln!("{test}: {line}");
    if let Ok(path) = std::env::var("LOCK_TEST_FIGURES") {
        use std::io::Write;
        if let Ok(mut file) = std::fs::OpenOptions::new().create(true).append(true).open(path) {
            let _ = writeln!(file, "{test}: {line}");
        }
    }
}

/// A name no other test (or earlier run against the same server) uses.
pub fn unique(label: &str) -> String {
    format!("{label}:{}", lock_runtime::backend::OwnerId::next())
}

/// Retries `lock` of `name` until the backend answers again (after an outage it caused),
/// within 15 s; panics otherwise.
pub async fn lock_after_outage(m: &lock_runtime::LockManager, name: &str) -> lock_runtime::LockGuard {
    use std::time::{Duration, Instant};
    let started = Instant::now();
    loop {
        match m.lock(name).wait(Duration::from_secs(2)).await {
            Ok(guard) => return guard,
            Err(e) if e.is_backend() && started.elapsed() < Duration::from_secs(15) => {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(e) => panic!("no recovery after {:?}: {e}", started.elapsed()),
        }
    }
}

/// Polls `fut` exactly once, with this task's waker: `Ready` with its output, or `Pending`.
/// For tests that drop a future after a given number of polls.
pub async fn poll_once<F: std::future::Future + Unpin>(fut: &mut F) -> std::task::Poll<F::Output> {
    std::future::poll_fn(|cx| std::task::Poll::Ready(std::pin::Pin::new(&mut *fut).poll(cx))).await
}

/// Looks again every 10 ms until `look` gives `Ok(())`, for what nothing signals (a release
/// finished in the background, another process's waiter queued, a subscription the server
/// dropped); panics after `within` with `what` and the last `Err` seen.
pub async fn eventually<E: std::fmt::Debug>(
    what: &str,
    within: std::time::Duration,
    mut look: impl AsyncFnMut() -> Result<(), E>,
) {
    let started = std::time::Instant::now();
    loop {
        let seen = match look().await {
            Ok(()) => return,
            Err(seen) => seen,
        };
        assert!(started.elapsed() < within, "not {what} after {within:?}; last seen: {seen:?}");
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
}

/// `Ok(())` when `got == want`, else `Err(got)`: the look of [`eventually`] for a count.
pub fn reached<T: PartialEq>(got: T, want: T) -> Result<(), T> {
    if got == want {
        Ok(())
    } else {
        Err(got)
    }
}

/// The error `outcome` must be (`why`: why it must fail); panics if it succeeded.
pub fn refused<T>(outcome: Result<T, lock_runtime::LockError>, why: &str) -> lock_runtime::LockError {
    match outcome {
        Ok(_) => panic!("succeeded although {why}"),
        Err(e) => e,
    }
}

/// Awaits `fut`, asserting that it ended within `bound` (plus a second for a loaded machine).
pub async fn within_bound<T>(bound: std::time::Duration, fut: impl std::future::Future<Output = T>) -> T {
    let started = std::time::Instant::now();
    let out = fut.await;
    assert!(started.elapsed() < bound + std::time::Duration::from_secs(1), "took {:?}", started.elapsed());
    out
}

/// Takes `name` on `m`, queues a second acquisition behind it, releases: the waiter is handed
/// the lock with a greater fencing token (a release heard through the backend's wake-ups).
pub async fn hand_off(m: &lock_runtime::LockManager, name: &str) {
    let first = m.lock(name).await.expect("lock");
    let (m2, name2) = (m.clone(), name.to_owned());
    let waiter =
        tokio::spawn(
            async move { m2.lock(name2).wait(std::time::Duration::from_secs(5)).await.map(|g| g.fencing_token()) },
        );
    tokio::time::sleep(std::time::Duration::from_millis(100)).await; // the waiter queues
    let token = first.fencing_token();
    first.release().await.expect("release");
    assert!(waiter.await.expect("waiter").expect("handed over") > token);
}

/// Until every connection of the application's sqlx `pool` is idle again: given back by the
/// backend (sqlx returns a connection from a task of its own; 10 s is the margin).
#[cfg(feature = "sqlx")]
pub async fn until_given_back<DB: sqlx::Database>(pool: &sqlx::Pool<DB>) {
    let started = std::time::Instant::now();
    while pool.num_idle() < pool.size() as usize {
        assert!(started.elapsed() < std::time::Duration::from_secs(10), "a connection was not given back");
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
}
