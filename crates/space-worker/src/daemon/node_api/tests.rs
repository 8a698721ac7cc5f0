//! Router tests: `tower::ServiceExt::oneshot` on the real router of a real worker —
//! its records in a temporary directory, the trust anchor and capability key of the
//! test kit, bundles and capabilities valid now — one test per refusal node-api
//! answers. No jail is launched: a refusal is answered before any would be reached.
//!
//! node-api has no concurrency limit, so it never answers 429.

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};

use axum::body::{Body, Bytes};
use axum::http::{Request, StatusCode, header};
use axum::response::Response;
use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD as B64;
use hyper::body::Frame;
use space_identity::{
    BundleSigner, CapabilitySigner, Generation, KeyBundle, KeyUses, Purpose, Route, Timestamp,
    Token,
};
use space_proto::api::{
    DELIVERY_HEADER, Delivery, ErrorBody, MAX_EXEC_BODY, MAX_UPDATE_BODY, SignedUpdate, Update,
    UpdateBody,
};
use space_testkit::{CapabilityBuilder, TestKeys};
use tower::ServiceExt as _;

use crate::daemon::config::WorkerConfig;
use crate::daemon::launch::{self, Binaries};
use crate::daemon::records::{BridgeRecord, ExecutionRecord, RecordState, Records};
use crate::daemon::state::{AgentPool, Worker, activation_of, now_secs};
use crate::substrate::jail::{JailConfig, JailDriver};

/// This worker's ID.
const ME: &str = "w1";

/// A worker on records of its own in `data`, never enrolled: no jail, bridge or agent
/// is ever started (its binaries are the test process, never run). `tag` names its
/// cgroup parent.
pub(crate) fn bare_worker(data: &tempfile::TempDir, tag: &str) -> Arc<Worker> {
    let exe = std::env::current_exe().unwrap();
    let config = WorkerConfig {
        id: space_testkit::worker(ME),
        control_url: "http://127.0.0.1:9".into(),
        enroll_secret: "unused".into(),
        listen: "127.0.0.1:0".parse().unwrap(),
        advertise_url: None,
        data_dir: data.path().to_path_buf(),
        capacity: 4,
        binaries: Binaries {
            agent: exe.clone(),
            bridge: exe.clone(),
        },
        jail_binary: exe.clone(),
        cgroup_parent: format!("space-{tag}-test-{}", std::process::id()),
        warm_pool: 0,
        userns: None,
        limits: Default::default(),
        egress: None,
        vm: None,
    };
    let records = Records::open(&data.path().join("records.db")).unwrap();
    let mut jail = JailConfig::new(&exe);
    jail.userns = None;
    jail.cgroup_parent = config.cgroup_parent.clone();
    let substrate = Arc::new(JailDriver::new(jail).unwrap());
    Worker::assemble(&config, "http://127.0.0.1:1".into(), records, substrate).unwrap()
}

/// Enrolls `worker` with `keys`' trust anchor and installs a bundle of `keys`' signing
/// keys for `purposes` (the control key for `control`, the service-port key for
/// `service_port`), valid an hour either side of now.
pub(crate) fn enroll(worker: &Worker, keys: &TestKeys, purposes: &[Purpose]) {
    worker
        .set_enrollment(keys.anchor.anchor(), "credential")
        .unwrap();
    let now = Timestamp::from_unix_secs(now_secs());
    let bundle = keys
        .anchor
        .sign(&KeyBundle {
            version: 1,
            issued_at: now,
            keys: purposes
                .iter()
                .map(|&p| {
                    let signer = match p {
                        Purpose::Control => &keys.control,
                        Purpose::ServicePort => &keys.service_port,
                    };
                    signer.bundle_key(KeyUses::only(p), now.minus_secs(3600), now.plus_secs(3600))
                })
                .collect(),
        })
        .unwrap();
    worker
        .keys
        .write()
        .unwrap()
        .as_mut()
        .unwrap()
        .install(&bundle)
        .unwrap();
}

/// A worker on records of its own, enrolled with the test kit's trust anchor and
/// holding a bundle (the kit's keys, valid an hour either side of now).
struct Fixture {
    worker: Arc<Worker>,
    keys: TestKeys,
    _data: tempfile::TempDir,
}

impl Fixture {
    fn new() -> Self {
        let data = tempfile::tempdir().unwrap();
        let worker = bare_worker(&data, "node-api");
        let keys = TestKeys::new();
        enroll(&worker, &keys, &[Purpose::Control]);
        Self {
            worker,
            keys,
            _data: data,
        }
    }

    /// Sandbox `n`'s execution `generation` recorded here in `state`, with a bridge
    /// pool (of a bridge never connected to: the test process stands in for it).
    fn hold(&self, n: u64, generation: u64, state: RecordState) -> Route {
        let route = space_testkit::route(n, generation, ME);
        let bridge = BridgeRecord {
            socket: self._data.path().join("no-bridge.sock"),
            process: space_peer::LiveProcess::open(std::process::id())
                .unwrap()
                .identity,
        };
        let record = ExecutionRecord {
            sandbox: route.sandbox,
            generation: route.execution.generation,
            execution_id: route.execution.id,
            substrate: route.placement.substrate,
            activation: route.placement.activation,
            state,
            secret: [7; 32],
            handle: None,
            bridge: Some(bridge.clone()),
            env: Default::default(),
            ports: Vec::new(),
            network: space_proto::api::Policy::none(),
            defaults: Default::default(),
            template: None,
            updated_at: now_secs() as i64,
        };
        self.worker.records.put(&record).unwrap();
        let pool = AgentPool::new(launch::bridge_target(&bridge, &activation_of(&record)), 1);
        self.worker.put_slot(record, Some(Arc::new(pool)));
        route
    }

    /// A capability for `route`, valid for a minute from now.
    fn capability(&self, route: &Route) -> Token {
        let now = Timestamp::from_unix_secs(now_secs());
        CapabilityBuilder::control(&self.keys, route)
            .times(now, now.plus_secs(60))
            .sign(&self.keys)
    }

    /// The signed delivery header of `body`, claiming `size` bytes.
    fn delivery(&self, body: &[u8], size: u64) -> String {
        let descriptor = serde_json::to_vec(&Delivery {
            worker: ME.into(),
            issued_at: now_secs(),
            size,
            digest: blake3::hash(body).to_hex().to_string(),
            nonce: format!("{:x}", rand_nonce()),
        })
        .unwrap();
        let signature = self.keys.anchor.sign_delivery(&descriptor);
        format!("{}.{}", B64.encode(&descriptor), B64.encode(signature))
    }

    /// A signed update (sequence number `seq`) of `update` for this worker.
    fn update(&self, seq: u64, update: Update) -> Vec<u8> {
        let body = serde_json::to_vec(&UpdateBody {
            worker: space_testkit::worker(ME),
            issued_at: now_secs(),
            seq,
            update,
        })
        .unwrap();
        let signature = self.keys.anchor.sign_update(&body);
        serde_json::to_vec(&SignedUpdate {
            body: B64.encode(&body),
            signature: B64.encode(signature),
        })
        .unwrap()
    }

    async fn send(&self, req: Request<Body>) -> Response {
        super::router(Arc::clone(&self.worker))
            .oneshot(req)
            .await
            .unwrap()
    }
}

/// A nonce no two deliveries share.
fn rand_nonce() -> u128 {
    u128::from_le_bytes(crate::daemon::state::random32()[..16].try_into().unwrap())
}

/// A request body that records whether anything read it.
struct Tripwire {
    read: Arc<AtomicBool>,
    left: usize,
}

impl hyper::body::Body for Tripwire {
    type Data = Bytes;
    type Error = std::io::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, std::io::Error>>> {
        self.read.store(true, Ordering::SeqCst);
        if self.left == 0 {
            return Poll::Ready(None);
        }
        let n = self.left.min(64 << 10);
        self.left -= n;
        Poll::Ready(Some(Ok(Frame::data(Bytes::from(vec![b'x'; n])))))
    }
}

/// A body of `len` bytes, and the flag it sets once read.
fn tripwire(len: usize) -> (Body, Arc<AtomicBool>) {
    let read = Arc::new(AtomicBool::new(false));
    let body = Body::new(Tripwire {
        read: Arc::clone(&read),
        left: len,
    });
    (body, read)
}

/// Status and error body of an answer.
async fn refusal(resp: Response) -> (StatusCode, ErrorBody) {
    let status = resp.status();
    let body = axum::body::to_bytes(resp.into_body(), 1 << 20)
        .await
        .unwrap();
    let error = serde_json::from_slice(&body)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&body)));
    (status, error)
}

fn exec_request(route: &Route, token: Option<&Token>, body: Body) -> Request<Body> {
    let mut req = Request::post(format!("/v1/sandboxes/{}/exec", route.sandbox))
        .header(header::CONTENT_TYPE, "application/json");
    if let Some(token) = token {
        req = req.header(
            header::AUTHORIZATION,
            format!("SpaceCap {}", token.to_text()),
        );
    }
    req.body(body).unwrap()
}

#[tokio::test]
async fn an_exec_without_a_capability_is_refused_with_401_and_its_body_left_unread() {
    let f = Fixture::new();
    let route = f.hold(1, 1, RecordState::Running);
    let (body, read) = tripwire(1024);
    let resp = f.send(exec_request(&route, None, body)).await;
    assert_eq!(resp.headers()[header::CONNECTION], "close");
    let (status, e) = refusal(resp).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert_eq!(e.error, "unauthorized");
    assert_eq!(e.message, "a SpaceCap capability is required");
    assert!(!read.load(Ordering::SeqCst), "the body was read");
}

#[tokio::test]
async fn an_update_without_a_signed_delivery_is_refused_with_401_before_its_body_is_read() {
    let f = Fixture::new();
    let (body, read) = tripwire(1024);
    let req = Request::post("/internal/v1/updates").body(body).unwrap();
    let resp = f.send(req).await;
    assert_eq!(resp.headers()[header::CONNECTION], "close");
    let (status, e) = refusal(resp).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert_eq!(e.error, "update_refused");
    assert_eq!(e.message, format!("no {DELIVERY_HEADER} header"));
    assert!(!read.load(Ordering::SeqCst), "the body was read");
}

#[tokio::test]
async fn an_update_whose_delivery_another_key_signed_is_refused_with_403() {
    let f = Fixture::new();
    let body = f.update(1, Update::Bundle { bundle: "x".into() });
    let forged = {
        let descriptor = serde_json::to_vec(&Delivery {
            worker: ME.into(),
            issued_at: now_secs(),
            size: body.len() as u64,
            digest: blake3::hash(&body).to_hex().to_string(),
            nonce: "1".into(),
        })
        .unwrap();
        let signature = BundleSigner::from_seed([9; 32]).sign_delivery(&descriptor);
        format!("{}.{}", B64.encode(&descriptor), B64.encode(signature))
    };
    let req = Request::post("/internal/v1/updates")
        .header(DELIVERY_HEADER, forged)
        .body(Body::from(body))
        .unwrap();
    let (status, e) = refusal(f.send(req).await).await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    assert_eq!(
        (e.error.as_str(), e.message.as_str()),
        ("update_refused", "delivery not signed by the trust anchor")
    );
}

#[tokio::test]
async fn an_expired_capability_is_refused_with_403_expired() {
    let f = Fixture::new();
    let route = f.hold(1, 1, RecordState::Running);
    let now = Timestamp::from_unix_secs(now_secs());
    let token = CapabilityBuilder::control(&f.keys, &route)
        .times(now.minus_secs(600), now.minus_secs(540))
        .sign(&f.keys);
    let resp = f
        .send(exec_request(&route, Some(&token), Body::from("{}")))
        .await;
    let (status, e) = refusal(resp).await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    assert_eq!(e.error, "deny");
    assert_eq!(e.reason.as_deref(), Some("expired"));
}

#[tokio::test]
async fn a_capability_signed_by_a_key_outside_the_bundle_is_refused_with_403_unknown_key() {
    let f = Fixture::new();
    let route = f.hold(1, 1, RecordState::Running);
    let now = Timestamp::from_unix_secs(now_secs());
    let token = CapabilityBuilder::control(&f.keys, &route)
        .times(now, now.plus_secs(60))
        .with(|c| c.key_id = CapabilitySigner::from_seed([9; 32]).key_id())
        .sign_with(&CapabilitySigner::from_seed([9; 32]));
    let req = Request::get(format!(
        "/v1/sandboxes/{}/files/list?path=/root",
        route.sandbox
    ))
    .header(
        header::AUTHORIZATION,
        format!("SpaceCap {}", token.to_text()),
    )
    .body(Body::empty())
    .unwrap();
    let (status, e) = refusal(f.send(req).await).await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    assert_eq!(e.reason.as_deref(), Some("unknown_key"));
}

#[tokio::test]
async fn a_capability_for_another_sandbox_than_the_path_names_is_refused_with_403() {
    let f = Fixture::new();
    let mine = f.hold(1, 1, RecordState::Running);
    let other = f.hold(2, 1, RecordState::Running);
    let token = f.capability(&other);
    let resp = f
        .send(exec_request(&mine, Some(&token), Body::from("{}")))
        .await;
    let (status, e) = refusal(resp).await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    assert_eq!(e.reason.as_deref(), Some("sandbox_mismatch"));
}

#[tokio::test]
async fn a_capability_for_a_sandbox_this_worker_never_held_is_refused_with_403() {
    let f = Fixture::new();
    let route = space_testkit::route(5, 1, ME);
    let token = f.capability(&route);
    let resp = f
        .send(exec_request(&route, Some(&token), Body::from("{}")))
        .await;
    let (status, e) = refusal(resp).await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    assert_eq!(e.reason.as_deref(), Some("unknown_sandbox"));
}

#[tokio::test]
async fn an_unknown_route_is_answered_404_not_found() {
    let f = Fixture::new();
    let req = Request::get("/v1/sandboxes/nothing/here")
        .body(Body::empty())
        .unwrap();
    let (status, e) = refusal(f.send(req).await).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_eq!(
        (e.error.as_str(), e.message.as_str()),
        ("not_found", "no such route")
    );
}

#[tokio::test]
async fn a_replayed_delivery_header_is_refused_with_409_before_its_body_is_read() {
    let f = Fixture::new();
    let route = space_testkit::route(3, 1, ME);
    let body = f.update(
        1,
        Update::Retire {
            sandbox: route.sandbox,
            generation: Generation(1),
            execution_id: route.execution.id,
        },
    );
    let header = f.delivery(&body, body.len() as u64);
    let first = Request::post("/internal/v1/updates")
        .header(DELIVERY_HEADER, &header)
        .body(Body::from(body.clone()))
        .unwrap();
    let resp = f.send(first).await;
    assert_eq!(
        resp.status(),
        StatusCode::OK,
        "the first delivery is applied"
    );
    let (replay, read) = tripwire(body.len());
    let again = Request::post("/internal/v1/updates")
        .header(DELIVERY_HEADER, &header)
        .body(replay)
        .unwrap();
    let (status, e) = refusal(f.send(again).await).await;
    assert_eq!(status, StatusCode::CONFLICT);
    assert_eq!(e.error, "update_refused");
    assert!(e.message.starts_with("replayed_delivery:"), "{}", e.message);
    assert!(!read.load(Ordering::SeqCst), "the body was read");
}

#[tokio::test]
async fn a_request_to_a_sandbox_that_stays_paused_is_refused_with_409_paused() {
    let f = Fixture::new();
    let route = f.hold(1, 1, RecordState::Paused);
    let token = f.capability(&route);
    let req = Request::get(format!(
        "/v1/sandboxes/{}/files/list?path=/root",
        route.sandbox
    ))
    .header(
        header::AUTHORIZATION,
        format!("SpaceCap {}", token.to_text()),
    )
    .body(Body::empty())
    .unwrap();
    let started = std::time::Instant::now();
    let (status, e) = refusal(f.send(req).await).await;
    assert_eq!(status, StatusCode::CONFLICT);
    assert_eq!(
        (e.error.as_str(), e.message.as_str()),
        ("paused", "the sandbox is paused; resume it first")
    );
    assert!(started.elapsed() >= std::time::Duration::from_secs(2));
}

#[tokio::test]
async fn an_update_whose_signed_size_is_over_the_limit_is_refused_with_413_before_its_body_is_read()
{
    let f = Fixture::new();
    let (body, read) = tripwire(1024);
    let header = f.delivery(b"", MAX_UPDATE_BODY + 1);
    let req = Request::post("/internal/v1/updates")
        .header(DELIVERY_HEADER, header)
        .body(body)
        .unwrap();
    let (status, e) = refusal(f.send(req).await).await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE);
    assert_eq!(e.error, "update_refused");
    assert!(e.message.starts_with("too_large:"), "{}", e.message);
    assert!(!read.load(Ordering::SeqCst), "the body was read");
}

#[tokio::test]
async fn an_exec_body_over_the_limit_is_refused_with_413_too_large() {
    let f = Fixture::new();
    let route = f.hold(1, 1, RecordState::Running);
    let token = f.capability(&route);
    let (body, _) = tripwire(MAX_EXEC_BODY + 1);
    let resp = f.send(exec_request(&route, Some(&token), body)).await;
    let (status, e) = refusal(resp).await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE);
    assert_eq!(e.error, "too_large");
    assert!(
        e.message.starts_with("exec stdin is limited to"),
        "{}",
        e.message
    );
}

#[tokio::test]
async fn a_capability_for_generation_7_is_refused_with_421_after_8_is_installed() {
    let f = Fixture::new();
    let old = space_testkit::route(1, 7, ME);
    f.hold(1, 8, RecordState::Running);
    let token = f.capability(&old);
    let (body, read) = tripwire(1024);
    let resp = f.send(exec_request(&old, Some(&token), body)).await;
    assert_eq!(resp.headers()[header::CONNECTION], "close");
    let (status, e) = refusal(resp).await;
    assert_eq!(status, StatusCode::MISDIRECTED_REQUEST);
    assert_eq!(e.error, "refresh_route");
    assert_eq!(e.reason.as_deref(), Some("stale_generation"));
    assert!(!read.load(Ordering::SeqCst), "the body was read");
}

#[tokio::test]
async fn a_capability_for_a_retired_execution_is_refused_with_421_retired() {
    let f = Fixture::new();
    let route = f.hold(1, 1, RecordState::Retired);
    let token = f.capability(&route);
    let req = Request::get(format!(
        "/v1/sandboxes/{}/files?path=/root/x",
        route.sandbox
    ))
    .header(
        header::AUTHORIZATION,
        format!("SpaceCap {}", token.to_text()),
    )
    .body(Body::empty())
    .unwrap();
    let (status, e) = refusal(f.send(req).await).await;
    assert_eq!(status, StatusCode::MISDIRECTED_REQUEST);
    assert_eq!(e.reason.as_deref(), Some("retired"));
}

/// An install that continues a sandbox (`needs_layer`) on a worker that does not hold
/// the sandbox's files is refused and records nothing: it used to start the sandbox
/// from an empty layer, silently losing every acknowledged file (seen in a soak with
/// workers killed: a restarted worker given a sandbox whose files were elsewhere).
#[tokio::test]
async fn an_install_that_needs_the_sandboxs_files_where_they_are_not_is_refused_with_409() {
    let f = Fixture::new();
    let route = space_testkit::route(9, 2, ME);
    let install = space_proto::api::InstallExecution {
        sandbox: route.sandbox,
        generation: Generation(2),
        execution_id: route.execution.id,
        substrate: space_identity::Substrate::Jail,
        activation: 1,
        template: "default".into(),
        env: Default::default(),
        limits: space_proto::api::Limits::default(),
        needs_layer: true,
        ports: Vec::new(),
        network: space_proto::api::Policy::none(),
    };
    let body = f.update(1, Update::Install(install));
    let req = Request::post("/internal/v1/updates")
        .header(DELIVERY_HEADER, f.delivery(&body, body.len() as u64))
        .body(Body::from(body))
        .unwrap();
    let (status, e) = refusal(f.send(req).await).await;
    assert_eq!(status, StatusCode::CONFLICT, "{e:?}");
    assert!(e.message.starts_with("layer_missing:"), "{}", e.message);
    assert_eq!(
        f.worker.records.max_generation(&route.sandbox).unwrap(),
        Generation(0),
        "a refused install left a record"
    );
}

/// A read of `route`'s file `/root/x` with `token`.
fn read_request(route: &Route, token: Option<&Token>) -> Request<Body> {
    let mut req = Request::get(format!(
        "/v1/sandboxes/{}/files?path=/root/x",
        route.sandbox
    ));
    if let Some(token) = token {
        req = req.header(
            header::AUTHORIZATION,
            format!("SpaceCap {}", token.to_text()),
        );
    }
    req.body(Body::empty()).unwrap()
}

/// While a restarted worker re-adopts its executions, requests with an authentic
/// capability wait for it — and nothing else does: a request without a capability,
/// with a forged or an expired one, or for a sandbox this worker never held, is
/// answered at once (else anyone could hold the worker's connections for the wait).
#[tokio::test]
async fn while_a_restarted_worker_adopts_only_requests_with_an_authentic_capability_wait() {
    let f = Fixture::new();
    let route = f.hold(1, 1, RecordState::Retired);
    f.worker.readiness.adopting();
    let at_once = std::time::Duration::from_secs(3);
    let now = Timestamp::from_unix_secs(now_secs());
    let expired = CapabilityBuilder::control(&f.keys, &route)
        .times(now.minus_secs(600), now.minus_secs(540))
        .sign(&f.keys);
    let stranger = space_testkit::route(2, 1, ME);
    let foreign = f.capability(&stranger);
    // One character of the signature changed (not the last: its spare bits would
    // make the text non-canonical, refused before any signature check).
    let mut forged: Vec<char> = f.capability(&route).to_text().chars().collect();
    let at = forged.len() - 10;
    forged[at] = if forged[at] == 'A' { 'B' } else { 'A' };
    let forged = Token::from_text(&forged.into_iter().collect::<String>()).unwrap();
    for (what, req, status) in [
        (
            "no capability",
            read_request(&route, None),
            StatusCode::UNAUTHORIZED,
        ),
        (
            "forged",
            read_request(&route, Some(&forged)),
            StatusCode::FORBIDDEN,
        ),
        (
            "expired",
            read_request(&route, Some(&expired)),
            StatusCode::FORBIDDEN,
        ),
        (
            "never held",
            read_request(&stranger, Some(&foreign)),
            StatusCode::FORBIDDEN,
        ),
    ] {
        let resp = tokio::time::timeout(at_once, f.send(req))
            .await
            .unwrap_or_else(|_| panic!("{what}: held for the adoption"));
        assert_eq!(resp.status(), status, "{what}");
    }
    // An authentic one waits, and is answered once the adoption is over.
    let token = f.capability(&route);
    let worker = Arc::clone(&f.worker);
    let waiting = tokio::spawn(async move {
        super::router(worker)
            .oneshot(read_request(&route, Some(&token)))
            .await
            .unwrap()
    });
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    assert!(!waiting.is_finished(), "an authentic request was not held");
    f.worker.readiness.adoption_over();
    let (status, e) = refusal(waiting.await.unwrap()).await;
    assert_eq!(status, StatusCode::MISDIRECTED_REQUEST);
    assert_eq!(e.reason.as_deref(), Some("retired"));
}
