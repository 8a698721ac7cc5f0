//! Streams of a sandbox over WebSocket: a streaming exec, a terminal, a watch.

use super::*;

pub(crate) type Socket = tokio_tungstenite::WebSocketStream<MaybeTlsStream<tokio::net::TcpStream>>;

/// One WebSocket connection attempt to `url` (`http://…`) with `authorization`.
pub(crate) async fn connect(url: &str, authorization: &str) -> Attempt<Socket> {
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
            match answer.status {
                StatusCode::MISDIRECTED_REQUEST => Attempt::Refresh(error_body(&answer)),
                StatusCode::FORBIDDEN => Attempt::Denied(api_error(&answer)),
                _ => Attempt::Done(Err(api_error(&answer))),
            }
        }
        // Nothing reached the worker.
        Err(WsError::Io(e)) if e.kind() == std::io::ErrorKind::ConnectionRefused => {
            Attempt::Failed(Error::Stream(e.to_string()), Progress::NotStarted)
        }
        Err(e) => Attempt::Failed(Error::Stream(e.to_string()), Progress::Started),
    }
}

/// What a streaming exec yields.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ExecEvent {
    /// Bytes the command wrote to stdout.
    Stdout(Bytes),
    /// Bytes the command wrote to stderr.
    Stderr(Bytes),
    /// The command ended: its exit code, `128 + signal` when a signal killed it.
    Exited(i32),
}

/// A command's output as it is produced ([`Client::exec_stream`]).
#[derive(Debug)]
pub struct ExecStream {
    pub(crate) socket: Socket,
}

impl ExecStream {
    /// Writes `bytes` to the command's stdin (when the request gave no `stdin`). Sent
    /// as it is given: the socket applies backpressure, so a command that does not
    /// read stops the sender; a command that echoes its input needs its output read
    /// ([`ExecStream::next`]) between sends of more than a few pipe buffers.
    pub async fn send_stdin(&mut self, bytes: impl Into<Bytes>) -> Result<(), Error> {
        let bytes = bytes.into();
        if bytes.is_empty() {
            // An empty message is the end of stdin: nothing to send.
            return Ok(());
        }
        self.socket
            .send(Message::Binary(bytes))
            .await
            .map_err(|e| Error::Stream(e.to_string()))
    }

    /// Closes the command's stdin (it reads end of file: `cat` ends).
    pub async fn close_stdin(&mut self) -> Result<(), Error> {
        self.socket
            .send(Message::Binary(Bytes::new()))
            .await
            .map_err(|e| Error::Stream(e.to_string()))
    }

    /// The next piece of output, then [`ExecEvent::Exited`], then `None`. The stream
    /// ends in an error when the execution it ran in was replaced meanwhile (close
    /// code 4001), which is never silently reattached.
    pub async fn next(&mut self) -> Option<Result<ExecEvent, Error>> {
        loop {
            match self.socket.next().await? {
                Ok(Message::Binary(b)) if !b.is_empty() => {
                    let data = b.slice(1..);
                    return Some(Ok(match b[0] {
                        2 => ExecEvent::Stderr(data),
                        _ => ExecEvent::Stdout(data),
                    }));
                }
                Ok(Message::Close(frame)) => return Some(closed(frame).map(ExecEvent::Exited)),
                Ok(_) => {}
                Err(e) => return Some(Err(Error::Stream(e.to_string()))),
            }
        }
    }
}

/// An interactive shell ([`Client::terminal`]): bytes both ways.
#[derive(Debug)]
pub struct Terminal {
    pub(crate) socket: Socket,
}

impl Terminal {
    /// Types `bytes`.
    pub async fn send(&mut self, bytes: impl Into<Bytes>) -> Result<(), Error> {
        self.socket
            .send(Message::Binary(bytes.into()))
            .await
            .map_err(|e| Error::Stream(e.to_string()))
    }

    /// Resizes the terminal.
    pub async fn resize(&mut self, rows: u16, cols: u16) -> Result<(), Error> {
        let size = format!(r#"{{"rows":{rows},"cols":{cols}}}"#);
        self.socket
            .send(Message::Text(size.into()))
            .await
            .map_err(|e| Error::Stream(e.to_string()))
    }

    /// The next output of the terminal, then [`TerminalEvent::Exited`] with the shell's
    /// exit code, then `None`.
    pub async fn next(&mut self) -> Option<Result<TerminalEvent, Error>> {
        loop {
            match self.socket.next().await? {
                Ok(Message::Binary(b)) => return Some(Ok(TerminalEvent::Output(b))),
                Ok(Message::Close(frame)) => {
                    return Some(closed(frame).map(TerminalEvent::Exited));
                }
                Ok(_) => {}
                Err(e) => return Some(Err(Error::Stream(e.to_string()))),
            }
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
    pub(crate) socket: Socket,
}

impl WatchStream {
    /// The next change (`{"kind", "path", …}` as the agent reports it); `None` once the
    /// watch ended normally.
    pub async fn next(&mut self) -> Option<Result<serde_json::Value, Error>> {
        loop {
            match self.socket.next().await? {
                Ok(Message::Text(t)) => {
                    return Some(
                        serde_json::from_str(t.as_str()).map_err(|e| Error::Decode(e.to_string())),
                    );
                }
                Ok(Message::Close(frame)) => return closed(frame).err().map(Err),
                Ok(_) => {}
                Err(e) => return Some(Err(Error::Stream(e.to_string()))),
            }
        }
    }
}

/// How a stream's close frame reads: 1000 with `exited N` / `killed by signal N` is a
/// normal end; any other code is an error naming the reason.
fn closed(frame: Option<CloseFrame>) -> Result<i32, Error> {
    let Some(f) = frame else {
        return Ok(0);
    };
    if u16::from(f.code) != 1000 {
        return Err(Error::Stream(format!(
            "closed: {} ({})",
            f.reason,
            u16::from(f.code)
        )));
    }
    let number = |prefix: &str| f.reason.as_str().strip_prefix(prefix)?.parse::<i32>().ok();
    Ok(number("exited ")
        .or_else(|| number("killed by signal ").map(|s| 128 + s))
        .unwrap_or(0))
}
