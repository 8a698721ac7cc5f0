//! The bridge: accept the worker, verify the guest transport and handshake, then hand
//! the verified agent connection to the worker.

use std::io::{self, Write};
use std::net::Shutdown;
use std::os::fd::AsFd;
use std::os::unix::net::{UnixListener, UnixStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::thread;

use rustix::net::sockopt::socket_peercred;
use space_peer::{
    PeerError, check_socket_path, listening_unix_inode, peer_process, process_holds_socket,
};
use space_proto::codec;
use space_proto::frame;
use space_proto::guest::{
    self, AgentBody, AgentFrame, CONNECTION, ClientFrame, ErrorKind, WireError, verify_proof,
};

pub use crate::error::BridgeError;
use crate::spec::BridgeSpec;
use space_mux::Link;

/// How long the agent may take to answer the hello.
const HANDSHAKE_WAIT: std::time::Duration = std::time::Duration::from_secs(15);

/// Stack size of the bridge's threads: they only move bytes.
const THREAD_STACK: usize = 64 * 1024;

/// Serves the worker until the listener fails. Each connection gets its own thread.
pub fn run(spec: BridgeSpec, listener: UnixListener) -> io::Result<()> {
    run_shared(spec, listener, None)
}

/// [`run`], with the agent reached over `link` (a VM's transport, already verified
/// and activated) when one is given; the bridge may replace the link
/// ([`crate::relink`]): each connection takes the link current when it arrives.
pub fn run_shared(
    spec: BridgeSpec,
    listener: UnixListener,
    link: Option<Arc<crate::relink::SharedLink>>,
) -> io::Result<()> {
    let spec = Arc::new(spec);
    let active = Arc::new(AtomicUsize::new(0));
    for conn in listener.incoming() {
        let conn = match conn {
            Ok(c) => c,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        let spec = Arc::clone(&spec);
        let link = link.clone();
        let active = Arc::clone(&active);
        if active.fetch_add(1, Ordering::AcqRel) >= spec.max_connections {
            active.fetch_sub(1, Ordering::AcqRel);
            refuse(&conn, &spec, &BridgeError::Busy);
            continue;
        }
        let spawned = thread::Builder::new()
            .stack_size(THREAD_STACK)
            .spawn(move || {
                let link = link.map(|l| l.get());
                if let Err(e) = serve(&conn, &spec, link.as_ref()) {
                    log_refusal(&spec, &e);
                    refuse(&conn, &spec, &e);
                    drain(&conn);
                }
                active.fetch_sub(1, Ordering::AcqRel);
            });
        if let Err(e) = spawned {
            eprintln!("spaced-host: cannot start a connection thread: {e}");
        }
    }
    Ok(())
}

fn log_refusal(spec: &BridgeSpec, e: &BridgeError) {
    eprintln!(
        "spaced-host: refused connection sandbox={} generation={} reason=\"{e}\"",
        spec.activation.sandbox, spec.activation.generation
    );
}

/// After a refusal, reads what the client still sends (its hello, typically) until it
/// closes or briefly goes quiet: closing a Unix socket with unread data resets the
/// peer, which could then lose the refusal before reading it.
fn drain(conn: &UnixStream) {
    use std::io::Read;
    let _ = conn.set_read_timeout(Some(std::time::Duration::from_millis(200)));
    let mut sink = [0u8; 4096];
    let mut left = 1usize << 20;
    let mut r = conn;
    while left > 0 {
        match r.read(&mut sink) {
            Ok(0) | Err(_) => break,
            Ok(n) => left = left.saturating_sub(n),
        }
    }
    let _ = conn.shutdown(Shutdown::Both);
}

/// Tells the worker why, as a connection-level agent error, then closes its half.
fn refuse(conn: &UnixStream, spec: &BridgeSpec, e: &BridgeError) {
    let kind = match e {
        BridgeError::Busy => ErrorKind::Busy,
        BridgeError::NotHello | BridgeError::Frame(_) => ErrorKind::Protocol,
        _ => ErrorKind::PermissionDenied,
    };
    let frame = AgentFrame {
        execution_id: spec.activation.execution_id,
        request_id: CONNECTION,
        body: AgentBody::Error(WireError::new(kind, format!("bridge: {e}"))),
    };
    let mut w = conn;
    let _ = frame::write_frame(&mut w, &codec::encode(&frame));
    let _ = conn.shutdown(Shutdown::Write);
}

fn serve(conn: &UnixStream, spec: &BridgeSpec, link: Option<&Link>) -> Result<(), BridgeError> {
    let cred = socket_peercred(conn.as_fd()).map_err(io::Error::from)?;
    if cred.uid.as_raw() != spec.worker_uid {
        return Err(BridgeError::WrongClientUid(cred.uid.as_raw()));
    }
    let mut worker = conn;
    let hello_body = frame::read_frame(&mut worker)?;
    let nonce = match guest::decode_client_frame(&hello_body) {
        Ok(ClientFrame::Hello(h)) => h.nonce,
        _ => return Err(BridgeError::NotHello),
    };

    let mut agent = match link {
        None => open_verified_transport(spec)?,
        Some(link) => crate::serial::open_stream(spec, link)?,
    };
    frame::write_frame(&mut agent, &hello_body)?;
    // A silent agent does not hold this thread: its answer comes in time or never.
    agent.set_read_timeout(Some(HANDSHAKE_WAIT))?;
    let ack_body = frame::read_frame(&mut agent)?;
    agent.set_read_timeout(None)?;
    let ack = match guest::decode_agent_frame(&ack_body) {
        Ok(AgentFrame {
            execution_id,
            request_id: CONNECTION,
            body: AgentBody::HelloAck(ack),
        }) if execution_id == ack.execution_id => ack,
        _ => {
            return Err(BridgeError::Handshake(
                "the agent did not answer with a hello ack",
            ));
        }
    };
    if !verify_proof(&spec.activation.secret, &nonce, &ack) {
        return Err(BridgeError::Handshake(
            "proof does not verify with this activation's secret",
        ));
    }
    if ack.identity() != spec.activation.identity() {
        return Err(BridgeError::Handshake("the agent serves another execution"));
    }
    // The peer again, after the handshake: the same live process must still hold the
    // transport (the VMM, for a link: its peer credentials are the connect's).
    match link {
        None => {
            let (_, peer) = peer_process(agent.as_fd())?;
            spec.agent.verify(&peer.identity)?;
        }
        Some(_) => crate::serial::check_vmm(spec)?,
    }

    worker.write_all(&frame::frame_bytes(&ack_body)?)?;
    hand_over(conn, &agent)
}

/// Passes the verified agent connection to the worker (`SCM_RIGHTS`, with one byte)
/// and steps out of the path: every later byte goes between the worker and the agent
/// directly, on the connection this bridge verified (peer, socket table, proof, peer
/// again). Relaying would cost two more thread wake-ups per request for no check.
/// The bridge's own copy closes when this returns; nothing reconnects.
fn hand_over(worker: &UnixStream, agent: &UnixStream) -> Result<(), BridgeError> {
    use rustix::net::{SendAncillaryBuffer, SendAncillaryMessage, SendFlags, sendmsg};
    use std::mem::MaybeUninit;
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))];
    let mut control = SendAncillaryBuffer::new(&mut space);
    let fds = [agent.as_fd()];
    if !control.push(SendAncillaryMessage::ScmRights(&fds)) {
        return Err(BridgeError::Io(io::Error::other(
            "no room for the descriptor",
        )));
    }
    let sent = sendmsg(
        worker,
        &[io::IoSlice::new(HANDOVER)],
        &mut control,
        SendFlags::empty(),
    )
    .map_err(io::Error::from)?;
    if sent != HANDOVER.len() {
        return Err(BridgeError::Io(io::Error::other("short hand-over")));
    }
    Ok(())
}

/// The byte that carries the agent's descriptor to the worker.
pub const HANDOVER: &[u8] = b"H";

/// Connects to the agent and checks the transport: safe path, the peer is the recorded
/// process, and the kernel's socket table shows that process holding the listener.
fn open_verified_transport(spec: &BridgeSpec) -> Result<UnixStream, BridgeError> {
    check_socket_path(&spec.agent_socket)?;
    let agent = UnixStream::connect(&spec.agent_socket)?;
    let (_, peer) = peer_process(agent.as_fd())?;
    spec.agent.verify(&peer.identity)?;
    let inode = listening_unix_inode(&spec.agent_socket)?;
    if !process_holds_socket(spec.agent.pid, inode)? {
        return Err(PeerError::SocketTable("the recorded agent does not hold the listener").into());
    }
    Ok(agent)
}
