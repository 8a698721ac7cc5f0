//! Streams over WebSocket: a terminal (PTY shell), a directory watch, and a
//! streaming exec (with or without a PTY).
//!
//! Each stream is admitted like any request (durable identity re-checked before it
//! opens), owns a dedicated verified bridge connection, and holds the lease of the
//! execution it opened on: when the worker retires or replaces that execution, input
//! and output stop at once and the client gets close code 4001 "execution replaced".
//! A bridge drop ends the stream; nothing reattaches silently.

use std::sync::Arc;

use axum::extract::ws::{CloseFrame, Message, Utf8Bytes, WebSocket, WebSocketUpgrade};
use axum::extract::{Path, Query, State};
use axum::http::HeaderMap;
use axum::response::IntoResponse;
use axum::response::Response;
use space_identity::Access;
use space_proto::client::AgentConnection;
use space_proto::guest::{
    AgentBody, ExecSpec, ExitOutcome, Input, MAX_CHUNK, Operation, PtySize, RequestId, WatchEvent,
};
use tokio::net::unix::{OwnedReadHalf, OwnedWriteHalf};
use tokio::sync::mpsc;

use super::admission::admit_stream;
use super::agent::{Split, send_input, start_split};
use super::exec::exec_stdin;
use super::refusal::Refusal;
use crate::daemon::state::{Slot, Worker};

/// Close code sent when the execution a stream was bound to is replaced or retired.
pub const CLOSE_REPLACED: u16 = 4001;
/// Close code when the bridge or agent connection ends the stream.
pub const CLOSE_BACKEND_GONE: u16 = 4002;

/// Query of a terminal.
#[derive(Debug, serde::Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub struct TerminalQuery {
    /// Rows, 1 to 1000 (24).
    rows: Option<u16>,
    /// Columns, 1 to 1000 (80).
    cols: Option<u16>,
    /// The account the shell runs as: a user name of the sandbox or a uid (root when
    /// absent; an unknown name: 400 `unknown_user`, nothing started), in its home.
    user: Option<String>,
}

/// Query of a watch.
#[derive(Debug, serde::Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub struct WatchQuery {
    /// The directory watched (`/root`).
    path: Option<String>,
    /// Whether its subdirectories are watched too (`false`).
    recursive: Option<bool>,
}

/// What the agent side of a stream produced.
enum Out {
    Data(Vec<u8>),
    Stderr(Vec<u8>),
    Text(String),
    End(u16, String),
}

/// `GET /v1/sandboxes/{id}/terminal` (WebSocket): binary messages are terminal bytes
/// both ways; a text message `{"rows": R, "cols": C}` resizes.
#[utoipa::path(get, path = "/v1/sandboxes/{id}/terminal", tag = "sandbox", params(space_proto::openapi::SandboxPath, TerminalQuery), responses((status = 101, description = "WebSocket upgrade: the stream (a refusal before it is a plain HTTP answer)"), super::openapi::Operation), security(("capability" = [])))]
pub async fn terminal(
    State(w): State<Arc<Worker>>,
    Path(id): Path<String>,
    Query(q): Query<TerminalQuery>,
    headers: HeaderMap,
    connection: Option<axum::Extension<space_http::Connection>>,
    ws: WebSocketUpgrade,
) -> Response {
    let slot = match admit_stream(&w, &headers, &id, Access::Terminal).await {
        Ok(admitted) => admitted.into_slot(),
        Err(r) => return r.into_response(),
    };
    let size = PtySize {
        rows: q.rows.unwrap_or(24).clamp(1, 1000),
        cols: q.cols.unwrap_or(80).clamp(1, 1000),
    };
    let user = slot
        .record
        .defaults
        .user_or(q.user.as_deref().map(space_proto::api::User::parse));
    let spec = ExecSpec {
        argv: vec!["/bin/sh".into(), "-i".into()],
        env: slot.record.env.clone().into_iter().collect(),
        cwd: slot.record.defaults.cwd_or(None),
        stdin: None,
        timeout_ms: None,
        pty: Some(size),
        max_output_bytes: None,
        user,
    };
    match open(&slot, Operation::Exec(spec)).await {
        Ok(opened) => {
            // The stream keeps its connection's place under node-api's limit while it
            // lives (it outlives the HTTP connection it was upgraded from).
            ws.on_upgrade(move |socket| async move {
                let _place = connection;
                relay(
                    socket,
                    slot,
                    opened,
                    Kind::Terminal,
                    PendingInput::default(),
                )
                .await;
            })
        }
        Err(r) => r.into_response(),
    }
}

/// `GET /v1/sandboxes/{id}/watch?path=&recursive=` (WebSocket): one JSON text message
/// per change.
#[utoipa::path(get, path = "/v1/sandboxes/{id}/watch", tag = "sandbox", params(space_proto::openapi::SandboxPath, WatchQuery), responses((status = 101, description = "WebSocket upgrade: the stream (a refusal before it is a plain HTTP answer)"), super::openapi::Operation), security(("capability" = [])))]
pub async fn watch(
    State(w): State<Arc<Worker>>,
    Path(id): Path<String>,
    Query(q): Query<WatchQuery>,
    headers: HeaderMap,
    connection: Option<axum::Extension<space_http::Connection>>,
    ws: WebSocketUpgrade,
) -> Response {
    let slot = match admit_stream(&w, &headers, &id, Access::Watch).await {
        Ok(admitted) => admitted.into_slot(),
        Err(r) => return r.into_response(),
    };
    let path = q.path.unwrap_or_else(|| "/root".into());
    let op = Operation::Watch {
        path,
        recursive: q.recursive.unwrap_or(false),
    };
    match open(&slot, op).await {
        Ok(opened) => {
            // The stream keeps its connection's place under node-api's limit while it
            // lives (it outlives the HTTP connection it was upgraded from).
            ws.on_upgrade(move |socket| async move {
                let _place = connection;
                relay(socket, slot, opened, Kind::Watch, PendingInput::default()).await;
            })
        }
        Err(r) => r.into_response(),
    }
}

/// `GET /v1/sandboxes/{id}/exec/stream` (WebSocket): the first client message is
/// the exec request (the JSON of `POST …/exec`, `pty` too); once the process runs, a
/// text message `{"type":"started","pid":N}`; output follows as it is produced, each
/// binary message tagged 1 (stdout, and all of a PTY's output) or 2 (stderr); the
/// close reason is `exited N` or `killed by signal N`. Later client messages are
/// stdin, but for a text `{"rows","cols"}` (a resize) and `{"signal":N}`.
#[utoipa::path(get, path = "/v1/sandboxes/{id}/exec/stream", tag = "sandbox", params(space_proto::openapi::SandboxPath), responses((status = 101, description = "WebSocket upgrade: the stream (a refusal before it is a plain HTTP answer)"), super::openapi::Operation), security(("capability" = [])))]
pub async fn exec_stream(
    State(w): State<Arc<Worker>>,
    Path(id): Path<String>,
    headers: HeaderMap,
    connection: Option<axum::Extension<space_http::Connection>>,
    ws: WebSocketUpgrade,
) -> Response {
    let slot = match admit_stream(&w, &headers, &id, Access::Exec).await {
        Ok(admitted) => admitted.into_slot(),
        Err(r) => return r.into_response(),
    };
    ws.on_upgrade(move |mut socket| async move {
        let _place = connection;
        let first = tokio::time::timeout(std::time::Duration::from_secs(30), socket.recv()).await;
        let req: space_proto::api::ExecRequest = match first {
            Ok(Some(Ok(Message::Text(t)))) => match serde_json::from_str(t.as_str()) {
                Ok(r) => r,
                Err(e) => {
                    return close(
                        &mut socket,
                        CLOSE_BAD_REQUEST,
                        format!("invalid exec request: {e}"),
                    )
                    .await;
                }
            },
            _ => {
                return close(
                    &mut socket,
                    CLOSE_BAD_REQUEST,
                    "the first message must be the exec request".into(),
                )
                .await;
            }
        };
        let mut req = req;
        if req.cmd.is_empty() {
            return close(
                &mut socket,
                CLOSE_BAD_REQUEST,
                "cmd must not be empty".into(),
            )
            .await;
        }
        // Stdin given in the request is written as input (of any size the request
        // holds, not bounded by a frame), then closed; without it stdin stays open for
        // the client's binary messages, up to an empty one.
        let given = req.stdin.is_some() || req.stdin_base64.is_some();
        let mut initial = PendingInput::default();
        match exec_stdin(&mut req) {
            Ok(bytes) if given => {
                initial.stdin(bytes.into());
                initial.then(Input::CloseStdin);
            }
            Ok(_) => {}
            Err(r) => {
                return close(
                    &mut socket,
                    CLOSE_BAD_REQUEST,
                    format!("invalid exec request: stdin ({})", r.status()),
                )
                .await;
            }
        }
        let spec = ExecSpec {
            argv: req.cmd,
            env: slot
                .record
                .env
                .clone()
                .into_iter()
                .chain(req.env.unwrap_or_default())
                .collect::<std::collections::BTreeMap<_, _>>()
                .into_iter()
                .collect(),
            cwd: slot.record.defaults.cwd_or(req.cwd),
            stdin: None,
            timeout_ms: req.timeout_secs.map(|s| s.saturating_mul(1000)),
            pty: req.pty.map(space_proto::api::TerminalSize::clamped),
            // A stream is read as it comes: nothing is collected, nothing capped.
            max_output_bytes: None,
            user: slot.record.defaults.user_or(req.user),
        };
        match open(&slot, Operation::Exec(spec)).await {
            Ok(opened) => {
                // Before any output: the process's pid in the sandbox (0 when the
                // program could not be executed; its 126 or 127 follows).
                let started = serde_json::json!({"type": "started", "pid": opened.pid});
                if socket
                    .send(Message::Text(started.to_string().into()))
                    .await
                    .is_ok()
                {
                    relay(socket, slot, opened, Kind::Exec, initial).await;
                }
            }
            // The execution was retired while the stream was being opened.
            Err(_) if *slot.lease.borrow() => {
                close(&mut socket, CLOSE_REPLACED, "execution replaced".into()).await
            }
            // The request's own fault (an unknown account): a bad request, said so.
            Err(Refusal::Agent(e)) if e.kind == space_proto::guest::ErrorKind::UnknownUser => {
                close(
                    &mut socket,
                    CLOSE_BAD_REQUEST,
                    format!("{}: {}", e.kind, e.message),
                )
                .await
            }
            Err(r) => {
                close(
                    &mut socket,
                    CLOSE_BACKEND_GONE,
                    format!("exec refused: {}", r.status()),
                )
                .await
            }
        }
    })
}

/// Close code for a malformed stream request.
pub const CLOSE_BAD_REQUEST: u16 = 4000;

/// A stream's agent side: the request it runs, a writer for its input, and the task
/// reading its answers (no thread: the connection is non-blocking).
struct Opened {
    id: RequestId,
    /// The pid of an exec's process (`0` for a watch, or a program that could not be
    /// executed).
    pid: u32,
    writer: OwnedWriteHalf,
    output: mpsc::Receiver<Out>,
    reader: Reader,
}

/// The reader task, stopped when the stream ends however it ends: with the writer
/// dropped too, the connection is closed.
struct Reader(tokio::task::JoinHandle<()>);

impl Drop for Reader {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Opens a dedicated connection (its checks and handshake on the blocking pool),
/// starts `op`, and spawns the task that reads its answers.
async fn open(slot: &Arc<Slot>, op: Operation) -> Result<Opened, Refusal> {
    let Split {
        id,
        writer,
        conn,
        first,
    } = start_split(slot, op).await?;
    let pid = match first {
        AgentBody::Started { pid } => pid,
        _ => 0,
    };
    let (tx, output) = mpsc::channel(64);
    let reader = Reader(tokio::spawn(read_answers(conn, id, tx)));
    Ok(Opened {
        id,
        pid,
        writer,
        output,
        reader,
    })
}

/// Forwards the agent's answers until the request ends or the connection breaks.
/// The bounded channel applies backpressure to the agent.
async fn read_answers(
    mut conn: AgentConnection<OwnedReadHalf>,
    id: RequestId,
    tx: mpsc::Sender<Out>,
) {
    loop {
        let out = match conn.next_answer_async(id).await {
            Ok(AgentBody::Stdout(b)) => Out::Data(b),
            Ok(AgentBody::Stderr(b)) => Out::Stderr(b),
            Ok(AgentBody::WatchEvent(e)) => Out::Text(event_json(&e).to_string()),
            Ok(AgentBody::Exited(s)) => {
                let why = match s.outcome {
                    ExitOutcome::Code(c) => format!("exited {c}"),
                    ExitOutcome::Signal(n) => format!("killed by signal {n}"),
                };
                Out::End(1000, why)
            }
            Ok(AgentBody::WatchEnded { reason }) => {
                Out::End(1000, format!("watch ended: {reason:?}"))
            }
            Ok(_) => continue,
            Err(e) => Out::End(CLOSE_BACKEND_GONE, format!("backend connection ended: {e}")),
        };
        let end = matches!(out, Out::End(..));
        if tx.send(out).await.is_err() || end {
            return;
        }
    }
}

fn event_json(e: &WatchEvent) -> serde_json::Value {
    match e {
        WatchEvent::Created { path, dir } => {
            serde_json::json!({"type": "created", "path": path, "dir": dir})
        }
        WatchEvent::Modified { path } => serde_json::json!({"type": "modified", "path": path}),
        WatchEvent::Removed { path, dir } => {
            serde_json::json!({"type": "removed", "path": path, "dir": dir})
        }
        WatchEvent::Renamed { from, to } => {
            serde_json::json!({"type": "renamed", "from": from, "to": to})
        }
        WatchEvent::Overflow => serde_json::json!({"type": "overflow"}),
    }
}

async fn close(socket: &mut WebSocket, code: u16, reason: String) {
    let _ = socket
        .send(Message::Close(Some(CloseFrame {
            code,
            reason: Utf8Bytes::from(reason),
        })))
        .await;
}

/// What a stream relays.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    /// A shell on a PTY: untagged bytes both ways, resizes.
    Terminal,
    /// Change events.
    Watch,
    /// A streaming exec: output tagged 1 (stdout) or 2 (stderr), an empty binary
    /// message closes stdin, resizes and signals.
    Exec,
}

/// A client text message that is not input bytes.
#[derive(Debug, PartialEq, Eq)]
enum Control {
    /// `{"rows": R, "cols": C}` (each clamped to 1–1000).
    Resize(PtySize),
    /// `{"signal": N}` of an exec, N 1 to 64: for its process group.
    Signal(i32),
    /// `{"signal": …}` of an exec with anything else: the stream is closed 4000.
    BadSignal(String),
}

/// What a client's text message is on a stream of `kind`: a control, or `None` for
/// input bytes (as every text that is neither was before signals existed).
fn control(kind: Kind, text: &str) -> Option<Control> {
    if kind == Kind::Exec {
        if let Ok(serde_json::Value::Object(m)) = serde_json::from_str(text) {
            if let (1, Some(v)) = (m.len(), m.get("signal")) {
                return Some(match v.as_i64().and_then(|n| i32::try_from(n).ok()) {
                    Some(n @ 1..=64) => Control::Signal(n),
                    _ => Control::BadSignal(format!("invalid signal {v}")),
                });
            }
        }
    }
    let size = serde_json::from_str::<PtySize>(text).ok()?;
    Some(Control::Resize(
        space_proto::api::TerminalSize {
            rows: size.rows,
            cols: size.cols,
        }
        .clamped(),
    ))
}

/// Relays between the client and the agent until either ends or the lease breaks.
/// An exec's binary messages to the client start with 1 (stdout) or 2 (stderr); a
/// terminal's output is untagged (the PTY merges them).
async fn relay(
    mut socket: WebSocket,
    slot: Arc<Slot>,
    opened: Opened,
    kind: Kind,
    initial: PendingInput,
) {
    let tagged = kind == Kind::Exec;
    let Opened {
        id,
        writer,
        mut output,
        reader: _reader,
        ..
    } = opened;
    let (inputs, _writer) = input_writer(writer, id);
    let mut pending = initial;
    let mut lease = slot.lease();
    if *lease.borrow() {
        close(&mut socket, CLOSE_REPLACED, "execution replaced".into()).await;
        return;
    }
    loop {
        tokio::select! {
            changed = lease.changed() => {
                if changed.is_err() || *lease.borrow() {
                    close(&mut socket, CLOSE_REPLACED, "execution replaced".into()).await;
                    break;
                }
            }
            out = output.recv() => match out {
                Some(Out::Data(b)) => {
                    let b = if tagged { [&[1u8][..], &b].concat() } else { b };
                    if socket.send(Message::Binary(b.into())).await.is_err() {
                        break;
                    }
                }
                Some(Out::Stderr(b)) => {
                    let b = if tagged { [&[2u8][..], &b].concat() } else { b };
                    if socket.send(Message::Binary(b.into())).await.is_err() {
                        break;
                    }
                }
                Some(Out::Text(t)) => {
                    if socket.send(Message::Text(t.into())).await.is_err() {
                        break;
                    }
                }
                Some(Out::End(code, why)) => {
                    close(&mut socket, code, why).await;
                    break;
                }
                None => {
                    close(&mut socket, CLOSE_BACKEND_GONE, "backend connection ended".into()).await;
                    break;
                }
            },
            // The next input, once the writer took the previous: while the agent is
            // slow to take input, output still flows (a `cat` fed faster than its
            // output is read would otherwise stop both ways).
            permit = inputs.reserve(), if pending.is_some() => match (permit, pending.next()) {
                (Ok(permit), Some(input)) => permit.send(input),
                _ => {
                    close(&mut socket, CLOSE_BACKEND_GONE, "backend connection ended".into()).await;
                    break;
                }
            },
            msg = socket.recv(), if pending.is_none() => {
                match msg {
                    // An empty binary message ends the stdin of an exec (`cat` ends).
                    Some(Ok(Message::Binary(b))) if b.is_empty() && tagged => {
                        pending.then(Input::CloseStdin);
                    }
                    Some(Ok(Message::Binary(b))) => pending.stdin(b),
                    Some(Ok(Message::Text(t))) => match control(kind, t.as_str()) {
                        Some(Control::Resize(size)) => pending.then(Input::Resize(size)),
                        Some(Control::Signal(n)) => pending.then(Input::Signal(n)),
                        Some(Control::BadSignal(why)) => {
                            close(&mut socket, CLOSE_BAD_REQUEST, why).await;
                            break;
                        }
                        None => pending.stdin(axum::body::Bytes::from(t)),
                    },
                    Some(Ok(Message::Ping(_) | Message::Pong(_))) => continue,
                    _ => break,
                }
            }
        }
    }
    // Closing the connection (both halves: the reader stops with `_reader`, the writer
    // with `_writer`) ends the process group or the watch at the agent.
}

/// Client input not yet handed to the writer: a message's stdin bytes, cut into
/// frames of at most [`MAX_CHUNK`] as they are handed over (a message larger than
/// the agent's frame limit still arrives whole), or one other input.
#[derive(Default)]
struct PendingInput {
    stdin: axum::body::Bytes,
    other: Option<Input>,
}

impl PendingInput {
    fn is_some(&self) -> bool {
        !self.stdin.is_empty() || self.other.is_some()
    }

    fn is_none(&self) -> bool {
        !self.is_some()
    }

    fn stdin(&mut self, b: axum::body::Bytes) {
        self.stdin = b;
    }

    fn then(&mut self, input: Input) {
        self.other = Some(input);
    }

    fn next(&mut self) -> Option<Input> {
        if !self.stdin.is_empty() {
            let n = self.stdin.len().min(MAX_CHUNK);
            return Some(Input::Stdin(self.stdin.split_to(n).to_vec()));
        }
        self.other.take()
    }
}

/// The task writing a stream's input to the agent, stopped (and the write half
/// closed) when the stream ends, even in the middle of a write the agent does not
/// take.
struct Writer(tokio::task::JoinHandle<()>);

impl Drop for Writer {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Starts the writer of request `id`'s input: a small queue (each entry at most
/// [`MAX_CHUNK`]) in front of the connection, which is all the input a stream buffers.
fn input_writer(mut writer: OwnedWriteHalf, id: RequestId) -> (mpsc::Sender<Input>, Writer) {
    let (tx, mut rx) = mpsc::channel::<Input>(4);
    let task = tokio::spawn(async move {
        while let Some(input) = rx.recv().await {
            if send_input(&mut writer, id, input).await.is_err() {
                return;
            }
        }
    });
    (tx, Writer(task))
}

#[cfg(test)]
mod control_tests {
    use super::{Control, Kind, control};
    use space_proto::guest::PtySize;

    #[test]
    fn an_exec_takes_signals_1_to_64_and_closes_on_any_other_while_a_terminal_types_them() {
        assert_eq!(
            control(Kind::Exec, r#"{"signal":15}"#),
            Some(Control::Signal(15))
        );
        assert_eq!(
            control(Kind::Exec, r#"{"signal": 64}"#),
            Some(Control::Signal(64))
        );
        for (text, why) in [
            (r#"{"signal":0}"#, "invalid signal 0"),
            (r#"{"signal":65}"#, "invalid signal 65"),
            (r#"{"signal":-9}"#, "invalid signal -9"),
            (r#"{"signal":"TERM"}"#, r#"invalid signal "TERM""#),
            (r#"{"signal":4294967311}"#, "invalid signal 4294967311"),
        ] {
            assert_eq!(
                control(Kind::Exec, text),
                Some(Control::BadSignal(why.into())),
                "{text}"
            );
        }
        // Anything else is stdin, as before; a terminal types a signal message.
        assert_eq!(control(Kind::Exec, r#"{"signal":15,"x":1}"#), None);
        assert_eq!(control(Kind::Exec, "echo hi\n"), None);
        assert_eq!(control(Kind::Terminal, r#"{"signal":15}"#), None);
    }

    #[test]
    fn a_resize_is_clamped_to_1_to_1000() {
        for kind in [Kind::Exec, Kind::Terminal] {
            assert_eq!(
                control(kind, r#"{"rows":40,"cols":120}"#),
                Some(Control::Resize(PtySize {
                    rows: 40,
                    cols: 120
                }))
            );
            assert_eq!(
                control(kind, r#"{"rows":0,"cols":5000}"#),
                Some(Control::Resize(PtySize {
                    rows: 1,
                    cols: 1000
                }))
            );
        }
    }
}
