//! One client connection: handshake, then one request at a time, each dispatched to
//! its handler.

use std::os::unix::net::UnixStream;
use std::time::Duration;

use space_proto::frame;
use space_proto::guest::{
    self, AgentBody, CONNECTION, ClientFrame, ErrorKind, HelloAck, Operation, PROTOCOL_VERSION,
    Request, RequestId,
};

use crate::agent::Agent;
use crate::conn::{Conn, End, Flow};
use crate::{exec, files, ports, tree, watch};

/// How long a new connection may take to say hello: a peer that connects and stays
/// silent must not hold a connection slot forever.
const HELLO_TIMEOUT: Duration = Duration::from_secs(10);

/// Serves one connection until the peer closes it or breaks the protocol.
pub(crate) fn serve(stream: UnixStream, agent: &Agent) -> End {
    let mut conn = Conn::new(stream, agent);
    if let Err(end) = handshake(&mut conn) {
        return end;
    }
    loop {
        let body = match frame::read_frame(&mut conn.stream) {
            Ok(b) => b,
            Err(e) => return conn.frame_failed(e),
        };
        let result = match conn.decode(&body) {
            Ok(ClientFrame::Request(Request { id, op })) if id != CONNECTION => {
                let r = dispatch(&mut conn, id, op);
                conn.finished(id);
                r
            }
            Ok(ClientFrame::Request(_)) => {
                Err(conn.refuse(ErrorKind::Protocol, "request id 0 is reserved"))
            }
            Ok(other) => {
                // Input while idle: only late input of the last request is tolerated.
                conn.input_for(None, other).map(|_| ())
            }
            Err(end) => Err(end),
        };
        if let Err(end) = result {
            return end;
        }
    }
}

fn handshake(conn: &mut Conn<'_>) -> Flow {
    conn.stream
        .set_read_timeout(Some(HELLO_TIMEOUT))
        .map_err(|_| End::Gone)?;
    let body = frame::read_frame(&mut conn.stream).map_err(|e| conn.frame_failed(e))?;
    match guest::peek_hello_version(&body) {
        None => return Err(conn.refuse(ErrorKind::Protocol, "expected hello")),
        Some(v) if v != PROTOCOL_VERSION => {
            return Err(conn.refuse(
                ErrorKind::UnsupportedVersion,
                format!(
                    "protocol version {v} is not supported; this agent speaks {PROTOCOL_VERSION}"
                ),
            ));
        }
        Some(_) => {}
    }
    let ClientFrame::Hello(hello) = conn.decode(&body)? else {
        return Err(conn.refuse(ErrorKind::Protocol, "expected hello"));
    };
    conn.stream.set_read_timeout(None).map_err(|_| End::Gone)?;
    let id = conn.agent.identity;
    let ack = HelloAck {
        protocol_version: PROTOCOL_VERSION,
        sandbox: id.sandbox,
        generation: id.execution.generation,
        execution_id: id.execution.id,
        activation: id.activation,
        proof: conn.agent.proof(&hello.nonce),
    };
    conn.send(CONNECTION, AgentBody::HelloAck(ack))
}

fn dispatch(conn: &mut Conn<'_>, id: RequestId, op: Operation) -> Flow {
    match op {
        Operation::Exec(spec) => exec::run(conn, id, spec),
        Operation::Watch { path, recursive } => watch::run(conn, id, &path, recursive),
        Operation::WriteFile {
            path,
            mode,
            parents,
            user,
        } => files::write(conn, id, &path, mode, parents, user.as_ref()),
        Operation::ReadTree { path } => tree::read(conn, id, &path),
        Operation::WriteTree { path, user } => tree::write(conn, id, &path, user.as_ref()),
        Operation::ReadFile {
            path,
            offset,
            max_bytes,
        } => files::read(conn, id, &path, offset, max_bytes),
        Operation::List { path } => files::list(conn, id, &path),
        Operation::AsUser { user, op } => match *op {
            inner @ (Operation::ReadFile { .. }
            | Operation::ReadRange { .. }
            | Operation::List { .. }
            | Operation::Stat { .. }
            | Operation::Remove { .. }) => {
                // The thread acts as the account for the whole operation: every path
                // it opens is opened with the account's rights.
                let acting = match files::as_account(Some(&user)) {
                    Ok(a) => a,
                    Err(e) => return conn.send_error(id, e),
                };
                let flow = dispatch(conn, id, inner);
                drop(acting);
                flow
            }
            other => conn.send_error(
                id,
                guest::WireError::new(
                    ErrorKind::InvalidArgument,
                    format!("not an operation to do as an account: {other:?}"),
                ),
            ),
        },
        Operation::ReadRange { path, range } => files::read_range(conn, id, &path, range),
        Operation::ConnectPort { port } => ports::connect(conn, id, port),
        op => {
            let body = files::simple(conn.agent, op).unwrap_or_else(AgentBody::Error);
            conn.send(id, body)
        }
    }
}
