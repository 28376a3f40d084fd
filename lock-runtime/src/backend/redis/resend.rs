//! When a command is sent again, for every topology, here and nowhere else:
//!
//! - **A dropped connection.** A command (or pipeline) that finds its connection closed or
//!   reset (the server closed it while idle, an operator killed it, the server restarted) goes
//!   out once more, on the new connection the connection manager makes (Sentinel: on a
//!   connection to the primary resolved again, in `sentinel.rs`), with [`dropped`] as the test.
//! - **A script the server does not know** (`NOSCRIPT`: restarted, flushed, failed over). Every
//!   script of the backend is made with [`script`], which remembers its source by SHA1; an
//!   `EVALSHA` answered `NOSCRIPT` is followed by `SCRIPT LOAD` of that source and sent again
//!   (a pipeline: every script in it loaded, the pipeline sent again). On a Cluster the source
//!   goes as `EVAL` to the node that runs it instead (`cluster.rs`), from the same sources.
//!
//! Sending again is safe because every command the backend sends is idempotent for its owner:
//! an attempt whose key already holds its owner grants it again (`acquire.lua`, and so a
//! batch's attempts, with the same token; `kind_acquire.lua` with a fresh one), a release, renewal or
//! hand-off is owner-checked (a second copy finds the key gone or another owner's and changes
//! nothing), a queue entry is keyed by its owner, and the rest only read. (A `NOSCRIPT` answer
//! ran nothing; a `WAIT` sent again waits for what was already acknowledged.) The one cost of
//! an answer lost with the connection: a release whose first copy ran reports the lock gone
//! (`lost`), though it was released.

use std::collections::HashMap;
use std::sync::{Arc, LazyLock, Mutex, PoisonError};

use redis::aio::ConnectionLike;
use redis::{Cmd, Pipeline, RedisError, RedisResult, Script, Value};

/// The sources of the backend's scripts, by SHA1 (a handful).
static SOURCES: LazyLock<Mutex<HashMap<String, Arc<[u8]>>>> = LazyLock::new(Default::default);

/// A script of the backend: its source is remembered, so that a server that lost it is given
/// it again wherever it is called.
pub(super) fn script(source: &'static str) -> Script {
    let script = Script::new(source);
    remember(script.get_hash(), source.as_bytes());
    script
}

/// Remembers `source` as the script of SHA1 `sha`.
pub(super) fn remember(sha: &str, source: &[u8]) {
    SOURCES.lock().unwrap_or_else(PoisonError::into_inner).insert(sha.to_ascii_lowercase(), Arc::from(source));
}

/// The source of the script of SHA1 `sha`, if it is one of the backend's.
pub(super) fn source(sha: &[u8]) -> Option<Arc<[u8]>> {
    let sha = std::str::from_utf8(sha).ok()?.to_ascii_lowercase();
    SOURCES.lock().unwrap_or_else(PoisonError::into_inner).get(&sha).cloned()
}

/// Whether `e` says the connection was found closed or reset (not a server's answer, not a
/// timeout): the command may be sent again on a new connection.
pub(super) fn dropped(e: &RedisError) -> bool {
    e.is_connection_dropped() && !e.is_timeout()
}

/// Whether an answer is `NOSCRIPT` (a server's error comes back as a value, or as an error).
pub(super) fn noscript(answer: &RedisResult<Value>) -> bool {
    match answer {
        Ok(value) => noscript_value(value),
        Err(e) => e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript),
    }
}

fn noscript_value(value: &Value) -> bool {
    matches!(value, Value::ServerError(e) if e.kind() == Some(redis::ServerErrorKind::NoScript))
}

/// The simple arguments of `cmd`.
pub(super) fn args(cmd: &Cmd) -> Vec<&[u8]> {
    cmd.args_iter()
        .filter_map(|a| match a {
            redis::Arg::Simple(a) => Some(a),
            _ => None,
        })
        .collect()
}

/// The source of the script an `EVALSHA` command calls, if it is one of the backend's.
fn called(cmd: &Cmd) -> Option<Arc<[u8]>> {
    let args = args(cmd);
    let verb = args.first()?;
    if !verb.eq_ignore_ascii_case(b"EVALSHA") {
        return None;
    }
    source(args.get(1)?)
}

/// Loads `source` on `conn`.
async fn load(conn: &mut (impl ConnectionLike + Send), source: &[u8]) -> RedisResult<()> {
    let mut load = redis::cmd("SCRIPT");
    load.arg("LOAD").arg(source);
    match conn.req_packed_command(&load).await? {
        Value::ServerError(e) => Err(e.into()),
        _ => Ok(()),
    }
}

/// `cmd` on `conn`: sent again once when it finds the connection dropped (unless the caller
/// does that itself: `again_if_dropped` false), and after loading its script when answered
/// `NOSCRIPT`.
pub(super) async fn command(
    conn: &mut (impl ConnectionLike + Send),
    cmd: &Cmd,
    again_if_dropped: bool,
) -> RedisResult<Value> {
    let mut answer = conn.req_packed_command(cmd).await;
    if again_if_dropped && matches!(&answer, Err(e) if dropped(e)) {
        answer = conn.req_packed_command(cmd).await;
    }
    if noscript(&answer) {
        if let Some(source) = called(cmd) {
            load(conn, &source).await?;
            answer = conn.req_packed_command(cmd).await;
        }
    }
    answer
}

/// [`command`] for a pipeline: answered `NOSCRIPT` anywhere, every script it calls is loaded
/// and the pipeline sent again.
pub(super) async fn commands(
    conn: &mut (impl ConnectionLike + Send),
    pipeline: &Pipeline,
    (offset, count): (usize, usize),
    again_if_dropped: bool,
) -> RedisResult<Vec<Value>> {
    let mut answer = conn.req_packed_commands(pipeline, offset, count).await;
    if again_if_dropped && matches!(&answer, Err(e) if dropped(e)) {
        answer = conn.req_packed_commands(pipeline, offset, count).await;
    }
    let missing = match &answer {
        Ok(values) => values.iter().any(noscript_value),
        Err(e) => e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript),
    };
    if missing {
        let sources: Vec<Arc<[u8]>> = pipeline.cmd_iter().filter_map(called).collect();
        if !sources.is_empty() {
            for source in &sources {
                load(conn, source).await?;
            }
            answer = conn.req_packed_commands(pipeline, offset, count).await;
        }
    }
    answer
}
