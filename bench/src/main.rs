//! lock-runtime against its peers, in one run, on one local `redis-server`.
//!
//! ```text
//! scripts/bench                                    # the one command: starts redis, builds, runs, charts
//! lock-bench --port 6379 --out bench [--quick]     # what it runs (a redis-server must listen on --port)
//! ```
//!
//! Prints the table, writes `RESULTS.md` and `chart.svg` into `--out`.

mod contenders;
mod report;
mod scenario;
mod server;

#[cfg(feature = "attribute")]
mod attribute;

use std::sync::Arc;
use std::time::Duration;

use contenders::{Contender, KeyedMap, Naive, Ours, Rslock, TokioMutex};
use report::{Machine, MemoryRow, RedisRow, Results};
use scenario::{keys, Contended, Cycles};

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
    attribute_round: Duration,
}

impl Plan {
    fn full() -> Self {
        Plan {
            warm: Duration::from_millis(200),
            redis_cycles: Duration::from_millis(1500),
            redis_contended: Duration::from_secs(4),
            memory_cycles: Duration::from_secs(1),
            memory_contended: Duration::from_secs(2),
            ceiling_requests: 200_000,
            attribute_round: Duration::from_millis(500),
        }
    }

    fn quick() -> Self {
        Plan {
            warm: Duration::from_millis(50),
            redis_cycles: Duration::from_millis(300),
            redis_contended: Duration::from_secs(1),
            memory_cycles: Duration::from_millis(200),
            memory_contended: Duration::from_millis(300),
            ceiling_requests: 20_000,
            attribute_round: Duration::from_millis(100),
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
}

fn args() -> Result<Args, String> {
    let mut a = Args { port: 6379, out: "bench".into(), quick: false };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        match arg.as_str() {
            "--port" => a.port = it.next().and_then(|p| p.parse().ok()).ok_or("--port needs a number")?,
            "--out" => a.out = it.next().ok_or("--out needs a directory")?.into(),
            "--quick" => a.quick = true,
            other => return Err(format!("unknown argument {other:?} (use --port N --out DIR [--quick])")),
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

async fn run(args: Args) -> Result<(), String> {
    let plan = if args.quick { Plan::quick() } else { Plan::full() };
    let url = format!("redis://127.0.0.1:{}/", args.port);
    let mut probe = server::Probe::connect(&url).await?;
    let machine = Machine::detect(probe.version().await?);
    eprintln!("machine: {}", machine.line());

    // ---------------------------------------------------------------- Redis
    let mut redis_rows = Vec::new();
    #[cfg(feature = "ours-redis")]
    {
        let ours = Arc::new(Ours::redis(&url).await?);
        redis_rows.push(redis_row("lock-runtime (redis)", true, &ours, &mut probe, plan, "ours", true).await?);
    }
    let rslock = Arc::new(Rslock::new(&url));
    redis_rows.push(redis_row("rslock 0.10 (defaults)", false, &rslock, &mut probe, plan, "rslock", true).await?);
    let naive1 = Arc::new(Naive::new(&url, Duration::from_millis(1)).await?);
    redis_rows.push(redis_row("naive SET NX PX, 1 ms sleep", false, &naive1, &mut probe, plan, "naive1", true).await?);
    let naive10 = Arc::new(Naive::new(&url, Duration::from_millis(10)).await?);
    redis_rows.push(redis_row("naive SET NX PX, 10 ms sleep", false, &naive10, &mut probe, plan, "naive10", false).await?);

    eprintln!("redis-benchmark EVALSHA, 50 clients ...");
    let sha = probe.script_load(server::CEILING_SCRIPT).await?;
    let ceiling = server::ceiling(args.port, &sha, plan.ceiling_requests)?;

    // ---------------------------------------------------------------- memory
    let mut memory_rows = Vec::new();
    memory_rows.push(memory_row("lock-runtime (memory)", true, &Arc::new(Ours::memory()), plan).await?);
    memory_rows.push(memory_row("tokio::sync::Mutex (one per name)", false, &Arc::new(TokioMutex::new(MANY)), plan).await?);
    memory_rows.push(memory_row("DashMap<String, Arc<Mutex<()>>>", false, &Arc::new(KeyedMap::default()), plan).await?);

    // ---------------------------------------------------------------- attribute
    #[cfg(feature = "attribute")]
    let attribute = Some(attribute::overhead(plan.attribute_round).await?);
    #[cfg(not(feature = "attribute"))]
    let attribute: Option<report::Attribute> = None;

    let results = Results {
        machine,
        quick: args.quick,
        redis: redis_rows,
        ceiling_rps: ceiling,
        memory: memory_rows,
        attribute,
        ours_redis_built: cfg!(feature = "ours-redis"),
    };
    println!("{}", results.text());
    std::fs::create_dir_all(&args.out).map_err(|e| format!("{}: {e}", args.out.display()))?;
    let md = args.out.join("RESULTS.md");
    std::fs::write(&md, results.markdown()).map_err(|e| format!("{}: {e}", md.display()))?;
    let svg = args.out.join("chart.svg");
    std::fs::write(&svg, results.svg()).map_err(|e| format!("{}: {e}", svg.display()))?;
    eprintln!("wrote {} and {}", md.display(), svg.display());
    Ok(())
}

async fn redis_row<C: Contender>(
    label: &'static str,
    ours: bool,
    c: &Arc<C>,
    probe: &mut server::Probe,
    plan: Plan,
    tag: &str,
    uncontended: bool,
) -> Result<RedisRow, String> {
    eprintln!("redis: {label} ...");
    let one_key = keys(&format!("bench:{tag}:one:"), 1);
    scenario::cycles(c, &one_key, plan.warm).await?;
    let (one, many) = if uncontended {
        let one = scenario::cycles(c, &one_key, plan.redis_cycles).await?;
        let many = scenario::cycles(c, &keys(&format!("bench:{tag}:many:"), MANY), plan.redis_cycles).await?;
        (Some(one), Some(many))
    } else {
        (None, None)
    };
    let before = probe.command_calls().await?;
    let contended = scenario::contended(c, &format!("bench:{tag}:hot"), CONTENDERS, plan.redis_contended).await?;
    let after = probe.command_calls().await?;
    let (commands, per_command) = server::delta(&before, &after);
    let acquisitions = contended.acquisitions_total.max(1) as f64;
    Ok(RedisRow {
        label,
        ours,
        one,
        many,
        contended,
        commands_per_acquisition: commands as f64 / acquisitions,
        per_command: per_command.into_iter().map(|(k, v)| (k, v as f64 / acquisitions)).collect(),
    })
}

async fn memory_row<C: Contender>(label: &'static str, ours: bool, c: &Arc<C>, plan: Plan) -> Result<MemoryRow, String> {
    eprintln!("memory: {label} ...");
    let one_key = keys("mem:one:", 1);
    scenario::cycles(c, &one_key, plan.warm).await?;
    let one: Cycles = scenario::cycles(c, &one_key, plan.memory_cycles).await?;
    let many: Cycles = scenario::cycles(c, &keys("mem:many:", MANY), plan.memory_cycles).await?;
    let contended: Contended = scenario::contended(c, "mem:hot", CONTENDERS, plan.memory_contended).await?;
    Ok(MemoryRow { label, ours, one, many, contended })
}
