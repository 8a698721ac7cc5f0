//! The edge API's OpenAPI document: served at `GET /v1/openapi.json` without a
//! credential (by the control plane's router and by a standalone edge's), the same
//! bytes as the document built from the route table, naming every route `docs/api.md`
//! documents, and checked in as `docs/openapi/edge.json` (`SPACE_BLESS=1` rewrites it).

use std::sync::Arc;

use axum::body::Body;
use axum::http::{Request, StatusCode, header};
use space_control::api::{self, AppState};
use space_control::edge::{Authority, Edge};
use space_control::service::ControlPlane;
use space_store::Store;
use tower::ServiceExt as _;

/// The control plane's router on a fresh store (no key is created: the document
/// needs none).
async fn control_router(dir: &tempfile::TempDir) -> axum::Router {
    let store = Store::open(dir.path().join("control.db").to_str().unwrap())
        .await
        .unwrap();
    let cp = ControlPlane::new(store, "enroll-secret".into(), dir.path().join("snapshots"))
        .await
        .unwrap();
    api::router(AppState {
        cp: Some(Arc::clone(&cp)),
        edge: Edge::new(Authority::Local(cp)),
    })
}

async fn served(router: axum::Router) -> (StatusCode, Option<String>, String) {
    let req = Request::get("/v1/openapi.json")
        .body(Body::empty())
        .unwrap();
    let resp = router.oneshot(req).await.unwrap();
    let status = resp.status();
    let ct = resp
        .headers()
        .get(header::CONTENT_TYPE)
        .map(|v| v.to_str().unwrap().to_owned());
    let body = axum::body::to_bytes(resp.into_body(), usize::MAX)
        .await
        .unwrap();
    (status, ct, String::from_utf8(body.to_vec()).unwrap())
}

#[tokio::test]
async fn the_control_plane_serves_its_document_without_a_key() {
    let dir = tempfile::tempdir().unwrap();
    let (status, ct, body) = served(control_router(&dir).await).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(ct.as_deref(), Some("application/json"));
    assert_eq!(body, api::document_json());
}

#[tokio::test]
async fn a_standalone_edge_serves_the_same_document_without_a_key() {
    // Its control plane is never asked: the port is closed.
    let router = api::edge_router(api::edge_only("http://127.0.0.1:9".into()));
    let (status, _, body) = served(router).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body, api::document_json());
}

#[tokio::test]
async fn another_v1_path_still_needs_a_key() {
    let dir = tempfile::tempdir().unwrap();
    let req = Request::get("/v1/openapi.yaml")
        .body(Body::empty())
        .unwrap();
    let resp = control_router(&dir).await.oneshot(req).await.unwrap();
    assert_eq!(resp.status(), StatusCode::UNAUTHORIZED);
}

/// `(method, path)` of every operation in the document.
fn operations(doc: &serde_json::Value) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for (path, item) in doc["paths"].as_object().unwrap() {
        for method in item.as_object().unwrap().keys() {
            out.push((method.to_uppercase(), path.clone()));
        }
    }
    out
}

#[test]
fn every_route_docs_api_md_lists_is_in_the_document_with_its_method() {
    let doc: serde_json::Value = serde_json::from_str(&api::document_json()).unwrap();
    let ops = operations(&doc);
    let api_md = include_str!("../../../docs/api.md");
    // Table rows and headings name routes as `METHOD /path…`.
    let mut seen = 0;
    for line in api_md.lines() {
        for word in ["GET", "POST", "PUT", "DELETE", "PATCH"] {
            let needle = format!("`{word} /");
            let Some(at) = line.find(&needle) else {
                continue;
            };
            let rest = &line[at + needle.len() - 1..];
            let path: String = rest
                .chars()
                .take_while(|c| !matches!(c, '`' | '?' | ' '))
                .collect();
            // Worker-only routes and what `docs/api.md` lists as not implemented.
            let worker_only = path.starts_with("/internal/v1/updates")
                || path.starts_with("/internal/v1/snapshot")
                || path.starts_with("/internal/v1/layers")
                || path.ends_with("/netgtw");
            let not_built = ["/v1/templates"].iter().any(|p| path.contains(p));
            // E2B's paths: the E2B front's (crate space-e2b, docs/api.md §6), not this
            // document's.
            let e2b = [
                "/sandboxes",
                "/v2/",
                "/files",
                "/health",
                "/process.",
                "/filesystem.",
            ]
            .iter()
            .any(|p| path.starts_with(p));
            if worker_only || not_built || e2b {
                continue;
            }
            let path = path.replace("{key_id}", "{id}");
            assert!(
                ops.contains(&(word.to_owned(), path.clone())),
                "docs/api.md names `{word} {path}`, which the document lacks"
            );
            seen += 1;
        }
    }
    assert!(seen >= 25, "only {seen} routes read from docs/api.md");
}

#[test]
fn every_reference_in_the_document_resolves() {
    let doc: serde_json::Value = serde_json::from_str(&api::document_json()).unwrap();
    let mut refs = Vec::new();
    collect_refs(&doc, &mut refs);
    assert!(!refs.is_empty());
    for r in refs {
        let pointer = r.strip_prefix('#').expect("a local reference");
        assert!(doc.pointer(pointer).is_some(), "{r} does not resolve");
    }
}

fn collect_refs(v: &serde_json::Value, out: &mut Vec<String>) {
    match v {
        serde_json::Value::Object(m) => {
            for (k, v) in m {
                match (k.as_str(), v) {
                    ("$ref", serde_json::Value::String(r)) => out.push(r.clone()),
                    _ => collect_refs(v, out),
                }
            }
        }
        serde_json::Value::Array(a) => a.iter().for_each(|v| collect_refs(v, out)),
        _ => {}
    }
}

#[test]
fn the_checked_in_edge_document_is_the_generated_one() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/openapi/edge.json");
    let generated = api::document_json();
    if std::env::var_os("SPACE_BLESS").is_some_and(|v| v == "1") {
        std::fs::write(path, &generated).unwrap();
        return;
    }
    let checked_in = std::fs::read_to_string(path).unwrap_or_default();
    assert!(
        checked_in == generated,
        "docs/openapi/edge.json is not the document the code generates; run \
         `SPACE_BLESS=1 cargo test -p space-control --test openapi` and commit it"
    );
}

/// `docs/api.md` is written from the document: every route the edge serves is named
/// there as `METHOD /path` (a path parameter may be spelled as its meaning, e.g.
/// `{key_id}` for `{id}`).
#[test]
fn every_route_of_the_document_is_named_in_docs_api_md() {
    let doc: serde_json::Value = serde_json::from_str(&api::document_json()).unwrap();
    let api_md = include_str!("../../../docs/api.md").replace("{key_id}", "{id}");
    let mut missing = Vec::new();
    for (method, path) in operations(&doc) {
        let named = [format!("`{method} {path}`"), format!("`{method} {path}?")]
            .iter()
            .any(|n| api_md.contains(n.as_str()));
        if !named {
            missing.push(format!("{method} {path}"));
        }
    }
    assert!(
        missing.is_empty(),
        "docs/api.md does not name: {missing:#?}"
    );
}
