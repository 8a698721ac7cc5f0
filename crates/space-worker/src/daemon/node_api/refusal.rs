//! What node-api answers instead of an operation: a typed [`Refusal`], and the one
//! mapping from each to its status and `{"error", "message"[, "reason"]}` body.

use axum::Json;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use space_identity::{DenyReason, RefreshReason};
use space_proto::api::ErrorBody;
use space_proto::codes::WorkerCode;
use space_proto::guest::{ErrorKind, WireError};

use crate::daemon::snapshot::transfer::TransferError;
use crate::daemon::updates::UpdateError;

/// Why an operation is not run, or did not finish.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// No `SpaceCap` capability (401 `unauthorized`).
    NoCapability,
    /// A capability that does not parse (401 `unauthorized`, with its reason).
    UnparseableCapability(DenyReason),
    /// The comparator denied it, or its path names no sandbox (403 `deny`).
    Deny(DenyReason),
    /// The route it was sent on is stale (421 `refresh_route`).
    RefreshRoute(Stale),
    /// The sandbox stayed paused while the request waited (409 `paused`).
    Paused,
    /// No such route (404 `not_found`).
    NoRoute,
    /// The request is malformed (400 `bad_request`).
    BadRequest(String),
    /// The request is larger than this worker takes (413 `too_large`).
    TooLarge(String),
    /// The client stopped sending its body (408 `body_timeout`).
    BodyTimeout(String),
    /// The request body ended before its end (400 `incomplete_body`).
    IncompleteBody(String),
    /// The `Range` selects nothing of a file of `size` bytes (416).
    RangeNotSatisfiable {
        /// The file's size.
        size: u64,
    },
    /// The bridge or the agent connection failed (502 `bridge`).
    Bridge(String),
    /// The agent refused the operation (its kind decides the status).
    Agent(WireError),
    /// An operation with this idempotency key ran, and its answer is gone (409
    /// `replay_unavailable`).
    ReplayUnavailable(String),
    /// The operation ran but its answer could not be kept (502 `answer_failed`).
    AnswerLost(String),
    /// This worker failed (500 `internal`).
    Internal(String),
    /// Nothing accepts connections on the service port (502 `port_closed`).
    PortClosed(String),
    /// This worker cannot serve it (503 `unsupported`).
    Unsupported(String),
    /// A signed update, its delivery, or a layer transfer was refused
    /// (`update_refused`; the status by the error).
    Update(UpdateError),
}

/// Which stale route a 421 reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Stale {
    /// The comparator's verdict.
    Route(RefreshReason),
    /// The record holds no running execution with a bridge.
    NotRunning,
    /// The execution was retired or replaced while the request waited.
    Replaced,
    /// The execution was retired while the operation ran.
    RetiredDuringOperation,
}

impl Stale {
    fn message(self) -> &'static str {
        match self {
            Self::Route(_) => "route is stale",
            Self::NotRunning => "execution not running",
            Self::Replaced => "execution replaced",
            Self::RetiredDuringOperation => "the execution was retired during the operation",
        }
    }

    fn reason(self) -> &'static str {
        match self {
            Self::Route(reason) => reason.as_str(),
            Self::NotRunning => RefreshReason::NotRunning.as_str(),
            Self::Replaced | Self::RetiredDuringOperation => RefreshReason::Retired.as_str(),
        }
    }
}

impl From<UpdateError> for Refusal {
    fn from(e: UpdateError) -> Self {
        Self::Update(e)
    }
}

impl From<TransferError> for Refusal {
    fn from(e: TransferError) -> Self {
        match e {
            TransferError::Update(e) => Self::Update(e),
            TransferError::TooLarge(why) => Self::TooLarge(why),
        }
    }
}

/// The status of an update's refusal.
fn update_status(e: &UpdateError) -> StatusCode {
    match e {
        UpdateError::Unauthenticated(_) => StatusCode::UNAUTHORIZED,
        UpdateError::Refused(_) => StatusCode::FORBIDDEN,
        UpdateError::Invalid(_) => StatusCode::BAD_REQUEST,
        UpdateError::Conflict(_) => StatusCode::CONFLICT,
        UpdateError::TooLarge(_) => StatusCode::PAYLOAD_TOO_LARGE,
        UpdateError::NotEnrolled => StatusCode::SERVICE_UNAVAILABLE,
        UpdateError::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
    }
}

/// The status and code of an agent's refusal.
fn agent_status(kind: ErrorKind) -> (StatusCode, WorkerCode) {
    match kind {
        ErrorKind::NotFound => (StatusCode::NOT_FOUND, WorkerCode::NotFound),
        ErrorKind::PermissionDenied => (StatusCode::FORBIDDEN, WorkerCode::PermissionDenied),
        ErrorKind::IsADirectory => (StatusCode::BAD_REQUEST, WorkerCode::IsADirectory),
        ErrorKind::NotADirectory => (StatusCode::BAD_REQUEST, WorkerCode::NotADirectory),
        ErrorKind::AlreadyExists => (StatusCode::CONFLICT, WorkerCode::AlreadyExists),
        ErrorKind::InvalidArgument => (StatusCode::BAD_REQUEST, WorkerCode::InvalidArgument),
        ErrorKind::Busy => (StatusCode::SERVICE_UNAVAILABLE, WorkerCode::Busy),
        ErrorKind::NoSpace => (StatusCode::INSUFFICIENT_STORAGE, WorkerCode::NoSpace),
        ErrorKind::UnknownUser => (StatusCode::BAD_REQUEST, WorkerCode::UnknownUser),
        ErrorKind::PortClosed => (StatusCode::BAD_GATEWAY, WorkerCode::PortClosed),
        _ => (StatusCode::BAD_GATEWAY, WorkerCode::Agent),
    }
}

impl Refusal {
    /// Status, code, message and reason: the whole answer.
    fn parts(&self) -> (StatusCode, WorkerCode, String, Option<&'static str>) {
        use StatusCode as S;
        match self {
            Self::NoCapability => (
                S::UNAUTHORIZED,
                WorkerCode::Unauthorized,
                "a SpaceCap capability is required".into(),
                None,
            ),
            Self::UnparseableCapability(r) => (
                S::UNAUTHORIZED,
                WorkerCode::Unauthorized,
                "unparseable capability".into(),
                Some(r.as_str()),
            ),
            Self::Deny(r) => (
                S::FORBIDDEN,
                WorkerCode::Deny,
                "denied".into(),
                Some(r.as_str()),
            ),
            Self::RefreshRoute(stale) => (
                S::MISDIRECTED_REQUEST,
                WorkerCode::RefreshRoute,
                stale.message().into(),
                Some(stale.reason()),
            ),
            Self::Paused => (
                S::CONFLICT,
                WorkerCode::Paused,
                "the sandbox is paused; resume it first".into(),
                None,
            ),
            Self::NoRoute => (
                S::NOT_FOUND,
                WorkerCode::NotFound,
                "no such route".into(),
                None,
            ),
            Self::BadRequest(m) => (S::BAD_REQUEST, WorkerCode::BadRequest, m.clone(), None),
            Self::TooLarge(m) => (S::PAYLOAD_TOO_LARGE, WorkerCode::TooLarge, m.clone(), None),
            Self::BodyTimeout(m) => (S::REQUEST_TIMEOUT, WorkerCode::BodyTimeout, m.clone(), None),
            Self::IncompleteBody(m) => {
                (S::BAD_REQUEST, WorkerCode::IncompleteBody, m.clone(), None)
            }
            Self::RangeNotSatisfiable { size } => (
                S::RANGE_NOT_SATISFIABLE,
                WorkerCode::RangeNotSatisfiable,
                format!("the range selects nothing of this {size}-byte file"),
                None,
            ),
            Self::Bridge(m) => (S::BAD_GATEWAY, WorkerCode::Bridge, m.clone(), None),
            Self::Agent(e) => {
                let (status, code) = agent_status(e.kind);
                (status, code, e.message.clone(), None)
            }
            Self::ReplayUnavailable(m) => {
                (S::CONFLICT, WorkerCode::ReplayUnavailable, m.clone(), None)
            }
            Self::AnswerLost(m) => (S::BAD_GATEWAY, WorkerCode::AnswerFailed, m.clone(), None),
            Self::Internal(m) => (
                S::INTERNAL_SERVER_ERROR,
                WorkerCode::Internal,
                m.clone(),
                None,
            ),
            Self::PortClosed(m) => (S::BAD_GATEWAY, WorkerCode::PortClosed, m.clone(), None),
            Self::Unsupported(m) => (
                S::SERVICE_UNAVAILABLE,
                WorkerCode::Unsupported,
                m.clone(),
                None,
            ),
            Self::Update(e) => (
                update_status(e),
                WorkerCode::UpdateRefused,
                e.to_string(),
                None,
            ),
        }
    }

    /// The status this refusal is answered with.
    pub(crate) fn status(&self) -> StatusCode {
        self.parts().0
    }

    /// The text this refusal is answered with.
    pub(crate) fn message(&self) -> String {
        self.parts().2
    }

    /// Its code.
    pub(crate) fn code(&self) -> &'static str {
        self.parts().1.as_str()
    }

    /// The answer, with `Connection: close`: for a request whose body is left unread.
    pub(crate) fn closing(self) -> Response {
        let mut resp = self.into_response();
        resp.headers_mut()
            .insert(header::CONNECTION, HeaderValue::from_static("close"));
        resp
    }
}

impl IntoResponse for Refusal {
    fn into_response(self) -> Response {
        let (status, code, message, reason) = self.parts();
        let mut resp = (
            status,
            Json(ErrorBody {
                error: code.as_str().to_owned(),
                message,
                reason: reason.map(str::to_owned),
            }),
        )
            .into_response();
        if let Self::RangeNotSatisfiable { size } = self {
            if let Ok(v) = HeaderValue::from_str(&format!("bytes */{size}")) {
                resp.headers_mut().insert(header::CONTENT_RANGE, v);
            }
        }
        resp
    }
}
