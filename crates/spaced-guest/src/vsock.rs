//! The agent over vsock: a VM whose VMM gives it a vsock device (Firecracker) and
//! whose kernel command line says `space.transport=vsock` (see `space_proto::vm`).
//!
//! The agent listens on [`vm::VSOCK_PORT`] and takes connections from the host
//! ([`vm::HOST_CID`]) only. One connection is one `space-mux` link, served exactly as
//! the serial port's ([`crate::vm::run_link`]: the activation as its first control
//! message, `ready`, then streams); the next connection is accepted once the link
//! ends. After a snapshot is loaded the VMM resets every vsock connection, so the old
//! link ends and the new execution's bridge, connecting anew, brings its activation.

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

/// Whether a connection from `cid` may be served: only the host's.
pub fn accepts_peer(cid: u32) -> bool {
    cid == vm::HOST_CID
}

/// The agent on vsock `port`: one link per host connection, for ever.
pub fn serve_vsock(port: u32, max_connections: usize) -> Result<(), String> {
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
        let peer = getpeername::<VsockAddr>(conn.as_raw_fd()).map(|a| a.cid());
        match peer {
            Ok(cid) if accepts_peer(cid) => {}
            Ok(cid) => {
                eprintln!("spaced-guest: a vsock connection from CID {cid} refused");
                continue;
            }
            Err(e) => {
                eprintln!("spaced-guest: vsock peer: {e}");
                continue;
            }
        }
        if let Err(e) = serve_connection(conn, max_connections, true) {
            eprintln!("spaced-guest: link ended: {e}");
        }
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
    fn only_the_host_is_served() {
        assert!(accepts_peer(vm::HOST_CID));
        for cid in [0, 1, vm::GUEST_CID, 4, u32::MAX] {
            assert!(!accepts_peer(cid), "{cid}");
        }
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
