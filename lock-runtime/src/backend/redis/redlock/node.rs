//! One Redis primary of a Redlock set, and how one lock's commands reach all of them: each
//! command runs in a task of its own (so a paused node never holds up the decision), chained
//! after the lock's previous command on the same node (so a release is always sent after the
//! acquire it undoes), and its answer is gathered until the outcome is known.

use std::future::Future;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use redis::{FromRedisValue, ScriptInvocation};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use crate::backend::redis::server::Server;

/// One primary: its (redacted) URL and its server (the command connection and how a script
/// is called on it); its pub/sub connection is the waiters' (see `waiters.rs`).
pub(super) struct Node {
    pub(super) url: String,
    pub(super) server: Arc<Server>,
}

/// What one node answered, or why it did not.
pub(super) type Answer<T> = Result<T, String>;

impl Node {
    /// A script call on this node, owning its arguments; bounded by `timeout`.
    pub(super) fn call<T>(
        &self,
        invocation: ScriptInvocation<'static>,
        timeout: Duration,
    ) -> impl Future<Output = Answer<T>> + Send + 'static
    where
        T: FromRedisValue + Send + 'static,
    {
        let server = self.server.clone();
        async move {
            match tokio::time::timeout(timeout, server.eval_raw::<T>(invocation)).await {
                Ok(Ok(value)) => Ok(value),
                Ok(Err(e)) if e.is_timeout() => Err(format!("no answer within {timeout:?}")),
                Ok(Err(e)) => Err(e.to_string()),
                Err(_) => Err(format!("no answer within {timeout:?}")),
            }
        }
    }
}

/// The tasks of one lock's latest command on each node. A new command on a node starts once
/// the previous one there has finished (each is bounded by the command timeout), so the
/// commands of one lock reach each node in the order they were issued: a release never
/// overtakes the acquire it undoes, even while the node's connection is being made again.
#[derive(Clone)]
pub(super) struct Chains(Arc<Mutex<Vec<Option<JoinHandle<()>>>>>);

impl Chains {
    pub(super) fn new(nodes: usize) -> Self {
        Chains(Arc::new(Mutex::new((0..nodes).map(|_| None).collect())))
    }

    /// Runs `op` on node `i` after the lock's previous command there, in the background; its
    /// answer goes to `tx` (if anyone still listens).
    pub(super) fn run<T, F>(
        &self,
        runtime: &tokio::runtime::Handle,
        i: usize,
        op: F,
        tx: Option<mpsc::UnboundedSender<(usize, Answer<T>)>>,
    ) where
        T: Send + 'static,
        F: Future<Output = Answer<T>> + Send + 'static,
    {
        let mut chains = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        let previous = chains.get_mut(i).and_then(Option::take);
        let task = runtime.spawn(async move {
            if let Some(previous) = previous {
                let _ = previous.await;
            }
            let answer = op.await;
            if let Some(tx) = tx {
                let _ = tx.send((i, answer));
            }
        });
        if let Some(slot) = chains.get_mut(i) {
            *slot = Some(task);
        }
    }
}

/// The answers gathered so far, one per node: `None` while a node has not answered.
pub(super) struct Gathered<T> {
    pub(super) answers: Vec<Option<Answer<T>>>,
}

impl<T> Gathered<T> {
    /// Nodes that answered with `ok`.
    pub(super) fn count(&self, ok: impl Fn(&T) -> bool) -> usize {
        self.answers.iter().filter(|a| matches!(a, Some(Ok(v)) if ok(v))).count()
    }

    /// Nodes that answered at all (not an error, not still pending).
    pub(super) fn answered(&self) -> usize {
        self.answers.iter().filter(|a| matches!(a, Some(Ok(_)))).count()
    }

    /// Nodes still pending.
    pub(super) fn pending(&self) -> usize {
        self.answers.iter().filter(|a| a.is_none()).count()
    }

    /// Why the nodes that gave no answer did not, for messages: `node <url>: <why>; …`.
    pub(super) fn failures(&self, nodes: &[Node], timeout: Duration) -> String {
        let mut out = Vec::new();
        for (node, answer) in nodes.iter().zip(&self.answers) {
            match answer {
                Some(Err(e)) => out.push(format!("node {}: {e}", node.url)),
                None => out.push(format!("node {}: no answer within {timeout:?}", node.url)),
                Some(Ok(_)) => {}
            }
        }
        out.join("; ")
    }
}

/// Reads answers from `rx` until `decided` says the outcome is known, every node answered, or
/// `deadline` passed (the nodes that have not answered by then stay `None`). Commands still in
/// flight keep running in their tasks.
pub(super) async fn gather<T>(
    rx: &mut mpsc::UnboundedReceiver<(usize, Answer<T>)>,
    nodes: usize,
    deadline: Instant,
    decided: impl Fn(&Gathered<T>) -> bool,
) -> Gathered<T> {
    gather_more(Gathered { answers: (0..nodes).map(|_| None).collect() }, rx, deadline, decided).await
}

/// [`gather`] on from the answers `gathered` already holds.
pub(super) async fn gather_more<T>(
    mut gathered: Gathered<T>,
    rx: &mut mpsc::UnboundedReceiver<(usize, Answer<T>)>,
    deadline: Instant,
    decided: impl Fn(&Gathered<T>) -> bool,
) -> Gathered<T> {
    let timer = tokio::time::sleep_until(deadline.into());
    tokio::pin!(timer);
    while gathered.pending() > 0 && !decided(&gathered) {
        tokio::select! {
            next = rx.recv() => match next {
                Some((i, answer)) => {
                    if let Some(slot) = gathered.answers.get_mut(i) {
                        *slot = Some(answer);
                    }
                }
                None => break,
            },
            _ = &mut timer => break,
        }
    }
    gathered
}
