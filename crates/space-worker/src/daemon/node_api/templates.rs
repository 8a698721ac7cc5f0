//! `POST /internal/v1/templates`: a template arriving from the control plane (the
//! operation is [`crate::daemon::templates`]).

use std::sync::Arc;

use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use space_proto::api::AckState;

use super::refusal::Refusal;
use crate::daemon::snapshot::transfer;
use crate::daemon::state::Worker;
use crate::daemon::templates;
use crate::daemon::updates::{self, UpdateError};

fn refused(why: UpdateError) -> Response {
    Refusal::Update(why).into_response()
}

/// Receives a template for this worker's store. The signed update (header
/// `space-update`) names the template's digest and the archive's length and is
/// verified before a byte of the body is read; the body is streamed to a file
/// (refused past the signed length), then every blob is verified as it is unpacked
/// and the manifest against the signed digest.
#[utoipa::path(post, path = "/internal/v1/templates", tag = "internal", request_body(content = space_proto::openapi::RawBytes, content_type = "application/x-tar", description = "`manifest.json`, then the layer blobs as `blobs/sha256/<hex>` (at most 9 GiB)"), responses((status = 200, description = "the template is in this worker's store", body = space_proto::api::UpdateAck), super::openapi::UpdateRefused), security(("signed_layer" = [])), extensions(("x-internal" = json!(true))))]
pub(crate) async fn receive(
    State(w): State<Arc<Worker>>,
    headers: HeaderMap,
    body: axum::body::Body,
) -> Response {
    let Some(signed) = super::snapshots::signed_header(&headers) else {
        return refused(UpdateError::Invalid(
            "header space-update must hold a signed template update".into(),
        ));
    };
    let expected = updates::verify(&w, &signed).and_then(|(_, update)| {
        templates::expect(update).map_err(|e| UpdateError::Invalid(e.to_string()))
    });
    let (digest, size) = match expected {
        Ok(v) => v,
        Err(e) => return refused(e),
    };
    let file = match transfer::spool_file(&w) {
        Ok(f) => f,
        Err(e) => return refused(e),
    };
    let (file, received) = match space_http::spool_body(body, size, file).await {
        Ok(v) => v,
        Err(e) if e.kind() == std::io::ErrorKind::FileTooLarge => {
            return refused(UpdateError::Refused(
                "the template archive is longer than signed".into(),
            ));
        }
        Err(e) => return refused(UpdateError::Invalid(format!("receiving the template: {e}"))),
    };
    if received != size {
        return refused(UpdateError::Refused(format!(
            "the template archive is {received} bytes, {size} were signed (truncated)"
        )));
    }
    match templates::receive(&w, digest, file).await {
        Ok(()) => axum::Json(updates::ack(&w, AckState::Installed, None)).into_response(),
        Err(e) => refused(updates::template_refusal(e)),
    }
}
