//! `POST …/exec`: a command run to its end, its stdin (of up to 64 MiB) written in
//! frames while its output is collected, its answer the exit and the capped output.

use std::sync::Arc;
use std::time::Instant;

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use space_identity::Access;
use space_proto::api::{
    DEFAULT_MAX_OUTPUT_BYTES, ExecRequest, ExecResponse, MAX_EXEC_BODY, MAX_EXEC_STDIN,
    MAX_OUTPUT_BYTES,
};
use space_proto::client::Call;
use space_proto::guest::{ExecSpec, ExitOutcome, MAX_CHUNK};

use super::admission::parse_and_admit;
use super::agent::{exec_collect, with_conn, with_execution};
use super::idempotency::{IdempotencyCache, once};
use super::refusal::{Refusal, Stale};
use crate::daemon::state::{Slot, Worker};

/// Default exec timeout when the request names none.
const DEFAULT_EXEC_TIMEOUT_SECS: u64 = space_proto::api::DEFAULT_EXEC_TIMEOUT_SECS;

#[utoipa::path(post, path = "/v1/sandboxes/{id}/exec", tag = "sandbox", summary = "Run a command and collect its output (200 whatever its exit code); accepts `Idempotency-Key`.", params(space_proto::openapi::SandboxPath), request_body = space_proto::api::ExecRequest, responses((status = 200, description = "the command ran", body = space_proto::api::ExecResponse, headers(("space-execution" = String, description = "the execution that answered"))), super::openapi::Exec), security(("capability" = [])))]
pub(crate) async fn exec(
    State(w): State<Arc<Worker>>,
    State(idempotency): State<IdempotencyCache>,
    Path(id): Path<String>,
    headers: HeaderMap,
    body: Result<Bytes, axum::extract::rejection::BytesRejection>,
) -> Response {
    let start = Instant::now();
    match run(&w, &idempotency, &id, &headers, body).await {
        Ok(resp) => {
            w.metrics.observe("exec", start.elapsed());
            resp
        }
        // Refused before it ran: not an operation's latency.
        Err(r) => r.into_response(),
    }
}

async fn run(
    w: &Worker,
    idempotency: &IdempotencyCache,
    id: &str,
    headers: &HeaderMap,
    body: Result<Bytes, axum::extract::rejection::BytesRejection>,
) -> Result<Response, Refusal> {
    let admitted = parse_and_admit(w, headers, id, Access::Exec)?;
    let body = match body {
        Ok(b) => b,
        Err(e) if e.status() == StatusCode::PAYLOAD_TOO_LARGE => return Err(exec_too_large()),
        Err(e) => return Err(Refusal::BadRequest(format!("exec body: {e}"))),
    };
    let admitted = admitted.unpaused(w).await?;
    let mut req: ExecRequest = serde_json::from_slice(&body)
        .map_err(|e| Refusal::BadRequest(format!("invalid exec body: {e}")))?;
    drop(body);
    let stdin = exec_stdin(&mut req)?;
    if req.cmd.is_empty() {
        return Err(Refusal::BadRequest("cmd must not be empty".into()));
    }
    if req.pty.is_some() {
        return Err(Refusal::BadRequest(
            "pty is only for the streaming exec".into(),
        ));
    }
    let max_output_bytes = req.max_output_bytes.unwrap_or(DEFAULT_MAX_OUTPUT_BYTES);
    if max_output_bytes > MAX_OUTPUT_BYTES {
        return Err(Refusal::BadRequest(format!(
            "max_output_bytes must be at most {MAX_OUTPUT_BYTES} ({} MiB); use the \
             streaming exec (/exec/stream) for more output",
            MAX_OUTPUT_BYTES >> 20
        )));
    }
    let sandbox = admitted.sandbox();
    let slot = admitted.into_slot();
    let spec = ExecSpec {
        argv: req.cmd,
        // The sandbox's environment, overridden by the request's.
        env: slot
            .record
            .env
            .clone()
            .into_iter()
            .chain(req.env.unwrap_or_default())
            .collect::<std::collections::BTreeMap<_, _>>()
            .into_iter()
            .collect(),
        cwd: slot.record.defaults.cwd_or(req.cwd),
        // Stdin that fits in the request frame goes with it; more follows as input.
        stdin: (stdin.len() <= MAX_CHUNK).then(Vec::new),
        timeout_ms: Some(
            req.timeout_secs
                .unwrap_or(DEFAULT_EXEC_TIMEOUT_SECS)
                .saturating_mul(1000),
        ),
        pty: None,
        max_output_bytes: Some(max_output_bytes),
        user: slot.record.defaults.user_or(req.user),
    };
    let execution_id = slot.record.execution_id;
    let resp = once(idempotency, sandbox, headers, move || async move {
        // The memory cgroup's OOM-kill count, before and after: a rise means the
        // kernel killed a process of the sandbox for its limit while this ran.
        let cgroups = slot.record.handle.as_ref().map(|h| h.cgroups.clone());
        let oom_before = cgroups.as_ref().and_then(|c| c.oom_kills());
        let ran = match spec.stdin {
            Some(_) => {
                let mut spec = spec;
                spec.stdin = Some(stdin);
                with_conn(&slot, Call::exec(spec)).await
            }
            None => exec_with_stdin(&slot, spec, stdin).await,
        };
        match ran {
            Ok(out) => {
                let oom_killed = matches!(
                    (oom_before, cgroups.as_ref().and_then(|c| c.oom_kills())),
                    (Some(before), Some(after)) if after > before
                );
                let memory_limit_mib = cgroups
                    .as_ref()
                    .filter(|_| oom_killed)
                    .and_then(|c| c.memory_limit())
                    .map(|b| b >> 20);
                let (exit_code, signal) = match out.status.outcome {
                    ExitOutcome::Code(c) => (c, None),
                    ExitOutcome::Signal(s) => (128 + s, Some(s)),
                };
                let (stdout_truncated, stderr_truncated) =
                    (out.status.stdout_truncated, out.status.stderr_truncated);
                // The caps hold each stream's JSON to `max_output_bytes`, so the answer
                // is at most about twice that, held once (valid UTF-8 is not copied).
                with_execution(
                    exec_json(&ExecResponse {
                        exit_code,
                        signal,
                        timed_out: out.status.timed_out,
                        oom_killed,
                        memory_limit_mib,
                        truncated: stdout_truncated || stderr_truncated,
                        stdout_truncated,
                        stderr_truncated,
                        stdout: lossy(out.stdout),
                        stderr: lossy(out.stderr),
                        execution_id,
                    }),
                    &slot,
                )
            }
            Err(r) => r.into_response(),
        }
    })
    .await;
    Ok(resp)
}

/// 413 for an exec request over [`MAX_EXEC_BODY`] or with stdin over
/// [`MAX_EXEC_STDIN`].
fn exec_too_large() -> Refusal {
    Refusal::TooLarge(format!(
        "exec stdin is limited to {} MiB (the request to {} MiB); use the streaming \
         exec (/exec/stream, `space exec --stream`) for more",
        MAX_EXEC_STDIN >> 20,
        MAX_EXEC_BODY >> 20
    ))
}

/// The stdin bytes of an exec request (taken out of it): its text or its decoded
/// base64, at most [`MAX_EXEC_STDIN`].
pub(crate) fn exec_stdin(req: &mut ExecRequest) -> Result<Vec<u8>, Refusal> {
    use base64::Engine as _;
    let stdin = match (req.stdin.take(), req.stdin_base64.take()) {
        (Some(_), Some(_)) => {
            return Err(Refusal::BadRequest(
                "give stdin or stdin_base64, not both".into(),
            ));
        }
        (Some(text), None) => text.into_bytes(),
        (None, Some(b64)) => {
            // Decoded size known before decoding: no buffer for an oversized stdin.
            if b64.len() / 4 * 3 > MAX_EXEC_STDIN + 2 {
                return Err(exec_too_large());
            }
            base64::engine::general_purpose::STANDARD
                .decode(b64.as_bytes())
                .map_err(|e| {
                    Refusal::BadRequest(format!("stdin_base64 is not standard base64: {e}"))
                })?
        }
        (None, None) => Vec::new(),
    };
    if stdin.len() > MAX_EXEC_STDIN {
        return Err(exec_too_large());
    }
    Ok(stdin)
}

/// [`exec_collect`] (stdin larger than a frame), with the same answer as
/// [`with_conn`] when the execution is retired meanwhile.
async fn exec_with_stdin(
    slot: &Arc<Slot>,
    spec: ExecSpec,
    stdin: Vec<u8>,
) -> Result<space_proto::client::ExecOutput, Refusal> {
    let lease = slot.lease();
    match exec_collect(slot, spec, stdin).await {
        Err(r) if r.status() == StatusCode::BAD_GATEWAY && *lease.borrow() => {
            Err(Refusal::RefreshRoute(Stale::RetiredDuringOperation))
        }
        other => other,
    }
}

/// The JSON answer of an exec, written into a buffer of its exact size: no growth by
/// doubling (a copy and up to twice the size) for a large answer.
fn exec_json(answer: &ExecResponse) -> Response {
    let size = space_proto::guest::json_str_len(&answer.stdout)
        + space_proto::guest::json_str_len(&answer.stderr)
        + 1024;
    let mut body = Vec::with_capacity(size);
    match serde_json::to_writer(&mut body, answer) {
        Ok(()) => ([(header::CONTENT_TYPE, "application/json")], body).into_response(),
        Err(e) => Refusal::Internal(format!("exec answer: {e}")).into_response(),
    }
}

/// Text of `bytes`, invalid UTF-8 replaced; without a copy when it is valid.
fn lossy(bytes: Vec<u8>) -> String {
    String::from_utf8(bytes).unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned())
}
