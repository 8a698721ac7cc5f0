//! Key bundle rules (`IDENTITY.md` §2, Keys): signed by the trust anchor, versions
//! never go backwards, one canonical encoding, no weak keys, IDs bound to keys.

use space_identity::test_util::{encode_bundle_body, sign_bundle_body};
use space_identity::{
    BundleError, BundleSigner, CapabilitySigner, InstalledKeys, KeyBundle, KeyUses, Purpose,
    SignedKeyBundle,
};
use space_testkit::{T0, TestKeys};

fn bundle_of(version: u64, signers: &[&CapabilitySigner]) -> KeyBundle {
    KeyBundle {
        version,
        issued_at: T0,
        keys: signers
            .iter()
            .map(|s| s.bundle_key(KeyUses::all(), T0, T0.plus_secs(3600)))
            .collect(),
    }
}

#[test]
fn bundle_version_never_goes_backwards() {
    let keys = TestKeys::new();
    let mut rx = keys.installed.clone();
    assert!(rx.install(&keys.bundle(5, &[&keys.control])).unwrap());
    assert_eq!(
        rx.install(&keys.bundle(4, &[&keys.control, &keys.service_port])),
        Err(BundleError::Rollback {
            installed: 5,
            offered: 4
        })
    );
    assert_eq!(rx.version(), 5);
    assert!(
        rx.get(&keys.service_port.key_id()).is_none(),
        "the refused bundle changed nothing"
    );
}

#[test]
fn reinstalling_the_same_bundle_is_a_no_op() {
    let keys = TestKeys::new();
    let mut rx = keys.installed.clone();
    let b = keys.bundle(1, &[&keys.control, &keys.service_port]);
    assert_eq!(rx.install(&b), Ok(false));
}

#[test]
fn same_version_with_other_contents_is_refused() {
    let keys = TestKeys::new();
    let mut rx = keys.installed.clone();
    assert_eq!(
        rx.install(&keys.bundle(1, &[&keys.control])),
        Err(BundleError::ConflictingVersion { version: 1 })
    );
}

#[test]
fn bundle_not_signed_by_the_trust_anchor_is_refused() {
    let keys = TestKeys::new();
    let impostor = BundleSigner::from_seed([7; 32]);
    let forged = impostor.sign(&bundle_of(9, &[&keys.control])).unwrap();
    let mut rx = keys.installed.clone();
    assert_eq!(rx.install(&forged), Err(BundleError::BadSignature));
    assert_eq!(rx.version(), 1);
}

#[test]
fn tampered_bundle_is_refused() {
    let keys = TestKeys::new();
    let good = keys.bundle(2, &[&keys.control]);
    let mut rx = InstalledKeys::new(keys.anchor.anchor());
    for i in 0..good.as_bytes().len() {
        let mut bytes = good.as_bytes().to_vec();
        bytes[i] ^= 0x10;
        assert!(
            rx.install(&SignedKeyBundle::from_bytes(bytes)).is_err(),
            "flip at byte {i}"
        );
    }
    assert_eq!(rx.version(), 0);
}

#[test]
fn bundle_listing_a_key_under_a_foreign_id_is_refused() {
    let keys = TestKeys::new();
    let mut bundle = bundle_of(3, &[&keys.control]);
    bundle.keys[0].key_id = keys.service_port.key_id();
    assert_eq!(keys.anchor.sign(&bundle), Err(BundleError::KeyIdMismatch));
    let forged = sign_bundle_body(&keys.anchor, encode_bundle_body(&bundle));
    assert_eq!(
        keys.installed.clone().install(&forged),
        Err(BundleError::KeyIdMismatch)
    );
}

#[test]
fn bundle_listing_a_key_twice_is_refused() {
    let keys = TestKeys::new();
    let bundle = bundle_of(3, &[&keys.control, &keys.control]);
    assert_eq!(keys.anchor.sign(&bundle), Err(BundleError::Malformed));
    let forged = sign_bundle_body(&keys.anchor, encode_bundle_body(&bundle));
    assert_eq!(
        keys.installed.clone().install(&forged),
        Err(BundleError::Malformed)
    );
}

#[test]
fn bundle_with_trailing_bytes_is_refused() {
    let keys = TestKeys::new();
    let mut body = encode_bundle_body(&bundle_of(3, &[&keys.control]));
    body.push(0);
    let forged = sign_bundle_body(&keys.anchor, body);
    assert_eq!(
        keys.installed.clone().install(&forged),
        Err(BundleError::Malformed)
    );
}

#[test]
fn empty_bundle_is_refused() {
    let keys = TestKeys::new();
    assert_eq!(
        keys.anchor.sign(&bundle_of(3, &[])),
        Err(BundleError::Malformed)
    );
}

#[test]
fn key_uses_limit_purposes() {
    assert!(KeyUses::only(Purpose::Control).allows(Purpose::Control));
    assert!(!KeyUses::only(Purpose::Control).allows(Purpose::ServicePort));
    assert!(KeyUses::all().allows(Purpose::ServicePort));
}

#[test]
fn signed_bundle_persists_and_reinstalls_after_a_restart() {
    let keys = TestKeys::new();
    let persisted = keys.installed.signed_bundle().unwrap().as_bytes().to_vec();
    let mut restarted = InstalledKeys::new(keys.anchor.anchor());
    assert_eq!(
        restarted.install(&SignedKeyBundle::from_bytes(persisted)),
        Ok(true)
    );
    assert_eq!(restarted.version(), 1);
    assert!(restarted.get(&keys.control.key_id()).is_some());
}

#[test]
fn control_update_signed_by_the_anchor_verifies_and_nothing_else_does() {
    let keys = TestKeys::new();
    let body = br#"{"worker":"w1","update":"retire"}"#;
    let sig = keys.anchor.sign_update(body);
    assert!(space_identity::verify_update(
        &keys.anchor.anchor(),
        body,
        &sig
    ));
    // Another body, another signer, or a bundle-domain signature: refused.
    assert!(!space_identity::verify_update(
        &keys.anchor.anchor(),
        b"{}",
        &sig
    ));
    let impostor = BundleSigner::from_seed([7; 32]);
    assert!(!space_identity::verify_update(
        &keys.anchor.anchor(),
        body,
        &impostor.sign_update(body)
    ));
    let bundle = keys.bundle(2, &[&keys.control]);
    let b = bundle.as_bytes();
    let (bundle_body, bundle_sig) = b.split_at(b.len() - 64);
    assert!(!space_identity::verify_update(
        &keys.anchor.anchor(),
        bundle_body,
        bundle_sig.try_into().unwrap()
    ));
}

#[test]
fn a_delivery_descriptor_and_an_update_never_verify_as_each_other() {
    let keys = TestKeys::new();
    let anchor = keys.anchor.anchor();
    let bytes = br#"{"worker":"w1","issued_at":1,"size":3,"digest":"ab"}"#;
    let delivery = keys.anchor.sign_delivery(bytes);
    assert!(space_identity::verify_delivery(&anchor, bytes, &delivery));
    assert!(!space_identity::verify_update(&anchor, bytes, &delivery));
    let update = keys.anchor.sign_update(bytes);
    assert!(!space_identity::verify_delivery(&anchor, bytes, &update));
    let impostor = BundleSigner::from_seed([7; 32]);
    assert!(!space_identity::verify_delivery(
        &anchor,
        bytes,
        &impostor.sign_delivery(bytes)
    ));
}
