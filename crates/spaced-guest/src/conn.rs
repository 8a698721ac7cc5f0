//! A client connection and what request handlers use of it: framed answers, input,
//! refusals, and the typed I/O error.

use std::io::{self, Read, Write};
use std::os::unix::net::UnixStream;

use space_proto::codec;
use space_proto::frame::{self, FrameError};
use space_proto::guest::{
    self, AgentBody, AgentFrame, CONNECTION, ClientFrame, ErrorKind, Input, InputFrame, MAX_CHUNK,
    Request, RequestId, WireError,
};

use crate::agent::Agent;

/// Why a connection ends early. Either way the connection is dropped; the difference
/// is only what gets logged.
#[derive(Debug)]
pub(crate) enum End {
    /// The peer went away or the transport failed.
    Gone,
    /// The peer broke the protocol and was told so.
    Refused,
}

/// What a request handler returns: `Err` ends the connection.
pub(crate) type Flow = Result<(), End>;

/// A connection after its handshake.
pub(crate) struct Conn<'a> {
    pub(crate) stream: UnixStream,
    pub(crate) agent: &'a Agent,
    /// The request that finished last: input that raced with its end is dropped.
    last_finished: Option<RequestId>,
    /// Frames of the answer under way not written yet (see [`Conn::queue`]).
    pending: Vec<u8>,
}

impl<'a> Conn<'a> {
    /// A connection on `stream`, before its handshake.
    pub(crate) fn new(stream: UnixStream, agent: &'a Agent) -> Self {
        Self {
            stream,
            agent,
            last_finished: None,
            pending: Vec::new(),
        }
    }

    /// Records that request `id` finished: input that raced with its end is dropped.
    pub(crate) fn finished(&mut self, id: RequestId) {
        self.last_finished = Some(id);
    }

    /// Encodes an answer as a whole frame (header and body).
    pub(crate) fn frame(&self, id: RequestId, body: AgentBody) -> Vec<u8> {
        let msg = AgentFrame {
            execution_id: self.agent.identity.execution.id,
            request_id: id,
            body,
        };
        // Our answers are built under the cap (chunks are at most MAX_CHUNK).
        frame::frame_bytes(&codec::encode(&msg)).unwrap_or_default()
    }

    /// Sends an answer (after any frames queued before it), blocking until the socket
    /// takes it: a slow reader slows the producer rather than growing a buffer here.
    pub(crate) fn send(&mut self, id: RequestId, body: AgentBody) -> Flow {
        let bytes = self.frame(id, body);
        if self.pending.is_empty() {
            return self.stream.write_all(&bytes).map_err(|_| End::Gone);
        }
        self.pending.extend_from_slice(&bytes);
        self.flush()
    }

    /// Queues a frame of an answer that has more to come; it is written with the next
    /// [`Conn::send`], or at once when a chunk's worth is queued. A small answer of
    /// several frames (a file's data and its end, entries and their end) then leaves
    /// in one write, and the peer is woken once for it instead of once per frame.
    pub(crate) fn queue(&mut self, id: RequestId, body: AgentBody) -> Flow {
        let bytes = self.frame(id, body);
        self.pending.extend_from_slice(&bytes);
        if self.pending.len() >= MAX_CHUNK {
            return self.flush();
        }
        Ok(())
    }

    fn flush(&mut self) -> Flow {
        let result = self.stream.write_all(&self.pending).map_err(|_| End::Gone);
        self.pending.clear();
        result
    }

    /// Sends a final error for request `id`.
    pub(crate) fn send_error(&mut self, id: RequestId, err: WireError) -> Flow {
        self.send(id, AgentBody::Error(err))
    }

    /// Tells the peer it broke the protocol; the caller then drops the connection.
    pub(crate) fn refuse(&mut self, kind: ErrorKind, msg: impl Into<String>) -> End {
        let _ = self.send_error(CONNECTION, WireError::new(kind, msg));
        End::Refused
    }

    /// Maps a failure to read a frame to the end of the connection, telling the peer
    /// when it was at fault.
    pub(crate) fn frame_failed(&mut self, e: FrameError) -> End {
        match e {
            FrameError::TooLarge(n) => self.refuse(
                ErrorKind::Protocol,
                format!("frame of {n} bytes is over the limit"),
            ),
            _ => End::Gone,
        }
    }

    /// Decodes a client frame, refusing the connection if it is garbage.
    pub(crate) fn decode(&mut self, body: &[u8]) -> Result<ClientFrame, End> {
        guest::decode_client_frame(body)
            .map_err(|e| self.refuse(ErrorKind::Protocol, format!("undecodable frame: {e}")))
    }

    /// Classifies input that arrived while request `current` runs: `Ok(Some)` for its
    /// own input, `Ok(None)` for late input of the previous request (dropped), and an
    /// error for anything else.
    pub(crate) fn input_for(
        &mut self,
        current: Option<RequestId>,
        frame: ClientFrame,
    ) -> Result<Option<Input>, End> {
        match frame {
            ClientFrame::Input(InputFrame { id, input }) if Some(id) == current => Ok(Some(input)),
            ClientFrame::Input(InputFrame { id, .. }) if Some(id) == self.last_finished => Ok(None),
            ClientFrame::Input(InputFrame { id, .. }) => Err(self.refuse(
                ErrorKind::Protocol,
                format!("input for request {id}, which is not running"),
            )),
            ClientFrame::Request(Request { id, .. }) => Err(self.refuse(
                ErrorKind::Protocol,
                format!("request {id} while another request runs"),
            )),
            ClientFrame::Hello(_) => Err(self.refuse(ErrorKind::Protocol, "second hello")),
        }
    }

    /// Blocks for the next input of request `current` (late input of the previous
    /// request is skipped).
    pub(crate) fn read_input(&mut self, current: RequestId) -> Result<Input, End> {
        loop {
            let body = frame::read_frame(&mut self.stream).map_err(|e| self.frame_failed(e))?;
            let frame = self.decode(&body)?;
            if let Some(input) = self.input_for(Some(current), frame)? {
                return Ok(input);
            }
        }
    }
}

/// Reads from a socket without blocking, for event loops that multiplex it with other
/// descriptors (the socket itself stays blocking for plain request handling).
pub(crate) struct DontWait<'s>(pub(crate) &'s UnixStream);

impl Read for DontWait<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let (n, _) = rustix::net::recv(self.0, buf, rustix::net::RecvFlags::DONTWAIT)?;
        Ok(n)
    }
}

impl Write for DontWait<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let flags = rustix::net::SendFlags::DONTWAIT | rustix::net::SendFlags::NOSIGNAL;
        Ok(rustix::net::send(self.0, buf, flags)?)
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// Maps an I/O failure to a typed error naming what failed.
pub(crate) fn io_error(what: &str, e: &io::Error) -> WireError {
    let kind = match e.raw_os_error() {
        Some(libc::ENOENT) => ErrorKind::NotFound,
        Some(libc::EACCES | libc::EPERM) => ErrorKind::PermissionDenied,
        Some(libc::EISDIR) => ErrorKind::IsADirectory,
        Some(libc::ENOTDIR) => ErrorKind::NotADirectory,
        Some(libc::EEXIST) => ErrorKind::AlreadyExists,
        Some(libc::EINVAL | libc::ENAMETOOLONG) => ErrorKind::InvalidArgument,
        Some(_) => ErrorKind::Io,
        None => match e.kind() {
            io::ErrorKind::NotFound => ErrorKind::NotFound,
            io::ErrorKind::PermissionDenied => ErrorKind::PermissionDenied,
            io::ErrorKind::AlreadyExists => ErrorKind::AlreadyExists,
            io::ErrorKind::InvalidInput | io::ErrorKind::InvalidFilename => {
                ErrorKind::InvalidArgument
            }
            _ => ErrorKind::Io,
        },
    };
    WireError::new(kind, format!("{what}: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use space_identity::{ExecutionId, Generation, SandboxId};
    use space_proto::guest::Activation;

    fn answers(peer: &mut UnixStream, n: usize) -> Vec<AgentBody> {
        (0..n)
            .map(|_| {
                let body = frame::read_frame(peer).expect("frame");
                guest::decode_agent_frame(&body).expect("agent frame").body
            })
            .collect()
    }

    #[test]
    fn queued_frames_leave_with_the_next_send_or_once_a_chunk_is_queued() {
        let activation = Activation {
            sandbox: SandboxId::from_bytes([1; 16]),
            generation: Generation(1),
            execution_id: ExecutionId::from_bytes([2; 16]),
            activation: 1,
            secret: [3; 32],
        };
        let agent = Agent::new(&activation, std::env::temp_dir(), 1);
        let (ours, mut peer) = UnixStream::pair().expect("pair");
        let mut conn = Conn {
            stream: ours,
            agent: &agent,
            last_finished: None,
            pending: Vec::new(),
        };
        let nothing_yet = |peer: &UnixStream| {
            let mut byte = [0u8; 1];
            peer.set_nonblocking(true).expect("nonblocking");
            let r = (&*peer).read(&mut byte).map_err(|e| e.kind());
            peer.set_nonblocking(false).expect("blocking");
            r == Err(io::ErrorKind::WouldBlock)
        };
        // A small answer: its data waits for its end, and both leave together.
        conn.queue(7, AgentBody::FileData(vec![1; 100]))
            .expect("queue");
        assert!(nothing_yet(&peer));
        conn.send(
            7,
            AgentBody::ReadEnd {
                bytes: 100,
                truncated: false,
            },
        )
        .expect("send");
        assert_eq!(
            answers(&mut peer, 2),
            [
                AgentBody::FileData(vec![1; 100]),
                AgentBody::ReadEnd {
                    bytes: 100,
                    truncated: false
                }
            ]
        );
        assert!(nothing_yet(&peer));
        // A chunk's worth does not wait: a large read streams as before.
        conn.queue(8, AgentBody::FileData(vec![0; MAX_CHUNK]))
            .expect("queue");
        assert_eq!(
            answers(&mut peer, 1),
            [AgentBody::FileData(vec![0; MAX_CHUNK])]
        );
        assert!(conn.pending.is_empty());
    }
}
