//! The control plane's keys: the trust anchor (signs key bundles and worker updates)
//! and the capability signing keys with their rotation.
//!
//! Every replica derives the same state from the store: the anchor seed lives in the
//! `kv` table, signing keys in `signing_keys`, bundles in `bundles`. A bundle lists
//! every key that is published, active or retiring; its version only grows.

use space_identity::{
    BundleSigner, CapabilitySigner, KeyBundle, KeyUses, SignedKeyBundle, Timestamp,
};
use space_store::{KeyState, SigningKeyRecord, Store, StoreError};

use crate::random_bytes;

const ANCHOR_KV: &str = "anchor_seed";
/// How long a signing key is published for (it is rotated well before).
const KEY_VALIDITY_SECS: i64 = 365 * 86_400;

/// The keys one replica signs with, loaded from the store.
#[derive(Debug)]
pub struct Keyring {
    /// Signs bundles and updates.
    pub anchor: BundleSigner,
    /// Signs capabilities.
    pub signer: CapabilitySigner,
    /// The newest bundle, as pushed to workers.
    pub bundle: SignedKeyBundle,
    /// Its version.
    pub bundle_version: u64,
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex32(s: &str) -> Option<[u8; 32]> {
    if s.len() != 64 {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, pair) in s.as_bytes().chunks(2).enumerate() {
        out[i] = u8::from_str_radix(std::str::from_utf8(pair).ok()?, 16).ok()?;
    }
    Some(out)
}

/// Loads the anchor, creating it on first start (race-safe between replicas).
async fn load_anchor(store: &Store) -> Result<BundleSigner, StoreError> {
    let fresh = hex(&random_bytes::<32>());
    store.kv_insert_if_absent(ANCHOR_KV, &fresh).await?;
    let text = store
        .kv_get(ANCHOR_KV)
        .await?
        .ok_or_else(|| StoreError::Backend("anchor seed vanished".into()))?;
    let seed =
        unhex32(&text).ok_or_else(|| StoreError::Backend("anchor seed is corrupt".into()))?;
    Ok(BundleSigner::from_seed(seed))
}

fn new_key_record(state: KeyState, now: i64) -> SigningKeyRecord {
    let seed = random_bytes::<32>();
    let signer = CapabilitySigner::from_seed(seed);
    SigningKeyRecord {
        key_id: signer.key_id().to_string(),
        seed,
        state,
        created_at: now,
        not_before: now - 60,
        not_after: now + KEY_VALIDITY_SECS,
    }
}

fn to_ts(secs: i64) -> Timestamp {
    Timestamp::from_unix_secs(u64::try_from(secs).unwrap_or(0))
}

fn retire_kv(key_id: &str) -> String {
    format!("retire_at:{key_id}")
}

/// When a retiring key's grace ends (its validity in bundles is cut to that).
async fn retire_at(store: &Store, k: &SigningKeyRecord) -> Result<Option<i64>, StoreError> {
    if k.state != KeyState::Retiring {
        return Ok(None);
    }
    Ok(store
        .kv_get(&retire_kv(&k.key_id))
        .await?
        .and_then(|v| v.parse().ok()))
}

/// Builds the bundle for the keys that verifiers must hold, at `version`.
async fn bundle_of(
    store: &Store,
    keys: &[SigningKeyRecord],
    version: u64,
    now: i64,
) -> Result<KeyBundle, StoreError> {
    let mut out = Vec::new();
    for k in keys {
        if !matches!(
            k.state,
            KeyState::Published | KeyState::Active | KeyState::Retiring
        ) {
            continue;
        }
        let not_after = match retire_at(store, k).await? {
            Some(t) => t.min(k.not_after),
            None => k.not_after,
        };
        out.push(CapabilitySigner::from_seed(k.seed).bundle_key(
            KeyUses::all(),
            to_ts(k.not_before),
            to_ts(not_after),
        ));
    }
    Ok(KeyBundle {
        version,
        issued_at: to_ts(now),
        keys: out,
    })
}

/// Stores a new bundle for the current key set (version = newest + 1), retrying when
/// another replica stored one first. Returns it.
pub async fn publish_bundle(
    store: &Store,
    anchor: &BundleSigner,
    now: i64,
) -> Result<(u64, SignedKeyBundle), StoreError> {
    for _ in 0..8 {
        let keys = store.list_signing_keys().await?;
        let version = store.latest_bundle().await?.map_or(1, |(v, _)| v + 1);
        let signed = anchor
            .sign(&bundle_of(store, &keys, version, now).await?)
            .map_err(|e| StoreError::Backend(format!("cannot sign bundle: {e}")))?;
        match store
            .store_bundle(version, signed.as_bytes().to_vec())
            .await
        {
            Ok(()) => return Ok((version, signed)),
            Err(StoreError::Conflict(_)) => continue,
            Err(e) => return Err(e),
        }
    }
    Err(StoreError::Conflict(
        "bundle version race did not settle".into(),
    ))
}

impl Keyring {
    /// Loads (or on first start creates) the keys.
    pub async fn load(store: &Store, now: i64) -> Result<Self, StoreError> {
        let anchor = load_anchor(store).await?;
        let mut keys = store.list_signing_keys().await?;
        // More than one active key: an activation was cut off after its first step.
        // The newest (the one that signs) stays; the others retire as they would have.
        let actives: Vec<&SigningKeyRecord> = keys
            .iter()
            .filter(|k| k.state == KeyState::Active)
            .collect();
        if actives.len() > 1 {
            // The one the cut-off activation named (creation times are seconds: two
            // keys made in one second do not tell which is newer).
            let named = store.kv_get(ACTIVATING_KV).await?;
            let keep = named
                .filter(|n| actives.iter().any(|k| k.key_id == *n))
                .or_else(|| {
                    actives
                        .iter()
                        .max_by_key(|k| (k.created_at, k.key_id.clone()))
                        .map(|k| k.key_id.clone())
                });
            if let Some(newest) = keep {
                retire_all_but(store, &newest, now).await?;
                publish_bundle(store, &anchor, now).await?;
                keys = store.list_signing_keys().await?;
            }
        }
        if !keys.iter().any(|k| k.state == KeyState::Active) {
            store
                .insert_signing_key(&new_key_record(KeyState::Active, now))
                .await?;
            publish_bundle(store, &anchor, now).await?;
            keys = store.list_signing_keys().await?;
        }
        // A rotation cut off after its activation, before the bundle that cuts the
        // retiring key's validity was stored: that key would stay valid for its full
        // lifetime in every verifier. The bundle is published now (workers fetch it at
        // their next sync).
        let mut cut = Vec::new();
        for k in &keys {
            if let Some(t) = retire_at(store, k).await? {
                cut.push((k.key_id.clone(), t));
            }
        }
        let latest = store
            .latest_bundle()
            .await?
            .and_then(|(_, bytes)| KeyBundle::decode_verified(&bytes, &anchor.anchor()).ok());
        if !validity_is_cut(latest.as_ref(), &cut) {
            publish_bundle(store, &anchor, now).await?;
        }
        Self::from_parts(store, anchor, &keys).await
    }

    async fn from_parts(
        store: &Store,
        anchor: BundleSigner,
        keys: &[SigningKeyRecord],
    ) -> Result<Self, StoreError> {
        // The newest active key signs; another replica may have just activated one.
        let active = keys
            .iter()
            .filter(|k| k.state == KeyState::Active)
            .max_by_key(|k| (k.created_at, k.key_id.clone()))
            .ok_or_else(|| StoreError::Backend("no active signing key".into()))?;
        let (bundle_version, bytes) = store
            .latest_bundle()
            .await?
            .ok_or_else(|| StoreError::Backend("no key bundle".into()))?;
        Ok(Self {
            anchor,
            signer: CapabilitySigner::from_seed(active.seed),
            bundle: SignedKeyBundle::from_bytes(bytes),
            bundle_version,
        })
    }

    /// Re-reads the store (other replicas may have rotated).
    pub async fn reload(&self, store: &Store) -> Result<Self, StoreError> {
        let keys = store.list_signing_keys().await?;
        let anchor = BundleSigner::from_seed(
            unhex32(
                &store
                    .kv_get(ANCHOR_KV)
                    .await?
                    .ok_or_else(|| StoreError::Backend("anchor seed vanished".into()))?,
            )
            .ok_or_else(|| StoreError::Backend("anchor seed is corrupt".into()))?,
        );
        Self::from_parts(store, anchor, &keys).await
    }
}

/// Pure: whether `bundle` ends every retiring key of `cut` (key ID, end of its grace)
/// by that time. A bundle that cannot be read (none yet, or not verifying) does not.
fn validity_is_cut(bundle: Option<&KeyBundle>, cut: &[(String, i64)]) -> bool {
    let Some(bundle) = bundle else {
        return cut.is_empty();
    };
    cut.iter().all(|(id, until)| {
        bundle
            .keys
            .iter()
            .find(|k| k.key_id.to_string() == *id)
            .is_none_or(|k| i64::try_from(k.not_after.unix_secs()).unwrap_or(i64::MAX) <= *until)
    })
}

/// Step one of a rotation: a new key is published (in a new bundle) but not yet used.
pub async fn begin_rotation(
    store: &Store,
    anchor: &BundleSigner,
    now: i64,
) -> Result<(SigningKeyRecord, u64, SignedKeyBundle), StoreError> {
    let record = new_key_record(KeyState::Published, now);
    store.insert_signing_key(&record).await?;
    let (version, bundle) = publish_bundle(store, anchor, now).await?;
    Ok((record, version, bundle))
}

/// Step two, once every receiver holds the new bundle: the new key signs, the old ones
/// retire. A retiring key stays in bundles, with its validity cut to the tombstone
/// retention (lifetime + skew on both ends), so verifiers refuse it by themselves
/// after every capability it signed has expired; [`retire_expired`] then drops it.
pub async fn activate(store: &Store, new_key: &str, now: i64) -> Result<(), StoreError> {
    // The new key first: a crash between the two steps leaves two active keys, of
    // which the newest signs (see `Keyring::load`, which finishes the step), never
    // none.
    store.kv_set(ACTIVATING_KV, new_key).await?;
    store
        .set_signing_key_state(new_key, KeyState::Active)
        .await?;
    space_http::crash::crash_point("control.rotate.activating");
    retire_all_but(store, new_key, now).await
}

/// The kv entry naming the key an activation makes active (set before its first step).
const ACTIVATING_KV: &str = "keys:activating";

/// Every key but `keep`: a published one (its rotation never completed; it signed
/// nothing) retires at once, an active one starts its retirement grace.
async fn retire_all_but(store: &Store, keep: &str, now: i64) -> Result<(), StoreError> {
    let grace = i64::try_from(space_identity::TOMBSTONE_RETENTION_SECS).unwrap_or(150);
    for k in store.list_signing_keys().await? {
        if k.state == KeyState::Published && k.key_id != keep {
            store
                .set_signing_key_state(&k.key_id, KeyState::Retired)
                .await?;
        }
        if k.state == KeyState::Active && k.key_id != keep {
            store
                .kv_set(&retire_kv(&k.key_id), &(now + grace).to_string())
                .await?;
            store
                .set_signing_key_state(&k.key_id, KeyState::Retiring)
                .await?;
        }
    }
    Ok(())
}

/// Retires keys whose retirement grace has passed; returns whether any did (a new
/// bundle must then be published and pushed).
pub async fn retire_expired(store: &Store, now: i64) -> Result<bool, StoreError> {
    let mut changed = false;
    for k in store.list_signing_keys().await? {
        if retire_at(store, &k).await?.is_some_and(|t| t < now) {
            store
                .set_signing_key_state(&k.key_id, KeyState::Retired)
                .await?;
            changed = true;
        }
    }
    Ok(changed)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bundle_with(key: &CapabilitySigner, not_after: u64) -> KeyBundle {
        KeyBundle {
            version: 1,
            issued_at: Timestamp::from_unix_secs(0),
            keys: vec![key.bundle_key(
                KeyUses::all(),
                Timestamp::from_unix_secs(0),
                Timestamp::from_unix_secs(not_after),
            )],
        }
    }

    #[test]
    fn a_bundle_that_keeps_a_retiring_key_valid_past_its_grace_is_not_cut() {
        let key = CapabilitySigner::from_seed([5; 32]);
        let id = key.key_id().to_string();
        let full = bundle_with(&key, 10_000);
        let cut = bundle_with(&key, 100);
        assert!(!validity_is_cut(Some(&full), &[(id.clone(), 100)]));
        assert!(validity_is_cut(Some(&cut), &[(id.clone(), 100)]));
        assert!(validity_is_cut(Some(&full), &[]));
        assert!(!validity_is_cut(None, &[(id, 100)]));
        assert!(validity_is_cut(None, &[]));
    }
}
