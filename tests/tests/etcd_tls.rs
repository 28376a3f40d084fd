//! The etcd backend over TLS and with etcd's authentication, against real `etcd` processes
//! whose client port speaks TLS only (certificates `openssl` makes for each test): the
//! conformance suite over mutual TLS, the TLS failures as clear errors within the bound, and a
//! user whose role may read and write the library's key prefix only (RBAC on).

#![cfg(all(feature = "etcd", feature = "tls"))]
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::Arc;
use std::time::Duration;

use etcd_client::ConnectOptions;
use lock_runtime::backend::etcd::{EtcdBackend, EtcdOptions};
use lock_runtime::{LockError, LockManager, LockManagerBuilder, TlsOptions};
use lock_tests::etcd_server::EtcdServer;
use lock_tests::refused;
use lock_tests::tls_certs::Certs;

lock_tests::conformance_suite!(
    {
        let certs = Arc::new(Certs::make());
        let server = Arc::new(EtcdServer::start_tls(&certs, true));
        move |builder: LockManagerBuilder| {
            let (endpoint, tls) = (server.endpoint(), certs.mutual());
            let _keep = (server.clone(), certs.clone());
            async move {
                let backend = EtcdBackend::connect_with(&[endpoint], EtcdOptions::new().tls(tls)).await;
                builder.backend(backend.expect("connect over mutual TLS"))
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

const TIMEOUT: Duration = Duration::from_secs(2);

async fn connect(endpoint: &str, options: EtcdOptions) -> Result<EtcdBackend, LockError> {
    lock_tests::within_bound(TIMEOUT, EtcdBackend::connect_with(&[endpoint], options.operation_timeout(TIMEOUT))).await
}

#[tokio::test]
async fn tls_refusals_and_mistakes_are_clear_errors() {
    let certs = Certs::make();
    let server = EtcdServer::start_tls(&certs, true);
    let endpoint = server.endpoint();
    // A CA that did not sign the server's certificate; then none given (platform roots).
    for tls in [TlsOptions::new().ca_file(certs.path("other-ca.pem")), TlsOptions::new()] {
        let e = refused(connect(&endpoint, EtcdOptions::new().tls(tls)).await, "the CA is not trusted");
        assert!(e.is_backend() && e.to_string().contains("UnknownIssuer"), "{e}");
    }
    // Mutual TLS, and no client certificate.
    let e = refused(
        connect(&endpoint, EtcdOptions::new().tls(TlsOptions::new().ca_file(certs.path("ca.pem")))).await,
        "no client certificate",
    );
    assert!(e.is_backend(), "{e}");
    // Plaintext to the TLS port.
    let plain = endpoint.replacen("https://", "http://", 1);
    assert!(refused(connect(&plain, EtcdOptions::new()).await, "the port speaks TLS").is_backend());
    // TLS settings with an http:// endpoint; a key file that is missing.
    let e = refused(connect(&plain, EtcdOptions::new().tls(certs.mutual())).await, "http:// endpoint");
    assert!(e.is_invalid() && e.to_string().contains("https://"), "{e}");
    let missing =
        TlsOptions::new().ca_file(certs.path("ca.pem")).client_cert_files(certs.path("client.pem"), "/nonexistent.key");
    let e = refused(connect(&endpoint, EtcdOptions::new().tls(missing)).await, "the key is missing");
    assert!(e.is_invalid() && e.to_string().contains("/nonexistent.key"), "{e}");
    assert!(connect(&endpoint, EtcdOptions::new().tls(certs.mutual())).await.is_ok());
}

/// RBAC on: a user whose role may read and write `lock-runtime/` only runs every kind the
/// backend offers, over TLS; wrong credentials are refused by name.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_user_limited_to_the_lock_prefix_runs_everything() {
    let certs = Certs::make();
    let server = EtcdServer::start_tls(&certs, false);
    let endpoint = server.endpoint();
    let ca = std::fs::read(certs.path("ca.pem")).unwrap();
    let tls = etcd_client::TlsOptions::new().ca_certificate(etcd_client::Certificate::from_pem(ca));
    let mut admin = etcd_client::Client::connect([endpoint.as_str()], Some(ConnectOptions::new().with_tls(tls)))
        .await
        .expect("admin");
    admin.put("other/secret", "x", None).await.unwrap();
    lock_tests::etcd_server::enable_rbac(&mut admin).await;

    let tls = || TlsOptions::new().ca_file(certs.path("ca.pem"));
    let options = EtcdOptions::new().tls(tls()).credentials("locker", "lock-secret");
    let m = LockManager::builder().backend(connect(&endpoint, options).await.expect("the limited user connects"));
    let first = m.lock("rbac:mutex").await.expect("mutex");
    let token = first.fencing_token();
    let m2 = m.clone();
    let waiter =
        tokio::spawn(
            async move { m2.lock("rbac:mutex").wait(Duration::from_secs(5)).await.map(|g| g.fencing_token()) },
        );
    tokio::time::sleep(Duration::from_millis(100)).await;
    first.release().await.expect("release");
    assert!(waiter.await.unwrap().expect("handed over") > token);
    m.lock_all(["rbac:a", "rbac:b"]).await.expect("lock_all").release().await.expect("release");

    // The same user reads nothing else.
    let ca = std::fs::read(certs.path("ca.pem")).unwrap();
    let client_tls = etcd_client::TlsOptions::new().ca_certificate(etcd_client::Certificate::from_pem(ca));
    let options = ConnectOptions::new().with_tls(client_tls).with_user("locker", "lock-secret");
    let mut locker = etcd_client::Client::connect([endpoint.as_str()], Some(options)).await.expect("locker");
    let e = locker.get("other/secret", None).await.expect_err("outside the role's prefix");
    assert!(e.to_string().contains("permission denied"), "{e}");

    let wrong = EtcdOptions::new().tls(tls()).credentials("locker", "wrong");
    let e = refused(connect(&endpoint, wrong).await, "the password is wrong");
    assert!(e.is_backend() && e.to_string().contains("authentication failed"), "{e}");
    assert!(!e.to_string().contains("wrong"), "the password is not shown: {e}");
    assert!(e.to_string().contains("credentials"), "the hint points at the credentials: {e}");
}

/// Failed connects (an untrusted CA, no client certificate, a wrong password) leave no task
/// of theirs running.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_connects_leave_no_task() {
    let certs = Certs::make();
    let server = EtcdServer::start_tls(&certs, true);
    let endpoint = server.endpoint();
    let metrics = tokio::runtime::Handle::current().metrics();
    let before = metrics.num_alive_tasks();
    for _ in 0..3 {
        let untrusted = EtcdOptions::new().tls(TlsOptions::new().ca_file(certs.path("other-ca.pem")));
        assert!(connect(&endpoint, untrusted).await.is_err());
        let no_cert = EtcdOptions::new().tls(TlsOptions::new().ca_file(certs.path("ca.pem")));
        assert!(connect(&endpoint, no_cert).await.is_err());
    }
    lock_tests::eventually("no task of the failed connects left", Duration::from_secs(5), async || {
        lock_tests::reached(metrics.num_alive_tasks(), before)
    })
    .await;
}
