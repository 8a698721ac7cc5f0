//! Sandboxes: who may see one, their API view, creating one (validated, within the
//! tenant's quota, claimed from the standby sandboxes or placed and started), and the
//! limits policy creates resolve against.

use std::collections::BTreeMap;

use space_identity::{Generation, SandboxId};
use space_proto::api::{self, CreateSandbox, ExecutionView};
use space_store::{ExecutionRecord, ExecutionState, SandboxRecord, SandboxState};

use super::plane::{ControlPlane, MAX_TTL_SECS, STANDBY_TENANT};
use super::quota::QuotaHold;
use super::transitions::step_key;
use crate::auth::Caller;
use crate::error::ControlError;
use crate::{now_secs, random_bytes};

impl ControlPlane {
    /// The sandbox `id` if `caller` may see it (404 otherwise, revealing nothing).
    pub async fn sandbox_for(
        &self,
        caller: &Caller,
        id: &SandboxId,
    ) -> Result<SandboxRecord, ControlError> {
        match self.store.get_sandbox(id).await {
            Ok(s) if s.tenant == caller.tenant || caller.admin => Ok(s),
            Ok(_) | Err(space_store::StoreError::NotFound(_)) => {
                Err(ControlError::NotFound("sandbox"))
            }
            Err(e) => Err(e.into()),
        }
    }

    /// The user-facing view of a sandbox.
    pub async fn view(&self, s: &SandboxRecord) -> Result<api::Sandbox, ControlError> {
        let execution = match s.state {
            SandboxState::Stopped => None,
            _ => self.store.current_execution(&s.id).await?,
        };
        let mut view = self.view_of(s, execution.as_ref());
        if s.state == SandboxState::Migrating {
            view.step = self
                .store
                .kv_get(&step_key(&s.id))
                .await?
                .filter(|v| !v.is_empty());
        }
        Ok(view)
    }

    /// The API view of `s` with its current execution `e` (no step).
    pub(super) fn view_of(&self, s: &SandboxRecord, e: Option<&ExecutionRecord>) -> api::Sandbox {
        let execution = e.map(|e| ExecutionView {
            generation: e.generation,
            execution_id: e.execution_id,
            worker: e.worker.clone(),
            substrate: e.substrate,
            activation: e.activation,
        });
        api::Sandbox {
            id: s.id,
            state: api_state(s.state),
            template: s.template.clone(),
            created_at: api::rfc3339(s.created_at.max(0) as u64),
            expires_at: s.expires_at.map(|t| api::rfc3339(t.max(0) as u64)),
            execution,
            metadata: s.metadata.clone(),
            step: None,
            limits: Some(api::LimitsView::from(&crate::limits::of_store(
                s.limits.as_ref(),
            ))),
            network: s.network.clone(),
        }
    }

    /// The sandbox's current execution, which must be running (`409 not_running`
    /// otherwise).
    pub(super) async fn running_execution(
        &self,
        sandbox: &SandboxId,
    ) -> Result<ExecutionRecord, ControlError> {
        self.store
            .current_execution(sandbox)
            .await?
            .filter(|e| e.state == ExecutionState::Running)
            .ok_or(ControlError::NotRunning)
    }

    /// Creates a sandbox and launches its first execution.
    pub async fn create_sandbox(
        &self,
        caller: &Caller,
        req: CreateSandbox,
    ) -> Result<api::Sandbox, ControlError> {
        // `default`, or the template's name pinned to its digest (`NAME:TAG@sha256:…`:
        // a later import under the name changes nothing of this sandbox); an unknown
        // name is 400.
        let default_template = self.default_template();
        let template = self
            .pin_template(req.template.as_deref().unwrap_or(&default_template))
            .await?;
        if let Some(ttl) = req.ttl_secs {
            if ttl == 0 || ttl > MAX_TTL_SECS {
                return Err(ControlError::BadRequest(format!(
                    "ttl_secs must be 1 to {MAX_TTL_SECS}"
                )));
            }
        }
        let pause_at_ttl = match req.ttl_action.as_deref() {
            None | Some("stop") => false,
            Some("pause") if req.ttl_secs.is_some() => true,
            Some("pause") => {
                return Err(ControlError::BadRequest("ttl_action needs ttl_secs".into()));
            }
            Some(other) => {
                return Err(ControlError::BadRequest(format!(
                    "ttl_action must be stop or pause, not {other:?}"
                )));
            }
        };
        let env = req.env.unwrap_or_default();
        validate_env(&env)?;
        let metadata = req
            .metadata
            .unwrap_or(serde_json::Value::Object(Default::default()));
        if metadata.to_string().len() > 16 * 1024 {
            return Err(ControlError::BadRequest("metadata is over 16 KiB".into()));
        }
        let policy = self.limits_policy();
        let limits = policy.resolve(req.limits.as_ref())?;
        // Validated as it was parsed (`space_egress::Policy`'s serde).
        let network = req.network.unwrap_or_else(|| self.default_network());
        let mut quota_hold = None;
        if caller.tenant != STANDBY_TENANT {
            // Standby sandboxes belong to no tenant until claimed: they never count.
            // Creates of this process still under way count too (a burst that read
            // the same count would pass the quota together); a create whose row is
            // already written may be counted twice for a moment, which only refuses
            // early near the quota, never admits past it. Replicas on one PostgreSQL
            // each count their own creates under way.
            let (hold, pending) = QuotaHold::take(&self.quota_pending, &caller.tenant);
            quota_hold = Some(hold);
            let live = self.store.count_live_sandboxes(&caller.tenant).await?;
            policy.admit(live + pending)?;
        }
        let now = now_secs() as i64;
        let expires_at = req.ttl_secs.map(|t| now + t as i64);
        // A standby sandbox already runs: claiming one is a single write. Its template
        // must have a pool (the default, or one `--standby-template` names); sandboxes
        // with their own environment or a chosen worker are started for the request.
        // Standby sandboxes run with the default limits: other limits start their own.
        // Any network policy claims one of its mode (one in mode `egress` has its
        // link made already): the claim writes the policy, given to the worker below
        // before the answer.
        // Standby sandboxes run on workers of the default substrate only.
        let substrate = req.substrate.unwrap_or_else(|| self.default_substrate());
        let plain = env.is_empty()
            && req.worker.is_none()
            && limits == policy.defaults
            && substrate == self.default_substrate();
        let kind = crate::standby_plan::PoolKey {
            template: template.clone(),
            linked: network.mode == space_proto::api::NetworkMode::Egress,
        };
        if plain && caller.tenant != STANDBY_TENANT && self.has_standby_pool(&kind) {
            let claim = space_store::Claim {
                tenant: caller.tenant.clone(),
                created_at: now,
                expires_at,
                metadata: metadata.clone(),
                template: template.clone(),
                network: network.clone(),
            };
            let claimed = self.store.claim_standby(STANDBY_TENANT, &claim).await?;
            // A standby sandbox started under another default substrate is not handed
            // over as this one (a jail for a VM would be a weaker sandbox): it goes.
            let claimed = match claimed {
                Some(s) => match self.store.current_execution(&s.id).await? {
                    Some(e) if e.substrate == substrate => Some((s, e)),
                    _ => {
                        let _ = self.delete_sandbox(&s).await;
                        None
                    }
                },
                None => None,
            };
            if let Some((s, e)) = claimed {
                drop(quota_hold.take());
                self.standby_burst
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .claimed(std::time::Instant::now());
                // A sandbox in mode `none` with no lists is what every standby sandbox
                // of its kind runs. Any other policy is pushed (the standby sandbox ran
                // its pool's, or one from before a restart that changed it): handed
                // over only once the worker has put it in force; one whose worker
                // does not take it is stopped, not handed over.
                if network != space_proto::api::Policy::none() {
                    // What the claim wrote and the execution just read are the first
                    // round's (the confirmation reads both again).
                    let first = (e, s.network.clone());
                    let pushed = self.push_network_from(&s.id, Some(first)).await;
                    if let Ok(applied) = &pushed {
                        tracing::debug!(sandbox = %s.id, ?applied, "claimed standby sandbox given its policy");
                    }
                    if let Err(e) = pushed {
                        let _ = self.delete_sandbox(&s).await;
                        // Its message speaks of a running sandbox (the push's own
                        // log line keeps the worker's reason).
                        return Err(match e {
                            ControlError::BadGateway(_) => ControlError::BadGateway(
                                "no sandbox was created: the worker of the standby sandbox \
                                 claimed for it did not take its network policy; send the \
                                 create again"
                                    .into(),
                            ),
                            other => other,
                        });
                    }
                }
                if pause_at_ttl {
                    self.store.kv_set(&ttl_pause_key(&s.id), "pause").await?;
                }
                self.metrics.standby_claims.inc();
                self.metrics.standby_ready.dec();
                return self.view(&s).await;
            }
        }
        let placed = self.place_create(req.worker.as_ref(), substrate).await?;
        let worker = &placed.worker;
        let record = SandboxRecord {
            id: SandboxId::from_bytes(random_bytes()),
            tenant: caller.tenant.clone(),
            template,
            state: SandboxState::Starting,
            created_at: now,
            expires_at,
            metadata,
            env,
            generation: Generation::NONE,
            limits: Some(crate::limits::to_store(&limits)),
            network,
        };
        let _busy = self.transition(record.id)?;
        self.store.create_sandbox(&record).await?;
        // The row counts from here on.
        drop(quota_hold);
        if pause_at_ttl {
            self.store
                .kv_set(&ttl_pause_key(&record.id), "pause")
                .await?;
        }
        let exe = match self.start_execution(&record, worker).await {
            Ok(exe) => exe,
            Err(e) => {
                let _ = self
                    .store
                    .set_sandbox_state(
                        &record.id,
                        SandboxState::Stopped,
                        Some(SandboxState::Starting),
                    )
                    .await;
                return Err(e);
            }
        };
        self.store
            .set_sandbox_state(
                &record.id,
                SandboxState::Running,
                Some(SandboxState::Starting),
            )
            .await?;
        // Built from what was written (the conditional updates above succeeded), not
        // read back: a create under load costs no extra reads.
        let s = SandboxRecord {
            state: SandboxState::Running,
            generation: exe.generation,
            ..record
        };
        Ok(self.view_of(&s, Some(&exe)))
    }

    /// The limits policy in force (defaults, maxima, tenant quota).
    pub fn limits_policy(&self) -> crate::limits::LimitsPolicy {
        *self
            .limits_policy
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Sets a sandbox's time to live, counted from `now` (`None`: it never expires).
    /// A sandbox created to pause at its TTL pauses at the new one too, also if it
    /// paused at an earlier one already.
    pub async fn set_ttl(
        &self,
        s: &SandboxRecord,
        ttl_secs: Option<u64>,
        now: i64,
    ) -> Result<(), ControlError> {
        if let Some(ttl) = ttl_secs {
            if ttl == 0 || ttl > MAX_TTL_SECS {
                return Err(ControlError::BadRequest(format!(
                    "ttl_secs must be 1 to {MAX_TTL_SECS}"
                )));
            }
        }
        self.store
            .set_expiry(&s.id, ttl_secs.map(|t| now + t as i64))
            .await?;
        let key = ttl_pause_key(&s.id);
        if ttl_secs.is_some() && self.store.kv_get(&key).await?.as_deref() == Some("done") {
            self.store.kv_set(&key, "pause").await?;
        }
        Ok(())
    }

    /// Whether the sandbox pauses (rather than stops) at its TTL.
    pub async fn pauses_at_ttl(&self, s: &SandboxRecord) -> Result<bool, ControlError> {
        Ok(self.store.kv_get(&ttl_pause_key(&s.id)).await?.is_some())
    }

    /// Sets the limits policy for creates from now on (stored sandboxes keep theirs).
    pub fn set_limits_policy(&self, policy: crate::limits::LimitsPolicy) {
        *self
            .limits_policy
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = policy;
    }
}

/// The kv key that marks a sandbox to be paused, not stopped, at its TTL.
pub(super) fn ttl_pause_key(sandbox: &SandboxId) -> String {
    format!("ttl_pause:{sandbox}")
}

fn validate_env(env: &BTreeMap<String, String>) -> Result<(), ControlError> {
    if env.len() > 256 {
        return Err(ControlError::BadRequest(
            "at most 256 environment variables".into(),
        ));
    }
    for (k, v) in env {
        let ok_name = !k.is_empty()
            && k.len() <= 256
            && !k.starts_with(|c: char| c.is_ascii_digit())
            && k.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_');
        if !ok_name {
            return Err(ControlError::BadRequest(format!(
                "invalid environment variable name {k:?}"
            )));
        }
        if v.len() > 32 * 1024 || v.contains('\0') {
            return Err(ControlError::BadRequest(format!("invalid value for {k}")));
        }
    }
    Ok(())
}

/// Maps the store's state to the API's.
pub fn api_state(s: SandboxState) -> api::SandboxState {
    match s {
        SandboxState::Starting => api::SandboxState::Starting,
        SandboxState::Running => api::SandboxState::Running,
        SandboxState::Paused => api::SandboxState::Paused,
        SandboxState::Migrating => api::SandboxState::Migrating,
        SandboxState::Stopped => api::SandboxState::Stopped,
    }
}
