//! The HTTP API of the control plane and edge (`API.md`), and the internal endpoints
//! workers call. Requests are parsed into typed values here; handlers never see raw
//! input, and bad input is a 4xx with a JSON error, never a 500.

use std::sync::Arc;
use std::time::Instant;

use axum::Json;
pub use axum::Router;
use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, MatchedPath, Path, Request, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, post};
use serde::de::DeserializeOwned;
use space_identity::{AccessSet, OperationClass, SandboxId, WorkerId};
use space_proto::api::{CapabilityRequest, CreateSandbox, EnrollRequest};

use crate::edge::{Authenticated, Authority, Edge};
use crate::error::ControlError;
use crate::service::ControlPlane;

pub mod error;

/// Largest request body (file uploads), read only once the API key is verified.
pub const MAX_BODY: usize = 64 << 20;

/// Largest body of an `/internal/v1/*` request (enrollment, sync, lost executions):
/// those authenticate by what they carry, so what is read first is kept small.
pub const MAX_INTERNAL_BODY: usize = 64 << 10;

tokio::task_local! {
    /// The caller [`authenticate_first`] verified for the request this task serves,
    /// with the key presented.
    static AUTHENTICATED: Authenticated;
}

/// Shared state of the handlers.
#[derive(Debug, Clone)]
pub struct AppState {
    /// The control plane (absent in a standalone edge).
    pub cp: Option<Arc<ControlPlane>>,
    /// The edge.
    pub edge: Arc<Edge>,
}

fn parse<T: DeserializeOwned>(body: &[u8]) -> Result<T, ControlError> {
    serde_json::from_slice(body)
        .map_err(|e| ControlError::BadRequest(format!("invalid JSON body: {e}")))
}

fn bearer(headers: &HeaderMap) -> Result<String, ControlError> {
    let v = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .ok_or(ControlError::Unauthorized)?;
    v.strip_prefix("Bearer ")
        .map(|s| s.trim().to_owned())
        .ok_or(ControlError::Unauthorized)
}

async fn caller(st: &AppState, headers: &HeaderMap) -> Result<Authenticated, ControlError> {
    let key = bearer(headers)?;
    // Verified already by `authenticate_first` in this task (the same key).
    if let Ok(Some(who)) = AUTHENTICATED.try_with(|who| who.presented(&key).then(|| who.clone())) {
        return Ok(who);
    }
    st.edge.authenticate(&key).await
}

/// Verifies the API key of every `/v1/*` request before its body is read, so an
/// unauthenticated client gets its 401 (and the connection is closed) without the
/// server reading, let alone buffering, what it sends. `/internal/v1/*` requests
/// authenticate by their worker credential or enrollment secret and are bounded by
/// [`MAX_INTERNAL_BODY`] instead.
async fn authenticate_first(State(st): State<AppState>, req: Request, next: Next) -> Response {
    if !req.uri().path().starts_with("/v1/") {
        return next.run(req).await;
    }
    match caller(&st, req.headers()).await {
        Ok(authenticated) => AUTHENTICATED.scope(authenticated, next.run(req)).await,
        Err(e) => {
            let mut resp = e.into_response();
            resp.headers_mut()
                .insert(header::CONNECTION, HeaderValue::from_static("close"));
            resp
        }
    }
}

fn cp(st: &AppState) -> Result<&Arc<ControlPlane>, ControlError> {
    st.cp.as_ref().ok_or(ControlError::NotHere)
}

/// The caller's sandbox `id` (404 for anyone else's).
async fn owned_sandbox(
    st: &AppState,
    headers: &HeaderMap,
    id: &str,
) -> Result<(Arc<ControlPlane>, space_store::SandboxRecord), ControlError> {
    let who = caller(st, headers).await?;
    let cp = Arc::clone(cp(st)?);
    let s = cp.sandbox_for(&who.caller, &sandbox_id(id)?).await?;
    Ok((cp, s))
}

fn sandbox_id(s: &str) -> Result<SandboxId, ControlError> {
    s.parse().map_err(|_| ControlError::NotFound("sandbox"))
}

/// The router.
pub fn router(state: AppState) -> Router {
    // Changes of state run to their end whatever becomes of the caller (see
    // `space_http::run_to_end`); forwarded operations are the worker's business.
    let changes = Router::new()
        .route("/v1/sandboxes", post(create_sandbox).get(list_sandboxes))
        .route(
            "/v1/sandboxes/{id}",
            get(get_sandbox).delete(delete_sandbox),
        )
        .route("/v1/sandboxes/{id}/capabilities", post(capability))
        .route("/v1/sandboxes/{id}/pause", post(pause))
        .route("/v1/sandboxes/{id}/resume", post(resume))
        .route("/v1/sandboxes/{id}/migrate", post(migrate))
        .route("/v1/sandboxes/{id}/snapshot", post(snapshot))
        .route("/v1/tenants", post(create_tenant))
        .route("/v1/keys", post(create_key))
        .route("/v1/keys/{id}", delete(revoke_key))
        .route("/v1/signing-keys/rotate", post(rotate))
        .route("/internal/v1/enroll", post(enroll).layer(internal_limit()))
        .route(
            "/internal/v1/workers/{id}/sync",
            post(sync).layer(internal_limit()),
        )
        .route(
            "/internal/v1/workers/{id}/lost",
            post(lost).layer(internal_limit()),
        )
        .route_layer(middleware::from_fn(space_http::run_to_end));
    Router::new()
        .merge(changes)
        .route("/v1/sandboxes/{id}/exec", post(forward_exec))
        .route(
            "/v1/sandboxes/{id}/files",
            get(forward_files).put(forward_files).delete(forward_files),
        )
        .route("/v1/sandboxes/{id}/files/list", get(forward_list))
        .route("/v1/sandboxes/{id}/terminal", get(forward_stream))
        .route("/v1/sandboxes/{id}/watch", get(forward_stream))
        .route("/v1/sandboxes/{id}/exec/stream", get(forward_stream))
        .route("/v1/workers", get(workers))
        .route("/v1/whoami", get(whoami))
        .route("/metrics", get(metrics))
        .route("/healthz", get(crate::health::healthz))
        .route(
            "/readyz",
            get(|State(st): State<AppState>| crate::health::readyz(st.edge)),
        )
        .fallback(|| async { ControlError::NotFound("route") })
        .layer(DefaultBodyLimit::max(MAX_BODY))
        .layer(middleware::from_fn_with_state(
            state.clone(),
            authenticate_first,
        ))
        .layer(middleware::from_fn_with_state(state.clone(), observe))
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

async fn create_sandbox(
    State(st): State<AppState>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, ControlError> {
    let who = caller(&st, &headers).await?;
    let c = &who.caller;
    let req: CreateSandbox = if body.is_empty() {
        CreateSandbox::default()
    } else {
        parse(&body)?
    };
    let cp = cp(&st)?;
    let view = cp.create_sandbox(c, req).await?;
    Ok((StatusCode::CREATED, Json(view)).into_response())
}

async fn list_sandboxes(
    State(st): State<AppState>,
    headers: HeaderMap,
) -> Result<Response, ControlError> {
    let who = caller(&st, &headers).await?;
    let c = &who.caller;
    let cp = cp(&st)?;
    let mut out = Vec::new();
    for s in cp.store.list_sandboxes(&c.tenant).await? {
        out.push(cp.view(&s).await?);
    }
    Ok(Json(out).into_response())
}

async fn get_sandbox(
    State(st): State<AppState>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Result<Response, ControlError> {
    let (cp, s) = owned_sandbox(&st, &headers, &id).await?;
    Ok(Json(cp.view(&s).await?).into_response())
}

async fn delete_sandbox(
    State(st): State<AppState>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Result<Response, ControlError> {
    let (cp, s) = owned_sandbox(&st, &headers, &id).await?;
    cp.delete_sandbox(&s).await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

async fn pause(
    State(st): State<AppState>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Result<Response, ControlError> {
    let (cp, s) = owned_sandbox(&st, &headers, &id).await?;
    cp.pause(&s).await?;
    Ok(Json(cp.view(&cp.store.get_sandbox(&s.id).await?).await?).into_response())
}

async fn resume(
    State(st): State<AppState>,
    headers: HeaderMap,
    Path(id): Path<String>,
    body: Bytes,
) -> Result<Response, ControlError> {
    #[derive(serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Req {
        worker: Option<WorkerId>,
    }
    let req: Req = if body.is_empty() {
        Req { worker: None }
    } else {
        parse(&body)?
    };
    let (cp, s) = owned_sandbox(&st, &headers, &id).await?;
    match req.worker {
        // Resuming on a worker restores the snapshot there as a new execution.
        Some(w) => cp.resume_from_snapshot(&s, &w).await?,
        // In place: the same execution thaws; a stored snapshot is then stale.
        None => {
            cp.resume(&s).await?;
            cp.forget_snapshot(&s.id).await;
        }
    }
    Ok(Json(cp.view(&cp.store.get_sandbox(&s.id).await?).await?).into_response())
}

async fn migrate(
    State(st): State<AppState>,
    headers: HeaderMap,
    Path(id): Path<String>,
    body: Bytes,
) -> Result<Response, ControlError> {
    #[derive(serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Req {
        worker: WorkerId,
    }
    let req: Req = parse(&body)?;
    let (cp, s) = owned_sandbox(&st, &headers, &id).await?;
    cp.migrate(&s, &req.worker).await?;
    Ok(Json(cp.view(&cp.store.get_sandbox(&s.id).await?).await?).into_response())
}

async fn snapshot(
    State(st): State<AppState>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Result<Response, ControlError> {
    let (cp, s) = owned_sandbox(&st, &headers, &id).await?;
    Ok(Json(cp.snapshot(&s).await?).into_response())
}

async fn capability(
    State(st): State<AppState>,
    headers: HeaderMap,
    Path(id): Path<String>,
    body: Bytes,
) -> Result<Response, ControlError> {
    let req: CapabilityRequest = parse(&body)?;
    let (cp, s) = owned_sandbox(&st, &headers, &id).await?;
    // During a transition, wait for the next execution rather than answer
    // `not_running`: a client resolving after a RefreshRoute then makes its one rebuilt
    // attempt against an execution that runs.
    let wait = req
        .wait_ms
        .map_or(cp.transition_wait(), std::time::Duration::from_millis);
    let s = cp.settled_record(s, wait).await?;
    let port = match (req.port, req.protocol) {
        (Some(p), Some(proto)) => Some((p, proto)),
        (None, None) => None,
        _ => {
            return Err(ControlError::BadRequest(
                "port and protocol go together".into(),
            ));
        }
    };
    let cap = cp
        .issue_capability(&s, AccessSet::of(&req.access), req.purpose, port)
        .await?;
    if req.rebuilt {
        cp.note_rebuilt(&cap);
    }
    Ok(Json(cap).into_response())
}

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

async fn forward_exec(
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
            crate::edge::files::read(edge, &who, &sandbox, &pq, &headers).await
        } else {
            let class = mutation(&headers);
            let body = req.into_body();
            crate::edge::files::write(edge, &who, &sandbox, &pq, &headers, body, class).await
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

async fn forward_list(
    State(st): State<AppState>,
    headers: HeaderMap,
    Path(id): Path<String>,
    req: Request,
) -> Result<Response, ControlError> {
    let pq = path_and_query(&req);
    forward(
        &st,
        &headers,
        &id,
        Method::GET,
        pq,
        Bytes::new(),
        OperationClass::Read,
    )
    .await
}

/// Terminal and watch: the backend stream opens first (so refusals are plain HTTP
/// answers), then the client's WebSocket is accepted and relayed.
async fn forward_stream(
    State(st): State<AppState>,
    headers: HeaderMap,
    Path(id): Path<String>,
    uri: axum::http::Uri,
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
    Ok(ws.on_upgrade(move |socket| crate::edge::streams::relay(socket, backend, resubscribe)))
}

fn path_and_query(req: &Request) -> String {
    req.uri()
        .path_and_query()
        .map_or_else(|| req.uri().path().to_owned(), |p| p.as_str().to_owned())
}

async fn workers(State(st): State<AppState>, headers: HeaderMap) -> Result<Response, ControlError> {
    caller(&st, &headers).await?;
    Ok(Json(cp(&st)?.workers().await?).into_response())
}

async fn whoami(State(st): State<AppState>, headers: HeaderMap) -> Result<Response, ControlError> {
    let who = caller(&st, &headers).await?;
    let c = &who.caller;
    Ok(
        Json(serde_json::json!({"tenant": c.tenant, "key_id": c.key_id, "admin": c.admin}))
            .into_response(),
    )
}

async fn create_tenant(
    State(st): State<AppState>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, ControlError> {
    let who = caller(&st, &headers).await?;
    let c = &who.caller;
    if !c.admin {
        return Err(ControlError::Forbidden(
            "only an admin key may create tenants".into(),
        ));
    }
    #[derive(serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Req {
        name: String,
    }
    let req: Req = parse(&body)?;
    let (t, key) = cp(&st)?.create_tenant(&req.name, false).await?;
    Ok((
        StatusCode::CREATED,
        Json(serde_json::json!({"tenant": t.id, "name": t.name, "key_id": key.id, "api_key": key.text})),
    )
        .into_response())
}

async fn create_key(
    State(st): State<AppState>,
    headers: HeaderMap,
) -> Result<Response, ControlError> {
    let who = caller(&st, &headers).await?;
    let c = &who.caller;
    let key = cp(&st)?.create_key(&c.tenant, false).await?;
    Ok((
        StatusCode::CREATED,
        Json(serde_json::json!({"key_id": key.id, "api_key": key.text})),
    )
        .into_response())
}

async fn revoke_key(
    State(st): State<AppState>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Result<Response, ControlError> {
    let who = caller(&st, &headers).await?;
    let c = &who.caller;
    cp(&st)?.revoke_key(c, &id).await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

async fn rotate(State(st): State<AppState>, headers: HeaderMap) -> Result<Response, ControlError> {
    let who = caller(&st, &headers).await?;
    let c = &who.caller;
    if !c.admin {
        return Err(ControlError::Forbidden(
            "only an admin key may rotate signing keys".into(),
        ));
    }
    let key_id = cp(&st)?.rotate_keys().await?;
    st.edge.clear();
    Ok(Json(serde_json::json!({"active_key": key_id})).into_response())
}

async fn metrics(State(st): State<AppState>) -> Result<Response, ControlError> {
    let text = cp(&st)?.metrics.encode();
    Ok(([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], text).into_response())
}

async fn enroll(State(st): State<AppState>, body: Bytes) -> Result<Response, ControlError> {
    let req: EnrollRequest = parse(&body)?;
    Ok(Json(cp(&st)?.enroll(&req).await?).into_response())
}

async fn worker_caller(
    st: &AppState,
    headers: &HeaderMap,
    id: &str,
) -> Result<space_store::WorkerRecord, ControlError> {
    let id: WorkerId = id.parse().map_err(|_| ControlError::Unauthorized)?;
    let b = bearer(headers)?;
    cp(st)?.authenticate_worker(&id, &b).await
}

async fn sync(
    State(st): State<AppState>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Result<Response, ControlError> {
    let w = worker_caller(&st, &headers, &id).await?;
    Ok(Json(cp(&st)?.sync_for(&w).await?).into_response())
}

async fn lost(
    State(st): State<AppState>,
    headers: HeaderMap,
    Path(id): Path<String>,
    body: Bytes,
) -> Result<Response, ControlError> {
    let w = worker_caller(&st, &headers, &id).await?;
    #[derive(serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Req {
        sandbox: SandboxId,
        generation: u64,
    }
    let req: Req = parse(&body)?;
    cp(&st)?
        .execution_lost(&w, &req.sandbox, req.generation)
        .await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

pub use space_http::serve_until;

/// The router of a standalone edge: sandbox operations are forwarded to workers with
/// route recovery; everything else is relayed to the control plane as is.
pub fn edge_router(state: AppState) -> Router {
    Router::new()
        .route("/v1/sandboxes/{id}/exec", post(forward_exec))
        .route(
            "/v1/sandboxes/{id}/files",
            get(forward_files).put(forward_files).delete(forward_files),
        )
        .route("/v1/sandboxes/{id}/files/list", get(forward_list))
        .route("/v1/sandboxes/{id}/terminal", get(forward_stream))
        .route("/v1/sandboxes/{id}/watch", get(forward_stream))
        .route("/v1/sandboxes/{id}/exec/stream", get(forward_stream))
        .route("/healthz", get(crate::health::healthz))
        .route(
            "/readyz",
            get(|State(st): State<AppState>| crate::health::readyz(st.edge)),
        )
        .fallback(relay_to_control)
        .layer(DefaultBodyLimit::max(MAX_BODY))
        .layer(middleware::from_fn_with_state(
            state.clone(),
            authenticate_first,
        ))
        .with_state(state)
}

async fn relay_to_control(
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

/// A standalone edge's state (no control plane in process).
pub fn edge_only(url: String) -> AppState {
    AppState {
        cp: None,
        edge: Edge::new(Authority::Remote {
            url,
            http: crate::http::HttpClient::new(std::time::Duration::from_secs(30)),
        }),
    }
}
