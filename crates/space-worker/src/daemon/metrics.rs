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

/// Labels of a service port's traffic at netgtw.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PortLabels {
    /// Sandbox.
    pub sandbox: String,
    /// Port.
    pub port: u16,
}

/// Labels of a service port's bytes.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PortBytesLabels {
    /// Sandbox.
    pub sandbox: String,
    /// Port.
    pub port: u16,
    /// `to_sandbox` or `from_sandbox`.
    pub direction: &'static str,
}

/// Labels of a refused service-port connection or request.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PortRefusalLabels {
    /// Sandbox (as the request named it).
    pub sandbox: String,
    /// Port.
    pub port: u16,
    /// Reason code.
    pub reason: String,
}

/// The byte counters of one service port (a connection into the sandbox writes to
/// it, reads from it).
#[derive(Debug, Clone)]
pub struct PortBytes {
    to_sandbox: Counter,
    from_sandbox: Counter,
}

impl space_http::proxy::Count for PortBytes {
    fn read(&self, n: u64) {
        self.from_sandbox.inc_by(n);
    }

    fn written(&self, n: u64) {
        self.to_sandbox.inc_by(n);
    }
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
    /// Service-port connections netgtw opened into a sandbox.
    port_connections: Family<PortLabels, Counter>,
    /// Service-port bytes through netgtw.
    port_bytes: Family<PortBytesLabels, Counter>,
    /// Service-port connections and requests netgtw refused.
    port_refusals: Family<PortRefusalLabels, Counter>,
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
        let port_connections = Family::<PortLabels, Counter>::default();
        let port_bytes = Family::<PortBytesLabels, Counter>::default();
        let port_refusals = Family::<PortRefusalLabels, Counter>::default();
        registry.register(
            "space_worker_port_connections",
            "Service-port connections netgtw opened into a sandbox, by sandbox and port",
            port_connections.clone(),
        );
        registry.register(
            "space_worker_port_bytes",
            "Service-port bytes through netgtw, by sandbox, port and direction",
            port_bytes.clone(),
        );
        registry.register(
            "space_worker_port_refusals",
            "Service-port connections and requests netgtw refused, by sandbox, port and reason",
            port_refusals.clone(),
        );
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
            port_connections,
            port_bytes,
            port_refusals,
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

    /// Counts a connection netgtw opened to `port` of `sandbox`.
    pub fn port_connected(&self, sandbox: &space_identity::SandboxId, port: u16) {
        self.port_connections
            .get_or_create(&PortLabels {
                sandbox: sandbox.to_string(),
                port,
            })
            .inc();
    }

    /// The byte counters of a sandbox's port, counted as traffic flows.
    pub fn port_bytes(&self, sandbox: &space_identity::SandboxId, port: u16) -> PortBytes {
        let counter = |direction| {
            self.port_bytes
                .get_or_create(&PortBytesLabels {
                    sandbox: sandbox.to_string(),
                    port,
                    direction,
                })
                .clone()
        };
        PortBytes {
            to_sandbox: counter("to_sandbox"),
            from_sandbox: counter("from_sandbox"),
        }
    }

    /// Counts a refused service-port connection or request; `sandbox` only when it
    /// is one held here (`-` otherwise: a caller cannot grow the label set with
    /// names of its own).
    pub fn port_refused(
        &self,
        sandbox: Option<&space_identity::SandboxId>,
        port: u16,
        reason: &str,
    ) {
        let sandbox = sandbox.map_or_else(|| "-".to_owned(), ToString::to_string);
        self.port_refusals
            .get_or_create(&PortRefusalLabels {
                sandbox,
                port,
                reason: reason.to_owned(),
            })
            .inc();
    }

    /// Drops the port series of a sandbox that no longer runs here (its counters
    /// would otherwise stay for the worker's life).
    pub fn forget_ports(&self, sandbox: &space_identity::SandboxId, ports: &[u16]) {
        let sandbox = sandbox.to_string();
        for &port in ports {
            self.port_connections.remove(&PortLabels {
                sandbox: sandbox.clone(),
                port,
            });
            for direction in ["to_sandbox", "from_sandbox"] {
                self.port_bytes.remove(&PortBytesLabels {
                    sandbox: sandbox.clone(),
                    port,
                    direction,
                });
            }
        }
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
