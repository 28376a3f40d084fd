//! The Prometheus recorder of the examples (feature `metrics`): `lock-runtime`'s metrics (see
//! its crate docs, *Telemetry*) rendered in the Prometheus text format, which the Axum orders
//! service serves at `GET /metrics`.
//!
//! `metrics-exporter-prometheus` is used without its default features: its recorder and
//! [`PrometheusHandle::render`] only, no HTTP listener or push gateway of its own (the app's
//! router serves the text).

use std::sync::{Mutex, PoisonError};

use metrics_exporter_prometheus::{BuildError, Matcher, PrometheusBuilder, PrometheusHandle};

/// The buckets of the `*_seconds` histograms (`lock_wait_seconds`, `lock_hold_seconds`), in
/// seconds: a histogram (with `_bucket`, `_sum` and `_count`) rather than the exporter's
/// default summary, so that instances can be aggregated.
pub const BUCKETS: &[f64] = &[0.0005, 0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0];

static INSTALLED: Mutex<Option<PrometheusHandle>> = Mutex::new(None);

/// Installs the Prometheus recorder as the process's global `metrics` recorder (once; later
/// calls return the same handle). Call it before the lock manager takes its first lock: a
/// manager registers its series with the recorder in force then.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let handle = examples::metrics::install()?;
/// let manager = lock_runtime::LockManager::memory();
/// manager.lock("order:42").await?.release().await?;
/// assert!(handle.render().contains(r#"lock_acquisitions_total{backend="memory",outcome="acquired"} 1"#));
/// # Ok(()) }
/// ```
pub fn install() -> Result<PrometheusHandle, BuildError> {
    let mut slot = INSTALLED.lock().unwrap_or_else(PoisonError::into_inner);
    if let Some(handle) = &*slot {
        return Ok(handle.clone());
    }
    let handle = PrometheusBuilder::new()
        .set_buckets_for_metric(Matcher::Suffix("_seconds".into()), BUCKETS)?
        .install_recorder()?;
    *slot = Some(handle.clone());
    Ok(handle)
}

/// The handle of the installed recorder, if [`install`] was called.
pub fn handle() -> Option<PrometheusHandle> {
    INSTALLED.lock().unwrap_or_else(PoisonError::into_inner).clone()
}

/// The metrics in the Prometheus text format (exposition format 0.0.4), after the exporter's
/// upkeep (which it needs now and then; a scrape is a good moment); `None` before [`install`].
pub fn render() -> Option<String> {
    let handle = handle()?;
    handle.run_upkeep();
    Some(handle.render())
}
