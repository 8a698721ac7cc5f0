//! The worker's Prometheus metrics (`space_worker_*`): every layer counts through the
//! methods of [`WorkerMetrics`]; node-api's `GET /metrics` renders them.

use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use space_identity::Verdict;

use super::records::RecordState;

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
    admissions: Family<AdmissionLabels, Counter>,
    /// Latency of admitted operations.
    latency: Family<OpLabels, Histogram>,
    /// Executions launched.
    launches: Counter,
    /// Executions retired.
    retirements: Counter,
    /// Launches served by a warm jail (a subset of `launches`).
    warm_activations: Counter,
    /// Executions by record state (set when scraped).
    sandboxes: Family<StateLabels, Gauge>,
    /// Warm jails ready (set when scraped).
    warm_ready: Gauge,
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

impl WorkerMetrics {
    /// Counts one admission's verdict.
    pub fn admitted(&self, verdict: &Verdict) {
        self.admissions
            .get_or_create(&AdmissionLabels {
                verdict: verdict.kind_str(),
                reason: verdict.reason_str(),
            })
            .inc();
    }

    /// Records how long operation `op` took.
    pub fn observe(&self, op: &'static str, took: Duration) {
        self.latency
            .get_or_create(&OpLabels { op })
            .observe(took.as_secs_f64());
    }

    /// Counts a launch that a warm jail served (also counted by [`Self::launched`]).
    pub fn warm_activation(&self) {
        self.warm_activations.inc();
    }

    /// Counts a launched execution.
    pub fn launched(&self) {
        self.launches.inc();
    }

    /// Counts a retired (or lost) execution.
    pub fn retired(&self) {
        self.retirements.inc();
    }

    /// The text exposition, with the gauges set from `states` (the record state of
    /// every slot) and `warm_ready`.
    pub fn render(
        &self,
        states: impl IntoIterator<Item = RecordState>,
        warm_ready: usize,
    ) -> String {
        let mut counts = [0i64; 5];
        for state in states {
            let i = match state {
                RecordState::Starting => 0,
                RecordState::Running => 1,
                RecordState::Paused => 2,
                RecordState::Retired => 3,
                RecordState::Failed => 4,
            };
            counts[i] += 1;
        }
        for (i, state) in ["starting", "running", "paused", "retired", "failed"]
            .into_iter()
            .enumerate()
        {
            self.sandboxes
                .get_or_create(&StateLabels { state })
                .set(counts[i]);
        }
        self.warm_ready.set(warm_ready as i64);
        let mut out = String::new();
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }
}
