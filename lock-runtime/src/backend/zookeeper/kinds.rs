#![doc = include_str!("kinds.md")]

use super::recipe::{mutex_tag, suffix_sequence};
use crate::backend::{Acquire, LockKind};
use crate::error::LockError;

/// The suffix of a kind's container name (after the encoded key): none for the mutex.
pub(super) fn dir_suffix(kind: LockKind) -> &'static str {
    match kind {
        LockKind::Read | LockKind::Write => ".rw",
        LockKind::Semaphore { .. } => ".sem",
        _ => "",
    }
}

/// The tag of an acquisition's node: its name before `-<sequence>`.
pub(super) fn tag(kind: LockKind, owner: &str) -> String {
    match kind {
        LockKind::Read => format!("read-{owner}"),
        LockKind::Write => format!("write-{owner}"),
        LockKind::Semaphore { permits } => format!("sem{permits}-{owner}"),
        _ => mutex_tag(owner),
    }
}

/// What a node of a kind's container is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Role {
    Read,
    Write,
    /// A permit holder or waiter, with the permits it asked for.
    Permit(u32),
}

/// The role and sequence number of a node of a kind's container; `None` for anything else.
pub(super) fn role(child: &str) -> Option<(Role, i64)> {
    let seq = suffix_sequence(child)?;
    if child.starts_with("read-") {
        Some((Role::Read, seq))
    } else if child.starts_with("write-") {
        Some((Role::Write, seq))
    } else {
        let (permits, _) = child.strip_prefix("sem")?.split_once('-')?;
        Some((Role::Permit(permits.parse().ok()?), seq))
    }
}

/// The nodes of a kind's container, lowest sequence first.
pub(super) fn queue(children: Vec<String>) -> Vec<(i64, String)> {
    let mut nodes: Vec<(i64, String)> =
        children.into_iter().filter_map(|c| role(&c).map(|(_, seq)| (seq, c))).collect();
    nodes.sort_unstable();
    nodes
}

/// Where an acquisition stands, from one listing.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Verdict {
    /// It holds the lock.
    Granted,
    /// Blocked: watch these nodes (by index in the listing); any change may unblock it.
    Blocked(Vec<usize>),
    /// A permit waiter behind another waiter: watch that one, which records its grant (a data
    /// change) when it is granted. If it already did, look again at once.
    Behind(usize),
}

/// The verdict for the acquisition of `kind` whose node is at `index` of `nodes` (lowest first).
pub(super) fn verdict(req: &Acquire, index: usize, nodes: &[(i64, String)]) -> Result<Verdict, LockError> {
    let ahead = nodes.get(..index).unwrap_or_default();
    match req.kind {
        LockKind::Read => {
            let writer = ahead.iter().rposition(|(_, n)| matches!(role(n), Some((Role::Write, _))));
            Ok(writer.map_or(Verdict::Granted, |w| Verdict::Blocked(vec![w])))
        }
        LockKind::Semaphore { permits } => {
            let disagrees = ahead.iter().find_map(|(_, n)| match role(n) {
                Some((Role::Permit(p), _)) if p != permits => Some(p),
                _ => None,
            });
            if let Some(other) = disagrees {
                return Err(LockError::invalid(
                    &*req.name,
                    format!(
                        "the semaphore is held or waited for with {other} permits; this call asked for {permits}: \
                         every holder of a semaphore must give the same number of permits"
                    ),
                ));
            }
            let permits = usize::try_from(permits).unwrap_or(usize::MAX);
            if index < permits {
                Ok(Verdict::Granted)
            } else if index == permits {
                Ok(Verdict::Blocked((0..permits).collect()))
            } else {
                Ok(Verdict::Behind(index - 1))
            }
        }
        // A writer (and the mutex): only the lowest node holds.
        _ if index == 0 => Ok(Verdict::Granted),
        _ => Ok(Verdict::Blocked(vec![index - 1])),
    }
}

/// Whether the node at `index` of `nodes` (a kind's container, lowest first) holds the lock of
/// `kind`.
pub(super) fn holds(kind: LockKind, index: usize, nodes: &[(i64, String)]) -> bool {
    let role_at = |i: usize| nodes.get(i).and_then(|(_, n)| role(n)).map(|(r, _)| r);
    match (kind, role_at(index)) {
        (LockKind::Exclusive, _) => index == 0,
        (LockKind::Semaphore { permits }, _) => index < usize::try_from(permits).unwrap_or(usize::MAX),
        (_, Some(Role::Write)) => index == 0,
        (_, Some(Role::Read)) => !(0..index).any(|i| role_at(i) == Some(Role::Write)),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::backend::{Holder, Lease, OwnerId};

    fn req(kind: LockKind) -> Acquire {
        Acquire {
            name: Arc::from("n"),
            key: Arc::from("n"),
            owner: OwnerId::next(),
            holder: Holder::of_process(None),
            lease: Lease::Renewed(std::time::Duration::from_secs(1)),
            kind,
        }
    }

    fn nodes(names: &[&str]) -> Vec<(i64, String)> {
        queue(names.iter().enumerate().map(|(i, n)| format!("{n}-o-{i:010}")).collect())
    }

    #[test]
    fn names_carry_the_role_and_the_permits() {
        let owner = OwnerId::next().to_string();
        for (kind, role_) in [
            (LockKind::Read, Role::Read),
            (LockKind::Write, Role::Write),
            (LockKind::Semaphore { permits: 12 }, Role::Permit(12)),
        ] {
            assert_eq!(role(&format!("{}-0000000042", tag(kind, &owner))), Some((role_, 42)));
        }
        assert_eq!(role(&format!("{}-0000000042", tag(LockKind::Exclusive, &owner))), None);
        assert_ne!(dir_suffix(LockKind::Read), dir_suffix(LockKind::Semaphore { permits: 1 }));
        assert_eq!(dir_suffix(LockKind::Read), dir_suffix(LockKind::Write));
    }

    #[test]
    fn readers_wait_only_for_lower_writers_and_writers_for_their_predecessor() {
        let line = nodes(&["read", "read", "write", "read", "read", "write"]);
        let read = req(LockKind::Read);
        assert_eq!(verdict(&read, 1, &line).ok(), Some(Verdict::Granted));
        assert_eq!(verdict(&read, 3, &line).ok(), Some(Verdict::Blocked(vec![2])));
        assert_eq!(verdict(&read, 4, &line).ok(), Some(Verdict::Blocked(vec![2])));
        let write = req(LockKind::Write);
        assert_eq!(verdict(&write, 2, &line).ok(), Some(Verdict::Blocked(vec![1])));
        assert_eq!(verdict(&write, 5, &line).ok(), Some(Verdict::Blocked(vec![4])));
        assert_eq!(verdict(&write, 0, &nodes(&["write"])).ok(), Some(Verdict::Granted));
        let holding: Vec<bool> = (0..line.len()).map(|i| holds(LockKind::Read, i, &line)).collect();
        assert_eq!(holding, [true, true, false, false, false, false]);
        let writer_first = nodes(&["write", "read"]);
        assert!(holds(LockKind::Write, 0, &writer_first) && !holds(LockKind::Read, 1, &writer_first));
    }

    #[test]
    fn permits_are_positions_and_must_agree() {
        let line = nodes(&["sem2", "sem2", "sem2", "sem2"]);
        let sem = req(LockKind::Semaphore { permits: 2 });
        assert_eq!(verdict(&sem, 1, &line).ok(), Some(Verdict::Granted));
        assert_eq!(verdict(&sem, 2, &line).ok(), Some(Verdict::Blocked(vec![0, 1])));
        assert_eq!(verdict(&sem, 3, &line).ok(), Some(Verdict::Behind(2)));
        let mixed = nodes(&["sem2", "sem3"]);
        let err = verdict(&req(LockKind::Semaphore { permits: 3 }), 1, &mixed).expect_err("disagrees");
        assert!(err.is_invalid() && err.to_string().contains("permits"), "{err}");
        // A later node that disagrees is refused by its own listing, not ours.
        assert_eq!(verdict(&sem, 0, &mixed).ok(), Some(Verdict::Granted));
    }
}
