//! The worker API's OpenAPI 3.1 document ([`super::document`]) is built from the same
//! declarations as node-api's router (each handler's `#[utoipa::path]`, gathered by
//! `utoipa_axum::routes!`), so no route is served undescribed; it is served at
//! `GET /v1/openapi.json` without a credential, and checked in as
//! `docs/openapi/worker.json` (`tests/openapi.rs`).
//!
//! Here: the document's frame (title, tags, the credential schemes: the capability of
//! direct mode, the control plane's signed delivery and signed layer), and the
//! refusals each route may answer (one mapping to status: [`super::refusal`]).

use std::sync::Arc;

use axum::Extension;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use space_proto::api::{Delivery, ErrorBody, UpdateBody};
use space_proto::error_responses;
use space_proto::openapi::SandboxIdSchema;
use utoipa::Modify;
use utoipa::openapi::OpenApi;
use utoipa::openapi::security::{ApiKey, ApiKeyValue, SecurityScheme};

/// The frame the routes are added to.
#[derive(utoipa::OpenApi)]
#[openapi(
    info(
        title = "SPACE worker API",
        description = "A worker's node-api: the sandbox-scoped operations of direct mode (the edge's paths and bodies, each request admitted against the worker's own record of the execution its capability names), and the internal routes the control plane calls. Errors are `{\"error\": code, \"message\": text}` (plus `reason` for identity rejections).",
        license(name = "Apache-2.0", identifier = "Apache-2.0")
    ),
    // What the signed envelopes carry (`SignedUpdate.body` is an `UpdateBody`, the
    // `space-delivery` header a `Delivery`), and the sandbox ID of every path.
    components(schemas(ErrorBody, UpdateBody, Delivery, SandboxIdSchema)),
    modifiers(&SecuritySchemes),
    tags(
        (name = "sandbox", description = "Direct mode: exec, files and streams of one sandbox, with a capability."),
        (name = "process", description = "Metrics, liveness, readiness and this document; no credential."),
        (name = "internal", description = "Called by the control plane, not clients: signed updates, snapshots, layers."),
    )
)]
struct Frame;

struct SecuritySchemes;

impl Modify for SecuritySchemes {
    fn modify(&self, doc: &mut OpenApi) {
        let components = doc.components.get_or_insert_with(Default::default);
        let header = |name: &str, description: &str| {
            SecurityScheme::ApiKey(ApiKey::Header(ApiKeyValue::with_description(
                name,
                description,
            )))
        };
        components.add_security_scheme(
            "capability",
            header(
                "Authorization",
                "`Authorization: SpaceCap <token>`: the `token` of a capability of purpose `control` (issued by `POST /v1/sandboxes/{id}/capabilities` at the edge). An API key is not accepted.",
            ),
        );
        components.add_security_scheme(
            "delivery",
            header(
                "space-delivery",
                "`<base64url of the descriptor's JSON>.<base64url of the anchor's signature>`: the control plane's signed delivery (worker, issued_at, size, BLAKE3 digest, nonce), verified before a byte of the body is read; each header is used once.",
            ),
        );
        components.add_security_scheme(
            "signed_layer",
            header(
                "space-update",
                "base64url of the signed layer update naming the archive's digest and size, verified before a byte of the body is read.",
            ),
        );
    }
}

/// The frame of the document, before routes are added.
pub(super) fn frame() -> OpenApi {
    use utoipa::OpenApi as _;
    let mut doc = Frame::openapi();
    doc.info.version = env!("CARGO_PKG_VERSION").into();
    doc
}

/// The document as served, built once by the router ([`super::document_json`]).
#[derive(Debug, Clone)]
pub(super) struct Served(pub(super) Arc<str>);

/// This API's OpenAPI 3.1 document.
#[utoipa::path(get, path = "/v1/openapi.json", tag = "process",
    responses((status = 200, description = "the OpenAPI 3.1 document of this API", content_type = "application/json")),
    security(()))]
pub(super) async fn openapi_json(Extension(Served(text)): Extension<Served>) -> Response {
    (
        [(header::CONTENT_TYPE, "application/json")],
        text.to_string(),
    )
        .into_response()
}

const BAD_REQUEST: (u16, &str) = (
    400,
    "`bad_request` (a malformed body or query; an `Idempotency-Key` empty or over 255 characters), `incomplete_body`, or the agent's `is_a_directory`, `not_a_directory`, `invalid_argument`",
);
const UNAUTHORIZED: (u16, &str) = (
    401,
    "`unauthorized`: no `SpaceCap` capability, or one that does not parse (`reason`: `malformed`, `oversized`); a refused exec or write carries `Connection: close`, its body unread",
);
const DENY: (u16, &str) = (
    403,
    "`deny` (final; `reason` says why, e.g. `expired`, `unknown_key`, `sandbox_mismatch`), or the agent's `permission_denied`",
);
const NOT_FOUND: (u16, &str) = (404, "`not_found`: no such file (or route)");
const BODY_TIMEOUT: (u16, &str) = (
    408,
    "`body_timeout`: the client stopped sending the body; nothing was written",
);
const CONFLICT: (u16, &str) = (
    409,
    "`paused` (still paused after waiting 2 s), `already_exists`, `replay_unavailable` (an `Idempotency-Key` whose answer is no longer kept)",
);
const TOO_LARGE: (u16, &str) = (
    413,
    "`too_large`: stdin over 64 MiB (use the streaming exec)",
);
const RANGE: (u16, &str) = (
    416,
    "`range_not_satisfiable`: the `Range` selects no byte (`Content-Range: bytes */SIZE`)",
);
const REFRESH_ROUTE: (u16, &str) = (
    421,
    "`refresh_route`: the capability names another execution than this worker's record (`reason`: `wrong_worker`, `retired`, `stale_generation`, …); fetch a new capability and try once more",
);
const INTERNAL: (u16, &str) = (500, "`internal`: this worker failed");
const BAD_GATEWAY: (u16, &str) = (
    502,
    "`bridge`, `agent`, `answer_failed`: the bridge or the agent failed",
);
const BUSY: (u16, &str) = (503, "`busy`: the agent is busy");
const NO_SPACE: (u16, &str) = (
    507,
    "`no_space`: the write went past the sandbox's disk limit; the old file is kept whole",
);

error_responses!(
    /// A sandbox operation refused or failed.
    Operation: [BAD_REQUEST, UNAUTHORIZED, DENY, NOT_FOUND, CONFLICT, REFRESH_ROUTE, INTERNAL, BAD_GATEWAY, BUSY]
);
error_responses!(
    /// An exec refused or failed.
    Exec: [BAD_REQUEST, UNAUTHORIZED, DENY, NOT_FOUND, CONFLICT, TOO_LARGE, REFRESH_ROUTE, INTERNAL, BAD_GATEWAY, BUSY]
);
error_responses!(
    /// A file read refused or failed.
    FileRead: [BAD_REQUEST, UNAUTHORIZED, DENY, NOT_FOUND, CONFLICT, RANGE, REFRESH_ROUTE, INTERNAL, BAD_GATEWAY, BUSY]
);
error_responses!(
    /// A file write refused or failed.
    FileWrite: [BAD_REQUEST, UNAUTHORIZED, DENY, NOT_FOUND, BODY_TIMEOUT, CONFLICT, REFRESH_ROUTE, INTERNAL, BAD_GATEWAY, BUSY, NO_SPACE]
);
error_responses!(
    /// A signed update, snapshot order or layer refused (`update_refused`, or
    /// `bad_request` for an update that does not parse).
    UpdateRefused: [
        (400, "`update_refused` (malformed, or asking for what this worker does not do) or `bad_request`"),
        (401, "`update_refused`: no readable signed delivery or signed update; its sender is unknown"),
        (403, "`update_refused`: not signed by the trust anchor, for another worker, not fresh, or a body other than the one signed"),
        (409, "`update_refused`: contrary to this worker's records (a replayed delivery or sequence number, an old generation, a missing layer)"),
        (413, "`update_refused` or `too_large`: larger than this worker reads"),
        (500, "`update_refused`: this worker failed"),
        (503, "`update_refused`: not enrolled yet"),
    ]
);
error_responses!(
    /// A readiness probe that says no.
    NotReady: [(503, "`not_ready`: not enrolled, or not synced with the control plane")]
);

#[cfg(test)]
mod tests;
