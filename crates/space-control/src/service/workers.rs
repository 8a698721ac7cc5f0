//! Workers: enrollment (a taken ID needs its credential), their credentials, the sync
//! a (re)starting worker gets, the executions they report lost, and their listing.

use space_identity::{Generation, SandboxId, WorkerId};
use space_proto::api::{self, SignedUpdate, Update, WorkerView};
use space_store::{ExecutionState, SandboxState, WorkerRecord, WorkerState};

use super::channel::{b64, install_of};
use super::plane::ControlPlane;
use crate::auth;
use crate::error::ControlError;
use crate::{now_secs, random_bytes};

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
        // A worker ID keeps its substrate: the sandboxes whose files it holds were
        // made for it (a jail's layer is no VM's disk, and a VM's kept snapshot must
        // never be a jail's files).
        if let Some(w) = existing.as_ref().filter(|w| w.substrate != req.substrate) {
            return Err(ControlError::Conflict(format!(
                "worker {} is enrolled as a {} worker; it cannot come back as a {} one                  (give the worker another ID and data directory)",
                w.id, w.substrate, req.substrate
            )));
        }
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

    /// What a (re)starting worker must hold: the newest bundle, then an install for each
    /// execution the control plane believes runs there, then the templates kept here
    /// (the worker drops the others it holds; see [`Update::Templates`]).
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
            let ports = self.exposed_ports(&s.id).await?;
            updates.push(Update::Install(install_of(&s, &exe, ports)));
        }
        updates.push(self.templates_to_keep().await?);
        self.sign_updates(&w.id, updates).await
    }

    /// A worker reports that an execution it was told to run is gone (its processes did
    /// not survive a restart). The execution fails; a sandbox that should be running
    /// gets a new execution — a new generation, never the old identity.
    pub async fn execution_lost(
        &self,
        w: &WorkerRecord,
        sandbox: &SandboxId,
        generation: Generation,
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
}
