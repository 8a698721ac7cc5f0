//! Transitions and their leases: one lifecycle operation per sandbox at a time in this
//! process, a lease in the store renewed while a transition runs (so another
//! replica's reconciler leaves it alone), and the step it is at, for progress.

use space_identity::SandboxId;

use super::plane::ControlPlane;
use crate::error::ControlError;
use crate::now_secs;

/// Marks a sandbox busy for as long as it lives; with a lease, also renews the
/// sandbox's lease in the store so that other replicas' reconcilers leave it alone.
pub(super) struct Busy<'a>(
    &'a ControlPlane,
    SandboxId,
    Option<tokio::task::AbortHandle>,
);

impl Drop for Busy<'_> {
    fn drop(&mut self) {
        if let Some(lease) = self.2.take() {
            lease.abort();
        }
        if let Ok(mut b) = self.0.busy.lock() {
            b.remove(&self.1);
        }
    }
}

impl ControlPlane {
    pub(super) fn busy(&self, sandbox: SandboxId) -> Result<Busy<'_>, ControlError> {
        let mut b = self
            .busy
            .lock()
            .map_err(|_| ControlError::Internal("lock poisoned".into()))?;
        if !b.insert(sandbox) {
            return Err(ControlError::Conflict(
                "another lifecycle operation on this sandbox is under way".into(),
            ));
        }
        Ok(Busy(self, sandbox, None))
    }

    /// Like [`Self::busy`], for a transition (start, snapshot, migration): while it
    /// lasts, its lease in the store is renewed every third of the reconciler's grace
    /// period (first after one third, so quick ones write nothing), so a slow
    /// transition on this replica is never taken over by another's reconciler.
    pub(super) fn transition(&self, sandbox: SandboxId) -> Result<Busy<'_>, ControlError> {
        let mut busy = self.busy(sandbox)?;
        let store = self.store.clone();
        let period =
            std::time::Duration::from_millis((self.reconcile_after_secs.max(1) as u64) * 1000 / 3);
        let renew = tokio::spawn(async move {
            loop {
                tokio::time::sleep(period).await;
                let now = now_secs().to_string();
                if let Err(e) = store.kv_set(&lease_key(&sandbox), &now).await {
                    tracing::warn!(%sandbox, error = %e, "could not renew a transition lease");
                }
            }
        });
        busy.2 = Some(renew.abort_handle());
        Ok(busy)
    }

    /// Records the step a snapshot or migration of `sandbox` is at, for clients that
    /// show progress (best effort: a failure to record it changes nothing else).
    pub(super) async fn step(&self, sandbox: &SandboxId, step: String) {
        let _ = self.store.kv_set(&step_key(sandbox), &step).await;
    }
}

/// The kv key holding when the replica running a transition of `sandbox` last
/// renewed its lease (unix seconds).
pub(super) fn lease_key(sandbox: &SandboxId) -> String {
    format!("lease:{sandbox}")
}

/// The kv key holding the step a snapshot or migration of `sandbox` is at.
pub(super) fn step_key(sandbox: &SandboxId) -> String {
    format!("step:{sandbox}")
}
