//! The one place errors become HTTP answers: each [`ControlError`] gets its status
//! here, and its body `{"error": code, "message": text, "reason": …}`.

use axum::Json;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use space_proto::api::ErrorBody;
use space_store::StoreError;

use crate::error::ControlError;

/// The HTTP status of `e`'s answer.
pub fn status(e: &ControlError) -> StatusCode {
    use ControlError as E;
    match e {
        E::BadRequest(_) | E::InvalidLimits(_) => StatusCode::BAD_REQUEST,
        E::Unauthorized | E::PortPrivate(_) | E::ExecutionReplaced => StatusCode::UNAUTHORIZED,
        E::Forbidden(_) | E::Deny { .. } => StatusCode::FORBIDDEN,
        E::NotFound(_) | E::Store(StoreError::NotFound(_)) => StatusCode::NOT_FOUND,
        E::Conflict(_)
        | E::NotRunning
        | E::SnapshotCorrupt
        | E::TemplateInUse { .. }
        | E::Store(StoreError::Conflict(_)) => StatusCode::CONFLICT,
        E::TooLarge(_) => StatusCode::PAYLOAD_TOO_LARGE,
        E::Quota { .. } => StatusCode::TOO_MANY_REQUESTS,
        E::Transitioning { .. } | E::Unavailable(_) | E::RefreshRoute { .. } => {
            StatusCode::SERVICE_UNAVAILABLE
        }
        E::BadGateway(_) | E::WrongExecution => StatusCode::BAD_GATEWAY,
        E::Internal(_) | E::Store(_) => StatusCode::INTERNAL_SERVER_ERROR,
        E::NotHere => StatusCode::NOT_IMPLEMENTED,
        E::PortNotExposed(_) => StatusCode::NOT_FOUND,
        E::Misdirected(_) => StatusCode::MISDIRECTED_REQUEST,
        E::Relayed(r) => StatusCode::from_u16(r.status).unwrap_or(StatusCode::BAD_GATEWAY),
    }
}

/// The body of `e`'s answer.
pub fn body(e: &ControlError) -> ErrorBody {
    ErrorBody {
        error: e.code().as_str().to_owned(),
        message: e.to_string(),
        reason: e.reason(),
    }
}

impl IntoResponse for ControlError {
    fn into_response(self) -> Response {
        // What failed stays in the log; the client reads `storage failure`.
        if let ControlError::Store(failure @ StoreError::Backend(_)) = &self {
            tracing::error!(error = %failure, "store failure");
        }
        (status(&self), Json(body(&self))).into_response()
    }
}
