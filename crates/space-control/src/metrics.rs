//! Prometheus metrics of the control plane and edge (`space_control_*`, `space_edge_*`).

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

/// Labels of a request.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RequestLabels {
    /// Route template (`/v1/sandboxes/{id}/exec`).
    pub route: String,
    /// Status class (`2xx`, `4xx` …).
    pub status: String,
}

/// Labels of a state gauge.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StateLabels {
    /// The state.
    pub state: String,
}

/// Labels of an edge recovery.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RecoveryLabels {
    /// What the worker said (`refresh_route` reason or `deny` reason).
    pub reason: String,
    /// `rebuilt_ok`, `failed`, `denied`.
    pub outcome: String,
}

/// The metrics.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    /// Requests by route and status class.
    pub requests: Family<RequestLabels, Counter>,
    /// Request latency by route.
    pub latency: Family<RequestLabels, Histogram>,
    /// Sandboxes by state (refreshed periodically).
    pub sandboxes: Family<StateLabels, Gauge>,
    /// Capabilities issued.
    pub capabilities_issued: Counter,
    /// Route recoveries at the edge.
    pub recoveries: Family<RecoveryLabels, Counter>,
    /// Creates served by claiming a standby sandbox.
    pub standby_claims: Counter,
    /// Standby sandboxes ready (refreshed by the standby keeper).
    pub standby_ready: Gauge,
    /// Resolves that waited for a transition longer than their bound.
    pub transition_timeouts: Counter,
    /// Time from a worker's RefreshRoute to the rebuilt attempt's answer at the edge.
    pub rebuilt_added: Histogram,
    /// Answers whose execution was not the one of the route used (never expected).
    pub wrong_execution: Counter,
    /// Service-port requests the edge refused, by reason.
    port_refusals: Family<ReasonLabels, Counter>,
    /// Tunnels the edge opened to workers' netgtw.
    port_tunnels: Counter,
    /// Templates sent to workers that lacked them, by result.
    template_pushes: Family<ResultLabels, Counter>,
    /// Standby sandboxes (ready or starting) per worker and template, as the keeper
    /// last counted them.
    pub standby_by_worker: Family<StandbyLabels, Gauge>,
}

/// Labels of a standby pool's share on a worker.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StandbyLabels {
    /// The worker.
    pub worker: String,
    /// The template as records name it.
    pub template: String,
    /// The network mode they were started in (`egress`: with their link made).
    pub network: String,
}

/// Labels of an outcome.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResultLabels {
    /// `ok` or `failed`.
    pub result: String,
}

/// Labels of a refusal.
#[derive(Clone, Debug, Hash, PartialEq, Eq, prometheus_client::encoding::EncodeLabelSet)]
pub struct ReasonLabels {
    /// Its code.
    pub reason: String,
}

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::default();
        let requests = Family::<RequestLabels, Counter>::default();
        let latency = Family::<RequestLabels, Histogram>::new_with_constructor(|| {
            Histogram::new(exponential_buckets(0.000_1, 2.0, 18))
        });
        let sandboxes = Family::<StateLabels, Gauge>::default();
        let capabilities_issued = Counter::default();
        let recoveries = Family::<RecoveryLabels, Counter>::default();
        registry.register("space_control_requests", "HTTP requests", requests.clone());
        registry.register(
            "space_control_request_duration_seconds",
            "HTTP request latency",
            latency.clone(),
        );
        registry.register(
            "space_control_sandboxes",
            "Sandboxes by state",
            sandboxes.clone(),
        );
        registry.register(
            "space_control_capabilities_issued",
            "Capabilities signed",
            capabilities_issued.clone(),
        );
        let standby_claims = Counter::default();
        let standby_ready = Gauge::default();
        let standby_by_worker = Family::<StandbyLabels, Gauge>::default();
        registry.register(
            "space_control_standby_by_worker",
            "Standby sandboxes (ready or starting) per worker and template",
            standby_by_worker.clone(),
        );
        registry.register(
            "space_control_standby_claims",
            "Creates served by claiming a standby sandbox",
            standby_claims.clone(),
        );
        registry.register(
            "space_control_standby_ready",
            "Standby sandboxes ready to be claimed",
            standby_ready.clone(),
        );
        registry.register(
            "space_edge_route_recoveries",
            "Route recoveries after a worker rejected a capability",
            recoveries.clone(),
        );
        let transition_timeouts = Counter::default();
        registry.register(
            "space_control_transition_wait_timeouts",
            "Resolves that gave up waiting for a sandbox's transition to end",
            transition_timeouts.clone(),
        );
        let rebuilt_added = Histogram::new(exponential_buckets(0.000_1, 2.0, 20));
        registry.register(
            "space_edge_rebuilt_added_seconds",
            "From a RefreshRoute to the rebuilt attempt's answer",
            rebuilt_added.clone(),
        );
        let wrong_execution = Counter::default();
        registry.register(
            "space_edge_wrong_execution_answers",
            "Worker answers naming another execution than the route the edge used",
            wrong_execution.clone(),
        );
        let port_refusals = Family::<ReasonLabels, Counter>::default();
        registry.register(
            "space_edge_port_refusals",
            "Service-port requests the edge refused, by reason (netgtw counts its own per sandbox and port)",
            port_refusals.clone(),
        );
        let port_tunnels = Counter::default();
        registry.register(
            "space_edge_port_tunnels",
            "Tunnels opened to workers' netgtw for service-port traffic",
            port_tunnels.clone(),
        );
        let template_pushes = Family::<ResultLabels, Counter>::default();
        registry.register(
            "space_control_template_pushes",
            "Templates sent to a worker that lacked one for an install, by result",
            template_pushes.clone(),
        );
        Self {
            registry,
            template_pushes,
            port_refusals,
            port_tunnels,
            transition_timeouts,
            rebuilt_added,
            wrong_execution,
            requests,
            latency,
            sandboxes,
            capabilities_issued,
            recoveries,
            standby_claims,
            standby_ready,
            standby_by_worker,
        }
    }
}

impl Metrics {
    /// The Prometheus text exposition.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }

    /// Counts a refused service-port request.
    pub fn port_refused(&self, reason: &str) {
        self.port_refusals
            .get_or_create(&ReasonLabels {
                reason: reason.to_owned(),
            })
            .inc();
    }

    /// Counts a template sent to a worker (`ok` or `failed`).
    pub fn template_pushed(&self, result: &str) {
        self.template_pushes
            .get_or_create(&ResultLabels {
                result: result.to_owned(),
            })
            .inc();
    }

    /// Counts a tunnel opened to a netgtw.
    pub fn port_opened(&self) {
        self.port_tunnels.inc();
    }

    /// Records one request.
    pub fn observe(&self, route: &str, status: u16, seconds: f64) {
        let labels = RequestLabels {
            route: route.to_owned(),
            status: format!("{}xx", status / 100),
        };
        self.requests.get_or_create(&labels).inc();
        self.latency.get_or_create(&labels).observe(seconds);
    }
}
