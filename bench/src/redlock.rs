//! Redlock on three local `redis-server`s: ours (`LockManager::redlock`, with fencing tokens)
//! against rslock's Redlock (`rslock::LockManager::new(urls)`), the same loops as the
//! single-server rows: uncontended cycles (1 task, `MANY` tasks on distinct names) and
//! `CONTENDERS` tasks on one name. Printed with the ratios; not part of RESULTS.md.

use std::sync::Arc;
use std::time::Duration;

use crate::contenders::{Contender, Ours, Rslock};
use crate::scenario::{self, keys, Clock, Contended};

/// The figures of one contender.
struct Row {
    one: f64,
    many: f64,
    contended: Contended,
}

async fn measure<C: Contender>(
    c: &Arc<C>,
    tag: &str,
    rounds: usize,
    cycles: Duration,
    contended: Duration,
    tasks: (usize, usize),
) -> Result<Row, String> {
    let (many_tasks, contenders) = tasks;
    let one_key = keys(&format!("bench:redlock:{tag}:one:"), 1);
    let many_keys = keys(&format!("bench:redlock:{tag}:many:"), many_tasks);
    scenario::cycles(c, &one_key, cycles / 2, Clock::Wall).await?; // warm-up
    let (mut one, mut many) = (0.0f64, 0.0f64);
    for _ in 0..rounds {
        one = one.max(scenario::cycles(c, &one_key, cycles, Clock::Wall).await?.per_sec);
        many = many.max(scenario::cycles(c, &many_keys, cycles, Clock::Wall).await?.per_sec);
    }
    let contended = scenario::contended(c, &format!("bench:redlock:{tag}:hot"), contenders, contended).await?;
    Ok(Row { one, many, contended })
}

/// Runs both contenders on `urls` (alternating the uncontended rounds would need both built
/// at once; they are, and each keeps its best of `rounds`) and prints the comparison.
pub async fn run(urls: &[String], quick: bool, many: usize, contenders: usize) -> Result<String, String> {
    let (rounds, cycles, contended) = if quick {
        (2, Duration::from_millis(150), Duration::from_secs(1))
    } else {
        (3, Duration::from_millis(500), Duration::from_secs(4))
    };
    let ours = Arc::new(Ours::redlock(urls).await?);
    let rslock = Arc::new(Rslock::redlock(urls));
    eprintln!("redlock: ours ...");
    let a = measure(&ours, "ours", rounds, cycles, contended, (many, contenders)).await?;
    eprintln!("redlock: rslock ...");
    let b = measure(&rslock, "rslock", rounds, cycles, contended, (many, contenders)).await?;
    let ratio = |x: f64, y: f64| if y > 0.0 { format!("{:.2}x", x / y) } else { "n/a".into() };
    let ms = |d: Duration| format!("{:.2} ms", d.as_secs_f64() * 1e3);
    let mut out = format!("Redlock on {} local redis-servers (ours vs rslock 0.10 Redlock)\n", urls.len());
    out += &format!(
        "{:<28} {:>14} {:>16} {:>14} {:>10} {:>10} {:>9}\n",
        "",
        "1 task cyc/s",
        format!("{many} tasks cyc/s"),
        "hand-offs/s",
        "wait p50",
        "wait p99",
        "fairness"
    );
    for (label, r) in [("lock-runtime (redlock)", &a), ("rslock 0.10 (Redlock)", &b)] {
        out += &format!(
            "{:<28} {:>14.0} {:>16.0} {:>14.0} {:>10} {:>10} {:>9.2}\n",
            label,
            r.one,
            r.many,
            r.contended.handoffs_per_sec,
            ms(r.contended.wait_p50),
            ms(r.contended.wait_p99),
            r.contended.fairness
        );
    }
    out += &format!(
        "ratios ours/rslock: uncontended 1 task {}, {many} tasks {}, contended hand-offs {}\n",
        ratio(a.one, b.one),
        ratio(a.many, b.many),
        ratio(a.contended.handoffs_per_sec, b.contended.handoffs_per_sec)
    );
    Ok(out)
}
