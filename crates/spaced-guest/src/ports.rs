//! `ConnectPort`: the agent connects to a port on the sandbox's own loopback and hands
//! the client's connection over to it — how netgtw reaches a service port of a
//! sandbox whose network namespace the worker cannot enter (a VM's: its loopback is
//! the guest kernel's). The server may stay on the loopback: nothing is forwarded to
//! a network address.

use std::io::{self, Read, Write};
use std::net::{Ipv4Addr, Shutdown, SocketAddr, TcpStream};
use std::os::unix::net::UnixStream;
use std::time::Duration;

use space_proto::guest::{AgentBody, ErrorKind, RequestId, WireError};

use crate::conn::{Conn, End, Flow};

/// How long connecting to the port may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// Bytes one read of either side moves at most.
const CHUNK: usize = 64 << 10;

/// Connects to `port` on `127.0.0.1`; once connected, answers `PortConnected` and
/// relays bytes both ways until both sides have ended, then ends the connection (it
/// was the port's, not the protocol's, from the answer on).
pub(crate) fn connect(conn: &mut Conn<'_>, id: RequestId, port: u16) -> Flow {
    let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
    let tcp = match TcpStream::connect_timeout(&addr, CONNECT_TIMEOUT) {
        Ok(s) => s,
        Err(e) => {
            let msg = format!("nothing accepts connections on port {port} in the sandbox: {e}");
            return conn.send_error(id, WireError::new(ErrorKind::PortClosed, msg));
        }
    };
    let _ = tcp.set_nodelay(true);
    conn.send(id, AgentBody::PortConnected)?;
    relay(&conn.stream, &tcp);
    Err(End::Gone)
}

/// Copies `client` ↔ `port` until both directions have ended: each end's write side
/// is shut when the other stops sending; a failure either way ends both.
fn relay(client: &UnixStream, port: &TcpStream) {
    let (Ok(client_back), Ok(port_back)) = (client.try_clone(), port.try_clone()) else {
        return;
    };
    let back = std::thread::Builder::new()
        .name("port".into())
        .stack_size(128 << 10)
        .spawn(move || one_way(&port_back, &client_back));
    let Ok(back) = back else {
        return;
    };
    one_way(client, port);
    let _ = back.join();
}

/// Sockets [`one_way`] copies between.
trait Half: Read + Write {
    fn shut(&self, how: Shutdown);
}

impl Half for &UnixStream {
    fn shut(&self, how: Shutdown) {
        let _ = UnixStream::shutdown(self, how);
    }
}

impl Half for &TcpStream {
    fn shut(&self, how: Shutdown) {
        let _ = TcpStream::shutdown(self, how);
    }
}

fn one_way<A, B>(from: A, to: B)
where
    A: Half,
    B: Half,
{
    let (mut from, mut to) = (from, to);
    let mut buf = vec![0u8; CHUNK];
    let ended = loop {
        match from.read(&mut buf) {
            Ok(0) => break Ok(()),
            Ok(n) => {
                if let Err(e) = to.write_all(&buf[..n]) {
                    break Err(e);
                }
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => break Err(e),
        }
    };
    match ended {
        Ok(()) => to.shut(Shutdown::Write),
        Err(_) => {
            // A reset or a broken pipe: nothing more goes either way.
            from.shut(Shutdown::Both);
            to.shut(Shutdown::Both);
        }
    }
}
