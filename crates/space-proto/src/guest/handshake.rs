//! The handshake: the client learns, with proof, which execution the agent serves.
//!
//! A restored snapshot still holds its predecessor's memory (`IDENTITY.md` §5), so the
//! agent's *claim* of an execution is worth nothing alone. Every activation hands the
//! agent a fresh secret; the bridge, which knows the same secret, sends a random nonce
//! and accepts only an answer keyed with that secret over the nonce and the identity.

use serde::{Deserialize, Serialize};
use space_identity::{Execution, ExecutionId, Generation, SandboxId};

use crate::codec::wire;

/// The protocol version this crate speaks. The agent refuses any other. (2: exec output
/// caps — `ExecSpec::max_output_bytes` and the truncation flags of `ExitStatus`. 3:
/// accounts — `ExecSpec::user`, `WriteFile::user`, `ReadTree`/`WriteTree`. 4: file
/// details — owners, groups and times in `FileStat` and `DirEntry`, `FileStat::path`,
/// `Mkdir::user` answered `Made`, `Rename::user`.)
pub const PROTOCOL_VERSION: u32 = 4;

/// Domain separation for the proof, so the secret's MAC can never be confused with any
/// other use of the same key.
pub const PROOF_CONTEXT: &[u8] = b"space/guest-proof/v1\0";

/// First frame of a connection, client → agent.
///
/// Its encoding starts with the frame tag and then `protocol_version`, in every version,
/// so an agent can read the version of a hello it cannot otherwise decode.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Hello {
    /// Must equal the agent's [`PROTOCOL_VERSION`].
    pub protocol_version: u32,
    /// Fresh random bytes from the client; never reuse one.
    pub nonce: [u8; 32],
}

/// The agent's answer to a [`Hello`]: who it serves, and a proof it holds the secret of
/// that activation.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct HelloAck {
    /// The protocol version the agent speaks (equal to the client's).
    pub protocol_version: u32,
    /// The sandbox the agent belongs to.
    #[serde(with = "wire::sandbox_id")]
    pub sandbox: SandboxId,
    /// Generation of the execution the agent serves.
    pub generation: Generation,
    /// The execution the agent serves.
    #[serde(with = "wire::execution_id")]
    pub execution_id: ExecutionId,
    /// Activation attempt within the execution.
    pub activation: u32,
    /// [`compute_proof`] over the client's nonce and the fields above.
    pub proof: [u8; 32],
}

/// The identity an agent claims: everything in a [`HelloAck`] but the proof.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ServedIdentity {
    /// The sandbox.
    pub sandbox: SandboxId,
    /// The execution.
    pub execution: Execution,
    /// Activation attempt.
    pub activation: u32,
}

impl HelloAck {
    /// The identity this ack claims (not yet verified: see [`verify_proof`]).
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
}

fn proof_hash(secret: &[u8; 32], nonce: &[u8; 32], id: &ServedIdentity) -> blake3::Hash {
    let mut h = blake3::Hasher::new_keyed(secret);
    h.update(PROOF_CONTEXT);
    h.update(nonce);
    h.update(id.sandbox.as_bytes());
    h.update(&id.execution.generation.get().to_be_bytes());
    h.update(id.execution.id.as_bytes());
    h.update(&id.activation.to_be_bytes());
    h.finalize()
}

/// `blake3::keyed_hash(secret, context || nonce || sandbox || generation BE ||
/// execution_id || activation BE)`: what the agent puts in [`HelloAck::proof`].
pub fn compute_proof(secret: &[u8; 32], nonce: &[u8; 32], id: &ServedIdentity) -> [u8; 32] {
    *proof_hash(secret, nonce, id).as_bytes()
}

/// Whether `ack` proves knowledge of `secret` for this `nonce` and the identity it
/// names. The comparison is constant-time (`blake3::Hash` equality), so a forger learns
/// nothing from timing.
pub fn verify_proof(secret: &[u8; 32], nonce: &[u8; 32], ack: &HelloAck) -> bool {
    proof_hash(secret, nonce, &ack.identity()) == blake3::Hash::from_bytes(ack.proof)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ack(secret: &[u8; 32], nonce: &[u8; 32]) -> HelloAck {
        let id = ServedIdentity {
            sandbox: SandboxId::from_bytes([1; 16]),
            execution: Execution {
                generation: Generation(7),
                id: ExecutionId::from_bytes([2; 16]),
            },
            activation: 3,
        };
        HelloAck {
            protocol_version: PROTOCOL_VERSION,
            sandbox: id.sandbox,
            generation: id.execution.generation,
            execution_id: id.execution.id,
            activation: id.activation,
            proof: compute_proof(secret, nonce, &id),
        }
    }

    #[test]
    fn a_hello_ack_encodes_its_generation_as_the_bare_u64_it_was() {
        #[derive(Serialize)]
        struct AckOfU64 {
            protocol_version: u32,
            #[serde(with = "wire::sandbox_id")]
            sandbox: SandboxId,
            generation: u64,
            #[serde(with = "wire::execution_id")]
            execution_id: ExecutionId,
            activation: u32,
            proof: [u8; 32],
        }
        let ack = ack(&[9; 32], &[4; 32]);
        let mut far = ack.clone();
        far.generation = Generation(u64::MAX);
        for a in [ack, far] {
            let before = AckOfU64 {
                protocol_version: a.protocol_version,
                sandbox: a.sandbox,
                generation: a.generation.get(),
                execution_id: a.execution_id,
                activation: a.activation,
                proof: a.proof,
            };
            assert_eq!(
                postcard::to_allocvec(&a).unwrap(),
                postcard::to_allocvec(&before).unwrap()
            );
        }
    }

    #[test]
    fn proof_matches_the_documented_construction() {
        let (secret, nonce) = ([9; 32], [4; 32]);
        let mut input = PROOF_CONTEXT.to_vec();
        input.extend_from_slice(&nonce);
        input.extend_from_slice(&[1; 16]);
        input.extend_from_slice(&7u64.to_be_bytes());
        input.extend_from_slice(&[2; 16]);
        input.extend_from_slice(&3u32.to_be_bytes());
        assert_eq!(
            ack(&secret, &nonce).proof,
            *blake3::keyed_hash(&secret, &input).as_bytes()
        );
    }

    #[test]
    fn proof_verifies_only_with_the_same_secret_nonce_and_identity() {
        let (secret, nonce) = ([9; 32], [4; 32]);
        let good = ack(&secret, &nonce);
        assert!(verify_proof(&secret, &nonce, &good));
        assert!(!verify_proof(&[8; 32], &nonce, &good));
        assert!(!verify_proof(&secret, &[5; 32], &good));
        let mut other_generation = good.clone();
        other_generation.generation = Generation(8);
        assert!(!verify_proof(&secret, &nonce, &other_generation));
        let mut other_execution = good.clone();
        other_execution.execution_id = ExecutionId::from_bytes([3; 16]);
        assert!(!verify_proof(&secret, &nonce, &other_execution));
        let mut other_activation = good.clone();
        other_activation.activation = 4;
        assert!(!verify_proof(&secret, &nonce, &other_activation));
        let mut other_sandbox = good;
        other_sandbox.sandbox = SandboxId::from_bytes([0; 16]);
        assert!(!verify_proof(&secret, &nonce, &other_sandbox));
    }
}
