//! `lockctl --redlock URLS`: Redlock's independent primaries seen as one store. Each node is
//! inspected as the Redis server it is; a lock is held when a quorum of the nodes (N/2 + 1, as
//! Redlock grants) name the same owner, and is then shown with the largest token among them
//! (the one the quorum granted), the oldest grant and the shortest lease left. A key that
//! fewer nodes name (an attempt that lost its split vote, a node restarted empty) is not held.
//! A forced release frees the key on every node, owner-checked against the quorum's owner.
//! Changes are announced as any node announces them.
//!
//! The library itself does not offer this view to elections (`leader()` on Redlock stays
//! refused): between a release and the next quorum, nodes may name different owners.

use std::collections::BTreeMap;
use std::task::Poll;

use lock_runtime::backend::redis::{RedisBackend, RedisOptions};
use lock_runtime::backend::{BoxFuture, ChangeFeed, ForceRelease, Inspect, LockInfo};
use lock_runtime::LockError;

/// The nodes of one Redlock, each a Redis server.
pub(crate) struct Quorum {
    nodes: Vec<RedisBackend>,
}

impl Quorum {
    /// Connects to every node at `urls`; every node must answer.
    pub(crate) async fn connect(urls: &[&str], options: RedisOptions) -> Result<Self, LockError> {
        let mut nodes = Vec::with_capacity(urls.len());
        for url in urls {
            nodes.push(RedisBackend::connect_with(url, options.clone()).await?);
        }
        if nodes.is_empty() {
            return Err(LockError::invalid("", "--redlock needs at least one node URL"));
        }
        Ok(Quorum { nodes })
    }

    fn quorum(&self) -> usize {
        self.nodes.len() / 2 + 1
    }

    /// Every node's answer to `ask`, each node's error as its answer.
    async fn each<'a, T, F>(&'a self, ask: F) -> Vec<Result<T, LockError>>
    where
        F: Fn(&'a RedisBackend) -> BoxFuture<'a, Result<T, LockError>>,
    {
        let mut asks: Vec<_> = self.nodes.iter().map(|node| Some(ask(node))).collect();
        let mut answers: Vec<Option<Result<T, LockError>>> = (0..asks.len()).map(|_| None).collect();
        std::future::poll_fn(|cx| {
            for (ask, answer) in asks.iter_mut().zip(answers.iter_mut()) {
                if let Some(fut) = ask {
                    if let Poll::Ready(out) = fut.as_mut().poll(cx) {
                        *answer = Some(out);
                        *ask = None;
                    }
                }
            }
            if asks.iter().all(Option::is_none) {
                Poll::Ready(())
            } else {
                Poll::Pending
            }
        })
        .await;
        answers.into_iter().flatten().collect()
    }

    /// The answers, unless fewer than a quorum of nodes gave one (the first error then).
    fn answered<T>(&self, answers: Vec<Result<T, LockError>>) -> Result<Vec<T>, LockError> {
        let mut error = None;
        let mut ok = Vec::new();
        for answer in answers {
            match answer {
                Ok(a) => ok.push(a),
                Err(e) => error = error.or(Some(e)),
            }
        }
        match error {
            Some(e) if ok.len() < self.quorum() => Err(e),
            _ => Ok(ok),
        }
    }

    /// The lock the nodes' records of one key make: held when a quorum names one owner.
    fn merge(&self, records: Vec<LockInfo>) -> Option<LockInfo> {
        let mut by_owner: BTreeMap<String, Vec<LockInfo>> = BTreeMap::new();
        for info in records {
            by_owner.entry(info.owner.clone()).or_default().push(info);
        }
        let (_, agreeing) = by_owner.into_iter().find(|(_, infos)| infos.len() >= self.quorum())?;
        let mut merged = agreeing[0].clone();
        merged.fencing_token = agreeing.iter().filter_map(|i| i.fencing_token).max();
        merged.age = agreeing.iter().filter_map(|i| i.age).max();
        merged.remaining_lease = agreeing.iter().filter_map(|i| i.remaining_lease).min();
        merged.waited_on = Some(agreeing.iter().any(|i| i.waited_on == Some(true)));
        merged.subscribers = None;
        merged.queued = None; // Redlock keeps no queue of waiting processes on its nodes
        merged.waiters = None;
        Some(merged)
    }
}

impl Inspect for Quorum {
    fn store(&self) -> &'static str {
        "redlock"
    }

    fn list<'a>(&'a self, prefix: &'a str) -> BoxFuture<'a, Result<Vec<LockInfo>, LockError>> {
        Box::pin(async move {
            let lists = self.answered(self.each(|node| Inspect::list(node, prefix)).await)?;
            let mut by_key: BTreeMap<String, Vec<LockInfo>> = BTreeMap::new();
            for info in lists.into_iter().flatten() {
                by_key.entry(info.key.clone()).or_default().push(info);
            }
            Ok(by_key.into_values().filter_map(|records| self.merge(records)).collect())
        })
    }

    fn inspect<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<Option<LockInfo>, LockError>> {
        Box::pin(async move {
            let records = self.answered(self.each(|node| Inspect::inspect(node, key)).await)?;
            Ok(self.merge(records.into_iter().flatten().collect()))
        })
    }

    fn force_release<'a>(
        &'a self,
        key: &'a str,
        expected_owner: Option<&'a str>,
    ) -> BoxFuture<'a, Result<ForceRelease, LockError>> {
        Box::pin(async move {
            let Some(held) = self.inspect(key).await? else { return Ok(ForceRelease::NotHeld) };
            if expected_owner.is_some_and(|owner| owner != held.owner) {
                return Ok(ForceRelease::OwnerChanged(held.owner));
            }
            let owner = held.owner.as_str();
            let freed = self.answered(self.each(|node| Inspect::force_release(node, key, Some(owner))).await)?;
            match freed.iter().filter(|f| matches!(f, ForceRelease::Released(_))).count() {
                0 => Ok(ForceRelease::NotHeld),
                _ => Ok(ForceRelease::Released(held.owner)),
            }
        })
    }

    fn changes<'a>(&'a self, prefix: &'a str) -> BoxFuture<'a, Result<Box<dyn ChangeFeed>, LockError>> {
        Box::pin(async move {
            let feeds = self.answered(self.each(|node| Inspect::changes(node, prefix)).await)?;
            Ok(Box::new(AnyNode(feeds)) as Box<dyn ChangeFeed>)
        })
    }
}

/// The change feeds of the nodes that answered: a change on any of them.
struct AnyNode(Vec<Box<dyn ChangeFeed>>);

impl ChangeFeed for AnyNode {
    fn changed(&mut self) -> BoxFuture<'_, Result<(), LockError>> {
        let mut changes: Vec<_> = self.0.iter_mut().map(|feed| feed.changed()).collect();
        Box::pin(std::future::poll_fn(move |cx| {
            for change in &mut changes {
                if let Poll::Ready(out) = change.as_mut().poll(cx) {
                    return Poll::Ready(out);
                }
            }
            Poll::Pending
        }))
    }

    fn complete(&self) -> bool {
        // A node restarted empty, or a take, goes unannounced (as on one Redis server).
        false
    }
}
