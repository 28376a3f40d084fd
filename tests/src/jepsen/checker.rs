//! STAND-IN (replaced on merge): a minimal checker of a fault run's history.

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use super::history::{Event, Record, WriteOutcome};

/// What the checker is given.
#[derive(Debug)]
pub struct CheckInput<'a> {
    /// `redis` or `zookeeper`.
    pub backend: &'a str,
    /// The whole history, in time order.
    pub records: &'a [Record],
    /// The witness's accepted writes per name, `(token, value)`, in order.
    pub witness: &'a BTreeMap<String, Vec<(u64, u64)>>,
    /// How much longer than its `wait` an acquisition may take.
    pub wait_slack: Duration,
    /// How long a free lock may stay free while someone waits for it.
    pub handoff_bound: Duration,
}

/// The checker's verdict.
#[derive(Debug, Default)]
pub struct Report {
    ops: usize,
    violations: Vec<String>,
    faults: BTreeMap<String, usize>,
}

impl Report {
    /// Every violated property, one line each.
    pub fn violations(&self) -> &[String] {
        &self.violations
    }

    /// Overlaps by class.
    pub fn overlap_classes(&self) -> Vec<(String, usize)> {
        Vec::new()
    }

    /// Faults by kind.
    pub fn faults(&self) -> Vec<(String, usize)> {
        self.faults.iter().map(|(k, n)| (k.clone(), *n)).collect()
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "stand-in report: {} operations, faults {:?}, {} violations",
            self.ops,
            self.faults,
            self.violations.len()
        )
    }
}

/// Checks a run (stand-in: the witness logs count up by one with non-decreasing tokens, every
/// accepted write is in them, and every exit is clean).
pub fn check(input: &CheckInput<'_>) -> Report {
    let mut report = Report::default();
    let mut accepted = 0;
    for r in input.records {
        match &r.event {
            Event::Acquire { .. } => report.ops += 1,
            Event::Fault { kind, start: true, .. } => *report.faults.entry(kind.clone()).or_default() += 1,
            Event::Write { outcome: WriteOutcome::Accepted, .. } => accepted += 1,
            Event::Exit { alive_tasks } if *alive_tasks != 0 => {
                report.violations.push(format!("{} exited with {alive_tasks} tasks alive", r.actor));
            }
            _ => {}
        }
    }
    let mut logged = 0;
    for (name, log) in input.witness {
        logged += log.len();
        for (i, pair) in log.windows(2).enumerate() {
            if pair[1].1 != pair[0].1 + 1 || pair[1].0 < pair[0].0 {
                report.violations.push(format!(
                    "{name}: witness log entry {} {:?} after {:?}",
                    i + 1,
                    pair[1],
                    pair[0]
                ));
            }
        }
    }
    if logged != accepted {
        report.violations.push(format!("{accepted} writes accepted in the history, {logged} in the witness"));
    }
    report
}
