//! Decisions: may this name be resolved, this address be connected to?

use std::net::IpAddr;

use crate::global::GlobalDeny;
use crate::policy::{DnsName, NetworkMode, Policy};

/// Which layer refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Layer {
    /// The platform's global deny list.
    Global,
    /// The sandbox's own lists.
    Sandbox,
    /// The sandbox's mode (`none`).
    Mode,
}

impl Layer {
    /// A short label for logs and metrics (`global`, `sandbox`, `mode`).
    pub fn as_str(self) -> &'static str {
        match self {
            Layer::Global => "global",
            Layer::Sandbox => "sandbox",
            Layer::Mode => "mode",
        }
    }
}

/// The outcome of a check.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    Allow,
    /// Refused by `rule` (a rule of the sandbox's deny list, an entry of the global
    /// list, or a sentence when nothing allowed it) at layer `by`.
    Deny {
        rule: String,
        by: Layer,
    },
}

/// The rule text of a refusal by the `none` mode.
pub const MODE_NONE: &str = "network mode none";
/// The rule text of a name no allow rule matched.
pub const NAME_NOT_ALLOWED: &str = "name not in the allow list";
/// The rule text of an address no address rule of the allow list matched.
pub const ADDRESS_NOT_ALLOWED: &str =
    "address not in the allow list (name rules do not allow addresses)";

impl Decision {
    /// Whether the decision allows.
    pub fn is_allow(&self) -> bool {
        matches!(self, Decision::Allow)
    }

    fn deny(rule: impl Into<String>, by: Layer) -> Self {
        Decision::Deny {
            rule: rule.into(),
            by,
        }
    }
}

/// Whether `name` may be resolved or named (a DNS question, a request's `Host`, a
/// ClientHello's SNI). Name rules only: address rules never match a name.
pub fn decide_name(policy: &Policy, name: &DnsName) -> Decision {
    if policy.mode == NetworkMode::None {
        return Decision::deny(MODE_NONE, Layer::Mode);
    }
    if let Some(rule) = policy.deny().iter().find(|r| r.matches_name(name)) {
        return Decision::deny(rule.to_string(), Layer::Sandbox);
    }
    if policy.allow().is_empty() || policy.allow().iter().any(|r| r.matches_name(name)) {
        return Decision::Allow;
    }
    Decision::deny(NAME_NOT_ALLOWED, Layer::Sandbox)
}

/// Whether a connection to `ip:port` reached without a name may be made: the global
/// list first, then the mode, the sandbox's address denies, and its address allows
/// (an empty allow list allows every address the rest let through).
pub fn decide_addr(policy: &Policy, global: &GlobalDeny, ip: IpAddr, port: u16) -> Decision {
    if let Some(entry) = global.check(ip, port) {
        return Decision::deny(entry, Layer::Global);
    }
    if policy.mode == NetworkMode::None {
        return Decision::deny(MODE_NONE, Layer::Mode);
    }
    if let Some(denied) = sandbox_addr_deny(policy, ip) {
        return denied;
    }
    if policy.allow().is_empty() || policy.allow().iter().any(|r| r.matches_addr(ip)) {
        return Decision::Allow;
    }
    Decision::deny(ADDRESS_NOT_ALLOWED, Layer::Sandbox)
}

/// Whether the proxy may connect to `ip:port`, an address it resolved for `name`
/// itself: the name must be allowed and the address must pass the global list and the
/// sandbox's address denies (an address allow list does not constrain it).
pub fn decide_named(
    policy: &Policy,
    global: &GlobalDeny,
    name: &DnsName,
    ip: IpAddr,
    port: u16,
) -> Decision {
    if let Some(entry) = global.check(ip, port) {
        return Decision::deny(entry, Layer::Global);
    }
    let by_name = decide_name(policy, name);
    if !by_name.is_allow() {
        return by_name;
    }
    sandbox_addr_deny(policy, ip).unwrap_or(Decision::Allow)
}

fn sandbox_addr_deny(policy: &Policy, ip: IpAddr) -> Option<Decision> {
    let rule = policy.deny().iter().find(|r| r.matches_addr(ip))?;
    Some(Decision::deny(rule.to_string(), Layer::Sandbox))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::Rule;
    use proptest::prelude::*;

    fn policy(mode: NetworkMode, allow: &[&str], deny: &[&str]) -> Policy {
        Policy::parse(mode, allow, deny).unwrap()
    }

    fn name(text: &str) -> DnsName {
        DnsName::parse(text).unwrap()
    }

    fn ip(text: &str) -> IpAddr {
        text.parse().unwrap()
    }

    fn denied(rule: &str, by: Layer) -> Decision {
        Decision::Deny {
            rule: rule.into(),
            by,
        }
    }

    #[test]
    fn mode_none_allows_no_name_and_no_address() {
        let p = policy(NetworkMode::None, &["pypi.org", "203.0.113.0/24"], &[]);
        let g = GlobalDeny::defaults();
        assert_eq!(
            decide_name(&p, &name("pypi.org")),
            denied(MODE_NONE, Layer::Mode)
        );
        assert_eq!(
            decide_addr(&p, &g, ip("203.0.113.1"), 22),
            denied(MODE_NONE, Layer::Mode)
        );
        assert_eq!(
            decide_named(&p, &g, &name("pypi.org"), ip("203.0.113.1"), 443),
            denied(MODE_NONE, Layer::Mode)
        );
    }

    #[test]
    fn an_empty_allow_list_allows_every_name_and_address_not_denied() {
        let p = policy(NetworkMode::Egress, &[], &["*.evil.org", "198.51.100.0/24"]);
        let g = GlobalDeny::defaults();
        assert!(decide_name(&p, &name("pypi.org")).is_allow());
        assert!(decide_name(&p, &name("evil.org")).is_allow());
        assert_eq!(
            decide_name(&p, &name("a.evil.org")),
            denied("*.evil.org", Layer::Sandbox)
        );
        assert!(decide_addr(&p, &g, ip("203.0.113.1"), 5432).is_allow());
        assert_eq!(
            decide_addr(&p, &g, ip("198.51.100.9"), 80),
            denied("198.51.100.0/24", Layer::Sandbox)
        );
    }

    #[test]
    fn a_non_empty_allow_list_allows_only_what_matches_it() {
        let p = policy(
            NetworkMode::Egress,
            &["pypi.org", "*.pythonhosted.org", "203.0.113.0/24"],
            &[],
        );
        let g = GlobalDeny::defaults();
        assert!(decide_name(&p, &name("pypi.org")).is_allow());
        assert!(decide_name(&p, &name("files.pythonhosted.org")).is_allow());
        assert_eq!(
            decide_name(&p, &name("pythonhosted.org")),
            denied(NAME_NOT_ALLOWED, Layer::Sandbox)
        );
        assert!(decide_addr(&p, &g, ip("203.0.113.200"), 6379).is_allow());
        assert_eq!(
            decide_addr(&p, &g, ip("198.51.100.1"), 6379),
            denied(ADDRESS_NOT_ALLOWED, Layer::Sandbox)
        );
    }

    #[test]
    fn a_name_rule_never_allows_an_address_by_itself() {
        let p = policy(NetworkMode::Egress, &["pypi.org"], &[]);
        let g = GlobalDeny::defaults();
        assert_eq!(
            decide_addr(&p, &g, ip("151.101.0.223"), 443),
            denied(ADDRESS_NOT_ALLOWED, Layer::Sandbox)
        );
        assert!(decide_named(&p, &g, &name("pypi.org"), ip("151.101.0.223"), 443).is_allow());
    }

    #[test]
    fn a_denied_name_is_refused_though_its_address_is_allowed() {
        let p = policy(
            NetworkMode::Egress,
            &["203.0.113.0/24", "ok.example"],
            &["bad.example"],
        );
        let g = GlobalDeny::defaults();
        assert_eq!(
            decide_named(&p, &g, &name("bad.example"), ip("203.0.113.5"), 443),
            denied("bad.example", Layer::Sandbox)
        );
        assert_eq!(
            decide_named(&p, &g, &name("other.example"), ip("203.0.113.5"), 443),
            denied(NAME_NOT_ALLOWED, Layer::Sandbox)
        );
    }

    #[test]
    fn a_named_connection_is_refused_by_the_sandboxs_address_denies() {
        let p = policy(NetworkMode::Egress, &["ok.example"], &["203.0.113.0/25"]);
        let g = GlobalDeny::defaults();
        assert_eq!(
            decide_named(&p, &g, &name("ok.example"), ip("203.0.113.5"), 443),
            denied("203.0.113.0/25", Layer::Sandbox)
        );
        assert!(decide_named(&p, &g, &name("ok.example"), ip("203.0.113.200"), 443).is_allow());
    }

    #[test]
    fn the_global_list_beats_an_allowed_name_and_an_allowed_address() {
        let p = policy(
            NetworkMode::Egress,
            &["metadata.internal", "169.254.0.0/16", "::ffff:0:0/96"],
            &[],
        );
        let g = GlobalDeny::defaults();
        assert_eq!(
            decide_addr(&p, &g, ip("169.254.169.254"), 80),
            denied("169.254.169.254 (metadata)", Layer::Global)
        );
        assert_eq!(
            decide_named(
                &p,
                &g,
                &name("metadata.internal"),
                ip("::ffff:127.0.0.1"),
                80
            ),
            denied("127.0.0.0/8 (loopback)", Layer::Global)
        );
    }

    fn arb_rule() -> impl Strategy<Value = Rule> {
        prop_oneof![
            "[a-c]{1,3}(\\.[a-c]{1,3}){0,2}".prop_map(|s| Rule::Name(DnsName::parse(&s).unwrap())),
            "[a-c]{1,3}(\\.[a-c]{1,3}){0,1}"
                .prop_map(|s| Rule::Wildcard(DnsName::parse(&s).unwrap())),
            (any::<[u8; 4]>(), 0u8..=32).prop_map(|(b, len)| {
                let bits =
                    u32::from_be_bytes(b) & u32::MAX.checked_shl(32 - u32::from(len)).unwrap_or(0);
                Rule::Net(crate::net::IpNet::new(IpAddr::V4(bits.into()), len).unwrap())
            }),
        ]
    }

    fn arb_policy() -> impl Strategy<Value = Policy> {
        (
            prop_oneof![Just(NetworkMode::None), Just(NetworkMode::Egress)],
            proptest::collection::vec(arb_rule(), 0..6),
            proptest::collection::vec(arb_rule(), 0..6),
        )
            .prop_map(|(mode, allow, deny)| Policy::new(mode, allow, deny).unwrap())
    }

    fn arb_name() -> impl Strategy<Value = DnsName> {
        "[a-c]{1,3}(\\.[a-c]{1,3}){0,3}".prop_map(|s| DnsName::parse(&s).unwrap())
    }

    fn arb_ip() -> impl Strategy<Value = IpAddr> {
        prop_oneof![
            any::<[u8; 4]>().prop_map(IpAddr::from),
            any::<[u8; 16]>().prop_map(IpAddr::from),
            any::<[u8; 4]>().prop_map(|b| IpAddr::V6(std::net::Ipv4Addr::from(b).to_ipv6_mapped())),
        ]
    }

    proptest! {
        #[test]
        fn the_global_list_always_wins(p in arb_policy(), n in arb_name(), ip in arb_ip(), port: u16) {
            let g = GlobalDeny::defaults();
            if let Some(entry) = g.check(ip, port) {
                let expected = Decision::Deny { rule: entry, by: Layer::Global };
                prop_assert_eq!(decide_addr(&p, &g, ip, port), expected.clone());
                prop_assert_eq!(decide_named(&p, &g, &n, ip, port), expected);
            }
        }

        #[test]
        fn a_deny_rule_always_beats_the_same_allow_rule(
            p in arb_policy(), r in arb_rule(), n in arb_name(), ip in arb_ip(), port: u16,
            kind in 0u8..3, len in 0u8..=128,
        ) {
            // A rule built to match `n` or `ip`, so every case exercises the rule.
            let derived = match (kind, n.as_str().split_once('.')) {
                (0, _) | (1, None) => Rule::Name(n.clone()),
                (1, Some((_, parent))) => Rule::Wildcard(DnsName::parse(parent).unwrap()),
                _ => {
                    let ip = crate::canonical(ip);
                    let max = if ip.is_ipv4() { 32 } else { 128 };
                    let len = len.min(max);
                    let net = format!("{ip}/{max}").parse::<crate::IpNet>().unwrap();
                    let bits = match net.addr() {
                        IpAddr::V4(v4) => IpAddr::V4((u32::from(v4) & u32::MAX.checked_shl(32 - u32::from(len)).unwrap_or(0)).into()),
                        IpAddr::V6(v6) => IpAddr::V6((u128::from(v6) & u128::MAX.checked_shl(128 - u32::from(len)).unwrap_or(0)).into()),
                    };
                    Rule::Net(crate::IpNet::new(bits, len).unwrap())
                }
            };
            prop_assert!(derived.matches_name(&n) || derived.matches_addr(ip));
            let mut allow = p.allow().to_vec();
            allow.extend([r.clone(), derived.clone()]);
            let mut deny = p.deny().to_vec();
            deny.extend([r.clone(), derived.clone()]);
            let p = Policy::new(NetworkMode::Egress, allow, deny).unwrap();
            let g = GlobalDeny::defaults();
            for rule in [&r, &derived] {
                if rule.matches_name(&n) {
                    let refused_by_sandbox = matches!(decide_name(&p, &n), Decision::Deny { by: Layer::Sandbox, .. });
                    prop_assert!(refused_by_sandbox);
                    prop_assert!(!decide_named(&p, &g, &n, ip, port).is_allow());
                }
                if rule.matches_addr(ip) {
                    prop_assert!(!decide_addr(&p, &g, ip, port).is_allow());
                    prop_assert!(!decide_named(&p, &g, &n, ip, port).is_allow());
                }
            }
        }

        #[test]
        fn allowing_requires_the_name_and_the_address_to_pass(
            p in arb_policy(), n in arb_name(), ip in arb_ip(), port: u16,
        ) {
            let g = GlobalDeny::defaults();
            if decide_named(&p, &g, &n, ip, port).is_allow() {
                prop_assert!(decide_name(&p, &n).is_allow());
                prop_assert!(g.check(ip, port).is_none());
            }
            if decide_addr(&p, &g, ip, port).is_allow() {
                prop_assert_eq!(p.mode, NetworkMode::Egress);
            }
        }
    }
}
