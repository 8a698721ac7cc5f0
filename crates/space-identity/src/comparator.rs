//! The comparator every receiver runs before it forwards anything (`IDENTITY.md` §3).
//!
//! Check order: size → decode → key → signature → time → purpose → access (and port /
//! protocol at netgtw) → identity. The first failure decides. Everything up to access
//! is about the token itself and can only Deny; only the identity comparison against
//! the receiver's durable record can ask for a route refresh.

use ed25519_dalek::Signature;

use crate::capability::{Claims, SIGNATURE_LEN, with_signed_message};
use crate::ids::{Access, Route, SandboxId, ServicePort, WorkerId};
use crate::keys::InstalledKeys;
use crate::time::Timestamp;
use crate::verdict::{DenyReason, RefreshReason, Verdict};
use crate::{CLOCK_SKEW_SECS, MAX_CAPABILITY_BYTES, MAX_CAPABILITY_LIFETIME_SECS};

/// Lifecycle state of an installed record.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RecordState {
    /// Installed, not yet acknowledged as running.
    Starting,
    /// Running.
    Running,
    /// Frozen in place: the same execution; requests wait for resume.
    Paused,
    /// Retired: a tombstone kept so late capabilities get a refresh, not a denial.
    Retired,
}

/// What a receiver has durably installed for one sandbox: its *installed* identity.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InstalledIdentity {
    /// Sandbox, execution and placement as installed.
    pub route: Route,
    /// Where the execution is in its life.
    pub state: RecordState,
}

/// Whether a service-port stream is being opened or already flows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StreamPhase {
    /// A new request or stream.
    Open,
    /// A stream admitted earlier and still open (re-checked on identity changes).
    Established,
}

/// The kind of endpoint a request reached, and what it needs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Endpoint {
    /// An operation through sbx-manager needing one access kind.
    Control {
        /// The access the operation needs.
        access: Access,
    },
    /// Service-port traffic at netgtw.
    ServicePort {
        /// The port and protocol of the traffic.
        requested: ServicePort,
        /// Whether this sandbox exposes that port (trusted activation state).
        exposed: bool,
        /// New open or established stream.
        phase: StreamPhase,
    },
}

/// One request as the receiver sees it, parsed from its own trusted inputs.
#[derive(Clone, Copy, Debug)]
pub struct Operation<'a> {
    /// The sandbox the request path names.
    pub path_sandbox: &'a SandboxId,
    /// For endpoints bound to one sandbox (netgtw, a bridge): that sandbox.
    pub bound_sandbox: Option<&'a SandboxId>,
    /// What the request is.
    pub endpoint: Endpoint,
}

/// Size → decode → key → signature → time. What a verified-token cache may skip on a
/// later sight of the same bytes is exactly the signature; time is re-checked by it.
pub fn verify_capability(
    token: &[u8],
    keys: &InstalledKeys,
    now: Timestamp,
) -> Result<Claims, DenyReason> {
    if token.len() > MAX_CAPABILITY_BYTES {
        return Err(DenyReason::Oversized);
    }
    if token.len() <= SIGNATURE_LEN {
        return Err(DenyReason::Malformed);
    }
    let (region, sig) = token.split_at(token.len() - SIGNATURE_LEN);
    let claims = Claims::decode(region)?;

    let key = keys.get(&claims.key_id).ok_or(DenyReason::UnknownKey)?;
    if !key.is_valid_at(now) {
        return Err(DenyReason::KeyNotValid);
    }
    if !key.uses.allows(claims.purpose) {
        return Err(DenyReason::WrongKeyPurpose);
    }

    let sig = Signature::from_slice(sig).map_err(|_| DenyReason::BadSignature)?;
    with_signed_message(region, |msg| key.public.verify_strict(msg, &sig))
        .map_err(|_| DenyReason::BadSignature)?;

    check_time(&claims, now)?;
    Ok(claims)
}

/// The time rules: lifetime ≤ the maximum (enforced here, not trusted from the
/// issuer), not expired beyond skew, not issued beyond skew in the future.
pub(crate) fn check_time(claims: &Claims, now: Timestamp) -> Result<(), DenyReason> {
    let (iat, exp) = (claims.issued_at.unix_secs(), claims.expires_at.unix_secs());
    if exp < iat || exp - iat > MAX_CAPABILITY_LIFETIME_SECS {
        return Err(DenyReason::LifetimeTooLong);
    }
    if now > claims.expires_at.plus_secs(CLOCK_SKEW_SECS) {
        return Err(DenyReason::Expired);
    }
    if claims.issued_at > now.plus_secs(CLOCK_SKEW_SECS) {
        return Err(DenyReason::NotYetValid);
    }
    Ok(())
}

/// Purpose → access (→ port and protocol) → identity, for verified claims.
///
/// `this_worker` is the receiver's own worker ID; `installed` is its durable record for
/// the sandbox the capability names (current or tombstone), `None` when it has none.
pub fn compare(
    claims: &Claims,
    op: &Operation<'_>,
    this_worker: &WorkerId,
    installed: Option<&InstalledIdentity>,
) -> Verdict {
    if let Err(reason) = check_grant(claims, op) {
        return Verdict::Deny { reason };
    }
    compare_identity(claims, op, this_worker, installed)
}

fn check_grant(claims: &Claims, op: &Operation<'_>) -> Result<(), DenyReason> {
    match op.endpoint {
        Endpoint::Control { access } => {
            if claims.purpose != crate::Purpose::Control {
                return Err(DenyReason::WrongPurpose);
            }
            if !claims.access.contains(access) {
                return Err(DenyReason::AccessDenied);
            }
        }
        Endpoint::ServicePort {
            requested, exposed, ..
        } => {
            if claims.purpose != crate::Purpose::ServicePort {
                return Err(DenyReason::WrongPurpose);
            }
            if !claims.access.contains(Access::ServicePort) {
                return Err(DenyReason::AccessDenied);
            }
            // The decoder guarantees a service-port capability names a port.
            let granted = claims.service_port.ok_or(DenyReason::Malformed)?;
            if granted.port != requested.port {
                return Err(DenyReason::WrongPort);
            }
            if granted.protocol != requested.protocol {
                return Err(DenyReason::WrongProtocol);
            }
            if !exposed {
                return Err(DenyReason::PortNotExposed);
            }
        }
    }
    Ok(())
}

fn compare_identity(
    claims: &Claims,
    op: &Operation<'_>,
    this_worker: &WorkerId,
    installed: Option<&InstalledIdentity>,
) -> Verdict {
    let selected = &claims.route;
    if selected.sandbox != *op.path_sandbox {
        return DenyReason::SandboxMismatch.into();
    }
    if op.bound_sandbox.is_some_and(|b| *b != selected.sandbox) {
        return DenyReason::SandboxMismatch.into();
    }
    let Some(record) = installed.filter(|r| r.route.sandbox == selected.sandbox) else {
        return DenyReason::UnknownSandbox.into();
    };
    if selected.placement.worker != *this_worker {
        return RefreshReason::WrongWorker.into();
    }
    if record.state == RecordState::Retired {
        return RefreshReason::Retired.into();
    }
    let (want, have) = (&selected.execution, &record.route.execution);
    if want.generation < have.generation {
        return RefreshReason::StaleGeneration.into();
    }
    if want.generation > have.generation {
        return RefreshReason::GenerationAhead.into();
    }
    if want.id != have.id {
        return RefreshReason::ExecutionMismatch.into();
    }
    let (want, have) = (&selected.placement, &record.route.placement);
    // The record is this worker's own; a record naming another worker is not a
    // placement this receiver serves.
    if want.worker != have.worker
        || want.substrate != have.substrate
        || want.pod_uid != have.pod_uid
    {
        return RefreshReason::PlacementMismatch.into();
    }
    if want.activation != have.activation {
        let established_stream = matches!(
            op.endpoint,
            Endpoint::ServicePort {
                phase: StreamPhase::Established,
                ..
            }
        );
        if !established_stream {
            return RefreshReason::StaleActivation.into();
        }
    }
    match record.state {
        RecordState::Running | RecordState::Paused => Verdict::Allow,
        RecordState::Starting | RecordState::Retired => RefreshReason::NotRunning.into(),
    }
}

/// The whole comparator: verify the token, then compare it with the record.
pub fn verify(
    token: &[u8],
    keys: &InstalledKeys,
    now: Timestamp,
    op: &Operation<'_>,
    this_worker: &WorkerId,
    installed: Option<&InstalledIdentity>,
) -> Verdict {
    match verify_capability(token, keys, now) {
        Ok(claims) => compare(&claims, op, this_worker, installed),
        Err(reason) => Verdict::Deny { reason },
    }
}
