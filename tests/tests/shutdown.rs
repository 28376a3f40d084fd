//! Clean shutdowns against real servers: a service stopped by SIGTERM that shuts its manager
//! down before returning from `main` (`shutdown_worker`, as the README says) leaves nothing
//! behind. A process waiting on its lock gets it, and a campaigner waiting on its election is
//! elected, right after the SIGTERM instead of a lease later; the lock of a guard dropped just
//! before the shutdown is free; the worker's leader loop ends with `is_shut_down` and its held
//! guard reports the lock lost.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use lock_runtime::LockManager;
use lock_tests::unique;

/// The worker's locks have the default 30 s lease, renewed every 10 s: a lock it left behind
/// would be granted at least 20 s after the SIGTERM. Its successor must have it within
/// `AT_ONCE` (a loaded machine's margin over a few round trips, far under 20 s).
const AT_ONCE: Duration = Duration::from_secs(8);

async fn stopped_by_sigterm(url: String) {
    let (name, dropped, election) = (unique("held"), unique("dropped"), unique("leader"));
    let mut child = Command::new(env!("CARGO_BIN_EXE_shutdown_worker"))
        .args([&url, &name, &dropped, &election])
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn the worker");
    let (lines_tx, mut lines) = tokio::sync::mpsc::unbounded_channel();
    let stdout = child.stdout.take().expect("stdout");
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { return };
            if lines_tx.send(line).is_err() {
                return;
            }
        }
    });
    let ready = tokio::time::timeout(Duration::from_secs(60), lines.recv()).await.expect("the worker's start");
    assert_eq!(ready.as_deref(), Some("ready"), "the worker did not start");

    let observer = LockManager::connect(&url).await.expect("connect");
    let (m, lock) = (observer.clone(), name.clone());
    let waiter = tokio::spawn(async move {
        let guard = m.lock(&lock).wait(Duration::from_secs(60)).await.expect("the waiter's lock");
        (Instant::now(), guard)
    });
    let campaign = observer.election(&election);
    let campaigner = tokio::spawn(async move {
        let leadership = campaign.campaign().wait(Duration::from_secs(60)).await.expect("the successor's campaign");
        (Instant::now(), leadership)
    });

    let pid = child.id().to_string();
    let sent = Instant::now();
    assert!(Command::new("kill").args(["-TERM", &pid]).status().expect("kill").success());
    // Each line within 30 s (a hang, not a speed); the worker is killed if it hangs.
    let mut said = Vec::new();
    while let Ok(Some(line)) = tokio::time::timeout(Duration::from_secs(30), lines.recv()).await {
        said.push(line);
    }
    let _ = Command::new("kill").args(["-KILL", &pid]).status();
    let status = tokio::task::spawn_blocking(move || child.wait()).await.expect("reaper").expect("wait");
    assert_eq!(said, ["leader: shut down", "guard: lost", "stopped"], "how the worker's locks ended ({status})");
    assert!(status.success(), "the worker failed ({status})");

    let (locked_at, guard) = waiter.await.expect("waiter");
    let took = locked_at.saturating_duration_since(sent);
    assert!(took < AT_ONCE, "the waiter got the lock {took:?} after the SIGTERM (a lease is 30 s)");
    let (elected_at, leadership) = campaigner.await.expect("campaigner");
    let took = elected_at.saturating_duration_since(sent);
    assert!(took < AT_ONCE, "the successor was elected {took:?} after the SIGTERM (a lease is 30 s)");
    let free = observer.try_lock(&dropped).await.expect("try_lock");
    assert!(free.is_some(), "the lock of the guard dropped before the shutdown was left held");

    free.unwrap().release().await.expect("release");
    guard.release().await.expect("release");
    leadership.resign().await.expect("resign");
    observer.shutdown().await;
}

#[cfg(feature = "redis")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis() {
    let server = lock_tests::redis_server::RedisServer::start();
    stopped_by_sigterm(server.url()).await;
}

#[cfg(feature = "postgres")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres() {
    let server = lock_tests::pg_server::PgServer::start();
    stopped_by_sigterm(server.url()).await;
}

#[cfg(feature = "mysql")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mysql() {
    let server = lock_tests::mysql_server::MysqlServer::start();
    stopped_by_sigterm(server.url()).await;
}

#[cfg(feature = "etcd")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd() {
    let server = lock_tests::etcd_server::shared();
    stopped_by_sigterm(format!("etcd://127.0.0.1:{}", server.port())).await;
}

#[cfg(feature = "zookeeper")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zookeeper() {
    let server = lock_tests::zk_server::shared();
    stopped_by_sigterm(format!("zookeeper://{}", server.hosts())).await;
}
