//! The global deny list: addresses no sandbox may reach, whatever its policy says.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::str::FromStr;

use crate::net::{IpNet, NetError, canonical};

/// Most entries of each kind of operator input (host addresses, listeners, extra
/// denies, allowed private ranges, sandbox blocks).
pub const MAX_OPERATOR_ENTRIES: usize = 4096;

/// One entry: a network and what it is, for the refusal's message.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Entry {
    net: IpNet,
    what: &'static str,
}

/// A platform listener: an address and, when known, the one port to refuse on it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Listener {
    pub addr: IpAddr,
    pub port: Option<u16>,
}

/// Why operator input for the global list was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GlobalError {
    #[error(
        "--allow-private {0}: not inside a private range (10.0.0.0/8, 172.16.0.0/12, \
         192.168.0.0/16, 100.64.0.0/10, fc00::/7); loopback, link-local and metadata \
         addresses can never be allowed"
    )]
    AllowNotPrivate(IpNet),
    #[error("more than {MAX_OPERATOR_ENTRIES} {0}")]
    TooMany(&'static str),
    #[error("listener {text:?}: {error}")]
    BadListener { text: String, error: NetError },
    #[error("listener {0:?}: the port is not a number from 1 to 65535")]
    BadListenerPort(String),
}

/// The global deny list, built from the defaults and the operator's input.
///
/// Judging an address (after mapping `::ffff:a.b.c.d` to `a.b.c.d`):
/// 1. the fixed entries — "this network", loopback, link-local, metadata addresses,
///    multicast, broadcast, reserved and deprecated ranges — plus the host's own
///    addresses, the platform's listeners, the sandboxes' address blocks and the
///    operator's extra denies: never overridable;
/// 2. the private ranges (RFC 1918, shared address space 100.64/10, ULA fc00::/7),
///    except the parts the operator allows (`--allow-private`);
/// 3. an IPv6 address embedding an IPv4 one that a translator would reach (NAT64
///    `64:ff9b::/96`, 6to4 `2002::/16`, SIIT `::ffff:0:0:0/96`) is refused when the
///    embedded address is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GlobalDeny {
    fixed: Vec<Entry>,
    private: Vec<Entry>,
    allowed_private: Vec<IpNet>,
    listeners: Vec<Listener>,
}

/// Operator input for [`GlobalDeny`]; [`GlobalDenyBuilder::build`] validates it.
#[derive(Debug, Clone, Default)]
pub struct GlobalDenyBuilder {
    host_addresses: Vec<IpAddr>,
    listeners: Vec<Listener>,
    sandbox_blocks: Vec<IpNet>,
    extra_deny: Vec<IpNet>,
    allow_private: Vec<IpNet>,
}

fn fixed_defaults() -> Vec<Entry> {
    let e = |net, what| Entry { net, what };
    vec![
        e(IpNet::v4(0, 0, 0, 0, 8), "this network"),
        e(IpNet::v4(127, 0, 0, 0, 8), "loopback"),
        e(IpNet::v4(169, 254, 169, 254, 32), "metadata"),
        e(IpNet::v4(169, 254, 0, 0, 16), "link-local"),
        // Alibaba Cloud's metadata service sits inside the shared address space, which
        // an operator may allow; Azure's host services use a public address.
        e(IpNet::v4(100, 100, 100, 200, 32), "metadata"),
        e(IpNet::v4(168, 63, 129, 16, 32), "metadata"),
        e(IpNet::v4(224, 0, 0, 0, 4), "multicast"),
        e(IpNet::v4(255, 255, 255, 255, 32), "broadcast"),
        e(IpNet::v4(240, 0, 0, 0, 4), "reserved"),
        e(IpNet::v6([0; 8], 128), "unspecified"),
        e(IpNet::v6([0, 0, 0, 0, 0, 0, 0, 1], 128), "loopback"),
        e(IpNet::v6([0; 8], 96), "IPv4-compatible (deprecated)"),
        e(
            IpNet::v6([0xfd00, 0xec2, 0, 0, 0, 0, 0, 0x254], 128),
            "metadata",
        ),
        e(IpNet::v6([0xfe80, 0, 0, 0, 0, 0, 0, 0], 10), "link-local"),
        e(
            IpNet::v6([0xfec0, 0, 0, 0, 0, 0, 0, 0], 10),
            "site-local (deprecated)",
        ),
        e(IpNet::v6([0xff00, 0, 0, 0, 0, 0, 0, 0], 8), "multicast"),
    ]
}

fn private_defaults() -> Vec<Entry> {
    let e = |net, what| Entry { net, what };
    vec![
        e(IpNet::v4(10, 0, 0, 0, 8), "private"),
        e(IpNet::v4(172, 16, 0, 0, 12), "private"),
        e(IpNet::v4(192, 168, 0, 0, 16), "private"),
        e(IpNet::v4(100, 64, 0, 0, 10), "shared address space"),
        e(IpNet::v6([0xfc00, 0, 0, 0, 0, 0, 0, 0], 7), "unique local"),
    ]
}

impl Default for GlobalDeny {
    fn default() -> Self {
        GlobalDeny::defaults()
    }
}

impl GlobalDeny {
    /// The defaults alone (no host addresses, listeners or operator input).
    pub fn defaults() -> Self {
        GlobalDeny {
            fixed: fixed_defaults(),
            private: private_defaults(),
            allowed_private: Vec::new(),
            listeners: Vec::new(),
        }
    }

    /// Operator input on top of the defaults.
    pub fn builder() -> GlobalDenyBuilder {
        GlobalDenyBuilder::default()
    }

    /// The entry that refuses `ip:port` (`"127.0.0.0/8 (loopback)"`), or `None`.
    pub fn check(&self, ip: IpAddr, port: u16) -> Option<String> {
        let ip = canonical(ip);
        if let Some(found) = self.check_direct(ip, port) {
            return Some(found);
        }
        let (embedded, via) = embedded_v4(ip)?;
        self.check_direct(IpAddr::V4(embedded), port)
            .map(|found| format!("{via} of {found}"))
    }

    /// Networks refused to every sandbox on every port, whatever the operator allows
    /// (for a packet filter's first set).
    pub fn always_denied(&self) -> impl Iterator<Item = IpNet> + '_ {
        self.fixed.iter().map(|e| e.net)
    }

    /// The platform's listeners (a port of `None`: every port), refused after
    /// [`GlobalDeny::always_denied`].
    pub fn listeners(&self) -> &[Listener] {
        &self.listeners
    }

    /// Private ranges the operator allows: a packet filter accepts them after the two
    /// sets above and before [`GlobalDeny::private`].
    pub fn allowed_private(&self) -> &[IpNet] {
        &self.allowed_private
    }

    /// The private ranges, refused unless [`GlobalDeny::allowed_private`] let the
    /// address through.
    pub fn private(&self) -> impl Iterator<Item = IpNet> + '_ {
        self.private.iter().map(|e| e.net)
    }

    fn check_direct(&self, ip: IpAddr, port: u16) -> Option<String> {
        if let Some(entry) = self.fixed.iter().find(|e| e.net.contains(ip)) {
            return Some(format!("{} ({})", entry.net, entry.what));
        }
        if let Some(l) = self
            .listeners
            .iter()
            .find(|l| canonical(l.addr) == ip && l.port.is_none_or(|p| p == port))
        {
            return Some(format!("{l} (platform listener)"));
        }
        let entry = self.private.iter().find(|e| e.net.contains(ip))?;
        if self.allowed_private.iter().any(|a| a.contains(ip)) {
            return None;
        }
        Some(format!("{} ({})", entry.net, entry.what))
    }
}

/// IPv6 prefixes that carry an IPv4 address a translator would reach: NAT64
/// `64:ff9b::/96`, IPv4-translated `::ffff:0:0:0/96` (both in the low 32 bits) and
/// 6to4 `2002::/16` (bits 16–48). A packet filter that cannot look inside them may
/// refuse them whole; [`GlobalDeny::check`] judges the embedded address.
pub fn translation_prefixes() -> [IpNet; 3] {
    [
        IpNet::v6([0x64, 0xff9b, 0, 0, 0, 0, 0, 0], 96),
        IpNet::v6([0, 0, 0, 0, 0xffff, 0, 0, 0], 96),
        IpNet::v6([0x2002, 0, 0, 0, 0, 0, 0, 0], 16),
    ]
}

/// The IPv4 address a translator would reach for `ip`, and the translation's name.
fn embedded_v4(ip: IpAddr) -> Option<(Ipv4Addr, &'static str)> {
    let IpAddr::V6(v6) = ip else { return None };
    let bits = u128::from(v6);
    let low32 = Ipv4Addr::from((bits & 0xffff_ffff) as u32);
    let [nat64, siit, six_to_four] = translation_prefixes();
    if nat64.contains(ip) {
        Some((low32, "64:ff9b::/96 (NAT64)"))
    } else if siit.contains(ip) {
        Some((low32, "::ffff:0:0:0/96 (IPv4-translated)"))
    } else if six_to_four.contains(ip) {
        Some((
            Ipv4Addr::from(((bits >> 80) & 0xffff_ffff) as u32),
            "2002::/16 (6to4)",
        ))
    } else {
        None
    }
}

impl GlobalDenyBuilder {
    /// One of the host's own addresses (every port).
    pub fn host_address(mut self, ip: IpAddr) -> Self {
        self.host_addresses.push(ip);
        self
    }

    /// A listener of the platform (edge, control plane, a worker's node-api). One bound
    /// to an unspecified address (`0.0.0.0:7070`) is covered by the host's addresses,
    /// which the caller passes with [`GlobalDenyBuilder::host_address`].
    pub fn listener(mut self, listener: Listener) -> Self {
        self.listeners.push(listener);
        self
    }

    /// A block the worker gives sandboxes addresses from: no sandbox reaches another
    /// sandbox, nor the host side of another sandbox's link.
    pub fn sandbox_block(mut self, net: IpNet) -> Self {
        self.sandbox_blocks.push(net);
        self
    }

    /// An extra network the operator refuses to every sandbox.
    pub fn deny(mut self, net: IpNet) -> Self {
        self.extra_deny.push(net);
        self
    }

    /// A private range the operator lets sandboxes reach (`--allow-private`); checked
    /// by [`GlobalDenyBuilder::build`] to lie inside one of the private ranges.
    pub fn allow_private(mut self, net: IpNet) -> Self {
        self.allow_private.push(net);
        self
    }

    /// Validates the input and builds the list.
    pub fn build(self) -> Result<GlobalDeny, GlobalError> {
        let counts = [
            (self.host_addresses.len(), "host addresses"),
            (self.listeners.len(), "listeners"),
            (self.sandbox_blocks.len(), "sandbox blocks"),
            (self.extra_deny.len(), "denied networks"),
            (self.allow_private.len(), "allowed private ranges"),
        ];
        if let Some((_, what)) = counts.iter().find(|(n, _)| *n > MAX_OPERATOR_ENTRIES) {
            return Err(GlobalError::TooMany(what));
        }
        let private = private_defaults();
        if let Some(bad) = self
            .allow_private
            .iter()
            .find(|a| !private.iter().any(|p| p.net.covers(a)))
        {
            return Err(GlobalError::AllowNotPrivate(*bad));
        }
        let mut fixed = fixed_defaults();
        let host = self.host_addresses.into_iter().map(|ip| Entry {
            net: IpNet::host(ip),
            what: "host address",
        });
        let blocks = self.sandbox_blocks.into_iter().map(|net| Entry {
            net,
            what: "sandbox addresses",
        });
        let extra = self.extra_deny.into_iter().map(|net| Entry {
            net,
            what: "denied by the operator",
        });
        fixed.extend(host.chain(blocks).chain(extra));
        Ok(GlobalDeny {
            fixed,
            private,
            allowed_private: self.allow_private,
            listeners: self.listeners,
        })
    }
}

impl FromStr for Listener {
    type Err = GlobalError;

    /// `addr`, `addr:port`, `[v6]:port` or a bare IPv6 address.
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let bad = |error| GlobalError::BadListener {
            text: text.chars().take(80).collect(),
            error,
        };
        if text.len() > 64 {
            return Err(bad(NetError::TooLong));
        }
        if let Ok(addr) = text.parse::<IpAddr>() {
            return Ok(Listener { addr, port: None });
        }
        if let Ok(sock) = text.parse::<SocketAddr>() {
            if sock.port() == 0 {
                return Err(GlobalError::BadListenerPort(text.into()));
            }
            return Ok(Listener {
                addr: sock.ip(),
                port: Some(sock.port()),
            });
        }
        match text.rsplit_once(':') {
            Some((addr, _)) if addr.trim_matches(['[', ']']).parse::<IpAddr>().is_ok() => Err(
                GlobalError::BadListenerPort(text.chars().take(80).collect()),
            ),
            _ => Err(bad(NetError::BadAddress)),
        }
    }
}

impl fmt::Display for Listener {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (self.addr, self.port) {
            (addr, None) => write!(f, "{addr}"),
            (addr, Some(port)) => write!(f, "{}", SocketAddr::new(addr, port)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::net::Ipv6Addr;

    fn ip(text: &str) -> IpAddr {
        text.parse().unwrap()
    }

    fn net(text: &str) -> IpNet {
        text.parse().unwrap()
    }

    fn v6(text: &str) -> Ipv6Addr {
        text.parse().unwrap()
    }

    #[test]
    fn the_defaults_refuse_each_documented_range() {
        let g = GlobalDeny::defaults();
        let cases = [
            ("127.0.0.1", "127.0.0.0/8 (loopback)"),
            ("127.255.255.254", "127.0.0.0/8 (loopback)"),
            ("0.0.0.0", "0.0.0.0/8 (this network)"),
            ("169.254.169.254", "169.254.169.254 (metadata)"),
            ("169.254.1.1", "169.254.0.0/16 (link-local)"),
            ("100.100.100.200", "100.100.100.200 (metadata)"),
            ("168.63.129.16", "168.63.129.16 (metadata)"),
            ("10.1.2.3", "10.0.0.0/8 (private)"),
            ("172.31.255.255", "172.16.0.0/12 (private)"),
            ("192.168.0.1", "192.168.0.0/16 (private)"),
            ("100.64.0.1", "100.64.0.0/10 (shared address space)"),
            ("224.0.0.251", "224.0.0.0/4 (multicast)"),
            ("255.255.255.255", "255.255.255.255 (broadcast)"),
            ("240.0.0.1", "240.0.0.0/4 (reserved)"),
            ("::1", "::1 (loopback)"),
            ("::", ":: (unspecified)"),
            ("fd00:ec2::254", "fd00:ec2::254 (metadata)"),
            ("fe80::1", "fe80::/10 (link-local)"),
            ("fd12:3456::1", "fc00::/7 (unique local)"),
            ("ff02::1", "ff00::/8 (multicast)"),
        ];
        for (addr, rule) in cases {
            assert_eq!(g.check(ip(addr), 443).as_deref(), Some(rule), "{addr}");
        }
    }

    #[test]
    fn public_and_documentation_addresses_pass_the_defaults() {
        let g = GlobalDeny::defaults();
        for addr in [
            "203.0.113.7",
            "198.51.100.1",
            "198.18.0.1",
            "8.8.8.8",
            "2001:db8::1",
            "2606:4700::1111",
        ] {
            assert_eq!(g.check(ip(addr), 443), None, "{addr}");
        }
    }

    #[test]
    fn an_ipv4_mapped_address_is_judged_by_its_ipv4() {
        let g = GlobalDeny::defaults();
        assert_eq!(
            g.check(ip("::ffff:127.0.0.1"), 80).as_deref(),
            Some("127.0.0.0/8 (loopback)")
        );
        assert_eq!(
            g.check(ip("::ffff:169.254.169.254"), 80).as_deref(),
            Some("169.254.169.254 (metadata)")
        );
        assert_eq!(g.check(ip("::ffff:203.0.113.7"), 80), None);
    }

    #[test]
    fn a_translated_ipv6_address_is_refused_when_its_ipv4_is() {
        let g = GlobalDeny::defaults();
        assert_eq!(
            g.check(ip("64:ff9b::a9fe:a9fe"), 80).as_deref(),
            Some("64:ff9b::/96 (NAT64) of 169.254.169.254 (metadata)")
        );
        assert_eq!(
            g.check(IpAddr::V6(v6("2002:7f00:1::")), 80).as_deref(),
            Some("2002::/16 (6to4) of 127.0.0.0/8 (loopback)")
        );
        assert_eq!(
            g.check(ip("::ffff:0:a00:1"), 80).as_deref(),
            Some("::ffff:0:0:0/96 (IPv4-translated) of 10.0.0.0/8 (private)")
        );
        assert_eq!(g.check(ip("64:ff9b::cb00:7107"), 80), None);
    }

    #[test]
    fn host_addresses_listeners_and_sandbox_blocks_are_refused() {
        let g = GlobalDeny::builder()
            .host_address(ip("198.51.100.10"))
            .listener("203.0.113.20:7070".parse().unwrap())
            .listener("2001:db8::20".parse().unwrap())
            .sandbox_block(net("198.18.0.0/15"))
            .deny(net("192.0.2.0/24"))
            .build()
            .unwrap();
        assert_eq!(
            g.check(ip("198.51.100.10"), 22).as_deref(),
            Some("198.51.100.10 (host address)")
        );
        assert_eq!(
            g.check(ip("203.0.113.20"), 7070).as_deref(),
            Some("203.0.113.20:7070 (platform listener)")
        );
        assert_eq!(
            g.check(ip("203.0.113.20"), 443),
            None,
            "only the listener's port"
        );
        assert_eq!(
            g.check(ip("2001:db8::20"), 1).as_deref(),
            Some("2001:db8::20 (platform listener)")
        );
        assert_eq!(
            g.check(ip("198.19.0.1"), 80).as_deref(),
            Some("198.18.0.0/15 (sandbox addresses)")
        );
        assert_eq!(
            g.check(ip("192.0.2.1"), 80).as_deref(),
            Some("192.0.2.0/24 (denied by the operator)")
        );
    }

    #[test]
    fn an_allowed_private_range_passes_but_nothing_else_private_does() {
        let g = GlobalDeny::builder()
            .allow_private(net("10.20.0.0/16"))
            .build()
            .unwrap();
        assert_eq!(g.check(ip("10.20.3.4"), 5432), None);
        assert_eq!(g.check(ip("::ffff:10.20.3.4"), 5432), None);
        assert_eq!(
            g.check(ip("10.21.0.1"), 5432).as_deref(),
            Some("10.0.0.0/8 (private)")
        );
    }

    #[test]
    fn allowing_a_private_range_never_allows_the_host_or_a_listener_inside_it() {
        let g = GlobalDeny::builder()
            .allow_private(net("10.0.0.0/8"))
            .host_address(ip("10.0.0.5"))
            .listener("10.0.0.6:9000".parse().unwrap())
            .allow_private(net("fd00::/8"))
            .build()
            .unwrap();
        assert_eq!(
            g.check(ip("10.0.0.5"), 80).as_deref(),
            Some("10.0.0.5 (host address)")
        );
        assert_eq!(
            g.check(ip("10.0.0.6"), 9000).as_deref(),
            Some("10.0.0.6:9000 (platform listener)")
        );
        assert_eq!(g.check(ip("10.0.0.6"), 9001), None);
        assert_eq!(
            g.check(ip("fd00:ec2::254"), 80).as_deref(),
            Some("fd00:ec2::254 (metadata)")
        );
    }

    #[test]
    fn loopback_link_local_metadata_or_everything_cannot_be_allowed() {
        for bad in [
            "127.0.0.0/8",
            "169.254.0.0/16",
            "169.254.169.254",
            "0.0.0.0/0",
            "::/0",
            "fe80::/10",
            "8.8.8.0/24",
            "10.0.0.0/7",
        ] {
            let err = GlobalDeny::builder()
                .allow_private(net(bad))
                .build()
                .unwrap_err();
            assert_eq!(err, GlobalError::AllowNotPrivate(net(bad)), "{bad}");
            assert!(err.to_string().contains("can never be allowed"));
        }
    }

    #[test]
    fn listeners_parse_with_or_without_a_port_and_refuse_junk() {
        assert_eq!(
            "127.0.0.1:7070".parse::<Listener>(),
            Ok(Listener {
                addr: ip("127.0.0.1"),
                port: Some(7070)
            })
        );
        assert_eq!("[::1]:7070".parse::<Listener>().unwrap().port, Some(7070));
        assert_eq!("::1".parse::<Listener>().unwrap().port, None);
        assert!(matches!(
            "127.0.0.1:0".parse::<Listener>(),
            Err(GlobalError::BadListenerPort(_))
        ));
        assert!(matches!(
            "127.0.0.1:99999".parse::<Listener>(),
            Err(GlobalError::BadListenerPort(_))
        ));
        assert!(matches!(
            "edge:7070".parse::<Listener>(),
            Err(GlobalError::BadListener { .. })
        ));
    }

    #[test]
    fn operator_input_past_the_bound_is_refused() {
        let mut b = GlobalDeny::builder();
        for i in 0..=MAX_OPERATOR_ENTRIES as u32 {
            b = b.host_address(IpAddr::V4(Ipv4Addr::from(0xc633_0000 + i)));
        }
        assert_eq!(
            b.build().unwrap_err(),
            GlobalError::TooMany("host addresses")
        );
    }

    proptest! {
        #[test]
        fn the_layers_in_packet_filter_order_agree_with_check(
            raw in prop_oneof![
                any::<[u8; 4]>().prop_map(IpAddr::from),
                any::<[u8; 16]>().prop_map(IpAddr::from),
                (
                    prop::sample::select(vec![[10u8, 20], [10, 21], [172, 16], [172, 24], [192, 168], [100, 64]]),
                    any::<[u8; 2]>(),
                )
                    .prop_map(|(p, b)| IpAddr::from([p[0], p[1], b[0], b[1]])),
            ],
            port: u16,
        ) {
            let g = GlobalDeny::builder()
                .allow_private(net("10.20.0.0/16"))
                .allow_private(net("172.16.0.0/13"))
                .host_address(ip("10.20.0.1"))
                .listener("203.0.113.9:7070".parse().unwrap())
                .build()
                .unwrap();
            let addr = canonical(raw);
            // The order a packet filter applies: drop, drop, accept, drop.
            let dropped_first = g.always_denied().any(|n| n.contains(addr))
                || g.listeners().iter().any(|l| canonical(l.addr) == addr && l.port.is_none_or(|p| p == port));
            let layered = dropped_first
                || (!g.allowed_private().iter().any(|n| n.contains(addr)) && g.private().any(|n| n.contains(addr)));
            let translated = translation_prefixes().iter().any(|n| n.contains(addr));
            if !translated {
                prop_assert_eq!(layered, g.check(raw, port).is_some(), "{}", raw);
            }
        }
    }
}
