//! `GET /healthz` and `GET /readyz` of node-api.
//!
//! Both are unauthenticated, read no body and say nothing secret: `/healthz` answers
//! 200 `{"status":"ok"}` while node-api serves; `/readyz` answers 200
//! `{"status":"ready"}` once the worker is enrolled and synced with its control plane
//! (see [`super::readiness`]), and 503 `{"error":"not_ready","message":…}` otherwise —
//! before the first sync, and after a sync failed until one goes through again.

use std::sync::Arc;

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use space_proto::api::ErrorBody;

use super::state::Worker;

/// `GET /healthz`.
pub async fn healthz() -> Response {
    Json(serde_json::json!({"status": "ok"})).into_response()
}

/// `GET /readyz`.
pub async fn readyz(State(w): State<Arc<Worker>>) -> Response {
    let enrolled = w.keys.read().is_ok_and(|k| k.is_some());
    match w.readiness.check(enrolled) {
        Ok(()) => Json(serde_json::json!({"status": "ready"})).into_response(),
        Err(message) => (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(ErrorBody {
                error: "not_ready".into(),
                message: message.into(),
                reason: None,
            }),
        )
            .into_response(),
    }
}
