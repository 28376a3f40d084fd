//! Who holds a lock: the id of one acquisition ([`OwnerId`]) and the process it belongs to
//! ([`Holder`]), as stored with every lock.

use std::cell::Cell;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

/// Identifies one acquisition: unique per process *and* across processes, never shared by two
/// callers, never the lock's name.
///
/// ```
/// let a = lock_runtime::backend::OwnerId::next();
/// let b = lock_runtime::backend::OwnerId::next();
/// assert_ne!(a, b);
/// assert_ne!(a.to_string(), b.to_string());
/// ```
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct OwnerId {
    process: u128,
    seq: u64,
}

impl OwnerId {
    /// A fresh owner id: a random per-process part and a sequence number unique in the process.
    pub fn next() -> Self {
        OwnerId { process: process_id(), seq: next_seq() }
    }

    /// The random part shared by every owner id of this process.
    pub fn process(&self) -> u128 {
        self.process
    }

    /// The sequence number, unique in the process. Each thread draws its numbers from the
    /// process-wide counter a block at a time, so they increase per thread, not across threads.
    pub fn seq(&self) -> u64 {
        self.seq
    }
}

impl OwnerId {
    /// `<owner id>@<holder>`, as the networked backends store it: built by hand, without the
    /// formatting machinery (one of the costs of every acquisition).
    #[cfg(feature = "redis")]
    pub(crate) fn with_holder(&self, holder: &Holder) -> Arc<str> {
        let mut buf = [0; OWNER_TEXT_MAX];
        let id = self.text(&mut buf);
        let mut text = String::with_capacity(id.len() + 1 + holder.as_str().len());
        text.push_str(id);
        text.push('@');
        text.push_str(holder.as_str());
        text.into()
    }

    /// The [`Display`](fmt::Display) form in `buf`: 32 hex digits, `-`, the sequence in hex.
    fn text<'b>(&self, buf: &'b mut [u8; OWNER_TEXT_MAX]) -> &'b str {
        const HEX: &[u8; 16] = b"0123456789abcdef";
        let digit = |v: u128, at: usize| HEX[((v >> (4 * at)) & 0xf) as usize];
        for (i, d) in buf[..32].iter_mut().enumerate() {
            *d = digit(self.process, 31 - i);
        }
        buf[32] = b'-';
        let seq_digits = (16 - self.seq.leading_zeros() as usize / 4).max(1);
        for (i, d) in buf[33..33 + seq_digits].iter_mut().enumerate() {
            *d = digit(u128::from(self.seq), seq_digits - 1 - i);
        }
        std::str::from_utf8(&buf[..33 + seq_digits]).unwrap_or_default()
    }
}

/// The longest [`OwnerId`] text: 32 hex digits, `-`, 16 hex digits.
const OWNER_TEXT_MAX: usize = 32 + 1 + 16;

impl fmt::Display for OwnerId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.text(&mut [0; OWNER_TEXT_MAX]))
    }
}

impl fmt::Debug for OwnerId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

/// A sequence number never handed out before in this process. Each thread takes a block of
/// numbers from the process-wide counter and hands them out one by one: one atomic operation
/// per block rather than per id.
fn next_seq() -> u64 {
    /// Numbers taken from the process-wide counter at a time.
    const BLOCK: u64 = 1024;
    static SEQ: AtomicU64 = AtomicU64::new(1);
    thread_local! {
        /// This thread's block: the next number and the end of the block.
        static RANGE: Cell<(u64, u64)> = const { Cell::new((0, 0)) };
    }
    RANGE
        .try_with(|range| {
            let (mut next, mut end) = range.get();
            if next >= end {
                next = SEQ.fetch_add(BLOCK, Ordering::Relaxed);
                end = next.saturating_add(BLOCK);
            }
            range.set((next + 1, end));
            next
        })
        // The thread is shutting down: one number on its own.
        .unwrap_or_else(|_| SEQ.fetch_add(1, Ordering::Relaxed))
}

/// 128 random bits chosen once per process (from the standard library's per-process
/// SipHash keys, the process id and the clock), so owner ids of two processes never collide.
fn process_id() -> u128 {
    static ID: OnceLock<u128> = OnceLock::new();
    *ID.get_or_init(|| {
        use std::hash::{BuildHasher, Hasher};
        let nanos =
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0);
        let mut parts = [0u64; 2];
        for (i, part) in parts.iter_mut().enumerate() {
            let mut h = std::collections::hash_map::RandomState::new().build_hasher();
            h.write_u128(nanos);
            h.write_u32(std::process::id());
            h.write_usize(i);
            *part = h.finish();
        }
        (u128::from(parts[0]) << 64) | u128::from(parts[1])
    })
}

/// Which process holds a lock: its host name, process id and an optional label, stored with
/// every lock the process takes (so that an operator, or `lockctl`, can tell who holds it).
///
/// Written `host/pid` or `host/pid/label`. Host and label keep ASCII letters, digits and
/// `-`, `_`, `.`, `:`; any other character becomes `_`, and each is cut to 64 bytes, so the
/// text never holds the separators of the stored formats (`/`, `@`, `#`, `+`, `;`, `=`) and
/// stays short (it is sent with every acquisition). The label is set per manager with
/// [`LockManagerBuilder::label`](crate::LockManagerBuilder::label).
///
/// ```
/// use lock_runtime::backend::Holder;
///
/// let me = Holder::of_process(Some("billing worker"));
/// assert_eq!(me.pid(), Some(std::process::id()));
/// assert_eq!(me.label(), Some("billing_worker"));
/// let parsed = Holder::parse(&me.to_string()).expect("parses");
/// assert_eq!(parsed, me);
/// assert_eq!(Holder::parse("db-1/42").and_then(|h| h.label().map(str::to_owned)), None);
/// ```
#[derive(Clone)]
pub struct Holder(HolderText);

/// A process's own holder text is interned (one per label, never freed), so that handing it to
/// every acquisition copies a pointer: no reference count shared by all threads on the hot
/// path. Texts read back from a store are reference-counted.
#[derive(Clone)]
enum HolderText {
    Interned(&'static str),
    Read(Arc<str>),
}

/// The longest host name or label kept in a [`Holder`], in bytes.
const HOLDER_PART_MAX: usize = 64;

impl Holder {
    /// This process, with `label` (`None` or empty for none). The host name is the system's
    /// (`uname` on Unix, `COMPUTERNAME` on Windows), else the `HOSTNAME` variable, else
    /// `unknown`.
    pub fn of_process(label: Option<&str>) -> Holder {
        let text = match label.map(sanitize).filter(|l| !l.is_empty()) {
            None => format!("{}/{}", host_name(), std::process::id()),
            Some(label) => format!("{}/{}/{label}", host_name(), std::process::id()),
        };
        Holder(HolderText::Interned(intern(text)))
    }

    /// A holder the store did not record (a lock taken by an older version): `unknown/0`.
    pub(crate) fn unknown() -> Holder {
        Holder(HolderText::Interned("unknown/0"))
    }

    /// Reads `host/pid[/label]` back; `None` when `text` is not in that form.
    pub fn parse(text: &str) -> Option<Holder> {
        let mut parts = text.splitn(3, '/');
        let host = parts.next().filter(|h| !h.is_empty())?;
        let pid = parts.next()?;
        pid.parse::<u32>().ok()?;
        let label = parts.next();
        let clean = |s: &str| !s.is_empty() && sanitize(s) == s;
        if !clean(host) || !label.is_none_or(clean) {
            return None;
        }
        Some(Holder(HolderText::Read(text.into())))
    }

    /// The host name.
    pub fn host(&self) -> &str {
        self.as_str().split('/').next().unwrap_or("")
    }

    /// The process id, if the text holds a valid one.
    pub fn pid(&self) -> Option<u32> {
        self.as_str().split('/').nth(1)?.parse().ok()
    }

    /// The label, if the manager was given one.
    pub fn label(&self) -> Option<&str> {
        self.as_str().splitn(3, '/').nth(2)
    }

    /// The text, `host/pid[/label]`.
    pub fn as_str(&self) -> &str {
        match &self.0 {
            HolderText::Interned(text) => text,
            HolderText::Read(text) => text,
        }
    }
}

/// `text` as a `&'static str`, leaked once per distinct text (a process uses one per label).
fn intern(text: String) -> &'static str {
    static TEXTS: std::sync::Mutex<Vec<&'static str>> = std::sync::Mutex::new(Vec::new());
    let mut texts = TEXTS.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    if let Some(known) = texts.iter().find(|t| **t == text) {
        return known;
    }
    let leaked: &'static str = Box::leak(text.into_boxed_str());
    texts.push(leaked);
    leaked
}

impl PartialEq for Holder {
    fn eq(&self, other: &Self) -> bool {
        self.as_str() == other.as_str()
    }
}

impl Eq for Holder {}

impl std::hash::Hash for Holder {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.as_str().hash(state);
    }
}

impl fmt::Display for Holder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl fmt::Debug for Holder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self.as_str(), f)
    }
}

/// Keeps `[A-Za-z0-9-_.:]`, turns anything else into `_`, cuts to [`HOLDER_PART_MAX`] bytes.
fn sanitize(part: &str) -> String {
    part.trim()
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | ':') { c } else { '_' })
        .take(HOLDER_PART_MAX)
        .collect()
}

/// The system's name for this machine.
#[cfg(unix)]
fn system_host_name() -> Option<String> {
    Some(rustix::system::uname().nodename().to_string_lossy().into_owned())
}

/// The system's name for this machine.
#[cfg(windows)]
fn system_host_name() -> Option<String> {
    std::env::var("COMPUTERNAME").ok()
}

#[cfg(not(any(unix, windows)))]
fn system_host_name() -> Option<String> {
    None
}

/// This machine's host name (sanitised), read once.
fn host_name() -> &'static str {
    static HOST: OnceLock<String> = OnceLock::new();
    HOST.get_or_init(|| {
        let name = system_host_name()
            .filter(|h| !h.is_empty())
            .or_else(|| std::env::var("HOSTNAME").ok())
            .map(|h| sanitize(&h))
            .unwrap_or_default();
        if name.is_empty() {
            "unknown".to_owned()
        } else {
            name
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The host name is the system's (`uname -n`), read by a platform call rather than from
    /// Linux's `/proc` alone.
    #[cfg(unix)]
    #[test]
    fn the_host_name_is_the_systems() {
        let Ok(out) = std::process::Command::new("uname").arg("-n").output() else { return };
        let expected = sanitize(String::from_utf8_lossy(&out.stdout).trim());
        assert_eq!(host_name(), expected);
        assert!(Holder::of_process(None).to_string().starts_with(&format!("{expected}/")));
    }

    /// The owner text is stored in Redis and compared by scripts: built by hand, it must stay
    /// exactly the formatted one.
    #[test]
    fn owner_text_is_the_formatted_one() {
        let holder = Holder::of_process(Some("worker-1"));
        for (process, seq) in [(0, 0), (u128::MAX, u64::MAX), (0x0123_4567_89ab_cdef, 0x10), (process_id(), 1 << 40)] {
            let owner = OwnerId { process, seq };
            let formatted = format!("{process:032x}-{seq:x}");
            assert_eq!(owner.to_string(), formatted);
            #[cfg(feature = "redis")]
            assert_eq!(&*owner.with_holder(&holder), format!("{formatted}@{holder}"));
            let _ = &holder;
        }
    }
}
