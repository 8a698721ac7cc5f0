//! Deterministic identities: sandboxes, executions, workers, routes and runtime records
//! built from small numbers, so a failing test fails the same way twice.

use space_identity::{
    Execution, ExecutionId, Generation, InstalledIdentity, Placement, RecordState, Route,
    SandboxId, Substrate, WorkerId,
};

/// A deterministic 16-byte value from a label and a number.
pub fn bytes16(label: u8, n: u64) -> [u8; 16] {
    let mut b = [label; 16];
    b[8..].copy_from_slice(&n.to_be_bytes());
    b
}

/// Sandbox number `n`.
pub fn sandbox(n: u64) -> SandboxId {
    SandboxId::from_bytes(bytes16(0x5b, n))
}

/// Execution `generation` of sandbox `n` (its ID is derived from both).
pub fn execution(n: u64, generation: u64) -> Execution {
    Execution {
        generation: Generation(generation),
        id: ExecutionId::from_bytes(bytes16(0xe0 ^ (n as u8), generation)),
    }
}

/// A worker name.
pub fn worker(name: &str) -> WorkerId {
    name.parse().expect("test worker names are valid")
}

/// The route of sandbox `n`, generation `generation`, on jail worker `w`.
pub fn route(n: u64, generation: u64, w: &str) -> Route {
    Route {
        sandbox: sandbox(n),
        execution: execution(n, generation),
        placement: Placement {
            worker: worker(w),
            substrate: Substrate::Jail,
            activation: 1,
            pod_uid: None,
        },
    }
}

/// A running record for `route`.
pub fn running(route: &Route) -> InstalledIdentity {
    InstalledIdentity {
        route: route.clone(),
        state: RecordState::Running,
    }
}
