//! What the bench asks the Redis server itself: command counts, its version, its ceiling.

use std::collections::BTreeMap;
use std::process::Command;

/// A connection for probes (never used by a contender).
pub struct Probe {
    con: redis::aio::MultiplexedConnection,
}

impl Probe {
    pub async fn connect(url: &str) -> Result<Self, String> {
        let client = redis::Client::open(url).map_err(|e| format!("probe: {e}"))?;
        let con = client.get_multiplexed_async_connection().await.map_err(|e| format!("probe: {e}"))?;
        Ok(Probe { con })
    }

    async fn info(&mut self, section: &str) -> Result<String, String> {
        redis::cmd("INFO").arg(section).query_async(&mut self.con).await.map_err(|e| format!("INFO {section}: {e}"))
    }

    /// Calls per command since the server started (`INFO commandstats`), without the probe's
    /// own `INFO`s. Commands a Lua script runs are counted too, beside the `EVALSHA`.
    pub async fn command_calls(&mut self) -> Result<BTreeMap<String, u64>, String> {
        let text = self.info("commandstats").await?;
        let mut calls = BTreeMap::new();
        for line in text.lines() {
            let Some(rest) = line.strip_prefix("cmdstat_") else { continue };
            let Some((name, fields)) = rest.split_once(':') else { continue };
            if name == "info" {
                continue;
            }
            let n = fields
                .split(',')
                .find_map(|f| f.strip_prefix("calls="))
                .and_then(|v| v.parse::<u64>().ok())
                .unwrap_or(0);
            calls.insert(name.to_string(), n);
        }
        Ok(calls)
    }

    /// The server's memory in use (`used_memory`), in bytes.
    pub async fn used_memory(&mut self) -> Result<f64, String> {
        let text = self.info("memory").await?;
        text.lines()
            .find_map(|l| l.strip_prefix("used_memory:"))
            .and_then(|v| v.trim().parse::<f64>().ok())
            .ok_or_else(|| "INFO memory has no used_memory".to_owned())
    }

    /// The server's CPU time so far (`used_cpu_user` + `used_cpu_sys`), in seconds.
    pub async fn cpu_seconds(&mut self) -> Result<f64, String> {
        let text = self.info("cpu").await?;
        let field = |name: &str| {
            text.lines().find_map(|l| l.strip_prefix(name)).and_then(|v| v.trim().parse::<f64>().ok()).unwrap_or(0.0)
        };
        Ok(field("used_cpu_user:") + field("used_cpu_sys:"))
    }

    /// The median of `n` `PING` round trips on the probe's connection.
    pub async fn ping_rtt(&mut self, n: usize) -> Result<std::time::Duration, String> {
        let mut rtts = Vec::with_capacity(n);
        for _ in 0..n {
            let sent = std::time::Instant::now();
            let _: String = redis::cmd("PING").query_async(&mut self.con).await.map_err(|e| format!("PING: {e}"))?;
            rtts.push(sent.elapsed());
        }
        rtts.sort_unstable();
        Ok(rtts.get(n / 2).copied().unwrap_or_default())
    }

    pub async fn version(&mut self) -> Result<String, String> {
        let text = self.info("server").await?;
        Ok(text.lines().find_map(|l| l.strip_prefix("redis_version:")).unwrap_or("?").trim().to_string())
    }

    /// Loads `script` and returns its SHA.
    pub async fn script_load(&mut self, script: &str) -> Result<String, String> {
        redis::cmd("SCRIPT")
            .arg("LOAD")
            .arg(script)
            .query_async(&mut self.con)
            .await
            .map_err(|e| format!("SCRIPT LOAD: {e}"))
    }
}

/// Commands between two snapshots, total and per command (largest first).
pub fn delta(before: &BTreeMap<String, u64>, after: &BTreeMap<String, u64>) -> (u64, Vec<(String, u64)>) {
    let mut per: Vec<(String, u64)> = after
        .iter()
        .map(|(k, v)| (k.clone(), v.saturating_sub(before.get(k).copied().unwrap_or(0))))
        .filter(|(_, v)| *v > 0)
        .collect();
    per.sort_by_key(|p| std::cmp::Reverse(p.1));
    (per.iter().map(|(_, v)| v).sum(), per)
}

/// An uncontended acquire like ours and every `SET NX PX` lock: set-if-absent with a TTL and,
/// on success, a fencing counter bump; otherwise the remaining TTL.
pub const CEILING_SCRIPT: &str = "if redis.call('set', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then \
return redis.call('incr', KEYS[2]) end return redis.call('pttl', KEYS[1])";

/// The server's ceiling for that script: `redis-benchmark` EVALSHA at 50 clients on random
/// keys (1 ms TTL, so nearly every call takes the acquire path), `pipeline` requests in flight
/// per client. Requests per second.
pub fn ceiling(port: u16, sha: &str, requests: u32, pipeline: u32) -> Result<f64, String> {
    let out = Command::new("redis-benchmark")
        .args(["-h", "127.0.0.1", "-p", &port.to_string(), "-c", "50", "-n", &requests.to_string()])
        .args(["-P", &pipeline.to_string()])
        .args(["-r", "1000000", "--csv", "EVALSHA", sha, "2", "bench:ceiling:{__rand_int__}"])
        .args(["bench:ceiling:fence", "owner", "1"])
        .output()
        .map_err(|e| format!("redis-benchmark: {e}"))?;
    if !out.status.success() {
        return Err(format!("redis-benchmark: {}", String::from_utf8_lossy(&out.stderr)));
    }
    let text = String::from_utf8_lossy(&out.stdout);
    // "test","rps",... then "EVALSHA ...","95238.10",...
    text.lines()
        .filter(|l| !l.starts_with("\"test\""))
        .find_map(|l| l.split("\",\"").nth(1).and_then(|v| v.trim_matches('"').parse::<f64>().ok()))
        .ok_or_else(|| format!("redis-benchmark: unexpected output: {text}"))
}
