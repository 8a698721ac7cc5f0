//! The front's credentials: the access-token secret (one for every replica, kept in
//! the store) and which API keys are still valid (a revoked key's tokens stop within
//! [`KEY_CHECK_TTL`]).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use space_control::auth::Caller;
use space_control::error::ControlError;
use space_control::service::ControlPlane;
use tokio::sync::OnceCell;

use crate::token::{Claims, TokenKey};

/// The store's name for the token secret.
const SECRET_KV: &str = "e2b_token_secret";

/// How long a key's validity is trusted before it is read again.
pub const KEY_CHECK_TTL: Duration = Duration::from_secs(5);

/// Entries of the validity cache at most.
const KEYS_CACHED: usize = 10_000;

/// Tokens: made and checked with the secret, and the key behind each re-checked.
#[derive(Debug)]
pub struct Tokens {
    cp: Arc<ControlPlane>,
    key: OnceCell<TokenKey>,
    live: Mutex<HashMap<String, (Caller, Instant)>>,
}

impl Tokens {
    pub fn new(cp: Arc<ControlPlane>) -> Self {
        Self {
            cp,
            key: OnceCell::new(),
            live: Mutex::new(HashMap::new()),
        }
    }

    /// The secret: read from the store, made there on first use (race-safe between
    /// replicas: the first value written wins).
    async fn key(&self) -> Result<&TokenKey, ControlError> {
        self.key
            .get_or_try_init(|| async {
                let fresh: String = space_control::random_bytes::<32>()
                    .iter()
                    .map(|b| format!("{b:02x}"))
                    .collect();
                self.cp.store.kv_insert_if_absent(SECRET_KV, &fresh).await?;
                let text =
                    self.cp.store.kv_get(SECRET_KV).await?.ok_or_else(|| {
                        ControlError::Internal("the token secret vanished".into())
                    })?;
                let secret = space_control::auth::unhex::<32>(&text)
                    .ok_or_else(|| ControlError::Internal("the token secret is corrupt".into()))?;
                Ok(TokenKey::new(secret))
            })
            .await
    }

    /// A token for `claims`.
    pub async fn mint(&self, claims: &Claims) -> Result<String, ControlError> {
        Ok(self.key().await?.mint(claims))
    }

    /// The claims of a genuine token whose key is still valid, as the caller it
    /// acts for; `Unauthorized` otherwise.
    pub async fn verify(&self, token: &str) -> Result<(Claims, Caller), ControlError> {
        let claims = self
            .key()
            .await?
            .verify(token.trim())
            .map_err(|_| ControlError::Unauthorized)?;
        if let Some(c) = self.cached(&claims.key_id) {
            return if c.tenant == claims.tenant {
                Ok((claims, c))
            } else {
                Err(ControlError::Unauthorized)
            };
        }
        let record = self
            .cp
            .store
            .find_api_key(&claims.key_id)
            .await?
            .filter(|k| k.revoked_at.is_none() && k.tenant == claims.tenant)
            .ok_or(ControlError::Unauthorized)?;
        let caller = Caller {
            tenant: record.tenant,
            key_id: record.id,
            admin: false,
        };
        if let Ok(mut live) = self.live.lock() {
            if live.len() >= KEYS_CACHED {
                live.retain(|_, (_, at)| at.elapsed() < KEY_CHECK_TTL);
                if live.len() >= KEYS_CACHED {
                    live.clear();
                }
            }
            live.insert(caller.key_id.clone(), (caller.clone(), Instant::now()));
        }
        Ok((claims, caller))
    }

    fn cached(&self, key_id: &str) -> Option<Caller> {
        let live = self.live.lock().ok()?;
        let (c, at) = live.get(key_id)?;
        (at.elapsed() < KEY_CHECK_TTL).then(|| c.clone())
    }
}
