//! The renderer's text: layers in order, per-sandbox chains, refusals of bad input.

use space_egress::plan::{AddressBlock, DEFAULT_BLOCK};
use space_egress::{GlobalDeny, NetworkMode, Policy};

use super::nft::{Attached, HostPorts, NftError, Ruleset, TableName, render};
use super::veth::{LinkNames, Pair};

pub(super) const PORTS: HostPorts = HostPorts {
    http: 3080,
    tls: 3443,
    dns: 3053,
};

pub(super) fn global(block: AddressBlock) -> GlobalDeny {
    GlobalDeny::builder()
        .host_address("192.0.2.10".parse().unwrap())
        .listener("192.0.2.20:7070".parse().unwrap())
        .listener("203.0.113.9".parse().unwrap())
        .listener("[2001:db8::1]:7070".parse().unwrap())
        .sandbox_block(block.net())
        .allow_private("10.20.0.0/16".parse().unwrap())
        .build()
        .unwrap()
}

fn policy(mode: NetworkMode, allow: &[&str], deny: &[&str]) -> Policy {
    Policy::parse(mode, allow, deny).unwrap()
}

struct Fixture {
    table: TableName,
    links: LinkNames,
    global: GlobalDeny,
    pairs: Vec<Pair>,
    policies: Vec<Policy>,
}

impl Fixture {
    fn new(policies: Vec<Policy>) -> Self {
        let links = LinkNames::new("t").unwrap();
        let pairs = (0..policies.len() as u32)
            .map(|i| links.pair(&DEFAULT_BLOCK, i).unwrap())
            .collect();
        Fixture {
            table: TableName::for_worker("w1").unwrap(),
            links,
            global: global(DEFAULT_BLOCK),
            pairs,
            policies,
        }
    }

    fn render(&self) -> Result<String, NftError> {
        self.render_with(PORTS)
    }

    /// The table with the proxy and resolver on `ports`.
    fn render_with(&self, ports: HostPorts) -> Result<String, NftError> {
        let attached: Vec<Attached<'_>> = self
            .pairs
            .iter()
            .zip(&self.policies)
            .map(|(pair, policy)| Attached { pair, policy })
            .collect();
        render(&Ruleset {
            table: &self.table,
            links: &self.links,
            block: DEFAULT_BLOCK,
            global: &self.global,
            ports,
            sandboxes: &attached,
            prepared: 0,
        })
    }
}

/// The lines of chain `name`, trimmed, without its braces.
fn chain<'a>(text: &'a str, name: &str) -> Vec<&'a str> {
    let start = format!("\tchain {name} {{");
    let body = &text[text
        .find(&start)
        .unwrap_or_else(|| panic!("no chain {name}"))
        + start.len()..];
    body.lines()
        .map(str::trim)
        .skip(1)
        .take_while(|l| *l != "}")
        .collect()
}

fn three() -> Fixture {
    Fixture::new(vec![
        policy(
            NetworkMode::Egress,
            &[
                "198.51.100.0/24",
                "pypi.org",
                "198.51.100.7",
                "2001:db8::/32",
            ],
            &["198.51.100.128/25", "2001:db8:1::/48"],
        ),
        policy(NetworkMode::Egress, &[], &["203.0.113.0/24"]),
        policy(NetworkMode::None, &["198.51.100.0/24"], &[]),
    ])
}

#[test]
fn the_table_replaces_itself_in_one_transaction() {
    let text = three().render().unwrap();
    let mut lines = text.lines();
    assert_eq!(lines.next(), Some("add table inet space_egress_w1"));
    assert_eq!(lines.next(), Some("delete table inet space_egress_w1"));
    assert_eq!(lines.next(), Some("table inet space_egress_w1 {"));
    assert_eq!(text.matches("\ntable ").count(), 1);
    assert!(text.ends_with("}\n"));
}

#[test]
fn a_sandbox_chain_drops_spoofed_sources_then_global_denies_then_its_own_then_accepts_its_allows() {
    let text = three().render().unwrap();
    assert_eq!(
        chain(&text, "forward_0"),
        [
            "ip saddr != 240.0.0.1 drop",
            "jump global_deny",
            "ip daddr { 198.51.100.128/25 } drop",
            "ip daddr { 198.51.100.0/24 } accept",
            "drop",
        ]
    );
}

#[test]
fn an_empty_allow_list_accepts_everything_past_the_denies() {
    let text = three().render().unwrap();
    assert_eq!(
        chain(&text, "forward_1"),
        [
            "ip saddr != 240.0.0.3 drop",
            "jump global_deny",
            "ip daddr { 203.0.113.0/24 } drop",
            "accept",
        ]
    );
}

#[test]
fn an_allow_list_of_names_only_accepts_no_address() {
    let text = Fixture::new(vec![policy(NetworkMode::Egress, &["pypi.org"], &[])])
        .render()
        .unwrap();
    assert_eq!(
        chain(&text, "forward_0"),
        ["ip saddr != 240.0.0.1 drop", "jump global_deny", "drop"]
    );
}

#[test]
fn a_sandbox_in_mode_none_is_dropped_both_ways() {
    let text = three().render().unwrap();
    assert_eq!(chain(&text, "forward_2"), ["drop"]);
    assert_eq!(chain(&text, "input_2"), ["drop"]);
}

#[test]
fn a_sandbox_reaches_only_the_proxy_and_resolver_ports_of_its_own_host_side() {
    let text = three().render().unwrap();
    assert_eq!(
        chain(&text, "input_1"),
        [
            "ip saddr != 240.0.0.3 drop",
            "ip daddr 240.0.0.2 tcp dport { 3053, 3080, 3443 } accept",
            "ip daddr 240.0.0.2 udp dport 3053 accept",
            "drop",
        ]
    );
    assert_eq!(
        chain(&text, "input"),
        [
            "type filter hook input priority filter; policy accept;",
            "iifname \"sxht-*\" goto sandbox_input",
            // Nothing but a sandbox link (or the host's loopback, where the services
            // turn strangers away) reaches the proxy and the resolver.
            "iifname != \"lo\" meta l4proto { tcp, udp } th dport { 3053, 3080, 3443 } drop"
        ]
    );
    assert_eq!(
        chain(&text, "sandbox_input"),
        [
            "meta nfproto != ipv4 drop",
            "iifname vmap @input_links",
            "drop"
        ]
    );
}

#[test]
fn each_link_leads_to_its_own_chains_through_the_maps() {
    let text = three().render().unwrap();
    assert!(text.contains(
        "\tmap forward_links {\n\t\ttype ifname : verdict\n\t\telements = { \"sxht-0\" : goto forward_0, \"sxht-1\" : goto forward_1, \"sxht-2\" : goto forward_2 }\n\t}\n"
    ));
    assert!(text.contains("\"sxht-2\" : goto input_2 }"));
}

#[test]
fn nothing_enters_a_sandbox_but_replies_and_no_ipv6_leaves_one() {
    let text = three().render().unwrap();
    assert_eq!(
        chain(&text, "forward"),
        [
            "type filter hook forward priority filter; policy accept;",
            "oifname \"sxht-*\" ct state established,related accept",
            "oifname \"sxht-*\" drop",
            "iifname \"sxht-*\" goto sandbox_forward",
        ]
    );
    assert_eq!(
        chain(&text, "sandbox_forward"),
        [
            "meta nfproto != ipv4 drop",
            "ct state established,related accept",
            "iifname vmap @forward_links",
            "drop",
        ]
    );
}

#[test]
fn web_and_dns_are_redirected_to_the_host_side_and_the_block_is_masqueraded() {
    let text = three().render().unwrap();
    assert_eq!(
        chain(&text, "prerouting"),
        [
            "type nat hook prerouting priority dstnat; policy accept;",
            "iifname \"sxht-*\" meta nfproto ipv4 tcp dport 80 redirect to :3080",
            "iifname \"sxht-*\" meta nfproto ipv4 tcp dport 443 redirect to :3443",
            "iifname \"sxht-*\" meta nfproto ipv4 meta l4proto { tcp, udp } th dport 53 redirect to :3053",
        ]
    );
    assert_eq!(
        chain(&text, "postrouting"),
        [
            "type nat hook postrouting priority srcnat; policy accept;",
            "oifname != \"sxht-*\" ip saddr 240.0.0.0/12 masquerade",
        ]
    );
}

#[test]
fn the_global_layers_come_in_packet_filter_order_without_overlaps() {
    let text = three().render().unwrap();
    assert_eq!(
        chain(&text, "global_deny"),
        [
            "ip daddr @always_denied drop",
            "ip daddr @listener_addrs drop",
            "meta l4proto { tcp, udp } ip daddr . th dport @listener_ports drop",
            "ip daddr @allowed_private return",
            "ip daddr @private drop",
        ]
    );
    // 169.254.169.254 lies in 169.254/16, 240/12 (the block) in 240/4: left out.
    assert!(text.contains(
        "\tset always_denied {\n\t\ttype ipv4_addr\n\t\tflags interval\n\t\telements = { 0.0.0.0/8, 100.100.100.200, 127.0.0.0/8, 168.63.129.16, 169.254.0.0/16, 192.0.2.10, 224.0.0.0/4, 240.0.0.0/4 }\n\t}\n"
    ), "{text}");
    assert!(text.contains("elements = { 203.0.113.9 }"));
    assert!(text.contains("elements = { 192.0.2.20 . 7070 }"));
    assert!(text.contains("\tset allowed_private {\n\t\ttype ipv4_addr\n\t\tflags interval\n\t\telements = { 10.20.0.0/16 }"));
    assert!(
        text.contains("elements = { 10.0.0.0/8, 100.64.0.0/10, 172.16.0.0/12, 192.168.0.0/16 }")
    );
    assert!(
        !text.contains("2001:db8"),
        "IPv6 rules and listeners are left out"
    );
}

#[test]
fn empty_sets_and_maps_are_declared_without_elements() {
    let text = Fixture::new(vec![]).render().unwrap();
    assert!(text.contains("\tmap input_links {\n\t\ttype ifname : verdict\n\t}\n"));
    assert!(!text.contains("{  }"));
}

#[test]
fn a_foreign_link_a_duplicate_an_address_outside_the_block_or_a_zero_port_is_refused() {
    let mut f = three();
    f.pairs[1] = LinkNames::new("x")
        .unwrap()
        .pair(&DEFAULT_BLOCK, 1)
        .unwrap();
    assert!(matches!(f.render(), Err(NftError::ForeignLink(l)) if l == "sxhx-1"));
    let mut f = three();
    f.pairs[1] = f.pairs[0].clone();
    assert!(matches!(f.render(), Err(NftError::DuplicateLink(l)) if l == "sxht-0"));
    let mut f = three();
    let other: AddressBlock = "198.18.0.0/15".parse().unwrap();
    f.pairs[1] = f.links.pair(&other, 1).unwrap();
    assert!(matches!(f.render(), Err(NftError::OutsideBlock { .. })));
    let err = three()
        .render_with(HostPorts { dns: 0, ..PORTS })
        .unwrap_err();
    assert_eq!(err.to_string(), "the resolver port is 0");
}

#[test]
fn worker_table_names_are_checked() {
    assert_eq!(TableName::shared().as_str(), "space_egress");
    assert_eq!(
        TableName::for_worker("w_2").unwrap().as_str(),
        "space_egress_w_2"
    );
    for bad in ["", "w 1", "w;1", "w-1", &"w".repeat(33)] {
        assert!(
            matches!(TableName::for_worker(bad), Err(NftError::BadWorkerName(_))),
            "{bad:?}"
        );
    }
}

#[test]
fn prepared_pairs_get_names_only_chains_and_a_sandbox_of_another_shape_keeps_its_own() {
    // Pair 0: an address rule (its own chains); pair 1: names only (the prepared ones).
    let f = Fixture::new(vec![
        policy(NetworkMode::Egress, &["203.0.113.0/24"], &[]),
        policy(NetworkMode::Egress, &["pypi.org"], &["evil.example"]),
    ]);
    let attached: Vec<Attached<'_>> = f
        .pairs
        .iter()
        .zip(&f.policies)
        .map(|(pair, policy)| Attached { pair, policy })
        .collect();
    let text = render(&Ruleset {
        table: &f.table,
        links: &f.links,
        block: DEFAULT_BLOCK,
        global: &f.global,
        ports: PORTS,
        sandboxes: &attached,
        prepared: 4,
    })
    .unwrap();
    assert_eq!(
        chain(&text, "forward_0"),
        [
            "ip saddr != 240.0.0.1 drop",
            "jump global_deny",
            "ip daddr { 203.0.113.0/24 } accept",
            "drop"
        ]
    );
    // Pairs 1 to 3, attached or not, have the same chains: nothing but the proxy and
    // the resolver of their own link.
    for i in 1..4u32 {
        let (own, host) = (2 * i + 1, 2 * i);
        assert_eq!(
            chain(&text, &format!("forward_{i:x}")),
            [
                format!("ip saddr != 240.0.0.{own} drop").as_str(),
                "jump global_deny",
                "drop"
            ]
        );
        assert_eq!(
            chain(&text, &format!("input_{i:x}"))[0],
            format!("ip saddr != 240.0.0.{own} drop")
        );
        assert!(
            chain(&text, &format!("input_{i:x}"))[1]
                .starts_with(&format!("ip daddr 240.0.0.{host} tcp dport"))
        );
        assert!(text.contains(&format!("\"sxht-{i:x}\" : goto forward_{i:x}")));
    }
    assert!(!text.contains("forward_4"), "only 4 pairs are prepared");
    assert_eq!(text.matches("\tchain forward_0 {").count(), 1);
    assert!(super::nft::names_only(&f.policies[1]));
    assert!(!super::nft::names_only(&f.policies[0]));
    assert!(!super::nft::names_only(&policy(
        NetworkMode::Egress,
        &[],
        &[]
    )));
    assert!(!super::nft::names_only(&Policy::none()));
}

/// Removes its table on drop, also when the test fails.
struct AppliedTable(TableName);

impl Drop for AppliedTable {
    fn drop(&mut self) {
        let _ = super::nft::remove(&self.0);
    }
}

#[test]
fn a_table_left_by_a_killed_worker_does_not_black_hole_loopback_listeners_on_its_ports() {
    super::testnet::require_tools!();
    // A listener the host gives an ephemeral port, as the edge of a later `space up`
    // got one that a dead worker's proxy had: the stale table names it.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let mut f = Fixture::new(vec![policy(NetworkMode::Egress, &[], &[])]);
    f.table = TableName::for_worker(&format!("stale{}", std::process::id())).unwrap();
    let script = f
        .render_with(HostPorts {
            http: port,
            tls: port,
            dns: port,
        })
        .unwrap();
    super::nft::apply(&script).unwrap();
    let _table = AppliedTable(f.table.clone());
    // Without the loopback exception the SYN is dropped and this times out.
    let c = std::net::TcpStream::connect_timeout(
        &std::net::SocketAddr::from(([127, 0, 0, 1], port)),
        std::time::Duration::from_secs(3),
    );
    assert!(c.is_ok(), "a loopback connect to {port}: {c:?}");
    let (_, peer) = listener.accept().unwrap();
    assert!(peer.ip().is_loopback());
}
