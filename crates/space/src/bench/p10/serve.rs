//! `space bench serve http|tcp`: the servers P10 runs inside a sandbox, fast enough
//! that what is measured is the platform's path to them, not their own work.
//!
//! `http` answers every HTTP/1.1 request with a fixed 13-byte body, keeping the
//! connection alive (pipelined requests answered in order). `tcp` is a sink: a client
//! sends frames of an 8-byte big-endian length followed by that many bytes; after each
//! frame the sink answers with the count it received (8 bytes, big-endian), so the
//! client knows every byte went through without relying on a half-close the path
//! might not carry.

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::{Args, ValueEnum};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// Longest request head the HTTP server reads (request line and headers).
pub const MAX_HEAD: usize = 16 * 1024;
/// Largest request body the HTTP server reads (and discards).
pub const MAX_BODY: usize = 1 << 20;
/// Largest frame the sink accepts (1 TiB).
pub const MAX_FRAME: u64 = 1 << 40;

/// The body of every answer of the HTTP server.
pub const BODY: &[u8] = b"hello, world\n";

const ANSWER: &[u8] =
    b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 13\r\n\r\nhello, world\n";

/// Which server.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ServeKind {
    /// HTTP/1.1 keep-alive, a fixed answer.
    Http,
    /// A byte sink answering each frame with its count.
    Tcp,
    /// A relay copying bytes to `--to` and back, nothing else: two of them in a row
    /// are the least any path with two hops (edge, netgtw) can cost.
    Relay,
    /// The sink after one TLS record (the ClientHello a client sends through the
    /// egress proxy, which judges its SNI).
    TlsSink,
}

/// `space bench serve`.
#[derive(Debug, Clone, Args)]
pub struct ServeArgs {
    /// Which server.
    pub kind: ServeKind,
    /// Address to listen on.
    #[arg(long)]
    pub listen: SocketAddr,
    /// A file created once the server listens.
    #[arg(long)]
    pub ready: Option<PathBuf>,
    /// Where a relay copies to.
    #[arg(long)]
    pub to: Option<SocketAddr>,
}

/// Runs the server of `a` until the process is killed.
pub async fn run(a: &ServeArgs) -> Result<(), String> {
    let listener = TcpListener::bind(a.listen)
        .await
        .map_err(|e| format!("listen on {}: {e}", a.listen))?;
    if let Some(ready) = &a.ready {
        std::fs::write(ready, b"").map_err(|e| format!("{}: {e}", ready.display()))?;
    }
    if a.kind == ServeKind::Relay {
        let to = a.to.ok_or("a relay needs --to")?;
        return relay(listener, to).await;
    }
    serve(listener, a.kind).await
}

/// Copies every accepted connection to a new one to `to` and back, until either ends.
pub async fn relay(listener: TcpListener, to: SocketAddr) -> Result<(), String> {
    loop {
        let (client, _) = listener
            .accept()
            .await
            .map_err(|e| format!("accept: {e}"))?;
        let _ = client.set_nodelay(true);
        tokio::spawn(async move {
            if let Ok(server) = TcpStream::connect(to).await {
                let _ = server.set_nodelay(true);
                // As the platform's tunnels copy: kernel to kernel.
                let (_keep, stop) = tokio::sync::watch::channel(false);
                space_http::proxy::splice_bridge(
                    client,
                    bytes::Bytes::new(),
                    server,
                    bytes::Bytes::new(),
                    stop,
                    |_, _| {},
                )
                .await;
            }
        });
    }
}

/// Serves `kind` on `listener`, a task per connection.
pub async fn serve(listener: TcpListener, kind: ServeKind) -> Result<(), String> {
    loop {
        let (stream, _) = listener
            .accept()
            .await
            .map_err(|e| format!("accept: {e}"))?;
        let _ = stream.set_nodelay(true);
        tokio::spawn(async move {
            let _ = match kind {
                ServeKind::Http => http_connection(stream).await,
                ServeKind::Tcp => sink_connection(stream).await,
                ServeKind::TlsSink => tls_sink_connection(stream).await,
                // `run` relays before it serves.
                ServeKind::Relay => Ok(()),
            };
        });
    }
}

/// What to do with a request head.
#[derive(Debug, PartialEq, Eq)]
enum Parsed {
    /// Answer it; `body` bytes follow the head; `close` after the answer.
    Answer { body: usize, close: bool },
    /// Refuse it with this answer and close.
    Refuse(&'static [u8]),
}

fn parse_request(head: &[u8]) -> Parsed {
    const BAD: &[u8] =
        b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\nConnection: close\r\n\r\n";
    const CHUNKED: &[u8] =
        b"HTTP/1.1 501 Not Implemented\r\nContent-Length: 0\r\nConnection: close\r\n\r\n";
    const LARGE: &[u8] =
        b"HTTP/1.1 413 Content Too Large\r\nContent-Length: 0\r\nConnection: close\r\n\r\n";
    let Ok(text) = std::str::from_utf8(head) else {
        return Parsed::Refuse(BAD);
    };
    let mut lines = text.split("\r\n");
    let request_line = lines.next().unwrap_or_default();
    let version = request_line.rsplit(' ').next().unwrap_or_default();
    let mut close = match version {
        "HTTP/1.1" => false,
        "HTTP/1.0" => true,
        _ => return Parsed::Refuse(BAD),
    };
    let mut body = 0;
    for line in lines.filter(|l| !l.is_empty()) {
        let Some((name, value)) = line.split_once(':') else {
            return Parsed::Refuse(BAD);
        };
        let (name, value) = (name.trim(), value.trim());
        if name.eq_ignore_ascii_case("content-length") {
            match value.parse::<usize>() {
                Ok(n) if n <= MAX_BODY => body = n,
                Ok(_) => return Parsed::Refuse(LARGE),
                Err(_) => return Parsed::Refuse(BAD),
            }
        } else if name.eq_ignore_ascii_case("transfer-encoding") {
            return Parsed::Refuse(CHUNKED);
        } else if name.eq_ignore_ascii_case("connection") {
            if value.eq_ignore_ascii_case("close") {
                close = true;
            } else if value.eq_ignore_ascii_case("keep-alive") {
                close = false;
            }
        }
    }
    Parsed::Answer { body, close }
}

/// The end of the head (through its blank line) in `buf`, looking from `from`.
pub fn head_end(buf: &[u8], from: usize) -> Option<usize> {
    buf.get(from..)?
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .map(|i| from + i + 4)
}

/// One kept-alive HTTP connection: every complete request in the buffer is answered
/// (in one write when pipelined) before the next read.
async fn http_connection<S>(mut stream: S) -> std::io::Result<()>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    const HEAD_TOO_LONG: &[u8] = b"HTTP/1.1 431 Request Header Fields Too Large\r\n\
          Content-Length: 0\r\nConnection: close\r\n\r\n";
    let mut buf: Vec<u8> = Vec::with_capacity(8192);
    let mut out: Vec<u8> = Vec::with_capacity(ANSWER.len() * 4);
    let mut chunk = vec![0u8; 64 * 1024];
    // Where the search for the current head's end resumes.
    let mut searched: usize = 0;
    loop {
        let n = stream.read(&mut chunk).await?;
        if n == 0 {
            return Ok(());
        }
        buf.extend_from_slice(&chunk[..n]);
        let mut close = false;
        loop {
            let Some(end) = head_end(&buf, searched.saturating_sub(3)) else {
                searched = buf.len();
                if buf.len() > MAX_HEAD {
                    out.extend_from_slice(HEAD_TOO_LONG);
                    close = true;
                }
                break;
            };
            if end > MAX_HEAD {
                out.extend_from_slice(HEAD_TOO_LONG);
                close = true;
                break;
            }
            match parse_request(&buf[..end]) {
                Parsed::Refuse(answer) => {
                    out.extend_from_slice(answer);
                    close = true;
                    break;
                }
                Parsed::Answer { body, close: last } => {
                    if buf.len() < end + body {
                        // The body is still coming: answer once it is here.
                        searched = 0;
                        break;
                    }
                    buf.drain(..end + body);
                    searched = 0;
                    out.extend_from_slice(ANSWER);
                    if last {
                        close = true;
                        break;
                    }
                }
            }
        }
        if !out.is_empty() {
            stream.write_all(&out).await?;
            out.clear();
        }
        if close {
            let _ = stream.shutdown().await;
            return Ok(());
        }
    }
}

/// Largest TLS record: 16 KiB of plaintext and its overhead.
const MAX_TLS_RECORD: usize = (16 << 10) + 2048;

/// One TLS record skipped, then a sink connection.
async fn tls_sink_connection(mut stream: TcpStream) -> std::io::Result<()> {
    let mut head = [0u8; 5];
    stream.read_exact(&mut head).await?;
    let len = usize::from(u16::from_be_bytes([head[3], head[4]]));
    if head[0] != 22 || len > MAX_TLS_RECORD {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            "not a TLS handshake record",
        ));
    }
    let mut record = vec![0u8; len];
    stream.read_exact(&mut record).await?;
    sink_connection(stream).await
}

/// One sink connection: frames counted until the client closes.
async fn sink_connection(mut stream: TcpStream) -> std::io::Result<()> {
    let mut chunk = vec![0u8; 256 * 1024];
    loop {
        let mut len = [0u8; 8];
        match stream.read_exact(&mut len).await {
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(()),
            Err(e) => return Err(e),
        }
        let want = u64::from_be_bytes(len);
        if want > MAX_FRAME {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!("a frame of {want} bytes is over the sink's 1 TiB"),
            ));
        }
        let mut got = 0u64;
        while got < want {
            let max = usize::try_from(want - got).map_or(chunk.len(), |r| r.min(chunk.len()));
            let n = stream.read(&mut chunk[..max]).await?;
            if n == 0 {
                return Ok(());
            }
            got += n as u64;
        }
        stream.write_all(&got.to_be_bytes()).await?;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn server(kind: ServeKind) -> SocketAddr {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        tokio::spawn(serve(listener, kind));
        addr
    }

    /// Everything the server sends until it closes (a server that never closes
    /// fails the test after 5 s).
    async fn read_to_end(s: &mut TcpStream) -> Vec<u8> {
        let mut out = Vec::new();
        tokio::time::timeout(std::time::Duration::from_secs(5), s.read_to_end(&mut out))
            .await
            .expect("the server did not close the connection within 5 s")
            .expect("read");
        out
    }

    #[tokio::test]
    async fn pipelined_requests_on_one_connection_are_answered_in_order() {
        let addr = server(ServeKind::Http).await;
        let mut s = TcpStream::connect(addr).await.expect("connect");
        // Two requests in one write, the second with a body split over two writes,
        // then a third asking to close.
        s.write_all(
            b"GET / HTTP/1.1\r\nHost: a\r\n\r\nPOST /x HTTP/1.1\r\nContent-Length: 6\r\n\r\nab",
        )
        .await
        .expect("write");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        s.write_all(b"cdefGET / HTTP/1.1\r\nConnection: close\r\n\r\n")
            .await
            .expect("write");
        let got = read_to_end(&mut s).await;
        assert_eq!(got, ANSWER.repeat(3));
    }

    #[tokio::test]
    async fn an_http_1_0_request_is_answered_and_the_connection_closed() {
        let addr = server(ServeKind::Http).await;
        let mut s = TcpStream::connect(addr).await.expect("connect");
        s.write_all(b"GET / HTTP/1.0\r\n\r\n").await.expect("write");
        assert_eq!(read_to_end(&mut s).await, ANSWER);
    }

    #[tokio::test]
    async fn a_head_over_16_kib_is_refused_with_431() {
        let addr = server(ServeKind::Http).await;
        let mut s = TcpStream::connect(addr).await.expect("connect");
        // One byte over, and nothing after it (unread bytes would reset the answer).
        let mut req = b"GET / HTTP/1.1\r\nX-Pad: ".to_vec();
        req.resize(MAX_HEAD + 1, b'a');
        s.write_all(&req).await.expect("write");
        let got = read_to_end(&mut s).await;
        assert!(
            got.starts_with(b"HTTP/1.1 431 "),
            "{:?}",
            String::from_utf8_lossy(&got)
        );
    }

    #[tokio::test]
    async fn a_chunked_or_oversized_body_is_refused_and_the_connection_closed() {
        let addr = server(ServeKind::Http).await;
        for (req, status) in [
            (
                "POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n".to_owned(),
                "501",
            ),
            (
                format!(
                    "POST / HTTP/1.1\r\nContent-Length: {}\r\n\r\n",
                    MAX_BODY + 1
                ),
                "413",
            ),
            ("GET / SPDY/3\r\n\r\n".to_owned(), "400"),
        ] {
            let mut s = TcpStream::connect(addr).await.expect("connect");
            s.write_all(req.as_bytes()).await.expect("write");
            let got = String::from_utf8(read_to_end(&mut s).await).expect("text");
            assert!(
                got.starts_with(&format!("HTTP/1.1 {status} ")),
                "{req:?}: {got:?}"
            );
        }
    }

    #[tokio::test]
    async fn the_sink_answers_each_frame_with_the_bytes_it_counted() {
        let addr = server(ServeKind::Tcp).await;
        let mut s = TcpStream::connect(addr).await.expect("connect");
        for size in [0u64, 1, 3 << 20] {
            s.write_all(&size.to_be_bytes()).await.expect("len");
            s.write_all(&vec![1u8; size as usize]).await.expect("bytes");
            let mut count = [0u8; 8];
            s.read_exact(&mut count).await.expect("count");
            assert_eq!(u64::from_be_bytes(count), size);
        }
    }

    #[tokio::test]
    async fn a_frame_over_the_sinks_bound_closes_the_connection() {
        let addr = server(ServeKind::Tcp).await;
        let mut s = TcpStream::connect(addr).await.expect("connect");
        s.write_all(&(MAX_FRAME + 1).to_be_bytes())
            .await
            .expect("len");
        assert!(read_to_end(&mut s).await.is_empty());
    }
}
