//! Execution identity for SPACE.
//!
//! This crate implements the rules of `IDENTITY.md` as pure code: identifiers and
//! routes, the signed capability that selects an execution, verification-key bundles,
//! the comparator every receiver runs before it forwards anything, a cache of verified
//! tokens for receivers, and the route-recovery decisions of the edge and the SDK.
//!
//! It does no I/O and never reads a clock or a random source: `now` and every random
//! byte are parameters, so each rule is testable with fixed inputs.

#![forbid(unsafe_code)]

pub mod bench;
mod cache;
mod capability;
mod codec;
mod comparator;
mod ids;
mod keys;
mod recovery;
mod time;
mod verdict;

#[cfg(feature = "test-util")]
pub mod test_util;

pub use cache::VerifiedTokenCache;
pub use capability::{CapabilitySigner, Claims, MAX_CAPABILITY_TEXT, SignError, Token};
pub use comparator::{
    Endpoint, InstalledIdentity, Operation, RecordState, StreamPhase, compare, verify,
    verify_capability,
};
pub use ids::{
    Access, AccessSet, Execution, ExecutionId, Generation, ParseIdError, Placement, PodUid,
    Protocol, Purpose, Route, RouteIdentity, SandboxId, ServicePort, Substrate, TokenId, WorkerId,
};
pub use keys::{
    BundleError, BundleKey, BundleSigner, InstalledKeys, KeyBundle, KeyId, KeyUses,
    SignedKeyBundle, verify_delivery, verify_update,
};
pub use recovery::{
    AfterRefresh, CachedRoute, OperationClass, Progress, Recovery, RecoveryError, RecoveryStep,
    Replacement, RouteCache,
};
pub use time::Timestamp;

/// Re-exported so receivers can hold a trust anchor without naming ed25519-dalek.
pub use ed25519_dalek::VerifyingKey;
pub use verdict::{DenyReason, RefreshReason, Verdict};

/// Longest lifetime (`expires_at - issued_at`) a verifier accepts, in seconds.
pub const MAX_CAPABILITY_LIFETIME_SECS: u64 = 120;

/// Clock-skew allowance on both ends of a capability's validity, in seconds.
pub const CLOCK_SKEW_SECS: u64 = 15;

/// Largest encoded capability a verifier looks at; larger ones are refused before
/// decoding.
pub const MAX_CAPABILITY_BYTES: usize = 1024;

/// How long a receiver keeps the tombstone of a retired execution: until every
/// capability for it is refused by time alone. A token may carry an `issued_at` up to
/// one skew ahead of the receiver's clock and is accepted one skew past its expiry, so
/// that is the maximum lifetime plus twice the skew (`IDENTITY.md` asks for at least
/// lifetime plus skew).
pub const TOMBSTONE_RETENTION_SECS: u64 = MAX_CAPABILITY_LIFETIME_SECS + 2 * CLOCK_SKEW_SECS;
