//! The routes about the process itself, served without a credential: Prometheus
//! metrics, liveness and readiness (answered by [`crate::health`]).

use axum::extract::State;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use space_proto::openapi::Status;

use super::openapi::NotReady;
use super::request::{AppState, cp};
use crate::error::ControlError;

/// Prometheus metrics of the control plane and its edge (a standalone edge relays
/// this to its control plane).
#[utoipa::path(get, path = "/metrics", tag = "process",
    responses((status = 200, description = "Prometheus text", body = String, content_type = "text/plain; version=0.0.4")),
    security(()))]
pub(super) async fn metrics(State(st): State<AppState>) -> Result<Response, ControlError> {
    let text = cp(&st)?.metrics.encode();
    Ok(([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], text).into_response())
}

/// Liveness: 200 while the process serves.
#[utoipa::path(get, path = "/healthz", tag = "process",
    responses((status = 200, description = "`{\"status\":\"ok\"}`", body = Status)),
    security(()))]
pub(super) async fn healthz() -> Response {
    crate::health::healthz().await
}

/// Readiness: the control plane's store answers a query (a standalone edge: its
/// control plane's `/readyz` answers 200), within 2 s.
#[utoipa::path(get, path = "/readyz", tag = "process",
    responses((status = 200, description = "`{\"status\":\"ready\"}`", body = Status), NotReady),
    security(()))]
pub(super) async fn readyz(State(st): State<AppState>) -> Response {
    crate::health::readyz(st.edge).await
}
