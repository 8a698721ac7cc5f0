//! node-api: the worker's HTTP entry. Every sandbox-scoped request is parsed into a
//! [`admission::SandboxRequest`], admitted (capability verified and compared with the
//! persisted record — local state only) into an [`admission::Admitted`] request, and
//! only then handled: forwarded through the verified bridge. Whatever is not done is
//! a [`refusal::Refusal`], answered through one mapping to status and body.
//!
//! This module is the router alone; each child does one job:
//! [`admission`] (parse, admit, wait out a pause), [`refusal`] (the answers that are
//! not an operation's), [`agent`] (calls through the bridge), the handlers
//! ([`exec`], [`files`], [`paths`], [`streams`], [`updates`], [`snapshots`], [`metrics`],
//! [`probes`]), [`idempotency`] (non-idempotent operations run once per key), and
//! [`openapi`] (the frame of the document the route table describes: [`document`]).

use std::sync::Arc;

use axum::extract::{DefaultBodyLimit, FromRef};
use axum::response::IntoResponse;
use axum::routing::MethodRouter;
use axum::{Extension, Router};
use space_proto::api::MAX_EXEC_BODY;
use utoipa_axum::router::{OpenApiRouter, UtoipaMethodRouterExt as _};
use utoipa_axum::routes;

use super::state::Worker;

pub(crate) mod admission;
pub(crate) mod agent;
pub(crate) mod events;
pub(crate) mod exec;
pub(crate) mod files;
pub(crate) mod idempotency;
pub(crate) mod metrics;
pub(crate) mod netgtw;
pub(crate) mod openapi;
pub(crate) mod paths;
pub(crate) mod probes;
pub(crate) mod refusal;
pub(crate) mod snapshots;
pub mod streams;
pub(crate) mod templates;
pub(crate) mod tree;
pub(crate) mod updates;

#[cfg(test)]
pub(crate) mod tests;

pub use idempotency::{IDEMPOTENCY_MAX_BYTES, IDEMPOTENCY_MAX_ENTRIES, IdempotencyCache};

/// Largest request body read into memory (an exec's JSON). File writes are streamed
/// to the agent and not bound by it (the sandbox's disk limit is theirs); file reads
/// are streamed too, at any size.
const MAX_BUFFERED_BODY: usize = 64 << 20;

/// Largest body of a request that carries its own signature (a snapshot order).
const MAX_SIGNED_REQUEST: usize = 64 << 10;

/// What node-api's handlers share: the worker, and the answers of non-idempotent
/// operations by idempotency key (an HTTP concern, so kept here, not in the worker).
#[derive(Debug, Clone)]
pub struct NodeApi {
    /// The worker.
    pub worker: Arc<Worker>,
    /// Answers by idempotency key.
    pub idempotency: IdempotencyCache,
}

impl FromRef<NodeApi> for Arc<Worker> {
    fn from_ref(api: &NodeApi) -> Self {
        Arc::clone(&api.worker)
    }
}

impl FromRef<NodeApi> for IdempotencyCache {
    fn from_ref(api: &NodeApi) -> Self {
        api.idempotency.clone()
    }
}

/// Every route of node-api, each with its description: the router and the OpenAPI
/// document are built from the same declarations (each handler's `#[utoipa::path]`,
/// gathered by `routes!`), so no route is served undescribed. The admission layers
/// need the worker; the document does not (`None`: the same routes, unlayered).
fn routes(worker: Option<&Arc<Worker>>) -> OpenApiRouter<NodeApi> {
    let admitted_first = |r: MethodRouter<NodeApi>| match worker {
        Some(w) => r.route_layer(axum::middleware::from_fn_with_state(
            Arc::clone(w),
            admission::admitted_first,
        )),
        None => r,
    };
    let sandboxes = OpenApiRouter::default()
        .routes(
            routes!(exec::exec)
                .map(|r| admitted_first(r.layer(DefaultBodyLimit::max(MAX_EXEC_BODY)))),
        )
        .routes(
            routes!(files::read_file, files::write_file, files::remove_file).map(admitted_first),
        )
        .routes(routes!(files::list_files))
        .routes(routes!(paths::stat))
        .routes(routes!(paths::mkdir).map(admitted_first))
        .routes(
            routes!(paths::rename)
                .map(|r| admitted_first(r.layer(DefaultBodyLimit::max(paths::MAX_RENAME_BODY)))),
        )
        .routes(routes!(tree::read_tree, tree::write_tree).map(admitted_first))
        .routes(routes!(events::events))
        .routes(routes!(streams::terminal))
        .routes(routes!(streams::watch))
        .routes(routes!(streams::exec_stream))
        .routes(routes!(netgtw::open));
    let sandboxes = match worker {
        Some(w) => sandboxes.route_layer(axum::middleware::from_fn_with_state(
            Arc::clone(w),
            admission::held_while_adopting,
        )),
        None => sandboxes,
    };
    OpenApiRouter::with_openapi(openapi::frame())
        .merge(sandboxes)
        .merge(
            // Updates, snapshots and layers run to their end whatever becomes of the
            // caller (see `space_http::run_to_end`).
            OpenApiRouter::default()
                .routes(routes!(updates::apply_update))
                .routes(
                    routes!(snapshots::snapshot).layer(DefaultBodyLimit::max(MAX_SIGNED_REQUEST)),
                )
                // The body is streamed to disk once the signed update in its header
                // is verified (no body limit here: the signed size is the limit).
                .routes(routes!(snapshots::layer))
                .routes(routes!(templates::receive))
                .route_layer(axum::middleware::from_fn(space_http::run_to_end)),
        )
        .routes(routes!(metrics::metrics))
        .routes(routes!(probes::healthz))
        .routes(routes!(probes::readyz))
        .routes(routes!(openapi::openapi_json))
}

/// The worker API's OpenAPI 3.1 document.
pub fn document() -> utoipa::openapi::OpenApi {
    routes(None).into_openapi()
}

/// The document as served and checked in: pretty JSON, keys sorted, a final newline.
pub fn document_json() -> String {
    let value = serde_json::to_value(document()).unwrap_or_default();
    let mut text = serde_json::to_string_pretty(&value).unwrap_or_default();
    text.push('\n');
    text
}

/// The router.
pub fn router(worker: Arc<Worker>) -> Router {
    let served = openapi::Served(Arc::from(document_json()));
    let (routes, _) = routes(Some(&worker)).split_for_parts();
    routes
        .fallback(|| async { refusal::Refusal::NoRoute.into_response() })
        .layer(Extension(served))
        .layer(DefaultBodyLimit::max(MAX_BUFFERED_BODY))
        .with_state(NodeApi {
            worker,
            idempotency: IdempotencyCache::default(),
        })
}
