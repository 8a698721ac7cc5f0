//! `space port expose|ls|rm|link|forward`: service ports of a sandbox, through the
//! edge, with the SDK.

use std::io::Write as _;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use space_client::{Client, ExposePort, PortList, PortView, Protocol};
use space_identity::SandboxId;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tokio::task::JoinSet;

use super::errors;
use super::output::{print_json, sandbox_id, table};
use crate::args::{Cli, PortCmd};

/// Local connections `space port forward` tunnels at once; more are closed.
pub(crate) const MAX_FORWARDED: usize = 256;

/// Runs a `space port` command; returns the exit code.
pub(crate) async fn run(c: &Client, cli: &Cli, url: &str, cmd: &PortCmd) -> Result<i32, String> {
    let sdk = |e: space_client::Error| errors::describe(&e, url);
    match cmd {
        PortCmd::Expose {
            id,
            port,
            tcp,
            public,
        } => {
            let req = ExposePort {
                port: *port,
                protocol: if *tcp { Protocol::Tcp } else { Protocol::Http },
                public: *public,
            };
            let view = c.expose_port(&sandbox_id(id)?, req).await.map_err(sdk)?;
            if cli.json {
                print_json(&view);
            } else {
                print!("{}", exposed_text(&view));
            }
        }
        PortCmd::Ls { id } => {
            let ports = c.list_ports(&sandbox_id(id)?).await.map_err(sdk)?;
            if cli.json {
                print_json(&PortList { ports });
            } else {
                table(&["PORT", "PROTOCOL", "PUBLIC", "URL"], &port_rows(&ports));
            }
        }
        PortCmd::Rm { id, port } => {
            c.close_port(&sandbox_id(id)?, *port).await.map_err(sdk)?;
        }
        PortCmd::Link { id, port } => {
            let view = c.port_link(&sandbox_id(id)?, *port).await.map_err(sdk)?;
            if cli.json {
                print_json(&view);
            } else {
                let link = view
                    .link
                    .as_deref()
                    .ok_or("unexpected answer: the edge gave no link")?;
                println!("{link}");
            }
        }
        PortCmd::Forward { id, port, local } => {
            let id = sandbox_id(id)?;
            // Before binding: a Ctrl-C from then on ends in a clean stop.
            let stop = crate::daemons::shutdown_signal();
            let listener = TcpListener::bind(local)
                .await
                .map_err(|e| format!("cannot listen on {local}: {e}"))?;
            let at = listener
                .local_addr()
                .map_err(|e| format!("cannot listen on {local}: {e}"))?;
            println!("forwarding {at} -> {id}:{port}");
            let _ = std::io::stdout().flush();
            let forward = Forward {
                client: c.clone(),
                url: url.to_owned(),
                sandbox: id,
                port: *port,
            };
            forward.serve(listener, MAX_FORWARDED, stop).await;
        }
    }
    Ok(0)
}

/// What `space port expose` prints: the URL, then the token and the one-time link
/// when the answer has them, one a line.
fn exposed_text(v: &PortView) -> String {
    let mut out = format!("{}\n", v.url);
    if let Some(t) = &v.token {
        out.push_str(&format!("token: {t}\n"));
    }
    if let Some(l) = &v.link {
        out.push_str(&format!("link:  {l}\n"));
    }
    out
}

fn port_rows(ports: &[PortView]) -> Vec<Vec<String>> {
    ports
        .iter()
        .map(|p| {
            vec![
                p.port.to_string(),
                p.protocol.as_str().to_owned(),
                if p.public { "yes" } else { "no" }.to_owned(),
                p.url.clone(),
            ]
        })
        .collect()
}

/// A line on stderr (never a panic when stderr goes nowhere: the forwarder keeps
/// running).
fn say(line: std::fmt::Arguments<'_>) {
    let _ = writeln!(std::io::stderr(), "space: {line}");
}

/// `space port forward`: local connections, each tunnelled to one port of a sandbox.
#[derive(Debug, Clone)]
struct Forward {
    client: Client,
    /// The edge's URL, for error messages.
    url: String,
    sandbox: SandboxId,
    port: u16,
}

impl Forward {
    /// Accepts on `listener` until `stop`, with at most `limit` tunnels at once (a
    /// connection over it is closed at once). Tunnels still open at `stop` are closed.
    async fn serve(
        &self,
        listener: TcpListener,
        limit: usize,
        stop: impl std::future::Future<Output = ()>,
    ) {
        let open = Arc::new(Semaphore::new(limit));
        let mut tunnels = JoinSet::new();
        let mut stop = std::pin::pin!(stop);
        loop {
            tokio::select! {
                () = &mut stop => break,
                Some(_) = tunnels.join_next(), if !tunnels.is_empty() => {}
                accepted = listener.accept() => {
                    let (local, peer) = match accepted {
                        Ok(a) => a,
                        Err(e) => {
                            // Out of descriptors, most likely: let some close.
                            say(format_args!("cannot accept a connection: {e}"));
                            tokio::time::sleep(Duration::from_millis(100)).await;
                            continue;
                        }
                    };
                    let Ok(permit) = Arc::clone(&open).try_acquire_owned() else {
                        say(format_args!(
                            "closed the connection from {peer}: {limit} are open already"
                        ));
                        drop(local);
                        continue;
                    };
                    let this = self.clone();
                    tunnels.spawn(async move {
                        this.tunnel(local, peer).await;
                        drop(permit);
                    });
                }
            }
        }
        tunnels.shutdown().await;
    }

    /// Opens a tunnel for one local connection and copies both ways until both
    /// sides are done; a tunnel that cannot be opened closes the local connection.
    async fn tunnel(&self, mut local: TcpStream, peer: SocketAddr) {
        let _ = local.set_nodelay(true);
        let mut tunnel = match self.client.connect_port(&self.sandbox, self.port).await {
            Ok(t) => t,
            Err(e) => {
                say(format_args!(
                    "cannot open a tunnel to {}:{} for {peer}: {}",
                    self.sandbox,
                    self.port,
                    errors::describe(&e, &self.url)
                ));
                return;
            }
        };
        // A reset on either side ends the copy; there is nothing to report.
        let _ = tokio::io::copy_bidirectional(&mut local, &mut tunnel).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    fn view(token: Option<&str>, link: Option<&str>) -> PortView {
        PortView {
            port: 8000,
            protocol: Protocol::Http,
            public: false,
            url: "http://8000-sbx_a.localhost:7070/".into(),
            created_at: 1,
            token: token.map(str::to_owned),
            link: link.map(str::to_owned),
        }
    }

    #[test]
    fn expose_prints_the_url_first_then_the_token_and_the_link() {
        assert_eq!(
            exposed_text(&view(Some("pt_1"), Some("http://l/?space_link=x"))),
            "http://8000-sbx_a.localhost:7070/\ntoken: pt_1\nlink:  http://l/?space_link=x\n"
        );
        assert_eq!(
            exposed_text(&view(None, None)),
            "http://8000-sbx_a.localhost:7070/\n"
        );
    }

    #[test]
    fn ls_rows_are_port_protocol_public_url() {
        let mut tcp = view(None, None);
        tcp.port = 5432;
        tcp.protocol = Protocol::Tcp;
        tcp.public = true;
        assert_eq!(
            port_rows(&[view(None, None), tcp]),
            vec![
                vec!["8000", "http", "no", "http://8000-sbx_a.localhost:7070/"],
                vec!["5432", "tcp", "yes", "http://8000-sbx_a.localhost:7070/"],
            ]
        );
    }

    /// A local stand-in for the edge's CONNECT, to drive the forwarder: a tunnel to
    /// port 7 echoes, one to any other port is refused with `port_not_exposed`.
    async fn connect_server() -> SocketAddr {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        tokio::spawn(async move {
            loop {
                let Ok((mut s, _)) = listener.accept().await else {
                    return;
                };
                tokio::spawn(async move {
                    let mut head = Vec::new();
                    let mut b = [0u8; 1];
                    while !head.ends_with(b"\r\n\r\n") && head.len() < 16 * 1024 {
                        match s.read(&mut b).await {
                            Ok(1) => head.push(b[0]),
                            _ => return,
                        }
                    }
                    let head = String::from_utf8_lossy(&head).into_owned();
                    if !head.lines().next().unwrap_or_default().contains(":7 ") {
                        let body =
                            r#"{"error":"port_not_exposed","message":"port is not exposed"}"#;
                        let answer = format!(
                            "HTTP/1.1 404 Not Found\r\ncontent-length: {}\r\n\r\n{body}",
                            body.len()
                        );
                        let _ = s.write_all(answer.as_bytes()).await;
                        return;
                    }
                    let _ = s.write_all(b"HTTP/1.1 200 OK\r\n\r\n").await;
                    let (mut r, mut w) = s.split();
                    let _ = tokio::io::copy(&mut r, &mut w).await;
                });
            }
        });
        addr
    }

    /// A forwarder of port `port` to the server at `edge`, with at most `limit`
    /// tunnels; its local address and the sender that stops it.
    async fn forwarder(
        edge: SocketAddr,
        port: u16,
        limit: usize,
    ) -> (SocketAddr, tokio::sync::oneshot::Sender<()>) {
        let f = Forward {
            client: Client::new(&format!("http://{edge}"), "k"),
            url: format!("http://{edge}"),
            sandbox: SandboxId::from_bytes([1; 16]),
            port,
        };
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let at = listener.local_addr().expect("addr");
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        tokio::spawn(async move {
            f.serve(listener, limit, async {
                let _ = rx.await;
            })
            .await;
        });
        (at, tx)
    }

    async fn echoes(s: &mut TcpStream, what: &[u8]) -> bool {
        if s.write_all(what).await.is_err() {
            return false;
        }
        let mut back = vec![0u8; what.len()];
        let read = tokio::time::timeout(Duration::from_secs(5), s.read_exact(&mut back)).await;
        matches!(read, Ok(Ok(_))) && back == what
    }

    /// Whether the other side closed `s` (within 5 s).
    async fn closed(s: &mut TcpStream) -> bool {
        let mut b = [0u8; 1];
        matches!(
            tokio::time::timeout(Duration::from_secs(5), s.read(&mut b)).await,
            Ok(Ok(0) | Err(_))
        )
    }

    #[tokio::test]
    async fn each_local_connection_is_a_tunnel_of_its_own_both_ways() {
        let (at, _stop) = forwarder(connect_server().await, 7, 4).await;
        let mut a = TcpStream::connect(at).await.expect("connect");
        let mut b = TcpStream::connect(at).await.expect("connect");
        assert!(echoes(&mut a, b"from a").await);
        assert!(echoes(&mut b, b"from b").await);
        assert!(echoes(&mut a, &vec![b'x'; 256 * 1024]).await);
    }

    #[tokio::test]
    async fn a_refused_tunnel_closes_its_local_connection_and_the_forwarder_keeps_running() {
        let edge = connect_server().await;
        let (at, _stop) = forwarder(edge, 8, 4).await;
        let mut refused = TcpStream::connect(at).await.expect("connect");
        assert!(closed(&mut refused).await);
        let mut again = TcpStream::connect(at).await.expect("still listening");
        assert!(closed(&mut again).await);
    }

    #[tokio::test]
    async fn a_connection_over_the_limit_is_closed_and_a_freed_place_is_taken_again() {
        let (at, _stop) = forwarder(connect_server().await, 7, 2).await;
        let mut first = TcpStream::connect(at).await.expect("connect");
        let mut second = TcpStream::connect(at).await.expect("connect");
        assert!(echoes(&mut first, b"1").await && echoes(&mut second, b"2").await);
        let mut third = TcpStream::connect(at).await.expect("connect");
        assert!(closed(&mut third).await, "a third tunnel over a limit of 2");
        drop(first);
        // The first tunnel's end frees its place.
        let mut freed = false;
        for _ in 0..50 {
            let mut next = TcpStream::connect(at).await.expect("connect");
            if echoes(&mut next, b"4").await {
                freed = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert!(freed, "no place came free after a tunnel closed");
        assert!(echoes(&mut second, b"2 still").await);
    }

    #[tokio::test]
    async fn stopping_the_forwarder_closes_its_tunnels_and_its_listener() {
        let (at, stop) = forwarder(connect_server().await, 7, 4).await;
        let mut open = TcpStream::connect(at).await.expect("connect");
        assert!(echoes(&mut open, b"up").await);
        stop.send(()).expect("stop");
        assert!(closed(&mut open).await);
        let mut refused = false;
        for _ in 0..50 {
            if TcpStream::connect(at).await.is_err() {
                refused = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert!(refused, "the listener still accepts after the stop");
    }
}
