//! Directories as tar streams: `GET …/files/tar?path=DIR` streams DIR as the agent
//! packs it (chunked: its size is known only at its end), `PUT …/files/tar?path=DIR`
//! streams the body to the agent, which unpacks it into DIR inside the sandbox
//! (refusing entries that are absolute, climb with `..`, pass through a symlink or
//! are devices). Neither side holds more than a few chunks.

use std::sync::Arc;
use std::time::Instant;

use axum::body::{Body, Bytes};
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, HeaderValue, header};
use axum::response::{IntoResponse, Response};
use space_identity::Access;
use space_proto::client::ClientError;
use space_proto::guest::{AgentBody, Operation};

use super::admission::parse_and_admit;
use super::agent::{stale_or, with_execution};
use super::files::{WriteQuery, broken, checked_path, idle, take, upload};
use super::idempotency::IdempotencyCache;
use super::refusal::{Refusal, Stale};
use crate::daemon::state::Worker;

/// Chunks in flight between the task reading the agent and the HTTP body.
const QUEUE: usize = 8;

/// The query of a directory read.
#[derive(serde::Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub(crate) struct TreeQuery {
    /// The directory: 1 to 4096 bytes, no NUL.
    #[param(required = true)]
    path: Option<String>,
}

/// `GET /v1/sandboxes/{id}/files/tar?path=DIR`: DIR as a tar stream.
#[utoipa::path(get, path = "/v1/sandboxes/{id}/files/tar", tag = "sandbox", params(space_proto::openapi::SandboxPath, TreeQuery), responses((status = 200, description = "the directory as a tar archive (regular files, directories, symlinks as links, modes, mtimes; no devices), streamed; cut short (no final chunk) if packing fails on the way", body = space_proto::openapi::RawBytes, content_type = "application/x-tar", headers(("space-execution" = String, description = "the execution that answered"))), super::openapi::FileRead), security(("capability" = [])))]
pub(crate) async fn read_tree(
    State(w): State<Arc<Worker>>,
    Path(id): Path<String>,
    Query(q): Query<TreeQuery>,
    headers: HeaderMap,
) -> Response {
    let start = Instant::now();
    let resp = read(&w, &headers, &id, &q)
        .await
        .unwrap_or_else(IntoResponse::into_response);
    w.metrics.observe("read_tree", start.elapsed());
    resp
}

async fn read(
    w: &Worker,
    headers: &HeaderMap,
    id: &str,
    q: &TreeQuery,
) -> Result<Response, Refusal> {
    let admitted = parse_and_admit(w, headers, id, Access::FsRead)?;
    let path = checked_path(q.path.as_deref())?;
    let slot = admitted.unpaused(w).await?.into_slot();
    let pool = slot
        .pool
        .clone()
        .ok_or(Refusal::RefreshRoute(Stale::NotRunning))?;
    let lease = slot.lease();
    let mut conn = match take(&pool).await {
        Ok(c) => c,
        Err(r) => return Err(stale_or(r, lease, &slot).await),
    };
    let rid = match conn.send_request_async(Operation::ReadTree { path }).await {
        Ok(rid) => rid,
        Err(e) => return Err(broken(&e, &lease, &slot).await),
    };
    // The first answer decides the status: an error before any byte is the answer.
    let first = match conn.next_answer_async(rid).await {
        Ok(AgentBody::FileData(chunk)) => chunk,
        Ok(AgentBody::ReadEnd { .. }) => Vec::new(),
        Err(ClientError::Agent(e)) => {
            pool.give_back(conn);
            return Err(Refusal::Agent(e));
        }
        Err(e) => return Err(broken(&e, &lease, &slot).await),
        Ok(other) => return Err(Refusal::Bridge(format!("unexpected answer {other:?}"))),
    };
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<Bytes, std::io::Error>>(QUEUE);
    tokio::spawn(async move {
        if !first.is_empty() && !hand(&tx, Ok(Bytes::from(first))).await {
            return;
        }
        loop {
            match conn.next_answer_async(rid).await {
                Ok(AgentBody::FileData(chunk)) => {
                    if !hand(&tx, Ok(Bytes::from(chunk))).await {
                        return;
                    }
                }
                Ok(AgentBody::ReadEnd { .. }) => {
                    pool.give_back(conn);
                    return;
                }
                // Cut: the client sees the chunked body end without its last chunk.
                other => {
                    tracing::warn!(answer = ?other, "directory read cut");
                    hand(&tx, Err(std::io::Error::other("the directory read failed"))).await;
                    return;
                }
            }
        }
    });
    let mut resp = Body::new(Chunks { rx }).into_response();
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/x-tar"),
    );
    Ok(with_execution(resp, &slot))
}

/// The HTTP body of a directory read: the agent's chunks as they come, ended by an
/// error (the connection cut short of the last chunk) when the read fails.
struct Chunks {
    rx: tokio::sync::mpsc::Receiver<Result<Bytes, std::io::Error>>,
}

impl hyper::body::Body for Chunks {
    type Data = Bytes;
    type Error = std::io::Error;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<hyper::body::Frame<Bytes>, std::io::Error>>> {
        self.rx
            .poll_recv(cx)
            .map(|item| item.map(|r| r.map(hyper::body::Frame::data)))
    }
}

/// Hands `item` to the HTTP body within the idle time; whether it was taken.
async fn hand(
    tx: &tokio::sync::mpsc::Sender<Result<Bytes, std::io::Error>>,
    item: Result<Bytes, std::io::Error>,
) -> bool {
    matches!(
        tokio::time::timeout(idle(), tx.send(item)).await,
        Ok(Ok(()))
    )
}

/// `PUT /v1/sandboxes/{id}/files/tar?path=DIR[&user=]`: the `application/x-tar` body
/// unpacked into DIR (made, with its parents, if missing).
#[utoipa::path(put, path = "/v1/sandboxes/{id}/files/tar", tag = "sandbox", params(space_proto::openapi::SandboxPath, WriteQuery), request_body(content = space_proto::openapi::RawBytes, content_type = "application/x-tar"), responses((status = 204, description = "unpacked (an entry that is absolute, climbs out with `..`, passes through a symlink or is a device: 400 `invalid_argument`, what came before it stays)", headers(("space-execution" = String, description = "the execution that answered"))), super::openapi::FileWrite), security(("capability" = [])))]
pub(crate) async fn write_tree(
    State(w): State<Arc<Worker>>,
    State(idempotency): State<IdempotencyCache>,
    Path(id): Path<String>,
    Query(q): Query<WriteQuery>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let start = Instant::now();
    let op = |path: String| -> Result<Operation, Refusal> {
        Ok(Operation::WriteTree {
            path,
            user: q.account(),
        })
    };
    let resp = upload(&w, &idempotency, &id, &headers, q.path(), op, body).await;
    w.metrics.observe("write_tree", start.elapsed());
    resp
}
