//! Calls to a sandbox's agent through its verified bridge: on a pooled connection
//! ([`with_conn`]), or on a dedicated one started for a stream or a large stdin
//! ([`start_split`], [`exec_collect`]); a connection that breaks while its execution
//! is retired is a stale route, not a failed backend ([`stale_or`]).

use std::sync::Arc;
use std::time::Duration;

use axum::http::StatusCode;
use space_proto::client::{self, AgentConnection, Call, ClientError, ExecOutput};
use space_proto::guest::{AgentBody, ExecSpec, Input, MAX_CHUNK, Operation, OutputCap, RequestId};
use tokio::net::unix::{OwnedReadHalf, OwnedWriteHalf};

use super::refusal::{Refusal, Stale};
use crate::daemon::state::{AgentPool, AgentStream, Slot};

/// How long an operation whose agent connection broke waits to learn that its
/// execution was retired (then it is a stale route, 421) before it is a bridge failure.
const RETIRE_GRACE: Duration = Duration::from_secs(2);

/// Runs `call` on a pooled, verified agent connection, on this task: no thread waits
/// for the agent, and no other thread is woken for it. The connection goes back to the
/// pool only after a clean answer; a request cancelled part-way drops it.
pub(crate) async fn with_conn<T: Send + 'static>(
    slot: &Arc<Slot>,
    call: Call<T>,
) -> Result<T, Refusal> {
    let Some(pool) = slot.pool.clone() else {
        return Err(Refusal::RefreshRoute(Stale::NotRunning));
    };
    let lease = slot.lease();
    let result = async {
        let mut conn = match pool.idle() {
            Some(conn) => conn,
            None => connect(&pool).await.map_err(Refusal::Bridge)?,
        };
        match conn.run_async(call).await {
            Ok(v) => {
                pool.give_back(conn);
                Ok(v)
            }
            Err(ClientError::Agent(e)) => {
                // An operation error leaves the connection usable.
                pool.give_back(conn);
                Err(Refusal::Agent(e))
            }
            Err(e) => Err(Refusal::Bridge(e.to_string())),
        }
    }
    .await;
    match result {
        Err(r) if r.status() == StatusCode::BAD_GATEWAY => Err(stale_or(r, lease, slot).await),
        other => other,
    }
}

/// A broken agent connection of `slot` (`r`, a 502): a stale route (421 `retired`)
/// when the execution was retired or replaced meanwhile (a migration, say), else `r`.
/// Its agent may go a moment before the worker records the retirement (a jail torn
/// down, a frozen agent's bridge giving up), so this waits up to [`RETIRE_GRACE`] for
/// the execution's lease to end.
pub(crate) async fn stale_or(
    r: Refusal,
    mut lease: tokio::sync::watch::Receiver<bool>,
    slot: &Slot,
) -> Refusal {
    let replaced = tokio::time::timeout(RETIRE_GRACE, lease.wait_for(|gone| *gone))
        .await
        .is_ok_and(|r| r.is_ok());
    if replaced {
        return Refusal::RefreshRoute(Stale::RetiredDuringOperation);
    }
    tracing::warn!(sandbox = %slot.record.sandbox, generation = slot.record.generation.get(), state = ?slot.record.state, "agent connection failed and the execution was not retired");
    r
}

/// A new verified connection to the pool's bridge (the checks and the handshake run
/// once, on the blocking pool), made non-blocking for the runtime.
pub(crate) async fn connect(pool: &AgentPool) -> Result<AgentConnection<AgentStream>, String> {
    let target = pool.target().clone();
    let conn = tokio::task::spawn_blocking(move || spaced_host::connect(&target))
        .await
        .map_err(|e| e.to_string())?
        .map_err(|e| e.to_string())?;
    conn.map_stream(AgentStream::new)
        .map_err(|e: std::io::Error| e.to_string())
}

/// An operation started on a dedicated connection: its id, the write half for its
/// input, the read half for its answers, and the first answer (`Started` with the pid
/// of an exec, `WatchStarted`).
pub(crate) struct Split {
    pub(crate) id: RequestId,
    pub(crate) writer: OwnedWriteHalf,
    pub(crate) conn: AgentConnection<OwnedReadHalf>,
    pub(crate) first: AgentBody,
}

/// Takes a connection of its own for a stream, starts `op` on it and splits it into
/// its halves once the agent said the operation started.
///
/// The connection is an idle one of the pool when there is one — verified for this
/// execution like every pooled connection — and the pool then gets a new one in the
/// background, so that the next stream finds one too: the bridge's checks and the
/// agent's handshake are off the stream's path (measured: they were most of what a
/// streamed `true` cost over a buffered one, P13). Without an idle one, a new
/// connection is made here.
pub(crate) async fn start_split(slot: &Arc<Slot>, op: Operation) -> Result<Split, Refusal> {
    let Some(pool) = slot.pool.clone() else {
        return Err(Refusal::RefreshRoute(Stale::NotRunning));
    };
    let expected = match op {
        Operation::Watch { .. } => First::WatchStarted,
        Operation::ConnectPort { .. } => First::PortConnected,
        _ => First::Started,
    };
    let bad = Refusal::Bridge;
    let std_conn = match pool.idle() {
        Some(idle) => {
            refill(&pool);
            idle.map_stream(|s| Ok::<_, std::convert::Infallible>(s.into_std()))
                .unwrap_or_else(|never| match never {})
        }
        None => {
            let p = Arc::clone(&pool);
            tokio::task::spawn_blocking(move || p.dedicated())
                .await
                .map_err(|e| bad(e.to_string()))?
                .map_err(|e| bad(e.to_string()))?
        }
    };
    let mut conn = std_conn
        .map_stream(|s| {
            s.set_nonblocking(true)?;
            tokio::net::UnixStream::from_std(s)
        })
        .map_err(|e| bad(e.to_string()))?;
    let id = conn
        .send_request_async(op)
        .await
        .map_err(|e| bad(e.to_string()))?;
    // The first answer tells whether the operation started. The agent's refusal (a
    // missing directory to watch, a bad cwd) comes as an error of the connection's
    // reader: answered with its own status (404 `not_found`, …), not as a broken
    // backend (502).
    let first = match conn.next_answer_async(id).await {
        Ok(body) => body,
        Err(client::ClientError::Agent(e)) => {
            return Err(Refusal::Agent(e));
        }
        Err(e) => return Err(bad(e.to_string())),
    };
    match (&first, expected) {
        (AgentBody::Started { .. }, First::Started)
        | (AgentBody::WatchStarted, First::WatchStarted)
        | (AgentBody::PortConnected, First::PortConnected) => {}
        (AgentBody::Error(e), _) => return Err(Refusal::Agent(e.clone())),
        (other, _) => return Err(bad(format!("unexpected {other:?}"))),
    }
    let mut writer = None;
    let conn = conn
        .map_stream(|s| {
            let (read, write) = s.into_split();
            writer = Some(write);
            Ok::<_, std::convert::Infallible>(read)
        })
        .unwrap_or_else(|never| match never {});
    let writer = writer.ok_or_else(|| bad("split".into()))?;
    Ok(Split {
        id,
        writer,
        conn,
        first,
    })
}

/// The answer that says an operation of [`start_split`] started.
#[derive(Debug, Clone, Copy)]
enum First {
    Started,
    WatchStarted,
    PortConnected,
}

/// A connection to `port` on the loopback of `slot`'s sandbox made by its agent
/// ([`Operation::ConnectPort`]), on a verified connection of the execution's own: the
/// stream carries the port's bytes from here on. A port nothing accepts on is the
/// agent's `port_closed` (502).
pub(crate) async fn connect_port(
    slot: &Arc<Slot>,
    port: u16,
) -> Result<tokio::net::UnixStream, Refusal> {
    let split = start_split(slot, Operation::ConnectPort { port }).await?;
    split
        .conn
        .into_stream()
        .reunite(split.writer)
        .map_err(|e| Refusal::Bridge(format!("reunite: {e}")))
}

/// Puts a new verified connection in `pool` in the background (for the next stream);
/// a failure is left to the next caller, which then connects itself.
fn refill(pool: &Arc<AgentPool>) {
    let pool = Arc::clone(pool);
    tokio::spawn(async move {
        if let Ok(conn) = connect(&pool).await {
            pool.give_back(conn);
        }
    });
}

/// Runs a non-streaming exec whose stdin is too large for the request frame: the
/// process starts with its stdin open, `stdin` follows in [`MAX_CHUNK`] input frames
/// and is then closed, and the output is collected (capped at the spec's
/// `max_output_bytes`, as [`space_proto::client::Call::exec`] does) *while* stdin is
/// written — a process that echoes its input (`cat`) would otherwise block on its
/// full stdout while the worker waits for it to read more.
pub(crate) async fn exec_collect(
    slot: &Arc<Slot>,
    mut spec: ExecSpec,
    stdin: Vec<u8>,
) -> Result<ExecOutput, Refusal> {
    spec.stdin = None;
    let mut caps = spec
        .max_output_bytes
        .map(|n| [OutputCap::new(n), OutputCap::new(n)]);
    let Split {
        id,
        mut writer,
        mut conn,
        first,
    } = start_split(slot, Operation::Exec(spec)).await?;
    let AgentBody::Started { pid } = first else {
        return Err(Refusal::Bridge(format!("unexpected {first:?}")));
    };
    let (mut stdout, mut stderr) = (Vec::new(), Vec::new());
    let feed = async {
        for chunk in stdin.chunks(MAX_CHUNK) {
            send_input(&mut writer, id, Input::Stdin(chunk.to_vec())).await?;
        }
        send_input(&mut writer, id, Input::CloseStdin).await
    };
    let collect = async {
        loop {
            match conn.next_answer_async(id).await? {
                AgentBody::Stdout(c) => match &mut caps {
                    Some([cap, _]) => cap.push(&c, &mut stdout),
                    None => stdout.extend_from_slice(&c),
                },
                AgentBody::Stderr(c) => match &mut caps {
                    Some([_, cap]) => cap.push(&c, &mut stderr),
                    None => stderr.extend_from_slice(&c),
                },
                AgentBody::Exited(status) => return Ok(status),
                other => {
                    return Err(client::ClientError::Unexpected {
                        request: id,
                        what: format!("{other:?}").chars().take(120).collect(),
                    });
                }
            }
        }
    };
    let ended = {
        let mut feed = std::pin::pin!(feed);
        let mut collect = std::pin::pin!(collect);
        let mut fed = false;
        loop {
            tokio::select! {
                // A write that fails (the process exited and the agent went on) is not
                // the outcome: the answers are.
                _ = &mut feed, if !fed => fed = true,
                r = &mut collect => break r,
            }
        }
    };
    let mut status = match ended {
        Ok(status) => status,
        Err(client::ClientError::Agent(e)) => {
            return Err(Refusal::Agent(e));
        }
        Err(e) => return Err(Refusal::Bridge(e.to_string())),
    };
    if let Some([out, err]) = &mut caps {
        out.finish(&mut stdout);
        err.finish(&mut stderr);
        status.stdout_truncated |= out.truncated();
        status.stderr_truncated |= err.truncated();
    }
    Ok(ExecOutput {
        pid,
        stdout,
        stderr,
        status,
    })
}

/// Writes one input frame of request `id`.
pub(crate) async fn send_input(
    writer: &mut OwnedWriteHalf,
    id: RequestId,
    input: Input,
) -> Result<(), client::ClientError> {
    client::write_async(writer, &client::input_frame(id, input)?).await
}

/// `resp` naming the execution that gave it (`space-execution`), checked by the edge
/// and the SDK against the route they sent it on.
pub(crate) fn with_execution(
    mut resp: axum::response::Response,
    slot: &Slot,
) -> axum::response::Response {
    if let Ok(v) = axum::http::HeaderValue::from_str(&slot.record.execution_id.to_string()) {
        resp.headers_mut().insert("space-execution", v);
    }
    resp
}
