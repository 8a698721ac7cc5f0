//! Service ports of a sandbox: expose, list, close, and one-time links
//! (`API.md`, "Service ports"). The traffic itself is the edge's (`edge::ports`).

use axum::Json;
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use space_proto::api::ports::{ExposePort, PortList, PortView};
use space_proto::openapi::SandboxPath;

use super::openapi::PortChange;
use super::request::{AppState, owned_sandbox, parse};
use crate::error::ControlError;

/// The path of one port.
#[derive(Debug, serde::Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Path)]
pub(super) struct PortPath {
    /// Sandbox ID.
    id: String,
    /// The port inside the sandbox.
    port: u16,
}

/// Expose a port of the sandbox.
///
/// The answer carries the port's access token (`X-Space-Port-Token`) and a one-time
/// link for a browser; exposing an exposed port again replaces its protocol,
/// publicity and token (the old token, links and cookies stop working).
#[utoipa::path(post, path = "/v1/sandboxes/{id}/ports", tag = "ports", params(SandboxPath),
    request_body = ExposePort,
    responses(
        (status = 201, description = "exposed", body = PortView),
        (status = 200, description = "it was exposed already: replaced", body = PortView),
        PortChange),
    security(("api_key" = [])))]
pub(super) async fn expose(
    State(st): State<AppState>,
    headers: HeaderMap,
    Path(id): Path<String>,
    body: Bytes,
) -> Result<Response, ControlError> {
    let (cp, s) = owned_sandbox(&st, &headers, &id).await?;
    let req: ExposePort = parse(&body)?;
    let (view, new) = cp.expose_port(&s, req).await?;
    let status = if new {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    Ok((status, Json(view)).into_response())
}

/// List the sandbox's exposed ports (no tokens).
#[utoipa::path(get, path = "/v1/sandboxes/{id}/ports", tag = "ports", params(SandboxPath),
    responses((status = 200, description = "by port", body = PortList), PortChange),
    security(("api_key" = [])))]
pub(super) async fn list(
    State(st): State<AppState>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Result<Response, ControlError> {
    let (cp, s) = owned_sandbox(&st, &headers, &id).await?;
    let ports = cp.list_ports(&s).await?;
    Ok(Json(PortList { ports }).into_response())
}

/// Close a port: its connections end, its token, links and cookies stop working.
#[utoipa::path(delete, path = "/v1/sandboxes/{id}/ports/{port}", tag = "ports", params(PortPath),
    responses((status = 204, description = "closed"), PortChange),
    security(("api_key" = [])))]
pub(super) async fn close(
    State(st): State<AppState>,
    headers: HeaderMap,
    Path(p): Path<PortPath>,
) -> Result<Response, ControlError> {
    let (cp, s) = owned_sandbox(&st, &headers, &p.id).await?;
    cp.close_port(&s, p.port).await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

/// A new one-time link to the port: opening it in a browser sets a cookie (for a
/// day, for this port alone) and redirects to the port's URL. Usable once, for five
/// minutes.
#[utoipa::path(post, path = "/v1/sandboxes/{id}/ports/{port}/links", tag = "ports", params(PortPath),
    responses((status = 200, description = "the port, with `link`", body = PortView), PortChange),
    security(("api_key" = [])))]
pub(super) async fn link(
    State(st): State<AppState>,
    headers: HeaderMap,
    Path(p): Path<PortPath>,
) -> Result<Response, ControlError> {
    let (cp, s) = owned_sandbox(&st, &headers, &p.id).await?;
    Ok(Json(cp.port_link(&s, p.port).await?).into_response())
}
