//! Signing keys, verification-key bundles and the receiver's installed key set.
//!
//! The control plane holds the signing keys. Receivers (workers, gateways) hold only a
//! [`KeyBundle`]: verification keys with an ID, the purposes each may sign for, and a
//! validity window. A bundle is itself signed by a trust anchor (a separate key the
//! receiver was given at enrollment), carries a version that never goes backwards, and
//! has one canonical encoding.

use std::collections::HashMap;
use std::fmt;
use std::str::FromStr;

use ed25519_dalek::{Signature, Signer, SigningKey, VerifyingKey};

use crate::codec::Reader;
use crate::ids::{ParseIdError, Purpose};
use crate::time::Timestamp;

/// Identifies a signing key: the first 8 bytes of the BLAKE3 hash of its public key,
/// so an ID can never name two different keys in a well-formed bundle.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct KeyId([u8; 8]);

impl KeyId {
    /// The ID of a public key.
    pub fn of(key: &VerifyingKey) -> Self {
        let hash = blake3::hash(key.as_bytes());
        let mut id = [0u8; 8];
        id.copy_from_slice(&hash.as_bytes()[..8]);
        Self(id)
    }

    /// Raw bytes.
    pub const fn as_bytes(&self) -> &[u8; 8] {
        &self.0
    }

    pub(crate) const fn from_bytes(bytes: [u8; 8]) -> Self {
        Self(bytes)
    }
}

impl fmt::Display for KeyId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("key_")?;
        self.0.iter().try_for_each(|b| write!(f, "{b:02x}"))
    }
}

impl fmt::Debug for KeyId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl FromStr for KeyId {
    type Err = ParseIdError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        const ERR: ParseIdError = ParseIdError::new("key id");
        let hex = s.strip_prefix("key_").ok_or(ERR)?.as_bytes();
        if hex.len() != 16 {
            return Err(ERR);
        }
        let mut out = [0u8; 8];
        for (i, pair) in hex.chunks(2).enumerate() {
            let nibble = |c: u8| match c {
                b'0'..=b'9' => Some(c - b'0'),
                b'a'..=b'f' => Some(c - b'a' + 10),
                _ => None,
            };
            out[i] = (nibble(pair[0]).ok_or(ERR)? << 4) | nibble(pair[1]).ok_or(ERR)?;
        }
        Ok(Self(out))
    }
}

crate::codec::serde_text!(KeyId);

/// The capability purposes a key may sign for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct KeyUses(u8);

impl KeyUses {
    /// A key for one purpose.
    pub const fn only(purpose: Purpose) -> Self {
        Self(purpose.code())
    }

    /// A key for both purposes.
    pub const fn all() -> Self {
        Self(Purpose::Control.code() | Purpose::ServicePort.code())
    }

    /// Whether the key may sign capabilities of `purpose`.
    pub const fn allows(self, purpose: Purpose) -> bool {
        self.0 & purpose.code() != 0
    }

    const fn from_bits(bits: u8) -> Option<Self> {
        if bits == 0 || bits & !Self::all().0 != 0 {
            None
        } else {
            Some(Self(bits))
        }
    }
}

/// One verification key in a bundle.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BundleKey {
    /// Its ID (derived from the key).
    pub key_id: KeyId,
    /// The Ed25519 public key.
    pub public: VerifyingKey,
    /// What it may sign.
    pub uses: KeyUses,
    /// Start of validity (inclusive).
    pub not_before: Timestamp,
    /// End of validity (inclusive).
    pub not_after: Timestamp,
}

impl BundleKey {
    /// Whether the key is within its validity window at `now`.
    pub fn is_valid_at(&self, now: Timestamp) -> bool {
        self.not_before <= now && now <= self.not_after
    }
}

/// A versioned set of verification keys.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeyBundle {
    /// Strictly grows with every change; receivers refuse anything older.
    pub version: u64,
    /// When the control plane made it.
    pub issued_at: Timestamp,
    /// The keys, each ID once.
    pub keys: Vec<BundleKey>,
}

/// Why a key bundle was refused. The installed bundle is unchanged.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum BundleError {
    /// Larger than any valid bundle.
    Oversized,
    /// Not a bundle: truncated, trailing bytes, bad values, keys out of order or
    /// repeated, or no keys at all.
    Malformed,
    /// A format version this receiver does not know.
    UnsupportedVersion,
    /// The trust anchor did not sign it.
    BadSignature,
    /// A key of small order (or otherwise weak) is listed.
    WeakKey,
    /// A key is listed under an ID that is not its own.
    KeyIdMismatch,
    /// Older than the installed bundle.
    Rollback {
        /// Installed version.
        installed: u64,
        /// Offered version.
        offered: u64,
    },
    /// Same version as the installed bundle with different contents.
    ConflictingVersion {
        /// The version both claim.
        version: u64,
    },
}

impl fmt::Display for BundleError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Oversized => f.write_str("key bundle too large"),
            Self::Malformed => f.write_str("key bundle malformed"),
            Self::UnsupportedVersion => f.write_str("key bundle format not supported"),
            Self::BadSignature => f.write_str("key bundle not signed by the trust anchor"),
            Self::WeakKey => f.write_str("key bundle lists a weak key"),
            Self::KeyIdMismatch => f.write_str("key bundle lists a key under a foreign id"),
            Self::Rollback { installed, offered } => {
                write!(
                    f,
                    "key bundle version {offered} is older than installed {installed}"
                )
            }
            Self::ConflictingVersion { version } => {
                write!(
                    f,
                    "key bundle version {version} differs from the installed one"
                )
            }
        }
    }
}

impl std::error::Error for BundleError {}

const BUNDLE_DOMAIN: &[u8] = b"space/key-bundle/v1\0";
const BUNDLE_FORMAT_V1: u8 = 1;
const BUNDLE_HEADER: usize = 1 + 8 + 8 + 2;
const BUNDLE_KEY_LEN: usize = 8 + 32 + 1 + 8 + 8;
/// Most keys one bundle may list.
pub const MAX_BUNDLE_KEYS: usize = 64;
const MAX_BUNDLE_BYTES: usize = BUNDLE_HEADER + MAX_BUNDLE_KEYS * BUNDLE_KEY_LEN + 64;

impl KeyBundle {
    pub(crate) fn encode_body(&self) -> Vec<u8> {
        let mut keys: Vec<&BundleKey> = self.keys.iter().collect();
        keys.sort_by_key(|k| k.key_id);
        let mut out = Vec::with_capacity(BUNDLE_HEADER + keys.len() * BUNDLE_KEY_LEN + 64);
        out.push(BUNDLE_FORMAT_V1);
        out.extend_from_slice(&self.version.to_be_bytes());
        out.extend_from_slice(&self.issued_at.unix_secs().to_be_bytes());
        // Bounded by MAX_BUNDLE_KEYS at signing time.
        out.extend_from_slice(&(keys.len() as u16).to_be_bytes());
        for k in keys {
            out.extend_from_slice(k.key_id.as_bytes());
            out.extend_from_slice(k.public.as_bytes());
            out.push(k.uses.0);
            out.extend_from_slice(&k.not_before.unix_secs().to_be_bytes());
            out.extend_from_slice(&k.not_after.unix_secs().to_be_bytes());
        }
        out
    }

    /// Decodes a signed bundle and checks the anchor's signature (strictly).
    pub fn decode_verified(bytes: &[u8], anchor: &VerifyingKey) -> Result<Self, BundleError> {
        if bytes.len() > MAX_BUNDLE_BYTES {
            return Err(BundleError::Oversized);
        }
        if bytes.len() < BUNDLE_HEADER + 64 {
            return Err(BundleError::Malformed);
        }
        let (body, sig) = bytes.split_at(bytes.len() - 64);
        if body[0] != BUNDLE_FORMAT_V1 {
            return Err(BundleError::UnsupportedVersion);
        }
        let sig = Signature::from_slice(sig).map_err(|_| BundleError::BadSignature)?;
        let mut msg = Vec::with_capacity(BUNDLE_DOMAIN.len() + body.len());
        msg.extend_from_slice(BUNDLE_DOMAIN);
        msg.extend_from_slice(body);
        anchor
            .verify_strict(&msg, &sig)
            .map_err(|_| BundleError::BadSignature)?;
        Self::decode_body(body)
    }

    fn decode_body(body: &[u8]) -> Result<Self, BundleError> {
        use BundleError::Malformed;
        let mut r = Reader::new(&body[1..]);
        let version = r.u64().ok_or(Malformed)?;
        let issued_at = Timestamp::from_unix_secs(r.u64().ok_or(Malformed)?);
        let count = usize::from(r.u16().ok_or(Malformed)?);
        if count == 0 || count > MAX_BUNDLE_KEYS {
            return Err(Malformed);
        }
        let mut keys: Vec<BundleKey> = Vec::with_capacity(count);
        for _ in 0..count {
            let key_id = KeyId(r.array().ok_or(Malformed)?);
            let public_bytes: [u8; 32] = r.array().ok_or(Malformed)?;
            let uses = KeyUses::from_bits(r.u8().ok_or(Malformed)?).ok_or(Malformed)?;
            let not_before = Timestamp::from_unix_secs(r.u64().ok_or(Malformed)?);
            let not_after = Timestamp::from_unix_secs(r.u64().ok_or(Malformed)?);
            let public = VerifyingKey::from_bytes(&public_bytes).map_err(|_| Malformed)?;
            if public.is_weak() {
                return Err(BundleError::WeakKey);
            }
            if KeyId::of(&public) != key_id {
                return Err(BundleError::KeyIdMismatch);
            }
            if not_after < not_before {
                return Err(Malformed);
            }
            // Strictly increasing IDs: one encoding per bundle, no duplicates.
            if keys.last().is_some_and(|prev| prev.key_id >= key_id) {
                return Err(Malformed);
            }
            keys.push(BundleKey {
                key_id,
                public,
                uses,
                not_before,
                not_after,
            });
        }
        if !r.is_empty() {
            return Err(Malformed);
        }
        Ok(Self {
            version,
            issued_at,
            keys,
        })
    }
}

/// The encoded, signed form of a [`KeyBundle`], as pushed to receivers and persisted
/// by them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SignedKeyBundle(Vec<u8>);

impl SignedKeyBundle {
    /// Wraps received bytes (checked when installed).
    pub fn from_bytes(bytes: Vec<u8>) -> Self {
        Self(bytes)
    }

    /// The encoded bytes.
    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }
}

/// The trust anchor's signing half: signs key bundles. Held by the control plane.
pub struct BundleSigner {
    key: SigningKey,
}

impl fmt::Debug for BundleSigner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BundleSigner")
            .field("anchor", &KeyId::of(&self.key.verifying_key()))
            .finish_non_exhaustive()
    }
}

impl BundleSigner {
    /// A signer from 32 secret bytes (the caller draws them from a CSPRNG).
    pub fn from_seed(seed: [u8; 32]) -> Self {
        Self {
            key: SigningKey::from_bytes(&seed),
        }
    }

    /// The public half that receivers trust.
    pub fn anchor(&self) -> VerifyingKey {
        self.key.verifying_key()
    }

    /// Signs a control update (install, retire, pause … for one worker) so the worker can
    /// check it came from the control plane before it persists and acknowledges it.
    /// Domain-separated from bundles and capabilities.
    pub fn sign_update(&self, body: &[u8]) -> [u8; 64] {
        let msg = [UPDATE_DOMAIN, body].concat();
        self.key.sign(&msg).to_bytes()
    }

    /// Signs the delivery descriptor of an update (worker, time, size and digest of the
    /// request body), sent in a header so that the worker authenticates the sender
    /// before it reads the body. Domain-separated from updates, bundles and
    /// capabilities: a descriptor never verifies as an update, nor the reverse.
    pub fn sign_delivery(&self, descriptor: &[u8]) -> [u8; 64] {
        let msg = [DELIVERY_DOMAIN, descriptor].concat();
        self.key.sign(&msg).to_bytes()
    }

    /// Signs a bundle. Panics never; refuses bundles no receiver would accept.
    pub fn sign(&self, bundle: &KeyBundle) -> Result<SignedKeyBundle, BundleError> {
        if bundle.keys.is_empty() || bundle.keys.len() > MAX_BUNDLE_KEYS {
            return Err(BundleError::Malformed);
        }
        let mut ids: Vec<KeyId> = bundle.keys.iter().map(|k| k.key_id).collect();
        ids.sort();
        ids.dedup();
        if ids.len() != bundle.keys.len() {
            return Err(BundleError::Malformed);
        }
        if bundle.keys.iter().any(|k| KeyId::of(&k.public) != k.key_id) {
            return Err(BundleError::KeyIdMismatch);
        }
        if bundle.keys.iter().any(|k| k.public.is_weak()) {
            return Err(BundleError::WeakKey);
        }
        Ok(self.sign_body(bundle.encode_body()))
    }

    pub(crate) fn sign_body(&self, mut body: Vec<u8>) -> SignedKeyBundle {
        let mut msg = Vec::with_capacity(BUNDLE_DOMAIN.len() + body.len());
        msg.extend_from_slice(BUNDLE_DOMAIN);
        msg.extend_from_slice(&body);
        let sig = self.key.sign(&msg);
        body.extend_from_slice(&sig.to_bytes());
        SignedKeyBundle(body)
    }
}

const UPDATE_DOMAIN: &[u8] = b"space/control-update/v1\0";
const DELIVERY_DOMAIN: &[u8] = b"space/update-delivery/v1\0";

/// Checks the signature (strictly) of an update's delivery descriptor against the
/// trust anchor (see [`BundleSigner::sign_delivery`]).
pub fn verify_delivery(anchor: &VerifyingKey, descriptor: &[u8], signature: &[u8; 64]) -> bool {
    let msg = [DELIVERY_DOMAIN, descriptor].concat();
    anchor
        .verify_strict(&msg, &Signature::from_bytes(signature))
        .is_ok()
}

/// Checks a control update's signature (strictly) against the trust anchor.
pub fn verify_update(anchor: &VerifyingKey, body: &[u8], signature: &[u8; 64]) -> bool {
    let msg = [UPDATE_DOMAIN, body].concat();
    anchor
        .verify_strict(&msg, &Signature::from_bytes(signature))
        .is_ok()
}

/// A receiver's installed verification keys: one bundle, never rolled back.
#[derive(Debug, Clone)]
pub struct InstalledKeys {
    anchor: VerifyingKey,
    installed: Option<(KeyBundle, SignedKeyBundle)>,
    by_id: HashMap<KeyId, BundleKey>,
}

impl InstalledKeys {
    /// The trust anchor this key set accepts bundles from.
    pub fn anchor(&self) -> &VerifyingKey {
        &self.anchor
    }

    /// An empty key set that trusts bundles signed by `anchor`. It verifies nothing
    /// until a bundle is installed.
    pub fn new(anchor: VerifyingKey) -> Self {
        Self {
            anchor,
            installed: None,
            by_id: HashMap::new(),
        }
    }

    /// Installs a signed bundle. Returns `Ok(true)` if it replaced the installed one,
    /// `Ok(false)` if it is the installed one again. A refused bundle changes nothing.
    pub fn install(&mut self, signed: &SignedKeyBundle) -> Result<bool, BundleError> {
        let bundle = KeyBundle::decode_verified(signed.as_bytes(), &self.anchor)?;
        if let Some((current, current_bytes)) = &self.installed {
            if bundle.version < current.version {
                return Err(BundleError::Rollback {
                    installed: current.version,
                    offered: bundle.version,
                });
            }
            if bundle.version == current.version {
                return if current_bytes == signed {
                    Ok(false)
                } else {
                    Err(BundleError::ConflictingVersion {
                        version: bundle.version,
                    })
                };
            }
        }
        self.by_id = bundle.keys.iter().map(|k| (k.key_id, k.clone())).collect();
        self.installed = Some((bundle, signed.clone()));
        Ok(true)
    }

    /// The installed bundle's version (0 when none is installed).
    pub fn version(&self) -> u64 {
        self.installed.as_ref().map_or(0, |(b, _)| b.version)
    }

    /// The installed bundle, signed, for persistence.
    pub fn signed_bundle(&self) -> Option<&SignedKeyBundle> {
        self.installed.as_ref().map(|(_, s)| s)
    }

    /// The installed key with this ID. Keys are only ever looked up here: a key named
    /// by a token is never fetched.
    pub fn get(&self, id: &KeyId) -> Option<&BundleKey> {
        self.by_id.get(id)
    }
}
