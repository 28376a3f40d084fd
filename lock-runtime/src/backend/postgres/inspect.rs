//! PostgreSQL's locks as an inspection tool sees them ([`Inspect`], for `lockctl --postgres`).
//! Locks held on carriers (connections shared by many locks) are asked of their holders'
//! processes (see `carrier.rs`). Advisory keys are hashes, so a holder of a session of its own
//! leaves what it is where a tool can read it, at no cost of its own: its grant query starts
//! with a comment naming the owner, the holding process, the kind and the lock's key (hex)
//! (`/* lock-runtime o=… h=… m=mutex k=… */`), which
//! `pg_stat_activity.query` keeps while the session idles, holding the lock; and the token is
//! drawn into the session's `application_name` (`lock-runtime t=<token>`, put back at the
//! release). A tool joins `pg_locks` (granted advisory locks, and the requests waiting on the
//! same key) with `pg_stat_activity`: it needs to see other sessions' queries (a superuser,
//! the holders' own role, or `pg_read_all_stats`). `pg_stat_activity.query` is cut at
//! `track_activity_query_size` (1 kB by default), which a long name's hex passes: the key comes
//! last, so a cut takes only the key, and such a lock is found by its advisory key
//! (`inspect(name)`, an election's `leader()` and `observe()`, `release`) and listed as
//! `advisory:<a>,<b>`. A forced release
//! ends the holder's session (`pg_terminate_backend`, which needs `pg_signal_backend` or the
//! holders' role): the server frees its lock and the holder's `lost()` fires at once.

use std::time::Duration;

use super::{PostgresBackend, KIND};
use crate::backend::inspect::Unannounced;
use crate::backend::{Acquire, BoxFuture, ChangeFeed, ForceRelease, Holder, Inspect, LockInfo, LockKind};
use crate::error::LockError;

/// The comment a grant's query starts with: its owner, the holding process, the kind, and last
/// the lock's key in hex (no `*/` can appear). `pg_stat_activity.query` is cut at
/// `track_activity_query_size` (1 kB by default), and a name's hex may be twice that long: the
/// bounded fields come first, so a cut takes only the key, and the lock is then found by its
/// advisory key.
pub(super) fn record(req: &Acquire) -> String {
    let hex: String = req.key.bytes().map(|b| format!("{b:02x}")).collect();
    let mode = match req.kind {
        LockKind::Read => "read".to_owned(),
        LockKind::Write => "write".to_owned(),
        LockKind::Semaphore { permits } => format!("semaphore n={permits}"),
        _ => "mutex".to_owned(),
    };
    format!("/* lock-runtime o={} h={} m={mode} k={hex} */ ", req.owner, req.holder)
}

/// The token in an `application_name` set at a grant (`<name> t=<token>`).
pub(super) fn token(application_name: &str) -> Option<u64> {
    application_name.rsplit_once(" t=")?.1.parse().ok()
}

/// What a grant's comment says: the key (`None` when the comment was cut inside it), the owner,
/// the holder and the kind.
type Record = (Option<String>, String, Option<Holder>, Option<LockKind>);

/// The [`Record`] in a grant query's comment.
fn parse(query: &str) -> Option<Record> {
    let rest = query.strip_prefix("/* lock-runtime ")?;
    let (inside, whole) = match rest.split_once(" */") {
        Some((inside, _)) => (inside, true),
        None => (rest, false),
    };
    let (mut key, mut owner, mut holder, mut kind, mut permits) = (None, None, None, None, None);
    for field in inside.split(' ') {
        match field.split_once('=') {
            Some(("k", hex)) if whole => {
                let bytes: Option<Vec<u8>> = (0..hex.len() / 2)
                    .map(|i| hex.get(2 * i..2 * i + 2).and_then(|h| u8::from_str_radix(h, 16).ok()))
                    .collect();
                key = bytes.map(|b| String::from_utf8_lossy(&b).into_owned());
            }
            Some(("o", o)) => owner = Some(o.to_owned()),
            Some(("h", h)) => holder = Holder::parse(h),
            Some(("m", m)) => {
                kind = match m {
                    "read" => Some(LockKind::Read),
                    "write" => Some(LockKind::Write),
                    "mutex" => Some(LockKind::Exclusive),
                    "semaphore" => Some(LockKind::Semaphore { permits: 0 }),
                    _ => None,
                }
            }
            Some(("n", n)) => permits = n.parse().ok(),
            _ => {}
        }
    }
    if let (Some(LockKind::Semaphore { .. }), Some(permits)) = (kind, permits) {
        kind = Some(LockKind::Semaphore { permits });
    }
    // Every grant's record names its owner (a carrier's mark, `/* lock-runtime carrier */`,
    // names none: its locks are asked of it instead).
    Some((key, owner?, holder, kind))
}

/// Every granted advisory lock of a lock-runtime session (but a semaphore holder's marker of
/// its permit count, a shared lock beside its permit): pid, application name, query, seconds
/// since the grant, waiters on the same key.
const HELD: &str = "SELECT a.pid::text, coalesce(a.application_name, ''), coalesce(a.query, ''), \
     extract(epoch FROM now() - a.state_change)::float8::text, \
     (SELECT count(*) FROM pg_locks w WHERE w.locktype = 'advisory' AND NOT w.granted \
        AND w.classid = l.classid AND w.objid = l.objid AND w.objsubid = 2)::text, \
     l.classid::text, l.objid::text \
     FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid \
     WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 2 AND a.query LIKE '/* lock-runtime %' \
     AND NOT (l.mode = 'ShareLock' AND a.query LIKE '/* lock-runtime % m=semaphore %')";

/// How a lock whose name is not known is listed: by its advisory key.
fn unnamed((a, b): (i32, i32)) -> String {
    format!("advisory:{a},{b}")
}

/// Where a lock is held.
#[derive(Clone, Copy)]
enum Place {
    /// By a session of its own (its pid).
    Session(i32),
    /// On a carrier (its pid), under an advisory key.
    Carried(i32, (i32, i32)),
}

impl PostgresBackend {
    /// The held locks, with where they are held. A carried lock whose holder did not answer
    /// is listed under its advisory key (`advisory:<a>,<b>`), with no owner.
    async fn held(&self) -> Result<Vec<(Place, LockInfo)>, LockError> {
        let mut locks = Vec::new();
        for row in self.carried().await? {
            let place = Place::Carried(row.pid, row.key);
            let Some((token, age, record)) = row.answer else {
                let mut info = LockInfo::new(unnamed(row.key), String::new());
                info.session_bound = true;
                info.waiters = row.waiters;
                locks.push((place, info));
                continue;
            };
            let Some((key, owner, holder, kind)) = parse(&record) else { continue };
            let key = key.unwrap_or_else(|| unnamed(row.key));
            let mut info = LockInfo::new(key, owner);
            info.holder = holder;
            info.kind = kind;
            info.fencing_token = Some(token);
            info.age = Some(age);
            info.session_bound = true;
            info.waiters = row.waiters;
            locks.push((place, info));
        }
        for row in self.rows(HELD).await? {
            let field = |i: usize| row.get(i).map(String::as_str).unwrap_or_default();
            let Some((key, owner, holder, kind)) = parse(field(2)) else { continue };
            // A name cut with its comment: the lock is listed under its advisory key, which
            // `holders` matches with the name asked for.
            let key = match (key, field(5).parse::<u32>(), field(6).parse::<u32>()) {
                (Some(key), ..) => key,
                (None, Ok(a), Ok(b)) => unnamed((a as i32, b as i32)),
                (None, ..) => continue,
            };
            let mut info = LockInfo::new(key, owner);
            info.holder = holder;
            info.kind = kind;
            info.fencing_token = token(field(1));
            info.age = field(3).parse::<f64>().ok().filter(|s| *s >= 0.0).map(Duration::from_secs_f64);
            info.session_bound = true;
            info.waiters = field(4).parse().ok();
            locks.push((Place::Session(field(0).parse().unwrap_or(0)), info));
        }
        locks.sort_by(|a, b| a.1.key.cmp(&b.1.key));
        Ok(locks)
    }

    /// The holders of `key`: by name, or (a carried lock whose holder did not answer) by its
    /// advisory key.
    async fn holders(&self, key: &str) -> Result<Vec<(Place, LockInfo)>, LockError> {
        let advisory = [super::advisory_key(key), super::advisory_key(&format!("{key}{}", super::RW_SUFFIX))];
        let unnamed = advisory.map(unnamed);
        Ok(self
            .held()
            .await?
            .into_iter()
            .filter_map(|(place, mut info)| {
                if info.key == key {
                    return Some((place, info));
                }
                unnamed.contains(&info.key).then(|| {
                    info.key = key.to_owned();
                    (place, info)
                })
            })
            .collect())
    }
}

impl Inspect for PostgresBackend {
    fn store(&self) -> &'static str {
        KIND
    }

    fn list<'a>(&'a self, prefix: &'a str) -> BoxFuture<'a, Result<Vec<LockInfo>, LockError>> {
        Box::pin(async move {
            Ok(self.held().await?.into_iter().map(|(_, info)| info).filter(|i| i.key.starts_with(prefix)).collect())
        })
    }

    fn inspect<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<Option<LockInfo>, LockError>> {
        Box::pin(async move { Ok(self.holders(key).await?.into_iter().map(|(_, info)| info).next()) })
    }

    fn force_release<'a>(
        &'a self,
        key: &'a str,
        expected_owner: Option<&'a str>,
    ) -> BoxFuture<'a, Result<ForceRelease, LockError>> {
        Box::pin(async move {
            let holders = self.holders(key).await?;
            let Some((place, info)) = (match expected_owner {
                Some(owner) => holders.iter().find(|(_, i)| i.owner == owner).or(holders.first()),
                None => holders.first(),
            }) else {
                return Ok(ForceRelease::NotHeld);
            };
            if expected_owner.is_some_and(|owner| owner != info.owner) && !info.owner.is_empty() {
                return Ok(ForceRelease::OwnerChanged(info.owner.clone()));
            }
            let pid = match *place {
                Place::Session(pid) => pid,
                Place::Carried(pid, advisory) => {
                    // Its holder frees it and fires its `lost()`; one that does not answer has
                    // its carrier's session ended, with every lock on it.
                    return self.force_carried(pid, advisory, expected_owner, &info.owner).await;
                }
            };
            // Ending the holder's session frees its lock (one lock per session) and closes its
            // connection: its `lost()` fires.
            let ended = self.rows(&format!("SELECT pg_terminate_backend({pid})::text")).await?;
            match ended.first().and_then(|r| r.first()).map(String::as_str) {
                Some("true") => Ok(ForceRelease::Released(info.owner.clone())),
                _ => Ok(ForceRelease::NotHeld),
            }
        })
    }

    fn changes<'a>(&'a self, _prefix: &'a str) -> BoxFuture<'a, Result<Box<dyn ChangeFeed>, LockError>> {
        Box::pin(std::future::ready(Ok(Box::new(Unannounced) as Box<dyn ChangeFeed>)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_read_back() {
        let owner = crate::backend::OwnerId::next();
        let holder = Holder::of_process(Some("billing"));
        let req = Acquire {
            name: "order:1".into(),
            key: "app:order:1 */ DROP".into(),
            owner,
            holder: holder.clone(),
            lease: crate::backend::Lease::Fixed(Duration::from_secs(1)),
            kind: LockKind::Exclusive,
        };
        let text = record(&req);
        assert_eq!(text.matches("*/").count(), 1, "{text}");
        let (key, read_owner, read_holder, kind) = parse(&format!("{text}SELECT 1")).expect("parses");
        assert_eq!((key.as_deref(), read_owner), (Some("app:order:1 */ DROP"), owner.to_string()));
        assert_eq!((read_holder, kind), (Some(holder.clone()), Some(LockKind::Exclusive)));
        // Cut at `track_activity_query_size` inside the key: owner, holder and kind kept.
        let cut = &text[..text.find(" k=").expect("the key") + 8];
        let (key, read_owner, read_holder, kind) = parse(cut).expect("parses");
        assert_eq!((key, read_owner), (None, owner.to_string()));
        assert_eq!((read_holder, kind), (Some(holder), Some(LockKind::Exclusive)));
        let reader = record(&Acquire { kind: LockKind::Read, ..req.clone() });
        assert_eq!(parse(&reader).map(|r| r.3), Some(Some(LockKind::Read)));
        let permit = record(&Acquire { kind: LockKind::Semaphore { permits: 3 }, ..req });
        assert_eq!(parse(&permit).map(|r| r.3), Some(Some(LockKind::Semaphore { permits: 3 })));
        assert_eq!(token("lock-runtime t=42"), Some(42));
        assert_eq!(token("my app t=x t=7"), Some(7));
        assert_eq!(token("lock-runtime"), None);
    }
}
