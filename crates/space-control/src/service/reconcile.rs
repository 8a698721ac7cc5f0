//! Work the control plane does on its own: finishing transitions a dead replica left,
//! TTL expiry, gauges.

use std::collections::BTreeMap;

use space_identity::{Generation, SandboxId, WorkerId};
use space_proto::api::Update;
use space_store::{ExecutionRecord, ExecutionState, SandboxRecord, SandboxState, WorkerState};

use super::executions::layer_key;
use super::plane::ControlPlane;
use super::sandboxes::ttl_pause_key;
use super::transitions::lease_key;
use crate::error::ControlError;
use crate::now_secs;

impl ControlPlane {
    /// Finishes transitions that a crash interrupted (a control plane killed during a
    /// migration or a start): every execution still pending is failed (its worker,
    /// not seeing it listed any more, retires it at its next sync), every running
    /// execution but the newest is retired, the newest is thawed in case a snapshot
    /// froze it, and the sandbox is running again — or stopped when nothing runs. A
    /// transition is taken over only when neither its newest execution nor its lease
    /// (renewed by the replica running it) has changed for the grace period, so one
    /// still under way elsewhere, however slow, is left alone.
    pub async fn reconcile_transitions(&self) -> Result<(), ControlError> {
        let now = now_secs() as i64;
        for t in self.store.list_tenants().await? {
            for s in self.store.list_sandboxes(&t.id).await? {
                if !matches!(s.state, SandboxState::Migrating | SandboxState::Starting) {
                    continue;
                }
                let Ok(_busy) = self.busy(s.id) else {
                    continue;
                };
                let execs = self.store.list_executions(&s.id).await?;
                let newest = execs
                    .iter()
                    .map(|e| e.updated_at)
                    .max()
                    .unwrap_or(s.created_at);
                let leased = self
                    .store
                    .kv_get(&lease_key(&s.id))
                    .await?
                    .and_then(|v| v.parse::<i64>().ok())
                    .unwrap_or(0);
                // Whole seconds on both sides: a lease renewed a moment ago can read
                // as a full second old, hence `<=`.
                if now - newest.max(leased) <= self.reconcile_after_secs {
                    continue;
                }
                tracing::warn!(sandbox = %s.id, state = s.state.as_str(), "finishing an interrupted transition");
                for e in execs.iter().filter(|e| e.state == ExecutionState::Pending) {
                    self.store
                        .set_execution_state(&s.id, e.generation, ExecutionState::Failed, None, now)
                        .await?;
                }
                let mut running: Vec<&ExecutionRecord> = execs
                    .iter()
                    .filter(|e| e.state == ExecutionState::Running)
                    .collect();
                running.sort_by_key(|e| e.generation);
                let Some(current) = running.pop() else {
                    self.start_again_or_stop(&s, &execs).await?;
                    continue;
                };
                for old in running {
                    self.retire(old).await?;
                }
                let thaw = Update::Unfreeze {
                    sandbox: s.id,
                    generation: current.generation,
                    execution_id: current.execution_id,
                };
                let thawed = match self.store.get_worker(&current.worker).await {
                    Ok(w) => self.deliver(&w, thaw).await,
                    Err(e) => Err(e.into()),
                };
                if let Err(e) = thawed {
                    // Its worker is not back yet: try again at the next round.
                    tracing::warn!(sandbox = %s.id, error = %e, "could not thaw after an interrupted transition");
                    continue;
                }
                // Running again: a snapshot stored before the crash is stale.
                self.forget_snapshot(&s.id).await;
                self.store
                    .set_sandbox_state(&s.id, SandboxState::Running, Some(s.state))
                    .await?;
            }
        }
        Ok(())
    }

    /// A sandbox in a transition that nothing runs any more: started again on the
    /// worker that keeps its writable layer, or stopped (see [`after_failed_start`]).
    async fn start_again_or_stop(
        &self,
        s: &SandboxRecord,
        execs: &[ExecutionRecord],
    ) -> Result<(), ControlError> {
        let key = restart_key(&s.id);
        let tried = self
            .store
            .kv_get(&key)
            .await?
            .and_then(|v| v.parse::<u32>().ok())
            .unwrap_or(0);
        let layer_at = self
            .store
            .kv_get(&layer_key(&s.id))
            .await?
            .and_then(|w| w.parse::<WorkerId>().ok());
        let on = match after_failed_start(s.state, execs, tried, layer_at) {
            AfterFailedStart::Stop => {
                self.store.kv_set(&key, "").await?;
                self.store
                    .set_sandbox_state(&s.id, SandboxState::Stopped, Some(s.state))
                    .await?;
                return Ok(());
            }
            AfterFailedStart::StartOn(w) => w,
        };
        let w = match self.store.get_worker(&on).await {
            Ok(w) if w.state == WorkerState::Active => w,
            // Not back yet: its layer waits there; the next round tries again.
            _ => return Ok(()),
        };
        self.store.kv_set(&key, &(tried + 1).to_string()).await?;
        tracing::warn!(sandbox = %s.id, worker = %w.id, attempt = tried + 1, "starting a sandbox again after its replacement failed");
        if self.start_execution(s, &w).await.is_ok() {
            self.store.kv_set(&key, "").await?;
            self.store
                .set_sandbox_state(&s.id, SandboxState::Running, Some(s.state))
                .await?;
        }
        Ok(())
    }

    /// Stops sandboxes past their TTL.
    pub async fn expire_sandboxes(&self) -> Result<(), ControlError> {
        let now = now_secs() as i64;
        for t in self.store.list_tenants().await? {
            for s in self.store.list_sandboxes(&t.id).await? {
                if s.state == SandboxState::Stopped || s.expires_at.is_none_or(|e| e > now) {
                    continue;
                }
                match self.store.kv_get(&ttl_pause_key(&s.id)).await?.as_deref() {
                    // Asked to pause at the TTL, once: a later resume keeps it running.
                    Some("pause") => {
                        if s.state == SandboxState::Running {
                            tracing::info!(sandbox = %s.id, "ttl reached: pausing");
                            self.pause(&s).await?;
                            self.store.kv_set(&ttl_pause_key(&s.id), "done").await?;
                        }
                        continue;
                    }
                    Some(_) => continue,
                    None => {}
                }
                tracing::info!(sandbox = %s.id, "ttl reached: stopping");
                self.delete_sandbox(&s).await?;
            }
        }
        Ok(())
    }

    /// Refreshes the sandboxes-by-state gauges.
    pub async fn refresh_gauges(&self) {
        let mut counts: BTreeMap<&'static str, i64> = BTreeMap::new();
        for st in SandboxState::ALL {
            counts.insert(st.as_str(), 0);
        }
        let Ok(tenants) = self.store.list_tenants().await else {
            return;
        };
        for t in tenants {
            if let Ok(list) = self.store.list_sandboxes(&t.id).await {
                for s in list {
                    *counts.entry(s.state.as_str()).or_default() += 1;
                }
            }
        }
        for (state, n) in counts {
            self.metrics
                .sandboxes
                .get_or_create(&crate::metrics::StateLabels {
                    state: state.to_owned(),
                })
                .set(n);
        }
    }
}

/// Starts the reconciler makes for a sandbox whose replacement failed, before it stops
/// it.
pub(crate) const MAX_RESTARTS: u32 = 8;

fn restart_key(sandbox: &SandboxId) -> String {
    format!("restarts:{sandbox}")
}

/// What the reconciler does with a sandbox in a transition that nothing runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum AfterFailedStart {
    /// Start a new execution on this worker: the one that holds the sandbox's writable
    /// layer (a worker never discards the layer of an execution that was lost or did
    /// not run; it refuses, `layer_missing`, an install whose layer it does not hold).
    StartOn(WorkerId),
    /// Nothing to come back to, or tried often enough.
    Stop,
}

/// Pure: `state` is the sandbox's (`starting` or `migrating`), `execs` its executions
/// (none running), `tried` the starts the reconciler made already, `layer_at` the
/// worker of the newest execution ever acknowledged running (see [`layer_key`]).
///
/// A sandbox that ever ran has acknowledged files on `layer_at`: it is started again
/// there, up to [`MAX_RESTARTS`] times — also a migration that lost its source while
/// its target never started (the source's worker kept the layer). Without `layer_at`
/// (a sandbox recorded before it was kept), a `starting` sandbox whose newest
/// execution replaced an earlier one is started on that execution's worker. A first
/// execution that never ran (a create cut off) is stopped: it has no files.
pub(crate) fn after_failed_start(
    state: SandboxState,
    execs: &[ExecutionRecord],
    tried: u32,
    layer_at: Option<WorkerId>,
) -> AfterFailedStart {
    if tried >= MAX_RESTARTS {
        return AfterFailedStart::Stop;
    }
    if let Some(w) = layer_at {
        return AfterFailedStart::StartOn(w);
    }
    let newest = execs.iter().max_by_key(|e| e.generation);
    match newest {
        Some(e) if state == SandboxState::Starting && e.generation > Generation::FIRST => {
            AfterFailedStart::StartOn(e.worker.clone())
        }
        _ => AfterFailedStart::Stop,
    }
}

#[cfg(test)]
mod tests {
    use space_identity::ExecutionId;

    use super::*;

    fn exe(generation: u64, worker: &str, state: ExecutionState) -> ExecutionRecord {
        ExecutionRecord {
            sandbox: SandboxId::from_bytes([3; 16]),
            generation: Generation(generation),
            execution_id: ExecutionId::from_bytes([generation as u8; 16]),
            worker: worker.parse().unwrap(),
            substrate: space_identity::Substrate::Jail,
            activation: 1,
            pod_uid: None,
            state,
            created_at: 0,
            updated_at: 0,
        }
    }

    #[test]
    fn a_lost_sandbox_whose_replacement_failed_starts_again_where_its_layer_is() {
        let execs = [
            exe(1, "w1", ExecutionState::Failed),
            exe(2, "w2", ExecutionState::Failed),
        ];
        assert_eq!(
            after_failed_start(SandboxState::Starting, &execs, 0, None),
            AfterFailedStart::StartOn("w2".parse().unwrap())
        );
        assert_eq!(
            after_failed_start(SandboxState::Starting, &execs, MAX_RESTARTS - 1, None),
            AfterFailedStart::StartOn("w2".parse().unwrap())
        );
    }

    #[test]
    fn a_sandbox_starts_again_on_the_worker_that_holds_its_layer_not_where_it_last_failed() {
        // Ran on w1 (generation 2), lost there; its replacement on w2 never started.
        let execs = [
            exe(1, "w1", ExecutionState::Retired),
            exe(2, "w1", ExecutionState::Failed),
            exe(3, "w2", ExecutionState::Failed),
        ];
        let w1: WorkerId = "w1".parse().unwrap();
        assert_eq!(
            after_failed_start(SandboxState::Starting, &execs, 0, Some(w1.clone())),
            AfterFailedStart::StartOn(w1.clone())
        );
        // A migration whose source was lost while its target never started: the
        // source's worker kept the files.
        assert_eq!(
            after_failed_start(SandboxState::Migrating, &execs, 0, Some(w1.clone())),
            AfterFailedStart::StartOn(w1.clone())
        );
        // A first execution that ran and was lost.
        let first = [exe(1, "w1", ExecutionState::Failed)];
        assert_eq!(
            after_failed_start(SandboxState::Starting, &first, 0, Some(w1.clone())),
            AfterFailedStart::StartOn(w1.clone())
        );
        assert_eq!(
            after_failed_start(SandboxState::Migrating, &execs, MAX_RESTARTS, Some(w1)),
            AfterFailedStart::Stop
        );
    }

    #[test]
    fn a_cut_off_create_a_lost_migration_or_too_many_tries_stop_the_sandbox() {
        let first = [exe(1, "w1", ExecutionState::Failed)];
        assert_eq!(
            after_failed_start(SandboxState::Starting, &first, 0, None),
            AfterFailedStart::Stop
        );
        let two = [
            exe(1, "w1", ExecutionState::Failed),
            exe(2, "w1", ExecutionState::Failed),
        ];
        assert_eq!(
            after_failed_start(SandboxState::Migrating, &two, 0, None),
            AfterFailedStart::Stop
        );
        assert_eq!(
            after_failed_start(SandboxState::Starting, &two, MAX_RESTARTS, None),
            AfterFailedStart::Stop
        );
        assert_eq!(
            after_failed_start(SandboxState::Starting, &[], 0, None),
            AfterFailedStart::Stop
        );
    }
}
