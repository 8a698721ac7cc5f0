//! Template routes: import (admin only: templates are platform-wide), list, read,
//! remove. An import's body — an image archive of up to
//! [`ControlPlane::max_template_bytes`](crate::service::ControlPlane::max_template_bytes)
//! — is streamed to a spool file only once the caller is known to be an admin (the
//! key was checked before any byte of the body was read), then imported from there.

use axum::Json;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use space_proto::api::templates::{TemplateList, TemplateView};
use utoipa::IntoParams;

use super::openapi::{Listed, TemplateImport, TemplateRead, TemplateRemoval};
use super::request::{AppState, caller, cp};
use crate::error::ControlError;

/// `?name=` of an import.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub(super) struct ImportQuery {
    /// `name[:tag]` (`[a-z0-9._-]`, starting with a letter or a digit, at most 128
    /// each; the tag `latest` when none is given).
    name: String,
}

/// `{name}` of a template path: `name[:tag]`.
#[derive(Debug, IntoParams)]
#[into_params(parameter_in = Path)]
#[allow(
    dead_code,
    reason = "described; the handlers take the path as a string"
)]
pub(super) struct TemplatePath {
    /// `name[:tag]` (the tag `latest` when none is given).
    name: String,
}

fn admin_only(admin: bool) -> Result<(), ControlError> {
    if admin {
        Ok(())
    } else {
        Err(ControlError::Forbidden(
            "only an admin key may import or remove templates (they are platform-wide)".into(),
        ))
    }
}

/// Import a template from an image archive (admin only).
///
/// The body is an OCI image layout as a tar, or a `docker save` / `podman save`
/// archive (plain tar; gzip and zstd layers). Every layer blob is verified (sha256,
/// size, and the `diff_id` of its tar stream) and kept by the control plane, which
/// sends the template to a worker when an install there needs it. A template is
/// immutable: the same image again under its name is 201 with the same digest,
/// another image under a taken name is 409.
#[utoipa::path(post, path = "/v1/templates", tag = "templates", params(ImportQuery),
    request_body(content = Vec<u8>, content_type = "application/x-tar", description = "the image archive, at most 8 GiB"),
    responses((status = 201, description = "the template", body = TemplateView), TemplateImport),
    security(("api_key" = [])))]
pub(super) async fn import(
    State(st): State<AppState>,
    headers: HeaderMap,
    q: Result<Query<ImportQuery>, QueryRejection>,
    body: axum::body::Body,
) -> Result<Response, ControlError> {
    let who = caller(&st, &headers).await?;
    admin_only(who.caller.admin)?;
    let Query(q) = q.map_err(|_| {
        ControlError::BadRequest("an import names its template: ?name=NAME[:TAG]".into())
    })?;
    let cp = cp(&st)?;
    // The name is checked before the body is read.
    space_image::TemplateRef::parse(&q.name)
        .map_err(|e| ControlError::BadRequest(e.to_string()))?;
    let limit = cp.max_template_bytes();
    let too_large = || ControlError::TooLarge(format!("an image archive is at most {limit} bytes"));
    let announced = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if announced.is_some_and(|n| n > limit) {
        return Err(too_large());
    }
    let spool = cp.template_spool().await?;
    let file = spool
        .as_file()
        .try_clone()
        .map_err(|e| ControlError::Internal(format!("template spool: {e}")))?;
    let sink = std::io::BufWriter::with_capacity(256 << 10, file);
    match space_http::spool_body(body, limit, sink).await {
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::FileTooLarge => return Err(too_large()),
        Err(e) => {
            return Err(ControlError::BadRequest(format!(
                "the image archive did not arrive whole: {e}"
            )));
        }
    }
    let view = cp.import_template(&q.name, spool.path()).await?;
    Ok((StatusCode::CREATED, Json(view)).into_response())
}

/// The same import at the path `API.md` names (`POST /v1/templates/import?name=`),
/// which the SDK and the CLI use.
#[utoipa::path(post, path = "/v1/templates/import", tag = "templates", params(ImportQuery),
    request_body(content = Vec<u8>, content_type = "application/x-tar", description = "the image archive, at most 8 GiB"),
    responses((status = 201, description = "the template", body = TemplateView), TemplateImport),
    security(("api_key" = [])))]
pub(super) async fn import_named(
    st: State<AppState>,
    headers: HeaderMap,
    q: Result<Query<ImportQuery>, QueryRejection>,
    body: axum::body::Body,
) -> Result<Response, ControlError> {
    import(st, headers, q, body).await
}

/// List the templates (any caller).
#[utoipa::path(get, path = "/v1/templates", tag = "templates",
    responses((status = 200, description = "by name and tag; the host-directories `default` is not listed", body = TemplateList), Listed),
    security(("api_key" = [])))]
pub(super) async fn list(
    State(st): State<AppState>,
    headers: HeaderMap,
) -> Result<Response, ControlError> {
    caller(&st, &headers).await?;
    Ok(Json(cp(&st)?.templates().await?).into_response())
}

/// Read a template (any caller).
#[utoipa::path(get, path = "/v1/templates/{name}", tag = "templates", params(TemplatePath),
    responses((status = 200, description = "the template", body = TemplateView), TemplateRead),
    security(("api_key" = [])))]
pub(super) async fn get(
    State(st): State<AppState>,
    headers: HeaderMap,
    Path(name): Path<String>,
) -> Result<Response, ControlError> {
    caller(&st, &headers).await?;
    Ok(Json(cp(&st)?.template(&name).await?).into_response())
}

/// Remove a template's name (admin only).
///
/// Refused with 409 `template_in_use` while sandboxes that are not stopped were
/// created from its digest and no other name keeps it; blobs no template uses any
/// more are deleted. Workers keep their copies until their own store removes them.
#[utoipa::path(delete, path = "/v1/templates/{name}", tag = "templates", params(TemplatePath),
    responses((status = 204, description = "removed"), TemplateRemoval),
    security(("api_key" = [])))]
pub(super) async fn remove(
    State(st): State<AppState>,
    headers: HeaderMap,
    Path(name): Path<String>,
) -> Result<Response, ControlError> {
    let who = caller(&st, &headers).await?;
    admin_only(who.caller.admin)?;
    cp(&st)?.remove_template(&name).await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}
