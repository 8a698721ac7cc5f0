//! The HTTP side of snapshots and migrations: `POST /internal/v1/snapshot` and
//! `POST /internal/v1/layers` (the operations are [`crate::daemon::snapshot::transfer`]).

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, header};
use axum::response::{IntoResponse, Response};
use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD as B64;
use space_proto::api::SignedUpdate;

use super::refusal::Refusal;
use crate::daemon::snapshot::transfer;
use crate::daemon::state::Worker;
use crate::daemon::updates::UpdateError;

/// The signed update of header `space-update` (base64url of its JSON), if it holds
/// one: what a transfer's body is verified against before a byte of it is read.
pub(crate) fn signed_header(headers: &HeaderMap) -> Option<SignedUpdate> {
    headers
        .get("space-update")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| B64.decode(v).ok())
        .and_then(|b| serde_json::from_slice(&b).ok())
}

/// A refused transfer, answered as a refused update.
fn refused(why: UpdateError) -> Response {
    Refusal::Update(why).into_response()
}

/// Freezes the execution the signed update names and answers with its writable
/// layer; header `space-snapshot-digest` holds the BLAKE3 digest. The archive is
/// written to a file first (the limit enforced while it is written, a file too
/// large for it refused before it is read) and sent from there.
#[utoipa::path(post, path = "/internal/v1/snapshot", tag = "internal", request_body(content = space_proto::api::SignedUpdate, description = "the signed snapshot order (at most 64 KiB)"), responses((status = 200, description = "the frozen writable layer", body = space_proto::openapi::RawBytes, content_type = "application/x-tar", headers(("space-snapshot-digest" = String, description = "BLAKE3 of the archive, lowercase hex"))), super::openapi::UpdateRefused), security(()), extensions(("x-internal" = json!(true))))]
pub(crate) async fn snapshot(State(w): State<Arc<Worker>>, body: Bytes) -> Response {
    let Ok(signed) = serde_json::from_slice::<SignedUpdate>(&body) else {
        return refused(UpdateError::Invalid("invalid signed update".into()));
    };
    match transfer::take(&w, &signed).await {
        Ok((file, packed)) => (
            [
                (header::CONTENT_TYPE, "application/x-tar".to_owned()),
                (
                    header::HeaderName::from_static("space-snapshot-digest"),
                    packed.digest,
                ),
            ],
            axum::body::Body::new(space_http::FileBody::new(file, packed.size)),
        )
            .into_response(),
        Err(e) => Refusal::from(e).into_response(),
    }
}

/// Receives a sandbox's writable layer for its next execution here. The signed
/// update (header `space-update`) names the archive's digest and size and is
/// verified before a byte of the body is read; the body is then streamed to a file
/// (refused past the signed size), its digest checked over the bytes received, and
/// only then unpacked.
#[utoipa::path(post, path = "/internal/v1/layers", tag = "internal", request_body(content = space_proto::openapi::RawBytes, content_type = "application/x-tar", description = "the archive the signed layer update names (at most 1 GiB)"), responses((status = 200, description = "kept for the sandbox's next execution here", body = space_proto::api::UpdateAck), super::openapi::UpdateRefused), security(("signed_layer" = [])), extensions(("x-internal" = json!(true))))]
pub(crate) async fn layer(
    State(w): State<Arc<Worker>>,
    headers: HeaderMap,
    body: axum::body::Body,
) -> Response {
    let Some(signed) = signed_header(&headers) else {
        return refused(UpdateError::Invalid(
            "header space-update must hold a signed layer update".into(),
        ));
    };
    let expected = match transfer::expect(&w, &signed) {
        Ok(e) => e,
        Err(e) => return Refusal::from(e).into_response(),
    };
    let file = match transfer::spool_file(&w) {
        Ok(f) => f,
        Err(e) => return refused(e),
    };
    let sink = space_http::HashingFile::new(file);
    let (sink, received) = match space_http::spool_body(body, expected.size, sink).await {
        Ok(v) => v,
        Err(e) if e.kind() == std::io::ErrorKind::FileTooLarge => {
            return refused(UpdateError::Refused(
                "the archive is not the one the control plane signed (longer than signed)".into(),
            ));
        }
        Err(e) => {
            return refused(UpdateError::Invalid(format!("receiving the layer: {e}")));
        }
    };
    let got = sink.hash.finalize().to_hex().to_string();
    if received != expected.size || got != expected.digest {
        return refused(UpdateError::Refused(
            "the archive is not the one the control plane signed (tampered or truncated)".into(),
        ));
    }
    let file = match sink.out.into_inner() {
        Ok(f) => f,
        Err(e) => return refused(UpdateError::Internal(format!("spool: {}", e.error()))),
    };
    match transfer::keep(&w, expected.sandbox, file, &got).await {
        Ok(ack) => axum::Json(ack).into_response(),
        Err(e) => refused(e),
    }
}
