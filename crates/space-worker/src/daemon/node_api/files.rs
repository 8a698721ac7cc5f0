//! File reads and writes of any size, streamed between the HTTP body and the agent.
//!
//! A read answers `Content-Length` (the size of the file the agent opened, or of the
//! span a `Range` header selects) and streams the agent's chunks; one chunk is held
//! back until the agent's end says the file did not change while it was read, so a
//! file that shrank or grew meanwhile ends the answer with an error before its
//! `Content-Length` is reached (the connection is cut), never with a short 200 that
//! looks complete. A write streams the request body to the agent, which writes a
//! temporary file beside the target and renames it into place only after the whole
//! body arrived and was synced: a body cut part-way, or a write past the sandbox's
//! disk limit (`507 no_space`), leaves nothing at the path. Memory per transfer is a
//! few chunks whatever the file's size. Listing a directory and removing a path are
//! single agent calls ([`file_op`]).

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;

use axum::Json;
use axum::body::{Body, Bytes};
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use hyper::body::{Body as _, Frame, SizeHint};
use space_identity::Access;
use space_proto::api::FileEntry;
use space_proto::client::{AgentConnection, Call, ClientError, input_frame, write_async};
use space_proto::guest::{AgentBody, ByteRange, Input, MAX_CHUNK, Operation, RequestId};

use super::admission::parse_and_admit;
use super::agent::{connect, stale_or, with_conn, with_execution};
use super::idempotency::{IdempotencyCache, once};
use super::refusal::{Refusal, Stale};
use crate::daemon::state::{AgentPool, AgentStream, Slot, Worker};

/// Bytes gathered from the agent's chunks before they are handed to the HTTP body
/// (fewer wake-ups than one per 64 KiB chunk).
const BATCH: usize = 256 << 10;

/// Batches in flight between the task reading the agent and the HTTP body.
const QUEUE: usize = 4;

/// `GET /v1/sandboxes/{id}/files?path=[&user=]`: the file, or the span of a `Range` header
/// (`206`, `416` when it selects nothing), streamed.
#[utoipa::path(get, path = "/v1/sandboxes/{id}/files", tag = "sandbox", params(space_proto::openapi::SandboxPath, PathQuery), responses((status = 200, description = "the whole file", body = space_proto::openapi::RawBytes, content_type = "application/octet-stream", headers(("space-execution" = String, description = "the execution that answered"))), (status = 206, description = "the range asked for (`Content-Range`)", body = space_proto::openapi::RawBytes, content_type = "application/octet-stream"), super::openapi::FileRead), security(("capability" = [])))]
pub(crate) async fn read_file(
    State(w): State<Arc<Worker>>,
    Path(id): Path<String>,
    Query(q): Query<PathQuery>,
    headers: HeaderMap,
) -> Response {
    let start = Instant::now();
    let resp = read(&w, &headers, &id, &q)
        .await
        .unwrap_or_else(IntoResponse::into_response);
    w.metrics.observe("read_file", start.elapsed());
    resp
}

/// `PUT /v1/sandboxes/{id}/files?path=[&mode=][&mkdir=][&user=]`: the body streamed
/// into the file.
#[utoipa::path(put, path = "/v1/sandboxes/{id}/files", tag = "sandbox", params(space_proto::openapi::SandboxPath, WriteQuery), request_body(content = space_proto::openapi::RawBytes, content_type = "application/octet-stream"), responses((status = 204, description = "written, atomically and durably", headers(("space-execution" = String, description = "the execution that answered"))), super::openapi::FileWrite), security(("capability" = [])))]
pub(crate) async fn write_file(
    State(w): State<Arc<Worker>>,
    State(idempotency): State<IdempotencyCache>,
    Path(id): Path<String>,
    Query(q): Query<WriteQuery>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let start = Instant::now();
    let op = |path: String| -> Result<Operation, Refusal> {
        Ok(Operation::WriteFile {
            path,
            mode: q.mode()?,
            parents: q.parents()?,
            user: q.account(),
        })
    };
    let resp = upload(&w, &idempotency, &id, &headers, q.path.as_deref(), op, body).await;
    w.metrics.observe("write_file", start.elapsed());
    resp
}

/// An upload: admitted, then `body` streamed to the agent as the input of `op` (built
/// from the path), the answer kept under the request's idempotency key.
pub(super) async fn upload(
    w: &Worker,
    idempotency: &IdempotencyCache,
    id: &str,
    headers: &HeaderMap,
    path: Option<&str>,
    op: impl FnOnce(String) -> Result<Operation, Refusal>,
    body: Body,
) -> Response {
    match parse_and_admit(w, headers, id, Access::FsWrite)
        .and_then(|admitted| Ok((admitted, op(checked_path(path)?)?)))
    {
        Err(r) => r.into_response(),
        Ok((admitted, op)) => match admitted.unpaused(w).await {
            Err(r) => r.into_response(),
            Ok(admitted) => {
                let sandbox = admitted.sandbox();
                let slot = admitted.into_slot();
                // The idempotency record keeps the outcome only: a body streamed to
                // the agent is not replayed from memory, and a replay of the key is
                // answered from the record without reading its body.
                let run = move || async move {
                    match write(&slot, op, body).await {
                        Ok(resp) => {
                            // Written and not yet answered: a worker killed here leaves
                            // its caller without the answer of a write that was done.
                            space_http::crash::crash_point("worker.write.done");
                            with_execution(resp, &slot)
                        }
                        Err(r) => r.into_response(),
                    }
                };
                once(idempotency, sandbox, headers, run).await
            }
        },
    }
}

/// A verified agent connection of `pool`: an idle one, or a new one.
pub(super) async fn take(pool: &AgentPool) -> Result<AgentConnection<AgentStream>, Refusal> {
    match pool.idle() {
        Some(conn) => Ok(conn),
        None => connect(pool).await.map_err(Refusal::Bridge),
    }
}

/// A bridge failure of `slot`'s connection: a stale route when the execution was
/// retired meanwhile (see [`stale_or`]), else a 502.
pub(super) async fn broken(
    e: &ClientError,
    lease: &tokio::sync::watch::Receiver<bool>,
    slot: &Slot,
) -> Refusal {
    stale_or(Refusal::Bridge(e.to_string()), lease.clone(), slot).await
}

async fn read(
    w: &Worker,
    headers: &HeaderMap,
    id: &str,
    q: &PathQuery,
) -> Result<Response, Refusal> {
    let admitted = parse_and_admit(w, headers, id, Access::FsRead)?;
    let path = required_path(q)?;
    let slot = admitted.unpaused(w).await?.into_slot();
    // A header that is not one byte range is ignored: the whole file is the answer.
    let asked = headers
        .get(header::RANGE)
        .and_then(|v| v.to_str().ok())
        .and_then(ByteRange::parse_header);
    let pool = slot
        .pool
        .clone()
        .ok_or(Refusal::RefreshRoute(Stale::NotRunning))?;
    let lease = slot.lease();
    let mut conn = match take(&pool).await {
        Ok(c) => c,
        // No connection to the agent: a stale route if the execution is being retired.
        Err(r) => return Err(stale_or(r, lease, &slot).await),
    };
    let op = Operation::ReadRange {
        path,
        range: asked.unwrap_or(ByteRange::All),
    }
    .as_user(q.account());
    let rid = match conn.send_request_async(op).await {
        Ok(rid) => rid,
        Err(e) => return Err(broken(&e, &lease, &slot).await),
    };
    let (size, span) = match conn.next_answer_async(rid).await {
        Ok(AgentBody::FileOpened { size, range }) => (size, range),
        Err(ClientError::Agent(e)) => {
            pool.give_back(conn);
            return Err(Refusal::Agent(e));
        }
        Err(e) => return Err(broken(&e, &lease, &slot).await),
        Ok(other) => return Err(Refusal::Bridge(format!("unexpected answer {other:?}"))),
    };
    let Some((start, len)) = span else {
        if let Ok(AgentBody::ReadEnd { .. }) = conn.next_answer_async(rid).await {
            pool.give_back(conn);
        }
        let resp = Refusal::RangeNotSatisfiable { size }.into_response();
        return Ok(with_execution(resp, &slot));
    };
    let (tx, rx) = tokio::sync::mpsc::channel(QUEUE);
    tokio::spawn(pump(conn, pool, rid, len, tx));
    let body = Body::new(Streamed {
        rx,
        left: len,
        failed: false,
    });
    let mut resp = body.into_response();
    let status = if asked.is_some() {
        StatusCode::PARTIAL_CONTENT
    } else {
        StatusCode::OK
    };
    *resp.status_mut() = status;
    let h = resp.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/octet-stream"),
    );
    h.insert(header::ACCEPT_RANGES, HeaderValue::from_static("bytes"));
    h.insert(header::CONTENT_LENGTH, HeaderValue::from(len));
    if asked.is_some() {
        let last = (start + len).saturating_sub(1);
        if let Ok(v) = HeaderValue::from_str(&format!("bytes {start}-{last}/{size}")) {
            h.insert(header::CONTENT_RANGE, v);
        }
    }
    Ok(with_execution(resp, &slot))
}

/// Longest a transfer waits for its client: for the next bytes of an upload, or for
/// a download's reader to take the next batch. A client idle longer loses the
/// transfer, so a stalled client cannot hold an agent connection (and, for an upload,
/// a temporary file) for ever. `SPACE_FILE_IDLE_SECS`, default 60.
pub(super) fn idle() -> std::time::Duration {
    static IDLE: std::sync::OnceLock<std::time::Duration> = std::sync::OnceLock::new();
    *IDLE.get_or_init(|| {
        let secs = std::env::var("SPACE_FILE_IDLE_SECS")
            .ok()
            .and_then(|v| v.parse::<u64>().ok())
            .filter(|s| *s > 0)
            .unwrap_or(60);
        std::time::Duration::from_secs(secs)
    })
}

/// Hands `item` to the HTTP body within the idle time; whether it was taken.
async fn handed(
    tx: &tokio::sync::mpsc::Sender<Result<Bytes, Cut>>,
    item: Result<Bytes, Cut>,
) -> bool {
    matches!(
        tokio::time::timeout(idle(), tx.send(item)).await,
        Ok(Ok(()))
    )
}

/// Why a streamed read ended without its span.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
struct Cut(String);

/// Reads the agent's chunks of request `rid` (a span of `len` bytes) into `tx` in
/// batches, the last batch held back until the agent's end confirms the span is whole
/// and the file did not change meanwhile. Anything else ends the body with an error.
/// The connection goes back to the pool only after a clean end; a client that goes
/// away (the receiver dropped) drops it, which ends the agent's side too.
async fn pump(
    mut conn: AgentConnection<AgentStream>,
    pool: Arc<AgentPool>,
    rid: RequestId,
    len: u64,
    tx: tokio::sync::mpsc::Sender<Result<Bytes, Cut>>,
) {
    let mut held: Option<Bytes> = None;
    let mut batch: Vec<u8> = Vec::with_capacity(BATCH);
    let mut got = 0u64;
    let outcome = loop {
        match conn.next_answer_async(rid).await {
            Ok(AgentBody::FileData(chunk)) => {
                got += chunk.len() as u64;
                if got > len {
                    break Err(Cut(format!("the agent sent more than the {len} bytes")));
                }
                batch.extend_from_slice(&chunk);
                if batch.len() >= BATCH {
                    let full = std::mem::replace(&mut batch, Vec::with_capacity(BATCH));
                    if let Some(prev) = held.replace(Bytes::from(full)) {
                        if !handed(&tx, Ok(prev)).await {
                            return;
                        }
                    }
                }
            }
            Ok(AgentBody::ReadEnd { bytes, truncated }) => {
                break if bytes != len || got != len {
                    Err(Cut(format!(
                        "the file changed while it was read: {got} of {len} bytes"
                    )))
                } else if truncated {
                    Err(Cut("the file grew while it was read".into()))
                } else {
                    Ok(())
                };
            }
            Ok(other) => break Err(Cut(format!("unexpected answer {other:?}"))),
            Err(e) => break Err(Cut(format!("the read failed: {e}"))),
        }
    };
    match outcome {
        Ok(()) => {
            pool.give_back(conn);
            for part in [held, (!batch.is_empty()).then(|| Bytes::from(batch))]
                .into_iter()
                .flatten()
            {
                if !handed(&tx, Ok(part)).await {
                    return;
                }
            }
        }
        Err(cut) => {
            tracing::warn!(%cut, "file read cut");
            handed(&tx, Err(cut)).await;
        }
    }
}

/// The HTTP body of a streamed read: the pump's batches, exactly `left` bytes, or an
/// error (which makes the server cut the connection short of its length).
struct Streamed {
    rx: tokio::sync::mpsc::Receiver<Result<Bytes, Cut>>,
    left: u64,
    failed: bool,
}

impl hyper::body::Body for Streamed {
    type Data = Bytes;
    type Error = Cut;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Cut>>> {
        if self.left == 0 || self.failed {
            return Poll::Ready(None);
        }
        match self.rx.poll_recv(cx) {
            Poll::Pending => Poll::Pending,
            Poll::Ready(Some(Ok(b))) => {
                self.left = self.left.saturating_sub(b.len() as u64);
                Poll::Ready(Some(Ok(Frame::data(b))))
            }
            Poll::Ready(Some(Err(e))) => {
                self.failed = true;
                Poll::Ready(Some(Err(e)))
            }
            Poll::Ready(None) => {
                self.failed = true;
                Poll::Ready(Some(Err(Cut("the read ended early".into()))))
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.left == 0
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::with_exact(self.left)
    }
}

/// Streams `body` through one agent connection as the input of `op` (a file or a
/// tree write): the request, the body's chunks as they arrive (each data frame of the
/// body in one socket write), the end, and the agent's answer once what it wrote is
/// in place.
async fn write(slot: &Arc<Slot>, op: Operation, mut body: Body) -> Result<Response, Refusal> {
    let pool = slot
        .pool
        .clone()
        .ok_or(Refusal::RefreshRoute(Stale::NotRunning))?;
    let lease = slot.lease();
    let mut conn = match take(&pool).await {
        Ok(c) => c,
        // No connection to the agent: a stale route if the execution is being retired.
        Err(r) => return Err(stale_or(r, lease, slot).await),
    };
    let rid = match conn.send_request_async(op).await {
        Ok(rid) => rid,
        Err(e) => return Err(broken(&e, &lease, slot).await),
    };
    let mut frames = Vec::new();
    loop {
        let next = std::future::poll_fn(|cx| Pin::new(&mut body).poll_frame(cx));
        let Ok(next) = tokio::time::timeout(idle(), next).await else {
            // A client that stops sending holds an agent connection and a temporary
            // file: after the idle time, both go (nothing is written at `path`).
            return Err(Refusal::BodyTimeout(format!(
                "no byte of the request body for {} s; nothing was written",
                idle().as_secs()
            )));
        };
        let data = match next {
            None => break,
            Some(Ok(frame)) => match frame.into_data() {
                Ok(d) => d,
                Err(_) => continue,
            },
            // The client went away or sent less than it announced: the connection is
            // dropped without an end, and the agent removes its temporary file.
            Some(Err(e)) => {
                return Err(Refusal::IncompleteBody(format!(
                    "the request body ended early: {e}; nothing was written"
                )));
            }
        };
        frames.clear();
        for piece in data.chunks(MAX_CHUNK) {
            match input_frame(rid, Input::Data(piece.to_vec())) {
                Ok(f) => frames.extend_from_slice(&f),
                Err(e) => return Err(Refusal::Bridge(e.to_string())),
            }
        }
        if let Err(e) = write_async(conn.stream_mut(), &frames).await {
            return Err(broken(&e, &lease, slot).await);
        }
    }
    if let Err(e) = conn.send_input_async(rid, Input::End).await {
        return Err(broken(&e, &lease, slot).await);
    }
    match conn.next_answer_async(rid).await {
        Ok(AgentBody::Written { .. }) => {
            pool.give_back(conn);
            Ok(StatusCode::NO_CONTENT.into_response())
        }
        Err(ClientError::Agent(e)) => {
            pool.give_back(conn);
            Err(Refusal::Agent(e))
        }
        Err(e) => Err(broken(&e, &lease, slot).await),
        Ok(other) => Err(Refusal::Bridge(format!("unexpected answer {other:?}"))),
    }
}

/// The `path` query parameter of a file operation.
#[derive(serde::Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub(crate) struct PathQuery {
    /// The file or directory: 1 to 4096 bytes, no NUL (400 `bad_request` otherwise).
    #[param(required = true)]
    path: Option<String>,
    /// Do it as this account of the sandbox (a user name or a uid): its permissions
    /// apply (an unknown name: 400 `unknown_user`); the sandbox's root when absent.
    user: Option<String>,
}

pub(super) fn required_path(q: &PathQuery) -> Result<String, Refusal> {
    checked_path(q.path.as_deref())
}

impl PathQuery {
    pub(super) fn account(&self) -> Option<space_proto::guest::Account> {
        self.user
            .as_deref()
            .map(|u| space_proto::api::User::parse(u).into())
    }
}

/// The query of an upload: the path, and how to write it.
#[derive(serde::Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub(crate) struct WriteQuery {
    /// The file (for `/files/tar`: the directory): 1 to 4096 bytes, no NUL.
    #[param(required = true)]
    path: Option<String>,
    /// Permission bits in octal (`0755`), at most `7777` (400 `bad_request`
    /// otherwise); without it an existing file keeps its mode and a new one gets
    /// `0644`.
    mode: Option<String>,
    /// Whether missing parent directories are made (mode 0755, owned like the file):
    /// `1` (the default) or `0` (a missing parent is then 404 `not_found`).
    mkdir: Option<String>,
    /// Write as this account of the sandbox (a user name or a uid): its permissions
    /// apply and what is made is its own (an unknown name: 400 `unknown_user`).
    user: Option<String>,
}

impl WriteQuery {
    pub(super) fn path(&self) -> Option<&str> {
        self.path.as_deref()
    }

    fn mode(&self) -> Result<Option<u32>, Refusal> {
        let Some(text) = self.mode.as_deref() else {
            return Ok(None);
        };
        match u32::from_str_radix(text, 8) {
            Ok(m) if m <= 0o7777 && !text.is_empty() && text.len() <= 6 => Ok(Some(m)),
            _ => Err(Refusal::BadRequest(format!(
                "mode must be octal permission bits, 0 to 7777 (got {text:?})"
            ))),
        }
    }

    fn parents(&self) -> Result<bool, Refusal> {
        match self.mkdir.as_deref() {
            None | Some("1" | "true") => Ok(true),
            Some("0" | "false") => Ok(false),
            Some(other) => Err(Refusal::BadRequest(format!(
                "mkdir must be 1 or 0 (got {other:?})"
            ))),
        }
    }

    pub(super) fn account(&self) -> Option<space_proto::guest::Account> {
        self.user
            .as_deref()
            .map(|u| space_proto::api::User::parse(u).into())
    }
}

pub(super) fn checked_path(path: Option<&str>) -> Result<String, Refusal> {
    match path {
        Some(p) if !p.is_empty() && p.len() <= 4096 && !p.contains('\0') => Ok(p.to_owned()),
        _ => Err(Refusal::BadRequest(
            "query parameter `path` is required".into(),
        )),
    }
}

/// A file operation: admit, then `prepare` the agent call (a refusal here, a bad
/// path or body, comes after the capability's), run it on a verified bridge
/// connection, shape the answer. Writes (and removals, mkdir, rename) honour
/// idempotency keys.
#[allow(clippy::too_many_arguments)]
pub(super) async fn file_op<T, F, R>(
    w: &Worker,
    idempotency: &IdempotencyCache,
    headers: &HeaderMap,
    id: &str,
    access: Access,
    name: &'static str,
    prepare: F,
    respond: R,
) -> Response
where
    T: Send + 'static,
    F: FnOnce() -> Result<Call<T>, Refusal>,
    R: FnOnce(T) -> Response + Send + 'static,
{
    let start = Instant::now();
    let admitted = match parse_and_admit(w, headers, id, access)
        .and_then(|admitted| Ok((admitted, prepare()?)))
    {
        Ok((admitted, call)) => admitted.unpaused(w).await.map(|a| (a, call)),
        Err(r) => Err(r),
    };
    let resp = match admitted {
        Err(r) => r.into_response(),
        Ok((admitted, call)) => {
            let sandbox = admitted.sandbox();
            let slot = admitted.into_slot();
            let run = move || async move {
                match with_conn(&slot, call).await {
                    Ok(v) => with_execution(respond(v), &slot),
                    Err(r) => r.into_response(),
                }
            };
            if access == Access::FsWrite {
                once(idempotency, sandbox, headers, run).await
            } else {
                run().await
            }
        }
    };
    w.metrics.observe(name, start.elapsed());
    resp
}

/// `DELETE /v1/sandboxes/{id}/files?path=[&user=]`.
#[utoipa::path(delete, path = "/v1/sandboxes/{id}/files", tag = "sandbox", params(space_proto::openapi::SandboxPath, PathQuery), responses((status = 204, description = "removed", headers(("space-execution" = String, description = "the execution that answered"))), super::openapi::Operation), security(("capability" = [])))]
pub(crate) async fn remove_file(
    State(w): State<Arc<Worker>>,
    State(idempotency): State<IdempotencyCache>,
    Path(id): Path<String>,
    Query(q): Query<PathQuery>,
    headers: HeaderMap,
) -> Response {
    let remove = || Ok(Call::remove(&required_path(&q)?, true).as_user(q.account()));
    let respond = |()| StatusCode::NO_CONTENT.into_response();
    file_op(
        &w,
        &idempotency,
        &headers,
        &id,
        Access::FsWrite,
        "remove_file",
        remove,
        respond,
    )
    .await
}

/// `GET /v1/sandboxes/{id}/files/list?path=[&user=]`.
#[utoipa::path(get, path = "/v1/sandboxes/{id}/files/list", tag = "sandbox", params(space_proto::openapi::SandboxPath, PathQuery), responses((status = 200, description = "the directory's entries (symlinks described, not followed)", body = Vec<space_proto::api::FileEntry>, headers(("space-execution" = String, description = "the execution that answered"))), super::openapi::Operation), security(("capability" = [])))]
pub(crate) async fn list_files(
    State(w): State<Arc<Worker>>,
    State(idempotency): State<IdempotencyCache>,
    Path(id): Path<String>,
    Query(q): Query<PathQuery>,
    headers: HeaderMap,
) -> Response {
    let list = || Ok(Call::list(&required_path(&q)?).as_user(q.account()));
    let respond = |entries: Vec<space_proto::guest::DirEntry>| {
        let out: Vec<FileEntry> = entries.into_iter().map(FileEntry::from).collect();
        Json(out).into_response()
    };
    file_op(
        &w,
        &idempotency,
        &headers,
        &id,
        Access::FsRead,
        "list",
        list,
        respond,
    )
    .await
}
