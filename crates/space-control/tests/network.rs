//! A sandbox's network policy through the control plane: chosen at create (or the
//! control plane's default), stored, shown, installed with every execution, and
//! replaced with `PATCH /v1/sandboxes/{id}/network`, which pushes it to the worker.
//!
//! The router is called with `tower::ServiceExt::oneshot` over a real SQLite store
//! and real API keys. The worker is a listener on loopback that takes the signed
//! updates the control plane delivers, keeps them for the test to read, and
//! acknowledges them as a worker does (or refuses network updates, when told to).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::body::{Body, Bytes};
use axum::http::{Request, StatusCode, header};
use axum::response::IntoResponse as _;
use base64::Engine as _;
use space_control::api::{self, AppState};
use space_control::edge::{Authority, Edge};
use space_control::service::ControlPlane;
use space_identity::{Generation, SandboxId, Substrate, WorkerId};
use space_proto::api::{
    AckState, InstallExecution, NetworkMode, Policy, SignedUpdate, Update, UpdateAck, UpdateBody,
};
use space_store::{SandboxRecord, SandboxState, Store, WorkerRecord, WorkerState};
use tower::ServiceExt as _;

/// What the recording worker was sent, and whether it refuses network updates.
#[derive(Default)]
struct Worker {
    updates: Mutex<Vec<Update>>,
    refuse_network: AtomicBool,
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

    /// Every network update: `(sandbox, generation, execution, policy)`.
    fn network_updates(&self) -> Vec<(SandboxId, Generation, String, Policy)> {
        let updates = self.updates.lock().unwrap();
        updates
            .iter()
            .filter_map(|u| match u {
                Update::Network {
                    sandbox,
                    generation,
                    execution_id,
                    network,
                } => Some((
                    *sandbox,
                    *generation,
                    execution_id.to_string(),
                    network.clone(),
                )),
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

/// Serves `/internal/v1/updates` on loopback for `worker`; returns its URL.
async fn serve_worker(worker: Arc<Worker>) -> String {
    let app = Router::new().route(
        "/internal/v1/updates",
        axum::routing::post(move |body: Bytes| {
            let worker = Arc::clone(&worker);
            async move {
                let signed: SignedUpdate = serde_json::from_slice(&body).unwrap();
                let update = decode(&signed).update;
                let refused = matches!(update, Update::Network { .. })
                    && worker.refuse_network.load(Ordering::SeqCst);
                worker.updates.lock().unwrap().push(update);
                if refused {
                    return (
                        StatusCode::SERVICE_UNAVAILABLE,
                        axum::Json(serde_json::json!({"error": "busy", "message": "not now"})),
                    )
                        .into_response();
                }
                let ack = UpdateAck {
                    state: AckState::Running,
                    message: None,
                    bundle_version: 1,
                    warm_ready: None,
                };
                axum::Json(ack).into_response()
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(api::serve_until(listener, app, std::future::pending()));
    url
}

/// A control plane on a fresh store with a tenant's key and one active worker, the
/// recording one.
struct Plane {
    _dir: tempfile::TempDir,
    cp: Arc<ControlPlane>,
    tenant: String,
    key: String,
    worker: Arc<Worker>,
    worker_id: WorkerId,
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
        let (tenant, key) = cp.create_tenant("tenant", false).await.unwrap();
        let worker = Arc::new(Worker::default());
        let url = serve_worker(Arc::clone(&worker)).await;
        let now = space_control::now_secs() as i64;
        let worker_id: WorkerId = "w1".parse().unwrap();
        cp.store
            .upsert_worker(&WorkerRecord {
                id: worker_id.clone(),
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
            _dir: dir,
            cp,
            tenant: tenant.id,
            key: key.text,
            worker,
            worker_id,
        }
    }

    fn router(&self) -> Router {
        api::router(AppState {
            cp: Some(Arc::clone(&self.cp)),
            edge: Edge::new(Authority::Local(Arc::clone(&self.cp))),
        })
    }

    async fn call(&self, method: &str, path: &str, body: impl Into<Body>) -> Answer {
        let req = Request::builder()
            .method(method)
            .uri(path)
            .header(header::CONTENT_TYPE, "application/json")
            .header(header::AUTHORIZATION, format!("Bearer {}", self.key))
            .body(body.into())
            .unwrap();
        let resp = self.router().oneshot(req).await.unwrap();
        let status = resp.status();
        let bytes = axum::body::to_bytes(resp.into_body(), 1 << 20)
            .await
            .unwrap();
        let body = match bytes.is_empty() {
            true => serde_json::Value::Null,
            false => serde_json::from_slice(&bytes).unwrap_or_else(|_| {
                panic!("{status}: not JSON: {}", String::from_utf8_lossy(&bytes))
            }),
        };
        Answer { status, body }
    }

    /// Creates a sandbox with `body`; its ID (the create must succeed).
    async fn create(&self, body: &str) -> (SandboxId, serde_json::Value) {
        let a = self.call("POST", "/v1/sandboxes", body.to_owned()).await;
        assert_eq!(a.status, StatusCode::CREATED, "{}", a.body);
        (a.body["id"].as_str().unwrap().parse().unwrap(), a.body)
    }

    async fn patch(&self, id: &SandboxId, body: &str) -> Answer {
        self.call(
            "PATCH",
            &format!("/v1/sandboxes/{id}/network"),
            body.to_owned(),
        )
        .await
    }

    async fn get(&self, id: &SandboxId) -> serde_json::Value {
        let a = self
            .call("GET", &format!("/v1/sandboxes/{id}"), Body::empty())
            .await;
        assert_eq!(a.status, StatusCode::OK, "{}", a.body);
        a.body
    }
}

struct Answer {
    status: StatusCode,
    body: serde_json::Value,
}

impl Answer {
    fn error(&self) -> (&str, &str) {
        (
            self.body["error"].as_str().unwrap_or_default(),
            self.body["message"].as_str().unwrap_or_default(),
        )
    }
}

fn policy(json: serde_json::Value) -> Policy {
    serde_json::from_value(json).unwrap()
}

const EGRESS: &str = r#"{"mode":"egress","allow":["PyPI.org","*.githubusercontent.com","203.0.113.0/24"],"deny":["10.0.0.0/8"]}"#;

#[tokio::test]
async fn a_create_without_network_gets_no_network_stored_shown_and_installed() {
    let p = Plane::start().await;
    let (id, view) = p.create("{}").await;
    let none = serde_json::json!({"mode": "none", "allow": [], "deny": []});
    assert_eq!(view["network"], none);
    assert_eq!(p.get(&id).await["network"], none);
    assert_eq!(
        p.cp.store.get_sandbox(&id).await.unwrap().network,
        Policy::none()
    );
    let installs = p.worker.installs();
    assert_eq!(installs.len(), 1);
    assert_eq!(installs[0].network, Policy::none());
}

#[tokio::test]
async fn a_create_with_a_policy_stores_it_shows_it_and_installs_it() {
    let p = Plane::start().await;
    let (id, view) = p.create(&format!(r#"{{"network":{EGRESS}}}"#)).await;
    let want = serde_json::json!({
        "mode": "egress",
        "allow": ["pypi.org", "*.githubusercontent.com", "203.0.113.0/24"],
        "deny": ["10.0.0.0/8"],
    });
    // As the API shows it: rules in their canonical form.
    assert_eq!(view["network"], want);
    assert_eq!(p.get(&id).await["network"], want);
    let installs = p.worker.installs();
    assert_eq!(installs.len(), 1);
    assert_eq!(installs[0].sandbox, id);
    assert_eq!(installs[0].network, policy(want));
}

#[tokio::test]
async fn a_create_without_network_takes_the_control_planes_default_mode() {
    let p = Plane::start().await;
    p.cp.set_default_network(NetworkMode::Egress);
    let (id, view) = p.create("{}").await;
    let egress = serde_json::json!({"mode": "egress", "allow": [], "deny": []});
    assert_eq!(view["network"], egress);
    assert_eq!(p.worker.installs()[0].network, policy(egress.clone()));
    // A policy given beats the default.
    let (other, _) = p.create(r#"{"network":{"mode":"none"}}"#).await;
    assert_eq!(p.get(&other).await["network"]["mode"], "none");
    // The default changes creates from then on only.
    p.cp.set_default_network(NetworkMode::None);
    assert_eq!(p.get(&id).await["network"], egress);
}

#[tokio::test]
async fn a_bad_policy_is_refused_with_400_naming_the_list_the_index_and_the_rule() {
    let p = Plane::start().await;
    let cases = [
        (
            r#"{"network":{"mode":"egress","allow":["pypi.org","bad_name!"]}}"#,
            r#"invalid network policy: allow[1] "bad_name!": not a name: character '_' is not a letter, digit or hyphen"#,
        ),
        (
            r#"{"network":{"mode":"egress","deny":["300.1.2.3"]}}"#,
            r#"invalid network policy: deny[0] "300.1.2.3""#,
        ),
        (
            r#"{"network":{"mode":"wifi"}}"#,
            "invalid network policy: unknown variant `wifi`",
        ),
        (
            r#"{"network":{"mode":"egress","allowed":[]}}"#,
            "invalid network policy: unknown field `allowed`",
        ),
    ];
    for (body, message) in cases {
        let a = p.call("POST", "/v1/sandboxes", body.to_owned()).await;
        assert_eq!(a.status, StatusCode::BAD_REQUEST, "{body}: {}", a.body);
        let (code, got) = a.error();
        assert_eq!(code, "bad_request", "{body}");
        assert!(got.starts_with(message), "{body}: {got}");
    }
    // Nothing was created or installed.
    assert!(
        p.cp.store
            .list_sandboxes(&p.tenant)
            .await
            .unwrap()
            .is_empty()
    );
    assert!(p.worker.installs().is_empty());

    // The same policy errors on a PATCH, which keeps the policy stored.
    let (id, _) = p.create("{}").await;
    let a = p
        .patch(&id, r#"{"mode":"egress","allow":["pypi.org","bad_name!"]}"#)
        .await;
    assert_eq!(a.status, StatusCode::BAD_REQUEST);
    assert!(
        a.error()
            .1
            .starts_with(r#"invalid network policy: allow[1] "bad_name!": not a name"#),
        "{}",
        a.body
    );
    assert_eq!(p.get(&id).await["network"]["mode"], "none");
    assert!(p.worker.network_updates().is_empty());
}

#[tokio::test]
async fn patching_the_network_stores_it_and_pushes_it_to_the_current_execution() {
    let p = Plane::start().await;
    let (id, created) = p.create("{}").await;
    let a = p.patch(&id, EGRESS).await;
    assert_eq!(a.status, StatusCode::OK, "{}", a.body);
    let want = policy(a.body["network"].clone());
    assert_eq!(want, policy(serde_json::from_str(EGRESS).unwrap()));
    assert_eq!(a.body["id"], id.to_string());
    assert_eq!(a.body["state"], "running");
    // Told to the worker of the execution that runs, for that execution.
    let pushed = p.worker.network_updates();
    assert_eq!(pushed.len(), 1, "{pushed:?}");
    let (sandbox, generation, execution, network) = &pushed[0];
    assert_eq!(*sandbox, id);
    assert_eq!(
        generation.get(),
        created["execution"]["generation"].as_u64().unwrap()
    );
    assert_eq!(
        execution,
        created["execution"]["execution_id"].as_str().unwrap()
    );
    assert_eq!(*network, want);
    assert_eq!(policy(p.get(&id).await["network"].clone()), want);

    // Back to none: pushed too.
    let a = p.patch(&id, r#"{"mode":"none"}"#).await;
    assert_eq!(a.status, StatusCode::OK);
    assert_eq!(p.worker.network_updates()[1].3, Policy::none());
}

#[tokio::test]
async fn a_policy_the_worker_does_not_take_is_502_stored_and_in_the_next_install() {
    let p = Plane::start().await;
    let (id, _) = p.create("{}").await;
    p.worker.refuse_network.store(true, Ordering::SeqCst);
    let a = p.patch(&id, EGRESS).await;
    assert_eq!(a.status, StatusCode::BAD_GATEWAY, "{}", a.body);
    let (code, message) = a.error();
    assert_eq!(code, "bad_gateway");
    assert!(
        message.starts_with("the network policy is stored, but worker w1 did not take it")
            && message.contains("keeps its previous policy until it is told"),
        "{message}"
    );
    let want = policy(serde_json::from_str(EGRESS).unwrap());
    assert_eq!(policy(p.get(&id).await["network"].clone()), want);

    // The worker restarts and syncs: the install it gets carries the stored policy.
    let w = p.cp.store.get_worker(&p.worker_id).await.unwrap();
    let synced: Vec<Update> =
        p.cp.sync_for(&w)
            .await
            .unwrap()
            .iter()
            .map(|s| decode(s).update)
            .collect();
    let install = synced
        .iter()
        .find_map(|u| match u {
            Update::Install(i) if i.sandbox == id => Some(i),
            _ => None,
        })
        .expect("an install of the sandbox");
    assert_eq!(install.network, want);

    // The execution is lost: the next one starts with the stored policy.
    let generation = install.generation;
    p.cp.execution_lost(&w, &id, generation).await.unwrap();
    let installs = p.worker.installs();
    let last = installs.last().unwrap();
    assert_eq!(last.generation, Generation(generation.get() + 1));
    assert_eq!(last.network, want);
}

#[tokio::test]
async fn a_patch_of_a_stopped_sandbox_is_409_and_of_another_tenants_is_404() {
    let p = Plane::start().await;
    let (id, _) = p.create("{}").await;
    let a = p
        .call("DELETE", &format!("/v1/sandboxes/{id}"), Body::empty())
        .await;
    assert_eq!(a.status, StatusCode::NO_CONTENT, "{}", a.body);
    let a = p.patch(&id, EGRESS).await;
    assert_eq!(a.status, StatusCode::CONFLICT);
    assert_eq!(a.error(), ("conflict", "the sandbox is stopped"));
    assert_eq!(
        p.cp.store.get_sandbox(&id).await.unwrap().network,
        Policy::none()
    );

    let (other, _) = p.cp.create_tenant("other", false).await.unwrap();
    let theirs = SandboxId::from_bytes([9; 16]);
    p.cp.store
        .create_sandbox(&SandboxRecord {
            id: theirs,
            tenant: other.id,
            template: "default".into(),
            state: SandboxState::Running,
            created_at: 1,
            expires_at: None,
            metadata: serde_json::json!({}),
            env: Default::default(),
            generation: Generation(0),
            limits: None,
            network: Policy::none(),
        })
        .await
        .unwrap();
    let a = p.patch(&theirs, EGRESS).await;
    assert_eq!(a.status, StatusCode::NOT_FOUND);
    assert_eq!(a.error(), ("not_found", "sandbox not found"));
    assert!(p.worker.network_updates().is_empty());
}

#[tokio::test]
async fn a_patch_body_over_its_limit_is_refused_with_413() {
    let p = Plane::start().await;
    let (id, _) = p.create("{}").await;
    let huge = format!(
        r#"{{"mode":"egress","allow":["{}"]}}"#,
        "a".repeat(space_control::api::MAX_NETWORK_BODY)
    );
    let a = p.patch(&id, &huge).await;
    assert_eq!(a.status, StatusCode::PAYLOAD_TOO_LARGE);
    assert_eq!(
        a.error(),
        ("too_large", "a network policy body is at most 256 KiB")
    );
    assert_eq!(p.get(&id).await["network"]["mode"], "none");
}

#[tokio::test]
async fn a_standby_sandbox_started_under_another_default_is_handed_over_with_the_current_one() {
    let p = Plane::start().await;
    p.cp.set_standby_egress_target(1);
    assert!(p.cp.keep_standby_now().await.unwrap() > 0);
    let standby = p.cp.store.list_sandboxes("_standby").await.unwrap();
    // With its link, holding it for a claim: nothing is allowed out.
    assert_eq!(standby.len(), 1);
    assert_eq!(
        standby[0].network,
        space_control::service::held_link_policy()
    );
    // The operator restarts with egress as the default.
    p.cp.set_default_network(NetworkMode::Egress);
    let (id, view) = p.create("{}").await;
    assert_eq!(id, standby[0].id, "the standby sandbox was claimed");
    let egress = serde_json::json!({"mode": "egress", "allow": [], "deny": []});
    assert_eq!(view["network"], egress);
    let pushed = p.worker.network_updates();
    assert_eq!(pushed.len(), 1);
    assert_eq!((pushed[0].0, &pushed[0].3), (id, &policy(egress)));
}

#[tokio::test]
async fn the_sdk_creates_with_a_policy_and_replaces_it_through_the_edge() {
    let p = Plane::start().await;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(api::serve_until(
        listener,
        p.router(),
        std::future::pending(),
    ));
    let client = space_client::Client::new(&url, &p.key);

    let allow = Policy::parse(NetworkMode::Egress, &["pypi.org"], &["10.0.0.0/8"]).unwrap();
    let req = space_client::CreateSandbox {
        network: Some(allow.clone()),
        ..Default::default()
    };
    let created = client.create_sandbox(&req).await.unwrap();
    assert_eq!(created.network, allow);
    assert_eq!(p.worker.installs()[0].network, allow);

    let changed = client
        .set_network(&created.id, &Policy::none())
        .await
        .unwrap();
    assert_eq!(changed.network, Policy::none());
    assert_eq!(
        client.sandbox(&created.id).await.unwrap().network,
        Policy::none()
    );
    assert_eq!(p.worker.network_updates()[0].3, Policy::none());

    let err = client
        .set_network(&SandboxId::from_bytes([7; 16]), &allow)
        .await
        .unwrap_err();
    assert_eq!(err.code(), Some("not_found"));
}

#[tokio::test]
async fn a_create_with_its_own_policy_claims_a_standby_sandbox_answered_once_the_worker_took_it() {
    let p = Plane::start().await;
    // One standby sandbox without a link, one with.
    p.cp.set_standby_target(1);
    p.cp.set_standby_egress_target(1);
    assert_eq!(p.cp.keep_standby_now().await.unwrap(), 2);
    let standby = p.cp.store.list_sandboxes("_standby").await.unwrap();
    let held = space_control::service::held_link_policy();
    let linked = standby.iter().find(|s| s.network == held).unwrap().id;
    let bare = standby
        .iter()
        .find(|s| s.network == Policy::none())
        .unwrap()
        .id;
    let (id, view) = p.create(&format!(r#"{{"network":{EGRESS}}}"#)).await;
    assert_eq!(id, linked, "the standby sandbox with a link was claimed");
    let want = policy(serde_json::from_str(EGRESS).unwrap());
    assert_eq!(policy(view["network"].clone()), want);
    // Before the answer, the worker was told (and acknowledged) the policy of the
    // execution the standby sandbox runs; no other install was made.
    let pushed = p.worker.network_updates();
    assert_eq!(pushed.len(), 1);
    let execution = p.cp.store.current_execution(&id).await.unwrap().unwrap();
    assert_eq!(
        (pushed[0].0, pushed[0].1, pushed[0].2.clone(), &pushed[0].3),
        (
            id,
            execution.generation,
            execution.execution_id.to_string(),
            &want
        )
    );
    assert_eq!(p.worker.installs().len(), 2);
    assert_eq!(p.cp.store.get_sandbox(&id).await.unwrap().network, want);
    // A create in mode none takes the one without a link, and nothing is pushed.
    let (id, view) = p.create("{}").await;
    assert_eq!(id, bare, "the standby sandbox without a link was claimed");
    assert_eq!(view["network"]["mode"], "none");
    assert_eq!(p.worker.network_updates().len(), 1);
    // None of either kind is left: the next of each kind starts its own.
    let (id, _) = p.create(&format!(r#"{{"network":{EGRESS}}}"#)).await;
    assert!(id != linked && id != bare);
    assert_eq!(p.worker.installs().len(), 3);
}

#[tokio::test]
async fn a_claimed_standby_sandbox_whose_worker_refuses_the_policy_is_deleted_and_the_create_fails()
{
    let p = Plane::start().await;
    p.cp.set_standby_egress_target(1);
    assert!(p.cp.keep_standby_now().await.unwrap() > 0);
    let standby = p.cp.store.list_sandboxes("_standby").await.unwrap()[0].id;
    p.worker.refuse_network.store(true, Ordering::SeqCst);
    let a = p
        .call(
            "POST",
            "/v1/sandboxes",
            format!(r#"{{"network":{EGRESS}}}"#),
        )
        .await;
    assert_eq!(a.status, StatusCode::BAD_GATEWAY, "{}", a.body);
    assert_eq!(
        a.error(),
        (
            "bad_gateway",
            "no sandbox was created: the worker of the standby sandbox claimed for it did \
             not take its network policy; send the create again"
        )
    );
    // Never handed over with another policy: stopped, and the tenant has nothing.
    let s = p.cp.store.get_sandbox(&standby).await.unwrap();
    assert_eq!(s.state, SandboxState::Stopped);
    assert_eq!(p.cp.store.count_live_sandboxes(&p.tenant).await.unwrap(), 0);
    assert_eq!(
        p.worker.installs().len(),
        1,
        "no sandbox started in its place"
    );
}
