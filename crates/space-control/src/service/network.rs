//! Sandbox network policies: the default a create without one gets, and replacing a
//! sandbox's policy — durable in the store first, then pushed to the worker running
//! its current execution. Every later execution (a restart, a migration, a resume,
//! a snapshot restore) gets the stored policy in its install (`executions`).

use space_identity::{Execution, SandboxId};
use space_proto::api::{self, NetworkMode, Policy, Update};
use space_store::{ExecutionState, SandboxRecord, SandboxState};

use super::plane::ControlPlane;
use crate::error::ControlError;

/// How many times a push follows a policy or an execution that changed under it (a
/// concurrent change, a migration installing the next execution) before giving up.
const PUSH_ROUNDS: usize = 4;

/// Where a stored policy took effect.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NetworkApplied {
    /// The worker of the sandbox's current execution acknowledged it.
    Execution {
        /// The execution told.
        execution: Execution,
        /// Its worker.
        worker: space_identity::WorkerId,
    },
    /// No execution is current (none started yet, or every one failed): the next
    /// install carries it.
    NothingRuns,
}

impl ControlPlane {
    /// The policy a create without `network` gets: the default mode, no rules (in
    /// `egress`, everything the operator's global deny list lets through).
    pub fn default_network(&self) -> Policy {
        let mut policy = Policy::none();
        policy.mode = *self
            .network_default
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        policy
    }

    /// Sets the default mode of creates from now on (stored sandboxes keep theirs).
    pub fn set_default_network(&self, mode: NetworkMode) {
        *self
            .network_default
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = mode;
    }

    /// `PATCH /v1/sandboxes/{id}/network`: stores `policy` as the sandbox's, tells
    /// the worker of its current execution, and answers the sandbox as it is then.
    /// A stopped sandbox is `409`; a worker that does not take the policy is `502`
    /// saying that it is stored (and that the running execution keeps its previous
    /// one until told).
    pub async fn set_network(
        &self,
        s: &SandboxRecord,
        policy: Policy,
    ) -> Result<api::Sandbox, ControlError> {
        if s.state == SandboxState::Stopped {
            return Err(ControlError::Conflict("the sandbox is stopped".into()));
        }
        self.apply_network(&s.id, &policy).await?;
        let now = self.store.get_sandbox(&s.id).await?;
        self.view(&now).await
    }

    /// Stores `policy` for `sandbox` and pushes it to its current execution.
    pub(super) async fn apply_network(
        &self,
        sandbox: &SandboxId,
        policy: &Policy,
    ) -> Result<NetworkApplied, ControlError> {
        self.store.set_network(sandbox, policy).await?;
        let applied = self.push_network(sandbox).await?;
        tracing::info!(sandbox = %sandbox, mode = ?policy.mode, allow = policy.allow().len(), deny = policy.deny().len(), applied = ?applied, "network policy set");
        Ok(applied)
    }

    /// Tells the worker of `sandbox`'s current execution the stored policy, until the
    /// execution told and the policy told are still the current ones afterwards: a
    /// concurrent change (this replica's or another's) or a new execution is then
    /// told too, so the last policy stored is the one in effect.
    pub async fn push_network(&self, sandbox: &SandboxId) -> Result<NetworkApplied, ControlError> {
        self.push_network_from(sandbox, None).await
    }

    /// [`Self::push_network`], its first round with `first` — the execution and the
    /// policy the caller read or wrote itself a moment ago — instead of reading them
    /// (a claim's create); every later round, and so the confirmation, reads them.
    pub(super) async fn push_network_from(
        &self,
        sandbox: &SandboxId,
        mut first: Option<(space_store::ExecutionRecord, Policy)>,
    ) -> Result<NetworkApplied, ControlError> {
        let mut told: Option<(Execution, Policy)> = None;
        for _ in 0..PUSH_ROUNDS {
            let (current, known) = match first.take() {
                Some((exe, policy)) => (Some(exe), Some(policy)),
                None => (self.store.current_execution(sandbox).await?, None),
            };
            let current = current
                .filter(|e| matches!(e.state, ExecutionState::Running | ExecutionState::Pending));
            let Some(exe) = current else {
                return Ok(NetworkApplied::NothingRuns);
            };
            let policy = match known {
                Some(p) => p,
                None => self.store.get_sandbox(sandbox).await?.network,
            };
            if told.as_ref() == Some(&(exe.execution(), policy.clone())) {
                return Ok(NetworkApplied::Execution {
                    execution: exe.execution(),
                    worker: exe.worker,
                });
            }
            let worker = self.store.get_worker(&exe.worker).await?;
            let update = Update::Network {
                sandbox: *sandbox,
                generation: exe.generation,
                execution_id: exe.execution_id,
                network: policy.clone(),
            };
            if let Err(e) = self.deliver(&worker, update).await {
                tracing::warn!(sandbox = %sandbox, generation = exe.generation.get(), worker = %worker.id, error = %e, "network policy stored but not acknowledged; the next install carries it");
                return Err(ControlError::BadGateway(format!(
                    "the network policy is stored, but worker {} did not take it ({e}): the \
                     running execution keeps its previous policy until it is told; send the \
                     change again (every later execution of the sandbox gets the stored policy)",
                    worker.id
                )));
            }
            told = Some((exe.execution(), policy));
        }
        Err(ControlError::Conflict(
            "the sandbox's network policy or execution kept changing while it was pushed; \
             send the change again"
                .into(),
        ))
    }
}
