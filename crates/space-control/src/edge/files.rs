//! File reads and writes through the edge, streamed between the client and the worker
//! (neither body is held whole here), with the recovery rules of [`Edge::forward`].
//!
//! **Reads** (`GET …/files`, `Range` passed on): the worker's answer head decides. A
//! RefreshRoute (421) or a transport failure arrives before any byte of the answer
//! went to the client, so the read is eligible for the one rebuilt attempt (or the
//! one retry) as any read is; once a head is passed on, its body is relayed as it
//! comes and never retried — a body the worker cuts short cuts the client's answer
//! short of its `Content-Length` too.
//!
//! **Writes** (`PUT …/files`): the client's body is relayed behind a gate
//! ([`space_http::stream::gated`]) with `Expect: 100-continue`. The worker says
//! `100 Continue` only when its handler starts reading the body, after admission; a
//! RefreshRoute from admission (or a closed connection before that) therefore comes
//! back with the client's body unread, and the rebuilt attempt carries that same body,
//! whole. Once any byte of the body went to a worker, the write is not repeated
//! anywhere: an error then is the answer, and the agent's write (a temporary file
//! renamed into place at the end) left nothing half-written at the path.

use std::time::Duration;

use axum::body::Body;
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::response::{IntoResponse, Response};
use space_http::CallError;
use space_http::patience::Patience;
use space_http::stream::{self, StreamBody, StreamedAnswer};
use space_identity::{OperationClass, Progress, Recovery, RecoveryStep, Route, SandboxId};
use space_proto::api::ErrorBody;

use super::{Authenticated, Edge};
use crate::error::{ControlError, RouteLost};

/// Longest wait for a read's answer head.
const READ_HEAD_TIMEOUT: Duration = Duration::from_secs(300);

/// Longest wait for a write's answer head, which comes once the whole body was
/// relayed and made durable: a large upload on a slow link takes long.
const WRITE_HEAD_TIMEOUT: Duration = Duration::from_secs(6 * 3600);

/// Largest error answer read here (to decide on recovery).
const MAX_ERROR: usize = 64 << 10;

/// Uploads up to this size are held whole at the edge, so a rebuilt attempt can
/// resend them whatever the worker read of the first one.
const RESEND_LIMIT: usize = 1 << 20;

/// Answer headers passed on from the worker.
const PASSED: [header::HeaderName; 5] = [
    header::CONTENT_TYPE,
    header::CONTENT_LENGTH,
    header::CONTENT_RANGE,
    header::ACCEPT_RANGES,
    header::HeaderName::from_static("space-execution"),
];

/// `GET …/files?path=` streamed from the worker.
pub(crate) async fn read(
    edge: &Edge,
    who: &Authenticated,
    sandbox: &SandboxId,
    path_and_query: &str,
    headers: &HeaderMap,
) -> Result<Response, ControlError> {
    let (mut route, mut grant) = edge.route_for(who, sandbox).await?;
    let mut recovery = Recovery::new(OperationClass::Read);
    let mut unreachable = Patience::new(edge.transition_wait());
    loop {
        let mut h: Vec<(&str, &str)> = vec![("authorization", &grant.authorization)];
        if let Some(v) = headers.get(header::RANGE).and_then(|v| v.to_str().ok()) {
            h.push(("range", v));
        }
        let url = format!("{}{path_and_query}", grant.worker_url);
        let sent = stream::send(
            Method::GET,
            &url,
            &h,
            stream::empty(),
            None,
            READ_HEAD_TIMEOUT,
        )
        .await;
        match step(
            edge,
            who,
            sandbox,
            &mut recovery,
            &mut unreachable,
            &route,
            sent,
        )
        .await?
        {
            Step::Answer(a) => return relay(edge, &route, a),
            Step::Done(resp) => return Ok(resp),
            Step::Next(r, g) => (route, grant) = (r, g),
        }
    }
}

/// `PUT …/files?path=`: the client's `body` streamed to the worker.
pub(crate) async fn write(
    edge: &Edge,
    who: &Authenticated,
    sandbox: &SandboxId,
    path_and_query: &str,
    headers: &HeaderMap,
    body: Body,
    class: OperationClass,
) -> Result<Response, ControlError> {
    let (mut route, mut grant) = edge.route_for(who, sandbox).await?;
    let mut recovery = Recovery::new(class);
    let mut unreachable = Patience::new(edge.transition_wait());
    // A small body is kept whole here: the one rebuilt attempt can send it again even
    // when the worker had read it before the route went stale (an execution frozen for
    // a migration after admission). A large one streams, and only a refusal before its
    // first byte left (behind `Expect: 100-continue`) leaves it for another attempt.
    let small = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<usize>().ok())
        .filter(|n| *n <= RESEND_LIMIT);
    let (mut body, kept): (Option<StreamBody>, Option<bytes::Bytes>) = match small {
        Some(_) => {
            let whole = axum::body::to_bytes(body, RESEND_LIMIT)
                .await
                .map_err(|e| ControlError::BadRequest(format!("upload body: {e}")))?;
            (None, Some(whole))
        }
        None => (Some(stream::boxed(body)), None),
    };
    loop {
        let Some(unread) = body
            .take()
            .or_else(|| kept.clone().map(|b| stream::boxed(Body::from(b))))
        else {
            return Err(ControlError::RefreshRoute {
                reason: RouteLost::UploadStarted,
            });
        };
        let (gated, gate) = stream::gated(unread);
        let mut h: Vec<(&str, &str)> = vec![("authorization", &grant.authorization)];
        for name in ["content-type", "idempotency-key"] {
            if let Some(v) = headers.get(name).and_then(|v| v.to_str().ok()) {
                h.push((name, v));
            }
        }
        let url = format!("{}{path_and_query}", grant.worker_url);
        let sent = stream::send(
            Method::PUT,
            &url,
            &h,
            gated,
            Some(gate.clone()),
            WRITE_HEAD_TIMEOUT,
        )
        .await;
        // The body back, if no byte of it left: only then may another attempt run.
        body = gate.take_back();
        let sent = match sent {
            // A transport failure after bytes of the body left is never retried: the
            // worker may have the file already.
            Err(e) if body.is_none() => {
                return Err(ControlError::BadGateway(format!(
                    "worker unreachable during the upload: {e}"
                )));
            }
            other => other,
        };
        match step(
            edge,
            who,
            sandbox,
            &mut recovery,
            &mut unreachable,
            &route,
            sent,
        )
        .await?
        {
            Step::Answer(a) => return relay(edge, &route, a),
            Step::Done(resp) => return Ok(resp),
            Step::Next(r, g) => (route, grant) = (r, g),
        }
    }
}

/// What one attempt gave.
enum Step {
    /// The answer, complete.
    Done(Response),
    /// An answer to pass on.
    Answer(StreamedAnswer),
    /// Try again on this route.
    Next(Route, std::sync::Arc<super::Grant>),
}

/// The recovery rules after one attempt on `route` (as in [`Edge::forward`]).
async fn step(
    edge: &Edge,
    who: &Authenticated,
    sandbox: &SandboxId,
    recovery: &mut Recovery,
    unreachable: &mut Patience,
    route: &Route,
    sent: Result<StreamedAnswer, CallError>,
) -> Result<Step, ControlError> {
    let answer = match sent {
        Ok(a) => a,
        // Nothing reached the worker: it is not listening (restarting, say). Waited
        // for, bounded like a transition (not a retry of the operation), resolving
        // afresh each time: it may come back under another address.
        Err(CallError::Connect(_)) if unreachable.patient() => {
            unreachable.wait().await;
            edge.forget(&route.identity());
            let (r, g) = edge.fresh(who, sandbox).await?;
            return Ok(Step::Next(r, g));
        }
        Err(e) => {
            let progress = match e {
                CallError::Connect(_) => Progress::NotStarted,
                _ => Progress::Started,
            };
            return match recovery.on_transport_failure(progress) {
                Ok(RecoveryStep::RetrySameRoute) if progress == Progress::NotStarted => {
                    // Nothing reached the worker: it may have restarted under a new
                    // address; resolve afresh.
                    edge.forget(&route.identity());
                    let (r, g) = edge.fresh(who, sandbox).await?;
                    Ok(Step::Next(r, g))
                }
                Ok(RecoveryStep::RetrySameRoute) => {
                    let (r, g) = edge.route_for(who, sandbox).await?;
                    Ok(Step::Next(r, g))
                }
                _ => Err(ControlError::BadGateway(format!("worker unreachable: {e}"))),
            };
        }
    };
    match answer.status {
        StatusCode::MISDIRECTED_REQUEST => {
            let body = answer.small_body(MAX_ERROR).await;
            let body = serde_json::from_slice::<ErrorBody>(&body).ok();
            let reason = space_proto::api::refresh_reason(body.as_ref());
            let used = route.identity();
            if let Err(e) = recovery.on_refresh(used.clone(), reason, Progress::NotStarted) {
                edge.count(reason.as_str(), "failed");
                return Err(e.into());
            }
            let (r, g) = edge.repair(who, &used).await?;
            if let Err(e) = recovery.on_resolved(&r.identity()) {
                edge.count(reason.as_str(), "failed");
                return Err(e.into());
            }
            edge.count(reason.as_str(), "rebuilt");
            Ok(Step::Next(r, g))
        }
        StatusCode::FORBIDDEN => {
            // Surfaced as the worker said it, and the route dropped.
            let status = answer.status;
            let content_type = answer.headers.get(header::CONTENT_TYPE).cloned();
            let body = answer.small_body(MAX_ERROR).await;
            let why = serde_json::from_slice::<ErrorBody>(&body)
                .ok()
                .and_then(|e| e.reason)
                .unwrap_or_default();
            edge.count(&why, "denied");
            edge.forget(&route.identity());
            let mut resp = (status, body).into_response();
            if let Some(ct) = content_type {
                resp.headers_mut().insert(header::CONTENT_TYPE, ct);
            }
            Ok(Step::Done(resp))
        }
        _ => Ok(Step::Answer(answer)),
    }
}

/// The worker's answer passed on as it comes: its status, its length and range
/// headers, its body streamed (hyper checks it against its `Content-Length`, on both
/// sides). An answer from another execution than the route's is never passed on.
fn relay(edge: &Edge, route: &Route, a: StreamedAnswer) -> Result<Response, ControlError> {
    let execution = a
        .headers
        .get("space-execution")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let head = super::Forwarded {
        status: a.status,
        content_type: None,
        execution,
        body: bytes::Bytes::new(),
    };
    edge.check_execution(route, &head)?;
    let mut resp = Body::new(a.body).into_response();
    *resp.status_mut() = a.status;
    for name in PASSED {
        if let Some(v) = a.headers.get(&name) {
            resp.headers_mut().insert(name, v.clone());
        }
    }
    if !resp.headers().contains_key(header::CONTENT_TYPE) {
        resp.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/octet-stream"),
        );
    }
    Ok(resp)
}
