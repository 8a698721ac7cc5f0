//! Host-side network plumbing for sandbox egress (issue 15): a veth pair per sandbox
//! into its network namespace ([`veth`]) and the worker's nftables table ([`nft`]),
//! built on the pure `space-egress` crate (policy, global deny list, address plan).
//!
//! Sandboxes in mode `none` get no pair at all. For one in mode `egress`, everything
//! the policy allows by address leaves through the host's NAT; HTTP, TLS and DNS are
//! redirected to the platform's proxy and resolver on the pair's host side, which judge
//! names (their implementation is not here). The sandbox can change nothing of this:
//! the rules live in the worker's namespace, and the sandbox reaches the host only at
//! those ports of its own host-side address.

pub mod command;
pub mod manager;
pub mod metrics;
pub mod nft;
pub mod proxy;
pub mod resolver;
pub mod services;
pub mod tenant;
pub mod upstream;
pub mod veth;

#[cfg(test)]
mod manager_tests;
#[cfg(test)]
mod nft_tests;
#[cfg(test)]
mod tests;
#[cfg(test)]
pub(crate) mod testnet;
#[cfg(test)]
mod proxy_tests;
