//! The edge: forwards sandbox-scoped operations to the worker named by the route, with
//! the route cache and the recovery rules of `IDENTITY.md` §4.
//!
//! RefreshRoute from a worker → one coalesced resolve → one rebuilt attempt for an
//! eligible operation. Deny is surfaced. Cache replacement is compare-and-swap on the
//! rejected route and keeps the original authorization expiry.
//!
//! - [`authority`]: who authenticates callers and issues capabilities — the control
//!   plane in this process, or one over HTTP — and the [`Authenticated`] caller that
//!   carries the API key a remote control plane needs;
//! - this module: the route cache (hits, fresh authorizations, coalesced repairs);
//! - [`forward`]: buffered operations (exec, deletes, listings);
//! - [`files`]: file reads and writes, streamed;
//! - [`streams`]: WebSocket streams (terminal, watch, streaming exec).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use space_identity::{AfterRefresh, Route, RouteCache, RouteIdentity, SandboxId, Timestamp};
use space_proto::api::CapabilityResponse;

use crate::auth::Caller;
use crate::error::ControlError;
use crate::http::HttpClient;
use crate::metrics::RecoveryLabels;
use crate::now_secs;

pub mod authority;
pub(crate) mod files;
pub mod forward;
pub mod streams;

pub use authority::{Authenticated, Authority};
pub use forward::Forwarded;

/// What the cache keeps per sandbox.
#[derive(Debug, Clone)]
pub(crate) struct Grant {
    /// `SpaceCap <token>`: the worker's `authorization` header.
    pub(crate) authorization: String,
    pub(crate) worker_url: String,
    /// The tenant whose authorization produced it (`None`: an admin's).
    owner: Option<String>,
}

impl Grant {
    /// Whether `caller` may use this grant: its owner's, or any for an admin.
    fn may_serve(&self, caller: &Caller) -> bool {
        caller.admin || self.owner.as_deref() == Some(caller.tenant.as_str())
    }
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

    fn cached(&self, caller: &Caller, sandbox: &SandboxId) -> Option<(Route, Arc<Grant>)> {
        let now = Timestamp::from_unix_secs(now_secs());
        let routes = self.routes.lock().ok()?;
        let e = routes.get(sandbox, now)?;
        e.value
            .may_serve(caller)
            .then(|| (e.route.clone(), e.value.clone()))
    }

    /// A fresh authorization for `sandbox`, cached.
    pub(crate) async fn fresh(
        &self,
        who: &Authenticated,
        sandbox: &SandboxId,
    ) -> Result<(Route, Arc<Grant>), ControlError> {
        let cap = self.authorize(who, sandbox, false).await?;
        let until = Timestamp::from_unix_secs(cap.expires_at.saturating_sub(RENEW_MARGIN_SECS));
        let (route, grant) = grant_of(&who.caller, cap);
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
        who: &Authenticated,
        sandbox: &SandboxId,
    ) -> Result<(Route, Arc<Grant>), ControlError> {
        match self.cached(&who.caller, sandbox) {
            Some(hit) => Ok(hit),
            None => self.fresh(who, sandbox).await,
        }
    }

    /// After a RefreshRoute for `rejected`: one resolve per sandbox at a time; later
    /// arrivals use the repaired entry.
    pub(crate) async fn repair(
        &self,
        who: &Authenticated,
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
                if e.value.may_serve(&who.caller) {
                    return Ok((e.route.clone(), e.value.clone()));
                }
            }
        }
        let cap = self.authorize(who, &rejected.sandbox, true).await?;
        let (route, grant) = grant_of(&who.caller, cap);
        if let Ok(mut routes) = self.routes.lock() {
            // Conditional on the rejected route; keeps the original expiry. Missing (the
            // entry expired meanwhile) is fine: the next request authorizes afresh.
            let _ = routes.replace_if_current(rejected, route.clone(), grant.clone(), now);
        }
        Ok((route, grant))
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
