//! Firecracker's hybrid vsock: the host reaches a guest's vsock port through the
//! VMM's Unix socket by asking for it (`CONNECT <port>\n`, in one write) and reading
//! `OK <host port>\n`; from then on the stream is the guest's. A guest port nobody
//! listens on ends the stream without an `OK`. Every read is bounded and timed.
//!
//! The bridge's vsock transport ([`connect_agent`], a Firecracker VM's) is the serial
//! transport's flow over such a stream: the VMM verified as the socket's peer, then
//! the guest activated over one `space-mux` link for the bridge's life.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

use space_mux::Link;
use space_proto::vm;

use crate::error::BridgeError;
use crate::spec::BridgeSpec;

/// How long the VMM may take to acknowledge a `CONNECT`.
const HANDSHAKE_WAIT: Duration = Duration::from_secs(10);

/// Longest acknowledgement line read (`OK ` and a `u32`, with room to spare).
const MAX_ACK: usize = 32;

/// Why a hybrid vsock connection was not made.
#[derive(Debug, thiserror::Error)]
pub enum VsockError {
    /// The VMM's socket could not be reached or the stream failed.
    #[error("vsock socket: {0}")]
    Io(#[from] std::io::Error),
    /// The stream ended before an acknowledgement: nothing listens on the port.
    #[error("nothing listens on vsock port {0} in the guest")]
    NoListener(u32),
    /// The VMM answered something else.
    #[error("vsock: unexpected acknowledgement {0:?}")]
    Unexpected(String),
}

/// Connects to guest port `port` through the hybrid vsock socket at `path`; the
/// stream once acknowledged, and the host-side port the VMM gave it.
pub fn connect(path: &Path, port: u32, timeout: Duration) -> Result<(UnixStream, u32), VsockError> {
    let stream = UnixStream::connect(path)?;
    handshake(stream, port, timeout)
}

/// The `CONNECT` exchange on a connected `stream`.
pub fn handshake(
    mut stream: UnixStream,
    port: u32,
    timeout: Duration,
) -> Result<(UnixStream, u32), VsockError> {
    stream.set_read_timeout(Some(timeout))?;
    stream.set_write_timeout(Some(timeout))?;
    stream.write_all(format!("CONNECT {port}\n").as_bytes())?;
    // Byte by byte up to the newline: nothing of the guest's stream is read past it.
    let mut line = Vec::with_capacity(MAX_ACK);
    loop {
        let mut b = [0u8; 1];
        match stream.read(&mut b)? {
            0 if line.is_empty() => return Err(VsockError::NoListener(port)),
            0 => {
                return Err(VsockError::Unexpected(
                    String::from_utf8_lossy(&line).into_owned(),
                ));
            }
            _ if b[0] == b'\n' => break,
            _ if line.len() >= MAX_ACK => {
                return Err(VsockError::Unexpected(format!(
                    "{}… (over {MAX_ACK} bytes)",
                    String::from_utf8_lossy(&line)
                )));
            }
            _ => line.push(b[0]),
        }
    }
    let text = String::from_utf8_lossy(&line).into_owned();
    let host_port = text
        .strip_prefix("OK ")
        .and_then(|p| p.parse::<u32>().ok())
        .ok_or_else(|| VsockError::Unexpected(text.clone()))?;
    stream.set_read_timeout(None)?;
    stream.set_write_timeout(None)?;
    Ok((stream, host_port))
}

/// The bridge's vsock transport: connects to the VMM's hybrid vsock socket
/// (`agent_socket`), verifies it as [`crate::serial`] verifies QEMU — its directory
/// reachable only by this uid and the VMM's, its peer the recorded VMM process (PID,
/// start time, executable, uid, pidfd), that process holding the listener there in its
/// network namespace's socket table — asks for the guest's [`vm::VSOCK_PORT`], and
/// activates the guest: the link, once `ready`. A guest still booting has no listener
/// yet (the VMM closes the stream without an `OK`): asked again, each time on a new
/// connection verified anew, until `ready_wait` has passed.
pub fn connect_agent(spec: &BridgeSpec, ready_wait: Duration) -> Result<Link, BridgeError> {
    let deadline = std::time::Instant::now() + ready_wait;
    loop {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        match connect_once(spec, left.min(HANDSHAKE_WAIT)) {
            Ok(stream) => {
                let left = deadline.saturating_duration_since(std::time::Instant::now());
                return crate::serial::activate(stream, spec, left.max(Duration::from_secs(1)));
            }
            Err(Attempt::Again(e)) if std::time::Instant::now() < deadline => {
                let _ = e;
                std::thread::sleep(Duration::from_millis(50));
            }
            Err(Attempt::Again(e) | Attempt::Refused(e)) => return Err(e),
        }
    }
}

/// Why one attempt failed: worth another (nothing listens yet, a VMM slow to answer),
/// or not (the socket or its peer is not the recorded VMM's).
enum Attempt {
    Again(BridgeError),
    Refused(BridgeError),
}

fn connect_once(spec: &BridgeSpec, wait: Duration) -> Result<UnixStream, Attempt> {
    let refused = |e: BridgeError| Attempt::Refused(e);
    space_peer::check_vmm_socket_path(&spec.agent_socket, spec.agent.uid)
        .map_err(|e| refused(e.into()))?;
    let stream = UnixStream::connect(&spec.agent_socket).map_err(|e| refused(e.into()))?;
    crate::serial::verify_peer(&stream, spec).map_err(refused)?;
    let listens = space_peer::process_listens_at(spec.agent.pid, &spec.agent_socket)
        .map_err(|e| refused(e.into()))?;
    if !listens {
        return Err(refused(
            space_peer::PeerError::SocketTable("the recorded VMM does not hold the vsock socket")
                .into(),
        ));
    }
    match handshake(stream, vm::VSOCK_PORT, wait.max(Duration::from_millis(100))) {
        Ok((stream, _)) => Ok(stream),
        Err(e @ VsockError::NoListener(_)) => Err(Attempt::Again(BridgeError::Io(
            std::io::Error::other(e.to_string()),
        ))),
        Err(VsockError::Io(e))
            if matches!(
                e.kind(),
                std::io::ErrorKind::WouldBlock
                    | std::io::ErrorKind::TimedOut
                    | std::io::ErrorKind::ConnectionReset
            ) =>
        {
            Err(Attempt::Again(BridgeError::Io(e)))
        }
        Err(VsockError::Io(e)) => Err(refused(BridgeError::Io(e))),
        Err(other) => Err(refused(BridgeError::Io(std::io::Error::other(
            other.to_string(),
        )))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::net::UnixListener;

    /// A stand-in for the VMM's end (Firecracker does not run on this host class):
    /// reads the request line, answers `answer`, then (with `echo`) echoes five bytes
    /// before it closes.
    fn vmm(
        answer: &'static [u8],
        echo: bool,
    ) -> (
        tempfile::TempDir,
        std::path::PathBuf,
        std::thread::JoinHandle<String>,
    ) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("v.sock");
        let listener = UnixListener::bind(&path).unwrap();
        let server = std::thread::spawn(move || {
            let (mut s, _) = listener.accept().unwrap();
            let mut got = Vec::new();
            let mut b = [0u8; 1];
            while s.read(&mut b).unwrap() == 1 && b[0] != b'\n' {
                got.push(b[0]);
            }
            let _ = s.write_all(answer);
            let mut rest = [0u8; 5];
            if echo && s.read_exact(&mut rest).is_ok() {
                let _ = s.write_all(&rest);
            }
            String::from_utf8(got).unwrap()
        });
        (dir, path, server)
    }

    #[test]
    fn an_acknowledged_connection_is_the_guests_stream_from_the_next_byte() {
        // The acknowledgement and the guest's first bytes arrive together.
        let (_d, path, server) = vmm(b"OK 1073741824\nfirst", false);
        let (mut s, host_port) = connect(&path, 1024, Duration::from_secs(5)).unwrap();
        assert_eq!(host_port, 1 << 30);
        assert_eq!(server.join().unwrap(), "CONNECT 1024");
        let mut first = [0u8; 5];
        s.read_exact(&mut first).unwrap();
        assert_eq!(&first, b"first");
    }

    #[test]
    fn the_request_names_the_port() {
        let (_d, path, server) = vmm(b"OK 7\n", true);
        let (mut s, _) = connect(&path, 52, Duration::from_secs(5)).unwrap();
        s.write_all(b"hello").unwrap();
        let mut back = [0u8; 5];
        s.read_exact(&mut back).unwrap();
        assert_eq!(&back, b"hello");
        assert_eq!(server.join().unwrap(), "CONNECT 52");
    }

    #[test]
    fn no_listener_garbage_and_an_endless_line_are_refused() {
        let (_d, path, _s) = vmm(b"", false);
        assert!(matches!(
            connect(&path, 1, Duration::from_secs(5)),
            Err(VsockError::NoListener(1))
        ));
        let (_d, path, _s) = vmm(b"NO 5\n", false);
        assert!(matches!(
            connect(&path, 1, Duration::from_secs(5)),
            Err(VsockError::Unexpected(_))
        ));
        let (_d, path, _s) = vmm(&[b'O'; 100], false);
        assert!(matches!(
            connect(&path, 1, Duration::from_secs(5)),
            Err(VsockError::Unexpected(_))
        ));
    }
}
