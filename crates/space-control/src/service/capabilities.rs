//! Capability issuance: only for a running execution the worker acknowledged, naming
//! its route, the access asked, and for service ports the port and protocol.

use std::time::Duration;

use space_identity::{
    Access, AccessSet, Claims, Placement, Protocol, Purpose, Route, SandboxId, ServicePort,
    Timestamp, TokenId,
};
use space_proto::api::{CapabilityResponse, RouteView};
use space_store::{ExecutionRecord, ExecutionState, SandboxRecord, SandboxState};

use super::plane::{CAPABILITY_LIFETIME_SECS, ControlPlane, MAX_TRANSITION_WAIT};
use crate::auth::Caller;
use crate::error::ControlError;
use crate::{now_secs, random_bytes};

/// Whether a capability can name the sandbox's execution now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Settle {
    /// An execution its worker acknowledged runs (the sandbox may be paused in place:
    /// the same execution, requests wait at the worker).
    Ready,
    /// It never runs again (stopped): issuance answers why.
    Final,
    /// In a transition, named by the word given: wait for the next change.
    Wait(&'static str),
}

/// [`Settle`] of `s` whose current execution is `exe` (pure: the store's records in,
/// the decision out).
pub(crate) fn settle(s: &SandboxRecord, exe: Option<&ExecutionRecord>) -> Settle {
    match s.state {
        SandboxState::Stopped => Settle::Final,
        SandboxState::Starting => Settle::Wait("starting"),
        SandboxState::Migrating => Settle::Wait("migrating"),
        SandboxState::Running | SandboxState::Paused => match exe.map(|e| e.state) {
            Some(ExecutionState::Running) => Settle::Ready,
            Some(ExecutionState::Pending) => Settle::Wait("starting its next execution"),
            // Its execution was lost or retired and the reconciler replaces it.
            _ => Settle::Wait("restarting"),
        },
    }
}

impl ControlPlane {
    /// Records that `cap` was issued for a rebuilt attempt: a freeze of its execution
    /// lets it arrive first (see `arrivals`).
    pub fn note_rebuilt(&self, cap: &CapabilityResponse) {
        self.arrivals.note_rebuilt(cap);
    }

    /// The default of [`Self::settled`]'s wait.
    pub fn transition_wait(&self) -> Duration {
        self.transition_wait
    }

    /// `caller`'s sandbox once a capability can name its execution (see
    /// [`Self::settled_record`]).
    pub async fn settled(
        &self,
        caller: &Caller,
        sandbox: &SandboxId,
        wait: Duration,
    ) -> Result<SandboxRecord, ControlError> {
        let s = self.sandbox_for(caller, sandbox).await?;
        self.settled_record(s, wait).await
    }

    /// `s` (already authorized) once a capability can name its execution: at once when
    /// one runs, else after waiting — woken by the store's change notifications, never
    /// polling — up to `wait` for a transition to end (then `503 transitioning`, naming
    /// the state). A stopped sandbox comes back at once (issuance then refuses it).
    pub async fn settled_record(
        &self,
        mut s: SandboxRecord,
        wait: Duration,
    ) -> Result<SandboxRecord, ControlError> {
        let wait = wait.min(MAX_TRANSITION_WAIT);
        let deadline = tokio::time::Instant::now() + wait;
        // Subscribed before the first read: a change written in between wakes us.
        let mut changes = space_store::changes::subscribe(&s.id);
        let mut fresh = false;
        loop {
            if fresh {
                s = self.store.get_sandbox(&s.id).await?;
            }
            fresh = true;
            let exe = self.store.current_execution(&s.id).await?;
            let state = match settle(&s, exe.as_ref()) {
                Settle::Ready | Settle::Final => return Ok(s),
                Settle::Wait(state) => state,
            };
            if tokio::time::timeout_at(deadline, changes.changed())
                .await
                .is_err()
            {
                self.metrics.transition_timeouts.inc();
                return Err(ControlError::Transitioning {
                    state,
                    waited: wait,
                });
            }
        }
    }

    /// Issues a capability for the running execution of `s`.
    pub async fn issue_capability(
        &self,
        s: &SandboxRecord,
        access: AccessSet,
        purpose: Purpose,
        port: Option<(u16, Protocol)>,
    ) -> Result<CapabilityResponse, ControlError> {
        if access.is_empty() {
            return Err(ControlError::BadRequest("access must not be empty".into()));
        }
        let service_port = match (purpose, port) {
            (Purpose::ServicePort, Some((port, protocol))) if port != 0 => {
                Some(ServicePort { port, protocol })
            }
            (Purpose::ServicePort, _) => {
                return Err(ControlError::BadRequest(
                    "service_port capabilities need a port and a protocol".into(),
                ));
            }
            (Purpose::Control, None) => None,
            (Purpose::Control, Some(_)) => {
                return Err(ControlError::BadRequest(
                    "port and protocol are only for service_port".into(),
                ));
            }
        };
        if purpose == Purpose::ServicePort && access != AccessSet::of(&[Access::ServicePort]) {
            return Err(ControlError::BadRequest(
                "a service_port capability grants service_port only".into(),
            ));
        }
        if purpose == Purpose::Control && access.contains(Access::ServicePort) {
            return Err(ControlError::BadRequest(
                "service_port access needs purpose service_port".into(),
            ));
        }
        if matches!(s.state, SandboxState::Stopped) {
            return Err(ControlError::Conflict("the sandbox is stopped".into()));
        }
        // A service-port capability only for a port exposed with that protocol.
        if let Some(sp) = service_port {
            let exposed = self.port(&s.id, sp.port).await?;
            if exposed.protocol != sp.protocol.as_str() {
                return Err(ControlError::Deny {
                    reason: space_identity::DenyReason::WrongProtocol,
                });
            }
        }
        // Only an execution its worker acknowledged as running gets capabilities.
        let exe = self.running_execution(&s.id).await?;
        let worker = self.store.get_worker(&exe.worker).await?;
        let keys = self.keys().await;
        let now = now_secs();
        let route = Route {
            sandbox: s.id,
            execution: exe.execution(),
            placement: Placement {
                worker: exe.worker.clone(),
                substrate: exe.substrate,
                activation: exe.activation,
                pod_uid: exe.pod_uid,
            },
        };
        let claims = Claims {
            key_id: keys.signer.key_id(),
            route,
            access,
            purpose,
            service_port,
            issued_at: Timestamp::from_unix_secs(now),
            expires_at: Timestamp::from_unix_secs(now + CAPABILITY_LIFETIME_SECS),
            token_id: TokenId::from_bytes(random_bytes()),
        };
        let token = keys
            .signer
            .sign(&claims)
            .map_err(|e| ControlError::Internal(format!("cannot sign capability: {e}")))?;
        self.metrics.capabilities_issued.inc();
        Ok(CapabilityResponse {
            token: token.to_text(),
            route: RouteView {
                sandbox: s.id,
                generation: exe.generation,
                execution_id: exe.execution_id,
                worker: exe.worker,
                substrate: exe.substrate,
                activation: exe.activation,
                pod_uid: exe.pod_uid,
                worker_url: worker.url,
            },
            expires_at: now + CAPABILITY_LIFETIME_SECS,
        })
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use space_identity::{ExecutionId, Generation, Substrate};

    use super::*;

    fn sandbox(state: SandboxState) -> SandboxRecord {
        SandboxRecord {
            id: SandboxId::from_bytes([1; 16]),
            tenant: "ten_a".into(),
            state,
            template: "default".into(),
            created_at: 0,
            expires_at: None,
            metadata: serde_json::Value::Null,
            env: BTreeMap::new(),
            generation: Generation(1),
            limits: None,
            network: space_store::Policy::none(),
        }
    }

    fn execution(state: ExecutionState) -> ExecutionRecord {
        ExecutionRecord {
            sandbox: SandboxId::from_bytes([1; 16]),
            generation: Generation(1),
            execution_id: ExecutionId::from_bytes([2; 16]),
            worker: "w1".parse().unwrap(),
            substrate: Substrate::Jail,
            activation: 1,
            pod_uid: None,
            state,
            created_at: 0,
            updated_at: 0,
        }
    }

    #[test]
    fn a_running_or_paused_sandbox_with_an_acknowledged_execution_is_ready() {
        let exe = execution(ExecutionState::Running);
        for s in [SandboxState::Running, SandboxState::Paused] {
            assert_eq!(settle(&sandbox(s), Some(&exe)), Settle::Ready);
        }
    }

    #[test]
    fn a_migrating_sandbox_is_waited_for_even_while_its_old_execution_still_runs() {
        let old = execution(ExecutionState::Running);
        assert_eq!(
            settle(&sandbox(SandboxState::Migrating), Some(&old)),
            Settle::Wait("migrating")
        );
    }

    #[test]
    fn a_pending_lost_or_missing_execution_is_waited_for() {
        let s = sandbox(SandboxState::Running);
        for e in [
            ExecutionState::Pending,
            ExecutionState::Failed,
            ExecutionState::Retired,
        ] {
            assert!(matches!(settle(&s, Some(&execution(e))), Settle::Wait(_)));
        }
        assert!(matches!(settle(&s, None), Settle::Wait(_)));
        assert_eq!(
            settle(&sandbox(SandboxState::Starting), None),
            Settle::Wait("starting")
        );
    }

    #[test]
    fn a_stopped_sandbox_is_answered_at_once() {
        assert_eq!(
            settle(
                &sandbox(SandboxState::Stopped),
                Some(&execution(ExecutionState::Retired))
            ),
            Settle::Final
        );
    }
}
