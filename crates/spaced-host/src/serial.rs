//! The serial transport (VM sandboxes under QEMU; the vsock transports, [`crate::vsock`]
//! and [`crate::vhost`], share its verification and activation): one connection to the VMM's virtio-serial
//! socket for the bridge's whole life, verified once, carrying a `space-mux` link.
//!
//! At start the bridge connects to `agent_socket`, checks that its peer is the recorded
//! VMM process (PID, start time, executable, uid, pidfd) and that the kernel's socket
//! table shows that process holding the listener, sends the activation record as the
//! link's first control message and waits for the guest's [`vm::READY`]. Each worker
//! connection then gets a new stream of the link, on which the usual handshake proves
//! the execution. When the link ends (the VMM exited, the guest broke the protocol)
//! the bridge exits: nothing reconnects behind the worker's back.

use std::os::fd::AsFd;
use std::os::unix::net::UnixStream;
use std::time::Duration;

use space_mux::Link;
use space_peer::{
    check_socket_path, listening_unix_inode_of, peer_process_listened_as, process_holds_socket,
};
use space_proto::vm;

use crate::error::BridgeError;
use crate::spec::BridgeSpec;

/// How long a guest may take from the bridge's connection to its `ready` (a boot under
/// software emulation takes seconds).
pub const READY_WAIT: Duration = Duration::from_secs(120);
/// The longest a write to the VMM's socket may block.
const WRITE_WAIT: Duration = Duration::from_secs(30);

/// Connects to the VMM, verifies it, activates the guest: the link, once `ready`.
pub fn connect(spec: &BridgeSpec, ready_wait: Duration) -> Result<Link, BridgeError> {
    check_socket_path(&spec.agent_socket)?;
    let transport = UnixStream::connect(&spec.agent_socket)?;
    verify_peer(&transport, spec)?;
    // The table of the VMM's own network namespace (QEMU runs in one of its own).
    let inode = listening_unix_inode_of(spec.agent.pid, &spec.agent_socket)?;
    if !process_holds_socket(spec.agent.pid, inode)? {
        return Err(space_peer::PeerError::SocketTable(
            "the recorded VMM does not hold the serial socket",
        )
        .into());
    }
    activate(transport, spec, ready_wait)
}

/// The transport's peer is the recorded VMM process (PID, start time, executable, uid,
/// pidfd). A VMM may have listened as the worker's uid (this bridge's) and dropped to
/// the VM's own afterwards (QEMU's `-runas`): what it runs as now is in the recorded
/// identity.
pub(crate) fn verify_peer(transport: &UnixStream, spec: &BridgeSpec) -> Result<(), BridgeError> {
    let (_, peer) =
        peer_process_listened_as(transport.as_fd(), rustix::process::geteuid().as_raw())?;
    spec.agent.verify(&peer.identity)?;
    Ok(())
}

/// A `space-mux` link over a verified `transport` to the guest: the activation record
/// as its first control message, then the guest's [`vm::READY`] within `ready_wait`.
pub(crate) fn activate(
    transport: UnixStream,
    spec: &BridgeSpec,
    ready_wait: Duration,
) -> Result<Link, BridgeError> {
    // A guest that stops reading stalls the VMM's reads of this socket: a write that
    // waits this long ends the link (and the bridge) instead of every sender.
    transport.set_write_timeout(Some(WRITE_WAIT))?;
    let link = Link::over_unix(transport, true, vm::MAX_STREAMS, None)?;
    activate_link(link, spec, ready_wait)
}

/// The longest a write to a guest transport may block (see [`activate`]).
pub(crate) const TRANSPORT_WRITE_WAIT: Duration = WRITE_WAIT;

/// Activates the guest over a started `link` (any transport's): the activation record
/// as its first control message, then the guest's [`vm::READY`] within `ready_wait`.
pub(crate) fn activate_link(
    link: Link,
    spec: &BridgeSpec,
    ready_wait: Duration,
) -> Result<Link, BridgeError> {
    let sent = link
        .send_control(&spec.activation.encode())
        .and_then(|()| link.recv_control(ready_wait));
    match sent {
        Ok(answer) if answer == vm::READY => Ok(link),
        Ok(_) => {
            link.shut("the guest did not answer ready");
            Err(BridgeError::Handshake("the guest did not answer ready"))
        }
        Err(e) => {
            link.shut("no ready");
            Err(BridgeError::Io(std::io::Error::other(format!(
                "guest activation: {e}"
            ))))
        }
    }
}

/// A new stream to the agent, after checking the VMM is still the recorded process.
pub fn open_stream(spec: &BridgeSpec, link: &Link) -> Result<UnixStream, BridgeError> {
    check_vmm(spec)?;
    link.open()
        .map_err(|e| BridgeError::Io(std::io::Error::other(e.to_string())))
}

/// The recorded VMM is still the live process (the link's peer credentials were taken
/// at connect; the process behind them must not have been replaced).
pub fn check_vmm(spec: &BridgeSpec) -> Result<(), BridgeError> {
    let live = space_peer::LiveProcess::open(spec.agent.pid)?;
    spec.agent.verify(&live.identity)?;
    Ok(())
}
