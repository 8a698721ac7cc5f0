//! Sandbox egress end to end (issue 15): sandboxes of a real `space up` (two workers,
//! egress on, each test with its own pair of slots) reach test hosts — python servers
//! in network namespaces this test creates, on veths with addresses of TEST-NET-2
//! routed only into them — by name through the platform's proxy and resolver, and by
//! address through its rules; the upstream DNS the platform asks is this test's own
//! server on 127.0.0.1. No traffic leaves the machine: every name resolves to a test
//! host or to the host itself, and `ip route get` names the test host's link before
//! any traffic.

use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use dns::DnsServer;
use net::{ECHO, TestCa, TestHost};
use probes::{
    CONNECT_TIMEOUT_SECS, api, curl, dig, egress_metric, forbidden, gateway, getent, own_addr,
    reached, refused_event, run, sh, tcp,
};
use serde_json::{Value, json};
use space_testkit::cluster::{Cluster, can_run_jails};

#[path = "egress/dns.rs"]
mod dns;
#[path = "egress/net.rs"]
mod net;
#[path = "egress/packages.rs"]
mod packages;
#[path = "egress/probes.rs"]
mod probes;

/// Whether this host can run these tests; prints what is missing otherwise.
fn can_run() -> bool {
    if !can_run_jails() {
        return false;
    }
    match net::missing() {
        Some(what) => {
            eprintln!("SKIPPED: the egress tests need {what}");
            false
        }
        None => true,
    }
}

/// A cluster with egress on, its upstream DNS, and two test hosts `a` and `b`
/// (HTTP on 80, TLS on 443 with a certificate for `a.test` from `ca`, an echo on
/// [`ECHO`]). Fields drop in order: the cluster (its tables and links) first.
struct World {
    c: Cluster,
    dns: DnsServer,
    a: TestHost,
    b: TestHost,
    ca: TestCa,
}

/// The world of test `test` (1..=16): slots `200 + 2 × test` and the next.
fn world(test: u8) -> World {
    world_with(test, &[])
}

/// [`world`] with more of `space up`'s environment.
fn world_with(test: u8, env: &[(&str, &str)]) -> World {
    let ca = TestCa::make("a.test");
    let tls = Some((ca.cert.as_path(), ca.key.as_path()));
    let a = TestHost::start(test, 0, "a", tls);
    // `b` serves the same certificate: a client sent to it for `a.test` would accept it.
    let b = TestHost::start(test, 1, "b", tls);
    let dns = DnsServer::start(&[
        ("a.test", a.addr),
        ("b.test", b.addr),
        ("loop.test", Ipv4Addr::LOCALHOST),
        // One of the host's own addresses (it exists before the cluster starts).
        ("hostip.test", a.host_side),
    ]);
    let slot = (200 + 2 * u32::from(test)).to_string();
    let upstream = dns.addr.to_string();
    let mut all = vec![
        ("SPACE_NO_EGRESS", "0"),
        ("SPACE_EGRESS_SLOT", slot.as_str()),
        ("SPACE_EGRESS_DNS", upstream.as_str()),
    ];
    all.extend_from_slice(env);
    let c = Cluster::start_with_env(&all);
    World { c, dns, a, b, ca }
}

/// `POST /v1/sandboxes` on `worker` with `network` (left out when `None`): its ID.
fn create(c: &Cluster, worker: &str, network: Option<Value>) -> String {
    let mut body = json!({ "worker": worker });
    if let Some(n) = network {
        body["network"] = n;
    }
    let (status, view) = api(c, "POST", "/v1/sandboxes", &body.to_string());
    assert!(status == 200 || status == 201, "create: {status} {view}");
    view["id"].as_str().expect("an ID").to_owned()
}

fn egress(allow: &[&str], deny: &[&str]) -> Value {
    json!({ "mode": "egress", "allow": allow, "deny": deny })
}

fn upload(c: &Cluster, id: &str, path: &str, bytes: &[u8]) {
    let out = c.cli_with_stdin(&["fs", "put", id, "-", path], bytes);
    assert!(
        out.status.success(),
        "fs put {path}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A TCP server the test binds on the host: it answers `host\n` to every connection
/// and counts them.
struct HostListener {
    port: u16,
    accepted: Arc<AtomicUsize>,
}

impl HostListener {
    fn bind(addr: SocketAddr) -> Self {
        Self::try_bind(addr).unwrap_or_else(|| panic!("{addr} is in use on the host"))
    }

    /// [`HostListener::bind`], or `None` (said on stderr) when `addr` is in use.
    fn try_bind(addr: SocketAddr) -> Option<Self> {
        let listener = match TcpListener::bind(addr) {
            Ok(l) => l,
            Err(e) if e.kind() == std::io::ErrorKind::AddrInUse => {
                eprintln!("NOTE: {addr} is in use on the host; not listening there");
                return None;
            }
            Err(e) => panic!("bind {addr} on the host: {e}"),
        };
        let port = listener.local_addr().expect("its address").port();
        let accepted = Arc::new(AtomicUsize::new(0));
        let counter = Arc::clone(&accepted);
        // The thread ends with the test process (a listener is a few bytes).
        std::thread::spawn(move || {
            for mut conn in listener.incoming().flatten() {
                counter.fetch_add(1, Ordering::SeqCst);
                let mut buf = [0u8; 512];
                let _ = conn.set_read_timeout(Some(Duration::from_millis(200)));
                let _ = conn.read(&mut buf);
                let _ = conn.write_all(b"HTTP/1.0 200 OK\r\nContent-Length: 5\r\n\r\nhost\n");
            }
        });
        Some(HostListener { port, accepted })
    }

    fn accepted(&self) -> usize {
        self.accepted.load(Ordering::SeqCst)
    }
}

/// The port of a `http://ip:port` URL.
fn port_of(url: &str) -> u16 {
    url.rsplit(':')
        .next()
        .and_then(|p| p.trim_end_matches('/').parse().ok())
        .unwrap_or_else(|| panic!("no port in {url}"))
}

#[test]
fn an_allowed_host_is_reached_by_name_over_http_and_over_tls_with_a_test_ca() {
    if !can_run() {
        return;
    }
    let w = world(1);
    let c = &w.c;
    let id = create(c, "w1", Some(egress(&["a.test"], &[])));
    upload(
        c,
        &id,
        "/root/ca.pem",
        &std::fs::read(&w.ca.ca).expect("the CA"),
    );

    assert_eq!(getent(c, &id, "a.test"), Some(w.a.addr.to_string()));
    reached(c, &id, "http://a.test/", "a");
    reached(c, &id, "--cacert /root/ca.pem https://a.test/", "a");
    // The same through python's own TLS stack, which checks the name as well.
    let py = sh(
        c,
        &id,
        "python3 -c \"import ssl, urllib.request\n\
         ctx = ssl.create_default_context(cafile='/root/ca.pem')\n\
         print(urllib.request.urlopen('https://a.test/', context=ctx, timeout=5).read().decode().strip())\"",
    );
    assert_eq!(py.trim(), "a");
    // The certificate is checked end to end: without the test CA, curl refuses it.
    let untrusted = curl(c, &id, "https://a.test/");
    assert_eq!(untrusted.exit, 60, "{untrusted}");
    // A name outside the allow list is not resolved, nor reached by address over TLS.
    assert_eq!(getent(c, &id, "b.test"), None);
    let b = curl(
        c,
        &id,
        &format!("-k --resolve b.test:443:{} https://b.test/", w.b.addr),
    );
    assert_ne!(b.status, 200, "{b}");
    assert!(w.dns.asked("a.test") >= 1);
}

#[test]
fn a_denied_name_is_refused_though_its_address_is_allowed() {
    if !can_run() {
        return;
    }
    let w = world(2);
    let c = &w.c;
    // Every name of .test and every test host's address is allowed; b.test is denied.
    let id = create(
        c,
        "w1",
        Some(egress(&["*.test", "198.51.100.0/24"], &["b.test"])),
    );
    reached(c, &id, "http://a.test/", "a");
    assert_eq!(getent(c, &id, "b.test"), None, "b.test resolved");
    let by_name = curl(c, &id, "http://b.test/");
    assert_eq!(by_name.exit, 6, "{by_name}");
    forbidden(
        c,
        &id,
        &format!("--resolve b.test:80:{} http://b.test/", w.b.addr),
        "b.test",
    );
    // Over TLS, the SNI b.test is refused whichever address the client dials.
    let tls = curl(
        c,
        &id,
        &format!("-k --resolve b.test:443:{} https://b.test/", w.b.addr),
    );
    assert_ne!(tls.status, 200, "{tls}");
    // The address itself is allowed: b's echo answers on another port.
    assert_eq!(tcp(c, &id, w.b.addr, ECHO), Ok("b hello".into()));
    refused_event(c, &id, "dns", "b.test", "b.test");
    refused_event(c, &id, "http", "b.test", "b.test");
    refused_event(c, &id, "tls", "b.test", "b.test");
    // Counted per rule in the worker's metrics (DNS questions of both types, HTTP, TLS).
    let refusals = egress_metric(
        c,
        "w1",
        "space_worker_egress_refusals_total",
        &id,
        "rule=\"b.test\"",
    );
    assert!(refusals >= 3.0, "{refusals} refusals under b.test");
    let http_conns = egress_metric(
        c,
        "w1",
        "space_worker_egress_connections_total",
        &id,
        "via=\"http\"",
    );
    assert!(http_conns >= 2.0, "{http_conns} HTTP connections counted");
}

#[test]
fn an_address_rule_opens_a_non_http_port_and_nothing_else() {
    if !can_run() {
        return;
    }
    let w = world(3);
    let c = &w.c;
    let id = create(c, "w1", Some(egress(&[&w.a.addr.to_string()], &[])));
    assert_eq!(tcp(c, &id, w.a.addr, ECHO), Ok("a hello".into()));
    // Another address: neither its echo nor its HTTP (by address, through the proxy).
    let other = tcp(c, &id, w.b.addr, ECHO);
    assert!(other.is_err(), "b's echo was reached: {other:?}");
    forbidden(
        c,
        &id,
        &format!("http://{}/", w.b.addr),
        "address not in the allow list",
    );
    // An address rule allows no name: a.test is not resolved, nor reached by Host.
    assert_eq!(getent(c, &id, "a.test"), None, "a.test resolved");
    forbidden(
        c,
        &id,
        &format!("--resolve a.test:80:{} http://a.test/", w.a.addr),
        "name not in the allow list",
    );
    refused_event(
        c,
        &id,
        "http",
        &w.b.addr.to_string(),
        "address not in the allow list",
    );
}

#[test]
fn etc_hosts_spoofing_inside_the_sandbox_changes_nothing() {
    if !can_run() {
        return;
    }
    let w = world(4);
    let c = &w.c;
    // Both names are allowed: what decides is which host the platform dials for a.test.
    let id = create(c, "w1", Some(egress(&["a.test", "b.test"], &[])));
    upload(
        c,
        &id,
        "/root/ca.pem",
        &std::fs::read(&w.ca.ca).expect("the CA"),
    );
    sh(
        c,
        &id,
        &format!(
            "printf '{} a.test\\n' | cat - /etc/hosts > /tmp/hosts && cat /tmp/hosts > /etc/hosts",
            w.b.addr
        ),
    );
    // The spoof works inside: the sandbox's own resolution says b's address.
    assert_eq!(getent(c, &id, "a.test"), Some(w.b.addr.to_string()));
    // The platform dials a.test itself: a answers, over HTTP and over TLS (b serves
    // a certificate for a.test too, so a client sent there would accept it).
    reached(c, &id, "http://a.test/", "a");
    reached(c, &id, "--cacert /root/ca.pem https://a.test/", "a");
    reached(
        c,
        &id,
        &format!("--resolve a.test:80:{} http://a.test/", w.b.addr),
        "a",
    );
}

#[test]
fn the_global_deny_list_beats_a_sandboxs_allow_list() {
    if !can_run() {
        return;
    }
    let w = world(5);
    let c = &w.c;
    // Servers the test binds on the host, each of which a sandbox would reach without
    // the global list: on every address, on loopback's port 80 (loop.test), on a host
    // address's port 80 (hostip.test).
    let anywhere = HostListener::bind("0.0.0.0:0".parse().unwrap());
    // Port 80 of loopback may be someone else's (another run of this test): then that
    // server is the one a sandbox must not reach, and only the refusal is checked.
    let loopback = HostListener::try_bind("127.0.0.1:80".parse().unwrap());
    let host_addr = HostListener::bind(SocketAddr::from((w.a.host_side, 80)));
    let hostip = w.a.host_side.to_string();
    // Allowed by the sandbox's own lists: every address and every name.
    let id = create(c, "w1", Some(egress(&[], &[])));
    reached(c, &id, "http://a.test/", "a");
    let gw = gateway(c, &id);
    let edge_port = port_of(&c.url);
    let node_api_ports: Vec<u16> = c.worker_urls().iter().map(|(_, u)| port_of(u)).collect();
    for port in [edge_port, anywhere.port]
        .into_iter()
        .chain(node_api_ports.iter().copied())
    {
        for addr in [gw.as_str(), hostip.as_str()] {
            let got = tcp(c, &id, addr, port);
            assert!(got.is_err(), "{addr}:{port} was reached: {got:?}");
        }
    }
    // Through the proxy: names that resolve to the host, the host by address, the
    // gateway by address, another port by Host.
    // loop.test resolves to 127.0.0.1 in the sandbox too, which is the sandbox's own
    // loopback: only the proxy, dialing the name itself, could reach the host's.
    forbidden(
        c,
        &id,
        &format!("--resolve loop.test:80:{} http://loop.test/", w.a.addr),
        "127.0.0.0/8 (loopback)",
    );
    forbidden(c, &id, "http://hostip.test/", "(host address)");
    forbidden(
        c,
        &id,
        &format!("-H 'Host: 127.0.0.1' http://{}/", w.a.addr),
        "127.0.0.0/8 (loopback)",
    );
    forbidden(c, &id, &format!("http://{gw}/"), "240.0.0.0/4");
    let other_port = curl(
        c,
        &id,
        &format!("-H 'Host: loop.test:{edge_port}' http://{}/", w.a.addr),
    );
    assert_ne!(other_port.status, 200, "{other_port}");
    let tls = curl(
        c,
        &id,
        &format!("-k --resolve loop.test:443:{} https://loop.test/", w.a.addr),
    );
    assert_ne!(tls.status, 200, "{tls}");
    assert_eq!(
        (
            anywhere.accepted(),
            loopback.as_ref().map_or(0, HostListener::accepted),
            host_addr.accepted()
        ),
        (0, 0, 0),
        "a server on the host was reached"
    );
    refused_event(c, &id, "http", "loop.test", "127.0.0.0/8 (loopback)");
}

#[test]
fn dns_for_a_denied_name_fails() {
    if !can_run() {
        return;
    }
    let w = world(6);
    let c = &w.c;
    let id = create(c, "w1", Some(egress(&["*.test"], &["b.test"])));
    assert_eq!(getent(c, &id, "a.test"), Some(w.a.addr.to_string()));
    assert_eq!(getent(c, &id, "b.test"), None, "b.test resolved");
    let resolv = sh(c, &id, "cat /etc/resolv.conf");
    let server = resolv
        .lines()
        .find_map(|l| l.strip_prefix("nameserver "))
        .unwrap_or_else(|| panic!("no nameserver in {resolv:?}"))
        .trim()
        .to_owned();
    // REFUSED (5) without records, from the resolver resolv.conf names and from any
    // other address a client might try: every DNS packet is the platform's.
    for to in [server.as_str(), &w.b.addr.to_string()] {
        assert_eq!(dig(c, &id, "b.test", to), Ok((5, 0)), "asked {to}");
        assert_eq!(dig(c, &id, "a.test", to), Ok((0, 1)), "asked {to}");
    }
    // The refused name never reached the upstream.
    assert_eq!(w.dns.asked("b.test"), 0);
    assert!(w.dns.asked("a.test") >= 1);
    refused_event(c, &id, "dns", "b.test", "b.test");
}

#[test]
fn a_policy_changed_on_a_running_sandbox_takes_effect_for_new_connections() {
    if !can_run() {
        return;
    }
    let w = world(7);
    let c = &w.c;
    let id = create(c, "w1", Some(egress(&["a.test"], &[])));
    reached(c, &id, "http://a.test/", "a");
    assert_eq!(getent(c, &id, "b.test"), None);
    assert!(tcp(c, &id, w.b.addr, ECHO).is_err());

    let policy = egress(&["b.test", &w.b.addr.to_string()], &[]);
    let (status, view) = api(
        c,
        "PATCH",
        &format!("/v1/sandboxes/{id}/network"),
        &policy.to_string(),
    );
    assert_eq!(status, 200, "PATCH network: {view}");
    assert_eq!(view["network"]["allow"], policy["allow"], "{view}");
    assert_eq!(c.sandbox(&id)["network"]["allow"], policy["allow"]);

    reached(c, &id, "http://b.test/", "b");
    assert_eq!(getent(c, &id, "b.test"), Some(w.b.addr.to_string()));
    assert_eq!(tcp(c, &id, w.b.addr, ECHO), Ok("b hello".into()));
    forbidden(
        c,
        &id,
        &format!("--resolve a.test:80:{} http://a.test/", w.a.addr),
        "name not in the allow list",
    );
    assert_eq!(getent(c, &id, "a.test"), None, "a.test resolved");

    // Back to none: the link goes, and nothing leaves.
    let (status, view) = api(
        c,
        "PATCH",
        &format!("/v1/sandboxes/{id}/network"),
        &json!({"mode": "none"}).to_string(),
    );
    assert_eq!(status, 200, "PATCH network: {view}");
    let started = Instant::now();
    let gone = curl(c, &id, "http://b.test/");
    assert_ne!(gone.status, 200, "{gone}");
    assert!(tcp(c, &id, w.b.addr, ECHO).is_err());
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "mode none took {:?} to fail",
        started.elapsed()
    );
}

#[test]
fn the_policy_is_kept_after_migration() {
    if !can_run() {
        return;
    }
    let w = world(8);
    let c = &w.c;
    // Every test host's address is allowed but b's, and one name: without this policy
    // on the new execution (allowed everything, or nothing), the checks below differ.
    let policy = egress(&["a.test", "198.51.100.0/24"], &[&w.b.addr.to_string()]);
    let id = create(c, "w1", Some(policy.clone()));
    reached(c, &id, "http://a.test/", "a");
    assert_eq!(tcp(c, &id, w.a.addr, ECHO), Ok("a hello".into()));
    // A loop that tries b's echo every 50 ms and logs any answer: it must stay empty
    // across the migration (the new execution has its rules before its first packet).
    let probe = format!(
        "import socket, time\n\
         while True:\n\
         \x20   try:\n\
         \x20       s = socket.create_connection(('{b}', {ECHO}), timeout=0.2)\n\
         \x20       open('/root/leak.log', 'a').write('reached\\n')\n\
         \x20       s.close()\n\
         \x20   except OSError:\n\
         \x20       open('/root/tries.log', 'a').write('.')\n\
         \x20   time.sleep(0.05)\n",
        b = w.b.addr
    );
    upload(c, &id, "/root/probe.py", probe.as_bytes());
    sh(
        c,
        &id,
        "(nohup python3 /root/probe.py > /root/probe.err 2>&1 < /dev/null &)",
    );
    let tries = |c: &Cluster| run(c, &id, "cat /root/tries.log 2>/dev/null").1.len();
    let started = Instant::now();
    while tries(c) == 0 {
        let (_, err, _) = run(c, &id, "cat /root/probe.err");
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "the probe does not run: {err}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }

    let out = c.cli(&["--json", "sandbox", "migrate", &id, "--worker", "w2"]);
    assert!(
        out.status.success(),
        "migrate: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let view = c.sandbox(&id);
    assert_eq!(view["execution"]["worker"], "w2", "{view}");
    assert_eq!(view["network"]["allow"], policy["allow"], "{view}");
    assert_eq!(view["network"]["deny"], policy["deny"], "{view}");

    reached(c, &id, "http://a.test/", "a");
    assert_eq!(tcp(c, &id, w.a.addr, ECHO), Ok("a hello".into()));
    assert_eq!(getent(c, &id, "b.test"), None, "b.test resolved");
    forbidden(
        c,
        &id,
        &format!("--resolve b.test:80:{} http://b.test/", w.b.addr),
        "name not in the allow list",
    );
    assert!(tcp(c, &id, w.b.addr, ECHO).is_err());
    let (_, leaks, _) = run(c, &id, "cat /root/leak.log 2>/dev/null");
    assert_eq!(leaks, "", "b's echo was reached around the migration");
    let before = tries(c);
    std::thread::sleep(Duration::from_millis(500));
    if tries(c) > before {
        eprintln!("the probe lived through the migration: {} tries", tries(c));
    } else {
        eprintln!("the probe did not live through the migration ({before} tries before it)");
    }
    refused_event(c, &id, "http", "b.test", "name not in the allow list");
}

#[test]
fn two_sandboxes_cannot_reach_each_other() {
    if !can_run() {
        return;
    }
    let w = world(9);
    let c = &w.c;
    let everything = || Some(egress(&[], &[]));
    let one = create(c, "w1", everything());
    let two = create(c, "w1", everything());
    let three = create(c, "w2", everything());
    let server = "(nohup python3 -c \"import socketserver\n\
        class H(socketserver.StreamRequestHandler):\n\
        \x20   def handle(self):\n\
        \x20       self.wfile.write(b'sandbox ' + self.rfile.readline())\n\
        socketserver.ThreadingTCPServer(('0.0.0.0', 9000), H).serve_forever()\" \
        > /tmp/server.log 2>&1 < /dev/null &)";
    for id in [&one, &two, &three] {
        sh(c, id, server);
    }
    let addrs: Vec<String> = [&one, &two, &three]
        .iter()
        .map(|id| own_addr(c, id))
        .collect();
    // Each serves itself, and each reaches the test hosts.
    let deadline = Instant::now() + Duration::from_secs(20);
    for (id, addr) in [&one, &two, &three].iter().zip(&addrs) {
        loop {
            match tcp(c, id, addr, 9000) {
                Ok(a) => {
                    assert_eq!(a, "sandbox hello");
                    break;
                }
                Err(e) if Instant::now() > deadline => panic!("{id} does not serve: {e}"),
                Err(_) => std::thread::sleep(Duration::from_millis(200)),
            }
        }
        assert_eq!(tcp(c, id, w.a.addr, ECHO), Ok("a hello".into()));
    }
    for (i, from) in [&one, &two, &three].iter().enumerate() {
        for (j, to) in addrs.iter().enumerate() {
            if i == j {
                continue;
            }
            let got = tcp(c, from, to, 9000);
            assert!(got.is_err(), "{from} reached {to}:9000: {got:?}");
            forbidden(c, from, &format!("http://{to}/"), "240.0.0.0/4");
        }
    }
}

#[test]
fn a_sandbox_without_a_network_has_only_loopback() {
    if !can_run() {
        return;
    }
    let w = world(10);
    let c = &w.c;
    let id = create(c, "w1", None);
    assert_eq!(c.sandbox(&id)["network"]["mode"], "none");
    let addrs = sh(c, &id, "ip -4 -o addr");
    assert!(
        addrs
            .lines()
            .all(|l| l.split_whitespace().nth(1) == Some("lo")),
        "interfaces other than lo: {addrs}"
    );
    assert!(!addrs.contains("eth0"), "{addrs}");
    let started = Instant::now();
    let by_name = curl(c, &id, "http://a.test/");
    // 6: could not resolve; 7: could not connect (no route) — not 28, a timeout.
    assert_eq!((by_name.exit, by_name.status), (6, 0), "{by_name}");
    let by_addr = curl(c, &id, &format!("http://{}/", w.a.addr));
    assert_eq!((by_addr.exit, by_addr.status), (7, 0), "{by_addr}");
    assert!(
        started.elapsed() < Duration::from_secs(u64::from(CONNECT_TIMEOUT_SECS)),
        "the failures took {:?} (no network fails at once)",
        started.elapsed()
    );
    assert!(tcp(c, &id, w.a.addr, ECHO).is_err());
    assert_eq!(getent(c, &id, "a.test"), None);
    assert_eq!(w.dns.asked("a.test"), 0);
}

/// Waits until `n` standby sandboxes are ready.
fn wait_for_standby(c: &Cluster, n: f64) {
    let deadline = Instant::now() + Duration::from_secs(90);
    while c.control_metric("space_control_standby_ready") < n {
        assert!(
            Instant::now() < deadline,
            "standby sandboxes did not come up"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// `POST /v1/sandboxes` with `network` and nothing else (so it may claim a standby
/// sandbox): its ID.
fn create_plain(c: &Cluster, network: Value) -> String {
    let body = json!({ "network": network });
    let (status, view) = api(c, "POST", "/v1/sandboxes", &body.to_string());
    assert!(status == 200 || status == 201, "create: {status} {view}");
    assert_eq!(view["network"], network, "{view}");
    view["id"].as_str().expect("an ID").to_owned()
}

#[test]
fn a_standby_sandbox_claimed_with_an_egress_policy_has_it_before_the_create_returns() {
    if !can_run() {
        return;
    }
    // Two standby sandboxes of the default policy, `none`, and two with their link
    // made (`--standby-egress`), holding it for a claim.
    let w = world_with(12, &[("SPACE_STANDBY", "2"), ("SPACE_STANDBY_EGRESS", "2")]);
    let c = &w.c;
    wait_for_standby(c, 4.0);
    let id = create_plain(c, egress(&["a.test"], &[]));
    assert_eq!(
        c.control_metric("space_control_standby_claims_total"),
        1.0,
        "the create claimed a standby sandbox"
    );
    assert!(
        sh(c, &id, "ip -o link").contains("eth0"),
        "the claimed sandbox has its link"
    );
    // The very first exec after the answer: the allowed host is reached by name, the
    // other is refused by name and by address.
    reached(c, &id, "http://a.test/", "a");
    forbidden(
        c,
        &id,
        &format!("--resolve b.test:80:{} http://b.test/", w.b.addr),
        "name not in the allow list",
    );
    assert!(tcp(c, &id, w.b.addr, ECHO).is_err());
    assert_eq!(c.sandbox(&id)["network"], egress(&["a.test"], &[]));
    // A create in mode none claims one without a link, never one with.
    let bare = create_plain(c, json!({"mode": "none", "allow": [], "deny": []}));
    assert_eq!(
        c.control_metric("space_control_standby_claims_total"),
        2.0,
        "the create claimed a standby sandbox"
    );
    let links = sh(c, &bare, "ip -o link; ip -4 -o addr");
    assert!(!links.contains("eth0"), "a link in mode none: {links}");
}

#[test]
fn a_create_in_mode_none_never_claims_a_standby_sandbox_with_a_link() {
    if !can_run() {
        return;
    }
    // Standby sandboxes run the default policy, `egress` (everything the global list
    // lets through): each has a link.
    let w = world_with(
        13,
        &[("SPACE_STANDBY", "2"), ("SPACE_NETWORK_DEFAULT", "egress")],
    );
    let c = &w.c;
    wait_for_standby(c, 2.0);
    let id = create_plain(c, json!({"mode": "none", "allow": [], "deny": []}));
    assert_eq!(
        c.control_metric("space_control_standby_claims_total"),
        0.0,
        "a create in mode none claimed a standby sandbox with a link"
    );
    // Its own launch: no link at its first exec.
    let links = sh(c, &id, "ip -o link; ip -4 -o addr");
    assert!(!links.contains("eth0"), "a link: {links}");
    let by_addr = curl(c, &id, &format!("http://{}/", w.a.addr));
    assert_eq!((by_addr.exit, by_addr.status), (7, 0), "{by_addr}");
    assert_eq!(getent(c, &id, "a.test"), None);
    // A create with the default claims one, and its policy is in force there.
    let other = create_plain(c, egress(&[], &[]));
    assert_eq!(
        c.control_metric("space_control_standby_claims_total"),
        1.0,
        "the create claimed a standby sandbox"
    );
    reached(c, &other, "http://a.test/", "a");
}
