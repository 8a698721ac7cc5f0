//! E2B's code interpreter for sandboxes made from its template (`code-interpreter-v1`,
//! the `e2b-code-interpreter` SDK's default): the SDK's `run_code` and contexts talk to
//! port 49999 of the sandbox, which the front's catch-all port record routes like any
//! other (`E2b-Sandbox-Port`). What answers there is SPACE's own service
//! (`code_interpreter.py`: stateful Python contexts, each a process of its own, output
//! streamed as the SDK parses it), started inside the sandbox — with the sandbox's
//! rights and no others — when the front creates the sandbox and again on every
//! `connect` (a resume on another worker is a new execution whose processes are new; a
//! second start finds the port taken and does nothing).
//!
//! Such a sandbox runs on the default template; the template it was asked for is kept
//! in its metadata under [`TEMPLATE_KEY`], which E2B's answers show as its
//! `templateID` and never among its metadata.

use axum::body::Bytes;
use axum::http::Method;
use serde_json::{Value, json};
use space_control::auth::Caller;
use space_identity::OperationClass;
use space_proto::api::Sandbox;

use crate::front::{Envd, Front, acting_for};

/// The templates that carry the code interpreter.
pub const TEMPLATES: [&str; 2] = ["code-interpreter-v1", "code-interpreter"];

/// The port the SDK reaches it on.
pub const PORT: u16 = 49999;

/// The metadata key (reserved: a create naming it is refused) holding the E2B
/// template a sandbox was made from, where that is not a SPACE template.
pub const TEMPLATE_KEY: &str = "space.e2b.template";

/// The service, run by `python3` inside the sandbox.
const SOURCE: &str = include_str!("code_interpreter.py");

/// Whether E2B's `templateID` asks for the code interpreter.
pub fn wanted(template_id: Option<&str>) -> bool {
    template_id.is_some_and(|t| TEMPLATES.contains(&t.trim()))
}

/// The E2B template `view` was made from, if it is kept in its metadata.
pub fn template_of(view: &Sandbox) -> Option<&str> {
    view.metadata.get(TEMPLATE_KEY).and_then(Value::as_str)
}

/// Starts the service in `view`'s current execution unless it is serving already;
/// returns once it listens. The sandbox needs `python3`.
pub async fn ensure(front: &Front, caller: &Caller, view: &Sandbox) -> Result<(), String> {
    let execution = view
        .execution
        .as_ref()
        .map(|e| e.execution_id)
        .ok_or("the sandbox is not running")?;
    let ctx = Envd {
        who: acting_for(caller.clone()),
        sandbox: view.id,
        execution,
        user: None,
    };
    // The service binds before it detaches, so the port listens when this returns.
    let exec = json!({
        "cmd": ["python3", "-c", SOURCE],
        "timeout_secs": 30,
    });
    let answer = front
        .operate(
            &ctx,
            Method::POST,
            "exec",
            Some("application/json"),
            Bytes::from(exec.to_string()),
            OperationClass::Mutation {
                idempotency_key: false,
            },
        )
        .await
        .map_err(|e| format!("the code interpreter did not start: {}", e.message))?;
    let v: Value = serde_json::from_slice(&answer.body).unwrap_or_default();
    if v["exit_code"] == 0 {
        Ok(())
    } else {
        Err(format!(
            "the code interpreter did not start (the template needs python3): exit {} {}",
            v["exit_code"],
            v["stderr"].as_str().unwrap_or_default().trim()
        ))
    }
}
