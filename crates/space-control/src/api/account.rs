//! Who the caller is and what its tenant holds: `whoami`, tenants, API keys, signing
//! key rotation, and the list of workers.

use axum::Json;
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use space_proto::api::WorkerView;

use super::bodies::{KeyCreated, KeyRotated, NewKey, NewTenant, TenantCreated, WhoAmI};
use super::openapi::{AdminOnly, Authenticated, KeyRevocation, Listed, Rotation};
use super::request::{AppState, caller, cp, parse};
use crate::error::ControlError;

/// List the registered workers (any valid key).
#[utoipa::path(get, path = "/v1/workers", tag = "account",
    responses((status = 200, description = "every worker registered", body = Vec<WorkerView>), Listed),
    security(("api_key" = [])))]
pub(super) async fn workers(
    State(st): State<AppState>,
    headers: HeaderMap,
) -> Result<Response, ControlError> {
    caller(&st, &headers).await?;
    Ok(Json(cp(&st)?.workers().await?).into_response())
}

/// The caller's tenant and key (the standalone edge checks keys with it).
#[utoipa::path(get, path = "/v1/whoami", tag = "account",
    responses((status = 200, description = "the key's tenant, ID and whether it is an admin's", body = WhoAmI), Authenticated),
    security(("api_key" = [])))]
pub(super) async fn whoami(
    State(st): State<AppState>,
    headers: HeaderMap,
) -> Result<Response, ControlError> {
    let who = caller(&st, &headers).await?;
    let c = &who.caller;
    Ok(Json(WhoAmI {
        admin: c.admin,
        key_id: c.key_id.clone(),
        tenant: c.tenant.clone(),
    })
    .into_response())
}

/// Create a tenant and its first (non-admin) key (admin only).
#[utoipa::path(post, path = "/v1/tenants", tag = "account", request_body = NewTenant,
    responses((status = 201, description = "the tenant and its first key (`api_key` is shown only here)", body = TenantCreated), AdminOnly),
    security(("api_key" = [])))]
pub(super) async fn create_tenant(
    State(st): State<AppState>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, ControlError> {
    let who = caller(&st, &headers).await?;
    let c = &who.caller;
    if !c.admin {
        return Err(ControlError::Forbidden(
            "only an admin key may create tenants".into(),
        ));
    }
    let req: NewTenant = parse(&body)?;
    let (t, key) = cp(&st)?.create_tenant(&req.name, false).await?;
    let created = TenantCreated {
        api_key: key.text,
        key_id: key.id,
        name: t.name,
        tenant: t.id,
    };
    Ok((StatusCode::CREATED, Json(created)).into_response())
}

/// Create a non-admin key of the caller's tenant, as `space_…` or, with
/// `{"format": "e2b"}`, as `e2b_…` for E2B's SDKs.
#[utoipa::path(post, path = "/v1/keys", tag = "account",
    request_body(content = Option<NewKey>, description = "optional: an empty body makes a `space_…` key"),
    responses((status = 201, description = "the key (`api_key` is shown only here)", body = KeyCreated), Listed),
    security(("api_key" = [])))]
pub(super) async fn create_key(
    State(st): State<AppState>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, ControlError> {
    let who = caller(&st, &headers).await?;
    let c = &who.caller;
    let req: NewKey = if body.is_empty() {
        NewKey::default()
    } else {
        parse(&body)?
    };
    let format = match req.format.as_deref() {
        None | Some("space") => crate::auth::KeyFormat::Space,
        Some("e2b") => crate::auth::KeyFormat::E2b,
        Some(other) => {
            return Err(ControlError::BadRequest(format!(
                "format must be space or e2b, not {other:?}"
            )));
        }
    };
    let key = cp(&st)?.create_key_as(&c.tenant, false, format).await?;
    let created = KeyCreated {
        api_key: key.text,
        key_id: key.id,
    };
    Ok((StatusCode::CREATED, Json(created)).into_response())
}

/// Revoke a key of the caller's tenant (an admin: any key).
#[utoipa::path(delete, path = "/v1/keys/{id}", tag = "account",
    params(("id" = String, Path, description = "the key's ID (`ak…`)")),
    responses((status = 204, description = "revoked"), KeyRevocation),
    security(("api_key" = [])))]
pub(super) async fn revoke_key(
    State(st): State<AppState>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Result<Response, ControlError> {
    let who = caller(&st, &headers).await?;
    let c = &who.caller;
    cp(&st)?.revoke_key(c, &id).await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

/// Rotate the capability signing keys (admin only): answered once every active
/// worker acknowledged the new key bundle.
#[utoipa::path(post, path = "/v1/signing-keys/rotate", tag = "account",
    responses((status = 200, description = "the key now in use", body = KeyRotated), Rotation),
    security(("api_key" = [])))]
pub(super) async fn rotate(
    State(st): State<AppState>,
    headers: HeaderMap,
) -> Result<Response, ControlError> {
    let who = caller(&st, &headers).await?;
    let c = &who.caller;
    if !c.admin {
        return Err(ControlError::Forbidden(
            "only an admin key may rotate signing keys".into(),
        ));
    }
    let key_id = cp(&st)?.rotate_keys().await?;
    st.edge.clear();
    Ok(Json(KeyRotated { active_key: key_id }).into_response())
}
