//! The fenced witness store: a second `redis-server` (never faulted) holding one counter per lock
//! name, which refuses any read or write whose fencing token is below the highest it has seen for
//! that name, and logs every accepted write. The workers read-modify-write through it under their
//! lock's token; the checker reads the logs afterwards (no accepted write may be lost).

use std::collections::BTreeMap;
use std::fmt;
use std::future::Future;
use std::sync::LazyLock;
use std::time::Duration;

use redis::aio::MultiplexedConnection;
use redis::{AsyncConnectionConfig, Client, Script};

use super::history::{ReadOutcome, WriteOutcome};

/// How long one call may take before it counts as an error.
const CALL_TIMEOUT: Duration = Duration::from_secs(5);

static OPERATION: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("witness.lua")));

/// A connection to the witness store (multiplexed: clones share it).
#[derive(Clone)]
pub struct Witness {
    conn: MultiplexedConnection,
}

impl fmt::Debug for Witness {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Witness").finish_non_exhaustive()
    }
}

fn keys(name: &str) -> [String; 3] {
    [format!("witness:{{{name}}}:max"), format!("witness:{{{name}}}:value"), format!("witness:{{{name}}}:log")]
}

async fn bounded<T>(what: &str, call: impl Future<Output = redis::RedisResult<T>>) -> Result<T, String> {
    match tokio::time::timeout(CALL_TIMEOUT, call).await {
        Ok(Ok(value)) => Ok(value),
        Ok(Err(e)) => Err(format!("witness {what}: {e}")),
        Err(_) => Err(format!("witness {what}: no answer within {CALL_TIMEOUT:?}")),
    }
}

impl Witness {
    /// Connects to the witness server at `url` (`redis://127.0.0.1:<port>`).
    pub async fn connect(url: &str) -> Result<Witness, String> {
        let client = Client::open(url).map_err(|e| format!("witness url {url:?}: {e}"))?;
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(CALL_TIMEOUT))
            .set_response_timeout(Some(CALL_TIMEOUT));
        let conn = bounded("connect", client.get_multiplexed_async_connection_with_config(&config)).await?;
        Ok(Witness { conn })
    }

    async fn call(&self, op: &str, name: &str, token: u64, value: u64) -> Result<(String, String), String> {
        let mut conn = self.conn.clone();
        let [max, val, log] = keys(name);
        let mut invocation = OPERATION.key(max);
        invocation.key(val).key(log).arg(op).arg(token.to_string()).arg(value.to_string());
        bounded(op, invocation.invoke_async::<(String, String)>(&mut conn)).await
    }

    /// Reads `name`'s value under `token`: refused when a higher token was seen; otherwise the
    /// token becomes the highest seen. A name never written reads 0.
    pub async fn read(&self, name: &str, token: u64) -> ReadOutcome {
        match self.call("read", name, token, 0).await {
            Ok((kind, value)) if kind == "value" => value.parse().map_or(ReadOutcome::Error, ReadOutcome::Value),
            Ok((kind, _)) if kind == "refused" => ReadOutcome::Refused,
            _ => ReadOutcome::Error,
        }
    }

    /// Writes `value` to `name` under `token`: refused when a higher token was seen; otherwise the
    /// token becomes the highest seen and `(token, value)` is appended to the name's log.
    pub async fn write(&self, name: &str, token: u64, value: u64) -> WriteOutcome {
        match self.call("write", name, token, value).await {
            Ok((kind, _)) if kind == "accepted" => WriteOutcome::Accepted,
            Ok((kind, _)) if kind == "refused" => WriteOutcome::Refused,
            _ => WriteOutcome::Error,
        }
    }

    /// Accepted writes of `name`, in the order the witness stored them: (token, value).
    pub async fn log(&self, name: &str) -> Result<Vec<(u64, u64)>, String> {
        let mut conn = self.conn.clone();
        let [_, _, log] = keys(name);
        let entries: Vec<String> =
            bounded("log", redis::cmd("LRANGE").arg(&log).arg(0).arg(-1).query_async(&mut conn)).await?;
        entries
            .iter()
            .map(|entry| {
                let parsed = entry.split_once(':').and_then(|(t, v)| Some((t.parse().ok()?, v.parse().ok()?)));
                parsed.ok_or_else(|| format!("witness log of {name}: malformed entry {entry:?}"))
            })
            .collect()
    }

    /// Every name's log (what the checker takes): all names the witness saw a write for.
    pub async fn all_logs(&self) -> Result<BTreeMap<String, Vec<(u64, u64)>>, String> {
        let mut conn = self.conn.clone();
        // The witness server is the test's own: KEYS over its few keys is fine.
        let keys: Vec<String> =
            bounded("keys", redis::cmd("KEYS").arg("witness:{*}:log").query_async(&mut conn)).await?;
        let mut logs = BTreeMap::new();
        for key in keys {
            let Some(name) = key.strip_prefix("witness:{").and_then(|k| k.strip_suffix("}:log")) else { continue };
            logs.insert(name.to_string(), self.log(name).await?);
        }
        Ok(logs)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;
    use crate::redis_server::RedisServer;

    #[tokio::test]
    async fn the_witness_refuses_lower_tokens_and_logs_accepted_writes() {
        let server = RedisServer::start();
        let witness = Witness::connect(&server.url()).await.unwrap();
        assert_eq!(witness.read("n", 5).await, ReadOutcome::Value(0));
        assert_eq!(witness.write("n", 5, 1).await, WriteOutcome::Accepted);
        // Equal tokens pass (the holder's own read-modify-write); lower ones do not.
        assert_eq!(witness.read("n", 5).await, ReadOutcome::Value(1));
        assert_eq!(witness.read("n", 4).await, ReadOutcome::Refused);
        assert_eq!(witness.write("n", 4, 2).await, WriteOutcome::Refused);
        // A read alone raises the highest token seen: the earlier holder's write is now stale.
        assert_eq!(witness.read("n", 7).await, ReadOutcome::Value(1));
        assert_eq!(witness.write("n", 6, 2).await, WriteOutcome::Refused);
        assert_eq!(witness.write("n", 7, 2).await, WriteOutcome::Accepted);
        // Tokens compare as numbers, also beyond 2^53 and across digit counts.
        assert_eq!(witness.write("n", 10, 3).await, WriteOutcome::Accepted);
        assert_eq!(witness.write("n", 9, 4).await, WriteOutcome::Refused);
        assert_eq!(witness.write("n", u64::MAX - 1, 4).await, WriteOutcome::Accepted);
        assert_eq!(witness.write("n", u64::MAX - 2, 5).await, WriteOutcome::Refused);
        assert_eq!(witness.read("n", u64::MAX).await, ReadOutcome::Value(4));
        assert_eq!(witness.log("n").await.unwrap(), vec![(5, 1), (7, 2), (10, 3), (u64::MAX - 1, 4)]);
        // Names are independent; a clone shares the connection.
        let clone = witness.clone();
        assert_eq!(clone.write("m", 1, 1).await, WriteOutcome::Accepted);
        assert_eq!(clone.log("m").await.unwrap(), vec![(1, 1)]);
        assert_eq!(witness.log("never").await.unwrap(), vec![]);
        let all = witness.all_logs().await.unwrap();
        assert_eq!(all.keys().collect::<Vec<_>>(), ["m", "n"]);
        assert_eq!(all["m"], vec![(1, 1)]);
    }

    #[tokio::test]
    async fn a_dead_witness_is_an_error_not_a_hang() {
        let mut server = RedisServer::start();
        let witness = Witness::connect(&server.url()).await.unwrap();
        server.kill();
        assert_eq!(witness.read("n", 1).await, ReadOutcome::Error);
        assert_eq!(witness.write("n", 1, 1).await, WriteOutcome::Error);
        assert!(witness.log("n").await.is_err());
        assert!(witness.all_logs().await.is_err());
        assert!(Witness::connect(&server.url()).await.is_err());
    }
}
