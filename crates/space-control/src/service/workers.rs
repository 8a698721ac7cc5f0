//! Workers and the update channel: enrollment (a taken ID needs its credential),
//! signed updates with their per-worker sequence numbers, delivery with a signed
//! single-use header, the sync a (re)starting worker gets, lost executions, key
//! bundles and their rotation.

use super::*;

impl ControlPlane {
    /// Registers a worker presenting the enrollment secret. A worker ID that is
    /// enrolled already is re-enrolled only by the worker holding its credential (a
    /// restart): the enrollment secret alone enrolls new IDs only, so it cannot take
    /// over a worker and the sandboxes (and environments) placed on it. A re-enrolled
    /// worker keeps its credential, so an answer lost on the way cannot lock it out.
    pub async fn enroll(
        &self,
        req: &api::EnrollRequest,
    ) -> Result<api::EnrollResponse, ControlError> {
        let expected = blake3::hash(self.enroll_secret.as_bytes());
        if blake3::hash(req.enroll_secret.as_bytes()) != expected {
            return Err(ControlError::Forbidden("wrong enrollment secret".into()));
        }
        if !(req.url.starts_with("http://") || req.url.starts_with("https://"))
            || req.url.len() > 512
        {
            return Err(ControlError::BadRequest(
                "url must be an http(s) URL".into(),
            ));
        }
        let existing = match self.store.get_worker(&req.worker).await {
            Ok(w) => Some(w),
            Err(space_store::StoreError::NotFound(_)) => None,
            Err(e) => return Err(e.into()),
        };
        let taken = || {
            ControlError::Forbidden(format!(
                "worker {} is enrolled already: re-enrolling it needs its own credential \
                 (kept in its records); the enrollment secret alone only enrolls a new worker ID",
                req.worker
            ))
        };
        let (credential, proven) = match (&existing, &req.credential) {
            (None, _) => (b64(&random_bytes::<32>()), None),
            (Some(w), Some(presented))
                if presented.len() <= 128
                    && auth::hashes_equal(
                        &w.credential_hash,
                        blake3::hash(presented.as_bytes()).as_bytes(),
                    ) =>
            {
                (presented.clone(), Some(w.credential_hash))
            }
            (Some(_), _) => return Err(taken()),
        };
        let now = now_secs() as i64;
        let record = WorkerRecord {
            id: req.worker.clone(),
            url: req.url.trim_end_matches('/').to_owned(),
            substrate: req.substrate,
            capacity: req.capacity.clamp(1, 100_000),
            state: WorkerState::Active,
            credential_hash: *blake3::hash(credential.as_bytes()).as_bytes(),
            registered_at: now,
            last_seen: now,
        };
        match self.store.enroll_worker(&record, proven).await {
            Ok(_) => {}
            // Another enrollment of this ID won in between.
            Err(space_store::StoreError::Conflict(_) | space_store::StoreError::NotFound(_)) => {
                return Err(taken());
            }
            Err(e) => return Err(e.into()),
        }
        let keys = self.keys().await;
        Ok(api::EnrollResponse {
            credential,
            anchor: b64(keys.anchor.anchor().as_bytes()),
        })
    }

    /// Checks a worker's credential.
    pub async fn authenticate_worker(
        &self,
        id: &WorkerId,
        credential: &str,
    ) -> Result<WorkerRecord, ControlError> {
        let w = self
            .store
            .get_worker(id)
            .await
            .map_err(|_| ControlError::Unauthorized)?;
        if !auth::hashes_equal(
            &w.credential_hash,
            blake3::hash(credential.as_bytes()).as_bytes(),
        ) {
            return Err(ControlError::Unauthorized);
        }
        Ok(w)
    }

    /// Signs an update for `worker` under the next number of its update sequence
    /// (reserved durably in the store first, so no number is signed twice, also by
    /// two replicas or across restarts); the worker applies each number once.
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
        let last = self.store.reserve_update_seqs(worker, n).await?;
        let issued_at = now_secs();
        let keys = self.keys().await;
        Ok(updates
            .into_iter()
            .zip(last + 1 - n..)
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

    /// Pushes one signed update to a worker and returns its acknowledgement, which the
    /// worker sends only after the update is durable.
    pub async fn deliver(
        &self,
        w: &WorkerRecord,
        update: Update,
    ) -> Result<UpdateAck, ControlError> {
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
            let text = String::from_utf8_lossy(&answer.body);
            return Err(ControlError::BadGateway(format!(
                "worker {} answered {}: {text}",
                w.id, answer.status
            )));
        }
        serde_json::from_slice(&answer.body)
            .map_err(|e| ControlError::BadGateway(format!("worker {}: bad ack: {e}", w.id)))
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

    /// What a (re)starting worker must hold: the newest bundle, then an install for each
    /// execution the control plane believes runs there.
    pub async fn sync_for(&self, w: &WorkerRecord) -> Result<Vec<SignedUpdate>, ControlError> {
        self.store.touch_worker(&w.id, now_secs() as i64).await?;
        let keys = self.keys().await;
        let mut updates = vec![Update::Bundle {
            bundle: b64(keys.bundle.as_bytes()),
        }];
        for exe in self
            .store
            .executions_on_worker(&w.id, &[ExecutionState::Pending, ExecutionState::Running])
            .await?
        {
            let Ok(s) = self.store.get_sandbox(&exe.sandbox).await else {
                continue;
            };
            updates.push(Update::Install(install_of(&s, &exe)));
        }
        self.sign_updates(&w.id, updates).await
    }

    /// A worker reports that an execution it was told to run is gone (its processes did
    /// not survive a restart). The execution fails; a sandbox that should be running
    /// gets a new execution — a new generation, never the old identity.
    pub async fn execution_lost(
        &self,
        w: &WorkerRecord,
        sandbox: &SandboxId,
        generation: u64,
    ) -> Result<(), ControlError> {
        let exe = self.store.get_execution(sandbox, generation).await?;
        if exe.worker != w.id {
            return Err(ControlError::Forbidden(
                "not this worker's execution".into(),
            ));
        }
        self.store
            .set_execution_state(
                sandbox,
                generation,
                ExecutionState::Failed,
                None,
                now_secs() as i64,
            )
            .await?;
        let s = self.store.get_sandbox(sandbox).await?;
        let current = self.store.current_execution(sandbox).await?;
        let superseded = current.is_some_and(|c| c.generation > generation);
        if matches!(s.state, SandboxState::Running | SandboxState::Starting) && !superseded {
            let _busy = self.transition(s.id)?;
            // Starting until the replacement runs: no capability is issued meanwhile.
            self.store
                .set_sandbox_state(sandbox, SandboxState::Starting, Some(s.state))
                .await?;
            let started = self.start_execution(&s, w).await;
            if started.is_ok() {
                self.store
                    .set_sandbox_state(sandbox, SandboxState::Running, Some(SandboxState::Starting))
                    .await?;
            }
            // Otherwise it stays `starting`: its worker keeps the writable layer of an
            // execution that never ran, and the reconciler starts the sandbox again
            // there (`reconcile_transitions`) — stopping it lost acknowledged files.
            started?;
        }
        Ok(())
    }

    /// Lists workers with their load.
    pub async fn workers(&self) -> Result<Vec<WorkerView>, ControlError> {
        let load = self.store.count_active_by_worker().await?;
        Ok(self
            .store
            .list_workers()
            .await?
            .into_iter()
            .map(|w| WorkerView {
                sandboxes: load.get(&w.id).copied().unwrap_or(0) as u32,
                address: w.url,
                state: w.state.as_str().to_owned(),
                capacity: w.capacity,
                substrate: w.substrate,
                id: w.id,
            })
            .collect())
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

    /// Rotates the capability signing key: publish the new key to every receiver, and
    /// only then sign with it; the old key retires after the maximum capability
    /// lifetime plus skew.
    pub async fn rotate_keys(&self) -> Result<String, ControlError> {
        let now = now_secs() as i64;
        let keys = self.keys().await;
        let (record, _, bundle) = keyring::begin_rotation(&self.store, &keys.anchor, now).await?;
        let failed = self.push_bundle(&bundle).await?;
        space_http::crash::crash_point("control.rotate.published");
        if !failed.is_empty() {
            let names: Vec<String> = failed.iter().map(ToString::to_string).collect();
            return Err(ControlError::Unavailable(format!(
                "new key {} published but not acknowledged by {}; it is not used yet — retry when they are back or drain them",
                record.key_id,
                names.join(", ")
            )));
        }
        keyring::activate(&self.store, &record.key_id, now).await?;
        space_http::crash::crash_point("control.rotate.activated");
        // The retiring key's shortened validity must reach verifiers too.
        let (_, bundle) = keyring::publish_bundle(&self.store, &keys.anchor, now).await?;
        self.push_bundle(&bundle).await?;
        self.reload_keys().await?;
        Ok(record.key_id)
    }

    /// Drops keys whose retirement grace has passed, and pushes the smaller bundle.
    pub async fn retire_old_keys(&self) -> Result<(), ControlError> {
        let now = now_secs() as i64;
        if keyring::retire_expired(&self.store, now).await? {
            let keys = self.keys().await;
            let (_, bundle) = keyring::publish_bundle(&self.store, &keys.anchor, now).await?;
            self.push_bundle(&bundle).await?;
            self.reload_keys().await?;
        }
        Ok(())
    }
}
