//! Capability issuance: only for a running execution the worker acknowledged, naming
//! its route, the access asked, and for service ports the port and protocol.

use super::*;

impl ControlPlane {
    /// Issues a capability for the running execution of `s`.
    pub async fn issue_capability(
        &self,
        s: &SandboxRecord,
        access: AccessSet,
        purpose: Purpose,
        port: Option<(u16, Protocol)>,
    ) -> Result<CapabilityResponse, ApiError> {
        if access.is_empty() {
            return Err(ApiError::bad_request("access must not be empty"));
        }
        let service_port = match (purpose, port) {
            (Purpose::ServicePort, Some((port, protocol))) if port != 0 => {
                Some(ServicePort { port, protocol })
            }
            (Purpose::ServicePort, _) => {
                return Err(ApiError::bad_request(
                    "service_port capabilities need a port and a protocol",
                ));
            }
            (Purpose::Control, None) => None,
            (Purpose::Control, Some(_)) => {
                return Err(ApiError::bad_request(
                    "port and protocol are only for service_port",
                ));
            }
        };
        if purpose == Purpose::ServicePort && access != AccessSet::of(&[Access::ServicePort]) {
            return Err(ApiError::bad_request(
                "a service_port capability grants service_port only",
            ));
        }
        if purpose == Purpose::Control && access.contains(Access::ServicePort) {
            return Err(ApiError::bad_request(
                "service_port access needs purpose service_port",
            ));
        }
        if matches!(s.state, SandboxState::Stopped) {
            return Err(ApiError::conflict("the sandbox is stopped"));
        }
        // Only an execution its worker acknowledged as running gets capabilities.
        let exe = self.running_execution(&s.id).await?;
        let worker = self.store.get_worker(&exe.worker).await?;
        let keys = self.keys().await;
        let now = now_secs();
        let route = Route {
            sandbox: s.id,
            execution: Execution {
                generation: Generation(exe.generation),
                id: exe.execution_id,
            },
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
            .map_err(|e| ApiError::internal(format!("cannot sign capability: {e}")))?;
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
