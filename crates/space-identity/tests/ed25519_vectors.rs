//! Ed25519 edge cases that a lax verifier accepts and a strict one must refuse.

use ed25519_dalek::{Signature, VerifyingKey};
use space_identity::test_util::{encode_bundle_body, sign_bundle_body};
use space_identity::{
    Access, BundleError, BundleKey, DenyReason, Endpoint, KeyBundle, KeyId, KeyUses, Operation,
    Token, Verdict, verify,
};
use space_testkit::{CapabilityBuilder, T0, TestKeys, route, running, worker};

/// The group order L, little-endian.
const L: [u8; 32] = [
    0xed, 0xd3, 0xf5, 0x5c, 0x1a, 0x63, 0x12, 0x58, 0xd6, 0x9c, 0xf7, 0xa2, 0xde, 0xf9, 0xde, 0x14,
    0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x10,
];

/// The identity point's encoding: a small-order (order 1) point.
const IDENTITY: [u8; 32] = {
    let mut p = [0u8; 32];
    p[0] = 1;
    p
};

fn admit(keys: &TestKeys, token: &Token) -> Verdict {
    let r = route(1, 1, "w1");
    let op = Operation {
        path_sandbox: &r.sandbox,
        bound_sandbox: None,
        endpoint: Endpoint::Control {
            access: Access::Exec,
        },
    };
    verify(
        token.as_bytes(),
        &keys.installed,
        T0,
        &op,
        &worker("w1"),
        Some(&running(&r)),
    )
}

fn with_signature(token: &Token, sig: [u8; 64]) -> Token {
    let b = token.as_bytes();
    Token::from_bytes([&b[..b.len() - 64], &sig].concat())
}

#[test]
fn all_zero_signature_is_refused() {
    let keys = TestKeys::new();
    let token = CapabilityBuilder::control(&keys, &route(1, 1, "w1")).sign(&keys);
    assert_eq!(
        admit(&keys, &with_signature(&token, [0; 64])),
        Verdict::Deny {
            reason: DenyReason::BadSignature
        }
    );
}

#[test]
fn non_canonical_s_is_refused() {
    let keys = TestKeys::new();
    let token = CapabilityBuilder::control(&keys, &route(1, 1, "w1")).sign(&keys);
    let b = token.as_bytes();
    let mut sig: [u8; 64] = b[b.len() - 64..].try_into().unwrap();
    // S + L is the same scalar mod L, so a lax verifier would accept it.
    let mut carry = 0u16;
    for i in 0..32 {
        let sum = u16::from(sig[32 + i]) + u16::from(L[i]) + carry;
        sig[32 + i] = sum as u8;
        carry = sum >> 8;
    }
    assert_eq!(carry, 0);
    assert_eq!(
        admit(&keys, &with_signature(&token, sig)),
        Verdict::Deny {
            reason: DenyReason::BadSignature
        }
    );
}

#[test]
fn small_order_r_in_the_signature_is_refused() {
    let keys = TestKeys::new();
    let token = CapabilityBuilder::control(&keys, &route(1, 1, "w1")).sign(&keys);
    let mut sig = [0u8; 64];
    sig[..32].copy_from_slice(&IDENTITY);
    assert_eq!(
        admit(&keys, &with_signature(&token, sig)),
        Verdict::Deny {
            reason: DenyReason::BadSignature
        }
    );
}

#[test]
fn small_order_public_key_forges_under_lax_verify_but_not_strict() {
    // Why the comparator insists on verify_strict: with A = identity and the signature
    // (R = identity, S = 0), the cofactorless equation holds for *every* message.
    let weak = VerifyingKey::from_bytes(&IDENTITY).unwrap();
    let mut sig = [0u8; 64];
    sig[..32].copy_from_slice(&IDENTITY);
    let sig = Signature::from_bytes(&sig);
    assert!(weak.verify_strict(b"any message", &sig).is_err());
    assert!(weak.is_weak());
}

#[test]
fn bundle_with_a_small_order_public_key_is_refused() {
    let keys = TestKeys::new();
    let weak = VerifyingKey::from_bytes(&IDENTITY).unwrap();
    let bundle = KeyBundle {
        version: 2,
        issued_at: T0,
        keys: vec![BundleKey {
            key_id: KeyId::of(&weak),
            public: weak,
            uses: KeyUses::all(),
            not_before: T0,
            not_after: T0.plus_secs(60),
        }],
    };
    assert_eq!(keys.anchor.sign(&bundle), Err(BundleError::WeakKey));
    let forged = sign_bundle_body(&keys.anchor, encode_bundle_body(&bundle));
    let mut rx = keys.installed.clone();
    assert_eq!(rx.install(&forged), Err(BundleError::WeakKey));
    assert_eq!(rx.version(), 1);
}
