//! Buffered operations forwarded with recovery: exec, deletes, listings.

use axum::http::{HeaderMap, Method, StatusCode};
use bytes::Bytes;
use space_identity::{OperationClass, Progress, Route, SandboxId};
use space_proto::api::ErrorBody;
use space_route::Attempt;

use super::routes::{deny_reason, relayed};
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
    /// Forwards one operation with recovery. A worker's Deny is passed on as it
    /// answered it.
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
        self.forward_to(
            who,
            sandbox,
            None,
            method,
            path_and_query,
            headers,
            body,
            class,
        )
        .await
    }

    /// [`Edge::forward`] to execution `pinned` only (`None`: whichever serves the
    /// sandbox): see [`Edge::drive_pinned`].
    #[allow(clippy::too_many_arguments)]
    pub async fn forward_to(
        &self,
        who: &Authenticated,
        sandbox: &SandboxId,
        pinned: Option<&space_identity::ExecutionId>,
        method: Method,
        path_and_query: &str,
        headers: &HeaderMap,
        body: Bytes,
        class: OperationClass,
    ) -> Result<Forwarded, ControlError> {
        self.drive_pinned(who, sandbox, pinned, class, |route, grant| {
            let (method, body) = (method.clone(), body.clone());
            async move {
                let mut h: Vec<(&str, &str)> = vec![("authorization", &grant.authorization)];
                for name in ["content-type", "idempotency-key"] {
                    if let Some(v) = headers.get(name).and_then(|v| v.to_str().ok()) {
                        h.push((name, v));
                    }
                }
                let url = format!("{}{}", grant.worker_url, path_and_query);
                match self.http.call(method, &url, &h, body).await {
                    Ok(answer) => self.classify(&route, answer),
                    Err(e) => Attempt::Failed {
                        progress: match e {
                            // Nothing reached the worker: it is not listening.
                            CallError::Connect(_) => Progress::NotStarted,
                            _ => Progress::Started,
                        },
                        error: ControlError::BadGateway(format!("worker unreachable: {e}")),
                    },
                }
            }
        })
        .await
    }

    /// A worker's answer to an attempt on `route`.
    fn classify(
        &self,
        route: &Route,
        answer: crate::http::Answer,
    ) -> Attempt<Forwarded, ControlError> {
        match answer.status {
            StatusCode::MISDIRECTED_REQUEST => {
                let body = serde_json::from_slice::<ErrorBody>(&answer.body).ok();
                Attempt::RefreshRoute {
                    reason: space_proto::api::refresh_reason(body.as_ref()),
                    answer: relayed(answer.status.as_u16(), body),
                }
            }
            StatusCode::FORBIDDEN => Attempt::Denied {
                reason: deny_reason(serde_json::from_slice(&answer.body).ok().as_ref()),
                answer: Ok(passthrough(answer)),
            },
            _ => {
                let answer = passthrough(answer);
                Attempt::Done(self.check_execution(route, &answer).map(|()| answer))
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
