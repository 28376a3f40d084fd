//! The history of a fault run: one record per event, written by the workers (lock operations and
//! what the fenced witness answered) and by the nemesis (faults), read by the checker.
//!
//! One line per record, space separated: `<t_us> <actor> <event> <fields...>`, where `t_us` is
//! microseconds on the run's clock (wall clock since the Unix epoch for process runs, which all
//! share this machine's clock; virtual time since the start for in-process runs) and `actor` is
//! a worker (`w3`), a task of a worker that runs several (`w3.1`, see [`process_of`]) or
//! `nemesis`. Lock names and fault targets contain no spaces.
//!
//! ```text
//! 1763850000000000 w3 acquire jepsen:0 2000          # lock("jepsen:0").wait(2000 ms) starts
//! 1763850000001200 w3 granted jepsen:0 17             # ... returned a guard with token 17
//! 1763850000001300 w5 granted jepsen:1 18 read        # a read lock (also `write`, `permit/<n>`)
//! 1763850000001900 w3 read jepsen:0 17 41             # witness read under token 17: value 41
//! 1763850000002500 w3 write jepsen:0 17 42 accepted   # witness write of 42 under token 17
//! 1763850000002600 w3 release jepsen:0 17             # guard.release() starts
//! 1763850000003100 w3 released jepsen:0 17 ok         # ... and returned Ok
//! 1763850000009000 w4 failed jepsen:0 contended       # an acquisition returned an error
//! 1763850000009000 w4 lost jepsen:0 18                # the guard's lost() fired
//! 1763850000010000 nemesis fault pause w3 start       # a fault begins (kind, target)
//! 1763850000012000 nemesis fault pause w3 end         # ... and ends
//! 1763850000020000 w3 exit 0                          # the worker is done; tokio tasks still alive
//! ```

use std::fmt;
use std::str::FromStr;

/// The worker process an actor belongs to: `w3` for `w3` and for its tasks `w3.0`, `w3.1`, ..
/// (a worker started with `tasks=<n>`). Faults target processes: a kill or a pause of `w3` acts
/// on every task of it.
///
/// ```
/// use lock_tests::jepsen::history::process_of;
///
/// assert_eq!(process_of("w3.1"), "w3");
/// assert_eq!(process_of("w3"), "w3");
/// ```
pub fn process_of(actor: &str) -> &str {
    actor.split_once('.').map_or(actor, |(process, _)| process)
}

/// What a witness read returned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReadOutcome {
    /// Accepted; the stored value.
    Value(u64),
    /// Refused: a higher token was seen before.
    Refused,
    /// The witness could not be asked (it is never faulted, so this is a worker-side failure).
    Error,
}

/// What a witness write returned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WriteOutcome {
    /// Stored.
    Accepted,
    /// Refused: a higher token was seen before.
    Refused,
    /// The witness could not be asked.
    Error,
}

/// What a grant holds: the name alone (a mutex, a term, a write lock) or a share of it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// A mutex or an election's term: no other holder at once.
    Exclusive,
    /// A write lock: no other holder at once.
    Write,
    /// A read lock: beside other readers only.
    Read,
    /// A permit of a semaphore of this many permits: at most that many holders at once.
    Permit(u32),
}

impl Mode {
    /// Whether a holding in this mode and one in `other` may overlap (two readers; two permits,
    /// within their count, which the checker counts).
    pub fn shares_with(self, other: Mode) -> bool {
        matches!((self, other), (Mode::Read, Mode::Read) | (Mode::Permit(_), Mode::Permit(_)))
    }
}

impl fmt::Display for Mode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Mode::Exclusive => Ok(()),
            Mode::Write => f.write_str(" write"),
            Mode::Read => f.write_str(" read"),
            Mode::Permit(n) => write!(f, " permit/{n}"),
        }
    }
}

/// One event of a run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// `acquire <name> <wait_ms>`: an acquisition with this `wait` starts.
    Acquire { name: String, wait_ms: u64 },
    /// `granted <name> <token> [write|read|permit/<n>]`: it returned a guard (of a mutex or a
    /// term when no mode follows).
    Granted { name: String, token: u64, mode: Mode },
    /// `failed <name> <reason>`: it returned an error; reason is `contended`, `backend`, `lost`,
    /// `invalid` or `other`.
    Failed { name: String, reason: String },
    /// `read <name> <token> <value|refused|error>`.
    Read { name: String, token: u64, outcome: ReadOutcome },
    /// `write <name> <token> <value> <accepted|refused|error>`.
    Write { name: String, token: u64, value: u64, outcome: WriteOutcome },
    /// `release <name> <token>`: the holder starts releasing.
    Release { name: String, token: u64 },
    /// `released <name> <token> <ok|error>`.
    Released { name: String, token: u64, ok: bool },
    /// `lost <name> <token>`: the guard's `lost()` fired.
    Lost { name: String, token: u64 },
    /// `fault <kind> <target> <start|end>`: written by the nemesis. Kinds: `kill` (SIGKILL of a
    /// worker; it has no end), `pause` (SIGSTOP .. SIGCONT of a worker), `server-restart`
    /// (lock server killed .. back up), `client-kill` (server-side kill of connections; no end),
    /// `partition` (a worker's traffic black-holed, sockets kept open), `delay` (a worker's
    /// traffic delayed), `session-expiry` (ZooKeeper: a worker black-holed past its session
    /// timeout). Targets: a worker (`w3`) or `server`.
    Fault { kind: String, target: String, start: bool },
    /// `exit <alive_tasks>`: the worker finished its run cleanly; tokio tasks still alive after
    /// its manager was dropped (0 when every background task stopped).
    Exit { alive_tasks: u64 },
}

/// One line of a history.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    /// Microseconds on the run's clock.
    pub t_us: u64,
    /// `w<N>` or `nemesis`.
    pub actor: String,
    /// What happened.
    pub event: Event,
}

impl fmt::Display for Record {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {} ", self.t_us, self.actor)?;
        match &self.event {
            Event::Acquire { name, wait_ms } => write!(f, "acquire {name} {wait_ms}"),
            Event::Granted { name, token, mode } => write!(f, "granted {name} {token}{mode}"),
            Event::Failed { name, reason } => write!(f, "failed {name} {reason}"),
            Event::Read { name, token, outcome } => match outcome {
                ReadOutcome::Value(v) => write!(f, "read {name} {token} {v}"),
                ReadOutcome::Refused => write!(f, "read {name} {token} refused"),
                ReadOutcome::Error => write!(f, "read {name} {token} error"),
            },
            Event::Write { name, token, value, outcome } => {
                let outcome = match outcome {
                    WriteOutcome::Accepted => "accepted",
                    WriteOutcome::Refused => "refused",
                    WriteOutcome::Error => "error",
                };
                write!(f, "write {name} {token} {value} {outcome}")
            }
            Event::Release { name, token } => write!(f, "release {name} {token}"),
            Event::Released { name, token, ok } => {
                write!(f, "released {name} {token} {}", if *ok { "ok" } else { "error" })
            }
            Event::Lost { name, token } => write!(f, "lost {name} {token}"),
            Event::Fault { kind, target, start } => {
                write!(f, "fault {kind} {target} {}", if *start { "start" } else { "end" })
            }
            Event::Exit { alive_tasks } => write!(f, "exit {alive_tasks}"),
        }
    }
}

impl FromStr for Record {
    type Err = String;

    fn from_str(line: &str) -> Result<Self, String> {
        let bad = || format!("malformed history line: {line:?}");
        let fields: Vec<&str> = line.split_whitespace().collect();
        let [t_us, actor, kind, rest @ ..] = fields.as_slice() else { return Err(bad()) };
        let t_us: u64 = t_us.parse().map_err(|_| bad())?;
        let num = |s: &str| s.parse::<u64>().map_err(|_| bad());
        let event = match (*kind, rest) {
            ("acquire", [name, wait]) => Event::Acquire { name: name.to_string(), wait_ms: num(wait)? },
            ("granted", [name, token]) => {
                Event::Granted { name: name.to_string(), token: num(token)?, mode: Mode::Exclusive }
            }
            ("granted", [name, token, mode]) => Event::Granted {
                name: name.to_string(),
                token: num(token)?,
                mode: match *mode {
                    "write" => Mode::Write,
                    "read" => Mode::Read,
                    m => Mode::Permit(m.strip_prefix("permit/").and_then(|n| n.parse().ok()).ok_or_else(bad)?),
                },
            },
            ("failed", [name, reason]) => Event::Failed { name: name.to_string(), reason: reason.to_string() },
            ("read", [name, token, outcome]) => Event::Read {
                name: name.to_string(),
                token: num(token)?,
                outcome: match *outcome {
                    "refused" => ReadOutcome::Refused,
                    "error" => ReadOutcome::Error,
                    v => ReadOutcome::Value(num(v)?),
                },
            },
            ("write", [name, token, value, outcome]) => Event::Write {
                name: name.to_string(),
                token: num(token)?,
                value: num(value)?,
                outcome: match *outcome {
                    "accepted" => WriteOutcome::Accepted,
                    "refused" => WriteOutcome::Refused,
                    "error" => WriteOutcome::Error,
                    _ => return Err(bad()),
                },
            },
            ("release", [name, token]) => Event::Release { name: name.to_string(), token: num(token)? },
            ("released", [name, token, ok]) => Event::Released {
                name: name.to_string(),
                token: num(token)?,
                ok: match *ok {
                    "ok" => true,
                    "error" => false,
                    _ => return Err(bad()),
                },
            },
            ("lost", [name, token]) => Event::Lost { name: name.to_string(), token: num(token)? },
            ("fault", [kind, target, phase]) => Event::Fault {
                kind: kind.to_string(),
                target: target.to_string(),
                start: match *phase {
                    "start" => true,
                    "end" => false,
                    _ => return Err(bad()),
                },
            },
            ("exit", [alive]) => Event::Exit { alive_tasks: num(alive)? },
            _ => return Err(bad()),
        };
        Ok(Record { t_us, actor: actor.to_string(), event })
    }
}

/// Parses a whole history (blank lines and lines starting with `#` are skipped).
pub fn parse(text: &str) -> Result<Vec<Record>, String> {
    text.lines().map(str::trim).filter(|l| !l.is_empty() && !l.starts_with('#')).map(str::parse).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_event_survives_a_round_trip() {
        let text = "1 w3 acquire jepsen:0 2000\n2 w3 granted jepsen:0 17\n3 w3 read jepsen:0 17 41\n\
                    4 w3 read jepsen:0 17 refused\n5 w3 write jepsen:0 17 42 accepted\n\
                    6 w3 release jepsen:0 17\n7 w3 released jepsen:0 17 ok\n8 w4 failed jepsen:0 contended\n\
                    9 w4 lost jepsen:0 18\n10 nemesis fault pause w3 start\n11 w3 exit 0\n\
                    12 w5 granted jepsen:1 19 read\n13 w5 granted jepsen:1 20 write\n\
                    14 w6 granted jepsen:2 21 permit/2\n";
        let records = parse(text).unwrap();
        assert_eq!(records.len(), 14);
        let again: String = records.iter().map(|r| format!("{r}\n")).collect();
        assert_eq!(again, text);
        assert!(parse("1 w3 granted jepsen:0").is_err());
        assert!(parse("x w3 granted jepsen:0 1").is_err());
        assert!(parse("1 w3 granted jepsen:0 1 permit/x").is_err());
    }
}
