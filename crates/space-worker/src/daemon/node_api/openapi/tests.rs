//! The worker API's document: served at `GET /v1/openapi.json` without a credential
//! by the real router of a real worker (records in a temporary directory, never
//! enrolled: the document needs nothing), the same bytes as the one built from the
//! route table, naming every route `docs/api.md` lists for workers, and checked in as
//! `docs/openapi/worker.json` (`SPACE_BLESS=1` rewrites it).

use std::sync::Arc;

use axum::body::Body;
use axum::http::{Request, StatusCode, header};
use tower::ServiceExt as _;

use crate::daemon::node_api::{document_json, router};
use crate::daemon::state::Worker;

/// A worker on records of its own; no jail, bridge or agent is ever started.
fn worker(data: &tempfile::TempDir) -> Arc<Worker> {
    super::super::tests::bare_worker(data, "openapi")
}

#[tokio::test]
async fn a_worker_serves_its_document_without_a_credential() {
    let data = tempfile::tempdir().unwrap();
    let req = Request::get("/v1/openapi.json")
        .body(Body::empty())
        .unwrap();
    let resp = router(worker(&data)).oneshot(req).await.unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    assert_eq!(
        resp.headers().get(header::CONTENT_TYPE).unwrap(),
        "application/json"
    );
    let body = axum::body::to_bytes(resp.into_body(), usize::MAX)
        .await
        .unwrap();
    assert_eq!(String::from_utf8(body.to_vec()).unwrap(), document_json());
}

#[test]
fn every_route_docs_api_md_lists_for_workers_is_in_the_document() {
    let doc: serde_json::Value = serde_json::from_str(&document_json()).unwrap();
    let has = |method: &str, path: &str| doc["paths"][path][method].is_object();
    // docs/api.md section 3 (direct mode) and the worker's rows of section 4.
    let listed = [
        ("post", "/v1/sandboxes/{id}/exec"),
        ("get", "/v1/sandboxes/{id}/files"),
        ("put", "/v1/sandboxes/{id}/files"),
        ("delete", "/v1/sandboxes/{id}/files"),
        ("get", "/v1/sandboxes/{id}/files/list"),
        ("get", "/v1/sandboxes/{id}/files/stat"),
        ("post", "/v1/sandboxes/{id}/files/mkdir"),
        ("post", "/v1/sandboxes/{id}/files/rename"),
        ("get", "/v1/sandboxes/{id}/files/tar"),
        ("put", "/v1/sandboxes/{id}/files/tar"),
        ("get", "/v1/sandboxes/{id}/events"),
        ("get", "/v1/sandboxes/{id}/terminal"),
        ("get", "/v1/sandboxes/{id}/watch"),
        ("get", "/v1/sandboxes/{id}/exec/stream"),
        ("post", "/v1/sandboxes/{id}/netgtw"),
        ("get", "/healthz"),
        ("get", "/readyz"),
        ("get", "/metrics"),
        ("get", "/v1/openapi.json"),
        ("post", "/internal/v1/updates"),
        ("post", "/internal/v1/snapshot"),
        ("post", "/internal/v1/layers"),
        ("post", "/internal/v1/templates"),
    ];
    for (method, path) in listed {
        assert!(has(method, path), "{method} {path} is not in the document");
    }
    // And nothing else: a new worker route is added to the list above and to
    // docs/api.md.
    for (path, item) in doc["paths"].as_object().unwrap() {
        for method in item.as_object().unwrap().keys() {
            assert!(
                listed.contains(&(method.as_str(), path.as_str())),
                "{method} {path} is served but not listed (nor in docs/api.md)"
            );
        }
    }
    let api_md = include_str!("../../../../../../docs/api.md");
    for path in [
        "/internal/v1/updates",
        "/internal/v1/snapshot",
        "/internal/v1/layers",
        "/internal/v1/templates",
    ] {
        assert!(api_md.contains(&format!("`POST {path}`")), "{path}");
    }
}

#[test]
fn every_internal_route_is_marked_internal_and_every_sandbox_route_needs_a_capability() {
    let doc: serde_json::Value = serde_json::from_str(&document_json()).unwrap();
    for (path, item) in doc["paths"].as_object().unwrap() {
        for (method, op) in item.as_object().unwrap() {
            if path.starts_with("/internal/") {
                assert_eq!(op["x-internal"], true, "{method} {path}");
                assert_eq!(op["tags"][0], "internal", "{method} {path}");
            }
            if path.starts_with("/v1/sandboxes/") {
                assert_eq!(
                    op["security"],
                    serde_json::json!([{"capability": []}]),
                    "{method} {path}"
                );
                assert!(op["responses"]["421"].is_object(), "{method} {path}");
            }
        }
    }
}

#[test]
fn every_reference_in_the_document_resolves() {
    fn refs(v: &serde_json::Value, out: &mut Vec<String>) {
        match v {
            serde_json::Value::Object(m) => {
                for (k, v) in m {
                    match (k.as_str(), v) {
                        ("$ref", serde_json::Value::String(r)) => out.push(r.clone()),
                        _ => refs(v, out),
                    }
                }
            }
            serde_json::Value::Array(a) => a.iter().for_each(|v| refs(v, out)),
            _ => {}
        }
    }
    let doc: serde_json::Value = serde_json::from_str(&document_json()).unwrap();
    let mut found = Vec::new();
    refs(&doc, &mut found);
    assert!(found.iter().any(|r| r.ends_with("/SandboxId")));
    for r in found {
        let pointer = r.strip_prefix('#').expect("a local reference");
        assert!(doc.pointer(pointer).is_some(), "{r} does not resolve");
    }
}

#[test]
fn the_checked_in_worker_document_is_the_generated_one() {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../docs/openapi/worker.json"
    );
    let generated = document_json();
    if std::env::var_os("SPACE_BLESS").is_some_and(|v| v == "1") {
        std::fs::write(path, &generated).unwrap();
        return;
    }
    let checked_in = std::fs::read_to_string(path).unwrap_or_default();
    assert!(
        checked_in == generated,
        "docs/openapi/worker.json is not the document the code generates; run \
         `SPACE_BLESS=1 cargo test -p space-worker --lib openapi` and commit it"
    );
}
