//! Errors of the public API, mapped to HTTP only here.

use axum::Json;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use space_proto::api::ErrorBody;

/// An error answer: status, stable code, message, and for identity rejections the
/// comparator's reason.
#[derive(Debug, Clone)]
pub struct ApiError {
    /// HTTP status.
    pub status: StatusCode,
    /// Stable code.
    pub code: &'static str,
    /// Text for people.
    pub message: String,
    /// Reason code, for `refresh_route` / `deny`.
    pub reason: Option<String>,
}

impl ApiError {
    /// An error with no reason code.
    pub fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        Self {
            status,
            code,
            message: message.into(),
            reason: None,
        }
    }

    /// 400.
    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "bad_request", message)
    }

    /// 401.
    pub fn unauthorized() -> Self {
        Self::new(
            StatusCode::UNAUTHORIZED,
            "unauthorized",
            "a valid API key is required",
        )
    }

    /// 403.
    pub fn forbidden(message: impl Into<String>) -> Self {
        Self::new(StatusCode::FORBIDDEN, "forbidden", message)
    }

    /// 404 (also for things that exist but belong to another tenant).
    pub fn not_found(what: &str) -> Self {
        Self::new(
            StatusCode::NOT_FOUND,
            "not_found",
            format!("{what} not found"),
        )
    }

    /// 409.
    pub fn conflict(message: impl Into<String>) -> Self {
        Self::new(StatusCode::CONFLICT, "conflict", message)
    }

    /// 503.
    pub fn unavailable(message: impl Into<String>) -> Self {
        Self::new(StatusCode::SERVICE_UNAVAILABLE, "unavailable", message)
    }

    /// 502: a worker failed or answered nonsense.
    pub fn bad_gateway(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_GATEWAY, "bad_gateway", message)
    }

    /// 500, for failures of our own (store, signing). Never for bad input.
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", message)
    }
}

impl From<space_store::StoreError> for ApiError {
    fn from(e: space_store::StoreError) -> Self {
        match e {
            space_store::StoreError::NotFound(_) => Self::not_found("record"),
            space_store::StoreError::Conflict(m) => Self::conflict(m),
            other => {
                tracing::error!(error = %other, "store failure");
                Self::internal("storage failure")
            }
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = ErrorBody {
            error: self.code.to_owned(),
            message: self.message,
            reason: self.reason,
        };
        (self.status, Json(body)).into_response()
    }
}
