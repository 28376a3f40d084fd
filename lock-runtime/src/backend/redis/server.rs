//! The ground floor of the Redis wing: the connection to the store (whatever its topology,
//! `topology.rs`), the scripts loaded on it, and the one way to call a script: sent again on a
//! new connection or after a `NOSCRIPT` answer (by the connection itself, `resend.rs`), bounded
//! by the command timeout, its error mapped to a [`LockError`], and a lost connection reported
//! to whoever checks the held locks (`holdings.rs`). Everything that calls a script (attempts,
//! releases, renewals, batches, inspection, the held-lock check) does it through a [`Server`].

use std::collections::HashSet;
use std::future::Future;
use std::sync::{Mutex, OnceLock, PoisonError};
use std::time::Duration;

use redis::{FromRedisValue, Script, ScriptInvocation};

use super::options::KIND;
use super::scripts::{ACQUIRE, BATCH, EXTEND, HANDOFF, RELEASE};
use super::topology::Conn;
use crate::error::LockError;

/// What to do when a command finds the connection lost (check the held locks).
type OnLost = Box<dyn Fn() + Send + Sync>;

/// One connection to the store, the scripts loaded on it, and how a script is called.
pub(super) struct Server {
    conn: Conn,
    /// The command timeout: the bound of every call.
    timeout: Duration,
    /// The scripts loaded (`SCRIPT LOAD`), by hash: at connect ([`Server::preload`]), or
    /// before their first pipeline with `WAIT`, where a `NOSCRIPT` answer inside the pipeline
    /// would make the call wait for the replicas twice.
    loaded: Mutex<HashSet<String>>,
    /// Told when a command finds the connection lost ([`Server::on_connection_lost`]).
    on_lost: OnceLock<OnLost>,
}

impl Server {
    pub(super) fn new(conn: Conn, timeout: Duration) -> Self {
        Server { conn, timeout, loaded: Mutex::default(), on_lost: OnceLock::new() }
    }

    /// The connection (for what is not a script: `SCAN`, `WAIT`, pub/sub counts).
    pub(super) fn conn(&self) -> &Conn {
        &self.conn
    }

    /// The command timeout.
    pub(super) fn timeout(&self) -> Duration {
        self.timeout
    }

    /// Whether the store is a Redis Cluster (its commands are routed by key slot).
    pub(super) fn is_cluster(&self) -> bool {
        matches!(self.conn, Conn::Cluster(..))
    }

    /// Sets what a command that finds the connection lost calls (once; later calls are ignored).
    pub(super) fn on_connection_lost(&self, f: impl Fn() + Send + Sync + 'static) {
        let _ = self.on_lost.set(Box::new(f));
    }

    /// Loads the scripts of every mutex lock, release, hand-off and renewal at once (their
    /// commands go out together on the one connection), bounded by the command timeout. A new
    /// process's first calls are then not answered `NOSCRIPT`, loaded and sent again: two more
    /// round trips each (a scheduled job that locks once paid four), and a call sent again
    /// behind what the process sent after it. A failure is left to those calls, which load
    /// what they miss, as after a server restart.
    pub(super) async fn preload(&self) {
        if tokio::time::timeout(self.timeout, self.load(&[&*ACQUIRE, &*RELEASE, &*HANDOFF, &*BATCH, &*EXTEND]))
            .await
            .is_err()
        {
            tracing::debug!("redis: scripts not loaded within {:?} at connect; loaded on first use", self.timeout)
        }
    }

    /// Loads `scripts` together (one round trip; unbounded: the caller bounds it). A script
    /// not loaded is only logged: the call that needs it loads it (the server answers
    /// `NOSCRIPT`), as after a server restart.
    pub(super) async fn load(&self, scripts: &[&Script]) {
        let loaded = load_scripts(&self.conn, scripts).await;
        self.loaded.lock().unwrap_or_else(PoisonError::into_inner).extend(loaded);
    }

    /// One script call for lock `name`'s `operation`: its answer, or its error mapped (see
    /// [`failed`](Self::failed)). The connection's response timeout (the command timeout)
    /// bounds it.
    pub(super) async fn eval<T: FromRedisValue>(
        &self,
        name: &str,
        operation: &'static str,
        invocation: ScriptInvocation<'_>,
    ) -> Result<T, LockError> {
        self.eval_raw(invocation).await.map_err(|e| self.failed(name, operation, e))
    }

    /// [`eval`](Self::eval) with the connection's own error, for a caller that looks at it
    /// (and maps it with [`failed`](Self::failed)).
    pub(super) async fn eval_raw<T: FromRedisValue>(
        &self,
        invocation: ScriptInvocation<'_>,
    ) -> Result<T, redis::RedisError> {
        let mut conn = self.conn.clone();
        invocation.invoke_async(&mut conn).await
    }

    /// [`eval_raw`](Self::eval_raw) of an `EVALSHA` the caller wrote itself (in one buffer,
    /// not an argument at a time). A server that lost the script is given it again by the
    /// connection (see `resend.rs`).
    pub(super) async fn eval_command<T: FromRedisValue>(&self, command: redis::Cmd) -> Result<T, redis::RedisError> {
        let mut conn = self.conn.clone();
        command.query_async(&mut conn).await
    }

    /// The error of a failed command; a connection found lost is reported (every held lock is
    /// checked).
    pub(super) fn failed(&self, name: &str, operation: &'static str, e: redis::RedisError) -> LockError {
        if connection_lost(&e) {
            if let Some(on_lost) = self.on_lost.get() {
                on_lost();
            }
        }
        command_error(name, operation, self.timeout, e)
    }

    /// `script` and then `WAIT <replicas> <timeout>` in one pipeline, so both go on the same
    /// connection and the `WAIT` covers the script's writes: the script's answer and how many
    /// replicas acknowledged.
    pub(super) async fn eval_then_wait<T: FromRedisValue>(
        &self,
        name: &str,
        operation: &'static str,
        (script, keys, args): (&Script, &[&str], &[&str]),
        (replicas, timeout): (usize, Duration),
    ) -> Result<(T, usize), LockError> {
        let mut evalsha = redis::cmd("EVALSHA");
        evalsha.arg(script.get_hash()).arg(keys.len()).arg(keys).arg(args);
        let mut pipe = redis::pipe();
        pipe.add_command(evalsha).cmd("WAIT").arg(replicas).arg(lease_millis(timeout));
        let mut conn = self.conn.clone();
        let map = |e: redis::RedisError| self.failed(name, operation, e);
        let loaded = |hash: &str| self.loaded.lock().unwrap_or_else(PoisonError::into_inner).contains(hash);
        if !loaded(script.get_hash()) {
            // Once per script and backend; a server that lost it later answers NOSCRIPT below.
            script.load_async(&mut conn).await.map_err(map)?;
            self.loaded.lock().unwrap_or_else(PoisonError::into_inner).insert(script.get_hash().to_owned());
        }
        // A server that lost the script since is given it again by the connection (`resend.rs`).
        pipe.query_async(&mut conn).await.map_err(map)
    }
}

/// Whether `e` means the connection to the server was lost (dropped, refused, or failed
/// reading or writing), as a restart or a failover shows itself.
/// A timeout is not: the server may only be slow. A `READONLY` answer is (a failover demoted
/// the server written to).
pub(super) fn connection_lost(e: &redis::RedisError) -> bool {
    !e.is_timeout()
        && (e.is_connection_dropped()
            || e.is_connection_refusal()
            || e.is_unrecoverable_error()
            || e.code() == Some("READONLY"))
}

/// `fut` bounded by `timeout`: past it, a timed-out `operation` error of lock `name`.
///
/// A future of its own rather than an `async fn`: the latter would keep `fut` twice in its
/// state (as its argument, and inside the timeout), and the futures it bounds are the largest
/// part of every attempt's and release's.
pub(super) fn bounded<'a, T, F: Future<Output = Result<T, LockError>>>(
    name: &'a str,
    operation: &'static str,
    timeout: Duration,
    fut: F,
) -> Bounded<'a, F> {
    Bounded { timed: tokio::time::timeout(timeout, fut), name, operation, timeout }
}

pin_project_lite::pin_project! {
    /// The future of [`bounded`].
    pub(super) struct Bounded<'a, F> {
        #[pin]
        timed: tokio::time::Timeout<F>,
        name: &'a str,
        operation: &'static str,
        timeout: Duration,
    }
}

impl<T, F: Future<Output = Result<T, LockError>>> Future for Bounded<'_, F> {
    type Output = Result<T, LockError>;

    fn poll(self: std::pin::Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> std::task::Poll<Self::Output> {
        let this = self.project();
        match std::task::ready!(this.timed.poll(cx)) {
            Ok(out) => std::task::Poll::Ready(out),
            Err(_) => {
                std::task::Poll::Ready(Err(LockError::timed_out(*this.name, KIND, this.operation, *this.timeout)))
            }
        }
    }
}

/// The error of a failed command: timed out past `timeout`, or the server's or connection's.
pub(super) fn command_error(name: &str, operation: &'static str, timeout: Duration, e: redis::RedisError) -> LockError {
    if e.is_timeout() {
        LockError::timed_out(name, KIND, operation, timeout)
    } else {
        LockError::backend(name, KIND, operation, e)
    }
}

/// A lease (or any duration) in whole milliseconds, at least one, as the scripts take it.
pub(super) fn lease_millis(lease: Duration) -> u64 {
    u64::try_from(lease.as_millis()).unwrap_or(u64::MAX).max(1)
}

/// The answer of an owner-checked script (release, extend): `1` done; anything else means
/// the lock was lost (see [`lost_reason`]).
pub(super) fn still_held(name: &str, status: i64) -> Result<(), LockError> {
    match status {
        1 => Ok(()),
        status => Err(LockError::lost(name, lost_reason(status))),
    }
}

pub(super) fn lost_reason(status: i64) -> &'static str {
    if status == 0 {
        "its Redis key is gone: the lease ran out, or the key was deleted"
    } else {
        "its Redis key now holds another owner"
    }
}

/// Loads `scripts` on `conn` together (one round trip), as a backend connects: the hashes of
/// those loaded. A script not loaded is only logged: the call that needs it loads it (the
/// server answers `NOSCRIPT`), as after a server restart.
async fn load_scripts(conn: &Conn, scripts: &[&Script]) -> Vec<String> {
    let mut conns: Vec<Conn> = scripts.iter().map(|_| conn.clone()).collect();
    let loads = scripts.iter().zip(conns.iter_mut()).map(|(script, conn)| script.load_async(conn));
    let mut loaded = Vec::new();
    for outcome in futures_util::future::join_all(loads).await {
        match outcome {
            Ok(hash) => loaded.push(hash),
            Err(e) => tracing::debug!(error = %e, "redis: a script not loaded at connect; loaded on first use"),
        }
    }
    loaded
}
