//! The verified-token cache skips only signature work: every other rule still runs on
//! every request.

use space_identity::{
    Access, DenyReason, Endpoint, InstalledIdentity, Operation, RefreshReason, Timestamp, Token,
    Verdict, VerifiedTokenCache,
};
use space_testkit::{CapabilityBuilder, T0, TestKeys, route, running, worker};

fn admit(
    cache: &mut VerifiedTokenCache,
    keys: &TestKeys,
    token: &Token,
    now: Timestamp,
    access: Access,
    record: &InstalledIdentity,
) -> Verdict {
    let op = Operation {
        path_sandbox: &record.route.sandbox,
        bound_sandbox: None,
        endpoint: Endpoint::Control { access },
    };
    cache.admit(
        token.as_bytes(),
        &keys.installed,
        now,
        &op,
        &worker("w1"),
        Some(record),
    )
}

#[test]
fn cached_token_is_refused_once_a_newer_execution_is_installed() {
    let keys = TestKeys::new();
    let mut cache = VerifiedTokenCache::new(16);
    let gen7 = route(1, 7, "w1");
    let token = CapabilityBuilder::control(&keys, &gen7).sign(&keys);
    assert_eq!(
        admit(&mut cache, &keys, &token, T0, Access::Exec, &running(&gen7)),
        Verdict::Allow
    );
    assert_eq!(cache.len(), 1);
    let gen8 = running(&route(1, 8, "w1"));
    assert_eq!(
        admit(&mut cache, &keys, &token, T0, Access::Exec, &gen8),
        Verdict::RefreshRoute {
            reason: RefreshReason::StaleGeneration
        }
    );
}

#[test]
fn cached_token_still_needs_the_requested_access() {
    let keys = TestKeys::new();
    let mut cache = VerifiedTokenCache::new(16);
    let r = route(1, 1, "w1");
    let token = CapabilityBuilder::control(&keys, &r)
        .access(&[Access::Exec])
        .sign(&keys);
    assert_eq!(
        admit(&mut cache, &keys, &token, T0, Access::Exec, &running(&r)),
        Verdict::Allow
    );
    assert_eq!(
        admit(&mut cache, &keys, &token, T0, Access::FsWrite, &running(&r)),
        Verdict::Deny {
            reason: DenyReason::AccessDenied
        }
    );
}

#[test]
fn cached_token_stops_at_expiry_plus_skew() {
    let keys = TestKeys::new();
    let mut cache = VerifiedTokenCache::new(16);
    let r = route(1, 1, "w1");
    let token = CapabilityBuilder::control(&keys, &r).sign(&keys);
    assert_eq!(
        admit(&mut cache, &keys, &token, T0, Access::Exec, &running(&r)),
        Verdict::Allow
    );
    let edge = T0.plus_secs(120 + 15);
    assert_eq!(
        admit(&mut cache, &keys, &token, edge, Access::Exec, &running(&r)),
        Verdict::Allow
    );
    assert_eq!(
        admit(
            &mut cache,
            &keys,
            &token,
            edge.plus_secs(1),
            Access::Exec,
            &running(&r)
        ),
        Verdict::Deny {
            reason: DenyReason::Expired
        }
    );
}

#[test]
fn cache_is_cleared_when_the_key_bundle_changes() {
    let mut keys = TestKeys::new();
    let mut cache = VerifiedTokenCache::new(16);
    let r = route(1, 1, "w1");
    let token = CapabilityBuilder::control(&keys, &r).sign(&keys);
    assert_eq!(
        admit(&mut cache, &keys, &token, T0, Access::Exec, &running(&r)),
        Verdict::Allow
    );
    let without_control = keys.bundle(2, &[&keys.service_port]);
    keys.installed.install(&without_control).unwrap();
    assert_eq!(
        admit(&mut cache, &keys, &token, T0, Access::Exec, &running(&r)),
        Verdict::Deny {
            reason: DenyReason::UnknownKey
        },
        "a removed key stops verifying at once, cached or not"
    );
    assert!(cache.is_empty());
}

#[test]
fn cache_never_holds_more_than_its_capacity() {
    let keys = TestKeys::new();
    let mut cache = VerifiedTokenCache::new(8);
    let r = route(1, 1, "w1");
    for n in 0..100 {
        let token = CapabilityBuilder::control(&keys, &r)
            .token_id(n)
            .sign(&keys);
        assert_eq!(
            admit(&mut cache, &keys, &token, T0, Access::Exec, &running(&r)),
            Verdict::Allow
        );
        assert!(cache.len() <= 8);
    }
}

#[test]
fn refused_tokens_are_never_cached() {
    let keys = TestKeys::new();
    let mut cache = VerifiedTokenCache::new(8);
    let r = route(1, 1, "w1");
    let token = CapabilityBuilder::control(&keys, &r).sign(&keys);
    let mut bytes = token.as_bytes().to_vec();
    let n = bytes.len();
    bytes[n - 1] ^= 1;
    let forged = Token::from_bytes(bytes);
    for _ in 0..2 {
        assert_eq!(
            admit(&mut cache, &keys, &forged, T0, Access::Exec, &running(&r)),
            Verdict::Deny {
                reason: DenyReason::BadSignature
            }
        );
    }
    assert!(cache.is_empty());
}

#[test]
fn cache_hit_and_miss_give_the_same_verdicts() {
    let keys = TestKeys::new();
    let r = route(1, 3, "w1");
    let token = CapabilityBuilder::control(&keys, &r).sign(&keys);
    let records = [
        running(&r),
        running(&route(1, 4, "w1")),
        running(&route(1, 3, "w2")),
    ];
    let mut warm = VerifiedTokenCache::new(4);
    for rec in &records {
        for access in Access::ALL {
            for now in [T0, T0.plus_secs(135), T0.plus_secs(136), T0.minus_secs(16)] {
                let op = Operation {
                    path_sandbox: &rec.route.sandbox,
                    bound_sandbox: None,
                    endpoint: Endpoint::Control { access },
                };
                let cold = space_identity::verify(
                    token.as_bytes(),
                    &keys.installed,
                    now,
                    &op,
                    &worker("w1"),
                    Some(rec),
                );
                let hot = warm.admit(
                    token.as_bytes(),
                    &keys.installed,
                    now,
                    &op,
                    &worker("w1"),
                    Some(rec),
                );
                assert_eq!(cold, hot, "{access:?} at {now} on {:?}", rec.route);
            }
        }
    }
}
