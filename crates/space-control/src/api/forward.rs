//! The sandbox operations the edge forwards to the worker that runs the sandbox
//! (exec, files, streams), with route recovery (`crate::edge`); and the standalone
//! edge's relay of everything else to its control plane.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{Path, Request, State};
use axum::http::{HeaderMap, HeaderValue, Method, header};
use axum::response::{IntoResponse, Response};
use space_identity::OperationClass;
use space_proto::api::{
    ExecRequest, ExecResponse, FileEntry, FileInfo, MkdirResponse, RenameRequest,
};
use space_proto::openapi::{RawBytes, SandboxPath};

use super::openapi::{
    Exec, FileAsQuery, FilePath, FileRead, FileWrite, FileWriteQuery, Forwarded, MkdirQuery,
    RenameQuery, TerminalQuery, WatchQuery,
};
use super::request::{AppState, MAX_BODY, MAX_INTERNAL_BODY, caller, path_and_query, sandbox_id};
use crate::edge::Authority;
use crate::error::ControlError;

async fn forward(
    st: &AppState,
    headers: &HeaderMap,
    id: &str,
    method: Method,
    path_and_query: String,
    body: Bytes,
    class: OperationClass,
) -> Result<Response, ControlError> {
    let who = caller(st, headers).await?;
    let sandbox = sandbox_id(id)?;
    let f = st
        .edge
        .forward(
            &who,
            &sandbox,
            method,
            &path_and_query,
            headers,
            body,
            class,
        )
        .await?;
    let mut resp = (f.status, f.body).into_response();
    if let Some(ct) = f.content_type.and_then(|v| HeaderValue::from_str(&v).ok()) {
        resp.headers_mut().insert(header::CONTENT_TYPE, ct);
    }
    if let Some(e) = f.execution.and_then(|v| HeaderValue::from_str(&v).ok()) {
        resp.headers_mut().insert("space-execution", e);
    }
    Ok(resp)
}

fn mutation(headers: &HeaderMap) -> OperationClass {
    OperationClass::Mutation {
        idempotency_key: headers.contains_key("idempotency-key"),
    }
}

/// Run a command and collect its output (200 whatever its exit code).
///
/// Stdin at most 64 MiB; output cut at `max_output_bytes` per stream. Accepts
/// `Idempotency-Key` (passed to the worker).
#[utoipa::path(post, path = "/v1/sandboxes/{id}/exec", tag = "operations", params(SandboxPath),
    request_body = ExecRequest,
    responses((status = 200, description = "the command ran", body = ExecResponse,
        headers(("space-execution" = String, description = "the execution that ran it"))), Exec),
    security(("api_key" = [])))]
pub(super) async fn forward_exec(
    State(st): State<AppState>,
    headers: HeaderMap,
    Path(id): Path<String>,
    req: Request,
) -> Result<Response, ControlError> {
    let pq = path_and_query(&req);
    // Room for 64 MiB of stdin in base64; the worker checks the stdin itself.
    let limit = space_proto::api::MAX_EXEC_BODY;
    let body = axum::body::to_bytes(req.into_body(), limit)
        .await
        .map_err(|_| {
            ControlError::TooLarge(format!(
                "exec request over {} MiB (stdin at most {} MiB; use the streaming exec for more)",
                limit >> 20,
                space_proto::api::MAX_EXEC_STDIN >> 20
            ))
        })?;
    let class = mutation(&headers);
    forward(&st, &headers, &id, Method::POST, pq, body, class).await
}

/// Read a file, streamed, at any size (`Range: bytes=…` for a part).
#[utoipa::path(get, path = "/v1/sandboxes/{id}/files", tag = "operations", params(SandboxPath, FileAsQuery),
    responses(
        (status = 200, description = "the whole file", body = RawBytes, content_type = "application/octet-stream",
            headers(("space-execution" = String, description = "the execution that read it"))),
        (status = 206, description = "the range asked for (`Content-Range`)", body = RawBytes, content_type = "application/octet-stream"),
        FileRead),
    security(("api_key" = [])))]
pub(super) async fn read_file(
    st: State<AppState>,
    headers: HeaderMap,
    id: Path<String>,
    req: Request,
) -> Result<Response, ControlError> {
    forward_files(st, headers, id, req).await
}

/// Write a file: the body, streamed, replaces it atomically once whole (missing
/// parents are made unless `mkdir=0`; `mode=` sets its mode, `user=` writes as an
/// account of the sandbox). Accepts `Idempotency-Key`.
#[utoipa::path(put, path = "/v1/sandboxes/{id}/files", tag = "operations", params(SandboxPath, FileWriteQuery),
    request_body(content = RawBytes, content_type = "application/octet-stream"),
    responses((status = 204, description = "written",
        headers(("space-execution" = String, description = "the execution that wrote it"))), FileWrite),
    security(("api_key" = [])))]
pub(super) async fn write_file(
    st: State<AppState>,
    headers: HeaderMap,
    id: Path<String>,
    req: Request,
) -> Result<Response, ControlError> {
    forward_files(st, headers, id, req).await
}

/// Read a directory as a tar stream (regular files, directories, symlinks as links,
/// modes, mtimes; no devices).
#[utoipa::path(get, path = "/v1/sandboxes/{id}/files/tar", tag = "operations", params(SandboxPath, FilePath),
    responses(
        (status = 200, description = "the directory as a tar archive, streamed (cut short if packing fails)", body = RawBytes, content_type = "application/x-tar",
            headers(("space-execution" = String, description = "the execution that read it"))),
        FileRead),
    security(("api_key" = [])))]
pub(super) async fn read_tree(
    st: State<AppState>,
    headers: HeaderMap,
    id: Path<String>,
    req: Request,
) -> Result<Response, ControlError> {
    forward_files(st, headers, id, req).await
}

/// Unpack a tar stream into a directory (made if missing), inside the sandbox: an
/// entry that is absolute, climbs out with `..`, passes through a symlink or is a
/// device is refused (400). `?user=` unpacks as that account. Accepts
/// `Idempotency-Key`.
#[utoipa::path(put, path = "/v1/sandboxes/{id}/files/tar", tag = "operations", params(SandboxPath, FileWriteQuery),
    request_body(content = RawBytes, content_type = "application/x-tar"),
    responses((status = 204, description = "unpacked",
        headers(("space-execution" = String, description = "the execution that wrote it"))), FileWrite),
    security(("api_key" = [])))]
pub(super) async fn write_tree(
    st: State<AppState>,
    headers: HeaderMap,
    id: Path<String>,
    req: Request,
) -> Result<Response, ControlError> {
    forward_files(st, headers, id, req).await
}

/// Remove a file, or a directory recursively. Accepts `Idempotency-Key`.
#[utoipa::path(delete, path = "/v1/sandboxes/{id}/files", tag = "operations", params(SandboxPath, FileAsQuery),
    responses((status = 204, description = "removed",
        headers(("space-execution" = String, description = "the execution that removed it"))), Forwarded),
    security(("api_key" = [])))]
pub(super) async fn remove_file(
    st: State<AppState>,
    headers: HeaderMap,
    id: Path<String>,
    req: Request,
) -> Result<Response, ControlError> {
    forward_files(st, headers, id, req).await
}

async fn forward_files(
    State(st): State<AppState>,
    headers: HeaderMap,
    Path(id): Path<String>,
    req: Request,
) -> Result<Response, ControlError> {
    let method = req.method().clone();
    let pq = path_and_query(&req);
    // Reads and writes stream both ways, at any size (`edge::files`).
    if method == Method::GET || method == Method::PUT {
        let who = caller(&st, &headers).await?;
        let sandbox = sandbox_id(&id)?;
        let edge = &st.edge;
        return if method == Method::GET {
            crate::edge::files::read(edge, &who, &sandbox, None, &pq, &headers).await
        } else {
            let class = mutation(&headers);
            let body = req.into_body();
            crate::edge::files::write(edge, &who, &sandbox, None, &pq, &headers, body, class).await
        };
    }
    let body = axum::body::to_bytes(req.into_body(), MAX_BODY)
        .await
        .map_err(|_| ControlError::TooLarge("body over 64 MiB".into()))?;
    let class = if method == Method::GET {
        OperationClass::Read
    } else {
        mutation(&headers)
    };
    forward(&st, &headers, &id, method, pq, body, class).await
}

/// List a directory.
#[utoipa::path(get, path = "/v1/sandboxes/{id}/files/list", tag = "operations", params(SandboxPath, FileAsQuery),
    responses((status = 200, description = "its entries", body = Vec<FileEntry>,
        headers(("space-execution" = String, description = "the execution that listed it"))), Forwarded),
    security(("api_key" = [])))]
pub(super) async fn forward_list(
    State(st): State<AppState>,
    headers: HeaderMap,
    Path(id): Path<String>,
    req: Request,
) -> Result<Response, ControlError> {
    forward_read(&st, &headers, &id, path_and_query(&req)).await
}

/// Describe a path (a final symlink described, not followed).
#[utoipa::path(get, path = "/v1/sandboxes/{id}/files/stat", tag = "operations", params(SandboxPath, FileAsQuery),
    responses((status = 200, description = "its description", body = FileInfo,
        headers(("space-execution" = String, description = "the execution that described it"))), Forwarded),
    security(("api_key" = [])))]
pub(super) async fn stat_file(
    State(st): State<AppState>,
    headers: HeaderMap,
    Path(id): Path<String>,
    req: Request,
) -> Result<Response, ControlError> {
    forward_read(&st, &headers, &id, path_and_query(&req)).await
}

/// Make a directory and its missing parents (0755; `?user=` as an account of the
/// sandbox): 201 when made, 200 when a directory was already there, 409
/// `already_exists` for anything else there. Accepts `Idempotency-Key`.
#[utoipa::path(post, path = "/v1/sandboxes/{id}/files/mkdir", tag = "operations", params(SandboxPath, MkdirQuery),
    responses(
        (status = 201, description = "made", body = MkdirResponse,
            headers(("space-execution" = String, description = "the execution that made it"))),
        (status = 200, description = "a directory was already there", body = MkdirResponse),
        Forwarded),
    security(("api_key" = [])))]
pub(super) async fn make_dir(
    State(st): State<AppState>,
    headers: HeaderMap,
    Path(id): Path<String>,
    req: Request,
) -> Result<Response, ControlError> {
    let pq = path_and_query(&req);
    let class = mutation(&headers);
    forward(&st, &headers, &id, Method::POST, pq, Bytes::new(), class).await
}

/// Rename a path (a file at `to` is replaced; `?user=` as an account of the
/// sandbox): 404 when `from` is missing. Accepts `Idempotency-Key`.
#[utoipa::path(post, path = "/v1/sandboxes/{id}/files/rename", tag = "operations", params(SandboxPath, RenameQuery),
    request_body = RenameRequest,
    responses((status = 204, description = "renamed",
        headers(("space-execution" = String, description = "the execution that renamed it"))), Forwarded),
    security(("api_key" = [])))]
pub(super) async fn rename_file(
    State(st): State<AppState>,
    headers: HeaderMap,
    Path(id): Path<String>,
    req: Request,
) -> Result<Response, ControlError> {
    let pq = path_and_query(&req);
    // Two paths of at most 4096 bytes each, as JSON.
    let limit = 64 << 10;
    let body = axum::body::to_bytes(req.into_body(), limit)
        .await
        .map_err(|_| ControlError::TooLarge(format!("rename body over {limit} bytes")))?;
    let class = mutation(&headers);
    forward(&st, &headers, &id, Method::POST, pq, body, class).await
}

/// A read without a body, forwarded to the sandbox's worker as it came.
async fn forward_read(
    st: &AppState,
    headers: &HeaderMap,
    id: &str,
    pq: String,
) -> Result<Response, ControlError> {
    let class = OperationClass::Read;
    forward(st, headers, id, Method::GET, pq, Bytes::new(), class).await
}

/// What the platform refused the sandbox lately (its network policy's refusals on
/// its current execution), newest first.
#[utoipa::path(get, path = "/v1/sandboxes/{id}/events", tag = "operations", params(SandboxPath),
    responses((status = 200, description = "its events", body = space_proto::api::EventList,
        headers(("space-execution" = String, description = "the execution that answered"))), Forwarded),
    security(("api_key" = [])))]
pub(super) async fn events(
    State(st): State<AppState>,
    headers: HeaderMap,
    Path(id): Path<String>,
    req: Request,
) -> Result<Response, ControlError> {
    forward_read(&st, &headers, &id, path_and_query(&req)).await
}

/// A terminal (WebSocket): `/bin/sh -i` on a PTY; binary messages carry its bytes
/// both ways, a text `{"rows", "cols"}` resizes.
#[utoipa::path(get, path = "/v1/sandboxes/{id}/terminal", tag = "operations", params(SandboxPath, TerminalQuery),
    responses((status = 101, description = "WebSocket upgrade: the terminal's stream (closes 1000 `exited N` when the shell ends, 4001 when its execution is replaced)"), Forwarded),
    security(("api_key" = [])))]
pub(super) async fn terminal(
    st: State<AppState>,
    headers: HeaderMap,
    id: Path<String>,
    uri: axum::http::Uri,
    connection: Option<axum::Extension<space_http::Connection>>,
    ws: axum::extract::WebSocketUpgrade,
) -> Result<Response, ControlError> {
    forward_stream(st, headers, id, uri, connection, ws).await
}

/// Watch a directory (WebSocket): one JSON text message per change; through the edge
/// it follows a migration by itself (`{"type":"resubscribed"}`).
#[utoipa::path(get, path = "/v1/sandboxes/{id}/watch", tag = "operations", params(SandboxPath, WatchQuery),
    responses((status = 101, description = "WebSocket upgrade: one JSON event per change (`created`, `modified`, `removed`, `renamed`, `overflow`, `resubscribed`)"), Forwarded),
    security(("api_key" = [])))]
pub(super) async fn watch(
    st: State<AppState>,
    headers: HeaderMap,
    id: Path<String>,
    uri: axum::http::Uri,
    connection: Option<axum::Extension<space_http::Connection>>,
    ws: axum::extract::WebSocketUpgrade,
) -> Result<Response, ControlError> {
    forward_stream(st, headers, id, uri, connection, ws).await
}

/// Run a command with streamed input and output (WebSocket): the first text message
/// is an `ExecRequest`; output comes as binary messages tagged `1` stdout, `2`
/// stderr; an empty binary message closes stdin.
#[utoipa::path(get, path = "/v1/sandboxes/{id}/exec/stream", tag = "operations", params(SandboxPath),
    responses((status = 101, description = "WebSocket upgrade: the command's stream (closes 1000 `exited N`, 4000 for a bad request, 4001 when its execution is replaced, 4002 when the backend ends)"), Forwarded),
    security(("api_key" = [])))]
pub(super) async fn exec_stream(
    st: State<AppState>,
    headers: HeaderMap,
    id: Path<String>,
    uri: axum::http::Uri,
    connection: Option<axum::Extension<space_http::Connection>>,
    ws: axum::extract::WebSocketUpgrade,
) -> Result<Response, ControlError> {
    forward_stream(st, headers, id, uri, connection, ws).await
}

/// Terminal and watch: the backend stream opens first (so refusals are plain HTTP
/// answers), then the client's WebSocket is accepted and relayed.
async fn forward_stream(
    State(st): State<AppState>,
    headers: HeaderMap,
    Path(id): Path<String>,
    uri: axum::http::Uri,
    connection: Option<axum::Extension<space_http::Connection>>,
    ws: axum::extract::WebSocketUpgrade,
) -> Result<Response, ControlError> {
    let who = caller(&st, &headers).await?;
    let sandbox = sandbox_id(&id)?;
    let pq = uri
        .path_and_query()
        .map_or_else(|| uri.path().to_owned(), |p| p.as_str().to_owned());
    let backend = st.edge.open_stream(&who, &sandbox, &pq).await?;
    // A watch re-subscribes across a replacement; a terminal only when asked (its new
    // shell is not the old one).
    let query = uri.query().unwrap_or_default();
    let resubscribe = (uri.path().ends_with("/watch")
        || query.split('&').any(|kv| kv == "reattach=true"))
    .then(|| crate::edge::streams::Resubscribe {
        edge: Arc::clone(&st.edge),
        caller: who.clone(),
        sandbox,
        path_and_query: pq.clone(),
    });
    // The stream keeps its connection's place under the listener's limit while it
    // lives (it outlives the HTTP connection it was upgraded from).
    Ok(ws.on_upgrade(move |socket| async move {
        let _place = connection;
        crate::edge::streams::relay(socket, backend, resubscribe).await;
    }))
}

/// A standalone edge's answer to every route it does not serve itself: the request
/// relayed to its control plane as is.
pub(super) async fn relay_to_control(
    State(st): State<AppState>,
    req: Request,
) -> Result<Response, ControlError> {
    let Authority::Remote { url, http } = st.edge.authority() else {
        return Err(ControlError::NotFound("route"));
    };
    let method = req.method().clone();
    let pq = path_and_query(&req);
    let headers = req.headers().clone();
    // `/v1/*` was authenticated first; anything else is relayed only if small.
    let limit = if pq.starts_with("/v1/") {
        MAX_BODY
    } else {
        MAX_INTERNAL_BODY
    };
    let body = axum::body::to_bytes(req.into_body(), limit)
        .await
        .map_err(|_| ControlError::TooLarge(format!("body over {limit} bytes")))?;
    let mut h: Vec<(&str, &str)> = Vec::new();
    for name in ["authorization", "content-type"] {
        if let Some(v) = headers.get(name).and_then(|v| v.to_str().ok()) {
            h.push((name, v));
        }
    }
    let a = http
        .call(method, &format!("{url}{pq}"), &h, body)
        .await
        .map_err(|e| ControlError::Unavailable(format!("control plane: {e}")))?;
    let mut resp = (a.status, a.body).into_response();
    if let Some(ct) = a.headers.get(header::CONTENT_TYPE) {
        resp.headers_mut().insert(header::CONTENT_TYPE, ct.clone());
    }
    Ok(resp)
}
