//! The edge: forwards sandbox-scoped operations to the worker named by the route, with
//! the route cache and the recovery rules of `IDENTITY.md` §4.
//!
//! RefreshRoute from a worker → one coalesced resolve → one rebuilt attempt for an
//! eligible operation. Deny is surfaced. Cache replacement is compare-and-swap on the
//! rejected route and keeps the original authorization expiry.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::http::{HeaderMap, Method, StatusCode};
use bytes::Bytes;
use space_identity::{
    Access, AccessSet, AfterRefresh, OperationClass, Progress, Purpose, Recovery, RecoveryStep,
    Route, RouteCache, RouteIdentity, SandboxId, Timestamp,
};
use space_proto::api::{CapabilityResponse, ErrorBody};

use crate::auth::Caller;
use crate::error::{ControlError, ErrorCode, Relayed};
use crate::http::{CallError, HttpClient};
use crate::metrics::RecoveryLabels;
use crate::now_secs;
use crate::service::ControlPlane;

/// Where the edge gets callers and capabilities from.
#[derive(Debug, Clone)]
pub enum Authority {
    /// In the control-plane process (`space up`, `space control`).
    Local(Arc<ControlPlane>),
    /// A control plane over HTTP (`space edge`).
    Remote {
        /// Its base URL.
        url: String,
        /// Client.
        http: HttpClient,
    },
}

/// What the cache keeps per sandbox.
#[derive(Debug, Clone)]
pub(crate) struct Grant {
    /// `SpaceCap <token>`: the worker's `authorization` header.
    pub(crate) authorization: String,
    pub(crate) worker_url: String,
    /// The tenant whose authorization produced it (`None`: an admin's).
    owner: Option<String>,
}

/// Access the edge asks for: every control operation it forwards.
fn edge_access() -> AccessSet {
    AccessSet::of(&[
        Access::Exec,
        Access::FsRead,
        Access::FsWrite,
        Access::Terminal,
        Access::Watch,
        Access::Lifecycle,
    ])
}

/// Renew a cached grant this long before its capability expires.
const RENEW_MARGIN_SECS: u64 = 10;

/// The edge's state.
#[derive(Debug)]
pub struct Edge {
    authority: Authority,
    http: HttpClient,
    routes: Mutex<RouteCache<Arc<Grant>>>,
    /// One async lock per sandbox so concurrent refreshes share one resolve.
    resolving: Mutex<HashMap<SandboxId, Arc<tokio::sync::Mutex<()>>>>,
}

/// A forwarded answer.
#[derive(Debug)]
pub struct Forwarded {
    /// Status.
    pub status: StatusCode,
    /// Content type, if any.
    pub content_type: Option<String>,
    /// The execution that answered (`space-execution` header of the worker).
    pub execution: Option<String>,
    /// Body.
    pub body: Bytes,
}

impl Edge {
    /// An edge using `authority`.
    pub fn new(authority: Authority) -> Arc<Self> {
        Arc::new(Self {
            authority,
            http: HttpClient::new(Duration::from_secs(300)),
            routes: Mutex::new(RouteCache::new(100_000)),
            resolving: Mutex::new(HashMap::new()),
        })
    }

    /// The authority.
    pub fn authority(&self) -> &Authority {
        &self.authority
    }

    /// Resolves an API key.
    pub async fn authenticate(&self, bearer: &str) -> Result<Caller, ControlError> {
        match &self.authority {
            Authority::Local(cp) => cp.authenticate(bearer).await,
            Authority::Remote { url, http } => {
                let auth = format!("Bearer {bearer}");
                let a = http
                    .call(
                        Method::GET,
                        &format!("{url}/v1/whoami"),
                        &[("authorization", &auth)],
                        Bytes::new(),
                    )
                    .await
                    .map_err(|e| ControlError::Unavailable(format!("control plane: {e}")))?;
                if a.status == StatusCode::UNAUTHORIZED {
                    return Err(ControlError::Unauthorized);
                }
                let v: serde_json::Value = serde_json::from_slice(&a.body).map_err(|_| {
                    ControlError::BadGateway("control plane: bad whoami answer".into())
                })?;
                Ok(Caller {
                    tenant: v["tenant"].as_str().unwrap_or_default().to_owned(),
                    key_id: v["key_id"].as_str().unwrap_or_default().to_owned(),
                    admin: v["admin"].as_bool().unwrap_or(false),
                })
            }
        }
    }

    /// A fresh capability for `sandbox` under `caller`'s authorization.
    async fn authorize(
        &self,
        caller: &Caller,
        bearer: &str,
        sandbox: &SandboxId,
        rebuilt: bool,
    ) -> Result<CapabilityResponse, ControlError> {
        match &self.authority {
            Authority::Local(cp) => {
                // During a transition: the next execution, once acknowledged (bounded).
                let s = cp.settled(caller, sandbox, cp.transition_wait()).await?;
                let cap = cp
                    .issue_capability(&s, edge_access(), Purpose::Control, None)
                    .await?;
                if rebuilt {
                    cp.note_rebuilt(&cap);
                }
                Ok(cap)
            }
            Authority::Remote { url, http } => {
                let auth = format!("Bearer {bearer}");
                let body = serde_json::json!({
                    "access": edge_access().iter().map(|a| a.as_str()).collect::<Vec<_>>(),
                    "purpose": "control",
                    "rebuilt": rebuilt,
                });
                let a = http
                    .post_json(
                        &format!("{url}/v1/sandboxes/{sandbox}/capabilities"),
                        &[("authorization", &auth)],
                        &body,
                    )
                    .await
                    .map_err(|e| ControlError::Unavailable(format!("control plane: {e}")))?;
                if !a.status.is_success() {
                    let e: ErrorBody = serde_json::from_slice(&a.body).unwrap_or(ErrorBody {
                        error: "bad_gateway".into(),
                        message: String::from_utf8_lossy(&a.body).into_owned(),
                        reason: None,
                    });
                    return Err(ControlError::Relayed(Relayed {
                        status: a.status.as_u16(),
                        code: ErrorCode::relayed(&e.error),
                        message: e.message,
                        reason: e.reason,
                    }));
                }
                serde_json::from_slice(&a.body).map_err(|_| {
                    ControlError::BadGateway("control plane: bad capability answer".into())
                })
            }
        }
    }

    fn cached(&self, caller: &Caller, sandbox: &SandboxId) -> Option<(Route, Arc<Grant>)> {
        let now = Timestamp::from_unix_secs(now_secs());
        let routes = self.routes.lock().ok()?;
        let e = routes.get(sandbox, now)?;
        let allowed = caller.admin || e.value.owner.as_deref() == Some(caller.tenant.as_str());
        allowed.then(|| (e.route.clone(), e.value.clone()))
    }

    pub(crate) async fn fresh(
        &self,
        caller: &Caller,
        bearer: &str,
        sandbox: &SandboxId,
    ) -> Result<(Route, Arc<Grant>), ControlError> {
        let cap = self.authorize(caller, bearer, sandbox, false).await?;
        let until = Timestamp::from_unix_secs(cap.expires_at.saturating_sub(RENEW_MARGIN_SECS));
        let (route, grant) = grant_of(caller, cap);
        if let Ok(mut routes) = self.routes.lock() {
            routes.insert(
                route.clone(),
                grant.clone(),
                until,
                Timestamp::from_unix_secs(now_secs()),
            );
        }
        Ok((route, grant))
    }

    /// The cached route and grant for `sandbox`, or a fresh authorization.
    pub(crate) async fn route_for(
        &self,
        caller: &Caller,
        bearer: &str,
        sandbox: &SandboxId,
    ) -> Result<(Route, Arc<Grant>), ControlError> {
        match self.cached(caller, sandbox) {
            Some(hit) => Ok(hit),
            None => self.fresh(caller, bearer, sandbox).await,
        }
    }

    /// After a RefreshRoute for `rejected`: one resolve per sandbox at a time; later
    /// arrivals use the repaired entry.
    pub(crate) async fn repair(
        &self,
        caller: &Caller,
        bearer: &str,
        rejected: &RouteIdentity,
    ) -> Result<(Route, Arc<Grant>), ControlError> {
        let lock = {
            let mut map = self
                .resolving
                .lock()
                .map_err(|_| ControlError::Internal("edge lock poisoned".into()))?;
            if map.len() > 10_000 {
                map.retain(|_, l| Arc::strong_count(l) > 1);
            }
            Arc::clone(map.entry(rejected.sandbox).or_default())
        };
        let _guard = lock.lock().await;
        let now = Timestamp::from_unix_secs(now_secs());
        if let Ok(routes) = self.routes.lock() {
            if let AfterRefresh::UseCurrent(e) = routes.after_refresh(rejected, now) {
                let allowed =
                    caller.admin || e.value.owner.as_deref() == Some(caller.tenant.as_str());
                if allowed {
                    return Ok((e.route.clone(), e.value.clone()));
                }
            }
        }
        let cap = self
            .authorize(caller, bearer, &rejected.sandbox, true)
            .await?;
        let (route, grant) = grant_of(caller, cap);
        if let Ok(mut routes) = self.routes.lock() {
            // Conditional on the rejected route; keeps the original expiry. Missing (the
            // entry expired meanwhile) is fine: the next request authorizes afresh.
            let _ = routes.replace_if_current(rejected, route.clone(), grant.clone(), now);
        }
        Ok((route, grant))
    }

    /// Forwards one operation with recovery.
    #[allow(clippy::too_many_arguments)]
    pub async fn forward(
        &self,
        caller: &Caller,
        bearer: &str,
        sandbox: &SandboxId,
        method: Method,
        path_and_query: &str,
        headers: &HeaderMap,
        body: Bytes,
        class: OperationClass,
    ) -> Result<Forwarded, ControlError> {
        let (mut route, mut grant) = self.route_for(caller, bearer, sandbox).await?;
        let mut recovery = Recovery::new(class);
        // When the first RefreshRoute arrived: the rebuilt attempt's added latency.
        let mut refreshed_at: Option<std::time::Instant> = None;
        let mut unreachable = space_http::patience::Patience::new(self.transition_wait());
        loop {
            let mut h: Vec<(&str, &str)> = vec![("authorization", &grant.authorization)];
            for name in ["content-type", "idempotency-key"] {
                if let Some(v) = headers.get(name).and_then(|v| v.to_str().ok()) {
                    h.push((name, v));
                }
            }
            let url = format!("{}{}", grant.worker_url, path_and_query);
            let answer = match self.http.call(method.clone(), &url, &h, body.clone()).await {
                Ok(a) => a,
                // Nothing reached the worker: it is not listening (restarting, say).
                // Waiting for it is not a retry of the operation; it is bounded like a
                // transition's wait, resolving afresh each time (it may come back
                // under another address, or its sandbox be moved).
                Err(CallError::Connect(_)) if unreachable.patient() => {
                    unreachable.wait().await;
                    self.forget(&route.identity());
                    (route, grant) = self.fresh(caller, bearer, sandbox).await?;
                    continue;
                }
                Err(e) => {
                    let progress = match e {
                        CallError::Connect(_) => Progress::NotStarted,
                        _ => Progress::Started,
                    };
                    match recovery.on_transport_failure(progress) {
                        Ok(RecoveryStep::RetrySameRoute) if progress == Progress::NotStarted => {
                            // Nothing reached the worker. It may have restarted under a
                            // new address: resolve afresh (full authorization, not a
                            // repair) and try once more.
                            if let Ok(mut routes) = self.routes.lock() {
                                routes.remove_if_current(&route.identity());
                            }
                            (route, grant) = self.fresh(caller, bearer, sandbox).await?;
                            continue;
                        }
                        Ok(RecoveryStep::RetrySameRoute) => continue,
                        _ => {
                            return Err(ControlError::BadGateway(format!(
                                "worker unreachable: {e}"
                            )));
                        }
                    }
                }
            };
            match answer.status {
                StatusCode::MISDIRECTED_REQUEST => {
                    let body = serde_json::from_slice::<ErrorBody>(&answer.body).ok();
                    let reason = space_proto::api::refresh_reason(body.as_ref());
                    let used = route.identity();
                    match recovery.on_refresh(used.clone(), reason, Progress::NotStarted) {
                        Ok(_) => {}
                        Err(e) => {
                            self.count(reason.as_str(), "failed");
                            return Err(e.into());
                        }
                    }
                    refreshed_at.get_or_insert_with(std::time::Instant::now);
                    let (r, g) = self.repair(caller, bearer, &used).await?;
                    if let Err(e) = recovery.on_resolved(&r.identity()) {
                        self.count(reason.as_str(), "failed");
                        return Err(e.into());
                    }
                    self.count(reason.as_str(), "rebuilt");
                    (route, grant) = (r, g);
                }
                StatusCode::FORBIDDEN => {
                    let reason = serde_json::from_slice::<ErrorBody>(&answer.body)
                        .ok()
                        .and_then(|e| e.reason)
                        .unwrap_or_default();
                    self.count(&reason, "denied");
                    if let Ok(mut routes) = self.routes.lock() {
                        routes.remove_if_current(&route.identity());
                    }
                    return Ok(passthrough(answer));
                }
                _ => {
                    let answer = passthrough(answer);
                    self.check_execution(&route, &answer)?;
                    if let Some(t) = refreshed_at {
                        self.observe_rebuilt(t.elapsed());
                    }
                    return Ok(answer);
                }
            }
        }
    }

    /// An answer must come from the execution of the route it was sent on: the worker
    /// names it (`space-execution`, from the agent's frames, each stamped with the
    /// execution that produced it). Another one is never passed on.
    pub(crate) fn check_execution(
        &self,
        route: &Route,
        answer: &Forwarded,
    ) -> Result<(), ControlError> {
        match answer.execution.as_deref() {
            Some(x) if !x.is_empty() && x != route.execution.id.to_string() => {
                if let Authority::Local(cp) = &self.authority {
                    cp.metrics.wrong_execution.inc();
                }
                tracing::error!(sandbox = %route.sandbox, expected = %route.execution.id, got = x, "answer from another execution");
                Err(ControlError::WrongExecution)
            }
            _ => Ok(()),
        }
    }

    /// Records the latency a rebuilt attempt added.
    pub(crate) fn observe_rebuilt(&self, added: Duration) {
        if let Authority::Local(cp) = &self.authority {
            cp.metrics.rebuilt_added.observe(added.as_secs_f64());
        }
    }

    /// How long a resolve or an unreachable worker is waited for.
    pub(crate) fn transition_wait(&self) -> Duration {
        match &self.authority {
            Authority::Local(cp) => cp.transition_wait(),
            Authority::Remote { .. } => crate::service::DEFAULT_TRANSITION_WAIT,
        }
    }

    pub(crate) fn count(&self, reason: &str, outcome: &str) {
        if let Authority::Local(cp) = &self.authority {
            cp.metrics
                .recoveries
                .get_or_create(&RecoveryLabels {
                    reason: reason.to_owned(),
                    outcome: outcome.to_owned(),
                })
                .inc();
        }
    }

    /// Drops the cached route `route`, if it is still the cached one.
    pub(crate) fn forget(&self, route: &space_identity::RouteIdentity) {
        if let Ok(mut routes) = self.routes.lock() {
            routes.remove_if_current(route);
        }
    }

    /// Drops every cached route (tests, key rotation).
    pub fn clear(&self) {
        if let Ok(mut routes) = self.routes.lock() {
            *routes = RouteCache::new(100_000);
        }
    }
}

/// The route a capability names and the grant to present it with (shared by every
/// request that hits the cache, so a hit copies no strings).
fn grant_of(caller: &Caller, cap: CapabilityResponse) -> (Route, Arc<Grant>) {
    let route = cap.route.route();
    let grant = Grant {
        authorization: format!("SpaceCap {}", cap.token),
        worker_url: cap.route.worker_url,
        owner: (!caller.admin).then(|| caller.tenant.clone()),
    };
    (route, Arc::new(grant))
}

fn passthrough(a: crate::http::Answer) -> Forwarded {
    Forwarded {
        status: a.status,
        content_type: a
            .headers
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned),
        execution: a
            .headers
            .get("space-execution")
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned),
        body: a.body,
    }
}
