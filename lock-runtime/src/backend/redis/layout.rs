//! Where a lock lives in Redis: its key, its release channel, and its slot's fencing counter.
//!
//! All three share one hash slot (Redis Cluster's unit of sharding), so every script touches a
//! single slot:
//!
//! | what | name |
//! |---|---|
//! | the lock (a string `<owner id>@<holder>#<token>#<granted ms>`, then `#q` while a grant from the queue is not claimed, then `+` once waited on; expiring with the lease) | `lock:{<key>}` |
//! | the channel a release publishes on | `lock:{<key>}:released` |
//! | the fencing counter | on one server or Sentinel, `lock:fence`, one for every lock of every kind (a batch of grants reads and writes it once); on a Cluster, the slot's `lock:fence:{<tag>}`, `<tag>` a short string of the same slot |
//! | a read-write lock's state (a hash of holders, waiting writers' intents, a waited-on mark) and its channel | `lock:rw:{<key>}`, `lock:rw:{<key>}:released` |
//! | a semaphore's state (a hash of holders, its permits, a waited-on mark) and its channel | `lock:sem:{<key>}`, `lock:sem:{<key>}:released` |
//!
//! `<key>` is the manager prefix followed by the lock name. There is one fencing counter per
//! hash slot ever used (at most 16,384), never one per name, so the keys left behind stay
//! bounded however many names are locked.

use std::sync::OnceLock;

use crate::backend::LockKind;

/// The number of hash slots of Redis Cluster.
pub(super) const SLOTS: usize = 16_384;

/// The Redis names of one lock.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyLayout {
    /// The lock key, `lock:{<key>}`.
    pub lock: String,
    /// The release channel, `lock:{<key>}:released`.
    pub channel: String,
    /// The fencing counter of the lock key's hash slot, `lock:fence:{<tag>}`: the lock's on a
    /// Cluster (elsewhere, [`SERVER_FENCE`](Self::SERVER_FENCE)).
    pub fence: String,
}

impl KeyLayout {
    /// The one fencing counter of one server or a Sentinel-managed primary (`lock:fence`), for
    /// locks of every kind; a Cluster's locks take their slot's, [`fence`](Self::fence).
    pub const SERVER_FENCE: &'static str = SERVER_FENCE;

    /// The names used for the backend key `key` (the manager prefix followed by the lock name).
    pub fn of(key: &str) -> Self {
        Self::in_space("lock:{", key)
    }

    /// The names of `<space>{<key>}`: built by hand (every acquisition builds them).
    fn in_space(space: &str, key: &str) -> Self {
        let lock = concat(&[space, key, "}"]);
        let channel = concat(&[&lock, ":released"]);
        let fence = fence_of(&lock);
        KeyLayout { lock, channel, fence }
    }

    /// The names of a lock of `kind` for the backend key `key`: [`of`](Self::of) for a mutex;
    /// for the other kinds, each a namespace of its own, a state (`lock:rw:{<key>}` for a
    /// read-write lock, `lock:sem:{<key>}` for a semaphore) in `lock`, its channel
    /// `<state>:released`, and the fencing counter of the state's own slot (a name beginning
    /// with `}` leaves the state's hash tag empty, so the state is hashed whole, to another slot
    /// than the mutex key of the same name).
    pub fn of_kind(key: &str, kind: LockKind) -> Self {
        let space = match kind {
            LockKind::Exclusive => return Self::of(key),
            LockKind::Semaphore { .. } => "lock:sem:{",
            _ => "lock:rw:{",
        };
        Self::in_space(space, key)
    }

    /// The backend key of a lock key (`lock:{<key>}` gives `<key>`); `None` for any other
    /// Redis key (a channel, a counter, a foreign key).
    ///
    /// ```
    /// use lock_runtime::backend::redis::KeyLayout;
    /// let layout = KeyLayout::of("myapp:order/42");
    /// assert_eq!(KeyLayout::key_of(&layout.lock), Some("myapp:order/42"));
    /// assert_eq!(KeyLayout::key_of(&layout.fence), None);
    /// ```
    pub fn key_of(lock: &str) -> Option<&str> {
        lock.strip_prefix("lock:{")?.strip_suffix('}')
    }

    /// The mutex's queue of waiting processes, in the lock key's slot: a hash from each
    /// waiting acquisition's owner to when it registered and when its entry runs out, from
    /// which a release grants the lock server-side. `lock:{<key>}:queue`; for a key beginning
    /// with `}` (the lock key's hash tag is empty, so the whole key is hashed),
    /// `lock:queue:{<tag>}` followed by the lock key, `<tag>` one of the lock key's slot.
    ///
    /// ```
    /// use lock_runtime::backend::redis::{key_slot, KeyLayout};
    /// assert_eq!(KeyLayout::of("order/42").queue(), "lock:{order/42}:queue");
    /// let odd = KeyLayout::of("}order");
    /// assert_eq!(key_slot(odd.queue().as_bytes()), key_slot(odd.lock.as_bytes()));
    /// ```
    pub fn queue(&self) -> String {
        queue_of(&self.lock)
    }
}

/// The queue of the lock key `lock` (see [`KeyLayout::queue`]).
pub(super) fn queue_of(lock: &str) -> String {
    concat(&queue_parts(lock))
}

/// The parts of [`queue_of`]`(lock)`, to join.
pub(super) fn queue_parts(lock: &str) -> [&str; 4] {
    let tag = lock.find('{').map(|open| &lock[open + 1..]);
    match tag {
        Some(rest) if !rest.starts_with('}') && rest.contains('}') => [lock, ":queue", "", ""],
        _ => ["lock:queue:{", slot_tag(key_slot(lock.as_bytes())), "}", lock],
    }
}

/// The one fencing counter of the grants of one server or a Sentinel-managed primary, locks
/// of every kind: a batch of grants reads and writes it once (`batch.lua`). A Redis Cluster
/// keeps one per hash slot instead ([`fence_of`]), as a script touches one slot.
pub(super) const SERVER_FENCE: &str = "lock:fence";

/// The fencing counter of the hash slot of the Redis key `key`, `lock:fence:{<tag>}`: every
/// script that mints a token from it touches `key` and the counter in one slot, whatever hash
/// tag `key` has (an empty one, `{}`, hashes the whole key).
pub(super) fn fence_of(key: &str) -> String {
    concat(&fence_parts(key))
}

/// The parts of [`fence_of`]`(key)`, to join.
pub(super) fn fence_parts(key: &str) -> [&str; 3] {
    ["lock:fence:{", slot_tag(key_slot(key.as_bytes())), "}"]
}

/// `parts` joined, allocated once.
fn concat(parts: &[&str]) -> String {
    let mut out = String::new();
    joined(&mut out, parts);
    out
}

/// `parts` joined in `buffer` (emptied first): a name written into a buffer used again for
/// the next, not allocated on its own.
pub(super) fn joined<'b>(buffer: &'b mut String, parts: &[&str]) -> &'b str {
    buffer.clear();
    buffer.reserve(parts.iter().map(|p| p.len()).sum());
    parts.iter().for_each(|p| buffer.push_str(p));
    buffer
}

/// A short string of the hash slot of the Redis key `key`, to give a key of one's own that
/// slot: `{<tag>}` as its hash tag.
pub(crate) fn slot_tag_of(key: &str) -> &'static str {
    slot_tag(key_slot(key.as_bytes()))
}

/// The hash slot of a Redis key, as Redis Cluster computes it: CRC16 (XMODEM) of the hash tag
/// (the part between the first `{` and the next `}`, when not empty), else of the whole key.
pub fn key_slot(key: &[u8]) -> u16 {
    let hashed = match key.iter().position(|&b| b == b'{') {
        Some(open) => match key[open + 1..].iter().position(|&b| b == b'}') {
            Some(len) if len > 0 => &key[open + 1..open + 1 + len],
            _ => key,
        },
        None => key,
    };
    (crc16(hashed) as usize % SLOTS) as u16
}

/// CRC-16/XMODEM (polynomial 0x1021, initial value 0), the checksum of Redis Cluster; a byte
/// at a time, from [`CRC16_TABLE`].
fn crc16(data: &[u8]) -> u16 {
    data.iter().fold(0u16, |crc, &byte| (crc << 8) ^ CRC16_TABLE[usize::from((crc >> 8) as u8 ^ byte)])
}

/// The CRC-16/XMODEM of each byte value, computed at compile time.
const CRC16_TABLE: [u16; 256] = {
    let mut table = [0u16; 256];
    let mut i = 0;
    while i < 256 {
        let mut crc = (i as u16) << 8;
        let mut bit = 0;
        while bit < 8 {
            crc = if crc & 0x8000 != 0 { (crc << 1) ^ 0x1021 } else { crc << 1 };
            bit += 1;
        }
        table[i] = crc;
        i += 1;
    }
    table
};

/// A short string whose hash slot is `slot`: the first base-36 number that lands there. (The
/// tags name the fencing counters in Redis, so they never change: see `tags_never_change`.)
fn slot_tag(slot: u16) -> &'static str {
    static TAGS: OnceLock<SlotTags> = OnceLock::new();
    TAGS.get_or_init(SlotTags::find).get(slot)
}

/// Every slot's tag, in one string: tag `slot` ends at `ends[slot]` and starts where the one
/// before ends.
struct SlotTags {
    text: String,
    ends: Box<[u32]>,
}

impl SlotTags {
    /// Tries 0, 1, 2, .. in base 36 until every slot has its first (about 170,000 numbers),
    /// each in a buffer on the stack: under a millisecond once per process, where a string per
    /// number took about ten.
    fn find() -> Self {
        let mut first = vec![u32::MAX; SLOTS];
        let mut missing = SLOTS;
        let mut n: u32 = 0;
        while missing > 0 {
            let slot = usize::from(crc16(Base36::of(n).as_bytes())) % SLOTS;
            if first[slot] == u32::MAX {
                first[slot] = n;
                missing -= 1;
            }
            n += 1;
        }
        let mut text = String::with_capacity(SLOTS * 4);
        let ends = first
            .iter()
            .map(|&n| {
                text.push_str(Base36::of(n).as_str());
                u32::try_from(text.len()).unwrap_or(u32::MAX)
            })
            .collect();
        SlotTags { text, ends }
    }

    fn get(&self, slot: u16) -> &str {
        let slot = usize::from(slot) % SLOTS;
        let start = slot.checked_sub(1).map_or(0, |before| self.ends[before] as usize);
        self.text.get(start..self.ends[slot] as usize).unwrap_or_default()
    }
}

/// A number in base 36 (`0`-`9`, `a`-`z`), most significant digit first, at the end of a
/// buffer on the stack.
struct Base36 {
    buf: [u8; 7],
    start: usize,
}

impl Base36 {
    fn of(mut n: u32) -> Self {
        const DIGITS: &[u8; 36] = b"0123456789abcdefghijklmnopqrstuvwxyz";
        let mut out = Base36 { buf: [0; 7], start: 7 };
        loop {
            out.start -= 1;
            out.buf[out.start] = DIGITS[(n % 36) as usize];
            n /= 36;
            if n == 0 {
                return out;
            }
        }
    }

    fn as_bytes(&self) -> &[u8] {
        &self.buf[self.start..]
    }

    fn as_str(&self) -> &str {
        std::str::from_utf8(self.as_bytes()).unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crc16_matches_redis_cluster_spec() {
        // The reference value from the Redis Cluster specification.
        assert_eq!(crc16(b"123456789"), 0x31C3);
        assert_eq!(key_slot(b"foo"), 12182);
        assert_eq!(key_slot(b"{user1000}.following"), key_slot(b"{user1000}.followers"));
        assert_eq!(key_slot(b"foo{}{bar}"), key_slot(b"foo{}{bar}"));
        assert_eq!(key_slot(b"{}a"), (crc16(b"{}a") as usize % SLOTS) as u16);
    }

    /// The tags name the fencing counters in Redis: every version must find the same ones (a
    /// process of another version would mint tokens from another counter). The reference is
    /// the first way they were found: a string per number, CRC16 a bit at a time.
    /// Every script that takes the queue names it with the lock key: one slot, whatever the
    /// name's braces (an empty hash tag, none, one never closed).
    #[test]
    fn the_queue_shares_the_lock_keys_slot() {
        for name in ["order/42", "}tag", "}{tag}", "{}tag", "a}tag{", "{", "}", "a{b}c", "{{}}"] {
            let layout = KeyLayout::of(name);
            let queue = layout.queue();
            assert_ne!(queue, layout.lock);
            assert_eq!(key_slot(queue.as_bytes()), key_slot(layout.lock.as_bytes()), "{name}: {queue}");
        }
    }

    #[test]
    fn tags_never_change() {
        fn crc16_bitwise(data: &[u8]) -> u16 {
            let mut crc: u16 = 0;
            for &byte in data {
                crc ^= u16::from(byte) << 8;
                for _ in 0..8 {
                    crc = if crc & 0x8000 != 0 { (crc << 1) ^ 0x1021 } else { crc << 1 };
                }
            }
            crc
        }
        fn base36(mut n: u64) -> String {
            let mut out = Vec::new();
            loop {
                out.push(b"0123456789abcdefghijklmnopqrstuvwxyz"[(n % 36) as usize]);
                n /= 36;
                if n == 0 {
                    break;
                }
            }
            out.reverse();
            String::from_utf8(out).unwrap()
        }
        let mut tags = vec![String::new(); SLOTS];
        let (mut missing, mut n) = (SLOTS, 0u64);
        while missing > 0 {
            let tag = base36(n);
            let slot = usize::from(crc16_bitwise(tag.as_bytes())) % SLOTS;
            assert_eq!(crc16(tag.as_bytes()), crc16_bitwise(tag.as_bytes()), "{tag}");
            if tags[slot].is_empty() {
                tags[slot] = tag;
                missing -= 1;
            }
            n += 1;
        }
        for (slot, tag) in tags.iter().enumerate() {
            assert_eq!(slot_tag(slot as u16), tag, "slot {slot}");
        }
        assert_eq!((slot_tag(0), slot_tag(12182), slot_tag(16383)), ("1bz", "foo", "hia"));
    }

    #[test]
    fn every_slot_has_a_tag_and_a_lock_shares_its_slot() {
        for slot in [0u16, 1, 12182, 16383] {
            assert_eq!(key_slot(slot_tag(slot).as_bytes()), slot);
        }
        for key in ["order:42", "myapp:x", "a{b}c", "é", "}x", "{}x", "}{x}", "a}b{", "}"] {
            let l = KeyLayout::of(key);
            let slot = key_slot(l.lock.as_bytes());
            assert_eq!(key_slot(l.fence.as_bytes()), slot, "{key}: the keys of one script share a slot");
            // The channel is a script argument, not a key; it shares the slot when the name
            // gives the lock key a hash tag (any name not beginning with `}`).
            if !key.starts_with('}') {
                assert_eq!(key_slot(l.channel.as_bytes()), slot, "{key}");
            }
        }
    }

    #[test]
    fn kind_keys_share_a_slot_with_their_counter_and_namespaces_differ() {
        for key in ["order:42", "myapp:x", "a{b}c", "é", "a}b", "}x", "{}x", "}{x}", "a}b{", "}"] {
            let lock = KeyLayout::of(key);
            let rw = KeyLayout::of_kind(key, LockKind::Read);
            let sem = KeyLayout::of_kind(key, LockKind::Semaphore { permits: 3 });
            assert_eq!(rw, KeyLayout::of_kind(key, LockKind::Write), "readers and writers share one state");
            assert_ne!(rw.lock, sem.lock);
            assert_ne!(rw.lock, lock.lock);
            // The keys of one script (state and counter) share a slot, for every name.
            for keys in [&rw, &sem] {
                assert_eq!(key_slot(keys.fence.as_bytes()), key_slot(keys.lock.as_bytes()), "{key}");
            }
            // With a hash tag (any name not beginning with `}`), the channels and the mutex too.
            if !key.starts_with('}') {
                let slot = key_slot(lock.lock.as_bytes());
                for name in [&rw.lock, &rw.channel, &rw.fence, &sem.lock, &sem.channel, &sem.fence] {
                    assert_eq!(key_slot(name.as_bytes()), slot, "{name} of {key}");
                }
            }
            assert_eq!(KeyLayout::key_of(&rw.lock), None, "not taken for a mutex by inspection");
        }
    }
}
