//! `space term`, `space watch` and `space exec --stream`: WebSocket streams through
//! the edge, opened and read with the SDK.

use std::io::{IsTerminal, Read, Write};

use space_client::{Client, Error, ExecEvent, ExecRequest, TerminalEvent};
use space_identity::SandboxId;

/// A stream that could not be opened, as the CLI words it (an API error in the one
/// form; anything else named as the stream's).
fn open_failed(e: Error, url: &str) -> String {
    match e {
        Error::Stream(why) => format!("cannot open the stream: {why}"),
        e => crate::cli::errors::describe(&e, url),
    }
}

/// How a stream ended: the exit code for a normal end (the worker closes with 1000
/// and "exited N"), an error naming the reason otherwise (4001: the execution was
/// replaced). A stream that broke off without a close frame ended normally.
fn ended(last: Option<Result<i32, Error>>) -> Result<i32, String> {
    match last {
        Some(Ok(code)) => Ok(code),
        Some(Err(Error::Closed { code, reason })) => {
            Err(format!("{reason} (stream closed, code {code})"))
        }
        Some(Err(_)) | None => Ok(0),
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
pub async fn term(
    c: &Client,
    url: &str,
    sandbox: &SandboxId,
    user: Option<&space_proto::api::User>,
) -> Result<i32, String> {
    let (rows, cols) = window_size();
    let terminal = c
        .terminal_as(sandbox, rows, cols, user)
        .await
        .map_err(|e| open_failed(e, url))?;
    let (mut tx, mut rx) = terminal.split();
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
                Some(Ok(TerminalEvent::Output(b))) => {
                    let mut out = std::io::stdout().lock();
                    let _ = out.write_all(&b);
                    let _ = out.flush();
                }
                Some(Ok(TerminalEvent::Exited(code))) => break Some(Ok(code)),
                Some(Err(e)) => break Some(Err(e)),
                None => break None,
            },
            Some(bytes) = input_rx.recv() => {
                if tx.send(bytes).await.is_err() {
                    break None;
                }
            }
            Some(()) = async { match winch.as_mut() { Some(s) => s.recv().await, None => std::future::pending().await } } => {
                let (rows, cols) = window_size();
                let _ = tx.resize(rows, cols).await;
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
/// stops the reading here. Output is read meanwhile (the stream's halves are apart).
pub async fn exec(
    c: &Client,
    url: &str,
    sandbox: &SandboxId,
    request: &ExecRequest,
    forward_stdin: bool,
) -> Result<i32, String> {
    let stream = c
        .exec_stream(sandbox, request)
        .await
        .map_err(|e| open_failed(e, url))?;
    let (mut tx, mut rx) = stream.split();
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
            let sent = if chunk.is_empty() {
                tx.close_stdin().await
            } else {
                tx.send_stdin(chunk).await
            };
            if sent.is_err() {
                return;
            }
        }
    });
    let last = loop {
        match rx.next().await {
            Some(Ok(ExecEvent::Stderr(data))) => {
                let mut err = std::io::stderr().lock();
                let _ = err.write_all(&data);
                let _ = err.flush();
            }
            Some(Ok(ExecEvent::Stdout(data))) => {
                let mut out = std::io::stdout().lock();
                let _ = out.write_all(&data);
                let _ = out.flush();
            }
            Some(Ok(ExecEvent::Exited(code))) => break Some(Ok(code)),
            Some(Ok(ExecEvent::Started { .. })) => {}
            Some(Err(e)) => break Some(Err(e)),
            None => break None,
        }
    };
    sender.abort();
    let code = ended(last)?;
    Ok(code.clamp(0, 255))
}

/// `space watch SANDBOX PATH`: prints one JSON line per change until interrupted.
pub async fn watch(
    c: &Client,
    url: &str,
    sandbox: &SandboxId,
    path: &str,
    recursive: bool,
) -> Result<i32, String> {
    let mut stream = c
        .watch(sandbox, path, recursive)
        .await
        .map_err(|e| open_failed(e, url))?;
    let last = loop {
        match stream.next_text().await {
            Some(Ok(t)) => {
                let mut out = std::io::stdout().lock();
                let _ = writeln!(out, "{t}");
                let _ = out.flush();
            }
            Some(Err(e)) => break Some(Err(e)),
            None => break None,
        }
    };
    ended(last)
}
