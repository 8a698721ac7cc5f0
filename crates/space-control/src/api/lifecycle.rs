//! The sandbox routes the control plane answers itself: create, list, read, delete,
//! pause, resume, migrate, snapshot, the network policy, and capability issuance.

use axum::Json;
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use space_identity::AccessSet;
use space_proto::api::{CapabilityRequest, CapabilityResponse, CreateSandbox, Policy, Sandbox};
use space_proto::openapi::{NetworkSchema, SandboxPath};

use super::bodies::{MigrateRequest, ResumeRequest, SnapshotTaken, TtlRequest};
use super::openapi::{Change, Create, Issue, Listed, SandboxRead};
use super::request::{AppState, MAX_NETWORK_BODY, caller, cp, owned_sandbox, parse};
use crate::error::ControlError;

/// Create a sandbox.
///
/// An empty body, or any field left out, takes the default. A create with no `env`,
/// no `worker` and default limits may claim a pre-started standby sandbox.
#[utoipa::path(post, path = "/v1/sandboxes", tag = "sandboxes",
    request_body(content = Option<CreateSandbox>, description = "optional: an empty body takes every default"),
    responses((status = 201, description = "the sandbox, normally `running`", body = Sandbox), Create),
    security(("api_key" = [])))]
pub(super) async fn create_sandbox(
    State(st): State<AppState>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, ControlError> {
    let who = caller(&st, &headers).await?;
    let c = &who.caller;
    let req: CreateSandbox = if body.is_empty() {
        CreateSandbox::default()
    } else {
        parse(&body).map_err(|e| network_error(&body).unwrap_or(e))?
    };
    let cp = cp(&st)?;
    let view = cp.create_sandbox(c, req).await?;
    Ok((StatusCode::CREATED, Json(view)).into_response())
}

/// Why a create's body that did not parse was refused, when its `network` is the
/// cause: said as the policy's own error (`network: allow[1] "…": …`) rather than
/// as a position in the body. Only read on that error path.
fn network_error(body: &[u8]) -> Option<ControlError> {
    let value: serde_json::Value = serde_json::from_slice(body).ok()?;
    let network = value.get("network")?.clone();
    let e = serde_json::from_value::<Option<Policy>>(network).err()?;
    Some(ControlError::BadRequest(format!(
        "invalid network policy: {e}"
    )))
}

/// Replace the sandbox's network policy.
///
/// Stored first, then given to the worker of its current execution: new connections
/// and DNS questions are judged by it (established ones are kept). Every later
/// execution (restart, migration, resume, snapshot restore) gets it too.
#[utoipa::path(patch, path = "/v1/sandboxes/{id}/network", tag = "sandboxes", params(SandboxPath),
    request_body(content = NetworkSchema, description = "the whole policy: `{\"mode\": \"none\"|\"egress\", \"allow\": […], \"deny\": […]}`; at most 256 KiB"),
    responses((status = 200, description = "the sandbox, `network` as stored and in effect", body = Sandbox), Change),
    security(("api_key" = [])))]
pub(super) async fn set_network(
    State(st): State<AppState>,
    headers: HeaderMap,
    Path(id): Path<String>,
    body: axum::body::Body,
) -> Result<Response, ControlError> {
    let (cp, s) = owned_sandbox(&st, &headers, &id).await?;
    let body = axum::body::to_bytes(body, MAX_NETWORK_BODY)
        .await
        .map_err(|_| {
            ControlError::TooLarge(format!(
                "a network policy body is at most {} KiB",
                MAX_NETWORK_BODY >> 10
            ))
        })?;
    let policy: Policy = serde_json::from_slice(&body)
        .map_err(|e| ControlError::BadRequest(format!("invalid network policy: {e}")))?;
    Ok(Json(cp.set_network(&s, policy).await?).into_response())
}

/// List the caller's tenant's sandboxes, `stopped` ones included.
#[utoipa::path(get, path = "/v1/sandboxes", tag = "sandboxes",
    responses((status = 200, description = "ordered by `created_at`, then `id`; not paginated", body = Vec<Sandbox>), Listed),
    security(("api_key" = [])))]
pub(super) async fn list_sandboxes(
    State(st): State<AppState>,
    headers: HeaderMap,
) -> Result<Response, ControlError> {
    let who = caller(&st, &headers).await?;
    let c = &who.caller;
    let cp = cp(&st)?;
    let mut out = Vec::new();
    for s in cp.store.list_sandboxes(&c.tenant).await? {
        out.push(cp.view(&s).await?);
    }
    Ok(Json(out).into_response())
}

/// Read a sandbox.
#[utoipa::path(get, path = "/v1/sandboxes/{id}", tag = "sandboxes", params(SandboxPath),
    responses((status = 200, description = "the sandbox", body = Sandbox), SandboxRead),
    security(("api_key" = [])))]
pub(super) async fn get_sandbox(
    State(st): State<AppState>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Result<Response, ControlError> {
    let (cp, s) = owned_sandbox(&st, &headers, &id).await?;
    Ok(Json(cp.view(&s).await?).into_response())
}

/// Delete a sandbox: it becomes `stopped` and its execution is retired (deleting a
/// stopped sandbox again is 204 too).
#[utoipa::path(delete, path = "/v1/sandboxes/{id}", tag = "sandboxes", params(SandboxPath),
    responses((status = 204, description = "stopped"), Change),
    security(("api_key" = [])))]
pub(super) async fn delete_sandbox(
    State(st): State<AppState>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Result<Response, ControlError> {
    let (cp, s) = owned_sandbox(&st, &headers, &id).await?;
    cp.delete_sandbox(&s).await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

/// Set a sandbox's time to live, from now (`null`: no expiry). A sandbox created to
/// pause at its TTL pauses at the new one.
#[utoipa::path(post, path = "/v1/sandboxes/{id}/ttl", tag = "sandboxes", params(SandboxPath),
    request_body = TtlRequest,
    responses((status = 200, description = "the sandbox, `expires_at` as set", body = Sandbox), Change),
    security(("api_key" = [])))]
pub(super) async fn set_ttl(
    State(st): State<AppState>,
    headers: HeaderMap,
    Path(id): Path<String>,
    body: Bytes,
) -> Result<Response, ControlError> {
    let req: TtlRequest = parse(&body)?;
    let (cp, s) = owned_sandbox(&st, &headers, &id).await?;
    cp.set_ttl(&s, req.ttl_secs, crate::now_secs() as i64)
        .await?;
    Ok(Json(cp.view(&cp.store.get_sandbox(&s.id).await?).await?).into_response())
}

/// Pause a sandbox: its execution freezes in place (a no-op if already `paused`).
#[utoipa::path(post, path = "/v1/sandboxes/{id}/pause", tag = "sandboxes", params(SandboxPath),
    responses((status = 200, description = "the sandbox as it is afterwards", body = Sandbox), Change),
    security(("api_key" = [])))]
pub(super) async fn pause(
    State(st): State<AppState>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Result<Response, ControlError> {
    let (cp, s) = owned_sandbox(&st, &headers, &id).await?;
    cp.pause(&s).await?;
    Ok(Json(cp.view(&cp.store.get_sandbox(&s.id).await?).await?).into_response())
}

/// Resume a sandbox: in place (an empty body), or from its stored snapshot on the
/// worker named, as a new execution.
#[utoipa::path(post, path = "/v1/sandboxes/{id}/resume", tag = "sandboxes", params(SandboxPath),
    request_body(content = Option<ResumeRequest>, description = "optional: an empty body resumes in place"),
    responses((status = 200, description = "the sandbox as it is afterwards", body = Sandbox), Change),
    security(("api_key" = [])))]
pub(super) async fn resume(
    State(st): State<AppState>,
    headers: HeaderMap,
    Path(id): Path<String>,
    body: Bytes,
) -> Result<Response, ControlError> {
    let req: ResumeRequest = if body.is_empty() {
        ResumeRequest::default()
    } else {
        parse(&body)?
    };
    let (cp, s) = owned_sandbox(&st, &headers, &id).await?;
    match req.worker {
        // Resuming on a worker restores the snapshot there as a new execution.
        Some(w) => cp.resume_from_snapshot(&s, &w).await?,
        // In place: the same execution thaws; a stored snapshot is then stale.
        None => {
            cp.resume(&s).await?;
            cp.forget_snapshot(&s.id).await;
        }
    }
    Ok(Json(cp.view(&cp.store.get_sandbox(&s.id).await?).await?).into_response())
}

/// Migrate a sandbox to another worker: a new execution, the same files; `running`
/// afterwards.
#[utoipa::path(post, path = "/v1/sandboxes/{id}/migrate", tag = "sandboxes", params(SandboxPath),
    request_body = MigrateRequest,
    responses((status = 200, description = "the sandbox as it is afterwards", body = Sandbox), Change),
    security(("api_key" = [])))]
pub(super) async fn migrate(
    State(st): State<AppState>,
    headers: HeaderMap,
    Path(id): Path<String>,
    body: Bytes,
) -> Result<Response, ControlError> {
    let req: MigrateRequest = parse(&body)?;
    let (cp, s) = owned_sandbox(&st, &headers, &id).await?;
    cp.migrate(&s, &req.worker).await?;
    Ok(Json(cp.view(&cp.store.get_sandbox(&s.id).await?).await?).into_response())
}

/// Snapshot a sandbox: it freezes and its writable layer is kept on the control
/// plane; it is `paused` afterwards.
#[utoipa::path(post, path = "/v1/sandboxes/{id}/snapshot", tag = "sandboxes", params(SandboxPath),
    responses((status = 200, description = "the snapshot kept", body = SnapshotTaken), Change),
    security(("api_key" = [])))]
pub(super) async fn snapshot(
    State(st): State<AppState>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Result<Response, ControlError> {
    let (cp, s) = owned_sandbox(&st, &headers, &id).await?;
    // The answer goes out as its documented type (the same bytes: see `bodies`).
    let taken: SnapshotTaken = serde_json::from_value(cp.snapshot(&s).await?)
        .map_err(|e| ControlError::Internal(format!("snapshot answer: {e}")))?;
    Ok(Json(taken).into_response())
}

/// Issue a capability for the sandbox's running execution (direct mode: the caller
/// then calls its worker with `Authorization: SpaceCap <token>`).
///
/// During a transition it waits (`wait_ms`) for the next execution rather than
/// answer `not_running`.
#[utoipa::path(post, path = "/v1/sandboxes/{id}/capabilities", tag = "sandboxes", params(SandboxPath),
    request_body = CapabilityRequest,
    responses((status = 200, description = "the capability (60 s) and the route it selects", body = CapabilityResponse), Issue),
    security(("api_key" = [])))]
pub(super) async fn capability(
    State(st): State<AppState>,
    headers: HeaderMap,
    Path(id): Path<String>,
    body: Bytes,
) -> Result<Response, ControlError> {
    let req: CapabilityRequest = parse(&body)?;
    let (cp, s) = owned_sandbox(&st, &headers, &id).await?;
    // During a transition, wait for the next execution rather than answer
    // `not_running`: a client resolving after a RefreshRoute then makes its one rebuilt
    // attempt against an execution that runs.
    let wait = req
        .wait_ms
        .map_or(cp.transition_wait(), std::time::Duration::from_millis);
    let s = cp.settled_record(s, wait).await?;
    let port = match (req.port, req.protocol) {
        (Some(p), Some(proto)) => Some((p, proto)),
        (None, None) => None,
        _ => {
            return Err(ControlError::BadRequest(
                "port and protocol go together".into(),
            ));
        }
    };
    let cap = cp
        .issue_capability(&s, AccessSet::of(&req.access), req.purpose, port)
        .await?;
    if req.rebuilt {
        cp.note_rebuilt(&cap);
    }
    Ok(Json(cap).into_response())
}
