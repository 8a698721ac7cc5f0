//! The records the store keeps: plain structs with public fields.
//!
//! State enums have one lowercase text form each, which is what the database holds: a
//! row stays readable with `psql`/`sqlite3`, and a variant added later never renumbers
//! the old ones.

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};
pub use space_egress::{NetworkMode, Policy};
use space_identity::{Execution, ExecutionId, Generation, PodUid, SandboxId, Substrate, WorkerId};

/// A text form that is not one of an enum's variants.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("not a valid {kind}: {text:?}")]
pub struct ParseStateError {
    kind: &'static str,
    text: String,
}

macro_rules! text_state {
    ($(#[$doc:meta])* $name:ident, $kind:literal, { $($(#[$vdoc:meta])* $variant:ident => $text:literal),+ $(,)? }) => {
        $(#[$doc])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
        #[serde(rename_all = "snake_case")]
        pub enum $name {
            $($(#[$vdoc])* $variant),+
        }

        impl $name {
            /// Every variant, in declaration order.
            pub const ALL: &'static [$name] = &[$($name::$variant),+];

            /// The stable text form stored in the database.
            pub const fn as_str(self) -> &'static str {
                match self {
                    $($name::$variant => $text),+
                }
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.as_str())
            }
        }

        impl FromStr for $name {
            type Err = ParseStateError;

            fn from_str(s: &str) -> Result<Self, Self::Err> {
                match s {
                    $($text => Ok($name::$variant),)+
                    _ => Err(ParseStateError { kind: $kind, text: s.to_owned() }),
                }
            }
        }
    };
}

text_state!(
    /// Whether the control plane places new executions on a worker.
    WorkerState, "worker state", {
        /// Accepts new executions.
        Active => "active",
        /// Keeps what it runs but receives nothing new.
        Draining => "draining",
        /// Unreachable or removed; its executions must be replaced elsewhere.
        Dead => "dead",
    }
);

text_state!(
    /// The user-visible state of a sandbox (the `state` field of the edge API).
    SandboxState, "sandbox state", {
        /// An execution is being started.
        Starting => "starting",
        /// Its current execution runs.
        Running => "running",
        /// Suspended; no execution runs until it is resumed.
        Paused => "paused",
        /// Moving to another worker.
        Migrating => "migrating",
        /// Deleted or expired; never runs again.
        Stopped => "stopped",
    }
);

text_state!(
    /// The life of one execution.
    ExecutionState, "execution state", {
        /// Allocated; its worker has not yet acknowledged it as running.
        Pending => "pending",
        /// Acknowledged as running by its worker.
        Running => "running",
        /// Failed to start or died; its generation stays consumed.
        Failed => "failed",
        /// Replaced by a later execution or stopped on purpose.
        Retired => "retired",
    }
);

text_state!(
    /// Where a signing key is in its rotation.
    KeyState, "key state", {
        /// Distributed to verifiers, not yet used for signing.
        Published => "published",
        /// Signs new capabilities.
        Active => "active",
        /// No longer signs; still verifies capabilities issued before.
        Retiring => "retiring",
        /// Removed from every bundle.
        Retired => "retired",
    }
);

/// A tenant: the owner of sandboxes and API keys.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Tenant {
    /// `ten_…`.
    pub id: String,
    /// Human-readable name.
    pub name: String,
    /// Unix seconds.
    pub created_at: i64,
}

/// An API key. The store holds only the BLAKE3 hash of the secret, so a leaked
/// database grants no access.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ApiKeyRecord {
    /// Public key ID (`ak_…`), the part of the key that is looked up.
    pub id: String,
    /// Owning tenant ID.
    pub tenant: String,
    /// BLAKE3 hash of the secret part.
    pub hash: [u8; 32],
    /// Whether the key may call administrative operations.
    pub admin: bool,
    /// Unix seconds.
    pub created_at: i64,
    /// Unix seconds at which the key was revoked, if it was.
    pub revoked_at: Option<i64>,
}

/// A registered worker.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct WorkerRecord {
    /// The worker's name.
    pub id: WorkerId,
    /// Base URL of its node-api.
    pub url: String,
    /// The isolation technology it runs.
    pub substrate: Substrate,
    /// How many active sandboxes it accepts.
    pub capacity: u32,
    /// Whether it receives new executions.
    pub state: WorkerState,
    /// BLAKE3 hash of the credential it enrolled with.
    pub credential_hash: [u8; 32],
    /// Unix seconds of its first registration.
    pub registered_at: i64,
    /// Unix seconds of its last heartbeat.
    pub last_seen: i64,
}

/// A sandbox: the stable, user-visible environment.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SandboxRecord {
    /// `sbx_…`.
    pub id: SandboxId,
    /// Owning tenant ID.
    pub tenant: String,
    /// Template the sandbox was created from.
    pub template: String,
    /// User-visible state.
    pub state: SandboxState,
    /// Unix seconds.
    pub created_at: i64,
    /// Unix seconds after which the sandbox is stopped, if it has a TTL.
    pub expires_at: Option<i64>,
    /// Caller-supplied JSON, returned as given.
    pub metadata: serde_json::Value,
    /// Environment for every process in the sandbox.
    pub env: BTreeMap<String, String>,
    /// The highest generation allocated so far; [`Generation::NONE`] before the first
    /// execution.
    pub generation: Generation,
    /// Resource limits every execution gets; `None` for a sandbox stored before limits
    /// were (the platform's defaults then apply).
    #[serde(default)]
    pub limits: Option<SandboxLimits>,
    /// Its network policy, the same for every execution (a sandbox stored before
    /// policies were reads as [`Policy::none`]: loopback only).
    #[serde(default)]
    pub network: Policy,
}

/// A sandbox's resource limits, as stored (a JSON column).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SandboxLimits {
    /// Memory, bytes.
    pub memory_bytes: u64,
    /// Most processes and threads.
    pub pids: u32,
    /// CPU, thousandths of a core.
    pub cpu_millis: u32,
    /// Disk, bytes (0: not limited).
    pub disk_bytes: u64,
}

/// One execution of a sandbox and where it runs.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExecutionRecord {
    /// The sandbox it incarnates.
    pub sandbox: SandboxId,
    /// 1, 2, 3 … per sandbox, never reused.
    pub generation: Generation,
    /// Random ID of this execution.
    pub execution_id: ExecutionId,
    /// The worker hosting it.
    pub worker: WorkerId,
    /// The isolation technology.
    pub substrate: Substrate,
    /// Activation attempt within this execution, from 1.
    pub activation: u32,
    /// Kubernetes only, once the pod exists.
    pub pod_uid: Option<PodUid>,
    /// Where it is in its life.
    pub state: ExecutionState,
    /// Unix seconds.
    pub created_at: i64,
    /// Unix seconds of the last change.
    pub updated_at: i64,
}

impl ExecutionRecord {
    /// Which execution this is: its generation and ID.
    pub fn execution(&self) -> Execution {
        Execution {
            generation: self.generation,
            id: self.execution_id,
        }
    }
}

/// A capability signing key. The seed is secret: `Debug` leaves it out.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SigningKeyRecord {
    /// The key's ID as carried in capabilities.
    pub key_id: String,
    /// Ed25519 seed.
    pub seed: [u8; 32],
    /// Rotation state.
    pub state: KeyState,
    /// Unix seconds.
    pub created_at: i64,
    /// Unix seconds before which verifiers refuse it.
    pub not_before: i64,
    /// Unix seconds after which verifiers refuse it.
    pub not_after: i64,
}

impl fmt::Debug for SigningKeyRecord {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SigningKeyRecord")
            .field("key_id", &self.key_id)
            .field("seed", &"<redacted>")
            .field("state", &self.state)
            .field("created_at", &self.created_at)
            .field("not_before", &self.not_before)
            .field("not_after", &self.not_after)
            .finish()
    }
}

/// One exposed service port of a sandbox. The store keeps only the hash of the port's
/// access token, so a leaked database opens no port.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PortRecord {
    /// The sandbox exposing it.
    pub sandbox: SandboxId,
    /// The port inside the sandbox, 1–65535.
    pub port: u16,
    /// `http` or `tcp` (the caller validates it).
    pub protocol: String,
    /// Whether it is reachable without credentials.
    pub public: bool,
    /// Lowercase hex BLAKE3 hash of the port's access token.
    pub token_hash: String,
    /// Unix seconds it was (last) exposed.
    pub created_at: i64,
}

/// What a tenant's create stamps on a standby sandbox it claims.
#[derive(Debug, Clone, PartialEq)]
pub struct Claim {
    /// The new owner.
    pub tenant: String,
    /// Unix seconds: the claim is the sandbox's creation as far as its owner sees.
    pub created_at: i64,
    /// Unix seconds, when it has a TTL.
    pub expires_at: Option<i64>,
    /// The owner's metadata.
    pub metadata: serde_json::Value,
    /// Only a standby sandbox of this template (as records name it: `default`, or
    /// `NAME:TAG@sha256:…`) is taken.
    pub template: String,
    /// The claimed sandbox's network policy from now on (written with the claim).
    /// Only a standby sandbox of the same mode is taken: one in mode `egress` already
    /// has its link, and a sandbox in mode `none` must never have one.
    pub network: Policy,
}

/// Standby sandboxes of one kind on one worker ([`crate::Store::count_standby_by_worker`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StandbyCount {
    /// The worker of their current execution.
    pub worker: WorkerId,
    /// Their template, as records name it.
    pub template: String,
    /// Their network mode (`egress`: each has its link already).
    pub mode: NetworkMode,
    /// How many.
    pub n: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_state_text_form_parses_back_to_its_variant() {
        for s in WorkerState::ALL {
            assert_eq!(s.as_str().parse::<WorkerState>(), Ok(*s));
        }
        for s in SandboxState::ALL {
            assert_eq!(s.as_str().parse::<SandboxState>(), Ok(*s));
        }
        for s in ExecutionState::ALL {
            assert_eq!(s.as_str().parse::<ExecutionState>(), Ok(*s));
        }
        for s in KeyState::ALL {
            assert_eq!(s.as_str().parse::<KeyState>(), Ok(*s));
        }
        assert!("Running".parse::<ExecutionState>().is_err());
    }

    #[test]
    fn serde_uses_the_same_text_as_the_database() {
        for s in SandboxState::ALL {
            let json = serde_json::to_string(s).unwrap();
            assert_eq!(json, format!("\"{}\"", s.as_str()));
        }
    }

    #[test]
    fn signing_key_debug_never_shows_the_seed() {
        let key = SigningKeyRecord {
            key_id: "k1".into(),
            seed: [0xab; 32],
            state: KeyState::Active,
            created_at: 1,
            not_before: 1,
            not_after: 2,
        };
        let text = format!("{key:?}");
        assert!(!text.contains("171"), "{text}");
        assert!(text.contains("<redacted>"));
    }
}
