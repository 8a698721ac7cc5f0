//! The agent over vsock: a VM whose VMM gives it a vsock device (Firecracker's, or
//! QEMU's vhost-vsock) and whose kernel command line says `space.transport=vsock`
//! (see `space_proto::vm`).
//!
//! The agent listens on [`vm::VSOCK_PORT`] and takes connections from the host
//! ([`vm::HOST_CID`]) only — under QEMU's vhost-vsock (the command line says
//! `space.vsock_peer=reserved_port`) only from a reserved host port: there any host
//! process may connect to any guest's CID, and only one with `CAP_NET_BIND_SERVICE`
//! (the worker's bridge) can bind a port at or below [`vm::LAST_RESERVED_PORT`]. One
//! connection is one `space-mux` link, served exactly as
//! the serial port's ([`crate::vm::run_link`]: the activation as its first control
//! message, `ready`, then streams), one at a time. After a snapshot the VMM resets
//! every vsock connection, so the old link ends and the bridge, connecting anew,
//! brings its activation (QEMU resets them on the restored side only). A VMM that did
//! not tell the guest of the reset (Firecracker
//! before 1.10, which the worker refuses anyway) would leave the old link open for
//! ever: so a new host connection ends the link being served first (its socket shut
//! both ways, its end awaited at most [`OLD_LINK_WAIT`]) and is then served. Only the
//! host can connect (CID 2: the VMM's socket, which only the worker's bridge reaches).

use std::fs::File;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::time::Duration;

use nix::sys::socket::{
    AddressFamily, Backlog, SockFlag, SockType, VsockAddr, bind, getpeername, listen, socket,
};
use space_proto::vm;

/// The longest a write to the host may block: a host that stops reading ends the
/// link instead of stalling every writer of it for ever.
const WRITE_WAIT: Duration = Duration::from_secs(30);
/// Connections the kernel queues while a link is served.
const BACKLOG: i32 = 4;
/// How long a new host connection waits for the link it replaces to end.
pub const OLD_LINK_WAIT: Duration = Duration::from_secs(5);

/// Whether `vm-agent --vsock` may serve here: only in a VM whose kernel command line
/// (`cmdline`) names the vsock transport and whose PID 1 is this binary (the init of
/// a SPACE guest, which started it). Elsewhere — a host that is itself a VM with a
/// guest-to-host vsock transport — its hypervisor could otherwise activate it, rename
/// the machine and run commands. Where it may, the host connections it may serve
/// (the command line's, [`Peers::of_command_line`]): the only way to the permission.
pub fn may_serve(cmdline: &str, pid1_is_this_binary: bool) -> Result<Peers, String> {
    if vm::transport_of_command_line(cmdline) != Some(vm::GuestTransport::Vsock) {
        return Err(format!(
            "the kernel command line does not say {}=vsock: not a SPACE VM",
            vm::TRANSPORT_PARAM
        ));
    }
    if !pid1_is_this_binary {
        return Err("PID 1 is not this agent's binary: not a SPACE VM".into());
    }
    Ok(Peers::of_command_line(cmdline))
}

/// Whether PID 1 runs the same executable as this process.
pub fn pid1_is_this_binary() -> bool {
    use std::os::unix::fs::MetadataExt as _;
    match (
        std::fs::metadata("/proc/1/exe"),
        std::fs::metadata("/proc/self/exe"),
    ) {
        (Ok(a), Ok(b)) => (a.dev(), a.ino()) == (b.dev(), b.ino()),
        _ => false,
    }
}

/// Which host connections the agent serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Peers {
    /// The host's, from any port (Firecracker: only the bridge reaches its socket).
    AnyHostPort,
    /// The host's, from a reserved port only (QEMU's vhost-vsock).
    ReservedHostPort,
}

impl Peers {
    /// The rule a kernel command line names ([`vm::VSOCK_PEER_PARAM`]).
    pub fn of_command_line(cmdline: &str) -> Self {
        if vm::vsock_peer_needs_reserved_port(cmdline) {
            Self::ReservedHostPort
        } else {
            Self::AnyHostPort
        }
    }
}

/// Whether a connection from `cid`, `port` may be served: only the host's, and under
/// [`Peers::ReservedHostPort`] only from a reserved port.
pub fn accepts_peer(cid: u32, port: u32, peers: Peers) -> bool {
    cid == vm::HOST_CID
        && match peers {
            Peers::AnyHostPort => true,
            Peers::ReservedHostPort => port <= vm::LAST_RESERVED_PORT,
        }
}

/// The agent on vsock `port`: one link per host connection it accepts (`peers`), for
/// ever.
pub fn serve_vsock(port: u32, peers: Peers, max_connections: usize) -> Result<(), String> {
    let listener = socket(
        AddressFamily::Vsock,
        SockType::Stream,
        SockFlag::SOCK_CLOEXEC,
        None,
    )
    .map_err(|e| format!("vsock socket: {e}"))?;
    bind(
        listener.as_raw_fd(),
        &VsockAddr::new(libc::VMADDR_CID_ANY, port),
    )
    .map_err(|e| format!("bind vsock port {port}: {e}"))?;
    listen(
        &listener,
        Backlog::new(BACKLOG).map_err(|e| format!("backlog: {e}"))?,
    )
    .map_err(|e| format!("listen on vsock port {port}: {e}"))?;
    let host_connections = std::iter::from_fn(|| {
        loop {
            let conn = match rustix::net::accept(&listener) {
                Ok(c) => c,
                Err(rustix::io::Errno::INTR | rustix::io::Errno::CONNABORTED) => continue,
                Err(e) => {
                    // A transient failure (no memory, a descriptor limit): wait, go on.
                    eprintln!("spaced-guest: vsock accept: {e}");
                    std::thread::sleep(Duration::from_millis(100));
                    continue;
                }
            };
            let peer = getpeername::<VsockAddr>(conn.as_raw_fd()).map(|a| (a.cid(), a.port()));
            match peer {
                Ok((cid, port)) if accepts_peer(cid, port, peers) => return Some(conn),
                Ok((cid, port)) => {
                    eprintln!("spaced-guest: a vsock connection from CID {cid} port {port} refused")
                }
                Err(e) => eprintln!("spaced-guest: vsock peer: {e}"),
            }
        }
    });
    // Under vhost-vsock the VMM resets the guest's connections itself when a restore
    // loads it, and a host process other than the bridge (one allowed a reserved
    // port) could connect: the link being served is never ended for a new one.
    let on_new = match peers {
        Peers::AnyHostPort => OnNewConnection::EndTheOld,
        Peers::ReservedHostPort => OnNewConnection::KeepTheOld,
    };
    serve_connections(host_connections, max_connections, true, on_new);
    Ok(())
}

/// What a host connection arriving while a link is served does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnNewConnection {
    /// The link served ends (its socket shut both ways, its end awaited at most
    /// [`OLD_LINK_WAIT`]) and the new one is served (Firecracker: a VMM that missed its
    /// reset must not wedge the agent; only the bridge reaches its socket).
    EndTheOld,
    /// The new connection waits at most [`OLD_LINK_WAIT`] for the link served to end
    /// on its own (a reset the guest is still taking in) and is refused if it does
    /// not (QEMU's vhost-vsock).
    KeepTheOld,
}

/// Serves each connection of `connections` (the host's, already checked) as one link,
/// one at a time: a new connection while a link is served does as `on_new` says.
/// Returns when `connections` ends, after ending the last link. `set_hostname` as
/// [`crate::vm::run_link`] takes it.
pub fn serve_connections(
    connections: impl Iterator<Item = OwnedFd>,
    max_connections: usize,
    set_hostname: bool,
    on_new: OnNewConnection,
) {
    let mut current: Option<(OwnedFd, std::thread::JoinHandle<()>)> = None;
    for conn in connections {
        if let Some((old, served)) = current.take() {
            match on_new {
                OnNewConnection::EndTheOld => end_link(&old, served),
                OnNewConnection::KeepTheOld => {
                    if !ended_within(&served, OLD_LINK_WAIT) {
                        eprintln!(
                            "spaced-guest: a host connection while a link is served: refused"
                        );
                        current = Some((old, served));
                        continue;
                    }
                    let _ = served.join();
                }
            }
        }
        let Ok(shut) = conn.try_clone() else {
            eprintln!("spaced-guest: a vsock connection could not be held; dropped");
            continue;
        };
        let served = std::thread::Builder::new()
            .name("vsock-link".into())
            .spawn(move || {
                if let Err(e) = serve_connection(conn, max_connections, set_hostname) {
                    eprintln!("spaced-guest: link ended: {e}");
                }
            });
        match served {
            Ok(served) => current = Some((shut, served)),
            Err(e) => eprintln!("spaced-guest: a vsock link could not start: {e}"),
        }
    }
    if let Some((old, served)) = current.take() {
        end_link(&old, served);
    }
}

/// Whether `served` ends within `wait`.
fn ended_within(served: &std::thread::JoinHandle<()>, wait: Duration) -> bool {
    let deadline = std::time::Instant::now() + wait;
    while !served.is_finished() {
        if std::time::Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    true
}

/// Ends the link over `conn` (served by `served`): its socket shut both ways, then its
/// end awaited at most [`OLD_LINK_WAIT`].
fn end_link(conn: &OwnedFd, served: std::thread::JoinHandle<()>) {
    if served.is_finished() {
        let _ = served.join();
        return;
    }
    eprintln!("spaced-guest: a new host connection: the link served until now ends");
    let _ = rustix::net::shutdown(conn.as_fd(), rustix::net::Shutdown::Both);
    let deadline = std::time::Instant::now() + OLD_LINK_WAIT;
    while !served.is_finished() && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    if served.is_finished() {
        let _ = served.join();
    } else {
        eprintln!("spaced-guest: the old link did not end in time; serving the new one");
    }
}

/// One link over a connected stream socket `conn` (a vsock connection from the host,
/// or in tests a Unix stream): until it ends; the socket is closed when this returns.
/// `set_hostname` as [`crate::vm::run_link`] takes it (`false` off a VM).
pub fn serve_connection(
    conn: OwnedFd,
    max_connections: usize,
    set_hostname: bool,
) -> Result<(), String> {
    rustix::net::sockopt::set_socket_timeout(
        &conn,
        rustix::net::sockopt::Timeout::Send,
        Some(WRITE_WAIT),
    )
    .map_err(|e| format!("send timeout: {e}"))?;
    let reader = File::from(conn.try_clone().map_err(|e| e.to_string())?);
    let writer = File::from(conn.try_clone().map_err(|e| e.to_string())?);
    crate::vm::run_link(
        Box::new(reader),
        Box::new(writer),
        Box::new(move || {
            let _ = rustix::net::shutdown(conn.as_fd(), rustix::net::Shutdown::Both);
        }),
        max_connections,
        set_hostname,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use space_identity::{ExecutionId, Generation, SandboxId};
    use space_proto::guest::Activation;

    #[test]
    fn the_vsock_agent_serves_only_in_a_space_vm() {
        let vm_line = format!(
            "console=ttyS0 {}=vsock {}=1",
            vm::TRANSPORT_PARAM,
            vm::LAYERS_PARAM
        );
        assert_eq!(may_serve(&vm_line, true), Ok(Peers::AnyHostPort));
        // QEMU's vhost-vsock line: the permission comes with the reserved-port rule.
        let vhost_line = format!(
            "{vm_line} {}={}",
            vm::VSOCK_PEER_PARAM,
            vm::VSOCK_PEER_RESERVED
        );
        assert_eq!(may_serve(&vhost_line, true), Ok(Peers::ReservedHostPort));
        // A host's own command line, or a VM whose init is something else.
        assert!(may_serve("BOOT_IMAGE=/vmlinuz root=/dev/sda1 ro quiet", true).is_err());
        assert!(may_serve(&vm_line, false).is_err());
        let serial = format!("{}=serial", vm::TRANSPORT_PARAM);
        assert!(may_serve(&serial, true).is_err());
        // This test's host: PID 1 is not the test binary.
        assert!(!pid1_is_this_binary());
    }

    #[test]
    fn only_the_host_is_served() {
        for peers in [Peers::AnyHostPort, Peers::ReservedHostPort] {
            assert!(accepts_peer(vm::HOST_CID, 1023, peers));
            for cid in [0, 1, vm::GUEST_CID, 4, u32::MAX] {
                assert!(!accepts_peer(cid, 1023, peers), "{cid}");
            }
        }
        // Firecracker's host ports are its own (from 2^30).
        assert!(accepts_peer(vm::HOST_CID, 1 << 30, Peers::AnyHostPort));
    }

    #[test]
    fn an_unprivileged_host_process_connecting_to_a_vhost_vsock_guest_is_not_served() {
        // Any host process may connect to a vhost-vsock guest's CID; one that cannot
        // bind a reserved port gets an ephemeral one (1024 and up).
        let cmdline = format!(
            "{}=vsock {}={}",
            vm::TRANSPORT_PARAM,
            vm::VSOCK_PEER_PARAM,
            vm::VSOCK_PEER_RESERVED
        );
        let peers = Peers::of_command_line(&cmdline);
        assert_eq!(peers, Peers::ReservedHostPort);
        for port in [1024, 49152, u32::MAX] {
            assert!(!accepts_peer(vm::HOST_CID, port, peers), "{port}");
        }
        assert!(accepts_peer(vm::HOST_CID, vm::LAST_RESERVED_PORT, peers));
        assert_eq!(
            Peers::of_command_line("space.transport=vsock"),
            Peers::AnyHostPort
        );
    }

    fn activation(seed: u8) -> Activation {
        Activation {
            sandbox: SandboxId::from_bytes([seed; 16]),
            generation: Generation(1),
            execution_id: ExecutionId::from_bytes([seed + 1; 16]),
            activation: 1,
            secret: [seed; 32],
        }
    }

    /// A host connection handed to the agent (`tx`), as a link of the host's end.
    fn connected(tx: &std::sync::mpsc::Sender<OwnedFd>) -> space_mux::Link {
        let (host, guest) = std::os::unix::net::UnixStream::pair().unwrap();
        tx.send(OwnedFd::from(guest)).unwrap();
        space_mux::Link::over_unix(host, true, vm::MAX_STREAMS, None).unwrap()
    }

    /// [`connected`], activated with `activation(seed)` and `ready`.
    fn activated(tx: &std::sync::mpsc::Sender<OwnedFd>, seed: u8) -> space_mux::Link {
        let link = connected(tx);
        link.send_control(&activation(seed).encode()).unwrap();
        assert_eq!(
            link.recv_control(Duration::from_secs(10)).unwrap(),
            vm::READY
        );
        link
    }

    #[test]
    fn a_new_host_connection_ends_the_old_link_and_is_served() {
        let (tx, rx) = std::sync::mpsc::channel::<OwnedFd>();
        let served = std::thread::spawn(move || {
            serve_connections(rx.into_iter(), 4, false, OnNewConnection::EndTheOld)
        });
        // The first link, activated and up.
        let link1 = activated(&tx, 7);
        // A VMM that reset nothing on the guest's side: the bridge's new connection
        // arrives while the old link is still open. The old one ends, the new one is
        // activated.
        let link2 = activated(&tx, 9);
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while link1.dead().is_none() {
            assert!(
                std::time::Instant::now() < deadline,
                "the old link stayed up"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        assert!(link2.dead().is_none());
        drop(tx);
        served.join().unwrap();
        assert!(link2.dead().is_some() || link2.recv_control(Duration::from_secs(5)).is_err());
    }

    #[test]
    fn under_vhost_vsock_a_second_host_connection_cannot_take_the_link_served() {
        let (tx, rx) = std::sync::mpsc::channel::<OwnedFd>();
        let served = std::thread::spawn(move || {
            serve_connections(rx.into_iter(), 4, false, OnNewConnection::KeepTheOld)
        });
        // The bridge's link, activated and up.
        let link1 = activated(&tx, 7);
        // Another host process (one allowed a reserved port) connects and sends its own
        // activation: refused once the wait is over, the bridge's link untouched.
        let link2 = connected(&tx);
        let _ = link2.send_control(&activation(9).encode());
        assert!(
            link2
                .recv_control(OLD_LINK_WAIT + Duration::from_secs(5))
                .is_err(),
            "the second connection was activated"
        );
        assert!(link1.dead().is_none(), "the bridge's link was ended");
        assert!(link1.open().is_ok());
        // Once the bridge's link ends, the next connection is served.
        link1.shut("the bridge went away");
        let _link3 = activated(&tx, 11);
        drop(tx);
        served.join().unwrap();
    }

    #[test]
    fn a_connection_is_one_link_activated_then_ended_by_the_host() {
        let hostname = nix::unistd::gethostname().unwrap();
        let (host, guest) = std::os::unix::net::UnixStream::pair().unwrap();
        let served = std::thread::spawn(move || serve_connection(OwnedFd::from(guest), 4, false));
        let link = space_mux::Link::over_unix(host, true, vm::MAX_STREAMS, None).unwrap();
        let activation = Activation {
            sandbox: SandboxId::from_bytes([7; 16]),
            generation: Generation(1),
            execution_id: ExecutionId::from_bytes([9; 16]),
            activation: 1,
            secret: [3; 32],
        };
        link.send_control(&activation.encode()).unwrap();
        assert_eq!(
            link.recv_control(Duration::from_secs(10)).unwrap(),
            vm::READY
        );
        // A stream of the link reaches the agent (it answers a handshake's bytes with
        // its own or ends the stream; either way the stream was accepted).
        assert!(link.open().is_ok());
        link.shut("the host went away");
        assert!(served.join().unwrap().is_err());
        // Off a VM the machine keeps its name.
        assert_eq!(nix::unistd::gethostname().unwrap(), hostname);
    }
}
