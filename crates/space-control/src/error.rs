//! What can go wrong in the control plane and the edge, by meaning. Nothing here names
//! an HTTP status: [`crate::api::error`] maps each error to its answer (status, code,
//! message, reason) in one place. The message a client reads is the error's `Display`.

use std::time::Duration;

use space_identity::{DenyReason, RecoveryError};
pub use space_proto::codes::ErrorCode;
use space_store::StoreError;

/// An error of the control plane's service or of the edge.
#[derive(Debug, Clone, thiserror::Error)]
pub enum ControlError {
    /// The request is malformed or asks for something that does not exist.
    #[error("{0}")]
    BadRequest(String),
    /// A sandbox asked for limits below the minimums or past the maxima.
    #[error("{0}")]
    InvalidLimits(String),
    /// No valid API key (or worker credential) was presented.
    #[error("a valid API key is required")]
    Unauthorized,
    /// The caller is known but may not do this.
    #[error("{0}")]
    Forbidden(String),
    /// A capability was denied (never retried): the comparator's reason is kept.
    #[error("denied")]
    Deny {
        /// Why.
        reason: DenyReason,
    },
    /// `what` does not exist, or belongs to another tenant (which is not revealed).
    #[error("{0} not found")]
    NotFound(&'static str),
    /// The request conflicts with the state of the sandbox (or of the store).
    #[error("{0}")]
    Conflict(String),
    /// The sandbox has no execution its worker acknowledged running.
    #[error("the sandbox has no running execution")]
    NotRunning,
    /// The stored snapshot's bytes do not have the digest recorded when it was taken.
    #[error(
        "the stored snapshot does not match its digest (tampered or truncated); nothing was changed"
    )]
    SnapshotCorrupt,
    /// A body, an exec request or a writable layer is over its limit.
    #[error("{0}")]
    TooLarge(String),
    /// The tenant has as many live sandboxes as its quota allows.
    #[error("this tenant has {live} live sandboxes, its quota is {quota}: delete one first")]
    Quota {
        /// Its live sandboxes.
        live: u64,
        /// Its quota.
        quota: u64,
    },
    /// The sandbox stayed in a transition (named by `state`) for the whole wait.
    #[error(
        "the sandbox is {state}: no execution of it was acknowledged running within {} ms; retry",
        waited.as_millis()
    )]
    Transitioning {
        /// `starting`, `migrating`, `restarting` …
        state: &'static str,
        /// How long the resolve waited.
        waited: Duration,
    },
    /// Something the request needs is not there now (no worker, a control plane
    /// unreachable, a key not acknowledged yet): retry later.
    #[error("{0}")]
    Unavailable(String),
    /// A RefreshRoute the edge could not recover from under the rules of
    /// `IDENTITY.md` §4 (kept apart from [`Self::Deny`]: the route went stale, the
    /// capability was not refused).
    #[error("{reason}")]
    RefreshRoute {
        /// Why no (further) rebuilt attempt was made.
        reason: RouteLost,
    },
    /// A worker failed, was unreachable, or answered nonsense.
    #[error("{0}")]
    BadGateway(String),
    /// A worker answered from another execution than the route named.
    #[error(
        "the worker answered from another execution than the route named; nothing was passed on"
    )]
    WrongExecution,
    /// An operation bound to one execution (an E2B access token's) found the sandbox
    /// served by another: nothing was sent to either.
    #[error(
        "the sandbox now runs another execution than this credential was issued for; get a new one (E2B: Sandbox.connect)"
    )]
    ExecutionReplaced,
    /// A failure of our own (signing, the snapshot spool, a poisoned lock); never
    /// for bad input.
    #[error("{0}")]
    Internal(String),
    /// The store failed, or a record it was asked for is missing or conflicts.
    #[error("{}", store_message(.0))]
    Store(#[from] StoreError),
    /// The sandbox does not expose this service port.
    #[error("port {0} of this sandbox is not exposed (POST /v1/sandboxes/{{id}}/ports)")]
    PortNotExposed(u16),
    /// A private service port reached without a credential that opens it.
    #[error(
        "port {0} of this sandbox is private: send the owner's API key (Authorization: Bearer), the port's token (X-Space-Port-Token), or open a one-time link (POST /v1/sandboxes/{{id}}/ports/{0}/links)"
    )]
    PortPrivate(u16),
    /// A request on a service-port connection that another sandbox or port holds.
    #[error("{0}")]
    Misdirected(String),
    /// A template that live sandboxes are pinned to (and no other name keeps).
    #[error("template_in_use: {live} live sandboxes use template {template}; delete them first")]
    TemplateInUse {
        /// `name:tag`.
        template: String,
        /// The live sandboxes pinned to its digest.
        live: u64,
    },
    /// A control-plane operation asked of a standalone edge.
    #[error("served by the control plane, not this edge")]
    NotHere,
    /// An error answer another daemon gave (the remote control plane of a standalone
    /// edge, a worker refusing a stream), passed on as it came.
    #[error("{}", .0.message)]
    Relayed(Relayed),
}

/// Why a RefreshRoute ended the operation.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RouteLost {
    /// The recovery rules allow no further attempt.
    #[error("{0}")]
    Recovery(RecoveryError),
    /// The upload's body went to a worker already and cannot be sent again.
    #[error(
        "the route changed after the upload started; the file was not replaced \
         (the write is all or nothing): send it again"
    )]
    UploadStarted,
}

/// An error answer of another daemon, as the edge passes it on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Relayed {
    /// Its HTTP status, as given.
    pub status: u16,
    /// Its code, if one the platform passes on (see [`ErrorCode::relayed`]).
    pub code: ErrorCode,
    /// Its message.
    pub message: String,
    /// Its reason code.
    pub reason: Option<String>,
}

impl From<RecoveryError> for ControlError {
    fn from(e: RecoveryError) -> Self {
        match e {
            RecoveryError::Denied(reason) => Self::Deny { reason },
            other => Self::RefreshRoute {
                reason: RouteLost::Recovery(other),
            },
        }
    }
}

fn store_message(e: &StoreError) -> String {
    match e {
        StoreError::NotFound(_) => "record not found".into(),
        StoreError::Conflict(m) => m.clone(),
        _ => "storage failure".into(),
    }
}

impl ControlError {
    /// The stable code of this error's answer.
    pub fn code(&self) -> ErrorCode {
        match self {
            Self::BadRequest(_) => ErrorCode::BadRequest,
            Self::InvalidLimits(_) => ErrorCode::InvalidLimits,
            Self::Unauthorized => ErrorCode::Unauthorized,
            Self::Forbidden(_) => ErrorCode::Forbidden,
            Self::Deny { .. } => ErrorCode::Deny,
            Self::NotFound(_) | Self::Store(StoreError::NotFound(_)) => ErrorCode::NotFound,
            Self::Conflict(_) | Self::Store(StoreError::Conflict(_)) => ErrorCode::Conflict,
            Self::NotRunning => ErrorCode::NotRunning,
            Self::SnapshotCorrupt => ErrorCode::SnapshotCorrupt,
            Self::TooLarge(_) => ErrorCode::TooLarge,
            Self::Quota { .. } => ErrorCode::QuotaExceeded,
            Self::Transitioning { .. } => ErrorCode::Transitioning,
            Self::Unavailable(_) => ErrorCode::Unavailable,
            Self::RefreshRoute { .. } => ErrorCode::RouteUnavailable,
            Self::BadGateway(_) => ErrorCode::BadGateway,
            Self::WrongExecution => ErrorCode::WrongExecution,
            Self::ExecutionReplaced => ErrorCode::ExecutionReplaced,
            Self::Internal(_) | Self::Store(_) => ErrorCode::Internal,
            Self::NotHere => ErrorCode::NotHere,
            Self::PortNotExposed(_) => ErrorCode::PortNotExposed,
            Self::PortPrivate(_) => ErrorCode::Unauthorized,
            Self::Misdirected(_) => ErrorCode::Misdirected,
            Self::TemplateInUse { .. } => ErrorCode::TemplateInUse,
            Self::Relayed(r) => r.code,
        }
    }

    /// The comparator's reason a client is given (denials, and relayed answers that
    /// carry one).
    pub fn reason(&self) -> Option<String> {
        match self {
            Self::Deny { reason } => Some(reason.as_str().to_owned()),
            Self::Relayed(r) => r.reason.clone(),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_recovery_that_was_denied_stays_a_deny_and_any_other_is_a_lost_route() {
        let denied = ControlError::from(RecoveryError::Denied(DenyReason::Expired));
        assert!(matches!(
            denied,
            ControlError::Deny {
                reason: DenyReason::Expired
            }
        ));
        assert_eq!(denied.reason().as_deref(), Some("expired"));
        let lost = ControlError::from(RecoveryError::ResolvedSameRoute);
        assert_eq!(lost.code(), ErrorCode::RouteUnavailable);
        assert_eq!(
            lost.to_string(),
            "the control plane resolved the rejected route again"
        );
        assert_eq!(lost.reason(), None);
    }

    #[test]
    fn store_failures_tell_clients_nothing_of_the_store() {
        let e = ControlError::from(StoreError::Backend("disk I/O error at /data".into()));
        assert_eq!(e.to_string(), "storage failure");
        assert_eq!(e.code(), ErrorCode::Internal);
        let e = ControlError::from(StoreError::NotFound("sandbox sbx_1".into()));
        assert_eq!(
            (e.code(), e.to_string().as_str()),
            (ErrorCode::NotFound, "record not found")
        );
    }
}
