//! Streams of a sandbox over WebSocket: a streaming exec, a terminal, a watch. Each
//! can be split into its input and output halves, to send and receive at once from
//! two tasks.

use bytes::Bytes;
use futures_util::stream::{SplitSink, SplitStream};
use futures_util::{Sink, SinkExt, Stream, StreamExt};
use space_identity::{OperationClass, Progress, SandboxId};
use tokio_tungstenite::MaybeTlsStream;
use tokio_tungstenite::tungstenite::Error as WsError;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::protocol::CloseFrame;

use super::{Answer, Attempt, Client, Error, ExecRequest, encode_query, refused};

pub(crate) type Socket = tokio_tungstenite::WebSocketStream<MaybeTlsStream<tokio::net::TcpStream>>;

impl Client {
    /// Runs a command and streams its output as it is produced.
    pub async fn exec_stream(
        &self,
        id: &SandboxId,
        req: &ExecRequest,
    ) -> Result<ExecStream, Error> {
        let spec = serde_json::to_string(req).map_err(|e| Error::Decode(e.to_string()))?;
        let mut socket = self
            .open_stream(id, &format!("/v1/sandboxes/{id}/exec/stream"))
            .await?;
        socket
            .send(Message::Text(spec.into()))
            .await
            .map_err(|e| Error::Stream(e.to_string()))?;
        Ok(ExecStream { socket })
    }

    /// Streams changes under `path` (one JSON event each) until dropped.
    pub async fn watch(
        &self,
        id: &SandboxId,
        path: &str,
        recursive: bool,
    ) -> Result<WatchStream, Error> {
        let path = encode_query(path);
        let socket = self
            .open_stream(
                id,
                &format!("/v1/sandboxes/{id}/watch?path={path}&recursive={recursive}"),
            )
            .await?;
        Ok(WatchStream { socket })
    }

    /// Opens an interactive shell on a terminal of `rows` × `cols`.
    pub async fn terminal(&self, id: &SandboxId, rows: u16, cols: u16) -> Result<Terminal, Error> {
        self.terminal_as(id, rows, cols, None).await
    }

    /// [`Client::terminal`] as an account of the sandbox (a user name or a uid; root
    /// when `None`): its uid, groups and home. An unknown name is `400 unknown_user`.
    pub async fn terminal_as(
        &self,
        id: &SandboxId,
        rows: u16,
        cols: u16,
        user: Option<&space_proto::api::User>,
    ) -> Result<Terminal, Error> {
        let mut pq = format!("/v1/sandboxes/{id}/terminal?rows={rows}&cols={cols}");
        if let Some(u) = user {
            pq.push_str(&format!("&user={}", crate::encode_query(&u.as_query())));
        }
        let socket = self.open_stream(id, &pq).await?;
        Ok(Terminal { socket })
    }

    /// Opens a WebSocket at `path_and_query`: on the sandbox's worker (with recovery:
    /// a refused upgrade is an HTTP answer like any other) or through the edge, which
    /// recovers on its side (whatever it answers is final here).
    async fn open_stream(
        &self,
        sandbox: &SandboxId,
        path_and_query: &str,
    ) -> Result<Socket, Error> {
        if !self.inner.direct {
            let url = format!("{}{path_and_query}", self.inner.url);
            return connect(&url, &self.inner.bearer).await.settle();
        }
        self.on_route(sandbox, OperationClass::StreamOpen, |grant| async move {
            let url = format!("{}{path_and_query}", grant.worker_url);
            connect(&url, &grant.authorization).await
        })
        .await
    }
}

/// One WebSocket connection attempt to `url` (`http://…`) with `authorization`.
async fn connect(url: &str, authorization: &str) -> Attempt<Socket> {
    let bad = |e: String| Attempt::Done(Err(Error::Stream(e)));
    let mut req = match url.replacen("http", "ws", 1).into_client_request() {
        Ok(r) => r,
        Err(e) => return bad(format!("bad url {url}: {e}")),
    };
    match authorization.parse() {
        Ok(v) => {
            req.headers_mut().insert("authorization", v);
        }
        Err(_) => return bad("the credential is not a header value".into()),
    }
    match tokio_tungstenite::connect_async(req).await {
        Ok((socket, _)) => Attempt::Done(Ok(socket)),
        Err(WsError::Http(resp)) => {
            let body = resp.body().as_deref().unwrap_or_default();
            let answer = Answer {
                status: resp.status(),
                headers: Default::default(),
                body: Bytes::copy_from_slice(body),
            };
            refused(&answer).unwrap_or_else(|| Attempt::Done(Err(super::api_error(&answer))))
        }
        Err(e) => Attempt::Failed {
            // A refused connection: nothing reached the worker.
            progress: match &e {
                WsError::Io(io) if io.kind() == std::io::ErrorKind::ConnectionRefused => {
                    Progress::NotStarted
                }
                _ => Progress::Started,
            },
            error: Error::Stream(e.to_string()),
        },
    }
}

/// Sends `m` on a stream's sending half.
async fn send<S>(sink: &mut S, m: Message) -> Result<(), Error>
where
    S: Sink<Message, Error = WsError> + Unpin,
{
    sink.send(m).await.map_err(|e| Error::Stream(e.to_string()))
}

/// The next message of a stream's receiving half.
async fn receive<S>(stream: &mut S) -> Option<Result<Message, Error>>
where
    S: Stream<Item = Result<Message, WsError>> + Unpin,
{
    Some(
        stream
            .next()
            .await?
            .map_err(|e| Error::Stream(e.to_string())),
    )
}

/// What a streaming exec yields.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ExecEvent {
    /// The command runs, as this process of the sandbox (its process group too); `0`
    /// when the program could not be executed (its 126 or 127 follows). First, before
    /// any output.
    Started {
        /// Its pid in the sandbox.
        pid: u32,
    },
    /// Bytes the command wrote to stdout (and all of a PTY's output).
    Stdout(Bytes),
    /// Bytes the command wrote to stderr.
    Stderr(Bytes),
    /// The command ended: its exit code, `128 + signal` when a signal killed it.
    Exited(i32),
}

/// A command's output as it is produced ([`Client::exec_stream`]).
#[derive(Debug)]
pub struct ExecStream {
    socket: Socket,
}

impl ExecStream {
    /// Writes `bytes` to the command's stdin (when the request gave no `stdin`). Sent
    /// as it is given: the socket applies backpressure, so a command that does not
    /// read stops the sender; a command that echoes its input needs its output read
    /// ([`ExecStream::next`]) between sends of more than a few pipe buffers — or
    /// [`ExecStream::split`] and read from another task.
    pub async fn send_stdin(&mut self, bytes: impl Into<Bytes>) -> Result<(), Error> {
        send_stdin(&mut self.socket, bytes.into()).await
    }

    /// Closes the command's stdin (it reads end of file: `cat` ends).
    pub async fn close_stdin(&mut self) -> Result<(), Error> {
        send(&mut self.socket, Message::Binary(Bytes::new())).await
    }

    /// Sends signal `n` (1 to 64) to the command's process group; another number
    /// makes the worker close the stream (4000 `invalid signal N`).
    pub async fn signal(&mut self, n: i32) -> Result<(), Error> {
        send(&mut self.socket, signal(n)).await
    }

    /// Resizes the command's terminal (one asked for with `pty`; without, nothing
    /// happens).
    pub async fn resize(&mut self, rows: u16, cols: u16) -> Result<(), Error> {
        send(&mut self.socket, resize(rows, cols)).await
    }

    /// [`ExecEvent::Started`] (from a worker that sends it), the output as it comes,
    /// then [`ExecEvent::Exited`], then `None`. The stream ends in [`Error::Closed`]
    /// when the execution it ran in was replaced meanwhile (close code 4001), which is
    /// never silently reattached.
    pub async fn next(&mut self) -> Option<Result<ExecEvent, Error>> {
        next_exec(&mut self.socket).await
    }

    /// Its stdin and its output apart, to use from two tasks at once.
    pub fn split(self) -> (ExecInput, ExecOutput) {
        let (sink, stream) = self.socket.split();
        (ExecInput { sink }, ExecOutput { stream })
    }
}

/// The stdin half of an [`ExecStream`].
#[derive(Debug)]
pub struct ExecInput {
    sink: SplitSink<Socket, Message>,
}

impl ExecInput {
    /// As [`ExecStream::send_stdin`].
    pub async fn send_stdin(&mut self, bytes: impl Into<Bytes>) -> Result<(), Error> {
        send_stdin(&mut self.sink, bytes.into()).await
    }

    /// As [`ExecStream::close_stdin`].
    pub async fn close_stdin(&mut self) -> Result<(), Error> {
        send(&mut self.sink, Message::Binary(Bytes::new())).await
    }

    /// As [`ExecStream::signal`].
    pub async fn signal(&mut self, n: i32) -> Result<(), Error> {
        send(&mut self.sink, signal(n)).await
    }

    /// As [`ExecStream::resize`].
    pub async fn resize(&mut self, rows: u16, cols: u16) -> Result<(), Error> {
        send(&mut self.sink, resize(rows, cols)).await
    }
}

fn signal(n: i32) -> Message {
    Message::Text(format!(r#"{{"signal":{n}}}"#).into())
}

/// The output half of an [`ExecStream`].
#[derive(Debug)]
pub struct ExecOutput {
    stream: SplitStream<Socket>,
}

impl ExecOutput {
    /// As [`ExecStream::next`].
    pub async fn next(&mut self) -> Option<Result<ExecEvent, Error>> {
        next_exec(&mut self.stream).await
    }
}

async fn send_stdin<S>(sink: &mut S, bytes: Bytes) -> Result<(), Error>
where
    S: Sink<Message, Error = WsError> + Unpin,
{
    if bytes.is_empty() {
        // An empty message is the end of stdin: nothing to send.
        return Ok(());
    }
    send(sink, Message::Binary(bytes)).await
}

async fn next_exec<S>(stream: &mut S) -> Option<Result<ExecEvent, Error>>
where
    S: Stream<Item = Result<Message, WsError>> + Unpin,
{
    loop {
        match receive(stream).await? {
            Ok(Message::Binary(b)) if !b.is_empty() => {
                let data = b.slice(1..);
                return Some(Ok(match b[0] {
                    2 => ExecEvent::Stderr(data),
                    _ => ExecEvent::Stdout(data),
                }));
            }
            Ok(Message::Close(frame)) => return Some(closed(frame).map(ExecEvent::Exited)),
            Ok(Message::Text(t)) => {
                if let Some(pid) = started(t.as_str()) {
                    return Some(Ok(ExecEvent::Started { pid }));
                }
            }
            Ok(_) => {}
            Err(e) => return Some(Err(e)),
        }
    }
}

/// The pid of a `{"type":"started","pid":N}` message (any other text is skipped).
fn started(text: &str) -> Option<u32> {
    #[derive(serde::Deserialize)]
    struct Started {
        r#type: String,
        pid: u32,
    }
    let s: Started = serde_json::from_str(text).ok()?;
    (s.r#type == "started").then_some(s.pid)
}

/// An interactive shell ([`Client::terminal`]): bytes both ways.
#[derive(Debug)]
pub struct Terminal {
    socket: Socket,
}

impl Terminal {
    /// Types `bytes`.
    pub async fn send(&mut self, bytes: impl Into<Bytes>) -> Result<(), Error> {
        send(&mut self.socket, Message::Binary(bytes.into())).await
    }

    /// Resizes the terminal.
    pub async fn resize(&mut self, rows: u16, cols: u16) -> Result<(), Error> {
        send(&mut self.socket, resize(rows, cols)).await
    }

    /// The next output of the terminal, then [`TerminalEvent::Exited`] with the shell's
    /// exit code, then `None`.
    pub async fn next(&mut self) -> Option<Result<TerminalEvent, Error>> {
        next_terminal(&mut self.socket).await
    }

    /// Its input and its output apart, to use from two tasks (or branches) at once.
    pub fn split(self) -> (TerminalInput, TerminalOutput) {
        let (sink, stream) = self.socket.split();
        (TerminalInput { sink }, TerminalOutput { stream })
    }
}

/// The input half of a [`Terminal`].
#[derive(Debug)]
pub struct TerminalInput {
    sink: SplitSink<Socket, Message>,
}

impl TerminalInput {
    /// As [`Terminal::send`].
    pub async fn send(&mut self, bytes: impl Into<Bytes>) -> Result<(), Error> {
        send(&mut self.sink, Message::Binary(bytes.into())).await
    }

    /// As [`Terminal::resize`].
    pub async fn resize(&mut self, rows: u16, cols: u16) -> Result<(), Error> {
        send(&mut self.sink, resize(rows, cols)).await
    }
}

/// The output half of a [`Terminal`].
#[derive(Debug)]
pub struct TerminalOutput {
    stream: SplitStream<Socket>,
}

impl TerminalOutput {
    /// As [`Terminal::next`].
    pub async fn next(&mut self) -> Option<Result<TerminalEvent, Error>> {
        next_terminal(&mut self.stream).await
    }
}

fn resize(rows: u16, cols: u16) -> Message {
    Message::Text(format!(r#"{{"rows":{rows},"cols":{cols}}}"#).into())
}

async fn next_terminal<S>(stream: &mut S) -> Option<Result<TerminalEvent, Error>>
where
    S: Stream<Item = Result<Message, WsError>> + Unpin,
{
    loop {
        match receive(stream).await? {
            Ok(Message::Binary(b)) => return Some(Ok(TerminalEvent::Output(b))),
            Ok(Message::Close(frame)) => return Some(closed(frame).map(TerminalEvent::Exited)),
            Ok(_) => {}
            Err(e) => return Some(Err(e)),
        }
    }
}

/// What a terminal yields.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TerminalEvent {
    /// Bytes the terminal shows.
    Output(Bytes),
    /// The shell ended with this code (`128 + signal` when killed).
    Exited(i32),
}

/// Changes under a path ([`Client::watch`]).
#[derive(Debug)]
pub struct WatchStream {
    socket: Socket,
}

impl WatchStream {
    /// The next change (`{"kind", "path", …}` as the agent reports it); `None` once the
    /// watch ended normally.
    pub async fn next(&mut self) -> Option<Result<serde_json::Value, Error>> {
        Some(
            self.next_text()
                .await?
                .and_then(|t| serde_json::from_str(&t).map_err(|e| Error::Decode(e.to_string()))),
        )
    }

    /// The next change as the agent wrote it (one JSON object); `None` once the watch
    /// ended normally.
    pub async fn next_text(&mut self) -> Option<Result<String, Error>> {
        loop {
            match receive(&mut self.socket).await? {
                Ok(Message::Text(t)) => return Some(Ok(t.as_str().to_owned())),
                Ok(Message::Close(frame)) => return closed(frame).err().map(Err),
                Ok(_) => {}
                Err(e) => return Some(Err(e)),
            }
        }
    }
}

/// How a stream's close frame reads: 1000 with `exited N` / `killed by signal N` is a
/// normal end; any other code is [`Error::Closed`].
fn closed(frame: Option<CloseFrame>) -> Result<i32, Error> {
    let Some(f) = frame else {
        return Ok(0);
    };
    if u16::from(f.code) != 1000 {
        return Err(Error::Closed {
            code: f.code.into(),
            reason: f.reason.as_str().to_owned(),
        });
    }
    let number = |prefix: &str| f.reason.as_str().strip_prefix(prefix)?.parse::<i32>().ok();
    Ok(number("exited ")
        .or_else(|| number("killed by signal ").map(|s| 128 + s))
        .unwrap_or(0))
}
