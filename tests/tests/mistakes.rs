//! Mistakes caught where they are made (issue 57): connecting checks what it can (the
//! password, the database) and names the cause and the host; a URL refuses a parameter it does
//! not know, listing the known ones; every hint fits the cause it follows.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

#[cfg(any(feature = "redis", feature = "postgres"))]
use lock_runtime::LockManager;

/// A Redis server that wants a password, reached without one: `connect` fails (it connected,
/// and the first `lock()` failed with `NOAUTH`), naming the credentials.
#[cfg(feature = "redis")]
#[tokio::test]
async fn a_redis_url_without_the_servers_password_fails_at_connect() {
    let server = lock_tests::redis_server::RedisServer::start_with(&["--requirepass", "s3cret"]);
    let e = LockManager::connect(&server.url()).await.expect_err("no password, no manager");
    assert!(e.is_backend(), "{e}");
    let text = e.to_string();
    assert!(text.contains("credentials") && text.contains("NOAUTH"), "{text}");
    let url = server.url().replacen("redis://", "redis://:s3cret@", 1);
    LockManager::connect(&url)
        .await
        .expect("with the password")
        .lock("m")
        .await
        .expect("lock")
        .release()
        .await
        .unwrap();
}

/// A misspelled parameter is refused, listing the known ones, on every networked scheme
/// (before anything is connected: no server is needed).
#[cfg(all(feature = "redis", feature = "postgres"))]
#[tokio::test]
async fn a_misspelled_url_parameter_is_refused_naming_the_known_ones() {
    for url in [
        "redis://127.0.0.1:1/?opertion_timeout=2s",
        "redis+cluster://127.0.0.1:1,127.0.0.1:2?opertion_timeout=2s",
        "redlock://127.0.0.1:1,127.0.0.1:2,127.0.0.1:3?opertion_timeout=2s",
        "postgres://u@127.0.0.1:1/db?opertion_timeout=2s",
        #[cfg(feature = "mysql")]
        "mysql://u:p@127.0.0.1:1/db?opertion_timeout=2s",
    ] {
        let e = LockManager::connect(url).await.expect_err("refused");
        assert!(e.is_invalid(), "{url}: {e}");
        let text = e.to_string();
        assert!(text.contains("opertion_timeout") && text.contains("operation_timeout"), "{url}: {text}");
    }
}

/// PostgreSQL: a database that does not exist is named, with the host, and the hint is not
/// about reaching the server.
#[cfg(feature = "postgres")]
#[tokio::test]
async fn a_missing_postgres_database_is_named_with_the_host() {
    let server = lock_tests::pg_server::PgServer::start();
    let url = format!("postgres://postgres@127.0.0.1:{}/nosuchdb", server.port());
    let e = LockManager::connect(&url).await.expect_err("no such database");
    let text = e.to_string();
    assert!(text.contains("nosuchdb"), "{text}");
    assert!(text.contains(&format!("127.0.0.1:{}", server.port())), "the host is named: {text}");
    assert!(!text.contains("reachable"), "the hint fits: {text}");
    assert!(!text.contains("error: error") && !text.contains("Input/output error: Input/output error"), "{text}");
}

/// MariaDB: a wrong password is about the credentials (not the TLS settings), with the host.
#[cfg(feature = "mysql")]
#[tokio::test]
async fn a_wrong_mariadb_password_is_about_the_credentials() {
    let server = lock_tests::mysql_server::MysqlServer::start();
    let url = format!("mysql://app:wrong@127.0.0.1:{}/app", server.port());
    let e = lock_runtime::LockManager::connect(&url).await.expect_err("wrong password");
    let text = e.to_string();
    assert!(text.contains("check the credentials") && !text.contains("check the TLS settings"), "{text}");
    assert!(text.contains(&format!("127.0.0.1:{}", server.port())), "the host is named: {text}");
    assert!(!text.contains("Input/output error: Input/output error"), "said twice: {text}");
}
