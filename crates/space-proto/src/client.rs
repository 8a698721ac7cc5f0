//! A small blocking client for one agent connection.
//!
//! Used by the bridge, tests and benchmarks. It checks, on every frame, that the answer
//! names the execution the handshake named and the request it waits for. Any error but
//! [`ClientError::Agent`] leaves the connection in an unknown state: drop it and open a
//! new one, which passes the handshake again (no transparent reconnects).

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;

use space_identity::ExecutionId;

use crate::codec::{self, DecodeError};
use crate::frame::{self, FrameError};
use crate::guest::{
    self, AgentBody, CONNECTION, ClientFrame, DirEntry, ExecSpec, ExitStatus, FileStat, Hello,
    HelloAck, Input, InputFrame, MAX_CHUNK, Operation, PROTOCOL_VERSION, Request, RequestId,
    ServedIdentity, WireError,
};

/// Why a client call failed.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// Reading or writing a frame failed (includes the agent closing the connection).
    #[error(transparent)]
    Frame(#[from] FrameError),
    /// The agent sent a body that does not decode.
    #[error("undecodable answer: {0}")]
    Decode(#[from] DecodeError),
    /// The agent reported a failure of the operation (the connection stays usable), or
    /// of the connection (request id 0; the agent has closed it).
    #[error("agent: {0}")]
    Agent(WireError),
    /// An answer named another execution than the handshake did.
    #[error("answer from execution {got}, expected {expected}")]
    WrongExecution {
        /// Named by the handshake.
        expected: ExecutionId,
        /// Named by the answer.
        got: ExecutionId,
    },
    /// An answer out of sequence: wrong request id or a body that does not fit.
    #[error("unexpected answer for request {request}: {what}")]
    Unexpected {
        /// The request waited for.
        request: RequestId,
        /// What arrived instead.
        what: String,
    },
    /// The handshake's proof does not verify with the expected secret.
    #[error("handshake proof does not verify")]
    BadProof,
}

impl ClientError {
    fn unexpected(request: RequestId, body: &AgentBody) -> Self {
        Self::Unexpected {
            request,
            what: format!("{body:?}").chars().take(120).collect(),
        }
    }
}

/// Output of a finished process.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExecOutput {
    /// PID the process had.
    pub pid: u32,
    /// All of stdout (and the terminal's output under a PTY).
    pub stdout: Vec<u8>,
    /// All of stderr.
    pub stderr: Vec<u8>,
    /// How it ended.
    pub status: ExitStatus,
}

/// One handshaken connection to an agent.
#[derive(Debug)]
pub struct AgentConnection<S = UnixStream> {
    stream: S,
    ack: HelloAck,
    next_id: RequestId,
}

impl<S: Read + Write> AgentConnection<S> {
    /// Says hello with `nonce` and reads the agent's ack. The ack is *not* verified:
    /// use [`AgentConnection::handshake_verified`] when you hold the activation secret.
    pub fn handshake(mut stream: S, nonce: [u8; 32]) -> Result<Self, ClientError> {
        let hello = ClientFrame::Hello(Hello {
            protocol_version: PROTOCOL_VERSION,
            nonce,
        });
        frame::write_frame(&mut stream, &codec::encode(&hello))?;
        let answer = guest::decode_agent_frame(&frame::read_frame(&mut stream)?)?;
        let ack = match answer.body {
            AgentBody::HelloAck(ack) if answer.request_id == CONNECTION => ack,
            AgentBody::Error(e) => return Err(ClientError::Agent(e)),
            other => return Err(ClientError::unexpected(CONNECTION, &other)),
        };
        if ack.execution_id != answer.execution_id {
            return Err(ClientError::WrongExecution {
                expected: ack.execution_id,
                got: answer.execution_id,
            });
        }
        if ack.protocol_version != PROTOCOL_VERSION {
            return Err(ClientError::Unexpected {
                request: CONNECTION,
                what: format!("protocol version {}", ack.protocol_version),
            });
        }
        Ok(Self {
            stream,
            ack,
            next_id: 1,
        })
    }

    /// [`AgentConnection::handshake`], then refuses the connection unless the proof
    /// verifies with `secret` (the activation's secret).
    pub fn handshake_verified(
        stream: S,
        nonce: [u8; 32],
        secret: &[u8; 32],
    ) -> Result<Self, ClientError> {
        let conn = Self::handshake(stream, nonce)?;
        if guest::verify_proof(secret, &nonce, &conn.ack) {
            Ok(conn)
        } else {
            Err(ClientError::BadProof)
        }
    }

    /// The agent's handshake answer.
    pub fn ack(&self) -> &HelloAck {
        &self.ack
    }

    /// The identity the agent claimed in the handshake.
    pub fn identity(&self) -> ServedIdentity {
        self.ack.identity()
    }

    /// Continues this handshaken session on `stream`, which must carry the very
    /// connection the handshake ran on (a verifying relay handing the agent's socket
    /// over, say): the acknowledged identity and the request numbering carry over.
    pub fn continue_on<T>(self, stream: T) -> AgentConnection<T> {
        AgentConnection {
            stream,
            ack: self.ack,
            next_id: self.next_id,
        }
    }

    /// The underlying stream (for timeouts, or for tests that misbehave on purpose).
    pub fn stream_mut(&mut self) -> &mut S {
        &mut self.stream
    }

    /// Starts an operation and returns its id. Read its answers with
    /// [`AgentConnection::next_answer`] until one [`AgentBody::is_final`].
    pub fn send_request(&mut self, op: Operation) -> Result<RequestId, ClientError> {
        let id = self.next_id;
        self.next_id += 1;
        let body = codec::encode(&ClientFrame::Request(Request { id, op }));
        frame::write_frame(&mut self.stream, &body)?;
        Ok(id)
    }

    /// Sends input to the running request `id`.
    pub fn send_input(&mut self, id: RequestId, input: Input) -> Result<(), ClientError> {
        let body = codec::encode(&ClientFrame::Input(InputFrame { id, input }));
        frame::write_frame(&mut self.stream, &body)?;
        Ok(())
    }

    /// Reads the next answer to request `id`. An answer from another execution or for
    /// another request is an error; so is a connection-level error from the agent.
    pub fn next_answer(&mut self, id: RequestId) -> Result<AgentBody, ClientError> {
        let frame = guest::decode_agent_frame(&frame::read_frame(&mut self.stream)?)?;
        if frame.execution_id != self.ack.execution_id {
            return Err(ClientError::WrongExecution {
                expected: self.ack.execution_id,
                got: frame.execution_id,
            });
        }
        match frame.body {
            AgentBody::Error(e) if frame.request_id == id || frame.request_id == CONNECTION => {
                Err(ClientError::Agent(e))
            }
            body if frame.request_id == id => Ok(body),
            body => Err(ClientError::unexpected(id, &body)),
        }
    }

    /// Runs a one-answer operation and returns its final body.
    fn call(&mut self, op: Operation) -> Result<(RequestId, AgentBody), ClientError> {
        let id = self.send_request(op)?;
        Ok((id, self.next_answer(id)?))
    }

    /// Describes `path` (without following a final symlink).
    pub fn stat(&mut self, path: &str) -> Result<FileStat, ClientError> {
        match self.call(Operation::Stat { path: path.into() })? {
            (_, AgentBody::Stat(s)) => Ok(s),
            (id, other) => Err(ClientError::unexpected(id, &other)),
        }
    }

    /// Lists a directory (in the directory's order).
    pub fn list(&mut self, path: &str) -> Result<Vec<DirEntry>, ClientError> {
        let id = self.send_request(Operation::List { path: path.into() })?;
        let mut out = Vec::new();
        loop {
            match self.next_answer(id)? {
                AgentBody::Entries(batch) => out.extend(batch),
                AgentBody::Done => return Ok(out),
                other => return Err(ClientError::unexpected(id, &other)),
            }
        }
    }

    fn expect_done(&mut self, op: Operation) -> Result<(), ClientError> {
        match self.call(op)? {
            (_, AgentBody::Done) => Ok(()),
            (id, other) => Err(ClientError::unexpected(id, &other)),
        }
    }

    /// Creates a directory.
    pub fn mkdir(&mut self, path: &str, parents: bool) -> Result<(), ClientError> {
        self.expect_done(Operation::Mkdir {
            path: path.into(),
            parents,
        })
    }

    /// Removes a file or directory.
    pub fn remove(&mut self, path: &str, recursive: bool) -> Result<(), ClientError> {
        self.expect_done(Operation::Remove {
            path: path.into(),
            recursive,
        })
    }

    /// Renames `from` to `to`.
    pub fn rename(&mut self, from: &str, to: &str) -> Result<(), ClientError> {
        self.expect_done(Operation::Rename {
            from: from.into(),
            to: to.into(),
        })
    }

    /// Reads at most `max_bytes` of a file, from its start.
    pub fn read_file(&mut self, path: &str, max_bytes: u64) -> Result<Vec<u8>, ClientError> {
        let id = self.send_request(Operation::ReadFile {
            path: path.into(),
            offset: 0,
            max_bytes,
        })?;
        let mut out = Vec::new();
        loop {
            match self.next_answer(id)? {
                AgentBody::FileData(chunk) => out.extend_from_slice(&chunk),
                AgentBody::ReadEnd { .. } => return Ok(out),
                other => return Err(ClientError::unexpected(id, &other)),
            }
        }
    }

    /// Replaces a file atomically with `data`; returns the bytes written.
    pub fn write_file(
        &mut self,
        path: &str,
        data: &[u8],
        mode: Option<u32>,
    ) -> Result<u64, ClientError> {
        let id = self.send_request(Operation::WriteFile {
            path: path.into(),
            mode,
            parents: false,
        })?;
        for chunk in data.chunks(MAX_CHUNK) {
            self.send_input(id, Input::Data(chunk.to_vec()))?;
        }
        self.send_input(id, Input::End)?;
        match self.next_answer(id)? {
            AgentBody::Written { bytes } => Ok(bytes),
            other => Err(ClientError::unexpected(id, &other)),
        }
    }

    /// Runs a process to its end and collects its output in memory. For long or large
    /// output, send [`Operation::Exec`] and read the chunks as they come instead.
    pub fn exec(&mut self, spec: ExecSpec) -> Result<ExecOutput, ClientError> {
        let id = self.send_request(Operation::Exec(spec))?;
        let pid = match self.next_answer(id)? {
            AgentBody::Started { pid } => pid,
            other => return Err(ClientError::unexpected(id, &other)),
        };
        let (mut stdout, mut stderr) = (Vec::new(), Vec::new());
        loop {
            match self.next_answer(id)? {
                AgentBody::Stdout(c) => stdout.extend_from_slice(&c),
                AgentBody::Stderr(c) => stderr.extend_from_slice(&c),
                AgentBody::Exited(status) => {
                    return Ok(ExecOutput {
                        pid,
                        stdout,
                        stderr,
                        status,
                    });
                }
                other => return Err(ClientError::unexpected(id, &other)),
            }
        }
    }
}

impl ExecSpec {
    /// A spec for `argv` with empty, closed stdin and every other field defaulted.
    pub fn command<I, T>(argv: I) -> Self
    where
        I: IntoIterator<Item = T>,
        T: Into<String>,
    {
        Self {
            argv: argv.into_iter().map(Into::into).collect(),
            stdin: Some(Vec::new()),
            ..Self::default()
        }
    }

    /// `sh -c script`, with empty, closed stdin.
    pub fn shell(script: &str) -> Self {
        Self::command(["/bin/sh", "-c", script])
    }
}
