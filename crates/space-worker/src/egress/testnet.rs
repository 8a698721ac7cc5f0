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
use space_egress::{GlobalDeny, NetworkMode, Policy};

use super::command::on_path;
use super::nft::{self, Attached, HostPorts, Ruleset, TableName};
use super::veth::{self, LinkNames, Pair};
use crate::substrate::process::ProcessIdentity;

/// Serves one line (`<name> <port>`) per connection on each port of `argv[2]`
/// (comma-separated; 0 picks a free one), prints `ready <ports>`, then runs
/// `connect ADDR PORT` lines from stdin, answering `ok <line>` or why not.
pub(crate) const PEER: &str = r#"
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

pub(crate) fn missing_tools(extra: &[&'static str]) -> Option<String> {
    if !rustix::process::geteuid().is_root() {
        return Some("root (network namespaces, veths, nftables)".into());
    }
    let missing: Vec<&str> = ["ip", "nft", "nsenter", "unshare", "python3"]
        .into_iter()
        .chain(extra.iter().copied())
        .filter(|p| !on_path(p))
        .collect();
    (!missing.is_empty()).then(|| missing.join(", "))
}

macro_rules! require_tools {
    ($($extra:literal),*) => {
        if let Some(missing) = $crate::egress::testnet::missing_tools(&[$($extra),*]) {
            eprintln!("skipped: egress tests need {missing}");
            return;
        }
    };
}
pub(crate) use require_tools;

/// A python [`PEER`], in a network namespace of its own (`unshare --net`) or on the
/// host; killed on drop, which removes its namespace and every link in it.
pub(crate) struct Peer {
    pub(crate) child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
    pub(crate) ports: Vec<u16>,
}

impl Peer {
    pub(crate) fn start(own_netns: bool, name: &str, ports: &[u16]) -> Self {
        let ports_arg = ports
            .iter()
            .map(u16::to_string)
            .collect::<Vec<_>>()
            .join(",");
        Self::start_script(own_netns, PEER, &[name, &ports_arg])
    }

    /// `python3 -c script args…` (in a namespace of its own when `own_netns`), which
    /// prints `ready <ports>` (comma-separated) once it serves.
    pub(crate) fn start_script(own_netns: bool, script: &str, args: &[&str]) -> Self {
        let mut command = if own_netns {
            let mut c = Command::new("unshare");
            c.args(["--net", "--", "python3"]);
            c
        } else {
            Command::new("python3")
        };
        let mut child = command
            .arg("-c")
            .arg(script)
            .args(args)
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
            .unwrap_or_else(|| panic!("{args:?} did not start: {line:?}"))
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

    /// Writes `line` to the peer and reads the line it answers.
    pub(crate) fn ask(&mut self, line: &str) -> String {
        writeln!(self.stdin, "{line}").unwrap();
        self.stdin.flush().unwrap();
        let mut answer = String::new();
        self.stdout.read_line(&mut answer).unwrap();
        answer.trim().to_owned()
    }

    pub(crate) fn identity(&self) -> ProcessIdentity {
        ProcessIdentity::of(self.child.id() as i32).expect("identity")
    }

    /// `ok <name> <port>`, `timeout`, `refused` or `error …`, from inside this peer.
    pub(crate) fn connect(&mut self, addr: Ipv4Addr, port: u16) -> String {
        writeln!(self.stdin, "connect {addr} {port}").unwrap();
        self.stdin.flush().unwrap();
        let mut line = String::new();
        self.stdout.read_line(&mut line).unwrap();
        line.trim().to_owned()
    }

    /// A command run inside this peer's network namespace.
    pub(crate) fn inside(&self, args: &[&str]) -> std::process::Output {
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
pub(crate) struct LinkGuard(pub(crate) String);

impl Drop for LinkGuard {
    fn drop(&mut self) {
        let _ = veth::detach(&self.0);
    }
}

/// Removes a table on drop.
pub(crate) struct TableGuard(pub(crate) TableName);

impl Drop for TableGuard {
    fn drop(&mut self) {
        let _ = nft::remove(&self.0);
    }
}

pub(crate) fn ip(args: &[&str]) -> String {
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
pub(crate) struct Scope {
    /// Worker tag of link names: a letter per test and two base-36 digits of the PID.
    pub(crate) links: LinkNames,
    pub(crate) table: TableName,
    /// A `/24` of 240.16/12 (outside the default block) per test and PID.
    pub(crate) block: AddressBlock,
    tag: String,
    test: u8,
}

impl Scope {
    pub(crate) fn new(test: u8) -> Self {
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

    pub(crate) fn pair(&self, index: u32) -> Pair {
        self.links.pair(&self.block, index).unwrap()
    }

    /// A test host: a peer in a namespace of its own, linked to the host by a veth
    /// `/31` of 198.51.100.0/24 whose host side is `.2k` and the test host `.2k+1`.
    pub(crate) fn test_host(&self, slot: u8, ports: &[u16]) -> TestHost {
        self.test_host_with(slot, Peer::start(true, &format!("testhost{slot}"), ports))
    }

    /// [`Scope::test_host`] for a peer already started in a namespace of its own.
    pub(crate) fn test_host_with(&self, slot: u8, peer: Peer) -> TestHost {
        // 32 `/31`s per test process (16 tests of 2 slots), 4 processes at once.
        assert!(self.test < 16 && slot < 2, "test {} slot {slot}", self.test);
        let pair = (std::process::id() % 4) * 32 + u32::from(self.test) * 2 + u32::from(slot);
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

pub(crate) struct TestHost {
    pub(crate) addr: Ipv4Addr,
    pub(crate) host_side: Ipv4Addr,
    _link: LinkGuard,
    _peer: Peer,
}

/// A sandbox: a peer in a namespace of its own with a pair attached.
pub(crate) struct Sandbox {
    pub(crate) peer: Peer,
    pub(crate) pair: Pair,
    _link: LinkGuard,
}

pub(crate) fn sandbox(scope: &Scope, index: u32, ports: &[u16]) -> Sandbox {
    sandbox_with(
        scope,
        index,
        Peer::start(true, &format!("sandbox{index}"), ports),
    )
}

/// [`sandbox`] for a peer already started in a namespace of its own.
pub(crate) fn sandbox_with(scope: &Scope, index: u32, peer: Peer) -> Sandbox {
    let pair = scope.pair(index);
    let guard = LinkGuard(pair.host_link().to_owned());
    veth::attach(&pair, &peer.identity()).expect("attach");
    Sandbox {
        peer,
        pair,
        _link: guard,
    }
}

pub(crate) fn policy(allow: &[&str], deny: &[&str]) -> Policy {
    Policy::parse(NetworkMode::Egress, allow, deny).unwrap()
}

pub(crate) fn apply(
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
        prepared: 0,
    })
    .unwrap();
    let guard = TableGuard(scope.table.clone());
    nft::apply(&script).unwrap_or_else(|e| panic!("{e}\n{script}"));
    guard
}

/// Ports no test connects to as a proxy.
pub(crate) const UNUSED_PORTS: HostPorts = HostPorts {
    http: 1,
    tls: 2,
    dns: 3,
};

pub(crate) fn global(scope: &Scope) -> GlobalDeny {
    GlobalDeny::builder()
        .sandbox_block(scope.block.net())
        .build()
        .unwrap()
}
