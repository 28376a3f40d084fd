//! The PostgreSQL backend over TLS, against real `postgres` servers that accept TLS only
//! (`hostssl` lines alone; certificates `openssl` makes for each test): the conformance suite
//! with `verify-full` and mutual TLS, libpq's `sslmode` / `sslrootcert` / `sslcert` / `sslkey`
//! with libpq's meaning for each, the cancel request of a dropped waiter over TLS, and each
//! failure a clear error within the bound.

#![cfg(all(feature = "postgres", feature = "tls"))]
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::Arc;
use std::time::Duration;

use lock_runtime::backend::postgres::{PostgresBackend, PostgresOptions};
use lock_runtime::{LockError, LockManager, LockManagerBuilder, TlsOptions};
use lock_tests::pg_server::PgServer;
use lock_tests::refused;
use lock_tests::tls_certs::Certs;

/// `postgres://postgres@127.0.0.1:<port>/postgres?<params>` (the certificate names 127.0.0.1).
fn url(server: &PgServer, params: &str) -> String {
    format!("postgres://postgres@127.0.0.1:{}/postgres?{params}", server.port())
}

lock_tests::conformance_suite!(
    {
        let certs = Arc::new(Certs::make());
        let server = Arc::new(PgServer::start_tls(&certs, true));
        move |builder: LockManagerBuilder| {
            let (url, tls) = (url(&server, "sslmode=verify-full"), certs.mutual());
            let _keep = (server.clone(), certs.clone());
            async move {
                let backend = PostgresBackend::connect_with(url, PostgresOptions::new().tls(tls)).await;
                builder.backend(backend.expect("connect with verify-full and mutual TLS"))
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

async fn connect(url: &str, options: PostgresOptions) -> Result<PostgresBackend, LockError> {
    lock_tests::within_bound(TIMEOUT, PostgresBackend::connect_with(url, options.operation_timeout(TIMEOUT))).await
}

#[tokio::test]
async fn libpq_url_parameters_alone_connect_with_mutual_tls() {
    let certs = Certs::make();
    let server = PgServer::start_tls(&certs, true);
    let params = format!(
        "sslmode=verify-full&sslrootcert={}&sslcert={}&sslkey={}",
        certs.path("ca.pem").display(),
        certs.path("client.pem").display(),
        certs.path("client.key").display()
    );
    let m =
        LockManager::builder().backend(connect(&url(&server, &params), PostgresOptions::new()).await.expect("connect"));
    m.lock("over-tls").await.expect("lock").release().await.expect("release");
    // Encrypted: the server says so of the lock connection.
    let admin = server.admin().await;
    let row = admin.query_one("SELECT count(*) FROM pg_stat_ssl WHERE ssl", &[]).await.expect("pg_stat_ssl");
    assert!(row.get::<_, i64>(0) >= 1, "a TLS session is open");
}

#[tokio::test]
async fn each_sslmode_checks_what_libpq_checks() {
    let certs = Certs::make();
    // The server's certificate is for another host name.
    let server = PgServer::start_tls_as(&certs, "elsewhere", false);
    let ca = format!("sslrootcert={}", certs.path("ca.pem").display());
    // require without a CA: encryption only, nothing checked.
    assert!(connect(&url(&server, "sslmode=require"), PostgresOptions::new()).await.is_ok());
    // prefer (the default): the same.
    assert!(connect(&url(&server, ""), PostgresOptions::new()).await.is_ok());
    // verify-ca: the chain, not the name.
    assert!(connect(&url(&server, &format!("sslmode=verify-ca&{ca}")), PostgresOptions::new()).await.is_ok());
    // verify-full: the name too.
    let e = refused(connect(&url(&server, &format!("sslmode=verify-full&{ca}")), PostgresOptions::new()).await, "name");
    assert!(e.is_backend() && e.to_string().contains("not valid for name"), "{e}");
    // TLS settings given and no sslmode: verify-full.
    let tls = PostgresOptions::new().tls(TlsOptions::new().ca_file(certs.path("ca.pem")));
    let e = refused(connect(&url(&server, ""), tls).await, "the settings given mean verify-full");
    assert!(e.is_backend() && e.to_string().contains("TLS settings"), "{e}");
    // verify-ca, and require with a CA given, refuse an unknown CA.
    let other = format!("sslrootcert={}", certs.path("other-ca.pem").display());
    for mode in ["verify-ca", "require"] {
        let e = refused(connect(&url(&server, &format!("sslmode={mode}&{other}")), PostgresOptions::new()).await, mode);
        assert!(e.is_backend() && e.to_string().contains("UnknownIssuer"), "{mode}: {e}");
    }
}

#[tokio::test]
async fn refusals_and_mistakes_are_clear_errors() {
    let certs = Certs::make();
    let server = PgServer::start_tls(&certs, true);
    // No TLS to a TLS-only server: the server's own refusal.
    let e = refused(connect(&url(&server, "sslmode=disable"), PostgresOptions::new()).await, "hostssl only");
    assert!(e.is_backend() && e.to_string().contains("pg_hba.conf"), "{e}");
    // No client certificate where one is required.
    let ca_only = PostgresOptions::new().tls(TlsOptions::new().ca_file(certs.path("ca.pem")));
    let e = refused(connect(&url(&server, "sslmode=verify-full"), ca_only).await, "no client certificate");
    assert!(e.is_backend(), "{e}");
    // Mistakes in the settings: is_invalid, naming the cause.
    for (params, cause) in [
        ("sslmode=verify".to_owned(), "verify-full"),
        (format!("sslmode=verify-full&sslcert={}", certs.path("client.pem").display()), "sslkey"),
        ("sslmode=verify-full&sslrootcert=/nonexistent/ca.pem".to_owned(), "/nonexistent/ca.pem"),
    ] {
        let e = refused(connect(&url(&server, &params), PostgresOptions::new()).await, &params);
        assert!(e.is_invalid() && e.to_string().contains(cause), "{params}: {e}");
    }
}

/// A waiter dropped while it waits on the server leaves the server's queue at once: its
/// cancel request goes over TLS as its connection did.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropped_waiter_is_cancelled_over_tls() {
    let certs = Certs::make();
    let server = PgServer::start_tls(&certs, true);
    let m = LockManager::builder().backend(
        connect(&url(&server, "sslmode=verify-full"), PostgresOptions::new().tls(certs.mutual()))
            .await
            .expect("connect"),
    );
    let admin = server.admin().await;
    let queued = async || -> i64 {
        let sql = "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted";
        admin.query_one(sql, &[]).await.expect("pg_locks").get(0)
    };
    let holder = m.lock("queued").await.expect("holder");
    let m2 = m.clone();
    let waiter = tokio::spawn(async move { m2.lock("queued").wait(Duration::from_secs(30)).await.map(drop) });
    lock_tests::eventually("the waiter queued on the server", Duration::from_secs(5), async || {
        lock_tests::reached(queued().await, 1)
    })
    .await;
    waiter.abort();
    let _ = waiter.await;
    lock_tests::eventually("the dropped waiter gone from the server's queue", Duration::from_secs(2), async || {
        lock_tests::reached(queued().await, 0)
    })
    .await;
    holder.release().await.expect("release");
}

/// The least-privilege role of the README: no table rights, `USAGE` on the fencing sequence
/// (created beforehand by its owner), over TLS; it runs what the backend offers (mutexes,
/// `lock_all`). Before, `connect` ran `CREATE SEQUENCE IF NOT EXISTS` even when the sequence
/// was there, which such a role may not (`permission denied for schema public`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_role_with_only_usage_on_the_sequence_runs_everything() {
    let certs = Certs::make();
    let server = PgServer::start_tls(&certs, false);
    let admin = server.admin().await;
    admin
        .batch_execute(
            "CREATE SEQUENCE lock_runtime_fence; CREATE ROLE locker LOGIN; \
             REVOKE CREATE ON SCHEMA public FROM PUBLIC; GRANT USAGE ON SEQUENCE lock_runtime_fence TO locker",
        )
        .await
        .expect("role");
    let url = format!("postgres://locker@127.0.0.1:{}/postgres?sslmode=verify-full", server.port());
    let tls = PostgresOptions::new().tls(TlsOptions::new().ca_file(certs.path("ca.pem")));
    let m = LockManager::builder().backend(connect(&url, tls).await.expect("the least-privilege role connects"));
    let first = m.lock("role:mutex").await.expect("mutex");
    let token = first.fencing_token();
    first.release().await.expect("release");
    assert!(m.lock("role:mutex").await.expect("again").fencing_token() > token);
    m.lock_all(["role:a", "role:b"]).await.expect("lock_all").release().await.expect("release");
    // It may not create anything.
    let (locker, connection) = tokio_postgres::Config::new()
        .host_path(server.admin_socket_dir())
        .port(server.port())
        .user("locker")
        .dbname("postgres")
        .connect(tokio_postgres::NoTls)
        .await
        .expect("locker over the socket");
    tokio::spawn(connection);
    let e = locker.batch_execute("CREATE TABLE t (x int)").await.expect_err("no CREATE");
    assert!(format!("{e:?}").contains("permission denied"), "{e:?}");
}

/// Failed connects (a certificate for another host under verify-full, no client certificate)
/// leave nothing behind: no task of theirs, no session on the server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_connects_leave_no_task_or_session() {
    let certs = Certs::make();
    let server = PgServer::start_tls(&certs, true);
    let admin = server.admin().await;
    let sessions = async || -> i64 {
        let sql = "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend'";
        admin.query_one(sql, &[]).await.expect("pg_stat_activity").get(0)
    };
    let sessions_before = sessions().await;
    let metrics = tokio::runtime::Handle::current().metrics();
    let tasks_before = metrics.num_alive_tasks();
    let ca_only = || PostgresOptions::new().tls(TlsOptions::new().ca_file(certs.path("ca.pem")));
    for _ in 0..3 {
        assert!(connect(&url(&server, "sslmode=verify-full"), ca_only()).await.is_err());
        let other = format!("sslmode=verify-ca&sslrootcert={}", certs.path("other-ca.pem").display());
        assert!(connect(&url(&server, &other), PostgresOptions::new()).await.is_err());
    }
    lock_tests::eventually("no task of the failed connects left", Duration::from_secs(5), async || {
        lock_tests::reached(metrics.num_alive_tasks(), tasks_before)
    })
    .await;
    lock_tests::eventually("no session of the failed connects left", Duration::from_secs(5), async || {
        lock_tests::reached(sessions().await, sessions_before)
    })
    .await;
}
