//! Per-call options ([`LockOptions`]) and the limits every input is checked against.

use std::time::Duration;

use crate::error::LockError;

/// The longest lock name accepted, in bytes.
pub const MAX_NAME_LEN: usize = 1024;
/// The longest `wait` accepted.
pub const MAX_WAIT: Duration = Duration::from_secs(24 * 60 * 60);
/// The longest lease (fixed, or the manager's `default_lease`) accepted.
pub const MAX_LEASE: Duration = Duration::from_secs(24 * 60 * 60);
/// The shortest lease accepted.
pub const MIN_LEASE: Duration = Duration::from_millis(1);
/// The shortest `default_lease` accepted (the watchdog renews at a third of it).
pub const MIN_DEFAULT_LEASE: Duration = Duration::from_millis(30);
/// The most `retry` attempts accepted.
pub const MAX_RETRY: u32 = 1_000_000;

/// What one acquisition asks for. Unset fields fall back to the manager's defaults.
///
/// ```
/// use std::time::Duration;
/// let opts = lock_runtime::LockOptions::new().wait(Duration::from_millis(250)).retry(3);
/// assert_eq!(opts.wait_for(), Some(Duration::from_millis(250)));
/// assert_eq!(opts.lease_for(), None); // the watchdog keeps the lock alive
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LockOptions {
    wait: Option<Duration>,
    lease: Option<Duration>,
    retry: Option<u32>,
    hold_at_least: Option<Duration>,
}

impl LockOptions {
    /// No option set: the manager's `default_wait`, a watchdog lease, unlimited attempts.
    pub const fn new() -> Self {
        LockOptions { wait: None, lease: None, retry: None, hold_at_least: None }
    }

    /// The longest time to wait for the lock; zero means one attempt.
    pub const fn wait(mut self, wait: Duration) -> Self {
        self.wait = Some(wait);
        self
    }

    /// A fixed lease: the lock expires after it unless released, and is never renewed.
    pub const fn lease(mut self, lease: Duration) -> Self {
        self.lease = Some(lease);
        self
    }

    /// At most this many further attempts after the first, within `wait`. An attempt is made
    /// each time the backend signals that the lock may be free (a release, or the holder's
    /// lease running out); a fair backend's direct hand-off counts as one.
    pub const fn retry(mut self, retry: u32) -> Self {
        self.retry = Some(retry);
        self
    }

    /// Keeps the name taken until `hold` after the grant, even when the holder releases
    /// earlier (ShedLock's `lockAtLeastFor`): see
    /// [`LockRequest::hold_at_least`](crate::LockRequest::hold_at_least).
    pub const fn hold_at_least(mut self, hold: Duration) -> Self {
        self.hold_at_least = Some(hold);
        self
    }

    /// The `wait` given, if any.
    pub const fn wait_for(&self) -> Option<Duration> {
        self.wait
    }

    /// The fixed `lease` given, if any.
    pub const fn lease_for(&self) -> Option<Duration> {
        self.lease
    }

    /// The `retry` given, if any.
    pub const fn retries(&self) -> Option<u32> {
        self.retry
    }

    /// The `hold_at_least` given, if any.
    pub const fn hold_at_least_for(&self) -> Option<Duration> {
        self.hold_at_least
    }
}

/// Checks a lock name: not empty, at most [`MAX_NAME_LEN`] bytes, no control characters.
#[inline]
pub(crate) fn check_name(name: &str) -> Result<(), LockError> {
    // The common case, printable ASCII of an accepted length, in one pass of 8 bytes at a time.
    let plain = name.len() <= MAX_NAME_LEN && !name.is_empty() && printable_ascii(name.as_bytes());
    if plain {
        Ok(())
    } else {
        check_name_fully(name)
    }
}

/// Whether every byte is printable ASCII (`0x20..0x7f`), checked a word at a time.
#[inline]
fn printable_ascii(bytes: &[u8]) -> bool {
    let Some(last) = bytes.last_chunk::<8>() else { return short_printable(bytes) };
    let mut chunks = bytes.chunks_exact(8);
    for chunk in &mut chunks {
        let mut w = [0u8; 8];
        w.copy_from_slice(chunk);
        if !printable_word(u64::from_ne_bytes(w)) {
            return false;
        }
    }
    // The rest, as the last 8 bytes (overlapping the last whole word): read in place, not
    // copied into a padded word first (a copy the word's load then waits for).
    chunks.remainder().is_empty() || printable_word(u64::from_ne_bytes(*last))
}

/// Whether every byte of `w` is printable ASCII: no byte has its high bit set, none is below
/// 0x20, and none is 0x7f (0x7f + 1 sets the high bit; with every byte below 0x80 no addition
/// carries into the next byte).
#[inline]
fn printable_word(w: u64) -> bool {
    const ONES: u64 = u64::from_ne_bytes([0x01; 8]);
    const HIGH: u64 = u64::from_ne_bytes([0x80; 8]);
    let below_space = w.wrapping_sub(ONES * 0x20) & !w & HIGH;
    (w & HIGH) == 0 && below_space == 0 && (w.wrapping_add(ONES) & HIGH) == 0
}

/// [`printable_ascii`] of fewer than 8 bytes: the first and last 4 (overlapping) as one word.
#[inline]
fn short_printable(bytes: &[u8]) -> bool {
    match (bytes.first_chunk::<4>(), bytes.last_chunk::<4>()) {
        (Some(first), Some(last)) => {
            let w = u64::from(u32::from_ne_bytes(*first)) | u64::from(u32::from_ne_bytes(*last)) << 32;
            printable_word(w)
        }
        _ => bytes.iter().all(|b| (0x20..0x7f).contains(b)),
    }
}

#[cold]
fn check_name_fully(name: &str) -> Result<(), LockError> {
    if name.is_empty() {
        return Err(LockError::invalid(name, "the name is empty; give every lock a non-empty name"));
    }
    if name.len() > MAX_NAME_LEN {
        let shown: String = name.chars().take(64).collect();
        return Err(LockError::invalid(
            format!("{shown}…"),
            format!("the name is {} bytes long; the most accepted is {MAX_NAME_LEN}", name.len()),
        ));
    }
    let has_control =
        if name.is_ascii() { name.bytes().any(|b| b.is_ascii_control()) } else { name.chars().any(char::is_control) };
    if has_control {
        return Err(LockError::invalid(name.escape_debug().to_string(), "the name contains control characters"));
    }
    Ok(())
}

#[inline]
pub(crate) fn check_wait(name: &str, wait: Duration) -> Result<(), LockError> {
    if wait > MAX_WAIT {
        return wait_too_long(name, wait);
    }
    Ok(())
}

#[cold]
fn wait_too_long(name: &str, wait: Duration) -> Result<(), LockError> {
    Err(LockError::invalid(name, format!("wait {wait:?} is longer than the most accepted, {MAX_WAIT:?}")))
}

#[inline]
pub(crate) fn check_lease(name: &str, what: &str, lease: Duration, min: Duration) -> Result<(), LockError> {
    if lease >= min && lease <= MAX_LEASE {
        return Ok(());
    }
    lease_out_of_range(name, what, lease, min)
}

#[cold]
fn lease_out_of_range(name: &str, what: &str, lease: Duration, min: Duration) -> Result<(), LockError> {
    if lease < min {
        return Err(LockError::invalid(name, format!("{what} {lease:?} is shorter than the least accepted, {min:?}")));
    }
    if lease > MAX_LEASE {
        return Err(LockError::invalid(
            name,
            format!("{what} {lease:?} is longer than the most accepted, {MAX_LEASE:?}"),
        ));
    }
    Ok(())
}

/// Checks `hold_at_least`: at most [`MAX_LEASE`], and no longer than a fixed `lease` (the lock
/// would expire before; ShedLock's `lockAtLeastFor <= lockAtMostFor`).
pub(crate) fn check_hold(name: &str, hold: Duration, lease: Option<Duration>) -> Result<(), LockError> {
    if hold > MAX_LEASE {
        return Err(LockError::invalid(
            name,
            format!("hold_at_least {hold:?} is longer than the most accepted, {MAX_LEASE:?}"),
        ));
    }
    match lease {
        Some(lease) if hold > lease => Err(LockError::invalid(
            name,
            format!(
                "hold_at_least {hold:?} is longer than the fixed lease {lease:?}: the lock would expire before; \
                 give a longer lease, or none (a watchdog keeps it)"
            ),
        )),
        _ => Ok(()),
    }
}

pub(crate) fn check_retry(name: &str, retry: u32) -> Result<(), LockError> {
    if retry > MAX_RETRY {
        return Err(LockError::invalid(name, format!("retry {retry} is more than the most accepted, {MAX_RETRY}")));
    }
    Ok(())
}

/// How the lease of an acquisition is kept.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Lease {
    /// A fixed lease: the lock expires after it unless released; never renewed.
    Fixed(Duration),
    /// Kept alive by the runtime's watchdog while the guard lives; the backend should make the
    /// lock expire after this long if renewals stop (the holder crashed).
    Renewed(Duration),
}

impl Lease {
    /// The lease duration, either way.
    pub fn duration(&self) -> Duration {
        match *self {
            Lease::Fixed(d) | Lease::Renewed(d) => d,
        }
    }
}

/// `tls(..)` and `get_tls()` of a backend's options (feature `tls`), which keep the settings in
/// a field `tls`: one text for every backend. `$doc` says what the settings do there.
#[cfg_attr(
    not(any(feature = "redis", feature = "postgres", feature = "etcd", feature = "mysql", feature = "zookeeper")),
    allow(unused_macros)
)]
macro_rules! tls_setters {
    ($doc:literal) => {
        /// Connects over TLS with these settings: CAs to trust besides the platform's roots,
        /// a client certificate for mutual TLS. Feature `tls`.
        ///
        #[doc = $doc]
        #[cfg(feature = "_tls")]
        #[cfg_attr(docsrs, doc(cfg(any(feature = "tls", feature = "tls-aws-lc"))))]
        pub fn tls(mut self, tls: crate::tls::TlsOptions) -> Self {
            self.tls = Some(tls);
            self
        }

        /// The configured [`tls`](Self::tls) settings, if any.
        #[cfg(feature = "_tls")]
        #[cfg_attr(docsrs, doc(cfg(any(feature = "tls", feature = "tls-aws-lc"))))]
        pub fn get_tls(&self) -> Option<&crate::tls::TlsOptions> {
            self.tls.as_ref()
        }
    };
}
#[cfg_attr(
    not(any(feature = "redis", feature = "postgres", feature = "etcd", feature = "mysql", feature = "zookeeper")),
    allow(unused_imports)
)]
pub(crate) use tls_setters;

/// The setters of a request over its [`LockOptions`] (`wait`, `lease`, `retry`,
/// `hold_at_least`, `options`): one text for every request type, which keeps its options in a
/// field `options`.
macro_rules! option_setters {
    () => {
        /// The longest time to wait for the lock; `Duration::ZERO` makes one attempt.
        pub fn wait(mut self, wait: std::time::Duration) -> Self {
            self.options = self.options.wait(wait);
            self
        }

        /// A fixed lease: the lock expires after it unless released; no watchdog renewal.
        pub fn lease(mut self, lease: std::time::Duration) -> Self {
            self.options = self.options.lease(lease);
            self
        }

        /// At most this many further attempts after the first, within `wait`.
        pub fn retry(mut self, retry: u32) -> Self {
            self.options = self.options.retry(retry);
            self
        }

        /// Keeps the name taken until `hold` after the grant, even when the guard is released (or
        /// dropped) earlier: ShedLock's `lockAtLeastFor`, for a scheduled job that runs on several
        /// instances whose clocks differ a little. A 50 ms job started by each instance's timer at
        /// "12:00:00" by its own clock thus runs once, not once per instance whose timer fires
        /// after the first one finished.
        ///
        /// The remainder is counted from when the grant's reply arrived (so the name stays taken
        /// at least `hold` after the store granted it, however slow the request) and handed to the
        /// store as a duration, which counts it on its own clock (Redis sets the key's expiry to it instead of
        /// deleting it; ZooKeeper's node is deleted when the remainder recorded in it has passed;
        /// the in-process store keeps the entry held): the clocks of the instances need not agree.
        /// Waiters are woken when the remainder ends. A release after `hold` is a plain release.
        /// The remainder outlives the guard but not the holder's process on ZooKeeper (its session
        /// ends, and its node with it) nor the in-process store. At most the fixed `lease`, if
        /// one is given.
        ///
        /// ```
        /// # use std::time::Duration;
        /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), lock_runtime::LockError> {
        /// let manager = lock_runtime::LockManager::memory();
        /// let guard = manager.lock("nightly").hold_at_least(Duration::from_millis(200)).wait(Duration::ZERO).await?;
        /// guard.release().await?; // the job took no time
        /// assert!(manager.try_lock("nightly").await?.is_none()); // still taken for ~200 ms
        /// tokio::time::sleep(Duration::from_millis(250)).await;
        /// assert!(manager.try_lock("nightly").await?.is_some());
        /// # Ok(()) }
        /// ```
        pub fn hold_at_least(mut self, hold: std::time::Duration) -> Self {
            self.options = self.options.hold_at_least(hold);
            self
        }

        /// Replaces all options at once.
        pub fn options(mut self, options: $crate::LockOptions) -> Self {
            self.options = options;
            self
        }
    };
}
pub(crate) use option_setters;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn printable_ascii_agrees_with_the_byte_check() {
        for len in 0..20 {
            for bad in 0u8..=255 {
                for at in 0..len {
                    let mut bytes = vec![b'x'; len];
                    bytes[at] = bad;
                    let expected = bytes.iter().all(|b| (0x20..0x7f).contains(b));
                    assert_eq!(printable_ascii(&bytes), expected, "{bytes:?}");
                }
            }
            assert!(printable_ascii(&vec![b'~'; len]) && printable_ascii(&vec![b' '; len]));
        }
    }

    #[test]
    fn names() {
        assert!(check_name("order:42").is_ok());
        assert!(check_name("заказ/42 ✓").is_ok());
        assert!(check_name("").unwrap_err().is_invalid());
        assert!(check_name("tab\there").unwrap_err().is_invalid());
        assert!(check_name("c1\u{85}").unwrap_err().is_invalid());
        assert!(check_name(&"x".repeat(MAX_NAME_LEN)).is_ok());
        let err = check_name(&"x".repeat(MAX_NAME_LEN + 1)).unwrap_err();
        assert!(err.is_invalid() && err.to_string().contains("1025 bytes"), "{err}");
    }

    #[test]
    fn durations_and_retries() {
        assert!(check_wait("n", Duration::ZERO).is_ok());
        assert!(check_wait("n", MAX_WAIT + Duration::from_secs(1)).unwrap_err().is_invalid());
        assert!(check_lease("n", "lease", Duration::ZERO, MIN_LEASE).unwrap_err().is_invalid());
        assert!(check_lease("n", "lease", MIN_LEASE, MIN_LEASE).is_ok());
        assert!(check_lease("n", "lease", MAX_LEASE * 2, MIN_LEASE).unwrap_err().is_invalid());
        assert!(check_hold("n", Duration::from_secs(30), None).is_ok());
        assert!(check_hold("n", MAX_LEASE * 2, None).unwrap_err().is_invalid());
        assert!(check_hold("n", Duration::from_secs(2), Some(Duration::from_secs(2))).is_ok());
        assert!(check_hold("n", Duration::from_secs(3), Some(Duration::from_secs(2))).unwrap_err().is_invalid());
        assert!(check_retry("n", MAX_RETRY).is_ok());
        assert!(check_retry("n", MAX_RETRY + 1).unwrap_err().is_invalid());
    }
}
