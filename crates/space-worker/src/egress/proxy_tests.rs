//! The proxy and the resolver against the real kernel: a sandbox (a python client in a
//! namespace of its own, with a real pair and the real table redirecting its TCP 80,
//! 443 and DNS to [`Services`] bound on 0.0.0.0 here), two test hosts in namespaces of
//! their own (TEST-NET-2 addresses routed only into them) serving HTTP and TLS with a
//! certificate of a test CA made with `openssl`, and an upstream DNS server this test
//! runs on 127.0.0.1. No traffic goes anywhere else. Needs root, `ip`, `nft`,
//! `nsenter`, `unshare`, `python3` and `openssl`; skipped with a message otherwise.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use space_egress::dns::{self, Rcode};
use space_egress::{NAME_NOT_ALLOWED, Policy};
use space_identity::SandboxId;

use super::services::{Services, ServicesConfig};
use super::tenant::{CounterSnapshot, PairDirectory, Tenant};
use super::testnet::{
    Peer, Sandbox, Scope, TableGuard, TestHost, apply, global, policy, require_tools, sandbox_with,
};

/// A test host: `name` answers HTTP on 80 (`<name> <Host> <path>`) and TLS on 443
/// (each line `L` answered `<name> L`) with the certificate `argv[2]`/`argv[3]`.
const HOST: &str = r#"
import socket, socketserver, ssl, sys, threading
from http.server import BaseHTTPRequestHandler
name, cert, key = sys.argv[1:4]
class H(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def do_GET(self):
        if self.path == "/ws":
            import base64, hashlib
            key = self.headers.get("Sec-WebSocket-Key", "")
            accept = base64.b64encode(hashlib.sha1(
                (key + "258EAFA5-E914-47DA-95CA-C5AB0DC85B11").encode()).digest()).decode()
            self.send_response(101)
            self.send_header("Upgrade", "websocket")
            self.send_header("Connection", "Upgrade")
            self.send_header("Sec-WebSocket-Accept", accept)
            self.end_headers()
            self.wfile.flush()
            # Held open until the client goes.
            while self.rfile.read(1):
                pass
            self.close_connection = True
            return
        body = ("%s %s %s\n" % (name, self.headers.get("Host"), self.path)).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *a):
        pass
class S(socketserver.ThreadingTCPServer):
    allow_reuse_address = True
    daemon_threads = True
http = S(("0.0.0.0", 80), H)
threading.Thread(target=http.serve_forever, daemon=True).start()
ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
ctx.load_cert_chain(cert, key)
tls = socket.socket()
tls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
tls.bind(("0.0.0.0", 443))
tls.listen(16)
def serve(c):
    try:
        s = ctx.wrap_socket(c, server_side=True)
        f = s.makefile("rwb")
        for line in f:
            f.write(("%s %s\n" % (name, line.decode().strip())).encode())
            f.flush()
    except Exception:
        pass
    finally:
        c.close()
def accept():
    while True:
        c, _ = tls.accept()
        threading.Thread(target=serve, args=(c,), daemon=True).start()
threading.Thread(target=accept, daemon=True).start()
print("ready 80,443", flush=True)
sys.stdin.read()
"#;

/// The sandbox's client (`argv[1]`: the CA file). One line per command:
/// `http ADDR H1,H2…` (one connection to ADDR:80, one request per Host),
/// `tls ADDR SNI` (`-`: no SNI), `tlsopen ADDR SNI` / `tlsping` (a kept connection),
/// `dns GW NAME TYPE` / `dnstcp GW NAME TYPE` (a hand-built query to GW:53).
const CLIENT: &str = r#"
import random, socket, ssl, struct, sys
ca = sys.argv[1]
kept = None
upgraded = []
def wsopen(addr, host):
    s = socket.create_connection((addr, 80), timeout=5)
    s.sendall(("GET /ws HTTP/1.1\r\nHost: %s\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n"
               "Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n"
               % host).encode())
    f = s.makefile("rb")
    line = f.readline()
    if not line:
        s.close()
        return "closed"
    while f.readline() not in (b"\r\n", b""):
        pass
    upgraded.append((s, f))
    return line.split()[1].decode()
def http(addr, hosts):
    s = socket.create_connection((addr, 80), timeout=5)
    f = s.makefile("rb")
    out = []
    for h in hosts:
        s.sendall(("GET /p HTTP/1.1\r\nHost: %s\r\n\r\n" % h).encode())
        line = f.readline()
        if not line:
            out.append("closed")
            break
        status = line.split()[1].decode()
        length = 0
        while True:
            l = f.readline()
            if l in (b"\r\n", b""):
                break
            k, _, v = l.decode().partition(":")
            if k.strip().lower() == "content-length":
                length = int(v)
        out.append(status + " " + f.read(length).decode().strip())
    s.close()
    return " | ".join(out)
def tls_connect(addr, sni):
    ctx = ssl.create_default_context(cafile=ca)
    if sni == "-":
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
        sni = None
    raw = socket.create_connection((addr, 443), timeout=5)
    return ctx.wrap_socket(raw, server_hostname=sni)
def ping(s):
    s.sendall(b"ping\n")
    data = b""
    while not data.endswith(b"\n"):
        chunk = s.recv(100)
        if not chunk:
            return "closed"
        data += chunk
    return "ok " + data.decode().strip()
def recvn(s, n):
    data = b""
    while len(data) < n:
        chunk = s.recv(n - len(data))
        if not chunk:
            raise EOFError("closed")
        data += chunk
    return data
def dns(gw, name, qtype, tcp):
    qid = random.randrange(65536)
    q = struct.pack(">HHHHHH", qid, 0x0100, 1, 0, 0, 0)
    for label in name.split("."):
        q += bytes([len(label)]) + label.encode()
    q += b"\0" + struct.pack(">HH", int(qtype), 1)
    if tcp:
        s = socket.create_connection((gw, 53), timeout=3)
        s.sendall(struct.pack(">H", len(q)) + q)
        r = recvn(s, struct.unpack(">H", recvn(s, 2))[0])
    else:
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        s.settimeout(3)
        s.sendto(q, (gw, 53))
        r = s.recv(4096)
    s.close()
    rid, flags, qd, an = struct.unpack(">HHHH", r[:8])
    if rid != qid:
        return "wrong id"
    at = 12
    while r[at] != 0:
        at += r[at] + 1
    at += 5
    addrs = []
    for _ in range(an):
        if r[at] & 0xc0 == 0xc0:
            at += 2
        else:
            while r[at] != 0:
                at += r[at] + 1
            at += 1
        rtype, _, ttl, ln = struct.unpack(">HHIH", r[at:at + 10])
        at += 10
        if rtype == 1:
            addrs.append(socket.inet_ntoa(r[at:at + 4]))
        at += ln
    return "rcode %d %s" % (flags & 0xf, ",".join(addrs) or "-")
print("ready", flush=True)
for line in sys.stdin:
    w = line.split()
    try:
        if w[0] == "http":
            out = http(w[1], w[2].split(","))
        elif w[0] == "tls":
            s = tls_connect(w[1], w[2])
            out = ping(s)
            s.close()
        elif w[0] == "tlsopen":
            kept = tls_connect(w[1], w[2])
            out = ping(kept)
        elif w[0] == "tlsping":
            out = ping(kept)
        elif w[0] == "wsopen":
            out = wsopen(w[1], w[2])
        elif w[0] == "wsclose":
            s, f = upgraded.pop(0)
            f.close()
            s.close()
            out = "closed one"
        elif w[0] in ("dns", "dnstcp"):
            out = dns(w[1], w[2], w[3], w[0] == "dnstcp")
        else:
            out = "unknown command"
    except Exception as e:
        out = "error %s %s" % (type(e).__name__, e)
    print(out.replace("\n", " "), flush=True)
"#;

fn openssl(dir: &std::path::Path, args: &[&str]) {
    let out = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A test CA and a certificate it signed for the test names: (dir, ca, cert, key).
fn test_ca() -> (tempfile::TempDir, String, String, String) {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1"];
    let mut ca = vec!["req", "-x509", "-nodes", "-days", "2"];
    ca.extend(ec);
    ca.extend([
        "-keyout",
        "ca.key",
        "-out",
        "ca.pem",
        "-subj",
        "/CN=space egress test CA",
        "-addext",
        "keyUsage=critical,keyCertSign,cRLSign",
    ]);
    openssl(d, &ca);
    let mut csr = vec!["req", "-nodes"];
    csr.extend(ec);
    csr.extend([
        "-keyout",
        "host.key",
        "-out",
        "host.csr",
        "-subj",
        "/CN=a.test",
    ]);
    openssl(d, &csr);
    std::fs::write(
        d.join("ext"),
        "subjectAltName=DNS:a.test,DNS:b.test,DNS:evil.test,DNS:loop.test\n\
         basicConstraints=CA:FALSE\nkeyUsage=digitalSignature\nextendedKeyUsage=serverAuth\n\
         subjectKeyIdentifier=hash\nauthorityKeyIdentifier=keyid\n",
    )
    .unwrap();
    openssl(
        d,
        &[
            "x509",
            "-req",
            "-in",
            "host.csr",
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-days",
            "2",
            "-extfile",
            "ext",
            "-out",
            "host.pem",
        ],
    );
    let path = |f: &str| d.join(f).to_string_lossy().into_owned();
    let (ca, cert, key) = (path("ca.pem"), path("host.pem"), path("host.key"));
    (dir, ca, cert, key)
}

/// The upstream DNS server: `names` → one `A` record each, NXDOMAIN otherwise; the
/// questions it got are counted.
async fn upstream_dns(names: HashMap<String, Ipv4Addr>) -> (SocketAddr, Arc<AtomicUsize>) {
    let socket = tokio::net::UdpSocket::bind("127.0.0.1:0").await.unwrap();
    let addr = socket.local_addr().unwrap();
    let seen = Arc::new(AtomicUsize::new(0));
    let counter = Arc::clone(&seen);
    tokio::spawn(async move {
        let mut buf = [0u8; 512];
        while let Ok((n, from)) = socket.recv_from(&mut buf).await {
            counter.fetch_add(1, Ordering::SeqCst);
            let Ok(q) = dns::parse_query(&buf[..n]) else {
                continue;
            };
            let reply = match names.get(&q.name) {
                Some(&a) => dns::answer(&q, &[IpAddr::V4(a)], 60),
                None => dns::reply_without_records(&q, Rcode::NxDomain),
            };
            let _ = socket.send_to(&reply, from).await;
        }
    });
    (addr, seen)
}

/// One sandbox, two test hosts (`a.test` → A, `b.test` and `evil.test` → B,
/// `loop.test` → 127.0.0.1), the services and the table. Dropped in field order: the
/// services stop before the runtime goes.
struct World {
    services: Services,
    tenant: Arc<Tenant>,
    questions: Arc<AtomicUsize>,
    table: Option<TableGuard>,
    sandbox: Sandbox,
    a: TestHost,
    b: TestHost,
    _scope: Scope,
    _ca: tempfile::TempDir,
    _rt: tokio::runtime::Runtime,
}

impl World {
    fn new(test: u8, policy: Policy) -> World {
        Self::tuned(test, policy, |_| {})
    }

    /// [`World::new`] with the services' configuration changed by `tune`.
    fn tuned(test: u8, policy: Policy, tune: impl FnOnce(&mut ServicesConfig)) -> World {
        let scope = Scope::new(test);
        let (ca_dir, ca, cert, key) = test_ca();
        let host = |slot: u8, name: &str| {
            let peer = Peer::start_script(true, HOST, &[name, &cert, &key]);
            scope.test_host_with(slot, peer)
        };
        let (a, b) = (host(0, "hostA"), host(1, "hostB"));
        let sandbox = sandbox_with(&scope, 0, Peer::start_script(true, CLIENT, &[&ca]));
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let names = HashMap::from([
            ("a.test".to_owned(), a.addr),
            ("b.test".to_owned(), b.addr),
            ("evil.test".to_owned(), b.addr),
            ("loop.test".to_owned(), Ipv4Addr::LOCALHOST),
        ]);
        let (upstream, questions) = rt.block_on(upstream_dns(names));
        let g = global(&scope);
        let tenant = Arc::new(Tenant::new(
            SandboxId::from_bytes([test; 16]),
            policy.clone(),
        ));
        let directory = PairDirectory::new();
        directory.insert(
            sandbox.pair.sandbox_addr(),
            sandbox.pair.host_addr(),
            Arc::clone(&tenant),
        );
        let mut config = ServicesConfig::new(vec![upstream], Arc::new(g.clone()));
        tune(&mut config);
        let services = rt
            .block_on(Services::start(config, Arc::new(directory)))
            .unwrap();
        let table = apply(&scope, &g, services.ports(), &[(&sandbox, &policy)]);
        World {
            services,
            tenant,
            questions,
            table: Some(table),
            sandbox,
            a,
            b,
            _scope: scope,
            _ca: ca_dir,
            _rt: rt,
        }
    }

    fn ask(&mut self, line: &str) -> String {
        self.sandbox.peer.ask(line)
    }

    /// The counters once `settled` holds of them (within 2 s): the proxy counts a write
    /// just after the kernel took it, which the client can see first.
    fn counters_once(&self, settled: impl Fn(&CounterSnapshot) -> bool) -> CounterSnapshot {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(2);
        loop {
            let c = self.tenant.counters();
            if settled(&c) || std::time::Instant::now() > deadline {
                return c;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
    }

    fn gateway(&self) -> Ipv4Addr {
        self.sandbox.pair.host_addr()
    }

    /// The (via, target, layer, rule) of the refusals, oldest first.
    fn refusals(&self) -> Vec<(String, String, String, String)> {
        let mut r: Vec<_> = self
            .tenant
            .refusals()
            .into_iter()
            .map(|r| (r.via.into(), r.target, r.layer.into(), r.rule))
            .collect();
        r.reverse();
        r
    }
}

fn refusal(via: &str, target: &str, layer: &str, rule: &str) -> (String, String, String, String) {
    (via.into(), target.into(), layer.into(), rule.into())
}

#[test]
fn an_allowed_name_is_reached_by_name_over_http() {
    require_tools!("openssl");
    let mut w = World::new(4, policy(&["a.test"], &[]));
    let gw = w.gateway();
    let a = w.a.addr;
    assert_eq!(w.ask(&format!("dns {gw} a.test 1")), format!("rcode 0 {a}"));
    assert_eq!(
        w.ask(&format!("http {a} a.test")),
        "200 hostA a.test /p",
        "the request reaches A with its Host and path"
    );
    let c = w.counters_once(|c| c.bytes_in > 20);
    assert_eq!((c.http_connections, c.dns_questions), (1, 1));
    assert!(c.bytes_out > 20 && c.bytes_in > 20, "{c:?}");
    assert!(w.refusals().is_empty());
}

#[test]
fn an_allowed_name_is_reached_over_tls_by_its_sni_with_a_test_ca() {
    require_tools!("openssl");
    let mut w = World::new(5, policy(&["a.test"], &[]));
    let a = w.a.addr;
    // The certificate is checked against the test CA and the name: the TLS session is
    // the test host's own, end to end.
    assert_eq!(w.ask(&format!("tls {a} a.test")), "ok hostA ping");
    assert!(w.ask(&format!("tls {a} -")).starts_with("error"));
    assert_eq!(
        w.refusals(),
        [refusal(
            "tls",
            &format!("{a}:443"),
            "proxy",
            super::proxy::NO_SNI
        )]
    );
    let c = w.counters_once(|c| c.bytes_in > 100);
    assert_eq!(c.tls_connections, 2);
    assert!(c.bytes_out > 100 && c.bytes_in > 100, "{c:?}");
}

#[test]
fn a_denied_name_is_refused_though_its_address_is_allowed() {
    require_tools!("openssl");
    let mut w = World::new(6, policy(&["198.51.100.0/24", "a.test"], &["evil.test"]));
    let b = w.b.addr;
    assert_eq!(
        w.ask(&format!("http {b} evil.test")),
        "403 space egress: evil.test (evil.test)"
    );
    assert_eq!(
        w.ask(&format!("http {b} b.test")),
        format!("403 space egress: {NAME_NOT_ALLOWED} (b.test)")
    );
    assert!(w.ask(&format!("tls {b} evil.test")).starts_with("error"));
    assert_eq!(
        w.refusals(),
        [
            refusal("http", "evil.test", "sandbox", "evil.test"),
            refusal("http", "b.test", "sandbox", NAME_NOT_ALLOWED),
            refusal("tls", "evil.test", "sandbox", "evil.test"),
        ]
    );
    // The address itself is allowed: by its literal, B answers.
    assert_eq!(w.ask(&format!("http {b} {b}")), format!("200 hostB {b} /p"));
}

#[test]
fn etc_hosts_spoofing_inside_the_sandbox_changes_nothing() {
    require_tools!("openssl");
    let mut w = World::new(7, policy(&["a.test"], &["evil.test"]));
    let (a, b) = (w.a.addr, w.b.addr);
    // The sandbox believes a.test is B (its /etc/hosts says so) and connects there: the
    // platform resolved a.test itself, to A.
    assert_eq!(w.ask(&format!("http {b} a.test")), "200 hostA a.test /p");
    assert_eq!(w.ask(&format!("tls {b} a.test")), "ok hostA ping");
    // …and believes evil.test is A, an address it reached before: still refused.
    assert!(
        w.ask(&format!("http {a} evil.test"))
            .starts_with("403 space egress: evil.test")
    );
    assert!(w.ask(&format!("tls {a} evil.test")).starts_with("error"));
}

#[test]
fn dns_for_a_denied_name_fails() {
    require_tools!("openssl");
    let mut w = World::new(8, policy(&["a.test"], &["evil.test"]));
    let (gw, a) = (w.gateway(), w.a.addr);
    assert_eq!(w.ask(&format!("dns {gw} evil.test 1")), "rcode 5 -");
    assert_eq!(w.ask(&format!("dns {gw} b.test 1")), "rcode 5 -");
    assert_eq!(w.ask(&format!("dnstcp {gw} evil.test 1")), "rcode 5 -");
    assert_eq!(w.ask(&format!("dns {gw} a.test 1")), format!("rcode 0 {a}"));
    assert_eq!(
        w.ask(&format!("dnstcp {gw} a.test 1")),
        format!("rcode 0 {a}")
    );
    assert_eq!(w.ask(&format!("dns {gw} a.test 28")), "rcode 0 -", "AAAA");
    assert_eq!(w.ask(&format!("dns {gw} a.test 15")), "rcode 4 -", "MX");
    // Whatever address the sandbox sends its question to, the platform answers.
    assert_eq!(w.ask("dns 198.51.100.250 a.test 1"), format!("rcode 0 {a}"));
    assert_eq!(
        w.refusals(),
        [
            refusal("dns", "evil.test", "sandbox", "evil.test"),
            refusal("dns", "b.test", "sandbox", NAME_NOT_ALLOWED),
            refusal("dns", "evil.test", "sandbox", "evil.test"),
        ]
    );
    assert_eq!(
        w.questions.load(Ordering::SeqCst),
        1,
        "refused names never reach the upstream, a.test is cached"
    );
}

#[test]
fn every_request_on_a_kept_alive_connection_is_judged() {
    require_tools!("openssl");
    let mut w = World::new(9, policy(&["a.test", "b.test"], &["evil.test"]));
    let a = w.a.addr;
    assert_eq!(
        w.ask(&format!("http {a} a.test,evil.test,b.test,a.test")),
        "200 hostA a.test /p | 403 space egress: evil.test (evil.test) | \
         200 hostB b.test /p | 200 hostA a.test /p"
    );
    assert_eq!(w.tenant.counters().http_connections, 1, "one connection");
}

#[test]
fn a_name_resolving_to_a_globally_denied_address_is_refused() {
    require_tools!("openssl");
    let mut w = World::new(10, policy(&[], &[]));
    let a = w.a.addr;
    let loopback = "127.0.0.0/8 (loopback)";
    assert_eq!(
        w.ask(&format!("http {a} loop.test")),
        format!("403 space egress: {loopback} (loop.test)")
    );
    assert!(w.ask(&format!("tls {a} loop.test")).starts_with("error"));
    assert_eq!(
        w.refusals(),
        [
            refusal("http", "loop.test", "global", loopback),
            refusal("tls", "loop.test", "global", loopback),
        ]
    );
    assert_eq!(w.ask(&format!("http {a} a.test")), "200 hostA a.test /p");
}

#[test]
fn a_policy_change_takes_effect_for_new_connections() {
    require_tools!("openssl");
    let mut w = World::new(11, policy(&["a.test"], &[]));
    let (gw, a, b) = (w.gateway(), w.a.addr, w.b.addr);
    assert_eq!(w.ask(&format!("tlsopen {a} a.test")), "ok hostA ping");
    assert_eq!(w.ask(&format!("http {a} a.test")), "200 hostA a.test /p");

    w.tenant.set_policy(policy(&["b.test"], &[]));
    assert_eq!(
        w.ask("tlsping"),
        "ok hostA ping",
        "the spliced one stays up"
    );
    assert!(w.ask(&format!("tls {a} a.test")).starts_with("error"));
    assert_eq!(
        w.ask(&format!("http {a} a.test")),
        format!("403 space egress: {NAME_NOT_ALLOWED} (a.test)")
    );
    assert_eq!(w.ask(&format!("dns {gw} a.test 1")), "rcode 5 -");
    assert_eq!(w.ask(&format!("tls {a} b.test")), "ok hostB ping");
    assert_eq!(w.ask(&format!("dns {gw} b.test 1")), format!("rcode 0 {b}"));
}

#[test]
fn an_unknown_peer_gets_nothing() {
    use std::io::{Read, Write};
    require_tools!("openssl");
    let mut w = World::new(12, policy(&[], &[]));
    // The table drops these ports from anything but a sandbox link; without it, the
    // services themselves must turn strangers away.
    drop(w.table.take());
    let ports = w.services.ports();
    let request = b"GET / HTTP/1.1\r\nHost: a.test\r\n\r\n";
    // From the host's loopback, and from the host to the sandbox's own gateway (the
    // right local address, a peer that is not the sandbox).
    for to in [Ipv4Addr::LOCALHOST, w.gateway()] {
        for port in [ports.http, ports.tls, ports.dns] {
            let mut c = std::net::TcpStream::connect_timeout(
                &SocketAddr::from((to, port)),
                std::time::Duration::from_secs(3),
            )
            .unwrap_or_else(|e| panic!("{to}:{port}: {e}"));
            c.set_read_timeout(Some(std::time::Duration::from_secs(3)))
                .unwrap();
            let _ = c.write_all(request);
            let mut got = Vec::new();
            let n = c.read_to_end(&mut got);
            assert!(
                matches!(n, Ok(0)) || n.is_err(),
                "{to}:{port} answered {got:?}"
            );
            assert!(got.is_empty(), "{to}:{port} answered {got:?}");
        }
        let udp = std::net::UdpSocket::bind("0.0.0.0:0").unwrap();
        udp.set_read_timeout(Some(std::time::Duration::from_millis(500)))
            .unwrap();
        let q = dns::build_query(1, "a.test", dns::TYPE_A).unwrap();
        udp.send_to(&q, (to, ports.dns)).unwrap();
        let mut buf = [0u8; 512];
        assert!(udp.recv(&mut buf).is_err(), "{to}: a DNS answer");
    }
    assert_eq!(w.questions.load(Ordering::SeqCst), 0, "nothing forwarded");
    assert_eq!(w.services.unknown_peers(), 8);
    assert_eq!(w.tenant.counters(), Default::default());
}

#[test]
fn a_websocket_upgrade_keeps_its_place_under_the_tenants_connection_limit() {
    require_tools!("openssl");
    let mut w = World::tuned(13, policy(&["a.test"], &[]), |c| {
        c.limits.connections_per_tenant = 2;
    });
    let a = w.a.addr;
    assert_eq!(w.ask(&format!("wsopen {a} a.test")), "101");
    assert_eq!(w.ask(&format!("wsopen {a} a.test")), "101");
    // Both upgraded streams outlive their HTTP connections: they still count, so a
    // third connection of any kind is turned away.
    let turned_away = |answer: String| {
        assert!(
            answer == "closed" || answer.starts_with("error ConnectionResetError"),
            "a connection past the limit was served: {answer}"
        );
    };
    turned_away(w.ask(&format!("wsopen {a} a.test")));
    turned_away(w.ask(&format!("http {a} a.test")));
    // Once one stream ends, its place is free again.
    assert_eq!(w.ask("wsclose"), "closed one");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    loop {
        let answer = w.ask(&format!("http {a} a.test"));
        if answer.starts_with("200 hostA") {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the place was not given back: {answer}"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

#[test]
fn dns_questions_in_flight_are_bounded_for_all_sandboxes_together() {
    require_tools!("openssl");
    // An upstream that never answers: every question holds its place until given up.
    let silent = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let silent_addr = silent.local_addr().unwrap();
    let mut w = World::tuned(14, policy(&["a.test", "b.test"], &[]), |c| {
        c.upstream = vec![silent_addr];
        c.limits.questions = 1;
    });
    let gw = w.gateway();
    assert_eq!(w.services.over_limit(), 0);
    // The first question takes the only place (the client gives up first, after 3 s,
    // while the resolver still waits for the upstream); the second finds none, though
    // the sandbox's own bound (64) is far.
    assert!(w.ask(&format!("dns {gw} a.test 1")).starts_with("error"));
    assert!(w.ask(&format!("dns {gw} b.test 1")).starts_with("error"));
    assert!(
        w.services.over_limit() >= 1,
        "a question past the global bound was taken"
    );
    drop(silent);
}
