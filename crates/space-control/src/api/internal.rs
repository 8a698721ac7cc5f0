//! `/internal/v1/*`: what workers call — enrollment, sync, lost executions. They
//! authenticate by what they carry (the enrollment secret, the worker credential),
//! not by an API key, and their bodies are bounded by [`super::MAX_INTERNAL_BODY`].

use axum::Json;
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use space_identity::WorkerId;
use space_proto::api::{EnrollRequest, EnrollResponse, SignedUpdate};

use super::bodies::ExecutionLost;
use super::openapi::{Enrollment, LostReport, WorkerCall};
use super::request::{AppState, bearer, cp, parse};
use crate::error::ControlError;

/// Enroll a worker with the shared enrollment secret (re-enrolling an ID needs its
/// earlier credential).
#[utoipa::path(post, path = "/internal/v1/enroll", tag = "internal", request_body = EnrollRequest,
    responses((status = 200, description = "the worker's credential and the trust anchor", body = EnrollResponse), Enrollment),
    security(()), extensions(("x-internal" = json!(true))))]
pub(super) async fn enroll(
    State(st): State<AppState>,
    body: Bytes,
) -> Result<Response, ControlError> {
    let req: EnrollRequest = parse(&body)?;
    Ok(Json(cp(&st)?.enroll(&req).await?).into_response())
}

async fn worker_caller(
    st: &AppState,
    headers: &HeaderMap,
    id: &str,
) -> Result<space_store::WorkerRecord, ControlError> {
    let id: WorkerId = id.parse().map_err(|_| ControlError::Unauthorized)?;
    let b = bearer(headers)?;
    cp(st)?.authenticate_worker(&id, &b).await
}

/// A worker's sync: the signed key bundle and an install for each execution placed
/// there.
#[utoipa::path(post, path = "/internal/v1/workers/{id}/sync", tag = "internal",
    params(("id" = String, Path, description = "the worker's ID")),
    responses((status = 200, description = "the signed updates to apply, in order", body = Vec<SignedUpdate>), WorkerCall),
    security(("worker_credential" = [])), extensions(("x-internal" = json!(true))))]
pub(super) async fn sync(
    State(st): State<AppState>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Result<Response, ControlError> {
    let w = worker_caller(&st, &headers, &id).await?;
    Ok(Json(cp(&st)?.sync_for(&w).await?).into_response())
}

/// A worker reports an execution it no longer runs; the control plane starts a new
/// one.
#[utoipa::path(post, path = "/internal/v1/workers/{id}/lost", tag = "internal",
    params(("id" = String, Path, description = "the worker's ID")),
    request_body = ExecutionLost,
    responses((status = 204, description = "noted"), LostReport),
    security(("worker_credential" = [])), extensions(("x-internal" = json!(true))))]
pub(super) async fn lost(
    State(st): State<AppState>,
    headers: HeaderMap,
    Path(id): Path<String>,
    body: Bytes,
) -> Result<Response, ControlError> {
    let w = worker_caller(&st, &headers, &id).await?;
    let req: ExecutionLost = parse(&body)?;
    cp(&st)?
        .execution_lost(&w, &req.sandbox, req.generation)
        .await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}
