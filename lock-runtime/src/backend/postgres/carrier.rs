//! PostgreSQL's carriers (connections shared by held locks, see `session/carrier.rs`): their
//! statements, and how an inspection learns what they hold.
//!
//! A session-held lock names itself in its session's last query (see `inspect.rs`); a carrier
//! holds many, so its queries only say what it is (`/* lock-runtime carrier */`). An
//! inspection finds carriers' advisory locks in `pg_locks`, then asks their holders: it
//! `NOTIFY`s the channel every carrier listens to (`lock_runtime_ask`, with a nonce), and each
//! carrier's process answers on `lock_runtime_answers`, from that carrier's session (the
//! notification's pid is the carrier's), with one line per held lock: its key, token, age and
//! the same record a session-held lock keeps. Nothing is written per grant; an inspection
//! costs a round trip to the holders' processes. A carrier answers once the attempts on
//! their way when it was asked are answered, so a lock the server showed granted is answered
//! for with its record, or left out when it was freed meanwhile. A forced release asks the same way, and the
//! holder frees the lock and fires its `lost()`; a holder that does not answer within the
//! operation timeout (a paused process) has its carrier's session ended, with every lock on
//! it.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Weak};
use std::time::Duration;

use super::conn::{last_value, Conn, Listener, PgSessions};
use super::sql::PgKey;
use super::{pg_error, KIND, SEQUENCE};
use crate::backend::session::{Carrier, Failure};
use crate::backend::ForceRelease;
use crate::error::LockError;

/// What every carrier query starts with, for `pg_stat_activity`.
pub(super) const MARK: &str = "/* lock-runtime carrier */ ";
/// The channel carriers listen to.
const ASK: &str = "lock_runtime_ask";
/// The channel they answer on.
const ANSWERS: &str = "lock_runtime_answers";
/// How long an answer waits for the attempts on their way (one round trip each).
const SETTLE: Duration = Duration::from_millis(250);
/// Under PostgreSQL's 8000-byte limit of a notification's payload.
const CHUNK: usize = 7000;

/// A key's identity on a carrier.
pub(super) fn id(key: &PgKey) -> u64 {
    let (a, b) = key.key;
    (u64::from(a as u32) << 32) | u64::from(b as u32)
}

/// Takes `key` at once and draws its token.
pub(super) fn try_lock(key: &PgKey) -> String {
    let (a, b) = key.key;
    let shared = if key.shared { "_shared" } else { "" };
    format!("{MARK}SELECT CASE WHEN pg_try_advisory_lock{shared}({a}, {b}) THEN nextval('{SEQUENCE}') END")
}

/// Releases `key`: `t` when the session held it.
pub(super) fn unlock(key: &PgKey) -> String {
    let (a, b) = key.key;
    let shared = if key.shared { "_shared" } else { "" };
    format!("{MARK}SELECT pg_advisory_unlock{shared}({a}, {b})")
}

impl PgSessions {
    /// A carrier: a connection that listens for inspections.
    pub(super) async fn open_carrier_conn(&self, name: &str) -> Result<Conn, LockError> {
        let conn = self.connect_once(name).await?;
        let listen = format!("{MARK}LISTEN {ASK}");
        let bound = self.options.operation_timeout;
        match tokio::time::timeout(bound, conn.client.batch_execute(&listen)).await {
            Ok(Ok(())) => Ok(conn),
            Ok(Err(e)) => Err(pg_error(name, "connect", e)),
            Err(_) => Err(LockError::timed_out(name, KIND, "connect", bound)),
        }
    }
}

/// Answers the inspections of `carrier` while it lives.
pub(super) fn serve(sessions: &Arc<PgSessions>, carrier: Weak<Carrier<PgSessions>>) {
    let Some(mut asked) = carrier.upgrade().and_then(|c| c.conn.take_notifications()) else { return };
    let Ok(runtime) = tokio::runtime::Handle::try_current() else { return };
    let bound = sessions.options.operation_timeout;
    let sessions = Arc::downgrade(sessions);
    runtime.spawn(async move {
        // Ends when the connection does (its sender goes with its task).
        while let Some(request) = asked.recv().await {
            let (Some(carrier), Some(sessions)) = (carrier.upgrade(), sessions.upgrade()) else { break };
            if request.channel() != ASK {
                continue;
            }
            let _ = tokio::time::timeout(bound, answer(&sessions, &carrier, request.payload())).await;
        }
    });
}

/// One request: `ask <nonce>`, or `release <nonce> <a> <b> <owner or ->`.
async fn answer(
    sessions: &PgSessions,
    carrier: &Arc<Carrier<PgSessions>>,
    request: &str,
) -> Result<(), tokio_postgres::Error> {
    let mut words = request.split(' ');
    let (verb, nonce) = (words.next().unwrap_or_default(), words.next().unwrap_or_default());
    let mut payloads = Vec::new();
    match verb {
        "ask" => {
            let mut chunk = String::new();
            // A lock the asker saw granted may still be on its way back to its holder here.
            for held in carrier.held_settled(SETTLE).await {
                let (a, b) = held.key.key;
                let mode = if held.key.shared { 's' } else { 'x' };
                let line =
                    format!("{a} {b} {mode} {} {} {}\n", held.token, held.age.as_millis(), held.key.record.trim_end());
                if line.len() > CHUNK {
                    continue; // a key longer than a notification can carry
                }
                if chunk.len() + line.len() > CHUNK {
                    payloads.push(std::mem::take(&mut chunk));
                }
                chunk.push_str(&line);
            }
            payloads.push(chunk);
        }
        "release" => {
            let (a, b) =
                (words.next().and_then(|w| w.parse::<i32>().ok()), words.next().and_then(|w| w.parse::<i32>().ok()));
            let (Some(a), Some(b)) = (a, b) else { return Ok(()) };
            let owner = words.next().filter(|o| *o != "-").map(str::to_owned);
            let id = (u64::from(a as u32) << 32) | u64::from(b as u32);
            let owned = |key: &PgKey| owner.as_deref().is_none_or(|o| owner_of(&key.record).as_deref() == Some(o));
            let forced = carrier.force(sessions, id, owned).await;
            let said = match forced {
                Some(Ok(true)) => "released".to_owned(),
                Some(_) => "gone".to_owned(),
                None => match carrier.held().into_iter().find(|h| h.key.key == (a, b)) {
                    Some(other) => format!("owner {}", owner_of(&other.key.record).unwrap_or_default()),
                    None => "gone".to_owned(),
                },
            };
            payloads.push(format!("{said}\n"));
        }
        _ => return Ok(()),
    }
    let last = payloads.len().saturating_sub(1);
    let send = format!("{MARK}SELECT pg_notify($1, $2)");
    for (i, chunk) in payloads.into_iter().enumerate() {
        let more = u8::from(i < last);
        let payload = format!("{nonce} {more}\n{chunk}");
        carrier.conn.client.execute(send.as_str(), &[&ANSWERS, &payload]).await?;
    }
    Ok(())
}

/// The owner in a record (`o=…`).
fn owner_of(record: &str) -> Option<String> {
    record.split(' ').find_map(|f| f.strip_prefix("o=")).map(str::to_owned)
}

/// One held lock of a carrier, as its holder answered (`record` is `None` when it did not).
pub(super) struct CarriedRow {
    pub(super) pid: i32,
    pub(super) key: (i32, i32),
    pub(super) shared: bool,
    pub(super) waiters: Option<u64>,
    /// Token, age, record.
    pub(super) answer: Option<(u64, Duration, String)>,
}

/// Every carrier's advisory lock (pid, key halves, shared, waiters on the key).
const CARRIED: &str = "SELECT a.pid::text, l.classid::text, l.objid::text, (l.mode = 'ShareLock')::text, \
     (SELECT count(*) FROM pg_locks w WHERE w.locktype = 'advisory' AND NOT w.granted \
        AND w.classid = l.classid AND w.objid = l.objid AND w.objsubid = 2)::text \
     FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid \
     WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 2 AND a.query LIKE '/* lock-runtime carrier */%'";

/// Runs `f` on the inspections' connection (made, or made again, as needed).
async fn with_listener<T>(
    sessions: &PgSessions,
    f: impl AsyncFnOnce(&mut Listener) -> Result<T, LockError>,
) -> Result<T, LockError> {
    let mut slot = sessions.listener.lock().await;
    if slot.as_ref().is_none_or(|l| l.conn.is_closed()) {
        let conn = sessions.connect_once("").await?;
        let Some(answers) = conn.take_notifications() else {
            return Err(LockError::backend("", KIND, "inspect", "no notifications"));
        };
        *slot = Some(Listener { conn, answers });
    }
    let Some(listener) = slot.as_mut() else { return Err(LockError::backend("", KIND, "inspect", "no listener")) };
    let outcome = f(listener).await;
    if outcome.is_err() {
        *slot = None;
    }
    outcome
}

/// Runs `sql` on the listener: every row's columns as text.
async fn rows(listener: &Listener, sql: &str, bound: Duration) -> Result<Vec<Vec<String>>, LockError> {
    let messages = match tokio::time::timeout(bound, listener.conn.client.simple_query(sql)).await {
        Ok(Ok(messages)) => messages,
        Ok(Err(e)) => return Err(pg_error("", "inspect", e)),
        Err(_) => return Err(LockError::timed_out("", KIND, "inspect", bound)),
    };
    Ok(messages
        .into_iter()
        .filter_map(|m| match m {
            tokio_postgres::SimpleQueryMessage::Row(row) => {
                Some((0..row.len()).map(|i| row.get(i).unwrap_or_default().to_owned()).collect())
            }
            _ => None,
        })
        .collect())
}

/// Sends `request` (with a fresh nonce) to every carrier and collects the answers of the
/// carriers `pids` (each one's lines, in order) until all have answered or the operation
/// timeout passes.
async fn ask(
    listener: &mut Listener,
    request: impl FnOnce(&str) -> String,
    pids: &HashSet<i32>,
    bound: Duration,
) -> Result<HashMap<i32, Vec<String>>, LockError> {
    while listener.answers.try_recv().is_ok() {} // an earlier inspection's late answers
    let nonce = crate::backend::OwnerId::next().to_string();
    let request = request(&nonce).replace('\'', "");
    // Listening only while it asks: answers to other processes' inspections do not pile up
    // in between.
    let notify = format!("LISTEN {ANSWERS}; SELECT pg_notify('{ASK}', '{request}')");
    let _ = last_value(&match tokio::time::timeout(bound, listener.conn.client.simple_query(&notify)).await {
        Ok(Ok(rows)) => rows,
        Ok(Err(e)) => return Err(pg_error("", "inspect", e)),
        Err(_) => return Err(LockError::timed_out("", KIND, "inspect", bound)),
    });
    let mut answered: HashMap<i32, Vec<String>> = HashMap::new();
    let mut done = HashSet::new();
    let deadline = tokio::time::Instant::now() + bound;
    while done.len() < pids.len() {
        let Ok(Some(n)) = tokio::time::timeout_at(deadline, listener.answers.recv()).await else { break };
        let Some((head, body)) = n.payload().split_once('\n') else { continue };
        let Some((their_nonce, more)) = head.split_once(' ') else { continue };
        if n.channel() != ANSWERS || their_nonce != nonce || !pids.contains(&n.process_id()) {
            continue;
        }
        answered.entry(n.process_id()).or_default().extend(body.lines().map(str::to_owned));
        if more == "0" {
            done.insert(n.process_id());
        }
    }
    answered.retain(|pid, _| done.contains(pid));
    match tokio::time::timeout(bound, listener.conn.client.batch_execute(&format!("UNLISTEN {ANSWERS}"))).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => return Err(pg_error("", "inspect", e)),
        Err(_) => return Err(LockError::timed_out("", KIND, "inspect", bound)),
    }
    while listener.answers.try_recv().is_ok() {}
    Ok(answered)
}

/// Every lock held on a carrier, with what its holder answered.
pub(super) async fn carried(sessions: &PgSessions) -> Result<Vec<CarriedRow>, LockError> {
    let bound = sessions.options.operation_timeout;
    with_listener(sessions, async |listener| {
        let mut found = scan(listener, bound).await?;
        if found.is_empty() {
            return Ok(found);
        }
        let pids: HashSet<i32> = found.iter().map(|r| r.pid).collect();
        let answers = ask(listener, |nonce| format!("ask {nonce}"), &pids, bound).await?;
        for row in &mut found {
            let Some(lines) = answers.get(&row.pid) else { continue };
            let mode = if row.shared { "s" } else { "x" };
            row.answer = lines.iter().find_map(|line| {
                let mut parts = line.splitn(6, ' ');
                let (a, b, m) = (parts.next()?, parts.next()?, parts.next()?);
                if a.parse::<i32>().ok()? != row.key.0 || b.parse::<i32>().ok()? != row.key.1 || m != mode {
                    return None;
                }
                let token = parts.next()?.parse().ok()?;
                let age = Duration::from_millis(parts.next()?.parse().ok()?);
                Some((token, age, parts.next()?.to_owned()))
            });
        }
        // A holder answers once the attempts on their way when asked are answered (see
        // `answer`): a lock its answer leaves out was free when it was asked (freed since the
        // scan; taken again after, it is newer than this look). Only a holder that did not
        // answer (a paused process) leaves a lock shown without its record.
        found.retain(|row| row.answer.is_some() || !answers.contains_key(&row.pid));
        Ok(found)
    })
    .await
}

/// Every carrier's advisory lock the server shows granted, none answered for yet.
async fn scan(listener: &Listener, bound: Duration) -> Result<Vec<CarriedRow>, LockError> {
    let mut found = Vec::new();
    for row in rows(listener, CARRIED, bound).await? {
        let field = |i: usize| row.get(i).map(String::as_str).unwrap_or_default();
        let (Ok(pid), Ok(a), Ok(b)) = (field(0).parse::<i32>(), field(1).parse::<u32>(), field(2).parse::<u32>())
        else {
            continue;
        };
        found.push(CarriedRow {
            pid,
            key: (a as i32, b as i32),
            shared: field(3) == "true",
            waiters: field(4).parse().ok(),
            answer: None,
        });
    }
    Ok(found)
}

/// Asks the holder of `key` on carrier `pid` to free it (for `owner`, if given; `shown` is the
/// owner an inspection saw); a holder that does not answer has its carrier's session ended,
/// with every lock on it.
pub(super) async fn force(
    sessions: &PgSessions,
    pid: i32,
    key: (i32, i32),
    owner: Option<&str>,
    shown: &str,
) -> Result<ForceRelease, LockError> {
    let bound = sessions.options.operation_timeout;
    with_listener(sessions, async |listener| {
        let pids = HashSet::from([pid]);
        let owner = owner.unwrap_or("-").replace(' ', "");
        let answers =
            ask(listener, |nonce| format!("release {nonce} {} {} {owner}", key.0, key.1), &pids, bound).await?;
        let Some(said) = answers.get(&pid).and_then(|lines| lines.first().cloned()) else {
            let ended = rows(listener, &format!("SELECT pg_terminate_backend({pid})::text"), bound).await?;
            return Ok(match ended.first().and_then(|r| r.first()).map(String::as_str) {
                Some("true") => {
                    tracing::warn!(
                        pid,
                        "the holder of a carried PostgreSQL lock did not answer: its carrier's session was ended, \
                         with every lock on it"
                    );
                    ForceRelease::Released(shown.to_owned())
                }
                _ => ForceRelease::NotHeld,
            });
        };
        Ok(match said.split_once(' ') {
            _ if said == "released" => ForceRelease::Released(shown.to_owned()),
            Some(("owner", other)) => ForceRelease::OwnerChanged(other.to_owned()),
            _ => ForceRelease::NotHeld,
        })
    })
    .await
}

/// Takes `key` at once on a carrier's connection: its token, or `None` (busy).
pub(super) async fn try_carried(conn: &Conn, key: &PgKey) -> Result<Option<u64>, Failure> {
    match PgSessions::query(conn, &key.name, "attempt", &try_lock(key)).await? {
        None => Ok(None),
        Some(token) => token.parse().map(Some).map_err(|_| {
            Failure::Failed(LockError::backend(&*key.name, KIND, "attempt", "no fencing token in the answer"))
        }),
    }
}

/// Releases `key` on a carrier's connection: `false` when its session did not hold it.
pub(super) async fn unlock_carried(conn: &Conn, key: &PgKey) -> Result<bool, Failure> {
    Ok(PgSessions::query(conn, &key.name, "release", &unlock(key)).await?.as_deref() == Some("t"))
}
