//! The constructors of the built-in backends, on the manager and its builder: each is the
//! backend's own `connect` with default options, handed to [`LockManagerBuilder::backend`]. For
//! other options, build the backend (`RedisBackend::connect_with(..)`, ...) and pass it there.

#[cfg(feature = "etcd")]
use crate::backend::etcd::EtcdBackend;
use crate::backend::file::FileBackend;
#[cfg(feature = "mysql")]
use crate::backend::mysql::MysqlBackend;
#[cfg(feature = "postgres")]
use crate::backend::postgres::PostgresBackend;
#[cfg(feature = "redis")]
use crate::backend::redis::{RedisBackend, RedisOptions, RedlockBackend};
#[cfg(feature = "zookeeper")]
use crate::backend::zookeeper::ZookeeperBackend;
use crate::error::LockError;

use super::{LockManager, LockManagerBuilder};

impl LockManager {
    /// A manager on the backend `url` names by its scheme (`redis://`, `postgres://`,
    /// `zookeeper://`, `file:///dir`, `memory://`, ...; see [`backend::url`](crate::backend::url)
    /// for each scheme and what its URL carries), with default settings; same as
    /// `LockManager::builder().connect(url)`. A scheme whose feature this build leaves out is
    /// an [`is_invalid`](LockError::is_invalid) error naming the feature; an unknown scheme
    /// lists the known ones.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), lock_runtime::LockError> {
    /// let url = std::env::var("LOCK_URL").unwrap_or_else(|_| "memory://".to_owned());
    /// let manager = lock_runtime::LockManager::connect(&url).await?;
    /// let guard = manager.lock("order:42").await?;
    /// guard.release().await?;
    /// # Ok(()) }
    /// ```
    pub async fn connect(url: impl AsRef<str>) -> Result<LockManager, LockError> {
        LockManager::builder().connect(url).await
    }

    /// A manager on the lock files in `dir` (created if missing), shared by the processes of
    /// one host; same as `LockManager::builder().file(dir)`. Always compiled. See
    /// [`FileBackend`] for what it does and the options.
    ///
    /// ```
    /// # #[tokio::main] async fn main() -> Result<(), lock_runtime::LockError> {
    /// let manager = lock_runtime::LockManager::file(std::env::temp_dir().join("myapp-locks"))?;
    /// let guard = manager.lock("order:42").await?;
    /// guard.release().await?;
    /// # Ok(()) }
    /// ```
    pub fn file(dir: impl AsRef<std::path::Path>) -> Result<LockManager, LockError> {
        LockManager::builder().file(dir)
    }

    /// A manager on the Redis server at `url`, with default settings; same as
    /// `LockManager::builder().redis(url).await`. Feature `redis`.
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), lock_runtime::LockError> {
    /// let manager = lock_runtime::LockManager::redis("redis://127.0.0.1:6379").await?;
    /// let guard = manager.lock("order:42").await?;
    /// guard.release().await?;
    /// # Ok(()) }
    /// ```
    #[cfg(feature = "redis")]
    #[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
    pub async fn redis(url: impl AsRef<str>) -> Result<LockManager, LockError> {
        LockManager::builder().redis(url).await
    }

    /// A manager on the Redis Cluster that the nodes at `urls` belong to, with default
    /// settings; same as `LockManager::builder().redis_cluster(urls).await`. Feature `redis`.
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), lock_runtime::LockError> {
    /// let manager =
    ///     lock_runtime::LockManager::redis_cluster(&["redis://127.0.0.1:7000", "redis://127.0.0.1:7001"]).await?;
    /// let guard = manager.lock("order:42").await?;
    /// guard.release().await?;
    /// # Ok(()) }
    /// ```
    #[cfg(feature = "redis")]
    #[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
    pub async fn redis_cluster<E: AsRef<str>, S: AsRef<[E]>>(urls: S) -> Result<LockManager, LockError> {
        LockManager::builder().redis_cluster(urls).await
    }

    /// A manager on the primary the sentinels at `sentinels` name `master_name`, with default
    /// settings; same as `LockManager::builder().redis_sentinel(sentinels, master_name)`.
    /// Feature `redis`.
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), lock_runtime::LockError> {
    /// let sentinels = ["redis://127.0.0.1:26379", "redis://127.0.0.1:26380"];
    /// let manager = lock_runtime::LockManager::redis_sentinel(&sentinels, "mymaster").await?;
    /// let guard = manager.lock("order:42").await?;
    /// guard.release().await?;
    /// # Ok(()) }
    /// ```
    #[cfg(feature = "redis")]
    #[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
    pub async fn redis_sentinel<E: AsRef<str>, S: AsRef<[E]>>(
        sentinels: S,
        master_name: &str,
    ) -> Result<LockManager, LockError> {
        LockManager::builder().redis_sentinel(sentinels, master_name).await
    }

    /// A manager on Redlock over the independent Redis primaries at `urls` (3 or 5 are meant),
    /// with default [`RedisOptions`]; same as `LockManager::builder().redlock(urls).await`.
    /// Feature `redis`. See [`RedlockBackend`].
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), lock_runtime::LockError> {
    /// let manager =
    ///     lock_runtime::LockManager::redlock(&["redis://a:6379", "redis://b:6379", "redis://c:6379"]).await?;
    /// let guard = manager.lock("order:42").await?;
    /// guard.release().await?;
    /// # Ok(()) }
    /// ```
    #[cfg(feature = "redis")]
    #[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
    pub async fn redlock<E: AsRef<str>, S: AsRef<[E]>>(urls: S) -> Result<LockManager, LockError> {
        LockManager::builder().redlock(urls).await
    }

    /// A manager on ZooKeeper at `hosts` (`"host:port,host:port"`) with default settings; same
    /// as `LockManager::builder().zookeeper(hosts)`. See [`ZookeeperBackend`] for the options.
    ///
    /// ```no_run
    /// # #[tokio::main] async fn main() -> Result<(), lock_runtime::LockError> {
    /// let manager = lock_runtime::LockManager::zookeeper("127.0.0.1:2181").await?;
    /// let guard = manager.lock("order:42").await?;
    /// guard.release().await?;
    /// # Ok(()) }
    /// ```
    #[cfg(feature = "zookeeper")]
    #[cfg_attr(docsrs, doc(cfg(feature = "zookeeper")))]
    pub async fn zookeeper(hosts: impl AsRef<str>) -> Result<LockManager, LockError> {
        LockManager::builder().zookeeper(hosts).await
    }

    /// A manager on etcd at `endpoints` (`["http://host:port", …]`) with default settings;
    /// same as `LockManager::builder().etcd(endpoints)`. See [`EtcdBackend`] for the options.
    ///
    /// ```no_run
    /// # #[tokio::main] async fn main() -> Result<(), lock_runtime::LockError> {
    /// let manager = lock_runtime::LockManager::etcd(&["http://127.0.0.1:2379"]).await?;
    /// let guard = manager.lock("order:42").await?;
    /// guard.release().await?;
    /// # Ok(()) }
    /// ```
    #[cfg(feature = "etcd")]
    #[cfg_attr(docsrs, doc(cfg(feature = "etcd")))]
    pub async fn etcd<E: AsRef<str>, S: AsRef<[E]>>(endpoints: S) -> Result<LockManager, LockError> {
        LockManager::builder().etcd(endpoints).await
    }

    /// A manager on PostgreSQL at `url` (`postgres://user@host:port/db`) with default
    /// settings; same as `LockManager::builder().postgres(url)`. See [`PostgresBackend`] for
    /// the options.
    ///
    /// ```no_run
    /// # #[tokio::main] async fn main() -> Result<(), lock_runtime::LockError> {
    /// let manager = lock_runtime::LockManager::postgres("postgres://app@127.0.0.1:5432/app").await?;
    /// let guard = manager.lock("order:42").await?;
    /// guard.release().await?;
    /// # Ok(()) }
    /// ```
    #[cfg(feature = "postgres")]
    #[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
    pub async fn postgres(url: impl AsRef<str>) -> Result<LockManager, LockError> {
        LockManager::builder().postgres(url).await
    }

    /// A manager on MySQL or MariaDB at `url` (`mysql://user:password@host:port/database`)
    /// with default settings; same as `LockManager::builder().mysql(url)`. Feature `mysql`.
    /// See [`MysqlBackend`] for the options.
    ///
    /// ```no_run
    /// # #[tokio::main] async fn main() -> Result<(), lock_runtime::LockError> {
    /// let manager = lock_runtime::LockManager::mysql("mysql://app:secret@127.0.0.1:3306/app").await?;
    /// let guard = manager.lock("order:42").await?;
    /// guard.release().await?;
    /// # Ok(()) }
    /// ```
    #[cfg(feature = "mysql")]
    #[cfg_attr(docsrs, doc(cfg(feature = "mysql")))]
    pub async fn mysql(url: impl AsRef<str>) -> Result<LockManager, LockError> {
        LockManager::builder().mysql(url).await
    }
}

impl LockManagerBuilder {
    /// A manager on the backend `url` names by its scheme (see [`LockManager::connect`] and
    /// [`backend::url`](crate::backend::url)). `memory://` gives the in-process backend with its
    /// fast path, as [`memory`](LockManagerBuilder::memory) does.
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), lock_runtime::LockError> {
    /// let manager = lock_runtime::LockManager::builder()
    ///     .prefix("myapp:")
    ///     .connect("redis+sentinel://s1:26379,s2:26379/mymaster")
    ///     .await?;
    /// # Ok(()) }
    /// ```
    pub async fn connect(self, url: impl AsRef<str>) -> Result<LockManager, LockError> {
        let backend = crate::backend::url::connect(url.as_ref()).await?;
        Ok(match backend.name() {
            "memory" => self.memory(),
            _ => self.backend_arc(backend.into()),
        })
    }

    /// A manager on the lock files in `dir` (see [`FileBackend::open`]); for other options,
    /// pass [`FileBackend::open_with`]'s backend to [`backend`](LockManagerBuilder::backend).
    ///
    /// ```
    /// # fn main() -> Result<(), lock_runtime::LockError> {
    /// let manager =
    ///     lock_runtime::LockManager::builder().prefix("myapp:").file(std::env::temp_dir().join("myapp-locks"))?;
    /// # Ok(()) }
    /// ```
    pub fn file(self, dir: impl AsRef<std::path::Path>) -> Result<LockManager, LockError> {
        Ok(self.backend(FileBackend::open(dir)?))
    }

    /// A manager on the Redis server at `url` (see [`RedisBackend::connect`]). Feature `redis`.
    /// For a custom command timeout, use [`RedisBackend::connect_with`] and
    /// [`backend`](LockManagerBuilder::backend).
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), lock_runtime::LockError> {
    /// let manager = lock_runtime::LockManager::builder().prefix("myapp:").redis("redis://127.0.0.1:6379").await?;
    /// # Ok(()) }
    /// ```
    #[cfg(feature = "redis")]
    #[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
    pub async fn redis(self, url: impl AsRef<str>) -> Result<LockManager, LockError> {
        Ok(self.backend(RedisBackend::connect(url.as_ref()).await?))
    }

    /// A manager on the Redis Cluster that the nodes at `urls` belong to (see
    /// [`RedisBackend::cluster`]). Feature `redis`. For other options, pass the backend of
    /// [`RedisBackend::cluster`] to [`backend`](LockManagerBuilder::backend).
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), lock_runtime::LockError> {
    /// let manager = lock_runtime::LockManager::builder()
    ///     .prefix("myapp:")
    ///     .redis_cluster(&["redis://127.0.0.1:7000", "redis://127.0.0.1:7001"])
    ///     .await?;
    /// # Ok(()) }
    /// ```
    #[cfg(feature = "redis")]
    #[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
    pub async fn redis_cluster<E: AsRef<str>, S: AsRef<[E]>>(self, urls: S) -> Result<LockManager, LockError> {
        Ok(self.backend(RedisBackend::cluster(urls, RedisOptions::default()).await?))
    }

    /// A manager on the primary the sentinels at `sentinels` name `master_name` (see
    /// [`RedisBackend::sentinel`]). Feature `redis`. For other options, pass
    /// [`RedisBackend::sentinel`]'s backend to [`backend`](LockManagerBuilder::backend).
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), lock_runtime::LockError> {
    /// let manager = lock_runtime::LockManager::builder()
    ///     .prefix("myapp:")
    ///     .redis_sentinel(&["redis://127.0.0.1:26379"], "mymaster")
    ///     .await?;
    /// # Ok(()) }
    /// ```
    #[cfg(feature = "redis")]
    #[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
    pub async fn redis_sentinel<E: AsRef<str>, S: AsRef<[E]>>(
        self,
        sentinels: S,
        master_name: &str,
    ) -> Result<LockManager, LockError> {
        Ok(self.backend(RedisBackend::sentinel(sentinels, master_name, RedisOptions::default()).await?))
    }

    /// A manager on Redlock over the independent Redis primaries at `urls` (see
    /// [`RedlockBackend::connect`]). Feature `redis`.
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), lock_runtime::LockError> {
    /// let manager = lock_runtime::LockManager::builder()
    ///     .prefix("myapp:")
    ///     .redlock(&["redis://a:6379", "redis://b:6379", "redis://c:6379"])
    ///     .await?;
    /// # Ok(()) }
    /// ```
    #[cfg(feature = "redis")]
    #[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
    pub async fn redlock<E: AsRef<str>, S: AsRef<[E]>>(self, urls: S) -> Result<LockManager, LockError> {
        Ok(self.backend(RedlockBackend::connect(urls, RedisOptions::default()).await?))
    }

    /// A manager on ZooKeeper at `hosts` with the default [`ZookeeperOptions`](crate::backend::zookeeper::ZookeeperOptions); for other
    /// options, pass [`ZookeeperBackend::connect_with`]'s backend to
    /// [`backend`](LockManagerBuilder::backend).
    ///
    /// ```no_run
    /// # use std::time::Duration;
    /// # #[tokio::main] async fn main() -> Result<(), lock_runtime::LockError> {
    /// let manager = lock_runtime::LockManager::builder()
    ///     .prefix("myapp:")
    ///     .default_lease(Duration::from_secs(30))
    ///     .zookeeper("zk1:2181,zk2:2181,zk3:2181")
    ///     .await?;
    /// # Ok(()) }
    /// ```
    #[cfg(feature = "zookeeper")]
    #[cfg_attr(docsrs, doc(cfg(feature = "zookeeper")))]
    pub async fn zookeeper(self, hosts: impl AsRef<str>) -> Result<LockManager, LockError> {
        Ok(self.backend(ZookeeperBackend::connect(hosts).await?))
    }

    /// A manager on etcd at `endpoints` with the default [`EtcdOptions`](crate::backend::etcd::EtcdOptions); for other options,
    /// pass [`EtcdBackend::connect_with`]'s backend to
    /// [`backend`](LockManagerBuilder::backend).
    ///
    /// ```no_run
    /// # use std::time::Duration;
    /// # #[tokio::main] async fn main() -> Result<(), lock_runtime::LockError> {
    /// let manager = lock_runtime::LockManager::builder()
    ///     .prefix("myapp:")
    ///     .default_lease(Duration::from_secs(30))
    ///     .etcd(&["http://etcd1:2379", "http://etcd2:2379"])
    ///     .await?;
    /// # Ok(()) }
    /// ```
    #[cfg(feature = "etcd")]
    #[cfg_attr(docsrs, doc(cfg(feature = "etcd")))]
    pub async fn etcd<E: AsRef<str>, S: AsRef<[E]>>(self, endpoints: S) -> Result<LockManager, LockError> {
        Ok(self.backend(EtcdBackend::connect(endpoints).await?))
    }

    /// A manager on PostgreSQL at `url` with the default [`PostgresOptions`](crate::backend::postgres::PostgresOptions); for other
    /// options, pass [`PostgresBackend::connect_with`]'s backend to
    /// [`backend`](LockManagerBuilder::backend).
    ///
    /// ```no_run
    /// # use std::time::Duration;
    /// # #[tokio::main] async fn main() -> Result<(), lock_runtime::LockError> {
    /// let manager = lock_runtime::LockManager::builder()
    ///     .prefix("myapp:")
    ///     .default_lease(Duration::from_secs(30))
    ///     .postgres("postgres://app@db:5432/app")
    ///     .await?;
    /// # Ok(()) }
    /// ```
    #[cfg(feature = "postgres")]
    #[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
    pub async fn postgres(self, url: impl AsRef<str>) -> Result<LockManager, LockError> {
        Ok(self.backend(PostgresBackend::connect(url).await?))
    }

    /// A manager on MySQL or MariaDB at `url` with the default
    /// [`MysqlOptions`](crate::backend::mysql::MysqlOptions); for other options, pass
    /// [`MysqlBackend::connect_with`]'s backend to [`backend`](LockManagerBuilder::backend).
    ///
    /// ```no_run
    /// # #[tokio::main] async fn main() -> Result<(), lock_runtime::LockError> {
    /// let manager = lock_runtime::LockManager::builder().prefix("myapp:").mysql("mysql://app@db:3306/app").await?;
    /// # Ok(()) }
    /// ```
    #[cfg(feature = "mysql")]
    #[cfg_attr(docsrs, doc(cfg(feature = "mysql")))]
    pub async fn mysql(self, url: impl AsRef<str>) -> Result<LockManager, LockError> {
        Ok(self.backend(MysqlBackend::connect(url).await?))
    }
}
