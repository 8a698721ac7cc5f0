//! node-api: the worker's HTTP entry. Every sandbox-scoped request is parsed into a
//! typed operation, admitted (capability verified and compared with the persisted
//! record — local state only), and only then forwarded through the verified bridge.

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, Path, Query, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use space_identity::{Access, Endpoint, Operation, SandboxId, Token, Verdict};
use space_proto::api::{
    DEFAULT_MAX_OUTPUT_BYTES, ErrorBody, ExecRequest, ExecResponse, FileEntry, MAX_EXEC_BODY,
    MAX_EXEC_STDIN, MAX_OUTPUT_BYTES, SignedUpdate,
};
use space_proto::client::{AgentConnection, Call, ClientError};
use space_proto::guest::{ErrorKind, FileKind};

use super::records::RecordState;
use super::state::{AgentPool, AgentStream, Slot, Worker};
use super::updates;

/// Largest request body read into memory (an exec's JSON). File writes are streamed
/// to the agent and not bound by it (the sandbox's disk limit is theirs); file reads
/// are streamed too, at any size.
const MAX_BUFFERED_BODY: usize = 64 << 20;
/// Default exec timeout when the request names none.
const DEFAULT_EXEC_TIMEOUT_SECS: u64 = space_proto::api::DEFAULT_EXEC_TIMEOUT_SECS;

/// A rejection answered instead of the operation (boxed: responses are large).
pub(crate) type Rejection = Box<Response>;

/// 421: the execution is not running here.
pub(crate) fn not_running() -> Rejection {
    reject(
        StatusCode::MISDIRECTED_REQUEST,
        "refresh_route",
        "execution not running",
        Some("not_running"),
    )
}

/// 502: the bridge or agent failed.
pub(crate) fn bad_gateway(message: impl Into<String>) -> Rejection {
    reject(StatusCode::BAD_GATEWAY, "bridge", message, None)
}

/// Admission of a stream open: the comparator, then the same wait as requests when
/// the execution is paused.
pub(crate) async fn admit_stream(
    w: &Worker,
    headers: &HeaderMap,
    id: &str,
    access: Access,
) -> Result<Arc<Slot>, Rejection> {
    let (_, slot) = admit(w, headers, id, access)?;
    unpaused(w, slot).await
}

fn reject(
    status: StatusCode,
    code: &str,
    message: impl Into<String>,
    reason: Option<&str>,
) -> Rejection {
    Box::new(error(status, code, message, reason))
}

fn error(
    status: StatusCode,
    code: &str,
    message: impl Into<String>,
    reason: Option<&str>,
) -> Response {
    (
        status,
        Json(ErrorBody {
            error: code.to_owned(),
            message: message.into(),
            reason: reason.map(str::to_owned),
        }),
    )
        .into_response()
}

/// The router.
pub fn router(worker: Arc<Worker>) -> Router {
    Router::new()
        .route(
            "/v1/sandboxes/{id}/exec",
            post(exec::exec)
                .layer(DefaultBodyLimit::max(MAX_EXEC_BODY))
                .route_layer(axum::middleware::from_fn_with_state(
                    Arc::clone(&worker),
                    admitted_first,
                )),
        )
        .route(
            "/v1/sandboxes/{id}/files",
            get(files::read_file)
                .put(files::write_file)
                .delete(remove_file)
                .route_layer(axum::middleware::from_fn_with_state(
                    Arc::clone(&worker),
                    admitted_first,
                )),
        )
        .route("/v1/sandboxes/{id}/files/list", get(list_files))
        .route("/v1/sandboxes/{id}/terminal", get(super::streams::terminal))
        .route("/v1/sandboxes/{id}/watch", get(super::streams::watch))
        .route(
            "/v1/sandboxes/{id}/exec/stream",
            get(super::streams::exec_stream),
        )
        .merge(
            // Updates, snapshots and layers run to their end whatever becomes of the
            // caller (see `space_http::run_to_end`).
            Router::new()
                .route("/internal/v1/updates", post(apply_update))
                .route(
                    "/internal/v1/snapshot",
                    post(super::snapshot::http::snapshot)
                        .layer(DefaultBodyLimit::max(MAX_SIGNED_REQUEST)),
                )
                // The body is streamed to disk once the signed update in its header
                // is verified (no body limit here: the signed size is the limit).
                .route("/internal/v1/layers", post(super::snapshot::http::layer))
                .route_layer(axum::middleware::from_fn(space_http::run_to_end)),
        )
        .route("/metrics", get(metrics))
        .route("/healthz", get(|| async { "ok" }))
        .fallback(|| async { error(StatusCode::NOT_FOUND, "not_found", "no such route", None) })
        .layer(DefaultBodyLimit::max(MAX_BUFFERED_BODY))
        .with_state(worker)
}

/// Largest body of a request that carries its own signature (a snapshot order).
const MAX_SIGNED_REQUEST: usize = 64 << 10;

/// Admits the capability of an exec or file request before its body is read (the
/// handler then admits it again, from the verified-token cache, and counts it): a
/// request without a valid capability for a running execution here is answered — and
/// its connection closed — without a byte of its body being read.
async fn admitted_first(
    State(w): State<Arc<Worker>>,
    Path(id): Path<String>,
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let access = match *req.method() {
        axum::http::Method::POST => Access::Exec,
        // Reads take no body (one sent is never read): admitted by the handler alone.
        axum::http::Method::GET => return next.run(req).await,
        _ => Access::FsWrite,
    };
    let allowed = admission_token(req.headers()).is_some_and(|token| {
        let Ok(sandbox) = id.parse::<SandboxId>() else {
            return false;
        };
        let op = Operation {
            path_sandbox: &sandbox,
            bound_sandbox: None,
            endpoint: Endpoint::Control { access },
        };
        matches!(w.admit(token.as_bytes(), &op).0, Verdict::Allow)
    });
    if allowed {
        // A paused (or snapshot-frozen) execution: wait for it here, before the body is
        // read, so that if it is retired meanwhile the 421 finds the body unread and
        // the caller can make its rebuilt attempt with it.
        let paused = id
            .parse::<SandboxId>()
            .ok()
            .and_then(|s| w.slot(&s))
            .filter(|s| s.record.state == RecordState::Paused);
        if let Some(slot) = paused {
            if let Err(r) = unpaused(&w, slot).await {
                return closing(*r);
            }
        }
        return next.run(req).await;
    }
    // Refused: the rejection (counted once) as `admit` words it; the body stays unread.
    match admit(&w, req.headers(), &id, access) {
        Err(r) => closing(*r),
        // Allowed meanwhile (an install arrived): served.
        Ok(_) => next.run(req).await,
    }
}

/// `resp` with `Connection: close` (its request's body was not read).
fn closing(mut resp: Response) -> Response {
    resp.headers_mut()
        .insert(header::CONNECTION, HeaderValue::from_static("close"));
    resp
}

/// The capability a request presents, if it parses.
fn admission_token(headers: &HeaderMap) -> Option<Token> {
    let text = headers
        .get(header::AUTHORIZATION)?
        .to_str()
        .ok()?
        .strip_prefix("SpaceCap ")?;
    Token::from_text(text.trim()).ok()
}

/// Admits a request or answers the rejection (401, 421, 403).
fn admit(
    w: &Worker,
    headers: &HeaderMap,
    id: &str,
    access: Access,
) -> Result<(SandboxId, Arc<Slot>), Rejection> {
    let text = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("SpaceCap "))
        .ok_or_else(|| {
            reject(
                StatusCode::UNAUTHORIZED,
                "unauthorized",
                "a SpaceCap capability is required",
                None,
            )
        })?;
    let token = Token::from_text(text.trim()).map_err(|r| {
        reject(
            StatusCode::UNAUTHORIZED,
            "unauthorized",
            "unparseable capability",
            Some(r.as_str()),
        )
    })?;
    // An unparseable path names no sandbox this worker could serve.
    let sandbox: SandboxId = id.parse().map_err(|_| {
        reject(
            StatusCode::FORBIDDEN,
            "deny",
            "denied",
            Some("sandbox_mismatch"),
        )
    })?;
    let op = Operation {
        path_sandbox: &sandbox,
        bound_sandbox: None,
        endpoint: Endpoint::Control { access },
    };
    let (verdict, slot) = w.admit(token.as_bytes(), &op);
    w.metrics
        .admissions
        .get_or_create(&AdmissionLabels {
            verdict: verdict.kind_str(),
            reason: verdict.reason_str(),
        })
        .inc();
    match verdict {
        Verdict::Allow => {}
        Verdict::RefreshRoute { reason } => {
            return Err(reject(
                StatusCode::MISDIRECTED_REQUEST,
                "refresh_route",
                "route is stale",
                Some(reason.as_str()),
            ));
        }
        Verdict::Deny { reason } => {
            return Err(reject(
                StatusCode::FORBIDDEN,
                "deny",
                "denied",
                Some(reason.as_str()),
            ));
        }
    }
    match slot {
        Some(s) if s.pool.is_some() => Ok((sandbox, s)),
        _ => Err(reject(
            StatusCode::MISDIRECTED_REQUEST,
            "refresh_route",
            "execution not running",
            Some("not_running"),
        )),
    }
}

/// How long a request to a paused sandbox waits for a resume before it is answered
/// `409 paused` (nothing was forwarded, so nothing is lost).
const PAUSED_WAIT: Duration = Duration::from_secs(2);

/// How long a request to an execution frozen for a snapshot or a migration waits for
/// it to be thawed or replaced: as long as the edge waits for a transition.
const SNAPSHOT_WAIT: Duration = Duration::from_secs(10);

/// The slot once its execution is not paused (waiting up to [`PAUSED_WAIT`], or
/// [`SNAPSHOT_WAIT`] when it is frozen for a snapshot, woken by
/// slot changes, not polling). An execution retired or replaced meanwhile is a stale
/// route (421); one that is no longer live is too.
async fn unpaused(w: &Worker, mut slot: Arc<Slot>) -> Result<Arc<Slot>, Rejection> {
    let wait = if w.is_snapshot_frozen(&slot.record.sandbox, slot.record.generation) {
        SNAPSHOT_WAIT
    } else {
        PAUSED_WAIT
    };
    let deadline = tokio::time::Instant::now() + wait;
    let mut changes = w.slot_changes.subscribe();
    while slot.record.state == RecordState::Paused {
        if !matches!(
            tokio::time::timeout_at(deadline, changes.changed()).await,
            Ok(Ok(()))
        ) {
            return Err(reject(
                StatusCode::CONFLICT,
                "paused",
                "the sandbox is paused; resume it first",
                None,
            ));
        }
        slot = match w.slot(&slot.record.sandbox) {
            Some(s)
                if s.record.generation == slot.record.generation
                    && s.record.execution_id == slot.record.execution_id =>
            {
                s
            }
            _ => return Err(replaced()),
        };
    }
    if !matches!(slot.record.state, RecordState::Running) {
        return Err(replaced());
    }
    Ok(slot)
}

/// 421: the execution was retired or replaced while the request waited.
fn replaced() -> Rejection {
    reject(
        StatusCode::MISDIRECTED_REQUEST,
        "refresh_route",
        "execution replaced",
        Some("retired"),
    )
}

/// How long an operation whose agent connection broke waits to learn that its
/// execution was retired (then it is a stale route, 421) before it is a bridge failure.
const RETIRE_GRACE: Duration = Duration::from_secs(2);

/// Runs `call` on a pooled, verified agent connection, on this task: no thread waits
/// for the agent, and no other thread is woken for it. The connection goes back to the
/// pool only after a clean answer; a request cancelled part-way drops it.
async fn with_conn<T: Send + 'static>(slot: &Arc<Slot>, call: Call<T>) -> Result<T, Rejection> {
    let Some(pool) = slot.pool.clone() else {
        return Err(not_running());
    };
    let lease = slot.lease();
    let result = async {
        let mut conn = match pool.idle() {
            Some(conn) => conn,
            None => connect(&pool)
                .await
                .map_err(|e| reject(StatusCode::BAD_GATEWAY, "bridge", e, None))?,
        };
        match conn.run_async(call).await {
            Ok(v) => {
                pool.give_back(conn);
                Ok(v)
            }
            Err(ClientError::Agent(e)) => {
                // An operation error leaves the connection usable.
                pool.give_back(conn);
                Err(Box::new(agent_error(&e)))
            }
            Err(e) => Err(reject(
                StatusCode::BAD_GATEWAY,
                "bridge",
                e.to_string(),
                None,
            )),
        }
    }
    .await;
    match result {
        Err(r) if r.status() == StatusCode::BAD_GATEWAY => Err(stale_or(r, lease, slot).await),
        other => other,
    }
}

/// A broken agent connection of `slot` (`r`, a 502): a stale route (421 `retired`)
/// when the execution was retired or replaced meanwhile (a migration, say), else `r`.
/// Its agent may go a moment before the worker records the retirement (a jail torn
/// down, a frozen agent's bridge giving up), so this waits up to [`RETIRE_GRACE`] for
/// the execution's lease to end.
pub(crate) async fn stale_or(
    r: Rejection,
    mut lease: tokio::sync::watch::Receiver<bool>,
    slot: &Slot,
) -> Rejection {
    let replaced = tokio::time::timeout(RETIRE_GRACE, lease.wait_for(|gone| *gone))
        .await
        .is_ok_and(|r| r.is_ok());
    if replaced {
        return reject(
            StatusCode::MISDIRECTED_REQUEST,
            "refresh_route",
            "the execution was retired during the operation",
            Some("retired"),
        );
    }
    tracing::warn!(sandbox = %slot.record.sandbox, generation = slot.record.generation, state = ?slot.record.state, "agent connection failed and the execution was not retired");
    r
}

/// A new verified connection to the pool's bridge (the checks and the handshake run
/// once, on the blocking pool), made non-blocking for the runtime.
async fn connect(pool: &AgentPool) -> Result<AgentConnection<AgentStream>, String> {
    let target = pool.target().clone();
    let conn = tokio::task::spawn_blocking(move || spaced_host::connect(&target))
        .await
        .map_err(|e| e.to_string())?
        .map_err(|e| e.to_string())?;
    conn.map_stream(AgentStream::new)
        .map_err(|e: std::io::Error| e.to_string())
}

pub(crate) fn agent_error(e: &space_proto::guest::WireError) -> Response {
    let (status, code) = match e.kind {
        ErrorKind::NotFound => (StatusCode::NOT_FOUND, "not_found"),
        ErrorKind::PermissionDenied => (StatusCode::FORBIDDEN, "permission_denied"),
        ErrorKind::IsADirectory => (StatusCode::BAD_REQUEST, "is_a_directory"),
        ErrorKind::NotADirectory => (StatusCode::BAD_REQUEST, "not_a_directory"),
        ErrorKind::AlreadyExists => (StatusCode::CONFLICT, "already_exists"),
        ErrorKind::InvalidArgument => (StatusCode::BAD_REQUEST, "invalid_argument"),
        ErrorKind::Busy => (StatusCode::SERVICE_UNAVAILABLE, "busy"),
        ErrorKind::NoSpace => (StatusCode::INSUFFICIENT_STORAGE, "no_space"),
        _ => (StatusCode::BAD_GATEWAY, "agent"),
    };
    error(status, code, e.message.clone(), None)
}

fn with_execution(mut resp: Response, slot: &Slot) -> Response {
    if let Ok(v) = HeaderValue::from_str(&slot.record.execution_id.to_string()) {
        resp.headers_mut().insert("space-execution", v);
    }
    resp
}

/// Runs `fut` in its own task to its end, whatever becomes of the caller.
async fn detached<T: Send + 'static>(
    fut: impl std::future::Future<Output = T> + Send + 'static,
) -> Result<T, Rejection> {
    tokio::spawn(fut).await.map_err(|e| {
        reject(
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal",
            format!("operation task: {e}"),
            None,
        )
    })
}

fn observe(w: &Worker, op: &'static str, start: Instant) {
    w.metrics
        .latency
        .get_or_create(&OpLabels { op })
        .observe(start.elapsed().as_secs_f64());
}

#[derive(serde::Deserialize)]
struct PathQuery {
    path: Option<String>,
}

fn required_path(q: &PathQuery) -> Result<String, Rejection> {
    match q.path.as_deref() {
        Some(p) if !p.is_empty() && p.len() <= 4096 && !p.contains('\0') => Ok(p.to_owned()),
        _ => Err(reject(
            StatusCode::BAD_REQUEST,
            "bad_request",
            "query parameter `path` is required",
            None,
        )),
    }
}

/// A file operation: admit, take the path, run `f` on a verified bridge connection,
/// shape the answer. Writes and removals honour idempotency keys.
#[allow(clippy::too_many_arguments)]
async fn file_op<T, F, R>(
    w: &Worker,
    headers: &HeaderMap,
    id: &str,
    q: &PathQuery,
    access: Access,
    name: &'static str,
    f: F,
    respond: R,
) -> Response
where
    T: Send + 'static,
    F: FnOnce(&str) -> Call<T>,
    R: FnOnce(T) -> Response + Send + 'static,
{
    let start = Instant::now();
    let admitted = match admit(w, headers, id, access)
        .and_then(|(sbx, slot)| Ok((sbx, slot, required_path(q)?)))
    {
        Ok((sbx, slot, path)) => unpaused(w, slot).await.map(|slot| (sbx, slot, path)),
        Err(r) => Err(r),
    };
    let resp = match admitted {
        Err(r) => *r,
        Ok((sandbox, slot, path)) => {
            let call = f(&path);
            let run = move || async move {
                match with_conn(&slot, call).await {
                    Ok(v) => with_execution(respond(v), &slot),
                    Err(r) => *r,
                }
            };
            if access == Access::FsWrite {
                once(&w.idempotency, sandbox, headers, run).await
            } else {
                run().await
            }
        }
    };
    observe(w, name, start);
    resp
}

async fn remove_file(
    State(w): State<Arc<Worker>>,
    Path(id): Path<String>,
    Query(q): Query<PathQuery>,
    headers: HeaderMap,
) -> Response {
    let remove = |path: &str| Call::remove(path, true);
    let respond = |()| StatusCode::NO_CONTENT.into_response();
    file_op(
        &w,
        &headers,
        &id,
        &q,
        Access::FsWrite,
        "remove_file",
        remove,
        respond,
    )
    .await
}

async fn list_files(
    State(w): State<Arc<Worker>>,
    Path(id): Path<String>,
    Query(q): Query<PathQuery>,
    headers: HeaderMap,
) -> Response {
    let list = |path: &str| Call::list(path);
    let respond = |entries: Vec<space_proto::guest::DirEntry>| {
        let out: Vec<FileEntry> = entries
            .into_iter()
            .map(|e| FileEntry {
                name: e.name,
                kind: match e.kind {
                    FileKind::File => "file",
                    FileKind::Dir => "dir",
                    FileKind::Symlink => "symlink",
                    FileKind::Other => "other",
                }
                .to_owned(),
                size: e.size,
            })
            .collect();
        Json(out).into_response()
    };
    file_op(&w, &headers, &id, &q, Access::FsRead, "list", list, respond).await
}

async fn apply_update(
    State(w): State<Arc<Worker>>,
    headers: HeaderMap,
    body: axum::body::Body,
) -> Response {
    // The sender first: nothing of the body is read before its signed delivery
    // descriptor verifies, and then no more than the size it signed.
    let delivery = match updates::check_delivery(&w, headers.get(space_proto::api::DELIVERY_HEADER))
    {
        Ok(d) => d,
        Err(e) => {
            let mut resp = error(
                StatusCode::from_u16(e.status).unwrap_or(StatusCode::UNAUTHORIZED),
                "update_refused",
                e.message,
                None,
            );
            resp.headers_mut().insert(
                axum::http::header::CONNECTION,
                HeaderValue::from_static("close"),
            );
            return resp;
        }
    };
    let body = match axum::body::to_bytes(body, delivery.size as usize).await {
        Ok(b)
            if b.len() as u64 == delivery.size
                && blake3::hash(&b).to_hex().as_str() == delivery.digest =>
        {
            b
        }
        Ok(_) | Err(_) => {
            return error(
                StatusCode::FORBIDDEN,
                "update_refused",
                "delivery_mismatch: the body is not the one whose delivery was signed",
                None,
            );
        }
    };
    let signed: SignedUpdate = match serde_json::from_slice(&body) {
        Ok(s) => s,
        Err(e) => {
            return error(
                StatusCode::BAD_REQUEST,
                "bad_request",
                format!("invalid update: {e}"),
                None,
            );
        }
    };
    let result = match updates::verify(&w, &signed) {
        Ok((body, update)) => updates::apply(&w, body, update).await,
        Err(e) => Err(e),
    };
    match result {
        Ok(ack) => Json(ack).into_response(),
        Err(e) => error(
            StatusCode::from_u16(e.status).unwrap_or(StatusCode::BAD_REQUEST),
            "update_refused",
            e.message,
            None,
        ),
    }
}

mod exec;
mod files;
mod idempotency;
mod metrics;

pub(crate) use exec::exec_stdin;
use idempotency::once;
pub use idempotency::{IDEMPOTENCY_MAX_BYTES, IDEMPOTENCY_MAX_ENTRIES, IdempotencyCache};
pub(crate) use metrics::metrics;
pub use metrics::{AdmissionLabels, OpLabels, StateLabels, WorkerMetrics};
