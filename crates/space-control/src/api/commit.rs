//! `POST /v1/sandboxes/{id}/commit`: a sandbox's changes as a new template (admin
//! only: templates are platform-wide).

use axum::Json;
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use space_proto::api::templates::TemplateView;
use space_proto::openapi::SandboxPath;

use super::openapi::Change;
use super::request::{AppState, caller, cp, parse, sandbox_id};
use crate::error::ControlError;

/// The largest commit body (a name).
const MAX_COMMIT_BODY: usize = 4 << 10;

/// What a commit names.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct CommitRequest {
    /// The new template, `name[:tag]` (the tag `latest` when none is given); a name
    /// that holds another digest is 409.
    name: String,
}

/// Commit a sandbox's changes as a new template (admin only).
///
/// The sandbox (running or paused, created from an image template) is frozen while
/// its writable layer is archived, then carries on as it was. Its changes — files
/// written, files removed (OCI whiteouts), directories replaced (opaque) — become
/// one layer over its template's layers; the new template keeps the template's
/// process defaults. A sandbox of the host-directories `default` is 409.
#[utoipa::path(post, path = "/v1/sandboxes/{id}/commit", tag = "templates", params(SandboxPath),
    request_body(content = CommitRequest, description = "`{\"name\": \"NAME[:TAG]\"}`"),
    responses((status = 201, description = "the new template", body = TemplateView),
        (status = 403, description = "`forbidden`: not an admin key"), Change),
    security(("api_key" = [])))]
pub(super) async fn commit(
    State(st): State<AppState>,
    headers: HeaderMap,
    Path(id): Path<String>,
    body: Bytes,
) -> Result<Response, ControlError> {
    let who = caller(&st, &headers).await?;
    if !who.caller.admin {
        return Err(ControlError::Forbidden(
            "only an admin key may commit a sandbox as a template (templates are platform-wide)"
                .into(),
        ));
    }
    if body.len() > MAX_COMMIT_BODY {
        return Err(ControlError::TooLarge(format!(
            "a commit body is at most {} KiB",
            MAX_COMMIT_BODY >> 10
        )));
    }
    let req: CommitRequest = parse(&body)?;
    let cp = cp(&st)?;
    let s = cp.sandbox_for(&who.caller, &sandbox_id(&id)?).await?;
    let view = cp.commit_sandbox(&s, &req.name).await?;
    Ok((StatusCode::CREATED, Json(view)).into_response())
}
