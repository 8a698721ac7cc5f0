//! Egress plumbing against the real kernel (fixtures in [`super::testnet`]): address
//! rules, the global list, sandbox isolation and detaching.

use std::net::Ipv4Addr;
use std::process::Command;

use space_egress::{GlobalDeny, Listener};

use super::nft::{self, HostPorts};
use super::testnet::{
    Peer, Scope, UNUSED_PORTS, apply, global, ip, policy, require_tools, sandbox,
};
use super::veth::{self, link_exists};

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
