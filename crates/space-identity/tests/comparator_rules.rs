//! One named test per row of the identity table (`IDENTITY.md` §3) and per grant rule
//! (purpose, access, port, protocol, exposure). All tokens here are genuine: only the
//! comparison with the receiver's record decides.

use space_identity::{
    Access, DenyReason, Endpoint, InstalledIdentity, Operation, PodUid, Protocol, RecordState,
    RefreshReason, Route, ServicePort, StreamPhase, Substrate, Verdict, verify,
};
use space_testkit::{CapabilityBuilder, T0, TestKeys, execution, route, running, worker};

struct Receiver {
    worker: &'static str,
    record: Option<InstalledIdentity>,
}

impl Receiver {
    fn running(r: &Route) -> Self {
        Self {
            worker: "w1",
            record: Some(running(r)),
        }
    }

    fn admit(
        &self,
        keys: &TestKeys,
        token: &space_identity::Token,
        path: &Route,
        endpoint: Endpoint,
    ) -> Verdict {
        let op = Operation {
            path_sandbox: &path.sandbox,
            bound_sandbox: None,
            endpoint,
        };
        verify(
            token.as_bytes(),
            &keys.installed,
            T0,
            &op,
            &worker(self.worker),
            self.record.as_ref(),
        )
    }
}

const EXEC: Endpoint = Endpoint::Control {
    access: Access::Exec,
};

fn refresh(reason: RefreshReason) -> Verdict {
    Verdict::RefreshRoute { reason }
}

fn deny(reason: DenyReason) -> Verdict {
    Verdict::Deny { reason }
}

#[test]
fn everything_equal_and_running_is_allowed() {
    let keys = TestKeys::new();
    let r = route(1, 7, "w1");
    let token = CapabilityBuilder::control(&keys, &r).sign(&keys);
    assert_eq!(
        Receiver::running(&r).admit(&keys, &token, &r, EXEC),
        Verdict::Allow
    );
}

#[test]
fn paused_execution_is_still_allowed_because_pause_keeps_the_execution() {
    let keys = TestKeys::new();
    let r = route(1, 7, "w1");
    let token = CapabilityBuilder::control(&keys, &r).sign(&keys);
    let mut rx = Receiver::running(&r);
    rx.record.as_mut().unwrap().state = RecordState::Paused;
    assert_eq!(rx.admit(&keys, &token, &r, EXEC), Verdict::Allow);
}

#[test]
fn sandbox_a_capability_on_sandbox_b_path_is_denied_revealing_nothing() {
    let keys = TestKeys::new();
    let a = route(1, 1, "w1");
    let b = route(2, 1, "w1");
    let token = CapabilityBuilder::control(&keys, &a).sign(&keys);
    // Whether or not this worker hosts B, the answer is the same.
    let hosting_b = Receiver::running(&b);
    let hosting_nothing = Receiver {
        worker: "w1",
        record: None,
    };
    assert_eq!(
        hosting_b.admit(&keys, &token, &b, EXEC),
        deny(DenyReason::SandboxMismatch)
    );
    assert_eq!(
        hosting_nothing.admit(&keys, &token, &b, EXEC),
        deny(DenyReason::SandboxMismatch)
    );
}

#[test]
fn endpoint_bound_to_one_sandbox_denies_another_sandboxs_capability() {
    let keys = TestKeys::new();
    let a = route(1, 1, "w1");
    let b = route(2, 1, "w1");
    let token = CapabilityBuilder::control(&keys, &a).sign(&keys);
    let op = Operation {
        path_sandbox: &a.sandbox,
        bound_sandbox: Some(&b.sandbox),
        endpoint: EXEC,
    };
    let record = running(&a);
    assert_eq!(
        verify(
            token.as_bytes(),
            &keys.installed,
            T0,
            &op,
            &worker("w1"),
            Some(&record)
        ),
        deny(DenyReason::SandboxMismatch)
    );
}

#[test]
fn sandbox_without_any_record_on_this_worker_is_denied() {
    let keys = TestKeys::new();
    let r = route(1, 1, "w1");
    let token = CapabilityBuilder::control(&keys, &r).sign(&keys);
    let rx = Receiver {
        worker: "w1",
        record: None,
    };
    assert_eq!(
        rx.admit(&keys, &token, &r, EXEC),
        deny(DenyReason::UnknownSandbox)
    );
    // A record of some other sandbox is no record of this one.
    let rx = Receiver::running(&route(2, 1, "w1"));
    assert_eq!(
        rx.admit(&keys, &token, &r, EXEC),
        deny(DenyReason::UnknownSandbox)
    );
}

#[test]
fn capability_for_another_worker_gets_refresh_route() {
    let keys = TestKeys::new();
    let on_w2 = route(1, 1, "w2");
    let token = CapabilityBuilder::control(&keys, &on_w2).sign(&keys);
    let rx = Receiver::running(&route(1, 1, "w1"));
    assert_eq!(
        rx.admit(&keys, &token, &on_w2, EXEC),
        refresh(RefreshReason::WrongWorker)
    );
}

#[test]
fn old_worker_after_migration_answers_refresh_route_from_its_tombstone() {
    let keys = TestKeys::new();
    let r = route(1, 7, "w1");
    let token = CapabilityBuilder::control(&keys, &r).sign(&keys);
    let mut rx = Receiver::running(&r);
    rx.record.as_mut().unwrap().state = RecordState::Retired;
    assert_eq!(
        rx.admit(&keys, &token, &r, EXEC),
        refresh(RefreshReason::Retired)
    );
}

#[test]
fn capability_for_generation_7_is_refused_after_8_is_installed() {
    let keys = TestKeys::new();
    let gen7 = route(1, 7, "w1");
    let token = CapabilityBuilder::control(&keys, &gen7).sign(&keys);
    let rx = Receiver::running(&route(1, 8, "w1"));
    // The token is unexpired and genuine; only the installed identity disagrees.
    assert_eq!(
        rx.admit(&keys, &token, &gen7, EXEC),
        refresh(RefreshReason::StaleGeneration)
    );
}

#[test]
fn capability_for_a_generation_not_yet_installed_gets_refresh_route() {
    let keys = TestKeys::new();
    let gen8 = route(1, 8, "w1");
    let token = CapabilityBuilder::control(&keys, &gen8).sign(&keys);
    let rx = Receiver::running(&route(1, 7, "w1"));
    assert_eq!(
        rx.admit(&keys, &token, &gen8, EXEC),
        refresh(RefreshReason::GenerationAhead)
    );
}

#[test]
fn same_generation_with_another_execution_id_gets_refresh_route() {
    let keys = TestKeys::new();
    let r = route(1, 7, "w1");
    let mut other = r.clone();
    other.execution.id = execution(99, 7).id;
    let token = CapabilityBuilder::control(&keys, &other).sign(&keys);
    let rx = Receiver::running(&r);
    assert_eq!(
        rx.admit(&keys, &token, &r, EXEC),
        refresh(RefreshReason::ExecutionMismatch)
    );
}

#[test]
fn different_substrate_gets_refresh_route() {
    let keys = TestKeys::new();
    let r = route(1, 7, "w1");
    let mut fc = r.clone();
    fc.placement.substrate = Substrate::Firecracker;
    let token = CapabilityBuilder::control(&keys, &fc).sign(&keys);
    let rx = Receiver::running(&r);
    assert_eq!(
        rx.admit(&keys, &token, &r, EXEC),
        refresh(RefreshReason::PlacementMismatch)
    );
}

#[test]
fn different_pod_uid_gets_refresh_route() {
    let keys = TestKeys::new();
    let mut r = route(1, 7, "w1");
    r.placement.substrate = Substrate::Kubernetes;
    r.placement.pod_uid = Some(PodUid::from_bytes([1; 16]));
    let mut other_pod = r.clone();
    other_pod.placement.pod_uid = Some(PodUid::from_bytes([2; 16]));
    let token = CapabilityBuilder::control(&keys, &other_pod).sign(&keys);
    let rx = Receiver::running(&r);
    assert_eq!(
        rx.admit(&keys, &token, &r, EXEC),
        refresh(RefreshReason::PlacementMismatch)
    );
}

#[test]
fn same_route_with_another_activation_gets_refresh_route_for_new_requests() {
    let keys = TestKeys::new();
    let r = route(1, 7, "w1");
    let mut reactivated = r.clone();
    reactivated.placement.activation = 2;
    let token = CapabilityBuilder::control(&keys, &r).sign(&keys);
    let rx = Receiver::running(&reactivated);
    assert_eq!(
        rx.admit(&keys, &token, &r, EXEC),
        refresh(RefreshReason::StaleActivation)
    );
}

fn port_endpoint(port: u16, protocol: Protocol, exposed: bool, phase: StreamPhase) -> Endpoint {
    Endpoint::ServicePort {
        requested: ServicePort { port, protocol },
        exposed,
        phase,
    }
}

const HTTP_8080: ServicePort = ServicePort {
    port: 8080,
    protocol: Protocol::Http,
};

#[test]
fn established_service_port_stream_is_kept_across_an_activation_only_change() {
    let keys = TestKeys::new();
    let r = route(1, 7, "w1");
    let mut reactivated = r.clone();
    reactivated.placement.activation = 2;
    let token = CapabilityBuilder::service_port(&keys, &r, HTTP_8080).sign(&keys);
    let rx = Receiver::running(&reactivated);
    assert_eq!(
        rx.admit(
            &keys,
            &token,
            &r,
            port_endpoint(8080, Protocol::Http, true, StreamPhase::Established)
        ),
        Verdict::Allow
    );
    assert_eq!(
        rx.admit(
            &keys,
            &token,
            &r,
            port_endpoint(8080, Protocol::Http, true, StreamPhase::Open)
        ),
        refresh(RefreshReason::StaleActivation),
        "new opens need the updated identity"
    );
}

#[test]
fn established_stream_is_not_kept_when_the_generation_changes() {
    let keys = TestKeys::new();
    let r = route(1, 7, "w1");
    let token = CapabilityBuilder::service_port(&keys, &r, HTTP_8080).sign(&keys);
    let rx = Receiver::running(&route(1, 8, "w1"));
    assert_eq!(
        rx.admit(
            &keys,
            &token,
            &r,
            port_endpoint(8080, Protocol::Http, true, StreamPhase::Established)
        ),
        refresh(RefreshReason::StaleGeneration)
    );
}

#[test]
fn capability_for_a_starting_execution_gets_refresh_route() {
    let keys = TestKeys::new();
    let r = route(1, 7, "w1");
    let token = CapabilityBuilder::control(&keys, &r).sign(&keys);
    let mut rx = Receiver::running(&r);
    rx.record.as_mut().unwrap().state = RecordState::Starting;
    assert_eq!(
        rx.admit(&keys, &token, &r, EXEC),
        refresh(RefreshReason::NotRunning)
    );
}

#[test]
fn exec_token_used_for_files_is_denied() {
    let keys = TestKeys::new();
    let r = route(1, 1, "w1");
    let token = CapabilityBuilder::control(&keys, &r)
        .access(&[Access::Exec])
        .sign(&keys);
    let rx = Receiver::running(&r);
    for access in [
        Access::FsRead,
        Access::FsWrite,
        Access::Terminal,
        Access::Watch,
        Access::Lifecycle,
    ] {
        assert_eq!(
            rx.admit(&keys, &token, &r, Endpoint::Control { access }),
            deny(DenyReason::AccessDenied),
            "{access:?}"
        );
    }
}

#[test]
fn service_port_token_at_sbx_manager_is_denied() {
    let keys = TestKeys::new();
    let r = route(1, 1, "w1");
    let token = CapabilityBuilder::service_port(&keys, &r, HTTP_8080).sign(&keys);
    assert_eq!(
        Receiver::running(&r).admit(&keys, &token, &r, EXEC),
        deny(DenyReason::WrongPurpose)
    );
}

#[test]
fn control_token_at_netgtw_is_denied() {
    let keys = TestKeys::new();
    let r = route(1, 1, "w1");
    let token = CapabilityBuilder::control(&keys, &r).sign(&keys);
    assert_eq!(
        Receiver::running(&r).admit(
            &keys,
            &token,
            &r,
            port_endpoint(8080, Protocol::Http, true, StreamPhase::Open)
        ),
        deny(DenyReason::WrongPurpose)
    );
}

#[test]
fn token_for_port_8080_is_denied_at_8081() {
    let keys = TestKeys::new();
    let r = route(1, 1, "w1");
    let token = CapabilityBuilder::service_port(&keys, &r, HTTP_8080).sign(&keys);
    assert_eq!(
        Receiver::running(&r).admit(
            &keys,
            &token,
            &r,
            port_endpoint(8081, Protocol::Http, true, StreamPhase::Open)
        ),
        deny(DenyReason::WrongPort)
    );
}

#[test]
fn http_token_used_for_tcp_is_denied() {
    let keys = TestKeys::new();
    let r = route(1, 1, "w1");
    let token = CapabilityBuilder::service_port(&keys, &r, HTTP_8080).sign(&keys);
    assert_eq!(
        Receiver::running(&r).admit(
            &keys,
            &token,
            &r,
            port_endpoint(8080, Protocol::Tcp, true, StreamPhase::Open)
        ),
        deny(DenyReason::WrongProtocol)
    );
}

#[test]
fn non_exposed_port_is_denied() {
    let keys = TestKeys::new();
    let r = route(1, 1, "w1");
    let token = CapabilityBuilder::service_port(&keys, &r, HTTP_8080).sign(&keys);
    assert_eq!(
        Receiver::running(&r).admit(
            &keys,
            &token,
            &r,
            port_endpoint(8080, Protocol::Http, false, StreamPhase::Open)
        ),
        deny(DenyReason::PortNotExposed)
    );
}

#[test]
fn identity_refusals_are_refresh_and_token_refusals_are_deny() {
    // Every reason has one kind; the two enums never overlap in text either.
    for d in DenyReason::ALL {
        assert!(!RefreshReason::ALL.iter().any(|r| r.as_str() == d.as_str()));
        assert_eq!(d.as_str().parse::<DenyReason>().unwrap(), *d);
    }
    for r in RefreshReason::ALL {
        assert_eq!(r.as_str().parse::<RefreshReason>().unwrap(), *r);
    }
    assert_eq!(Verdict::Allow.kind_str(), "allow");
    assert_eq!(refresh(RefreshReason::Retired).kind_str(), "refresh_route");
    assert_eq!(deny(DenyReason::Expired).reason_str(), "expired");
}
