//! IP networks (an address and a prefix length), parsed from `addr` or `addr/len`.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::str::FromStr;

/// Longest text an address or CIDR may have (`ffff:…:255.255.255.255/128` is 49).
const MAX_NET_TEXT: usize = 64;

/// An IPv4 or IPv6 network: `203.0.113.0/24`, `2001:db8::/32`, or one address.
///
/// Host bits are always zero. IPv4-mapped IPv6 networks (`::ffff:10.0.0.0/104`) are
/// stored as the IPv4 network they denote, since every address is judged in its
/// canonical form (see [`canonical`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct IpNet {
    addr: IpAddr,
    prefix: u8,
}

/// Why a network was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NetError {
    #[error("not an IP address")]
    BadAddress,
    #[error("prefix length must be a number from 0 to {max}")]
    BadPrefix { max: u8 },
    #[error("host bits are set (the network is {canonical})")]
    HostBits { canonical: String },
    #[error("longer than {MAX_NET_TEXT} characters")]
    TooLong,
}

/// The form an address is judged in: an IPv4-mapped IPv6 address (`::ffff:a.b.c.d`)
/// is the IPv4 address it carries.
pub fn canonical(ip: IpAddr) -> IpAddr {
    ip.to_canonical()
}

impl IpNet {
    /// A network from an address and a prefix length; host bits must be zero.
    pub fn new(addr: IpAddr, prefix: u8) -> Result<Self, NetError> {
        let max = max_prefix(addr);
        if prefix > max {
            return Err(NetError::BadPrefix { max });
        }
        let masked = mask(addr, prefix);
        if masked != addr {
            return Err(NetError::HostBits {
                canonical: IpNet {
                    addr: masked,
                    prefix,
                }
                .to_string(),
            });
        }
        Ok(Self::canonicalized(addr, prefix))
    }

    /// The network of one address (`/32` or `/128`).
    pub fn host(addr: IpAddr) -> Self {
        Self::canonicalized(addr, max_prefix(addr))
    }

    /// A fixed network of the crate's own tables; a wrong one is a bug the tests catch.
    pub(crate) fn v4(a: u8, b: u8, c: u8, d: u8, prefix: u8) -> Self {
        Self::v4_bits(u32::from(Ipv4Addr::new(a, b, c, d)), prefix)
    }

    /// An IPv4 network from its bits; host bits are cleared, the prefix capped at 32.
    pub(crate) fn v4_bits(bits: u32, prefix: u8) -> Self {
        let prefix = prefix.min(32);
        let addr = mask(IpAddr::V4(Ipv4Addr::from(bits)), prefix);
        IpNet { addr, prefix }
    }

    pub(crate) fn v6(segments: [u16; 8], prefix: u8) -> Self {
        let [a, b, c, d, e, f, g, h] = segments;
        let prefix = prefix.min(128);
        let addr = mask(IpAddr::V6(Ipv6Addr::new(a, b, c, d, e, f, g, h)), prefix);
        Self::canonicalized(addr, prefix)
    }

    fn canonicalized(addr: IpAddr, prefix: u8) -> Self {
        if let IpAddr::V6(v6) = addr
            && prefix >= 96
            && let Some(v4) = v6.to_ipv4_mapped()
        {
            return IpNet {
                addr: IpAddr::V4(v4),
                prefix: prefix - 96,
            };
        }
        IpNet { addr, prefix }
    }

    /// The first address of the network.
    pub fn addr(&self) -> IpAddr {
        self.addr
    }

    /// The prefix length.
    pub fn prefix(&self) -> u8 {
        self.prefix
    }

    /// Whether `ip` (judged in its canonical form) lies in this network.
    pub fn contains(&self, ip: IpAddr) -> bool {
        let ip = canonical(ip);
        match (self.addr, ip) {
            (IpAddr::V4(_), IpAddr::V4(_)) | (IpAddr::V6(_), IpAddr::V6(_)) => {
                mask(ip, self.prefix) == self.addr
            }
            _ => false,
        }
    }

    /// Whether every address of `other` lies in this network.
    pub fn covers(&self, other: &IpNet) -> bool {
        other.prefix >= self.prefix && self.contains(other.addr)
    }

    /// Whether the two networks share at least one address.
    pub fn overlaps(&self, other: &IpNet) -> bool {
        self.covers(other) || other.covers(self)
    }
}

fn max_prefix(addr: IpAddr) -> u8 {
    match addr {
        IpAddr::V4(_) => 32,
        IpAddr::V6(_) => 128,
    }
}

fn mask(addr: IpAddr, prefix: u8) -> IpAddr {
    match addr {
        IpAddr::V4(v4) => {
            let bits = u32::from(v4);
            let m = u32::MAX.checked_shl(32 - u32::from(prefix)).unwrap_or(0);
            IpAddr::V4(Ipv4Addr::from(bits & m))
        }
        IpAddr::V6(v6) => {
            let bits = u128::from(v6);
            let m = u128::MAX.checked_shl(128 - u32::from(prefix)).unwrap_or(0);
            IpAddr::V6(Ipv6Addr::from(bits & m))
        }
    }
}

impl FromStr for IpNet {
    type Err = NetError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        if text.len() > MAX_NET_TEXT {
            return Err(NetError::TooLong);
        }
        match text.split_once('/') {
            None => Ok(IpNet::host(
                text.parse::<IpAddr>().map_err(|_| NetError::BadAddress)?,
            )),
            Some((addr, prefix)) => {
                let addr = addr.parse::<IpAddr>().map_err(|_| NetError::BadAddress)?;
                let max = max_prefix(addr);
                // Digits only: `u8::from_str` would accept a leading `+`.
                if prefix.is_empty()
                    || prefix.len() > 3
                    || !prefix.bytes().all(|b| b.is_ascii_digit())
                {
                    return Err(NetError::BadPrefix { max });
                }
                let prefix: u8 = prefix.parse().map_err(|_| NetError::BadPrefix { max })?;
                IpNet::new(addr, prefix)
            }
        }
    }
}

impl fmt::Display for IpNet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.prefix == max_prefix(self.addr) {
            write!(f, "{}", self.addr)
        } else {
            write!(f, "{}/{}", self.addr, self.prefix)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn net(text: &str) -> IpNet {
        text.parse().unwrap()
    }

    #[test]
    fn a_cidr_contains_the_addresses_under_its_prefix_only() {
        let n = net("203.0.113.0/24");
        assert!(n.contains("203.0.113.0".parse().unwrap()));
        assert!(n.contains("203.0.113.255".parse().unwrap()));
        assert!(!n.contains("203.0.114.0".parse().unwrap()));
        assert!(!n.contains("2001:db8::1".parse().unwrap()));
        let v6 = net("2001:db8::/32");
        assert!(v6.contains("2001:db8:ffff::1".parse().unwrap()));
        assert!(!v6.contains("2001:db9::".parse().unwrap()));
    }

    #[test]
    fn host_bits_are_refused_naming_the_network_meant() {
        assert_eq!(
            "203.0.113.5/24".parse::<IpNet>(),
            Err(NetError::HostBits {
                canonical: "203.0.113.0/24".into()
            })
        );
    }

    #[test]
    fn prefixes_beyond_the_family_or_not_decimal_are_refused() {
        assert_eq!(
            "10.0.0.0/33".parse::<IpNet>(),
            Err(NetError::BadPrefix { max: 32 })
        );
        assert_eq!(
            "::/129".parse::<IpNet>(),
            Err(NetError::BadPrefix { max: 128 })
        );
        assert!("10.0.0.0/+8".parse::<IpNet>().is_err());
        assert!("10.0.0.0/".parse::<IpNet>().is_err());
        assert!("10.0.0.0/0008".parse::<IpNet>().is_err());
    }

    #[test]
    fn an_ipv4_mapped_network_is_the_ipv4_network_it_denotes() {
        let n = net("::ffff:10.0.0.0/104");
        assert_eq!(n, net("10.0.0.0/8"));
        assert!(n.contains("::ffff:10.1.2.3".parse().unwrap()));
        assert!(net("10.0.0.0/8").contains("::ffff:10.1.2.3".parse().unwrap()));
    }

    #[test]
    fn a_single_address_prints_without_a_prefix_and_zero_prefix_covers_all() {
        assert_eq!(net("203.0.113.7").to_string(), "203.0.113.7");
        assert_eq!(net("203.0.113.7/32").to_string(), "203.0.113.7");
        assert!(net("0.0.0.0/0").contains("198.51.100.1".parse().unwrap()));
        assert!(net("::/0").covers(&net("2001:db8::/32")));
        assert!(net("10.0.0.0/8").overlaps(&net("0.0.0.0/0")));
        assert!(!net("10.0.0.0/8").overlaps(&net("11.0.0.0/8")));
    }
}
