//! `GET /metrics`: the worker's metrics (see [`crate::daemon::metrics`]) as text.

use std::sync::Arc;

use axum::extract::State;
use axum::http::header;
use axum::response::{IntoResponse, Response};

use crate::daemon::state::Worker;

#[utoipa::path(get, path = "/metrics", tag = "process", summary = "Prometheus metrics of this worker.", responses((status = 200, description = "Prometheus text", body = String, content_type = "text/plain; version=0.0.4")), security(()))]
pub(crate) async fn metrics(State(w): State<Arc<Worker>>) -> Response {
    let states: Vec<_> = w
        .slots
        .read()
        .map(|slots| slots.values().map(|s| s.record.state).collect())
        .unwrap_or_default();
    let mut out = w.metrics.render(states, w.warm.ready());
    if let Ok(egress) = w.egress() {
        out =
            crate::egress::metrics::splice(out, &crate::egress::metrics::render(&egress.tenants()));
    }
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], out).into_response()
}
