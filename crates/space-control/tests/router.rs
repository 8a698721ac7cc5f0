//! The control plane's router and the standalone edge's, called with
//! `tower::ServiceExt::oneshot` over a real SQLite store in a temporary directory and
//! real API keys: one test per rejection. No worker runs: every refusal here comes
//! before a worker would be asked, except the RefreshRoute one, whose worker is a
//! deliberately stale listener that answers every request with 421.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use axum::Router;
use axum::body::{Body, Bytes};
use axum::http::{Request, StatusCode, header};
use space_control::api::{self, AppState};
use space_control::edge::{Authority, Edge};
use space_control::limits::LimitsPolicy;
use space_control::service::ControlPlane;
use space_identity::{ExecutionId, Generation, SandboxId, Substrate};
use space_store::{ExecutionState, SandboxRecord, SandboxState, Store, WorkerRecord, WorkerState};
use tower::ServiceExt as _;

/// A control plane on a fresh store, with an admin key and a tenant's key.
struct Plane {
    _dir: tempfile::TempDir,
    cp: Arc<ControlPlane>,
    admin_key: String,
    tenant: String,
    tenant_key: String,
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
        let (tenant, key) = cp.create_tenant("tenant", false).await.unwrap();
        Self {
            _dir: dir,
            cp,
            admin_key: admin.text,
            tenant: tenant.id,
            tenant_key: key.text,
        }
    }

    /// The control plane's router, with its edge in process (as `space up` serves it).
    fn router(&self) -> Router {
        api::router(AppState {
            cp: Some(Arc::clone(&self.cp)),
            edge: Edge::new(Authority::Local(Arc::clone(&self.cp))),
        })
    }

    /// A sandbox of `tenant` in `state`, written to the store as the service would.
    async fn sandbox(&self, tenant: &str, state: SandboxState) -> SandboxId {
        let id = SandboxId::from_bytes(space_control::random_bytes());
        let now = space_control::now_secs() as i64;
        self.cp
            .store
            .create_sandbox(&SandboxRecord {
                id,
                tenant: tenant.to_owned(),
                template: "default".into(),
                state,
                created_at: now,
                expires_at: None,
                metadata: serde_json::json!({}),
                env: Default::default(),
                generation: Generation(0),
                limits: None,
                network: space_store::Policy::none(),
            })
            .await
            .unwrap();
        id
    }

    /// Enrolls worker `w1` at `url` and makes `sandbox` run there, acknowledged.
    async fn running_on(&self, sandbox: &SandboxId, url: &str) {
        let now = space_control::now_secs() as i64;
        let worker = "w1".parse().unwrap();
        self.cp
            .store
            .upsert_worker(&WorkerRecord {
                id: "w1".parse().unwrap(),
                url: url.to_owned(),
                substrate: Substrate::Jail,
                capacity: 10,
                state: WorkerState::Active,
                credential_hash: [0; 32],
                registered_at: now,
                last_seen: now,
            })
            .await
            .unwrap();
        let exe = self
            .cp
            .store
            .allocate_execution(
                sandbox,
                ExecutionId::from_bytes(space_control::random_bytes()),
                &worker,
                Substrate::Jail,
                now,
            )
            .await
            .unwrap();
        self.cp
            .store
            .set_execution_state(
                sandbox,
                exe.generation,
                ExecutionState::Running,
                Some(ExecutionState::Pending),
                now,
            )
            .await
            .unwrap();
    }
}

/// `method path` with `key` (if any) and `body`.
fn request(method: &str, path: &str, key: Option<&str>, body: Body) -> Request<Body> {
    let mut r = Request::builder()
        .method(method)
        .uri(path)
        .header(header::CONTENT_TYPE, "application/json");
    if let Some(key) = key {
        r = r.header(header::AUTHORIZATION, format!("Bearer {key}"));
    }
    r.body(body).unwrap()
}

/// An answer: its status, its headers, and its body as JSON.
struct Answer {
    status: StatusCode,
    headers: axum::http::HeaderMap,
    body: serde_json::Value,
}

impl Answer {
    /// Its `(error, message)`.
    fn error(&self) -> (&str, &str) {
        (
            self.body["error"].as_str().unwrap_or_default(),
            self.body["message"].as_str().unwrap_or_default(),
        )
    }
}

async fn call(app: Router, req: Request<Body>) -> Answer {
    let resp = app.oneshot(req).await.unwrap();
    let status = resp.status();
    let headers = resp.headers().clone();
    let bytes = axum::body::to_bytes(resp.into_body(), 1 << 20)
        .await
        .unwrap();
    let body = serde_json::from_slice(&bytes)
        .unwrap_or_else(|_| panic!("{status}: not JSON: {}", String::from_utf8_lossy(&bytes)));
    Answer {
        status,
        headers,
        body,
    }
}

/// A body of `chunks` chunks of 1 MiB, made only as the server reads it; `pulled`
/// counts the bytes it handed out.
fn counted_body(chunks: usize, pulled: Arc<AtomicUsize>) -> Body {
    let chunk = Bytes::from(vec![b' '; 1 << 20]);
    Body::from_stream(futures_util::stream::iter((0..chunks).map(move |_| {
        pulled.fetch_add(chunk.len(), Ordering::SeqCst);
        Ok::<_, std::io::Error>(chunk.clone())
    })))
}

const EXEC: &str = r#"{"cmd":["true"]}"#;
const CAPABILITY: &str = r#"{"access":["exec"],"purpose":"control"}"#;

#[tokio::test]
async fn a_request_without_an_api_key_is_refused_with_401_before_its_body_is_read() {
    let p = Plane::start().await;
    let id = p.sandbox(&p.tenant, SandboxState::Running).await;
    let pulled = Arc::new(AtomicUsize::new(0));
    let body = counted_body(8, Arc::clone(&pulled));
    let a = call(
        p.router(),
        request("POST", &format!("/v1/sandboxes/{id}/exec"), None, body),
    )
    .await;
    assert_eq!(a.status, StatusCode::UNAUTHORIZED);
    assert_eq!(a.error(), ("unauthorized", "a valid API key is required"));
    assert_eq!(a.headers[header::CONNECTION], "close");
    assert_eq!(pulled.load(Ordering::SeqCst), 0, "the body was read");
}

#[tokio::test]
async fn a_forged_or_malformed_api_key_is_refused_with_401() {
    let p = Plane::start().await;
    // The tenant's key ID with another secret of the right form.
    let forged = format!(
        "{}{}",
        &p.tenant_key[..p.tenant_key.len() - 1],
        if p.tenant_key.ends_with('a') {
            'b'
        } else {
            'a'
        }
    );
    for key in [forged.as_str(), "space_not_a_key", ""] {
        let a = call(
            p.router(),
            request("GET", "/v1/sandboxes", Some(key), Body::empty()),
        )
        .await;
        assert_eq!(a.status, StatusCode::UNAUTHORIZED, "{key}");
        assert_eq!(a.error(), ("unauthorized", "a valid API key is required"));
    }
    // The real key passes the same route.
    let resp = p
        .router()
        .oneshot(request(
            "GET",
            "/v1/sandboxes",
            Some(&p.tenant_key),
            Body::empty(),
        ))
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
}

#[tokio::test]
async fn a_tenant_key_on_an_admin_only_route_is_refused_with_403() {
    let p = Plane::start().await;
    let a = call(
        p.router(),
        request(
            "POST",
            "/v1/tenants",
            Some(&p.tenant_key),
            Body::from(r#"{"name":"other"}"#),
        ),
    )
    .await;
    assert_eq!(a.status, StatusCode::FORBIDDEN);
    assert_eq!(
        a.error(),
        ("forbidden", "only an admin key may create tenants")
    );
    let a = call(
        p.router(),
        request(
            "POST",
            "/v1/signing-keys/rotate",
            Some(&p.tenant_key),
            Body::empty(),
        ),
    )
    .await;
    assert_eq!(a.status, StatusCode::FORBIDDEN);
    assert_eq!(
        a.error(),
        ("forbidden", "only an admin key may rotate signing keys")
    );
    // The admin's key creates the tenant.
    let resp = p
        .router()
        .oneshot(request(
            "POST",
            "/v1/tenants",
            Some(&p.admin_key),
            Body::from(r#"{"name":"other"}"#),
        ))
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::CREATED);
}

#[tokio::test]
async fn an_unknown_sandbox_is_refused_with_404() {
    let p = Plane::start().await;
    let unknown = SandboxId::from_bytes([9; 16]);
    for path in [
        format!("/v1/sandboxes/{unknown}"),
        "/v1/sandboxes/not-an-id".to_owned(),
    ] {
        let a = call(
            p.router(),
            request("GET", &path, Some(&p.tenant_key), Body::empty()),
        )
        .await;
        assert_eq!(a.status, StatusCode::NOT_FOUND, "{path}");
        assert_eq!(a.error(), ("not_found", "sandbox not found"));
    }
}

#[tokio::test]
async fn another_tenants_sandbox_is_refused_with_the_404_of_an_unknown_one() {
    let p = Plane::start().await;
    let (other, _) = p.cp.create_tenant("other", false).await.unwrap();
    let theirs = p.sandbox(&other.id, SandboxState::Running).await;
    for (method, path, body) in [
        ("GET", format!("/v1/sandboxes/{theirs}"), ""),
        ("DELETE", format!("/v1/sandboxes/{theirs}"), ""),
        ("POST", format!("/v1/sandboxes/{theirs}/exec"), EXEC),
        (
            "POST",
            format!("/v1/sandboxes/{theirs}/capabilities"),
            CAPABILITY,
        ),
    ] {
        let a = call(
            p.router(),
            request(method, &path, Some(&p.tenant_key), Body::from(body)),
        )
        .await;
        assert_eq!(a.status, StatusCode::NOT_FOUND, "{method} {path}");
        assert_eq!(a.error(), ("not_found", "sandbox not found"));
    }
    // Its owner's admin sees it.
    let resp = p
        .router()
        .oneshot(request(
            "GET",
            &format!("/v1/sandboxes/{theirs}"),
            Some(&p.admin_key),
            Body::empty(),
        ))
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
}

#[tokio::test]
async fn a_capability_for_a_stopped_sandbox_is_refused_with_409() {
    let p = Plane::start().await;
    let id = p.sandbox(&p.tenant, SandboxState::Stopped).await;
    let a = call(
        p.router(),
        request(
            "POST",
            &format!("/v1/sandboxes/{id}/capabilities"),
            Some(&p.tenant_key),
            Body::from(CAPABILITY),
        ),
    )
    .await;
    assert_eq!(a.status, StatusCode::CONFLICT);
    assert_eq!(a.error(), ("conflict", "the sandbox is stopped"));
    // The edge asks for the same capability on an exec, and answers the same.
    let a = call(
        p.router(),
        request(
            "POST",
            &format!("/v1/sandboxes/{id}/exec"),
            Some(&p.tenant_key),
            Body::from(EXEC),
        ),
    )
    .await;
    assert_eq!(a.status, StatusCode::CONFLICT);
    assert_eq!(a.error(), ("conflict", "the sandbox is stopped"));
}

#[tokio::test]
async fn an_exec_body_over_its_limit_is_refused_with_413_and_never_read_past_it() {
    let p = Plane::start().await;
    let id = p.sandbox(&p.tenant, SandboxState::Running).await;
    let limit = space_proto::api::MAX_EXEC_BODY;
    let chunks = (limit >> 20) + 16;
    let pulled = Arc::new(AtomicUsize::new(0));
    let body = counted_body(chunks, Arc::clone(&pulled));
    let a = call(
        p.router(),
        request(
            "POST",
            &format!("/v1/sandboxes/{id}/exec"),
            Some(&p.tenant_key),
            body,
        ),
    )
    .await;
    assert_eq!(a.status, StatusCode::PAYLOAD_TOO_LARGE);
    assert_eq!(
        a.error(),
        (
            "too_large",
            "exec request over 96 MiB (stdin at most 64 MiB; use the streaming exec for more)"
        )
    );
    let read = pulled.load(Ordering::SeqCst);
    assert!(
        read <= limit + (1 << 20),
        "{read} bytes read of a body refused at {limit}"
    );
}

#[tokio::test]
async fn a_create_past_the_tenants_quota_is_refused_with_429() {
    let p = Plane::start().await;
    p.cp.set_limits_policy(LimitsPolicy {
        tenant_sandboxes: 2,
        ..LimitsPolicy::default()
    });
    p.sandbox(&p.tenant, SandboxState::Running).await;
    p.sandbox(&p.tenant, SandboxState::Paused).await;
    // Stopped ones do not count, nor do other tenants'.
    p.sandbox(&p.tenant, SandboxState::Stopped).await;
    let a = call(
        p.router(),
        request(
            "POST",
            "/v1/sandboxes",
            Some(&p.tenant_key),
            Body::from("{}"),
        ),
    )
    .await;
    assert_eq!(a.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(
        a.error(),
        (
            "quota_exceeded",
            "this tenant has 2 live sandboxes, its quota is 2: delete one first"
        )
    );
    // Under the quota, the create gets past it (and fails only for want of a worker).
    let (other, other_key) = p.cp.create_tenant("other", false).await.unwrap();
    let _ = other;
    let a = call(
        p.router(),
        request(
            "POST",
            "/v1/sandboxes",
            Some(&other_key.text),
            Body::from("{}"),
        ),
    )
    .await;
    assert_eq!(a.status, StatusCode::SERVICE_UNAVAILABLE, "{:?}", a.body);
    assert_eq!(a.error().0, "unavailable");
}

/// A worker that answers every request with a RefreshRoute, however often it is
/// asked: the route the control plane names for it is stale for good.
async fn stale_worker(answered: Arc<AtomicUsize>) -> String {
    let app = Router::new().fallback(move || {
        let answered = Arc::clone(&answered);
        async move {
            answered.fetch_add(1, Ordering::SeqCst);
            (
                StatusCode::MISDIRECTED_REQUEST,
                axum::Json(serde_json::json!({
                    "error": "refresh_route",
                    "message": "stale route",
                    "reason": "stale_generation",
                })),
            )
        }
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(api::serve_until(listener, app, std::future::pending()));
    url
}

#[tokio::test]
async fn a_refresh_route_the_resolve_cannot_repair_is_refused_with_503_without_a_rebuilt_attempt() {
    let p = Plane::start().await;
    let id = p.sandbox(&p.tenant, SandboxState::Running).await;
    let answered = Arc::new(AtomicUsize::new(0));
    let url = stale_worker(Arc::clone(&answered)).await;
    p.running_on(&id, &url).await;
    let a = call(
        p.router(),
        request(
            "POST",
            &format!("/v1/sandboxes/{id}/exec"),
            Some(&p.tenant_key),
            Body::from(EXEC),
        ),
    )
    .await;
    assert_eq!(a.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(
        a.error(),
        (
            "route_unavailable",
            "the control plane resolved the rejected route again"
        )
    );
    assert_eq!(a.body.get("reason"), None);
    // The first attempt only: the resolve named the same execution, so no rebuilt
    // attempt was sent to it.
    assert_eq!(answered.load(Ordering::SeqCst), 1);
}

/// A standalone edge (`space edge`) in front of the control plane served on a port.
async fn standalone_edge(p: &Plane) -> Router {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(api::serve_until(
        listener,
        p.router(),
        std::future::pending(),
    ));
    api::edge_router(api::edge_only(url))
}

#[tokio::test]
async fn a_standalone_edge_refuses_a_forged_key_with_401_before_the_body_is_read() {
    let p = Plane::start().await;
    let edge = standalone_edge(&p).await;
    let id = p.sandbox(&p.tenant, SandboxState::Running).await;
    let pulled = Arc::new(AtomicUsize::new(0));
    let a = call(
        edge,
        request(
            "POST",
            &format!("/v1/sandboxes/{id}/exec"),
            Some("space_not_a_key"),
            counted_body(8, Arc::clone(&pulled)),
        ),
    )
    .await;
    assert_eq!(a.status, StatusCode::UNAUTHORIZED);
    assert_eq!(a.error(), ("unauthorized", "a valid API key is required"));
    assert_eq!(pulled.load(Ordering::SeqCst), 0, "the body was read");
}

#[tokio::test]
async fn a_standalone_edge_passes_on_the_control_planes_404_and_409_as_they_came() {
    let p = Plane::start().await;
    let edge = standalone_edge(&p).await;
    let (other, _) = p.cp.create_tenant("other", false).await.unwrap();
    let theirs = p.sandbox(&other.id, SandboxState::Running).await;
    let stopped = p.sandbox(&p.tenant, SandboxState::Stopped).await;
    for (id, status, error) in [
        (
            theirs,
            StatusCode::NOT_FOUND,
            ("not_found", "sandbox not found"),
        ),
        (
            stopped,
            StatusCode::CONFLICT,
            ("conflict", "the sandbox is stopped"),
        ),
    ] {
        let a = call(
            edge.clone(),
            request(
                "POST",
                &format!("/v1/sandboxes/{id}/exec"),
                Some(&p.tenant_key),
                Body::from(EXEC),
            ),
        )
        .await;
        assert_eq!(a.status, status);
        assert_eq!(a.error(), error);
    }
}

#[tokio::test]
async fn a_worker_id_cannot_come_back_as_a_worker_of_another_substrate() {
    let p = Plane::start().await;
    let req = |substrate: space_identity::Substrate, credential: Option<String>| {
        space_proto::api::EnrollRequest {
            worker: "w1".parse().unwrap(),
            url: "http://127.0.0.1:9".into(),
            substrate,
            capacity: 4,
            enroll_secret: "enroll-secret".into(),
            credential,
        }
    };
    let first =
        p.cp.enroll(&req(space_identity::Substrate::Jail, None))
            .await
            .unwrap();
    // With its own credential, as the same substrate: re-enrolled.
    p.cp.enroll(&req(
        space_identity::Substrate::Jail,
        Some(first.credential.clone()),
    ))
    .await
    .unwrap();
    // With its own credential, as a VM worker: refused, and still a jail worker (its
    // sandboxes' files are jails').
    let e =
        p.cp.enroll(&req(space_identity::Substrate::Vm, Some(first.credential)))
            .await
            .unwrap_err();
    assert!(
        matches!(e, space_control::error::ControlError::Conflict(_)),
        "{e}"
    );
    assert!(e.to_string().contains("enrolled as a jail worker"), "{e}");
    let w = p.cp.store.get_worker(&"w1".parse().unwrap()).await.unwrap();
    assert_eq!(w.substrate, space_identity::Substrate::Jail);
}
