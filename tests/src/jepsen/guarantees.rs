//! The guarantees doc (`GUARANTEES.md` at the workspace root) checked against a run: its one
//! table says, per backend and fault, what holds; a run must not refute a claim.
//!
//! ```text
//! | backend | fault | mutual exclusion | fencing | lost signal | liveness | shown by |
//! |---|---|---|---|---|---|---|
//! | redis | none | holds | holds | holds | holds | `jepsen_redis` |
//! | redis | pause | no: the lease runs out under a paused holder | holds | holds | holds | `jepsen_redis` |
//! ```
//!
//! A cell's verdict is its first word: `holds`, `no` or `n/a` (case-insensitive; markdown
//! emphasis and trailing punctuation ignored); the rest of the cell explains it.

use std::collections::BTreeSet;
use std::fmt;

use super::checker::Report;

/// The table's header, cell by cell.
const HEADER: [&str; 7] = ["backend", "fault", "mutual exclusion", "fencing", "lost signal", "liveness", "shown by"];

/// A cell's verdict.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// `holds`.
    Holds,
    /// `no`.
    No,
    /// `n/a`.
    NotApplicable,
}

impl fmt::Display for Verdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Verdict::Holds => "holds",
            Verdict::No => "no",
            Verdict::NotApplicable => "n/a",
        })
    }
}

/// One row of the table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Row {
    /// `memory`, `redis`, `zookeeper`, ...
    pub backend: String,
    /// `none` or a fault kind (`pause`, `server-restart`, ...).
    pub fault: String,
    /// No two holders at once.
    pub mutual_exclusion: Verdict,
    /// Tokens increase, so a fenced store refuses a stale holder.
    pub fencing: Verdict,
    /// A holder that lost the lock is told (`lost()`).
    pub lost_signal: Verdict,
    /// Waiters get the lock once it is free (within the stated bound).
    pub liveness: Verdict,
    /// The `shown by` cell as written (the tests that show the row).
    pub shown_by: String,
}

/// The cells of a table line (`| a | b |`), or `None` when the line is not one. `\|` is a literal
/// bar inside a cell.
fn cells(line: &str) -> Option<Vec<String>> {
    let line = line.trim();
    let inner = line.strip_prefix('|')?;
    let inner = inner.strip_suffix('|').filter(|i| !i.ends_with('\\')).unwrap_or(inner);
    let inner = inner.replace("\\|", "\u{0}");
    Some(inner.split('|').map(|c| c.replace('\u{0}', "|").trim().to_string()).collect())
}

/// A plain word of a cell: markdown emphasis, code quotes and surrounding punctuation removed,
/// lower case.
fn plain(word: &str) -> String {
    word.trim_matches(|c: char| !c.is_alphanumeric() && c != '/').to_lowercase()
}

fn verdict(cell: &str) -> Option<Verdict> {
    match plain(cell.split_whitespace().next()?).as_str() {
        "holds" => Some(Verdict::Holds),
        "no" => Some(Verdict::No),
        "n/a" => Some(Verdict::NotApplicable),
        _ => None,
    }
}

fn key(cell: &str) -> String {
    cell.trim_matches(|c: char| c == '`' || c == '*' || c == '_' || c.is_whitespace()).to_lowercase()
}

/// Rows of the guarantees table: (backend, fault) -> verdicts. Err on a malformed table (no
/// header, no separator, a row with the wrong number of cells or an unknown verdict, a repeated
/// (backend, fault), no rows).
pub fn parse_table(doc: &str) -> Result<Vec<Row>, String> {
    let lines: Vec<&str> = doc.lines().collect();
    let is_header = |line: &&str| {
        cells(line)
            .is_some_and(|c| c.len() == HEADER.len() && c.iter().zip(HEADER).all(|(c, h)| c.eq_ignore_ascii_case(h)))
    };
    let Some(at) = lines.iter().position(is_header) else {
        return Err(format!("no table with the header `| {} |`", HEADER.join(" | ")));
    };
    let separator = lines.get(at + 1).and_then(|l| cells(l));
    let dashes = |c: &String| {
        let c = c.trim_matches(':');
        !c.is_empty() && c.chars().all(|ch| ch == '-')
    };
    if !separator.is_some_and(|s| s.len() == HEADER.len() && s.iter().all(dashes)) {
        return Err(format!("line {}: the table's header is not followed by a `|---|` separator line", at + 2));
    }
    let mut rows = Vec::new();
    let mut seen = BTreeSet::new();
    for (i, line) in lines.iter().enumerate().skip(at + 2) {
        let Some(c) = cells(line) else { break };
        let n = i + 1;
        if c.len() != HEADER.len() {
            return Err(format!("line {n}: {} cells, expected {}: {line}", c.len(), HEADER.len()));
        }
        let v = |col: usize| {
            verdict(&c[col]).ok_or_else(|| {
                format!("line {n}: the {} cell {:?} starts with neither `holds`, `no` nor `n/a`", HEADER[col], c[col])
            })
        };
        let row = Row {
            backend: key(&c[0]),
            fault: key(&c[1]),
            mutual_exclusion: v(2)?,
            fencing: v(3)?,
            lost_signal: v(4)?,
            liveness: v(5)?,
            shown_by: c[6].clone(),
        };
        if row.backend.is_empty() || row.fault.is_empty() {
            return Err(format!("line {n}: empty backend or fault: {line}"));
        }
        if !seen.insert((row.backend.clone(), row.fault.clone())) {
            return Err(format!("line {n}: a second row for ({}, {})", row.backend, row.fault));
        }
        rows.push(row);
    }
    if rows.is_empty() {
        return Err("the guarantees table has no rows".into());
    }
    Ok(rows)
}

/// Whether a `shown by` cell names `test` (as a whole identifier, or as the last segment of a
/// `path::test`).
fn mentions(shown_by: &str, test: &str) -> bool {
    shown_by
        .split(|c: char| !(c.is_alphanumeric() || c == '_' || c == ':'))
        .any(|word| word == test || word.strip_suffix(test).is_some_and(|head| head.ends_with("::")))
}

/// What the run contradicts in the doc: empty when consistent. `test` is the test's name.
///
/// For the report's backend: the `none` row exists; every injected fault kind has a row whose
/// `shown by` names `test`; every observed overlap class (but `unexplained`, a violation of its
/// own) has mutual exclusion `no`; every fault kind a token rule broke under has fencing `no`.
pub fn verify(report: &Report, doc: &str, test: &str) -> Vec<String> {
    let rows = match parse_table(doc) {
        Ok(rows) => rows,
        Err(e) => return vec![format!("GUARANTEES.md: {e}")],
    };
    let backend = report.backend();
    let row = |fault: &str| rows.iter().find(|r| r.backend == backend && r.fault == fault);
    let mut problems = Vec::new();
    let mut missing = BTreeSet::new();
    let mut require = |problems: &mut Vec<String>, fault: &str, why: &str| {
        let found = row(fault);
        if found.is_none() && missing.insert(fault.to_string()) {
            problems.push(format!("GUARANTEES.md has no row for ({backend}, {fault}), though {why}"));
        }
        found
    };
    require(&mut problems, "none", "every backend needs its fault-free row");
    for (kind, n) in report.faults() {
        let why = format!("{test} injected {n} {kind} fault(s)");
        if let Some(r) = require(&mut problems, &kind, &why) {
            if !mentions(&r.shown_by, test) {
                problems.push(format!(
                    "GUARANTEES.md ({backend}, {kind}): `shown by` ({:?}) does not name {test}, which injected {n} \
                     {kind} fault(s)",
                    r.shown_by
                ));
            }
        }
    }
    for (class, n) in report.overlap_classes() {
        if class == "unexplained" {
            continue;
        }
        let why = format!("{test} saw {n} overlapping grant(s) under {class}");
        if let Some(r) = require(&mut problems, &class, &why) {
            if r.mutual_exclusion != Verdict::No {
                problems.push(format!(
                    "GUARANTEES.md ({backend}, {class}): mutual exclusion says `{}`, but {test} saw {n} overlapping \
                     grant(s) under {class}",
                    r.mutual_exclusion
                ));
            }
        }
    }
    for kind in report.fencing_broken_under() {
        let why = format!("{test} saw a token rule break under {kind}");
        if let Some(r) = require(&mut problems, &kind, &why) {
            if r.fencing != Verdict::No {
                problems.push(format!(
                    "GUARANTEES.md ({backend}, {kind}): fencing says `{}`, but {test} saw a token rule break while \
                     {kind} was active",
                    r.fencing
                ));
            }
        }
    }
    problems
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::collections::BTreeMap;
    use std::time::Duration;

    use super::*;
    use crate::jepsen::checker::{check, CheckInput};
    use crate::jepsen::history::parse;

    const DOC: &str = "\
# Guarantees

Some prose | with a bar.

| Backend | Fault | Mutual exclusion | Fencing | Lost signal | Liveness | Shown by |
|---------|:------|---|---|---|---|---|
| redis | none | holds | holds | holds | holds | `jepsen_redis` |
| redis | pause | **No**: the lease runs out under a paused holder | holds, the witness refuses | Holds. | holds | `jepsen_redis`, `jepsen_redis_pause` |
| `redis` | server-restart | no: the key is gone \\| so is the lock | holds | holds | n/a | tests/tests/jepsen.rs::jepsen_redis |
| memory | none | holds | holds | n/a | holds | `jepsen_memory` |

After the table.
";

    #[test]
    fn the_table_is_parsed() {
        let rows = parse_table(DOC).unwrap();
        assert_eq!(rows.len(), 4);
        assert_eq!(rows[1].backend, "redis");
        assert_eq!(rows[1].fault, "pause");
        assert_eq!(
            (rows[1].mutual_exclusion, rows[1].fencing, rows[1].lost_signal, rows[1].liveness),
            (Verdict::No, Verdict::Holds, Verdict::Holds, Verdict::Holds)
        );
        assert_eq!(rows[2].backend, "redis");
        assert_eq!(rows[2].liveness, Verdict::NotApplicable);
        assert_eq!(rows[2].shown_by, "tests/tests/jepsen.rs::jepsen_redis");
        assert_eq!(rows[3].lost_signal, Verdict::NotApplicable);
    }

    #[test]
    fn a_malformed_table_is_an_error() {
        assert!(parse_table("no table here").unwrap_err().contains("no table with the header"));
        let header = "| backend | fault | mutual exclusion | fencing | lost signal | liveness | shown by |\n";
        assert!(parse_table(&format!("{header}| redis | none |")).unwrap_err().contains("separator"));
        let sep = "|---|---|---|---|---|---|---|\n";
        assert!(parse_table(&format!("{header}{sep}")).unwrap_err().contains("no rows"));
        let short = format!("{header}{sep}| redis | none | holds | holds | holds | holds |\n");
        assert!(parse_table(&short).unwrap_err().contains("6 cells, expected 7"));
        let maybe = format!("{header}{sep}| redis | none | maybe | holds | holds | holds | x |\n");
        assert!(parse_table(&maybe).unwrap_err().contains("the mutual exclusion cell \"maybe\""));
        let twice = format!("{header}{sep}| redis | none | holds | holds | holds | holds | x |\n");
        let twice = format!("{twice}| redis | none | holds | holds | holds | holds | x |\n");
        assert!(parse_table(&twice).unwrap_err().contains("a second row for (redis, none)"));
    }

    #[test]
    fn shown_by_must_name_the_test_as_a_whole_word() {
        assert!(mentions("`jepsen_redis`, `jepsen_zk`", "jepsen_redis"));
        assert!(mentions("tests/tests/jepsen.rs::jepsen_redis", "jepsen_redis"));
        assert!(!mentions("`jepsen_redis_pause`", "jepsen_redis"));
        assert!(!mentions("`my_jepsen_redis`", "jepsen_redis"));
    }

    fn checked(history: &str) -> Report {
        let records = parse(history).unwrap();
        let witness = BTreeMap::from([("a".to_string(), vec![(2, 1)])]);
        check(&CheckInput {
            backend: "redis",
            records: &records,
            witness: &witness,
            wait_slack: Duration::from_millis(100),
            handoff_bound: Duration::from_millis(50),
        })
    }

    /// w1 holds token 1 when w2 is granted token 2, with `{FAULT}` in between.
    const OVERLAP: &str = "\
        1000 w1 acquire a 1000
        2000 w1 granted a 1
        {FAULT}
        3000 w2 acquire a 1000
        4000 w2 granted a 2
        4200 w2 write a 2 1 accepted
        4300 w2 release a 2
        5100 w1 release a 1
        9000 w1 exit 0
        9000 w2 exit 0";

    #[test]
    fn a_run_consistent_with_the_doc_passes() {
        let paused = OVERLAP.replace("{FAULT}", "2500 nemesis fault pause w1 start\n4500 nemesis fault pause w1 end");
        let report = checked(&paused);
        assert!(report.violations().is_empty(), "{report}");
        assert_eq!(verify(&report, DOC, "jepsen_redis"), Vec::<String>::new());
        assert_eq!(verify(&report, DOC, "jepsen_redis_pause"), Vec::<String>::new());
        // A fault that caused no overlap needs its row, naming the test, nothing more.
        let restart = OVERLAP
            .replace(
                "{FAULT}",
                "2500 nemesis fault server-restart server start\n2600 nemesis fault server-restart server end",
            )
            .replace("4000 w2 granted", "5200 w2 granted")
            .replace("4200 w2 write", "5300 w2 write")
            .replace("4300 w2 release", "5400 w2 release");
        let report = checked(&restart);
        assert!(report.overlaps().is_empty(), "{report}");
        assert_eq!(verify(&report, DOC, "jepsen_redis"), Vec::<String>::new());
    }

    #[test]
    fn a_run_refuting_the_doc_is_reported() {
        let paused = OVERLAP.replace("{FAULT}", "2500 nemesis fault pause w1 start\n4500 nemesis fault pause w1 end");
        let paused = checked(&paused);
        // The doc claims mutual exclusion holds under a pause.
        let claims = DOC.replace("**No**: the lease", "holds: the lease");
        let problems = verify(&paused, &claims, "jepsen_redis");
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert!(problems[0].contains("(redis, pause): mutual exclusion says `holds`"), "{problems:?}");
        // The test is not named for a fault it injected.
        let problems = verify(&paused, DOC, "jepsen_other");
        assert!(problems[0].contains("does not name jepsen_other"), "{problems:?}");
        // No row for a fault kind (reported once, not again for the overlap under it).
        let partitioned = OVERLAP.replace("{FAULT}", "2500 nemesis fault partition w1 start");
        let problems = verify(&checked(&partitioned), DOC, "jepsen_redis");
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert!(problems[0].contains("no row for (redis, partition)"), "{problems:?}");
        // No `none` row for the backend.
        let problems = verify(&paused, &DOC.replace("| redis | none |", "| zookeeper | none |"), "jepsen_redis");
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert!(problems[0].contains("no row for (redis, none)"), "{problems:?}");
        // A malformed doc.
        assert!(verify(&paused, "nothing", "jepsen_redis")[0].starts_with("GUARANTEES.md: no table"));
    }

    #[test]
    fn a_fencing_break_refutes_a_fencing_claim() {
        let history = "\
            1000 w1 acquire a 1000
            2000 w1 granted a 5
            2100 w1 release a 5
            2150 nemesis fault server-restart server start
            2200 w2 acquire a 1000
            2300 w2 granted a 3
            2400 w2 release a 3
            2500 nemesis fault server-restart server end
            9000 w1 exit 0
            9000 w2 exit 0";
        let report = checked(history);
        assert_eq!(report.fencing_broken_under(), vec!["server-restart".to_string()]);
        let problems = verify(&report, DOC, "jepsen_redis");
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert!(problems[0].contains("(redis, server-restart): fencing says `holds`"), "{problems:?}");
        let admits = DOC.replace("so is the lock | holds |", "so is the lock | no: restarted counter |");
        assert_eq!(verify(&report, &admits, "jepsen_redis"), Vec::<String>::new());
    }
}
