//! Route recovery rules (`IDENTITY.md` §4).

use space_identity::{
    AfterRefresh, DenyReason, OperationClass, Progress, Recovery, RecoveryError, RecoveryStep,
    RefreshReason, Replacement, RouteCache,
};
use space_testkit::{T0, route};

#[test]
fn late_refresh_for_r1_keeps_r2_in_the_cache() {
    let mut cache = RouteCache::new(16);
    let (r1, r2, r3) = (route(1, 1, "w1"), route(1, 2, "w2"), route(1, 3, "w1"));
    cache.insert(r1.clone(), "cap1", T0.plus_secs(300), T0);
    assert_eq!(
        cache.replace_if_current(&r1.identity(), r2.clone(), "cap2", T0),
        Replacement::Replaced
    );
    // A delayed rejection of r1 arrives with a resolve result r3 (or even r1 again).
    assert_eq!(
        cache.replace_if_current(&r1.identity(), r3, "cap3", T0),
        Replacement::KeptCurrent
    );
    assert_eq!(cache.get(&r1.sandbox, T0).unwrap().route, r2);
    assert_eq!(cache.get(&r1.sandbox, T0).unwrap().value, "cap2");
}

#[test]
fn repaired_entry_keeps_the_original_authorization_expiry() {
    let mut cache = RouteCache::new(16);
    let (r1, r2) = (route(1, 1, "w1"), route(1, 2, "w2"));
    let authorized_until = T0.plus_secs(60);
    cache.insert(r1.clone(), (), authorized_until, T0);
    assert_eq!(
        cache.replace_if_current(&r1.identity(), r2.clone(), (), T0.plus_secs(50)),
        Replacement::Replaced
    );
    let e = cache.get(&r1.sandbox, T0.plus_secs(50)).unwrap();
    assert_eq!(
        e.authorized_until, authorized_until,
        "repair is not renewal"
    );
    assert!(cache.get(&r1.sandbox, T0.plus_secs(61)).is_none());
}

#[test]
fn repair_of_an_expired_authorization_does_not_revive_it() {
    let mut cache = RouteCache::new(16);
    let (r1, r2) = (route(1, 1, "w1"), route(1, 2, "w2"));
    cache.insert(r1.clone(), (), T0.plus_secs(10), T0);
    assert_eq!(
        cache.replace_if_current(&r1.identity(), r2, (), T0.plus_secs(11)),
        Replacement::Missing
    );
}

#[test]
fn resolve_returning_the_rejected_route_is_not_cached() {
    let mut cache = RouteCache::new(16);
    let r1 = route(1, 1, "w1");
    cache.insert(r1.clone(), (), T0.plus_secs(60), T0);
    let mut same_identity = r1.clone();
    same_identity.placement.activation += 1;
    assert_eq!(
        cache.replace_if_current(&r1.identity(), same_identity, (), T0),
        Replacement::SameRoute
    );
}

#[test]
fn refresh_for_a_route_already_repaired_uses_the_repaired_entry_without_resolving() {
    let mut cache = RouteCache::new(16);
    let (r1, r2) = (route(1, 1, "w1"), route(1, 2, "w2"));
    cache.insert(r1.clone(), (), T0.plus_secs(60), T0);
    assert_eq!(
        cache.after_refresh(&r1.identity(), T0),
        AfterRefresh::Resolve
    );
    cache.replace_if_current(&r1.identity(), r2.clone(), (), T0);
    match cache.after_refresh(&r1.identity(), T0) {
        AfterRefresh::UseCurrent(e) => assert_eq!(e.route, r2),
        AfterRefresh::Resolve => panic!("a second resolve for an already repaired route"),
    }
}

#[test]
fn remove_after_deny_only_removes_the_denied_route() {
    let mut cache = RouteCache::new(16);
    let (r1, r2) = (route(1, 1, "w1"), route(1, 2, "w2"));
    cache.insert(r2.clone(), (), T0.plus_secs(60), T0);
    assert!(!cache.remove_if_current(&r1.identity()));
    assert!(cache.remove_if_current(&r2.identity()));
    assert!(cache.is_empty());
}

#[test]
fn route_cache_is_bounded() {
    let mut cache = RouteCache::new(4);
    for n in 0..50 {
        cache.insert(route(n, 1, "w1"), (), T0.plus_secs(60), T0);
        assert!(cache.len() <= 4);
    }
}

#[test]
fn eligible_operation_makes_exactly_one_rebuilt_attempt() {
    let mut rec = Recovery::new(OperationClass::Read);
    let (r1, r2) = (route(1, 1, "w1"), route(1, 2, "w2"));
    assert_eq!(
        rec.on_refresh(
            r1.identity(),
            RefreshReason::StaleGeneration,
            Progress::NotStarted
        ),
        Ok(RecoveryStep::Resolve {
            rejected: r1.identity()
        })
    );
    assert_eq!(rec.on_resolved(&r2.identity()), Ok(()));
    assert_eq!(
        rec.on_refresh(r2.identity(), RefreshReason::Retired, Progress::NotStarted),
        Err(RecoveryError::RefreshAfterRebuild(RefreshReason::Retired)),
        "a second RefreshRoute is an error, not a loop"
    );
}

#[test]
fn resolve_returning_the_rejected_route_again_is_an_error() {
    let mut rec = Recovery::new(OperationClass::Read);
    let r1 = route(1, 1, "w1");
    rec.on_refresh(
        r1.identity(),
        RefreshReason::WrongWorker,
        Progress::NotStarted,
    )
    .unwrap();
    assert_eq!(
        rec.on_resolved(&r1.identity()),
        Err(RecoveryError::ResolvedSameRoute)
    );
}

#[test]
fn deny_is_surfaced_and_never_retried() {
    let mut rec = Recovery::new(OperationClass::Read);
    assert_eq!(
        rec.on_deny(DenyReason::BadSignature),
        RecoveryError::Denied(DenyReason::BadSignature)
    );
    assert!(!rec.rebuilt());
}

#[test]
fn exec_rejected_before_forwarding_is_eligible() {
    let mut rec = Recovery::new(OperationClass::Mutation {
        idempotency_key: false,
    });
    assert!(
        rec.on_refresh(
            route(1, 1, "w1").identity(),
            RefreshReason::StaleGeneration,
            Progress::NotStarted
        )
        .is_ok()
    );
}

#[test]
fn started_non_idempotent_operation_is_not_retried_after_refresh() {
    for class in [
        OperationClass::Mutation {
            idempotency_key: false,
        },
        OperationClass::Mutation {
            idempotency_key: true,
        },
        OperationClass::StreamOpen,
    ] {
        let mut rec = Recovery::new(class);
        assert_eq!(
            rec.on_refresh(
                route(1, 1, "w1").identity(),
                RefreshReason::Retired,
                Progress::Started
            ),
            Err(RecoveryError::NotEligible(RefreshReason::Retired)),
            "{class:?}"
        );
    }
}

#[test]
fn started_read_may_be_rebuilt_on_the_current_execution() {
    let mut rec = Recovery::new(OperationClass::Read);
    assert!(
        rec.on_refresh(
            route(1, 1, "w1").identity(),
            RefreshReason::Retired,
            Progress::Started
        )
        .is_ok()
    );
}

#[test]
fn transport_failure_retries_an_idempotent_read_once() {
    let mut rec = Recovery::new(OperationClass::Read);
    assert_eq!(
        rec.on_transport_failure(Progress::Started),
        Ok(RecoveryStep::RetrySameRoute)
    );
    assert_eq!(
        rec.on_transport_failure(Progress::Started),
        Err(RecoveryError::Transport)
    );
}

#[test]
fn started_write_without_idempotency_key_is_not_retried_after_transport_failure() {
    let mut rec = Recovery::new(OperationClass::Mutation {
        idempotency_key: false,
    });
    assert_eq!(
        rec.on_transport_failure(Progress::Started),
        Err(RecoveryError::Transport)
    );
    let mut keyed = Recovery::new(OperationClass::Mutation {
        idempotency_key: true,
    });
    assert_eq!(
        keyed.on_transport_failure(Progress::Started),
        Ok(RecoveryStep::RetrySameRoute)
    );
}
