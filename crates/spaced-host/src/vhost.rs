//! QEMU's vhost-vsock (`Transport::VhostVsock`): the host's own `AF_VSOCK` reaches
//! the guest's agent at the guest's context ID (CID) and [`vm::VSOCK_PORT`], the
//! kernel's vhost-vsock carrying it into the VM through the `/dev/vhost-vsock`
//! descriptor its QEMU holds.
//!
//! `AF_VSOCK` gives no peer credentials, so the transport's peer is established from
//! what the kernel guarantees: a CID belongs to at most one vhost-vsock device of the
//! host at a time (taking a held one fails with `EADDRINUSE`), the worker opened the
//! device and gave it to the QEMU it recorded with this CID, and a device's CID goes
//! when the last descriptor of it closes. So before connecting — and again once the
//! connection is up — the bridge checks that the recorded QEMU is the live process
//! (PID, start time, executable, uid, pidfd) and holds a descriptor of
//! `/dev/vhost-vsock` (its `/proc/PID/fd` links, read with `readlink` only, at most
//! [`space_peer::MAX_FDS`] of them); a QEMU that is gone, was replaced, or holds no
//! such descriptor is refused and nothing is connected. The guest then proves its
//! execution with the activation's secret, as over every transport.
//!
//! Any host process may connect to any guest's CID: the bridge connects from a
//! reserved host port (at or below [`vm::LAST_RESERVED_PORT`], which only a process
//! with `CAP_NET_BIND_SERVICE` can bind), and the guest's agent serves no other
//! (`space.vsock_peer=reserved_port` on its kernel command line).
//!
//! The link is the bridge's for its life, as the serial port's is: QEMU resets vsock
//! connections only on a *restored* VM (a transport reset event after the incoming
//! migration); the VM a snapshot was taken of goes on with its connections, so a link
//! that ends while its QEMU lives is not a snapshot's doing and the bridge exits
//! (`relink::watch` without relinking).

use std::fs::File;
use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::path::Path;
use std::time::{Duration, Instant};

use space_mux::Link;
use space_peer::{LiveProcess, PeerError};
use space_proto::vm;

use crate::error::BridgeError;
use crate::spec::BridgeSpec;

/// The host's vhost-vsock device.
pub const VHOST_VSOCK: &str = "/dev/vhost-vsock";
/// The longest one connection attempt may take: short, so that an attempt whose
/// answer was lost (a restored guest answering from its old CID until it has taken in
/// its transport reset) is soon made again rather than waited on.
const CONNECT_WAIT: Duration = Duration::from_secs(1);
/// `VMADDR_CID_ANY`: a local address of any CID (the host's, for a connection into a
/// guest).
const VMADDR_CID_ANY: u32 = u32::MAX;
/// Pause between two attempts while the guest's agent does not listen yet.
const RETRY_PAUSE: Duration = Duration::from_millis(50);

/// Makes one `AF_VSOCK` connection to `(cid, port)` within a timeout: [`connect_vsock`],
/// or a test's stand-in where the host has no vsock.
pub type Connector<'a> = &'a mut dyn FnMut(u32, u32, Duration) -> io::Result<OwnedFd>;

/// Whether `cid` can be a guest's: not the hypervisor's (0), local (1), the host's (2)
/// nor `VMADDR_CID_ANY`.
pub fn is_guest_cid(cid: u32) -> bool {
    cid > vm::HOST_CID && cid != VMADDR_CID_ANY
}

/// What the bridge holds of its VMM for the link's life: the VMM's own open file of
/// the vhost-vsock device (a duplicate, by `pidfd_getfd`) — a CID goes only when the
/// last descriptor of its device closes, so while the bridge holds this no other
/// device can take the guest's CID and be reached through the bridge's connection
/// (the kernel resets a connection to a CID that went only when no device took it
/// again meanwhile) — and the VMM's pidfd, to end the bridge when the VMM ends
/// ([`exit_when_the_vmm_ends`]).
#[derive(Debug)]
pub struct VmmHold {
    /// The VMM's vhost-vsock device, duplicated.
    pub device: OwnedFd,
    /// The VMM, by pidfd.
    pub vmm: LiveProcess,
}

/// The bridge's vhost-vsock transport: the recorded QEMU verified ([`verify_vmm`]),
/// the guest's agent connected at `cid` from a reserved port, the QEMU verified again
/// and its device held ([`VmmHold`]), the guest activated: the link, once `ready`. A
/// guest still booting does not listen yet: asked again, verified again each time,
/// until `ready_wait` has passed.
pub fn connect_agent(
    spec: &BridgeSpec,
    cid: u32,
    ready_wait: Duration,
) -> Result<(Link, VmmHold), BridgeError> {
    connect_agent_with(
        spec,
        cid,
        ready_wait,
        Path::new(VHOST_VSOCK),
        &mut connect_vsock,
    )
}

/// [`connect_agent`] with the device whose descriptor the VMM must hold and the way a
/// connection is made as parameters (tests stand in for both: this host class has no
/// vhost-vsock).
pub fn connect_agent_with(
    spec: &BridgeSpec,
    cid: u32,
    ready_wait: Duration,
    device: &Path,
    connect: Connector<'_>,
) -> Result<(Link, VmmHold), BridgeError> {
    if !is_guest_cid(cid) {
        return Err(BridgeError::Io(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{cid} is no guest's context ID"),
        )));
    }
    let deadline = Instant::now() + ready_wait;
    loop {
        verify_vmm(spec, device)?;
        let left = deadline.saturating_duration_since(Instant::now());
        match connect(
            cid,
            vm::VSOCK_PORT,
            left.clamp(Duration::from_millis(100), CONNECT_WAIT),
        ) {
            Ok(conn) => {
                // The same live QEMU, still holding the device, now that the
                // connection is up: its device held from here on.
                let hold = match hold_vmm(spec, device) {
                    Ok(hold) => hold,
                    Err(e) => {
                        let _ = rustix::net::shutdown(&conn, rustix::net::Shutdown::Both);
                        return Err(e);
                    }
                };
                let left = deadline.saturating_duration_since(Instant::now());
                let link = activate(conn, spec, left.max(Duration::from_secs(1)))?;
                return Ok((link, hold));
            }
            Err(e) if not_listening_yet(&e) && Instant::now() < deadline => {
                std::thread::sleep(RETRY_PAUSE);
            }
            Err(e) => return Err(BridgeError::Io(e)),
        }
    }
}

/// Whether a failed connection is a guest whose agent does not listen yet (worth
/// another attempt): reset by the guest (no listener), refused, or timed out.
fn not_listening_yet(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::ConnectionReset
            | io::ErrorKind::ConnectionRefused
            | io::ErrorKind::TimedOut
            | io::ErrorKind::WouldBlock
    )
}

/// The recorded VMM (`spec.agent`) is the live process it was (PID, start time,
/// executable, uid, pidfd) and holds a descriptor of `device`; what `/proc` showed
/// was that process's (its pidfd says it still runs after the reading). [`hold_vmm`]
/// with the hold let go.
pub fn verify_vmm(spec: &BridgeSpec, device: &Path) -> Result<(), BridgeError> {
    hold_vmm(spec, device).map(drop)
}

/// The recorded VMM verified as [`verify_vmm`] says, and its device duplicated from it
/// (`pidfd_getfd`), checked to be `device` by identity.
pub fn hold_vmm(spec: &BridgeSpec, device: &Path) -> Result<VmmHold, BridgeError> {
    let live = LiveProcess::open(spec.agent.pid)?;
    spec.agent.verify(&live.identity)?;
    let Some(fd) = space_peer::fd_holding_file(spec.agent.pid, device)? else {
        return Err(PeerError::NotHeld("the recorded VMM holds no vhost-vsock device").into());
    };
    let held = live.take_fd_of(fd, device)?;
    if !live.is_alive() {
        return Err(PeerError::NoSuchProcess(spec.agent.pid).into());
    }
    Ok(VmmHold {
        device: held,
        vmm: live,
    })
}

/// Blocks until the process behind `pidfd` has ended.
pub fn wait_for_end(pidfd: &OwnedFd) {
    use rustix::event::{PollFd, PollFlags, poll};
    loop {
        let mut fds = [PollFd::new(pidfd, PollFlags::IN)];
        match poll(&mut fds, None) {
            Ok(n) if n > 0 => return,
            Err(rustix::io::Errno::INTR) | Ok(_) => continue,
            // A pidfd that cannot be polled: treat it as ended.
            Err(_) => return,
        }
    }
}

/// Keeps `hold` for this process's life and ends the process (exit 3) when the VMM
/// ends: a guest link whose VMM is gone is no link, and the held device (its CID)
/// must go with the bridge.
pub fn exit_when_the_vmm_ends(hold: VmmHold) {
    let _ = std::thread::Builder::new()
        .name("vmm-watch".into())
        .stack_size(64 * 1024)
        .spawn(move || {
            wait_for_end(&hold.vmm.pidfd);
            eprintln!("spaced-host: the VMM ended; exiting");
            std::process::exit(3);
        });
}

/// A `space-mux` link over the connected `conn`, the guest activated on it.
fn activate(conn: OwnedFd, spec: &BridgeSpec, ready_wait: Duration) -> Result<Link, BridgeError> {
    rustix::net::sockopt::set_socket_timeout(
        &conn,
        rustix::net::sockopt::Timeout::Send,
        Some(crate::serial::TRANSPORT_WRITE_WAIT),
    )
    .map_err(io::Error::from)?;
    let reader = File::from(conn.try_clone()?);
    let writer = File::from(conn.try_clone()?);
    let link = Link::start(
        Box::new(reader),
        Box::new(writer),
        Box::new(move || {
            let _ = rustix::net::shutdown(conn.as_fd(), rustix::net::Shutdown::Both);
        }),
        true,
        vm::MAX_STREAMS,
        None,
    )?;
    crate::serial::activate_link(link, spec, ready_wait)
}

/// One `AF_VSOCK` stream connection to `(cid, port)` from a reserved host port
/// ([`bind_reserved`]), made within `timeout`; blocking once made.
pub fn connect_vsock(cid: u32, port: u32, timeout: Duration) -> io::Result<OwnedFd> {
    use nix::sys::socket::{
        AddressFamily, SockFlag, SockType, VsockAddr, connect, getsockopt, socket, sockopt,
    };
    let fd = socket(
        AddressFamily::Vsock,
        SockType::Stream,
        SockFlag::SOCK_CLOEXEC | SockFlag::SOCK_NONBLOCK,
        None,
    )?;
    bind_reserved(&fd)?;
    match connect(fd.as_raw_fd(), &VsockAddr::new(cid, port)) {
        Ok(()) => {}
        Err(nix::errno::Errno::EINPROGRESS) => {
            let mut fds = [rustix::event::PollFd::new(
                &fd,
                rustix::event::PollFlags::OUT,
            )];
            let wait = rustix::event::Timespec {
                tv_sec: timeout.as_secs() as i64,
                tv_nsec: i64::from(timeout.subsec_nanos()),
            };
            if rustix::event::poll(&mut fds, Some(&wait))? == 0 {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "the guest did not answer",
                ));
            }
            let err = getsockopt(&fd, sockopt::SocketError)?;
            if err != 0 {
                return Err(io::Error::from_raw_os_error(err));
            }
        }
        Err(e) => return Err(e.into()),
    }
    rustix::io::ioctl_fionbio(&fd, false)?;
    Ok(fd)
}

/// Binds `fd` (an unbound `AF_VSOCK` socket) to a free reserved port, trying each of
/// `1..=`[`vm::LAST_RESERVED_PORT`] once from a random one: the guest serves no other
/// host port. Needs `CAP_NET_BIND_SERVICE`; the host's reserved ports bound this way
/// bound the VMs on vhost-vsock a host can link at once.
fn bind_reserved(fd: &OwnedFd) -> io::Result<()> {
    use nix::sys::socket::{VsockAddr, bind};
    let mut seed = [0u8; 4];
    rustix::rand::getrandom(&mut seed, rustix::rand::GetRandomFlags::empty())?;
    let ports = vm::LAST_RESERVED_PORT;
    let first = u32::from_ne_bytes(seed) % ports;
    for i in 0..ports {
        let port = 1 + (first + i) % ports;
        match bind(fd.as_raw_fd(), &VsockAddr::new(VMADDR_CID_ANY, port)) {
            Ok(()) => return Ok(()),
            Err(nix::errno::Errno::EADDRINUSE) => continue,
            Err(nix::errno::Errno::EACCES) => {
                return Err(io::Error::new(
                    io::ErrorKind::PermissionDenied,
                    "binding a reserved vsock port needs CAP_NET_BIND_SERVICE",
                ));
            }
            Err(e) => return Err(e.into()),
        }
    }
    Err(io::Error::new(
        io::ErrorKind::AddrInUse,
        "every reserved vsock port of the host is taken",
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_guests_context_id_is_connected() {
        for cid in [0, 1, vm::HOST_CID, u32::MAX] {
            assert!(!is_guest_cid(cid), "{cid}");
        }
        for cid in [3, 4, 1 << 20, u32::MAX - 1] {
            assert!(is_guest_cid(cid), "{cid}");
        }
    }

    #[test]
    fn only_a_guest_that_does_not_listen_yet_is_asked_again() {
        for kind in [
            io::ErrorKind::ConnectionReset,
            io::ErrorKind::ConnectionRefused,
            io::ErrorKind::TimedOut,
        ] {
            assert!(not_listening_yet(&io::Error::from(kind)));
        }
        for kind in [
            io::ErrorKind::PermissionDenied,
            io::ErrorKind::AddrInUse,
            io::ErrorKind::Unsupported,
        ] {
            assert!(!not_listening_yet(&io::Error::from(kind)));
        }
    }
}
