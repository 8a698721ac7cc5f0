//! netgtw against real processes: node-api served on a loopback port by a worker on
//! records of its own, a "sandbox" that is a real process in a network namespace of
//! its own (`unshare --net`, loopback up) running HTTP and TCP echo servers, and
//! clients speaking the tunnel protocol on raw sockets. Needs root (a new network
//! namespace, and `setns` into it); skipped with a message otherwise.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use space_identity::{DenyReason, Protocol, Purpose, Route, ServicePort, Timestamp, Token};
use space_proto::api::Update;
use space_proto::api::ports::ExposedPort;
use space_testkit::{CapabilityBuilder, TestKeys};

use crate::daemon::launch;
use crate::daemon::node_api::tests::{bare_worker, enroll};
use crate::daemon::records::{BridgeRecord, ExecutionRecord, RecordState};
use crate::daemon::state::{AgentPool, Worker, activation_of, now_secs};
use crate::substrate::jail::cgroup::CgroupSet;
use crate::substrate::process::ProcessIdentity;
use crate::substrate::{ExecutionKey, SandboxHandle, SubstrateKind};

const ME: &str = "w1";

/// HTTP (keep-alive; `/nows` refuses a WebSocket upgrade with 400; anything else
/// answers JSON naming where it runs and the headers it got) on `argv[1]`, a TCP echo
/// on `argv[2]`.
const SERVERS: &str = r#"
import json, socket, sys, threading
from http.server import ThreadingHTTPServer, BaseHTTPRequestHandler
http_port, echo_port = int(sys.argv[1]), int(sys.argv[2])
class H(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def do_GET(self):
        if self.path == "/nows":
            body, status = b"no websocket here", 400
        else:
            body = json.dumps({"where": "sandbox", "path": self.path, "headers": dict(self.headers)}).encode()
            status = 200
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *a):
        pass
def serve(c):
    while True:
        d = c.recv(65536)
        if not d:
            break
        c.sendall(d)
    c.close()
def echo():
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("127.0.0.1", echo_port))
    s.listen(64)
    while True:
        c, _ = s.accept()
        threading.Thread(target=serve, args=(c,), daemon=True).start()
threading.Thread(target=echo, daemon=True).start()
srv = ThreadingHTTPServer(("127.0.0.1", http_port), H)
print("ready", flush=True)
srv.serve_forever()
"#;

/// A process in a network namespace of its own, killed on drop.
struct NetnsServers {
    child: Child,
}

impl NetnsServers {
    fn start(http_port: u16, echo_port: u16) -> Self {
        let mut child = Command::new("unshare")
            .args(["--net", "--", "sh", "-c"])
            .arg("ip link set lo up && exec python3 -c \"$0\" \"$1\" \"$2\"")
            .arg(SERVERS)
            .arg(http_port.to_string())
            .arg(echo_port.to_string())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("unshare");
        let mut line = String::new();
        BufReader::new(child.stdout.take().expect("stdout"))
            .read_line(&mut line)
            .expect("ready line");
        assert_eq!(line.trim(), "ready", "the servers did not start");
        Self { child }
    }

    fn identity(&self) -> ProcessIdentity {
        ProcessIdentity::of(self.child.id() as i32).expect("identity")
    }
}

impl Drop for NetnsServers {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A worker serving node-api on a loopback port, holding one sandbox whose
/// "jail" is [`NetnsServers`].
struct Gateway {
    worker: Arc<Worker>,
    keys: TestKeys,
    addr: std::net::SocketAddr,
    runtime: tokio::runtime::Runtime,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    route: Route,
    record: ExecutionRecord,
    _servers: NetnsServers,
    bridge_stand_in: Child,
    data: tempfile::TempDir,
}

fn can_enter_namespaces() -> bool {
    if !rustix::process::geteuid().is_root() {
        eprintln!(
            "skipped: netgtw tests need root (a network namespace of their own, and setns into it)"
        );
        return false;
    }
    true
}

impl Gateway {
    /// `ports` exposed; the sandbox's HTTP server on `http_port`, echo on `echo_port`.
    fn start(http_port: u16, echo_port: u16, ports: &[(u16, Protocol)]) -> Self {
        let servers = NetnsServers::start(http_port, echo_port);
        let data = tempfile::tempdir().unwrap();
        let worker = bare_worker(&data, "netgtw");
        let keys = TestKeys::new();
        enroll(&worker, &keys, &[Purpose::Control, Purpose::ServicePort]);
        let route = space_testkit::route(1, 1, ME);
        let handle = SandboxHandle {
            key: ExecutionKey::new(route.sandbox.to_string(), route.execution.id.to_string()),
            substrate: SubstrateKind::Jail,
            init: servers.identity(),
            agent: None,
            socket_path: data.path().join("no-agent.sock"),
            socket_inode: 0,
            sandbox_dir: data.path().join("sandbox"),
            upper_dir: data.path().join("sandbox/upper"),
            log_path: data.path().join("sandbox/log"),
            cgroups: CgroupSet::V2 {
                dir: data.path().join("no-cgroup"),
            },
            host_uid: None,
            guest_cid: None,
        };
        // A retirement kills the bridge: a stand-in of its own, never this process.
        let bridge_stand_in = Command::new("sleep").arg("600").spawn().unwrap();
        let bridge = BridgeRecord {
            socket: data.path().join("no-bridge.sock"),
            process: space_peer::LiveProcess::open(bridge_stand_in.id())
                .unwrap()
                .identity,
        };
        let record = ExecutionRecord {
            sandbox: route.sandbox,
            generation: route.execution.generation,
            execution_id: route.execution.id,
            substrate: route.placement.substrate,
            activation: route.placement.activation,
            state: RecordState::Running,
            secret: [7; 32],
            handle: Some(handle),
            bridge: Some(bridge.clone()),
            env: Default::default(),
            ports: ports
                .iter()
                .map(|&(port, protocol)| ExposedPort { port, protocol })
                .collect(),
            network: space_proto::api::Policy::none(),
            defaults: Default::default(),
            template: None,
            updated_at: now_secs() as i64,
        };
        worker.records.put(&record).unwrap();
        let pool = AgentPool::new(launch::bridge_target(&bridge, &activation_of(&record)), 1);
        worker.put_slot(record.clone(), Some(Arc::new(pool)));
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let listener = runtime
            .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
            .unwrap();
        let addr = listener.local_addr().unwrap();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let app = crate::daemon::node_api::router(Arc::clone(&worker));
        runtime.spawn(async move {
            let _ = space_http::serve_until(listener, app, async {
                let _ = stopped.await;
            })
            .await;
        });
        Self {
            worker,
            keys,
            addr,
            runtime,
            stop: Some(stop),
            route,
            record,
            _servers: servers,
            bridge_stand_in,
            data,
        }
    }

    fn capability(&self, route: &Route, port: u16, protocol: Protocol) -> Token {
        let now = Timestamp::from_unix_secs(now_secs());
        CapabilityBuilder::service_port(&self.keys, route, ServicePort { port, protocol })
            .times(now, now.plus_secs(60))
            .sign(&self.keys)
    }

    /// Asks for a tunnel with `token` (if any) to `port`/`protocol` of `sandbox`: the
    /// status and, for 101, the open stream.
    fn open_as(
        &self,
        sandbox: &str,
        token: Option<&Token>,
        port: u16,
        protocol: &str,
    ) -> (u16, String, TcpStream) {
        let mut s = TcpStream::connect(self.addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let auth = token
            .map(|t| format!("Authorization: SpaceCap {}\r\n", t.to_text()))
            .unwrap_or_default();
        write!(
            s,
            "POST /v1/sandboxes/{sandbox}/netgtw HTTP/1.1\r\nHost: {}\r\n{auth}Upgrade: space-netgtw\r\nConnection: Upgrade\r\nspace-port: {port}\r\nspace-protocol: {protocol}\r\nContent-Length: 0\r\n\r\n",
            self.addr
        )
        .unwrap();
        let (status, _, body) = read_response(&mut s);
        (status, body, s)
    }

    fn open(&self, port: u16, protocol: Protocol) -> (u16, String, TcpStream) {
        let token = self.capability(&self.route, port, protocol);
        self.open_as(
            &self.route.sandbox.to_string(),
            Some(&token),
            port,
            protocol.as_str(),
        )
    }

    fn apply(&self, update: Update) {
        let w = Arc::clone(&self.worker);
        self.runtime
            .block_on(crate::daemon::updates::apply(&w, Vec::new(), update))
            .expect("update applies");
    }
}

impl Drop for Gateway {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        let _ = self.bridge_stand_in.kill();
        let _ = self.bridge_stand_in.wait();
        let _ = &self.data;
    }
}

/// Reads one HTTP/1.1 answer (head, then a `Content-Length` body): status, the head's
/// lines, and the body as text.
fn read_response(s: &mut TcpStream) -> (u16, Vec<String>, String) {
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        match s.read(&mut byte) {
            Ok(1) => head.push(byte[0]),
            _ => return (0, Vec::new(), String::new()),
        }
        assert!(head.len() < 65536, "head too long");
    }
    let text = String::from_utf8_lossy(&head).into_owned();
    let lines: Vec<String> = text.lines().map(str::to_owned).collect();
    let status = lines[0]
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let len = lines
        .iter()
        .find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.eq_ignore_ascii_case("content-length")
                .then(|| v.trim().parse::<usize>().ok())?
        })
        .unwrap_or(0);
    let mut body = vec![0u8; len];
    s.read_exact(&mut body).unwrap();
    (status, lines, String::from_utf8_lossy(&body).into_owned())
}

fn get(s: &mut TcpStream, path: &str, host: &str, extra: &str) -> (u16, Vec<String>, String) {
    write!(s, "GET {path} HTTP/1.1\r\nHost: {host}\r\n{extra}\r\n").unwrap();
    read_response(s)
}

fn closed(s: &mut TcpStream, within: Duration) -> bool {
    s.set_read_timeout(Some(within)).unwrap();
    let mut buf = [0u8; 64];
    matches!(s.read(&mut buf), Ok(0) | Err(_))
        && !matches!(s.read(&mut buf), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock)
}

fn free_port() -> (TcpListener, u16) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    (l, port)
}

fn reason(body: &str) -> String {
    serde_json::from_str::<serde_json::Value>(body).unwrap_or_default()["reason"]
        .as_str()
        .unwrap_or_default()
        .to_owned()
}

#[test]
fn a_tunnel_reaches_the_port_inside_the_sandboxs_namespace_never_the_hosts() {
    if !can_enter_namespaces() {
        return;
    }
    // The host listens on both ports; inside, the sandbox serves the first only.
    let (host_a, port_a) = free_port();
    let (host_b, port_b) = free_port();
    host_a.set_nonblocking(true).unwrap();
    host_b.set_nonblocking(true).unwrap();
    let echo = free_port().1;
    let g = Gateway::start(
        port_a,
        echo,
        &[(port_a, Protocol::Http), (port_b, Protocol::Http)],
    );
    let (status, _, mut tunnel) = g.open(port_a, Protocol::Http);
    assert_eq!(status, 101);
    let (status, _, body) = get(&mut tunnel, "/hello", "x", "");
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("\"where\": \"sandbox\""), "{body}");
    // Nothing listens on the second port inside: refused, though the host's port is open.
    let (status, body, _) = g.open(port_b, Protocol::Http);
    assert_eq!(status, 502, "{body}");
    assert!(body.contains("port_closed"), "{body}");
    for host in [&host_a, &host_b] {
        assert!(
            host.accept().is_err(),
            "a connection reached the host's own listener"
        );
    }
}

/// What is presented, and the refusal it must get: what, the capability, the port
/// and protocol asked, the status and the reason.
type Case = (
    &'static str,
    Option<Token>,
    u16,
    &'static str,
    u16,
    &'static str,
);

#[test]
fn a_capability_for_another_port_protocol_purpose_or_sandbox_is_denied_before_any_connection() {
    if !can_enter_namespaces() {
        return;
    }
    let (http, echo) = (free_port().1, free_port().1);
    let g = Gateway::start(http, echo, &[(http, Protocol::Http), (echo, Protocol::Tcp)]);
    let sandbox = g.route.sandbox.to_string();
    let for_http = g.capability(&g.route, http, Protocol::Http);
    let cases: Vec<Case> = vec![
        (
            "a token for one port at another",
            Some(for_http.clone()),
            echo,
            "http",
            403,
            DenyReason::WrongPort.as_str(),
        ),
        (
            "an http token for tcp",
            Some(for_http.clone()),
            http,
            "tcp",
            403,
            DenyReason::WrongProtocol.as_str(),
        ),
        (
            "a port not exposed",
            Some(g.capability(&g.route, http + 1, Protocol::Http)),
            http + 1,
            "http",
            403,
            DenyReason::PortNotExposed.as_str(),
        ),
        (
            "a tcp port asked as http",
            Some(g.capability(&g.route, echo, Protocol::Http)),
            echo,
            "http",
            403,
            DenyReason::PortNotExposed.as_str(),
        ),
        (
            "a control capability",
            Some({
                let now = Timestamp::from_unix_secs(now_secs());
                CapabilityBuilder::control(&g.keys, &g.route)
                    .times(now, now.plus_secs(60))
                    .sign(&g.keys)
            }),
            http,
            "http",
            403,
            DenyReason::WrongPurpose.as_str(),
        ),
        ("no capability", None, http, "http", 401, ""),
    ];
    for (what, token, port, protocol, want, why) in cases {
        let (status, body, _) = g.open_as(&sandbox, token.as_ref(), port, protocol);
        assert_eq!(status, want, "{what}: {body}");
        assert_eq!(reason(&body), why, "{what}: {body}");
    }
    // Another sandbox's capability on this sandbox's path.
    let other = space_testkit::route(2, 1, ME);
    let theirs = g.capability(&other, http, Protocol::Http);
    let (status, body, _) = g.open_as(&sandbox, Some(&theirs), http, "http");
    assert_eq!(
        (status, reason(&body).as_str()),
        (403, DenyReason::SandboxMismatch.as_str()),
        "{body}"
    );
    let metrics = g.worker.metrics.render(Vec::new(), 0);
    assert!(
        metrics.contains(&format!("space_worker_port_refusals_total{{sandbox=\"{sandbox}\",port=\"{echo}\",reason=\"wrong_port\"}} 1")),
        "{metrics}"
    );
}

#[test]
fn every_request_on_an_http_tunnel_is_checked() {
    if !can_enter_namespaces() {
        return;
    }
    let (http, echo) = (free_port().1, free_port().1);
    let g = Gateway::start(http, echo, &[(http, Protocol::Http)]);
    let me = g.route.sandbox;
    let other = space_testkit::route(2, 1, ME).sandbox;
    let own_host = format!("{http}-{me}.localhost:7070");
    // Several requests on one tunnel (the server keeps the connection alive).
    let (status, _, mut t) = g.open(http, Protocol::Http);
    assert_eq!(status, 101);
    for i in 0..3 {
        let (status, _, body) = get(&mut t, &format!("/{i}"), &own_host, "");
        assert_eq!(status, 200, "{body}");
        assert!(body.contains(&format!("\"path\": \"/{i}\"")), "{body}");
    }
    // An upgrade to anything but WebSocket: refused, and the tunnel closes.
    let (status, _, body) = get(
        &mut t,
        "/",
        &own_host,
        "Connection: Upgrade\r\nUpgrade: h2c\r\n",
    );
    assert_eq!(status, 403, "{body}");
    assert!(body.contains("wrong_protocol"), "{body}");
    assert!(
        closed(&mut t, Duration::from_secs(2)),
        "the tunnel stayed open"
    );
    // A request naming another sandbox — by Host or by header — or another port.
    for extra in [
        (format!("{http}-{other}.localhost:7070"), String::new()),
        (own_host.clone(), format!("X-Space-Sandbox: {other}\r\n")),
        (own_host.clone(), format!("X-Space-Port: {}\r\n", http + 1)),
        (format!("{}-{me}.localhost", http + 1), String::new()),
    ] {
        let (status, _, mut t) = g.open(http, Protocol::Http);
        assert_eq!(status, 101);
        let (status, _, body) = get(&mut t, "/", &extra.0, &extra.1);
        assert_eq!(status, 421, "{extra:?}: {body}");
        assert!(body.contains("misdirected"), "{body}");
        assert!(
            closed(&mut t, Duration::from_secs(2)),
            "{extra:?}: the tunnel stayed open"
        );
    }
    // A WebSocket upgrade the server does not accept (400): answered, then closed.
    let (status, _, mut t) = g.open(http, Protocol::Http);
    assert_eq!(status, 101);
    let ws = "Connection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n";
    let (status, _, body) = get(&mut t, "/nows", &own_host, ws);
    assert_eq!(status, 400, "{body}");
    assert!(
        closed(&mut t, Duration::from_secs(2)),
        "a refused upgrade left the tunnel open"
    );
}

#[test]
fn a_tunnel_ends_when_its_port_is_closed_or_its_execution_retired() {
    if !can_enter_namespaces() {
        return;
    }
    let (http, echo) = (free_port().1, free_port().1);
    let g = Gateway::start(http, echo, &[(http, Protocol::Http), (echo, Protocol::Tcp)]);
    let (status, _, mut tcp) = g.open(echo, Protocol::Tcp);
    assert_eq!(status, 101);
    tcp.write_all(b"ping").unwrap();
    let mut buf = [0u8; 4];
    tcp.read_exact(&mut buf).unwrap();
    assert_eq!(&buf, b"ping");
    let (status, _, mut web) = g.open(http, Protocol::Http);
    assert_eq!(status, 101);
    // The tcp port is no longer exposed: its tunnel ends, the http one goes on.
    g.apply(Update::Ports {
        sandbox: g.route.sandbox,
        generation: g.route.execution.generation,
        execution_id: g.route.execution.id,
        ports: vec![ExposedPort {
            port: http,
            protocol: Protocol::Http,
        }],
    });
    let t0 = Instant::now();
    assert!(
        closed(&mut tcp, Duration::from_secs(2)),
        "the closed port's tunnel stayed open"
    );
    assert!(t0.elapsed() < Duration::from_secs(1));
    let host = format!("{http}-{}.localhost", g.route.sandbox);
    assert_eq!(get(&mut web, "/", &host, "").0, 200);
    let (status, body, _) = g.open(echo, Protocol::Tcp);
    assert_eq!(
        (status, reason(&body).as_str()),
        (403, "port_not_exposed"),
        "{body}"
    );
    // Retired (what a retirement does first: the tombstone replaces the record, which
    // ends the execution's lease; tearing the processes down comes after): the http
    // tunnel ends, and a new one is a stale route.
    let mut tomb = g.record.clone();
    tomb.state = RecordState::Retired;
    g.worker.put_slot(tomb, None);
    assert!(
        closed(&mut web, Duration::from_secs(2)),
        "the retired execution's tunnel stayed open"
    );
    let (status, body, _) = g.open(http, Protocol::Http);
    assert_eq!(status, 421, "{body}");
}

#[test]
fn an_activation_only_change_keeps_established_tunnels_and_new_ones_need_the_new_activation() {
    if !can_enter_namespaces() {
        return;
    }
    let (http, echo) = (free_port().1, free_port().1);
    let g = Gateway::start(http, echo, &[(echo, Protocol::Tcp)]);
    let (status, _, mut tcp) = g.open(echo, Protocol::Tcp);
    assert_eq!(status, 101);
    // The same execution, a new activation attempt (a VMM restarted in place).
    let mut next = g.record.clone();
    next.activation += 1;
    g.worker.put_slot(
        next,
        g.worker.slot(&g.route.sandbox).and_then(|s| s.pool.clone()),
    );
    tcp.write_all(b"still").unwrap();
    let mut buf = [0u8; 5];
    tcp.read_exact(&mut buf).unwrap();
    assert_eq!(
        &buf, b"still",
        "an established tunnel ended on an activation change"
    );
    let (status, body, _) = g.open(echo, Protocol::Tcp);
    assert_eq!(
        (status, reason(&body).as_str()),
        (421, "stale_activation"),
        "{body}"
    );
    let mut route = g.route.clone();
    route.placement.activation += 1;
    let token = g.capability(&route, echo, Protocol::Tcp);
    let (status, body, _) = g.open_as(&g.route.sandbox.to_string(), Some(&token), echo, "tcp");
    assert_eq!(status, 101, "{body}");
}

/// `Update::Network` is an update of one execution's trusted state: one naming another
/// execution is refused, and so is a policy the worker cannot put in force (egress on
/// a worker without it); either way the record keeps the policy it had.
#[test]
fn a_network_update_for_another_execution_or_one_not_in_force_changes_nothing() {
    if !can_enter_namespaces() {
        return;
    }
    let (http, echo) = (free_port().1, free_port().1);
    let g = Gateway::start(http, echo, &[(http, Protocol::Http)]);
    let egress = space_proto::api::Policy::parse(
        space_proto::api::NetworkMode::Egress,
        &["pypi.org"],
        &[] as &[&str],
    )
    .unwrap();
    let try_apply = |update: Update| {
        let w = Arc::clone(&g.worker);
        g.runtime
            .block_on(crate::daemon::updates::apply(&w, Vec::new(), update))
    };
    let stale = Update::Network {
        sandbox: g.route.sandbox,
        generation: g.route.execution.generation,
        execution_id: space_identity::ExecutionId::from_bytes([0xee; 16]),
        network: egress.clone(),
    };
    assert!(
        try_apply(stale).is_err(),
        "an update of another execution was taken"
    );
    // This worker has no egress (none was started): the policy is refused, not recorded.
    let current = Update::Network {
        sandbox: g.route.sandbox,
        generation: g.route.execution.generation,
        execution_id: g.route.execution.id,
        network: egress,
    };
    assert!(
        try_apply(current).is_err(),
        "a policy not in force was taken"
    );
    let slot = g.worker.slot(&g.route.sandbox).expect("the slot");
    assert_eq!(slot.record.network, space_proto::api::Policy::none());
    let kept = g
        .worker
        .records
        .get(&g.route.sandbox, g.route.execution.generation)
        .unwrap()
        .expect("the record");
    assert_eq!(kept.network, space_proto::api::Policy::none());
}
