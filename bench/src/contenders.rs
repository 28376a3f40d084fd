//! Every contender is a small adapter behind one trait: take the lock named by a [`Key`], give it
//! back. The scenarios are generic over it, so each contender runs exactly the same loop.

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use dashmap::DashMap;
use tokio::sync::{Mutex, MutexGuard, OwnedMutexGuard};

/// Lease / TTL every Redis contender asks for (none is renewed during the bench).
pub const LEASE: Duration = Duration::from_secs(10);

/// The lock a task works on: its index (for the pre-built in-process mutexes) and its name.
#[derive(Clone, Debug)]
pub struct Key {
    pub idx: usize,
    pub name: String,
}

/// A lock implementation under test.
pub trait Contender: Send + Sync + 'static {
    /// What `lock` hands back and `unlock` consumes.
    type Guard<'a>: Send
    where
        Self: 'a;

    /// Takes the lock, waiting as long as it takes.
    fn lock<'a>(&'a self, key: &'a Key) -> impl Future<Output = Result<Self::Guard<'a>, String>> + Send + 'a;

    /// Releases it.
    fn unlock<'a>(&'a self, guard: Self::Guard<'a>) -> impl Future<Output = Result<(), String>> + Send + 'a;
}

// ---------------------------------------------------------------- in process

/// `tokio::sync::Mutex`, one pre-built mutex per name (no lookup at all): the floor.
pub struct TokioMutex {
    mutexes: Vec<Mutex<()>>,
}

impl TokioMutex {
    pub fn new(names: usize) -> Self {
        TokioMutex { mutexes: (0..names).map(|_| Mutex::new(())).collect() }
    }
}

impl Contender for TokioMutex {
    type Guard<'a> = MutexGuard<'a, ()>;

    async fn lock<'a>(&'a self, key: &'a Key) -> Result<Self::Guard<'a>, String> {
        Ok(self.mutexes[key.idx].lock().await)
    }

    async fn unlock<'a>(&'a self, guard: Self::Guard<'a>) -> Result<(), String> {
        drop(guard);
        Ok(())
    }
}

/// `DashMap<String, Arc<tokio::sync::Mutex<()>>>`: the usual keyed map (entries kept forever).
#[derive(Default)]
pub struct KeyedMap {
    map: DashMap<String, Arc<Mutex<()>>>,
}

impl Contender for KeyedMap {
    type Guard<'a> = OwnedMutexGuard<()>;

    async fn lock<'a>(&'a self, key: &'a Key) -> Result<Self::Guard<'a>, String> {
        // Lookup first, insert only when missing: the fastest way to use the map.
        let mutex = match self.map.get(key.name.as_str()) {
            Some(found) => found.clone(),
            None => self.map.entry(key.name.clone()).or_default().clone(),
        };
        Ok(mutex.lock_owned().await)
    }

    async fn unlock<'a>(&'a self, guard: Self::Guard<'a>) -> Result<(), String> {
        drop(guard);
        Ok(())
    }
}

/// Ours, any backend: `manager.lock(name)` then `guard.release()`.
pub struct Ours {
    manager: lock_runtime::LockManager,
    /// Fixed lease (as the Redis peers' TTL) or the default watchdog lease when `None`.
    lease: Option<Duration>,
}

impl Ours {
    /// The in-memory backend, default options.
    pub fn memory() -> Self {
        Ours {
            manager: lock_runtime::LockManager::builder().default_wait(Duration::from_secs(60)).memory(),
            lease: None,
        }
    }

    /// The Redis backend with a fixed lease, like the peers' TTL.
    #[cfg(feature = "ours-redis")]
    pub async fn redis(url: &str) -> Result<Self, String> {
        let manager = lock_runtime::LockManager::builder()
            .default_wait(Duration::from_secs(60))
            .redis(url)
            .await
            .map_err(|e| format!("ours (redis): {e}"))?;
        Ok(Ours { manager, lease: Some(LEASE) })
    }

    /// The Redlock backend over independent servers, with a fixed lease like the peers' TTL.
    #[cfg(feature = "ours-redis")]
    pub async fn redlock(urls: &[String]) -> Result<Self, String> {
        let manager = lock_runtime::LockManager::builder()
            .default_wait(Duration::from_secs(60))
            .redlock(urls)
            .await
            .map_err(|e| format!("ours (redlock): {e}"))?;
        Ok(Ours { manager, lease: Some(LEASE) })
    }
}

impl Contender for Ours {
    type Guard<'a> = lock_runtime::LockGuard;

    async fn lock<'a>(&'a self, key: &'a Key) -> Result<Self::Guard<'a>, String> {
        let request = self.manager.lock(&key.name);
        let request = match self.lease {
            Some(lease) => request.lease(lease),
            None => request,
        };
        request.await.map_err(|e| e.to_string())
    }

    async fn unlock<'a>(&'a self, guard: Self::Guard<'a>) -> Result<(), String> {
        guard.release().await.map_err(|e| e.to_string())
    }
}

// ---------------------------------------------------------------- Redis peers

/// The `rslock` crate with its defaults (`acquire` loops over `lock`: 3 tries with a random
/// 0-200 ms delay between them, an unlock after each failed try).
pub struct Rslock {
    manager: rslock::LockManager,
}

impl Rslock {
    pub fn new(url: &str) -> Self {
        Rslock { manager: rslock::LockManager::new(vec![url.to_string()]) }
    }

    /// rslock's Redlock over independent servers.
    pub fn redlock(urls: &[String]) -> Self {
        Rslock { manager: rslock::LockManager::new(urls.to_vec()) }
    }
}

impl Contender for Rslock {
    type Guard<'a> = rslock::LockGuard;

    async fn lock<'a>(&'a self, key: &'a Key) -> Result<Self::Guard<'a>, String> {
        self.manager.acquire(key.name.as_str(), LEASE).await.map_err(|e| format!("rslock: {e}"))
    }

    async fn unlock<'a>(&'a self, guard: Self::Guard<'a>) -> Result<(), String> {
        guard.release().await;
        Ok(())
    }
}

/// Compare-and-delete: the release every `SET NX PX` recipe ships.
const NAIVE_RELEASE: &str =
    "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) end return 0";

/// The recipe from the Redis docs: `SET key token NX PX ttl`, on failure sleep a fixed time and
/// try again; release with a compare-and-delete script. One multiplexed connection for all tasks.
pub struct Naive {
    con: redis::aio::MultiplexedConnection,
    sleep: Duration,
    release: redis::Script,
    next_token: AtomicU64,
    process: u64,
}

impl Naive {
    pub async fn new(url: &str, sleep: Duration) -> Result<Self, String> {
        let client = redis::Client::open(url).map_err(|e| format!("naive: {e}"))?;
        let con = client.get_multiplexed_async_connection().await.map_err(|e| format!("naive: {e}"))?;
        Ok(Naive {
            con,
            sleep,
            release: redis::Script::new(NAIVE_RELEASE),
            next_token: AtomicU64::new(0),
            process: u64::from(std::process::id()),
        })
    }
}

/// What a naive lock holds: the key and the unique token it wrote.
pub struct NaiveGuard<'a> {
    key: &'a str,
    token: String,
}

impl Contender for Naive {
    type Guard<'a> = NaiveGuard<'a>;

    async fn lock<'a>(&'a self, key: &'a Key) -> Result<Self::Guard<'a>, String> {
        let token = format!("{}:{}", self.process, self.next_token.fetch_add(1, Ordering::Relaxed));
        let mut con = self.con.clone();
        loop {
            let set: Option<String> = redis::cmd("SET")
                .arg(&key.name)
                .arg(&token)
                .arg("NX")
                .arg("PX")
                .arg(LEASE.as_millis() as u64)
                .query_async(&mut con)
                .await
                .map_err(|e| format!("naive: {e}"))?;
            if set.is_some() {
                return Ok(NaiveGuard { key: &key.name, token });
            }
            tokio::time::sleep(self.sleep).await;
        }
    }

    async fn unlock<'a>(&'a self, guard: Self::Guard<'a>) -> Result<(), String> {
        let mut con = self.con.clone();
        let _: i64 = self
            .release
            .key(guard.key)
            .arg(&guard.token)
            .invoke_async(&mut con)
            .await
            .map_err(|e| format!("naive release: {e}"))?;
        Ok(())
    }
}
