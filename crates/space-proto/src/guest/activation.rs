//! The activation record: how the per-execution secret reaches the agent.
//!
//! The launcher writes one JSON object to a file descriptor the agent inherits and
//! closes its end; the agent reads until EOF. JSON so that a shell script or a jail
//! profile can write it too; strict so that a typo never yields a default identity.

use std::fmt;

use serde::de::Error as _;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use space_identity::{Execution, ExecutionId, Generation, SandboxId};

use super::handshake::ServedIdentity;

/// Largest activation record the agent reads (a valid one is about 200 bytes).
pub const MAX_ACTIVATION_LEN: usize = 4096;

/// What the agent of one activation serves, and the secret it proves that with.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Activation {
    /// The sandbox.
    pub sandbox: SandboxId,
    /// Generation of the execution.
    pub generation: Generation,
    /// The execution.
    pub execution_id: ExecutionId,
    /// Activation attempt within the execution.
    pub activation: u32,
    /// Fresh for every activation; written as 64 lowercase hex digits.
    #[serde(serialize_with = "hex_ser", deserialize_with = "hex_de")]
    pub secret: [u8; 32],
}

// The secret must never reach a log through `{:?}`.
impl fmt::Debug for Activation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Activation")
            .field("sandbox", &self.sandbox)
            .field("generation", &self.generation)
            .field("execution_id", &self.execution_id)
            .field("activation", &self.activation)
            .field("secret", &"<redacted>")
            .finish()
    }
}

/// Why an activation record was refused.
#[derive(Debug, thiserror::Error)]
pub enum ActivationError {
    /// Longer than [`MAX_ACTIVATION_LEN`].
    #[error("activation record is over {MAX_ACTIVATION_LEN} bytes")]
    TooLarge,
    /// Not the expected JSON object.
    #[error("invalid activation record: {0}")]
    Invalid(#[from] serde_json::Error),
    /// Generation 0 is never issued.
    #[error("activation record names generation 0")]
    ZeroGeneration,
}

impl Activation {
    /// The identity this activation serves.
    pub fn identity(&self) -> ServedIdentity {
        ServedIdentity {
            sandbox: self.sandbox,
            execution: Execution {
                generation: self.generation,
                id: self.execution_id,
            },
            activation: self.activation,
        }
    }

    /// The JSON form, one object on one line.
    pub fn encode(&self) -> Vec<u8> {
        // A struct of strings and integers always serialises.
        serde_json::to_vec(self).unwrap_or_default()
    }

    /// Parses the JSON form strictly: unknown or duplicate fields, a secret that is not
    /// 64 lowercase hex digits, and generation 0 are refused.
    pub fn decode(bytes: &[u8]) -> Result<Self, ActivationError> {
        if bytes.len() > MAX_ACTIVATION_LEN {
            return Err(ActivationError::TooLarge);
        }
        let a: Self = serde_json::from_slice(bytes)?;
        if a.generation == Generation::NONE {
            return Err(ActivationError::ZeroGeneration);
        }
        Ok(a)
    }
}

fn hex_ser<S: Serializer>(v: &[u8; 32], s: S) -> Result<S::Ok, S::Error> {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let text: String = v
        .iter()
        .flat_map(|b| {
            [
                DIGITS[(b >> 4) as usize] as char,
                DIGITS[(b & 15) as usize] as char,
            ]
        })
        .collect();
    s.serialize_str(&text)
}

fn hex_de<'de, D: Deserializer<'de>>(d: D) -> Result<[u8; 32], D::Error> {
    let text = <std::borrow::Cow<'de, str>>::deserialize(d)?;
    let b = text.as_bytes();
    if b.len() != 64 {
        return Err(D::Error::custom("secret must be 64 hex digits"));
    }
    let nibble = |c: u8| match c {
        b'0'..=b'9' => Ok(c - b'0'),
        b'a'..=b'f' => Ok(c - b'a' + 10),
        _ => Err(D::Error::custom("secret must be lowercase hex")),
    };
    let mut out = [0u8; 32];
    for (i, pair) in b.chunks_exact(2).enumerate() {
        out[i] = (nibble(pair[0])? << 4) | nibble(pair[1])?;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Activation {
        Activation {
            sandbox: SandboxId::from_bytes([1; 16]),
            generation: Generation(3),
            execution_id: ExecutionId::from_bytes([2; 16]),
            activation: 1,
            secret: [0xa5; 32],
        }
    }

    #[test]
    fn activation_round_trips_as_one_json_object() {
        let a = sample();
        let text = String::from_utf8(a.encode()).unwrap();
        assert!(text.contains(&"a5".repeat(32)), "{text}");
        assert!(text.contains("\"sandbox\":\"sbx_"), "{text}");
        assert!(text.contains(",\"generation\":3,"), "{text}");
        assert_eq!(Activation::decode(text.as_bytes()).unwrap(), a);
    }

    #[test]
    fn activation_debug_never_shows_the_secret() {
        let shown = format!("{:?}", sample());
        assert!(!shown.contains("a5a5"), "{shown}");
        assert!(!shown.contains("165"), "{shown}");
    }

    #[test]
    fn activation_with_uppercase_short_or_extra_fields_is_refused() {
        let text = String::from_utf8(sample().encode()).unwrap();
        let upper = text.replace(&"a5".repeat(32), &"A5".repeat(32));
        assert!(Activation::decode(upper.as_bytes()).is_err());
        let short = text.replace(&"a5".repeat(32), &"a5".repeat(31));
        assert!(Activation::decode(short.as_bytes()).is_err());
        let extra = text.replacen('{', "{\"extra\":1,", 1);
        assert!(Activation::decode(extra.as_bytes()).is_err());
        let duplicate = text.replacen('{', "{\"generation\":9,", 1);
        assert!(Activation::decode(duplicate.as_bytes()).is_err());
        let missing = text.replace("\"activation\":1,", "");
        assert!(Activation::decode(missing.as_bytes()).is_err());
        let zero = text.replace("\"generation\":3", "\"generation\":0");
        assert!(matches!(
            Activation::decode(zero.as_bytes()),
            Err(ActivationError::ZeroGeneration)
        ));
        let big = vec![b' '; MAX_ACTIVATION_LEN + 1];
        assert!(matches!(
            Activation::decode(&big),
            Err(ActivationError::TooLarge)
        ));
    }
}
