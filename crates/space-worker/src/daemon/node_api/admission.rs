//! Admission, the step between parsing a request and handling it: the capability a
//! [`SandboxRequest`] presents is verified and compared with this worker's record of
//! the sandbox (local state only), and only an allowed request becomes [`Admitted`] —
//! which nothing else can make, so a handler, taking one, never sees any other.

use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Path, State};
use axum::http::{HeaderMap, Method, header};
use axum::response::Response;
use space_identity::{
    Access, DenyReason, Endpoint, Operation, SandboxId, ServicePort, StreamPhase, Token, Verdict,
};

use super::refusal::{Refusal, Stale};
use crate::daemon::records::RecordState;
use crate::daemon::state::{Slot, Worker};

/// A sandbox-scoped request as parsed: the sandbox its path names, the access it
/// needs, and the capability it presents.
#[derive(Debug)]
pub(crate) struct SandboxRequest {
    sandbox: SandboxId,
    access: Access,
    token: Token,
}

impl SandboxRequest {
    /// Parses the `Authorization: SpaceCap …` header and the path's sandbox ID: 401
    /// without a capability or with one that does not parse, 403 `sandbox_mismatch`
    /// for a path that names no sandbox this worker could serve.
    pub(crate) fn parse(headers: &HeaderMap, id: &str, access: Access) -> Result<Self, Refusal> {
        let text = headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("SpaceCap "))
            .ok_or(Refusal::NoCapability)?;
        let token = Token::from_text(text.trim()).map_err(Refusal::UnparseableCapability)?;
        let sandbox = id
            .parse()
            .map_err(|_| Refusal::Deny(DenyReason::SandboxMismatch))?;
        Ok(Self {
            sandbox,
            access,
            token,
        })
    }

    /// The comparator's verdict on this request, and the sandbox's slot.
    fn verdict(&self, w: &Worker) -> (Verdict, Option<Arc<Slot>>) {
        let op = Operation {
            path_sandbox: &self.sandbox,
            bound_sandbox: None,
            endpoint: Endpoint::Control {
                access: self.access,
            },
        };
        w.admit(self.token.as_bytes(), &op)
    }
}

/// A request the comparator allowed for an execution running here, with a bridge.
#[derive(Debug)]
pub(crate) struct Admitted {
    sandbox: SandboxId,
    slot: Arc<Slot>,
}

impl Admitted {
    /// The sandbox.
    pub(crate) fn sandbox(&self) -> SandboxId {
        self.sandbox
    }

    /// The slot of the execution it was admitted for.
    pub(crate) fn into_slot(self) -> Arc<Slot> {
        self.slot
    }

    /// The same request once its execution is not paused (see [`wait_unpaused`]).
    pub(crate) async fn unpaused(self, w: &Worker) -> Result<Self, Refusal> {
        let slot = wait_unpaused(w, self.slot).await?;
        Ok(Self {
            sandbox: self.sandbox,
            slot,
        })
    }
}

/// Admits `req` (its verdict counted) or refuses it: 403 on a denial, 421 on a stale
/// route or when the sandbox's execution is not running here.
pub(crate) fn admit(w: &Worker, req: SandboxRequest) -> Result<Admitted, Refusal> {
    let (verdict, slot) = req.verdict(w);
    admitted(w, req.sandbox, verdict, slot)
}

/// Admission of a service-port connection at netgtw (`IDENTITY.md` §3): the
/// capability must be for service ports, name `requested` (port and protocol) and the
/// sandbox the path names, which must expose that port in this worker's trusted
/// record; then the identity comparison, and the same wait as requests when paused.
pub(crate) async fn admit_service_port(
    w: &Worker,
    headers: &HeaderMap,
    id: &str,
    requested: ServicePort,
) -> Result<Admitted, Refusal> {
    let req = SandboxRequest::parse(headers, id, Access::ServicePort)?;
    let exposed = w.slot(&req.sandbox).is_some_and(|s| {
        space_proto::api::ports::exposure(&s.record.ports, requested.port, requested.protocol)
            .is_some()
    });
    let op = Operation {
        path_sandbox: &req.sandbox,
        bound_sandbox: Some(&req.sandbox),
        endpoint: Endpoint::ServicePort {
            requested,
            exposed,
            phase: StreamPhase::Open,
        },
    };
    let (verdict, slot) = w.admit(req.token.as_bytes(), &op);
    admitted(w, req.sandbox, verdict, slot)?.unpaused(w).await
}

/// What a verdict comes to: an admitted request, or its refusal (counted either way).
fn admitted(
    w: &Worker,
    sandbox: SandboxId,
    verdict: Verdict,
    slot: Option<Arc<Slot>>,
) -> Result<Admitted, Refusal> {
    w.metrics.admitted(&verdict);
    match verdict {
        Verdict::Allow => {}
        Verdict::RefreshRoute { reason } => {
            return Err(Refusal::RefreshRoute(Stale::Route(reason)));
        }
        Verdict::Deny { reason } => return Err(Refusal::Deny(reason)),
    }
    match slot {
        Some(slot) if slot.pool.is_some() => Ok(Admitted { sandbox, slot }),
        _ => Err(Refusal::RefreshRoute(Stale::NotRunning)),
    }
}

/// Parses and admits in one step.
pub(crate) fn parse_and_admit(
    w: &Worker,
    headers: &HeaderMap,
    id: &str,
    access: Access,
) -> Result<Admitted, Refusal> {
    admit(w, SandboxRequest::parse(headers, id, access)?)
}

/// Admission of a stream open: the comparator, then the same wait as requests when
/// the execution is paused.
pub(crate) async fn admit_stream(
    w: &Worker,
    headers: &HeaderMap,
    id: &str,
    access: Access,
) -> Result<Admitted, Refusal> {
    parse_and_admit(w, headers, id, access)?.unpaused(w).await
}

/// How long a request to a paused sandbox waits for a resume before it is answered
/// `409 paused` (nothing was forwarded, so nothing is lost).
const PAUSED_WAIT: Duration = Duration::from_secs(2);

/// How long a request to an execution frozen for a snapshot or a migration waits for
/// it to be thawed or replaced: as long as the edge waits for a transition.
const SNAPSHOT_WAIT: Duration = Duration::from_secs(10);

/// The slot once its execution is not paused (waiting up to [`PAUSED_WAIT`], or
/// [`SNAPSHOT_WAIT`] when it is frozen for a snapshot, woken by
/// slot changes, not polling). An execution retired or replaced meanwhile is a stale
/// route (421); one that is no longer live is too.
async fn wait_unpaused(w: &Worker, mut slot: Arc<Slot>) -> Result<Arc<Slot>, Refusal> {
    let wait = if w.is_snapshot_frozen(&slot.record.sandbox, slot.record.generation) {
        SNAPSHOT_WAIT
    } else {
        PAUSED_WAIT
    };
    let deadline = tokio::time::Instant::now() + wait;
    let mut changes = w.slot_changes.subscribe();
    while slot.record.state == RecordState::Paused {
        if !matches!(
            tokio::time::timeout_at(deadline, changes.changed()).await,
            Ok(Ok(()))
        ) {
            return Err(Refusal::Paused);
        }
        slot = match w.slot(&slot.record.sandbox) {
            Some(s)
                if s.record.generation == slot.record.generation
                    && s.record.execution_id == slot.record.execution_id =>
            {
                s
            }
            _ => return Err(Refusal::RefreshRoute(Stale::Replaced)),
        };
    }
    if !matches!(slot.record.state, RecordState::Running) {
        return Err(Refusal::RefreshRoute(Stale::Replaced));
    }
    Ok(slot)
}

/// How long a sandbox request waits for a restarted worker to re-adopt the executions
/// it ran before (its start-up reconciliation): as long as the edge waits for a
/// transition. Past it, the request is admitted as things stand.
const ADOPTION_WAIT: Duration = Duration::from_secs(10);

/// Holds a sandbox request while a restarted worker re-adopts what it ran (see
/// [`crate::daemon::readiness::Readiness::adopted`]): before that, the execution a
/// capability names is in the records but has no bridge, and a 421 would send the
/// caller's one rebuilt attempt to the very same route — which the control plane
/// still names, rightly, since the execution lives on. Only a request whose
/// capability is authentic (signed by an installed key, in its validity) for a
/// sandbox this worker holds is held: anything else is answered at once, as
/// admission words it, so that the wait cannot be used to hold connections.
pub(crate) async fn held_while_adopting(
    State(w): State<Arc<Worker>>,
    Path(id): Path<String>,
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    // The request path pays one read of a flag: nothing is verified or waited for
    // unless a reconciliation is under way.
    if w.readiness.is_adopting()
        && authentic(&w, req.headers(), &id)
        && !w.readiness.adopted(ADOPTION_WAIT).await
    {
        tracing::warn!("a sandbox request waited 10 s for the start-up reconciliation");
    }
    next.run(req).await
}

/// Whether the request's capability passed the comparator's checks up to and
/// including its signature and times, for a sandbox recorded here: its verdict is an
/// allow, a stale route, or a denial for what it asks (purpose, access, port), not for
/// what it is.
fn authentic(w: &Worker, headers: &HeaderMap, id: &str) -> bool {
    let Ok(asked) = SandboxRequest::parse(headers, id, Access::FsRead) else {
        return false;
    };
    match asked.verdict(w).0 {
        Verdict::Allow | Verdict::RefreshRoute { .. } => true,
        Verdict::Deny { reason } => matches!(
            reason,
            DenyReason::WrongPurpose
                | DenyReason::AccessDenied
                | DenyReason::WrongPort
                | DenyReason::WrongProtocol
                | DenyReason::PortNotExposed
        ),
    }
}

/// Admits the capability of an exec or file request before its body is read (the
/// handler then admits it again, from the verified-token cache, and counts it): a
/// request without a valid capability for a running execution here is answered — and
/// its connection closed — without a byte of its body being read.
pub(crate) async fn admitted_first(
    State(w): State<Arc<Worker>>,
    Path(id): Path<String>,
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let access = match *req.method() {
        // `POST …/files/mkdir` and `…/files/rename` write; `POST …/exec` runs.
        Method::POST if !req.uri().path().contains("/files/") => Access::Exec,
        // Reads take no body (one sent is never read): admitted by the handler alone.
        Method::GET => return next.run(req).await,
        _ => Access::FsWrite,
    };
    let allowed = SandboxRequest::parse(req.headers(), &id, access)
        .is_ok_and(|asked| matches!(asked.verdict(&w).0, Verdict::Allow));
    if allowed {
        // A paused (or snapshot-frozen) execution: wait for it here, before the body is
        // read, so that if it is retired meanwhile the 421 finds the body unread and
        // the caller can make its rebuilt attempt with it.
        let paused = id
            .parse::<SandboxId>()
            .ok()
            .and_then(|s| w.slot(&s))
            .filter(|s| s.record.state == RecordState::Paused);
        if let Some(slot) = paused {
            if let Err(r) = wait_unpaused(&w, slot).await {
                return r.closing();
            }
        }
        return next.run(req).await;
    }
    // Refused: the refusal (counted once) as `admit` words it; the body stays unread.
    match parse_and_admit(&w, req.headers(), &id, access) {
        Err(r) => r.closing(),
        // Allowed meanwhile (an install arrived): served.
        Ok(_) => next.run(req).await,
    }
}
