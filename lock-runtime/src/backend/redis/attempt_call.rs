//! One acquire attempt as it goes to the server: the script (`acquire.lua` for a mutex,
//! `kind_acquire.lua` for the other kinds), its keys and arguments, and the way it travels,
//! chosen here and nowhere else: in a batch with other tasks' operations when another call is
//! on the wire (a mutex attempt that does not register in the lock's queue; see `batch.rs`),
//! on its own otherwise, and followed by `WAIT` in the same round trip with
//! `wait_for_replicas`. Whatever carries it, the script does the same (one attempt, one token
//! of its slot's counter) and the answer is the same pair.

use std::sync::Arc;
use std::time::Duration;

use super::batch::{Answer, Op};
use super::held::{undo_dropped, ReleaseCall};
use super::scripts::{ACQUIRE, KIND_ACQUIRE};
use super::server::lease_millis;
use super::shared::Shared;
use crate::error::LockError;

/// One attempt's script call (see the [module docs](self)).
pub(super) struct AttemptCall<'a> {
    pub(super) backend: &'a Arc<Shared>,
    /// The lock's name, for errors.
    pub(super) name: &'a str,
    /// The lock key (or a kind's state) and the fencing counter.
    pub(super) lock: &'a str,
    pub(super) fence: &'a str,
    pub(super) owner: &'a Arc<str>,
    pub(super) lease: Duration,
    /// A kind's mode argument and permits (`kind_acquire.lua`); `None` for a mutex.
    pub(super) mode: Option<(&'static str, u32)>,
    /// A waiting mutex registering in the lock's queue: the queue's name, its claim window in
    /// milliseconds, and whether it may have an entry there already (see `handoff.rs`).
    pub(super) queue: Option<(&'a str, u64, bool)>,
}

impl AttemptCall<'_> {
    /// Sends the attempt: its answer, `(1, token)` or `(0, pttl)` (or a kind's `(-1, permits)`),
    /// and with `wait_for_replicas` how many replicas acknowledged it. `undo` is what undoes
    /// it when its caller is gone once a batch carrying it was sent (in the background, after
    /// the batch's answer). Not bounded in time: the caller bounds it.
    pub(super) async fn send(&self, undo: impl FnOnce() -> ReleaseCall) -> Result<(Answer, Option<usize>), LockError> {
        let server = &self.backend.server;
        if let Some(wait) = self.backend.options.wait_for_replicas {
            // (Boxed: a rare call, kept out of the size of every attempt's future.)
            return Box::pin(self.send_then_wait(wait)).await.map(|(reply, acked)| (reply, Some(acked)));
        }
        let reply = match &self.backend.lane {
            // A mutex attempt that does not register in the queue: in a batch when another
            // call is on the wire.
            Some(lane) if self.mode.is_none() && self.queue.is_none() => {
                let op = || Op::Acquire {
                    lock: self.lock.into(),
                    owner: self.owner.clone(),
                    lease: lease_millis(self.lease),
                    undo: {
                        let undo = undo();
                        Box::new(move || undo_dropped(undo, false))
                    },
                };
                lane.run(op, || Box::pin(server.eval_raw(self.invocation()))).await
            }
            _ => server.eval_raw(self.invocation()).await,
        };
        Ok((reply.map_err(|e| server.failed(self.name, "acquire", e))?, None))
    }

    /// The script and its arguments, sent on their own (written only if they are).
    fn invocation(&self) -> redis::ScriptInvocation<'static> {
        let mut invocation = self.script().prepare_invoke();
        invocation.key(self.lock).key(self.fence).arg(&**self.owner).arg(lease_millis(self.lease));
        if let Some((mode, permits)) = self.mode {
            invocation.arg(mode).arg(permits);
        }
        if let Some((queue, window, registered)) = self.queue {
            invocation.key(queue).arg("").arg(window).arg(if registered { "1" } else { "0" });
        }
        invocation
    }

    fn script(&self) -> &'static redis::Script {
        if self.mode.is_some() {
            &KIND_ACQUIRE
        } else {
            &ACQUIRE
        }
    }

    /// The script, then `WAIT` for `replicas` within `timeout` in the same round trip: its
    /// answer and the replicas that acknowledged it.
    async fn send_then_wait(&self, (replicas, timeout): (usize, Duration)) -> Result<(Answer, usize), LockError> {
        let (lease, permits) = (lease_millis(self.lease).to_string(), self.mode.map(|(_, p)| p.to_string()));
        let mut args = vec![&**self.owner, lease.as_str()];
        if let (Some((mode, _)), Some(permits)) = (self.mode, &permits) {
            args.extend([mode, permits.as_str()]);
        }
        let script = (self.script(), &[self.lock, self.fence][..], &args[..]);
        self.backend.server.eval_then_wait(self.name, "acquire", script, (replicas, timeout)).await
    }
}
