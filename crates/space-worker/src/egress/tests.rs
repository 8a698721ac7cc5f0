//! Egress plumbing against the real kernel: veth pairs into processes in network
//! namespaces of their own ("sandboxes"), the worker's nftables table applied with
//! `nft`, and "test hosts" — namespaces this test creates, each linked to the host by a
//! veth and given an address of TEST-NET-2 (198.51.100.0/24) routed only into it.
//! Traffic goes only to those namespaces and to servers this test starts on the host;
//! `ip route get` is checked to name the test host's link before any traffic. Needs
//! root, `ip`, `nft`, `nsenter`, `unshare` and `python3`; skipped with a message naming
//! what is missing otherwise. Every namespace, link and table is removed on drop.

use std::io::{BufRead, BufReader, Write};
use std::net::Ipv4Addr;
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};

use space_egress::plan::AddressBlock;
use space_egress::{GlobalDeny, Listener, NetworkMode, Policy};

use super::command::on_path;
use super::nft::{self, Attached, HostPorts, Ruleset, TableName};
use super::veth::{self, LinkNames, Pair, link_exists};
use crate::substrate::process::ProcessIdentity;

/// Serves one line (`<name> <port>`) per connection on each port of `argv[2]`
/// (comma-separated; 0 picks a free one), prints `ready <ports>`, then runs
/// `connect ADDR PORT` lines from stdin, answering `ok <line>` or why not.
const PEER: &str = r#"
import socket, sys, threading
name = sys.argv[1]
ports = [int(p) for p in sys.argv[2].split(",") if p]
def serve(s, port):
    while True:
        c, _ = s.accept()
        try:
            c.sendall(("%s %d\n" % (name, port)).encode())
        finally:
            c.close()
bound = []
for p in ports:
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("0.0.0.0", p))
    s.listen(16)
    port = s.getsockname()[1]
    bound.append(str(port))
    threading.Thread(target=serve, args=(s, port), daemon=True).start()
print("ready " + ",".join(bound), flush=True)
for line in sys.stdin:
    _, addr, port = line.split()
    try:
        c = socket.create_connection((addr, int(port)), timeout=1.0)
        c.settimeout(1.0)
        print("ok " + c.recv(200).decode().strip(), flush=True)
        c.close()
    except socket.timeout:
        print("timeout", flush=True)
    except ConnectionRefusedError:
        print("refused", flush=True)
    except OSError as e:
        print("error %s" % e, flush=True)
"#;

fn missing_tools() -> Option<String> {
    if !rustix::process::geteuid().is_root() {
        return Some("root (network namespaces, veths, nftables)".into());
    }
    let missing: Vec<&str> = ["ip", "nft", "nsenter", "unshare", "python3"]
        .into_iter()
        .filter(|p| !on_path(p))
        .collect();
    (!missing.is_empty()).then(|| missing.join(", "))
}

macro_rules! require_tools {
    () => {
        if let Some(missing) = missing_tools() {
            eprintln!("skipped: egress tests need {missing}");
            return;
        }
    };
}

/// A python [`PEER`], in a network namespace of its own (`unshare --net`) or on the
/// host; killed on drop, which removes its namespace and every link in it.
struct Peer {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
    ports: Vec<u16>,
}

impl Peer {
    fn start(own_netns: bool, name: &str, ports: &[u16]) -> Self {
        let ports_arg = ports
            .iter()
            .map(u16::to_string)
            .collect::<Vec<_>>()
            .join(",");
        let mut command = if own_netns {
            let mut c = Command::new("unshare");
            c.args(["--net", "--", "python3"]);
            c
        } else {
            Command::new("python3")
        };
        let mut child = command
            .args(["-c", PEER, name, &ports_arg])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start python3");
        let stdin = child.stdin.take().expect("stdin");
        let mut stdout = BufReader::new(child.stdout.take().expect("stdout"));
        let mut line = String::new();
        stdout.read_line(&mut line).expect("ready line");
        let bound = line
            .trim()
            .strip_prefix("ready")
            .unwrap_or_else(|| panic!("{name} did not start: {line:?}"))
            .trim()
            .split(',')
            .filter(|p| !p.is_empty())
            .map(|p| p.parse().unwrap())
            .collect();
        Peer {
            child,
            stdin,
            stdout,
            ports: bound,
        }
    }

    fn identity(&self) -> ProcessIdentity {
        ProcessIdentity::of(self.child.id() as i32).expect("identity")
    }

    /// `ok <name> <port>`, `timeout`, `refused` or `error …`, from inside this peer.
    fn connect(&mut self, addr: Ipv4Addr, port: u16) -> String {
        writeln!(self.stdin, "connect {addr} {port}").unwrap();
        self.stdin.flush().unwrap();
        let mut line = String::new();
        self.stdout.read_line(&mut line).unwrap();
        line.trim().to_owned()
    }

    /// A command run inside this peer's network namespace.
    fn inside(&self, args: &[&str]) -> std::process::Output {
        let net = format!("--net=/proc/{}/ns/net", self.child.id());
        Command::new("nsenter")
            .arg(net)
            .args(args)
            .output()
            .unwrap()
    }
}

impl Drop for Peer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Removes a host-side link on drop.
struct LinkGuard(String);

impl Drop for LinkGuard {
    fn drop(&mut self) {
        let _ = veth::detach(&self.0);
    }
}

/// Removes a table on drop.
struct TableGuard(TableName);

impl Drop for TableGuard {
    fn drop(&mut self) {
        let _ = nft::remove(&self.0);
    }
}

fn ip(args: &[&str]) -> String {
    let out = Command::new("ip").args(args).output().unwrap();
    assert!(
        out.status.success(),
        "ip {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Names and addresses unique to one test of one test process: tests run in parallel,
/// and other test processes may run on the same machine.
struct Scope {
    /// Worker tag of link names: a letter per test and two base-36 digits of the PID.
    links: LinkNames,
    table: TableName,
    /// A `/24` of 240.16/12 (outside the default block) per test and PID.
    block: AddressBlock,
    tag: String,
    test: u8,
}

impl Scope {
    fn new(test: u8) -> Self {
        let pid = std::process::id();
        let digit = |n: u32| char::from_digit(n % 36, 36).unwrap();
        let tag = format!(
            "{}{}{}",
            char::from(b'a' + test),
            digit(pid / 36),
            digit(pid)
        );
        let block = format!("240.{}.{}.0/24", 16 + u32::from(test), pid % 256)
            .parse()
            .unwrap();
        Scope {
            links: LinkNames::new(&tag).unwrap(),
            table: TableName::for_worker(&format!("test{pid}_{test}")).unwrap(),
            block,
            tag,
            test,
        }
    }

    fn pair(&self, index: u32) -> Pair {
        self.links.pair(&self.block, index).unwrap()
    }

    /// A test host: a peer in a namespace of its own, linked to the host by a veth
    /// `/31` of 198.51.100.0/24 whose host side is `.2k` and the test host `.2k+1`.
    fn test_host(&self, slot: u8, ports: &[u16]) -> TestHost {
        let peer = Peer::start(true, &format!("testhost{slot}"), ports);
        let pair = (std::process::id() % 16) * 8 + u32::from(self.test) * 2 + u32::from(slot);
        let host_side = Ipv4Addr::new(198, 51, 100, (2 * (pair % 128)) as u8);
        let addr = Ipv4Addr::new(198, 51, 100, (2 * (pair % 128) + 1) as u8);
        let link = format!("sth{}{slot}", self.tag);
        let guard = LinkGuard(link.clone());
        let netns = format!("/proc/{}/ns/net", peer.child.id());
        ip(&[
            "link", "add", &link, "type", "veth", "peer", "name", "eth0", "netns", &netns,
        ]);
        ip(&["addr", "add", &format!("{host_side}/31"), "dev", &link]);
        ip(&["link", "set", "dev", &link, "up"]);
        // Replies to the sandboxes come in here and are forwarded back.
        std::fs::write(format!("/proc/sys/net/ipv4/conf/{link}/forwarding"), "1").unwrap();
        for args in [
            vec!["ip", "addr", "add", &format!("{addr}/31"), "dev", "eth0"],
            vec!["ip", "link", "set", "dev", "eth0", "up"],
        ] {
            let out = peer.inside(&args);
            assert!(out.status.success(), "{args:?}: {out:?}");
        }
        let route = ip(&["route", "get", &addr.to_string()]);
        assert!(
            route.contains(&format!("dev {link} ")),
            "{addr} must be routed only into the test host: {route}"
        );
        TestHost {
            addr,
            host_side,
            _link: guard,
            _peer: peer,
        }
    }
}

struct TestHost {
    addr: Ipv4Addr,
    host_side: Ipv4Addr,
    _link: LinkGuard,
    _peer: Peer,
}

/// A sandbox: a peer in a namespace of its own with a pair attached.
struct Sandbox {
    peer: Peer,
    pair: Pair,
    _link: LinkGuard,
}

fn sandbox(scope: &Scope, index: u32, ports: &[u16]) -> Sandbox {
    let peer = Peer::start(true, &format!("sandbox{index}"), ports);
    let pair = scope.pair(index);
    let guard = LinkGuard(pair.host_link().to_owned());
    veth::attach(&pair, &peer.identity()).expect("attach");
    Sandbox {
        peer,
        pair,
        _link: guard,
    }
}

fn policy(allow: &[&str], deny: &[&str]) -> Policy {
    Policy::parse(NetworkMode::Egress, allow, deny).unwrap()
}

fn apply(
    scope: &Scope,
    global: &GlobalDeny,
    ports: HostPorts,
    sandboxes: &[(&Sandbox, &Policy)],
) -> TableGuard {
    let attached: Vec<Attached<'_>> = sandboxes
        .iter()
        .map(|(s, policy)| Attached {
            pair: &s.pair,
            policy,
        })
        .collect();
    let script = nft::render(&Ruleset {
        table: &scope.table,
        links: &scope.links,
        block: scope.block,
        global,
        ports,
        sandboxes: &attached,
    })
    .unwrap();
    let guard = TableGuard(scope.table.clone());
    nft::apply(&script).unwrap_or_else(|e| panic!("{e}\n{script}"));
    guard
}

/// Ports no test connects to as a proxy.
const UNUSED_PORTS: HostPorts = HostPorts {
    http: 1,
    tls: 2,
    dns: 3,
};

fn global(scope: &Scope) -> GlobalDeny {
    GlobalDeny::builder()
        .sandbox_block(scope.block.net())
        .build()
        .unwrap()
}

#[test]
fn an_address_rule_lets_a_sandbox_reach_a_test_host_port_and_nothing_else() {
    require_tools!();
    let scope = Scope::new(0);
    let one = scope.test_host(0, &[8080]);
    let two = scope.test_host(1, &[8080]);
    let mut s = sandbox(&scope, 0, &[]);
    let g = global(&scope);

    let only_one = policy(&[&format!("{}/32", one.addr)], &[]);
    let table = apply(&scope, &g, UNUSED_PORTS, &[(&s, &only_one)]);
    assert_eq!(s.peer.connect(one.addr, 8080), "ok testhost0 8080");
    assert_eq!(
        s.peer.connect(two.addr, 8080),
        "timeout",
        "an unlisted address"
    );

    // The same table name, replaced in place: the second host now reachable.
    let both = policy(&["198.51.100.0/24"], &[]);
    let _table = apply(&scope, &g, UNUSED_PORTS, &[(&s, &both)]);
    assert_eq!(s.peer.connect(two.addr, 8080), "ok testhost1 8080");

    let but_two = policy(&["198.51.100.0/24"], &[&format!("{}/32", two.addr)]);
    let _table = apply(&scope, &g, UNUSED_PORTS, &[(&s, &but_two)]);
    assert_eq!(
        s.peer.connect(two.addr, 8080),
        "timeout",
        "a denied network"
    );
    assert_eq!(s.peer.connect(one.addr, 8080), "ok testhost0 8080");
    drop(table);
}

#[test]
fn the_global_deny_list_beats_the_sandboxs_allow_list() {
    require_tools!();
    let scope = Scope::new(1);
    let mut host = Peer::start(false, "host", &[0, 0]);
    let (service, proxy) = (host.ports[0], host.ports[1]);
    let target = scope.test_host(0, &[7070, 8080]);
    let mut s = sandbox(&scope, 0, &[]);
    let g = GlobalDeny::builder()
        .sandbox_block(scope.block.net())
        .host_address(target.host_side.into())
        .listener(Listener {
            addr: target.addr.into(),
            port: Some(7070),
        })
        .build()
        .unwrap();
    let everything = policy(&["0.0.0.0/0"], &[]);
    let ports = HostPorts {
        http: proxy,
        tls: proxy,
        dns: proxy,
    };
    let _table = apply(&scope, &g, ports, &[(&s, &everything)]);

    // The host's services are there (seen from the host)…
    let host_side = s.pair.host_addr();
    for addr in [Ipv4Addr::LOCALHOST, host_side, target.host_side] {
        assert_eq!(host.connect(addr, service), format!("ok host {service}"));
    }
    // …and out of the sandbox's reach, on its own host side and on any other.
    assert_eq!(s.peer.connect(host_side, service), "timeout");
    assert_eq!(s.peer.connect(target.host_side, service), "timeout");
    // A platform listener on an allowed address: refused on its port only.
    assert_eq!(s.peer.connect(target.addr, 7070), "timeout");
    assert_eq!(s.peer.connect(target.addr, 8080), "ok testhost0 8080");
    // The proxy port on its own host side is reachable, and web traffic is sent there.
    assert_eq!(s.peer.connect(host_side, proxy), format!("ok host {proxy}"));
    assert_eq!(s.peer.connect(target.addr, 80), format!("ok host {proxy}"));
}

#[test]
fn two_sandboxes_cannot_reach_each_other() {
    require_tools!();
    let scope = Scope::new(2);
    let mut host = Peer::start(false, "host", &[0]);
    let service = host.ports[0];
    let target = scope.test_host(0, &[8080]);
    let mut a = sandbox(&scope, 0, &[9000]);
    let mut b = sandbox(&scope, 1, &[9000]);
    let (a_addr, b_addr) = (a.pair.sandbox_addr(), b.pair.sandbox_addr());

    // Without the table the kernel forwards between the links: the test can fail.
    assert_eq!(a.peer.connect(b_addr, 9000), "ok sandbox1 9000");
    assert_eq!(b.peer.connect(a_addr, 9000), "ok sandbox0 9000");

    let everything = policy(&[], &[]);
    let _table = apply(
        &scope,
        &global(&scope),
        UNUSED_PORTS,
        &[(&a, &everything), (&b, &everything)],
    );
    assert_eq!(a.peer.connect(b_addr, 9000), "timeout");
    assert_eq!(b.peer.connect(a_addr, 9000), "timeout");
    // Nor the other's host side.
    let b_host = b.pair.host_addr();
    assert_eq!(host.connect(b_host, service), format!("ok host {service}"));
    assert_eq!(a.peer.connect(b_host, service), "timeout");
    // Both still reach the test host.
    assert_eq!(a.peer.connect(target.addr, 8080), "ok testhost0 8080");
    assert_eq!(b.peer.connect(target.addr, 8080), "ok testhost0 8080");
}

#[test]
fn detaching_removes_the_veths_and_the_table() {
    require_tools!();
    let scope = Scope::new(3);
    let a = sandbox(&scope, 0, &[]);
    let b = sandbox(&scope, 1, &[]);
    // Attaching again replaces the pair: still one.
    veth::attach(&a.pair, &a.peer.identity()).unwrap();
    let everything = policy(&[], &[]);
    let table = apply(
        &scope,
        &global(&scope),
        UNUSED_PORTS,
        &[(&a, &everything), (&b, &everything)],
    );
    let inside = a.peer.inside(&["ip", "-o", "link", "show"]);
    let inside = String::from_utf8_lossy(&inside.stdout);
    assert_eq!(inside.matches(": eth0@").count(), 1, "{inside}");
    assert!(link_exists(a.pair.host_link()) && link_exists(b.pair.host_link()));
    assert!(nft::table_exists(&scope.table).unwrap());

    for s in [&a, &b] {
        veth::detach(s.pair.host_link()).unwrap();
        veth::detach(s.pair.host_link()).unwrap();
    }
    nft::remove(&scope.table).unwrap();
    nft::remove(&scope.table).unwrap();

    let links = ip(&["-o", "link", "show"]);
    for s in [&a, &b] {
        assert!(
            !links.contains(&format!(" {}@", s.pair.host_link())),
            "{links}"
        );
        let inside = s.peer.inside(&["ip", "-o", "link", "show"]);
        let inside = String::from_utf8_lossy(&inside.stdout);
        assert!(!inside.contains("eth0"), "{inside}");
    }
    let tables = Command::new("nft")
        .args(["list", "tables"])
        .output()
        .unwrap();
    let tables = String::from_utf8_lossy(&tables.stdout);
    assert!(!tables.contains(scope.table.as_str()), "{tables}");
    assert!(!nft::table_exists(&scope.table).unwrap());
    drop(table);
}
