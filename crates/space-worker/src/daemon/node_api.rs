//! node-api: the worker's HTTP entry. Every sandbox-scoped request is parsed into a
//! [`admission::SandboxRequest`], admitted (capability verified and compared with the
//! persisted record — local state only) into an [`admission::Admitted`] request, and
//! only then handled: forwarded through the verified bridge. Whatever is not done is
//! a [`refusal::Refusal`], answered through one mapping to status and body.
//!
//! This module is the router alone; each child does one job:
//! [`admission`] (parse, admit, wait out a pause), [`refusal`] (the answers that are
//! not an operation's), [`agent`] (calls through the bridge), the handlers
//! ([`exec`], [`files`], [`streams`], [`updates`], [`snapshots`], [`metrics`]), and
//! [`idempotency`] (non-idempotent operations run once per key).

use std::sync::Arc;

use axum::Router;
use axum::extract::{DefaultBodyLimit, FromRef};
use axum::response::IntoResponse;
use axum::routing::{get, post};
use space_proto::api::MAX_EXEC_BODY;

use super::state::Worker;

pub(crate) mod admission;
pub(crate) mod agent;
pub(crate) mod exec;
pub(crate) mod files;
pub(crate) mod idempotency;
pub(crate) mod metrics;
pub(crate) mod refusal;
pub(crate) mod snapshots;
pub mod streams;
pub(crate) mod updates;

#[cfg(test)]
mod tests;

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

/// The router.
pub fn router(worker: Arc<Worker>) -> Router {
    let admitted_first =
        || axum::middleware::from_fn_with_state(Arc::clone(&worker), admission::admitted_first);
    let held_while_adopting =
        axum::middleware::from_fn_with_state(Arc::clone(&worker), admission::held_while_adopting);
    let sandboxes = Router::new()
        .route(
            "/v1/sandboxes/{id}/exec",
            post(exec::exec)
                .layer(DefaultBodyLimit::max(MAX_EXEC_BODY))
                .route_layer(admitted_first()),
        )
        .route(
            "/v1/sandboxes/{id}/files",
            get(files::read_file)
                .put(files::write_file)
                .delete(files::remove_file)
                .route_layer(admitted_first()),
        )
        .route("/v1/sandboxes/{id}/files/list", get(files::list_files))
        .route("/v1/sandboxes/{id}/terminal", get(streams::terminal))
        .route("/v1/sandboxes/{id}/watch", get(streams::watch))
        .route("/v1/sandboxes/{id}/exec/stream", get(streams::exec_stream))
        .route_layer(held_while_adopting);
    Router::new()
        .merge(sandboxes)
        .merge(
            // Updates, snapshots and layers run to their end whatever becomes of the
            // caller (see `space_http::run_to_end`).
            Router::new()
                .route("/internal/v1/updates", post(updates::apply_update))
                .route(
                    "/internal/v1/snapshot",
                    post(snapshots::snapshot).layer(DefaultBodyLimit::max(MAX_SIGNED_REQUEST)),
                )
                // The body is streamed to disk once the signed update in its header
                // is verified (no body limit here: the signed size is the limit).
                .route("/internal/v1/layers", post(snapshots::layer))
                .route_layer(axum::middleware::from_fn(space_http::run_to_end)),
        )
        .route("/metrics", get(metrics::metrics))
        .route("/healthz", get(super::health::healthz))
        .route("/readyz", get(super::health::readyz))
        .fallback(|| async { refusal::Refusal::NoRoute.into_response() })
        .layer(DefaultBodyLimit::max(MAX_BUFFERED_BODY))
        .with_state(NodeApi {
            worker,
            idempotency: IdempotencyCache::default(),
        })
}
