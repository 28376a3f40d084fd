//! `lockctl watch`: the held locks, followed live.
//!
//! - On a terminal: the screen is redrawn in place, one line per held lock, ages and leases
//!   counting every second, a lock that just changed highlighted, and the latest events under
//!   the table ("acquired by …", "released", "waiting: 3").
//! - Piped: one plain line per event, each with its time (UTC, to the millisecond).
//! - `--json`: one JSON document per change, as before.

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use lock_runtime::backend::{ChangeFeed, Inspect, LockInfo};
use serde_json::Value;

use super::{holder_text, kind_text, list_json, opt, table, waiters_text, Failure};

/// How the views are printed.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Mode {
    /// One JSON line per change.
    Json,
    /// One plain line per event (standard output is not a terminal).
    Lines,
    /// The screen redrawn in place (standard output is a terminal).
    Screen,
}

/// How many events the screen keeps under the table.
const EVENTS_SHOWN: usize = 10;
/// How often the screen is redrawn when nothing changed (ages and leases count on).
const TICK: Duration = Duration::from_secs(1);

/// Prints the locks, then follows them (see the module docs); stops after `count` changes (the
/// first view included).
pub(crate) async fn watch(
    store: &dyn Inspect,
    prefix: &str,
    interval: Duration,
    count: Option<u64>,
    mode: Mode,
    mut print: impl FnMut(&str) -> Result<(), Failure>,
) -> Result<(), Failure> {
    let mut changes = store.changes(prefix).await?;
    let mut last: Option<Vec<LockInfo>> = None;
    let mut events: Vec<String> = Vec::new();
    let mut shown = 0u64;
    loop {
        let locks = store.list(prefix).await?;
        let changed = last.as_deref().is_none_or(|before| identity(before) != identity(&locks));
        if changed {
            shown += 1;
            let now = clock();
            let new_events = match &last {
                Some(before) => happened(before, &locks),
                None => locks
                    .iter()
                    .map(|l| format!("held `{}` by {} (token {})", l.key, holder_text(l), opt(l.fencing_token)))
                    .collect(),
            };
            match mode {
                Mode::Json => print(&format!("{}\n", list_json(store, &locks)))?,
                Mode::Lines => {
                    let mut text = String::new();
                    if new_events.is_empty() && last.is_none() {
                        text.push_str(&format!("{now} no lock held\n"));
                    }
                    for event in &new_events {
                        text.push_str(&format!("{now} {event}\n"));
                    }
                    print(&text)?;
                }
                Mode::Screen => {
                    events.extend(new_events.iter().map(|e| format!("{now} {e}")));
                    let skip = events.len().saturating_sub(EVENTS_SHOWN);
                    events.drain(..skip);
                }
            }
        }
        if mode == Mode::Screen {
            let fresh: Vec<&str> = match (&last, changed) {
                (Some(before), true) => changed_keys(before, &locks),
                (None, _) | (_, false) => Vec::new(),
            };
            print(&screen(store, prefix, &locks, &fresh, &events))?;
        }
        last = Some(locks);
        if changed && count.is_some_and(|n| shown >= n) {
            return Ok(());
        }
        // The screen is redrawn every second, for the ages and leases.
        let tick = async {
            match mode {
                Mode::Screen => tokio::time::sleep(TICK).await,
                Mode::Json | Mode::Lines => std::future::pending().await,
            }
        };
        tokio::select! {
            next = next_change(&mut *changes, interval) => next?,
            () = tick => {}
        }
    }
}

/// Waits for the next reason to look again: the store's announcement of a change, or
/// `interval` when the store does not announce every change.
async fn next_change(changes: &mut dyn ChangeFeed, interval: Duration) -> Result<(), Failure> {
    if changes.complete() {
        return Ok(changes.changed().await?);
    }
    tokio::select! {
        changed = changes.changed() => Ok(changed?),
        _ = tokio::time::sleep(interval) => Ok(()),
    }
}

/// What makes a view change (the ages and leases always do; they do not count).
fn identity(locks: &[LockInfo]) -> Vec<Value> {
    locks.iter().map(change_key).collect()
}

fn change_key(info: &LockInfo) -> Value {
    serde_json::json!([
        info.key,
        info.owner,
        info.fencing_token,
        info.waiters,
        info.waited_on,
        info.subscribers,
        info.queued,
        info.unclaimed
    ])
}

/// The events between two views: a lock acquired (or taken over), released, its waiters.
fn happened(before: &[LockInfo], after: &[LockInfo]) -> Vec<String> {
    let by_key = |locks: &[LockInfo]| {
        let mut map: BTreeMap<String, Vec<LockInfo>> = BTreeMap::new();
        for l in locks {
            map.entry(l.key.clone()).or_default().push(l.clone());
        }
        map
    };
    let (before, after) = (by_key(before), by_key(after));
    let mut events = Vec::new();
    for (key, now) in &after {
        let was = before.get(key).map(Vec::as_slice).unwrap_or_default();
        for l in now.iter().filter(|l| !was.iter().any(|w| w.owner == l.owner)) {
            events.push(format!(
                "acquired `{key}` ({}) by {} (token {})",
                kind_text(l),
                holder_text(l),
                opt(l.fencing_token)
            ));
        }
        for w in was.iter().filter(|w| !now.iter().any(|l| l.owner == w.owner)) {
            events.push(format!("released `{key}` by {}", holder_text(w)));
        }
        let waiting = |locks: &[LockInfo]| locks.first().map(|l| (l.waiters, l.queued, l.waited_on));
        if !was.is_empty() && waiting(was) != waiting(now) {
            if let Some(l) = now.first() {
                events.push(format!("waiting on `{key}`: {}", waiters_text(l)));
            }
        }
    }
    for (key, was) in &before {
        if !after.contains_key(key) {
            for w in was {
                events.push(format!("released `{key}` by {}", holder_text(w)));
            }
        }
    }
    events
}

/// The keys whose holders or waiters changed between two views.
fn changed_keys<'a>(before: &[LockInfo], after: &'a [LockInfo]) -> Vec<&'a str> {
    after.iter().filter(|l| !before.iter().any(|b| change_key(b) == change_key(l))).map(|l| l.key.as_str()).collect()
}

/// The whole screen: cleared, a heading, the table (changed rows highlighted), the events.
fn screen(store: &dyn Inspect, prefix: &str, locks: &[LockInfo], fresh: &[&str], events: &[String]) -> String {
    let mut out = String::from("\x1b[H\x1b[2J");
    let shown_prefix = if prefix.is_empty() { "every lock".to_owned() } else { format!("prefix `{prefix}`") };
    out.push_str(&format!("lockctl watch: {} ({shown_prefix}), {} UTC; ctrl-c to stop\n\n", store.store(), clock()));
    let rows = table(locks);
    for (i, line) in rows.lines().enumerate() {
        let highlighted = i > 0 && locks.get(i - 1).is_some_and(|l| fresh.contains(&l.key.as_str()));
        if highlighted {
            out.push_str(&format!("\x1b[7m{line}\x1b[0m\n"));
        } else {
            out.push_str(line);
            out.push('\n');
        }
    }
    if !events.is_empty() {
        out.push_str("\nlatest events:\n");
        for event in events {
            out.push_str(&format!("  {event}\n"));
        }
    }
    out
}

/// The time of day, UTC, to the millisecond: `14:03:07.412`.
fn clock() -> String {
    let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default();
    let secs = now.as_secs() % 86_400;
    format!("{:02}:{:02}:{:02}.{:03}", secs / 3600, (secs / 60) % 60, secs % 60, now.subsec_millis())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn held(key: &str, owner: &str, token: u64) -> LockInfo {
        let mut info = LockInfo::new(key, owner);
        info.fencing_token = Some(token);
        info
    }

    #[test]
    fn events_name_what_happened() {
        let a = held("a", "o1", 1);
        let events = happened(&[], std::slice::from_ref(&a));
        assert_eq!(events.len(), 1);
        assert!(events[0].starts_with("acquired `a`") && events[0].contains("token 1"), "{events:?}");
        assert_eq!(happened(std::slice::from_ref(&a), &[]), ["released `a` by unknown (owner o1)"]);
        let taken_over = happened(std::slice::from_ref(&a), &[held("a", "o2", 2)]);
        assert_eq!(taken_over.len(), 2, "{taken_over:?}");
        let mut waited = held("a", "o1", 1);
        waited.waiters = Some(3);
        assert_eq!(happened(std::slice::from_ref(&a), &[waited]), ["waiting on `a`: 3"]);
    }

    #[test]
    fn the_clock_reads_like_a_clock() {
        let text = clock();
        assert_eq!(text.len(), 12, "{text}");
        assert_eq!((&text[2..3], &text[5..6], &text[8..9]), (":", ":", "."), "{text}");
    }
}
