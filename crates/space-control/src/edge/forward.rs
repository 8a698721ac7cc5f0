//! Buffered operations forwarded with recovery: exec, deletes, listings.

use axum::http::{HeaderMap, Method, StatusCode};
use bytes::Bytes;
use space_identity::{OperationClass, Progress, Recovery, RecoveryStep, Route, SandboxId};
use space_proto::api::ErrorBody;

use super::{Authenticated, Authority, Edge};
use crate::error::ControlError;
use crate::http::CallError;

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
    /// Forwards one operation with recovery.
    #[allow(clippy::too_many_arguments)]
    pub async fn forward(
        &self,
        who: &Authenticated,
        sandbox: &SandboxId,
        method: Method,
        path_and_query: &str,
        headers: &HeaderMap,
        body: Bytes,
        class: OperationClass,
    ) -> Result<Forwarded, ControlError> {
        let (mut route, mut grant) = self.route_for(who, sandbox).await?;
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
                    (route, grant) = self.fresh(who, sandbox).await?;
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
                            (route, grant) = self.fresh(who, sandbox).await?;
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
                    let (r, g) = self.repair(who, &used).await?;
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
