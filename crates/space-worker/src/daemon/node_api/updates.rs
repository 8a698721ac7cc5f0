//! `POST /internal/v1/updates`: a signed update from the control plane, its sender
//! authenticated by the signed delivery in its header before a byte of the body is
//! read, then verified and applied (see [`crate::daemon::updates`]).

use std::sync::Arc;

use axum::Json;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use space_proto::api::SignedUpdate;

use super::refusal::Refusal;
use crate::daemon::state::Worker;
use crate::daemon::updates::{self, UpdateError};

#[utoipa::path(post, path = "/internal/v1/updates", tag = "internal", summary = "Apply a signed identity update; acknowledged once durable.", request_body = space_proto::api::SignedUpdate, responses((status = 200, description = "applied and durable", body = space_proto::api::UpdateAck), super::openapi::UpdateRefused), security(("delivery" = [])), extensions(("x-internal" = json!(true))))]
pub(crate) async fn apply_update(
    State(w): State<Arc<Worker>>,
    headers: HeaderMap,
    body: axum::body::Body,
) -> Response {
    // The sender first: nothing of the body is read before its signed delivery
    // descriptor verifies, and then no more than the size it signed.
    let header = headers
        .get(space_proto::api::DELIVERY_HEADER)
        .and_then(|v| v.to_str().ok());
    let delivery = match updates::check_delivery(&w, header) {
        Ok(d) => d,
        Err(e) => return Refusal::Update(e).closing(),
    };
    let body = match axum::body::to_bytes(body, delivery.size as usize).await {
        Ok(b)
            if b.len() as u64 == delivery.size
                && blake3::hash(&b).to_hex().as_str() == delivery.digest =>
        {
            b
        }
        Ok(_) | Err(_) => {
            return Refusal::Update(UpdateError::Refused(
                "delivery_mismatch: the body is not the one whose delivery was signed".into(),
            ))
            .into_response();
        }
    };
    let signed: SignedUpdate = match serde_json::from_slice(&body) {
        Ok(s) => s,
        Err(e) => return Refusal::BadRequest(format!("invalid update: {e}")).into_response(),
    };
    let result = match updates::verify_detached(&w, signed).await {
        Ok((body, update)) => updates::apply(&w, body, update).await,
        Err(e) => Err(e),
    };
    match result {
        Ok(ack) => Json(ack).into_response(),
        Err(e) => Refusal::Update(e).into_response(),
    }
}
