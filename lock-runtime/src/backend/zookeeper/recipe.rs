//! The lock recipe's pieces: node names, the queue order, creating an acquisition's node (and
//! finding it again after a lost reply), the lease record in a node's data, and when a waiter
//! may judge a holder's fixed lease over.

use std::sync::Arc;
use std::time::{Duration, Instant};

use zookeeper_client::{Acl, Acls, Client, CreateMode, Error as ZkError, Permission, Stat};

use super::session::wait_connected;
use super::{cut, NODE_PREFIX};
use crate::backend::{Holder, Lease};

/// Added to a holder's fixed lease before a waiter deletes its node: covers a step of the
/// server's wall clock (or a leader change) between the two server timestamps being compared,
/// and the clock rates of the holder and the waiter.
pub const STALE_HOLDER_MARGIN: Duration = Duration::from_secs(1);

/// A lock node this backend created.
#[derive(Debug, Clone)]
pub(super) struct Node {
    pub(super) path: Arc<str>,
    pub(super) seq: i64,
    pub(super) czxid: i64,
    /// The server's clock when it was created (milliseconds since the epoch).
    pub(super) ctime: i64,
    /// A local instant after its creation (when the reply arrived).
    pub(super) seen: Instant,
}

impl Node {
    fn new(path: String, seq: i64, stat: &Stat) -> Self {
        Node { path: Arc::from(path), seq, czxid: stat.czxid, ctime: stat.ctime, seen: crate::clock::now() }
    }
}

/// Percent-encodes a lock key into one znode name: ASCII letters, digits, `_`, `-` and `:` are
/// kept, every other byte (`/`, `.`, `%`, non-ASCII, …) becomes `%XX`.
pub(super) fn encode(key: &str) -> String {
    let mut out = String::with_capacity(key.len());
    for b in key.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b':') {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// The lock key of a container node's name ([`encode`] reversed); `None` if it is not one.
pub(super) fn decode(name: &str) -> Option<String> {
    let bytes = name.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = std::str::from_utf8(bytes.get(i + 1..i + 3)?).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

/// The sequence number of a lock node's name, if it is one of ours.
pub(super) fn sequence(child: &str) -> Option<i64> {
    let rest = child.strip_prefix(NODE_PREFIX)?;
    rest.rsplit_once('-')?.1.parse().ok()
}

/// The lock nodes among `children`, lowest sequence first.
pub(super) fn queue(children: Vec<String>) -> Vec<(i64, String)> {
    let mut nodes: Vec<(i64, String)> = children.into_iter().filter_map(|c| sequence(&c).map(|s| (s, c))).collect();
    nodes.sort_unstable();
    nodes
}

/// The sequence number at the end of any node name of ours (`…-<sequence>`), whatever its kind.
pub(super) fn suffix_sequence(child: &str) -> Option<i64> {
    child.rsplit_once('-')?.1.parse().ok()
}

/// The tag of an exclusive lock's node: its kind's prefix and the owner id. An acquisition's
/// node is named `<tag>-<sequence>` (the owner id makes the tag unique).
pub(super) fn mutex_tag(owner: &str) -> String {
    format!("{NODE_PREFIX}{owner}")
}

/// The node name prefix of an acquisition's node, from its tag ([`mutex_tag`], or a kind's).
pub(super) fn own_prefix(dir: &str, tag: &str) -> String {
    format!("{dir}/{tag}-")
}

pub(super) fn parent(path: &str) -> &str {
    path.rsplit_once('/').map_or(path, |(dir, _)| dir)
}

/// The ACL of lock nodes and containers made by a session authenticated with
/// `ZookeeperOptions::digest_auth`: everything to that identity, reading to everyone.
static OWNED: [Acl; 2] =
    [Acl::new_const(Permission::ALL, "auth", ""), Acl::new_const(Permission::READ, "world", "anyone")];

/// The ACL of the lock nodes and containers a session makes: [`OWNED`] when it is
/// authenticated (`owned`), else everything to everyone.
pub(super) fn node_acls(owned: bool) -> Acls<'static> {
    if owned {
        Acls::new(&OWNED)
    } else {
        Acls::anyone_all()
    }
}

/// Creates the acquisition's node `<tag>-<sequence>` under `dir`, creating parents as needed,
/// both with `acls`; after a lost reply, finds the node by its tag (after a `sync`) instead of
/// creating a second one.
pub(super) async fn create_node(
    client: &Client,
    (root, dir): (&str, &str),
    tag: &str,
    data: &[u8],
    acls: Acls<'static>,
    patience: Duration,
) -> Result<Node, ZkError> {
    let prefix = own_prefix(dir, tag);
    let options = CreateMode::EphemeralSequential.with_acls(acls);
    let mut tries = 0;
    // Set after a connection loss: the create may have happened, look for it before another.
    let mut recovering = false;
    loop {
        tries += 1;
        if recovering {
            wait_connected(client, patience).await?;
            match find_own(client, dir, tag).await {
                Ok(Some(node)) => return Ok(node),
                Ok(None) => recovering = false,
                Err(ref e) if cut(e) && tries < 8 => continue,
                Err(e) => return Err(e),
            }
        }
        match client.create(&prefix, data, &options).await {
            Ok((stat, seq)) => return Ok(Node::new(format!("{prefix}{seq}"), seq.into_i64(), &stat)),
            // No parent yet, or a release just deleted the empty parent: (re)create it.
            Err(ZkError::NoNode) if tries < 8 => make_dir(client, root, dir, acls).await?,
            Err(ref e) if cut(e) && tries < 8 => recovering = true,
            Err(e) => return Err(e),
        }
    }
}

async fn make_dir(client: &Client, root: &str, dir: &str, acls: Acls<'static>) -> Result<(), ZkError> {
    // The container's ACL is what guards its nodes against deletion (a right on the parent).
    let container = CreateMode::Container.with_acls(acls);
    match client.create(dir, &[], &container).await {
        Ok(_) | Err(ZkError::NodeExists) => Ok(()),
        Err(ZkError::NoNode) => {
            client.mkdir(root, &CreateMode::Persistent.with_acls(Acls::anyone_all())).await?;
            match client.create(dir, &[], &container).await {
                Ok(_) | Err(ZkError::NodeExists) => Ok(()),
                Err(e) => Err(e),
            }
        }
        Err(e) => Err(e),
    }
}

/// Finds the node tagged `tag` (the owner id and its kind's prefix) under `dir`, if it exists.
///
/// Used after a connection loss, when a create's reply (or the create itself) may be lost. The
/// client may have reconnected to another server of the ensemble, a follower that has not yet
/// applied the create: a plain listing there would miss the node, and the caller would create a
/// second one, which would then hold its place (and later the lock) for the session's life.
/// So the server is first brought up to date with the leader (`sync`), then listed.
pub(super) async fn find_own(client: &Client, dir: &str, tag: &str) -> Result<Option<Node>, ZkError> {
    match client.sync(dir).await {
        Ok(()) => {}
        Err(ZkError::NoNode) => return Ok(None),
        Err(e) => return Err(e),
    }
    let mine = format!("{tag}-");
    let children = match client.list_children(dir).await {
        Ok(children) => children,
        Err(ZkError::NoNode) => return Ok(None),
        Err(e) => return Err(e),
    };
    for child in children.into_iter().filter(|c| c.starts_with(&mine)) {
        let Some(seq) = suffix_sequence(&child) else { continue };
        let path = format!("{dir}/{child}");
        if let Some(stat) = client.check_stat(&path).await? {
            return Ok(Some(Node::new(path, seq, &stat)));
        }
    }
    Ok(None)
}

/// The fixed lease recorded in a lock node's data.
///
/// A node's data is `;`-separated fields: `holder=<host>/<pid>[/<label>]` (the process that
/// created it, see [`Holder`]), and for a fixed lease `lease_ms=<n>`. A holder that was not
/// granted in the attempt that created its node (it waited) records its grant before it takes
/// the lock: it rewrites the data, adding the field `granted`, on version 0 of the node, so the
/// node's `mtime` is the server's time of the grant and its version becomes 1. (Nodes of older
/// versions have no `holder` field; they parse the same.)
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct LeaseRecord {
    pub(super) lease_ms: u64,
    pub(super) granted: bool,
}

const GRANTED: &str = "granted";

impl LeaseRecord {
    /// The data a new node is created with.
    pub(super) fn initial(lease: Lease, holder: &Holder) -> Vec<u8> {
        match lease {
            Lease::Fixed(d) => format!("holder={holder};lease_ms={}", d.as_millis()).into_bytes(),
            Lease::Renewed(_) => format!("holder={holder}").into_bytes(),
        }
    }

    /// The data of a node whose holder recorded its grant.
    pub(super) fn granted(lease: Duration, holder: &Holder) -> Vec<u8> {
        format!("holder={holder};lease_ms={};{GRANTED}", lease.as_millis()).into_bytes()
    }

    /// The data of a permit holder that waited and has no fixed lease: its grant, recorded so
    /// that the waiter behind it is woken (see the `kinds` module).
    pub(super) fn granted_unleased(holder: &Holder) -> Vec<u8> {
        format!("holder={holder};{GRANTED}").into_bytes()
    }

    /// Whether `data` records a grant (with or without a fixed lease).
    pub(super) fn is_granted(data: &[u8]) -> bool {
        std::str::from_utf8(data).is_ok_and(|text| text.split(';').any(|field| field == GRANTED))
    }

    pub(super) fn parse(data: &[u8]) -> Option<LeaseRecord> {
        let text = std::str::from_utf8(data).ok()?;
        let mut lease_ms = None;
        let mut granted = false;
        for field in text.split(';') {
            if let Some(ms) = field.strip_prefix("lease_ms=") {
                lease_ms = Some(ms.parse().ok()?);
            } else if field == GRANTED {
                granted = true;
            }
        }
        Some(LeaseRecord { lease_ms: lease_ms?, granted })
    }
}

/// The process recorded in a lock node's data (see [`LeaseRecord`]), if any.
pub(super) fn holder_of(data: &[u8]) -> Option<Holder> {
    let text = std::str::from_utf8(data).ok()?;
    text.split(';').find_map(|field| field.strip_prefix("holder=")).and_then(Holder::parse)
}

/// When a waiter may delete the holder's node (with `holder.version` as the expected version):
/// the holder has a fixed lease, and that lease, counted from its grant, plus
/// [`STALE_HOLDER_MARGIN`] has passed.
///
/// - **A recorded grant** (`;granted`): the lease runs from the holder's grant record, stamped
///   by the server (`holder.mtime`). The waiter's own node was created at server time
///   `own.ctime`, which the local clock had passed by `own.seen`; so no two client clocks are
///   compared. The holder took its `granted_at` before it sent the record.
/// - **No record**: either the holder was granted in the attempt that created its node (its
///   lease runs from before that create, so from before it became the lowest node, which is
///   before `lowest_seen`: a local instant after a listing showed it lowest), or it waited and
///   has not recorded its grant yet, and then holds nothing: its record, conditional on version
///   0, fails once the waiter has deleted the node (and the waiter's delete, conditional on
///   version 0, fails once the record is made).
pub(super) fn stale_at(record: LeaseRecord, holder: &Stat, own: &Node, lowest_seen: Instant) -> Option<Instant> {
    let lease = Duration::from_millis(record.lease_ms);
    let start = if record.granted {
        let ahead_ms = holder.mtime.checked_sub(own.ctime)?;
        match u64::try_from(ahead_ms) {
            Ok(ahead) => own.seen.checked_add(Duration::from_millis(ahead))?,
            Err(_) => own.seen.checked_sub(Duration::from_millis(ahead_ms.unsigned_abs())).unwrap_or(own.seen),
        }
    } else {
        lowest_seen
    };
    start.checked_add(lease)?.checked_add(STALE_HOLDER_MARGIN)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::OwnerId;

    #[test]
    fn names_become_one_safe_znode_name() {
        assert_eq!(encode("order:42"), "order:42");
        assert_eq!(encode("a/b"), "a%2Fb");
        assert_eq!(encode(".."), "%2E%2E");
        assert_eq!(encode("100%"), "100%25");
        assert_eq!(encode("é"), "%C3%A9");
        assert_ne!(encode("a/b"), encode("a%2Fb"));
        for key in ["order:42", "a/b", "..", "100%", "é", "a%2Fb"] {
            assert_eq!(decode(&encode(key)).as_deref(), Some(key));
        }
        assert_eq!(decode("bad%2"), None);
    }

    #[test]
    fn queue_orders_by_sequence_and_skips_foreign_children() {
        let q = queue(vec![
            "lk-ab-1-0000000010".into(),
            "lk-cd-2-0000000002".into(),
            "foreign".into(),
            "lk-ef-3-0000000007".into(),
        ]);
        let seqs: Vec<i64> = q.iter().map(|(s, _)| *s).collect();
        assert_eq!(seqs, [2, 7, 10]);
    }

    #[test]
    fn owner_ids_fit_node_names() {
        let owner = OwnerId::next().to_string();
        assert!(!owner.contains('/'));
        assert_eq!(sequence(&format!("lk-{owner}-0000000042")), Some(42));
    }

    #[test]
    fn lease_records_round_trip() {
        let lease = Duration::from_millis(1500);
        let holder = Holder::of_process(Some("worker"));
        let initial = LeaseRecord::initial(Lease::Fixed(lease), &holder);
        assert_eq!(LeaseRecord::parse(&initial), Some(LeaseRecord { lease_ms: 1500, granted: false }));
        let granted = LeaseRecord::granted(lease, &holder);
        assert_eq!(LeaseRecord::parse(&granted), Some(LeaseRecord { lease_ms: 1500, granted: true }));
        let renewed = LeaseRecord::initial(Lease::Renewed(lease), &holder);
        assert_eq!(LeaseRecord::parse(&renewed), None);
        assert_eq!(LeaseRecord::parse(b"lease_ms=x"), None);
        for data in [initial, granted, renewed] {
            assert_eq!(holder_of(&data).as_ref(), Some(&holder));
        }
        // Nodes of older versions: no holder, same lease record.
        assert_eq!(LeaseRecord::parse(b"lease_ms=7;granted"), Some(LeaseRecord { lease_ms: 7, granted: true }));
        assert_eq!(holder_of(b"lease_ms=7"), None);
    }

    #[test]
    fn a_recorded_grant_counts_from_its_record() {
        let own = Node { path: Arc::from("/r/n/lk-x-1"), seq: 1, czxid: 1, ctime: 10_000, seen: crate::clock::now() };
        let holder = Stat { ctime: 5_000, mtime: 12_000, ..stat() };
        let record = LeaseRecord { lease_ms: 2_000, granted: true };
        let at = stale_at(record, &holder, &own, own.seen).expect("stale at");
        // The grant was recorded 2 s after our node: 2 s + lease + margin after `seen`.
        assert_eq!(at - own.seen, Duration::from_secs(4) + STALE_HOLDER_MARGIN);
        let unrecorded = LeaseRecord { granted: false, ..record };
        let later = own.seen + Duration::from_secs(7);
        assert_eq!(
            stale_at(unrecorded, &holder, &own, later),
            Some(later + Duration::from_secs(2) + STALE_HOLDER_MARGIN)
        );
    }

    #[test]
    fn a_grant_recorded_before_our_node_counts_from_earlier() {
        let own = Node { path: Arc::from("/r/n/lk-x-2"), seq: 2, czxid: 2, ctime: 10_000, seen: crate::clock::now() };
        let holder = Stat { ctime: 5_000, mtime: 9_500, ..stat() };
        let record = LeaseRecord { lease_ms: 2_000, granted: true };
        let at = stale_at(record, &holder, &own, own.seen).expect("stale at");
        // Recorded 0.5 s before our node was created: 1.5 s + margin after `seen`, or later.
        assert!(at >= own.seen + Duration::from_millis(1500) + STALE_HOLDER_MARGIN);
        assert!(at <= own.seen + Duration::from_secs(2) + STALE_HOLDER_MARGIN);
    }

    fn stat() -> Stat {
        Stat {
            czxid: 0,
            mzxid: 0,
            pzxid: 0,
            ctime: 0,
            mtime: 0,
            version: 0,
            cversion: 0,
            aversion: 0,
            ephemeral_owner: 0,
            data_length: 0,
            num_children: 0,
        }
    }
}
