//! Property tests over random capabilities, routes and cache histories.

use proptest::prelude::*;
use space_identity::test_util::sign_unchecked;
use space_identity::{
    Access, AccessSet, Claims, Endpoint, Execution, ExecutionId, Generation, Operation, Placement,
    PodUid, Protocol, Purpose, RecordState, Replacement, Route, RouteCache, SandboxId, ServicePort,
    Substrate, TokenId, Verdict, WorkerId, verify, verify_capability,
};
use space_testkit::{T0, TestKeys, running};

fn worker_name() -> impl Strategy<Value = WorkerId> {
    "[a-z0-9][a-z0-9-]{0,62}".prop_map(|s| s.parse().unwrap())
}

fn arb_route() -> impl Strategy<Value = Route> {
    (
        any::<[u8; 16]>(),
        1u64..,
        any::<[u8; 16]>(),
        worker_name(),
        prop_oneof![
            Just(Substrate::Jail),
            Just(Substrate::Firecracker),
            Just(Substrate::Kubernetes),
            Just(Substrate::Vm)
        ],
        any::<u32>(),
        any::<[u8; 16]>(),
    )
        .prop_map(
            |(sbx, generation, exe, worker, substrate, activation, pod)| Route {
                sandbox: SandboxId::from_bytes(sbx),
                execution: Execution {
                    generation: Generation(generation),
                    id: ExecutionId::from_bytes(exe),
                },
                placement: Placement {
                    worker,
                    substrate,
                    activation,
                    pod_uid: (substrate == Substrate::Kubernetes).then(|| PodUid::from_bytes(pod)),
                },
            },
        )
}

/// Valid claims for the fixture keys, issued at T0 with a lifetime of up to 120 s.
fn arb_claims(keys: &TestKeys) -> impl Strategy<Value = Claims> {
    let control = keys.control.key_id();
    let service = keys.service_port.key_id();
    (
        arb_route(),
        1u8..0x40,
        any::<bool>(),
        1u16..,
        any::<bool>(),
        0u64..=120,
        any::<[u8; 16]>(),
    )
        .prop_map(move |(route, bits, is_port, port, tcp, life, tok)| {
            let (key_id, purpose, access, service_port) = if is_port {
                let protocol = if tcp { Protocol::Tcp } else { Protocol::Http };
                (
                    service,
                    Purpose::ServicePort,
                    AccessSet::of(&[Access::ServicePort]),
                    Some(ServicePort { port, protocol }),
                )
            } else {
                let access = AccessSet::of(
                    &Access::ALL[..6]
                        .iter()
                        .enumerate()
                        .filter(|(i, _)| bits & (1 << i) != 0)
                        .map(|(_, a)| *a)
                        .collect::<Vec<_>>(),
                );
                (control, Purpose::Control, access, None)
            };
            Claims {
                key_id,
                route,
                access,
                purpose,
                service_port,
                issued_at: T0,
                expires_at: T0.plus_secs(life),
                token_id: TokenId::from_bytes(tok),
            }
        })
}

fn signer_for<'a>(keys: &'a TestKeys, c: &Claims) -> &'a space_identity::CapabilitySigner {
    match c.purpose {
        Purpose::Control => &keys.control,
        Purpose::ServicePort => &keys.service_port,
    }
}

#[test]
fn every_single_bit_flip_of_an_encoded_capability_is_refused() {
    let keys = TestKeys::new();
    let claims =
        space_testkit::CapabilityBuilder::control(&keys, &space_testkit::route(1, 1, "w1"));
    let token = claims.sign(&keys);
    let bytes = token.as_bytes();
    for bit in 0..bytes.len() * 8 {
        let mut flipped = bytes.to_vec();
        flipped[bit / 8] ^= 1 << (bit % 8);
        assert!(
            verify_capability(&flipped, &keys.installed, T0).is_err(),
            "flip of bit {bit} was accepted"
        );
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn encode_then_decode_round_trips(claims in arb_claims(&TestKeys::new())) {
        let keys = TestKeys::new();
        let token = signer_for(&keys, &claims).sign(&claims).unwrap();
        let decoded = verify_capability(token.as_bytes(), &keys.installed, T0).unwrap();
        prop_assert_eq!(&decoded, &claims);
        let text = token.to_text();
        prop_assert_eq!(space_identity::Token::from_text(&text).unwrap(), token);
    }

    #[test]
    fn any_single_bit_flip_of_a_random_capability_is_refused(
        claims in arb_claims(&TestKeys::new()),
        bit in any::<prop::sample::Index>(),
    ) {
        let keys = TestKeys::new();
        let token = signer_for(&keys, &claims).sign(&claims).unwrap();
        let mut bytes = token.as_bytes().to_vec();
        let bit = bit.index(bytes.len() * 8);
        bytes[bit / 8] ^= 1 << (bit % 8);
        prop_assert!(verify_capability(&bytes, &keys.installed, T0).is_err());
    }

    #[test]
    fn random_bytes_never_verify_and_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..1100)) {
        let keys = TestKeys::new();
        prop_assert!(verify_capability(&bytes, &keys.installed, T0).is_err());
    }

    #[test]
    fn comparator_never_allows_when_any_route_field_differs(
        selected in arb_route(),
        field in 0usize..6,
        other in arb_route(),
    ) {
        let keys = TestKeys::new();
        let mut installed = selected.clone();
        match field {
            0 => installed.execution.generation = Generation(selected.execution.generation.0 ^ other.execution.generation.0.max(1)),
            1 => installed.execution.id = other.execution.id,
            2 => installed.placement.worker = other.placement.worker.clone(),
            3 => installed.placement.substrate = other.placement.substrate,
            4 => installed.placement.activation = selected.placement.activation.wrapping_add(1),
            _ => installed.placement.pod_uid = Some(other.placement.pod_uid.unwrap_or(PodUid::from_bytes([0xaa; 16]))),
        }
        prop_assume!(installed != selected);
        let claims = Claims {
            key_id: keys.control.key_id(),
            route: selected.clone(),
            access: AccessSet::of(&[Access::Exec]),
            purpose: Purpose::Control,
            service_port: None,
            issued_at: T0,
            expires_at: T0.plus_secs(60),
            token_id: TokenId::from_bytes([0; 16]),
        };
        // Sign without issuer checks: the installed side may hold any combination.
        let token = sign_unchecked(&keys.control, &claims);
        let op = Operation {
            path_sandbox: &selected.sandbox,
            bound_sandbox: None,
            endpoint: Endpoint::Control { access: Access::Exec },
        };
        // The receiver is the worker its own record names.
        let me = installed.placement.worker.clone();
        for state in [RecordState::Running, RecordState::Paused] {
            let record = space_identity::InstalledIdentity { route: installed.clone(), state };
            let v = verify(token.as_bytes(), &keys.installed, T0, &op, &me, Some(&record));
            prop_assert_ne!(v, Verdict::Allow);
        }
    }

    #[test]
    fn cache_replacement_never_overwrites_an_entry_newer_than_the_rejected_route(
        ops in prop::collection::vec((1u64..6, 1u64..6), 1..40),
    ) {
        // Model: the cache holds generation `current`; each op is "a rejection of
        // generation r with a resolve result n". Replacement may happen only when the
        // entry still holds r.
        let mut cache = RouteCache::new(4);
        let route_of = |g: u64| running(&space_testkit::route(1, g, "w1")).route;
        let mut current = 1u64;
        cache.insert(route_of(1), (), T0.plus_secs(120), T0);
        for (rejected, resolved) in ops {
            let outcome = cache.replace_if_current(&route_of(rejected).identity(), route_of(resolved), (), T0);
            let expected = if rejected == resolved {
                Replacement::SameRoute
            } else if rejected == current {
                current = resolved;
                Replacement::Replaced
            } else {
                Replacement::KeptCurrent
            };
            prop_assert_eq!(outcome, expected);
            prop_assert_eq!(cache.get(&route_of(1).sandbox, T0).unwrap().route.execution.generation, Generation(current));
        }
    }
}
