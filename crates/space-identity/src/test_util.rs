//! Forging helpers for negative tests (feature `test-util`, never in production
//! builds): they sign what the issuer would refuse to sign, so a test can show that the
//! *verifier* enforces each rule on its own.

use crate::capability::{CapabilitySigner, Claims, Token};
use crate::keys::{BundleSigner, KeyBundle, SignedKeyBundle};

/// The canonical encoding of `claims` (the signed region), without any checks.
pub fn encode_claims(claims: &Claims) -> Vec<u8> {
    claims.encode()
}

/// Signs an arbitrary claims region with `signer`, domain-separated as a real token.
pub fn sign_region(signer: &CapabilitySigner, region: Vec<u8>) -> Token {
    signer.sign_region(region)
}

/// Signs `claims` without the issuer's lifetime and structure checks.
pub fn sign_unchecked(signer: &CapabilitySigner, claims: &Claims) -> Token {
    signer.sign_region(claims.encode())
}

/// The encoding of a bundle's body, without any checks.
pub fn encode_bundle_body(bundle: &KeyBundle) -> Vec<u8> {
    bundle.encode_body()
}

/// Signs an arbitrary bundle body with the trust anchor.
pub fn sign_bundle_body(anchor: &BundleSigner, body: Vec<u8>) -> SignedKeyBundle {
    anchor.sign_body(body)
}
