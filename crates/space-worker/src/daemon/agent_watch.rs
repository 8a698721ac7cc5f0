//! A dead agent is noticed at once: each running execution's agent is watched through
//! a pidfd (readable when the process exits) registered with the runtime — no thread
//! and no polling per sandbox, one descriptor and one small task each.
//!
//! When the agent (or its jail: the agent is in the jail's PID namespace and dies with
//! its init) exits while its record still says the execution runs — no retirement,
//! replacement or shutdown by the platform — the execution is marked failed durably,
//! what is left of it is torn down keeping the writable layer, and the control plane
//! is told it is lost: it starts a new execution of the sandbox (the next generation,
//! on this worker, from the kept files) or marks the sandbox stopped if it cannot.

use std::os::fd::OwnedFd;
use std::sync::Arc;
use std::time::Duration;

use space_identity::{Execution, SandboxId};
use tokio::io::Interest;
use tokio::io::unix::AsyncFd;

use super::launch;
use super::records::{ExecutionRecord, RecordState};
use super::state::{Worker, now_secs};

/// Watches the agent of `record` (a running execution) until it exits.
pub fn watch_agent(worker: &Arc<Worker>, record: &ExecutionRecord) {
    let Some(agent) = record.handle.as_ref().and_then(|h| h.agent) else {
        return;
    };
    let (sandbox, execution) = (record.sandbox, record.execution());
    let pidfd = open_pidfd(agent.pid, agent.start_time);
    let me = Arc::downgrade(worker);
    tokio::spawn(async move {
        if let Some(fd) = pidfd {
            let Ok(fd) = register(fd) else {
                return;
            };
            // Readable once the process has exited; it never becomes unreadable.
            let _ = fd.readable().await;
        }
        let Some(worker) = me.upgrade() else {
            return;
        };
        agent_exited(&worker, sandbox, execution).await;
    });
}

/// Registers a pidfd with the runtime, readable on exit.
// `with_interest` is deprecated because a type could change the descriptor it reports
// while registered; `OwnedFd` owns its descriptor until dropped, so it is sound here,
// and it keeps this crate free of `unsafe` (as `agent_socket::register`).
#[allow(deprecated)]
fn register(fd: OwnedFd) -> std::io::Result<AsyncFd<OwnedFd>> {
    AsyncFd::with_interest(fd, Interest::READABLE)
}

/// A pidfd for `pid` if it is still the process that started at `start_time` (opened
/// first, checked after, so it names that process); `None` if it is gone.
fn open_pidfd(pid: i32, start_time: u64) -> Option<OwnedFd> {
    let p = rustix::process::Pid::from_raw(pid)?;
    let fd = rustix::process::pidfd_open(p, rustix::process::PidfdFlags::NONBLOCK).ok()?;
    launch::still_alive_pid(pid, start_time).then_some(fd)
}

async fn agent_exited(worker: &Arc<Worker>, sandbox: SandboxId, execution: Execution) {
    if worker.is_stopping() {
        return;
    }
    let failed = {
        let _turn = worker.lock_sandbox(&sandbox).await;
        // Whatever the platform did to this execution meanwhile (retired, replaced,
        // failed) changed its record first: then this exit is expected.
        let Some(slot) = worker.slot(&sandbox) else {
            return;
        };
        let r = &slot.record;
        if r.execution() != execution
            || !matches!(r.state, RecordState::Running | RecordState::Paused)
            || worker.is_stopping()
        {
            return;
        }
        tracing::warn!(sandbox = %sandbox, generation = execution.generation.get(), "the agent died; the execution is lost");
        let mut failed = r.clone();
        failed.state = RecordState::Failed;
        failed.updated_at = now_secs() as i64;
        if let Err(e) = worker.records.put(&failed) {
            tracing::error!(sandbox = %sandbox, error = %e, "cannot record a lost execution");
            return;
        }
        if let Some(pool) = &slot.pool {
            pool.clear();
        }
        // Ends every stream of the execution; the comparator now answers 421.
        worker.put_slot(failed.clone(), None);
        worker.metrics.retired();
        worker.teardown(r, launch::Layer::Keep).await;
        failed
    };
    report_lost(worker, &failed).await;
}

/// Tells the control plane, a few times if it cannot be reached or is busy with the
/// sandbox; a report that never arrives is made again by the next restart's
/// reconciliation (the record says failed).
async fn report_lost(worker: &Arc<Worker>, r: &ExecutionRecord) {
    let Some(credential) = worker
        .records
        .setting("credential")
        .ok()
        .flatten()
        .and_then(|c| String::from_utf8(c).ok())
    else {
        return;
    };
    let url = format!(
        "{}/internal/v1/workers/{}/lost",
        worker.control_url.trim_end_matches('/'),
        worker.id
    );
    let auth = format!("Bearer {credential}");
    let body = serde_json::json!({"sandbox": r.sandbox, "generation": r.generation});
    let http = space_http::HttpClient::new(Duration::from_secs(60));
    let mut delay = Duration::from_millis(200);
    for _ in 0..8 {
        match http
            .post_json(&url, &[("authorization", &auth)], &body)
            .await
        {
            Ok(a) if a.status.is_success() => return,
            // Refused for good (not this worker's execution, say): nothing to retry.
            Ok(a) if a.status.is_client_error() && a.status.as_u16() != 409 => {
                tracing::warn!(sandbox = %r.sandbox, status = %a.status, "lost execution report refused");
                return;
            }
            Ok(a) => {
                tracing::warn!(sandbox = %r.sandbox, status = %a.status, "lost execution report failed; retrying");
            }
            Err(e) => {
                tracing::warn!(sandbox = %r.sandbox, error = %e, "lost execution report failed; retrying");
            }
        }
        if worker.is_stopping() {
            return;
        }
        tokio::time::sleep(delay).await;
        delay = (delay * 2).min(Duration::from_secs(5));
    }
}
