//! The address plan: each sandbox's veth pair is one `/31` (RFC 3021) of a block.
//!
//! Pair `i` of block `B` is `B + 2i` (host side, the sandbox's gateway) and `B + 2i + 1`
//! (sandbox side). A `/31` spends no address on a network or broadcast address, so a
//! block of `2^n` addresses holds `2^(n-1)` sandboxes.
//!
//! The default block is `240.0.0.0/12` (524,288 pairs). It lies in the reserved
//! "class E" range 240/4, which no LAN, VPN, cloud network or ISP uses because most
//! operating systems other than Linux refuse it; Linux has routed it as unicast since
//! 2.6.25, and the addresses never leave the host (outbound traffic is NATed to the
//! host's address). The shared address space 100.64/10, the usual choice, collides
//! with real deployments: Tailscale hands out addresses across all of it (and drops
//! packets from it that do not arrive on its own interface), Cloudflare WARP uses
//! 100.96/12, and Alibaba Cloud's metadata service is 100.100.100.200. The global deny
//! list refuses 240/4 anyway, so sandboxes never reach each other's links.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr};
use std::str::FromStr;

use crate::net::{IpNet, NetError};

/// The default block: `240.0.0.0/12`.
pub const DEFAULT_BLOCK: AddressBlock = AddressBlock {
    base: Ipv4Addr::new(240, 0, 0, 0),
    prefix: 12,
};

/// Prefix length of each pair.
pub const PAIR_PREFIX: u8 = 31;

/// An IPv4 block sandboxes' pairs are taken from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct AddressBlock {
    base: Ipv4Addr,
    prefix: u8,
}

/// Why a block was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BlockError {
    #[error("{0}")]
    Net(#[from] NetError),
    #[error("an address block is IPv4")]
    NotIpv4,
    #[error("prefix /{0} is outside /8../30 (a block holds at least two pairs)")]
    Size(u8),
    #[error("{block} overlaps {what} {net}")]
    Overlaps {
        block: IpNet,
        what: &'static str,
        net: IpNet,
    },
}

impl AddressBlock {
    /// A block from a network: IPv4, `/8` to `/30`, not overlapping "this network",
    /// loopback, multicast or the broadcast address.
    pub fn new(net: IpNet) -> Result<Self, BlockError> {
        let IpAddr::V4(base) = net.addr() else {
            return Err(BlockError::NotIpv4);
        };
        if !(8..=30).contains(&net.prefix()) {
            return Err(BlockError::Size(net.prefix()));
        }
        let forbidden = [
            (IpNet::v4(0, 0, 0, 0, 8), "this network"),
            (IpNet::v4(127, 0, 0, 0, 8), "loopback"),
            (IpNet::v4(224, 0, 0, 0, 4), "multicast"),
            (IpNet::v4(255, 255, 255, 255, 32), "the broadcast address"),
        ];
        if let Some((bad, what)) = forbidden.iter().find(|(n, _)| n.overlaps(&net)) {
            return Err(BlockError::Overlaps {
                block: net,
                what,
                net: *bad,
            });
        }
        Ok(AddressBlock {
            base,
            prefix: net.prefix(),
        })
    }

    /// The block as a network (for the global deny list and nftables sets).
    pub fn net(&self) -> IpNet {
        IpNet::v4_bits(u32::from(self.base), self.prefix)
    }

    /// How many pairs (sandboxes) the block holds.
    pub fn capacity(&self) -> u32 {
        1u32 << (31 - u32::from(self.prefix))
    }
}

impl Default for AddressBlock {
    fn default() -> Self {
        DEFAULT_BLOCK
    }
}

impl FromStr for AddressBlock {
    type Err = BlockError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        AddressBlock::new(text.parse()?)
    }
}

impl fmt::Display for AddressBlock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.base, self.prefix)
    }
}

/// Pair `index` of `block`: (host side, sandbox side, prefix length 31), or `None`
/// past the block's capacity.
pub fn pair(block: &AddressBlock, index: u32) -> Option<(Ipv4Addr, Ipv4Addr, u8)> {
    if index >= block.capacity() {
        return None;
    }
    let host = u32::from(block.base) + 2 * index;
    Some((Ipv4Addr::from(host), Ipv4Addr::from(host + 1), PAIR_PREFIX))
}

/// The index of the pair `addr` (either side) belongs to, or `None` outside the block.
pub fn index_of(block: &AddressBlock, addr: Ipv4Addr) -> Option<u32> {
    let offset = u32::from(addr).checked_sub(u32::from(block.base))?;
    let index = offset / 2;
    (index < block.capacity()).then_some(index)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn block(text: &str) -> AddressBlock {
        text.parse().unwrap()
    }

    #[test]
    fn the_default_block_holds_more_than_100000_sandboxes() {
        assert_eq!(AddressBlock::default().to_string(), "240.0.0.0/12");
        assert_eq!(DEFAULT_BLOCK.capacity(), 524_288);
        assert_eq!(DEFAULT_BLOCK, block("240.0.0.0/12"));
    }

    #[test]
    fn the_first_and_last_pairs_sit_at_the_edges_of_the_block() {
        let b = DEFAULT_BLOCK;
        assert_eq!(
            pair(&b, 0),
            Some((
                "240.0.0.0".parse().unwrap(),
                "240.0.0.1".parse().unwrap(),
                31
            ))
        );
        assert_eq!(
            pair(&b, 1),
            Some((
                "240.0.0.2".parse().unwrap(),
                "240.0.0.3".parse().unwrap(),
                31
            ))
        );
        assert_eq!(
            pair(&b, 524_287),
            Some((
                "240.15.255.254".parse().unwrap(),
                "240.15.255.255".parse().unwrap(),
                31
            ))
        );
        assert_eq!(pair(&b, 524_288), None);
        assert_eq!(pair(&b, u32::MAX), None);
    }

    #[test]
    fn index_of_finds_the_pair_of_either_side_and_nothing_outside() {
        let b = block("198.18.0.0/15");
        assert_eq!(b.capacity(), 65_536);
        assert_eq!(index_of(&b, "198.18.0.0".parse().unwrap()), Some(0));
        assert_eq!(index_of(&b, "198.18.0.1".parse().unwrap()), Some(0));
        assert_eq!(
            index_of(&b, "198.19.255.255".parse().unwrap()),
            Some(65_535)
        );
        assert_eq!(index_of(&b, "198.20.0.0".parse().unwrap()), None);
        assert_eq!(index_of(&b, "198.17.255.255".parse().unwrap()), None);
        assert_eq!(index_of(&b, "0.0.0.0".parse().unwrap()), None);
    }

    #[test]
    fn the_smallest_and_largest_blocks_are_accepted_and_others_refused() {
        assert_eq!(block("203.0.113.0/30").capacity(), 2);
        assert_eq!(block("10.0.0.0/8").capacity(), 1 << 23);
        assert_eq!(
            "203.0.113.0/31".parse::<AddressBlock>(),
            Err(BlockError::Size(31))
        );
        assert_eq!(
            "10.0.0.0/7".parse::<AddressBlock>(),
            Err(BlockError::Size(7))
        );
        assert_eq!(
            "2001:db8::/64".parse::<AddressBlock>(),
            Err(BlockError::NotIpv4)
        );
        assert!(matches!(
            "240.0.0.1/12".parse::<AddressBlock>(),
            Err(BlockError::Net(_))
        ));
    }

    #[test]
    fn a_block_over_loopback_multicast_or_broadcast_is_refused() {
        for bad in [
            "127.0.0.0/8",
            "0.0.0.0/8",
            "224.0.0.0/8",
            "255.255.255.0/24",
            "255.0.0.0/8",
        ] {
            let r = bad.parse::<AddressBlock>();
            assert!(
                matches!(r, Err(BlockError::Overlaps { .. })),
                "{bad}: {r:?}"
            );
        }
        assert!("254.0.0.0/8".parse::<AddressBlock>().is_ok());
    }

    proptest! {
        #[test]
        fn pair_and_index_of_are_inverse(prefix in 8u8..=30, base: u32, index: u32) {
            let mask = u32::MAX << (32 - u32::from(prefix));
            let Ok(b) = AddressBlock::new(IpNet::v4_bits(base & mask, prefix)) else {
                return Ok(());
            };
            let index = index % b.capacity();
            let (host, sandbox, len) = pair(&b, index).unwrap();
            prop_assert_eq!(len, 31);
            prop_assert_eq!(u32::from(sandbox), u32::from(host) + 1);
            prop_assert_eq!(u32::from(host) % 2, 0);
            prop_assert!(b.net().contains(host.into()) && b.net().contains(sandbox.into()));
            prop_assert_eq!(index_of(&b, host), Some(index));
            prop_assert_eq!(index_of(&b, sandbox), Some(index));
        }
    }
}
