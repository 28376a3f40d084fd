//! STAND-IN (replaced on merge): the fenced witness store, on a `redis-server` of its own. It
//! refuses any read or write whose token is below the highest it has seen for the name.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use redis::aio::MultiplexedConnection;
use redis::Script;

use super::history::{ReadOutcome, WriteOutcome};

const READ: &str = r"
local max = tonumber(redis.call('GET', KEYS[1]) or '0')
if tonumber(ARGV[1]) < max then return 'refused' end
redis.call('SET', KEYS[1], ARGV[1])
return redis.call('GET', KEYS[2]) or '0'
";

const WRITE: &str = r"
local max = tonumber(redis.call('GET', KEYS[1]) or '0')
if tonumber(ARGV[1]) < max then return 'refused' end
redis.call('SET', KEYS[1], ARGV[1])
redis.call('SET', KEYS[2], ARGV[2])
redis.call('RPUSH', KEYS[3], ARGV[1] .. ':' .. ARGV[2])
return 'accepted'
";

/// A connection to the witness store.
#[derive(Clone)]
pub struct Witness {
    conn: MultiplexedConnection,
}

impl std::fmt::Debug for Witness {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Witness").finish_non_exhaustive()
    }
}

fn keys(name: &str) -> [String; 3] {
    [format!("witness:{{{name}}}:max"), format!("witness:{{{name}}}:value"), format!("witness:{{{name}}}:log")]
}

impl Witness {
    /// Connects to the witness server at `url`.
    pub async fn connect(url: &str) -> Result<Witness, String> {
        let client = redis::Client::open(url).map_err(|e| e.to_string())?;
        let conn = client.get_multiplexed_async_connection().await.map_err(|e| e.to_string())?;
        Ok(Witness { conn })
    }

    /// Reads `name` under `token`.
    pub async fn read(&self, name: &str, token: u64) -> ReadOutcome {
        let [max, value, _] = keys(name);
        let mut conn = self.conn.clone();
        let answer: Result<String, _> = Script::new(READ).key(max).key(value).arg(token).invoke_async(&mut conn).await;
        match answer.as_deref() {
            Ok("refused") => ReadOutcome::Refused,
            Ok(v) => v.parse().map(ReadOutcome::Value).unwrap_or(ReadOutcome::Error),
            Err(_) => ReadOutcome::Error,
        }
    }

    /// Writes `value` to `name` under `token`.
    pub async fn write(&self, name: &str, token: u64, value: u64) -> WriteOutcome {
        let [max, val, log] = keys(name);
        let mut conn = self.conn.clone();
        let answer: Result<String, _> =
            Script::new(WRITE).key(max).key(val).key(log).arg(token).arg(value).invoke_async(&mut conn).await;
        match answer.as_deref() {
            Ok("accepted") => WriteOutcome::Accepted,
            Ok("refused") => WriteOutcome::Refused,
            _ => WriteOutcome::Error,
        }
    }

    /// The accepted writes of `name`, `(token, value)`, in order.
    pub async fn log(&self, name: &str) -> Result<Vec<(u64, u64)>, String> {
        let [_, _, log] = keys(name);
        let mut conn = self.conn.clone();
        let entries: Vec<String> =
            redis::cmd("LRANGE").arg(log).arg(0).arg(-1).query_async(&mut conn).await.map_err(|e| e.to_string())?;
        entries
            .iter()
            .map(|e| {
                let (t, v) = e.split_once(':').ok_or_else(|| format!("bad log entry {e}"))?;
                Ok((t.parse().map_err(|_| format!("bad token {e}"))?, v.parse().map_err(|_| format!("bad value {e}"))?))
            })
            .collect()
    }
}
