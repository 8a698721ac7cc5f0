//! Executions: starting one (allocated, installed, acknowledged running), pausing and
//! resuming it in place, stopping a sandbox, retiring an execution.

use space_identity::ExecutionId;
use space_proto::api::{AckState, InstallExecution, Update};
use space_store::{ExecutionRecord, ExecutionState, SandboxRecord, SandboxState, WorkerRecord};

use super::channel::install_of;
use super::plane::ControlPlane;
use crate::error::ControlError;
use crate::{now_secs, random_bytes};

/// The store key naming the worker that holds a sandbox's writable layer: the worker
/// of the newest execution that was acknowledged running. An execution that failed
/// there later (lost with its worker, or a replacement that never started) leaves the
/// layer there, which is where the reconciler starts the sandbox again.
pub(super) fn layer_key(sandbox: &space_identity::SandboxId) -> String {
    format!("layer:{sandbox}")
}

impl ControlPlane {
    /// Allocates the next generation on `worker`, installs it there and waits for the
    /// worker to acknowledge it running. A failed start consumes its generation.
    pub async fn start_execution(
        &self,
        s: &SandboxRecord,
        w: &WorkerRecord,
    ) -> Result<ExecutionRecord, ControlError> {
        let worker = &w.id;
        // Every execution of a sandbox runs on the substrate of its first: its files
        // are that substrate's (a jail's layer, a VM's disk or memory snapshot).
        if s.generation != space_identity::Generation::NONE {
            if let Ok(last) = self.store.get_execution(&s.id, s.generation).await {
                if last.substrate != w.substrate {
                    return Err(ControlError::Conflict(format!(
                        "sandbox {} runs on the {} substrate; worker {} runs {} sandboxes",
                        s.id, last.substrate, w.id, w.substrate
                    )));
                }
            }
        }
        let now = now_secs() as i64;
        let exe = self
            .store
            .allocate_execution(
                &s.id,
                ExecutionId::from_bytes(random_bytes()),
                worker,
                w.substrate,
                now,
            )
            .await?;
        let ports = self.exposed_ports(&s.id).await?;
        // The policy as stored now, after the allocation, not as `s` had it: a change
        // stored before this read is in the install, one stored after it is pushed to
        // this execution (it is current by then; see `push_network`).
        let network = self.store.get_sandbox(&s.id).await?.network;
        let install = InstallExecution {
            network,
            ..install_of(s, &exe, ports)
        };
        // A worker that lacks the sandbox's template is sent it first (then the
        // install once more): how a migration or a resume reaches a worker without it.
        let outcome = self.deliver_install(w, install).await;
        if let Some(ready) = outcome.as_ref().ok().and_then(|a| a.warm_ready) {
            self.load
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .reported_warm(worker, ready);
        }
        match outcome {
            Ok(ack) if ack.state == AckState::Running => {
                // This worker holds the sandbox's files from now on (the one before it
                // drops its copy only when its execution is retired, after this). A
                // hint for the reconciler: failing to write it fails nothing else.
                let noted = self.store.kv_set(&layer_key(&s.id), worker.as_str()).await;
                if let Err(e) = noted {
                    tracing::warn!(sandbox = %s.id, error = %e, "could not record where the sandbox's files are");
                }
                let now = now_secs() as i64;
                self.store
                    .set_execution_state(
                        &s.id,
                        exe.generation,
                        ExecutionState::Running,
                        Some(ExecutionState::Pending),
                        now,
                    )
                    .await?;
                // What the conditional update wrote: nothing else changes a pending
                // execution.
                Ok(ExecutionRecord {
                    state: ExecutionState::Running,
                    updated_at: now,
                    ..exe
                })
            }
            other => {
                let _ = self
                    .store
                    .set_execution_state(
                        &s.id,
                        exe.generation,
                        ExecutionState::Failed,
                        None,
                        now_secs() as i64,
                    )
                    .await;
                let why = match other {
                    Ok(ack) => ack.message.unwrap_or_else(|| ack.state.to_string()),
                    Err(e) => e.to_string(),
                };
                tracing::warn!(sandbox = %s.id, generation = exe.generation.get(), worker = %worker, reason = %why, "execution failed to start");
                Err(ControlError::BadGateway(format!(
                    "worker {worker} could not start the sandbox: {why}"
                )))
            }
        }
    }

    /// Stops a sandbox: its execution is retired on its worker (which keeps a
    /// tombstone), and it is never served again.
    pub async fn delete_sandbox(&self, s: &SandboxRecord) -> Result<(), ControlError> {
        self.store
            .set_sandbox_state(&s.id, SandboxState::Stopped, None)
            .await?;
        // A stopped sandbox serves no port again: its tokens, links and cookies go.
        self.store.delete_ports(&s.id).await?;
        if let Some(exe) = self.store.current_execution(&s.id).await? {
            self.retire(&exe).await?;
        } else if let Some(last) = self
            .store
            .list_executions(&s.id)
            .await?
            .into_iter()
            .filter(|e| e.state == ExecutionState::Failed)
            .max_by_key(|e| e.generation)
        {
            // Nothing runs (a replacement failed): its worker may keep the sandbox's
            // writable layer for the next start, which the retirement removes.
            self.retire(&last).await?;
        }
        Ok(())
    }

    /// Pauses a running sandbox in place (freezer): the same execution, so
    /// capabilities and routes stay valid; requests wait or get a clear `paused`.
    pub async fn pause(&self, s: &SandboxRecord) -> Result<(), ControlError> {
        self.freeze(s, true).await
    }

    /// Resumes a paused sandbox in place.
    pub async fn resume(&self, s: &SandboxRecord) -> Result<(), ControlError> {
        self.freeze(s, false).await
    }

    async fn freeze(&self, s: &SandboxRecord, pause: bool) -> Result<(), ControlError> {
        let (from, to) = if pause {
            (SandboxState::Running, SandboxState::Paused)
        } else {
            (SandboxState::Paused, SandboxState::Running)
        };
        if s.state == to {
            return Ok(());
        }
        if s.state != from {
            return Err(ControlError::Conflict(format!(
                "the sandbox is {}",
                s.state.as_str()
            )));
        }
        let exe = self.running_execution(&s.id).await?;
        let w = self.store.get_worker(&exe.worker).await?;
        let (sandbox, generation, execution_id) = (s.id, exe.generation, exe.execution_id);
        let update = if pause {
            Update::Pause {
                sandbox,
                generation,
                execution_id,
            }
        } else {
            Update::Resume {
                sandbox,
                generation,
                execution_id,
            }
        };
        let ack = self.deliver(&w, update).await?;
        let expected = if pause {
            AckState::Paused
        } else {
            AckState::Running
        };
        if ack.state != expected {
            return Err(ControlError::BadGateway(format!(
                "worker answered {}",
                ack.state
            )));
        }
        self.store.set_sandbox_state(&s.id, to, Some(from)).await?;
        Ok(())
    }

    /// Retires one execution on its worker and records it.
    pub async fn retire(&self, exe: &ExecutionRecord) -> Result<(), ControlError> {
        let w = self.store.get_worker(&exe.worker).await?;
        let update = Update::Retire {
            sandbox: exe.sandbox,
            generation: exe.generation,
            execution_id: exe.execution_id,
        };
        match self.deliver(&w, update).await {
            Ok(_) => {}
            // A worker that is down learns of the retirement at its next sync, and the
            // capabilities for the execution expire; the record is retired either way.
            Err(e) => {
                tracing::warn!(sandbox = %exe.sandbox, worker = %exe.worker, error = %e, "retirement not delivered")
            }
        }
        self.store
            .set_execution_state(
                &exe.sandbox,
                exe.generation,
                ExecutionState::Retired,
                None,
                now_secs() as i64,
            )
            .await?;
        Ok(())
    }
}
