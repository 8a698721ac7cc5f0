//! The host ↔ guest hop: handshake, activation record and messages.

mod activation;
mod handshake;
mod messages;
mod output;
pub mod temp_files;

#[cfg(test)]
mod proptests;

pub use activation::{Activation, ActivationError, MAX_ACTIVATION_LEN};
pub use handshake::{
    Hello, HelloAck, PROOF_CONTEXT, PROTOCOL_VERSION, ServedIdentity, compute_proof, verify_proof,
};
pub use messages::{
    Account, AgentBody, AgentFrame, ByteRange, CONNECTION, ClientFrame, DirEntry, ErrorKind,
    ExecSpec, ExitOutcome, ExitStatus, FileKind, FileStat, Input, InputFrame, MAX_CHUNK, Operation,
    PtySize, Request, RequestId, WatchEndReason, WatchEvent, WireError,
};
pub use output::{OutputCap, json_char_len, json_str_len};

use crate::codec::{self, DecodeError};

/// The protocol version announced by a body that starts like a [`ClientFrame::Hello`],
/// read without decoding the rest, so that a hello of another version — whose layout
/// this crate may not know — is answered with `unsupported_version` rather than a
/// decode error. `None` if the body does not start with the hello tag.
pub fn peek_hello_version(body: &[u8]) -> Option<u32> {
    // postcard writes the variant index, then the struct's fields in order; `Hello` is
    // variant 0 and `protocol_version` its first field, in every version.
    match postcard::take_from_bytes::<(u32, u32)>(body) {
        Ok(((0, version), _)) => Some(version),
        _ => None,
    }
}

/// Decodes a client frame strictly.
pub fn decode_client_frame(body: &[u8]) -> Result<ClientFrame, DecodeError> {
    codec::decode(body)
}

/// Decodes an agent frame strictly.
pub fn decode_agent_frame(body: &[u8]) -> Result<AgentFrame, DecodeError> {
    codec::decode(body)
}
