//! Telemetry: `tracing` spans and events, and (feature `metrics`) metrics through the
//! [`metrics`](https://docs.rs/metrics) facade. Everything the runtime reports goes through
//! here; the names are listed in the crate docs (section *Telemetry*).
//!
//! Costs: with no `tracing` subscriber interested in `debug`, a span is one relaxed atomic
//! load and `Span::none()`; without the `metrics` feature nothing of the metrics is compiled.
//! Gauges are kept by drop guards ([`Waiting`], [`Holding`]), so every exit path (a cancelled
//! acquisition, a guard dropped unreleased, a lost lock) gives back what it added.

use std::borrow::Cow;
use std::fmt;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tracing::field::Empty;
use tracing::{Level, Span};

use crate::error::LockError;
use crate::lost::LostSignal;
use crate::options::Lease;

/// How lock names appear in telemetry: span fields, events and metric labels.
///
/// Lock names often carry identifiers (`user:{email}`, `invoice:{customer}`): choose
/// [`Hashed`](TelemetryNames::Hashed) or [`Hidden`](TelemetryNames::Hidden) with
/// [`LockManagerBuilder::telemetry_names`](crate::LockManagerBuilder::telemetry_names) to keep them out of logs, traces and metrics.
///
/// ```
/// use lock_runtime::TelemetryNames;
///
/// assert_eq!(TelemetryNames::Plain.render("user:ada@example.com").as_deref(), Some("user:ada@example.com"));
/// let hashed = TelemetryNames::Hashed.render("user:ada@example.com").expect("shown hashed");
/// assert_eq!(hashed.len(), 12); // the first 12 hex digits of the name's MD5: stable across runs
/// assert_eq!(TelemetryNames::Hidden.render("user:ada@example.com"), None);
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum TelemetryNames {
    /// The name as it is (the default).
    #[default]
    Plain,
    /// A short stable hash of the name: the first 12 hex digits of its MD5. The same name
    /// always gives the same hash, so one lock can still be followed across events and
    /// processes (and looked up with [`render`](TelemetryNames::render)).
    Hashed,
    /// No name at all: the `lock` field is left out of spans and events, and names are
    /// replaced by `<hidden>` in the error messages that events carry.
    Hidden,
}

impl TelemetryNames {
    /// How `name` is shown in telemetry: `None` when it is not shown at all.
    pub fn render(self, name: &str) -> Option<Cow<'_, str>> {
        match self {
            TelemetryNames::Plain => Some(Cow::Borrowed(name)),
            TelemetryNames::Hashed => {
                let digest = md5::compute(name.as_bytes());
                let mut hex = format!("{digest:x}");
                hex.truncate(12);
                Some(Cow::Owned(hex))
            }
            TelemetryNames::Hidden => None,
        }
    }

    /// `text` with every occurrence of `name` replaced as the name is shown.
    fn redact<'t>(self, text: &'t str, name: &str) -> Cow<'t, str> {
        if self == TelemetryNames::Plain || name.is_empty() || !text.contains(name) {
            return Cow::Borrowed(text);
        }
        let shown = self.render(name).unwrap_or(Cow::Borrowed("<hidden>"));
        Cow::Owned(text.replace(name, &shown))
    }

    fn rank(self) -> u8 {
        match self {
            TelemetryNames::Plain => 0,
            TelemetryNames::Hashed => 1,
            TelemetryNames::Hidden => 2,
        }
    }

    fn from_rank(rank: u8) -> Self {
        match rank {
            0 => TelemetryNames::Plain,
            1 => TelemetryNames::Hashed,
            _ => TelemetryNames::Hidden,
        }
    }
}

/// The strictest [`TelemetryNames`] of any manager built in this process: used by the events
/// that know of no manager (an error answered over HTTP, a backend's own events).
static STRICTEST: AtomicU8 = AtomicU8::new(0);

fn strictest() -> TelemetryNames {
    TelemetryNames::from_rank(STRICTEST.load(Ordering::Relaxed))
}

/// A lock error as events show it: names redacted as `names` says.
pub(crate) struct ShownError<'e>(pub(crate) &'e LockError, pub(crate) TelemetryNames);

impl fmt::Display for ShownError<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ShownError(error, names) = *self;
        if names == TelemetryNames::Plain {
            return fmt::Display::fmt(error, f);
        }
        f.write_str(&names.redact(&error.to_string(), error.lock_name()))
    }
}

/// A lock error as events that know of no manager show it (the strictest setting in force).
pub(crate) fn shown_error(error: &LockError) -> ShownError<'_> {
    ShownError(error, strictest())
}

/// A name as events that know of no manager show it (a backend's own events).
#[cfg_attr(not(any(feature = "redis", feature = "testing")), allow(dead_code))]
pub(crate) fn shown_name(name: &str) -> Shown<'_> {
    Shown(strictest().render(name))
}

/// A name rendered for an event field (`<hidden>` when hidden).
pub(crate) struct Shown<'n>(Option<Cow<'n, str>>);

impl fmt::Display for Shown<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.0.as_deref().unwrap_or("<hidden>"))
    }
}

/// What a manager's builder holds of its telemetry settings.
#[derive(Clone, Default)]
pub(crate) struct Config {
    pub(crate) names: TelemetryNames,
    #[cfg(feature = "metrics")]
    pub(crate) name_label: Option<NameLabel>,
}

#[cfg(feature = "metrics")]
type NameLabel = Arc<dyn for<'a> Fn(&'a str) -> &'a str + Send + Sync>;

impl fmt::Debug for Config {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut s = f.debug_struct("Telemetry");
        s.field("names", &self.names);
        #[cfg(feature = "metrics")]
        s.field("name_label", &self.name_label.is_some());
        s.finish()
    }
}

impl Config {
    /// The manager's telemetry, for its backend `kind`.
    pub(crate) fn build(self, kind: &'static str) -> Telemetry {
        STRICTEST.fetch_max(self.names.rank(), Ordering::Relaxed);
        Telemetry {
            names: self.names,
            kind,
            #[cfg(feature = "metrics")]
            metrics: metrics_support::Registry::new(kind, self.name_label),
        }
    }
}

/// A manager's telemetry.
pub(crate) struct Telemetry {
    names: TelemetryNames,
    kind: &'static str,
    #[cfg(feature = "metrics")]
    metrics: metrics_support::Registry,
}

#[cfg(feature = "metrics")]
type Handles = Arc<metrics_support::Handles>;

/// Whether spans at `debug` may be wanted: one relaxed load with no subscriber.
#[inline(always)]
fn spans_on() -> bool {
    tracing::level_enabled!(Level::DEBUG)
}

impl Telemetry {
    /// Starts the telemetry of one acquisition of `name`, in the caller's context: the
    /// `lock.acquire` span is a child of the caller's current span.
    #[inline(always)]
    pub(crate) fn acquiring(&self, name: &str) -> Acquiring {
        Acquiring {
            span: if spans_on() { self.acquire_span(name) } else { None },
            #[cfg(feature = "metrics")]
            metrics: self
                .metrics
                .handles(name, self.names)
                .map(|handles| Box::new(AcquireMetrics { handles, waited: Duration::ZERO })),
        }
    }

    #[cold]
    #[inline(never)]
    fn acquire_span(&self, name: &str) -> Option<Box<AcquireSpan>> {
        let span = tracing::debug_span!(
            "lock.acquire",
            lock = Empty,
            backend = self.kind,
            wait_ms = Empty,
            lease = Empty,
            lease_ms = Empty,
            attempts = Empty,
            outcome = Empty,
            fencing_token = Empty,
        );
        if span.is_disabled() {
            return None;
        }
        if let Some(shown) = self.names.render(name) {
            span.record("lock", &*shown);
        }
        Some(Box::new(AcquireSpan { span, attempts: 1, over: false }))
    }

    #[cold]
    #[inline(never)]
    fn hold_span(&self, name: &str, fencing_token: u64) -> Span {
        let span = tracing::debug_span!("lock.hold", lock = Empty, backend = self.kind, fencing_token);
        if let Some(shown) = self.names.render(name) {
            span.record("lock", &*shown);
        }
        span
    }

    /// Notes that a locked call's lock could not be taken, for the fallback that may follow
    /// (see [`falling_back`]).
    #[cold]
    pub(crate) fn entry_failed(&self, error: &LockError) {
        #[cfg(not(feature = "metrics"))]
        let _ = error;
        FAILED_ENTRY.with(|slot| {
            slot.replace(Some(FailedEntry {
                kind: self.kind,
                names: self.names,
                #[cfg(feature = "metrics")]
                handles: self.metrics.handles(error.lock_name(), self.names),
            }))
        });
    }
}

/// The telemetry of one acquisition: its `lock.acquire` span, its metric handles, and what
/// is recorded when it ends. Dropped before it ended (a cancelled acquisition): its span
/// records the outcome `cancelled`.
pub(crate) struct Acquiring {
    /// `None` when no subscriber wants the span. Boxed: the acquisition is small when unseen.
    span: Option<Box<AcquireSpan>>,
    /// `None` without a recorder. Boxed, as the span: the acquisition is small when unseen.
    #[cfg(feature = "metrics")]
    metrics: Option<Box<AcquireMetrics>>,
}

#[cfg(feature = "metrics")]
struct AcquireMetrics {
    handles: Handles,
    /// How long the call waited (zero when granted on its first, immediate attempt).
    waited: Duration,
}

struct AcquireSpan {
    span: Span,
    /// Attempts made so far.
    attempts: u32,
    /// Its outcome is recorded.
    over: bool,
}

impl Acquiring {
    /// Records the request's settings on the span.
    #[inline(always)]
    pub(crate) fn planned(&self, wait: Duration, lease: Lease) {
        if let Some(s) = &self.span {
            s.record_plan(wait, lease);
        }
    }

    /// Takes it out, leaving one that records nothing (a grant consumes its acquisition).
    #[inline(always)]
    pub(crate) fn take(&mut self) -> Acquiring {
        let done = Acquiring {
            span: None,
            #[cfg(feature = "metrics")]
            metrics: None,
        };
        std::mem::replace(self, done)
    }

    /// Attempts made so far.
    #[inline(always)]
    pub(crate) fn attempts(&mut self, attempts: u32) {
        if let Some(s) = &mut self.span {
            s.attempts = attempts;
        }
    }

    /// The call has waited since `started` (read only when metrics want it).
    #[inline(always)]
    pub(crate) fn waited_since(&mut self, started: Instant) {
        #[cfg(feature = "metrics")]
        if let Some(m) = &mut self.metrics {
            m.waited = crate::clock::now().saturating_duration_since(started);
        }
        #[cfg(not(feature = "metrics"))]
        let _ = started;
    }

    /// While it lives, the call counts as waiting (`lock_waiting`).
    #[inline]
    pub(crate) fn waiting(&self) -> Waiting {
        #[cfg(feature = "metrics")]
        {
            Waiting(self.metrics.as_ref().map(|m| {
                m.handles.waiting.increment(1.0);
                m.handles.waiting.clone()
            }))
        }
        #[cfg(not(feature = "metrics"))]
        {
            Waiting(())
        }
    }

    /// The acquisition failed with `error`.
    #[cold]
    pub(crate) fn failed(&mut self, error: &LockError) {
        let outcome = outcome_of(error);
        if let Some(s) = &mut self.span {
            s.end(outcome);
        }
        #[cfg(feature = "metrics")]
        if let Some(m) = &self.metrics {
            m.handles.outcome(outcome).increment(1);
            if outcome != "invalid" {
                m.handles.wait.record(m.waited);
            }
        }
    }

    /// The lock was granted with `fencing_token`: ends the acquisition, starts the holding
    /// (its `lock.hold` span, a child of the caller's current span, and `lock_held`).
    #[inline(always)]
    pub(crate) fn granted(
        mut self,
        telemetry: &Telemetry,
        name: &Arc<str>,
        fencing_token: u64,
        lost: &LostSignal,
        granted_at: Option<Instant>,
    ) -> Holding {
        #[cfg(not(feature = "metrics"))]
        let (_, recorded) = (granted_at, false);
        #[cfg(feature = "metrics")]
        let recorded = self.metrics.is_some();
        let traced = if self.span.is_none() && !spans_on() && !lost.can_fire() && !recorded {
            None // nothing to show, nothing to report: an in-process lock with no subscriber
        } else {
            #[allow(unused_mut)] // the metrics go into it when recorded
            let mut traced = self.traced(telemetry, name, fencing_token, lost);
            #[cfg(feature = "metrics")]
            if let Some(m) = self.metrics.take() {
                let AcquireMetrics { handles, waited } = *m;
                handles.acquired.increment(1);
                handles.wait.record(waited);
                handles.held.increment(1.0);
                traced.held = Some(HeldMetrics { since: granted_at.unwrap_or_else(crate::clock::now), handles });
            }
            Some(traced)
        };
        let holding = Holding { traced };
        if self.span.is_none() {
            // Nothing left in it (no span, the handles taken): skip its drop on the fast path.
            std::mem::forget(self);
        }
        holding
    }

    #[cold]
    #[inline(never)]
    fn traced(&mut self, telemetry: &Telemetry, name: &Arc<str>, fencing_token: u64, lost: &LostSignal) -> Box<Traced> {
        let span = self.end_span(telemetry, name, fencing_token);
        let (name, kind, names, lost) = (name.clone(), telemetry.kind, telemetry.names, lost.clone());
        Box::new(Traced {
            span,
            name,
            kind,
            names,
            lost,
            #[cfg(feature = "metrics")]
            lost_total: self.metrics.as_ref().map(|m| m.handles.lost.clone()),
            reports_on_drop: true,
            #[cfg(feature = "metrics")]
            held: None,
        })
    }

    #[cold]
    #[inline(never)]
    fn end_span(&mut self, telemetry: &Telemetry, name: &str, fencing_token: u64) -> Span {
        if let Some(s) = &mut self.span {
            s.end("acquired");
            s.span.record("fencing_token", fencing_token);
        }
        if spans_on() {
            telemetry.hold_span(name, fencing_token)
        } else {
            Span::none()
        }
    }
}

impl AcquireSpan {
    fn record_plan(&self, wait: Duration, lease: Lease) {
        self.span.record("wait_ms", wait.as_millis() as u64);
        self.span.record("lease", if matches!(lease, Lease::Renewed(_)) { "renewed" } else { "fixed" });
        self.span.record("lease_ms", lease.duration().as_millis() as u64);
    }

    fn end(&mut self, outcome: &'static str) {
        self.over = true;
        self.span.record("attempts", self.attempts);
        self.span.record("outcome", outcome);
    }
}

impl Drop for AcquireSpan {
    fn drop(&mut self) {
        if !self.over {
            self.end("cancelled");
        }
    }
}

/// The outcome label of a failed acquisition.
fn outcome_of(error: &LockError) -> &'static str {
    match error {
        LockError::Contended { .. } => "contended",
        LockError::Invalid { .. } => "invalid",
        _ => "error",
    }
}

/// Counts a call as waiting (`lock_waiting`) until dropped.
pub(crate) struct Waiting(#[cfg(feature = "metrics")] Option<metrics::Gauge>, #[cfg(not(feature = "metrics"))] ());

impl Drop for Waiting {
    #[inline]
    fn drop(&mut self) {
        #[cfg(feature = "metrics")]
        if let Some(gauge) = &self.0 {
            gauge.decrement(1.0);
        }
    }
}

/// The telemetry of one held lock, from grant to release, kept by its guard: the `lock.hold`
/// span, `lock_held` (given back on drop), `lock_hold_seconds`, and the report of a loss not
/// reported yet. No drop of its own: its parts have theirs, so that an empty one costs a
/// test.
pub(crate) struct Holding {
    /// `None` when there is nothing to show, record or report: no subscriber wanted the span,
    /// no recorder is installed, and the lock cannot be lost (an in-process lock kept by its
    /// guard). One box for all three, so that a guard is as small with the `metrics` feature
    /// as without it, and an unseen lock pays one test.
    traced: Option<Box<Traced>>,
}

#[cfg(feature = "metrics")]
struct HeldMetrics {
    since: Instant,
    handles: Handles,
}

#[cfg(feature = "metrics")]
impl Drop for HeldMetrics {
    fn drop(&mut self) {
        self.handles.held.decrement(1.0);
        self.handles.hold.record(crate::clock::now().saturating_duration_since(self.since));
    }
}

/// The span of a held lock and what reports its loss: once per lock, by whoever notices it
/// first (the watchdog, or the end of the holding).
struct Traced {
    span: Span,
    name: Arc<str>,
    kind: &'static str,
    names: TelemetryNames,
    lost: LostSignal,
    #[cfg(feature = "metrics")]
    lost_total: Option<metrics::Counter>,
    /// Reports a loss not reported yet when dropped (the holding's, not the watchdog's copy).
    reports_on_drop: bool,
    /// The holding's metrics, when a recorder records them (not the watchdog's copy).
    #[cfg(feature = "metrics")]
    held: Option<HeldMetrics>,
}

impl Drop for Traced {
    fn drop(&mut self) {
        if self.reports_on_drop && self.lost.can_fire() && self.lost.is_lost() {
            let reason = self.lost.reason().unwrap_or_default();
            report_lost(self, &reason);
        }
    }
}

/// Reports the loss of `name` (one `warn` event in `span`, `lock_lost_total`) unless it was
/// reported already.
#[cold]
fn report_lost(traced: &Traced, reason: &str) {
    let Traced { span, name, kind, names, lost, .. } = traced;
    if !lost.report_once() {
        return;
    }
    #[cfg(feature = "metrics")]
    if let Some(lost_total) = &traced.lost_total {
        lost_total.increment(1);
    }
    let reason = names.redact(reason, name);
    let lock = Shown(names.render(name));
    if span.is_disabled() {
        tracing::warn!(lock = %lock, backend = kind, reason = %reason, "lock lost");
    } else {
        tracing::warn!(parent: span, lock = %lock, backend = kind, reason = %reason, "lock lost");
    }
}

impl Holding {
    /// A holding with nothing to show or report (one that stands for others, which report
    /// themselves).
    pub(crate) fn none() -> Holding {
        Holding { traced: None }
    }

    /// The `lock.hold` span, if a subscriber wants it.
    #[inline(always)]
    pub(crate) fn span(&self) -> Option<&Span> {
        self.traced.as_ref().map(|t| &t.span).filter(|span| !span.is_disabled())
    }

    /// How names are shown in this lock's events.
    pub(crate) fn names(&self) -> TelemetryNames {
        self.traced.as_ref().map_or_else(strictest, |t| t.names)
    }

    /// What the watchdog reports renewals and a loss with.
    pub(crate) fn renewals(&self) -> Renewals {
        Renewals {
            traced: self.traced.as_ref().map(|t| Traced {
                span: t.span.clone(),
                name: t.name.clone(),
                kind: t.kind,
                names: t.names,
                lost: t.lost.clone(),
                #[cfg(feature = "metrics")]
                lost_total: t.lost_total.clone(),
                reports_on_drop: false,
                #[cfg(feature = "metrics")]
                held: None,
            }),
            #[cfg(feature = "metrics")]
            handles: self.traced.as_ref().and_then(|t| t.held.as_ref()).map(|m| m.handles.clone()),
        }
    }
}

/// What the watchdog of one lock reports with: renewals (`debug` events in the `lock.hold`
/// span, `lock_renewals_total`) and the loss it finds.
pub(crate) struct Renewals {
    /// `None` only for a lock that cannot be lost (never renewed).
    traced: Option<Traced>,
    #[cfg(feature = "metrics")]
    handles: Option<Handles>,
}

/// How a renewal went, as `lock_renewals_total` labels it.
#[derive(Clone, Copy)]
pub(crate) enum Renewal {
    /// Confirmed in time.
    Renewed,
    /// Refused by the backend: the lock is lost.
    Refused,
    /// No answer, an error, or confirmed only after the lease ran out.
    Failed,
}

impl Renewals {
    /// Counts a renewal.
    pub(crate) fn renewal(&self, outcome: Renewal) {
        #[cfg(feature = "metrics")]
        if let Some(h) = &self.handles {
            match outcome {
                Renewal::Renewed => h.renewed.increment(1),
                Renewal::Refused => h.refused.increment(1),
                Renewal::Failed => h.renew_failed.increment(1),
            }
        }
        #[cfg(not(feature = "metrics"))]
        let _ = outcome;
    }

    /// A failed renewal that is retried: a `debug` event in the `lock.hold` span.
    pub(crate) fn retrying(&self, why: &str) {
        let Some(Traced { span, name, names, .. }) = &self.traced else { return };
        if tracing::enabled!(Level::DEBUG) {
            let why = names.redact(why, name);
            let lock = Shown(names.render(name));
            tracing::debug!(parent: span, lock = %lock, error = %why, "lease renewal failed; retrying");
        }
    }

    /// Reports the loss the watchdog found (unless reported already), before it fires `lost`.
    pub(crate) fn lost(&self, reason: &str) {
        if let Some(traced) = &self.traced {
            report_lost(traced, reason);
        }
    }
}

/// A locked call whose lock could not be taken, noted by its entry for the fallback that the
/// same poll may call next ([`falling_back`]).
struct FailedEntry {
    kind: &'static str,
    names: TelemetryNames,
    #[cfg(feature = "metrics")]
    handles: Option<Handles>,
}

thread_local! {
    static FAILED_ENTRY: std::cell::RefCell<Option<FailedEntry>> = const { std::cell::RefCell::new(None) };
}

/// Notes that a locked call found no manager (no telemetry to go by).
#[cold]
pub(crate) fn entry_refused() {
    FAILED_ENTRY.with(|slot| slot.replace(None));
}

/// A locked call calls its fallback instead of its body because of `error`: a `debug` event
/// when the lock was busy, a `warn` otherwise (the fallback hides a failure), and
/// `lock_fallbacks_total`. The entry that failed, in the same poll just before, noted the
/// manager's settings.
#[cold]
pub(crate) fn falling_back(error: &LockError) {
    let entry = FAILED_ENTRY.with(|slot| slot.borrow_mut().take());
    let (kind, names) = entry.as_ref().map_or(("none", strictest()), |e| (e.kind, e.names));
    let reason = match error {
        LockError::NotConfigured { .. } => "not_configured",
        other => outcome_of(other),
    };
    #[cfg(feature = "metrics")]
    metrics_support::fallback(entry.as_ref().and_then(|e| e.handles.as_ref()), kind, reason);
    let shown = ShownError(error, names);
    if error.is_contended() {
        tracing::debug!(backend = kind, reason, error = %shown, "lock busy; calling the fallback");
    } else {
        tracing::warn!(backend = kind, reason, error = %shown, "lock not acquired; calling the fallback");
    }
}

#[cfg(feature = "metrics")]
mod metrics_support {
    //! The metric handles, registered once per manager (and name label) with the recorder in
    //! force at the first acquisition.

    use std::collections::HashMap;
    use std::sync::{Arc, Mutex, OnceLock, PoisonError};

    use metrics::{Counter, Gauge, Histogram, Label, Unit};

    use super::{NameLabel, TelemetryNames};

    pub(super) const ACQUISITIONS: &str = "lock_acquisitions_total";
    pub(super) const WAIT: &str = "lock_wait_seconds";
    pub(super) const HOLD: &str = "lock_hold_seconds";
    pub(super) const LOST: &str = "lock_lost_total";
    pub(super) const FALLBACKS: &str = "lock_fallbacks_total";
    pub(super) const RENEWALS: &str = "lock_renewals_total";
    pub(super) const HELD: &str = "lock_held";
    pub(super) const WAITING: &str = "lock_waiting";

    /// The most distinct `name` label values kept per manager.
    const MAX_LABELS: usize = 256;

    /// The handles of one label set (a backend, and a name label if any).
    pub(crate) struct Handles {
        labels: Vec<Label>,
        pub(super) acquired: Counter,
        contended: Counter,
        error: Counter,
        invalid: Counter,
        pub(super) wait: Histogram,
        pub(super) hold: Histogram,
        pub(super) lost: Counter,
        pub(super) renewed: Counter,
        pub(super) refused: Counter,
        pub(super) renew_failed: Counter,
        pub(super) held: Gauge,
        pub(super) waiting: Gauge,
    }

    impl Handles {
        fn register(labels: Vec<Label>) -> Self {
            describe();
            let with = |key: &'static str, value: &'static str| {
                let mut all = labels.clone();
                all.push(Label::from_static_parts(key, value));
                all
            };
            Handles {
                acquired: metrics::counter!(ACQUISITIONS, with("outcome", "acquired")),
                contended: metrics::counter!(ACQUISITIONS, with("outcome", "contended")),
                error: metrics::counter!(ACQUISITIONS, with("outcome", "error")),
                invalid: metrics::counter!(ACQUISITIONS, with("outcome", "invalid")),
                wait: metrics::histogram!(WAIT, labels.clone()),
                hold: metrics::histogram!(HOLD, labels.clone()),
                lost: metrics::counter!(LOST, labels.clone()),
                renewed: metrics::counter!(RENEWALS, with("outcome", "renewed")),
                refused: metrics::counter!(RENEWALS, with("outcome", "refused")),
                renew_failed: metrics::counter!(RENEWALS, with("outcome", "failed")),
                held: metrics::gauge!(HELD, labels.clone()),
                waiting: metrics::gauge!(WAITING, labels.clone()),
                labels,
            }
        }

        /// The `lock_acquisitions_total` counter of a failed acquisition's outcome.
        pub(super) fn outcome(&self, outcome: &str) -> &Counter {
            match outcome {
                "contended" => &self.contended,
                "invalid" => &self.invalid,
                _ => &self.error,
            }
        }
    }

    fn describe() {
        metrics::describe_counter!(ACQUISITIONS, "Lock acquisitions, by outcome (acquired, contended, error, invalid)");
        metrics::describe_histogram!(WAIT, Unit::Seconds, "Time from a lock request to its outcome");
        metrics::describe_histogram!(HOLD, Unit::Seconds, "Time from a lock's grant to its release");
        metrics::describe_counter!(LOST, "Locks lost while held");
        metrics::describe_counter!(FALLBACKS, "Locked calls that ran their fallback, by reason");
        metrics::describe_counter!(RENEWALS, "Lease renewals by the watchdog, by outcome (renewed, refused, failed)");
        metrics::describe_gauge!(HELD, "Locks held by this process (guards alive)");
        metrics::describe_gauge!(WAITING, "Lock requests waiting for a held lock");
    }

    /// Counts a fallback.
    pub(super) fn fallback(handles: Option<&Arc<Handles>>, kind: &'static str, reason: &'static str) {
        let mut labels = match handles {
            Some(h) => h.labels.clone(),
            None => vec![Label::from_static_parts("backend", kind)],
        };
        labels.push(Label::from_static_parts("reason", reason));
        metrics::counter!(FALLBACKS, labels).increment(1);
    }

    /// A manager's handles: one set without a name label, else one per label value; none at
    /// all when no recorder is installed at the first acquisition (see `recording`).
    pub(crate) struct Registry {
        kind: &'static str,
        plain: OnceLock<Option<Arc<Handles>>>,
        name_label: Option<NameLabel>,
        by_label: Mutex<HashMap<Box<str>, Arc<Handles>>>,
    }

    /// Whether a recorder is installed (global, or local to this thread): the `metrics`
    /// facade's stand-in when none is, `NoopRecorder`, is zero-sized, and every recorder
    /// that keeps what it is given has state. Without one, a lock reads no clock and keeps no
    /// handle for its metrics: it costs what it costs without the `metrics` feature.
    fn recording() -> bool {
        metrics::with_recorder(|recorder| std::mem::size_of_val(recorder) != 0)
    }

    impl Registry {
        pub(super) fn new(kind: &'static str, name_label: Option<NameLabel>) -> Self {
            Registry { kind, plain: OnceLock::new(), name_label, by_label: Mutex::default() }
        }

        #[inline(always)]
        pub(super) fn handles(&self, name: &str, names: TelemetryNames) -> Option<Arc<Handles>> {
            let plain = self.plain()?;
            match &self.name_label {
                None => Some(plain.clone()),
                Some(label) => self.labelled(label(name), names, plain),
            }
        }

        /// The handles without a name label; `None` without a recorder.
        #[inline(always)]
        fn plain(&self) -> Option<&Arc<Handles>> {
            let kind = self.kind;
            self.plain
                .get_or_init(|| {
                    recording().then(|| Arc::new(Handles::register(vec![Label::from_static_parts("backend", kind)])))
                })
                .as_ref()
        }

        #[cold]
        fn labelled(&self, value: &str, names: TelemetryNames, plain: &Arc<Handles>) -> Option<Arc<Handles>> {
            let Some(shown) = names.render(value) else {
                return Some(plain.clone());
            };
            let mut map = self.by_label.lock().unwrap_or_else(PoisonError::into_inner);
            if let Some(h) = map.get(&*shown) {
                return Some(h.clone());
            }
            let key: Box<str> = if map.len() < MAX_LABELS { Box::from(&*shown) } else { Box::from("other") };
            let kind = self.kind;
            let h = map
                .entry(key)
                .or_insert_with_key(|key| {
                    Arc::new(Handles::register(vec![
                        Label::from_static_parts("backend", kind),
                        Label::new("name", key.to_string()),
                    ]))
                })
                .clone();
            Some(h)
        }
    }

    #[cfg(test)]
    mod tests {
        use std::sync::atomic::{AtomicUsize, Ordering};

        use metrics::{Counter, Gauge, Histogram, Key, KeyName, Metadata, Recorder, SharedString};

        use super::{Registry, TelemetryNames};

        /// A recorder with state (as every real one has): counts the series registered.
        #[derive(Default)]
        struct Counting(AtomicUsize);

        impl Recorder for Counting {
            fn describe_counter(&self, _: KeyName, _: Option<metrics::Unit>, _: SharedString) {}
            fn describe_gauge(&self, _: KeyName, _: Option<metrics::Unit>, _: SharedString) {}
            fn describe_histogram(&self, _: KeyName, _: Option<metrics::Unit>, _: SharedString) {}
            fn register_counter(&self, _: &Key, _: &Metadata<'_>) -> Counter {
                self.0.fetch_add(1, Ordering::Relaxed);
                Counter::noop()
            }
            fn register_gauge(&self, _: &Key, _: &Metadata<'_>) -> Gauge {
                self.0.fetch_add(1, Ordering::Relaxed);
                Gauge::noop()
            }
            fn register_histogram(&self, _: &Key, _: &Metadata<'_>) -> Histogram {
                self.0.fetch_add(1, Ordering::Relaxed);
                Histogram::noop()
            }
        }

        #[test]
        fn without_a_recorder_no_handles_are_kept() {
            let registry = Registry::new("memory", None);
            assert!(registry.handles("a", TelemetryNames::Plain).is_none());
            // Decided once per manager: a recorder installed later is not seen by it.
            let recorder = Counting::default();
            metrics::with_local_recorder(&recorder, || {
                assert!(registry.handles("a", TelemetryNames::Plain).is_none());
            });
            assert_eq!(recorder.0.load(Ordering::Relaxed), 0);
        }

        #[test]
        fn with_a_recorder_the_series_are_registered_once() {
            let recorder = Counting::default();
            let registry = Registry::new("memory", None);
            metrics::with_local_recorder(&recorder, || {
                assert!(registry.handles("a", TelemetryNames::Plain).is_some());
                assert!(registry.handles("b", TelemetryNames::Plain).is_some());
            });
            assert_eq!(recorder.0.load(Ordering::Relaxed), 12);
        }
    }
}
