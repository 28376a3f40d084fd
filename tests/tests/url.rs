//! One URL to a manager (`LockManager::connect`): each scheme reaches the store its
//! constructor reaches (a lock held through the URL is busy for a manager built the other
//! way), and its URL's parts (credentials, chroot, key root, master name, database) are used.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use lock_runtime::LockManager;

/// `url` connects, reports `kind`, and a lock it holds is busy for `other` (the same store,
/// reached by its own constructor) until released.
async fn same_store(url: &str, kind: &str, other: &LockManager) {
    let manager = LockManager::connect(url).await.unwrap_or_else(|e| panic!("{url}: {e}"));
    assert_eq!(manager.backend_name(), kind, "{url}");
    let name = format!("url:{kind}");
    let guard = manager.lock(&name).await.unwrap_or_else(|e| panic!("{url}: lock: {e}"));
    assert!(other.try_lock(&name).await.expect("try_lock").is_none(), "{url}: the other manager got {name}");
    guard.release().await.expect("release");
    let theirs = other.try_lock(&name).await.expect("try_lock").expect("free after the release");
    theirs.release().await.expect("release");
}

#[tokio::test]
async fn memory_and_lock_file_urls() {
    let manager = LockManager::connect("memory://").await.expect("memory");
    assert_eq!(manager.backend_name(), "memory");
    let dir = std::env::temp_dir().join(format!("lock-tests-url-{}", std::process::id()));
    let other = LockManager::file(&dir).expect("file");
    same_store(&format!("file://{}", dir.display()), "file", &other).await;
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn a_bad_url_names_what_is_wrong() {
    for (url, says) in [
        ("consul://c:8500", "known schemes"),
        ("redis+sentinel://127.0.0.1:1", "the path names the primary"),
        ("redlock://a:1,,b:2", "separated by commas"),
        ("file://dir/x", "absolute path"),
        ("127.0.0.1:6379", "not a URL"),
    ] {
        let err = LockManager::connect(url).await.err().unwrap_or_else(|| panic!("{url} connected"));
        assert!(err.is_invalid(), "{url}: {err}");
        assert!(err.to_string().contains(says), "{url}: {err}");
    }
}

#[cfg(feature = "redis")]
mod redis_urls {
    use lock_runtime::LockManager;
    use lock_tests::redis_sentinel::{SentinelSetup, MASTER};
    use lock_tests::redis_server::RedisServer;

    use super::same_store;

    #[tokio::test]
    async fn one_server_redlock_cluster_and_sentinel() {
        let server = RedisServer::start();
        let other = LockManager::redis(server.url()).await.expect("redis");
        same_store(&server.url(), "redis", &other).await;
        // A database in the path is the redis crate's: another keyspace, so no conflict.
        let db1 = LockManager::connect(format!("{}/1", server.url())).await.expect("db 1");
        let held = db1.lock("url:db").await.expect("lock in db 1");
        assert!(other.try_lock("url:db").await.expect("try_lock").is_some(), "db 0 saw db 1's lock");
        held.release().await.expect("release");

        let nodes = [RedisServer::start(), RedisServer::start(), RedisServer::start()];
        let hosts: Vec<String> = nodes.iter().map(|n| n.url().trim_start_matches("redis://").to_owned()).collect();
        let urls: Vec<String> = nodes.iter().map(RedisServer::url).collect();
        let other = LockManager::redlock(&urls).await.expect("redlock");
        same_store(&format!("redlock://{}", hosts.join(",")), "redlock", &other).await;

        let cluster = lock_tests::redis_cluster::shared();
        let other = LockManager::redis_cluster(cluster.urls()).await.expect("cluster");
        let hosts: Vec<String> = cluster.urls().iter().map(|u| u.trim_start_matches("redis://").to_owned()).collect();
        same_store(&format!("redis+cluster://{}", hosts.join(",")), "redis", &other).await;

        let sentinels = SentinelSetup::shared();
        let other = LockManager::redis_sentinel(sentinels.sentinel_urls(), MASTER).await.expect("sentinel");
        let hosts: Vec<String> =
            sentinels.sentinel_urls().iter().map(|u| u.trim_start_matches("redis://").to_owned()).collect();
        same_store(&format!("redis+sentinel://{}/{MASTER}", hosts.join(",")), other.backend_name(), &other).await;
        let err = LockManager::connect(format!("redis+sentinel://{}/nosuchmaster", hosts.join(","))).await.err();
        assert!(err.is_some(), "an unknown master connected");
    }
}

/// The application's own Redis client (`RedisBackend::from_client`): its server and database
/// are the backend's.
#[cfg(feature = "redis")]
#[tokio::test]
async fn the_applications_redis_client() {
    use lock_runtime::backend::redis::{RedisBackend, RedisOptions};
    let server = lock_tests::redis_server::RedisServer::start();
    let client = redis::Client::open(format!("{}/2", server.url())).expect("the app's client");
    let backend = RedisBackend::from_client(client, RedisOptions::default()).await.expect("from the client");
    let on_client = LockManager::builder().backend(backend);
    let db2 = LockManager::connect(format!("{}/2", server.url())).await.expect("db 2");
    same_store(&format!("{}/2", server.url()), "redis", &on_client).await;
    let db0 = LockManager::connect(server.url()).await.expect("db 0");
    let held = on_client.lock("url:client").await.expect("lock");
    assert!(db2.try_lock("url:client").await.expect("try").is_none(), "db 2 is the client's");
    db0.try_lock("url:client").await.expect("try").expect("db 0 is another keyspace").release().await.unwrap();
    held.release().await.expect("release");
}

#[cfg(feature = "zookeeper")]
mod zookeeper_url {
    use lock_runtime::backend::zookeeper::{ZookeeperBackend, ZookeeperOptions};
    use lock_runtime::LockManager;
    use lock_tests::zk_server::ZkServer;

    use super::same_store;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn hosts_chroot_and_digest_identity() {
        let server = ZkServer::start();
        let other = LockManager::zookeeper(server.hosts()).await.expect("zookeeper");
        same_store(&format!("zookeeper://{}", server.hosts()), "zookeeper", &other).await;
        // A chroot that does not exist is named (ZooKeeper answers "no node").
        let err = LockManager::connect(format!("zookeeper://{}/myapp", server.hosts())).await.expect_err("no chroot");
        assert!(err.is_invalid() && err.to_string().contains("the chroot `/myapp` does not exist"), "{err}");
        // Made (here by a backend whose lock root it is), it is used.
        let made = ZookeeperBackend::connect_with(server.hosts(), ZookeeperOptions::new().root("/myapp")).await;
        drop(made.expect("root /myapp"));
        // Under a chroot, with a digest identity: the same store as a backend given both.
        let options = ZookeeperOptions::new().digest_auth("app", "s3cret");
        let chrooted = ZookeeperBackend::connect_with(format!("{}/myapp", server.hosts()), options).await;
        let other = LockManager::builder().backend(chrooted.expect("chroot"));
        same_store(&format!("zookeeper://app:s3cret@{}/myapp", server.hosts()), "zookeeper", &other).await;
    }
}

#[cfg(feature = "etcd")]
mod etcd_url {
    use lock_runtime::backend::etcd::{EtcdBackend, EtcdOptions};
    use lock_runtime::LockManager;
    use lock_tests::etcd_server::EtcdServer;

    use super::same_store;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn endpoints_and_key_root() {
        let server = EtcdServer::start();
        let host = server.endpoint().trim_start_matches("http://").to_owned();
        let other = LockManager::etcd([server.endpoint()]).await.expect("etcd");
        same_store(&format!("etcd://{host}"), "etcd", &other).await;
        let rooted = EtcdBackend::connect_with([server.endpoint()], EtcdOptions::new().root("myapp/locks")).await;
        let other = LockManager::builder().backend(rooted.expect("root"));
        same_store(&format!("etcd://{host}/myapp/locks"), "etcd", &other).await;
    }
}

#[cfg(feature = "postgres")]
mod postgres_url {
    use lock_runtime::LockManager;
    use lock_tests::pg_server::PgServer;

    use super::same_store;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn libpq_urls_single_and_multi_host() {
        let server = PgServer::start();
        let other = LockManager::postgres(server.url()).await.expect("postgres");
        same_store(&server.url(), "postgres", &other).await;
        // libpq's multi-host form: the first host refuses, the second is the server.
        let dead = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let url = format!("postgresql://postgres@127.0.0.1:{dead},127.0.0.1:{}/postgres", server.port());
        same_store(&url, "postgres", &other).await;
    }
}

#[cfg(feature = "mysql")]
mod mysql_url {
    use lock_runtime::LockManager;
    use lock_tests::mysql_server::MysqlServer;

    use super::same_store;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn mysql_and_mariadb_schemes() {
        let server = MysqlServer::start();
        let other = LockManager::mysql(server.url()).await.expect("mysql");
        same_store(&server.url(), "mysql", &other).await;
        same_store(&server.url().replacen("mysql://", "mariadb://", 1), "mysql", &other).await;
        same_store(&server.url().replacen("mysql://", "MariaDB://", 1), "mysql", &other).await;
    }
}
