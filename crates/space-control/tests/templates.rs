//! Templates through the control plane: imported by an admin from an image archive
//! the test builds (a `docker save` archive with one gzip layer), listed, read and
//! removed; refused without an admin key (nothing spooled), past the import bound
//! (413), under a name another digest holds (409), while sandboxes use it (409
//! `template_in_use`); a create names one (400 for an unknown one), its record pins
//! the digest, it never claims a standby sandbox, and a worker that lacks the
//! template is sent it before the install is delivered again.
//!
//! The router is called with `tower::ServiceExt::oneshot` over a real SQLite store
//! and real API keys. The worker is a listener on loopback that takes signed updates
//! as a worker does, refuses an install whose template it does not hold with `409
//! template_missing…`, and takes a template at `/internal/v1/templates`, checking
//! the signed digest and size against the bundle it receives.

use std::collections::BTreeSet;
use std::io::{Read as _, Write as _};
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::body::{Body, Bytes};
use axum::http::{HeaderMap, Request, StatusCode, header};
use axum::response::IntoResponse as _;
use base64::Engine as _;
use space_control::api::{self, AppState};
use space_control::edge::{Authority, Edge};
use space_control::service::{ControlPlane, STANDBY_TENANT};
use space_identity::{Substrate, WorkerId};
use space_image::Digest;
use space_proto::api::{AckState, InstallExecution, SignedUpdate, Update, UpdateAck, UpdateBody};
use space_store::{WorkerRecord, WorkerState};
use tower::ServiceExt as _;

// ---- an image archive ---------------------------------------------------------------

/// A `docker save` archive (as Docker 25 writes it: blobs named by digest) of one
/// gzip layer holding `files`.
fn docker_save(files: &[(&str, &[u8])]) -> Vec<u8> {
    let mut layer = tar::Builder::new(Vec::new());
    for (path, data) in files {
        let mut h = tar::Header::new_ustar();
        h.set_size(data.len() as u64);
        h.set_mode(0o644);
        h.set_uid(0);
        h.set_gid(0);
        h.set_mtime(1_700_000_000);
        h.set_entry_type(tar::EntryType::Regular);
        layer.append_data(&mut h, path, *data).unwrap();
    }
    let layer = layer.into_inner().unwrap();
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    gz.write_all(&layer).unwrap();
    let blob = gz.finish().unwrap();
    let config = serde_json::to_vec(&serde_json::json!({
        "architecture": space_image::oci::host_architecture(),
        "os": "linux",
        "config": {"Env": ["PATH=/usr/bin:/bin", "LANG=C.UTF-8"], "WorkingDir": "/work", "User": "user", "Cmd": ["python3"]},
        "rootfs": {"type": "layers", "diff_ids": [Digest::of(&layer).to_string()]},
    }))
    .unwrap();
    let config_name = format!("blobs/sha256/{}", Digest::of(&config).hex());
    let blob_name = format!("blobs/sha256/{}", Digest::of(&blob).hex());
    let manifest = serde_json::to_vec(&serde_json::json!([{
        "Config": config_name, "RepoTags": ["test:latest"], "Layers": [blob_name],
    }]))
    .unwrap();
    let mut out = tar::Builder::new(Vec::new());
    for (name, data) in [
        (config_name.as_str(), &config[..]),
        (blob_name.as_str(), &blob[..]),
        ("manifest.json", &manifest[..]),
    ] {
        let mut h = tar::Header::new_ustar();
        h.set_size(data.len() as u64);
        h.set_mode(0o644);
        h.set_uid(0);
        h.set_gid(0);
        h.set_mtime(1_700_000_000);
        h.set_entry_type(tar::EntryType::Regular);
        out.append_data(&mut h, name, data).unwrap();
    }
    out.into_inner().unwrap()
}

fn python_image() -> Vec<u8> {
    docker_save(&[("usr/bin/python3", b"#!/bin/sh\necho python\n")])
}

fn other_image() -> Vec<u8> {
    docker_save(&[("etc/os-release", b"ID=other\n")])
}

// ---- the worker ---------------------------------------------------------------------

/// What the recording worker was sent, and the templates it holds.
#[derive(Default)]
struct Worker {
    updates: Mutex<Vec<Update>>,
    held: Mutex<BTreeSet<String>>,
    /// Every template received: (signed digest, signed size, bundle bytes).
    pushes: Mutex<Vec<(String, u64, Vec<u8>)>>,
}

impl Worker {
    fn installs(&self) -> Vec<InstallExecution> {
        let updates = self.updates.lock().unwrap();
        updates
            .iter()
            .filter_map(|u| match u {
                Update::Install(i) => Some(i.clone()),
                _ => None,
            })
            .collect()
    }
}

fn decode(signed: &SignedUpdate) -> UpdateBody {
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(&signed.body)
        .unwrap();
    serde_json::from_slice(&bytes).unwrap()
}

fn refuse(status: StatusCode, message: &str) -> axum::response::Response {
    let body = serde_json::json!({"error": "update_refused", "message": message});
    (status, axum::Json(body)).into_response()
}

async fn take_update(worker: Arc<Worker>, body: Bytes) -> axum::response::Response {
    let signed: SignedUpdate = serde_json::from_slice(&body).unwrap();
    let update = decode(&signed).update;
    worker.updates.lock().unwrap().push(update.clone());
    if let Update::Install(i) = &update {
        if let Some(digest) = space_control::service::pinned_digest(&i.template) {
            if !worker.held.lock().unwrap().contains(digest) {
                return refuse(
                    StatusCode::CONFLICT,
                    &format!("template_missing: this worker has no template {digest}"),
                );
            }
        }
    }
    axum::Json(UpdateAck {
        state: AckState::Running,
        message: None,
        bundle_version: 1,
        warm_ready: None,
    })
    .into_response()
}

/// Takes a template bundle as a worker's store would: the signed size is the body's,
/// the first member is the manifest whose sha256 is the signed digest, then one blob
/// per layer, each of the digest and size the manifest gives.
async fn take_template(
    worker: Arc<Worker>,
    headers: HeaderMap,
    body: Bytes,
) -> axum::response::Response {
    let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
    let header = headers.get("space-update").unwrap().to_str().unwrap();
    let signed: SignedUpdate = serde_json::from_slice(&b64.decode(header).unwrap()).unwrap();
    let Update::Template { digest, size } = decode(&signed).update else {
        return refuse(StatusCode::BAD_REQUEST, "not a template update");
    };
    if body.len() as u64 != size {
        return refuse(StatusCode::BAD_REQUEST, "the body is not the signed size");
    }
    let mut archive = tar::Archive::new(&body[..]);
    let mut manifest: Option<space_image::TemplateManifest> = None;
    for (i, entry) in archive.entries().unwrap().enumerate() {
        let mut entry = entry.unwrap();
        let name = entry.path().unwrap().display().to_string();
        let mut data = Vec::new();
        entry.read_to_end(&mut data).unwrap();
        match (i, &manifest) {
            (0, _) => {
                assert_eq!(name, "manifest.json");
                assert_eq!(
                    Digest::of(&data).to_string(),
                    digest,
                    "the manifest is not its digest"
                );
                manifest = Some(serde_json::from_slice(&data).unwrap());
            }
            (i, Some(m)) => {
                let l = &m.layers[i - 1];
                assert_eq!(name, format!("blobs/sha256/{}", l.digest.hex()));
                assert_eq!((Digest::of(&data), data.len() as u64), (l.digest, l.size));
            }
            _ => unreachable!(),
        }
    }
    worker.held.lock().unwrap().insert(digest.clone());
    worker
        .pushes
        .lock()
        .unwrap()
        .push((digest, size, body.to_vec()));
    axum::Json(serde_json::json!({})).into_response()
}

/// Serves the worker on loopback; returns its URL.
async fn serve_worker(worker: Arc<Worker>) -> String {
    let w = Arc::clone(&worker);
    let app = Router::new()
        .route(
            "/internal/v1/updates",
            axum::routing::post(move |body: Bytes| take_update(Arc::clone(&w), body)),
        )
        .route(
            "/internal/v1/templates",
            axum::routing::post(move |headers: HeaderMap, body: Bytes| {
                take_template(Arc::clone(&worker), headers, body)
            }),
        )
        .layer(axum::extract::DefaultBodyLimit::max(64 << 20));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(api::serve_until(listener, app, std::future::pending()));
    url
}

// ---- the control plane --------------------------------------------------------------

struct Plane {
    dir: tempfile::TempDir,
    cp: Arc<ControlPlane>,
    admin: String,
    key: String,
    worker: Arc<Worker>,
}

struct Answer {
    status: StatusCode,
    body: serde_json::Value,
}

impl Answer {
    fn code(&self) -> &str {
        self.body["error"].as_str().unwrap_or_default()
    }
    fn message(&self) -> &str {
        self.body["message"].as_str().unwrap_or_default()
    }
}

impl Plane {
    async fn start() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path().join("control.db").to_str().unwrap())
            .await
            .unwrap();
        let cp = ControlPlane::new(store, "enroll-secret".into(), dir.path().join("snapshots"))
            .await
            .unwrap();
        let (_, admin) = cp.create_tenant("admin", true).await.unwrap();
        let (_, key) = cp.create_tenant("tenant", false).await.unwrap();
        let worker = Arc::new(Worker::default());
        let url = serve_worker(Arc::clone(&worker)).await;
        let now = space_control::now_secs() as i64;
        let id: WorkerId = "w1".parse().unwrap();
        cp.store
            .upsert_worker(&WorkerRecord {
                id,
                url,
                substrate: Substrate::Jail,
                capacity: 10,
                state: WorkerState::Active,
                credential_hash: [0; 32],
                registered_at: now,
                last_seen: now,
            })
            .await
            .unwrap();
        Self {
            dir,
            cp,
            admin: admin.text,
            key: key.text,
            worker,
        }
    }

    async fn call(&self, key: &str, method: &str, path: &str, body: Vec<u8>) -> Answer {
        let req = Request::builder()
            .method(method)
            .uri(path)
            .header(header::AUTHORIZATION, format!("Bearer {key}"))
            .body(Body::from(body))
            .unwrap();
        let router = api::router(AppState {
            cp: Some(Arc::clone(&self.cp)),
            edge: Edge::new(Authority::Local(Arc::clone(&self.cp))),
        });
        let resp = router.oneshot(req).await.unwrap();
        let status = resp.status();
        let bytes = axum::body::to_bytes(resp.into_body(), 1 << 20)
            .await
            .unwrap();
        let body = if bytes.is_empty() {
            serde_json::Value::Null
        } else {
            serde_json::from_slice(&bytes).unwrap_or_else(|_| {
                panic!("{status}: not JSON: {}", String::from_utf8_lossy(&bytes))
            })
        };
        Answer { status, body }
    }

    async fn import(&self, name: &str, archive: Vec<u8>) -> Answer {
        self.call(
            &self.admin,
            "POST",
            &format!("/v1/templates?name={name}"),
            archive,
        )
        .await
    }

    async fn create(&self, body: &str) -> Answer {
        self.call(&self.key, "POST", "/v1/sandboxes", body.as_bytes().to_vec())
            .await
    }

    fn files(&self, sub: &str) -> usize {
        std::fs::read_dir(self.dir.path().join("templates").join(sub)).map_or(0, |d| d.count())
    }
}

use space_store::Store;

// ---- the tests ----------------------------------------------------------------------

#[tokio::test]
async fn an_admin_imports_an_archive_any_caller_lists_and_reads_it_and_the_admin_removes_it() {
    let p = Plane::start().await;
    let a = p.import("py:3.12", python_image()).await;
    assert_eq!(a.status, StatusCode::CREATED, "{}", a.body);
    let digest = a.body["digest"].as_str().unwrap().to_owned();
    assert!(digest.parse::<Digest>().is_ok(), "{digest}");
    assert_eq!(
        (a.body["name"].as_str(), a.body["tag"].as_str()),
        (Some("py"), Some("3.12"))
    );
    assert_eq!(a.body["layers"], 1);
    assert!(a.body["size"].as_u64().unwrap() > 0);
    assert_eq!(a.body["config"]["working_dir"], "/work");
    assert_eq!(a.body["config"]["user"], "user");
    assert_eq!(a.body["config"]["cmd"], serde_json::json!(["python3"]));
    assert_eq!(a.body["config"]["env"][1], "LANG=C.UTF-8");
    // The blob is kept by the control plane; the spool is gone.
    assert_eq!(p.files("blobs/sha256"), 1);
    assert_eq!(p.files("spool"), 0);

    let listed = p.call(&p.key, "GET", "/v1/templates", Vec::new()).await;
    assert_eq!(listed.status, StatusCode::OK, "{}", listed.body);
    assert_eq!(listed.body["templates"].as_array().unwrap().len(), 1);
    assert_eq!(listed.body["templates"][0]["digest"], digest.as_str());
    let read = p
        .call(&p.key, "GET", "/v1/templates/py:3.12", Vec::new())
        .await;
    assert_eq!(
        (read.status, read.body["digest"].as_str()),
        (StatusCode::OK, Some(digest.as_str()))
    );
    let missing = p.call(&p.key, "GET", "/v1/templates/py", Vec::new()).await;
    assert_eq!(missing.status, StatusCode::NOT_FOUND, "py is py:latest");

    // Only an admin removes it.
    let refused = p
        .call(&p.key, "DELETE", "/v1/templates/py:3.12", Vec::new())
        .await;
    assert_eq!(
        (refused.status, refused.code()),
        (StatusCode::FORBIDDEN, "forbidden")
    );
    let removed = p
        .call(&p.admin, "DELETE", "/v1/templates/py:3.12", Vec::new())
        .await;
    assert_eq!(removed.status, StatusCode::NO_CONTENT, "{}", removed.body);
    let gone = p
        .call(&p.key, "GET", "/v1/templates/py:3.12", Vec::new())
        .await;
    assert_eq!(gone.status, StatusCode::NOT_FOUND);
    assert_eq!(p.files("blobs/sha256"), 0, "an unreferenced blob was kept");
}

#[tokio::test]
async fn a_non_admin_import_is_forbidden_and_nothing_is_spooled() {
    let p = Plane::start().await;
    let a = p
        .call(&p.key, "POST", "/v1/templates?name=py", python_image())
        .await;
    assert_eq!(
        (a.status, a.code()),
        (StatusCode::FORBIDDEN, "forbidden"),
        "{}",
        a.body
    );
    assert_eq!(p.files("spool"), 0);
    assert_eq!(p.files("blobs/sha256"), 0);
    assert!(p.cp.store.list_templates().await.unwrap().is_empty());
    let unauthenticated = p
        .call(
            "space_ak_nope",
            "POST",
            "/v1/templates?name=py",
            python_image(),
        )
        .await;
    assert_eq!(unauthenticated.status, StatusCode::UNAUTHORIZED);
}

#[tokio::test]
async fn an_archive_over_the_bound_is_413_and_leaves_nothing_behind() {
    let p = Plane::start().await;
    let image = python_image();
    p.cp.set_max_template_bytes(image.len() as u64 - 1);
    let a = p.import("py", image.clone()).await;
    assert_eq!(
        (a.status, a.code()),
        (StatusCode::PAYLOAD_TOO_LARGE, "too_large"),
        "{}",
        a.body
    );
    assert_eq!(p.files("spool"), 0);
    assert!(p.cp.store.list_templates().await.unwrap().is_empty());
    // Announced past the bound: refused before the body is read.
    let req = Request::post("/v1/templates?name=py")
        .header(header::AUTHORIZATION, format!("Bearer {}", p.admin))
        .header(header::CONTENT_LENGTH, (image.len()).to_string())
        .body(Body::from(image.clone()))
        .unwrap();
    let router = api::router(AppState {
        cp: Some(Arc::clone(&p.cp)),
        edge: Edge::new(Authority::Local(Arc::clone(&p.cp))),
    });
    assert_eq!(
        router.oneshot(req).await.unwrap().status(),
        StatusCode::PAYLOAD_TOO_LARGE
    );
    // At the bound it goes in.
    p.cp.set_max_template_bytes(image.len() as u64);
    assert_eq!(p.import("py", image).await.status, StatusCode::CREATED);
}

#[tokio::test]
async fn a_name_another_digest_holds_is_409_and_the_same_image_again_is_the_same_template() {
    let p = Plane::start().await;
    let first = p.import("py", python_image()).await;
    assert_eq!(first.status, StatusCode::CREATED, "{}", first.body);
    let again = p.import("py:latest", python_image()).await;
    assert_eq!(again.status, StatusCode::CREATED, "{}", again.body);
    assert_eq!(
        again.body, first.body,
        "the same image is the same template"
    );
    let other = p.import("py", other_image()).await;
    assert_eq!(
        (other.status, other.code()),
        (StatusCode::CONFLICT, "conflict"),
        "{}",
        other.body
    );
    assert!(
        other
            .message()
            .contains(first.body["digest"].as_str().unwrap()),
        "{}",
        other.message()
    );
    // Under another name it is a template of its own.
    assert_eq!(
        p.import("other", other_image()).await.status,
        StatusCode::CREATED
    );
    assert_eq!(p.files("blobs/sha256"), 2);
}

#[tokio::test]
async fn a_bad_archive_or_name_is_400_with_the_reason() {
    let p = Plane::start().await;
    let a = p.import("py", b"not an archive at all".to_vec()).await;
    assert_eq!(
        (a.status, a.code()),
        (StatusCode::BAD_REQUEST, "bad_request"),
        "{}",
        a.body
    );
    assert!(a.message().contains("image"), "{}", a.message());
    let bad_name = p.import("Py/../x", python_image()).await;
    assert_eq!(
        bad_name.status,
        StatusCode::BAD_REQUEST,
        "{}",
        bad_name.body
    );
    assert!(
        bad_name.message().contains("invalid template reference"),
        "{}",
        bad_name.message()
    );
    let no_name = p
        .call(&p.admin, "POST", "/v1/templates", python_image())
        .await;
    assert_eq!(no_name.status, StatusCode::BAD_REQUEST, "{}", no_name.body);
    assert!(p.cp.store.list_templates().await.unwrap().is_empty());
    assert_eq!(p.files("spool"), 0);
}

#[tokio::test]
async fn a_create_with_an_unknown_template_is_400() {
    let p = Plane::start().await;
    let a = p.create(r#"{"template":"ubuntu-22.04"}"#).await;
    assert_eq!(
        (a.status, a.code()),
        (StatusCode::BAD_REQUEST, "bad_request"),
        "{}",
        a.body
    );
    assert_eq!(a.message(), r#"unknown template "ubuntu-22.04""#);
    assert!(p.worker.installs().is_empty());
}

#[tokio::test]
async fn a_worker_that_lacks_the_template_is_sent_it_then_the_install_again() {
    let p = Plane::start().await;
    let digest = p.import("py", python_image()).await.body["digest"]
        .as_str()
        .unwrap()
        .to_owned();
    let a = p.create(r#"{"template":"py"}"#).await;
    assert_eq!(a.status, StatusCode::CREATED, "{}", a.body);
    let pinned = format!("py:latest@{digest}");
    assert_eq!(a.body["template"], pinned.as_str());
    // Refused once for the missing template, then installed.
    let installs = p.worker.installs();
    assert_eq!(installs.len(), 2, "{installs:?}");
    assert!(installs.iter().all(|i| i.template == pinned));
    assert_eq!(
        installs[0].execution_id, installs[1].execution_id,
        "the same execution"
    );
    let pushes = p.worker.pushes.lock().unwrap().clone();
    assert_eq!(pushes.len(), 1);
    assert_eq!(pushes[0].0, digest);
    assert_eq!(pushes[0].1, pushes[0].2.len() as u64);
    assert!(
        p.cp.metrics
            .encode()
            .contains(r#"space_control_template_pushes_total{result="ok"} 1"#)
    );
    // A second sandbox on the worker that holds it now: no push.
    assert_eq!(
        p.create(r#"{"template":"py:latest"}"#).await.status,
        StatusCode::CREATED
    );
    assert_eq!(p.worker.pushes.lock().unwrap().len(), 1);
    assert_eq!(p.worker.installs().len(), 3);
    assert_eq!(p.files("spool"), 0, "the bundle's spool was kept");
}

#[tokio::test]
async fn a_sandbox_keeps_its_pinned_digest_when_the_name_is_bound_again_and_an_in_use_template_stays()
 {
    let p = Plane::start().await;
    let digest = p.import("py", python_image()).await.body["digest"]
        .as_str()
        .unwrap()
        .to_owned();
    let a = p.create(r#"{"template":"py"}"#).await;
    assert_eq!(a.status, StatusCode::CREATED, "{}", a.body);
    let id: space_identity::SandboxId = a.body["id"].as_str().unwrap().parse().unwrap();
    let pinned = format!("py:latest@{digest}");
    assert_eq!(p.cp.store.get_sandbox(&id).await.unwrap().template, pinned);

    // In use, and no other name keeps the digest: refused.
    let in_use = p
        .call(&p.admin, "DELETE", "/v1/templates/py", Vec::new())
        .await;
    assert_eq!(
        (in_use.status, in_use.code()),
        (StatusCode::CONFLICT, "template_in_use"),
        "{}",
        in_use.body
    );
    assert!(
        in_use.message().contains("1 live sandboxes"),
        "{}",
        in_use.message()
    );

    // Another name keeps the digest: the name goes, and is bound to another image.
    assert_eq!(
        p.import("python", python_image()).await.status,
        StatusCode::CREATED
    );
    let removed = p
        .call(&p.admin, "DELETE", "/v1/templates/py", Vec::new())
        .await;
    assert_eq!(removed.status, StatusCode::NO_CONTENT, "{}", removed.body);
    let rebound = p.import("py", other_image()).await;
    assert_eq!(rebound.status, StatusCode::CREATED, "{}", rebound.body);
    assert_ne!(rebound.body["digest"], digest.as_str());
    let view = p
        .call(&p.key, "GET", &format!("/v1/sandboxes/{id}"), Vec::new())
        .await;
    assert_eq!(
        view.body["template"],
        pinned.as_str(),
        "a rebinding changed a sandbox"
    );
    assert_eq!(p.cp.store.get_sandbox(&id).await.unwrap().template, pinned);

    // Stopped, it no longer holds the last name of its digest.
    let deleted = p
        .call(&p.key, "DELETE", &format!("/v1/sandboxes/{id}"), Vec::new())
        .await;
    assert_eq!(deleted.status, StatusCode::NO_CONTENT, "{}", deleted.body);
    let last = p
        .call(&p.admin, "DELETE", "/v1/templates/python", Vec::new())
        .await;
    assert_eq!(last.status, StatusCode::NO_CONTENT, "{}", last.body);
    // Only the rebound image's blob is left.
    assert_eq!(p.files("blobs/sha256"), 1);
}

#[tokio::test]
async fn a_create_from_a_template_without_a_standby_pool_never_claims_a_standby_sandbox() {
    let p = Plane::start().await;
    p.import("py", python_image()).await;
    p.cp.set_standby_target(1);
    assert!(p.cp.keep_standby_now().await.unwrap() > 0);
    let standby = p.cp.store.list_sandboxes(STANDBY_TENANT).await.unwrap();
    assert_eq!(standby.len(), 1);
    let a = p.create(r#"{"template":"py"}"#).await;
    assert_eq!(a.status, StatusCode::CREATED, "{}", a.body);
    assert_ne!(a.body["id"], standby[0].id.to_string().as_str());
    assert_eq!(
        p.cp.store
            .list_sandboxes(STANDBY_TENANT)
            .await
            .unwrap()
            .len(),
        1,
        "the standby sandbox was claimed"
    );
    // A default create does claim it.
    let plain = p.create("{}").await;
    assert_eq!(plain.body["id"], standby[0].id.to_string().as_str());
}

#[tokio::test]
async fn a_template_with_a_standby_pool_is_claimed_from_its_own_pool_only() {
    let p = Plane::start().await;
    p.import("py", python_image()).await;
    // Only the image's pool: the default template keeps none.
    p.cp.set_standby_target(0);
    p.cp.set_standby_templates(vec![
        space_control::service::TemplatePool::parse("py=2").unwrap(),
    ]);
    assert_eq!(p.cp.keep_standby_now().await.unwrap(), 2);
    let standby = p.cp.store.list_sandboxes(STANDBY_TENANT).await.unwrap();
    assert_eq!(standby.len(), 2);
    assert!(
        standby
            .iter()
            .all(|s| s.template.starts_with("py:latest@sha256:")),
        "{standby:?}"
    );
    // Full: the next step starts nothing.
    assert_eq!(p.cp.keep_standby_now().await.unwrap(), 0);
    // A default create claims none of them; a create of the image does.
    let plain = p.create("{}").await;
    assert_eq!(plain.status, StatusCode::CREATED, "{}", plain.body);
    assert!(
        standby
            .iter()
            .all(|s| plain.body["id"] != s.id.to_string().as_str())
    );
    let a = p.create(r#"{"template":"py"}"#).await;
    assert_eq!(a.status, StatusCode::CREATED, "{}", a.body);
    assert!(
        standby
            .iter()
            .any(|s| a.body["id"] == s.id.to_string().as_str()),
        "{}",
        a.body
    );
    assert_eq!(
        p.cp.store
            .list_sandboxes(STANDBY_TENANT)
            .await
            .unwrap()
            .len(),
        1
    );
    // And the keeper refills the pool it was claimed from.
    assert_eq!(p.cp.keep_standby_now().await.unwrap(), 1);
}

#[tokio::test]
async fn the_default_pool_follows_the_default_template() {
    let p = Plane::start().await;
    p.import("py", python_image()).await;
    p.cp.set_default_template("py");
    p.cp.set_standby_target(1);
    assert_eq!(p.cp.keep_standby_now().await.unwrap(), 1);
    let standby = p.cp.store.list_sandboxes(STANDBY_TENANT).await.unwrap();
    assert_eq!(standby.len(), 1);
    assert!(
        standby[0].template.starts_with("py:latest@sha256:"),
        "{standby:?}"
    );
    // A create without a template gets the default one, and claims from its pool.
    let a = p.create("{}").await;
    assert_eq!(a.status, StatusCode::CREATED, "{}", a.body);
    assert_eq!(a.body["id"], standby[0].id.to_string().as_str());
}

#[tokio::test]
async fn the_sdk_imports_an_archive_file_and_a_layout_directory_lists_reads_and_removes_them() {
    let p = Plane::start().await;
    let router = api::router(AppState {
        cp: Some(Arc::clone(&p.cp)),
        edge: Edge::new(Authority::Local(Arc::clone(&p.cp))),
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(api::serve_until(listener, router, std::future::pending()));
    let admin = space_client::Client::new(&url, &p.admin);

    let file = p.dir.path().join("python.tar");
    std::fs::write(&file, python_image()).unwrap();
    let from_file = admin.import_template("py", &file).await.unwrap();
    // The same archive unpacked into a directory: packed again as it is sent, the
    // same image.
    let dir = p.dir.path().join("other-layout");
    tar::Archive::new(&other_image()[..]).unpack(&dir).unwrap();
    let from_dir = admin.import_template("other:1", &dir).await.unwrap();
    assert_ne!(from_file.digest, from_dir.digest);
    let user = space_client::Client::new(&url, &p.key);
    let listed = user.templates().await.unwrap();
    let names: Vec<String> = listed
        .templates
        .iter()
        .map(|t| format!("{}:{}", t.name, t.tag))
        .collect();
    assert_eq!(names, ["other:1", "py:latest"]);
    assert_eq!(user.template("other:1").await.unwrap(), from_dir);
    let refused = user.import_template("x", &file).await.unwrap_err();
    assert_eq!(refused.code(), Some("forbidden"));
    admin.remove_template("other:1").await.unwrap();
    assert_eq!(
        user.template("other:1").await.unwrap_err().code(),
        Some("not_found")
    );
}

#[tokio::test]
async fn a_layer_that_unpacks_past_the_bound_is_413_naming_the_bound_and_nothing_is_kept() {
    let p = Plane::start().await;
    // 8 MiB of zeros: a few KiB of gzip, far below the archive's bound.
    let zeros = vec![0u8; 8 << 20];
    let image = docker_save(&[("zeros", &zeros[..])]);
    assert!(image.len() < 1 << 20, "{} bytes", image.len());
    let roomy = p.cp.limits_policy();
    p.cp.set_limits_policy(space_control::limits::LimitsPolicy {
        templates: space_image::ImageLimits {
            max_layer_bytes: 1 << 20,
            max_image_bytes: 4 << 20,
        },
        ..roomy
    });
    let a = p.import("bomb", image.clone()).await;
    assert_eq!(
        (a.status, a.code()),
        (StatusCode::PAYLOAD_TOO_LARGE, "too_large"),
        "{}",
        a.body
    );
    assert!(
        a.message().contains("SPACE_TEMPLATE_MAX_LAYER_BYTES") && a.message().contains("1048576"),
        "{}",
        a.message()
    );
    assert_eq!((p.files("blobs/sha256"), p.files("spool")), (0, 0));
    assert_eq!(p.files("blobs/tmp"), 0, "a spooled blob was left");
    assert!(p.cp.store.list_templates().await.unwrap().is_empty());
    // Under bounds that hold it, the same archive imports.
    p.cp.set_limits_policy(roomy);
    assert_eq!(p.import("bomb", image).await.status, StatusCode::CREATED);
}

#[tokio::test]
async fn a_workers_sync_names_the_templates_kept_here_and_not_a_removed_one() {
    let p = Plane::start().await;
    let digest = |a: Answer| {
        assert_eq!(a.status, StatusCode::CREATED, "{}", a.body);
        a.body["digest"].as_str().unwrap().to_owned()
    };
    let py = digest(p.import("py:3.12", python_image()).await);
    let other = digest(p.import("other", other_image()).await);
    let w = p.cp.store.get_worker(&"w1".parse().unwrap()).await.unwrap();
    let kept = |list: Vec<SignedUpdate>| -> Vec<Vec<String>> {
        list.iter()
            .filter_map(|s| match decode(s).update {
                Update::Templates { keep } => Some(keep),
                _ => None,
            })
            .collect()
    };
    let mut both = vec![py.clone(), other];
    both.sort();
    assert_eq!(kept(p.cp.sync_for(&w).await.unwrap()), [both]);
    let removed = p
        .call(&p.admin, "DELETE", "/v1/templates/other", Vec::new())
        .await;
    assert_eq!(removed.status, StatusCode::NO_CONTENT, "{}", removed.body);
    assert_eq!(kept(p.cp.sync_for(&w).await.unwrap()), [vec![py]]);
}
