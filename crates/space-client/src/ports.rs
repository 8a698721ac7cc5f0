//! Service ports: exposing a port of a sandbox, listing and closing them, one-time
//! browser links (all through the edge), and raw TCP tunnels to a port through the
//! edge's `CONNECT`.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::{Buf, Bytes};
use hyper::{Method, StatusCode};
use space_http::CallError;
use space_identity::SandboxId;
use space_proto::api::ports::{ExposePort, PortList, PortView};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::TcpStream;

use super::{Answer, Client, Error, api_error, decode};

/// Longest head of the edge's answer to a `CONNECT` (status line and headers); a
/// longer one is refused.
pub const MAX_CONNECT_HEAD: usize = 16 * 1024;

/// Most bytes of a refusal's body kept (its JSON error).
const MAX_REFUSAL_BODY: usize = 64 * 1024;

/// Longest wait for the edge to connect and answer a tunnel's `CONNECT`.
const TUNNEL_OPEN_TIMEOUT: Duration = Duration::from_secs(30);

/// The credential a tunnel is opened with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PortCredential<'a> {
    /// The client's API key (`Authorization: Bearer …`): the sandbox's owner.
    ApiKey,
    /// The port's access token (`X-Space-Port-Token`), from [`PortView::token`].
    Token(&'a str),
    /// None: a public port.
    Public,
}

impl Client {
    /// Exposes port `req.port` of a sandbox: the answer carries the port's URL, its
    /// access token and a one-time browser link. Exposing a port again replaces it
    /// (and its token).
    pub async fn expose_port(
        &self,
        sandbox: &SandboxId,
        req: ExposePort,
    ) -> Result<PortView, Error> {
        let path = format!("/v1/sandboxes/{sandbox}/ports");
        decode(&self.edge_json(Method::POST, &path, &req).await?)
    }

    /// The exposed ports of a sandbox, by port (without tokens or links).
    pub async fn list_ports(&self, sandbox: &SandboxId) -> Result<Vec<PortView>, Error> {
        let path = format!("/v1/sandboxes/{sandbox}/ports");
        let list: PortList = decode(&self.edge(Method::GET, &path, None, Bytes::new()).await?)?;
        Ok(list.ports)
    }

    /// Closes an exposed port (`404 port_not_exposed` when it was not).
    pub async fn close_port(&self, sandbox: &SandboxId, port: u16) -> Result<(), Error> {
        let path = format!("/v1/sandboxes/{sandbox}/ports/{port}");
        self.edge(Method::DELETE, &path, None, Bytes::new())
            .await
            .map(drop)
    }

    /// A new one-time browser link to an exposed port (in [`PortView::link`]; the
    /// token is not repeated).
    pub async fn port_link(&self, sandbox: &SandboxId, port: u16) -> Result<PortView, Error> {
        let path = format!("/v1/sandboxes/{sandbox}/ports/{port}/links");
        decode(&self.edge(Method::POST, &path, None, Bytes::new()).await?)
    }

    /// A raw byte tunnel to `port` inside a sandbox, through the edge, with the API
    /// key. The edge checks the port is exposed and reaches it through the worker's
    /// netgtw; a refusal is [`Error::Api`] with the edge's error.
    pub async fn connect_port(&self, sandbox: &SandboxId, port: u16) -> Result<PortTunnel, Error> {
        self.connect_port_with(sandbox, port, PortCredential::ApiKey)
            .await
    }

    /// [`Client::connect_port`] with another credential: a port's access token, or
    /// none for a public port.
    pub async fn connect_port_with(
        &self,
        sandbox: &SandboxId,
        port: u16,
        credential: PortCredential<'_>,
    ) -> Result<PortTunnel, Error> {
        let credential = match credential {
            PortCredential::ApiKey => Some(("Authorization", self.inner.bearer.as_str())),
            PortCredential::Token(t) => Some(("X-Space-Port-Token", t)),
            PortCredential::Public => None,
        };
        let request = connect_request(sandbox, port, credential)?;
        let edge = edge_authority(&self.inner.url)?;
        let open = async {
            let mut stream = TcpStream::connect(&edge)
                .await
                .map_err(|e| CallError::Connect(format!("{edge}: {e}")))?;
            let _ = stream.set_nodelay(true);
            stream
                .write_all(request.as_bytes())
                .await
                .map_err(|e| CallError::Transport(e.to_string()))?;
            let leftover = read_connect_answer(&mut stream).await?;
            Ok(PortTunnel { leftover, stream })
        };
        match tokio::time::timeout(TUNNEL_OPEN_TIMEOUT, open).await {
            Ok(r) => r,
            Err(_) => Err(Error::Transport(CallError::Timeout)),
        }
    }
}

/// `CONNECT {sandbox}:{port}` with `credential` (a header name and value).
fn connect_request(
    sandbox: &SandboxId,
    port: u16,
    credential: Option<(&str, &str)>,
) -> Result<String, Error> {
    let mut req = format!("CONNECT {sandbox}:{port} HTTP/1.1\r\nHost: {sandbox}:{port}\r\n");
    if let Some((name, value)) = credential {
        // A value with a line break would add headers of its own.
        if value.bytes().any(|b| b.is_ascii_control()) {
            return Err(Error::Stream("the credential is not a header value".into()));
        }
        req.push_str(&format!("{name}: {value}\r\n"));
    }
    req.push_str("\r\n");
    Ok(req)
}

/// `host:port` of an `http://` base URL (port 80 when it names none).
fn edge_authority(url: &str) -> Result<String, Error> {
    let bad = |why: &str| Error::Transport(CallError::Url(format!("{url}: {why}")));
    let rest = match url.split_once("://") {
        Some(("http", rest)) => rest,
        Some((scheme, _)) => {
            return Err(bad(&format!(
                "port tunnels need an http:// edge URL, not {scheme}://"
            )));
        }
        None => return Err(bad("no scheme")),
    };
    let authority = rest.split(['/', '?', '#']).next().unwrap_or_default();
    let authority = authority.rsplit('@').next().unwrap_or_default();
    if authority.is_empty() {
        return Err(bad("no host"));
    }
    // `[::1]:7070`, `[::1]`, `host:7070`, `host`.
    let has_port = match authority.rfind(']') {
        Some(close) => authority[close..].contains(':'),
        None => authority.contains(':'),
    };
    Ok(if has_port {
        authority.to_owned()
    } else {
        format!("{authority}:80")
    })
}

/// Reads the edge's answer to a `CONNECT` from `stream`: for `200`, the bytes that
/// came after the head (the first tunnel data); for any other status, the refusal as
/// an error (its JSON error body read up to its `Content-Length`, at most 64 KiB). A
/// head over [`MAX_CONNECT_HEAD`] is refused.
pub(crate) async fn read_connect_answer<S>(stream: &mut S) -> Result<Bytes, Error>
where
    S: AsyncRead + Unpin,
{
    let mut buf: Vec<u8> = Vec::with_capacity(4096);
    let mut chunk = [0u8; 4096];
    let head_len = loop {
        let searched = buf.len().saturating_sub(3);
        let n = stream
            .read(&mut chunk)
            .await
            .map_err(|e| CallError::Transport(e.to_string()))?;
        if n == 0 {
            return Err(Error::Transport(CallError::Transport(format!(
                "the edge closed the connection after {} bytes of its answer to CONNECT",
                buf.len()
            ))));
        }
        buf.extend_from_slice(&chunk[..n]);
        if let Some(at) = find_head_end(&buf, searched) {
            if at > MAX_CONNECT_HEAD {
                return Err(head_too_long());
            }
            break at;
        }
        if buf.len() >= MAX_CONNECT_HEAD {
            return Err(head_too_long());
        }
    };
    let head = parse_head(&buf[..head_len])?;
    let rest = Bytes::from(buf).slice(head_len..);
    if head.status == StatusCode::OK {
        return Ok(rest);
    }
    // A refusal: its body, to its length (or the connection's end), bounded.
    let want = head
        .content_length
        .unwrap_or(MAX_REFUSAL_BODY)
        .min(MAX_REFUSAL_BODY);
    let mut body = rest[..rest.len().min(want)].to_vec();
    while body.len() < want {
        let n = stream
            .read(&mut chunk[..(want - body.len()).min(4096)])
            .await
            .map_err(|e| CallError::Transport(e.to_string()))?;
        if n == 0 {
            break;
        }
        body.extend_from_slice(&chunk[..n]);
    }
    Err(api_error(&Answer {
        status: head.status,
        headers: Default::default(),
        body: Bytes::from(body),
    }))
}

fn head_too_long() -> Error {
    Error::Decode(format!(
        "the edge's answer to CONNECT has a head over {} KiB",
        MAX_CONNECT_HEAD / 1024
    ))
}

/// The length of the head (through its blank line) in `buf`, looking from `from`.
fn find_head_end(buf: &[u8], from: usize) -> Option<usize> {
    buf.get(from..)?
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .map(|i| from + i + 4)
}

/// What the CONNECT answer's head says.
#[derive(Debug)]
struct Head {
    status: StatusCode,
    content_length: Option<usize>,
}

fn parse_head(head: &[u8]) -> Result<Head, Error> {
    let bad = |why: &str| Error::Decode(format!("the edge's answer to CONNECT: {why}"));
    let text = std::str::from_utf8(head).map_err(|_| bad("a head that is not text"))?;
    let mut lines = text.split("\r\n");
    let status_line = lines.next().unwrap_or_default();
    let mut parts = status_line.splitn(3, ' ');
    let (version, code) = (parts.next(), parts.next());
    if !matches!(version, Some("HTTP/1.1" | "HTTP/1.0")) {
        return Err(bad(&format!("not an HTTP/1 status line: {status_line:?}")));
    }
    let status = code
        .filter(|c| c.len() == 3)
        .and_then(|c| c.parse::<u16>().ok())
        .and_then(|c| StatusCode::from_u16(c).ok())
        .ok_or_else(|| bad(&format!("no status in {status_line:?}")))?;
    let mut content_length = None;
    for line in lines.filter(|l| !l.is_empty()) {
        let (name, value) = line
            .split_once(':')
            .ok_or_else(|| bad(&format!("a header line without a colon: {line:?}")))?;
        if name.trim().eq_ignore_ascii_case("content-length") {
            let n = value
                .trim()
                .parse::<usize>()
                .map_err(|_| bad(&format!("Content-Length {:?}", value.trim())))?;
            content_length = Some(n);
        }
    }
    Ok(Head {
        status,
        content_length,
    })
}

/// A raw byte tunnel to a port inside a sandbox ([`Client::connect_port`]): what is
/// written reaches the port, what the port sends is read. Bytes the edge sent right
/// after its answer are read first.
#[derive(Debug)]
pub struct PortTunnel {
    leftover: Bytes,
    stream: TcpStream,
}

impl PortTunnel {
    /// The local address of the connection to the edge.
    pub fn local_addr(&self) -> io::Result<std::net::SocketAddr> {
        self.stream.local_addr()
    }
}

impl AsyncRead for PortTunnel {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if !this.leftover.is_empty() {
            let n = this.leftover.len().min(buf.remaining());
            buf.put_slice(&this.leftover[..n]);
            this.leftover.advance(n);
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut this.stream).poll_read(cx, buf)
    }
}

impl AsyncWrite for PortTunnel {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().stream).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::SocketAddr;
    use tokio::net::TcpListener;
    use tokio::sync::oneshot;

    fn sandbox() -> SandboxId {
        SandboxId::from_bytes([7; 16])
    }

    /// A local server that takes one connection, reads the CONNECT request's head,
    /// hands it over, then writes `chunks` one by one (a pause between them, so each
    /// arrives in a read of its own) and echoes what it reads after that.
    async fn canned_edge(chunks: Vec<Vec<u8>>) -> (SocketAddr, oneshot::Receiver<String>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let (tx, rx) = oneshot::channel();
        tokio::spawn(async move {
            let (mut s, _) = listener.accept().await.expect("accept");
            s.set_nodelay(true).expect("nodelay");
            let mut req = Vec::new();
            let mut byte = [0u8; 1];
            while !req.ends_with(b"\r\n\r\n") && req.len() < 64 * 1024 {
                if s.read(&mut byte).await.expect("read") == 0 {
                    break;
                }
                req.push(byte[0]);
            }
            let _ = tx.send(String::from_utf8_lossy(&req).into_owned());
            for c in chunks {
                s.write_all(&c).await.expect("write");
                s.flush().await.expect("flush");
                tokio::time::sleep(Duration::from_millis(30)).await;
            }
            let mut buf = [0u8; 1024];
            loop {
                match s.read(&mut buf).await {
                    Ok(0) | Err(_) => break,
                    Ok(n) => {
                        if s.write_all(&buf[..n]).await.is_err() {
                            break;
                        }
                    }
                }
            }
        });
        (addr, rx)
    }

    fn client(addr: SocketAddr) -> Client {
        Client::new(&format!("http://{addr}/"), "space_key")
    }

    async fn read_exactly(t: &mut PortTunnel, n: usize) -> Vec<u8> {
        let mut out = vec![0u8; n];
        t.read_exact(&mut out).await.expect("tunnel bytes");
        out
    }

    #[tokio::test]
    async fn a_head_split_across_reads_opens_the_tunnel_and_the_bytes_after_it_come_first() {
        let (addr, request) = canned_edge(vec![
            b"HTTP/1.1 200 OK\r\nConn".to_vec(),
            b"ection: upgrade\r\n\r".to_vec(),
            b"\nearly".to_vec(),
            b" late".to_vec(),
        ])
        .await;
        let mut t = client(addr)
            .connect_port(&sandbox(), 8080)
            .await
            .expect("tunnel");
        let s = sandbox();
        assert_eq!(
            request.await.expect("request"),
            format!(
                "CONNECT {s}:8080 HTTP/1.1\r\nHost: {s}:8080\r\n\
                 Authorization: Bearer space_key\r\n\r\n"
            )
        );
        assert_eq!(read_exactly(&mut t, 5).await, b"early");
        assert_eq!(read_exactly(&mut t, 5).await, b" late");
        t.write_all(b"ping").await.expect("write");
        assert_eq!(read_exactly(&mut t, 4).await, b"ping");
    }

    #[tokio::test]
    async fn bytes_that_arrive_with_the_head_are_kept_as_tunnel_data() {
        let (addr, _request) =
            canned_edge(vec![b"HTTP/1.1 200 OK\r\n\r\nhello from the port".to_vec()]).await;
        let mut t = client(addr)
            .connect_port(&sandbox(), 5432)
            .await
            .expect("tunnel");
        assert_eq!(read_exactly(&mut t, 19).await, b"hello from the port");
    }

    /// `HTTP/1.1 200 OK\r\n`, padding headers, `\r\n`: a head of exactly `len` bytes.
    fn head_of(len: usize) -> Vec<u8> {
        let mut head = b"HTTP/1.1 200 OK\r\n".to_vec();
        let pad = len - head.len() - "X-Pad: \r\n\r\n".len();
        head.extend_from_slice(b"X-Pad: ");
        head.extend(std::iter::repeat_n(b'a', pad));
        head.extend_from_slice(b"\r\n\r\n");
        assert_eq!(head.len(), len);
        head
    }

    /// `head` in two writes, the first of 100 bytes: the reads that follow end past
    /// the head's blank line, so the bound is checked on a head found whole.
    fn in_two(head: Vec<u8>) -> Vec<Vec<u8>> {
        vec![head[..100].to_vec(), head[100..].to_vec()]
    }

    #[tokio::test]
    async fn a_head_of_16_kib_is_read_and_one_byte_more_is_refused() {
        let mut ok = in_two(head_of(MAX_CONNECT_HEAD));
        ok.push(b"x".to_vec());
        let (addr, _r) = canned_edge(ok).await;
        let mut t = client(addr)
            .connect_port(&sandbox(), 80)
            .await
            .expect("a 16 KiB head is fine");
        assert_eq!(read_exactly(&mut t, 1).await, b"x");

        for chunks in [
            vec![head_of(MAX_CONNECT_HEAD + 1)],
            in_two(head_of(MAX_CONNECT_HEAD + 1)),
        ] {
            let (addr, _r) = canned_edge(chunks).await;
            let e = client(addr)
                .connect_port(&sandbox(), 80)
                .await
                .expect_err("over 16 KiB");
            assert!(
                matches!(&e, Error::Decode(m) if m.contains("over 16 KiB")),
                "{e}"
            );
        }
    }

    #[tokio::test]
    async fn a_head_that_never_ends_is_refused_at_16_kib() {
        let endless: Vec<Vec<u8>> = std::iter::once(b"HTTP/1.1 200 OK\r\n".to_vec())
            .chain(
                (0..40).map(|_| b"X-Pad: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\r\n".repeat(20)),
            )
            .collect();
        let (addr, _r) = canned_edge(endless).await;
        let e = client(addr)
            .connect_port(&sandbox(), 80)
            .await
            .expect_err("endless head");
        assert!(
            matches!(&e, Error::Decode(m) if m.contains("over 16 KiB")),
            "{e}"
        );
    }

    #[tokio::test]
    async fn a_refusal_surfaces_the_edges_json_error_read_to_its_content_length() {
        let body = br#"{"error":"port_not_exposed","message":"port 8081 is not exposed"}"#;
        let head = format!(
            "HTTP/1.1 404 Not Found\r\ncontent-type: application/json\r\nContent-Length: {}\r\n\r\n",
            body.len()
        );
        // The body split across reads, and the connection left open after it: only
        // Content-Length says where it ends.
        let (addr, _r) = canned_edge(vec![
            head.into_bytes(),
            body[..10].to_vec(),
            body[10..].to_vec(),
        ])
        .await;
        let e = client(addr)
            .connect_port(&sandbox(), 8081)
            .await
            .expect_err("refused");
        assert_eq!(e.status(), Some(StatusCode::NOT_FOUND));
        assert_eq!(e.code(), Some("port_not_exposed"));
        assert_eq!(
            e.to_string(),
            "port 8081 is not exposed (port_not_exposed, 404)"
        );
    }

    #[tokio::test]
    async fn a_deny_keeps_its_reason() {
        let body = br#"{"error":"deny","message":"denied","reason":"wrong_port"}"#;
        let answer = format!(
            "HTTP/1.1 403 Forbidden\r\nContent-Length: {}\r\n\r\n{}",
            body.len(),
            String::from_utf8_lossy(body)
        );
        let (addr, _r) = canned_edge(vec![answer.into_bytes()]).await;
        let e = client(addr)
            .connect_port(&sandbox(), 8080)
            .await
            .expect_err("denied");
        assert!(
            matches!(&e, Error::Api { status, code, reason: Some(r), .. }
                if *status == StatusCode::FORBIDDEN && code == "deny" && r == "wrong_port"),
            "{e:?}"
        );
    }

    #[tokio::test]
    async fn a_token_is_sent_instead_of_the_key_and_a_public_port_gets_no_credential() {
        let (addr, request) = canned_edge(vec![b"HTTP/1.1 200 OK\r\n\r\n".to_vec()]).await;
        client(addr)
            .connect_port_with(&sandbox(), 9000, PortCredential::Token("tok_abc"))
            .await
            .expect("tunnel");
        let req = request.await.expect("request");
        assert!(req.contains("\r\nX-Space-Port-Token: tok_abc\r\n"), "{req}");
        assert!(!req.contains("Authorization"), "{req}");

        let (addr, request) = canned_edge(vec![b"HTTP/1.1 200 OK\r\n\r\n".to_vec()]).await;
        client(addr)
            .connect_port_with(&sandbox(), 9000, PortCredential::Public)
            .await
            .expect("tunnel");
        let s = sandbox();
        assert_eq!(
            request.await.expect("request"),
            format!("CONNECT {s}:9000 HTTP/1.1\r\nHost: {s}:9000\r\n\r\n")
        );
    }

    #[tokio::test]
    async fn a_token_with_a_line_break_is_refused_before_anything_is_sent() {
        let e = Client::new("http://127.0.0.1:1", "k")
            .connect_port_with(
                &sandbox(),
                80,
                PortCredential::Token("t\r\nX-Space-Sandbox: other"),
            )
            .await
            .expect_err("bad token");
        assert!(matches!(e, Error::Stream(_)), "{e:?}");
    }

    #[tokio::test]
    async fn an_edge_that_closes_before_its_answer_ends_is_a_transport_error() {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        tokio::spawn(async move {
            let (mut s, _) = listener.accept().await.expect("accept");
            let mut buf = [0u8; 1024];
            let _ = s.read(&mut buf).await;
            let _ = s.write_all(b"HTTP/1.1 200 OK\r\n").await;
        });
        let e = client(addr)
            .connect_port(&sandbox(), 80)
            .await
            .expect_err("cut short");
        assert!(
            matches!(&e, Error::Transport(CallError::Transport(m)) if m.contains("closed")),
            "{e:?}"
        );
    }

    #[tokio::test]
    async fn an_answer_that_is_not_http_is_a_decode_error() {
        let (addr, _r) = canned_edge(vec![b"SSH-2.0-OpenSSH\r\n\r\n".to_vec()]).await;
        let e = client(addr)
            .connect_port(&sandbox(), 80)
            .await
            .expect_err("not http");
        assert!(matches!(e, Error::Decode(_)), "{e:?}");
    }

    #[test]
    fn the_edge_address_comes_from_the_client_url() {
        let ok = |u: &str| edge_authority(u).expect(u);
        assert_eq!(ok("http://127.0.0.1:7070"), "127.0.0.1:7070");
        assert_eq!(ok("http://edge.example/"), "edge.example:80");
        assert_eq!(ok("http://[::1]:7070/v1"), "[::1]:7070");
        assert_eq!(ok("http://[::1]"), "[::1]:80");
        assert!(edge_authority("https://edge.example").is_err());
        assert!(edge_authority("edge.example:7070").is_err());
        assert!(edge_authority("http:///x").is_err());
    }
}
