//! Liveness and readiness on node-api's route table (answered by
//! [`crate::daemon::health`]), without a credential.

use std::sync::Arc;

use axum::extract::State;
use axum::response::Response;
use space_proto::openapi::Status;

use super::openapi::NotReady;
use crate::daemon::state::Worker;

/// Liveness: 200 while node-api serves.
#[utoipa::path(get, path = "/healthz", tag = "process",
    responses((status = 200, description = "`{\"status\":\"ok\"}`", body = Status)),
    security(()))]
pub(super) async fn healthz() -> Response {
    crate::daemon::health::healthz().await
}

/// Readiness: enrolled, its start-up reconciliation done and its last sync with the
/// control plane through.
#[utoipa::path(get, path = "/readyz", tag = "process",
    responses((status = 200, description = "`{\"status\":\"ready\"}`", body = Status), NotReady),
    security(()))]
pub(super) async fn readyz(w: State<Arc<Worker>>) -> Response {
    crate::daemon::health::readyz(w).await
}
