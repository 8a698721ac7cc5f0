//! What every handler starts from: the shared state, the caller authenticated (before
//! the body is read), the body parsed into its typed value, the sandbox looked up for
//! its owner.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderValue, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use serde::de::DeserializeOwned;
use space_identity::SandboxId;

use crate::edge::{Authenticated, Authority, Edge};
use crate::error::ControlError;
use crate::service::ControlPlane;

/// Largest request body (file uploads), read only once the API key is verified.
pub const MAX_BODY: usize = 64 << 20;

/// Largest body of an `/internal/v1/*` request (enrollment, sync, lost executions):
/// those authenticate by what they carry, so what is read first is kept small.
pub const MAX_INTERNAL_BODY: usize = 64 << 10;

/// Largest body of `PATCH /v1/sandboxes/{id}/network`: two lists of 256 rules of at
/// most 255 characters fit with room to spare.
pub const MAX_NETWORK_BODY: usize = 256 << 10;

/// The one `/v1/*` path served without an API key: the API's own description.
pub const OPENAPI_PATH: &str = "/v1/openapi.json";

tokio::task_local! {
    /// The caller [`authenticate_first`] verified for the request this task serves,
    /// with the key presented.
    static AUTHENTICATED: Authenticated;
}

/// Shared state of the handlers.
#[derive(Debug, Clone)]
pub struct AppState {
    /// The control plane (absent in a standalone edge).
    pub cp: Option<Arc<ControlPlane>>,
    /// The edge.
    pub edge: Arc<Edge>,
}

/// A standalone edge's state (no control plane in process).
pub fn edge_only(url: String) -> AppState {
    AppState {
        cp: None,
        edge: Edge::new(Authority::Remote {
            url,
            http: crate::http::HttpClient::new(std::time::Duration::from_secs(30)),
        }),
    }
}

pub(super) fn parse<T: DeserializeOwned>(body: &[u8]) -> Result<T, ControlError> {
    serde_json::from_slice(body)
        .map_err(|e| ControlError::BadRequest(format!("invalid JSON body: {e}")))
}

pub(super) fn bearer(headers: &HeaderMap) -> Result<String, ControlError> {
    let v = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .ok_or(ControlError::Unauthorized)?;
    v.strip_prefix("Bearer ")
        .map(|s| s.trim().to_owned())
        .ok_or(ControlError::Unauthorized)
}

pub(super) async fn caller(
    st: &AppState,
    headers: &HeaderMap,
) -> Result<Authenticated, ControlError> {
    let key = bearer(headers)?;
    // Verified already by `authenticate_first` in this task (the same key).
    if let Ok(Some(who)) = AUTHENTICATED.try_with(|who| who.presented(&key).then(|| who.clone())) {
        return Ok(who);
    }
    st.edge.authenticate(&key).await
}

/// Verifies the API key of every `/v1/*` request before its body is read, so an
/// unauthenticated client gets its 401 (and the connection is closed) without the
/// server reading, let alone buffering, what it sends. `/internal/v1/*` requests
/// authenticate by their worker credential or enrollment secret and are bounded by
/// [`MAX_INTERNAL_BODY`] instead; [`OPENAPI_PATH`] is public.
pub(super) async fn authenticate_first(
    State(st): State<AppState>,
    req: Request,
    next: Next,
) -> Response {
    let path = req.uri().path();
    if !path.starts_with("/v1/") || path == OPENAPI_PATH {
        return next.run(req).await;
    }
    match caller(&st, req.headers()).await {
        Ok(authenticated) => AUTHENTICATED.scope(authenticated, next.run(req)).await,
        Err(e) => {
            let mut resp = e.into_response();
            resp.headers_mut()
                .insert(header::CONNECTION, HeaderValue::from_static("close"));
            resp
        }
    }
}

pub(super) fn cp(st: &AppState) -> Result<&Arc<ControlPlane>, ControlError> {
    st.cp.as_ref().ok_or(ControlError::NotHere)
}

/// The caller's sandbox `id` (404 for anyone else's).
pub(super) async fn owned_sandbox(
    st: &AppState,
    headers: &HeaderMap,
    id: &str,
) -> Result<(Arc<ControlPlane>, space_store::SandboxRecord), ControlError> {
    let who = caller(st, headers).await?;
    let cp = Arc::clone(cp(st)?);
    let s = cp.sandbox_for(&who.caller, &sandbox_id(id)?).await?;
    Ok((cp, s))
}

pub(super) fn sandbox_id(s: &str) -> Result<SandboxId, ControlError> {
    s.parse().map_err(|_| ControlError::NotFound("sandbox"))
}

pub(super) fn path_and_query(req: &Request) -> String {
    req.uri()
        .path_and_query()
        .map_or_else(|| req.uri().path().to_owned(), |p| p.as_str().to_owned())
}
