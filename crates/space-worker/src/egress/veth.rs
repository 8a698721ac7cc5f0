//! A sandbox's link to the host: one veth pair per sandbox, addressed from a `/31` of
//! the worker's block ([`space_egress::plan::pair`]).
//!
//! Names: the host side is `sxh{tag}-{index:x}` (`sxh-1f`, or `sxhw2-1f` for a worker
//! tagged `w2`; at most 15 bytes, the kernel's limit), so `sxh{tag}-*` names every
//! link of one worker and no other worker's. The sandbox side is created *directly*
//! in the sandbox's network namespace as `eth0` — it never exists in the host's
//! namespace under a guessable name, and every sandbox sees the usual name.
//!
//! The namespace is named through the init's pidfd: the pidfd is opened first, the
//! start time compared with the recorded one, then `/proc/PID/ns/net` opened and the
//! pidfd polled — an init that has not exited since its start time was compared still
//! held the PID when the namespace was opened, so a reused PID never leads into another
//! sandbox's (or the host's) namespace. That open file is the one the peer is created
//! in (`IFLA_NET_NS_FD`) and the one the socket configuring the inside is made in.
//!
//! Everything is done in-process over rtnetlink ([`super::netlink`]): a link costs a
//! few netlink round trips and two sysctl writes, no process.

use std::fs::File;
use std::io;
use std::net::Ipv4Addr;
use std::os::fd::AsFd;
use std::os::unix::fs::MetadataExt;

use rustix::event::{PollFd, PollFlags, Timespec, poll};
use rustix::process::{Pid, PidfdFlags, pidfd_open};
use space_egress::plan::{self, AddressBlock};

use super::netlink::{Name, NetlinkError, Route};
use crate::substrate::jail::netns::route_socket_in;
use crate::substrate::process::ProcessIdentity;

/// The sandbox side's name, inside the sandbox.
pub const SANDBOX_LINK: &str = "eth0";

/// Longest worker tag in link names (`sxh` + tag + `-` + 8 hex digits = 15 bytes).
pub const MAX_TAG: usize = 3;

/// Why a link could not be named, attached or detached.
#[derive(Debug, thiserror::Error)]
pub enum VethError {
    #[error("link tag {0:?}: at most {MAX_TAG} lowercase ASCII letters or digits")]
    BadTag(String),
    #[error("pair {index} is outside the address block {block}")]
    OutsideBlock { index: u32, block: AddressBlock },
    #[error("the sandbox's init is not running (or its PID now names another process)")]
    NotRunning,
    #[error("the process shares the worker's network namespace: no link is attached to it")]
    HostNamespace,
    #[error("{0} vanished while its link was made")]
    Gone(String),
    #[error("{context}: {source}")]
    Io { context: String, source: io::Error },
    #[error(transparent)]
    Netlink(#[from] NetlinkError),
}

/// The names one worker gives its host-side links.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LinkNames {
    tag: String,
}

/// One sandbox's pair: its index in the block, the host side's name, both addresses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pair {
    index: u32,
    host_link: String,
    host_addr: Ipv4Addr,
    sandbox_addr: Ipv4Addr,
}

impl LinkNames {
    /// Names `sxh{tag}-{index:x}`; `tag` is 0 to [`MAX_TAG`] of `[a-z0-9]`.
    pub fn new(tag: &str) -> Result<Self, VethError> {
        let ok = tag.len() <= MAX_TAG
            && tag
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit());
        if !ok {
            return Err(VethError::BadTag(tag.chars().take(16).collect()));
        }
        Ok(LinkNames { tag: tag.into() })
    }

    /// The host side of pair `index`.
    pub fn host_link(&self, index: u32) -> String {
        format!("sxh{}-{index:x}", self.tag)
    }

    /// An nftables interface wildcard matching every host side of this worker's
    /// links and no other worker's (a tag never contains `-`).
    pub fn wildcard(&self) -> String {
        format!("sxh{}-*", self.tag)
    }

    /// Whether `link` is one of this worker's host sides.
    pub fn owns(&self, link: &str) -> bool {
        link.strip_prefix("sxh")
            .and_then(|rest| rest.strip_prefix(self.tag.as_str()))
            .and_then(|rest| rest.strip_prefix('-'))
            .and_then(|hex| u32::from_str_radix(hex, 16).ok())
            .is_some_and(|index| self.host_link(index) == link)
    }

    /// Pair `index` of `block`: its names and addresses (nothing is created).
    pub fn pair(&self, block: &AddressBlock, index: u32) -> Result<Pair, VethError> {
        let (host_addr, sandbox_addr, _) =
            plan::pair(block, index).ok_or(VethError::OutsideBlock {
                index,
                block: *block,
            })?;
        Ok(Pair {
            index,
            host_link: self.host_link(index),
            host_addr,
            sandbox_addr,
        })
    }
}

impl Pair {
    /// The pair's index in the block.
    pub fn index(&self) -> u32 {
        self.index
    }

    /// The host side's interface name.
    pub fn host_link(&self) -> &str {
        &self.host_link
    }

    /// The host side's address: the sandbox's gateway, where the proxy and the
    /// resolver are reached.
    pub fn host_addr(&self) -> Ipv4Addr {
        self.host_addr
    }

    /// The sandbox's address.
    pub fn sandbox_addr(&self) -> Ipv4Addr {
        self.sandbox_addr
    }
}

/// The sandbox's network namespace, held open.
struct SandboxNetns {
    file: File,
}

impl SandboxNetns {
    /// Opens the network namespace of `init`, which must still be the recorded process.
    fn open(init: &ProcessIdentity) -> Result<Self, VethError> {
        let pid = Pid::from_raw(init.pid).ok_or(VethError::NotRunning)?;
        let pidfd = pidfd_open(pid, PidfdFlags::empty()).map_err(|_| VethError::NotRunning)?;
        if !init.is_alive() {
            return Err(VethError::NotRunning);
        }
        let file = File::open(format!("/proc/{}/ns/net", init.pid)).map_err(|e| {
            if e.kind() == io::ErrorKind::NotFound {
                VethError::NotRunning
            } else {
                VethError::Io {
                    context: "open the sandbox's network namespace".into(),
                    source: e,
                }
            }
        })?;
        // Readable once the process has exited: then the PID may have named another
        // process when the file was opened.
        let mut fds = [PollFd::new(&pidfd, PollFlags::IN)];
        let zero = Timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        let ready = poll(&mut fds, Some(&zero)).map_err(|e| VethError::Io {
            context: "poll the init's pidfd".into(),
            source: e.into(),
        })?;
        if ready != 0 {
            return Err(VethError::NotRunning);
        }
        let theirs = file.metadata();
        let ours = std::fs::metadata("/proc/self/ns/net");
        if let (Ok(a), Ok(b)) = (theirs, ours)
            && (a.dev(), a.ino()) == (b.dev(), b.ino())
        {
            return Err(VethError::HostNamespace);
        }
        Ok(SandboxNetns { file })
    }
}

/// Attaches `pair` to the network namespace of `init` (the sandbox's init, which must
/// still be the recorded process): the host side gets its address and comes up, with
/// IPv4 forwarding on and IPv6 off; `eth0` is created inside with the sandbox's address,
/// up, and a default route via the host side. A pair already there is replaced.
///
/// Traffic leaves only if the host also forwards on the uplink
/// (`net.ipv4.ip_forward=1` or `net.ipv4.conf.<uplink>.forwarding=1`) and the
/// worker's nftables table ([`super::nft`]) is applied. Blocking (a few netlink round
/// trips, and one to the thread that makes sockets in sandboxes' namespaces): call it
/// off the async runtime.
pub fn attach(pair: &Pair, init: &ProcessIdentity) -> Result<(), VethError> {
    let netns = SandboxNetns::open(init)?;
    let host_link = Name::new(&pair.host_link)?;
    let mut host = Route::open()?;
    host.delete_link(&host_link)?;
    let result = configure(&mut host, &host_link, pair, &netns);
    if result.is_err() {
        let _ = host.delete_link(&host_link);
    }
    result
}

fn configure(
    host: &mut Route,
    host_link: &Name,
    pair: &Pair,
    netns: &SandboxNetns,
) -> Result<(), VethError> {
    let sandbox_link = Name::new(SANDBOX_LINK)?;
    host.add_veth_pair(host_link, &sandbox_link, netns.file.as_fd())?;
    let index = host
        .link_index(host_link)?
        .ok_or_else(|| VethError::Gone(pair.host_link.clone()))?;
    host.add_address(index, pair.host_addr, plan::PAIR_PREFIX)?;
    // Before the link is up: it never takes an IPv6 address.
    write_sysctl(
        &format!("/proc/sys/net/ipv4/conf/{}/forwarding", pair.host_link),
        true,
    )?;
    write_sysctl(
        &format!("/proc/sys/net/ipv6/conf/{}/disable_ipv6", pair.host_link),
        false,
    )?;
    host.set_up(index)?;
    // The sandbox's side, over a socket made in its namespace (the very one the peer
    // was created in: the same open file).
    let socket = route_socket_in(netns.file.as_fd()).map_err(|e| VethError::Io {
        context: "a netlink socket in the sandbox's network namespace".into(),
        source: io::Error::other(e.to_string()),
    })?;
    let mut inside = Route::from_socket(socket)?;
    let eth0 = inside
        .link_index(&sandbox_link)?
        .ok_or_else(|| VethError::Gone(format!("{SANDBOX_LINK} in the sandbox")))?;
    inside.add_address(eth0, pair.sandbox_addr, plan::PAIR_PREFIX)?;
    inside.set_up(eth0)?;
    inside.replace_default_route(pair.host_addr, eth0)?;
    Ok(())
}

/// Writes `1` to a sysctl file; a missing file is an error only when `required`
/// (IPv6 may be off on the whole host).
fn write_sysctl(path: &str, required: bool) -> Result<(), VethError> {
    match std::fs::write(path, "1") {
        Err(e) if !required && e.kind() == io::ErrorKind::NotFound => Ok(()),
        other => other.map_err(|source| VethError::Io {
            context: format!("write {path}"),
            source,
        }),
    }
}

/// Removes the pair whose host side is `host_link` (deleting one side deletes both).
/// Nothing there is success.
pub fn detach(host_link: &str) -> Result<(), VethError> {
    let name = Name::new(host_link)?;
    Route::open()?.delete_link(&name)?;
    Ok(())
}

/// Whether an interface named `name` exists in the worker's network namespace.
pub fn link_exists(name: &str) -> bool {
    !name.is_empty()
        && !name.contains('/')
        && name != "."
        && name != ".."
        && std::path::Path::new("/sys/class/net").join(name).exists()
}

#[cfg(test)]
mod unit {
    use super::*;

    #[test]
    fn link_names_fit_the_kernels_limit_for_every_index() {
        let names = LinkNames::new("w2").unwrap();
        assert_eq!(names.host_link(0), "sxhw2-0");
        assert_eq!(names.host_link(0x1f), "sxhw2-1f");
        let widest = LinkNames::new("abc").unwrap().host_link(u32::MAX);
        assert_eq!(widest, "sxhabc-ffffffff");
        assert!(widest.len() <= 15);
        assert_eq!(LinkNames::new("").unwrap().host_link(5), "sxh-5");
    }

    #[test]
    fn a_tag_that_is_too_long_or_not_lowercase_alphanumeric_is_refused() {
        for bad in ["abcd", "W2", "a-b", "a*", "é"] {
            assert!(
                matches!(LinkNames::new(bad), Err(VethError::BadTag(_))),
                "{bad}"
            );
        }
    }

    #[test]
    fn a_worker_owns_its_own_links_and_not_another_workers() {
        let plain = LinkNames::new("").unwrap();
        let tagged = LinkNames::new("h1").unwrap();
        assert!(plain.owns("sxh-1f"));
        assert!(!plain.owns("sxhh1-1f"));
        assert!(tagged.owns("sxhh1-1f"));
        assert!(!tagged.owns("sxh-1f"));
        for junk in [
            "sxh-",
            "sxh-01",
            "sxh-1F",
            "sxh-1f ",
            "eth0",
            "sxh-100000000",
        ] {
            assert!(!plain.owns(junk), "{junk}");
        }
        assert_eq!(plain.wildcard(), "sxh-*");
        assert_eq!(tagged.wildcard(), "sxhh1-*");
    }

    #[test]
    fn a_pair_takes_its_addresses_from_the_plan_and_refuses_an_index_past_the_block() {
        let block: AddressBlock = "203.0.113.0/30".parse().unwrap();
        let names = LinkNames::new("").unwrap();
        let pair = names.pair(&block, 1).unwrap();
        assert_eq!(pair.host_link(), "sxh-1");
        assert_eq!(pair.host_addr(), Ipv4Addr::new(203, 0, 113, 2));
        assert_eq!(pair.sandbox_addr(), Ipv4Addr::new(203, 0, 113, 3));
        let err = names.pair(&block, 2).unwrap_err();
        assert_eq!(
            err.to_string(),
            "pair 2 is outside the address block 203.0.113.0/30"
        );
    }

    #[test]
    fn attaching_to_a_process_that_is_gone_is_refused_before_any_command_runs() {
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let init = ProcessIdentity::of(child.id() as i32).unwrap();
        child.wait().unwrap();
        let pair = LinkNames::new("")
            .unwrap()
            .pair(&plan::DEFAULT_BLOCK, 0xfffe)
            .unwrap();
        assert!(matches!(attach(&pair, &init), Err(VethError::NotRunning)));
        let stale = ProcessIdentity {
            pid: std::process::id() as i32,
            start_time: 1,
        };
        assert!(matches!(attach(&pair, &stale), Err(VethError::NotRunning)));
    }

    #[test]
    fn attaching_to_a_process_in_the_workers_own_namespace_is_refused() {
        let me = ProcessIdentity::of(std::process::id() as i32).unwrap();
        let pair = LinkNames::new("")
            .unwrap()
            .pair(&plan::DEFAULT_BLOCK, 0xfffd)
            .unwrap();
        assert!(matches!(attach(&pair, &me), Err(VethError::HostNamespace)));
    }
}
