//! The fenced witness store: a PostgreSQL server (never faulted) holding one counter per lock
//! name behind lock-runtime's shipped fence (`lock_runtime::fence::postgres`), which refuses any
//! read or write whose fencing token is below the highest it has seen for that name, and logs
//! every accepted write. The workers read-modify-write through it under their lock's token; the
//! checker reads the logs afterwards (no accepted write may be lost), so every fault run also
//! exercises the fence users get.

use std::collections::BTreeMap;
use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use lock_runtime::fence::postgres::{refusal, INSTALL_SQL};
use tokio_postgres::{Client, NoTls};

use super::history::{ReadOutcome, WriteOutcome};

/// How long one call may take before it counts as an error.
const CALL_TIMEOUT: Duration = Duration::from_secs(5);

/// A connection to the witness store (clones share it; calls are pipelined on it).
#[derive(Clone)]
pub struct Witness {
    client: Arc<Client>,
}

impl fmt::Debug for Witness {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Witness").finish_non_exhaustive()
    }
}

async fn bounded<T>(what: &str, call: impl Future<Output = Result<T, tokio_postgres::Error>>) -> Result<T, String> {
    match tokio::time::timeout(CALL_TIMEOUT, call).await {
        Ok(Ok(value)) => Ok(value),
        Ok(Err(e)) => Err(format!("witness {what}: {e}")),
        Err(_) => Err(format!("witness {what}: no answer within {CALL_TIMEOUT:?}")),
    }
}

/// A token as the fence's `bigint`; `None` above `i64::MAX` (then an error, as a write the
/// witness could not judge).
fn signed(token: u64) -> Option<i64> {
    i64::try_from(token).ok()
}

impl Witness {
    /// Connects to the witness server at `url` (`postgres://…`).
    pub async fn connect(url: &str) -> Result<Witness, String> {
        let (client, connection) = bounded("connect", tokio_postgres::connect(url, NoTls)).await?;
        tokio::spawn(connection);
        Ok(Witness { client: Arc::new(client) })
    }

    /// Installs the fence and the witness's schema (idempotent): once, before the workers start.
    pub async fn install(&self) -> Result<(), String> {
        bounded("install", self.client.batch_execute(INSTALL_SQL)).await?;
        bounded("install", self.client.batch_execute(include_str!("witness.sql"))).await
    }

    /// Reads `name`'s value under `token`: refused when a higher token was seen; otherwise the
    /// token becomes the highest seen. A name never written reads 0.
    pub async fn read(&self, name: &str, token: u64) -> ReadOutcome {
        let Some(t) = signed(token) else { return ReadOutcome::Error };
        match tokio::time::timeout(CALL_TIMEOUT, self.client.query_one("SELECT witness_read($1, $2)", &[&name, &t]))
            .await
        {
            Ok(Ok(row)) => row
                .try_get::<_, i64>(0)
                .ok()
                .and_then(|v| u64::try_from(v).ok())
                .map_or(ReadOutcome::Error, ReadOutcome::Value),
            Ok(Err(e)) if refusal(name, token, &e).is_some() => ReadOutcome::Refused,
            _ => ReadOutcome::Error,
        }
    }

    /// Writes `value` to `name` under `token`: refused when a higher token was seen; otherwise the
    /// token becomes the highest seen and `(token, value)` is appended to the name's log.
    pub async fn write(&self, name: &str, token: u64, value: u64) -> WriteOutcome {
        let (Some(t), Some(v)) = (signed(token), signed(value)) else { return WriteOutcome::Error };
        match tokio::time::timeout(
            CALL_TIMEOUT,
            self.client.execute("SELECT witness_write($1, $2, $3)", &[&name, &t, &v]),
        )
        .await
        {
            Ok(Ok(_)) => WriteOutcome::Accepted,
            Ok(Err(e)) if refusal(name, token, &e).is_some() => WriteOutcome::Refused,
            _ => WriteOutcome::Error,
        }
    }

    /// Accepted writes of `name`, in the order the witness stored them: (token, value).
    pub async fn log(&self, name: &str) -> Result<Vec<(u64, u64)>, String> {
        let rows = bounded(
            "log",
            self.client.query("SELECT token, value FROM witness_log WHERE name = $1 ORDER BY seq", &[&name]),
        )
        .await?;
        rows.iter()
            .map(|row| {
                let (token, value): (i64, i64) = (row.get(0), row.get(1));
                Ok((u64::try_from(token).map_err(|e| e.to_string())?, u64::try_from(value).map_err(|e| e.to_string())?))
            })
            .collect()
    }

    /// Every name's log (what the checker takes): all names the witness saw a write for.
    pub async fn all_logs(&self) -> Result<BTreeMap<String, Vec<(u64, u64)>>, String> {
        let rows = bounded("names", self.client.query("SELECT DISTINCT name FROM witness_log", &[])).await?;
        let mut logs = BTreeMap::new();
        for row in rows {
            let name: String = row.get(0);
            let log = self.log(&name).await?;
            logs.insert(name, log);
        }
        Ok(logs)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;
    use crate::pg_server::PgServer;

    #[tokio::test]
    async fn the_witness_refuses_lower_tokens_and_logs_accepted_writes() {
        let server = PgServer::start();
        let witness = Witness::connect(&server.url()).await.unwrap();
        witness.install().await.unwrap();
        witness.install().await.expect("idempotent");
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
        // Tokens compare as numbers across digit counts, up to the fence's bigint.
        assert_eq!(witness.write("n", 10, 3).await, WriteOutcome::Accepted);
        assert_eq!(witness.write("n", 9, 4).await, WriteOutcome::Refused);
        let top = i64::MAX as u64;
        assert_eq!(witness.write("n", top - 1, 4).await, WriteOutcome::Accepted);
        assert_eq!(witness.write("n", top - 2, 5).await, WriteOutcome::Refused);
        assert_eq!(witness.read("n", top).await, ReadOutcome::Value(4));
        assert_eq!(witness.write("n", top + 1, 5).await, WriteOutcome::Error, "beyond bigint: not judged");
        assert_eq!(witness.log("n").await.unwrap(), vec![(5, 1), (7, 2), (10, 3), (top - 1, 4)]);
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
        let mut server = Some(PgServer::start());
        let url = server.as_ref().map(PgServer::url).unwrap_or_default();
        let witness = Witness::connect(&url).await.unwrap();
        witness.install().await.unwrap();
        drop(server.take()); // stops the server
        assert_eq!(witness.read("n", 1).await, ReadOutcome::Error);
        assert_eq!(witness.write("n", 1, 1).await, WriteOutcome::Error);
        assert!(witness.log("n").await.is_err());
        assert!(witness.all_logs().await.is_err());
        assert!(Witness::connect(&url).await.is_err());
    }
}
