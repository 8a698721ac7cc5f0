//! E2B's REST API on SPACE sandboxes.
//!
//! | E2B | SPACE |
//! |---|---|
//! | `POST /sandboxes`, `POST /v2/sandboxes` | create (`templateID` → template, `base` → the default; `timeout` → TTL; `autoPause` → pause at the TTL; `envVars`, `metadata`; `allow_internet_access`/`network` → the egress policy) |
//! | `GET /sandboxes/{id}` | the sandbox, with a token for its current execution |
//! | `GET /sandboxes`, `GET /v2/sandboxes` | the tenant's sandboxes that are not stopped |
//! | `DELETE /sandboxes/{id}` | delete |
//! | `POST /sandboxes/{id}/timeout`, `/refreshes` | the TTL, from now |
//! | `POST /sandboxes/{id}/pause` | pause (in place: the same execution) |
//! | `POST /sandboxes/{id}/connect`, `/v2/…/connect`, `/resume` | resume if paused, the TTL, and a token for the execution now serving |
//! | `PUT /sandboxes/{id}/network` | the egress policy |
//!
//! Errors are E2B's `{"code": <status>, "message"}`. Keys come as `X-API-KEY` (or
//! `Authorization: Bearer`); the body is read only once the key is verified.

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::Router;
use axum::body::Body;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post, put};
use serde::Deserialize;
use serde_json::{Value, json};
use space_control::auth::Caller;
use space_control::edge::Authenticated;
use space_control::error::ControlError;
use space_identity::SandboxId;
use space_proto::api::{CreateSandbox, NetworkMode, Policy, Sandbox, SandboxState};
use space_store::SandboxRecord;

use crate::front::{ENVD_VERSION, Front};
use crate::interpreter;
use crate::token::Claims;

/// Largest REST body read.
const MAX_REST_BODY: usize = 256 << 10;

/// E2B's default sandbox timeout, seconds.
const DEFAULT_TIMEOUT: u64 = 300;

/// The template E2B's SDKs name by default.
const BASE_TEMPLATE: &str = "base";

/// The REST routes.
pub fn routes() -> Router<Arc<Front>> {
    Router::new()
        .route("/sandboxes", post(create).get(list))
        .route("/v2/sandboxes", post(create).get(list))
        .route("/sandboxes/{id}", get(detail).delete(kill))
        .route("/sandboxes/{id}/timeout", post(set_timeout))
        .route("/sandboxes/{id}/refreshes", post(refresh))
        .route("/sandboxes/{id}/pause", post(pause))
        .route("/sandboxes/{id}/connect", post(connect))
        .route("/v2/sandboxes/{id}/connect", post(connect))
        .route("/sandboxes/{id}/resume", post(connect))
        .route("/sandboxes/{id}/network", put(network))
        // Changes run to their end whatever becomes of the caller, as `/v1`'s do.
        .route_layer(axum::middleware::from_fn(space_control::http::run_to_end))
}

/// Whether `path` is one of E2B's REST paths.
pub fn is_rest_path(path: &str) -> bool {
    path == "/sandboxes"
        || path.starts_with("/sandboxes/")
        || path == "/v2/sandboxes"
        || path.starts_with("/v2/sandboxes/")
}

/// An E2B-shaped error answer.
#[derive(Debug)]
pub struct RestError {
    status: StatusCode,
    message: String,
}

impl RestError {
    pub(crate) fn new(status: StatusCode, message: impl Into<String>) -> Self {
        Self {
            status,
            message: message.into(),
        }
    }

    fn bad_request(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, message)
    }
}

/// A 404 in E2B's shape.
pub fn not_found(message: &str) -> Response {
    RestError::new(StatusCode::NOT_FOUND, message).into_response()
}

impl From<ControlError> for RestError {
    fn from(e: ControlError) -> Self {
        let status = space_control::api::error::status(&e);
        // E2B's SDKs read 409 on pause as "already paused" and 404 as "not found".
        Self::new(status, e.to_string())
    }
}

impl From<space_store::StoreError> for RestError {
    fn from(e: space_store::StoreError) -> Self {
        ControlError::from(e).into()
    }
}

impl IntoResponse for RestError {
    fn into_response(self) -> Response {
        let body = json!({"code": self.status.as_u16(), "message": self.message});
        (self.status, axum::Json(body)).into_response()
    }
}

type Answer = Result<Response, RestError>;

/// The caller of a REST request, from `X-API-KEY` or `Authorization: Bearer`.
async fn caller(front: &Front, headers: &HeaderMap) -> Result<Authenticated, RestError> {
    let key = headers
        .get("x-api-key")
        .and_then(|v| v.to_str().ok())
        .or_else(|| {
            headers
                .get("authorization")
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.strip_prefix("Bearer "))
        })
        .map(str::trim)
        .ok_or_else(|| {
            RestError::new(
                StatusCode::UNAUTHORIZED,
                "an API key is required (X-API-KEY: e2b_…; make one with POST /v1/keys {\"format\": \"e2b\"})",
            )
        })?;
    front
        .edge
        .authenticate(key)
        .await
        .map_err(|_| RestError::new(StatusCode::UNAUTHORIZED, "invalid API key"))
}

/// The body, read (bounded) only after authentication.
async fn read_body<T: for<'de> Deserialize<'de> + Default>(body: Body) -> Result<T, RestError> {
    let bytes = axum::body::to_bytes(body, MAX_REST_BODY)
        .await
        .map_err(|_| {
            RestError::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                format!("a request body is at most {} KiB", MAX_REST_BODY >> 10),
            )
        })?;
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Ok(T::default());
    }
    serde_json::from_slice(&bytes)
        .map_err(|e| RestError::bad_request(format!("invalid JSON body: {e}")))
}

fn sandbox_id(id: &str) -> Result<SandboxId, RestError> {
    id.parse()
        .map_err(|_| RestError::new(StatusCode::NOT_FOUND, format!("sandbox {id} not found")))
}

/// The caller's sandbox `id`, not stopped (a stopped one is gone, as in E2B).
async fn live_sandbox(front: &Front, who: &Caller, id: &str) -> Result<SandboxRecord, RestError> {
    let sid = sandbox_id(id)?;
    let s = front.cp.sandbox_for(who, &sid).await.map_err(|e| match e {
        ControlError::NotFound(_) => {
            RestError::new(StatusCode::NOT_FOUND, format!("sandbox {id} not found"))
        }
        other => other.into(),
    })?;
    if s.state == space_store::SandboxState::Stopped {
        return Err(RestError::new(
            StatusCode::NOT_FOUND,
            format!("sandbox {id} not found"),
        ));
    }
    Ok(s)
}

/// `POST /sandboxes`'s body (fields the SDKs send that SPACE has no use for are
/// accepted and ignored: `secure` — every token is checked —, `mcp`, `iam`, …).
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct NewSandbox {
    #[serde(rename = "templateID")]
    template_id: Option<String>,
    timeout: Option<u64>,
    auto_pause: Option<bool>,
    metadata: Option<BTreeMap<String, String>>,
    env_vars: Option<BTreeMap<String, String>>,
    #[serde(rename = "allow_internet_access")]
    allow_internet_access: Option<bool>,
    network: Option<NetworkConfig>,
    volume_mounts: Option<Vec<Value>>,
}

/// E2B's network settings; `allowOut`/`denyOut` are SPACE's allow and deny lists;
/// `allowPublicTraffic: false` makes the sandbox's ports need its traffic token.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct NetworkConfig {
    allow_out: Option<Vec<String>>,
    deny_out: Option<Vec<String>>,
    allow_public_traffic: Option<bool>,
}

/// The egress policy of E2B's `allow_internet_access` and `network`, or `None` for
/// the platform's default. Internet access without an allow list opens every
/// address (the global deny list still applies); names for HTTP and TLS need rules
/// of their own (`network.allowOut`).
fn policy(
    allow_internet_access: Option<bool>,
    network: Option<&NetworkConfig>,
) -> Result<Option<Policy>, RestError> {
    let lists = network.map(|n| {
        (
            n.allow_out.clone().unwrap_or_default(),
            n.deny_out.clone().unwrap_or_default(),
        )
    });
    let (mode, allow, deny) = match (allow_internet_access, lists) {
        (Some(false), _) => (NetworkMode::None, vec![], vec![]),
        (_, Some((allow, deny))) if !allow.is_empty() || !deny.is_empty() => {
            if allow.is_empty() {
                // Everything but what is denied.
                (NetworkMode::Egress, everything(), deny)
            } else {
                // E2B's allow list wins over its deny list; SPACE lets out only what
                // is allowed, so a catch-all deny (`0.0.0.0/0`) says nothing more.
                let deny = deny
                    .into_iter()
                    .filter(|d| !everything().contains(d))
                    .collect();
                (NetworkMode::Egress, allow, deny)
            }
        }
        (Some(true), _) => (NetworkMode::Egress, everything(), vec![]),
        _ => return Ok(None),
    };
    Policy::parse(mode, &allow, &deny)
        .map(Some)
        .map_err(|e| RestError::bad_request(format!("invalid network settings: {e}")))
}

fn everything() -> Vec<String> {
    vec!["0.0.0.0/0".into(), "::/0".into()]
}

/// The SPACE template E2B's `templateID` names.
fn template_of(id: Option<&str>) -> Option<String> {
    match id.map(str::trim) {
        None | Some("") | Some(BASE_TEMPLATE) => None,
        Some(t) => Some(t.to_owned()),
    }
}

/// The `templateID` a SPACE sandbox shows: `base` for the default template, else
/// its `name:tag` without the pinned digest.
fn template_id(front: &Front, template: &str) -> String {
    let name = template.split('@').next().unwrap_or(template);
    if name == front.cp.default_template() || name == space_control::service::DEFAULT_TEMPLATE {
        BASE_TEMPLATE.into()
    } else {
        name.to_owned()
    }
}

/// The `templateID` E2B's answers give `view`: the E2B template it was made from when
/// that is not a SPACE one (the code interpreter's), else its SPACE template's.
fn shown_template(front: &Front, view: &Sandbox) -> String {
    interpreter::template_of(view).map_or_else(|| template_id(front, &view.template), str::to_owned)
}

async fn create(State(front): State<Arc<Front>>, headers: HeaderMap, body: Body) -> Answer {
    let who = caller(&front, &headers).await?;
    let req: NewSandbox = read_body(body).await?;
    if req.volume_mounts.as_ref().is_some_and(|v| !v.is_empty()) {
        return Err(RestError::bad_request(
            "volume mounts are not supported by SPACE",
        ));
    }
    let timeout = req.timeout.unwrap_or(DEFAULT_TIMEOUT);
    let interpreter = interpreter::wanted(req.template_id.as_deref());
    let mut metadata = req.metadata;
    if metadata
        .as_ref()
        .is_some_and(|m| m.contains_key(interpreter::TEMPLATE_KEY))
    {
        return Err(RestError::bad_request(format!(
            "metadata key {} is reserved",
            interpreter::TEMPLATE_KEY
        )));
    }
    if interpreter {
        let asked = req.template_id.as_deref().unwrap_or_default().trim();
        metadata
            .get_or_insert_with(BTreeMap::new)
            .insert(interpreter::TEMPLATE_KEY.to_owned(), asked.to_owned());
    }
    let create = CreateSandbox {
        template: if interpreter {
            None
        } else {
            template_of(req.template_id.as_deref())
        },
        ttl_secs: Some(timeout),
        ttl_action: req.auto_pause.unwrap_or(false).then(|| "pause".to_owned()),
        env: req.env_vars,
        metadata: metadata
            .map(|m| Value::Object(m.into_iter().map(|(k, v)| (k, Value::String(v))).collect())),
        network: policy(req.allow_internet_access, req.network.as_ref())?,
        ..CreateSandbox::default()
    };
    let public = req
        .network
        .as_ref()
        .and_then(|n| n.allow_public_traffic)
        .unwrap_or(true);
    let view = front.cp.create_sandbox(&who.caller, create).await?;
    // Every HTTP port reachable, as in E2B (`get_host(port)`); a sandbox whose ports
    // could not be opened is not handed out half-made.
    let record = front.cp.sandbox_for(&who.caller, &view.id).await?;
    if let Err(e) = front.cp.expose_every_http_port(&record, public).await {
        let _ = front.cp.delete_sandbox(&record).await;
        return Err(e.into());
    }
    if interpreter {
        if let Err(e) = interpreter::ensure(&front, &who.caller, &view).await {
            let _ = front.cp.delete_sandbox(&record).await;
            return Err(RestError::new(StatusCode::INTERNAL_SERVER_ERROR, e));
        }
    }
    let body = sandbox_answer(&front, &who.caller, &view).await?;
    Ok((StatusCode::CREATED, axum::Json(body)).into_response())
}

/// The answer of a create or connect: the sandbox and a token for its execution.
async fn sandbox_answer(front: &Front, who: &Caller, view: &Sandbox) -> Result<Value, RestError> {
    let token = token_for(front, who, view).await?;
    // Only a sandbox whose ports are not public has (and needs) a traffic token.
    let traffic = match front.cp.every_http_port(&view.id).await? {
        Some(every) if !every.public => Some(front.cp.traffic_token(&view.id).await?),
        _ => None,
    };
    Ok(json!({
        "templateID": shown_template(front, view),
        "sandboxID": view.id.to_string(),
        "clientID": CLIENT_ID,
        "envdVersion": ENVD_VERSION,
        "envdAccessToken": token,
        "trafficAccessToken": traffic,
        "domain": front.domain(),
    }))
}

/// E2B's `clientID` (its cluster node; one value here).
const CLIENT_ID: &str = "space";

/// A token for the execution serving `view` now.
async fn token_for(front: &Front, who: &Caller, view: &Sandbox) -> Result<String, RestError> {
    let execution = view
        .execution
        .as_ref()
        .map(|e| e.execution_id)
        .ok_or_else(|| RestError::from(ControlError::NotRunning))?;
    Ok(front
        .tokens
        .mint(&Claims {
            tenant: who.tenant.clone(),
            key_id: who.key_id.clone(),
            sandbox: view.id,
            execution,
        })
        .await?)
}

/// A sandbox as E2B lists and describes it.
fn described(front: &Front, view: &Sandbox, created_at: i64) -> Value {
    let (cpus, memory_mib, disk_mib) = view
        .limits
        .as_ref()
        .map_or((1.0, 512, 1024), |l| (l.cpus, l.memory_mib, l.disk_mib));
    let state = match view.state {
        SandboxState::Paused => "paused",
        _ => "running",
    };
    // E2B always names an end; a sandbox without a TTL ends at the longest one.
    let end = view.expires_at.clone().unwrap_or_else(|| {
        space_proto::api::rfc3339(created_at.max(0) as u64 + space_control::service::MAX_TTL_SECS)
    });
    let metadata = match &view.metadata {
        Value::Object(m) => Value::Object(
            m.iter()
                .filter(|(k, _)| k.as_str() != interpreter::TEMPLATE_KEY)
                .map(|(k, v)| {
                    let text = v.as_str().map_or_else(|| v.to_string(), str::to_owned);
                    (k.clone(), Value::String(text))
                })
                .collect(),
        ),
        _ => json!({}),
    };
    json!({
        "templateID": shown_template(front, view),
        "sandboxID": view.id.to_string(),
        "clientID": CLIENT_ID,
        "startedAt": view.created_at,
        "endAt": end,
        "envdVersion": ENVD_VERSION,
        "cpuCount": (cpus.ceil() as u64).max(1),
        "memoryMB": memory_mib,
        "diskSizeMB": disk_mib,
        "state": state,
        "metadata": metadata,
        "domain": front.domain(),
    })
}

async fn detail(
    State(front): State<Arc<Front>>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Answer {
    let who = caller(&front, &headers).await?;
    let s = live_sandbox(&front, &who.caller, &id).await?;
    let view = front.cp.view(&s).await?;
    let mut body = described(&front, &view, s.created_at);
    if view.execution.is_some() {
        body["envdAccessToken"] = Value::String(token_for(&front, &who.caller, &view).await?);
    }
    Ok(axum::Json(body).into_response())
}

/// `GET /v2/sandboxes`'s query (`GET /sandboxes` takes `metadata` too).
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct ListQuery {
    /// `k=v&k2=v2`, URL-encoded: only sandboxes whose metadata has each.
    metadata: Option<String>,
    /// `running`, `paused`, or both comma-separated.
    state: Option<String>,
    limit: Option<usize>,
    next_token: Option<String>,
}

async fn list(
    State(front): State<Arc<Front>>,
    headers: HeaderMap,
    Query(q): Query<ListQuery>,
) -> Answer {
    let who = caller(&front, &headers).await?;
    let wanted_states: Vec<String> = q
        .state
        .as_deref()
        .map(|s| s.split(',').map(|p| p.trim().to_owned()).collect())
        .unwrap_or_default();
    let wanted_meta: Vec<(String, String)> = q
        .metadata
        .as_deref()
        .map(parse_metadata_filter)
        .unwrap_or_default();
    let limit = q.limit.unwrap_or(1000).clamp(1, 1000);
    let after = q.next_token.unwrap_or_default();
    let mut out = Vec::new();
    let mut next = None;
    // Pages follow the IDs' order: the cursor is the last ID of a page.
    let mut all = front.cp.store.list_sandboxes(&who.caller.tenant).await?;
    all.sort_by_key(|s| s.id.to_string());
    for s in all {
        if s.state == space_store::SandboxState::Stopped || s.id.to_string() <= after {
            continue;
        }
        let view = front.cp.view(&s).await?;
        let d = described(&front, &view, s.created_at);
        let state_ok = wanted_states.is_empty()
            || wanted_states.iter().any(|w| d["state"].as_str() == Some(w));
        let meta_ok = wanted_meta
            .iter()
            .all(|(k, v)| d["metadata"][k].as_str() == Some(v.as_str()));
        if state_ok && meta_ok {
            if out.len() == limit {
                next = out
                    .last()
                    .and_then(|l: &Value| l["sandboxID"].as_str().map(str::to_owned));
                break;
            }
            out.push(d);
        }
    }
    let mut resp = axum::Json(out).into_response();
    if let Some(n) = next.and_then(|n| HeaderValue::from_str(&n).ok()) {
        resp.headers_mut().insert("x-next-token", n);
    }
    Ok(resp)
}

/// `k1=v1&k2=v2` (each part URL-encoded) as pairs.
fn parse_metadata_filter(text: &str) -> Vec<(String, String)> {
    text.split('&')
        .filter_map(|pair| pair.split_once('='))
        .map(|(k, v)| (percent_decode(k), percent_decode(v)))
        .collect()
}

fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let hex = |c: u8| (c as char).to_digit(16).map(|d| d as u8);
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'%' if i + 2 < b.len() => match (hex(b[i + 1]), hex(b[i + 2])) {
                (Some(h), Some(l)) => {
                    out.push(h << 4 | l);
                    i += 3;
                    continue;
                }
                _ => out.push(b'%'),
            },
            b'+' => out.push(b' '),
            c => out.push(c),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

async fn kill(
    State(front): State<Arc<Front>>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Answer {
    let who = caller(&front, &headers).await?;
    let s = live_sandbox(&front, &who.caller, &id).await?;
    front.cp.delete_sandbox(&s).await?;
    front.processes.forget_sandbox(&s.id);
    front.watchers.forget_sandbox(&s.id);
    Ok(StatusCode::NO_CONTENT.into_response())
}

#[derive(Debug, Default, Deserialize)]
struct Timeout {
    timeout: Option<u64>,
}

async fn set_timeout(
    State(front): State<Arc<Front>>,
    headers: HeaderMap,
    Path(id): Path<String>,
    body: Body,
) -> Answer {
    let who = caller(&front, &headers).await?;
    let req: Timeout = read_body(body).await?;
    let timeout = req
        .timeout
        .ok_or_else(|| RestError::bad_request("timeout (seconds) is required"))?;
    let s = live_sandbox(&front, &who.caller, &id).await?;
    front.cp.set_ttl(&s, Some(timeout), now()).await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

#[derive(Debug, Default, Deserialize)]
struct Refresh {
    duration: Option<u64>,
}

async fn refresh(
    State(front): State<Arc<Front>>,
    headers: HeaderMap,
    Path(id): Path<String>,
    body: Body,
) -> Answer {
    let who = caller(&front, &headers).await?;
    let req: Refresh = read_body(body).await?;
    let duration = req.duration.unwrap_or(DEFAULT_TIMEOUT);
    if duration == 0 || duration > space_control::service::MAX_TTL_SECS {
        return Err(RestError::bad_request(format!(
            "duration must be 1 to {} seconds",
            space_control::service::MAX_TTL_SECS
        )));
    }
    let s = live_sandbox(&front, &who.caller, &id).await?;
    // A refresh only ever extends.
    if s.expires_at.is_some_and(|e| e < now() + duration as i64) {
        front.cp.set_ttl(&s, Some(duration), now()).await?;
    }
    Ok(StatusCode::NO_CONTENT.into_response())
}

async fn pause(
    State(front): State<Arc<Front>>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Answer {
    let who = caller(&front, &headers).await?;
    let s = live_sandbox(&front, &who.caller, &id).await?;
    if s.state == space_store::SandboxState::Paused {
        return Err(RestError::new(
            StatusCode::CONFLICT,
            format!("sandbox {id} is already paused"),
        ));
    }
    front.cp.pause(&s).await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

async fn connect(
    State(front): State<Arc<Front>>,
    headers: HeaderMap,
    Path(id): Path<String>,
    body: Body,
) -> Answer {
    let who = caller(&front, &headers).await?;
    let req: Timeout = read_body(body).await?;
    let s = live_sandbox(&front, &who.caller, &id).await?;
    let resumed = s.state == space_store::SandboxState::Paused;
    if resumed {
        front.cp.resume(&s).await?;
        front.cp.forget_snapshot(&s.id).await;
    }
    let s = front
        .cp
        .settled_record(s, front.cp.transition_wait())
        .await?;
    if let Some(t) = req.timeout {
        front.cp.set_ttl(&s, Some(t), now()).await?;
    }
    let view = front
        .cp
        .view(&front.cp.store.get_sandbox(&s.id).await?)
        .await?;
    // A resume on another worker is a new execution: its code interpreter is new too.
    if interpreter::template_of(&view).is_some() {
        interpreter::ensure(&front, &who.caller, &view)
            .await
            .map_err(|e| RestError::new(StatusCode::INTERNAL_SERVER_ERROR, e))?;
    }
    let body = sandbox_answer(&front, &who.caller, &view).await?;
    let status = if resumed {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    Ok((status, axum::Json(body)).into_response())
}

async fn network(
    State(front): State<Arc<Front>>,
    headers: HeaderMap,
    Path(id): Path<String>,
    body: Body,
) -> Answer {
    let who = caller(&front, &headers).await?;
    let req: NetworkConfig = read_body(body).await?;
    let s = live_sandbox(&front, &who.caller, &id).await?;
    let policy = policy(None, Some(&req))?.unwrap_or_else(|| front.cp.default_network());
    front.cp.set_network(&s, policy).await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

fn now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metadata_filters_are_decoded_pairs() {
        assert_eq!(
            parse_metadata_filter("user%3Did=a%20b&k=v+w&bad"),
            vec![
                ("user=id".to_owned(), "a b".to_owned()),
                ("k".to_owned(), "v w".to_owned())
            ]
        );
        assert_eq!(percent_decode("100%"), "100%");
        assert_eq!(percent_decode("%zz"), "%zz");
    }

    #[test]
    fn internet_access_and_network_lists_become_an_egress_policy() {
        assert_eq!(policy(None, None).unwrap(), None);
        let off = policy(Some(false), None).unwrap().unwrap();
        assert_eq!(off.mode, NetworkMode::None);
        let on = policy(Some(true), None).unwrap().unwrap();
        assert_eq!(on.mode, NetworkMode::Egress);
        assert_eq!(on.allow().len(), 2);
        let lists = NetworkConfig {
            allow_out: Some(vec!["pypi.org".into()]),
            deny_out: Some(vec!["10.0.0.0/8".into()]),
            allow_public_traffic: None,
        };
        let p = policy(None, Some(&lists)).unwrap().unwrap();
        assert_eq!(
            (p.mode, p.allow().len(), p.deny().len()),
            (NetworkMode::Egress, 1, 1)
        );
        // E2B's "deny everything, allow these": only these.
        let only = NetworkConfig {
            allow_out: Some(vec!["pypi.org".into()]),
            deny_out: Some(vec!["0.0.0.0/0".into()]),
            allow_public_traffic: Some(false),
        };
        let p = policy(None, Some(&only)).unwrap().unwrap();
        assert_eq!((p.allow().len(), p.deny().len()), (1, 0));
        assert_eq!(percent_decode("%e2%82%ac%"), "€%");
        let bad = NetworkConfig {
            allow_out: Some(vec!["not a host!".into()]),
            deny_out: None,
            allow_public_traffic: None,
        };
        assert_eq!(
            policy(None, Some(&bad)).unwrap_err().status,
            StatusCode::BAD_REQUEST
        );
    }
}
