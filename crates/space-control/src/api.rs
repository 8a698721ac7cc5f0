//! The HTTP API of the control plane and edge (`API.md`), and the internal endpoints
//! workers call. Requests are parsed into typed values here; handlers never see raw
//! input, and bad input is a 4xx with a JSON error, never a 500.
//!
//! Every route is declared once, by its handler's `#[utoipa::path]`; the route tables
//! below gather those declarations with `utoipa_axum::routes!`, which builds the
//! router and the OpenAPI document ([`document`]; its frame and error answers in
//! [`openapi`]) from them together: a route cannot be served without being described.
//!
//! The handlers, by what they do: [`lifecycle`] (sandboxes and capabilities, answered
//! here), [`forward`] (operations forwarded to workers; the standalone edge's relay),
//! [`account`] (whoami, tenants, keys, workers), [`templates`] (import, list, read,
//! remove), [`internal`] (what workers call),
//! [`probes`] (metrics, health); [`request`] is what they share (state, the caller
//! authenticated before the body is read, parsing), [`bodies`] the JSON bodies only
//! these routes use, [`error`] the one mapping of errors to answers.

use std::sync::Arc;
use std::time::Instant;

use axum::Extension;
pub use axum::Router;
use axum::extract::{DefaultBodyLimit, MatchedPath, Request, State};
use axum::middleware::{self, Next};
use axum::response::Response;
use utoipa_axum::router::{OpenApiRouter, UtoipaMethodRouterExt as _};
use utoipa_axum::routes;

use crate::error::ControlError;

mod account;
pub mod bodies;
mod commit;
pub mod error;
mod forward;
mod internal;
mod lifecycle;
pub mod openapi;
mod ports;
mod probes;
mod request;
mod templates;

pub use request::{
    AppState, MAX_BODY, MAX_INTERNAL_BODY, MAX_NETWORK_BODY, OPENAPI_PATH, edge_only,
};
pub use space_http::serve_until;

/// Every route of the control plane's router, each with its description.
fn routes() -> OpenApiRouter<AppState> {
    // Changes of state run to their end whatever becomes of the caller (see
    // `space_http::run_to_end`); forwarded operations are the worker's business.
    let changes = OpenApiRouter::default()
        .routes(routes!(
            lifecycle::create_sandbox,
            lifecycle::list_sandboxes
        ))
        .routes(routes!(lifecycle::get_sandbox, lifecycle::delete_sandbox))
        .routes(routes!(lifecycle::capability))
        .routes(routes!(lifecycle::set_ttl))
        .routes(routes!(lifecycle::pause))
        .routes(routes!(lifecycle::resume))
        .routes(routes!(lifecycle::migrate))
        .routes(routes!(lifecycle::snapshot))
        .routes(routes!(lifecycle::set_network))
        .routes(routes!(ports::expose, ports::list))
        .routes(routes!(ports::close))
        .routes(routes!(ports::link))
        .routes(routes!(account::create_tenant))
        .routes(routes!(account::create_key))
        .routes(routes!(account::revoke_key))
        .routes(routes!(account::rotate))
        .routes(routes!(templates::import, templates::list))
        .routes(routes!(templates::import_named))
        .routes(routes!(templates::get, templates::remove))
        .routes(routes!(commit::commit))
        .routes(routes!(internal::enroll).layer(internal_limit()))
        .routes(routes!(internal::sync).layer(internal_limit()))
        .routes(routes!(internal::lost).layer(internal_limit()))
        .route_layer(middleware::from_fn(space_http::run_to_end));
    OpenApiRouter::with_openapi(openapi::frame())
        .merge(changes)
        .merge(forwarded())
        .routes(routes!(account::workers))
        .routes(routes!(account::whoami))
        .routes(routes!(probes::metrics))
        .merge(probes())
}

/// The operations forwarded to workers, served by the control plane's edge and by a
/// standalone one.
fn forwarded() -> OpenApiRouter<AppState> {
    OpenApiRouter::default()
        .routes(routes!(forward::forward_exec))
        .routes(routes!(
            forward::read_file,
            forward::write_file,
            forward::remove_file
        ))
        .routes(routes!(forward::forward_list))
        .routes(routes!(forward::stat_file))
        .routes(routes!(forward::make_dir))
        .routes(routes!(forward::rename_file))
        .routes(routes!(forward::read_tree, forward::write_tree))
        .routes(routes!(forward::events))
        .routes(routes!(forward::terminal))
        .routes(routes!(forward::watch))
        .routes(routes!(forward::exec_stream))
}

/// Health, readiness and the document, served by every edge itself.
fn probes() -> OpenApiRouter<AppState> {
    OpenApiRouter::default()
        .routes(routes!(probes::healthz))
        .routes(routes!(probes::readyz))
        .routes(routes!(openapi::openapi_json))
}

/// The edge API's OpenAPI 3.1 document.
pub fn document() -> utoipa::openapi::OpenApi {
    routes().into_openapi()
}

/// The document as served and checked in: pretty JSON, keys sorted, a final newline.
pub fn document_json() -> String {
    let value = serde_json::to_value(document()).unwrap_or_default();
    let mut text = serde_json::to_string_pretty(&value).unwrap_or_default();
    text.push('\n');
    text
}

/// What `GET /v1/openapi.json` answers.
fn served() -> Extension<openapi::Served> {
    Extension(openapi::Served(Arc::from(document_json())))
}

/// The router.
pub fn router(state: AppState) -> Router {
    let (routes, _) = routes().split_for_parts();
    routes
        .fallback(|| async { ControlError::NotFound("route") })
        .layer(served())
        .layer(DefaultBodyLimit::max(MAX_BODY))
        .layer(middleware::from_fn_with_state(
            state.clone(),
            request::authenticate_first,
        ))
        .layer(middleware::from_fn_with_state(state.clone(), observe))
        // Service-port traffic never reaches the API (nor its key check).
        .layer(middleware::from_fn_with_state(
            std::sync::Arc::clone(&state.edge),
            crate::edge::ports::entry,
        ))
        .with_state(state)
}

fn internal_limit() -> DefaultBodyLimit {
    DefaultBodyLimit::max(MAX_INTERNAL_BODY)
}

async fn observe(State(st): State<AppState>, req: Request, next: Next) -> Response {
    let route = req
        .extensions()
        .get::<MatchedPath>()
        .map_or_else(|| "unmatched".to_owned(), |p| p.as_str().to_owned());
    let start = Instant::now();
    let resp = next.run(req).await;
    if let Some(cp) = &st.cp {
        cp.metrics.observe(
            &route,
            resp.status().as_u16(),
            start.elapsed().as_secs_f64(),
        );
    }
    resp
}

/// The routes a standalone edge serves itself (a subset of [`routes`]'s, described by
/// the same declarations); it relays every other request to its control plane, so
/// it serves the whole [`document`].
fn edge_routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::default().merge(forwarded()).merge(probes())
}

/// The router of a standalone edge: sandbox operations are forwarded to workers with
/// route recovery; everything else is relayed to the control plane as is.
pub fn edge_router(state: AppState) -> Router {
    let (routes, _) = edge_routes().split_for_parts();
    routes
        .fallback(forward::relay_to_control)
        .layer(served())
        .layer(DefaultBodyLimit::max(MAX_BODY))
        .layer(middleware::from_fn_with_state(
            state.clone(),
            request::authenticate_first,
        ))
        .layer(middleware::from_fn_with_state(
            std::sync::Arc::clone(&state.edge),
            crate::edge::ports::entry,
        ))
        .with_state(state)
}

#[cfg(test)]
mod tests;
