//! The two OpenAPI documents agree where the API is the same: every sandbox-scoped
//! operation of the worker (direct mode) is served by the edge at the same path and
//! method with the same parameters, and every operation the edge forwards is one the
//! worker serves — the edge passes queries through untouched, so a parameter one
//! side names and the other does not is a bug in one of them (the edge's only own
//! parameter is the terminal's `reattach`).

use std::collections::BTreeSet;

use serde_json::Value;

fn edge() -> Value {
    serde_json::from_str(&space_control::api::document_json()).unwrap()
}

fn worker() -> Value {
    serde_json::from_str(&space_worker::daemon::node_api::document_json()).unwrap()
}

/// `(method, path)` of every operation under `/v1/sandboxes/{id}/` whose tag is `tag`.
fn sandbox_operations(doc: &Value, tag: &str) -> BTreeSet<(String, String)> {
    let mut out = BTreeSet::new();
    for (path, item) in doc["paths"].as_object().unwrap() {
        if !path.starts_with("/v1/sandboxes/{id}/") {
            continue;
        }
        for (method, op) in item.as_object().unwrap() {
            if op["tags"][0] == tag {
                out.insert((method.clone(), path.clone()));
            }
        }
    }
    out
}

/// `(name, in, required)` of an operation's parameters.
fn parameters(doc: &Value, method: &str, path: &str) -> BTreeSet<(String, String, bool)> {
    doc["paths"][path][method]["parameters"]
        .as_array()
        .map(|ps| {
            ps.iter()
                .map(|p| {
                    (
                        p["name"].as_str().unwrap().to_owned(),
                        p["in"].as_str().unwrap().to_owned(),
                        p["required"].as_bool().unwrap_or(false),
                    )
                })
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn the_edge_forwards_exactly_the_sandbox_operations_a_worker_serves() {
    let forwarded = sandbox_operations(&edge(), "operations");
    let direct = sandbox_operations(&worker(), "sandbox");
    assert!(direct.len() >= 8, "{direct:?}");
    assert_eq!(forwarded, direct);
}

#[test]
fn the_edge_and_a_worker_take_the_same_parameters_for_each_sandbox_operation() {
    let (edge, worker) = (edge(), worker());
    for (method, path) in sandbox_operations(&worker, "sandbox") {
        let mut at_edge = parameters(&edge, &method, &path);
        if path.ends_with("/terminal") {
            assert!(at_edge.remove(&("reattach".into(), "query".into(), false)));
        }
        assert_eq!(
            at_edge,
            parameters(&worker, &method, &path),
            "{method} {path}"
        );
    }
}

#[test]
fn the_edge_and_a_worker_describe_the_shared_bodies_alike() {
    let (edge, worker) = (edge(), worker());
    for name in [
        "ErrorBody",
        "ExecRequest",
        "ExecResponse",
        "FileEntry",
        "FileInfo",
        "MkdirResponse",
        "RenameRequest",
        "SandboxId",
        "TerminalSize",
    ] {
        let e = &edge["components"]["schemas"][name];
        assert!(e.is_object(), "{name}");
        assert_eq!(e, &worker["components"]["schemas"][name], "{name}");
    }
}
