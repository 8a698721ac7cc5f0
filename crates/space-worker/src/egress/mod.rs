//! Sandbox egress on the worker (issue 15), built on the pure `space-egress` crate
//! (policy, global deny list, address plan, sniffers, DNS messages): a veth pair per
//! sandbox into its network namespace ([`veth`], made over rtnetlink by [`netlink`]),
//! the worker's nftables table ([`nft`]), the HTTP/TLS proxy ([`proxy`]) and the
//! resolver ([`resolver`]) with their upstream DNS client ([`upstream`]) and tenants
//! ([`tenant`]), started together by [`services`], and the [`manager`] that gives each
//! execution its link.
//!
//! Sandboxes in mode `none` get no pair at all. For one in mode `egress`, everything
//! the policy allows by address leaves through the host's NAT; HTTP, TLS and DNS are
//! redirected to the proxy and resolver, which judge names. The sandbox can change
//! nothing of this: the rules live in the worker's namespace, and the sandbox reaches
//! the host only at those ports of its own host-side address.

pub mod command;
pub mod manager;
pub mod metrics;
pub mod netlink;
pub mod nft;
pub mod proxy;
pub mod resolver;
pub mod services;
mod shared;
pub mod tenant;
pub mod upstream;
pub mod veth;

#[cfg(test)]
mod manager_tests;
#[cfg(test)]
mod nft_tests;
#[cfg(test)]
mod proxy_tests;
#[cfg(test)]
pub(crate) mod testnet;
#[cfg(test)]
mod tests;
