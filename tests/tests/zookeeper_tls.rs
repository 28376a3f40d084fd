//! ZooKeeper over TLS (feature `tls-aws-lc`), against a real server whose only client port is
//! its secure one (Netty; certificates `openssl` makes for each test): the conformance suite
//! over mutual TLS, and the failures as clear errors within the bound.

#![cfg(all(feature = "zookeeper", feature = "tls-aws-lc"))]
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::Arc;
use std::time::Duration;

use lock_runtime::backend::zookeeper::{ZookeeperBackend, ZookeeperOptions};
use lock_runtime::{LockManagerBuilder, TlsOptions};
use lock_tests::tls_certs::Certs;
use lock_tests::zk_server::ZkServer;

lock_tests::conformance_suite!(
    {
        let certs = Arc::new(Certs::make());
        let server = Arc::new(ZkServer::start_tls(certs.dir(), true));
        move |builder: LockManagerBuilder| {
            let (hosts, tls) = (server.hosts(), certs.mutual());
            let _keep = (server.clone(), certs.clone());
            async move {
                let backend = ZookeeperBackend::connect_with(hosts, ZookeeperOptions::new().tls(tls)).await;
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

async fn connect(server: &ZkServer, tls: Option<TlsOptions>) -> Result<ZookeeperBackend, lock_runtime::LockError> {
    let options = ZookeeperOptions::new().operation_timeout(TIMEOUT);
    let options = match tls {
        Some(tls) => options.tls(tls),
        None => options,
    };
    ZookeeperBackend::connect_with(server.hosts(), options).await
}

/// A server certificate signed by a CA the client does not trust, a client without the
/// certificate a mutual-TLS server asks for, and a plain-text client: each connect fails
/// within the bound (twice the operation timeout, a margin for a loaded machine), as a
/// backend error with the reason (the ZooKeeper client says only "no available hosts": the
/// backend's own handshake tells why).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_mistakes_fail_the_connect_within_the_bound() {
    let certs = Certs::make();
    let mutual = ZkServer::start_tls(certs.dir(), true);
    let cases = [
        ("an unknown CA", Some(TlsOptions::new().ca_file(certs.path("other-ca.pem"))), "UnknownIssuer"),
        ("no client certificate", Some(TlsOptions::new().ca_file(certs.path("ca.pem"))), "alert"),
        ("plain text", None, "no available hosts"),
    ];
    for (case, tls, reason) in cases {
        let started = std::time::Instant::now();
        let e = connect(&mutual, tls).await.expect_err(case);
        assert!(e.is_backend() && e.to_string().contains(reason), "{case}: {e}");
        assert!(started.elapsed() < 2 * TIMEOUT, "{case}: failed after {:?}", started.elapsed());
    }
    // The same server with the right settings: the failures were the settings'.
    let backend = connect(&mutual, Some(certs.mutual())).await.expect("connect over mutual TLS");
    let manager = lock_runtime::LockManager::builder().backend(backend);
    manager.lock("tls").await.expect("lock").release().await.expect("release");
}

/// A CA file that cannot be read is `is_invalid`, naming the file, before any connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreadable_ca_file_is_invalid_and_named() {
    let server = lock_tests::zk_server::shared();
    let tls = TlsOptions::new().ca_file("/nonexistent/ca.pem");
    let e = connect(server, Some(tls)).await.expect_err("refused");
    assert!(e.is_invalid() && e.to_string().contains("/nonexistent/ca.pem"), "{e}");
}
