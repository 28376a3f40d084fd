//! Group commit: the acquire attempts and holders' releases that many tasks of one process
//! make at once go to the server together, in one script call (`batch.lua`), instead of one
//! call each.
//!
//! One [`Lane`] per backend (not on a Cluster, where a script's keys must share a slot). An
//! operation made while fewer than [`MAX_IN_FLIGHT`] (two) calls of the lane are on the wire,
//! and none waits, goes out at once on its own, as it would without the lane (a lone task pays
//! a lock of the lane's state, nothing more); otherwise it waits, and when a call of the lane
//! ends, all that waited go out together in one call, in the order they were made (up to
//! [`MAX_BATCH`]). Two calls on the wire rather than one keep the server busy while a batch's
//! answer travels back and the next one fills. The server's work per lock falls (one script
//! call and one `TIME` for many operations), and so does the client's (one request sent, one
//! answer parsed). The lane's calls reach the server in the order their operations were made
//! (see [`Lane::wire`]): a guard dropped without awaiting its release is still released
//! before the same task's next lock call runs, and a release's local waiters attempt behind it.
//!
//! What each operation does is exactly what it does on its own: an attempt is `acquire.lua`'s
//! (its own fencing token from its slot's counter, never below the server's clock), a release
//! `release.lua`'s (owner-checked, granted from the queue or announced). Only mutex attempts
//! that do not register in the lock's queue, and holders' releases of a mutex, take the lane;
//! everything else (other kinds, `wait_for_replicas`, undoing a dropped acquisition, hand-offs
//! within the process, renewals) goes out on its own at once.
//!
//! Dropping: an attempt whose caller is gone before its batch is sent is left out of it; one
//! whose caller is gone once it was sent, and whose answer granted the lock (or was lost), is
//! undone with the owner-checked release, sent after the batch's answer. A release goes out
//! whoever waits for it. The task that sends the batches runs only while operations wait, and
//! stops when none is left; dropped (its runtime shutting down), it fails what waits.

use std::future::Future;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, TryLockError};
use std::task::Poll;

use redis::RedisError;
use tokio::sync::oneshot;

use super::layout::{joined, queue_parts, SERVER_FENCE};
use super::scripts::BATCH;
use super::server::Server;
use crate::backend::BoxFuture;

/// The most operations one batch carries (the rest wait for the next one).
const MAX_BATCH: usize = 64;

/// The most calls of one lane on the wire at once.
const MAX_IN_FLIGHT: usize = 2;

/// An operation's answer: an attempt's `(1, token)` or `(0, pttl)`, a release's `(status, 0)`.
pub(super) type Answer = (i64, i64);

/// One operation of a batch.
pub(super) enum Op {
    /// A mutex attempt (`acquire.lua`) on the lock key `lock`, and what undoes it (in the
    /// background) if it was, or may have been, granted when its caller is gone.
    Acquire { lock: Arc<str>, owner: Arc<str>, lease: u64, undo: Box<dyn FnOnce() + Send> },
    /// A holder's release of the mutex whose key is `lock` (`release.lua`; its channel is
    /// `<lock>:released`).
    Release { lock: Arc<str>, owner: Arc<str> },
}

/// The operations of a backend waiting for the call on the wire. Cheap to clone: clones are
/// one lane.
#[derive(Clone)]
pub(super) struct Lane(Arc<Wire>);

/// What a lane's clones share: what waits, the order onto the wire, and where its calls go.
struct Wire {
    state: Mutex<State>,
    /// Held while a batch is taken and its command put on its way (its first poll), and while
    /// an operation alone is: so the lane's calls reach the server in the order their
    /// operations were made. An operation that finds it held waits for a batch instead.
    wire: Mutex<()>,
    server: Arc<Server>,
    /// Where the batches' task runs.
    runtime: tokio::runtime::Handle,
}

#[derive(Default)]
struct State {
    /// The calls of the lane on the wire (each on its own, or a batch).
    busy: usize,
    pending: Vec<Pending>,
}

struct Pending {
    op: Op,
    answer: oneshot::Sender<Result<Answer, RedisError>>,
}

impl Lane {
    /// A lane of calls to `server`, its batches sent from a task on `runtime`.
    pub(super) fn new(server: Arc<Server>, runtime: tokio::runtime::Handle) -> Self {
        Lane(Arc::new(Wire { state: Mutex::default(), wire: Mutex::new(()), server, runtime }))
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.0.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Runs an operation: `alone()` (its own script call) at once when fewer than
    /// [`MAX_IN_FLIGHT`] calls of the lane are on the wire and none waits, else `op()` in the
    /// next batch (see [`Lane::wire`] for the order). The call alone is boxed only when made,
    /// so that the future of an operation that goes in a batch stays small (it is boxed,
    /// moved and freed on every lock and release).
    pub(super) async fn run<'a>(
        &self,
        op: impl FnOnce() -> Op,
        alone: impl FnOnce() -> BoxFuture<'a, Result<Answer, RedisError>>,
    ) -> Result<Answer, RedisError> {
        let mut alone = Some(alone);
        let mut op = Some(op);
        let mut busy = None;
        let first = std::future::poll_fn(|cx| {
            // Not alone while a batch is being put on the wire: behind it.
            let wire = match self.0.wire.try_lock() {
                Ok(wire) => Some(wire),
                Err(TryLockError::Poisoned(wire)) => Some(wire.into_inner()),
                Err(TryLockError::WouldBlock) => None,
            };
            let mut state = self.state();
            if wire.is_some() && state.busy < MAX_IN_FLIGHT && state.pending.is_empty() {
                state.busy += 1;
                drop(state);
                busy = Some(Busy(self));
                Poll::Ready(Ok(alone.take().map(|alone| {
                    let mut call = alone();
                    let polled = call.as_mut().poll(cx);
                    (call, polled)
                })))
            } else {
                let (answer, waiting) = oneshot::channel();
                let op = op.take().map(|op| op());
                state.pending.extend(op.map(|op| Pending { op, answer }));
                // Every call on the wire takes what waits when it ends; with fewer than the
                // most on the wire (the wire was held, or a batch is about to be sent), nobody
                // may: a batch is sent for it.
                if state.busy < MAX_IN_FLIGHT {
                    state.busy += 1;
                    drop(state);
                    drop(wire);
                    self.flush();
                }
                Poll::Ready(Err(waiting))
            }
        })
        .await;
        match first {
            Ok(Some((_, Poll::Ready(answer)))) => answer,
            Ok(Some((call, Poll::Pending))) => call.await,
            Ok(None) => Err(dropped()), // not reached: the first poll decides
            Err(waiting) => waiting.await.unwrap_or_else(|_| Err(dropped())),
        }
    }

    /// The call on the wire ended: what waited meanwhile goes out (in a task of its own, which
    /// sends batches until nothing waits), or the lane is idle.
    fn ended(&self) {
        let mut state = self.state();
        if state.pending.is_empty() {
            state.busy -= 1;
            return;
        }
        drop(state);
        self.flush();
    }

    /// Sends batches while operations wait, in a task of its own, on a call slot taken for it.
    fn flush(&self) {
        let flusher = Flusher { lane: self.clone(), finished: false };
        drop(self.0.runtime.spawn(flusher.run()));
    }
}

/// A call sent on its own: the lane is busy until it ends (answered or dropped).
struct Busy<'a>(&'a Lane);

impl Drop for Busy<'_> {
    fn drop(&mut self) {
        self.0.ended();
    }
}

/// Sends batches while operations wait.
struct Flusher {
    lane: Lane,
    finished: bool,
}

impl Flusher {
    async fn run(mut self) {
        let lane = self.lane.clone();
        let server = &lane.0.server;
        loop {
            // The batch is taken, and its command put on its way, holding the lane's wire: an
            // operation made after it goes out after it.
            let mut batch = Vec::new();
            let sent = std::future::poll_fn(|cx| {
                let _wire = lane.0.wire.lock().unwrap_or_else(PoisonError::into_inner);
                let mut state = lane.state();
                // An attempt nobody waits for any more is not sent (a release is).
                state.pending.retain(|p| matches!(p.op, Op::Release { .. }) || !p.answer.is_closed());
                if state.pending.is_empty() {
                    state.busy -= 1;
                    self.finished = true;
                    return Poll::Ready(None);
                }
                let n = state.pending.len().min(MAX_BATCH);
                batch.extend(state.pending.drain(..n));
                drop(state);
                let mut call = Box::pin(server.eval_command::<Vec<i64>>(command(&batch)));
                let first = call.as_mut().poll(cx);
                Poll::Ready(Some((call, first)))
            })
            .await;
            let Some((call, first)) = sent else { return };
            // Bounded here too (not every connection bounds its answers itself): a batch that
            // never answered would keep its slot of the lane.
            let timeout = server.timeout();
            let answers = match first {
                Poll::Ready(answers) => answers,
                Poll::Pending => tokio::time::timeout(timeout, call).await.unwrap_or_else(|_| {
                    let why = format!("no answer to a batch within {timeout:?}");
                    Err(RedisError::from(std::io::Error::new(std::io::ErrorKind::TimedOut, why)))
                }),
            };
            let answers = answers.and_then(|answers| {
                if answers.len() == 2 * batch.len() {
                    Ok(answers)
                } else {
                    let why = format!("answered {} numbers for {} operations", answers.len(), batch.len());
                    Err(RedisError::from((redis::ErrorKind::UnexpectedReturnType, "batch.lua", why)))
                }
            });
            for (i, pending) in batch.into_iter().enumerate() {
                let answer = match &answers {
                    Ok(answers) => Ok((answers[2 * i], answers[2 * i + 1])),
                    Err(e) => Err(e.clone()),
                };
                let granted = !matches!(answer, Ok((0, _)));
                if pending.answer.send(answer).is_err() {
                    undelivered(pending.op, granted);
                }
            }
        }
    }
}

impl Drop for Flusher {
    fn drop(&mut self) {
        // Dropped before it was done (its runtime shutting down): whatever waits fails now.
        if !self.finished {
            let pending = {
                let mut state = self.lane.state();
                state.busy -= 1;
                std::mem::take(&mut state.pending)
            };
            drop(pending);
        }
    }
}

/// The `batch.lua` call of `batch` (two numbers answered per operation), written into one
/// command buffer: `EVALSHA <hash> <number of keys> <keys>.. <arguments>..`: the server's
/// fencing counter (a lane is never on a Cluster), then per operation its lock key (and the
/// queue of a key whose queue is not `<lock key>:queue`), and two arguments.
fn command(batch: &[Pending]) -> redis::Cmd {
    let named = |lock: &str| queue_parts(lock)[0] != lock; // a queue not after the lock key
    let keys: usize = 1 + batch
        .iter()
        .map(|p| match &p.op {
            Op::Release { lock, .. } if named(lock) => 2,
            _ => 1,
        })
        .sum::<usize>();
    let mut cmd = redis::Cmd::with_capacity(3 + keys + 2 * batch.len(), 64 + 80 * batch.len());
    cmd.arg("EVALSHA").arg(BATCH.get_hash()).arg(keys).arg(SERVER_FENCE);
    let mut name = String::new();
    for pending in batch {
        match &pending.op {
            Op::Acquire { lock, .. } => cmd.arg(&**lock),
            Op::Release { lock, .. } if named(lock) => cmd.arg(&**lock).arg(joined(&mut name, &queue_parts(lock))),
            Op::Release { lock, .. } => cmd.arg(&**lock),
        };
    }
    for pending in batch {
        match &pending.op {
            Op::Acquire { owner, lease, .. } => cmd.arg(*lease).arg(&**owner),
            Op::Release { lock, owner } => cmd.arg(if named(lock) { "q" } else { "r" }).arg(&**owner),
        };
    }
    cmd
}

/// An answer whose caller is gone: an attempt that was (or may have been) granted is undone.
fn undelivered(op: Op, granted: bool) {
    if let (Op::Acquire { undo, .. }, true) = (op, granted) {
        undo();
    }
}

/// The error of an operation whose batch was dropped unsent.
fn dropped() -> RedisError {
    RedisError::from((redis::ErrorKind::Client, "the batch of this operation was dropped unsent"))
}
