//! Looking at the locks in etcd from outside their holders ([`Inspect`]): a lock's keys live
//! under `<root>/<encoded key>/`, the lowest create revision holds it, and the others queue.
//! The holder's key ends in its owner id, its value is its process (`host/pid[/label]`), and
//! its create revision is its fencing token. Changes are announced by a watch on the prefix.

use etcd_client::{DeleteOptions, EventType, GetOptions, SortOrder, SortTarget, WatchOptions, WatchStream};

use super::backend::EtcdBackend;
use std::time::Instant;

use super::{encode, etcd_error, failed, KIND};
use crate::backend::{BoxFuture, ChangeFeed, ForceRelease, Holder, Inspect, LockInfo, LockKind};
use crate::error::LockError;

/// `encode`'s inverse, for one path segment.
fn decode(segment: &str) -> String {
    segment.replace("%2F", "/").replace("%25", "%")
}

impl EtcdBackend {
    fn root(&self) -> String {
        format!("{}/", self.shared.options.get_root().trim_matches('/'))
    }

    async fn get(&self, prefix: &str, shown: &str) -> Result<Vec<etcd_client::KeyValue>, LockError> {
        let bound = self.shared.options.get_operation_timeout();
        let options = GetOptions::new().with_prefix().with_sort(SortTarget::Create, SortOrder::Ascend);
        let resp = self
            .shared
            .members
            .call(Instant::now() + bound, |mut client| {
                let options = options.clone();
                async move { client.get(prefix, Some(options)).await }
            })
            .await
            .map_err(|f| failed(shown, "inspect", bound, f))?;
        Ok(resp.kvs().to_vec())
    }

    /// The lock `key` from its keys, lowest create revision first.
    fn info_of(key: &str, kvs: &[&etcd_client::KeyValue]) -> Option<LockInfo> {
        let first = kvs.first()?;
        let name = first.key_str().ok()?;
        let tail = name.rsplit('/').next().unwrap_or("");
        // `<lease:016x>-<owner id>`
        let owner = tail.split_once('-').map_or(tail, |(_, owner)| owner);
        let mut info = LockInfo::new(key, owner);
        info.holder = first.value_str().ok().and_then(Holder::parse);
        info.kind = Some(LockKind::Exclusive); // a mutex's prefix
        info.fencing_token = u64::try_from(first.create_revision()).ok();
        // Held while the manager's etcd lease is kept alive.
        info.session_bound = true;
        info.waiters = Some(kvs.len() as u64 - 1);
        Some(info)
    }

    /// The holders of the read-write lock or semaphore `key` (`space` `rw` or `sem`) from its
    /// keys, lowest create revision first: a writer holds when no key is below its own, a
    /// reader when no writer's is, a permit when fewer than `permits` are. One record each,
    /// with the keys that wait behind the last holder as its waiters.
    fn holders_of(key: &str, space: &str, kvs: &[&etcd_client::KeyValue]) -> Vec<LockInfo> {
        let mut holders = Vec::new();
        let mut writer_ahead = false;
        for (ahead, kv) in kvs.iter().enumerate() {
            let Ok(name) = kv.key_str() else { continue };
            let tail = name.rsplit('/').next().unwrap_or("");
            // `r-<lease>-<owner>`, `w-<lease>-<owner>`, `s<permits>-<lease>-<owner>`
            let mut parts = tail.splitn(3, '-');
            let (mode, owner) = (parts.next().unwrap_or(""), parts.nth(1).unwrap_or(""));
            let (kind, holds) = match (space, mode) {
                ("rw", "r") => (LockKind::Read, !writer_ahead),
                ("rw", _) => (LockKind::Write, ahead == 0),
                (_, mode) => {
                    let permits = mode.strip_prefix('s').and_then(|p| p.parse().ok()).unwrap_or(0);
                    (LockKind::Semaphore { permits }, ahead < permits as usize)
                }
            };
            writer_ahead |= kind == LockKind::Write;
            if !holds {
                continue;
            }
            let mut info = LockInfo::new(key, owner);
            info.holder = kv.value_str().ok().and_then(Holder::parse);
            info.kind = Some(kind);
            info.fencing_token = u64::try_from(kv.create_revision()).ok();
            info.session_bound = true;
            holders.push(info);
        }
        let waiting = (kvs.len() - holders.len()) as u64;
        for info in &mut holders {
            info.waiters = Some(waiting);
        }
        holders
    }

    async fn inspect_key(&self, key: &str) -> Result<Option<LockInfo>, LockError> {
        let kvs = self.get(&self.lock_prefix(key), key).await?;
        if let Some(info) = Self::info_of(key, &kvs.iter().collect::<Vec<_>>()) {
            return Ok(Some(info));
        }
        // A name held as a read-write lock or a semaphore: its first holder.
        for space in ["rw", "sem"] {
            let kvs = self.get(&self.kind_prefix(key, space), key).await?;
            if let Some(first) = Self::holders_of(key, space, &kvs.iter().collect::<Vec<_>>()).into_iter().next() {
                return Ok(Some(first));
            }
        }
        Ok(None)
    }

    async fn list_prefix(&self, prefix: &str) -> Result<Vec<LockInfo>, LockError> {
        let root = self.root();
        let kvs = self.get(&format!("{root}{}", encode(prefix)), prefix).await?;
        // By key and space (`""` a mutex, `rw`, `sem`), each key's keys still lowest create
        // revision first.
        let mut by_key: std::collections::BTreeMap<(String, &str), Vec<&etcd_client::KeyValue>> = Default::default();
        for kv in &kvs {
            let Some(segment) = kv.key_str().ok().and_then(|k| k.strip_prefix(&root)).and_then(|k| k.split('/').next())
            else {
                continue;
            };
            let (segment, space) = match (segment.strip_suffix("%rw"), segment.strip_suffix("%sem")) {
                (Some(rw), _) => (rw, "rw"),
                (_, Some(sem)) => (sem, "sem"),
                _ => (segment, ""),
            };
            by_key.entry((decode(segment), space)).or_default().push(kv);
        }
        let mut locks = Vec::new();
        for ((key, space), kvs) in &by_key {
            match *space {
                "" => locks.extend(Self::info_of(key, kvs)),
                space => locks.extend(Self::holders_of(key, space, kvs)),
            }
        }
        Ok(locks)
    }

    async fn force_release_key(&self, key: &str, expected_owner: Option<&str>) -> Result<ForceRelease, LockError> {
        let Some(held) = self.inspect_key(key).await? else { return Ok(ForceRelease::NotHeld) };
        if expected_owner.is_some_and(|o| o != held.owner) {
            return Ok(ForceRelease::OwnerChanged(held.owner));
        }
        let kvs = self.get(&self.lock_prefix(key), key).await?;
        let Some(first) = kvs.first() else { return Ok(ForceRelease::NotHeld) };
        let bound = self.shared.options.get_operation_timeout();
        // Only that key, only while it is the one created then.
        let txn = etcd_client::Txn::new()
            .when([etcd_client::Compare::create_revision(
                first.key(),
                etcd_client::CompareOp::Equal,
                first.create_revision(),
            )])
            .and_then([etcd_client::TxnOp::delete(first.key(), None::<DeleteOptions>)]);
        let resp = self
            .shared
            .members
            .call(Instant::now() + bound, |mut client| {
                let txn = txn.clone();
                async move { client.txn(txn).await }
            })
            .await
            .map_err(|f| failed(key, "force release", bound, f))?;
        Ok(if resp.succeeded() { ForceRelease::Released(held.owner) } else { ForceRelease::NotHeld })
    }
}

impl Inspect for EtcdBackend {
    fn store(&self) -> &'static str {
        KIND
    }

    fn list<'a>(&'a self, prefix: &'a str) -> BoxFuture<'a, Result<Vec<LockInfo>, LockError>> {
        Box::pin(self.list_prefix(prefix))
    }

    fn inspect<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<Option<LockInfo>, LockError>> {
        Box::pin(self.inspect_key(key))
    }

    /// Deletes the holder's key; the next key in the queue holds the lock then, and its waiter
    /// is woken by its watch. The holder learns of it at its release (reported lost).
    fn force_release<'a>(
        &'a self,
        key: &'a str,
        expected_owner: Option<&'a str>,
    ) -> BoxFuture<'a, Result<ForceRelease, LockError>> {
        Box::pin(self.force_release_key(key, expected_owner))
    }

    fn changes<'a>(&'a self, prefix: &'a str) -> BoxFuture<'a, Result<Box<dyn ChangeFeed>, LockError>> {
        Box::pin(async move {
            let watched = format!("{}{}", self.root(), encode(prefix));
            let bound = self.shared.options.get_operation_timeout();
            let stream = self
                .shared
                .members
                .call(Instant::now() + bound, |mut client| {
                    let watched = watched.clone();
                    async move { client.watch(watched, Some(WatchOptions::new().with_prefix())).await }
                })
                .await
                .map_err(|f| failed(prefix, "watch", bound, f))?;
            Ok(Box::new(Changes { stream, prefix: prefix.to_owned() }) as Box<dyn ChangeFeed>)
        })
    }
}

/// A watch on the keys under a prefix: every put and delete is a change.
struct Changes {
    stream: WatchStream,
    prefix: String,
}

impl ChangeFeed for Changes {
    fn changed(&mut self) -> BoxFuture<'_, Result<(), LockError>> {
        Box::pin(async move {
            loop {
                match self.stream.message().await {
                    Ok(Some(resp)) if resp.canceled() => {
                        return Err(LockError::backend(&*self.prefix, KIND, "watch", "the watch was cancelled"))
                    }
                    Ok(Some(resp))
                        if resp
                            .events()
                            .iter()
                            .any(|e| matches!(e.event_type(), EventType::Put | EventType::Delete)) =>
                    {
                        return Ok(())
                    }
                    Ok(Some(_)) => continue, // progress notifications
                    Ok(None) => return Err(LockError::backend(&*self.prefix, KIND, "watch", "the watch ended")),
                    Err(e) => return Err(etcd_error(&self.prefix, "watch", e)),
                }
            }
        })
    }

    fn complete(&self) -> bool {
        true
    }
}
