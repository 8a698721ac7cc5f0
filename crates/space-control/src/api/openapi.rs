//! The edge API's OpenAPI 3.1 document ([`super::document`]) is built from the same
//! declarations as the router (each handler's `#[utoipa::path]`, gathered by
//! `utoipa_axum::routes!`), so no route is served undescribed; it is served at
//! `GET /v1/openapi.json` without a credential, and checked in as
//! `docs/openapi/edge.json` (`tests/openapi.rs`).
//!
//! Here: the document's frame (title, tags, security schemes, shared components), the
//! error answers each route may give, and the query parameters the edge passes on to
//! the worker untouched (the worker parses them; `space`'s `tests/openapi.rs` checks
//! both documents name the same ones).

use std::sync::Arc;

use axum::Extension;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use space_proto::api::ErrorBody;
use space_proto::error_responses;
use space_proto::openapi::SandboxIdSchema;
use utoipa::openapi::OpenApi;
use utoipa::openapi::security::{Http, HttpAuthScheme, SecurityScheme};
use utoipa::{IntoParams, Modify};

/// The frame the routes are added to.
#[derive(utoipa::OpenApi)]
#[openapi(
    info(
        title = "SPACE edge API",
        description = "The control plane's and the edge's HTTP API: sandboxes, their operations (forwarded to the worker that runs the sandbox, with route recovery), tenants and keys, and the internal routes workers call. Errors are `{\"error\": code, \"message\": text}` (plus `reason` for identity rejections).",
        license(name = "Apache-2.0", identifier = "Apache-2.0")
    ),
    // The sandbox ID of every sandbox path (parameters add no components).
    components(schemas(ErrorBody, SandboxIdSchema)),
    modifiers(&SecuritySchemes),
    tags(
        (name = "sandboxes", description = "Sandbox lifecycle and capabilities, answered by the control plane."),
        (name = "operations", description = "Exec, files and streams, forwarded to the sandbox's worker."),
        (name = "account", description = "The caller, tenants, keys, signing keys and workers."),
        (name = "templates", description = "Templates: images imported once, by digest, and sent to the workers that need them."),
        (name = "process", description = "Metrics, liveness, readiness and this document; no credential."),
        (name = "internal", description = "Called by workers, not clients."),
    )
)]
struct Frame;

struct SecuritySchemes;

impl Modify for SecuritySchemes {
    fn modify(&self, doc: &mut OpenApi) {
        let components = doc.components.get_or_insert_with(Default::default);
        let mut api_key = Http::new(HttpAuthScheme::Bearer);
        api_key.bearer_format = Some("space API key".into());
        api_key.description = Some("`Authorization: Bearer <api key>`: `space_ak…`.".into());
        components.add_security_scheme("api_key", SecurityScheme::Http(api_key));
        let mut worker = Http::new(HttpAuthScheme::Bearer);
        worker.bearer_format = Some("worker credential".into());
        worker.description =
            Some("`Authorization: Bearer <credential>`: the credential enrollment gave.".into());
        components.add_security_scheme("worker_credential", SecurityScheme::Http(worker));
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

/// `?path=` of the file routes.
#[derive(Debug, IntoParams)]
#[into_params(parameter_in = Query)]
#[allow(
    dead_code,
    reason = "described, never built: the edge passes the query to the worker as is"
)]
pub(super) struct FilePath {
    /// The file or directory: absolute, or relative to the agent's home; 1 to 4096
    /// bytes, no NUL (400 `bad_request` otherwise).
    path: String,
}

/// `?path=[&user=]` of a read, stat, list or remove.
#[derive(Debug, IntoParams)]
#[into_params(parameter_in = Query)]
#[allow(
    dead_code,
    reason = "described, never built: the edge passes the query to the worker as is"
)]
pub(super) struct FileAsQuery {
    /// The file or directory: absolute, or relative to the agent's home; 1 to 4096
    /// bytes, no NUL (400 `bad_request` otherwise).
    #[param(required = true)]
    path: String,
    /// Do it as this account of the sandbox (a user name or a uid): its permissions
    /// apply (an unknown name: 400 `unknown_user`); the sandbox's root when absent.
    user: Option<String>,
}

/// The query of an upload (`PUT …/files`, `PUT …/files/tar`).
#[derive(Debug, IntoParams)]
#[into_params(parameter_in = Query)]
#[allow(
    dead_code,
    reason = "described, never built: the edge passes the query to the worker as is"
)]
pub(super) struct FileWriteQuery {
    /// The file (the directory for `/files/tar`): absolute, or relative to the agent's
    /// home; 1 to 4096 bytes, no NUL.
    #[param(required = true)]
    path: String,
    /// Permission bits in octal (`0755`), at most `7777` (400 otherwise); without it
    /// an existing file keeps its mode and a new one gets `0644`. Not for `/files/tar`.
    mode: Option<String>,
    /// `1` (default): missing parent directories are made (0755, owned like the
    /// file); `0`: a missing parent is 404. Not for `/files/tar`.
    mkdir: Option<String>,
    /// Write as this account of the sandbox (a user name or a uid): its permissions
    /// apply and what is made is its own. An unknown name: 400 `unknown_user`.
    user: Option<String>,
}

/// The query of `POST …/files/mkdir`.
#[derive(Debug, IntoParams)]
#[into_params(parameter_in = Query)]
#[allow(
    dead_code,
    reason = "described, never built: the edge passes the query to the worker as is"
)]
pub(super) struct MkdirQuery {
    /// The directory: absolute, or relative to the agent's home; 1 to 4096 bytes, no
    /// NUL. Its missing parents are made too (0755, owned like it).
    #[param(required = true)]
    path: String,
    /// Make it as this account of the sandbox (a user name or a uid): its permissions
    /// apply and what is made is its own. An unknown name: 400 `unknown_user`.
    user: Option<String>,
}

/// The query of `POST …/files/rename`.
#[derive(Debug, IntoParams)]
#[into_params(parameter_in = Query)]
#[allow(
    dead_code,
    reason = "described, never built: the edge passes the query to the worker as is"
)]
pub(super) struct RenameQuery {
    /// Rename as this account of the sandbox (a user name or a uid): its permissions
    /// apply. An unknown name: 400 `unknown_user`.
    user: Option<String>,
}

/// The query of a terminal.
#[derive(Debug, IntoParams)]
#[into_params(parameter_in = Query)]
#[allow(
    dead_code,
    reason = "described, never built: the edge passes the query to the worker as is"
)]
pub(super) struct TerminalQuery {
    /// Rows, 1 to 1000 (24).
    rows: Option<u16>,
    /// Columns, 1 to 1000 (80).
    cols: Option<u16>,
    /// The account the shell runs as (a user name or a uid; root when absent; an
    /// unknown name: 400 `unknown_user`).
    user: Option<String>,
    /// Through the edge: open a new shell on the new execution after a migration
    /// instead of closing with 4001.
    reattach: Option<bool>,
}

/// The query of a watch.
#[derive(Debug, IntoParams)]
#[into_params(parameter_in = Query)]
#[allow(
    dead_code,
    reason = "described, never built: the edge passes the query to the worker as is"
)]
pub(super) struct WatchQuery {
    /// The directory watched (`/root`).
    path: Option<String>,
    /// Whether its subdirectories are watched too (`false`).
    recursive: Option<bool>,
}

const BAD_REQUEST: (u16, &str) = (
    400,
    "`bad_request` (invalid JSON, an unknown field, a value out of range), `invalid_limits`, or an agent's `is_a_directory`, `not_a_directory`, `invalid_argument`",
);
const UNAUTHORIZED: (u16, &str) = (
    401,
    "`unauthorized`: no valid credential (on `/v1/*` answered before the body is read, with `Connection: close`)",
);
const FORBIDDEN: (u16, &str) = (
    403,
    "`forbidden`: an admin-only call with a non-admin key, or a wrong enrollment secret",
);
const DENY: (u16, &str) = (
    403,
    "`deny` (the worker denied the capability; `reason` says why) or `permission_denied`",
);
const NOT_FOUND: (u16, &str) = (
    404,
    "`not_found`: no such sandbox (another tenant's is not found either), key, file or route",
);
const BODY_TIMEOUT: (u16, &str) = (
    408,
    "`body_timeout`: the client stopped sending the body; nothing was written",
);
const CONFLICT: (u16, &str) = (
    409,
    "`conflict` (wrong state; another change under way), `not_running`, `paused`, `snapshot_corrupt`, `already_exists`, `replay_unavailable`",
);
const TOO_LARGE: (u16, &str) = (
    413,
    "`too_large`: a non-streaming exec's stdin over 64 MiB, a layer over 1 GiB",
);
const RANGE: (u16, &str) = (
    416,
    "`range_not_satisfiable`: the `Range` selects no byte (`Content-Range: bytes */SIZE`)",
);
const QUOTA: (u16, &str) = (
    429,
    "`quota_exceeded`: the tenant's live-sandbox quota is reached",
);
const INTERNAL: (u16, &str) = (
    500,
    "`internal`: a failure of the platform itself (store, signing), never bad input",
);
const BAD_GATEWAY: (u16, &str) = (
    502,
    "`bad_gateway`, `agent`, `bridge`, `wrong_execution`: a worker failed, could not be reached, or answered for another execution",
);
const UNAVAILABLE: (u16, &str) = (
    503,
    "`unavailable`, `transitioning`, `route_unavailable`, `busy`: no worker can take it, the sandbox stayed in a transition, or route recovery gave up",
);
const NO_SPACE: (u16, &str) = (
    507,
    "`no_space`: the write went past the sandbox's disk limit; the old file is kept whole",
);

error_responses!(
    /// A call that only needs a valid key.
    Authenticated: [UNAUTHORIZED]
);
error_responses!(
    /// A read of what the caller's tenant holds.
    Listed: [UNAUTHORIZED, INTERNAL]
);
error_responses!(
    /// A read of one sandbox.
    SandboxRead: [UNAUTHORIZED, NOT_FOUND, INTERNAL]
);
error_responses!(
    /// A create.
    Create: [BAD_REQUEST, UNAUTHORIZED, QUOTA, INTERNAL, BAD_GATEWAY, UNAVAILABLE]
);
error_responses!(
    /// A lifecycle change.
    Change: [BAD_REQUEST, UNAUTHORIZED, NOT_FOUND, CONFLICT, TOO_LARGE, INTERNAL, BAD_GATEWAY, UNAVAILABLE]
);
error_responses!(
    /// A capability issue.
    Issue: [BAD_REQUEST, UNAUTHORIZED, NOT_FOUND, CONFLICT, INTERNAL, UNAVAILABLE]
);
error_responses!(
    /// An operation forwarded to the worker.
    Forwarded: [BAD_REQUEST, UNAUTHORIZED, DENY, NOT_FOUND, CONFLICT, BAD_GATEWAY, UNAVAILABLE]
);
error_responses!(
    /// An exec forwarded to the worker.
    Exec: [BAD_REQUEST, UNAUTHORIZED, DENY, NOT_FOUND, CONFLICT, TOO_LARGE, BAD_GATEWAY, UNAVAILABLE]
);
error_responses!(
    /// A file read forwarded to the worker.
    FileRead: [BAD_REQUEST, UNAUTHORIZED, DENY, NOT_FOUND, CONFLICT, RANGE, BAD_GATEWAY, UNAVAILABLE]
);
error_responses!(
    /// A file write forwarded to the worker.
    FileWrite: [BAD_REQUEST, UNAUTHORIZED, DENY, NOT_FOUND, BODY_TIMEOUT, CONFLICT, BAD_GATEWAY, UNAVAILABLE, NO_SPACE]
);
const PORT_NOT_EXPOSED: (u16, &str) = (404, "`not_found` (no such sandbox) or `port_not_exposed`");
error_responses!(
    /// A change of a sandbox's service ports.
    PortChange: [BAD_REQUEST, UNAUTHORIZED, PORT_NOT_EXPOSED, CONFLICT, INTERNAL]
);
error_responses!(
    /// An admin-only create.
    AdminOnly: [BAD_REQUEST, UNAUTHORIZED, FORBIDDEN, INTERNAL]
);
error_responses!(
    /// A key revocation.
    KeyRevocation: [UNAUTHORIZED, NOT_FOUND, INTERNAL]
);
error_responses!(
    /// A signing key rotation.
    Rotation: [UNAUTHORIZED, FORBIDDEN, INTERNAL, UNAVAILABLE]
);
error_responses!(
    /// An enrollment.
    Enrollment: [BAD_REQUEST, FORBIDDEN, INTERNAL]
);
error_responses!(
    /// A worker's call with its credential.
    WorkerCall: [UNAUTHORIZED, INTERNAL]
);
error_responses!(
    /// A worker's report of a lost execution.
    LostReport: [BAD_REQUEST, UNAUTHORIZED, NOT_FOUND, INTERNAL]
);
const TEMPLATE_CONFLICT: (u16, &str) = (
    409,
    "`conflict`: the name holds another digest (templates are immutable: remove it first or choose another tag)",
);
const TEMPLATE_TOO_LARGE: (u16, &str) = (
    413,
    "`too_large`: the archive is over the import bound (8 GiB unless the operator chose less), or a document in it over its own",
);
const TEMPLATE_IN_USE: (u16, &str) = (
    409,
    "`template_in_use`: sandboxes that are not stopped were created from it (the message says how many)",
);
error_responses!(
    /// A template import.
    TemplateImport: [BAD_REQUEST, UNAUTHORIZED, FORBIDDEN, TEMPLATE_CONFLICT, TEMPLATE_TOO_LARGE, INTERNAL]
);
error_responses!(
    /// A read of one template.
    TemplateRead: [BAD_REQUEST, UNAUTHORIZED, NOT_FOUND, INTERNAL]
);
error_responses!(
    /// A template removal.
    TemplateRemoval: [BAD_REQUEST, UNAUTHORIZED, FORBIDDEN, NOT_FOUND, TEMPLATE_IN_USE, INTERNAL]
);
error_responses!(
    /// A readiness probe that says no.
    NotReady: [(503, "`not_ready`: the process cannot do its job now (the cause is logged)")]
);
