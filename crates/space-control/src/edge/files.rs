//! File reads and writes through the edge, streamed between the client and the worker
//! (neither body is held whole here), with the route driver's recovery rules (as
//! [`Edge::forward`]).
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

use std::sync::Mutex;
use std::time::Duration;

use axum::body::Body;
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::response::{IntoResponse, Response};
use space_http::CallError;
use space_http::stream::{self, StreamBody, StreamedAnswer};
use space_identity::{ExecutionId, OperationClass, Progress, Route, SandboxId};
use space_proto::api::ErrorBody;
use space_route::Attempt;

use super::routes::{deny_reason, relayed};
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
    pinned: Option<&ExecutionId>,
    path_and_query: &str,
    headers: &HeaderMap,
) -> Result<Response, ControlError> {
    edge.drive_pinned(
        who,
        sandbox,
        pinned,
        OperationClass::Read,
        |route, grant| async move {
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
            classify(edge, &route, sent).await
        },
    )
    .await
}

/// `PUT …/files?path=`: the client's `body` streamed to the worker.
#[allow(clippy::too_many_arguments)]
pub(crate) async fn write(
    edge: &Edge,
    who: &Authenticated,
    sandbox: &SandboxId,
    pinned: Option<&ExecutionId>,
    path_and_query: &str,
    headers: &HeaderMap,
    body: Body,
    class: OperationClass,
) -> Result<Response, ControlError> {
    // A small body is kept whole here: the one rebuilt attempt can send it again even
    // when the worker had read it before the route went stale (an execution frozen for
    // a migration after admission). A large one streams, and only a refusal before its
    // first byte left (behind `Expect: 100-continue`) leaves it for another attempt.
    let small = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<usize>().ok())
        .filter(|n| *n <= RESEND_LIMIT);
    let (body, kept): (Option<StreamBody>, Option<bytes::Bytes>) = match small {
        Some(_) => {
            let whole = axum::body::to_bytes(body, RESEND_LIMIT)
                .await
                .map_err(|e| ControlError::BadRequest(format!("upload body: {e}")))?;
            (None, Some(whole))
        }
        None => (Some(stream::boxed(body)), None),
    };
    // The body not yet sent: an attempt takes it and gives it back if no byte left.
    let unsent = Mutex::new(body);
    let (unsent, kept) = (&unsent, &kept);
    edge.drive_pinned(who, sandbox, pinned, class, |route, grant| async move {
        let taken = unsent.lock().ok().and_then(|mut b| b.take());
        let Some(unread) = taken.or_else(|| kept.clone().map(|b| stream::boxed(Body::from(b))))
        else {
            return Attempt::Done(Err(ControlError::RefreshRoute {
                reason: RouteLost::UploadStarted,
            }));
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
        let back = gate.take_back();
        let untouched = back.is_some();
        if let Ok(mut b) = unsent.lock() {
            *b = back;
        }
        match sent {
            // A body kept whole here can be sent again: the class decides (a write with
            // an idempotency key, once, to the same execution — its worker killed and
            // back with it re-adopted; see `RouteDriver::drive`).
            Err(e) if !untouched && kept.is_some() => Attempt::Failed {
                progress: Progress::Started,
                error: ControlError::BadGateway(format!(
                    "worker unreachable during the upload: {e}"
                )),
            },
            // A streamed body cut off after bytes of it left is never sent again: it is
            // gone, and the worker may have the file already.
            Err(e) if !untouched => Attempt::Done(Err(ControlError::BadGateway(format!(
                "worker unreachable during the upload: {e}"
            )))),
            sent => classify(edge, &route, sent).await,
        }
    })
    .await
}

impl Edge {
    /// `GET …/files?path=` (in `path_and_query`, `Range` from `headers`) of execution
    /// `pinned` only, streamed: see [`Edge::drive_pinned`].
    pub async fn read_file_of(
        &self,
        who: &Authenticated,
        sandbox: &SandboxId,
        pinned: &ExecutionId,
        path_and_query: &str,
        headers: &HeaderMap,
    ) -> Result<Response, ControlError> {
        read(self, who, sandbox, Some(pinned), path_and_query, headers).await
    }

    /// `PUT …/files?path=` of execution `pinned` only, the body streamed.
    pub async fn write_file_of(
        &self,
        who: &Authenticated,
        sandbox: &SandboxId,
        pinned: &ExecutionId,
        path_and_query: &str,
        headers: &HeaderMap,
        body: Body,
    ) -> Result<Response, ControlError> {
        let class = OperationClass::Mutation {
            idempotency_key: headers.contains_key("idempotency-key"),
        };
        write(
            self,
            who,
            sandbox,
            Some(pinned),
            path_and_query,
            headers,
            body,
            class,
        )
        .await
    }
}

/// One attempt's outcome on `route`: a RefreshRoute or a Deny read from the worker's
/// (small) error answer; any other answer passed on as it comes.
async fn classify(
    edge: &Edge,
    route: &Route,
    sent: Result<StreamedAnswer, CallError>,
) -> Attempt<Response, ControlError> {
    let answer = match sent {
        Ok(a) => a,
        Err(e) => {
            return Attempt::Failed {
                progress: match e {
                    // Nothing reached the worker: it is not listening.
                    CallError::Connect(_) => Progress::NotStarted,
                    _ => Progress::Started,
                },
                error: ControlError::BadGateway(format!("worker unreachable: {e}")),
            };
        }
    };
    match answer.status {
        StatusCode::MISDIRECTED_REQUEST => {
            let status = answer.status.as_u16();
            let body = answer.small_body(MAX_ERROR).await;
            let body = serde_json::from_slice::<ErrorBody>(&body).ok();
            Attempt::RefreshRoute {
                reason: space_proto::api::refresh_reason(body.as_ref()),
                answer: relayed(status, body),
            }
        }
        StatusCode::FORBIDDEN => {
            // Surfaced as the worker said it (the driver drops the route).
            let status = answer.status;
            let content_type = answer.headers.get(header::CONTENT_TYPE).cloned();
            let body = answer.small_body(MAX_ERROR).await;
            let reason = deny_reason(serde_json::from_slice(&body).ok().as_ref());
            let mut resp = (status, body).into_response();
            if let Some(ct) = content_type {
                resp.headers_mut().insert(header::CONTENT_TYPE, ct);
            }
            Attempt::Denied {
                reason,
                answer: Ok(resp),
            }
        }
        _ => Attempt::Done(relay(edge, route, answer)),
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
