//! Reverse proxying of HTTP/1.1 for service ports, as the edge and netgtw both do it:
//! a request forwarded on a backend connection, a WebSocket upgrade bridged once both
//! sides agreed to it, hop-by-hop headers dropped, and the bytes to and from a backend
//! counted.

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};

use bytes::Bytes;
use hyper::body::{Body, Incoming};
use hyper::client::conn::http1::SendRequest;
use hyper::header::{self, HeaderMap, HeaderName, HeaderValue};
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::watch;

/// Largest response head a backend may send (a hostile server's headers are bounded).
pub const MAX_BACKEND_HEAD: usize = 64 << 10;

/// What an `Upgrade` header asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum UpgradeAsk {
    /// No upgrade.
    None,
    /// `websocket`.
    WebSocket,
    /// Anything else (named).
    Other(String),
}

/// What `headers` ask to upgrade to.
pub fn upgrade_asked(headers: &HeaderMap) -> UpgradeAsk {
    let Some(v) = headers.get(header::UPGRADE) else {
        return UpgradeAsk::None;
    };
    match v.to_str() {
        Ok(s) if s.trim().eq_ignore_ascii_case("websocket") => UpgradeAsk::WebSocket,
        Ok(s) => UpgradeAsk::Other(s.trim().chars().take(64).collect()),
        Err(_) => UpgradeAsk::Other("(not text)".into()),
    }
}

/// Headers that describe one hop, not the message (RFC 9110 §7.6.1), and are never
/// passed on; `Upgrade` goes on only with a WebSocket upgrade (with `Connection:
/// upgrade`).
fn strip_hop_headers(headers: &mut HeaderMap, websocket: bool) {
    // Headers named in `Connection` are hop-by-hop too.
    let named: Vec<HeaderName> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|n| HeaderName::from_bytes(n.trim().as_bytes()).ok())
        .collect();
    for name in named {
        if !(websocket && name == header::UPGRADE) {
            headers.remove(name);
        }
    }
    for name in [
        header::CONNECTION,
        header::PROXY_AUTHENTICATE,
        header::PROXY_AUTHORIZATION,
        header::TE,
        header::TRAILER,
        header::TRANSFER_ENCODING,
        header::UPGRADE,
    ] {
        headers.remove(name);
    }
    headers.remove("keep-alive");
    headers.remove("proxy-connection");
    if websocket {
        headers.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
        headers.insert(header::UPGRADE, HeaderValue::from_static("websocket"));
    }
}

/// Whether the server closes its connection after `resp`.
fn answer_closes(resp: &Response<Incoming>) -> bool {
    let connection = |token: &str| {
        resp.headers()
            .get_all(header::CONNECTION)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .any(|t| t.trim().eq_ignore_ascii_case(token))
    };
    if resp.version() == hyper::Version::HTTP_10 {
        !connection("keep-alive")
    } else {
        connection("close")
    }
}

/// An HTTP/1.1 client connection over `io` (a socket into a sandbox, a tunnel to a
/// worker), its driver spawned: it ends when the connection does.
pub async fn backend<B, I>(io: I) -> Result<SendRequest<B>, hyper::Error>
where
    B: Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    I: AsyncRead + AsyncWrite + Send + Unpin + 'static,
{
    Ok(backend_watched(io).await?.0)
}

/// [`backend`], and a receiver that completes when the connection has ended.
pub async fn backend_watched<B, I>(
    io: I,
) -> Result<(SendRequest<B>, tokio::sync::oneshot::Receiver<()>), hyper::Error>
where
    B: Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    I: AsyncRead + AsyncWrite + Send + Unpin + 'static,
{
    let (sender, conn) = hyper::client::conn::http1::Builder::new()
        .max_buf_size(MAX_BACKEND_HEAD.max(8192))
        .handshake(TokioIo::new(io))
        .await?;
    let (ended, on_end) = tokio::sync::oneshot::channel();
    tokio::spawn(async move {
        let _ = conn.with_upgrades().await;
        let _ = ended.send(());
    });
    Ok((sender, on_end))
}

/// How a forwarded request went.
#[derive(Debug)]
pub enum Forwarded {
    /// The backend's answer (for an upgrade that got no 101, marked `Connection:
    /// close`: the connection it came on ends after it).
    Answer(Response<Incoming>),
    /// The server's answer, after which it ends its connection (HTTP/1.0 without
    /// keep-alive, or `Connection: close`): the next request needs a new one.
    Last(Response<Incoming>),
    /// A WebSocket upgrade both sides agreed to: the 101 to return; the two upgraded
    /// streams are bridged by a spawned task until either ends or `stop` fires.
    Upgraded(Response<Incoming>),
}

/// Forwards `req` on `sender` (hop-by-hop headers dropped). A WebSocket upgrade the
/// backend accepts (101) is bridged: the client's side of `req` and the backend's are
/// copied both ways until either closes or `stop` becomes true. The bridge holds
/// `held` (the caller's connection permit) until it ends: an upgraded connection
/// outlives the HTTP connection that served it, and must still count.
pub async fn forward<B, H>(
    sender: &mut SendRequest<B>,
    mut req: Request<B>,
    stop: watch::Receiver<bool>,
    held: H,
) -> Result<Forwarded, hyper::Error>
where
    H: Send + 'static,
    B: Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let websocket = upgrade_asked(req.headers()) == UpgradeAsk::WebSocket;
    let client_side = websocket.then(|| hyper::upgrade::on(&mut req));
    strip_hop_headers(req.headers_mut(), websocket);
    sender.ready().await?;
    let mut resp = sender.send_request(req).await?;
    let Some(client_side) = client_side else {
        let last = answer_closes(&resp);
        strip_hop_headers(resp.headers_mut(), false);
        // Whether this hop's connection stays open is this hop's business: an
        // HTTP/1.0 server closing after each answer does not end the tunnel (the next
        // request gets a new connection to the server behind it).
        *resp.version_mut() = hyper::Version::HTTP_11;
        return Ok(if last {
            Forwarded::Last(resp)
        } else {
            Forwarded::Answer(resp)
        });
    };
    if resp.status() != StatusCode::SWITCHING_PROTOCOLS {
        strip_hop_headers(resp.headers_mut(), false);
        *resp.version_mut() = hyper::Version::HTTP_11;
        resp.headers_mut()
            .insert(header::CONNECTION, HeaderValue::from_static("close"));
        return Ok(Forwarded::Answer(resp));
    }
    let backend_side = hyper::upgrade::on(&mut resp);
    tokio::spawn(async move {
        let _held = held;
        let (Ok(client), Ok(backend)) = (client_side.await, backend_side.await) else {
            return;
        };
        bridge(TokioIo::new(client), TokioIo::new(backend), stop).await;
    });
    Ok(Forwarded::Upgraded(resp))
}

/// Each direction of a [`bridge`] moves up to this much per read and write (tokio's
/// default, 8 KiB, cost a tunnel most of its throughput: measured 695 MiB/s through
/// edge + netgtw against 4430 MiB/s direct).
pub const BRIDGE_BUFFER: usize = 256 << 10;

/// Completes once `stop` becomes true; never if its sender goes away without
/// setting it.
pub async fn stopped(mut stop: watch::Receiver<bool>) {
    if stop.wait_for(|s| *s).await.is_err() {
        std::future::pending::<()>().await;
    }
}

/// Copies `a` ↔ `b` until either ends or `stop` becomes true; the bytes each way.
pub async fn bridge<A, B>(mut a: A, mut b: B, stop: watch::Receiver<bool>) -> (u64, u64)
where
    A: AsyncRead + AsyncWrite + Unpin,
    B: AsyncRead + AsyncWrite + Unpin,
{
    tokio::select! {
        r = tokio::io::copy_bidirectional_with_sizes(&mut a, &mut b, BRIDGE_BUFFER, BRIDGE_BUFFER) => {
            r.unwrap_or((0, 0))
        }
        () = stopped(stop) => (0, 0),
    }
}

/// The TCP socket under an upgraded connection, and the bytes read past the answer's
/// head (to be passed on first), when it is one.
pub fn raw_tcp(
    up: hyper::upgrade::Upgraded,
) -> Result<(tokio::net::TcpStream, Bytes), hyper::upgrade::Upgraded> {
    up.downcast::<TokioIo<tokio::net::TcpStream>>()
        .map(|p| (p.io.into_inner(), p.read_buf))
}

/// Most bytes one `splice(2)` moves.
const SPLICE_CHUNK: usize = 1 << 20;

/// The capacity asked for each direction's pipe.
const SPLICE_PIPE: usize = 256 << 10;

/// Copies `a` ↔ `b` kernel to kernel (`splice(2)` through a pipe per direction: the
/// bytes never enter user space) after writing `a_first` to `b` and `b_first` to `a`,
/// until both directions have ended (each end's write side is shut when the other end
/// stops sending) or `stop` becomes true. `counted(to_b, to_a)` is told the bytes as
/// they go.
pub async fn splice_bridge(
    a: tokio::net::TcpStream,
    a_first: Bytes,
    b: tokio::net::TcpStream,
    b_first: Bytes,
    stop: watch::Receiver<bool>,
    counted: impl Fn(u64, u64),
) {
    use tokio::io::AsyncWriteExt as _;
    let (mut a, mut b) = (a, b);
    if (!a_first.is_empty() && b.write_all(&a_first).await.is_err())
        || (!b_first.is_empty() && a.write_all(&b_first).await.is_err())
    {
        return;
    }
    counted(a_first.len() as u64, b_first.len() as u64);
    let both = async {
        tokio::join!(
            one_way(&a, &b, |n| counted(n, 0)),
            one_way(&b, &a, |n| counted(0, n))
        )
    };
    tokio::select! {
        _ = both => {}
        () = stopped(stop) => {}
    }
}

/// One direction of [`splice_bridge`]: `from` → pipe → `to` until `from` ends (then
/// `to`'s write side is shut).
async fn one_way(
    from: &tokio::net::TcpStream,
    to: &tokio::net::TcpStream,
    count: impl Fn(u64),
) -> std::io::Result<()> {
    use rustix::pipe::{PipeFlags, SpliceFlags, pipe_with, splice};
    use tokio::io::Interest;
    let (pipe_r, pipe_w) = pipe_with(PipeFlags::CLOEXEC | PipeFlags::NONBLOCK)?;
    // Four times the default 64 KiB: fewer wake-ups per MiB moved. Bounded, as every
    // pipe's pages are the worker's memory whoever fills them.
    let _ = rustix::pipe::fcntl_setpipe_size(&pipe_w, SPLICE_PIPE);
    let flags = SpliceFlags::MOVE | SpliceFlags::NONBLOCK;
    loop {
        let n = loop {
            from.readable().await?;
            match from.try_io(Interest::READABLE, || {
                splice(from, None, &pipe_w, None, SPLICE_CHUNK, flags).map_err(Into::into)
            }) {
                Ok(n) => break n,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                Err(e) => return Err(e),
            }
        };
        if n == 0 {
            let _ = rustix::net::shutdown(to, rustix::net::Shutdown::Write);
            return Ok(());
        }
        let mut left = n;
        while left > 0 {
            to.writable().await?;
            match to.try_io(Interest::WRITABLE, || {
                splice(&pipe_r, None, to, None, left, flags).map_err(Into::into)
            }) {
                Ok(m) => left -= m,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                Err(e) => return Err(e),
            }
        }
        count(n as u64);
    }
}

/// Why [`open_upgrade`] got no upgraded connection.
#[derive(Debug)]
pub enum UpgradeRefused {
    /// Nothing reached the peer (connection refused, bad URL).
    Unreachable(String),
    /// The peer answered without upgrading: its status and (bounded) body.
    Answered(StatusCode, Bytes),
    /// The connection failed after the request was sent.
    Failed(String),
}

/// Largest error body read from a peer that refused an upgrade.
const MAX_REFUSAL_BODY: usize = 64 << 10;

/// `POST {base}{path}` with `headers` on a new connection to `base` (`http://host:port`),
/// asking to upgrade to `protocol`; the upgraded connection once the peer answers 101.
pub async fn open_upgrade(
    base: &str,
    path: &str,
    protocol: &'static str,
    headers: &[(&str, &str)],
    timeout: std::time::Duration,
) -> Result<hyper::upgrade::Upgraded, UpgradeRefused> {
    use http_body_util::BodyExt as _;
    let authority = base
        .strip_prefix("http://")
        .map(|a| a.trim_end_matches('/'))
        .ok_or_else(|| UpgradeRefused::Unreachable(format!("not an http:// URL: {base}")))?;
    let tcp = match tokio::time::timeout(timeout, tokio::net::TcpStream::connect(authority)).await {
        Ok(Ok(t)) => t,
        Ok(Err(e)) => return Err(UpgradeRefused::Unreachable(format!("{authority}: {e}"))),
        Err(_) => {
            return Err(UpgradeRefused::Unreachable(format!(
                "{authority}: timed out"
            )));
        }
    };
    let _ = tcp.set_nodelay(true);
    let (mut sender, conn) =
        hyper::client::conn::http1::handshake::<_, http_body_util::Empty<Bytes>>(TokioIo::new(tcp))
            .await
            .map_err(|e| UpgradeRefused::Failed(e.to_string()))?;
    tokio::spawn(async move {
        let _ = conn.with_upgrades().await;
    });
    let mut req = Request::post(path)
        .header(header::HOST, authority)
        .header(header::CONNECTION, "upgrade")
        .header(header::UPGRADE, protocol);
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let req = req
        .body(http_body_util::Empty::new())
        .map_err(|e| UpgradeRefused::Unreachable(format!("request: {e}")))?;
    let resp = tokio::time::timeout(timeout, sender.send_request(req))
        .await
        .map_err(|_| UpgradeRefused::Failed("no answer in time".into()))?
        .map_err(|e| UpgradeRefused::Failed(e.to_string()))?;
    if resp.status() == StatusCode::SWITCHING_PROTOCOLS {
        return hyper::upgrade::on(resp)
            .await
            .map_err(|e| UpgradeRefused::Failed(e.to_string()));
    }
    let status = resp.status();
    let limited = http_body_util::Limited::new(resp.into_body(), MAX_REFUSAL_BODY);
    let body = match tokio::time::timeout(timeout, limited.collect()).await {
        Ok(Ok(b)) => b.to_bytes(),
        _ => Bytes::new(),
    };
    Err(UpgradeRefused::Answered(status, body))
}

/// A JSON error answer `{"error", "message"}`; with `close`, the connection it goes
/// on ends after it.
pub fn refusal<B: From<Bytes>>(
    status: StatusCode,
    code: &str,
    message: &str,
    close: bool,
) -> Response<B> {
    let body = serde_json::json!({ "error": code, "message": message }).to_string();
    let mut resp = Response::new(B::from(Bytes::from(body)));
    *resp.status_mut() = status;
    let h = resp.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    if close {
        h.insert(header::CONNECTION, HeaderValue::from_static("close"));
    }
    resp
}

/// Where a [`Counted`] stream adds its traffic.
pub trait Count: Unpin {
    /// `n` bytes were read from the stream.
    fn read(&self, n: u64);
    /// `n` bytes were written to it.
    fn written(&self, n: u64);
}

/// Bytes read from and written to a stream.
#[derive(Debug, Default)]
pub struct ByteCounts {
    /// Read from it.
    pub read: AtomicU64,
    /// Written to it.
    pub written: AtomicU64,
}

impl Count for Arc<ByteCounts> {
    fn read(&self, n: u64) {
        self.read.fetch_add(n, Ordering::Relaxed);
    }

    fn written(&self, n: u64) {
        self.written.fetch_add(n, Ordering::Relaxed);
    }
}

/// A stream whose traffic is counted as it flows.
#[derive(Debug)]
pub struct Counted<S, C> {
    inner: S,
    counts: C,
}

impl<S, C> Counted<S, C> {
    /// `inner`, counted into `counts`.
    pub fn new(inner: S, counts: C) -> Self {
        Self { inner, counts }
    }
}

impl<S: AsyncRead + Unpin, C: Count> AsyncRead for Counted<S, C> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let r = Pin::new(&mut self.inner).poll_read(cx, buf);
        let n = buf.filled().len().saturating_sub(before) as u64;
        if n > 0 {
            self.counts.read(n);
        }
        r
    }
}

impl<S: AsyncWrite + Unpin, C: Count> AsyncWrite for Counted<S, C> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let r = Pin::new(&mut self.inner).poll_write(cx, buf);
        if let Poll::Ready(Ok(n)) = &r {
            self.counts.written(*n as u64);
        }
        r
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_spliced_bridge_carries_both_ways_the_first_bytes_first_and_ends_with_both_sides() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let pair = || async {
            let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            let addr = l.local_addr().unwrap();
            let (near, far) = tokio::join!(tokio::net::TcpStream::connect(addr), l.accept());
            (near.unwrap(), far.unwrap().0)
        };
        let ((mut client, a), (b, mut server)) = (pair().await, pair().await);
        let counts = Arc::new(ByteCounts::default());
        let c = Arc::clone(&counts);
        let (_keep, stop) = watch::channel(false);
        let bridge = tokio::spawn(async move {
            splice_bridge(
                a,
                Bytes::from_static(b"early:"),
                b,
                Bytes::new(),
                stop,
                move |x, y| {
                    c.written.fetch_add(x, Ordering::Relaxed);
                    c.read.fetch_add(y, Ordering::Relaxed);
                },
            )
            .await;
        });
        let big: Vec<u8> = (0..3_000_000u32).map(|i| (i % 251) as u8).collect();
        let sent = big.clone();
        let writer = tokio::spawn(async move {
            client.write_all(&sent).await.unwrap();
            client.shutdown().await.unwrap();
            let mut back = Vec::new();
            client.read_to_end(&mut back).await.unwrap();
            back
        });
        let mut got = Vec::new();
        server.read_to_end(&mut got).await.unwrap();
        assert_eq!(&got[..6], b"early:");
        assert!(got[6..] == big[..], "the bytes arrived changed");
        server.write_all(b"answer").await.unwrap();
        server.shutdown().await.unwrap();
        assert_eq!(writer.await.unwrap(), b"answer");
        bridge.await.unwrap();
        assert_eq!(counts.written.load(Ordering::Relaxed), 6 + big.len() as u64);
        assert_eq!(counts.read.load(Ordering::Relaxed), 6);
    }

    #[test]
    fn hop_headers_and_the_ones_connection_names_are_dropped() {
        let mut h = HeaderMap::new();
        h.insert(
            header::CONNECTION,
            HeaderValue::from_static("keep-alive, x-secret"),
        );
        h.insert("x-secret", HeaderValue::from_static("1"));
        h.insert("keep-alive", HeaderValue::from_static("timeout=5"));
        h.insert(
            header::PROXY_AUTHORIZATION,
            HeaderValue::from_static("Basic x"),
        );
        h.insert(header::UPGRADE, HeaderValue::from_static("h2c"));
        h.insert("x-kept", HeaderValue::from_static("1"));
        strip_hop_headers(&mut h, false);
        let names: Vec<&str> = h.keys().map(|k| k.as_str()).collect();
        assert_eq!(names, ["x-kept"]);
    }

    #[test]
    fn a_websocket_upgrade_keeps_only_its_own_upgrade_headers() {
        let mut h = HeaderMap::new();
        h.insert(header::CONNECTION, HeaderValue::from_static("Upgrade"));
        h.insert(header::UPGRADE, HeaderValue::from_static("WebSocket"));
        assert_eq!(upgrade_asked(&h), UpgradeAsk::WebSocket);
        strip_hop_headers(&mut h, true);
        assert_eq!(h[header::UPGRADE], "websocket");
        assert_eq!(h[header::CONNECTION], "upgrade");
    }

    #[test]
    fn an_upgrade_to_anything_else_is_named() {
        let mut h = HeaderMap::new();
        h.insert(header::UPGRADE, HeaderValue::from_static("h2c"));
        assert_eq!(upgrade_asked(&h), UpgradeAsk::Other("h2c".into()));
        assert_eq!(upgrade_asked(&HeaderMap::new()), UpgradeAsk::None);
    }
}
