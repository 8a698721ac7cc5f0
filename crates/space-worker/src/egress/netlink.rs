//! A small NETLINK_ROUTE client: the few requests a sandbox's link needs (a veth pair
//! whose peer is created directly in another network namespace, an IPv4 address, a
//! link up, a default route, a link deleted), made in-process instead of by `ip`
//! processes — a burst of creates paid for two processes per link.
//!
//! One request at a time, each acknowledged (`NLM_F_ACK`) before the next is sent, so
//! an error names the step that failed and the kernel's errno. A socket talks to the
//! namespace it was created in (a socket in a sandbox's namespace comes from
//! [`crate::substrate::jail::netns::route_socket_in`]). Bounds: a request is at most
//! [`MAX_REQUEST`] bytes, a reply datagram at most [`MAX_REPLY`] (a longer one is an
//! error, never read in part), and no answer within [`TIMEOUT`] is an error. A reply
//! is taken only from the kernel (the socket is connected to it, and the sender is
//! checked), to this socket's port, with the sequence number of the request.

use std::io;
use std::net::Ipv4Addr;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::time::Duration;

use rustix::io::Errno;
use rustix::net::netlink::SocketAddrNetlink;
use rustix::net::sockopt::{self, Timeout};
use rustix::net::{AddressFamily, RecvFlags, SendFlags, SocketAddrAny, SocketFlags, SocketType};

/// How long a request waits for the kernel's answer.
pub const TIMEOUT: Duration = Duration::from_secs(2);
/// Most bytes of one reply datagram read (a link's description is about 1.5 KiB).
pub const MAX_REPLY: usize = 32 * 1024;
/// Most bytes of one request.
pub const MAX_REQUEST: usize = 4096;
/// The kernel's interface name limit, with its NUL.
const IFNAMSIZ: usize = 16;

const NLMSG_HDRLEN: usize = 16;
const RTA_HDRLEN: usize = 4;
const NLMSG_NOOP: u16 = libc::NLMSG_NOOP as u16;
const NLMSG_ERROR: u16 = libc::NLMSG_ERROR as u16;
const NLMSG_OVERRUN: u16 = libc::NLMSG_OVERRUN as u16;
const NLM_F_REQUEST: u16 = libc::NLM_F_REQUEST as u16;
const NLM_F_ACK: u16 = libc::NLM_F_ACK as u16;
const NLM_F_EXCL: u16 = libc::NLM_F_EXCL as u16;
const NLM_F_CREATE: u16 = libc::NLM_F_CREATE as u16;
const NLM_F_REPLACE: u16 = libc::NLM_F_REPLACE as u16;
/// `linux/veth.h`.
const VETH_INFO_PEER: u16 = 1;

/// Why a request did not do what it asked.
#[derive(Debug, thiserror::Error)]
pub enum NetlinkError {
    #[error("netlink socket: {context}: {source}")]
    Socket {
        context: &'static str,
        source: io::Error,
    },
    #[error("{op}: the kernel answered {} ({})", errno_name(*.errno), io::Error::from_raw_os_error(*.errno))]
    Kernel { op: String, errno: i32 },
    #[error("{op}: no answer from the kernel within {TIMEOUT:?}")]
    Timeout { op: String },
    #[error("{op}: a reply with sequence number {got} is refused (the request's is {expected})")]
    ForeignSequence { op: String, expected: u32, got: u32 },
    #[error("{op}: {why}")]
    BadReply { op: String, why: String },
    #[error("interface name {0:?}: 1 to 15 bytes, none of them NUL, '/' or whitespace")]
    BadName(String),
    #[error("a request over {MAX_REQUEST} bytes")]
    TooLarge,
}

impl NetlinkError {
    /// The kernel's errno, when the kernel refused the request.
    pub fn errno(&self) -> Option<i32> {
        match self {
            NetlinkError::Kernel { errno, .. } => Some(*errno),
            _ => None,
        }
    }
}

/// The symbolic name of the errnos rtnetlink answers with (the number otherwise).
fn errno_name(errno: i32) -> String {
    let name = match errno {
        libc::EPERM => "EPERM",
        libc::ENOENT => "ENOENT",
        libc::ESRCH => "ESRCH",
        libc::EBADF => "EBADF",
        libc::EAGAIN => "EAGAIN",
        libc::ENOMEM => "ENOMEM",
        libc::EACCES => "EACCES",
        libc::EBUSY => "EBUSY",
        libc::EEXIST => "EEXIST",
        libc::ENODEV => "ENODEV",
        libc::EINVAL => "EINVAL",
        libc::ENOSPC => "ENOSPC",
        libc::ERANGE => "ERANGE",
        libc::EOPNOTSUPP => "EOPNOTSUPP",
        libc::EADDRNOTAVAIL => "EADDRNOTAVAIL",
        libc::ENETUNREACH => "ENETUNREACH",
        libc::ENOBUFS => "ENOBUFS",
        libc::ENETDOWN => "ENETDOWN",
        _ => return format!("errno {errno}"),
    };
    format!("{name}, errno {errno}")
}

fn align(n: usize) -> usize {
    (n + 3) & !3
}

/// One request under construction: header, family header, attributes (nested ones
/// closed by [`Request::end`]), every part padded to 4 bytes as the kernel reads it.
#[derive(Debug)]
struct Request {
    buf: Vec<u8>,
    too_large: bool,
}

impl Request {
    fn new(kind: u16, flags: u16) -> Self {
        let mut buf = Vec::with_capacity(256);
        buf.extend_from_slice(&0u32.to_ne_bytes()); // length, set by `finish`
        buf.extend_from_slice(&kind.to_ne_bytes());
        buf.extend_from_slice(&(flags | NLM_F_REQUEST | NLM_F_ACK).to_ne_bytes());
        buf.extend_from_slice(&0u32.to_ne_bytes()); // sequence, set by `finish`
        buf.extend_from_slice(&0u32.to_ne_bytes()); // port: 0, the kernel fills it in
        Request {
            buf,
            too_large: false,
        }
    }

    fn pad(&mut self) {
        self.buf.resize(align(self.buf.len()), 0);
    }

    /// Appends raw bytes (a family header), padded.
    fn put(&mut self, bytes: &[u8]) -> &mut Self {
        self.buf.extend_from_slice(bytes);
        self.pad();
        self
    }

    fn attr(&mut self, kind: u16, value: &[u8]) -> &mut Self {
        match u16::try_from(RTA_HDRLEN + value.len()) {
            Ok(len) => {
                self.buf.extend_from_slice(&len.to_ne_bytes());
                self.buf.extend_from_slice(&kind.to_ne_bytes());
                self.buf.extend_from_slice(value);
                self.pad();
            }
            Err(_) => self.too_large = true,
        }
        self
    }

    /// A NUL-terminated name.
    fn attr_name(&mut self, kind: u16, name: &Name) -> &mut Self {
        let mut value = name.0.as_bytes().to_vec();
        value.push(0);
        self.attr(kind, &value)
    }

    fn attr_u32(&mut self, kind: u16, value: u32) -> &mut Self {
        self.attr(kind, &value.to_ne_bytes())
    }

    /// Opens a nested attribute; its length is set by [`Request::end`].
    fn begin(&mut self, kind: u16) -> usize {
        let at = self.buf.len();
        self.attr(kind, &[]);
        at
    }

    fn end(&mut self, at: usize) -> &mut Self {
        match u16::try_from(self.buf.len() - at) {
            Ok(len) => self.buf[at..at + 2].copy_from_slice(&len.to_ne_bytes()),
            Err(_) => self.too_large = true,
        }
        self
    }

    /// The bytes to send with sequence number `seq`.
    fn finish(mut self, seq: u32) -> Result<Vec<u8>, NetlinkError> {
        if self.too_large || self.buf.len() > MAX_REQUEST {
            return Err(NetlinkError::TooLarge);
        }
        let len = self.buf.len() as u32;
        self.buf[0..4].copy_from_slice(&len.to_ne_bytes());
        self.buf[8..12].copy_from_slice(&seq.to_ne_bytes());
        Ok(self.buf)
    }
}

/// `struct ifinfomsg` (16 bytes).
fn ifinfomsg(index: u32, flags: u32, change: u32) -> [u8; 16] {
    let mut m = [0u8; 16];
    m[0] = libc::AF_UNSPEC as u8;
    m[4..8].copy_from_slice(&index.to_ne_bytes());
    m[8..12].copy_from_slice(&flags.to_ne_bytes());
    m[12..16].copy_from_slice(&change.to_ne_bytes());
    m
}

/// An interface name the kernel takes: 1 to 15 bytes, no NUL, `/` or whitespace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Name(String);

impl Name {
    /// `name`, checked.
    pub fn new(name: &str) -> Result<Self, NetlinkError> {
        let ok = !name.is_empty()
            && name.len() < IFNAMSIZ
            && name != "."
            && name != ".."
            && !name
                .bytes()
                .any(|b| b == 0 || b == b'/' || b == b':' || b.is_ascii_whitespace());
        if !ok {
            return Err(NetlinkError::BadName(name.chars().take(32).collect()));
        }
        Ok(Name(name.to_owned()))
    }
}

/// A NETLINK_ROUTE socket connected to the kernel of the namespace it was created in.
#[derive(Debug)]
pub struct Route {
    fd: OwnedFd,
    /// This socket's port (the kernel addresses its replies to it).
    port: u32,
    seq: u32,
}

impl Route {
    /// A socket in the calling thread's network namespace.
    pub fn open() -> Result<Self, NetlinkError> {
        let fd = rustix::net::socket_with(
            AddressFamily::NETLINK,
            SocketType::RAW,
            SocketFlags::CLOEXEC,
            None,
        )
        .map_err(|e| socket_error("create", e))?;
        Self::from_socket(fd)
    }

    /// A client on `fd`, a NETLINK_ROUTE socket made elsewhere (in a sandbox's
    /// namespace) and not used yet.
    pub fn from_socket(fd: OwnedFd) -> Result<Self, NetlinkError> {
        let kernel = SocketAddrNetlink::new(0, 0);
        // Port 0: the kernel picks one.
        rustix::net::bind(&fd, &SocketAddrNetlink::new(0, 0))
            .map_err(|e| socket_error("bind", e))?;
        // Connected to the kernel: no other socket's datagram is queued to this one.
        rustix::net::connect(&fd, &kernel).map_err(|e| socket_error("connect", e))?;
        sockopt::set_socket_timeout(&fd, Timeout::Recv, Some(TIMEOUT))
            .map_err(|e| socket_error("set the receive timeout", e))?;
        let local = rustix::net::getsockname(&fd).map_err(|e| socket_error("getsockname", e))?;
        let port = SocketAddrNetlink::try_from(local)
            .map_err(|e| socket_error("not a netlink socket", e))?
            .pid();
        Ok(Route { fd, port, seq: 0 })
    }

    /// A veth pair: `host` in this socket's namespace, its peer `peer` created
    /// directly in the namespace `peer_netns` (an open `/proc/PID/ns/net`). Both stay
    /// down. `EEXIST` if either name is taken.
    pub fn add_veth_pair(
        &mut self,
        host: &Name,
        peer: &Name,
        peer_netns: BorrowedFd<'_>,
    ) -> Result<(), NetlinkError> {
        let netns_fd = u32::try_from(peer_netns.as_raw_fd()).map_err(|_| NetlinkError::TooLarge)?;
        let mut r = Request::new(libc::RTM_NEWLINK, NLM_F_CREATE | NLM_F_EXCL);
        r.put(&ifinfomsg(0, 0, 0))
            .attr_name(libc::IFLA_IFNAME, host);
        let info = r.begin(libc::IFLA_LINKINFO);
        r.attr(libc::IFLA_INFO_KIND, b"veth");
        let data = r.begin(libc::IFLA_INFO_DATA);
        let peer_at = r.begin(VETH_INFO_PEER);
        r.put(&ifinfomsg(0, 0, 0))
            .attr_name(libc::IFLA_IFNAME, peer)
            .attr_u32(libc::IFLA_NET_NS_FD, netns_fd);
        r.end(peer_at).end(data).end(info);
        self.call(&format!("add the veth pair {}/{}", host.0, peer.0), r)
            .map(drop)
    }

    /// The index of the link named `name`, if there is one.
    pub fn link_index(&mut self, name: &Name) -> Result<Option<u32>, NetlinkError> {
        let mut r = Request::new(libc::RTM_GETLINK, 0);
        r.put(&ifinfomsg(0, 0, 0))
            .attr_name(libc::IFLA_IFNAME, name);
        let op = format!("look up the link {}", name.0);
        let reply = match self.call(&op, r) {
            Err(e) if e.errno() == Some(libc::ENODEV) => return Ok(None),
            other => other?,
        };
        let Some((kind, payload)) = reply else {
            return Err(bad_reply(&op, "no description of the link"));
        };
        if kind != libc::RTM_NEWLINK || payload.len() < 16 {
            return Err(bad_reply(&op, &format!("a reply of type {kind}")));
        }
        let index = u32::from_ne_bytes([payload[4], payload[5], payload[6], payload[7]]);
        if index == 0 {
            return Err(bad_reply(&op, "link index 0"));
        }
        Ok(Some(index))
    }

    /// Adds `addr/prefix` to link `index` (its peer address is `addr` too, as
    /// `ip addr add` sets it). `EEXIST` if it is there already.
    pub fn add_address(
        &mut self,
        index: u32,
        addr: Ipv4Addr,
        prefix: u8,
    ) -> Result<(), NetlinkError> {
        if prefix > 32 {
            return Err(bad_reply("add an address", "prefix over 32"));
        }
        let mut r = Request::new(libc::RTM_NEWADDR, NLM_F_CREATE | NLM_F_EXCL);
        let mut ifaddrmsg = [0u8; 8];
        ifaddrmsg[0] = libc::AF_INET as u8;
        ifaddrmsg[1] = prefix;
        ifaddrmsg[3] = libc::RT_SCOPE_UNIVERSE;
        ifaddrmsg[4..8].copy_from_slice(&index.to_ne_bytes());
        r.put(&ifaddrmsg)
            .attr(libc::IFA_LOCAL, &addr.octets())
            .attr(libc::IFA_ADDRESS, &addr.octets());
        self.call(&format!("add {addr}/{prefix} to link {index}"), r)
            .map(drop)
    }

    /// Brings link `index` up.
    pub fn set_up(&mut self, index: u32) -> Result<(), NetlinkError> {
        let up = libc::IFF_UP as u32;
        let mut r = Request::new(libc::RTM_NEWLINK, 0);
        r.put(&ifinfomsg(index, up, up));
        self.call(&format!("bring link {index} up"), r).map(drop)
    }

    /// Sets the default route of the main table: via `gateway` on link `index`
    /// (replacing one there).
    pub fn replace_default_route(
        &mut self,
        gateway: Ipv4Addr,
        index: u32,
    ) -> Result<(), NetlinkError> {
        let mut r = Request::new(libc::RTM_NEWROUTE, NLM_F_CREATE | NLM_F_REPLACE);
        let rtmsg = [
            libc::AF_INET as u8,
            0, // destination length: the default route
            0,
            0,
            libc::RT_TABLE_MAIN,
            libc::RTPROT_BOOT,
            libc::RT_SCOPE_UNIVERSE,
            libc::RTN_UNICAST,
            0,
            0,
            0,
            0,
        ];
        r.put(&rtmsg)
            .attr(libc::RTA_GATEWAY, &gateway.octets())
            .attr_u32(libc::RTA_OIF, index);
        self.call(&format!("default route via {gateway} on link {index}"), r)
            .map(drop)
    }

    /// Deletes the link named `name` (a veth's peer goes with it); `false` if there
    /// was none.
    pub fn delete_link(&mut self, name: &Name) -> Result<bool, NetlinkError> {
        let mut r = Request::new(libc::RTM_DELLINK, 0);
        r.put(&ifinfomsg(0, 0, 0))
            .attr_name(libc::IFLA_IFNAME, name);
        match self.call(&format!("delete the link {}", name.0), r) {
            Ok(_) => Ok(true),
            Err(e) if e.errno() == Some(libc::ENODEV) => Ok(false),
            Err(e) => Err(e),
        }
    }

    fn next_seq(&mut self) -> u32 {
        self.seq = self.seq.wrapping_add(1).max(1);
        self.seq
    }

    /// Sends `request` and reads until its acknowledgement; the one message other than
    /// the acknowledgement the kernel sent for it (a `GET`'s answer), if any.
    fn call(&mut self, op: &str, request: Request) -> Result<Option<(u16, Vec<u8>)>, NetlinkError> {
        let seq = self.next_seq();
        let bytes = request.finish(seq)?;
        self.send(&bytes)?;
        self.receive(op, seq)
    }

    fn send(&self, bytes: &[u8]) -> Result<(), NetlinkError> {
        let sent = rustix::net::send(&self.fd, bytes, SendFlags::empty())
            .map_err(|e| socket_error("send", e))?;
        if sent != bytes.len() {
            return Err(NetlinkError::Socket {
                context: "send",
                source: io::Error::other(format!("{sent} of {} bytes sent", bytes.len())),
            });
        }
        Ok(())
    }

    fn receive(&mut self, op: &str, seq: u32) -> Result<Option<(u16, Vec<u8>)>, NetlinkError> {
        let mut buf = vec![0u8; MAX_REPLY];
        let mut answer = None;
        loop {
            let (read, full, from) =
                match rustix::net::recvfrom(&self.fd, &mut buf[..], RecvFlags::TRUNC) {
                    Ok((_, full, from)) => (full.min(MAX_REPLY), full, from),
                    Err(Errno::AGAIN) => return Err(NetlinkError::Timeout { op: op.into() }),
                    Err(Errno::INTR) => continue,
                    Err(e) => return Err(socket_error("receive", e)),
                };
            if full > MAX_REPLY {
                return Err(bad_reply(
                    op,
                    &format!("a reply of {full} bytes (at most {MAX_REPLY} are read)"),
                ));
            }
            if !from_kernel(from) {
                return Err(bad_reply(op, "a reply not from the kernel"));
            }
            for message in Messages::new(&buf[..read]) {
                let m = message.map_err(|why| bad_reply(op, why))?;
                if m.seq != seq {
                    return Err(NetlinkError::ForeignSequence {
                        op: op.into(),
                        expected: seq,
                        got: m.seq,
                    });
                }
                if m.port != self.port {
                    return Err(bad_reply(op, &format!("a reply to port {}", m.port)));
                }
                match m.kind {
                    NLMSG_NOOP => {}
                    NLMSG_ERROR => {
                        let code = m
                            .payload
                            .get(..4)
                            .map(|b| i32::from_ne_bytes([b[0], b[1], b[2], b[3]]))
                            .ok_or_else(|| bad_reply(op, "a short error message"))?;
                        return match code {
                            0 => Ok(answer),
                            c if c < 0 => Err(NetlinkError::Kernel {
                                op: op.into(),
                                errno: -c,
                            }),
                            c => Err(bad_reply(op, &format!("error code {c}"))),
                        };
                    }
                    NLMSG_OVERRUN => return Err(bad_reply(op, "the kernel's buffer overran")),
                    kind if answer.is_none() => answer = Some((kind, m.payload.to_vec())),
                    _ => return Err(bad_reply(op, "more than one answer to one request")),
                }
            }
        }
    }

    /// Sends a request to look up `lo` with sequence number `seq` and waits for the
    /// answer to `expect` (for the test of foreign sequence numbers).
    #[cfg(test)]
    fn ask_with_sequence(&mut self, seq: u32, expect: u32) -> Result<(), NetlinkError> {
        let mut r = Request::new(libc::RTM_GETLINK, 0);
        r.put(&ifinfomsg(0, 0, 0))
            .attr_name(libc::IFLA_IFNAME, &Name::new("lo")?);
        let bytes = r.finish(seq)?;
        self.send(&bytes)?;
        self.receive("look up lo", expect).map(drop)
    }
}

impl AsFd for Route {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

fn from_kernel(from: Option<SocketAddrAny>) -> bool {
    from.and_then(|a| SocketAddrNetlink::try_from(a).ok())
        .is_some_and(|a| a.pid() == 0)
}

fn socket_error(context: &'static str, e: Errno) -> NetlinkError {
    NetlinkError::Socket {
        context,
        source: e.into(),
    }
}

fn bad_reply(op: &str, why: &str) -> NetlinkError {
    NetlinkError::BadReply {
        op: op.into(),
        why: why.into(),
    }
}

/// One message of a reply datagram.
#[derive(Debug)]
struct Message<'a> {
    kind: u16,
    seq: u32,
    port: u32,
    payload: &'a [u8],
}

/// The messages of one datagram, each checked to lie inside it.
#[derive(Debug)]
struct Messages<'a> {
    rest: &'a [u8],
}

impl<'a> Messages<'a> {
    fn new(datagram: &'a [u8]) -> Self {
        Messages { rest: datagram }
    }
}

impl<'a> Iterator for Messages<'a> {
    type Item = Result<Message<'a>, &'static str>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.rest.is_empty() {
            return None;
        }
        let rest = self.rest;
        if rest.len() < NLMSG_HDRLEN {
            self.rest = &[];
            return Some(Err("a message shorter than its header"));
        }
        let word =
            |at: usize| u32::from_ne_bytes([rest[at], rest[at + 1], rest[at + 2], rest[at + 3]]);
        let len = word(0) as usize;
        if len < NLMSG_HDRLEN || len > rest.len() {
            self.rest = &[];
            return Some(Err("a message whose length is outside the datagram"));
        }
        let message = Message {
            kind: u16::from_ne_bytes([rest[4], rest[5]]),
            seq: word(8),
            port: word(12),
            payload: &rest[NLMSG_HDRLEN..len],
        };
        self.rest = rest.get(align(len)..).unwrap_or(&[]);
        Some(Ok(message))
    }
}

#[cfg(test)]
#[path = "netlink_tests.rs"]
mod tests;
