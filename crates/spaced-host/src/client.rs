//! The worker's side: connect to a bridge and prove it is the recorded one.

use std::io;
use std::os::fd::AsFd;
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::sync::Mutex;
use std::time::Duration;

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
    // The bridge hands over the transport it verified; the session goes on there. A
    // bridge started by an earlier version (re-adopted after an upgrade) relays
    // instead: then the session stays on the bridge's stream.
    match receive_handover(conn.stream_mut())? {
        Some(agent) => Ok(conn.continue_on(agent)),
        None => Ok(conn),
    }
}

/// How long the worker waits for the hand-over before taking the bridge for a relay.
const HANDOVER_WAIT: Duration = Duration::from_secs(1);

/// Receives the agent connection the bridge passes after a verified handshake;
/// `None` if nothing arrives within [`HANDOVER_WAIT`] (a relaying bridge sends
/// nothing unasked).
fn receive_handover(bridge: &UnixStream) -> Result<Option<UnixStream>, BridgeClientError> {
    use rustix::event::{PollFd, PollFlags, poll};
    use rustix::net::{RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, recvmsg};
    use std::mem::MaybeUninit;
    let wait = rustix::event::Timespec {
        tv_sec: HANDOVER_WAIT.as_secs() as i64,
        tv_nsec: 0,
    };
    let mut watch = [PollFd::new(bridge, PollFlags::IN)];
    let ready = loop {
        match poll(&mut watch, Some(&wait)) {
            Ok(n) => break n,
            Err(rustix::io::Errno::INTR) => continue,
            Err(e) => return Err(BridgeClientError::Connect(e.into())),
        }
    };
    if ready == 0 {
        return Ok(None);
    }
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
    Ok(Some(agent))
}

/// Idle verified connections to one execution's bridge. A connection never outlives
/// its execution: the pool is bound to one [`ServedIdentity`] and is dropped with it.
///
/// `S` is the stream the idle connections are kept on: the blocking [`UnixStream`]
/// [`connect`] makes, or the same connection made non-blocking for an event loop (the
/// worker's). Whoever takes a connection out owns it until it gives it back.
#[derive(Debug)]
pub struct BridgePool<S = UnixStream> {
    target: BridgeTarget,
    idle: Mutex<Vec<AgentConnection<S>>>,
    max_idle: usize,
}

impl<S> BridgePool<S> {
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

    /// The bridge new connections go to (see [`connect`]).
    pub fn target(&self) -> &BridgeTarget {
        &self.target
    }

    /// An idle connection, if there is one.
    pub fn idle(&self) -> Option<AgentConnection<S>> {
        self.idle.lock().ok().and_then(|mut v| v.pop())
    }

    /// A new verified connection that never returns to the pool (for a stream, which
    /// owns its connection until it ends).
    pub fn dedicated(&self) -> Result<AgentConnection<UnixStream>, BridgeClientError> {
        connect(&self.target)
    }

    /// Returns a connection whose last request completed cleanly. Anything else must be
    /// dropped by the caller instead (a cancelled request closes its connection).
    pub fn give_back(&self, conn: AgentConnection<S>) {
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};

    #[test]
    fn a_bridge_that_sends_nothing_is_taken_for_a_relay() {
        let (worker, _bridge) = UnixStream::pair().unwrap();
        let t = std::time::Instant::now();
        assert!(receive_handover(&worker).unwrap().is_none());
        assert!(t.elapsed() >= HANDOVER_WAIT);
    }

    #[test]
    fn a_handed_over_connection_reaches_the_peer_it_was_connected_to() {
        use rustix::net::{SendAncillaryBuffer, SendAncillaryMessage, SendFlags, sendmsg};
        use std::mem::MaybeUninit;
        let (worker, bridge) = UnixStream::pair().unwrap();
        let (agent_side, mut agent) = UnixStream::pair().unwrap();
        let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))];
        let mut control = SendAncillaryBuffer::new(&mut space);
        let fds = [agent_side.as_fd()];
        assert!(control.push(SendAncillaryMessage::ScmRights(&fds)));
        sendmsg(
            &bridge,
            &[io::IoSlice::new(crate::server::HANDOVER)],
            &mut control,
            SendFlags::empty(),
        )
        .unwrap();
        drop(agent_side);
        let mut got = receive_handover(&worker).unwrap().unwrap();
        got.write_all(b"ping").unwrap();
        let mut buf = [0u8; 4];
        agent.read_exact(&mut buf).unwrap();
        assert_eq!(&buf, b"ping");
    }

    #[test]
    fn a_byte_without_a_connection_is_refused() {
        let (worker, mut bridge) = UnixStream::pair().unwrap();
        bridge.write_all(crate::server::HANDOVER).unwrap();
        assert!(receive_handover(&worker).is_err());
    }
}
