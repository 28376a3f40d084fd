//! The Redis backend over TLS, against real `redis-server` processes that speak TLS only (on
//! certificates `openssl` makes for each test): the conformance suite over mutual TLS, each
//! TLS failure a clear error within the connect bound, and an ACL user from the URL that may
//! touch the library's keys and channels only and still runs every lock kind.

#![cfg(all(feature = "redis", feature = "tls"))]
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::time::Duration;

use lock_runtime::backend::redis::{RedisBackend, RedisOptions};
use lock_runtime::{LockError, LockManager, LockManagerBuilder, TlsOptions};
use lock_tests::redis_server::RedisServer;
use lock_tests::refused;
use lock_tests::tls_certs::Certs;

lock_tests::conformance_suite!(
    {
        let certs = Arc::new(Certs::make());
        let server = Arc::new(RedisServer::start_tls(&certs, true, &[]));
        move |builder: LockManagerBuilder| {
            let (url, tls) = (server.url(), certs.mutual());
            let _keep = (server.clone(), certs.clone());
            async move {
                let options = RedisOptions::default().tls(tls);
                builder.backend(RedisBackend::connect_with(&url, options).await.expect("connect over mutual TLS"))
            }
        }
    },
    kinds = [
        lock_runtime::backend::LockKind::Read,
        lock_runtime::backend::LockKind::Write,
        lock_runtime::backend::LockKind::Semaphore { permits: 1 }
    ],
    inspect = true
);

const TIMEOUT: Duration = Duration::from_millis(800);

/// Connects with `tls` (or none) and a short command timeout; asserts that the attempt ended
/// within the bound.
async fn connect(url: &str, tls: Option<TlsOptions>) -> Result<RedisBackend, LockError> {
    let options = RedisOptions::default().command_timeout(TIMEOUT);
    let options = match tls {
        Some(tls) => options.tls(tls),
        None => options,
    };
    lock_tests::within_bound(TIMEOUT, RedisBackend::connect_with(url, options)).await
}

#[tokio::test]
async fn a_server_certificate_of_an_unknown_ca_is_refused_with_the_reason() {
    let certs = Certs::make();
    let server = RedisServer::start_tls(&certs, false, &[]);
    // Another CA only; then the platform's roots only (no CA given, or TLS settings left out).
    for tls in [Some(TlsOptions::new().ca_file(certs.path("other-ca.pem"))), Some(TlsOptions::new()), None] {
        let e = refused(connect(&server.url(), tls).await, "the server's CA is not trusted");
        assert!(e.is_backend(), "{e}");
        assert!(e.to_string().contains("UnknownIssuer"), "the reason is named: {e}");
        assert!(!e.to_string().contains("reachable"), "no hint at the network: {e}");
    }
    assert!(connect(&server.url(), Some(TlsOptions::new().ca_pem(std::fs::read(certs.path("ca.pem")).unwrap())))
        .await
        .is_ok());
}

#[tokio::test]
async fn a_certificate_for_another_host_or_expired_is_refused_with_the_reason() {
    let certs = Certs::make();
    let tls = TlsOptions::new().ca_file(certs.path("ca.pem"));
    for (cert, reason) in [("elsewhere", "not valid for name"), ("expired", "expired")] {
        let server = RedisServer::start_tls_as(&certs, cert, false, &[]);
        let e = refused(connect(&server.url(), Some(tls.clone())).await, cert);
        assert!(e.is_backend(), "{e}");
        assert!(e.to_string().to_lowercase().contains(reason), "{cert}: the reason is named: {e}");
        assert!(e.to_string().contains("TLS settings"), "the hint points at TLS: {e}");
    }
    // The good certificate names both `localhost` and 127.0.0.1.
    let server = RedisServer::start_tls(&certs, false, &[]);
    let ip = format!("rediss://127.0.0.1:{}", server.port());
    assert!(connect(&ip, Some(tls)).await.is_ok(), "the certificate names 127.0.0.1");
}

#[tokio::test]
async fn mutual_tls_without_a_client_certificate_is_refused() {
    let certs = Certs::make();
    let server = RedisServer::start_tls(&certs, true, &[]);
    let e = refused(
        connect(&server.url(), Some(TlsOptions::new().ca_file(certs.path("ca.pem")))).await,
        "no client certificate was presented",
    );
    assert!(e.is_backend(), "{e}");
    assert!(connect(&server.url(), Some(certs.mutual())).await.is_ok());
}

#[tokio::test]
async fn unreadable_or_mismatched_tls_material_is_invalid_and_named() {
    let certs = Certs::make();
    let server = RedisServer::start_tls(&certs, true, &[]);
    let missing = certs.path("missing.key");
    let tls = TlsOptions::new().ca_file(certs.path("ca.pem")).client_cert_files(certs.path("client.pem"), &missing);
    let e = refused(connect(&server.url(), Some(tls)).await, "the key file is missing");
    assert!(e.is_invalid() && e.to_string().contains(&*missing.to_string_lossy()), "{e}");
    // The server's key with the client's certificate.
    let tls = TlsOptions::new()
        .ca_file(certs.path("ca.pem"))
        .client_cert_files(certs.path("client.pem"), certs.path("server.key"));
    let e = refused(connect(&server.url(), Some(tls)).await, "the key is not the certificate's");
    assert!(e.is_invalid(), "{e}");
    // A CA file that holds a key, not a certificate.
    let tls = TlsOptions::new().ca_file(certs.path("ca.key"));
    let e = refused(connect(&server.url(), Some(tls)).await, "the CA file holds no certificate");
    assert!(e.is_invalid() && e.to_string().contains("ca.key"), "{e}");
}

#[tokio::test]
async fn tls_and_plaintext_mixed_up_fail_within_the_bound() {
    let certs = Certs::make();
    let tls_server = RedisServer::start_tls(&certs, false, &[]);
    let plain_server = RedisServer::start();
    // Plaintext to the TLS port.
    let url = format!("redis://127.0.0.1:{}", tls_server.port());
    assert!(refused(connect(&url, None).await, "the port speaks TLS").is_backend());
    // TLS to the plaintext port.
    let url = format!("rediss://localhost:{}", plain_server.port());
    let e =
        refused(connect(&url, Some(TlsOptions::new().ca_file(certs.path("ca.pem")))).await, "the port is plaintext");
    assert!(e.is_backend(), "{e}");
    // TLS settings with a plaintext URL: a mistake in the configuration.
    let e = refused(connect(&plain_server.url(), Some(TlsOptions::new())).await, "the URL is not rediss://");
    assert!(e.is_invalid() && e.to_string().contains("rediss://"), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acl_user_limited_to_the_lock_keys_runs_every_kind_over_tls() {
    let certs = Certs::make();
    let server = RedisServer::start_tls(&certs, true, &[]);
    let admin = LockManager::builder()
        .backend(RedisBackend::connect_with(&server.url(), RedisOptions::default().tls(certs.mutual())).await.unwrap());
    drop(admin); // (installs the TLS provider the raw client below uses)
    let mut raw = raw_tls(&server, &certs).await;
    let mut acl = redis::cmd("ACL");
    acl.arg("SETUSER").arg("locker").arg(lock_tests::redis_server::LOCK_USER_ACL);
    let _: () = acl.query_async(&mut raw).await.expect("ACL SETUSER");
    let _: () = redis::cmd("SET").arg("other:secret").arg("x").query_async(&mut raw).await.unwrap();

    let url = format!("rediss://locker:lock-secret@localhost:{}", server.port());
    let backend =
        RedisBackend::connect_with(&url, RedisOptions::default().tls(certs.mutual())).await.expect("acl user");
    let m = LockManager::builder().backend(backend);
    // Every kind, contended (so the release channels and their subscriptions are used too).
    let held = m.lock("acl:mutex").await.expect("mutex");
    let waiter = tokio::spawn({
        let m = m.clone();
        async move { m.lock("acl:mutex").wait(Duration::from_secs(5)).await.map(|g| g.fencing_token()) }
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    let first = held.fencing_token();
    held.release().await.expect("release");
    assert!(waiter.await.unwrap().expect("handed over") > first);
    let (r1, r2) = (m.read_lock("acl:rw").await.expect("read"), m.read_lock("acl:rw").await.expect("read"));
    assert!(m.try_write_lock("acl:rw").await.expect("one attempt").is_none(), "readers hold it");
    r1.release().await.unwrap();
    r2.release().await.unwrap();
    m.write_lock("acl:rw").await.expect("write").release().await.unwrap();
    let permits = m.semaphore("acl:sem", 2).await.expect("permit");
    permits.release().await.unwrap();
    m.lock_all(["acl:a", "acl:b"]).await.expect("lock_all").release().await.unwrap();

    // The same user cannot read or write anything else: the error names the command.
    let client = redis::Client::build_with_tls(url.as_str(), tls_certificates(&certs)).unwrap();
    let mut locker = client.get_multiplexed_async_connection().await.expect("acl user raw");
    let e = redis::cmd("GET").arg("other:secret").query_async::<Option<String>>(&mut locker).await.unwrap_err();
    assert!(e.to_string().to_lowercase().contains("no permissions"), "{e}");
}

#[tokio::test]
async fn wrong_acl_credentials_are_refused_by_name() {
    let certs = Certs::make();
    let server = RedisServer::start_tls(&certs, true, &[]);
    let url = format!("rediss://nobody:wrong@localhost:{}", server.port());
    let e = refused(connect(&url, Some(certs.mutual())).await, "the credentials are wrong");
    assert!(e.is_backend(), "{e}");
    assert!(!e.to_string().contains("wrong@"), "the password is not shown: {e}");
    assert!(e.to_string().to_lowercase().contains("password") || e.to_string().contains("WRONGPASS"), "{e}");
    assert!(e.to_string().contains("credentials"), "the hint points at the credentials: {e}");
}

fn tls_certificates(certs: &Certs) -> redis::TlsCertificates {
    redis::TlsCertificates {
        client_tls: Some(redis::ClientTlsConfig {
            client_cert: std::fs::read(certs.path("client.pem")).unwrap(),
            client_key: std::fs::read(certs.path("client.key")).unwrap(),
        }),
        root_cert: Some(std::fs::read(certs.path("ca.pem")).unwrap()),
    }
}

async fn raw_tls(server: &RedisServer, certs: &Certs) -> redis::aio::MultiplexedConnection {
    let client = redis::Client::build_with_tls(server.url(), tls_certificates(certs)).expect("tls client");
    client.get_multiplexed_async_connection().await.expect("raw TLS connection")
}

/// Redlock over three TLS-only primaries, each with mutual TLS: a lock, a hand-off, and an
/// untrusted CA refused with its reason.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redlock_over_mutual_tls() {
    let certs = Certs::make();
    let servers: Vec<RedisServer> = (0..3).map(|_| RedisServer::start_tls(&certs, true, &[])).collect();
    let urls: Vec<String> = servers.iter().map(RedisServer::url).collect();
    let options = RedisOptions::default().tls(certs.mutual());
    let backend =
        lock_runtime::backend::redis::RedlockBackend::connect(&urls, options).await.expect("redlock over TLS");
    let m = LockManager::builder().backend(backend);
    lock_tests::hand_off(&m, "redlock:tls").await;

    let untrusted =
        RedisOptions::default().command_timeout(TIMEOUT).tls(TlsOptions::new().ca_file(certs.path("other-ca.pem")));
    let outcome = lock_runtime::backend::redis::RedlockBackend::connect(&urls, untrusted);
    let e = refused(lock_tests::within_bound(TIMEOUT * 2, outcome).await, "the CA is not trusted");
    assert!(e.is_backend(), "{e}");
    assert!(e.to_string().contains("UnknownIssuer"), "the reason is named: {e}");
}

/// A 3-primary Redis Cluster over TLS (`tls-cluster yes`: a TLS client is told the nodes' TLS
/// ports): locks on every primary, a hand-off through the pub/sub connection, the other kinds,
/// and an untrusted CA refused with its reason.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_over_tls() {
    let certs = Certs::make();
    let cluster = lock_tests::redis_cluster::RedisCluster::start_tls(&certs, 3);
    let urls: Vec<String> = (0..cluster.len()).map(|i| cluster.tls_url(i)).collect();
    let options = RedisOptions::default().tls(TlsOptions::new().ca_file(certs.path("ca.pem")));
    let m = LockManager::builder().backend(RedisBackend::cluster(&urls, options).await.expect("cluster over TLS"));
    let mut primaries = std::collections::HashSet::new();
    for i in 0..30 {
        let name = format!("tls:{i}");
        primaries.insert(cluster.primary_of(&format!("lock:{{{name}}}")));
        m.lock(&name).await.expect("lock").release().await.expect("release");
    }
    assert_eq!(primaries.len(), 3, "the names spread over every primary");
    lock_tests::hand_off(&m, "tls:handoff").await;
    m.read_lock("tls:rw").await.expect("read").release().await.expect("release");
    m.semaphore("tls:sem", 2).await.expect("permit").release().await.expect("release");

    let untrusted =
        RedisOptions::default().command_timeout(TIMEOUT).tls(TlsOptions::new().ca_file(certs.path("other-ca.pem")));
    let e = refused(lock_tests::within_bound(TIMEOUT, RedisBackend::cluster(&urls, untrusted)).await, "untrusted CA");
    assert!(e.is_backend(), "{e}");
}

/// Failed connects (an untrusted CA, wrong credentials) leave nothing behind: no task of
/// theirs keeps running, and the server holds no connection of theirs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_connects_leave_no_task_or_connection() {
    let certs = Certs::make();
    let server = RedisServer::start_tls(&certs, true, &[]);
    let mut admin = raw_tls(&server, &certs).await;
    let clients = async |admin: &mut redis::aio::MultiplexedConnection| -> usize {
        let list: String = redis::cmd("CLIENT").arg("LIST").query_async(admin).await.expect("CLIENT LIST");
        list.lines().filter(|l| !l.is_empty()).count()
    };
    let connections_before = clients(&mut admin).await;
    let metrics = tokio::runtime::Handle::current().metrics();
    let tasks_before = metrics.num_alive_tasks();
    let wrong = format!("rediss://nobody:wrong@localhost:{}", server.port());
    for _ in 0..5 {
        let untrusted = TlsOptions::new().ca_file(certs.path("other-ca.pem"));
        assert!(connect(&server.url(), Some(untrusted)).await.is_err());
        assert!(connect(&wrong, Some(certs.mutual())).await.is_err());
    }
    lock_tests::eventually("no task of the failed connects left", Duration::from_secs(5), async || {
        lock_tests::reached(metrics.num_alive_tasks(), tasks_before)
    })
    .await;
    lock_tests::eventually("no connection of the failed connects left", Duration::from_secs(5), async || {
        lock_tests::reached(clients(&mut admin).await, connections_before)
    })
    .await;
}

/// Sentinel over TLS: the sentinel asked over TLS, the primary it names reached over TLS, and
/// the pub/sub connection to it (made by the backend itself, over the same settings) carrying
/// a hand-off; an untrusted CA refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinel_over_tls() {
    let certs = Certs::make();
    let setup = lock_tests::redis_sentinel::SentinelSetup::start_tls(&certs);
    let sentinels = setup.sentinel_tls_urls();
    let options = RedisOptions::default().tls(TlsOptions::new().ca_file(certs.path("ca.pem")));
    let backend = RedisBackend::sentinel(&sentinels, lock_tests::redis_sentinel::MASTER, options).await;
    let m = LockManager::builder().backend(backend.expect("sentinel over TLS"));
    lock_tests::hand_off(&m, "sentinel:tls").await;

    let untrusted =
        RedisOptions::default().command_timeout(TIMEOUT).tls(TlsOptions::new().ca_file(certs.path("other-ca.pem")));
    let outcome = RedisBackend::sentinel(&sentinels, lock_tests::redis_sentinel::MASTER, untrusted);
    let e = refused(lock_tests::within_bound(TIMEOUT, outcome).await, "untrusted CA");
    assert!(e.is_backend(), "{e}");
}
