//! Standby sandboxes: default sandboxes started ahead of demand, owned by
//! [`STANDBY_TENANT`] until a create claims one.

use std::time::Duration;

use space_proto::api::CreateSandbox;
use space_store::SandboxState;

use super::plane::{ControlPlane, STANDBY_TENANT};
use crate::auth::Caller;
use crate::error::ControlError;

/// How long after the last create the standby keeper waits before refilling.
const STANDBY_QUIET: Duration = Duration::from_millis(300);

impl ControlPlane {
    /// How many standby sandboxes this control plane keeps ready.
    pub fn standby_target(&self) -> usize {
        self.standby_target
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Sets how many standby sandboxes to keep ready (0: none; existing ones stay
    /// until claimed).
    pub fn set_standby_target(&self, n: usize) {
        self.standby_target
            .store(n, std::sync::atomic::Ordering::Relaxed);
    }

    /// One step of the standby keeper: when no create ran for [`STANDBY_QUIET`] and
    /// fewer than the target are ready or starting, starts one (through the normal
    /// create path: placement, warm jail, acknowledged install). Returns whether it
    /// started one.
    pub async fn keep_standby(&self) -> Result<bool, ControlError> {
        let target = self.standby_target();
        let standby = self.store.list_sandboxes(STANDBY_TENANT).await?;
        let ready = standby
            .iter()
            .filter(|s| s.state == SandboxState::Running)
            .count();
        self.metrics
            .standby_ready
            .set(i64::try_from(ready).unwrap_or(i64::MAX));
        // Starting ones count towards the target: they will be ready.
        let ready = standby
            .iter()
            .filter(|s| s.state != SandboxState::Stopped)
            .count();
        let quiet = self
            .last_create
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .is_none_or(|t| t.elapsed() >= STANDBY_QUIET);
        if ready >= target || !quiet {
            return Ok(false);
        }
        let standby = Caller {
            tenant: STANDBY_TENANT.into(),
            key_id: "standby".into(),
            admin: false,
        };
        // Standby sandboxes are of the host-directories `default` (the only template
        // a create claims one for), whatever template creates get by default.
        let req = CreateSandbox {
            template: Some(super::templates::DEFAULT_TEMPLATE.into()),
            ..Default::default()
        };
        self.create_sandbox(&standby, req)
            .await?;
        Ok(true)
    }
}
