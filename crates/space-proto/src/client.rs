//! A small client for one agent connection: blocking, and with the `tokio` feature
//! also asynchronous ([`AgentConnection::run_async`]).
//!
//! Used by the bridge, the worker, tests and benchmarks. It checks, on every frame, that
//! the answer names the execution the handshake named and the request it waits for. Any
//! error but [`ClientError::Agent`] leaves the connection in an unknown state: drop it
//! and open a new one, which passes the handshake again (no transparent reconnects).
//!
//! An operation is a [`Call`]: the frames it sends and a fold over its answers, the same
//! whichever way the connection is driven.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;

use space_identity::ExecutionId;

use crate::codec::{self, DecodeError};
use crate::frame::{self, FrameError};
use crate::guest::{
    self, AgentBody, CONNECTION, ClientFrame, DirEntry, ExecSpec, ExitStatus, FileStat, Hello,
    HelloAck, Input, InputFrame, MAX_CHUNK, Operation, OutputCap, PROTOCOL_VERSION, Request,
    RequestId, ServedIdentity, WireError,
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

/// How a [`Call`] folds the agent's answers: `Ok(None)` wants more, `Ok(Some(_))` is
/// the result, `Err(body)` is an answer that does not fit the operation.
type Fold<T> = Box<dyn FnMut(AgentBody) -> Result<Option<T>, AgentBody> + Send>;

/// One operation: the request and the input that follows it, and a fold over the
/// answers up to the final one.
pub struct Call<T> {
    /// Taken when the call starts.
    op: Option<Operation>,
    inputs: Vec<Input>,
    fold: Fold<T>,
}

impl<T> std::fmt::Debug for Call<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Call")
            .field("op", &self.op)
            .field("inputs", &self.inputs.len())
            .finish_non_exhaustive()
    }
}

impl<T> Call<T> {
    /// A call sending `op`, then `inputs`, and folding the answers with `fold`.
    pub fn new(
        op: Operation,
        inputs: Vec<Input>,
        fold: impl FnMut(AgentBody) -> Result<Option<T>, AgentBody> + Send + 'static,
    ) -> Self {
        Self {
            op: Some(op),
            inputs,
            fold: Box::new(fold),
        }
    }

    /// This call's operation done as `user` of the sandbox ([`Operation::AsUser`]);
    /// unchanged when `None`.
    pub fn as_user(mut self, user: Option<guest::Account>) -> Self {
        self.op = self.op.map(|op| op.as_user(user));
        self
    }

    /// Feeds one answer to request `id`.
    fn feed(&mut self, id: RequestId, body: AgentBody) -> Result<Option<T>, ClientError> {
        (self.fold)(body).map_err(|other| ClientError::unexpected(id, &other))
    }
}

impl Call<()> {
    fn done(op: Operation) -> Self {
        Self::new(op, Vec::new(), |body| match body {
            AgentBody::Done => Ok(Some(())),
            other => Err(other),
        })
    }

    /// Removes a file or directory.
    pub fn remove(path: &str, recursive: bool) -> Self {
        Self::done(Operation::Remove {
            path: path.into(),
            recursive,
        })
    }

    /// Renames `from` to `to`, as `user` of the sandbox (the agent's root when
    /// `None`).
    pub fn rename(from: &str, to: &str, user: Option<guest::Account>) -> Self {
        Self::done(Operation::Rename {
            from: from.into(),
            to: to.into(),
            user,
        })
    }
}

impl Call<bool> {
    /// Creates a directory (and its missing parents with `parents`), as `user` of the
    /// sandbox (the agent's root when `None`): whether this call made it (`false`: a
    /// directory was already there, which only `parents` accepts).
    pub fn mkdir(path: &str, parents: bool, user: Option<guest::Account>) -> Self {
        Self::new(
            Operation::Mkdir {
                path: path.into(),
                parents,
                user,
            },
            Vec::new(),
            |body| match body {
                AgentBody::Made { created } => Ok(Some(created)),
                other => Err(other),
            },
        )
    }
}

impl Call<FileStat> {
    /// Describes `path` (without following a final symlink).
    pub fn stat(path: &str) -> Self {
        Self::new(
            Operation::Stat { path: path.into() },
            Vec::new(),
            |body| match body {
                AgentBody::Stat(s) => Ok(Some(*s)),
                other => Err(other),
            },
        )
    }
}

impl Call<Vec<DirEntry>> {
    /// Lists a directory (in the directory's order).
    pub fn list(path: &str) -> Self {
        let mut out = Vec::new();
        Self::new(
            Operation::List { path: path.into() },
            Vec::new(),
            move |body| match body {
                AgentBody::Entries(batch) => {
                    out.extend(batch);
                    Ok(None)
                }
                AgentBody::Done => Ok(Some(std::mem::take(&mut out))),
                other => Err(other),
            },
        )
    }
}

/// A read of at most `max_bytes` of `path` from its start, its chunks collected, its
/// end (`truncated`: the file holds more) given to `done`.
fn read_call<T: Send + 'static>(
    path: &str,
    max_bytes: u64,
    done: fn(Vec<u8>, bool) -> T,
) -> Call<T> {
    let op = Operation::ReadFile {
        path: path.into(),
        offset: 0,
        max_bytes,
    };
    let mut out = Vec::new();
    Call::new(op, Vec::new(), move |body| match body {
        AgentBody::FileData(chunk) => {
            out.extend_from_slice(&chunk);
            Ok(None)
        }
        AgentBody::ReadEnd { truncated, .. } => Ok(Some(done(std::mem::take(&mut out), truncated))),
        other => Err(other),
    })
}

impl Call<Vec<u8>> {
    /// Reads at most `max_bytes` of a file, from its start.
    pub fn read_file(path: &str, max_bytes: u64) -> Self {
        read_call(path, max_bytes, |data, _| data)
    }
}

impl Call<(Vec<u8>, bool)> {
    /// Reads at most `max_bytes` of a file, from its start; the flag says whether the
    /// file holds more (the read was cut at `max_bytes`).
    pub fn read_file_up_to(path: &str, max_bytes: u64) -> Self {
        read_call(path, max_bytes, |data, truncated| (data, truncated))
    }
}

impl Call<u64> {
    /// Replaces a file atomically with `data`; the result is the bytes written.
    pub fn write_file(path: &str, data: &[u8], mode: Option<u32>) -> Self {
        let op = Operation::WriteFile {
            path: path.into(),
            mode,
            parents: false,
            user: None,
        };
        let inputs = data
            .chunks(MAX_CHUNK)
            .map(|c| Input::Data(c.to_vec()))
            .chain([Input::End])
            .collect();
        Self::new(op, inputs, |body| match body {
            AgentBody::Written { bytes } => Ok(Some(bytes)),
            other => Err(other),
        })
    }
}

impl Call<ExecOutput> {
    /// Runs a process to its end and collects its output in memory. For long or large
    /// output, send [`Operation::Exec`] and read the chunks as they come instead.
    ///
    /// With `spec.max_output_bytes`, the collection enforces the cap too (whatever the
    /// agent sends): each stream keeps at most that many bytes of its JSON encoding
    /// ([`crate::guest::OutputCap`]), and the status says when a stream was cut.
    pub fn exec(spec: ExecSpec) -> Self {
        let mut pid = None;
        let (mut stdout, mut stderr) = (Vec::new(), Vec::new());
        let mut caps = spec
            .max_output_bytes
            .map(|n| [OutputCap::new(n), OutputCap::new(n)]);
        Self::new(Operation::Exec(spec), Vec::new(), move |body| {
            match (pid, body, &mut caps) {
                (None, AgentBody::Started { pid: p }, _) => pid = Some(p),
                (Some(_), AgentBody::Stdout(c), Some([cap, _])) => cap.push(&c, &mut stdout),
                (Some(_), AgentBody::Stderr(c), Some([_, cap])) => cap.push(&c, &mut stderr),
                (Some(_), AgentBody::Stdout(c), None) => stdout.extend_from_slice(&c),
                (Some(_), AgentBody::Stderr(c), None) => stderr.extend_from_slice(&c),
                (Some(pid), AgentBody::Exited(mut status), caps) => {
                    if let Some([out, err]) = caps {
                        out.finish(&mut stdout);
                        err.finish(&mut stderr);
                        status.stdout_truncated |= out.truncated();
                        status.stderr_truncated |= err.truncated();
                    }
                    return Ok(Some(ExecOutput {
                        pid,
                        stdout: std::mem::take(&mut stdout),
                        stderr: std::mem::take(&mut stderr),
                        status,
                    }));
                }
                (_, other, _) => return Err(other),
            }
            Ok(None)
        })
    }
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
}

impl<S> AgentConnection<S> {
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

    /// Continues this session on `f(stream)`: the same connection in another wrapper
    /// (a non-blocking stream for an event loop, say).
    pub fn map_stream<T, E>(
        self,
        f: impl FnOnce(S) -> Result<T, E>,
    ) -> Result<AgentConnection<T>, E> {
        Ok(AgentConnection {
            stream: f(self.stream)?,
            ack: self.ack,
            next_id: self.next_id,
        })
    }

    /// The underlying stream (for timeouts, or for tests that misbehave on purpose).
    pub fn stream_mut(&mut self) -> &mut S {
        &mut self.stream
    }

    /// The underlying stream, ending the session: for a connection handed over to
    /// something else (a port's bytes after `PortConnected`). Answers are read frame
    /// by frame with nothing read ahead, so every byte after the last one read is
    /// still the stream's.
    pub fn into_stream(self) -> S {
        self.stream
    }

    /// The frames that start `call` (its request and all its input, in one buffer: one
    /// write) under a fresh request id.
    fn start<T>(&mut self, call: &mut Call<T>) -> Result<(RequestId, Vec<u8>), ClientError> {
        let Some(op) = call.op.take() else {
            return Err(ClientError::Unexpected {
                request: self.next_id,
                what: "a call started twice".into(),
            });
        };
        let (id, mut out) = self.request_frame(op)?;
        for input in std::mem::take(&mut call.inputs) {
            out.extend(input_frame(id, input)?);
        }
        Ok((id, out))
    }

    /// The frame starting `op` under a fresh request id.
    fn request_frame(&mut self, op: Operation) -> Result<(RequestId, Vec<u8>), ClientError> {
        let id = self.next_id;
        self.next_id += 1;
        let frame = frame::frame_bytes(&codec::encode(&ClientFrame::Request(Request { id, op })))?;
        Ok((id, frame))
    }

    /// Decodes an answer frame meant for request `id`. An answer from another execution
    /// or for another request is an error; so is a connection-level error from the agent.
    fn answer(&self, id: RequestId, frame: &[u8]) -> Result<AgentBody, ClientError> {
        let frame = guest::decode_agent_frame(frame)?;
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
}

impl<S: Read + Write> AgentConnection<S> {
    /// Starts an operation and returns its id. Read its answers with
    /// [`AgentConnection::next_answer`] until one [`AgentBody::is_final`].
    pub fn send_request(&mut self, op: Operation) -> Result<RequestId, ClientError> {
        let (id, frame) = self.request_frame(op)?;
        self.write(&frame)?;
        Ok(id)
    }

    /// Sends input to the running request `id`.
    pub fn send_input(&mut self, id: RequestId, input: Input) -> Result<(), ClientError> {
        self.write(&input_frame(id, input)?)
    }

    /// Writes whole frames.
    fn write(&mut self, frames: &[u8]) -> Result<(), ClientError> {
        self.stream
            .write_all(frames)
            .and_then(|()| self.stream.flush())
            .map_err(FrameError::Io)?;
        Ok(())
    }

    /// Reads the next answer to request `id`. An answer from another execution or for
    /// another request is an error; so is a connection-level error from the agent.
    pub fn next_answer(&mut self, id: RequestId) -> Result<AgentBody, ClientError> {
        let frame = frame::read_frame(&mut self.stream)?;
        self.answer(id, &frame)
    }

    /// Runs `call` to its final answer.
    pub fn run<T>(&mut self, mut call: Call<T>) -> Result<T, ClientError> {
        let (id, frames) = self.start(&mut call)?;
        self.write(&frames)?;
        loop {
            let body = self.next_answer(id)?;
            if let Some(out) = call.feed(id, body)? {
                return Ok(out);
            }
        }
    }

    /// Describes `path` (without following a final symlink).
    pub fn stat(&mut self, path: &str) -> Result<FileStat, ClientError> {
        self.run(Call::stat(path))
    }

    /// Lists a directory (in the directory's order).
    pub fn list(&mut self, path: &str) -> Result<Vec<DirEntry>, ClientError> {
        self.run(Call::list(path))
    }

    /// Creates a directory: whether this call made it.
    pub fn mkdir(&mut self, path: &str, parents: bool) -> Result<bool, ClientError> {
        self.run(Call::mkdir(path, parents, None))
    }

    /// Removes a file or directory.
    pub fn remove(&mut self, path: &str, recursive: bool) -> Result<(), ClientError> {
        self.run(Call::remove(path, recursive))
    }

    /// Renames `from` to `to`.
    pub fn rename(&mut self, from: &str, to: &str) -> Result<(), ClientError> {
        self.run(Call::rename(from, to, None))
    }

    /// Reads at most `max_bytes` of a file, from its start.
    pub fn read_file(&mut self, path: &str, max_bytes: u64) -> Result<Vec<u8>, ClientError> {
        self.run(Call::read_file(path, max_bytes))
    }

    /// Replaces a file atomically with `data`; returns the bytes written.
    pub fn write_file(
        &mut self,
        path: &str,
        data: &[u8],
        mode: Option<u32>,
    ) -> Result<u64, ClientError> {
        self.run(Call::write_file(path, data, mode))
    }

    /// Runs a process to its end and collects its output in memory. For long or large
    /// output, send [`Operation::Exec`] and read the chunks as they come instead.
    pub fn exec(&mut self, spec: ExecSpec) -> Result<ExecOutput, ClientError> {
        self.run(Call::exec(spec))
    }
}

#[cfg(feature = "tokio")]
mod asynchronous;
#[cfg(feature = "tokio")]
pub use asynchronous::write_async;

/// The frame carrying `input` for request `id` (for a writer that sends input on its
/// own, apart from the connection reading the answers).
pub fn input_frame(id: RequestId, input: Input) -> Result<Vec<u8>, ClientError> {
    Ok(frame::frame_bytes(&codec::encode(&ClientFrame::Input(
        InputFrame { id, input },
    )))?)
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

#[cfg(all(test, feature = "tokio"))]
mod async_tests {
    use super::*;
    use crate::guest::{AgentFrame, decode_client_frame};
    use space_identity::{Generation, SandboxId};

    const EXECUTION: [u8; 16] = [7; 16];

    /// A handshaken connection on a tokio stream, and the scripted agent's end.
    fn connected() -> (
        AgentConnection<tokio::net::UnixStream>,
        std::os::unix::net::UnixStream,
    ) {
        let (ours, mut agent) = UnixStream::pair().unwrap();
        let peer = std::thread::spawn(move || {
            let _hello = frame::read_frame(&mut agent).unwrap();
            let ack = HelloAck {
                protocol_version: PROTOCOL_VERSION,
                sandbox: SandboxId::from_bytes([1; 16]),
                generation: Generation(3),
                execution_id: ExecutionId::from_bytes(EXECUTION),
                activation: 1,
                proof: [0; 32],
            };
            answer(&mut agent, EXECUTION, CONNECTION, AgentBody::HelloAck(ack));
            agent
        });
        let conn = AgentConnection::handshake(ours, [9; 32]).unwrap();
        let agent = peer.join().unwrap();
        let conn = conn
            .map_stream(|s| {
                s.set_nonblocking(true)?;
                tokio::net::UnixStream::from_std(s)
            })
            .unwrap();
        (conn, agent)
    }

    fn answer(agent: &mut UnixStream, execution: [u8; 16], request_id: RequestId, body: AgentBody) {
        let f = AgentFrame {
            execution_id: ExecutionId::from_bytes(execution),
            request_id,
            body,
        };
        frame::write_frame(agent, &codec::encode(&f)).unwrap();
    }

    /// The next frame the client sent, decoded.
    fn sent(agent: &mut UnixStream) -> ClientFrame {
        decode_client_frame(&frame::read_frame(agent).unwrap()).unwrap()
    }

    #[tokio::test]
    async fn a_read_collects_its_chunks_and_the_request_numbering_goes_on() {
        let (mut conn, mut agent) = connected();
        let peer = std::thread::spawn(move || {
            for id in [1, 2] {
                match sent(&mut agent) {
                    ClientFrame::Request(r) => {
                        assert_eq!(r.id, id);
                        assert!(
                            matches!(r.op, Operation::ReadFile { ref path, .. } if path == "/f")
                        );
                    }
                    other => panic!("{other:?}"),
                }
                answer(&mut agent, EXECUTION, id, AgentBody::FileData(vec![1, 2]));
                answer(&mut agent, EXECUTION, id, AgentBody::FileData(vec![3]));
                answer(
                    &mut agent,
                    EXECUTION,
                    id,
                    AgentBody::ReadEnd {
                        bytes: 3,
                        truncated: false,
                    },
                );
            }
        });
        for _ in 0..2 {
            let got = conn.run_async(Call::read_file("/f", 10)).await.unwrap();
            assert_eq!(got, vec![1, 2, 3]);
        }
        peer.join().unwrap();
    }

    #[tokio::test]
    async fn a_write_sends_its_input_in_order_after_the_request() {
        let (mut conn, mut agent) = connected();
        let data = vec![5u8; MAX_CHUNK + 10];
        let peer = std::thread::spawn(move || {
            assert!(matches!(sent(&mut agent), ClientFrame::Request(r) if r.id == 1));
            let mut got = Vec::new();
            loop {
                match sent(&mut agent) {
                    ClientFrame::Input(InputFrame {
                        id: 1,
                        input: Input::Data(d),
                    }) => got.extend(d),
                    ClientFrame::Input(InputFrame {
                        id: 1,
                        input: Input::End,
                    }) => break,
                    other => panic!("{other:?}"),
                }
            }
            let bytes = got.len() as u64;
            answer(&mut agent, EXECUTION, 1, AgentBody::Written { bytes });
            got
        });
        let n = conn
            .run_async(Call::write_file("/f", &data, None))
            .await
            .unwrap();
        assert_eq!(n, data.len() as u64);
        assert_eq!(peer.join().unwrap(), data);
    }

    #[tokio::test]
    async fn answers_from_another_execution_or_request_are_refused() {
        for (execution, request) in [([8; 16], 1), (EXECUTION, 2), (EXECUTION, CONNECTION)] {
            let (mut conn, mut agent) = connected();
            let peer = std::thread::spawn(move || {
                sent(&mut agent);
                answer(&mut agent, execution, request, AgentBody::Done);
                agent
            });
            let r = conn.run_async(Call::remove("/f", false)).await;
            match r {
                Err(ClientError::WrongExecution { .. }) => assert_eq!(execution, [8; 16]),
                Err(ClientError::Unexpected { request: 1, .. }) => assert_eq!(execution, EXECUTION),
                other => panic!("{other:?}"),
            }
            drop(peer.join().unwrap());
        }
    }

    #[tokio::test]
    async fn an_answer_that_does_not_fit_the_operation_is_refused_and_a_closed_agent_is_an_error() {
        let (mut conn, mut agent) = connected();
        let peer = std::thread::spawn(move || {
            sent(&mut agent);
            answer(&mut agent, EXECUTION, 1, AgentBody::Done);
            sent(&mut agent);
        });
        let r = conn.run_async(Call::stat("/f")).await;
        assert!(
            matches!(r, Err(ClientError::Unexpected { request: 1, .. })),
            "{r:?}"
        );
        let r = conn.run_async(Call::stat("/f")).await;
        assert!(
            matches!(r, Err(ClientError::Frame(FrameError::Closed))),
            "{r:?}"
        );
        peer.join().unwrap();
    }

    #[tokio::test]
    async fn a_hostile_agent_flooding_past_the_cap_is_capped_by_the_collector() {
        // An agent that ignores `max_output_bytes`: 64 MiB on each stream, claiming
        // nothing was truncated. The collection keeps the cap and says what it cut.
        let (mut conn, mut agent) = connected();
        let peer = std::thread::spawn(move || {
            sent(&mut agent);
            answer(&mut agent, EXECUTION, 1, AgentBody::Started { pid: 5 });
            for _ in 0..1024 {
                answer(
                    &mut agent,
                    EXECUTION,
                    1,
                    AgentBody::Stdout(vec![0; MAX_CHUNK]),
                );
                answer(
                    &mut agent,
                    EXECUTION,
                    1,
                    AgentBody::Stderr(vec![b'e'; MAX_CHUNK]),
                );
            }
            let status = ExitStatus {
                outcome: guest::ExitOutcome::Code(0),
                timed_out: false,
                stdout_truncated: false,
                stderr_truncated: false,
            };
            answer(&mut agent, EXECUTION, 1, AgentBody::Exited(status));
        });
        let mut spec = ExecSpec::shell("flood");
        spec.max_output_bytes = Some(1 << 20);
        let out = conn.run_async(Call::exec(spec)).await.unwrap();
        peer.join().unwrap();
        // NULs count as their JSON escape (6 bytes each).
        assert_eq!(out.stdout.len(), (1 << 20) / 6);
        assert_eq!(out.stderr.len(), 1 << 20);
        assert!(out.status.stdout_truncated && out.status.stderr_truncated);
    }
}
