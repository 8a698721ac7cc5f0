//! The worker's nftables table: one `inet` table the platform owns, rendered whole
//! from the global deny list, the attached sandboxes and their policies, and replaced
//! atomically (`add table` + `delete table` + the table, in one `nft -f -`
//! transaction).
//!
//! Layout (see [`render`]): sets for the global list's layers in packet-filter
//! order; verdict maps from a host-side link to that sandbox's chains, so a packet
//! meets one sandbox's rules whatever the number of sandboxes; NAT (HTTP, TLS and DNS
//! redirected to the proxy and resolver on the pair's host side, masquerade for the
//! block leaving the host); `input` (a sandbox reaches only those ports on its own host
//! side, and nothing but a sandbox link or the host's loopback reaches those ports: the
//! proxy is never open to the host's other networks. Loopback is left to the services,
//! which turn away every peer that is not a sandbox: a table that outlives its worker —
//! one killed before it could remove it — must not black-hole the host's own listeners
//! that later get those ephemeral ports, as it did to a test cluster's edge) and `forward` (nothing enters a sandbox but replies; a sandbox's new
//! connections pass the global list, its denies, then its allows).
//!
//! IPv4 only: the address plan gives sandboxes IPv4 addresses, and every IPv6 packet
//! from a sandbox link is dropped (IPv6 rules of a policy have no effect here).

use std::collections::{BTreeSet, HashSet};
use std::fmt::Write as _;
use std::net::{IpAddr, Ipv4Addr};

use space_egress::plan::AddressBlock;
use space_egress::{GlobalDeny, IpNet, NetworkMode, Policy, canonical};

use super::command::{CommandError, run};
use super::veth::{LinkNames, Pair};

/// Longest worker name in a table name.
pub const MAX_WORKER_NAME: usize = 32;

/// Why a table could not be rendered, applied or removed.
#[derive(Debug, thiserror::Error)]
pub enum NftError {
    #[error("worker name {0:?} for a table: 1 to {MAX_WORKER_NAME} ASCII letters, digits or `_`")]
    BadWorkerName(String),
    #[error("the {0} port is 0")]
    ZeroPort(&'static str),
    #[error("link {0:?} is not one of this worker's links")]
    ForeignLink(String),
    #[error("link {link}: address {addr} is outside the block {block}")]
    OutsideBlock {
        link: String,
        addr: Ipv4Addr,
        block: AddressBlock,
    },
    #[error("link {0:?} is attached twice")]
    DuplicateLink(String),
    #[error(transparent)]
    Command(#[from] CommandError),
}

/// The name of the platform's table (`space_egress`, or `space_egress_<worker>` when
/// several workers share a host).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TableName(String);

impl TableName {
    /// `space_egress`.
    pub fn shared() -> Self {
        TableName("space_egress".into())
    }

    /// `space_egress_<worker>`.
    pub fn for_worker(worker: &str) -> Result<Self, NftError> {
        let ok = (1..=MAX_WORKER_NAME).contains(&worker.len())
            && worker
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'_');
        if !ok {
            return Err(NftError::BadWorkerName(worker.chars().take(40).collect()));
        }
        Ok(TableName(format!("space_egress_{worker}")))
    }

    /// The table's name.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// Host-side ports of the platform's proxy (HTTP and TLS) and resolver (UDP and TCP),
/// on each pair's host-side address.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HostPorts {
    pub http: u16,
    pub tls: u16,
    pub dns: u16,
}

/// One attached sandbox: its pair and its policy.
#[derive(Debug, Clone, Copy)]
pub struct Attached<'a> {
    pub pair: &'a Pair,
    pub policy: &'a Policy,
}

/// Everything one table is rendered from.
#[derive(Debug, Clone, Copy)]
pub struct Ruleset<'a> {
    pub table: &'a TableName,
    pub links: &'a LinkNames,
    pub block: AddressBlock,
    pub global: &'a GlobalDeny,
    pub ports: HostPorts,
    pub sandboxes: &'a [Attached<'a>],
    /// Pairs `0..prepared` get chains of the [`names_only`] shape whether a sandbox is
    /// attached there or not, so that a sandbox whose policy has that shape (the usual
    /// `--allow pypi.org`) is given its link without an `nft` run. Such chains grant
    /// nothing but the proxy and resolver ports of their own link.
    pub prepared: u32,
}

/// Whether `policy` needs no rules of its own in the table: mode `egress` with a
/// non-empty allow list and no address rule on either list. Then every packet that is
/// not HTTP, TLS or DNS is dropped, and what those carry is judged by name by the
/// proxy and the resolver: the same chains serve every such sandbox.
pub fn names_only(policy: &Policy) -> bool {
    policy.mode == NetworkMode::Egress
        && !policy.allow().is_empty()
        && policy.allowed_networks().next().is_none()
        && policy.denied_networks().next().is_none()
}

/// The IPv4 networks of `nets`, with every network inside another left out: CIDR
/// networks nest or are disjoint, so what remains never overlaps (an interval set
/// refuses overlapping elements).
fn disjoint_v4(nets: impl Iterator<Item = IpNet>) -> Vec<IpNet> {
    let mut v4: Vec<(u32, u8, IpNet)> = nets
        .filter_map(|n| match n.addr() {
            IpAddr::V4(a) => Some((u32::from(a), n.prefix(), n)),
            IpAddr::V6(_) => None,
        })
        .collect();
    // By first address, the widest first among networks starting together.
    v4.sort_by_key(|&(start, prefix, _)| (start, prefix));
    let mut kept: Vec<IpNet> = Vec::new();
    let mut end: Option<u64> = None;
    for (start, prefix, net) in v4 {
        let start = u64::from(start);
        if end.is_some_and(|e| start <= e) {
            continue;
        }
        end = Some(start + (1u64 << (32 - u32::from(prefix))) - 1);
        kept.push(net);
    }
    kept
}

fn elements<T: ToString>(items: impl IntoIterator<Item = T>) -> String {
    items
        .into_iter()
        .map(|i| i.to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

/// A named set (`keyword` `set`) or map (`map`); `elements` left out when empty (nft
/// refuses `elements = { }`).
fn declare(out: &mut String, keyword: &str, name: &str, kind: &str, interval: bool, items: &str) {
    let _ = writeln!(out, "\t{keyword} {name} {{\n\t\ttype {kind}");
    if interval {
        out.push_str("\t\tflags interval\n");
    }
    if !items.is_empty() {
        let _ = writeln!(out, "\t\telements = {{ {items} }}");
    }
    out.push_str("\t}\n");
}

fn validate(r: &Ruleset<'_>) -> Result<(), NftError> {
    for (port, what) in [
        (r.ports.http, "HTTP proxy"),
        (r.ports.tls, "TLS proxy"),
        (r.ports.dns, "resolver"),
    ] {
        if port == 0 {
            return Err(NftError::ZeroPort(what));
        }
    }
    if r.prepared > r.block.capacity() {
        return Err(NftError::OutsideBlock {
            link: r.links.host_link(r.prepared - 1),
            addr: Ipv4Addr::UNSPECIFIED,
            block: r.block,
        });
    }
    let mut seen = HashSet::new();
    for s in r.sandboxes {
        let link = s.pair.host_link();
        if !r.links.owns(link) {
            return Err(NftError::ForeignLink(link.into()));
        }
        if !seen.insert(link) {
            return Err(NftError::DuplicateLink(link.into()));
        }
        for addr in [s.pair.host_addr(), s.pair.sandbox_addr()] {
            if !r.block.net().contains(addr.into()) {
                return Err(NftError::OutsideBlock {
                    link: link.into(),
                    addr,
                    block: r.block,
                });
            }
        }
    }
    Ok(())
}

/// The `nft -f -` script that replaces the table with the one `r` describes.
///
/// Every name and address written comes from a validated type (link names are
/// checked to be this worker's, addresses to lie in the block), so nothing from a
/// policy can inject nftables syntax: a policy contributes only parsed networks.
pub fn render(r: &Ruleset<'_>) -> Result<String, NftError> {
    validate(r)?;
    let name = r.table.as_str();
    let links = r.links.wildcard();
    let g = r.global;
    let mut out = String::new();
    // `add` makes the `delete` valid when the table is absent; the three commands are
    // one transaction, so the old table is in force until the new one is.
    let _ = writeln!(out, "add table inet {name}\ndelete table inet {name}");
    let _ = writeln!(out, "table inet {name} {{");

    let listeners: BTreeSet<(Ipv4Addr, Option<u16>)> = g
        .listeners()
        .iter()
        .filter_map(|l| match canonical(l.addr) {
            IpAddr::V4(a) => Some((a, l.port)),
            IpAddr::V6(_) => None,
        })
        .collect();
    let listener_addrs = elements(listeners.iter().filter(|l| l.1.is_none()).map(|l| l.0));
    let listener_ports = elements(
        listeners
            .iter()
            .filter_map(|&(a, p)| p.map(|p| format!("{a} . {p}"))),
    );
    declare(
        &mut out,
        "set",
        "always_denied",
        "ipv4_addr",
        true,
        &elements(disjoint_v4(g.always_denied())),
    );
    declare(
        &mut out,
        "set",
        "listener_addrs",
        "ipv4_addr",
        false,
        &listener_addrs,
    );
    declare(
        &mut out,
        "set",
        "listener_ports",
        "ipv4_addr . inet_service",
        false,
        &listener_ports,
    );
    declare(
        &mut out,
        "set",
        "allowed_private",
        "ipv4_addr",
        true,
        &elements(disjoint_v4(g.allowed_private().iter().copied())),
    );
    declare(
        &mut out,
        "set",
        "private",
        "ipv4_addr",
        true,
        &elements(disjoint_v4(g.private())),
    );

    // Per-sandbox chains before the maps that name them: a prepared pair's (of the
    // names-only shape) unless the sandbox there needs its own.
    let own: Vec<&Attached<'_>> = r
        .sandboxes
        .iter()
        .filter(|s| s.pair.index() >= r.prepared || !names_only(s.policy))
        .collect();
    let prepared: Vec<Pair> = (0..r.prepared)
        .filter(|i| !own.iter().any(|s| s.pair.index() == *i))
        .filter_map(|i| r.links.pair(&r.block, i).ok())
        .collect();
    let shape = names_only_policy();
    let chains: Vec<Attached<'_>> = own
        .iter()
        .map(|s| **s)
        .chain(prepared.iter().map(|pair| Attached {
            pair,
            policy: &shape,
        }))
        .collect();
    for s in &chains {
        sandbox_chains(&mut out, s, r.ports);
    }
    for (map, prefix) in [("input_links", "input"), ("forward_links", "forward")] {
        let items = elements(chains.iter().map(|s| {
            format!(
                "\"{}\" : goto {prefix}_{:x}",
                s.pair.host_link(),
                s.pair.index()
            )
        }));
        declare(&mut out, "map", map, "ifname : verdict", false, &items);
    }

    let p = r.ports;
    let _ = write!(
        out,
        "\
\tchain prerouting {{
\t\ttype nat hook prerouting priority dstnat; policy accept;
\t\tiifname \"{links}\" meta nfproto ipv4 tcp dport 80 redirect to :{http}
\t\tiifname \"{links}\" meta nfproto ipv4 tcp dport 443 redirect to :{tls}
\t\tiifname \"{links}\" meta nfproto ipv4 meta l4proto {{ tcp, udp }} th dport 53 redirect to :{dns}
\t}}
\tchain postrouting {{
\t\ttype nat hook postrouting priority srcnat; policy accept;
\t\toifname != \"{links}\" ip saddr {block} masquerade
\t}}
\tchain input {{
\t\ttype filter hook input priority filter; policy accept;
\t\tiifname \"{links}\" goto sandbox_input
\t\tiifname != \"lo\" meta l4proto {{ tcp, udp }} th dport {{ {service_ports} }} drop
\t}}
\tchain sandbox_input {{
\t\tmeta nfproto != ipv4 drop
\t\tiifname vmap @input_links
\t\tdrop
\t}}
\tchain forward {{
\t\ttype filter hook forward priority filter; policy accept;
\t\toifname \"{links}\" ct state established,related accept
\t\toifname \"{links}\" drop
\t\tiifname \"{links}\" goto sandbox_forward
\t}}
\tchain sandbox_forward {{
\t\tmeta nfproto != ipv4 drop
\t\tct state established,related accept
\t\tiifname vmap @forward_links
\t\tdrop
\t}}
\tchain global_deny {{
\t\tip daddr @always_denied drop
\t\tip daddr @listener_addrs drop
\t\tmeta l4proto {{ tcp, udp }} ip daddr . th dport @listener_ports drop
\t\tip daddr @allowed_private return
\t\tip daddr @private drop
\t}}
}}
",
        http = p.http,
        tls = p.tls,
        dns = p.dns,
        block = r.block,
        service_ports = elements(BTreeSet::from([p.http, p.tls, p.dns])),
    );
    Ok(out)
}

/// A policy of the [`names_only`] shape (its one name plays no part in the table).
fn names_only_policy() -> Policy {
    Policy::parse(NetworkMode::Egress, &["prepared.invalid"], &[] as &[&str])
        .expect("a valid policy")
}

/// `input_<index>` and `forward_<index>` of one sandbox.
fn sandbox_chains(out: &mut String, s: &Attached<'_>, ports: HostPorts) {
    let i = s.pair.index();
    let own = s.pair.sandbox_addr();
    let host = s.pair.host_addr();
    let none = s.policy.mode == NetworkMode::None;
    let _ = writeln!(out, "\tchain input_{i:x} {{");
    if !none {
        let _ = writeln!(out, "\t\tip saddr != {own} drop");
        let tcp = elements(BTreeSet::from([ports.http, ports.tls, ports.dns]));
        let _ = writeln!(out, "\t\tip daddr {host} tcp dport {{ {tcp} }} accept");
        let _ = writeln!(out, "\t\tip daddr {host} udp dport {} accept", ports.dns);
    }
    out.push_str("\t\tdrop\n\t}\n");
    let _ = writeln!(out, "\tchain forward_{i:x} {{");
    if !none {
        let _ = writeln!(out, "\t\tip saddr != {own} drop");
        out.push_str("\t\tjump global_deny\n");
        let denied = elements(disjoint_v4(s.policy.denied_networks()));
        if !denied.is_empty() {
            let _ = writeln!(out, "\t\tip daddr {{ {denied} }} drop");
        }
        // An empty allow list allows every address the denies let through. Otherwise
        // only address rules allow: with names alone, nothing passes here (HTTP and TLS
        // go through the proxy, which judges names).
        let allowed = elements(disjoint_v4(s.policy.allowed_networks()));
        if s.policy.allow().is_empty() {
            out.push_str("\t\taccept\n\t}\n");
            return;
        }
        if !allowed.is_empty() {
            let _ = writeln!(out, "\t\tip daddr {{ {allowed} }} accept");
        }
    }
    out.push_str("\t\tdrop\n\t}\n");
}

/// Applies a script from [`render`] (`nft -f -`). Blocking.
pub fn apply(script: &str) -> Result<(), NftError> {
    Ok(run("nft", &["-f", "-"], Some(script.as_bytes()))?)
}

/// Removes the table; an absent table is success. Blocking.
pub fn remove(table: &TableName) -> Result<(), NftError> {
    let name = table.as_str();
    let script = format!("add table inet {name}\ndelete table inet {name}\n");
    Ok(run("nft", &["-f", "-"], Some(script.as_bytes()))?)
}

/// Whether the table exists. Blocking.
pub fn table_exists(table: &TableName) -> Result<bool, NftError> {
    match run("nft", &["list", "table", "inet", table.as_str()], None) {
        Ok(()) => Ok(true),
        Err(e)
            if e.stderr()
                .is_some_and(|s| s.contains("No such file or directory")) =>
        {
            Ok(false)
        }
        Err(e) => Err(e.into()),
    }
}
