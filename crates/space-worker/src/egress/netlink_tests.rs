//! The rtnetlink client against the real kernel, in network namespaces these tests
//! create (`unshare --net` children, gone with them) — no traffic is sent — and its
//! message building and reply parsing on bytes.

use std::fs::File;
use std::os::fd::AsFd;

use super::*;
use crate::egress::testnet::{Peer, Scope, ip, require_tools};
use crate::egress::veth;
use crate::substrate::jail::netns::route_socket_in;

/// A client in the network namespace of `peer`, and that namespace held open.
fn inside(peer: &Peer) -> (Route, File) {
    let netns = File::open(format!("/proc/{}/ns/net", peer.child.id())).unwrap();
    let socket = route_socket_in(netns.as_fd()).unwrap();
    (Route::from_socket(socket).unwrap(), netns)
}

fn run_inside(peer: &Peer, args: &[&str]) -> String {
    let out = peer.inside(args);
    assert!(out.status.success(), "{args:?}: {out:?}");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn a_pair_made_over_netlink_has_its_addresses_and_route_inside_the_namespace() {
    require_tools!();
    let scope = Scope::new(15);
    let peer = Peer::start(true, "sandbox", &[]);
    let pair = scope.pair(0);
    let _guard = crate::egress::testnet::LinkGuard(pair.host_link().to_owned());
    veth::attach(&pair, &peer.identity()).unwrap();

    let host = ip(&["-o", "-4", "addr", "show", "dev", pair.host_link()]);
    assert!(
        host.contains(&format!("inet {}/31 ", pair.host_addr())),
        "{host}"
    );
    let link = ip(&["-o", "link", "show", "dev", pair.host_link()]);
    assert!(link.contains("state UP") || link.contains(",UP"), "{link}");
    let forwarding = std::fs::read_to_string(format!(
        "/proc/sys/net/ipv4/conf/{}/forwarding",
        pair.host_link()
    ))
    .unwrap();
    assert_eq!(forwarding.trim(), "1");

    let addr = run_inside(&peer, &["ip", "-o", "-4", "addr", "show", "dev", "eth0"]);
    assert!(
        addr.contains(&format!("inet {}/31 ", pair.sandbox_addr())),
        "{addr}"
    );
    let eth0 = run_inside(&peer, &["ip", "-o", "link", "show", "dev", "eth0"]);
    assert!(eth0.contains(",UP"), "{eth0}");
    let route = run_inside(&peer, &["ip", "-4", "route", "show", "default"]);
    assert_eq!(
        route.trim(),
        format!("default via {} dev eth0", pair.host_addr())
    );
    // The peer is in the sandbox's namespace only, under the usual name.
    assert!(!ip(&["-o", "link", "show"]).contains(" eth0@"));

    // Attaching again replaces the pair; detaching removes both sides, twice is fine.
    veth::attach(&pair, &peer.identity()).unwrap();
    let links = run_inside(&peer, &["ip", "-o", "link", "show"]);
    assert_eq!(links.matches(": eth0@").count(), 1, "{links}");
    veth::detach(pair.host_link()).unwrap();
    veth::detach(pair.host_link()).unwrap();
    assert!(!veth::link_exists(pair.host_link()));
    let links = run_inside(&peer, &["ip", "-o", "link", "show"]);
    assert!(!links.contains("eth0"), "{links}");
}

#[test]
fn a_netlink_error_names_the_kernels_errno() {
    require_tools!();
    let peer = Peer::start(true, "errno", &[]);
    let (mut route, netns) = inside(&peer);

    let err = route.set_up(0x7fff_fff0).unwrap_err();
    assert_eq!(err.errno(), Some(libc::ENODEV), "{err}");
    assert_eq!(
        err.to_string(),
        "bring link 2147483632 up: the kernel answered ENODEV, errno 19 (No such device (os error 19))"
    );

    // `lo` exists in every namespace: a pair named so is refused, and nothing is made.
    let lo = Name::new("lo").unwrap();
    let other = Name::new("sxtest0").unwrap();
    let err = route.add_veth_pair(&lo, &other, netns.as_fd()).unwrap_err();
    assert_eq!(err.errno(), Some(libc::EEXIST), "{err}");
    assert!(
        err.to_string()
            .starts_with("add the veth pair lo/sxtest0: the kernel answered EEXIST, errno 17"),
        "{err}"
    );
    assert_eq!(route.link_index(&other).unwrap(), None);
    // The socket stays usable after a refusal.
    assert_eq!(route.link_index(&lo).unwrap(), Some(1));
}

#[test]
fn a_reply_with_a_foreign_sequence_number_is_refused() {
    // Only a lookup of `lo`, in this process's namespace: no root needed.
    let mut route = Route::open().unwrap();
    let err = route.ask_with_sequence(7, 8).unwrap_err();
    assert!(
        matches!(
            err,
            NetlinkError::ForeignSequence {
                expected: 8,
                got: 7,
                ..
            }
        ),
        "{err}"
    );
    assert_eq!(
        err.to_string(),
        "look up lo: a reply with sequence number 7 is refused (the request's is 8)"
    );
    // With the sequence number it was asked with, the same request is answered.
    let mut route = Route::open().unwrap();
    route.ask_with_sequence(9, 9).unwrap();
}

#[test]
fn a_request_is_padded_to_four_bytes_and_its_nests_enclose_their_attributes() {
    let mut r = Request::new(libc::RTM_NEWLINK, NLM_F_CREATE);
    r.put(&ifinfomsg(0, 0, 0))
        .attr_name(libc::IFLA_IFNAME, &Name::new("abcde").unwrap());
    let nest = r.begin(libc::IFLA_LINKINFO);
    r.attr(libc::IFLA_INFO_KIND, b"veth");
    r.end(nest);
    let bytes = r.finish(42).unwrap();
    let u16_at = |at: usize| u16::from_ne_bytes([bytes[at], bytes[at + 1]]);
    let u32_at = |at: usize| u32::from_ne_bytes(bytes[at..at + 4].try_into().unwrap());
    // Header 16 + ifinfomsg 16 + name (4 + 6, padded to 12) + nest (4 + kind 4 + 4).
    assert_eq!(bytes.len(), 16 + 16 + 12 + 12);
    assert_eq!(u32_at(0) as usize, bytes.len());
    assert_eq!(u16_at(4), libc::RTM_NEWLINK);
    assert_eq!(u16_at(6), NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE);
    assert_eq!(u32_at(8), 42);
    assert_eq!((u16_at(32), u16_at(34)), (10, libc::IFLA_IFNAME));
    assert_eq!(&bytes[36..42], b"abcde\0");
    assert_eq!(&bytes[42..44], [0, 0], "padding is zero");
    assert_eq!((u16_at(44), u16_at(46)), (12, libc::IFLA_LINKINFO));
    assert_eq!((u16_at(48), u16_at(50)), (8, libc::IFLA_INFO_KIND));

    let mut huge = Request::new(libc::RTM_NEWLINK, 0);
    huge.attr(1, &[0; MAX_REQUEST]);
    assert!(matches!(huge.finish(1), Err(NetlinkError::TooLarge)));
    let mut over_u16 = Request::new(libc::RTM_NEWLINK, 0);
    over_u16.attr(1, &vec![0; 70_000]);
    assert!(matches!(over_u16.finish(1), Err(NetlinkError::TooLarge)));
}

#[test]
fn a_message_whose_length_runs_past_its_datagram_is_refused() {
    let mut datagram = Vec::new();
    for (len, kind) in [(20u32, NLMSG_ERROR), (64, NLMSG_ERROR)] {
        datagram.extend_from_slice(&len.to_ne_bytes());
        datagram.extend_from_slice(&kind.to_ne_bytes());
        datagram.extend_from_slice(&0u16.to_ne_bytes());
        datagram.extend_from_slice(&5u32.to_ne_bytes());
        datagram.extend_from_slice(&6u32.to_ne_bytes());
        datagram.extend_from_slice(&0i32.to_ne_bytes());
    }
    let parsed: Vec<_> = Messages::new(&datagram).collect();
    assert_eq!(parsed.len(), 2);
    let first = parsed[0].as_ref().unwrap();
    assert_eq!((first.kind, first.seq, first.port), (NLMSG_ERROR, 5, 6));
    assert_eq!(first.payload, 0i32.to_ne_bytes());
    assert_eq!(
        parsed[1].as_ref().unwrap_err(),
        &"a message whose length is outside the datagram"
    );
    let short: Vec<_> = Messages::new(&datagram[..10]).collect();
    assert_eq!(short.len(), 1);
    assert!(short[0].is_err());
}

#[test]
fn an_interface_name_the_kernel_would_refuse_is_refused_before_anything_is_sent() {
    for bad in [
        "",
        ".",
        "..",
        "a/b",
        "a b",
        "a:b",
        "a\0b",
        "sixteen-bytes-xx",
    ] {
        assert!(
            matches!(Name::new(bad), Err(NetlinkError::BadName(_))),
            "{bad:?}"
        );
    }
    assert!(Name::new("sxhabc-ffffffff").is_ok());
    assert!(matches!(
        veth::detach("a/b"),
        Err(veth::VethError::Netlink(NetlinkError::BadName(_)))
    ));
}
