//! lock-runtime against its peers, in one run, on one local `redis-server`.
//!
//! ```text
//! scripts/bench                                    # the one command: starts redis, builds, runs, charts
//! lock-bench --port 6379 --out bench [--quick]     # what it runs (a redis-server must listen on --port)
//! lock-bench --redlock-ports 7001,7002,7003 --redlock-only [--quick]   # Redlock alone
//! ```
//!
//! With `--redlock-ports`, Redlock on those servers (ours against rslock's) runs last and is
//! printed with its ratios (not written to RESULTS.md).
//!
//! Prints the table, writes `RESULTS.md` and `chart.svg` into `--out`, and appends the targets' figures
//! of a full run to `history.tsv` there (the ranges in the table are over those runs).

mod contenders;
#[cfg(feature = "ours-postgres")]
mod postgres;
#[cfg(feature = "ours-redis")]
mod redlock;
mod report;
mod scenario;
mod server;

#[cfg(feature = "attribute")]
mod attribute;

use std::sync::Arc;
use std::time::Duration;

use contenders::{Contender, KeyedMap, Naive, Ours, Rslock, TokioMutex};
use report::{Machine, MemoryRow, RedisRow, Results};
use scenario::{keys, Clock, Contended, Cycles};

/// How long each measurement runs.
#[derive(Clone, Copy)]
struct Plan {
    warm: Duration,
    redis_cycles: Duration,
    redis_contended: Duration,
    memory_cycles: Duration,
    memory_contended: Duration,
    ceiling_requests: u32,
    #[cfg_attr(not(feature = "attribute"), allow(dead_code))]
    attribute_rounds: usize,
}

impl Plan {
    fn full() -> Self {
        Plan {
            warm: Duration::from_millis(200),
            redis_cycles: Duration::from_millis(500),
            redis_contended: Duration::from_secs(4),
            memory_cycles: Duration::from_millis(200),
            memory_contended: Duration::from_secs(2),
            ceiling_requests: 200_000,
            attribute_rounds: 41,
        }
    }

    fn quick() -> Self {
        Plan {
            warm: Duration::from_millis(50),
            redis_cycles: Duration::from_millis(150),
            redis_contended: Duration::from_secs(1),
            memory_cycles: Duration::from_millis(50),
            memory_contended: Duration::from_millis(300),
            ceiling_requests: 20_000,
            attribute_rounds: 5,
        }
    }
}

/// Tasks in the "many tasks, distinct names" runs.
const MANY: usize = 64;
/// Tasks fighting over one name in the contended runs.
const CONTENDERS: usize = 16;

struct Args {
    port: u16,
    out: std::path::PathBuf,
    quick: bool,
    /// Skip the Redis part (for looking at the in-process figures alone).
    memory_only: bool,
    /// Independent servers for the Redlock comparison.
    redlock_ports: Vec<u16>,
    /// Run the Redlock comparison alone.
    redlock_only: bool,
    /// A PostgreSQL server for the multiplexing figures (`postgres://…`).
    pg_url: Option<String>,
    /// Run the PostgreSQL part alone (printed, not written).
    postgres_only: bool,
}

fn args() -> Result<Args, String> {
    let mut a = Args {
        port: 6379,
        out: "bench".into(),
        quick: false,
        memory_only: false,
        redlock_ports: Vec::new(),
        redlock_only: false,
        pg_url: None,
        postgres_only: false,
    };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        match arg.as_str() {
            "--port" => a.port = it.next().and_then(|p| p.parse().ok()).ok_or("--port needs a number")?,
            "--out" => a.out = it.next().ok_or("--out needs a directory")?.into(),
            "--quick" => a.quick = true,
            "--memory-only" => a.memory_only = true,
            "--redlock-ports" => {
                let list = it.next().ok_or("--redlock-ports needs ports, e.g. 7001,7002,7003")?;
                a.redlock_ports = list
                    .split(',')
                    .map(|p| p.trim().parse::<u16>().map_err(|e| format!("--redlock-ports: {p:?}: {e}")))
                    .collect::<Result<_, _>>()?;
            }
            "--redlock-only" => a.redlock_only = true,
            "--pg-url" => a.pg_url = Some(it.next().ok_or("--pg-url needs a postgres:// URL")?),
            "--postgres-only" => a.postgres_only = true,
            other => {
                return Err(format!(
                    "unknown argument {other:?} (use --port N --out DIR [--quick] [--memory-only] \
                     [--redlock-ports P1,P2,P3] [--redlock-only] [--pg-url URL] [--postgres-only])"
                ))
            }
        }
    }
    Ok(a)
}

fn main() {
    let result = args().and_then(|args| {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .map_err(|e| format!("runtime: {e}"))?;
        rt.block_on(run(args))
    });
    if let Err(e) = result {
        eprintln!("bench failed: {e}");
        std::process::exit(1);
    }
}

/// The Redlock comparison on `--redlock-ports`, printed (nothing when no ports were given).
async fn redlock_part(args: &Args) -> Result<(), String> {
    if args.redlock_ports.is_empty() {
        return Ok(());
    }
    #[cfg(feature = "ours-redis")]
    {
        let urls: Vec<String> = args.redlock_ports.iter().map(|p| format!("redis://127.0.0.1:{p}/")).collect();
        println!("{}", redlock::run(&urls, args.quick, MANY, CONTENDERS).await?);
        Ok(())
    }
    #[cfg(not(feature = "ours-redis"))]
    Err("the Redlock comparison needs the `ours-redis` feature".into())
}

/// The PostgreSQL part on `--pg-url` (nothing when none was given).
async fn postgres_part(args: &Args) -> Result<Option<report::PgFigures>, String> {
    let Some(url) = &args.pg_url else { return Ok(None) };
    #[cfg(feature = "ours-postgres")]
    {
        postgres::run(url, args.quick).await.map(Some)
    }
    #[cfg(not(feature = "ours-postgres"))]
    {
        let _ = url;
        Err("the PostgreSQL part needs the `ours-postgres` feature".into())
    }
}

async fn run(args: Args) -> Result<(), String> {
    if args.redlock_only {
        return redlock_part(&args).await;
    }
    if args.postgres_only {
        let figures = postgres_part(&args).await?.ok_or("--postgres-only needs --pg-url")?;
        println!("{}", report::postgres_markdown(&figures));
        return Ok(());
    }
    let plan = if args.quick { Plan::quick() } else { Plan::full() };
    let url = format!("redis://127.0.0.1:{}/", args.port);
    let mut probe = server::Probe::connect(&url).await?;
    let machine = Machine::detect(probe.version().await?);
    eprintln!("machine: {}", machine.line());

    // ---------------------------------------------------------------- memory
    // Uncontended windows are short and noisy: alternate the contenders over a few rounds so
    // none gets a quieter machine, keep each one's best.
    let (ours, tokio_mutex, keyed) =
        (Arc::new(Ours::memory()), Arc::new(TokioMutex::new(MANY)), Arc::new(KeyedMap::default()));
    let mut best = [(0.0f64, 0.0f64); 3];
    for round in 0..MEMORY_ROUNDS {
        eprintln!("memory: uncontended round {}/{MEMORY_ROUNDS} ...", round + 1);
        let warm = round == 0;
        keep_best(&mut best[0], uncontended(&ours, plan, warm).await?);
        keep_best(&mut best[1], uncontended(&tokio_mutex, plan, warm).await?);
        keep_best(&mut best[2], uncontended(&keyed, plan, warm).await?);
    }
    let memory_rows = vec![
        memory_row("lock-runtime (memory)", true, &ours, best[0], plan).await?,
        memory_row("tokio::sync::Mutex (one per name)", false, &tokio_mutex, best[1], plan).await?,
        memory_row("DashMap<String, Arc<Mutex<()>>>", false, &keyed, best[2], plan).await?,
    ];

    // ---------------------------------------------------------------- attribute
    #[cfg(feature = "attribute")]
    let attribute =
        Some(attribute::overhead(lock_runtime::LockManager::memory(), plan.attribute_rounds, 20_000).await?);
    #[cfg(not(feature = "attribute"))]
    let attribute: Option<report::Attribute> = None;

    // ---------------------------------------------------------------- Redis
    // Last: the in-process figures are taken on a fresh process (the Redis clients' background
    // tasks and allocations are not there yet).
    let (redis_rows, ceiling, ceiling_pipelined, rtt_ping) = if args.memory_only {
        (Vec::new(), 0.0, 0.0, Duration::ZERO)
    } else {
        redis_part(&url, args.port, &mut probe, plan).await?
    };
    #[cfg(feature = "ours-redis")]
    let scale = if args.memory_only { report::Scale::default() } else { scale_part(&url, &mut probe, plan).await? };
    #[cfg(not(feature = "ours-redis"))]
    let scale = report::Scale::default();
    print!("{}", scale.markdown());
    // The same comparison where it matters in production: over Redis round trips.
    #[cfg(all(feature = "attribute", feature = "ours-redis"))]
    let attribute_redis = if args.memory_only {
        None
    } else {
        eprintln!("attribute over redis ...");
        let m = lock_runtime::LockManager::redis(&url).await.map_err(|e| format!("attribute (redis): {e}"))?;
        Some(attribute::overhead(m, plan.attribute_rounds / 2, 500).await?)
    };
    #[cfg(not(all(feature = "attribute", feature = "ours-redis")))]
    let attribute_redis: Option<report::Attribute> = None;

    let postgres = postgres_part(&args).await?;

    std::fs::create_dir_all(&args.out).map_err(|e| format!("{}: {e}", args.out.display()))?;
    let history_file = args.out.join("history.tsv");
    let mut results = Results {
        machine,
        scale,
        quick: args.quick,
        redis: redis_rows,
        ceiling_rps: ceiling,
        ceiling_pipelined_rps: ceiling_pipelined,
        rtt_ping,
        memory: memory_rows,
        attribute,
        attribute_redis,
        ours_redis_built: cfg!(feature = "ours-redis"),
        postgres,
        instructions: report::Instructions::from_env(),
        history: Vec::new(),
    };
    let mut history = std::fs::read_to_string(&history_file).unwrap_or_default();
    if !args.quick && !args.memory_only {
        // Only full runs count towards the ranges.
        history.push_str(&results.history_lines());
        std::fs::write(&history_file, &history).map_err(|e| format!("{}: {e}", history_file.display()))?;
    }
    results.history = Results::parse_history(&history);
    println!("{}", results.text());
    let md = args.out.join("RESULTS.md");
    std::fs::write(&md, results.markdown()).map_err(|e| format!("{}: {e}", md.display()))?;
    let svg = args.out.join("chart.svg");
    std::fs::write(&svg, results.svg()).map_err(|e| format!("{}: {e}", svg.display()))?;
    eprintln!("wrote {} and {}", md.display(), svg.display());
    redlock_part(&args).await
}

/// Rounds of the Redis uncontended runs (best kept).
const REDIS_ROUNDS: usize = 3;

/// The Redis contenders, then the server's own ceiling.
async fn redis_part(
    url: &str,
    port: u16,
    probe: &mut server::Probe,
    plan: Plan,
) -> Result<(Vec<RedisRow>, f64, f64, Duration), String> {
    #[cfg(feature = "ours-redis")]
    let ours = Arc::new(Ours::redis(url).await?);
    let rslock = Arc::new(Rslock::new(url));
    let naive1 = Arc::new(Naive::new(url, Duration::from_millis(1)).await?);
    let naive10 = Arc::new(Naive::new(url, Duration::from_millis(10)).await?);

    // Uncontended: alternating rounds, best kept. The two naive loops only differ when they
    // have to wait, so the 10 ms one is not run uncontended.
    #[cfg(feature = "ours-redis")]
    let mut best_ours = Uncontended::default();
    let (mut best_rslock, mut best_naive) = (Uncontended::default(), Uncontended::default());
    for round in 0..REDIS_ROUNDS {
        eprintln!("redis: uncontended round {}/{REDIS_ROUNDS} ...", round + 1);
        let warm = round == 0;
        #[cfg(feature = "ours-redis")]
        best_ours.keep_best(redis_uncontended(&ours, "ours", probe, plan, warm).await?);
        best_rslock.keep_best(redis_uncontended(&rslock, "rslock", probe, plan, warm).await?);
        best_naive.keep_best(redis_uncontended(&naive1, "naive", probe, plan, warm).await?);
    }

    let mut redis_rows = Vec::new();
    #[cfg(feature = "ours-redis")]
    redis_rows.push(redis_row("lock-runtime (redis)", true, &ours, probe, plan, "ours", Some(best_ours)).await?);
    redis_rows
        .push(redis_row("rslock 0.10 (defaults)", false, &rslock, probe, plan, "rslock", Some(best_rslock)).await?);
    redis_rows
        .push(redis_row("naive SET NX PX, 1 ms sleep", false, &naive1, probe, plan, "naive1", Some(best_naive)).await?);
    redis_rows.push(redis_row("naive SET NX PX, 10 ms sleep", false, &naive10, probe, plan, "naive10", None).await?);

    eprintln!("redis: round trip (PING) ...");
    let rtt_ping = probe.ping_rtt(500).await?;

    eprintln!("redis-benchmark EVALSHA, 50 clients ...");
    let sha = probe.script_load(server::CEILING_SCRIPT).await?;
    let ceiling = server::ceiling(port, &sha, plan.ceiling_requests, 1)?;
    let ceiling_pipelined = server::ceiling(port, &sha, plan.ceiling_requests * 2, 16)?;

    Ok((redis_rows, ceiling, ceiling_pipelined, rtt_ping))
}

/// The task counts of the scale curve.
const SCALE_TASKS: [usize; 4] = [1, 16, 64, 256];
/// The process counts of the scale curve (one name).
const SCALE_PROCESSES: [usize; 3] = [1, 4, 16];
/// The locks held at once to measure the server's memory per held lock.
const HELD_FOR_MEMORY: usize = 10_000;

/// The scale curve: per task count, the server CPU per uncontended cycle (ours and rslock's,
/// one window each) and ours' hand-off wait with that many tasks on one name; then the
/// server's memory per held lock.
#[cfg(feature = "ours-redis")]
async fn scale_part(url: &str, probe: &mut server::Probe, plan: Plan) -> Result<report::Scale, String> {
    let ours = Arc::new(Ours::redis(url).await?);
    let rslock = Arc::new(Rslock::new(url));
    let mut scale = report::Scale::default();
    for tasks in SCALE_TASKS {
        eprintln!("redis: scale, {tasks} tasks ...");
        let (ours_us, ours_rate) = server_cpu(&ours, &format!("scale:ours:{tasks}:"), tasks, probe, plan).await?;
        let (rslock_us, rslock_rate) =
            server_cpu(&rslock, &format!("scale:rslock:{tasks}:"), tasks, probe, plan).await?;
        let handoff = if tasks > 1 {
            let c = scenario::contended(&ours, &format!("scale:hot:{tasks}"), tasks, plan.redis_contended).await?;
            Some((c.wait_p50, c.wait_p99))
        } else {
            None
        };
        scale.points.push(report::ScalePoint { tasks, ours_us, ours_rate, rslock_us, rslock_rate, handoff });
    }
    for processes in SCALE_PROCESSES {
        eprintln!("redis: scale, {processes} processes on one name ...");
        let mut clients = Vec::with_capacity(processes);
        for _ in 0..processes {
            clients.push(Arc::new(Ours::redis(url).await?));
        }
        let name = format!("scale:procs:{processes}");
        let before = probe.command_calls().await?;
        let c = scenario::contended_across(&clients, &name, 2 * processes, plan.redis_contended).await?;
        let (commands, _) = server::delta(&before, &probe.command_calls().await?);
        scale.processes.push(report::ProcessPoint {
            processes,
            handoffs_per_sec: c.handoffs_per_sec,
            wait_p50: c.wait_p50,
            wait_p99: c.wait_p99,
            commands_per_acquisition: commands as f64 / c.acquisitions_total.max(1) as f64,
        });
    }
    eprintln!("redis: server memory per held lock ...");
    let names = keys("scale:held:", HELD_FOR_MEMORY);
    let before = probe.used_memory().await?;
    let mut guards = Vec::with_capacity(names.len());
    for key in &names {
        guards.push(ours.lock(key).await?);
    }
    let held = probe.used_memory().await?;
    for guard in guards {
        ours.unlock(guard).await?;
    }
    scale.memory_per_lock = Some(((held - before) / HELD_FOR_MEMORY as f64, HELD_FOR_MEMORY));
    Ok(scale)
}

/// The server's CPU per cycle (µs) and the cycles per second of `tasks` tasks on distinct
/// names, over one window.
#[cfg(feature = "ours-redis")]
async fn server_cpu<C: Contender>(
    c: &Arc<C>,
    prefix: &str,
    tasks: usize,
    probe: &mut server::Probe,
    plan: Plan,
) -> Result<(f64, f64), String> {
    let names = keys(prefix, tasks);
    scenario::cycles(c, &names, plan.warm, Clock::Wall).await?;
    let cpu = probe.cpu_seconds().await?;
    let got = scenario::cycles(c, &names, plan.redis_cycles, Clock::Wall).await?;
    let cpu = probe.cpu_seconds().await? - cpu;
    let cycles = got.per_sec * plan.redis_cycles.as_secs_f64();
    Ok((cpu * 1e6 / cycles.max(1.0), got.per_sec))
}

/// The uncontended Redis figures of a contender: cycles per second of 1 task and of `MANY`
/// tasks, and the server's CPU time per cycle during the `MANY` tasks' window.
#[derive(Default, Clone, Copy)]
struct Uncontended {
    one: f64,
    many: f64,
    server_us_per_cycle: f64,
    /// This process's CPU time per cycle in the same window (the contender's client, the
    /// runtime, and the bench's own loop, the same for every contender).
    client_us_per_cycle: Option<f64>,
    /// Script calls (`EVALSHA`) per cycle in the same window: below two, operations were batched.
    scripts_per_cycle: f64,
}

impl Uncontended {
    /// Keeps the best cycle rates over rounds, and the server CPU of the best `MANY` round.
    fn keep_best(&mut self, got: Uncontended) {
        self.one = self.one.max(got.one);
        if got.many > self.many {
            self.many = got.many;
            self.server_us_per_cycle = got.server_us_per_cycle;
            self.client_us_per_cycle = got.client_us_per_cycle;
            self.scripts_per_cycle = got.scripts_per_cycle;
        }
    }
}

/// One window of 1 task and one of `MANY` tasks on distinct names, with the server's CPU time
/// around the second.
async fn redis_uncontended<C: Contender>(
    c: &Arc<C>,
    tag: &str,
    probe: &mut server::Probe,
    plan: Plan,
    warm: bool,
) -> Result<Uncontended, String> {
    let one_key = keys(&format!("bench:{tag}:one:"), 1);
    if warm {
        scenario::cycles(c, &one_key, plan.warm, Clock::Wall).await?;
    }
    let one = scenario::cycles(c, &one_key, plan.redis_cycles, Clock::Wall).await?;
    let (cpu, calls) = (probe.cpu_seconds().await?, probe.command_calls().await?);
    let client = scenario::process_cpu_ns();
    let many = scenario::cycles(c, &keys(&format!("bench:{tag}:many:"), MANY), plan.redis_cycles, Clock::Wall).await?;
    let client = scenario::process_cpu_ns().zip(client).map(|(after, before)| after.saturating_sub(before));
    let cpu = probe.cpu_seconds().await? - cpu;
    let after = probe.command_calls().await?;
    let scripts = after.get("evalsha").copied().unwrap_or(0) - calls.get("evalsha").copied().unwrap_or(0);
    let cycles = many.per_sec * plan.redis_cycles.as_secs_f64();
    Ok(Uncontended {
        one: one.per_sec,
        many: many.per_sec,
        server_us_per_cycle: cpu * 1e6 / cycles.max(1.0),
        client_us_per_cycle: client.map(|ns| ns as f64 / 1e3 / cycles.max(1.0)),
        scripts_per_cycle: scripts as f64 / cycles.max(1.0),
    })
}

/// The contended run (with the server's command counts around it) and the row.
async fn redis_row<C: Contender>(
    label: &'static str,
    ours: bool,
    c: &Arc<C>,
    probe: &mut server::Probe,
    plan: Plan,
    tag: &str,
    uncontended: Option<Uncontended>,
) -> Result<RedisRow, String> {
    eprintln!("redis: {label}, contended ...");
    let before = probe.command_calls().await?;
    let contended = scenario::contended(c, &format!("bench:{tag}:hot"), CONTENDERS, plan.redis_contended).await?;
    let after = probe.command_calls().await?;
    let (commands, per_command) = server::delta(&before, &after);
    let acquisitions = contended.acquisitions_total.max(1) as f64;
    Ok(RedisRow {
        label,
        ours,
        one: uncontended.map(|u| Cycles { per_sec: u.one }),
        many: uncontended.map(|u| Cycles { per_sec: u.many }),
        server_us_per_cycle: uncontended.map(|u| u.server_us_per_cycle),
        client_us_per_cycle: uncontended.and_then(|u| u.client_us_per_cycle),
        scripts_per_cycle: uncontended.map(|u| u.scripts_per_cycle),
        contended,
        commands_per_acquisition: commands as f64 / acquisitions,
        per_command: per_command.into_iter().map(|(k, v)| (k, v as f64 / acquisitions)).collect(),
    })
}

/// Rounds of the in-memory uncontended runs (best kept).
const MEMORY_ROUNDS: usize = 7;

fn keep_best(best: &mut (f64, f64), got: (f64, f64)) {
    best.0 = best.0.max(got.0);
    best.1 = best.1.max(got.1);
}

/// One window of 1 task and one of `MANY` tasks: cycles per second of each.
async fn uncontended<C: Contender>(c: &Arc<C>, plan: Plan, warm: bool) -> Result<(f64, f64), String> {
    let one_key = keys("mem:one:", 1);
    if warm {
        scenario::cycles(c, &one_key, plan.warm, Clock::Cpu).await?;
    }
    let one: Cycles = scenario::cycles(c, &one_key, plan.memory_cycles, Clock::Cpu).await?;
    let many: Cycles = scenario::cycles(c, &keys("mem:many:", MANY), plan.memory_cycles, Clock::Cpu).await?;
    Ok((one.per_sec, many.per_sec))
}

async fn memory_row<C: Contender>(
    label: &'static str,
    ours: bool,
    c: &Arc<C>,
    (one, many): (f64, f64),
    plan: Plan,
) -> Result<MemoryRow, String> {
    eprintln!("memory: {label}, contended ...");
    let contended: Contended = scenario::contended(c, "mem:hot", CONTENDERS, plan.memory_contended).await?;
    Ok(MemoryRow { label, ours, one: Cycles { per_sec: one }, many: Cycles { per_sec: many }, contended })
}
