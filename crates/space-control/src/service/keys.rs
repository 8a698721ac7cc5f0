//! The signing keys: the keyring in use, reloaded from the store (other replicas
//! rotate too), rotation (publish, then sign), and retirement of old keys.

use std::sync::Arc;

use super::plane::ControlPlane;
use crate::error::ControlError;
use crate::keyring::{self, Keyring};
use crate::now_secs;

impl ControlPlane {
    /// The current keys.
    pub async fn keys(&self) -> Arc<Keyring> {
        Arc::clone(&*self.keys.read().await)
    }

    /// Re-reads keys from the store (other replicas may have rotated).
    pub async fn reload_keys(&self) -> Result<(), ControlError> {
        let fresh = self.keys().await.reload(&self.store).await?;
        *self.keys.write().await = Arc::new(fresh);
        Ok(())
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
