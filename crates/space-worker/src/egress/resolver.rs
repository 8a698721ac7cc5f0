//! The platform's resolver for sandboxes, on UDP and TCP of one port of each pair's
//! host side (the table redirects every DNS packet from a sandbox link there; no other
//! DNS leaves).
//!
//! A question's name is judged with `decide_name` under the tenant's policy of that
//! moment: refused → `REFUSED` without records (and a refusal recorded); `A` allowed →
//! the upstream's `A` records (TTL at most [`MAX_TTL`]); `AAAA` → `NOERROR` without
//! records (sandboxes are IPv4 only, so clients fall back to `A` at once); any other
//! type, or a class other than `IN` → `NOTIMP`. A name that is no host name (`_srv`
//! labels, the root) is refused. A malformed query gets `FORMERR` when its header can
//! be answered, and is dropped otherwise.

use std::io::{IoSlice, IoSliceMut};
use std::net::{IpAddr, Ipv4Addr, SocketAddrV4};
use std::os::fd::AsRawFd;
use std::sync::Arc;

use nix::sys::socket::{
    ControlMessage, ControlMessageOwned, MsgFlags, SockaddrIn, recvmsg, sendmsg,
};
use space_egress::dns::{self, CLASS_IN, DnsError, Rcode, TYPE_A, TYPE_AAAA};
use space_egress::{DnsName, decide_name};
use tokio::io::{AsyncReadExt, AsyncWriteExt, Interest};
use tokio::net::{TcpStream, UdpSocket};

use super::shared::{Admitted, Shared, Unknown};
use super::tenant::{LAYER_PROXY, Tenant, Via};
use super::upstream::{MAX_TTL, Upstream, UpstreamError};

/// The rule text of a question for something that is no host name.
pub const NOT_A_HOST_NAME: &str = "not a host name";

/// The answer to one message from `tenant`, or `None` to drop it.
pub(crate) async fn answer(tenant: &Tenant, upstream: &Upstream, msg: &[u8]) -> Option<Vec<u8>> {
    tenant.count(Via::Dns);
    let query = match dns::parse_query(msg) {
        Ok(q) => q,
        Err(DnsError::Opcode(_)) => return dns::error_reply(msg, Rcode::NotImp),
        Err(_) => return dns::error_reply(msg, Rcode::FormErr),
    };
    if query.qclass != CLASS_IN {
        return Some(dns::reply_without_records(&query, Rcode::NotImp));
    }
    let Ok(name) = DnsName::parse(&query.name) else {
        let shown = if query.name.is_empty() {
            "."
        } else {
            &query.name
        };
        tenant.refuse(Via::Dns, shown, LAYER_PROXY, NOT_A_HOST_NAME);
        return Some(dns::reply_without_records(&query, Rcode::Refused));
    };
    let decision = decide_name(&tenant.policy(), &name);
    if !decision.is_allow() {
        tenant.refused_by(Via::Dns, name.as_str(), &decision);
        return Some(dns::reply_without_records(&query, Rcode::Refused));
    }
    match query.qtype {
        TYPE_A => {}
        TYPE_AAAA => return Some(dns::answer(&query, &[], 0)),
        _ => return Some(dns::reply_without_records(&query, Rcode::NotImp)),
    }
    match upstream.resolve_a(&name).await {
        Ok(resolved) => {
            let addrs: Vec<IpAddr> = resolved.addrs.iter().map(|&a| a.into()).collect();
            Some(dns::answer(&query, &addrs, resolved.ttl.min(MAX_TTL)))
        }
        Err(UpstreamError::NxDomain) => Some(dns::reply_without_records(&query, Rcode::NxDomain)),
        Err(e) => {
            tracing::debug!(sandbox = %tenant.sandbox(), name = name.as_str(), error = %e, "upstream DNS failed");
            Some(dns::reply_without_records(&query, Rcode::ServFail))
        }
    }
}

/// One datagram: its bytes, who sent it and to which local address.
struct Datagram {
    len: usize,
    peer: SocketAddrV4,
    local: Option<Ipv4Addr>,
}

fn receive(socket: &UdpSocket, buf: &mut [u8]) -> std::io::Result<Datagram> {
    let mut iov = [IoSliceMut::new(buf)];
    let mut cmsg = nix::cmsg_space!(libc::in_pktinfo);
    let msg = recvmsg::<SockaddrIn>(
        socket.as_raw_fd(),
        &mut iov,
        Some(&mut cmsg),
        MsgFlags::MSG_DONTWAIT | MsgFlags::MSG_TRUNC,
    )
    .map_err(std::io::Error::from)?;
    let peer = msg
        .address
        .map(SocketAddrV4::from)
        .ok_or_else(|| std::io::Error::other("a datagram without a sender"))?;
    let mut local = None;
    for c in msg.cmsgs().map_err(std::io::Error::from)? {
        if let ControlMessageOwned::Ipv4PacketInfo(info) = c {
            local = Some(Ipv4Addr::from(u32::from_be(info.ipi_addr.s_addr)));
        }
    }
    Ok(Datagram {
        len: msg.bytes,
        peer,
        local,
    })
}

/// Sends `reply` to `peer` from `local` (the address the question was sent to, so
/// conntrack maps it back to where the sandbox sent it).
async fn reply(
    socket: &UdpSocket,
    peer: SocketAddrV4,
    local: Ipv4Addr,
    reply: &[u8],
) -> std::io::Result<()> {
    let info = libc::in_pktinfo {
        ipi_ifindex: 0,
        ipi_spec_dst: libc::in_addr {
            s_addr: u32::from(local).to_be(),
        },
        ipi_addr: libc::in_addr { s_addr: 0 },
    };
    let to = SockaddrIn::from(peer);
    socket
        .async_io(Interest::WRITABLE, || {
            sendmsg(
                socket.as_raw_fd(),
                &[IoSlice::new(reply)],
                &[ControlMessage::Ipv4PacketInfo(&info)],
                MsgFlags::MSG_DONTWAIT,
                Some(&to),
            )
            .map_err(std::io::Error::from)
        })
        .await
        .map(|_| ())
}

/// Receives questions until stopped; each answered by a task of its own.
pub(crate) async fn serve_udp(shared: Arc<Shared>, socket: UdpSocket) {
    let socket = Arc::new(socket);
    let mut stop = shared.stop.clone();
    let mut buf = vec![0u8; dns::MAX_UDP_MESSAGE + 1];
    loop {
        let got = tokio::select! {
            r = socket.async_io(Interest::READABLE, || receive(&socket, &mut buf)) => r,
            _ = stop.wait_for(|s| *s) => return,
        };
        let d = match got {
            Ok(d) => d,
            Err(e) => {
                tracing::debug!(error = %e, "resolver: receive failed");
                continue;
            }
        };
        let Some(local) = d.local else {
            shared.unknown(Unknown::Peer);
            continue;
        };
        let Some(tenant) = shared.directory.tenant(*d.peer.ip(), local) else {
            shared.unknown(Unknown::Peer);
            continue;
        };
        let Some(slot) = tenant.enter_question(shared.limits.questions_per_tenant) else {
            shared.unknown(Unknown::Limit);
            continue;
        };
        let Ok(place) = Arc::clone(&shared.questions).try_acquire_owned() else {
            shared.unknown(Unknown::Limit);
            continue;
        };
        // MSG_TRUNC gives the datagram's real length: longer than the buffer, it is
        // longer than any query.
        let msg = buf[..d.len.min(buf.len())].to_vec();
        let (shared, socket) = (Arc::clone(&shared), Arc::clone(&socket));
        tokio::spawn(async move {
            let _place = place;
            let Some(out) = answer(slot.tenant(), &shared.upstream, &msg).await else {
                return;
            };
            if let Err(e) = reply(&socket, d.peer, local, &out).await {
                tracing::debug!(error = %e, "resolver: reply failed");
            }
        });
    }
}

/// Questions over one TCP connection (2-byte length framing): at most
/// `Limits::tcp_questions` of them, each within `Limits::tcp_idle` of the last.
pub(crate) async fn serve_tcp(shared: Arc<Shared>, mut tcp: TcpStream, admitted: &Admitted) {
    let tenant = Arc::clone(admitted.slot.tenant());
    let limits = &shared.limits;
    let mut msg = Vec::with_capacity(dns::MAX_UDP_MESSAGE);
    for _ in 0..limits.tcp_questions {
        let read = async {
            let len = usize::from(tcp.read_u16().await?);
            if len > dns::MAX_UDP_MESSAGE {
                return Err(std::io::Error::other("a query longer than 512 bytes"));
            }
            msg.resize(len, 0);
            tcp.read_exact(&mut msg).await?;
            Ok::<_, std::io::Error>(())
        };
        match tokio::time::timeout(limits.tcp_idle, read).await {
            Ok(Ok(())) => {}
            _ => return,
        }
        let Some(_question) = tenant.enter_question(limits.questions_per_tenant) else {
            return;
        };
        let Ok(_place) = Arc::clone(&shared.questions).try_acquire_owned() else {
            shared.unknown(Unknown::Limit);
            return;
        };
        let Some(out) = answer(&tenant, &shared.upstream, &msg).await else {
            return;
        };
        let mut framed = Vec::with_capacity(out.len() + 2);
        framed.extend((out.len() as u16).to_be_bytes());
        framed.extend(out);
        if tcp.write_all(&framed).await.is_err() {
            return;
        }
    }
    shared.unknown(Unknown::Limit);
}
