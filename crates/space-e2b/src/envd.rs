//! envd, as the SDKs reach it: routing (`E2b-Sandbox-Id`, or the host name
//! `49983-{id}.{domain}`), the access token (`X-Access-Token`) checked on every call,
//! and each call carried out through the edge on the execution the token names — a
//! token from before a resume elsewhere or a migration is refused
//! (`unauthenticated`), never served by the new execution.
//!
//! The routes: `process.Process/*` ([`crate::process`]), `filesystem.Filesystem/*`
//! ([`crate::filesystem`]), `GET`/`POST /files` and `GET /health`. Browsers get CORS
//! answers (the JavaScript SDK in a browser).

use std::sync::Arc;

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use space_identity::OperationClass;

use crate::front::Front;

/// The envd routes.
pub fn routes() -> Router<Arc<Front>> {
    Router::new()
        .route("/health", get(health))
        .route(
            "/files",
            get(crate::files::download).post(crate::files::upload),
        )
        .route("/process.Process/{method}", post(crate::process::call))
        .route(
            "/filesystem.Filesystem/{method}",
            post(crate::filesystem::call),
        )
}

/// `GET /health`: envd answers 204 while it runs. Here: the token is valid and the
/// execution it names serves the sandbox.
async fn health(State(front): State<Arc<Front>>, headers: HeaderMap) -> Response {
    let routed = match front.envd(&headers).await {
        Ok(e) => e,
        Err(e) => return e.into_response(),
    };
    match front
        .operate(
            &routed,
            Method::GET,
            "files/stat?path=/",
            None,
            Bytes::new(),
            OperationClass::Read,
        )
        .await
    {
        Ok(_) => StatusCode::NO_CONTENT.into_response(),
        // A token of a replaced execution: get a new one (connect), the sandbox runs.
        Err(e) if e.code == crate::connect::Code::Unauthenticated => e.into_response(),
        // The SDKs read a 502 "… was not found" as a sandbox that is not running.
        Err(e) => {
            let body = serde_json::json!({
                "code": 502,
                "message": format!("sandbox {} was not found or does not answer: {}", routed.sandbox, e.message),
            });
            (StatusCode::BAD_GATEWAY, axum::Json(body)).into_response()
        }
    }
}

/// The answer to a CORS preflight.
pub fn preflight() -> Response {
    let mut resp = StatusCode::NO_CONTENT.into_response();
    let h = resp.headers_mut();
    h.insert(
        "access-control-allow-methods",
        HeaderValue::from_static("GET, POST, PUT, DELETE, OPTIONS"),
    );
    h.insert(
        "access-control-allow-headers",
        HeaderValue::from_static("*, authorization"),
    );
    h.insert("access-control-max-age", HeaderValue::from_static("600"));
    resp
}

/// CORS headers on every answer of the front: any origin may call it (each call
/// carries its own credential; none are cookies).
pub fn cors(h: &mut HeaderMap, origin: Option<HeaderValue>) {
    if origin.is_some() {
        h.insert("access-control-allow-origin", HeaderValue::from_static("*"));
        h.insert(
            "access-control-expose-headers",
            HeaderValue::from_static("*"),
        );
    }
}
