//! The fixture behind P1 and P2 of `QUALITY.md`, shared by the criterion bench
//! (`cargo bench -p space-identity --bench capability`) and `space bench p1` / `p2`.
//!
//! Pure like the rest of the crate: the caller gives the seeds and `now`, and times the
//! calls itself. Nothing here signs anything a verifier would refuse: the keys are the
//! caller's, installed only in the fixture's own [`InstalledKeys`].

use ed25519_dalek::{Signature, VerifyingKey};

use crate::capability::with_signed_message;
use crate::{
    Access, AccessSet, BundleSigner, CapabilitySigner, Claims, Endpoint, Execution, ExecutionId,
    Generation, InstalledIdentity, InstalledKeys, KeyBundle, KeyUses, Operation, Placement,
    Purpose, RecordState, Route, SandboxId, Substrate, Timestamp, Token, TokenId, Verdict,
    VerifiedTokenCache, WorkerId, verify_capability,
};

/// Other tokens in the cache when P2 looks one up, so the hit is a realistic lookup.
pub const CACHED_TOKENS: u64 = 5_000;

/// One capability, the exact message its signature covers, a receiver's installed
/// keys and a verified-token cache that already holds it among [`CACHED_TOKENS`]
/// others.
#[derive(Debug)]
pub struct CapabilityBench {
    signer: CapabilitySigner,
    claims: Claims,
    token: Token,
    message: Vec<u8>,
    signature: Signature,
    key: VerifyingKey,
    installed: InstalledKeys,
    cache: VerifiedTokenCache,
    record: InstalledIdentity,
    worker: WorkerId,
    now: Timestamp,
}

impl CapabilityBench {
    /// The fixture at `now`, from an anchor seed and a control-key seed.
    pub fn new(anchor_seed: [u8; 32], control_seed: [u8; 32], now: Timestamp) -> Self {
        let anchor = BundleSigner::from_seed(anchor_seed);
        let signer = CapabilitySigner::from_seed(control_seed);
        let mut installed = InstalledKeys::new(anchor.anchor());
        let bundle = anchor
            .sign(&KeyBundle {
                version: 1,
                issued_at: now,
                keys: vec![signer.bundle_key(
                    KeyUses::only(Purpose::Control),
                    now.minus_secs(86_400),
                    now.plus_secs(86_400),
                )],
            })
            .expect("a one-key bundle signs");
        installed.install(&bundle).expect("the bundle installs");
        let worker: WorkerId = "worker-a".parse().expect("a valid worker name");
        let route = Route {
            sandbox: SandboxId::from_bytes([0x5b; 16]),
            execution: Execution {
                generation: Generation(7),
                id: ExecutionId::from_bytes([0xe0; 16]),
            },
            placement: Placement {
                worker: worker.clone(),
                substrate: Substrate::Jail,
                activation: 1,
                pod_uid: None,
            },
        };
        let claims_for = |n: u64| {
            let mut id = [0x70; 16];
            id[8..].copy_from_slice(&n.to_be_bytes());
            Claims {
                key_id: signer.key_id(),
                route: route.clone(),
                access: AccessSet::of(&[Access::Exec, Access::FsRead, Access::FsWrite]),
                purpose: Purpose::Control,
                service_port: None,
                issued_at: now,
                expires_at: now.plus_secs(120),
                token_id: TokenId::from_bytes(id),
            }
        };
        let claims = claims_for(1);
        let token = signer.sign(&claims).expect("the fixture signs");
        let bytes = token.as_bytes();
        let (region, sig) = bytes.split_at(bytes.len() - 64);
        let message = with_signed_message(region, <[u8]>::to_vec);
        let signature = Signature::from_slice(sig).expect("64 bytes");
        let mut cache = VerifiedTokenCache::new(2 * CACHED_TOKENS as usize);
        for n in 0..CACHED_TOKENS {
            let other = signer.sign(&claims_for(n + 10)).expect("signs");
            cache
                .verify_capability(other.as_bytes(), &installed, now)
                .expect("a fixture token verifies");
        }
        let key = signer.verifying_key();
        let mut b = Self {
            signer,
            claims,
            token,
            message,
            signature,
            key,
            installed,
            cache,
            record: InstalledIdentity {
                route,
                state: RecordState::Running,
            },
            worker,
            now,
        };
        assert!(b.raw_verify(), "raw verify_strict of the fixture");
        assert!(b.verify_first_sight(), "first-sight verify of the fixture");
        assert!(b.admit_cached(), "admission of the fixture");
        b
    }

    /// The token's size in bytes, binary and base64url.
    pub fn token_sizes(&self) -> (usize, usize) {
        (self.token.as_bytes().len(), self.token.to_text().len())
    }

    /// Ed25519 `verify_strict` over exactly the bytes the capability signs (domain
    /// prefix + claims), with an already decompressed key: the floor of P1.
    pub fn raw_verify(&self) -> bool {
        self.key
            .verify_strict(
                std::hint::black_box(&self.message),
                std::hint::black_box(&self.signature),
            )
            .is_ok()
    }

    /// P1: the whole first-sight check (size, decode, key lookup, strict signature,
    /// time rules) of a token never seen.
    pub fn verify_first_sight(&self) -> bool {
        verify_capability(
            std::hint::black_box(self.token.as_bytes()),
            &self.installed,
            self.now,
        )
        .is_ok()
    }

    /// P2: admission of the already verified token from the cache (BLAKE3 of the
    /// token, lookup, time, purpose, access, identity comparison).
    pub fn admit_cached(&mut self) -> bool {
        let op = Operation {
            path_sandbox: &self.record.route.sandbox,
            bound_sandbox: None,
            endpoint: Endpoint::Control {
                access: Access::FsRead,
            },
        };
        self.cache.admit(
            std::hint::black_box(self.token.as_bytes()),
            &self.installed,
            self.now,
            std::hint::black_box(&op),
            &self.worker,
            Some(&self.record),
        ) == Verdict::Allow
    }

    /// The control plane's cost to issue one capability.
    pub fn sign(&self) -> bool {
        self.signer.sign(std::hint::black_box(&self.claims)).is_ok()
    }
}
