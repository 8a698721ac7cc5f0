//! `space term` and `space watch`: WebSocket streams through the edge.

use std::io::{IsTerminal, Read, Write};

use futures_util::{SinkExt, StreamExt};
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;

type Socket =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

/// Opens a stream at `path` with the API key.
async fn open(base: &str, key: &str, path: &str) -> Result<Socket, String> {
    let url = format!(
        "{}{path}",
        base.trim_end_matches('/').replacen("http", "ws", 1)
    );
    let mut req = url
        .into_client_request()
        .map_err(|e| format!("bad url: {e}"))?;
    let auth = format!("Bearer {key}")
        .parse()
        .map_err(|_| "the API key is not a header value".to_owned())?;
    req.headers_mut().insert("authorization", auth);
    match tokio_tungstenite::connect_async(req).await {
        Ok((s, _)) => Ok(s),
        Err(tokio_tungstenite::tungstenite::Error::Http(resp)) => Err(crate::cli::api_error(
            resp.status().as_u16(),
            resp.body().as_deref().unwrap_or_default(),
        )),
        Err(e) => Err(format!("cannot open the stream: {e}")),
    }
}

/// How a stream ended: the shell's exit code for a normal end (the worker closes
/// with 1000 and "exited N"), an error naming the reason otherwise (4001: the
/// execution was replaced).
fn ended(m: Option<Message>) -> Result<i32, String> {
    match m {
        Some(Message::Close(Some(f))) if u16::from(f.code) != 1000 => Err(format!(
            "{} (stream closed, code {})",
            f.reason,
            u16::from(f.code)
        )),
        Some(Message::Close(Some(f))) => {
            let reason = f.reason.as_str();
            let number = |prefix: &str| {
                reason
                    .strip_prefix(prefix)
                    .and_then(|c| c.parse::<i32>().ok())
            };
            Ok(number("exited ")
                .or_else(|| number("killed by signal ").map(|s| 128 + s))
                .unwrap_or(0))
        }
        _ => Ok(0),
    }
}

/// Puts the terminal in raw mode for the life of the guard.
struct RawMode(Option<rustix::termios::Termios>);

impl RawMode {
    fn enter() -> Self {
        let stdin = std::io::stdin();
        if !stdin.is_terminal() {
            return Self(None);
        }
        let Ok(saved) = rustix::termios::tcgetattr(&stdin) else {
            return Self(None);
        };
        let mut raw = saved.clone();
        raw.make_raw();
        let _ = rustix::termios::tcsetattr(&stdin, rustix::termios::OptionalActions::Now, &raw);
        Self(Some(saved))
    }
}

impl Drop for RawMode {
    fn drop(&mut self) {
        if let Some(saved) = &self.0 {
            let _ = rustix::termios::tcsetattr(
                std::io::stdin(),
                rustix::termios::OptionalActions::Now,
                saved,
            );
        }
    }
}

fn window_size() -> (u16, u16) {
    rustix::termios::tcgetwinsize(std::io::stdout())
        .ok()
        .filter(|w| w.ws_row > 0 && w.ws_col > 0)
        .map_or((24, 80), |w| (w.ws_row, w.ws_col))
}

/// `space term SANDBOX`: an interactive shell. Returns the exit code.
pub async fn term(base: &str, key: &str, sandbox: &str) -> Result<i32, String> {
    let (rows, cols) = window_size();
    let socket = open(
        base,
        key,
        &format!("/v1/sandboxes/{sandbox}/terminal?rows={rows}&cols={cols}"),
    )
    .await?;
    let (mut tx, mut rx) = socket.split();
    let raw = RawMode::enter();
    let (input_tx, mut input_rx) = tokio::sync::mpsc::channel::<Vec<u8>>(16);
    // Stdin is blocking: a thread feeds the socket.
    std::thread::spawn(move || {
        let mut buf = [0u8; 4096];
        let mut stdin = std::io::stdin().lock();
        while let Ok(n) = stdin.read(&mut buf) {
            if n == 0 || input_tx.blocking_send(buf[..n].to_vec()).is_err() {
                break;
            }
        }
    });
    let mut winch =
        tokio::signal::unix::signal(tokio::signal::unix::SignalKind::window_change()).ok();
    let last = loop {
        tokio::select! {
            m = rx.next() => match m {
                Some(Ok(Message::Binary(b))) => {
                    let mut out = std::io::stdout().lock();
                    let _ = out.write_all(&b);
                    let _ = out.flush();
                }
                Some(Ok(m @ Message::Close(_))) => break Some(m),
                Some(Ok(_)) => {}
                _ => break None,
            },
            Some(bytes) = input_rx.recv() => {
                if tx.send(Message::Binary(bytes.into())).await.is_err() {
                    break None;
                }
            }
            Some(()) = async { match winch.as_mut() { Some(s) => s.recv().await, None => std::future::pending().await } } => {
                let (rows, cols) = window_size();
                let _ = tx.send(Message::Text(format!(r#"{{"rows":{rows},"cols":{cols}}}"#).into())).await;
            }
        }
    };
    drop(raw);
    ended(last)
}

/// Largest stdin chunk read and sent in one message by `space exec --stream`.
const STDIN_CHUNK: usize = 64 * 1024;

/// `space exec --stream`: output as it is produced; the command's exit code. With
/// `forward_stdin`, stdin is sent as it is read, in binary messages of at most
/// [`STDIN_CHUNK`], and its end as an empty one (the command's stdin is closed: `cat`
/// ends). A few chunks are buffered, no more: a command that does not read its stdin
/// stops the reading here. Output is read meanwhile (the socket's halves are apart).
pub async fn exec(
    base: &str,
    key: &str,
    sandbox: &str,
    request: &serde_json::Value,
    forward_stdin: bool,
) -> Result<i32, String> {
    let mut socket = open(base, key, &format!("/v1/sandboxes/{sandbox}/exec/stream")).await?;
    socket
        .send(Message::Text(request.to_string().into()))
        .await
        .map_err(|e| format!("stream: {e}"))?;
    let (mut tx, mut rx) = socket.split();
    let (input_tx, mut input_rx) = tokio::sync::mpsc::channel::<Vec<u8>>(4);
    if forward_stdin {
        // Stdin is blocking: a thread reads it. It is left behind, blocked, when the
        // command ends first (the process exits with it).
        std::thread::spawn(move || {
            let mut stdin = std::io::stdin().lock();
            loop {
                let mut buf = vec![0u8; STDIN_CHUNK];
                let n = match stdin.read(&mut buf) {
                    Ok(n) => n,
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                    Err(_) => 0,
                };
                buf.truncate(n);
                // The empty chunk (end of stdin) is sent too: it closes the command's.
                if input_tx.blocking_send(buf).is_err() || n == 0 {
                    return;
                }
            }
        });
    } else {
        drop(input_tx);
    }
    let sender = tokio::spawn(async move {
        while let Some(chunk) = input_rx.recv().await {
            if tx.send(Message::Binary(chunk.into())).await.is_err() {
                return;
            }
        }
    });
    let last = loop {
        match rx.next().await {
            Some(Ok(Message::Binary(b))) if !b.is_empty() => {
                let (tag, data) = (b[0], &b[1..]);
                if tag == 2 {
                    let mut err = std::io::stderr().lock();
                    let _ = err.write_all(data);
                    let _ = err.flush();
                } else {
                    let mut out = std::io::stdout().lock();
                    let _ = out.write_all(data);
                    let _ = out.flush();
                }
            }
            Some(Ok(m @ Message::Close(_))) => break Some(m),
            Some(Ok(_)) => {}
            _ => break None,
        }
    };
    sender.abort();
    let code = ended(last)?;
    Ok(code.clamp(0, 255))
}

/// `space watch SANDBOX PATH`: prints one JSON line per change until interrupted.
pub async fn watch(
    base: &str,
    key: &str,
    sandbox: &str,
    path: &str,
    recursive: bool,
) -> Result<i32, String> {
    let path = crate::cli::encode_query(path);
    let mut socket = open(
        base,
        key,
        &format!("/v1/sandboxes/{sandbox}/watch?path={path}&recursive={recursive}"),
    )
    .await?;
    let last = loop {
        match socket.next().await {
            Some(Ok(Message::Text(t))) => {
                let mut out = std::io::stdout().lock();
                let _ = writeln!(out, "{}", t.as_str());
                let _ = out.flush();
            }
            Some(Ok(m @ Message::Close(_))) => break Some(m),
            Some(Ok(_)) => {}
            _ => break None,
        }
    };
    ended(last)
}
