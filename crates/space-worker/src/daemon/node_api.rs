//! node-api: the worker's HTTP entry. Every sandbox-scoped request is parsed into a
//! typed operation, admitted (capability verified and compared with the persisted
//! record — local state only), and only then forwarded through the verified bridge.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, Path, Query, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use space_identity::{Access, Endpoint, Operation, SandboxId, Token, Verdict};
use space_proto::api::{ErrorBody, ExecRequest, ExecResponse, FileEntry, SignedUpdate};
use space_proto::client::{AgentConnection, Call, ClientError};
use space_proto::guest::{ErrorKind, ExecSpec, ExitOutcome, FileKind};

use super::records::RecordState;
use super::state::{AgentPool, AgentStream, Slot, Worker};
use super::updates;

/// Largest file accepted in one PUT, and read in one GET.
pub const MAX_FILE: usize = 64 << 20;
/// Default exec timeout when the request names none.
const DEFAULT_EXEC_TIMEOUT_SECS: u64 = 300;

/// Labels of an admission.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct AdmissionLabels {
    /// `allow`, `refresh_route`, `deny`.
    pub verdict: &'static str,
    /// Reason code.
    pub reason: &'static str,
}

/// Labels of a request.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OpLabels {
    /// Operation.
    pub op: &'static str,
}

/// Labels of a sandbox count.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StateLabels {
    /// Record state.
    pub state: &'static str,
}

/// The worker's metrics (`space_worker_*`).
#[derive(Debug)]
pub struct WorkerMetrics {
    registry: Registry,
    /// Admissions by verdict and reason.
    pub admissions: Family<AdmissionLabels, Counter>,
    /// Latency of admitted operations.
    pub latency: Family<OpLabels, Histogram>,
    /// Executions launched.
    pub launches: Counter,
    /// Executions retired.
    pub retirements: Counter,
    /// Launches served by a warm jail (a subset of `launches`).
    pub warm_activations: Counter,
    /// Executions by record state (set when scraped).
    pub sandboxes: Family<StateLabels, Gauge>,
    /// Warm jails ready (set when scraped).
    pub warm_ready: Gauge,
}

impl Default for WorkerMetrics {
    fn default() -> Self {
        let mut registry = Registry::default();
        let admissions = Family::<AdmissionLabels, Counter>::default();
        let latency = Family::<OpLabels, Histogram>::new_with_constructor(|| {
            Histogram::new(exponential_buckets(0.000_05, 2.0, 20))
        });
        let launches = Counter::default();
        let retirements = Counter::default();
        let warm_activations = Counter::default();
        let sandboxes = Family::<StateLabels, Gauge>::default();
        let warm_ready = Gauge::default();
        registry.register(
            "space_worker_admissions",
            "Capability admissions by verdict and reason",
            admissions.clone(),
        );
        registry.register(
            "space_worker_operation_duration_seconds",
            "Latency of admitted operations",
            latency.clone(),
        );
        registry.register(
            "space_worker_launches",
            "Executions launched",
            launches.clone(),
        );
        registry.register(
            "space_worker_retirements",
            "Executions retired",
            retirements.clone(),
        );
        registry.register(
            "space_worker_warm_activations",
            "Launches served by a warm jail",
            warm_activations.clone(),
        );
        registry.register(
            "space_worker_sandboxes",
            "Executions on this worker by state",
            sandboxes.clone(),
        );
        registry.register(
            "space_worker_warm_ready",
            "Warm jails ready for a create",
            warm_ready.clone(),
        );
        Self {
            registry,
            admissions,
            latency,
            launches,
            retirements,
            warm_activations,
            sandboxes,
            warm_ready,
        }
    }
}

/// A response remembered under an idempotency key.
#[derive(Debug, Clone)]
struct Stored {
    status: StatusCode,
    execution: String,
    body: Bytes,
    content_type: &'static str,
    at: Instant,
}

/// Responses of non-idempotent operations by (sandbox, idempotency key), kept at least
/// as long as a capability lives, so a replay has no second effect.
#[derive(Debug, Default)]
pub struct IdempotencyCache {
    entries: Mutex<HashMap<(SandboxId, String), StoredCell>>,
}

type StoredCell = Arc<tokio::sync::OnceCell<Stored>>;

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

/// How long responses are remembered.
const IDEMPOTENCY_TTL: Duration = Duration::from_secs(600);

impl IdempotencyCache {
    fn cell(&self, sandbox: SandboxId, key: &str) -> Arc<tokio::sync::OnceCell<Stored>> {
        let mut entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        if entries.len() > 50_000 {
            entries.retain(|_, c| c.get().is_none_or(|s| s.at.elapsed() < IDEMPOTENCY_TTL));
        }
        let cell = entries.entry((sandbox, key.to_owned())).or_default();
        if cell
            .get()
            .is_some_and(|s| s.at.elapsed() >= IDEMPOTENCY_TTL)
        {
            *cell = Arc::default();
        }
        Arc::clone(cell)
    }
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
            post(exec).route_layer(axum::middleware::from_fn_with_state(
                Arc::clone(&worker),
                admitted_first,
            )),
        )
        .route(
            "/v1/sandboxes/{id}/files",
            get(read_file)
                .put(write_file)
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
        .layer(DefaultBodyLimit::max(MAX_FILE))
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
        return next.run(req).await;
    }
    // Refused: the rejection (counted once) as `admit` words it; the body stays unread.
    match admit(&w, req.headers(), &id, access) {
        Err(r) => {
            let mut resp = *r;
            resp.headers_mut()
                .insert(header::CONNECTION, HeaderValue::from_static("close"));
            resp
        }
        // Allowed meanwhile (an install arrived): served.
        Ok(_) => next.run(req).await,
    }
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

/// The slot once its execution is not paused (waiting up to [`PAUSED_WAIT`]).
async fn unpaused(w: &Worker, mut slot: Arc<Slot>) -> Result<Arc<Slot>, Rejection> {
    let deadline = Instant::now() + PAUSED_WAIT;
    while slot.record.state == RecordState::Paused {
        if Instant::now() >= deadline {
            return Err(reject(
                StatusCode::CONFLICT,
                "paused",
                "the sandbox is paused; resume it first",
                None,
            ));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
        slot = match w.slot(&slot.record.sandbox) {
            Some(s) if s.record.generation == slot.record.generation => s,
            _ => {
                return Err(reject(
                    StatusCode::MISDIRECTED_REQUEST,
                    "refresh_route",
                    "execution replaced",
                    Some("retired"),
                ));
            }
        };
    }
    Ok(slot)
}

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
    // The connection broke because the execution was retired or replaced meanwhile
    // (a migration, say): that is a stale route, not a broken backend.
    match result {
        Err(r) if r.status() == StatusCode::BAD_GATEWAY && *lease.borrow() => Err(reject(
            StatusCode::MISDIRECTED_REQUEST,
            "refresh_route",
            "the execution was retired during the operation",
            Some("retired"),
        )),
        other => other,
    }
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

/// Runs a non-idempotent operation once per idempotency key, to its end: it runs in
/// its own task, so a caller that goes away (a dropped connection, a client timeout)
/// cancels neither the operation nor the recording of its answer, and a retry with the
/// same key gets that answer instead of a second run.
async fn once<F, Fut>(w: &Worker, sandbox: SandboxId, headers: &HeaderMap, run: F) -> Response
where
    F: FnOnce() -> Fut,
    Fut: std::future::Future<Output = Response> + Send + 'static,
{
    let Some(key) = headers.get("idempotency-key").and_then(|v| v.to_str().ok()) else {
        return detached(run()).await.unwrap_or_else(|r| *r);
    };
    if key.is_empty() || key.len() > 255 {
        return error(
            StatusCode::BAD_REQUEST,
            "bad_request",
            "idempotency key must be 1 to 255 characters",
            None,
        );
    }
    let cell = w.idempotency.cell(sandbox, key);
    let operation = run();
    let stored = detached(async move {
        cell.get_or_init(|| async {
            let resp = operation.await;
            let status = resp.status();
            let execution = resp
                .headers()
                .get("space-execution")
                .and_then(|v| v.to_str().ok())
                .unwrap_or_default()
                .to_owned();
            let content_type = if resp
                .headers()
                .get(header::CONTENT_TYPE)
                .is_some_and(|v| v == "application/json")
            {
                "application/json"
            } else {
                "application/octet-stream"
            };
            let body = axum::body::to_bytes(resp.into_body(), MAX_FILE)
                .await
                .unwrap_or_default();
            Stored {
                status,
                execution,
                body,
                content_type,
                at: Instant::now(),
            }
        })
        .await
        .clone()
    })
    .await;
    let stored = match stored {
        Ok(s) => s,
        Err(r) => return *r,
    };
    let mut resp = (
        stored.status,
        [(header::CONTENT_TYPE, stored.content_type)],
        stored.body,
    )
        .into_response();
    if let Ok(v) = HeaderValue::from_str(&stored.execution) {
        resp.headers_mut().insert("space-execution", v);
    }
    resp.headers_mut()
        .insert("idempotent-replay", HeaderValue::from_static("checked"));
    resp
}

async fn exec(
    State(w): State<Arc<Worker>>,
    Path(id): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let start = Instant::now();
    let (sandbox, slot) = match admit(&w, &headers, &id, Access::Exec) {
        Ok(v) => v,
        Err(r) => return *r,
    };
    let slot = match unpaused(&w, slot).await {
        Ok(s) => s,
        Err(r) => return *r,
    };
    let req: ExecRequest = match serde_json::from_slice(&body) {
        Ok(r) => r,
        Err(e) => {
            return error(
                StatusCode::BAD_REQUEST,
                "bad_request",
                format!("invalid exec body: {e}"),
                None,
            );
        }
    };
    if req.cmd.is_empty() {
        return error(
            StatusCode::BAD_REQUEST,
            "bad_request",
            "cmd must not be empty",
            None,
        );
    }
    let spec = ExecSpec {
        argv: req.cmd,
        // The sandbox's environment, overridden by the request's.
        env: slot
            .record
            .env
            .clone()
            .into_iter()
            .chain(req.env.unwrap_or_default())
            .collect::<std::collections::BTreeMap<_, _>>()
            .into_iter()
            .collect(),
        cwd: req.cwd,
        stdin: Some(req.stdin.unwrap_or_default().into_bytes()),
        timeout_ms: Some(
            req.timeout_secs
                .unwrap_or(DEFAULT_EXEC_TIMEOUT_SECS)
                .saturating_mul(1000),
        ),
        pty: None,
    };
    let execution_id = slot.record.execution_id;
    let resp = once(&w, sandbox, &headers, move || async move {
        match with_conn(&slot, Call::exec(spec)).await {
            Ok(out) => {
                let (exit_code, signal) = match out.status.outcome {
                    ExitOutcome::Code(c) => (c, None),
                    ExitOutcome::Signal(s) => (128 + s, Some(s)),
                };
                with_execution(
                    Json(ExecResponse {
                        exit_code,
                        signal,
                        timed_out: out.status.timed_out,
                        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
                        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
                        execution_id,
                    })
                    .into_response(),
                    &slot,
                )
            }
            Err(r) => *r,
        }
    })
    .await;
    observe(&w, "exec", start);
    resp
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
                once(w, sandbox, headers, run).await
            } else {
                run().await
            }
        }
    };
    observe(w, name, start);
    resp
}

async fn read_file(
    State(w): State<Arc<Worker>>,
    Path(id): Path<String>,
    Query(q): Query<PathQuery>,
    headers: HeaderMap,
) -> Response {
    let read = |path: &str| Call::read_file(path, MAX_FILE as u64);
    let respond = |data: Vec<u8>| {
        ([(header::CONTENT_TYPE, "application/octet-stream")], data).into_response()
    };
    file_op(
        &w,
        &headers,
        &id,
        &q,
        Access::FsRead,
        "read_file",
        read,
        respond,
    )
    .await
}

async fn write_file(
    State(w): State<Arc<Worker>>,
    Path(id): Path<String>,
    Query(q): Query<PathQuery>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let write = move |path: &str| Call::write_file(path, &body, None);
    let respond = |_| StatusCode::NO_CONTENT.into_response();
    file_op(
        &w,
        &headers,
        &id,
        &q,
        Access::FsWrite,
        "write_file",
        write,
        respond,
    )
    .await
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

async fn apply_update(State(w): State<Arc<Worker>>, body: Bytes) -> Response {
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

async fn metrics(State(w): State<Arc<Worker>>) -> Response {
    let mut counts = [0i64; 5];
    if let Ok(slots) = w.slots.read() {
        for slot in slots.values() {
            let i = match slot.record.state {
                RecordState::Starting => 0,
                RecordState::Running => 1,
                RecordState::Paused => 2,
                RecordState::Retired => 3,
                RecordState::Failed => 4,
            };
            counts[i] += 1;
        }
    }
    for (i, state) in ["starting", "running", "paused", "retired", "failed"]
        .into_iter()
        .enumerate()
    {
        w.metrics
            .sandboxes
            .get_or_create(&StateLabels { state })
            .set(counts[i]);
    }
    w.metrics.warm_ready.set(w.warm.ready() as i64);
    let mut out = String::new();
    let _ = prometheus_client::encoding::text::encode(&mut out, &w.metrics.registry);
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], out).into_response()
}
