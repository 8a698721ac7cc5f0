//! One named negative test per capability rule (`IDENTITY.md` §2) and the check order
//! of §3. Each test forges, with the `test-util` helpers, a *validly signed* token that
//! breaks exactly one rule, so the refusal can only come from that rule.

use space_identity::test_util::{encode_claims, sign_region, sign_unchecked};
use space_identity::{
    Access, CapabilitySigner, DenyReason, Endpoint, MAX_CAPABILITY_BYTES, MAX_CAPABILITY_TEXT,
    Operation, Protocol, Purpose, ServicePort, SignError, Substrate, Timestamp, Token, Verdict,
    verify, verify_capability,
};
use space_testkit::{CapabilityBuilder, T0, TestKeys, route, running, worker};

fn control_op(access: Access) -> Endpoint {
    Endpoint::Control { access }
}

/// Verifies `token` at worker `w1` holding a running record of sandbox 1 generation 1.
fn admit_at(token: &Token, keys: &TestKeys, now: Timestamp, endpoint: Endpoint) -> Verdict {
    let r = route(1, 1, "w1");
    let record = running(&r);
    let op = Operation {
        path_sandbox: &r.sandbox,
        bound_sandbox: None,
        endpoint,
    };
    verify(
        token.as_bytes(),
        &keys.installed,
        now,
        &op,
        &worker("w1"),
        Some(&record),
    )
}

fn deny(reason: DenyReason) -> Verdict {
    Verdict::Deny { reason }
}

fn valid(keys: &TestKeys) -> CapabilityBuilder {
    CapabilityBuilder::control(keys, &route(1, 1, "w1"))
}

#[test]
fn a_valid_capability_is_allowed() {
    let keys = TestKeys::new();
    let token = valid(&keys).sign(&keys);
    assert_eq!(
        admit_at(&token, &keys, T0, control_op(Access::Exec)),
        Verdict::Allow
    );
}

#[test]
fn capability_with_lifetime_over_120_seconds_is_refused_even_when_signed() {
    let keys = TestKeys::new();
    let b = valid(&keys).times(T0, T0.plus_secs(121));
    assert_eq!(b.sign_with_result(&keys), Err(SignError::LifetimeTooLong));
    let forged = sign_unchecked(&keys.control, b.claims());
    assert_eq!(
        admit_at(&forged, &keys, T0, control_op(Access::Exec)),
        deny(DenyReason::LifetimeTooLong)
    );
}

#[test]
fn capability_expiring_before_it_was_issued_is_refused() {
    let keys = TestKeys::new();
    let b = valid(&keys).times(T0, T0.minus_secs(1));
    let forged = sign_unchecked(&keys.control, b.claims());
    assert_eq!(
        admit_at(&forged, &keys, T0, control_op(Access::Exec)),
        deny(DenyReason::LifetimeTooLong)
    );
}

#[test]
fn capability_expired_by_14_seconds_is_still_allowed_within_skew() {
    let keys = TestKeys::new();
    let token = valid(&keys).sign(&keys);
    let now = T0.plus_secs(120 + 14);
    assert_eq!(
        admit_at(&token, &keys, now, control_op(Access::Exec)),
        Verdict::Allow
    );
    assert_eq!(
        admit_at(&token, &keys, now.plus_secs(1), control_op(Access::Exec)),
        Verdict::Allow,
        "exactly at expiry + skew is still inside the allowance"
    );
}

#[test]
fn capability_expired_by_16_seconds_is_refused() {
    let keys = TestKeys::new();
    let token = valid(&keys).sign(&keys);
    assert_eq!(
        admit_at(
            &token,
            &keys,
            T0.plus_secs(120 + 16),
            control_op(Access::Exec)
        ),
        deny(DenyReason::Expired)
    );
}

#[test]
fn capability_issued_16_seconds_in_the_future_is_refused() {
    let keys = TestKeys::new();
    let token = valid(&keys).sign(&keys);
    assert_eq!(
        admit_at(&token, &keys, T0.minus_secs(16), control_op(Access::Exec)),
        deny(DenyReason::NotYetValid)
    );
    assert_eq!(
        admit_at(&token, &keys, T0.minus_secs(14), control_op(Access::Exec)),
        Verdict::Allow,
        "14 s of issuer clock lead is inside the allowance"
    );
}

#[test]
fn signature_without_domain_separation_is_refused() {
    let keys = TestKeys::new();
    let token = valid(&keys).sign(&keys);
    let region = &token.as_bytes()[..token.as_bytes().len() - 64];
    // A signature over the bare claims (no domain prefix), by the right key.
    let raw = ed25519_sign_raw(&[2; 32], region);
    let forged = Token::from_bytes([region, &raw].concat());
    assert_eq!(
        admit_at(&forged, &keys, T0, control_op(Access::Exec)),
        deny(DenyReason::BadSignature)
    );
}

fn ed25519_sign_raw(seed: &[u8; 32], msg: &[u8]) -> [u8; 64] {
    use ed25519_dalek::Signer;
    ed25519_dalek::SigningKey::from_bytes(seed)
        .sign(msg)
        .to_bytes()
}

#[test]
fn unknown_claim_tag_is_refused() {
    let keys = TestKeys::new();
    let mut region = encode_claims(valid(&keys).claims());
    region.extend_from_slice(&[0x10, 0]);
    let forged = sign_region(&keys.control, region);
    assert_eq!(
        admit_at(&forged, &keys, T0, control_op(Access::Exec)),
        deny(DenyReason::Malformed)
    );
}

#[test]
fn trailing_bytes_after_the_signature_are_refused() {
    let keys = TestKeys::new();
    let token = valid(&keys).sign(&keys);
    let forged = Token::from_bytes([token.as_bytes(), &[0]].concat());
    assert_eq!(
        admit_at(&forged, &keys, T0, control_op(Access::Exec)),
        deny(DenyReason::Malformed)
    );
}

#[test]
fn duplicate_claim_is_refused() {
    let keys = TestKeys::new();
    let mut region = encode_claims(valid(&keys).claims());
    // Repeat the token-ID claim (the last one) at the end.
    let last = region[region.len() - 17..].to_vec();
    region.extend_from_slice(&last);
    let forged = sign_region(&keys.control, region);
    assert_eq!(
        admit_at(&forged, &keys, T0, control_op(Access::Exec)),
        deny(DenyReason::Malformed)
    );
}

#[test]
fn claims_out_of_canonical_order_are_refused() {
    let keys = TestKeys::new();
    let region = encode_claims(valid(&keys).claims());
    // Swap the key-ID claim (tag 1, 8 bytes) and the sandbox claim (tag 2, 16 bytes).
    let (key_claim, rest) = region[1..].split_at(9);
    let (sandbox_claim, rest) = rest.split_at(17);
    let swapped = [&region[..1], sandbox_claim, key_claim, rest].concat();
    let forged = sign_region(&keys.control, swapped);
    assert_eq!(
        admit_at(&forged, &keys, T0, control_op(Access::Exec)),
        deny(DenyReason::Malformed)
    );
}

/// Removes the claim with `tag` from an encoded region (tags are unique and in order).
fn without_claim(region: &[u8], tag: u8) -> Vec<u8> {
    let lens: &[(u8, usize)] = &[
        (0x01, 8),
        (0x02, 16),
        (0x03, 8),
        (0x04, 16),
        (0x06, 1),
        (0x07, 4),
        (0x08, 16),
        (0x09, 1),
        (0x0a, 1),
        (0x0b, 2),
        (0x0c, 1),
        (0x0d, 8),
        (0x0e, 8),
        (0x0f, 16),
    ];
    let mut out = vec![region[0]];
    let mut i = 1;
    while i < region.len() {
        let t = region[i];
        let len = if t == 0x05 {
            1 + usize::from(region[i + 1])
        } else {
            lens.iter().find(|(x, _)| *x == t).map(|(_, l)| *l).unwrap()
        };
        if t != tag {
            out.extend_from_slice(&region[i..i + 1 + len]);
        }
        i += 1 + len;
    }
    out
}

#[test]
fn missing_required_claim_is_refused_and_never_defaults_to_any() {
    let keys = TestKeys::new();
    let region = encode_claims(valid(&keys).claims());
    for tag in [1u8, 2, 3, 4, 5, 6, 7, 9, 10, 13, 14, 15] {
        let forged = sign_region(&keys.control, without_claim(&region, tag));
        assert_eq!(
            admit_at(&forged, &keys, T0, control_op(Access::Exec)),
            deny(DenyReason::Malformed),
            "claim {tag:#04x} removed"
        );
    }
}

#[test]
fn empty_access_set_is_refused() {
    let keys = TestKeys::new();
    let b = valid(&keys).access(&[]);
    assert_eq!(b.sign_with_result(&keys), Err(SignError::Invalid));
    let forged = sign_unchecked(&keys.control, b.claims());
    assert_eq!(
        admit_at(&forged, &keys, T0, control_op(Access::Exec)),
        deny(DenyReason::Malformed)
    );
}

#[test]
fn other_format_version_is_refused_before_crypto() {
    let keys = TestKeys::new();
    let token = valid(&keys).sign(&keys);
    let mut bytes = token.as_bytes().to_vec();
    bytes[0] = 2;
    // The signature no longer matches either: the version check must come first.
    assert_eq!(
        admit_at(
            &Token::from_bytes(bytes),
            &keys,
            T0,
            control_op(Access::Exec)
        ),
        deny(DenyReason::UnsupportedVersion)
    );
}

#[test]
fn jwt_with_alg_none_is_refused_before_crypto() {
    // {"alg":"none","typ":"JWT"} . {"sub":"sbx_…","access":"exec"} . (empty signature)
    let jwt = "eyJhbGciOiJub25lIiwidHlwIjoiSldUIn0.\
               eyJzdWIiOiJzYnhfYWFhYWFhYWFhYWFhYWFhYWFhYWFhYWFhYWEiLCJhY2Nlc3MiOiJleGVjIn0.";
    assert_eq!(Token::from_text(jwt), Err(DenyReason::Malformed));
    // Even as raw bytes it is not a version-1 capability.
    let keys = TestKeys::new();
    let raw = Token::from_bytes(jwt.as_bytes().to_vec());
    assert_eq!(
        admit_at(&raw, &keys, T0, control_op(Access::Exec)),
        deny(DenyReason::UnsupportedVersion)
    );
}

#[test]
fn oversized_token_is_refused_before_decoding() {
    let keys = TestKeys::new();
    let token = valid(&keys).sign(&keys);
    let mut bytes = token.as_bytes().to_vec();
    bytes.resize(MAX_CAPABILITY_BYTES + 1, 0);
    assert_eq!(
        admit_at(
            &Token::from_bytes(bytes),
            &keys,
            T0,
            control_op(Access::Exec)
        ),
        deny(DenyReason::Oversized)
    );
    let text = "A".repeat(MAX_CAPABILITY_TEXT + 1);
    assert_eq!(Token::from_text(&text), Err(DenyReason::Oversized));
}

#[test]
fn text_form_round_trips_and_refuses_non_canonical_base64() {
    let keys = TestKeys::new();
    let token = valid(&keys).sign(&keys);
    let text = token.to_text();
    assert!(
        text.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
    );
    assert_eq!(Token::from_text(&text).unwrap(), token);
    assert_eq!(
        Token::from_text(&format!("{text}=")),
        Err(DenyReason::Malformed)
    );
    assert_eq!(
        Token::from_text(&text.replace('-', "+"))
            .ok()
            .filter(|t| *t == token),
        None
    );
}

#[test]
fn service_port_capability_without_port_is_refused() {
    let keys = TestKeys::new();
    let sp = ServicePort {
        port: 8080,
        protocol: Protocol::Http,
    };
    let b = CapabilityBuilder::service_port(&keys, &route(1, 1, "w1"), sp)
        .with(|c| c.service_port = None);
    assert_eq!(b.sign_with_result(&keys), Err(SignError::Invalid));
    let forged = sign_unchecked(&keys.service_port, b.claims());
    let endpoint = Endpoint::ServicePort {
        requested: sp,
        exposed: true,
        phase: space_identity::StreamPhase::Open,
    };
    assert_eq!(
        admit_at(&forged, &keys, T0, endpoint),
        deny(DenyReason::Malformed)
    );
}

#[test]
fn control_capability_naming_a_port_is_refused() {
    let keys = TestKeys::new();
    let b = valid(&keys).with(|c| {
        c.service_port = Some(ServicePort {
            port: 22,
            protocol: Protocol::Tcp,
        })
    });
    assert_eq!(b.sign_with_result(&keys), Err(SignError::Invalid));
    let forged = sign_unchecked(&keys.control, b.claims());
    assert_eq!(
        admit_at(&forged, &keys, T0, control_op(Access::Exec)),
        deny(DenyReason::Malformed)
    );
}

#[test]
fn kubernetes_route_without_pod_uid_is_refused() {
    let keys = TestKeys::new();
    let b = valid(&keys).with(|c| c.route.placement.substrate = Substrate::Kubernetes);
    assert_eq!(b.sign_with_result(&keys), Err(SignError::Invalid));
}

#[test]
fn token_signed_by_a_key_the_receiver_has_not_installed_is_refused() {
    let keys = TestKeys::new();
    let stranger = CapabilitySigner::from_seed([9; 32]);
    let b = valid(&keys).with(|c| c.key_id = stranger.key_id());
    let token = b.sign_with(&stranger);
    assert_eq!(
        admit_at(&token, &keys, T0, control_op(Access::Exec)),
        deny(DenyReason::UnknownKey)
    );
}

#[test]
fn token_naming_an_installed_key_but_signed_by_another_is_refused() {
    let keys = TestKeys::new();
    let stranger = CapabilitySigner::from_seed([9; 32]);
    let region = encode_claims(valid(&keys).claims());
    let forged = sign_region(&stranger, region);
    assert_eq!(
        admit_at(&forged, &keys, T0, control_op(Access::Exec)),
        deny(DenyReason::BadSignature)
    );
}

#[test]
fn key_of_another_purpose_is_refused() {
    let keys = TestKeys::new();
    // A control capability signed by the service-port key.
    let b = valid(&keys).with(|c| c.key_id = keys.service_port.key_id());
    let token = b.sign_with(&keys.service_port);
    assert_eq!(
        admit_at(&token, &keys, T0, control_op(Access::Exec)),
        deny(DenyReason::WrongKeyPurpose)
    );
}

#[test]
fn key_outside_its_validity_window_is_refused() {
    let keys = TestKeys::new();
    // The fixture keys are valid for a day around T0.
    let late = T0.plus_secs(86_400 + 1);
    let token = valid(&keys).times(late, late.plus_secs(60)).sign(&keys);
    assert_eq!(
        admit_at(&token, &keys, late, control_op(Access::Exec)),
        deny(DenyReason::KeyNotValid)
    );
}

#[test]
fn key_removed_from_the_bundle_stops_verifying_at_once() {
    let mut keys = TestKeys::new();
    let token = valid(&keys).sign(&keys);
    assert_eq!(
        admit_at(&token, &keys, T0, control_op(Access::Exec)),
        Verdict::Allow
    );
    let without_control = keys.bundle(2, &[&keys.service_port]);
    keys.installed.install(&without_control).unwrap();
    assert_eq!(
        admit_at(&token, &keys, T0, control_op(Access::Exec)),
        deny(DenyReason::UnknownKey)
    );
}

#[test]
fn check_order_reports_the_first_failure() {
    let keys = TestKeys::new();
    // Expired *and* badly signed: signature comes before time.
    let expired = valid(&keys).sign(&keys);
    let mut bad_sig = expired.as_bytes().to_vec();
    let n = bad_sig.len();
    bad_sig[n - 1] ^= 1;
    assert_eq!(
        admit_at(
            &Token::from_bytes(bad_sig),
            &keys,
            T0.plus_secs(1_000),
            control_op(Access::Exec)
        ),
        deny(DenyReason::BadSignature)
    );
    // Unknown key *and* bad signature: key comes before signature.
    let stranger = CapabilitySigner::from_seed([9; 32]);
    let forged = sign_region(
        &keys.control,
        encode_claims(valid(&keys).with(|c| c.key_id = stranger.key_id()).claims()),
    );
    assert_eq!(
        admit_at(&forged, &keys, T0, control_op(Access::Exec)),
        deny(DenyReason::UnknownKey)
    );
    // Expired *and* wrong purpose: time comes before purpose.
    let sp = ServicePort {
        port: 80,
        protocol: Protocol::Http,
    };
    assert_eq!(
        admit_at(
            &valid(&keys).sign(&keys),
            &keys,
            T0.plus_secs(1_000),
            Endpoint::ServicePort {
                requested: sp,
                exposed: true,
                phase: space_identity::StreamPhase::Open
            }
        ),
        deny(DenyReason::Expired)
    );
    // Wrong access *and* another sandbox's path: access comes before identity.
    let other = route(2, 1, "w1");
    let token = valid(&keys).access(&[Access::Exec]).sign(&keys);
    let op = Operation {
        path_sandbox: &other.sandbox,
        bound_sandbox: None,
        endpoint: control_op(Access::FsRead),
    };
    let record = running(&route(1, 1, "w1"));
    assert_eq!(
        verify(
            token.as_bytes(),
            &keys.installed,
            T0,
            &op,
            &worker("w1"),
            Some(&record)
        ),
        deny(DenyReason::AccessDenied)
    );
}

#[test]
fn issued_capability_is_compact() {
    let keys = TestKeys::new();
    let token = valid(&keys).sign(&keys);
    assert!(
        token.as_bytes().len() < 200,
        "{} bytes",
        token.as_bytes().len()
    );
    let claims = verify_capability(token.as_bytes(), &keys.installed, T0).unwrap();
    assert_eq!(&claims, valid(&keys).claims());
    assert_eq!(claims.purpose, Purpose::Control);
}

/// `sign` on the builder panics on refusal; tests of issuer refusals want the result.
trait SignResult {
    fn sign_with_result(&self, keys: &TestKeys) -> Result<Token, SignError>;
}

impl SignResult for CapabilityBuilder {
    fn sign_with_result(&self, keys: &TestKeys) -> Result<Token, SignError> {
        let signer = match self.claims().purpose {
            Purpose::Control => &keys.control,
            Purpose::ServicePort => &keys.service_port,
        };
        signer.sign(self.claims())
    }
}
