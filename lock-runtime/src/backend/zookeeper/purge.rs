//! Deleting lock nodes: on release, and in the background for an acquisition abandoned
//! half-way (its node known, or a create in flight that is found again by its owner id).

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use zookeeper_client::{Client, Error as ZkError};

use super::recipe::{find_own, parent};
use super::session::{wait_connected, Session, Shared};
use super::{cut, lock};

/// Sends the deletes of the lock node at `path` and of its parent (which fails harmlessly when
/// not empty) back to back, at once: requests are sent when this is called, so any later
/// request of the same session is applied after them. The returned future gives the node's
/// result.
pub(super) fn send_delete(client: &Client, path: &str) -> impl Future<Output = Result<(), ZkError>> + Send + 'static {
    let node = client.delete(path, None);
    let dir = client.delete(parent(path), None);
    async move {
        let result = node.await;
        let _ = dir.await;
        result
    }
}

/// What an abandoned acquisition leaves to delete.
#[derive(Debug, Clone)]
pub(super) enum Leftover {
    /// Its node, by path.
    Node(Arc<str>),
    /// A create that may or may not have happened: whatever node under `dir` carries `tag`
    /// (its kind's prefix and the owner id).
    Owner { dir: Arc<str>, tag: Arc<str> },
}

/// Deletes what an abandoned acquisition (or a release that failed) left, through `session`.
/// A known node's delete is sent before this returns (see [`send_delete`]); the rest runs in a
/// task on the current runtime, retried across connection losses and bounded by the operation
/// timeout plus the session timeout (a node whose session ends goes with it). Outside a
/// runtime, only the sent delete remains.
///
/// A node known only by its owner id (a create in flight) is looked up first, so until that
/// clean-up is done, new acquisitions of the same lock through this backend wait for it
/// ([`Shared::purged`]): otherwise the orphan, created first, would be ahead of them.
pub(super) fn purge(shared: &Arc<Shared>, session: &Arc<Session>, leftover: Leftover) {
    if session.is_dead() {
        return; // its ephemeral nodes are gone (or go when it expires)
    }
    // Both are at most an hour (validated option, server-negotiated session): saturating anyway.
    let bound = shared.options.get_operation_timeout().saturating_add(session.client.session_timeout());
    let client = session.client.clone();
    let first = match &leftover {
        Leftover::Node(path) => Some(send_delete(&client, path)),
        Leftover::Owner { .. } => None,
    };
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        tracing::debug!(?leftover, "abandoned lock node cleaned up outside a tokio runtime: delete sent, not awaited");
        return;
    };
    let gate = match &leftover {
        Leftover::Owner { dir, .. } => Some(PurgeGate::new(shared, dir.clone())),
        Leftover::Node(_) => None,
    };
    runtime.spawn(async move {
        let work = purge_until_done(&client, &leftover, first, bound);
        if tokio::time::timeout(bound, work).await.is_err() {
            tracing::warn!(?leftover, "gave up deleting an abandoned ZooKeeper lock node; it goes with its session");
        }
        drop(gate);
    });
}

/// Marks a lock's container as having a clean-up by owner id in progress, while it lives.
struct PurgeGate {
    shared: Arc<Shared>,
    dir: Arc<str>,
}

impl PurgeGate {
    fn new(shared: &Arc<Shared>, dir: Arc<str>) -> Self {
        *lock(&shared.purging).entry(dir.clone()).or_insert(0) += 1;
        PurgeGate { shared: shared.clone(), dir }
    }
}

impl Drop for PurgeGate {
    fn drop(&mut self) {
        {
            let mut purging = lock(&self.shared.purging);
            if let Some(count) = purging.get_mut(&self.dir) {
                *count = count.saturating_sub(1);
                if *count == 0 {
                    purging.remove(&self.dir);
                }
            }
        }
        self.shared.purged.notify_waiters();
    }
}

impl Shared {
    /// Waits until no clean-up by owner id is in progress under `dir` (see [`purge`]).
    pub(super) async fn purged(&self, dir: &str) {
        loop {
            let notified = self.purged.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if !lock(&self.purging).contains_key(dir) {
                return;
            }
            notified.await;
        }
    }
}

async fn purge_until_done(
    client: &Client,
    leftover: &Leftover,
    mut first: Option<impl Future<Output = Result<(), ZkError>>>,
    patience: Duration,
) {
    for _ in 0..4 {
        let result = match first.take() {
            Some(sent) => sent.await,
            None => {
                let target = match leftover {
                    Leftover::Node(path) => Some(path.to_string()),
                    Leftover::Owner { dir, tag } => match find_own(client, dir, tag).await {
                        Ok(found) => found.map(|n| n.path.to_string()),
                        Err(ref e) if cut(e) => {
                            if wait_connected(client, patience).await.is_err() {
                                return;
                            }
                            continue;
                        }
                        Err(_) => return,
                    },
                };
                let Some(target) = target else { return };
                send_delete(client, &target).await
            }
        };
        match result {
            Ok(()) | Err(ZkError::NoNode) => return,
            Err(ref e) if cut(e) => {
                if wait_connected(client, patience).await.is_err() {
                    return;
                }
            }
            Err(e) => {
                tracing::warn!(?leftover, error = %e, "could not delete an abandoned ZooKeeper lock node");
                return;
            }
        }
    }
}
