//! The edge's side of the route driver ([`space_route`]): routes resolved by the
//! authority on behalf of one authenticated caller (whose key a remote control plane
//! reads), and what the driver reports counted in the edge's metrics.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use space_identity::{OperationClass, Route, SandboxId, Timestamp};
use space_proto::api::{CapabilityResponse, ErrorBody};
use space_route::{Attempt, Event, Resolved, Resolver};

use super::{Authenticated, Authority, Edge, Grant};
use crate::error::{ControlError, ErrorCode, Relayed};
use crate::metrics::RecoveryLabels;

/// Renew a cached grant this long before its capability expires.
const RENEW_MARGIN_SECS: u64 = 10;

/// The routes of one caller at this edge.
struct OnBehalf<'a> {
    edge: &'a Edge,
    who: &'a Authenticated,
}

impl Resolver for OnBehalf<'_> {
    type Grant = Grant;
    type Error = ControlError;

    async fn resolve(
        &self,
        sandbox: &SandboxId,
        rebuilt: bool,
    ) -> Result<Resolved<Grant>, ControlError> {
        let cap = self.edge.authorize(self.who, sandbox, rebuilt).await?;
        let until = Timestamp::from_unix_secs(cap.expires_at.saturating_sub(RENEW_MARGIN_SECS));
        let (route, grant) = grant_of(self.who, cap);
        Ok(Resolved {
            route,
            grant,
            until,
        })
    }

    fn may_use(&self, grant: &Grant) -> bool {
        grant.may_serve(&self.who.caller)
    }

    fn patience(&self) -> Duration {
        self.edge.transition_wait()
    }

    fn observe(&self, event: Event<'_>) {
        let Authority::Local(cp) = &self.edge.authority else {
            return;
        };
        let (reason, outcome) = match event {
            Event::Rebuilt { reason } => (reason.as_str(), "rebuilt"),
            Event::RefreshFailed { reason } => (reason.as_str(), "failed"),
            Event::Denied { reason } => (reason, "denied"),
            Event::RebuiltAttemptEnded { added } => {
                cp.metrics.rebuilt_added.observe(added.as_secs_f64());
                return;
            }
        };
        cp.metrics
            .recoveries
            .get_or_create(&RecoveryLabels {
                reason: reason.to_owned(),
                outcome: outcome.to_owned(),
            })
            .inc();
    }
}

/// The route a capability names and the grant to present it with (shared by every
/// request that hits the cache, so a hit copies no strings).
fn grant_of(who: &Authenticated, cap: CapabilityResponse) -> (Route, Grant) {
    let route = cap.route.route();
    let grant = Grant {
        authorization: format!("SpaceCap {}", cap.token),
        worker_url: cap.route.worker_url,
        owner: (!who.caller.admin).then(|| who.caller.tenant.clone()),
    };
    (route, grant)
}

impl Edge {
    /// Runs `attempt` for `who` on the route of `sandbox` with the recovery rules of
    /// [`space_route::RouteDriver::drive`].
    pub(crate) async fn drive<T, F, Fut>(
        &self,
        who: &Authenticated,
        sandbox: &SandboxId,
        class: OperationClass,
        attempt: F,
    ) -> Result<T, ControlError>
    where
        F: FnMut(Route, Arc<Grant>) -> Fut,
        Fut: Future<Output = Attempt<T, ControlError>>,
    {
        let caller = OnBehalf { edge: self, who };
        self.routes.drive(&caller, sandbox, class, attempt).await
    }

    /// Runs `attempt` like [`Edge::drive`], on a route of execution `pinned` only
    /// (`None`: any, as `drive`). A cached route of another execution is resolved
    /// afresh once; a sandbox then served by another execution ends the operation
    /// with [`ControlError::ExecutionReplaced`], and nothing is sent to any
    /// execution but `pinned` (a credential issued for one execution — E2B's access
    /// token — is never served by its successor).
    pub(crate) async fn drive_pinned<T, F, Fut>(
        &self,
        who: &Authenticated,
        sandbox: &SandboxId,
        pinned: Option<&space_identity::ExecutionId>,
        class: OperationClass,
        mut attempt: F,
    ) -> Result<T, ControlError>
    where
        F: FnMut(Route, Arc<Grant>) -> Fut,
        Fut: Future<Output = Attempt<T, ControlError>>,
    {
        let Some(pinned) = pinned else {
            return self.drive(who, sandbox, class, attempt).await;
        };
        let mut mismatched = false;
        let outcome = self
            .drive(who, sandbox, class, |route, grant| {
                let verdict = if route.execution.id == *pinned {
                    Ok(attempt(route, grant))
                } else if !mismatched {
                    mismatched = true;
                    // Perhaps only the cache is behind: resolve once.
                    Err(Attempt::RefreshRoute {
                        reason: space_identity::RefreshReason::ExecutionMismatch,
                        answer: ControlError::ExecutionReplaced,
                    })
                } else {
                    Err(Attempt::Done(Err(ControlError::ExecutionReplaced)))
                };
                async move {
                    match verdict {
                        Ok(sent) => sent.await,
                        Err(refused) => refused,
                    }
                }
            })
            .await;
        match outcome {
            // The resolve named the cached route again: it is current, and not the
            // pinned execution's.
            Err(ControlError::RefreshRoute { .. }) if mismatched => {
                Err(ControlError::ExecutionReplaced)
            }
            other => other,
        }
    }

    /// How long a resolve or an unreachable worker is waited for.
    pub(crate) fn transition_wait(&self) -> Duration {
        match &self.authority {
            Authority::Local(cp) => cp.transition_wait(),
            Authority::Remote { .. } => crate::service::DEFAULT_TRANSITION_WAIT,
        }
    }
}

/// A worker's error answer as the edge passes it on (`bad_gateway` when it is not an
/// error body).
pub(crate) fn relayed(status: u16, body: Option<ErrorBody>) -> ControlError {
    let (code, message, reason) = match body {
        Some(b) => (b.error, b.message, b.reason),
        None => (
            "bad_gateway".into(),
            format!("worker answered {status}"),
            None,
        ),
    };
    ControlError::Relayed(Relayed {
        status,
        code: ErrorCode::relayed(&code),
        message,
        reason,
    })
}

/// The reason code of a worker's Deny answer (empty when it names none).
pub(crate) fn deny_reason(body: Option<&ErrorBody>) -> String {
    body.and_then(|e| e.reason.clone()).unwrap_or_default()
}
