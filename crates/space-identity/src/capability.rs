//! The capability: a short-lived, signed selection of one execution.
//!
//! Encoding, version 1 (`Token` bytes):
//!
//! ```text
//! 0x01                      format version; it also fixes the algorithm (Ed25519)
//! (tag, value)*             claims, tags strictly increasing (no duplicates, one order)
//! signature [64]            Ed25519 over "space/capability/v1\0" || everything before it
//! ```
//!
//! | tag | claim | value |
//! |---|---|---|
//! | 0x01 | key ID | 8 bytes |
//! | 0x02 | sandbox | 16 bytes |
//! | 0x03 | generation | u64 BE, ≥ 1 |
//! | 0x04 | execution ID | 16 bytes |
//! | 0x05 | worker | u8 length (1–63) + name |
//! | 0x06 | substrate | u8 |
//! | 0x07 | activation | u32 BE |
//! | 0x08 | pod UID | 16 bytes; present exactly for the Kubernetes substrate |
//! | 0x09 | access set | u8 bit set, non-empty |
//! | 0x0a | purpose | u8 |
//! | 0x0b | port | u16 BE, non-zero; present exactly for `service_port` |
//! | 0x0c | protocol | u8; present exactly for `service_port` |
//! | 0x0d | issued at | u64 BE Unix seconds |
//! | 0x0e | expires at | u64 BE Unix seconds |
//! | 0x0f | token ID | 16 bytes |
//!
//! Integers are fixed-width, so the encoding is canonical: one set of claims has one
//! byte string. Unknown tags, repeated or out-of-order tags, missing claims, invalid
//! values and trailing bytes are all refused.

use std::fmt;

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use ed25519_dalek::{Signer, SigningKey, VerifyingKey};

use crate::codec::Reader;
use crate::ids::{
    Access, AccessSet, Execution, ExecutionId, Generation, Placement, PodUid, Protocol, Purpose,
    Route, SandboxId, ServicePort, Substrate, TokenId, WorkerId,
};
use crate::keys::{BundleKey, KeyId, KeyUses};
use crate::time::Timestamp;
use crate::verdict::DenyReason;
use crate::{MAX_CAPABILITY_BYTES, MAX_CAPABILITY_LIFETIME_SECS};

pub(crate) const DOMAIN_V1: &[u8] = b"space/capability/v1\0";
const FORMAT_V1: u8 = 1;
pub(crate) const SIGNATURE_LEN: usize = 64;
/// Longest text form accepted: the base64url length of [`MAX_CAPABILITY_BYTES`].
pub const MAX_CAPABILITY_TEXT: usize = MAX_CAPABILITY_BYTES.div_ceil(3) * 4;

mod tag {
    pub const KEY_ID: u8 = 0x01;
    pub const SANDBOX: u8 = 0x02;
    pub const GENERATION: u8 = 0x03;
    pub const EXECUTION_ID: u8 = 0x04;
    pub const WORKER: u8 = 0x05;
    pub const SUBSTRATE: u8 = 0x06;
    pub const ACTIVATION: u8 = 0x07;
    pub const POD_UID: u8 = 0x08;
    pub const ACCESS: u8 = 0x09;
    pub const PURPOSE: u8 = 0x0a;
    pub const PORT: u8 = 0x0b;
    pub const PROTOCOL: u8 = 0x0c;
    pub const ISSUED_AT: u8 = 0x0d;
    pub const EXPIRES_AT: u8 = 0x0e;
    pub const TOKEN_ID: u8 = 0x0f;
}

/// What a capability says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Claims {
    /// The signing key's ID.
    pub key_id: KeyId,
    /// The selected sandbox, execution and placement.
    pub route: Route,
    /// Permitted access.
    pub access: AccessSet,
    /// Which kind of receiver accepts it.
    pub purpose: Purpose,
    /// Port and protocol: present exactly when `purpose` is `service_port`.
    pub service_port: Option<ServicePort>,
    /// Issue time.
    pub issued_at: Timestamp,
    /// Expiry.
    pub expires_at: Timestamp,
    /// Random token ID.
    pub token_id: TokenId,
}

impl Claims {
    /// The canonical encoding of the claims (everything the signature covers).
    pub(crate) fn encode(&self) -> Vec<u8> {
        let r = &self.route;
        let mut out = Vec::with_capacity(160);
        out.push(FORMAT_V1);
        out.push(tag::KEY_ID);
        out.extend_from_slice(self.key_id.as_bytes());
        out.push(tag::SANDBOX);
        out.extend_from_slice(r.sandbox.as_bytes());
        out.push(tag::GENERATION);
        out.extend_from_slice(&r.execution.generation.0.to_be_bytes());
        out.push(tag::EXECUTION_ID);
        out.extend_from_slice(r.execution.id.as_bytes());
        out.push(tag::WORKER);
        let worker = r.placement.worker.as_str().as_bytes();
        // WorkerId guarantees 1..=63 bytes.
        out.push(worker.len() as u8);
        out.extend_from_slice(worker);
        out.push(tag::SUBSTRATE);
        out.push(r.placement.substrate.code());
        out.push(tag::ACTIVATION);
        out.extend_from_slice(&r.placement.activation.to_be_bytes());
        if let Some(uid) = &r.placement.pod_uid {
            out.push(tag::POD_UID);
            out.extend_from_slice(uid.as_bytes());
        }
        out.push(tag::ACCESS);
        out.push(self.access.bits());
        out.push(tag::PURPOSE);
        out.push(self.purpose.code());
        if let Some(sp) = &self.service_port {
            out.push(tag::PORT);
            out.extend_from_slice(&sp.port.to_be_bytes());
            out.push(tag::PROTOCOL);
            out.push(sp.protocol.code());
        }
        out.push(tag::ISSUED_AT);
        out.extend_from_slice(&self.issued_at.unix_secs().to_be_bytes());
        out.push(tag::EXPIRES_AT);
        out.extend_from_slice(&self.expires_at.unix_secs().to_be_bytes());
        out.push(tag::TOKEN_ID);
        out.extend_from_slice(self.token_id.as_bytes());
        out
    }

    /// Strictly decodes the claims region of a token (without the signature).
    pub(crate) fn decode(region: &[u8]) -> Result<Self, DenyReason> {
        use DenyReason::Malformed;
        let mut r = Reader::new(region);
        match r.u8() {
            Some(FORMAT_V1) => {}
            Some(_) => return Err(DenyReason::UnsupportedVersion),
            None => return Err(Malformed),
        }

        let mut key_id = None;
        let mut sandbox = None;
        let mut generation = None;
        let mut execution_id = None;
        let mut worker = None;
        let mut substrate = None;
        let mut activation = None;
        let mut pod_uid = None;
        let mut access = None;
        let mut purpose = None;
        let mut port = None;
        let mut protocol = None;
        let mut issued_at = None;
        let mut expires_at = None;
        let mut token_id = None;

        let mut last_tag = 0u8;
        while let Some(t) = r.u8() {
            if t <= last_tag {
                return Err(Malformed);
            }
            last_tag = t;
            match t {
                tag::KEY_ID => key_id = Some(KeyId::from_bytes(r.array().ok_or(Malformed)?)),
                tag::SANDBOX => sandbox = Some(SandboxId::from_bytes(r.array().ok_or(Malformed)?)),
                tag::GENERATION => {
                    let g = r.u64().ok_or(Malformed)?;
                    if g == 0 {
                        return Err(Malformed);
                    }
                    generation = Some(Generation(g));
                }
                tag::EXECUTION_ID => {
                    execution_id = Some(ExecutionId::from_bytes(r.array().ok_or(Malformed)?));
                }
                tag::WORKER => {
                    let len = usize::from(r.u8().ok_or(Malformed)?);
                    let name = r.take(len).ok_or(Malformed)?;
                    let name = std::str::from_utf8(name).map_err(|_| Malformed)?;
                    worker = Some(name.parse::<WorkerId>().map_err(|_| Malformed)?);
                }
                tag::SUBSTRATE => {
                    substrate =
                        Some(Substrate::from_code(r.u8().ok_or(Malformed)?).ok_or(Malformed)?);
                }
                tag::ACTIVATION => activation = Some(r.u32().ok_or(Malformed)?),
                tag::POD_UID => pod_uid = Some(PodUid::from_bytes(r.array().ok_or(Malformed)?)),
                tag::ACCESS => {
                    let set = AccessSet::from_bits(r.u8().ok_or(Malformed)?).ok_or(Malformed)?;
                    if set.is_empty() {
                        return Err(Malformed);
                    }
                    access = Some(set);
                }
                tag::PURPOSE => {
                    purpose = Some(Purpose::from_code(r.u8().ok_or(Malformed)?).ok_or(Malformed)?);
                }
                tag::PORT => {
                    let p = r.u16().ok_or(Malformed)?;
                    if p == 0 {
                        return Err(Malformed);
                    }
                    port = Some(p);
                }
                tag::PROTOCOL => {
                    protocol =
                        Some(Protocol::from_code(r.u8().ok_or(Malformed)?).ok_or(Malformed)?);
                }
                tag::ISSUED_AT => {
                    issued_at = Some(Timestamp::from_unix_secs(r.u64().ok_or(Malformed)?))
                }
                tag::EXPIRES_AT => {
                    expires_at = Some(Timestamp::from_unix_secs(r.u64().ok_or(Malformed)?))
                }
                tag::TOKEN_ID => token_id = Some(TokenId::from_bytes(r.array().ok_or(Malformed)?)),
                _ => return Err(Malformed),
            }
        }

        let substrate = substrate.ok_or(Malformed)?;
        let purpose = purpose.ok_or(Malformed)?;
        let access = access.ok_or(Malformed)?;
        // The pod UID exists exactly for Kubernetes placements.
        if pod_uid.is_some() != (substrate == Substrate::Kubernetes) {
            return Err(Malformed);
        }
        let service_port = match (purpose, port, protocol) {
            (Purpose::ServicePort, Some(port), Some(protocol)) => {
                Some(ServicePort { port, protocol })
            }
            (Purpose::Control, None, None) => None,
            _ => return Err(Malformed),
        };
        // A service-port capability grants that port and nothing else; a control
        // capability never grants a port.
        let port_access = access.contains(Access::ServicePort);
        match purpose {
            Purpose::ServicePort if access != AccessSet::of(&[Access::ServicePort]) => {
                return Err(Malformed);
            }
            Purpose::Control if port_access => return Err(Malformed),
            _ => {}
        }

        Ok(Self {
            key_id: key_id.ok_or(Malformed)?,
            route: Route {
                sandbox: sandbox.ok_or(Malformed)?,
                execution: Execution {
                    generation: generation.ok_or(Malformed)?,
                    id: execution_id.ok_or(Malformed)?,
                },
                placement: Placement {
                    worker: worker.ok_or(Malformed)?,
                    substrate,
                    activation: activation.ok_or(Malformed)?,
                    pod_uid,
                },
            },
            access,
            purpose,
            service_port,
            issued_at: issued_at.ok_or(Malformed)?,
            expires_at: expires_at.ok_or(Malformed)?,
            token_id: token_id.ok_or(Malformed)?,
        })
    }
}

/// An encoded, signed capability.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct Token(Vec<u8>);

impl Token {
    /// Wraps received bytes. Nothing is checked until a receiver verifies it.
    pub fn from_bytes(bytes: Vec<u8>) -> Self {
        Self(bytes)
    }

    /// The encoded bytes.
    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }

    /// The text form for HTTP headers: base64url without padding.
    pub fn to_text(&self) -> String {
        URL_SAFE_NO_PAD.encode(&self.0)
    }

    /// Parses the text form. The length is checked before any decoding; only the
    /// canonical base64url spelling is accepted.
    pub fn from_text(text: &str) -> Result<Self, DenyReason> {
        if text.len() > MAX_CAPABILITY_TEXT {
            return Err(DenyReason::Oversized);
        }
        URL_SAFE_NO_PAD
            .decode(text)
            .map(Self)
            .map_err(|_| DenyReason::Malformed)
    }
}

impl fmt::Debug for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Tokens are bearer credentials: never print them whole.
        write!(f, "Token({} bytes)", self.0.len())
    }
}

/// Why the control plane refused to sign a set of claims.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SignError {
    /// The claims name another key than this signer's.
    KeyMismatch,
    /// The lifetime is negative or over the maximum.
    LifetimeTooLong,
    /// The claims break a structural rule (see the module documentation).
    Invalid,
}

impl fmt::Display for SignError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::KeyMismatch => "claims name another signing key",
            Self::LifetimeTooLong => "capability lifetime out of range",
            Self::Invalid => "claims are not a valid capability",
        })
    }
}

impl std::error::Error for SignError {}

/// A capability signing key with its ID. Only the control plane holds one.
pub struct CapabilitySigner {
    key: SigningKey,
    key_id: KeyId,
}

impl fmt::Debug for CapabilitySigner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CapabilitySigner")
            .field("key_id", &self.key_id)
            .finish_non_exhaustive()
    }
}

impl CapabilitySigner {
    /// A signer from 32 secret bytes (the caller draws them from a CSPRNG).
    pub fn from_seed(seed: [u8; 32]) -> Self {
        let key = SigningKey::from_bytes(&seed);
        let key_id = KeyId::of(&key.verifying_key());
        Self { key, key_id }
    }

    /// The key's ID.
    pub fn key_id(&self) -> KeyId {
        self.key_id
    }

    /// The verification half.
    pub fn verifying_key(&self) -> VerifyingKey {
        self.key.verifying_key()
    }

    /// The bundle entry that publishes this key.
    pub fn bundle_key(
        &self,
        uses: KeyUses,
        not_before: Timestamp,
        not_after: Timestamp,
    ) -> BundleKey {
        BundleKey {
            key_id: self.key_id,
            public: self.key.verifying_key(),
            uses,
            not_before,
            not_after,
        }
    }

    /// Signs claims. The issuer applies the same structural and lifetime rules as the
    /// verifier, so it never hands out a capability that every receiver would refuse.
    pub fn sign(&self, claims: &Claims) -> Result<Token, SignError> {
        if claims.key_id != self.key_id {
            return Err(SignError::KeyMismatch);
        }
        if claims.expires_at < claims.issued_at
            || claims.expires_at.unix_secs() - claims.issued_at.unix_secs()
                > MAX_CAPABILITY_LIFETIME_SECS
        {
            return Err(SignError::LifetimeTooLong);
        }
        let bytes = claims.encode();
        if bytes.len() + SIGNATURE_LEN > MAX_CAPABILITY_BYTES || Claims::decode(&bytes).is_err() {
            return Err(SignError::Invalid);
        }
        Ok(self.sign_region(bytes))
    }

    /// Signs an encoded claims region as it is.
    pub(crate) fn sign_region(&self, mut region: Vec<u8>) -> Token {
        let sig = with_signed_message(&region, |msg| self.key.sign(msg));
        region.extend_from_slice(&sig.to_bytes());
        Token(region)
    }
}

/// Runs `f` on the domain-separated message for a claims region, built on the stack
/// (verifiers only see regions under the size cap; anything larger goes to the heap).
pub(crate) fn with_signed_message<R>(region: &[u8], f: impl FnOnce(&[u8]) -> R) -> R {
    let mut buf = [0u8; DOMAIN_V1.len() + MAX_CAPABILITY_BYTES];
    let len = DOMAIN_V1.len() + region.len();
    if len > buf.len() {
        return f(&[DOMAIN_V1, region].concat());
    }
    buf[..DOMAIN_V1.len()].copy_from_slice(DOMAIN_V1);
    buf[DOMAIN_V1.len()..len].copy_from_slice(region);
    f(&buf[..len])
}
