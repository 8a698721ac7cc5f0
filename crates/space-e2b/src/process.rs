//! envd's `process.Process` service on SPACE's streaming exec.
//!
//! A process started here outlives the call that started it (E2B's background
//! commands): the front keeps, per execution, a table of its processes by pid, each
//! with the exec stream to the worker (opened through the edge on the token's
//! execution) and the calls following its output. `Connect` follows a running
//! process again; `SendInput`, `SendSignal`, `CloseStdin` and `Update` (a PTY's size)
//! go down its stream; `List` lists the table. A process ends when its command does,
//! or when its execution is replaced (the worker closes the stream: nothing of a new
//! execution is ever attached to it).
//!
//! Output is not buffered for later readers: a call that follows a process gets what
//! it prints from then on, and a reader that falls behind holds the command back
//! (like a pipe) rather than losing bytes.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::{Path, State};
use axum::http::HeaderMap;
use axum::response::Response;
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use futures_util::{SinkExt, StreamExt};
use serde::Deserialize;
use serde_json::{Value, json};
use space_identity::{ExecutionId, SandboxId};
use tokio::sync::mpsc;
use tokio_tungstenite::tungstenite::Message;

use crate::connect::{self, Code, RpcError};
use crate::front::Front;
use crate::proc_table::{Control, Event, INPUT_QUEUE, Proc, Selector, publish};

/// Longest wait for the worker to report the command started.
const START_TIMEOUT: Duration = Duration::from_secs(30);

/// A follower with nothing to read gets a keep-alive event this often.
const KEEPALIVE: Duration = Duration::from_secs(20);

#[derive(Debug, Default, Deserialize)]
struct SelectorJson {
    pid: Option<u32>,
    tag: Option<String>,
}

impl SelectorJson {
    fn selector(self) -> Result<Selector, RpcError> {
        match (self.pid, self.tag) {
            (Some(p), None) => Ok(Selector::Pid(p)),
            (None, Some(t)) => Ok(Selector::Tag(t)),
            _ => Err(RpcError::new(
                Code::InvalidArgument,
                "a process is selected by exactly one of pid and tag",
            )),
        }
    }
}

#[derive(Debug, Default, Deserialize)]
struct ProcessConfig {
    cmd: String,
    #[serde(default)]
    args: Vec<String>,
    #[serde(default)]
    envs: std::collections::BTreeMap<String, String>,
    cwd: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
struct PtySize {
    #[serde(default)]
    rows: u32,
    #[serde(default)]
    cols: u32,
}

#[derive(Debug, Default, Deserialize)]
struct Pty {
    size: Option<PtySize>,
}

#[derive(Debug, Default, Deserialize)]
struct StartRequest {
    process: Option<ProcessConfig>,
    pty: Option<Pty>,
    tag: Option<String>,
    stdin: Option<bool>,
}

#[derive(Debug, Default, Deserialize)]
struct ConnectRequest {
    process: Option<SelectorJson>,
}

#[derive(Debug, Default, Deserialize)]
struct InputJson {
    stdin: Option<String>,
    pty: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
struct SendInputRequest {
    process: Option<SelectorJson>,
    input: Option<InputJson>,
}

#[derive(Debug, Default, Deserialize)]
struct SendSignalRequest {
    process: Option<SelectorJson>,
    signal: Option<Value>,
}

#[derive(Debug, Default, Deserialize)]
struct UpdateRequest {
    process: Option<SelectorJson>,
    pty: Option<Pty>,
}

fn selector(s: Option<SelectorJson>) -> Result<Selector, RpcError> {
    s.ok_or_else(|| RpcError::new(Code::InvalidArgument, "process is required"))?
        .selector()
}

/// `POST /process.Process/{method}`.
pub async fn call(
    State(front): State<Arc<Front>>,
    Path(method): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let streaming = connect::is_streaming(&headers);
    let fail = |e: RpcError| connect::failure(streaming, &e);
    // Only input carries data; every other request is a few names and numbers.
    let limit = if method == "SendInput" {
        connect::MAX_MESSAGE + 5
    } else {
        connect::SMALL_MESSAGE
    };
    let (ctx, body) = match crate::front::begin(&front, &headers, body, limit).await {
        Ok(b) => b,
        Err(r) => return r,
    };
    let key = (ctx.sandbox, ctx.execution);
    let outcome = match (method.as_str(), streaming) {
        ("Start", true) => match connect::stream_request::<StartRequest>(&body) {
            Ok(req) => {
                return start(&front, &ctx, key, req, &headers)
                    .await
                    .unwrap_or_else(&fail);
            }
            Err(e) => Err(e),
        },
        ("Connect", true) => match connect::stream_request::<ConnectRequest>(&body) {
            Ok(req) => {
                return match selector(req.process).and_then(|s| front.processes.find(&key, &s)) {
                    Ok(p) => match p.follow() {
                        Ok(rx) => follow_response(p.pid, rx, connect::timeout(&headers)),
                        Err(e) => fail(e),
                    },
                    Err(e) => fail(e),
                };
            }
            Err(e) => Err(e),
        },
        ("List", false) => connect::unary_request::<Value>(&headers, &body).map(|_| {
            let processes: Vec<Value> = front
                .processes
                .list(&key)
                .iter()
                .map(|p| {
                    let mut info = json!({"config": p.config, "pid": p.pid});
                    if let Some(t) = &p.tag {
                        info["tag"] = Value::String(t.clone());
                    }
                    info
                })
                .collect();
            json!({"processes": processes})
        }),
        ("SendInput", false) => match connect::unary_request::<SendInputRequest>(&headers, &body) {
            Ok(req) => send_input(&front, &key, req).await.map(|()| json!({})),
            Err(e) => Err(e),
        },
        ("SendSignal", false) => match connect::unary_request::<SendSignalRequest>(&headers, &body)
        {
            Ok(req) => send_signal(&front, &key, req).await.map(|()| json!({})),
            Err(e) => Err(e),
        },
        ("CloseStdin", false) => match connect::unary_request::<ConnectRequest>(&headers, &body) {
            Ok(req) => match selector(req.process).and_then(|s| front.processes.find(&key, &s)) {
                Ok(p) => p.control(Control::CloseStdin).await.map(|()| json!({})),
                Err(e) => Err(e),
            },
            Err(e) => Err(e),
        },
        ("Update", false) => match connect::unary_request::<UpdateRequest>(&headers, &body) {
            Ok(req) => update(&front, &key, req).await.map(|()| json!({})),
            Err(e) => Err(e),
        },
        ("StreamInput", _) => Err(RpcError::new(
            Code::Unimplemented,
            "StreamInput (client streaming) is not served over HTTP/1.1: use SendInput",
        )),
        (m, _)
            if [
                "Start",
                "Connect",
                "List",
                "SendInput",
                "SendSignal",
                "CloseStdin",
                "Update",
            ]
            .contains(&m) =>
        {
            Err(RpcError::new(
                Code::InvalidArgument,
                format!("process.Process/{m} called with the wrong content type"),
            ))
        }
        (m, _) => Err(RpcError::new(
            Code::Unimplemented,
            format!("process.Process/{m} is not a method"),
        )),
    };
    match outcome {
        Ok(v) => connect::unary_response(&v),
        Err(e) => fail(e),
    }
}

async fn send_input(
    front: &Front,
    key: &(SandboxId, ExecutionId),
    req: SendInputRequest,
) -> Result<(), RpcError> {
    let p = front.processes.find(key, &selector(req.process)?)?;
    let input = req.input.unwrap_or_default();
    let data = match (input.stdin, input.pty) {
        (Some(d), None) | (None, Some(d)) => STANDARD
            .decode(d.as_bytes())
            .map_err(|_| RpcError::new(Code::InvalidArgument, "input is not base64"))?,
        _ => {
            return Err(RpcError::new(
                Code::InvalidArgument,
                "input is exactly one of stdin and pty",
            ));
        }
    };
    if data.is_empty() {
        return Ok(());
    }
    p.control(Control::Stdin(data)).await
}

async fn send_signal(
    front: &Front,
    key: &(SandboxId, ExecutionId),
    req: SendSignalRequest,
) -> Result<(), RpcError> {
    let p = front.processes.find(key, &selector(req.process)?)?;
    let signal = match req.signal {
        Some(Value::String(s)) if s == "SIGNAL_SIGKILL" => 9,
        Some(Value::String(s)) if s == "SIGNAL_SIGTERM" => 15,
        Some(Value::Number(n)) if n.as_u64() == Some(9) || n.as_u64() == Some(15) => {
            n.as_u64().unwrap_or(9) as i32
        }
        other => {
            return Err(RpcError::new(
                Code::InvalidArgument,
                format!("signal must be SIGNAL_SIGKILL or SIGNAL_SIGTERM, not {other:?}"),
            ));
        }
    };
    p.control(Control::Signal(signal)).await
}

async fn update(
    front: &Front,
    key: &(SandboxId, ExecutionId),
    req: UpdateRequest,
) -> Result<(), RpcError> {
    let p = front.processes.find(key, &selector(req.process)?)?;
    let Some(size) = req.pty.and_then(|p| p.size) else {
        return Ok(());
    };
    if !p.pty {
        return Err(RpcError::new(
            Code::FailedPrecondition,
            format!("process {} has no terminal to resize", p.pid),
        ));
    }
    p.control(Control::Resize {
        rows: clamp(size.rows),
        cols: clamp(size.cols),
    })
    .await
}

fn clamp(n: u32) -> u16 {
    n.clamp(1, 1000) as u16
}

/// `Start`: opens the exec stream on the token's execution, waits for the pid, and
/// answers with the process's events from its start.
async fn start(
    front: &Arc<Front>,
    ctx: &crate::front::Envd,
    key: (SandboxId, ExecutionId),
    req: StartRequest,
    headers: &HeaderMap,
) -> Result<Response, RpcError> {
    let config = req
        .process
        .ok_or_else(|| RpcError::new(Code::InvalidArgument, "process is required"))?;
    if config.cmd.is_empty() {
        return Err(RpcError::new(
            Code::InvalidArgument,
            "process.cmd is required",
        ));
    }
    let pty = req
        .pty
        .and_then(|p| p.size)
        .map(|s| (clamp(s.rows), clamp(s.cols)));
    let mut exec = json!({
        "cmd": std::iter::once(config.cmd.clone()).chain(config.args.iter().cloned()).collect::<Vec<_>>(),
        "env": config.envs,
    });
    if let Some(cwd) = &config.cwd {
        exec["cwd"] = Value::String(cwd.clone());
    }
    if let Some(user) = &ctx.user {
        exec["user"] = Value::String(user.clone());
    }
    if let Some((rows, cols)) = pty {
        exec["pty"] = json!({"rows": rows, "cols": cols});
    }
    let shown = json!({
        "cmd": config.cmd,
        "args": config.args,
        "envs": config.envs,
        "cwd": config.cwd,
    });
    let backend = front.stream(ctx, "exec/stream").await?;
    let (mut sink, mut source) = backend.split();
    sink.send(Message::Text(exec.to_string().into()))
        .await
        .map_err(|e| RpcError::new(Code::Unavailable, format!("exec stream: {e}")))?;
    // The pid comes first; a refusal (a close) instead says why.
    let pid = tokio::time::timeout(START_TIMEOUT, async {
        loop {
            match source.next().await {
                Some(Ok(Message::Text(t))) => {
                    let v: Value = serde_json::from_str(t.as_str()).unwrap_or_default();
                    if v["type"] == "started" {
                        if let Some(pid) = v["pid"].as_u64() {
                            return Ok(pid as u32);
                        }
                    }
                }
                Some(Ok(Message::Close(c))) => {
                    let reason = c.map(|c| c.reason.to_string()).unwrap_or_default();
                    return Err(RpcError::new(
                        Code::InvalidArgument,
                        format!("the command did not start: {reason}"),
                    ));
                }
                Some(Ok(_)) => {}
                Some(Err(e)) => {
                    return Err(RpcError::new(
                        Code::Unavailable,
                        format!("exec stream: {e}"),
                    ));
                }
                None => {
                    return Err(RpcError::new(
                        Code::Unavailable,
                        "exec stream ended before the command started",
                    ));
                }
            }
        }
    })
    .await
    .map_err(|_| {
        RpcError::new(
            Code::DeadlineExceeded,
            "the command was not started within 30 s",
        )
    })??;
    let (input, controls) = mpsc::channel(INPUT_QUEUE);
    let p = Arc::new(Proc {
        pid,
        tag: req.tag,
        config: shown,
        pty: pty.is_some(),
        input,
        followers: Mutex::new(Vec::new()),
    });
    let first = p.follow()?;
    front.processes.insert(key, Arc::clone(&p))?;
    if req.stdin == Some(false) && pty.is_none() {
        // A process started with `stdin: false` reads end-of-file at once (the SDKs
        // send the field for every command; without it stdin stays open).
        let _ = p.input.try_send(Control::CloseStdin);
    }
    let front = Arc::clone(front);
    let feeding = tokio::spawn(feed(sink, controls));
    tokio::spawn(async move {
        pump(&p, source).await;
        feeding.abort();
        front.processes.remove(&key, &p);
    });
    Ok(follow_response(pid, first, connect::timeout(headers)))
}

type Sink = futures_util::stream::SplitSink<space_control::edge::Backend, Message>;
type Source = futures_util::stream::SplitStream<space_control::edge::Backend>;

/// Moves a process's output to its followers until the command ends (or its stream
/// does). Input goes down the stream from a task of its own ([`feed`]), so a reader
/// that falls behind never holds back a signal.
async fn pump(p: &Proc, mut source: Source) {
    let end = loop {
        match source.next().await {
            Some(Ok(Message::Binary(b))) if !b.is_empty() => {
                // Under a terminal everything is the terminal's output.
                let stream = match (p.pty, b[0]) {
                    (true, _) => "pty",
                    (false, 2) => "stderr",
                    (false, _) => "stdout",
                };
                publish(
                    p,
                    Event::Data {
                        stream,
                        bytes: b.slice(1..),
                    },
                )
                .await;
            }
            Some(Ok(Message::Close(c))) => {
                let (code, reason) = c.map_or((1006, String::new()), |c| {
                    (u16::from(c.code), c.reason.to_string())
                });
                break ended(code, &reason);
            }
            Some(Ok(_)) => {}
            Some(Err(e)) => {
                break Err(RpcError::new(
                    Code::Unavailable,
                    format!("the connection to the sandbox ended: {e}"),
                ));
            }
            None => {
                break Err(RpcError::new(
                    Code::Unavailable,
                    "the connection to the sandbox ended before the command did",
                ));
            }
        }
    };
    publish(p, Event::End(end)).await;
}

/// Sends a process's input down its stream until the stream or the process ends.
async fn feed(mut sink: Sink, mut controls: mpsc::Receiver<Control>) {
    while let Some(c) = controls.recv().await {
        let m = match c {
            Control::Stdin(d) => Message::Binary(d.into()),
            Control::CloseStdin => Message::Binary(Bytes::new()),
            Control::Signal(n) => Message::Text(json!({"signal": n}).to_string().into()),
            Control::Resize { rows, cols } => {
                Message::Text(json!({"rows": rows, "cols": cols}).to_string().into())
            }
        };
        if sink.send(m).await.is_err() {
            return;
        }
    }
}

/// The end event of a stream the worker closed with `code` and `reason`.
fn ended(code: u16, reason: &str) -> Result<Value, RpcError> {
    match code {
        1000 => {
            if let Some(n) = reason
                .strip_prefix("exited ")
                .and_then(|n| n.parse::<i32>().ok())
            {
                return Ok(
                    json!({"exitCode": n, "exited": true, "status": format!("exit status {n}")}),
                );
            }
            if let Some(n) = reason
                .strip_prefix("killed by signal ")
                .and_then(|n| n.parse::<i32>().ok())
            {
                return Ok(
                    json!({"exitCode": -1, "exited": false, "status": format!("signal: {}", signal_name(n))}),
                );
            }
            Err(RpcError::new(
                Code::Unknown,
                format!("the command ended: {reason}"),
            ))
        }
        4001 => Err(RpcError::new(
            Code::Unavailable,
            "the sandbox's execution was replaced (resumed or moved): the process is gone",
        )),
        4000 => Err(RpcError::new(Code::InvalidArgument, reason.to_owned())),
        _ => Err(RpcError::new(
            Code::Unavailable,
            format!("the command's stream ended: {reason}"),
        )),
    }
}

/// How Go's `os.ProcessState` names a signal (what envd reports).
fn signal_name(n: i32) -> String {
    match n {
        1 => "hangup".into(),
        2 => "interrupt".into(),
        3 => "quit".into(),
        6 => "aborted".into(),
        9 => "killed".into(),
        11 => "segmentation fault".into(),
        13 => "broken pipe".into(),
        15 => "terminated".into(),
        n => format!("signal {n}"),
    }
}

/// The streamed answer of `Start` and `Connect`: the start event, then what the
/// process prints and how it ends; a keep-alive when it is quiet; the client's
/// deadline ends the call (not the process).
fn follow_response(pid: u32, rx: mpsc::Receiver<Event>, deadline: Option<Duration>) -> Response {
    let deadline = deadline.map(|d| tokio::time::Instant::now() + d);
    let start = connect::envelope(&json!({"event": {"start": {"pid": pid}}}));
    let state = (Some(start), Some(rx), deadline);
    let stream = futures_util::stream::unfold(state, |(first, rx, deadline)| async move {
        if let Some(first) = first {
            return Some((
                Ok::<Bytes, std::convert::Infallible>(first),
                (None, rx, deadline),
            ));
        }
        let mut rx = rx?;
        let wait = async { tokio::time::timeout(KEEPALIVE, rx.recv()).await.ok() };
        let next = match deadline {
            Some(d) => match tokio::time::timeout_at(d, wait).await {
                Ok(n) => n,
                Err(_) => {
                    let e = RpcError::new(
                        Code::DeadlineExceeded,
                        "the call's timeout passed (the process keeps running)",
                    );
                    return Some((Ok(connect::end_stream(Some(&e))), (None, None, None)));
                }
            },
            None => wait.await,
        };
        let chunk = match next {
            None => connect::envelope(&json!({"event": {"keepalive": {}}})),
            Some(Some(Event::Data { stream, bytes })) => {
                connect::envelope(&json!({"event": {"data": {stream: STANDARD.encode(&bytes)}}}))
            }
            Some(Some(Event::End(Ok(end)))) => {
                let mut b = connect::envelope(&json!({"event": {"end": end}})).to_vec();
                b.extend_from_slice(&connect::end_stream(None));
                return Some((Ok(Bytes::from(b)), (None, None, None)));
            }
            Some(Some(Event::End(Err(e)))) => {
                return Some((Ok(connect::end_stream(Some(&e))), (None, None, None)));
            }
            Some(None) => {
                let e = RpcError::new(Code::Unavailable, "the process's stream ended");
                return Some((Ok(connect::end_stream(Some(&e))), (None, None, None)));
            }
        };
        Some((Ok(chunk), (None, Some(rx), deadline)))
    });
    connect::stream_response(Body::from_stream(stream))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn close_reasons_become_end_events_as_envd_reports_them() {
        let ok = ended(1000, "exited 3").unwrap();
        assert_eq!(
            ok,
            json!({"exitCode": 3, "exited": true, "status": "exit status 3"})
        );
        let killed = ended(1000, "killed by signal 9").unwrap();
        assert_eq!(killed["status"], "signal: killed");
        assert_eq!(killed["exitCode"], -1);
        assert_eq!(
            ended(4001, "execution replaced").unwrap_err().code,
            Code::Unavailable
        );
        assert_eq!(
            ended(4000, "cmd must not be empty").unwrap_err().code,
            Code::InvalidArgument
        );
        assert_eq!(ended(1000, "nonsense").unwrap_err().code, Code::Unknown);
    }

    #[test]
    fn a_selector_names_exactly_one_of_pid_and_tag() {
        let s = |pid, tag: Option<&str>| {
            SelectorJson {
                pid,
                tag: tag.map(str::to_owned),
            }
            .selector()
        };
        assert_eq!(s(Some(4), None).unwrap(), Selector::Pid(4));
        assert_eq!(s(None, Some("t")).unwrap(), Selector::Tag("t".into()));
        assert!(s(Some(4), Some("t")).is_err());
        assert!(s(None, None).is_err());
    }
}
