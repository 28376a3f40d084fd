//! `lockctl` end to end: the binary run against real Redis and ZooKeeper servers, its output
//! parsed, while locks are held by managers of this process.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use lock_runtime::backend::redis::RedisBackend;
use lock_runtime::backend::zookeeper::ZookeeperBackend;
use lock_runtime::{LockGuard, LockManager};
use lock_tests::redis_server::RedisServer;
use lock_tests::{unique, zk_server};
use serde_json::Value;

const LABEL: &str = "billing-worker";

/// What a run of `lockctl` ended with.
struct Run {
    code: i32,
    stdout: String,
    stderr: String,
}

impl Run {
    fn json(&self) -> Value {
        serde_json::from_str(&self.stdout).unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.stdout))
    }
}

/// Runs `lockctl args…` with no terminal on standard input.
async fn lockctl(args: &[&str]) -> Run {
    let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
    tokio::task::spawn_blocking(move || {
        let out =
            Command::new(env!("CARGO_BIN_EXE_lockctl")).args(&args).stdin(Stdio::null()).output().expect("run lockctl");
        Run {
            code: out.status.code().unwrap_or(-1),
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        }
    })
    .await
    .expect("lockctl task")
}

/// The store arguments of one backend.
#[derive(Clone)]
struct Store {
    flag: &'static str,
    address: String,
}

impl Store {
    fn args<'a>(&'a self, rest: &[&'a str]) -> Vec<&'a str> {
        let mut args = vec![self.flag, self.address.as_str()];
        args.extend_from_slice(rest);
        args
    }
}

async fn redis_manager(server: &RedisServer, prefix: &str, lease: Duration) -> LockManager {
    let backend = RedisBackend::connect(&server.url()).await.expect("connect");
    LockManager::builder().prefix(prefix).label(LABEL).default_lease(lease).backend(backend)
}

async fn zk_manager(hosts: &str, prefix: &str) -> LockManager {
    let backend = ZookeeperBackend::connect(hosts).await.expect("connect");
    LockManager::builder().prefix(prefix).label(LABEL).backend(backend)
}

fn host() -> String {
    lock_runtime::backend::Holder::of_process(None).host().to_owned()
}

/// `list` and `show`, as text and JSON, name the holding process (host, pid, label) and give
/// the guard's fencing token.
async fn list_and_show(store: &Store, guard: &LockGuard, key: &str, prefix: &str) -> Value {
    let pid = std::process::id();
    let list = lockctl(&store.args(&["list", "--prefix", prefix])).await;
    assert_eq!(list.code, 0, "{}", list.stderr);
    let token = guard.fencing_token().to_string();
    let line = list.stdout.lines().find(|l| l.starts_with(key)).unwrap_or_else(|| panic!("{}", list.stdout));
    assert!(line.contains(&format!("{}/{pid}/{LABEL}", host())) && line.contains(&token), "{line}");
    assert!(list.stdout.starts_with("NAME"), "{}", list.stdout);

    let json = lockctl(&store.args(&["list", "--prefix", prefix, "--json"])).await;
    assert_eq!(json.code, 0, "{}", json.stderr);
    let locks = json.json()["locks"].as_array().expect("locks").clone();
    assert_eq!(locks.len(), 1, "{locks:?}");
    let lock = &locks[0];
    assert_eq!(lock["name"], key);
    assert_eq!(lock["kind"], "mutex");
    assert_eq!(lock["holder"]["pid"], pid);
    assert_eq!(lock["holder"]["label"], LABEL);
    assert_eq!(lock["holder"]["host"], host());
    assert_eq!(lock["fencing_token"], guard.fencing_token());
    assert!(lock["age_ms"].as_u64().expect("age") < 60_000, "{lock}");

    let show = lockctl(&store.args(&["show", key])).await;
    assert_eq!(show.code, 0, "{}", show.stderr);
    for expected in ["pid:".to_owned(), pid.to_string(), LABEL.to_owned(), token] {
        assert!(show.stdout.contains(&expected), "{expected} in {}", show.stdout);
    }
    let shown = lockctl(&store.args(&["show", key, "--json"])).await;
    assert_eq!(shown.code, 0, "{}", shown.stderr);
    let shown = shown.json();
    assert_eq!(shown["fencing_token"], guard.fencing_token());
    shown
}

/// `show` and `release` of a name nobody holds exit with 3.
async fn free_names_are_not_found(store: &Store, prefix: &str) {
    let key = format!("{prefix}free");
    let show = lockctl(&store.args(&["show", &key])).await;
    assert_eq!(show.code, 3, "{} {}", show.stdout, show.stderr);
    let release = lockctl(&store.args(&["release", &key, "--force"])).await;
    assert_eq!(release.code, 3, "{} {}", release.stdout, release.stderr);
}

/// `release` without `--force` (no terminal) is refused with 4 and leaves the lock; with it,
/// the lock is freed, the holder's `lost()` fires and a waiter gets the lock.
async fn release_frees_the_lock(store: &Store, holder: LockGuard, waiter: &LockManager, key: &str, name: &str) {
    let waiting = {
        let waiter = waiter.clone();
        let name = name.to_owned();
        tokio::spawn(async move { waiter.lock(name).wait(Duration::from_secs(30)).await })
    };
    tokio::time::sleep(Duration::from_millis(300)).await; // the waiter is queued

    let refused = lockctl(&store.args(&["release", key])).await;
    assert_eq!(refused.code, 4, "{} {}", refused.stdout, refused.stderr);
    assert!(refused.stderr.contains("--force"), "{}", refused.stderr);
    let still = lockctl(&store.args(&["show", key, "--json"])).await;
    assert_eq!(still.code, 0, "still held: {}", still.stderr);
    assert_eq!(still.json()["fencing_token"], holder.fencing_token());
    assert!(!waiting.is_finished());

    let started = Instant::now();
    let released = lockctl(&store.args(&["release", key, "--force", "--json"])).await;
    assert_eq!(released.code, 0, "{} {}", released.stdout, released.stderr);
    assert_eq!(released.json()["released"], key);
    assert_eq!(released.json()["holder"]["label"], LABEL);
    tokio::time::timeout(Duration::from_secs(5), holder.lost()).await.expect("the holder's lost() fires");
    let taken = tokio::time::timeout(Duration::from_secs(5), waiting).await.expect("the waiter is woken");
    let taken = taken.expect("task").expect("the waiter gets the lock");
    assert!(taken.fencing_token() > holder.fencing_token());
    assert!(started.elapsed() < Duration::from_secs(5));
    let err = holder.release().await.expect_err("the released holder lost its lock");
    assert!(err.is_lost(), "{err}");
    taken.release().await.expect("release");
}

/// A running `lockctl watch --json`, its lines read by a thread.
struct Watch {
    child: std::process::Child,
    lines: tokio::sync::mpsc::UnboundedReceiver<String>,
}

impl Watch {
    fn start(args: &[&str]) -> Watch {
        let mut child = Command::new(env!("CARGO_BIN_EXE_lockctl"))
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .spawn()
            .expect("run lockctl watch");
        let stdout = child.stdout.take().expect("stdout");
        let (tx, lines) = tokio::sync::mpsc::unbounded_channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Watch { child, lines }
    }

    /// The next view, within `within`.
    async fn next(&mut self, within: Duration) -> Value {
        let line = self.next_line(within).await;
        serde_json::from_str::<Value>(&line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}"))
    }

    /// The next line, within `within`.
    async fn next_line(&mut self, within: Duration) -> String {
        let line = tokio::time::timeout(within, self.lines.recv()).await.expect("a line in time");
        line.expect("a line")
    }

    async fn exits_cleanly(mut self) {
        let status = tokio::task::spawn_blocking(move || self.child.wait()).await.expect("task").expect("wait");
        assert!(status.success(), "watch exits 0 after --count views");
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `watch --json` prints a line when a lock is taken and another when it is released.
async fn watch_prints_changes(store: &Store, manager: &LockManager, prefix: &str, name: &str) {
    let mut watch =
        Watch::start(&store.args(&["watch", "--prefix", prefix, "--json", "--interval", "50", "--count", "3"]));
    let first = watch.next(Duration::from_secs(10)).await;
    assert_eq!(first["locks"].as_array().map(Vec::len), Some(0), "{first}");
    let guard = manager.lock(name).await.expect("lock");
    let taken = watch.next(Duration::from_secs(10)).await;
    assert_eq!(taken["locks"][0]["fencing_token"], guard.fencing_token(), "{taken}");
    assert_eq!(taken["locks"][0]["holder"]["label"], LABEL, "{taken}");
    guard.release().await.expect("release");
    let freed = watch.next(Duration::from_secs(10)).await;
    assert_eq!(freed["locks"].as_array().map(Vec::len), Some(0), "{freed}");
    watch.exits_cleanly().await;
}

/// `watch` piped (not a terminal, no `--json`): one plain line per event, each starting with
/// its time of day (`14:03:07.412`), naming the lock, its holder and token (it printed whole
/// tables headed with unix milliseconds).
async fn watch_piped_prints_events(store: &Store, manager: &LockManager, prefix: &str, name: &str) {
    let mut watch = Watch::start(&store.args(&["watch", "--prefix", prefix, "--interval", "50", "--count", "3"]));
    let within = Duration::from_secs(10);
    let clock = |line: &str| {
        let time = line.split(' ').next().unwrap_or_default();
        assert!(time.len() == 12 && &time[2..3] == ":" && &time[8..9] == ".", "no time of day: {line}");
    };
    let first = watch.next_line(within).await;
    clock(&first);
    assert!(first.ends_with("no lock held"), "{first}");
    let guard = manager.lock(name).await.expect("lock");
    let taken = watch.next_line(within).await;
    clock(&taken);
    let key = format!("{prefix}{name}");
    assert!(taken.contains(&format!("acquired `{key}`")), "{taken}");
    assert!(taken.contains(LABEL) && taken.contains(&format!("token {}", guard.fencing_token())), "{taken}");
    guard.release().await.expect("release");
    let freed = watch.next_line(within).await;
    clock(&freed);
    assert!(freed.contains(&format!("released `{key}`")), "{freed}");
    watch.exits_cleanly().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_list_show_release_and_watch() {
    let server = RedisServer::start();
    let store = Store { flag: "--redis", address: server.url() };
    let prefix = format!("{}:", unique("lockctl"));
    let manager = redis_manager(&server, &prefix, Duration::from_millis(900)).await;
    let waiter = redis_manager(&server, &prefix, Duration::from_secs(5)).await;
    let key = format!("{prefix}order:1");

    let guard = manager.lock("order:1").await.expect("lock");
    let shown = list_and_show(&store, &guard, &key, &prefix).await;
    // Redis cannot count other processes' waiters: unknown, not guessed.
    assert_eq!(shown["waiters"], Value::Null);
    assert_eq!(shown["waited_on"], false);
    assert_eq!(shown["queued"], 0, "nobody waits: {shown}");
    let left = shown["remaining_lease_ms"].as_u64().expect("lease left");
    assert!(left > 0 && left <= 900, "{shown}");
    let text = lockctl(&store.args(&["show", &key])).await;
    assert!(text.stdout.contains("unknown"), "{}", text.stdout);

    free_names_are_not_found(&store, &prefix).await;
    release_frees_the_lock(&store, guard, &waiter, &key, "order:1").await;
    watch_prints_changes(&store, &manager, &prefix, "order:2").await;
}

/// A waiter in another process marks the lock, subscribes to its channel and, once it has
/// waited a third of its claim window (2 s here), enters the lock's queue: shown as such.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_shows_a_waited_on_lock() {
    let server = RedisServer::start();
    let store = Store { flag: "--redis", address: server.url() };
    let manager = redis_manager(&server, "", Duration::from_secs(5)).await;
    let waiter = redis_manager(&server, "", Duration::from_secs(5)).await;
    let guard = manager.lock("busy").await.expect("lock");
    let waiting = tokio::spawn(async move { waiter.lock("busy").wait(Duration::from_secs(10)).await.map(drop) });
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let shown = lockctl(&store.args(&["show", "busy", "--json"])).await.json();
        if shown["waited_on"] == true && shown["subscribers"].as_u64() >= Some(1) && shown["queued"] == 1 {
            assert_eq!(shown["waiters"], Value::Null);
            break;
        }
        assert!(Instant::now() < deadline, "never shown waited on and queued: {shown}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let text = lockctl(&store.args(&["list"])).await;
    assert!(text.stdout.contains("unknown (waited on, 1 subscribed, 1 queued)"), "{}", text.stdout);
    guard.release().await.expect("release");
    waiting.await.expect("task").expect("the waiter gets it");
}

/// A forced release is announced like a release: a waiter in another process gets a lock whose
/// fixed lease has half a minute left at once, not when the lease runs out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_forced_release_wakes_the_waiters_at_once() {
    let server = RedisServer::start();
    let store = Store { flag: "--redis", address: server.url() };
    let manager = redis_manager(&server, "", Duration::from_secs(5)).await;
    let waiter = redis_manager(&server, "", Duration::from_secs(5)).await;
    let guard = manager.lock("fixed").lease(Duration::from_secs(30)).await.expect("lock");
    let waiting = tokio::spawn(async move { waiter.lock("fixed").wait(Duration::from_secs(30)).await });
    tokio::time::sleep(Duration::from_millis(300)).await; // queued
    let started = Instant::now();
    let released = lockctl(&store.args(&["release", "fixed", "--force"])).await;
    assert_eq!(released.code, 0, "{} {}", released.stdout, released.stderr);
    assert!(released.stdout.contains(LABEL), "{}", released.stdout);
    let taken = tokio::time::timeout(Duration::from_secs(5), waiting).await.expect("woken at once");
    let taken = taken.expect("task").expect("the waiter gets the lock");
    assert!(started.elapsed() < Duration::from_secs(5));
    assert!(taken.fencing_token() > guard.fencing_token());
    let err = guard.release().await.expect_err("the forced-out holder's release");
    assert!(err.is_lost(), "{err}");
    taken.release().await.expect("release");
}

/// A release that was waited for is announced: `watch` shows it at once, not at its next look
/// (a minute away here).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_watch_follows_announced_releases() {
    let server = RedisServer::start();
    let store = Store { flag: "--redis", address: server.url() };
    let manager = redis_manager(&server, "w:", Duration::from_secs(5)).await;
    let waiter = redis_manager(&server, "w:", Duration::from_secs(5)).await;
    let guard = manager.lock("x").await.expect("lock");
    let waiting = tokio::spawn(async move {
        let guard = waiter.lock("x").wait(Duration::from_secs(30)).await.expect("the waiter gets it");
        tokio::time::sleep(Duration::from_secs(30)).await; // hold it: the view settles
        drop(guard);
    });
    tokio::time::sleep(Duration::from_millis(300)).await; // queued, the lock marked waited on
    let mut watch = Watch::start(&store.args(&["watch", "--prefix", "w:", "--json", "--interval", "60000"]));
    let first = watch.next(Duration::from_secs(10)).await;
    assert_eq!(first["locks"][0]["fencing_token"], guard.fencing_token(), "{first}");
    assert_eq!(first["locks"][0]["waited_on"], true, "{first}");
    let token = guard.fencing_token();
    guard.release().await.expect("release");
    let next = watch.next(Duration::from_secs(5)).await;
    assert_ne!(next["locks"][0]["fencing_token"], token, "{next}");
    waiting.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zookeeper_list_show_release_and_watch() {
    let hosts = zk_server::shared().hosts();
    let store = Store { flag: "--zookeeper", address: hosts.clone() };
    let prefix = format!("{}:", unique("lockctl"));
    let manager = zk_manager(&hosts, &prefix).await;
    let waiter = zk_manager(&hosts, &prefix).await;
    let key = format!("{prefix}order:1");

    let guard = manager.lock("order:1").await.expect("lock");
    let shown = list_and_show(&store, &guard, &key, &prefix).await;
    assert_eq!(shown["waiters"], 0, "ZooKeeper counts waiters exactly");
    assert_eq!(shown["session_bound"], true, "{shown}");

    // A queued waiter is counted.
    let queued = {
        let waiter = waiter.clone();
        tokio::spawn(async move { waiter.lock("order:1").wait(Duration::from_secs(30)).await })
    };
    let deadline = Instant::now() + Duration::from_secs(5);
    while lockctl(&store.args(&["show", &key, "--json"])).await.json()["waiters"] != 1 {
        assert!(Instant::now() < deadline, "the waiter was never counted");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    queued.abort();
    let _ = queued.await;

    // A fixed lease shows what is left of it.
    let fixed = manager.lock("fixed").lease(Duration::from_secs(20)).await.expect("lock");
    let fixed_shown = lockctl(&store.args(&["show", &format!("{prefix}fixed"), "--json"])).await.json();
    let left = fixed_shown["remaining_lease_ms"].as_u64().expect("lease left");
    assert!(left > 10_000 && left <= 20_000, "{fixed_shown}");
    assert_eq!(fixed_shown["session_bound"], false);
    fixed.release().await.expect("release");

    free_names_are_not_found(&store, &prefix).await;
    release_frees_the_lock(&store, guard, &waiter, &key, "order:1").await;
    watch_prints_changes(&store, &manager, &prefix, "order:2").await;

    // ZooKeeper's view follows watches, not looks: a minute's interval changes nothing.
    let mut watch =
        Watch::start(&store.args(&["watch", "--prefix", &prefix, "--json", "--interval", "60000", "--count", "2"]));
    let empty = watch.next(Duration::from_secs(10)).await;
    assert_eq!(empty["locks"].as_array().map(Vec::len), Some(0), "{empty}");
    let guard = manager.lock("order:3").await.expect("lock");
    let taken = watch.next(Duration::from_secs(5)).await;
    assert_eq!(taken["locks"][0]["fencing_token"], guard.fencing_token(), "{taken}");
    watch.exits_cleanly().await;
    guard.release().await.expect("release");
}

#[tokio::test]
async fn errors_and_usage_have_their_exit_codes() {
    let unreachable = format!("redis://127.0.0.1:{}", lock_tests::free_port());
    let run = lockctl(&["--redis", &unreachable, "list"]).await;
    assert_eq!(run.code, 1, "{} {}", run.stdout, run.stderr);
    assert!(run.stderr.starts_with("lockctl: "), "{}", run.stderr);
    for usage in [&["list"][..], &["--redis", "redis://x", "frobnicate"], &["--redis", "redis://x", "show"]] {
        let run = lockctl(usage).await;
        assert_eq!(run.code, 2, "{usage:?}: {}", run.stderr);
    }
    let help = lockctl(&["--help"]).await;
    assert_eq!(help.code, 0);
    assert!(help.stdout.contains("Exit codes:") && help.stdout.contains("4  refused"), "{}", help.stdout);
}

/// Over mutual TLS with `--tls-ca`, `--tls-cert` and `--tls-key`, and an ACL user from the
/// URL: `list` names the holder; without the client certificate the server refuses (exit 1,
/// the reason shown); `--tls-cert` without `--tls-key` is a usage error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_over_mutual_tls() {
    let certs = lock_tests::tls_certs::Certs::make();
    let server = RedisServer::start_tls(&certs, true, &[]);
    let path = |f: &str| certs.path(f).to_string_lossy().into_owned();
    let options = lock_runtime::backend::redis::RedisOptions::default().tls(certs.mutual());
    let backend = RedisBackend::connect_with(&server.url(), options).await.expect("connect over TLS");
    let prefix = format!("{}:", unique("lockctl-tls"));
    let manager = LockManager::builder().prefix(&prefix).label(LABEL).backend(backend);
    let guard = manager.lock("order:1").await.expect("lock");
    let (ca, cert, key) = (path("ca.pem"), path("client.pem"), path("client.key"));
    let url = server.url();
    let list =
        lockctl(&["--redis", &url, "--tls-ca", &ca, "--tls-cert", &cert, "--tls-key", &key, "list", "--json"]).await;
    assert_eq!(list.code, 0, "{}", list.stderr);
    let locks = list.json()["locks"].as_array().expect("locks").clone();
    let lock = locks.iter().find(|l| l["name"] == format!("{prefix}order:1")).expect("the held lock");
    assert_eq!(lock["fencing_token"], guard.fencing_token());
    assert_eq!(lock["holder"]["label"], LABEL);

    let refused = lockctl(&["--redis", &url, "--tls-ca", &ca, "list"]).await;
    assert_eq!(refused.code, 1, "{} {}", refused.stdout, refused.stderr);
    assert!(refused.stderr.contains("TLS settings"), "{}", refused.stderr);
    let usage = lockctl(&["--redis", &url, "--tls-cert", &cert, "list"]).await;
    assert_eq!(usage.code, 2, "{}", usage.stderr);
    guard.release().await.expect("release");
}

/// A lock made under ZooKeeper digest authentication: `lockctl` lists it without credentials,
/// cannot release it without them (exit 1, the server's refusal) and releases it with the same
/// identity before the hosts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zookeeper_release_under_digest_authentication() {
    use lock_runtime::backend::zookeeper::ZookeeperOptions;
    let hosts = zk_server::shared().hosts();
    let prefix = format!("{}:", unique("lockctl-digest").replace(':', "-"));
    let options = ZookeeperOptions::new().digest_auth("ops", "ops-secret");
    let backend = ZookeeperBackend::connect_with(&hosts, options).await.expect("connect");
    let manager = LockManager::builder().prefix(&prefix).label(LABEL).backend(backend);
    let guard = manager.lock("job").await.expect("lock");
    let key = format!("{prefix}job");
    let list = lockctl(&["--zookeeper", &hosts, "list", "--prefix", &prefix, "--json"]).await;
    assert_eq!(list.code, 0, "{}", list.stderr);
    assert_eq!(list.json()["locks"].as_array().expect("locks").len(), 1);
    let refused = lockctl(&["--zookeeper", &hosts, "release", &key, "--force"]).await;
    assert_eq!(refused.code, 1, "{} {}", refused.stdout, refused.stderr);
    assert!(!guard.is_lost());
    let with = format!("ops:ops-secret@{hosts}");
    let released = lockctl(&["--zookeeper", &with, "release", &key, "--force"]).await;
    assert_eq!(released.code, 0, "{} {}", released.stdout, released.stderr);
    tokio::time::timeout(Duration::from_secs(5), guard.lost()).await.expect("the holder is told");
}

/// `--file DIR`: `list`, `show` and `watch` as on the other stores (the holder's label and
/// token from the record it wrote into its file); `release` is refused with 4 and names the
/// holding process, whose lock stays held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn file_list_show_watch_and_refused_release() {
    let dir = std::env::temp_dir().join(format!("lockctl-file-{}", lock_runtime::backend::OwnerId::next()));
    let prefix = format!("{}:", unique("file"));
    let manager = LockManager::builder().prefix(&prefix).label(LABEL).file(&dir).expect("open");
    let store = Store { flag: "--file", address: dir.display().to_string() };
    let key = format!("{prefix}ledger");
    let guard = manager.lock("ledger").await.expect("lock");
    let shown = list_and_show(&store, &guard, &key, &prefix).await;
    assert_eq!(shown["session_bound"], true, "{shown}");
    free_names_are_not_found(&store, &prefix).await;

    let refused = lockctl(&store.args(&["release", &key, "--force"])).await;
    assert_eq!(refused.code, 4, "{} {}", refused.stdout, refused.stderr);
    assert!(refused.stderr.contains(&format!("pid {}", std::process::id())), "{}", refused.stderr);
    assert!(manager.try_lock("ledger").await.expect("try").is_none(), "still held");
    guard.release().await.expect("release");

    watch_prints_changes(&store, &manager, &prefix, "ledger").await;
    watch_piped_prints_events(&store, &manager, &prefix, "ledger").await;
    let missing = lockctl(&["--file", "/nonexistent/locks", "list"]).await;
    assert_eq!(missing.code, 1, "{}", missing.stderr);
    let _ = std::fs::remove_dir_all(&dir);
}

/// `--postgres URL`: `list`, `show`, `release` and `watch` as on Redis (the holder's key and
/// process from its grant query, its token from its session's `application_name`); a forced
/// release ends the holder's session, which fires its `lost()` and hands the lock over.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_list_show_release_and_watch() {
    let server = lock_tests::pg_server::PgServer::start();
    let prefix = format!("{}:", unique("pg"));
    let manager = LockManager::builder().prefix(&prefix).label(LABEL).postgres(server.url()).await.expect("connect");
    let store = Store { flag: "--postgres", address: server.url() };
    let key = format!("{prefix}ledger");
    let guard = manager.lock("ledger").await.expect("lock");
    let shown = list_and_show(&store, &guard, &key, &prefix).await;
    assert_eq!(shown["waiters"], 0, "{shown}");
    free_names_are_not_found(&store, &prefix).await;
    let waiter = LockManager::builder().prefix(&prefix).postgres(server.url()).await.expect("connect");
    release_frees_the_lock(&store, guard, &waiter, &key, "ledger").await;
    watch_prints_changes(&store, &manager, &prefix, "other").await;
    // Two readers of a read-write lock: both listed, each with its kind and token.
    let (r1, r2) =
        (manager.read_lock("catalog").await.expect("read"), manager.read_lock("catalog").await.expect("read"));
    let list = lockctl(&store.args(&["list", "--prefix", &prefix, "--json"])).await;
    let locks = list.json()["locks"].as_array().expect("locks").clone();
    let kinds: Vec<&Value> = locks.iter().map(|l| &l["kind"]).collect();
    assert_eq!(kinds, [&json_str("read"), &json_str("read")], "{locks:?}");
    let mut tokens: Vec<u64> = locks.iter().filter_map(|l| l["fencing_token"].as_u64()).collect();
    tokens.sort_unstable();
    assert_eq!(tokens, [r1.fencing_token(), r2.fencing_token()]);
    let text = lockctl(&store.args(&["list", "--prefix", &prefix])).await;
    assert!(text.stdout.lines().filter(|l| l.contains(" read ")).count() == 2, "{}", text.stdout);
}

/// `--mysql URL`: `list`, `show`, `release` and `watch` as on PostgreSQL (the holder's key,
/// process and token from the record its grant wrote); a forced release ends the holder's
/// session, which hands the lock to the waiter at once and fires the holder's `lost()` at its
/// next heartbeat. A name longer than the server's 64 characters is listed by its whole key,
/// and a released lock leaves no record behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mysql_list_show_release_and_watch() {
    let server = lock_tests::mysql_server::MysqlServer::start();
    let prefix = format!("{}:", unique("my"));
    let manager = LockManager::builder().prefix(&prefix).label(LABEL).mysql(server.url()).await.expect("connect");
    let store = Store { flag: "--mysql", address: server.url() };
    let key = format!("{prefix}ledger");
    let guard = manager.lock("ledger").await.expect("lock");
    let shown = list_and_show(&store, &guard, &key, &prefix).await;
    assert_eq!(shown["session_bound"], true, "{shown}");
    free_names_are_not_found(&store, &prefix).await;
    let waiter = LockManager::builder().prefix(&prefix).mysql(server.url()).await.expect("connect");
    release_frees_the_lock(&store, guard, &waiter, &key, "ledger").await;
    watch_prints_changes(&store, &manager, &prefix, "other").await;

    let long = "l".repeat(100);
    let guard = manager.lock(long.as_str()).await.expect("lock");
    let list = lockctl(&store.args(&["list", "--prefix", &prefix, "--json"])).await;
    let locks = list.json()["locks"].as_array().expect("locks").clone();
    let names: Vec<&Value> = locks.iter().map(|l| &l["name"]).collect();
    assert_eq!(names, [&json_str(&format!("{prefix}{long}"))], "{locks:?}");
    assert_eq!(locks[0]["fencing_token"], guard.fencing_token());
    guard.release().await.expect("release");
    let list = lockctl(&store.args(&["list", "--json"])).await;
    assert_eq!(list.json()["locks"].as_array().map(Vec::len), Some(0), "{}", list.stdout);
}

fn json_str(text: &str) -> Value {
    Value::String(text.to_owned())
}

/// `--etcd ENDPOINTS`: `list` and `show` give the holder (its lowest key's value), the token
/// (its create revision) and the exact waiters; the age is not stored (`null`); a forced
/// `release` deletes the holder's key, which hands the lock to the next key's waiter at once
/// (the holder learns it at its release); `watch` follows the etcd watch.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_list_show_release_and_watch() {
    use lock_runtime::backend::etcd::EtcdBackend;
    let server = lock_tests::etcd_server::shared();
    let store = Store { flag: "--etcd", address: server.endpoint() };
    let prefix = format!("{}:", unique("lockctl"));
    let manager = |label: &'static str| {
        let endpoint = server.endpoint();
        let prefix = prefix.clone();
        async move {
            let backend = EtcdBackend::connect([endpoint.as_str()]).await.expect("connect");
            LockManager::builder().prefix(prefix).label(label).backend(backend)
        }
    };
    let (holder_manager, waiter_manager) = (manager(LABEL).await, manager("waiter").await);
    let key = format!("{prefix}ledger");
    let guard = holder_manager.lock("ledger").await.expect("lock");
    let waiting = {
        let waiter = waiter_manager.clone();
        tokio::spawn(async move { waiter.lock("ledger").wait(Duration::from_secs(30)).await })
    };
    let listed = loop {
        let list = lockctl(&store.args(&["list", "--prefix", &prefix, "--json"])).await;
        assert_eq!(list.code, 0, "{}", list.stderr);
        let locks = list.json()["locks"].as_array().expect("locks").clone();
        assert_eq!(locks.len(), 1, "{locks:?}");
        if locks[0]["waiters"] == 1 {
            break locks[0].clone();
        }
        tokio::time::sleep(Duration::from_millis(50)).await; // the waiter's key is being put
    };
    assert_eq!(listed["name"], key.as_str());
    assert_eq!(listed["holder"]["pid"], std::process::id());
    assert_eq!(listed["holder"]["label"], LABEL);
    assert_eq!(listed["fencing_token"], guard.fencing_token());
    assert_eq!(listed["age_ms"], Value::Null, "etcd stores no grant time");
    assert_eq!(listed["session_bound"], true);
    let show = lockctl(&store.args(&["show", &key])).await;
    assert!(show.stdout.contains(LABEL) && show.stdout.contains(&guard.fencing_token().to_string()), "{}", show.stdout);
    free_names_are_not_found(&store, &prefix).await;

    let released = lockctl(&store.args(&["release", &key, "--force", "--json"])).await;
    assert_eq!(released.code, 0, "{} {}", released.stdout, released.stderr);
    assert_eq!(released.json()["holder"]["label"], LABEL);
    let taken = tokio::time::timeout(Duration::from_secs(5), waiting).await.expect("the waiter is woken");
    let taken = taken.expect("task").expect("the waiter gets the lock");
    assert!(taken.fencing_token() > guard.fencing_token());
    assert!(guard.release().await.expect_err("taken away").is_lost());
    taken.release().await.expect("release");
    watch_prints_changes(&store, &holder_manager, &prefix, "journal").await;
}

/// `--redis-cluster URLS`: `list` scans every primary, `show` and a forced `release` work as
/// on one server, whichever node holds the slot.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_cluster_list_show_and_release() {
    let cluster = lock_tests::redis_cluster::RedisCluster::start(3, 0);
    let urls = cluster.urls();
    let store = Store { flag: "--redis-cluster", address: urls.join(",") };
    let prefix = format!("{}:", unique("lockctl"));
    let manager = LockManager::builder()
        .prefix(&prefix)
        .label(LABEL)
        .default_lease(Duration::from_millis(900))
        .redis_cluster(&urls)
        .await
        .expect("connect");
    // Names spread over the slots of every primary.
    let guards: Vec<LockGuard> = futures_join((0..6).map(|i| manager.lock(format!("order:{i}"))))
        .await
        .into_iter()
        .map(|g| g.expect("lock"))
        .collect();
    let list = lockctl(&store.args(&["list", "--prefix", &prefix, "--json"])).await;
    assert_eq!(list.code, 0, "{}", list.stderr);
    let locks = list.json()["locks"].as_array().expect("locks").clone();
    assert_eq!(locks.len(), 6, "{locks:?}");
    for (lock, guard) in locks.iter().zip(&guards) {
        assert_eq!(lock["fencing_token"], guard.fencing_token(), "{lock}");
        assert_eq!(lock["holder"]["label"], LABEL);
    }
    let key = format!("{prefix}order:3");
    let released = lockctl(&store.args(&["release", &key, "--force"])).await;
    assert_eq!(released.code, 0, "{} {}", released.stdout, released.stderr);
    let again = manager.lock("order:3").wait(Duration::from_secs(5)).await.expect("free after the release");
    assert!(again.fencing_token() > guards[3].fencing_token());
}

/// `--redis-sentinel URLS --master NAME`: the primary the Sentinels name is listed and shown,
/// with the holder and its token, and a forced release frees the lock there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_sentinel_list_show_and_release() {
    let setup = lock_tests::redis_sentinel::SentinelSetup::start(1, 1);
    let sentinels = setup.sentinel_urls();
    let master = lock_tests::redis_sentinel::MASTER;
    let prefix = format!("{}:", unique("lockctl"));
    let store = Store { flag: "--redis-sentinel", address: sentinels.join(",") };
    let args = |rest: &[&'static str]| {
        let mut all = vec!["--master".to_owned(), master.to_owned()];
        all.extend(store.args(&[]).into_iter().map(str::to_owned));
        all.extend(rest.iter().map(|a| a.to_string()));
        all
    };
    let manager = LockManager::builder()
        .prefix(&prefix)
        .label(LABEL)
        .default_lease(Duration::from_millis(900))
        .redis_sentinel(&sentinels, master)
        .await
        .expect("connect");
    let guard = manager.lock("order:1").await.expect("lock");
    let key = format!("{prefix}order:1");
    let run = |extra: Vec<String>| async move {
        let refs: Vec<&str> = extra.iter().map(String::as_str).collect();
        lockctl(&refs).await
    };
    let mut list = args(&["list", "--json"]);
    list.extend(["--prefix".to_owned(), prefix.clone()]);
    let list = run(list).await;
    assert_eq!(list.code, 0, "{}", list.stderr);
    let locks = list.json()["locks"].as_array().expect("locks").clone();
    assert_eq!(locks.len(), 1, "{locks:?}");
    assert_eq!(locks[0]["fencing_token"], guard.fencing_token());
    assert_eq!(locks[0]["holder"]["label"], LABEL);
    let mut show = args(&["show"]);
    show.push(key.clone());
    let show = run(show).await;
    assert_eq!(show.code, 0, "{}", show.stderr);
    assert!(show.stdout.contains(&guard.fencing_token().to_string()), "{}", show.stdout);
    let mut release = args(&["release", "--force"]);
    release.push(key.clone());
    let released = run(release).await;
    assert_eq!(released.code, 0, "{} {}", released.stdout, released.stderr);
    let again = manager.lock("order:1").wait(Duration::from_secs(5)).await.expect("free after the release");
    assert!(again.fencing_token() > guard.fencing_token());
}

/// `--redlock URLS`: a lock granted by a quorum is listed and shown with its holder and the
/// quorum's token; a key only a minority of the nodes holds (a lost split vote) is not; a forced
/// release frees it on every node, and its holder and a waiter see it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redlock_list_show_release_and_minority_keys() {
    let nodes: Vec<RedisServer> = (0..3).map(|_| RedisServer::start()).collect();
    let urls: Vec<String> = nodes.iter().map(RedisServer::url).collect();
    let store = Store { flag: "--redlock", address: urls.join(",") };
    let prefix = format!("{}:", unique("lockctl"));
    let manager = || async {
        LockManager::builder()
            .prefix(&prefix)
            .label(LABEL)
            .default_lease(Duration::from_millis(900))
            .redlock(&urls)
            .await
            .expect("connect")
    };
    let (holder_manager, waiter) = (manager().await, manager().await);
    let guard = holder_manager.lock("order:1").await.expect("lock");
    let key = format!("{prefix}order:1");
    list_and_show(&store, &guard, &key, &prefix).await;
    // A key on one node of three: not held.
    let stray = format!("{prefix}stray");
    let one_node = LockManager::builder().prefix(&prefix).label(LABEL).redis(urls[0].as_str()).await.expect("node");
    let _stray = one_node.lock("stray").await.expect("a lock on one node");
    let show = lockctl(&store.args(&["show", &stray])).await;
    assert_eq!(show.code, 3, "a minority's key shown as held: {}", show.stdout);
    let list = lockctl(&store.args(&["list", "--prefix", &prefix, "--json"])).await;
    assert_eq!(list.json()["locks"].as_array().map(Vec::len), Some(1), "{}", list.stdout);
    free_names_are_not_found(&store, &prefix).await;
    release_frees_the_lock(&store, guard, &waiter, &key, "order:1").await;
}

/// Awaits every future, one after the other (they are quick).
async fn futures_join<F: std::future::IntoFuture>(futures: impl IntoIterator<Item = F>) -> Vec<F::Output> {
    let mut out = Vec::new();
    for f in futures {
        out.push(f.await);
    }
    out
}

/// `--url URL`: the store a manager's URL names (`LockManager::connect`), one server, Redlock's
/// nodes and lock files alike; a URL it cannot use says why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn url_names_the_store_as_a_manager_does() {
    let server = RedisServer::start();
    let prefix = format!("{}:", unique("url"));
    let url = format!("{}?operation_timeout=2s", server.url());
    let builder = LockManager::builder().prefix(&prefix).label(LABEL).default_lease(Duration::from_millis(900));
    let manager = builder.connect(&url).await.expect("connect");
    let waiter = LockManager::builder().prefix(&prefix).connect(&url).await.expect("connect");
    let store = Store { flag: "--url", address: url.clone() };
    let key = format!("{prefix}order:1");
    let guard = manager.lock("order:1").await.expect("lock");
    list_and_show(&store, &guard, &key, &prefix).await;
    release_frees_the_lock(&store, guard, &waiter, &key, "order:1").await;

    let nodes: Vec<RedisServer> = (0..3).map(|_| RedisServer::start()).collect();
    let hosts: Vec<String> = nodes.iter().map(|n| n.url().trim_start_matches("redis://").to_owned()).collect();
    let redlock = format!("redlock://{}", hosts.join(","));
    let manager = LockManager::builder().prefix(&prefix).label(LABEL).connect(&redlock).await.expect("redlock");
    let store = Store { flag: "--url", address: redlock };
    let guard = manager.lock("order:2").await.expect("lock");
    list_and_show(&store, &guard, &format!("{prefix}order:2"), &prefix).await;
    guard.release().await.expect("release");

    let dir = std::env::temp_dir().join(format!("lockctl-url-{}", lock_runtime::backend::OwnerId::next()));
    let file = format!("file://{}", dir.display());
    let manager = LockManager::builder().prefix(&prefix).label(LABEL).connect(&file).await.expect("file");
    let store = Store { flag: "--url", address: file };
    let guard = manager.lock("ledger").await.expect("lock");
    list_and_show(&store, &guard, &format!("{prefix}ledger"), &prefix).await;
    guard.release().await.expect("release");
    let _ = std::fs::remove_dir_all(&dir);

    for (url, says) in [("memory://", "inside one process"), ("consul://c:8500", "known schemes: memory://")] {
        let run = lockctl(&["--url", url, "list"]).await;
        assert_eq!(run.code, 1, "{url}: {}", run.stderr);
        assert!(run.stderr.contains(says), "{url}: {}", run.stderr);
    }
}

/// `--url` through a transaction-mode PgBouncer: the locks held as transactions of their own
/// are listed and shown, and a forced release ends the holder's server session (the pooler
/// closes the holder's connection: its `lost()` fires) and hands the lock to the waiter.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_through_pgbouncer() {
    let server = lock_tests::pg_server::PgServer::start();
    let bouncer = lock_tests::pg_server::PgBouncer::start(&server, 8);
    let url = format!("{}?transaction_pooling=true", bouncer.url());
    let prefix = format!("{}:", unique("pgb"));
    let manager = LockManager::builder().prefix(&prefix).label(LABEL).connect(&url).await.expect("connect");
    let store = Store { flag: "--url", address: url.clone() };
    let key = format!("{prefix}ledger");
    let guard = manager.lock("ledger").await.expect("lock");
    list_and_show(&store, &guard, &key, &prefix).await;
    free_names_are_not_found(&store, &prefix).await;
    let waiter = LockManager::builder().prefix(&prefix).connect(&url).await.expect("connect");
    release_frees_the_lock(&store, guard, &waiter, &key, "ledger").await;
}

/// With no store on the command line, `LOCKCTL_URL` names it; with neither, a usage error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lockctl_url_from_the_environment() {
    let dir = std::env::temp_dir().join(format!("lockctl-env-{}", lock_runtime::backend::OwnerId::next()));
    let url = format!("file://{}", dir.display());
    let manager = LockManager::builder().label(LABEL).connect(&url).await.expect("file");
    let guard = manager.lock("env:1").await.expect("lock");
    let out = tokio::task::spawn_blocking(move || {
        Command::new(env!("CARGO_BIN_EXE_lockctl"))
            .args(["list", "--json"])
            .env("LOCKCTL_URL", &url)
            .stdin(Stdio::null())
            .output()
            .expect("run lockctl")
    })
    .await
    .expect("lockctl");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{stdout} {}", String::from_utf8_lossy(&out.stderr));
    let listed: Value = serde_json::from_str(&stdout).expect("JSON");
    assert_eq!(listed["locks"][0]["name"], "env:1", "{stdout}");
    assert_eq!(listed["locks"][0]["fencing_token"], guard.fencing_token());
    guard.release().await.expect("release");
    let neither = lockctl(&["list"]).await;
    assert_eq!(neither.code, 2, "{}", neither.stderr);
    assert!(neither.stderr.contains("LOCKCTL_URL"), "{}", neither.stderr);
    let _ = std::fs::remove_dir_all(&dir);
}
