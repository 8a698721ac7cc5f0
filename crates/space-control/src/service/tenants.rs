//! Tenants and their API keys: authenticating a key, creating tenants and keys,
//! revoking them.

use space_identity::SandboxId;
use space_store::{ApiKeyRecord, Tenant};

use super::plane::ControlPlane;
use crate::auth::{self, Caller, IssuedKey};
use crate::error::ControlError;
use crate::{now_secs, random_bytes};

impl ControlPlane {
    /// Resolves an `Authorization: Bearer` API key to its caller.
    pub async fn authenticate(&self, bearer: &str) -> Result<Caller, ControlError> {
        let (id, hash) = auth::parse_key(bearer).ok_or(ControlError::Unauthorized)?;
        let id = id.as_str();
        if let Some(c) = self.key_cache.get(id, &hash) {
            return Ok(c);
        }
        let record = self
            .store
            .find_api_key(id)
            .await?
            .filter(|k| k.revoked_at.is_none() && auth::hashes_equal(&k.hash, &hash))
            .ok_or(ControlError::Unauthorized)?;
        let caller = Caller {
            tenant: record.tenant,
            key_id: record.id,
            admin: record.admin,
        };
        self.key_cache.put(id, hash, caller.clone());
        Ok(caller)
    }

    /// Creates a tenant with a first key.
    pub async fn create_tenant(
        &self,
        name: &str,
        admin: bool,
    ) -> Result<(Tenant, IssuedKey), ControlError> {
        if name.is_empty() || name.len() > 64 {
            return Err(ControlError::BadRequest(
                "tenant name must be 1 to 64 characters".into(),
            ));
        }
        let tenant = Tenant {
            id: format!(
                "ten_{}",
                SandboxId::from_bytes(random_bytes())
                    .to_string()
                    .trim_start_matches("sbx_")
            ),
            name: name.to_owned(),
            created_at: now_secs() as i64,
        };
        self.store.create_tenant(&tenant).await?;
        let key = self.create_key(&tenant.id, admin).await?;
        Ok((tenant, key))
    }

    /// Issues a new API key for `tenant`.
    pub async fn create_key(&self, tenant: &str, admin: bool) -> Result<IssuedKey, ControlError> {
        self.create_key_as(tenant, admin, auth::KeyFormat::Space)
            .await
    }

    /// Issues a new API key for `tenant` in `format`.
    pub async fn create_key_as(
        &self,
        tenant: &str,
        admin: bool,
        format: auth::KeyFormat,
    ) -> Result<IssuedKey, ControlError> {
        let key = auth::issue_key_as(format);
        self.store
            .insert_api_key(&ApiKeyRecord {
                id: key.id.clone(),
                tenant: tenant.to_owned(),
                hash: key.hash,
                admin,
                created_at: now_secs() as i64,
                revoked_at: None,
            })
            .await?;
        Ok(key)
    }

    /// Revokes a key of `tenant` (admins may revoke any).
    pub async fn revoke_key(&self, caller: &Caller, id: &str) -> Result<(), ControlError> {
        let key = self
            .store
            .find_api_key(id)
            .await?
            .filter(|k| caller.admin || k.tenant == caller.tenant)
            .ok_or(ControlError::NotFound("api key"))?;
        self.store
            .revoke_api_key(&key.id, now_secs() as i64)
            .await?;
        self.key_cache.forget(&key.id);
        Ok(())
    }
}
