//! The update channel to workers, and the only part of the service that speaks
//! HTTP (as their client): updates signed under each worker's sequence numbers
//! (reserved durably first), delivered with a signed single-use header and
//! acknowledged once durable; the install a worker gets for an execution; key
//! bundles pushed to every active worker; snapshot archives fetched, layers and
//! templates sent.

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD as B64;
use space_identity::{Generation, WorkerId};
use space_proto::api::{InstallExecution, SignedUpdate, Update, UpdateAck, UpdateBody};
use space_store::{ExecutionRecord, SandboxRecord, WorkerRecord, WorkerState};

use super::plane::ControlPlane;
use super::seq_blocks::{SEQ_BLOCK, SeqBlock};
use crate::error::ControlError;
use crate::{now_secs, random_bytes};

/// Largest archive of a writable layer taken or sent (the workers' limit).
const MAX_ARCHIVE: u64 = 1 << 30;

/// URL-safe base64 without padding, the encoding of every binary field sent to workers.
pub(super) fn b64(bytes: &[u8]) -> String {
    B64.encode(bytes)
}

impl ControlPlane {
    /// Signs an update for `worker` under the next number of its update sequence
    /// (reserved durably in the store first — in blocks, see `take_update_seqs` — so
    /// no number is signed twice, also by two replicas or across restarts); the worker
    /// applies each number once.
    pub async fn sign_update(
        &self,
        worker: &WorkerId,
        update: Update,
    ) -> Result<SignedUpdate, ControlError> {
        let mut signed = self.sign_updates(worker, vec![update]).await?;
        signed
            .pop()
            .ok_or_else(|| ControlError::Internal("no update was signed".into()))
    }

    /// Signs several updates for `worker` with consecutive sequence numbers, reserved
    /// in one store write.
    pub async fn sign_updates(
        &self,
        worker: &WorkerId,
        updates: Vec<Update>,
    ) -> Result<Vec<SignedUpdate>, ControlError> {
        let n = updates.len() as u64;
        if n == 0 {
            return Ok(Vec::new());
        }
        let first = self.take_update_seqs(worker, n).await?;
        let issued_at = now_secs();
        let keys = self.keys().await;
        Ok(updates
            .into_iter()
            .zip(first..)
            .map(|(update, seq)| {
                let body = serde_json::to_vec(&UpdateBody {
                    worker: worker.clone(),
                    issued_at,
                    seq,
                    update,
                })
                .unwrap_or_default();
                let signature = keys.anchor.sign_update(&body);
                SignedUpdate {
                    body: b64(&body),
                    signature: b64(&signature),
                }
            })
            .collect())
    }

    /// The first of `n` consecutive sequence numbers of `worker`'s updates, never
    /// signed before: from the numbers reserved ahead when they hold them and are
    /// fresh ([`super::seq_blocks::SEQ_BLOCK_LIFETIME`]), else from a new reservation of [`SEQ_BLOCK`] (or
    /// `n`, if more) in one store write, whose rest is kept for the updates that
    /// follow. A burst of updates costs one reservation per block, not one each.
    /// Several replicas reserve from the one counter: their blocks never overlap.
    /// Each worker's numbers have a lock of their own: a reservation for one worker
    /// (a store write) holds up no update of another.
    async fn take_update_seqs(&self, worker: &WorkerId, n: u64) -> Result<u64, ControlError> {
        let lock = self.seq_blocks.of(worker);
        let mut block = lock.lock().await;
        let now = std::time::Instant::now();
        if let Some(first) = block.as_mut().and_then(|b| b.take(n, now)) {
            return Ok(first);
        }
        // Reserved under the worker's lock: its updates waiting meanwhile take from
        // this block.
        let size = n.max(SEQ_BLOCK);
        let last = self.store.reserve_update_seqs(worker, size).await?;
        let first = last + 1 - size;
        *block = Some(SeqBlock::new(first + n, last + 1, now));
        Ok(first)
    }

    /// Pushes one signed update to a worker and returns its acknowledgement, which the
    /// worker sends only after the update is durable.
    pub async fn deliver(
        &self,
        w: &WorkerRecord,
        update: Update,
    ) -> Result<UpdateAck, ControlError> {
        match self.deliver_answer(w, update).await? {
            Ok(ack) => Ok(ack),
            Err((status, body)) => Err(refused(w, status, &body)),
        }
    }

    /// As [`Self::deliver`], with a worker's refusal given back as its status and
    /// body (for the caller that acts on one: an install of a template it lacks).
    pub(super) async fn deliver_answer(
        &self,
        w: &WorkerRecord,
        update: Update,
    ) -> Result<Result<UpdateAck, (axum::http::StatusCode, bytes::Bytes)>, ControlError> {
        let signed = self.sign_update(&w.id, update).await?;
        let url = format!("{}/internal/v1/updates", w.url);
        let body = serde_json::to_vec(&signed)
            .map_err(|e| ControlError::Internal(format!("encode update: {e}")))?;
        let delivery = self.delivery_header(&w.id, &body).await?;
        let answer = self
            .http
            .call(
                axum::http::Method::POST,
                &url,
                &[
                    ("content-type", "application/json"),
                    (space_proto::api::DELIVERY_HEADER, delivery.as_str()),
                ],
                bytes::Bytes::from(body),
            )
            .await
            .map_err(|e| ControlError::BadGateway(format!("worker {}: {e}", w.id)))?;
        if !answer.status.is_success() {
            return Ok(Err((answer.status, answer.body)));
        }
        serde_json::from_slice(&answer.body)
            .map(Ok)
            .map_err(|e| ControlError::BadGateway(format!("worker {}: bad ack: {e}", w.id)))
    }

    /// Orders `w` to freeze an execution and archive its writable layer (`snapshot`,
    /// signed for it), and streams the archive it answers with into `sink` (at most
    /// [`MAX_ARCHIVE`] bytes). Returns the sink and the archive's size.
    pub(super) async fn fetch_layer(
        &self,
        w: &WorkerRecord,
        snapshot: &SignedUpdate,
        sink: space_http::HashingFile,
    ) -> Result<(space_http::HashingFile, u64), ControlError> {
        let order = serde_json::to_vec(snapshot).unwrap_or_default();
        let (answer, spooled) = self
            .http
            .call_to_sink(
                axum::http::Method::POST,
                &format!("{}/internal/v1/snapshot", w.url),
                &[("content-type", "application/json")],
                bytes::Bytes::from(order),
                MAX_ARCHIVE,
                sink,
            )
            .await
            .map_err(|e| ControlError::BadGateway(format!("snapshot on {}: {e}", w.id)))?;
        spooled.ok_or_else(|| {
            let message = format!(
                "snapshot on {}: {} {}",
                w.id,
                answer.status,
                String::from_utf8_lossy(&answer.body)
            );
            // A layer over the limit is the sandbox's doing, not a failure of the platform.
            if answer.status == axum::http::StatusCode::PAYLOAD_TOO_LARGE {
                ControlError::TooLarge(message)
            } else {
                ControlError::BadGateway(message)
            }
        })
    }

    /// Sends `w` the archive `file` (`size` bytes) under `layer`, its signed digest
    /// and size, which the worker checks before unpacking it.
    pub(super) async fn send_layer(
        &self,
        w: &WorkerRecord,
        layer: &SignedUpdate,
        file: std::fs::File,
        size: u64,
    ) -> Result<(), ControlError> {
        let header = b64(&serde_json::to_vec(layer).unwrap_or_default());
        let placed = self
            .http
            .call_with_file(
                axum::http::Method::POST,
                &format!("{}/internal/v1/layers", w.url),
                &[
                    ("space-update", header.as_str()),
                    ("content-type", "application/x-tar"),
                ],
                file,
                size,
            )
            .await
            .map_err(|e| ControlError::BadGateway(format!("layer to {}: {e}", w.id)))?;
        if !placed.status.is_success() {
            return Err(ControlError::BadGateway(format!(
                "layer to {}: {} {}",
                w.id,
                placed.status,
                String::from_utf8_lossy(&placed.body)
            )));
        }
        Ok(())
    }

    /// Sends `w` the template bundle `file` (`size` bytes) under `template`, its
    /// signed digest and length, which the worker checks before reading the body.
    pub(super) async fn send_template(
        &self,
        w: &WorkerRecord,
        template: &SignedUpdate,
        file: std::fs::File,
        size: u64,
    ) -> Result<(), ControlError> {
        let header = b64(&serde_json::to_vec(template).unwrap_or_default());
        let placed = self
            .http
            .call_with_file(
                axum::http::Method::POST,
                &format!("{}/internal/v1/templates", w.url),
                &[
                    ("space-update", header.as_str()),
                    ("content-type", "application/x-tar"),
                ],
                file,
                size,
            )
            .await
            .map_err(|e| ControlError::BadGateway(format!("template to {}: {e}", w.id)))?;
        if !placed.status.is_success() {
            return Err(ControlError::BadGateway(format!(
                "template to {}: {} {}",
                w.id,
                placed.status,
                String::from_utf8_lossy(&placed.body)
            )));
        }
        Ok(())
    }

    /// The signed [`space_proto::api::Delivery`] of a request body for worker `to`: it
    /// lets the worker authenticate the request before reading the body.
    pub async fn delivery_header(
        &self,
        to: &WorkerId,
        body: &[u8],
    ) -> Result<String, ControlError> {
        let descriptor = serde_json::to_vec(&space_proto::api::Delivery {
            worker: to.to_string(),
            issued_at: now_secs(),
            size: body.len() as u64,
            digest: blake3::hash(body).to_hex().to_string(),
            nonce: random_bytes::<16>()
                .iter()
                .map(|b| format!("{b:02x}"))
                .collect(),
        })
        .map_err(|e| ControlError::Internal(format!("encode delivery: {e}")))?;
        let keys = self.keys().await;
        let signature = keys.anchor.sign_delivery(&descriptor);
        Ok(format!("{}.{}", b64(&descriptor), b64(&signature)))
    }

    /// Pushes the newest bundle to every active worker; returns the workers that did
    /// not acknowledge it.
    pub async fn push_bundle(
        &self,
        bundle: &space_identity::SignedKeyBundle,
    ) -> Result<Vec<WorkerId>, ControlError> {
        let mut failed = Vec::new();
        for w in self.store.list_workers().await? {
            if w.state != WorkerState::Active {
                continue;
            }
            let update = Update::Bundle {
                bundle: b64(bundle.as_bytes()),
            };
            if let Err(e) = self.deliver(&w, update).await {
                tracing::warn!(worker = %w.id, error = %e, "bundle not acknowledged");
                failed.push(w.id);
            }
        }
        Ok(failed)
    }
}

/// A worker's refusal of an update, as the error of the delivery.
pub(super) fn refused(
    w: &WorkerRecord,
    status: axum::http::StatusCode,
    body: &[u8],
) -> ControlError {
    let text = String::from_utf8_lossy(body);
    ControlError::BadGateway(format!("worker {} answered {status}: {text}", w.id))
}

/// What a worker must run for execution `exe` of sandbox `s`.
pub(super) fn install_of(
    s: &SandboxRecord,
    exe: &ExecutionRecord,
    ports: Vec<space_proto::api::ports::ExposedPort>,
) -> InstallExecution {
    InstallExecution {
        sandbox: s.id,
        generation: exe.generation,
        execution_id: exe.execution_id,
        substrate: exe.substrate,
        activation: exe.activation,
        template: s.template.clone(),
        env: s.env.clone(),
        limits: crate::limits::of_store(s.limits.as_ref()),
        // A sandbox's first execution starts empty; every later one continues its
        // files, which must be on the worker (kept there, or sent before the install).
        needs_layer: exe.generation > Generation::FIRST,
        ports,
        network: s.network.clone(),
    }
}
