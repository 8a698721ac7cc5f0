//! The worker's Prometheus metrics and `GET /metrics`.

use std::sync::Arc;

use axum::extract::State;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use crate::daemon::records::RecordState;
use crate::daemon::state::Worker;
/// Labels of an admission.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct AdmissionLabels {
    /// `allow`, `refresh_route`, `deny`.
    pub verdict: &'static str,
    /// Reason code.
    pub reason: &'static str,
}

/// Labels of a request.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OpLabels {
    /// Operation.
    pub op: &'static str,
}

/// Labels of a sandbox count.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StateLabels {
    /// Record state.
    pub state: &'static str,
}

/// The worker's metrics (`space_worker_*`).
#[derive(Debug)]
pub struct WorkerMetrics {
    registry: Registry,
    /// Admissions by verdict and reason.
    pub admissions: Family<AdmissionLabels, Counter>,
    /// Latency of admitted operations.
    pub latency: Family<OpLabels, Histogram>,
    /// Executions launched.
    pub launches: Counter,
    /// Executions retired.
    pub retirements: Counter,
    /// Launches served by a warm jail (a subset of `launches`).
    pub warm_activations: Counter,
    /// Executions by record state (set when scraped).
    pub sandboxes: Family<StateLabels, Gauge>,
    /// Warm jails ready (set when scraped).
    pub warm_ready: Gauge,
}

impl Default for WorkerMetrics {
    fn default() -> Self {
        let mut registry = Registry::default();
        let admissions = Family::<AdmissionLabels, Counter>::default();
        let latency = Family::<OpLabels, Histogram>::new_with_constructor(|| {
            Histogram::new(exponential_buckets(0.000_05, 2.0, 20))
        });
        let launches = Counter::default();
        let retirements = Counter::default();
        let warm_activations = Counter::default();
        let sandboxes = Family::<StateLabels, Gauge>::default();
        let warm_ready = Gauge::default();
        registry.register(
            "space_worker_admissions",
            "Capability admissions by verdict and reason",
            admissions.clone(),
        );
        registry.register(
            "space_worker_operation_duration_seconds",
            "Latency of admitted operations",
            latency.clone(),
        );
        registry.register(
            "space_worker_launches",
            "Executions launched",
            launches.clone(),
        );
        registry.register(
            "space_worker_retirements",
            "Executions retired",
            retirements.clone(),
        );
        registry.register(
            "space_worker_warm_activations",
            "Launches served by a warm jail",
            warm_activations.clone(),
        );
        registry.register(
            "space_worker_sandboxes",
            "Executions on this worker by state",
            sandboxes.clone(),
        );
        registry.register(
            "space_worker_warm_ready",
            "Warm jails ready for a create",
            warm_ready.clone(),
        );
        Self {
            registry,
            admissions,
            latency,
            launches,
            retirements,
            warm_activations,
            sandboxes,
            warm_ready,
        }
    }
}

pub(crate) async fn metrics(State(w): State<Arc<Worker>>) -> Response {
    let mut counts = [0i64; 5];
    if let Ok(slots) = w.slots.read() {
        for slot in slots.values() {
            let i = match slot.record.state {
                RecordState::Starting => 0,
                RecordState::Running => 1,
                RecordState::Paused => 2,
                RecordState::Retired => 3,
                RecordState::Failed => 4,
            };
            counts[i] += 1;
        }
    }
    for (i, state) in ["starting", "running", "paused", "retired", "failed"]
        .into_iter()
        .enumerate()
    {
        w.metrics
            .sandboxes
            .get_or_create(&StateLabels { state })
            .set(counts[i]);
    }
    w.metrics.warm_ready.set(w.warm.ready() as i64);
    let mut out = String::new();
    let _ = prometheus_client::encoding::text::encode(&mut out, &w.metrics.registry);
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], out).into_response()
}
