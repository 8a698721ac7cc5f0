//! The HTTP side of snapshots and migrations: `POST /internal/v1/snapshot` and
//! `POST /internal/v1/layers`.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD as B64;
use space_proto::api::{SignedUpdate, Update, UpdateAck};

use crate::daemon::launch;
use crate::daemon::state::Worker;
use crate::daemon::updates::{self, UpdateError};

fn fail(e: UpdateError) -> Response {
    let status = StatusCode::from_u16(e.status).unwrap_or(StatusCode::BAD_REQUEST);
    (
        status,
        axum::Json(serde_json::json!({"error": "update_refused", "message": e.message})),
    )
        .into_response()
}

fn refused(status: u16, message: impl Into<String>) -> Response {
    fail(UpdateError {
        status,
        message: message.into(),
    })
}

fn too_large(message: String) -> Response {
    (
        StatusCode::PAYLOAD_TOO_LARGE,
        axum::Json(serde_json::json!({"error": "too_large", "message": message})),
    )
        .into_response()
}

/// Where archives wait on their way in or out (files without a name: nothing is
/// left behind).
fn spool_dir(w: &Worker) -> std::path::PathBuf {
    w.data_dir.join("spool")
}

/// Freezes the execution the signed update names and answers with its writable
/// layer; header `space-snapshot-digest` holds the BLAKE3 digest. The archive is
/// written to a file first (the limit enforced while it is written, a file too
/// large for it refused before it is read) and sent from there.
pub async fn snapshot(State(w): State<Arc<Worker>>, body: Bytes) -> Response {
    let Ok(signed) = serde_json::from_slice::<SignedUpdate>(&body) else {
        return refused(400, "invalid signed update");
    };
    let (sandbox, generation, execution_id) = match updates::verify(&w, &signed) {
        Ok((
            _,
            Update::Snapshot {
                sandbox,
                generation,
                execution_id,
            },
        )) => (sandbox, generation, execution_id),
        Ok(_) => return refused(400, "not a snapshot update"),
        Err(e) => return fail(e),
    };
    let _applying = w.update_lock.write().await;
    if let Err(e) = updates::freeze(&w, &sandbox, generation, execution_id, true).await {
        return fail(e);
    }
    w.set_snapshot_frozen(&sandbox, generation, true);
    let Some(upper) = w
        .slot(&sandbox)
        .and_then(|s| s.record.handle.as_ref().map(|h| h.upper_dir.clone()))
    else {
        return refused(409, "execution has no layer");
    };
    let spool = spool_dir(&w);
    let packed = tokio::task::spawn_blocking(move || {
        super::pack_to_temp(&upper, &spool, super::MAX_ARCHIVE)
    })
    .await;
    match packed {
        Ok(Ok((file, packed))) => (
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
        Ok(Err(e)) if e.kind() == std::io::ErrorKind::FileTooLarge => too_large(e.to_string()),
        Ok(Err(e)) => refused(500, format!("archive: {e}")),
        Err(e) => refused(500, e.to_string()),
    }
}

/// Receives a sandbox's writable layer for its next execution here. The signed
/// update (header `space-update`) names the archive's digest and size and is
/// verified before a byte of the body is read; the body is then streamed to a file
/// (refused past the signed size), its digest checked over the bytes received, and
/// only then unpacked.
pub async fn layer(
    State(w): State<Arc<Worker>>,
    headers: HeaderMap,
    body: axum::body::Body,
) -> Response {
    let signed: Option<SignedUpdate> = headers
        .get("space-update")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| B64.decode(v).ok())
        .and_then(|b| serde_json::from_slice(&b).ok());
    let Some(signed) = signed else {
        return refused(400, "header space-update must hold a signed layer update");
    };
    let (sandbox, digest, size) = match updates::verify(&w, &signed) {
        Ok((
            _,
            Update::Layer {
                sandbox,
                digest,
                size,
            },
        )) => (sandbox, digest, size),
        Ok(_) => return refused(400, "not a layer update"),
        Err(e) => return fail(e),
    };
    if size > super::MAX_ARCHIVE {
        return too_large(format!(
            "the layer is {size} bytes, over the limit of {} bytes",
            super::MAX_ARCHIVE
        ));
    }
    let file = match super::tempfile_in(&spool_dir(&w)) {
        Ok(f) => f,
        Err(e) => return refused(500, format!("spool: {e}")),
    };
    let sink = space_http::HashingFile::new(file);
    let (sink, received) = match space_http::spool_body(body, size, sink).await {
        Ok(v) => v,
        Err(e) if e.kind() == std::io::ErrorKind::FileTooLarge => {
            return refused(
                403,
                "the archive is not the one the control plane signed (longer than signed)",
            );
        }
        Err(e) => return refused(400, format!("receiving the layer: {e}")),
    };
    let got = sink.hash.finalize().to_hex().to_string();
    if received != size || got != digest {
        return refused(
            403,
            "the archive is not the one the control plane signed (tampered or truncated)",
        );
    }
    let mut file = match sink.out.into_inner() {
        Ok(f) => f,
        Err(e) => return refused(500, format!("spool: {}", e.error())),
    };
    let _applying = w.update_lock.write().await;
    let dest = launch::kept_layer(&w.data_dir, &sandbox);
    let incoming = dest.with_extension(format!("incoming-{}", got.get(..12).unwrap_or("x")));
    let result = tokio::task::spawn_blocking(move || {
        use std::io::Seek;
        file.seek(std::io::SeekFrom::Start(0))?;
        let _ = crate::substrate::tree::remove_tree(&incoming);
        if let Some(parent) = incoming.parent() {
            std::fs::create_dir_all(parent)?;
        }
        // A kept layer is a sandbox disk with the layer as `upper/` (a subvolume on
        // the disk volume: see `substrate::jail::disk`).
        let upper = crate::substrate::jail::disk::new_layer(&incoming, None)
            .map_err(std::io::Error::other)?;
        let unpacked = super::unpack(std::io::BufReader::new(file), &upper);
        if let Err(e) = unpacked {
            let _ = crate::substrate::tree::remove_tree(&incoming);
            return Err(e);
        }
        let _ = crate::substrate::tree::remove_tree(&dest);
        std::fs::rename(&incoming, &dest)
    })
    .await;
    match result {
        Ok(Ok(())) => axum::Json(UpdateAck {
            state: "installed".into(),
            message: None,
            warm_ready: None,
            bundle_version: w
                .keys
                .read()
                .ok()
                .and_then(|k| k.as_ref().map(|k| k.version()))
                .unwrap_or(0),
        })
        .into_response(),
        Ok(Err(e)) => refused(400, format!("unpack: {e}")),
        Err(e) => refused(500, e.to_string()),
    }
}
