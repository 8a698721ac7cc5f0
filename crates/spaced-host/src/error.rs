//! Why the bridge refused a connection.

use std::io;

use space_peer::PeerError;
use space_proto::frame::FrameError;

/// Why the bridge refused a connection (sent to the worker, and logged).
#[derive(Debug, thiserror::Error)]
pub enum BridgeError {
    /// The connecting process is not the worker's uid.
    #[error("client uid {0} is not the worker's")]
    WrongClientUid(u32),
    /// The worker did not open with a hello.
    #[error("first frame is not a hello")]
    NotHello,
    /// The guest transport's path or peer is not the recorded one.
    #[error("guest transport refused: {0}")]
    Transport(#[from] PeerError),
    /// The agent's handshake did not prove the expected execution.
    #[error("agent handshake refused: {0}")]
    Handshake(&'static str),
    /// Framing or socket failure.
    #[error("frame: {0}")]
    Frame(#[from] FrameError),
    /// Socket failure.
    #[error("io: {0}")]
    Io(#[from] io::Error),
    /// Too many connections.
    #[error("too many connections")]
    Busy,
}
