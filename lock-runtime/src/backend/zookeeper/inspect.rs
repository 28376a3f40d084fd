//! Looking at the locks in ZooKeeper from outside their holders: listing, inspecting and
//! force-releasing them (what `lockctl` does).

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use zookeeper_client::{Client, Error as ZkError, Stat};

use super::backend::ZookeeperBackend;
use super::kinds::{self, Role};
use super::recipe::{decode, holder_of, queue, LeaseRecord};
use super::{zk_error, KIND, NODE_PREFIX};
use crate::backend::{BoxFuture, ChangeFeed, ForceRelease, LockInfo, LockKind};
use crate::error::LockError;

/// Looks at a lock again when its holder's node went away between the listing and the read.
const RETRIES: usize = 4;

impl ZookeeperBackend {
    /// Completes once the locks whose key starts with `prefix` may have changed: a lock's node
    /// container created or deleted, a node queued or removed (a lock taken, released, waited
    /// for). Sets one watch on the lock root and one on each lock's container, when called: a
    /// change made before the call is not seen (a [`changes`](crate::backend::Inspect::changes)
    /// feed is armed ahead of time instead).
    pub async fn changed(&self, prefix: &str) -> Result<(), LockError> {
        self.arm(prefix).await?.fired().await;
        Ok(())
    }

    /// Sets the watches of [`changed`](Self::changed) and returns them, to be awaited later.
    async fn arm(&self, prefix: &str) -> Result<Armed, LockError> {
        const OP: &str = "watch";
        let client = self.client(prefix, OP).await?;
        let root = self.options().get_root();
        let mut watches = tokio::task::JoinSet::new();
        let dirs = match client.list_and_watch_children(root).await {
            Ok((dirs, watcher)) => {
                watches.spawn(async move { drop(watcher.changed().await) });
                dirs
            }
            Err(ZkError::NoNode) => Vec::new(),
            Err(e) => return Err(zk_error(prefix, OP, e)),
        };
        for dir in dirs.iter().filter(|d| decode(d).is_some_and(|k| k.starts_with(prefix))) {
            match client.list_and_watch_children(&format!("{root}/{dir}")).await {
                Ok((_, watcher)) => drop(watches.spawn(async move { drop(watcher.changed().await) })),
                Err(ZkError::NoNode) => return Ok(Armed(None)), // gone since the listing: a change
                Err(e) => return Err(zk_error(prefix, OP, e)),
            }
        }
        Ok(Armed(Some(watches)))
    }

    async fn client(&self, name: &str, operation: &'static str) -> Result<Client, LockError> {
        Ok(self.shared.session(name, operation).await?.client.clone())
    }
}

/// The owner id in a lock node's name (`lk-<owner id>-<sequence>`).
fn owner_of(node: &str) -> &str {
    let rest = node.strip_prefix(NODE_PREFIX).unwrap_or(node);
    rest.rsplit_once('-').map_or(rest, |(owner, _)| owner)
}

/// The owner and path of the lowest node under `dir`, if any.
async fn holder_node(
    client: &Client,
    dir: &str,
    key: &str,
    operation: &'static str,
) -> Result<Option<(String, String)>, LockError> {
    let children = match client.list_children(dir).await {
        Ok(children) => children,
        Err(ZkError::NoNode) => return Ok(None),
        Err(e) => return Err(zk_error(key, operation, e)),
    };
    Ok(queue(children).into_iter().next().map(|(_, node)| (owner_of(&node).to_owned(), format!("{dir}/{node}"))))
}

async fn inspect(client: &Client, dir: &str, key: &str) -> Result<Option<LockInfo>, LockError> {
    const OP: &str = "inspect";
    for _ in 0..RETRIES {
        let children = match client.list_children(dir).await {
            Ok(children) => children,
            Err(ZkError::NoNode) => return Ok(None),
            Err(e) => return Err(zk_error(key, OP, e)),
        };
        let nodes = queue(children);
        let Some((_, holder)) = nodes.first() else { return Ok(None) };
        let (data, stat) = match client.get_data(&format!("{dir}/{holder}")).await {
            Ok(read) => read,
            Err(ZkError::NoNode) => continue, // released since the listing: look again
            Err(e) => return Err(zk_error(key, OP, e)),
        };
        let waiters = u64::try_from(nodes.len() - 1).unwrap_or(u64::MAX);
        return Ok(Some(info(key, holder, &data, &stat, waiters, now_ms())));
    }
    Err(LockError::backend(key, KIND, OP, "the lock changed hands too often to be inspected"))
}

/// The holders of a read-write lock's or semaphore's container `dir` (see `kinds.rs`): a
/// writer holds when its node is the lowest, a reader when no writer's is below its own, a
/// permit when fewer than `permits` nodes are. One record each; the nodes not holding are
/// their waiters.
async fn kind_holders(client: &Client, dir: &str, key: &str) -> Result<Vec<LockInfo>, LockError> {
    let children = match client.list_children(dir).await {
        Ok(children) => children,
        Err(ZkError::NoNode) => return Ok(Vec::new()),
        Err(e) => return Err(zk_error(key, "inspect", e)),
    };
    let nodes = kinds::queue(children);
    let mut holders = Vec::new();
    for (index, (_, node)) in nodes.iter().enumerate() {
        let kind = match kinds::role(node) {
            Some((Role::Read, _)) => LockKind::Read,
            Some((Role::Write, _)) => LockKind::Write,
            Some((Role::Permit(permits), _)) => LockKind::Semaphore { permits },
            None => continue,
        };
        if !kinds::holds(kind, index, &nodes) {
            continue;
        }
        let (data, stat) = match client.get_data(&format!("{dir}/{node}")).await {
            Ok(read) => read,
            Err(ZkError::NoNode) => continue, // released since the listing
            Err(e) => return Err(zk_error(key, "inspect", e)),
        };
        let mut held = info(key, node, &data, &stat, 0, now_ms());
        // `read-<owner id>-<sequence>`, `write-…`, `sem<permits>-…`
        held.owner = node.split_once('-').and_then(|(_, rest)| rest.rsplit_once('-')).map_or("", |(o, _)| o).to_owned();
        held.kind = Some(kind);
        holders.push(held);
    }
    let waiting = (nodes.len() - holders.len()) as u64;
    for held in &mut holders {
        held.waiters = Some(waiting);
    }
    Ok(holders)
}

fn info(key: &str, node: &str, data: &[u8], stat: &Stat, waiters: u64, now_ms: i64) -> LockInfo {
    let mut info = LockInfo::new(key, owner_of(node));
    info.holder = holder_of(data);
    info.kind = Some(LockKind::Exclusive); // a mutex's container (the kinds' set theirs)
    info.fencing_token = u64::try_from(stat.czxid).ok();
    info.waiters = Some(waiters);
    let record = LeaseRecord::parse(data);
    let since = match record {
        Some(r) if r.granted => stat.mtime,
        _ => {
            info.age_at_most = true;
            stat.ctime
        }
    };
    let age = Duration::from_millis(u64::try_from(now_ms.saturating_sub(since)).unwrap_or(0));
    info.age = Some(age);
    match record {
        Some(r) => info.remaining_lease = Some(Duration::from_millis(r.lease_ms).saturating_sub(age)),
        None => info.session_bound = true,
    }
    info
}

fn now_ms() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

impl crate::backend::Inspect for ZookeeperBackend {
    fn store(&self) -> &'static str {
        KIND
    }

    /// The locks held now whose key (the manager prefix followed by the name) starts with
    /// `prefix`, sorted by key.
    fn list<'a>(&'a self, prefix: &'a str) -> BoxFuture<'a, Result<Vec<LockInfo>, LockError>> {
        Box::pin(async move {
            let client = self.client(prefix, "list").await?;
            let root = self.options().get_root();
            let dirs = match client.list_children(root).await {
                Ok(dirs) => dirs,
                Err(ZkError::NoNode) => Vec::new(),
                Err(e) => return Err(zk_error(prefix, "list", e)),
            };
            // `<encoded key>` a mutex's container, `<encoded key>.rw` and `.sem` the kinds' (a
            // `.` is always encoded, so no key's container ends so).
            let mut found: Vec<(String, &str)> = dirs
                .iter()
                .filter_map(|d| {
                    let (encoded, suffix) = [".rw", ".sem"]
                        .iter()
                        .find_map(|s| d.strip_suffix(s).map(|e| (e, *s)))
                        .unwrap_or((d.as_str(), ""));
                    Some((decode(encoded)?, suffix))
                })
                .filter(|(k, _)| k.starts_with(prefix))
                .collect();
            found.sort_unstable();
            let mut locks = Vec::with_capacity(found.len());
            for (key, suffix) in found {
                let dir = format!("{}{suffix}", self.lock_path(&key));
                match suffix {
                    "" => locks.extend(inspect(&client, &dir, &key).await?),
                    _ => locks.extend(kind_holders(&client, &dir, &key).await?),
                }
            }
            Ok(locks)
        })
    }

    /// The lock of backend key `key` (the manager prefix followed by the name), if it is held.
    ///
    /// Everything is known exactly but the age of a holder that may have waited: the fencing
    /// token is the holder node's `czxid`, the waiters are the nodes queued behind it, and the
    /// holder is the one recorded in its node's data. The age is counted from the recorded
    /// grant of a fixed lease (the node's `mtime`), else from the node's creation, which is
    /// the grant when the holder did not wait and earlier when it did
    /// ([`LockInfo::age_at_most`] is then `true`). Ages compare the server's timestamps with
    /// this machine's clock. A lock without a fixed lease is
    /// [`session_bound`](LockInfo::session_bound).
    fn inspect<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<Option<LockInfo>, LockError>> {
        Box::pin(async move {
            let client = self.client(key, "inspect").await?;
            if let Some(info) = inspect(&client, &self.lock_path(key), key).await? {
                return Ok(Some(info));
            }
            // A name held as a read-write lock or a semaphore: its first holder.
            for suffix in [".rw", ".sem"] {
                let dir = format!("{}{suffix}", self.lock_path(key));
                if let Some(first) = kind_holders(&client, &dir, key).await?.into_iter().next() {
                    return Ok(Some(first));
                }
            }
            Ok(None)
        })
    }

    /// Frees the lock of backend key `key` whatever holds it, by deleting the holder's node:
    /// the next node in the queue takes the lock, and the holder's process, which watches its
    /// node, fires its guard's [`lost()`](crate::LockGuard::lost). With `expected_owner` (a
    /// [`LockInfo::owner`] read before), only if that owner still holds it.
    fn force_release<'a>(
        &'a self,
        key: &'a str,
        expected_owner: Option<&'a str>,
    ) -> BoxFuture<'a, Result<ForceRelease, LockError>> {
        Box::pin(async move {
            const OP: &str = "force release";
            let client = self.client(key, OP).await?;
            let dir = self.lock_path(key);
            for _ in 0..RETRIES {
                let Some((owner, path)) = holder_node(&client, &dir, key, OP).await? else {
                    return Ok(ForceRelease::NotHeld);
                };
                if expected_owner.is_some_and(|expected| expected != owner) {
                    return Ok(ForceRelease::OwnerChanged(owner));
                }
                match client.delete(&path, None).await {
                    Ok(()) => return Ok(ForceRelease::Released(owner)),
                    Err(ZkError::NoNode) => continue, // released meanwhile: look again
                    Err(e) => return Err(zk_error(key, OP, e)),
                }
            }
            Err(LockError::backend(key, KIND, OP, "the lock changed hands too often to force its release"))
        })
    }

    fn changes<'a>(&'a self, prefix: &'a str) -> BoxFuture<'a, Result<Box<dyn ChangeFeed>, LockError>> {
        Box::pin(async move {
            let armed = self.arm(prefix).await?;
            let feed = Watches { store: self.clone(), prefix: prefix.to_owned(), armed: Some(armed) };
            Ok(Box::new(feed) as Box<dyn ChangeFeed>)
        })
    }
}

/// Watches set on a lock root and its containers: [`fired`](Armed::fired) once any of them
/// is (at once when a change was already seen while setting them).
struct Armed(Option<tokio::task::JoinSet<()>>);

impl Armed {
    /// Completes once a watch fired. Dropped before that, the watches stay set.
    async fn fired(&mut self) {
        match &mut self.0 {
            Some(watches) if !watches.is_empty() => drop(watches.join_next().await),
            Some(_) => std::future::pending().await,
            None => {}
        }
    }
}

/// ZooKeeper's watches see every change. They are always armed ahead of the next look: when
/// the feed is opened, and again as soon as they have fired, before [`changed`] returns, so a
/// change made between a look and the wait after it fires them too.
///
/// [`changed`]: ChangeFeed::changed
struct Watches {
    store: ZookeeperBackend,
    prefix: String,
    /// `None` when arming again failed or was cancelled: armed at the next call.
    armed: Option<Armed>,
}

impl ChangeFeed for Watches {
    fn changed(&mut self) -> BoxFuture<'_, Result<(), LockError>> {
        Box::pin(async move {
            let armed = match &mut self.armed {
                Some(armed) => armed,
                None => self.armed.insert(self.store.arm(&self.prefix).await?),
            };
            armed.fired().await; // dropped while waiting: still armed for the next call
            self.armed = None;
            self.armed = Some(self.store.arm(&self.prefix).await?);
            Ok(())
        })
    }

    fn complete(&self) -> bool {
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::Holder;

    #[test]
    fn nodes_are_read_back() {
        let stat = Stat {
            czxid: 77,
            mzxid: 0,
            pzxid: 0,
            ctime: 1_000,
            mtime: 4_000,
            version: 1,
            cversion: 0,
            aversion: 0,
            ephemeral_owner: 0,
            data_length: 0,
            num_children: 0,
        };
        let holder = Holder::parse("db-1/42/billing").expect("holder");
        let data = format!("holder={holder};lease_ms=5000;granted");
        let i = info("k", "lk-0a-1-0000000003", data.as_bytes(), &stat, 2, 5_000);
        assert_eq!((i.owner.as_str(), i.holder.as_ref(), i.fencing_token), ("0a-1", Some(&holder), Some(77)));
        assert_eq!((i.age, i.age_at_most), (Some(Duration::from_secs(1)), false));
        assert_eq!((i.remaining_lease, i.session_bound, i.waiters), (Some(Duration::from_secs(4)), false, Some(2)));
        let session = info("k", "lk-0a-1-0000000003", b"holder=db-1/42", &stat, 0, 5_000);
        assert_eq!((session.age, session.age_at_most), (Some(Duration::from_secs(4)), true));
        assert_eq!((session.remaining_lease, session.session_bound), (None, true));
        let old = info("k", "lk-0a-1-0000000003", b"", &stat, 0, 5_000);
        assert_eq!(old.holder, None);
    }
}
