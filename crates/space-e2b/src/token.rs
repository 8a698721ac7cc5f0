//! The envd access token (`envdAccessToken`, sent back as `X-Access-Token`): a MAC
//! over the tenant, the API key, the sandbox and the **execution** it was issued for.
//! It is never a capability: the front checks it, then asks the edge for a
//! short-lived capability of that execution for each operation, and refuses once the
//! sandbox runs another execution (a resume elsewhere, a migration): a token from
//! before is never served by the new execution, and `Sandbox.connect` gives a new
//! one. Pure: no I/O, no clock.

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use space_identity::{ExecutionId, SandboxId};

/// The version tag every token starts with.
pub(crate) const PREFIX: &str = "sxt1.";

/// Longest token read (anything longer is refused unread).
pub const MAX_TOKEN: usize = 512;

/// Bytes of the MAC kept in a token.
const TAG_BYTES: usize = 24;

/// What a token names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Claims {
    /// The tenant that created (or connected to) the sandbox.
    pub tenant: String,
    /// The API key it did so with: a revoked key's tokens stop working.
    pub key_id: String,
    /// The sandbox.
    pub sandbox: SandboxId,
    /// The execution that served the sandbox when the token was issued.
    pub execution: ExecutionId,
}

/// Why a presented token was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TokenError {
    /// Not a token of this front (wrong form, too long, bad encoding).
    Malformed,
    /// The MAC does not match: forged, altered, or issued under another secret.
    BadMac,
}

/// The secret tokens are made with (every replica reads the same one from the store).
#[derive(Clone)]
pub struct TokenKey([u8; 32]);

impl std::fmt::Debug for TokenKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("TokenKey(..)")
    }
}

impl TokenKey {
    /// A key from its 32 secret bytes.
    pub fn new(secret: [u8; 32]) -> Self {
        Self(blake3::derive_key(
            "space e2b envd access token v1",
            &secret,
        ))
    }

    /// The token for `claims`.
    pub fn mint(&self, claims: &Claims) -> String {
        let payload = payload(claims);
        let tag = self.tag(payload.as_bytes());
        format!(
            "{PREFIX}{}.{}",
            URL_SAFE_NO_PAD.encode(payload.as_bytes()),
            URL_SAFE_NO_PAD.encode(tag)
        )
    }

    /// The claims of a token this key made, or why not.
    pub fn verify(&self, token: &str) -> Result<Claims, TokenError> {
        if token.len() > MAX_TOKEN {
            return Err(TokenError::Malformed);
        }
        let rest = token.strip_prefix(PREFIX).ok_or(TokenError::Malformed)?;
        let (payload, tag) = rest.split_once('.').ok_or(TokenError::Malformed)?;
        let payload = URL_SAFE_NO_PAD
            .decode(payload)
            .map_err(|_| TokenError::Malformed)?;
        let tag = URL_SAFE_NO_PAD
            .decode(tag)
            .map_err(|_| TokenError::Malformed)?;
        let tag: [u8; TAG_BYTES] = tag.try_into().map_err(|_| TokenError::Malformed)?;
        let expected = self.tag(&payload);
        // Constant time: compared as whole BLAKE3 hashes of the two tags.
        if blake3::hash(&expected) != blake3::hash(&tag) {
            return Err(TokenError::BadMac);
        }
        parse(&payload).ok_or(TokenError::Malformed)
    }

    fn tag(&self, payload: &[u8]) -> [u8; TAG_BYTES] {
        let full = blake3::keyed_hash(&self.0, payload);
        let mut out = [0u8; TAG_BYTES];
        out.copy_from_slice(&full.as_bytes()[..TAG_BYTES]);
        out
    }
}

fn payload(c: &Claims) -> String {
    format!("{}\n{}\n{}\n{}", c.tenant, c.key_id, c.sandbox, c.execution)
}

fn parse(payload: &[u8]) -> Option<Claims> {
    let text = std::str::from_utf8(payload).ok()?;
    let mut parts = text.split('\n');
    let (tenant, key_id, sandbox, execution) =
        (parts.next()?, parts.next()?, parts.next()?, parts.next()?);
    if parts.next().is_some() || tenant.is_empty() || key_id.is_empty() {
        return None;
    }
    Some(Claims {
        tenant: tenant.to_owned(),
        key_id: key_id.to_owned(),
        sandbox: sandbox.parse().ok()?,
        execution: execution.parse().ok()?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn claims() -> Claims {
        Claims {
            tenant: "ten_abc".into(),
            key_id: "akabcdefghijklmnop".into(),
            sandbox: SandboxId::from_bytes([1; 16]),
            execution: ExecutionId::from_bytes([2; 16]),
        }
    }

    #[test]
    fn a_minted_token_verifies_to_its_claims() {
        let key = TokenKey::new([7; 32]);
        let c = claims();
        let t = key.mint(&c);
        assert!(t.len() < MAX_TOKEN, "{}", t.len());
        assert_eq!(key.verify(&t), Ok(c));
    }

    #[test]
    fn a_token_of_another_key_or_altered_in_any_byte_is_refused() {
        let key = TokenKey::new([7; 32]);
        let c = claims();
        let t = key.mint(&c);
        assert_eq!(TokenKey::new([8; 32]).verify(&t), Err(TokenError::BadMac));
        // Another execution of the same sandbox, the payload swapped in: the MAC fails.
        let other = key.mint(&Claims {
            execution: ExecutionId::from_bytes([3; 16]),
            ..c.clone()
        });
        let (head, _) = other.rsplit_once('.').unwrap();
        let (_, tag) = t.rsplit_once('.').unwrap();
        assert_eq!(
            key.verify(&format!("{head}.{tag}")),
            Err(TokenError::BadMac)
        );
        for i in PREFIX.len()..t.len() {
            let mut bytes = t.clone().into_bytes();
            bytes[i] = if bytes[i] == b'A' { b'B' } else { b'A' };
            let altered = String::from_utf8(bytes).unwrap();
            if altered != t {
                assert!(key.verify(&altered).is_err(), "byte {i}");
            }
        }
    }

    #[test]
    fn malformed_tokens_are_refused() {
        let key = TokenKey::new([7; 32]);
        let t = key.mint(&claims());
        for bad in [
            String::new(),
            "sxt1.".into(),
            t.replace("sxt1.", "sxt2."),
            format!("{t}.x"),
            "x".repeat(MAX_TOKEN + 1),
            format!("sxt1.{}.{}", URL_SAFE_NO_PAD.encode("a\nb\nc"), "AAAA"),
        ] {
            assert!(key.verify(&bad).is_err(), "{bad:?}");
        }
    }
}
