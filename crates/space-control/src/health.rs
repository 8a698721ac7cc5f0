//! `GET /healthz` and `GET /readyz` of the control plane and of the edge, in the
//! control plane's process or on its own (`space edge`).
//!
//! Both are unauthenticated, read no body and say nothing secret: `/healthz` answers
//! 200 `{"status":"ok"}` while the process serves; `/readyz` answers 200
//! `{"status":"ready"}` when it can do its job — the control plane's store answers a
//! query, a standalone edge's control plane answers its own `/readyz` — and 503
//! `{"error":"not_ready","message":…}` otherwise (what failed is logged, not told).

use std::time::Duration;

use std::sync::Arc;

use axum::Json;
use axum::http::{Method, StatusCode};
use axum::response::{IntoResponse, Response};
use space_proto::api::ErrorBody;

use crate::edge::{Authority, Edge};

/// How long `/readyz` waits for the store or the control plane before it says no.
pub const READY_WITHIN: Duration = Duration::from_secs(2);

/// `GET /healthz`.
pub async fn healthz() -> Response {
    Json(serde_json::json!({"status": "ok"})).into_response()
}

/// `GET /readyz` of the process `edge` serves in (its authority says which).
pub async fn readyz(edge: Arc<Edge>) -> Response {
    match readiness(&edge).await {
        Ok(()) => Json(serde_json::json!({"status": "ready"})).into_response(),
        Err(message) => not_ready(message),
    }
}

/// Why this process cannot do its job now, if it cannot.
async fn readiness(edge: &Edge) -> Result<(), &'static str> {
    match edge.authority() {
        Authority::Local(cp) => {
            match tokio::time::timeout(READY_WITHIN, cp.store.schema_versions()).await {
                Ok(Ok(_)) => Ok(()),
                Ok(Err(e)) => {
                    tracing::warn!(error = %e, "not ready: the store failed a query");
                    Err("the store does not answer")
                }
                Err(_) => {
                    tracing::warn!("not ready: the store did not answer in time");
                    Err("the store does not answer")
                }
            }
        }
        Authority::Remote { url, http } => {
            let readyz = format!("{url}/readyz");
            let probe = http.call(Method::GET, &readyz, &[], bytes::Bytes::new());
            match tokio::time::timeout(READY_WITHIN, probe).await {
                Ok(Ok(a)) if a.status == StatusCode::OK => Ok(()),
                Ok(Ok(a)) => {
                    tracing::warn!(status = %a.status, "not ready: the control plane is not");
                    Err("the control plane is not ready")
                }
                Ok(Err(e)) => {
                    tracing::warn!(error = %e, "not ready: the control plane does not answer");
                    Err("the control plane does not answer")
                }
                Err(_) => {
                    tracing::warn!("not ready: the control plane did not answer in time");
                    Err("the control plane does not answer")
                }
            }
        }
    }
}

fn not_ready(message: &str) -> Response {
    (
        StatusCode::SERVICE_UNAVAILABLE,
        Json(ErrorBody {
            error: "not_ready".into(),
            message: message.into(),
            reason: None,
        }),
    )
        .into_response()
}
