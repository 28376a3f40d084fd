//! The table (terminal and Markdown), the targets from issue 10 with their range over the
//! recorded runs, and the SVG chart.

use std::fmt::Write as _;
use std::time::Duration;

use crate::scenario::{Contended, Cycles};

/// What the numbers were measured on.
pub struct Machine {
    pub cpu: String,
    pub cores: usize,
    pub memory_gib: f64,
    pub kernel: String,
    pub redis: String,
    pub rustc: String,
    pub date: String,
}

impl Machine {
    pub fn detect(redis: String) -> Self {
        let read = |p: &str| std::fs::read_to_string(p).unwrap_or_default();
        let cpuinfo = read("/proc/cpuinfo");
        let cpu = cpuinfo
            .lines()
            .find_map(|l| {
                l.strip_prefix("model name").and_then(|r| r.split_once(':')).map(|(_, v)| v.trim().to_string())
            })
            .unwrap_or_else(|| "unknown CPU".into());
        let memory_gib = read("/proc/meminfo")
            .lines()
            .find_map(|l| l.strip_prefix("MemTotal:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
            .map(|kb| kb / (1024.0 * 1024.0))
            .unwrap_or(0.0);
        Machine {
            cpu,
            cores: std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1),
            memory_gib,
            kernel: format!("Linux {}", read("/proc/sys/kernel/osrelease").trim()),
            redis,
            rustc: std::env::var("BENCH_RUSTC").unwrap_or_else(|_| "rustc (unknown)".into()),
            date: std::env::var("BENCH_DATE").unwrap_or_default(),
        }
    }

    pub fn line(&self) -> String {
        format!(
            "{}, {} cores, {:.0} GiB RAM, {}, redis-server {}, {}{}",
            self.cpu,
            self.cores,
            self.memory_gib,
            self.kernel,
            self.redis,
            self.rustc,
            if self.date.is_empty() { String::new() } else { format!(", {}", self.date) }
        )
    }
}

pub struct RedisRow {
    pub label: &'static str,
    pub ours: bool,
    pub one: Option<Cycles>,
    pub many: Option<Cycles>,
    pub contended: Contended,
    pub commands_per_acquisition: f64,
    pub per_command: Vec<(String, f64)>,
    /// The server's CPU time (`INFO cpu`) per lock+release cycle, `MANY` tasks uncontended.
    pub server_us_per_cycle: Option<f64>,
    /// The bench process's CPU time per cycle in the same window (the contender's client).
    pub client_us_per_cycle: Option<f64>,
    /// Script calls (`EVALSHA`) per lock+release cycle in the same window.
    pub scripts_per_cycle: Option<f64>,
}

pub struct MemoryRow {
    pub label: &'static str,
    pub ours: bool,
    pub one: Cycles,
    pub many: Cycles,
    pub contended: Contended,
}

/// A locked fn against the same body with the programmatic API (in-memory backend, 1 task).
pub struct Attribute {
    pub attribute_ns: f64,
    pub programmatic_ns: f64,
    /// Median over rounds of (attribute round / programmatic round of the same pair) - 1.
    pub median_overhead: f64,
    /// Measured rounds per variant, and calls per round.
    pub rounds: usize,
    pub batch: u64,
}

impl Attribute {
    pub fn overhead(&self) -> f64 {
        self.attribute_ns / self.programmatic_ns - 1.0
    }
}

/// One point of the scale curve: `tasks` tasks of one process.
#[derive(Debug, Clone, Copy)]
pub struct ScalePoint {
    pub tasks: usize,
    /// Server CPU per uncontended lock+release (µs) and cycles per second, `tasks` tasks on
    /// distinct names: ours, then rslock's.
    pub ours_us: f64,
    pub ours_rate: f64,
    pub rslock_us: f64,
    pub rslock_rate: f64,
    /// Ours, `tasks` tasks on one name: hand-off wait p50 and p99 (none for one task).
    pub handoff: Option<(Duration, Duration)>,
}

/// One point of the processes curve: `processes` clients (each a backend of its own, as a
/// process is) with two tasks each, on one name.
#[derive(Debug, Clone, Copy)]
pub struct ProcessPoint {
    pub processes: usize,
    pub handoffs_per_sec: f64,
    pub wait_p50: Duration,
    pub wait_p99: Duration,
    /// Redis commands (those inside scripts included) per acquisition.
    pub commands_per_acquisition: f64,
}

/// How the Redis backend's cost grows (`scripts/bench`'s scale curve).
#[derive(Debug, Clone, Default)]
pub struct Scale {
    pub points: Vec<ScalePoint>,
    pub processes: Vec<ProcessPoint>,
    /// The server's memory per held lock (bytes), and how many were held to measure it.
    pub memory_per_lock: Option<(f64, usize)>,
}

impl Scale {
    /// The section of RESULTS.md (and the printed report).
    pub fn markdown(&self) -> String {
        let mut s = String::new();
        if self.points.is_empty() {
            return s;
        }
        let _ = writeln!(
            s,
            "
### Scale

How the cost grows with the tasks of one process (one window each, so rougher than the rows above): the server CPU per uncontended lock+release and the cycles per second with that many tasks on distinct names, ours and rslock's; and ours with that many tasks on one name, the hand-off wait.
"
        );
        let _ = writeln!(
            s,
            "| tasks | ours: server µs/cycle | rslock: server µs/cycle | ratio | ours cycles/s | rslock cycles/s | ours hand-off p50 | p99 |
|---:|---:|---:|---:|---:|---:|---:|---:|"
        );
        for p in &self.points {
            let (p50, p99) = p.handoff.map_or(("-".to_owned(), "-".to_owned()), |(a, b)| (ms(a), ms(b)));
            let _ = writeln!(
                s,
                "| {} | {:.1} | {:.1} | {:.2}x | {} | {} | {p50} | {p99} |",
                p.tasks,
                p.ours_us,
                p.rslock_us,
                p.ours_us / p.rslock_us,
                count(p.ours_rate),
                count(p.rslock_rate)
            );
        }
        if !self.processes.is_empty() {
            let _ = writeln!(
                s,
                "\nOne name, several processes (each a backend of its own, two tasks each): the server-side queue keeps the herd away, so the commands per acquisition should stay flat as processes grow.\n\n| processes | hand-offs/s | wait p50 | p99 | Redis cmds/acquisition |\n|---:|---:|---:|---:|---:|"
            );
            for p in &self.processes {
                let _ = writeln!(
                    s,
                    "| {} | {} | {} | {} | {:.1} |",
                    p.processes,
                    count(p.handoffs_per_sec),
                    ms(p.wait_p50),
                    ms(p.wait_p99),
                    p.commands_per_acquisition
                );
            }
        }
        if let Some((bytes, held)) = self.memory_per_lock {
            let _ = writeln!(
                s,
                "
Server memory per held lock (`used_memory` with {held} locks held by one process, less before): {bytes:.0} bytes."
            );
        }
        s
    }
}

pub struct Results {
    pub machine: Machine,
    /// The scale curve of the Redis backend.
    pub scale: Scale,
    pub quick: bool,
    pub redis: Vec<RedisRow>,
    /// `redis-benchmark -c 50` EVALSHA, one request in flight per client (the issue's reference).
    pub ceiling_rps: f64,
    /// The same with `-P 16`: what the server does when requests are batched, as a multiplexed
    /// client connection does under load.
    pub ceiling_pipelined_rps: f64,
    /// The median `PING` round trip on the probe's connection.
    pub rtt_ping: Duration,
    pub memory: Vec<MemoryRow>,
    pub attribute: Option<Attribute>,
    /// The same over the Redis backend.
    pub attribute_redis: Option<Attribute>,
    pub ours_redis_built: bool,
    /// The PostgreSQL part (`--pg-url`).
    pub postgres: Option<PgFigures>,
    /// Instruction counts (callgrind), which the machine's load does not disturb.
    pub instructions: Instructions,
    /// Earlier runs' target figures (`history.tsv`), this run's included once recorded.
    pub history: Vec<(String, f64)>,
}

/// Instructions per call/cycle from callgrind (`scripts/bench` measures them when valgrind is
/// installed and passes them in `BENCH_INSTR_MEMORY` / `BENCH_INSTR_ATTRIBUTE`).
#[derive(Default)]
pub struct Instructions {
    /// lock-runtime (memory) and the keyed map, per uncontended lock+release.
    pub memory: Option<(f64, f64)>,
    /// A locked fn and the programmatic API, per call (memory backend).
    pub attribute: Option<(f64, f64)>,
    /// lock-runtime (memory) built with the `metrics` feature (no recorder) and without, per
    /// uncontended lock+release.
    pub metrics: Option<(f64, f64)>,
    /// The same by time, ns per cycle (best of alternating runs of both builds).
    pub metrics_ns: Option<(f64, f64)>,
}

impl Instructions {
    /// From the environment: `BENCH_INSTR_MEMORY="ours map"`, `BENCH_INSTR_ATTRIBUTE="attr prog"`.
    pub fn from_env() -> Self {
        let pair = |var: &str| {
            let v = std::env::var(var).ok()?;
            let mut it = v.split_whitespace().map(|x| x.parse::<f64>());
            match (it.next(), it.next()) {
                (Some(Ok(a)), Some(Ok(b))) if a > 0.0 && b > 0.0 => Some((a, b)),
                _ => None,
            }
        };
        Instructions {
            memory: pair("BENCH_INSTR_MEMORY"),
            attribute: pair("BENCH_INSTR_ATTRIBUTE"),
            metrics: pair("BENCH_INSTR_METRICS"),
            metrics_ns: pair("BENCH_TIME_METRICS"),
        }
    }
}

/// What the PostgreSQL part measured (see `postgres.rs`).
#[cfg(feature = "ours-postgres")]
pub use crate::postgres::PgFigures;

/// Without the PostgreSQL part built, nothing is measured.
#[cfg(not(feature = "ours-postgres"))]
pub struct PgFigures {
    pub cycle_us: (f64, f64),
    pub connections: Vec<(usize, i64, Option<i64>)>,
    pub rounds: usize,
}

#[cfg(not(feature = "ours-postgres"))]
impl PgFigures {
    pub fn cycle_ratio(&self) -> f64 {
        self.cycle_us.0 / self.cycle_us.1.max(1e-9)
    }
}

/// The PostgreSQL section of RESULTS.md.
pub fn postgres_markdown(pg: &PgFigures) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "\n## PostgreSQL\n\nThe backend's default, held locks sharing up to 4 connections (multiplexing), against a \
         connection per lock (`?multiplexing=0`), on one local server. Uncontended: one task's lock+release on 64 \
         rotating names, µs per cycle, best of {} alternating rounds. Connections: the server sessions of the manager \
         (`pg_stat_activity` by its `application_name`, idle ones included) while it holds that many locks taken with \
         `try_lock`; a connection per lock is not taken to 1,000 (past the server's `max_connections`).\n",
        pg.rounds
    );
    let _ = writeln!(s, "| | multiplexed (default) | a connection per lock |\n|---|---:|---:|");
    let _ = writeln!(s, "| uncontended cycle, 1 task | {:.0} µs | {:.0} µs |", pg.cycle_us.0, pg.cycle_us.1);
    for (held, mux, own) in &pg.connections {
        let own = own.map_or("-".to_owned(), |o| o.to_string());
        let per = *mux as f64 / *held as f64;
        let _ = writeln!(s, "| connections at {held} held ({per:.3} per held lock, multiplexed) | {mux} | {own} |");
    }
    s
}

/// One target of issue 10 and how this run did.
pub struct Target {
    /// A short id, for the history of runs.
    pub key: &'static str,
    /// The figure compared with the goal (a ratio, milliseconds or a percentage), for ranges.
    pub value: f64,
    pub what: &'static str,
    pub goal: &'static str,
    pub measured: String,
    /// `None`: not measured in this run.
    pub met: Option<bool>,
    /// How far off, when missed.
    pub gap: String,
}

fn ms(d: Duration) -> String {
    let ms = d.as_secs_f64() * 1e3;
    if ms < 0.1 {
        format!("{:.1} µs", ms * 1e3)
    } else if ms < 10.0 {
        format!("{ms:.2} ms")
    } else {
        format!("{ms:.0} ms")
    }
}

fn count(v: f64) -> String {
    if v >= 1e6 {
        format!("{:.2} M", v / 1e6)
    } else if v >= 1e4 {
        format!("{:.1} k", v / 1e3)
    } else if v >= 100.0 {
        format!("{v:.0}")
    } else {
        format!("{v:.1}")
    }
}

fn opt_count(c: Option<Cycles>) -> String {
    c.map(|c| count(c.per_sec)).unwrap_or_else(|| "(as 1 ms)".into())
}

impl Results {
    fn ours_redis(&self) -> Option<&RedisRow> {
        self.redis.iter().find(|r| r.ours)
    }

    fn rslock(&self) -> Option<&RedisRow> {
        self.redis.iter().find(|r| r.label.starts_with("rslock"))
    }

    fn memory_row(&self, prefix: &str) -> Option<&MemoryRow> {
        self.memory.iter().find(|r| r.label.starts_with(prefix))
    }

    /// The targets of issue 10, as measured in this run.
    pub fn targets(&self) -> Vec<Target> {
        let mut t = Vec::new();
        let not_measured = |key, what, goal, why: &str| Target {
            key,
            value: f64::NAN,
            what,
            goal,
            measured: format!("not measured: {why}"),
            met: None,
            gap: String::new(),
        };
        match (self.ours_redis(), self.rslock()) {
            (Some(ours), Some(rs)) => {
                let ratio = ours.contended.handoffs_per_sec / rs.contended.handoffs_per_sec.max(1e-9);
                t.push(Target {
                    key: "handoffs_vs_rslock",
                    value: ratio,
                    what: "Redis contended hand-offs/s vs rslock",
                    goal: ">= 40x",
                    measured: format!(
                        "{:.1}x ({} vs {})",
                        ratio,
                        count(ours.contended.handoffs_per_sec),
                        count(rs.contended.handoffs_per_sec)
                    ),
                    met: Some(ratio >= 40.0),
                    gap: format!("{:.0}% short", (1.0 - ratio / 40.0) * 100.0),
                });
                let p99 = ours.contended.wait_p99;
                t.push(Target {
                    key: "handoff_p99_ms",
                    value: p99.as_secs_f64() * 1e3,
                    what: "Redis hand-off wait p99",
                    goal: "< 2 ms",
                    measured: ms(p99),
                    met: Some(p99 < Duration::from_millis(2)),
                    gap: format!("{} over", ms(p99.saturating_sub(Duration::from_millis(2)))),
                });
                let f = ours.contended.fairness;
                t.push(Target {
                    key: "fairness",
                    value: f,
                    what: "Redis contended fairness (fewest/most per task)",
                    goal: ">= 0.9",
                    measured: format!("{f:.2}"),
                    met: Some(f >= 0.9),
                    gap: format!("{:.2} short", 0.9 - f),
                });
                // The server's CPU per uncontended lock+release against rslock's, in this run:
                // what decides how many locks one Redis core serves (the rate on a machine
                // where client and server share two cores is reported, not a target).
                let (o, r) = (ours.server_us_per_cycle.unwrap_or(f64::NAN), rs.server_us_per_cycle.unwrap_or(f64::NAN));
                t.push(Target {
                    key: "server_cpu_vs_rslock",
                    value: o / r,
                    what: "Redis server CPU per uncontended lock+release, 64 tasks, vs rslock",
                    goal: "<= 0.67x",
                    measured: format!("{:.2}x ({o:.1} vs {r:.1} µs)", o / r),
                    met: Some(o / r <= 0.67),
                    gap: format!("{:.0}% over", (o / r / 0.67 - 1.0) * 100.0),
                });
                // The round trip as the issue defines it: half of a 1-task rslock cycle (a
                // `SET NX PX`, then a release script), measured in this run.
                let rtt = rs.one.map_or(0.0, |c| 0.5 / c.per_sec);
                let p50 = ours.contended.wait_p50.as_secs_f64();
                let rtts = if rtt > 0.0 { p50 / rtt } else { f64::NAN };
                t.push(Target {
                    key: "handoff_p50_rtts",
                    value: rtts,
                    what: "Redis hand-off wait p50, in round trips (half a 1-task rslock cycle)",
                    goal: "<= 1.2",
                    measured: format!(
                        "{rtts:.2} ({} vs a {:.1} µs round trip)",
                        ms(ours.contended.wait_p50),
                        rtt * 1e6
                    ),
                    met: Some(rtts <= 1.2),
                    gap: format!("{:.2} round trips over", rtts - 1.2),
                });
            }
            _ => {
                let why = "Redis backend not built (feature ours-redis)";
                t.push(not_measured("handoffs_vs_rslock", "Redis contended hand-offs/s vs rslock", ">= 40x", why));
                t.push(not_measured("handoff_p99_ms", "Redis hand-off wait p99", "< 2 ms", why));
                t.push(not_measured("fairness", "Redis contended fairness (fewest/most per task)", ">= 0.9", why));
                t.push(not_measured(
                    "server_cpu_vs_rslock",
                    "Redis server CPU per uncontended lock+release, 64 tasks, vs rslock",
                    "<= 0.67x",
                    why,
                ));
                t.push(not_measured(
                    "handoff_p50_rtts",
                    "Redis hand-off wait p50, in round trips (half a 1-task rslock cycle)",
                    "<= 1.2",
                    why,
                ));
            }
        }
        if let (Some(ours), Some(map)) = (self.memory_row("lock-runtime"), self.memory_row("DashMap")) {
            let ratio = ours.one.ns_per_cycle() / map.one.ns_per_cycle();
            t.push(Target {
                key: "memory_vs_map_time",
                value: ratio,
                what: "In-memory uncontended vs keyed map, by time",
                goal: "<= 1.5x",
                measured: format!("{ratio:.2}x ({:.0} vs {:.0} ns)", ours.one.ns_per_cycle(), map.one.ns_per_cycle()),
                met: Some(ratio <= 1.5),
                gap: format!("{:.0}% over", (ratio / 1.5 - 1.0) * 100.0),
            });
        }
        match self.instructions.memory {
            Some((ours, map)) => {
                let ratio = ours / map;
                t.push(Target {
                    key: "memory_vs_map_instructions",
                    value: ratio,
                    what: "In-memory uncontended vs keyed map, by instructions",
                    goal: "<= 1.5x",
                    measured: format!("{ratio:.2}x ({ours:.0} vs {map:.0} instructions)"),
                    met: Some(ratio <= 1.5),
                    gap: format!("{:.0}% over", (ratio / 1.5 - 1.0) * 100.0),
                });
            }
            None => t.push(not_measured(
                "memory_vs_map_instructions",
                "In-memory uncontended vs keyed map, by instructions",
                "<= 1.5x",
                "valgrind not installed",
            )),
        }
        match self.instructions.attribute {
            Some((attr, prog)) => {
                let overhead = (attr / prog - 1.0) * 100.0;
                t.push(Target {
                    key: "attribute_instructions_pct",
                    value: overhead,
                    what: "Attribute overhead vs programmatic API (memory), by instructions",
                    goal: "< 3%",
                    measured: format!("{overhead:+.1}% ({attr:.0} vs {prog:.0} instructions per call)"),
                    met: Some(overhead < 3.0),
                    gap: format!("{:.1} points over", overhead - 3.0),
                });
            }
            None => t.push(not_measured(
                "attribute_instructions_pct",
                "Attribute overhead vs programmatic API (memory), by instructions",
                "< 3%",
                "valgrind not installed",
            )),
        }
        let what = "Metrics feature on, no recorder, vs off (memory), extra time per lock";
        match (self.instructions.metrics, self.instructions.metrics_ns) {
            (Some((on, off)), Some((on_ns, off_ns))) => {
                // Instructions are what the machine's load does not disturb: the extra ones, at
                // the rate the lock path runs them without the feature (timed in this run).
                let rate = off / off_ns;
                let extra = (on - off) / rate;
                t.push(Target {
                    key: "metrics_no_recorder_ns",
                    value: extra,
                    what,
                    goal: "<= 10 ns",
                    measured: format!(
                        "{extra:+.1} ns ({:+.0} instructions, {on:.0} vs {off:.0}, at {rate:.1} a ns; timed: {on_ns:.0} vs {off_ns:.0} ns)",
                        on - off
                    ),
                    met: Some(extra <= 10.0),
                    gap: format!("{:.1} ns over", extra - 10.0),
                });
            }
            _ => t.push(not_measured("metrics_no_recorder_ns", what, "<= 10 ns", "valgrind not installed")),
        }
        match &self.postgres {
            Some(pg) => {
                let ratio = pg.cycle_ratio();
                t.push(Target {
                    key: "pg_multiplexed_cycle",
                    value: ratio,
                    what: "PostgreSQL uncontended cycle, multiplexed vs a connection per lock",
                    goal: "<= 1.10x",
                    measured: format!("{ratio:.2}x ({:.0} vs {:.0} µs)", pg.cycle_us.0, pg.cycle_us.1),
                    met: Some(ratio <= 1.10),
                    gap: format!("{:.0}% over", (ratio - 1.10) * 100.0),
                });
                let thousand = pg.connections.iter().find(|c| c.0 == 1000).map(|c| c.1 as f64).unwrap_or(f64::NAN);
                t.push(Target {
                    key: "pg_connections_at_1000",
                    value: thousand,
                    what: "PostgreSQL server connections with 1,000 held locks",
                    goal: "<= 16",
                    measured: format!("{thousand:.0}"),
                    met: Some(thousand <= 16.0),
                    gap: format!("{:.0} over", thousand - 16.0),
                });
            }
            None => t.push(not_measured(
                "pg_multiplexed_cycle",
                "PostgreSQL uncontended cycle, multiplexed vs a connection per lock",
                "<= 1.10x",
                "no --pg-url",
            )),
        }
        if let Some(a) = &self.attribute {
            t.push(Target {
                key: "attribute_time_pct",
                value: a.overhead() * 100.0,
                what: "Attribute overhead vs programmatic API (memory), by time (for reference)",
                goal: "< 3%",
                measured: format!(
                    "{:+.1}% ({:.0} vs {:.0} ns per call)",
                    a.overhead() * 100.0,
                    a.attribute_ns,
                    a.programmatic_ns
                ),
                met: Some(a.overhead() < 0.03),
                gap: format!("{:.1} points over", a.overhead() * 100.0 - 3.0),
            });
        }
        t
    }

    /// The range of a target's figure over the recorded runs: `(min, max, runs)`.
    fn range(&self, key: &str) -> Option<(f64, f64, usize)> {
        let values: Vec<f64> =
            self.history.iter().filter(|(k, v)| k == key && v.is_finite()).map(|(_, v)| *v).collect();
        let first = *values.first()?;
        let (lo, hi) = values.iter().fold((first, first), |(lo, hi), v| (lo.min(*v), hi.max(*v)));
        Some((lo, hi, values.len()))
    }

    fn range_text(&self, t: &Target) -> String {
        match self.range(t.key) {
            Some((lo, hi, n)) => {
                let unit = match t.key {
                    "handoff_p99_ms" => " ms",
                    "metrics_no_recorder_ns" => " ns",
                    "handoff_p50_rtts" => " round trips",
                    "pg_connections_at_1000" => " connections",
                    k if k.ends_with("_pct") => "%",
                    "fairness" => "",
                    _ => "x",
                };
                let digits = if t.key.ends_with("_pct") { 1 } else { 2 };
                format!("{lo:.digits$}–{hi:.digits$}{unit} ({n} runs)")
            }
            None => "-".into(),
        }
    }

    /// This run's target figures, as lines of `history.tsv` (`date<TAB>key<TAB>value`).
    pub fn history_lines(&self) -> String {
        let mut s = String::new();
        for t in self.targets().into_iter().filter(|t| t.value.is_finite()) {
            let _ = writeln!(s, "{}\t{}\t{}", self.machine.date, t.key, t.value);
        }
        s
    }

    /// Reads `history.tsv` (`date<TAB>key<TAB>value` lines).
    pub fn parse_history(text: &str) -> Vec<(String, f64)> {
        text.lines()
            .filter_map(|l| {
                let mut it = l.split('\t');
                let (_, key, value) = (it.next()?, it.next()?, it.next()?);
                Some((key.to_owned(), value.parse().ok()?))
            })
            .collect()
    }

    fn verdict(t: &Target) -> String {
        match t.met {
            Some(true) => "met".into(),
            Some(false) => format!("MISSED ({})", t.gap),
            None => "-".into(),
        }
    }

    /// The round trip, measured two ways in this run.
    fn round_trip_line(&self) -> String {
        let rslock = self.rslock().and_then(|r| r.one).map_or(0.0, |c| 0.5 / c.per_sec * 1e6);
        format!(
            "round trip: {:.1} µs (half a 1-task rslock cycle: a `SET NX PX`, then a release script); {:.1} µs (median `PING` on an idle connection)",
            rslock,
            self.rtt_ping.as_secs_f64() * 1e6
        )
    }

    /// The server's CPU time per uncontended cycle of each contender.
    fn server_cpu_line(&self) -> String {
        let what = format!("server CPU per lock+release (`INFO cpu`, {} tasks uncontended)", crate::MANY);
        self.cpu_line(&what, |r| r.server_us_per_cycle)
    }

    /// The client's CPU time per uncontended cycle of each contender: with the server's, what
    /// one lock+release costs the two cores the client and the server share.
    fn client_cpu_line(&self) -> String {
        self.cpu_line("client CPU per lock+release (this process's threads, same window)", |r| r.client_us_per_cycle)
    }

    /// What the server's CPU per cycle allows: Redis runs commands on one thread, so no rate
    /// passes one cycle per that time; and the server CPU per cycle the target (0.67× rslock's)
    /// allows.
    fn server_bound_line(&self) -> String {
        let bounds: Vec<String> = self
            .redis
            .iter()
            .filter_map(|r| r.server_us_per_cycle.map(|us| format!("{} {}", r.label, count(1e6 / us.max(0.001)))))
            .collect();
        let needed = self
            .rslock()
            .and_then(|r| r.server_us_per_cycle)
            .map(|rslock| {
                format!("; the target, 0.67× rslock's server CPU, is at most {:.1} µs per cycle", 0.67 * rslock)
            })
            .unwrap_or_default();
        format!(
            "rate the server's CPU allows (one cycle per server CPU time per cycle; Redis runs commands on one thread): {} cycles/s{needed}",
            bounds.join(", ")
        )
    }

    /// `what`: each contender's `us` per cycle.
    fn cpu_line(&self, what: &str, us: impl Fn(&RedisRow) -> Option<f64>) -> String {
        let parts: Vec<String> =
            self.redis.iter().filter_map(|r| us(r).map(|us| format!("{} {us:.1} µs", r.label))).collect();
        format!("{what}: {}", parts.join(", "))
    }

    /// The script calls per uncontended cycle of each contender; ours makes every lock and
    /// release a script call, so below two they went out in batches (of two over it, on average).
    fn scripts_line(&self) -> String {
        let parts: Vec<String> = self
            .redis
            .iter()
            .filter_map(|r| {
                r.scripts_per_cycle.map(|calls| match r.ours && calls > 0.0 {
                    true => format!("{} {calls:.2} (about {:.0} operations per batch)", r.label, 2.0 / calls),
                    false => format!("{} {calls:.2}", r.label),
                })
            })
            .collect();
        format!("script calls (`EVALSHA`) per lock+release ({} tasks uncontended): {}", crate::MANY, parts.join(", "))
    }

    /// The terminal table.
    pub fn text(&self) -> String {
        let mut s = String::new();
        let _ = writeln!(s, "\nmachine: {}{}", self.machine.line(), if self.quick { " (QUICK run)" } else { "" });
        let _ = writeln!(
            s,
            "\nRedis: uncontended cycles/s (1 task | {} tasks, distinct names); contended ({} tasks, one name)",
            crate::MANY,
            crate::CONTENDERS
        );
        let _ = writeln!(
            s,
            "  {:<30} {:>10} {:>10} | {:>11} {:>10} {:>10} {:>8} {:>9}",
            "contender", "1 task", "64 tasks", "hand-offs/s", "wait p50", "wait p99", "fairness", "cmds/acq"
        );
        for r in &self.redis {
            let c = &r.contended;
            let _ = writeln!(
                s,
                "  {:<30} {:>10} {:>10} | {:>11} {:>10} {:>10} {:>8.2} {:>9.1}",
                r.label,
                opt_count(r.one),
                opt_count(r.many),
                count(c.handoffs_per_sec),
                ms(c.wait_p50),
                ms(c.wait_p99),
                c.fairness,
                r.commands_per_acquisition
            );
        }
        let _ = writeln!(s, "  {}", self.round_trip_line());
        let _ = writeln!(s, "  {}", self.server_cpu_line());
        let _ = writeln!(s, "  {}", self.client_cpu_line());
        let _ = writeln!(s, "  {}", self.server_bound_line());
        let _ = writeln!(s, "  {}", self.scripts_line());
        let _ = writeln!(
            s,
            "  server ceiling: redis-benchmark EVALSHA (SET NX PX + INCR script), 50 clients: {} req/s = {} cycles/s at 2 scripts per cycle; pipelined (-P 16): {} req/s",
            count(self.ceiling_rps),
            count(self.ceiling_rps / 2.0),
            count(self.ceiling_pipelined_rps)
        );
        let _ = writeln!(s, "\nIn-memory:");
        let _ = writeln!(
            s,
            "  {:<34} {:>10} {:>10} | {:>11} {:>10} {:>10} {:>8}",
            "contender", "1 task ns", "64 tasks/s", "hand-offs/s", "wait p50", "wait p99", "fairness"
        );
        for r in &self.memory {
            let c = &r.contended;
            let _ = writeln!(
                s,
                "  {:<34} {:>10.0} {:>10} | {:>11} {:>10} {:>10} {:>8.2}",
                r.label,
                r.one.ns_per_cycle(),
                count(r.many.per_sec),
                count(c.handoffs_per_sec),
                ms(c.wait_p50),
                ms(c.wait_p99),
                c.fairness
            );
        }
        if let Some(a) = &self.attribute {
            let _ = writeln!(
                s,
                "\nAttribute (memory): locked fn {:.0} ns vs programmatic {:.0} ns per call: {:+.1}%",
                a.attribute_ns,
                a.programmatic_ns,
                a.overhead() * 100.0
            );
        }
        if let Some(a) = &self.attribute_redis {
            let _ = writeln!(
                s,
                "Attribute (redis):  locked fn {:.1} µs vs programmatic {:.1} µs per call: {:+.1}% (median of paired rounds {:+.1}%)",
                a.attribute_ns / 1e3,
                a.programmatic_ns / 1e3,
                a.overhead() * 100.0,
                a.median_overhead * 100.0
            );
        }
        let _ = writeln!(s, "\nTargets:");
        for t in self.targets() {
            let _ = writeln!(s, "  {:<48} {:>7}  {:<44} {}", t.what, t.goal, t.measured, Self::verdict(&t));
        }
        s
    }

    /// `RESULTS.md`.
    pub fn markdown(&self) -> String {
        let mut s = String::new();
        let _ = writeln!(s, "# Benchmark results\n");
        let _ = writeln!(
            s,
            "Generated by `scripts/bench`; do not edit by hand.{}\n",
            if self.quick { " **QUICK run: short windows, indicative only.**" } else { "" }
        );
        let _ = writeln!(s, "Machine: {}.\n", self.machine.line());
        let _ = writeln!(s, "## Targets\n");
        let _ = writeln!(
            s,
            "Range: over every full run recorded in `bench/history.tsv` (this one included); the \
             verdict is this run's.\n"
        );
        let _ = writeln!(s, "| target | goal | this run | range over runs | verdict |\n|---|---|---|---|---|");
        for t in self.targets() {
            let _ = writeln!(
                s,
                "| {} | {} | {} | {} | {} |",
                t.what,
                t.goal,
                t.measured,
                self.range_text(&t),
                Self::verdict(&t)
            );
        }
        let _ = writeln!(
            s,
            "\n## Redis\n\nUncontended: lock+release cycles per second, 1 task, and {} tasks on distinct names (best of 3 alternating \
rounds of 500 ms). \
Contended: {} tasks on one name, empty critical section; a hand-off is an acquisition by a different task than \
the previous holder (re-acquisitions by the same task are not counted), its wait runs from the previous holder's \
release call to the acquisition; fairness is fewest over most acquisitions per task; commands per acquisition \
is the `INFO commandstats` delta over acquisitions (commands run inside Lua scripts count too). Every \
contender uses a 10 s lease/TTL without renewal.\n",
            crate::MANY,
            crate::CONTENDERS
        );
        let _ = writeln!(
            s,
            "| contender | 1 task cycles/s | {} tasks cycles/s | hand-offs/s | acquisitions/s | hand-off wait p50 | p99 | fairness | Redis cmds/acquisition |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|",
            crate::MANY
        );
        for r in &self.redis {
            let c = &r.contended;
            let b = if r.ours { "**" } else { "" };
            let _ = writeln!(
                s,
                "| {b}{}{b} | {} | {} | {} | {} | {} | {} | {:.2} | {:.1} |",
                r.label,
                opt_count(r.one),
                opt_count(r.many),
                count(c.handoffs_per_sec),
                count(c.acquisitions_per_sec),
                ms(c.wait_p50),
                ms(c.wait_p99),
                c.fairness,
                r.commands_per_acquisition
            );
        }
        let _ = writeln!(
            s,
            "\nThe {}. The {}. The {}. The {}. The {}.",
            self.round_trip_line(),
            self.server_cpu_line(),
            self.client_cpu_line(),
            self.server_bound_line(),
            self.scripts_line()
        );
        let _ = writeln!(
            s,
            "\nServer ceiling (reference): `redis-benchmark -c 50 EVALSHA` of a `SET NX PX` + `INCR` script on random keys: \
**{} requests/s**, i.e. {} lock+release cycles/s at two script calls per cycle. With `-P 16` (16 requests in flight \
per client, as a multiplexed connection batches them under load): {} requests/s = {} cycles/s. Clients that \
multiplex many tasks over one connection batch their requests, so they can pass the unpipelined figure.\n",
            count(self.ceiling_rps),
            count(self.ceiling_rps / 2.0),
            count(self.ceiling_pipelined_rps),
            count(self.ceiling_pipelined_rps / 2.0)
        );
        if let Some(ours) = self.ours_redis() {
            if let Some(many) = ours.many {
                let _ = writeln!(
                    s,
                    "Ours at {} tasks: {:.0}% of the unpipelined cycle ceiling, {:.0}% of the pipelined one.\n",
                    crate::MANY,
                    many.per_sec / (self.ceiling_rps / 2.0) * 100.0,
                    many.per_sec / (self.ceiling_pipelined_rps / 2.0) * 100.0
                );
            }
        }
        let _ = writeln!(s, "Commands per acquisition under contention, by command:\n");
        for r in &self.redis {
            let parts: Vec<String> = r.per_command.iter().take(8).map(|(k, v)| format!("{k} {v:.2}")).collect();
            let _ = writeln!(s, "- {}: {}", r.label, parts.join(", "));
        }
        s.push_str(&self.scale.markdown());
        let _ = writeln!(
            s,
            "\n## In-memory\n\nSame loops, no server; the uncontended figures are the best of 7 alternating rounds of 200 ms (this machine is shared and noisy), and the 1-task figure counts the on-CPU time of the task's worker thread (`/proc/thread-self/schedstat`), not the time other processes held the CPU. `tokio::sync::Mutex` is one pre-built mutex per name (no lookup); the \
keyed map looks the name up (inserting when missing) and locks the mutex inside.\n"
        );
        let _ = writeln!(
            s,
            "| contender | 1 task ns/cycle | {} tasks cycles/s | hand-offs/s | hand-off wait p50 | p99 | fairness |\n|---|---:|---:|---:|---:|---:|---:|",
            crate::MANY
        );
        for r in &self.memory {
            let c = &r.contended;
            let b = if r.ours { "**" } else { "" };
            let _ = writeln!(
                s,
                "| {b}{}{b} | {:.0} | {} | {} | {} | {} | {:.2} |",
                r.label,
                r.one.ns_per_cycle(),
                count(r.many.per_sec),
                count(c.handoffs_per_sec),
                ms(c.wait_p50),
                ms(c.wait_p99),
                c.fairness
            );
        }
        if let Some(pg) = &self.postgres {
            s.push_str(&postgres_markdown(pg));
        }
        let _ = writeln!(s, "\n## Attribute overhead\n");
        match &self.attribute {
            Some(a) => {
                let _ = writeln!(
                    s,
                    "A `#[distributed_locked]` fn against the same body written with `manager.lock(..).await` + \
`guard.release().await` (in-memory backend, 1 task, least disturbed of {} alternating rounds of {} calls): **{:.0} ns vs {:.0} ns per call, {:+.1}%** (median of the paired rounds' ratios: {:+.1}%).",
                    a.rounds,
                    a.batch,
                    a.attribute_ns,
                    a.programmatic_ns,
                    a.overhead() * 100.0,
                    a.median_overhead * 100.0
                );
            }
            None => {
                let _ = writeln!(s, "Not measured in this run (the `attribute` feature of the bench was off).");
            }
        }
        if let Some(a) = &self.attribute_redis {
            let _ = writeln!(
                s,
                "\nThe same over the Redis backend (1 task, least disturbed of {} alternating rounds of {} calls): \
**{:.1} µs vs {:.1} µs per call, {:+.1}%** (median of the paired rounds' ratios: {:+.1}%; Redis round trips \
dominate both, and a few % either way is within run-to-run noise).",
                a.rounds,
                a.batch,
                a.attribute_ns / 1e3,
                a.programmatic_ns / 1e3,
                a.overhead() * 100.0,
                a.median_overhead * 100.0
            );
        }
        if !self.ours_redis_built {
            let _ = writeln!(s, "\nThe Redis backend was not built in this run (bench feature `ours-redis` off).");
        }
        let _ = writeln!(s, "\n![chart](chart.png)");
        s
    }

    /// The chart: panels of labelled horizontal bars, ours highlighted (the scale curve's
    /// two when it was measured).
    pub fn svg(&self) -> String {
        let mut panels: Vec<Panel> = Vec::new();
        let redis_bars = |f: &dyn Fn(&RedisRow) -> Option<f64>, fmt: &dyn Fn(f64) -> String| -> Vec<Bar> {
            self.redis
                .iter()
                .filter_map(|r| f(r).map(|v| Bar { label: r.label.to_string(), value: v, text: fmt(v), ours: r.ours }))
                .collect()
        };
        panels.push(Panel {
            title: format!("Redis contended: hand-offs/s ({} tasks, one name)", crate::CONTENDERS),
            note: "higher is better",
            bars: redis_bars(&|r| Some(r.contended.handoffs_per_sec), &|v| count(v)),
        });
        panels.push(Panel {
            title: "Redis contended: hand-off wait p99 (ms)".into(),
            note: "lower is better",
            bars: redis_bars(&|r| Some(r.contended.wait_p99.as_secs_f64() * 1e3), &|v| format!("{v:.2} ms")),
        });
        let mut many = redis_bars(&|r| r.many.map(|c| c.per_sec), &|v| count(v));
        many.push(Bar {
            label: "server ceiling, EVALSHA / 2".into(),
            value: self.ceiling_rps / 2.0,
            text: count(self.ceiling_rps / 2.0),
            ours: false,
        });
        many.push(Bar {
            label: "server ceiling, -P 16, / 2".into(),
            value: self.ceiling_pipelined_rps / 2.0,
            text: count(self.ceiling_pipelined_rps / 2.0),
            ours: false,
        });
        panels.push(Panel {
            title: format!("Redis uncontended: cycles/s, {} tasks, distinct names", crate::MANY),
            note: "higher is better",
            bars: many,
        });
        panels.push(Panel {
            title: "Redis contended: fairness (fewest/most per task)".into(),
            note: "higher is better, 1 = equal",
            bars: redis_bars(&|r| Some(r.contended.fairness), &|v| format!("{v:.2}")),
        });
        panels.push(Panel {
            title: format!("Redis uncontended: server CPU per lock+release, {} tasks (µs)", crate::MANY),
            note: "lower is better",
            bars: redis_bars(&|r| r.server_us_per_cycle, &|v| format!("{v:.1} µs")),
        });
        if !self.scale.points.is_empty() {
            panels.push(Panel {
                title: "Scale: our server CPU per lock+release over rslock's, by tasks".into(),
                note: "lower is better; the target is 0.67",
                bars: self
                    .scale
                    .points
                    .iter()
                    .map(|p| {
                        let v = p.ours_us / p.rslock_us;
                        let label = if p.tasks == 1 { "1 task".to_owned() } else { format!("{} tasks", p.tasks) };
                        Bar { label, value: v, text: format!("{v:.2}x"), ours: true }
                    })
                    .collect(),
            });
        }
        if !self.scale.processes.is_empty() {
            panels.push(Panel {
                title: "Scale: Redis commands per acquisition, processes on one name".into(),
                note: "flat is the goal",
                bars: self
                    .scale
                    .processes
                    .iter()
                    .map(|p| Bar {
                        label: if p.processes == 1 {
                            "1 process".to_owned()
                        } else {
                            format!("{} processes", p.processes)
                        },
                        value: p.commands_per_acquisition,
                        text: format!("{:.1}", p.commands_per_acquisition),
                        ours: true,
                    })
                    .collect(),
            });
        }
        let mem_bars = |f: &dyn Fn(&MemoryRow) -> f64, fmt: &dyn Fn(f64) -> String| -> Vec<Bar> {
            self.memory
                .iter()
                .map(|r| {
                    let v = f(r);
                    Bar { label: r.label.to_string(), value: v, text: fmt(v), ours: r.ours }
                })
                .collect()
        };
        panels.push(Panel {
            title: "In-memory uncontended: ns per lock+release (1 task)".into(),
            note: "lower is better",
            bars: mem_bars(&|r| r.one.ns_per_cycle(), &|v| format!("{v:.0} ns")),
        });
        panels.push(Panel {
            title: format!("In-memory contended: hand-offs/s ({} tasks, one name)", crate::CONTENDERS),
            note: "higher is better",
            bars: mem_bars(&|r| r.contended.handoffs_per_sec, &|v| count(v)),
        });
        render(&panels, &format!("lock-runtime vs peers: {}", self.machine.line()))
    }
}

struct Bar {
    label: String,
    value: f64,
    text: String,
    ours: bool,
}

struct Panel {
    title: String,
    note: &'static str,
    bars: Vec<Bar>,
}

fn esc(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;")
}

fn render(panels: &[Panel], footer: &str) -> String {
    const W: f64 = 1420.0;
    const COLS: usize = 2;
    const PANEL_W: f64 = 680.0;
    const LABEL_W: f64 = 250.0;
    const BAR_H: f64 = 22.0;
    const GAP: f64 = 8.0;
    const HEAD: f64 = 48.0;
    let rows = panels.len().div_ceil(COLS);
    let max_bars = panels.iter().map(|p| p.bars.len()).max().unwrap_or(1) as f64;
    let panel_h = HEAD + max_bars * (BAR_H + GAP) + 16.0;
    let h = 60.0 + rows as f64 * panel_h + 40.0;
    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{h}" viewBox="0 0 {W} {h}" font-family="DejaVu Sans, Arial, sans-serif">"#
    );
    let _ = writeln!(s, r#"<rect width="100%" height="100%" fill="white"/>"#);
    let _ = writeln!(
        s,
        r##"<text x="20" y="34" font-size="22" font-weight="bold" fill="#222">lock-runtime against its peers (one run, one local redis-server)</text>"##
    );
    for (i, p) in panels.iter().enumerate() {
        let x0 = 20.0 + (i % COLS) as f64 * (PANEL_W + 20.0);
        let y0 = 60.0 + (i / COLS) as f64 * panel_h;
        let _ = writeln!(
            s,
            r##"<rect x="{x0}" y="{y0}" width="{PANEL_W}" height="{}" fill="#fafafa" stroke="#ddd"/>"##,
            panel_h - 10.0
        );
        let _ = writeln!(
            s,
            r##"<text x="{}" y="{}" font-size="16" font-weight="bold" fill="#222">{}</text>"##,
            x0 + 10.0,
            y0 + 22.0,
            esc(&p.title)
        );
        let _ =
            writeln!(s, r##"<text x="{}" y="{}" font-size="12" fill="#777">{}</text>"##, x0 + 10.0, y0 + 39.0, p.note);
        let max = p.bars.iter().map(|b| b.value).fold(0.0f64, f64::max).max(1e-12);
        let bar_max = PANEL_W - LABEL_W - 110.0;
        for (j, b) in p.bars.iter().enumerate() {
            let y = y0 + HEAD + j as f64 * (BAR_H + GAP);
            let w = (b.value / max * bar_max).max(1.0);
            let color = if b.ours {
                "#d9480f"
            } else if b.label.starts_with("server") {
                "#868e96"
            } else {
                "#4c6ef5"
            };
            let weight = if b.ours { "bold" } else { "normal" };
            let _ = writeln!(
                s,
                r##"<text x="{}" y="{}" font-size="13" text-anchor="end" font-weight="{weight}" fill="#222">{}</text>"##,
                x0 + LABEL_W,
                y + 16.0,
                esc(&b.label)
            );
            let _ = writeln!(
                s,
                r##"<rect x="{}" y="{y}" width="{w:.1}" height="{BAR_H}" fill="{color}" rx="2"/>"##,
                x0 + LABEL_W + 8.0
            );
            let _ = writeln!(
                s,
                r##"<text x="{}" y="{}" font-size="13" font-weight="{weight}" fill="#222">{}</text>"##,
                x0 + LABEL_W + 14.0 + w,
                y + 16.0,
                esc(&b.text)
            );
        }
    }
    let _ = writeln!(s, r##"<text x="20" y="{}" font-size="12" fill="#555">{}</text>"##, h - 16.0, esc(footer));
    s.push_str("</svg>\n");
    s
}
