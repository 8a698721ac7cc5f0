//! The worker's side: connect to a bridge and prove it is the recorded one.

use std::io;
use std::os::fd::AsFd;
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::sync::Mutex;

use space_peer::{PeerError, ProcessIdentity, check_socket_path, peer_process};
use space_proto::client::{AgentConnection, ClientError};
use space_proto::guest::ServedIdentity;

/// Everything the worker recorded about one execution's bridge.
#[derive(Clone, Debug)]
pub struct BridgeTarget {
    /// The bridge's socket.
    pub socket: PathBuf,
    /// The bridge process as launched.
    pub bridge: ProcessIdentity,
    /// The execution behind it.
    pub served: ServedIdentity,
    /// That activation's secret.
    pub secret: [u8; 32],
}

/// Why the worker refused a bridge connection.
#[derive(Debug, thiserror::Error)]
pub enum BridgeClientError {
    /// Unsafe socket path, or the peer is not the recorded bridge.
    #[error("bridge refused: {0}")]
    Peer(#[from] PeerError),
    /// Connecting failed.
    #[error("connect: {0}")]
    Connect(#[from] io::Error),
    /// The handshake failed (including a refusal sent by the bridge).
    #[error("handshake: {0}")]
    Handshake(#[from] ClientError),
    /// The handshake named another execution.
    #[error("bridge serves another execution")]
    WrongExecution,
}

/// Opens a new, fully verified connection: safe path → the peer is the recorded bridge
/// process → the handshake proves the expected execution → the peer is checked again.
pub fn connect(target: &BridgeTarget) -> Result<AgentConnection<UnixStream>, BridgeClientError> {
    check_socket_path(&target.socket)?;
    let stream = UnixStream::connect(&target.socket)?;
    let (_, peer) = peer_process(stream.as_fd())?;
    target.bridge.verify(&peer.identity)?;
    let mut nonce = [0u8; 32];
    rustix::rand::getrandom(&mut nonce, rustix::rand::GetRandomFlags::empty())
        .map_err(io::Error::from)?;
    let mut conn = AgentConnection::handshake_verified(stream, nonce, &target.secret)?;
    if conn.identity() != target.served {
        return Err(BridgeClientError::WrongExecution);
    }
    let (_, again) = peer_process(conn.stream_mut().as_fd())?;
    target.bridge.verify(&again.identity)?;
    // The bridge hands over the transport it verified; the session goes on there.
    let agent = receive_handover(conn.stream_mut())?;
    Ok(conn.continue_on(agent))
}

/// Receives the agent connection the bridge passes after a verified handshake.
fn receive_handover(bridge: &UnixStream) -> Result<UnixStream, BridgeClientError> {
    use rustix::net::{RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, recvmsg};
    use std::mem::MaybeUninit;
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))];
    let mut control = RecvAncillaryBuffer::new(&mut space);
    let mut byte = [0u8; 1];
    let got = recvmsg(
        bridge,
        &mut [io::IoSliceMut::new(&mut byte)],
        &mut control,
        RecvFlags::CMSG_CLOEXEC,
    )
    .map_err(io::Error::from)?;
    let mut fds: Vec<std::os::fd::OwnedFd> = Vec::new();
    for msg in control.drain() {
        if let RecvAncillaryMessage::ScmRights(passed) = msg {
            fds.extend(passed);
        }
    }
    if got.bytes != 1 || byte != *crate::server::HANDOVER || fds.len() != 1 {
        return Err(BridgeClientError::Connect(io::Error::new(
            io::ErrorKind::InvalidData,
            "the bridge did not hand over exactly one agent connection",
        )));
    }
    let agent = UnixStream::from(fds.remove(0));
    // It must be a connected stream socket with a live peer (the agent).
    peer_process(agent.as_fd())?;
    Ok(agent)
}

/// Idle verified connections to one execution's bridge. A connection never outlives
/// its execution: the pool is bound to one [`ServedIdentity`] and is dropped with it.
#[derive(Debug)]
pub struct BridgePool {
    target: BridgeTarget,
    idle: Mutex<Vec<AgentConnection<UnixStream>>>,
    max_idle: usize,
}

impl BridgePool {
    /// A pool for `target` keeping at most `max_idle` idle connections.
    pub fn new(target: BridgeTarget, max_idle: usize) -> Self {
        Self {
            target,
            idle: Mutex::new(Vec::new()),
            max_idle,
        }
    }

    /// The execution this pool serves.
    pub fn served(&self) -> ServedIdentity {
        self.target.served
    }

    /// An idle connection, or a new verified one.
    pub fn take(&self) -> Result<AgentConnection<UnixStream>, BridgeClientError> {
        let idle = self.idle.lock().ok().and_then(|mut v| v.pop());
        match idle {
            Some(conn) => Ok(conn),
            None => connect(&self.target),
        }
    }

    /// A new verified connection that never returns to the pool (for a stream, which
    /// owns its connection until it ends).
    pub fn dedicated(&self) -> Result<AgentConnection<UnixStream>, BridgeClientError> {
        connect(&self.target)
    }

    /// Returns a connection whose last request completed cleanly. Anything else must be
    /// dropped by the caller instead (a cancelled request closes its connection).
    pub fn give_back(&self, conn: AgentConnection<UnixStream>) {
        if conn.identity() != self.target.served {
            return;
        }
        if let Ok(mut idle) = self.idle.lock() {
            if idle.len() < self.max_idle {
                idle.push(conn);
            }
        }
    }

    /// Drops every idle connection (on retirement of the execution).
    pub fn clear(&self) {
        if let Ok(mut idle) = self.idle.lock() {
            idle.clear();
        }
    }
}
