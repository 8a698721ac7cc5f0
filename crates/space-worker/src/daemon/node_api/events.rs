//! `GET /v1/sandboxes/{id}/events`: what the platform refused the sandbox lately.

use std::sync::Arc;

use axum::Json;
use axum::extract::{Path, State};
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use space_identity::Access;
use space_proto::api::{EventList, SandboxEvent};

use super::admission::parse_and_admit;
use super::agent::with_execution;
use crate::daemon::state::Worker;

/// The sandbox's recent network refusals on the execution the capability names.
#[utoipa::path(get, path = "/v1/sandboxes/{id}/events", tag = "sandbox", summary = "What the platform refused the sandbox lately (network policy refusals), newest first.", params(space_proto::openapi::SandboxPath), responses((status = 200, description = "its events", body = EventList, headers(("space-execution" = String, description = "the execution that answered"))), super::openapi::Operation), security(("capability" = [])))]
pub(crate) async fn events(
    State(w): State<Arc<Worker>>,
    Path(id): Path<String>,
    headers: HeaderMap,
) -> Response {
    let admitted = match parse_and_admit(&w, &headers, &id, Access::FsRead) {
        Ok(a) => a,
        Err(r) => return r.into_response(),
    };
    let sandbox = admitted.sandbox();
    let slot = admitted.into_slot();
    // Only this execution's link counts: a tenant is per execution.
    let refusals = w
        .egress()
        .ok()
        .and_then(|e| e.tenant_of(&sandbox, slot.record.execution()))
        .map(|t| t.refusals())
        .unwrap_or_default();
    let events = refusals
        .into_iter()
        .map(|r| SandboxEvent {
            at: space_proto::api::rfc3339(r.at),
            kind: "network_refused".into(),
            via: r.via.into(),
            target: r.target,
            layer: r.layer.into(),
            rule: r.rule,
        })
        .collect();
    with_execution(Json(EventList { events }).into_response(), &slot)
}
