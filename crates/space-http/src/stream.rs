//! Streamed exchanges: a request body sent as it is produced and an answer body handed
//! to the caller as it arrives, neither held whole in memory. Used for file transfers
//! of any size (edge ↔ worker, SDK and CLI ↔ edge or worker).
//!
//! Each exchange has a connection of its own (driven by a task of its own, so the
//! answer's body can be read after the call returns); the small calls keep using the
//! pooled [`crate::HttpClient`].
//!
//! A request body that cannot be produced a second time (a client's upload relayed
//! as it comes) is sent behind a [`Gate`] with `Expect: 100-continue`: no byte of it
//! leaves before the peer says `100 Continue`, which a hyper server says only when
//! its handler first reads the body. A peer that refuses the request first (a stale
//! route, a denied capability: answered before the body is read) leaves the body
//! untouched, and [`GateHandle::take_back`] returns it for the next attempt.

use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::BodyExt;
use hyper::body::{Body, Frame, Incoming, SizeHint};
use hyper::{HeaderMap, Method, Request, StatusCode, Uri};
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncReadExt};
use tokio::net::TcpStream;

use crate::CallError;

/// The error type of streamed bodies.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// A boxed request body.
pub type StreamBody = http_body_util::combinators::UnsyncBoxBody<Bytes, BoxError>;

/// Boxes a body for [`send`].
pub fn boxed<B>(body: B) -> StreamBody
where
    B: Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    body.map_err(Into::into).boxed_unsync()
}

/// An empty body.
pub fn empty() -> StreamBody {
    boxed(http_body_util::Empty::<Bytes>::new().map_err(|never| match never {}))
}

/// An answer whose body is still to be read.
#[derive(Debug)]
pub struct StreamedAnswer {
    /// Status.
    pub status: StatusCode,
    /// Headers.
    pub headers: HeaderMap,
    /// The body, as it arrives. Its length is checked against `Content-Length` by
    /// hyper: a body cut short ends with an error, never as if complete.
    pub body: Incoming,
}

impl StreamedAnswer {
    /// The whole body, at most `limit` bytes (for error answers).
    pub async fn small_body(self, limit: usize) -> Bytes {
        http_body_util::Limited::new(self.body, limit)
            .collect()
            .await
            .map(|c| c.to_bytes())
            .unwrap_or_default()
    }

    /// `Content-Length`, when the answer has one.
    pub fn content_length(&self) -> Option<u64> {
        self.headers
            .get(hyper::header::CONTENT_LENGTH)?
            .to_str()
            .ok()?
            .parse()
            .ok()
    }
}

/// How long a gated body waits for `100 Continue` before it is sent anyway (a peer
/// that never says it); longer than a worker keeps a request waiting for a resume.
const GATE_FALLBACK: Duration = Duration::from_secs(10);

/// Sends one request on a new connection and returns the answer's head, its body
/// still to be read. `head_timeout` bounds the wait for the connection and for the
/// head (which, for an upload, arrives only after the body was sent: give it time).
/// Nothing reached the peer when this fails with [`CallError::Connect`].
///
/// With `gate` (the handle of a body made by [`gated`]), the request asks for
/// `100 Continue` and the gate opens when it comes.
pub async fn send(
    method: Method,
    url: &str,
    headers: &[(&str, &str)],
    body: StreamBody,
    gate: Option<GateHandle>,
    head_timeout: Duration,
) -> Result<StreamedAnswer, CallError> {
    let bad_url = || CallError::Url(url.to_owned());
    let uri: Uri = url.parse().map_err(|_| bad_url())?;
    if uri.scheme_str() != Some("http") {
        return Err(bad_url());
    }
    let peer = uri.authority().ok_or_else(bad_url)?.as_str().to_owned();
    let path = uri.path_and_query().map_or("/", |p| p.as_str()).to_owned();
    let mut req = Request::builder()
        .method(method)
        .uri(path)
        .header(hyper::header::HOST, peer.as_str());
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    if gate.is_some() {
        req = req.header(hyper::header::EXPECT, "100-continue");
    }
    let mut req = req.body(body).map_err(|_| bad_url())?;
    if let Some(gate) = gate {
        let fallback = gate.clone();
        tokio::spawn(async move {
            tokio::time::sleep(GATE_FALLBACK).await;
            fallback.open();
        });
        hyper::ext::on_informational(&mut req, move |res| {
            if res.status() == StatusCode::CONTINUE {
                gate.open();
            }
        });
    }
    let work = async {
        let tcp = TcpStream::connect(&peer)
            .await
            .map_err(|e| CallError::Connect(format!("{peer}: {e}")))?;
        let _ = tcp.set_nodelay(true);
        let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tcp))
            .await
            .map_err(|e| CallError::Connect(format!("{peer}: {e}")))?;
        tokio::spawn(conn);
        let resp = sender.send_request(req).await.map_err(|e| {
            if e.is_canceled() {
                CallError::Connect(e.to_string())
            } else {
                CallError::Transport(e.to_string())
            }
        })?;
        let (parts, body) = resp.into_parts();
        Ok(StreamedAnswer {
            status: parts.status,
            headers: parts.headers,
            body,
        })
    };
    tokio::time::timeout(head_timeout, work)
        .await
        .map_err(|_| CallError::Timeout)?
}

/// The shared state of a [`Gate`].
struct GateState {
    body: Option<StreamBody>,
    open: bool,
    /// Whether the body was polled once open (it is then not whole any more).
    touched: bool,
    waker: Option<Waker>,
}

/// A request body that yields nothing until its [`GateHandle`] is opened (see the
/// module's note on `Expect: 100-continue`).
pub struct Gate {
    state: Arc<Mutex<GateState>>,
    hint: SizeHint,
}

impl std::fmt::Debug for Gate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gate").finish_non_exhaustive()
    }
}

/// Opens a [`Gate`], or takes its body back untouched.
#[derive(Clone)]
pub struct GateHandle {
    state: Arc<Mutex<GateState>>,
}

impl std::fmt::Debug for GateHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GateHandle").finish_non_exhaustive()
    }
}

impl Gate {
    /// `body` behind a closed gate, and its handle.
    pub fn new(body: StreamBody) -> (Self, GateHandle) {
        let hint = body.size_hint();
        let state = Arc::new(Mutex::new(GateState {
            body: Some(body),
            open: false,
            touched: false,
            waker: None,
        }));
        let handle = GateHandle {
            state: Arc::clone(&state),
        };
        (Self { state, hint }, handle)
    }
}

/// `body` behind a gate: the body and the handle to give [`send`], which asks for
/// `100 Continue` and opens the gate when it comes.
pub fn gated(body: StreamBody) -> (StreamBody, GateHandle) {
    let (gate, handle) = Gate::new(body);
    (boxed(gate), handle)
}

impl GateHandle {
    fn lock(&self) -> std::sync::MutexGuard<'_, GateState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Lets the body flow.
    pub fn open(&self) {
        let mut s = self.lock();
        s.open = true;
        if let Some(w) = s.waker.take() {
            w.wake();
        }
    }

    /// The body, if no byte of it was produced yet (the gate stayed closed, or was
    /// opened and never polled after).
    pub fn take_back(&self) -> Option<StreamBody> {
        let mut s = self.lock();
        if s.touched {
            return None;
        }
        s.open = false;
        s.body.take()
    }

    /// Whether some of the body was produced.
    pub fn touched(&self) -> bool {
        self.lock().touched
    }
}

impl Body for Gate {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if !s.open {
            s.waker = Some(cx.waker().clone());
            return Poll::Pending;
        }
        s.touched = true;
        match s.body.as_mut() {
            Some(b) => Pin::new(b).poll_frame(cx),
            None => Poll::Ready(Some(Err("the body was taken back".into()))),
        }
    }

    fn size_hint(&self) -> SizeHint {
        self.hint
    }
}

/// A request body read from an [`AsyncRead`] in chunks of at most 256 KiB as it is
/// sent. With `len`, exactly `len` bytes (a shorter source fails the body, a longer
/// one is cut at `len` — the peer then sees exactly what was announced); without,
/// everything up to the source's end (sent chunked).
pub fn reader_body<R>(reader: R, len: Option<u64>) -> StreamBody
where
    R: AsyncRead + Send + Unpin + 'static,
{
    const CHUNK: usize = 256 << 10;
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<Bytes, BoxError>>(4);
    tokio::spawn(async move {
        let mut reader = reader;
        let mut at = 0u64;
        loop {
            let want = match len {
                Some(l) if at >= l => return,
                Some(l) => CHUNK.min(usize::try_from(l - at).unwrap_or(CHUNK)),
                None => CHUNK,
            };
            let mut buf = vec![0u8; want];
            let r: Result<Bytes, BoxError> = match reader.read(&mut buf).await {
                Ok(0) if len.is_none() => return,
                Ok(0) => Err("the source ended before its announced length".into()),
                Ok(n) => {
                    buf.truncate(n);
                    at += n as u64;
                    Ok(Bytes::from(buf))
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => Err(e.into()),
            };
            let failed = r.is_err();
            if tx.send(r).await.is_err() || failed {
                return;
            }
        }
    });
    boxed(ChannelBody { rx, len, sent: 0 })
}

/// A body fed by a channel of chunks.
struct ChannelBody {
    rx: tokio::sync::mpsc::Receiver<Result<Bytes, BoxError>>,
    len: Option<u64>,
    sent: u64,
}

impl Body for ChannelBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        if self.len.is_some_and(|l| self.sent >= l) {
            return Poll::Ready(None);
        }
        match self.rx.poll_recv(cx) {
            Poll::Ready(Some(Ok(b))) => {
                self.sent += b.len() as u64;
                Poll::Ready(Some(Ok(Frame::data(b))))
            }
            Poll::Ready(Some(Err(e))) => Poll::Ready(Some(Err(e))),
            Poll::Ready(None) if self.len.is_some() => {
                Poll::Ready(Some(Err("the source stopped".into())))
            }
            Poll::Ready(None) => Poll::Ready(None),
            Poll::Pending => Poll::Pending,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.len.is_some_and(|l| self.sent >= l)
    }

    fn size_hint(&self) -> SizeHint {
        match self.len {
            Some(l) => SizeHint::with_exact(l - self.sent),
            None => SizeHint::default(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::routing::put;

    /// A server on loopback: `/refuse` answers 421 without reading the body (like a
    /// worker's admission of a stale route), `/take` reads it and answers its length
    /// and BLAKE3.
    async fn server() -> String {
        async fn take(body: axum::body::Body) -> String {
            let b = axum::body::to_bytes(body, 64 << 20)
                .await
                .unwrap_or_default();
            format!("{} {}", b.len(), blake3::hash(&b).to_hex())
        }
        let app = axum::Router::new()
            .route(
                "/refuse",
                put(|| async { (StatusCode::MISDIRECTED_REQUEST, "refresh_route") }),
            )
            .route("/take", put(take));
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", l.local_addr().unwrap());
        tokio::spawn(crate::serve_until(l, app, std::future::pending()));
        url
    }

    fn data() -> Vec<u8> {
        (0..(3u32 << 20))
            .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
            .collect()
    }

    /// Sends `body` gated (or not) to `/refuse`; the body back if it was untouched.
    async fn refused(url: &str, body: StreamBody, gate: bool) -> Option<StreamBody> {
        let (body, handle) = gated(body);
        if !gate {
            handle.open();
        }
        let t = Duration::from_secs(10);
        let url = format!("{url}/refuse");
        match send(Method::PUT, &url, &[], body, Some(handle.clone()), t).await {
            Ok(a) => assert_eq!(a.status, StatusCode::MISDIRECTED_REQUEST),
            // The peer closed while the body was being written: a transport failure
            // after the request went out, which no recovery rule may retry.
            Err(e) => assert!(!gate, "{e}"),
        }
        handle.take_back()
    }

    #[tokio::test]
    async fn an_upload_refused_before_its_body_is_read_is_handed_back_whole() {
        let url = server().await;
        let data = data();
        let src = reader_body(std::io::Cursor::new(data.clone()), Some(data.len() as u64));
        let body = refused(&url, src, true).await.expect("the body, untouched");
        // The next attempt carries every byte.
        let (body, handle) = gated(body);
        let a = send(
            Method::PUT,
            &format!("{url}/take"),
            &[],
            body,
            Some(handle),
            Duration::from_secs(10),
        )
        .await
        .unwrap();
        assert_eq!(a.status, StatusCode::OK);
        let got = String::from_utf8(a.small_body(1024).await.to_vec()).unwrap();
        assert_eq!(
            got,
            format!("{} {}", data.len(), blake3::hash(&data).to_hex())
        );
    }

    #[tokio::test]
    async fn without_the_gate_a_refused_upload_has_lost_bytes_and_is_not_handed_back() {
        // The same refusal with the gate open from the start: hyper sends the body
        // beside the head, so part of it is gone (or the exchange fails outright) and
        // a retry could not carry it whole.
        let url = server().await;
        let data = data();
        let src = reader_body(std::io::Cursor::new(data.clone()), Some(data.len() as u64));
        assert!(refused(&url, src, false).await.is_none());
    }

    #[tokio::test]
    async fn a_source_shorter_than_announced_fails_the_body() {
        let url = server().await;
        let body = reader_body(std::io::Cursor::new(vec![1u8; 1000]), Some(5000));
        let r = send(
            Method::PUT,
            &format!("{url}/take"),
            &[],
            body,
            None,
            Duration::from_secs(10),
        )
        .await;
        // Either the request fails, or the server saw a body cut short (never 5000).
        if let Ok(a) = r {
            let got = String::from_utf8(a.small_body(1024).await.to_vec()).unwrap();
            assert!(!got.starts_with("5000 "), "{got}");
        }
    }
}
