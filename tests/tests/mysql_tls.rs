//! The MySQL backend over TLS, against MariaDB servers that take TLS connections only
//! (`require_secure_transport`; one also requires client certificates): locks and hand-offs
//! over TLS with the test CA, and each refusal or mistake as a clear error.

#![cfg(all(feature = "mysql", feature = "tls"))]
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use lock_runtime::backend::mysql::{MysqlBackend, MysqlOptions};
use lock_runtime::{LockManager, TlsOptions};
use lock_tests::mysql_server::MysqlServer;
use lock_tests::tls_certs::Certs;
use lock_tests::{hand_off, refused};

async fn manager(url: &str, tls: TlsOptions) -> Result<LockManager, lock_runtime::LockError> {
    Ok(LockManager::builder().backend(MysqlBackend::connect_with(url, MysqlOptions::new().tls(tls)).await?))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn locks_over_tls_with_the_ca() {
    let certs = Certs::make();
    let server = MysqlServer::start_tls(&certs, false);
    let m = manager(&server.url(), TlsOptions::new().ca_file(certs.path("ca.pem"))).await.expect("TLS connect");
    hand_off(&m, "over-tls").await;
    // A dropped waiter's `KILL QUERY` goes over TLS too: its wait ends on the server at once.
    let mut admin = admin(&server, &certs).await;
    let held = m.lock("dropped").await.unwrap();
    let waiting = tokio::spawn({
        let m = m.clone();
        async move { m.lock("dropped").wait(std::time::Duration::from_secs(30)).await }
    });
    waits_on_the_server(&mut admin, 1).await;
    waiting.abort();
    let _ = waiting.await;
    waits_on_the_server(&mut admin, 0).await;
    held.release().await.unwrap();
    let again = m.lock("dropped").wait(std::time::Duration::from_secs(2)).await.expect("free at once");
    again.release().await.unwrap();
}

/// A connection of the test's own to the TLS-only server, trusting the test CA.
async fn admin(server: &MysqlServer, certs: &Certs) -> mysql_async::Conn {
    let ssl = mysql_async::SslOpts::default()
        .with_disable_built_in_roots(true)
        .with_root_certs(vec![certs.path("ca.pem").into()]);
    let opts = mysql_async::OptsBuilder::from_opts(mysql_async::Opts::from_url(&server.url()).unwrap())
        .ssl_opts(Some(ssl))
        .prefer_socket(false);
    mysql_async::Conn::new(opts).await.expect("admin connection over TLS")
}

/// Waits (within 5 s) until `n` sessions run `GET_LOCK` on the server.
async fn waits_on_the_server(admin: &mut mysql_async::Conn, n: u64) {
    use mysql_async::prelude::Queryable;
    let count = "SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE INFO LIKE 'SELECT GET_LOCK(%'";
    let started = std::time::Instant::now();
    while admin.query_first::<u64, _>(count).await.unwrap() != Some(n) {
        assert!(started.elapsed() < std::time::Duration::from_secs(5), "never {n} GET_LOCK waits on the server");
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refusals_and_mistakes_are_clear_errors() {
    let certs = Certs::make();
    let server = MysqlServer::start_tls(&certs, false);
    // Plaintext to a TLS-only server: MariaDB answers "Access denied"; the error says it may
    // mean that TLS is required.
    let err = refused(LockManager::mysql(server.url()).await, "the server takes TLS only");
    assert!(err.is_backend() && err.to_string().contains("require_secure_transport"), "{err}");
    // A CA that did not sign the server's certificate.
    let other = TlsOptions::new().ca_file(certs.path("other-ca.pem"));
    let err = refused(manager(&server.url(), other).await, "the server's CA is not trusted");
    assert!(err.is_backend(), "{err}");
    assert!(err.to_string().contains("UnknownIssuer") && err.to_string().contains("TLS"), "{err}");
    // The URL's `require_ssl=true` alone trusts the platform's roots, which did not sign it.
    let err = refused(LockManager::mysql(format!("{}?require_ssl=true", server.url())).await, "platform roots only");
    assert!(err.is_backend(), "{err}");
    // A CA file that cannot be read.
    let missing = TlsOptions::new().ca_file(certs.path("missing.pem"));
    let err = refused(manager(&server.url(), missing).await, "the CA file is missing");
    assert!(err.is_invalid() && err.to_string().contains("missing.pem"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mutual_tls_needs_the_client_certificate() {
    let certs = Certs::make();
    let server = MysqlServer::start_tls(&certs, true);
    let ca_only = TlsOptions::new().ca_file(certs.path("ca.pem"));
    let err = refused(manager(&server.url(), ca_only).await, "the user requires X509");
    assert!(err.is_backend() && err.to_string().contains("Access denied"), "{err}");
    let m = manager(&server.url(), certs.mutual()).await.expect("with the client certificate");
    hand_off(&m, "mutual").await;
}
