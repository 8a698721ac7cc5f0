//! A small HTTP/1.1 client (hyper) that drives its connections in the calling task:
//! control plane → workers, edge → workers and control
//! plane, worker → control plane, CLI → edge; and [`serve_until`], how every server of
//! the platform serves. Plain HTTP: the embedded default runs on loopback; put TLS in
//! front for anything else.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Limited};
use hyper::client::conn::http1::{Connection, SendRequest};
use hyper::{Method, Request, StatusCode, Uri};
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

mod body;
pub mod crash;
pub mod patience;
pub mod private_dir;
mod server;
pub mod stream;

pub use body::{FileBody, HashingFile, ReqBody, spool_body};
use body::{spool, spool_into};
pub use server::{
    DEFAULT_HEADER_TIMEOUT, DEFAULT_MAX_CONNECTIONS, DEFAULT_MAX_HEAD, ServeLimits, run_to_end,
    serve_until, serve_with,
};

/// Largest answer body read from a peer (a snapshot archive is the largest).
pub const MAX_ANSWER: usize = 1 << 30;

/// Why a call failed before an HTTP answer arrived.
#[derive(Debug, thiserror::Error)]
pub enum CallError {
    /// The URL is not valid.
    #[error("bad url {0}")]
    Url(String),
    /// Connecting failed: nothing reached the peer.
    #[error("connect: {0}")]
    Connect(String),
    /// Sending or receiving failed: the peer may have seen the request.
    #[error("transport: {0}")]
    Transport(String),
    /// No answer in time.
    #[error("timed out")]
    Timeout,
}

/// An HTTP answer.
#[derive(Debug)]
pub struct Answer {
    /// Status.
    pub status: StatusCode,
    /// Headers.
    pub headers: hyper::HeaderMap,
    /// Body.
    pub body: Bytes,
}

/// A pooled HTTP/1.1 client that drives each connection in the calling task.
///
/// No connection task runs beside the caller: the request is written, and the answer
/// read, by the task that awaits the call, so a round trip wakes no other thread of the
/// caller's process (with a spawned connection task it woke up to two; measured on the
/// edge's forwarding path). An idle connection is not polled; it is checked when it is
/// taken, and a pooled connection found closed before the request went out is replaced
/// by a new one once.
#[derive(Clone, Debug)]
pub struct HttpClient {
    idle: Arc<Mutex<Pool>>,
    timeout: Duration,
    /// An idle connection older than this is closed rather than reused.
    idle_for: Duration,
}

/// Idle connections by peer (`host:port`).
#[derive(Debug)]
struct Pool {
    peers: HashMap<String, Vec<Conn>>,
    /// When connections idle for too long were last closed, for every peer (peers that
    /// went away, a restarted worker's old address, keep nothing open for long).
    swept: Instant,
}

/// Idle connections kept per peer.
const MAX_IDLE_PER_PEER: usize = 64;

/// How long a connection may stay idle in the pool.
const IDLE_FOR: Duration = Duration::from_secs(30);

/// One connection: its request handle and the connection itself, polled by whoever
/// holds it.
struct Conn {
    sender: SendRequest<ReqBody>,
    conn: Connection<TokioIo<TcpStream>, ReqBody>,
    idle_since: Instant,
}

impl std::fmt::Debug for Conn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Conn")
            .field("idle_since", &self.idle_since)
            .finish_non_exhaustive()
    }
}

impl Conn {
    /// Whether the connection can take a request: not closed by the peer meanwhile
    /// (polled once, without waiting) and not idle for too long.
    fn usable(&mut self, idle_for: Duration) -> bool {
        if self.idle_since.elapsed() > idle_for {
            return false;
        }
        let mut cx = Context::from_waker(Waker::noop());
        matches!(Pin::new(&mut self.conn).poll(&mut cx), Poll::Pending) && !self.sender.is_closed()
    }
}

/// How an exchange on one connection failed.
enum Failure {
    /// The request did not go out on this connection.
    NotSent(String),
    /// It went out (or may have): the peer may have seen it.
    Sent(String),
}

impl HttpClient {
    /// A client whose calls time out after `timeout`.
    pub fn new(timeout: Duration) -> Self {
        Self {
            idle: Arc::new(Mutex::new(Pool {
                peers: HashMap::new(),
                swept: Instant::now(),
            })),
            timeout,
            // Closed here before the server's idle timeout closes it there, so a
            // request never races the server's close of a pooled connection.
            idle_for: IDLE_FOR.min(ServeLimits::from_env().header_timeout / 2),
        }
    }

    /// Sends one request.
    pub async fn call(
        &self,
        method: Method,
        url: &str,
        headers: &[(&str, &str)],
        body: Bytes,
    ) -> Result<Answer, CallError> {
        let mut body = Some(ReqBody::from(body));
        self.call_inner(method, url, headers, &mut body, Read::Collect)
            .await
    }

    /// Sends one request whose body is `len` bytes of `file` (from its start),
    /// streamed from disk; a new connection carries it (a body read from a file is
    /// not sent twice). The answer is read whole (at most [`MAX_ANSWER`]).
    pub async fn call_with_file(
        &self,
        method: Method,
        url: &str,
        headers: &[(&str, &str)],
        file: std::fs::File,
        len: u64,
    ) -> Result<Answer, CallError> {
        let mut body = Some(ReqBody::file(file, len));
        self.call_inner(method, url, headers, &mut body, Read::Collect)
            .await
    }

    /// Sends one request and, when the answer is a success, streams its body into
    /// `sink` on a blocking thread (a bounded queue of chunks between), failing once
    /// it passes `limit` bytes. Returns the answer (its body empty on success, the
    /// peer's error — at most 64 KiB — otherwise) and, on success, `sink` back with
    /// the number of bytes written.
    pub async fn call_to_sink<W: std::io::Write + Send + 'static>(
        &self,
        method: Method,
        url: &str,
        headers: &[(&str, &str)],
        body: Bytes,
        limit: u64,
        sink: W,
    ) -> Result<(Answer, Option<(W, u64)>), CallError> {
        let (tx, done) = spool(sink);
        let mut body = Some(ReqBody::from(body));
        let answer = self
            .call_inner(method, url, headers, &mut body, Read::Spool { limit, tx })
            .await;
        let written = match done.await {
            Ok(Ok(w)) => Some(w),
            Ok(Err(e)) => return Err(CallError::Transport(format!("writing the answer: {e}"))),
            Err(e) => return Err(CallError::Transport(e.to_string())),
        };
        let answer = answer?;
        if !answer.status.is_success() {
            return Ok((answer, None));
        }
        let len = answer
            .headers
            .get(SPOOLED)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        Ok((answer, written.map(|w| (w, len))))
    }

    async fn call_inner(
        &self,
        method: Method,
        url: &str,
        headers: &[(&str, &str)],
        body: &mut Option<ReqBody>,
        read: Read,
    ) -> Result<Answer, CallError> {
        let bad_url = || CallError::Url(url.to_owned());
        let uri: Uri = url.parse().map_err(|_| bad_url())?;
        if uri.scheme_str() != Some("http") {
            return Err(bad_url());
        }
        let peer = uri.authority().ok_or_else(bad_url)?.as_str().to_owned();
        let path = uri.path_and_query().map_or("/", |p| p.as_str());
        let once = body.as_ref().is_some_and(ReqBody::is_file);
        let mut request = || {
            let mut req = Request::builder()
                .method(method.clone())
                .uri(path)
                .header(hyper::header::HOST, peer.as_str());
            for (k, v) in headers {
                req = req.header(*k, *v);
            }
            // Bytes are cloned for a retry; a file body is taken (and sent once).
            let b = if once {
                body.take()
            } else {
                body.as_ref().and_then(ReqBody::bytes)
            }
            .ok_or_else(|| CallError::Connect("the request body was sent already".into()))?;
            req.body(b).map_err(|_| bad_url())
        };
        let mut read = Some(read);
        let fut = async {
            let mut pooled = !once;
            loop {
                let mut conn = match self.checkout(&peer).filter(|_| pooled) {
                    Some(c) => c,
                    None => {
                        pooled = false;
                        connect(&peer).await?
                    }
                };
                let how = read.take().unwrap_or(Read::Collect);
                match exchange(&mut conn, request()?, how).await {
                    Ok((answer, reusable)) => {
                        if reusable {
                            self.checkin(&peer, conn);
                        }
                        return Ok(answer);
                    }
                    // A pooled connection the peer had closed: once more on a new one.
                    Err((Failure::NotSent(_), how)) if pooled => {
                        pooled = false;
                        read = how;
                    }
                    Err((Failure::NotSent(e), _)) => return Err(CallError::Connect(e)),
                    Err((Failure::Sent(e), _)) => return Err(CallError::Transport(e)),
                }
            }
        };
        tokio::time::timeout(self.timeout, fut)
            .await
            .map_err(|_| CallError::Timeout)?
    }

    /// A usable idle connection to `peer`, if any (closed ones are dropped).
    fn checkout(&self, peer: &str) -> Option<Conn> {
        let mut pool = self.idle.lock().ok()?;
        let list = pool.peers.get_mut(peer)?;
        while let Some(mut c) = list.pop() {
            if c.usable(self.idle_for) {
                return Some(c);
            }
        }
        None
    }

    fn checkin(&self, peer: &str, mut conn: Conn) {
        conn.idle_since = Instant::now();
        let Ok(mut pool) = self.idle.lock() else {
            return;
        };
        match pool.peers.get_mut(peer) {
            Some(list) if list.len() < MAX_IDLE_PER_PEER => list.push(conn),
            Some(_) => {}
            None => {
                pool.peers.insert(peer.to_owned(), vec![conn]);
            }
        }
        // At most once a second: close what idled too long, for every peer.
        if pool.swept.elapsed() >= Duration::from_secs(1).min(self.idle_for) {
            pool.swept = Instant::now();
            let idle_for = self.idle_for;
            pool.peers.retain(|_, list| {
                list.retain(|c| c.idle_since.elapsed() <= idle_for);
                !list.is_empty()
            });
        }
    }

    /// Idle connections held, over all peers.
    #[cfg(test)]
    fn idle_count(&self) -> usize {
        self.idle
            .lock()
            .map(|p| p.peers.values().map(Vec::len).sum())
            .unwrap_or(0)
    }

    /// POSTs JSON.
    pub async fn post_json<T: serde::Serialize>(
        &self,
        url: &str,
        headers: &[(&str, &str)],
        body: &T,
    ) -> Result<Answer, CallError> {
        let bytes = serde_json::to_vec(body).map_err(|e| CallError::Url(e.to_string()))?;
        let mut h = headers.to_vec();
        h.push(("content-type", "application/json"));
        self.call(Method::POST, url, &h, Bytes::from(bytes)).await
    }
}

/// A new connection to `peer` (`host:port`), with `TCP_NODELAY`.
async fn connect(peer: &str) -> Result<Conn, CallError> {
    let tcp = TcpStream::connect(peer)
        .await
        .map_err(|e| CallError::Connect(format!("{peer}: {e}")))?;
    let _ = tcp.set_nodelay(true);
    let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tcp))
        .await
        .map_err(|e| CallError::Connect(format!("{peer}: {e}")))?;
    Ok(Conn {
        sender,
        conn,
        idle_since: Instant::now(),
    })
}

/// How an answer's body is read.
enum Read {
    /// Into memory, at most [`MAX_ANSWER`].
    Collect,
    /// A success's body to a spool writer (at most `limit` bytes); any other answer's
    /// into memory, at most 64 KiB.
    Spool {
        limit: u64,
        tx: tokio::sync::mpsc::Sender<Bytes>,
    },
}

/// The header (set on [`Answer::headers`] by [`HttpClient::call_to_sink`]) holding the
/// bytes spooled.
const SPOOLED: &str = "x-space-spooled-bytes";

/// Largest error answer read when the answer was to be spooled.
const MAX_SPOOL_ERROR: usize = 64 << 10;

/// One request and its whole answer on `c`, polling the connection alongside. The
/// flag says whether the connection can serve another request. A failure hands back
/// how the body was to be read when it is the same for a retry.
async fn exchange(
    c: &mut Conn,
    req: Request<ReqBody>,
    read: Read,
) -> Result<(Answer, bool), (Failure, Option<Read>)> {
    let Conn { sender, conn, .. } = c;
    let mut read = Some(read);
    let (answer, conn_ended) = {
        let read = &mut read;
        let sender = &mut *sender;
        let work = async move {
            if let Err(e) = sender.ready().await {
                return Err(Failure::NotSent(e.to_string()));
            }
            let resp = sender.try_send_request(req).await.map_err(|mut e| {
                if e.take_message().is_some() {
                    Failure::NotSent(e.into_error().to_string())
                } else {
                    Failure::Sent(e.into_error().to_string())
                }
            })?;
            let (mut parts, body) = resp.into_parts();
            let body = match read.take() {
                Some(Read::Spool { limit, tx }) if parts.status.is_success() => {
                    let n = spool_into(body, limit, &tx)
                        .await
                        .map_err(|e| Failure::Sent(e.to_string()))?;
                    if let Ok(v) = hyper::header::HeaderValue::from_str(&n.to_string()) {
                        parts.headers.insert(SPOOLED, v);
                    }
                    Bytes::new()
                }
                Some(Read::Spool { .. }) => collect(body, MAX_SPOOL_ERROR).await?,
                _ => collect(body, MAX_ANSWER).await?,
            };
            Ok(Answer {
                status: parts.status,
                headers: parts.headers,
                body,
            })
        };
        Together {
            work: std::pin::pin!(work),
            conn: &mut *conn,
            ended: false,
            wakes: WakeFlag::new(),
        }
        .await
    };
    let reusable = !conn_ended && !sender.is_closed();
    answer.map(|a| (a, reusable)).map_err(|f| (f, read))
}

async fn collect(body: hyper::body::Incoming, limit: usize) -> Result<Bytes, Failure> {
    Ok(Limited::new(body, limit)
        .collect()
        .await
        .map_err(|e| Failure::Sent(e.to_string()))?
        .to_bytes())
}

/// Polls a request's future and its connection in one task until the request is
/// answered. The two wake each other at every step (request queued, bytes read); such a
/// wake, while this future is being polled, polls again at once instead of going
/// through the scheduler, which on a multi-thread runtime wakes another worker thread
/// to steal the task.
struct Together<'a, W> {
    work: Pin<&'a mut W>,
    conn: &'a mut Connection<TokioIo<TcpStream>, ReqBody>,
    /// The connection future completed (closed or failed).
    ended: bool,
    wakes: (Arc<WakeFlag>, Waker),
}

/// A waker that notes wakes arriving while its task is being polled here, and passes
/// the others on to the task.
#[derive(Default)]
struct WakeFlag {
    polling: std::sync::atomic::AtomicBool,
    woken: std::sync::atomic::AtomicBool,
    task: Mutex<Option<Waker>>,
}

impl WakeFlag {
    /// A flag and the waker that sets it (made once per exchange, not per poll).
    fn new() -> (Arc<Self>, Waker) {
        let flag = Arc::new(Self::default());
        let waker = Waker::from(Arc::clone(&flag));
        (flag, waker)
    }
}

impl std::task::Wake for WakeFlag {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        use std::sync::atomic::Ordering::SeqCst;
        self.woken.store(true, SeqCst);
        if !self.polling.load(SeqCst) {
            if let Some(w) = self.task.lock().ok().and_then(|t| t.clone()) {
                w.wake();
            }
        }
    }
}

impl<W: Future<Output = Result<Answer, Failure>>> Future for Together<'_, W> {
    /// The answer, and whether the connection ended meanwhile.
    type Output = (Result<Answer, Failure>, bool);

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        use std::sync::atomic::Ordering::SeqCst;
        let this = &mut *self;
        let (wakes, waker) = &this.wakes;
        if let Ok(mut task) = wakes.task.lock() {
            if !task.as_ref().is_some_and(|t| t.will_wake(cx.waker())) {
                *task = Some(cx.waker().clone());
            }
        }
        let mut inner = Context::from_waker(waker);
        // Bounded: a pair that keeps waking each other yields to the scheduler.
        for _ in 0..64 {
            wakes.woken.store(false, SeqCst);
            wakes.polling.store(true, SeqCst);
            if !this.ended && Pin::new(&mut *this.conn).poll(&mut inner).is_ready() {
                // The request future fails next, with what happened.
                this.ended = true;
            }
            let answer = this.work.as_mut().poll(&mut inner);
            wakes.polling.store(false, SeqCst);
            if let Poll::Ready(a) = answer {
                return Poll::Ready((a, this.ended));
            }
            if !wakes.woken.load(SeqCst) {
                return Poll::Pending;
            }
        }
        cx.waker().wake_by_ref();
        Poll::Pending
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;

    /// How the test server treats each connection after reading one request.
    #[derive(Clone, Copy)]
    enum Serve {
        /// Answers every request, keeping the connection open.
        KeepAlive,
        /// Answers one request, then closes (without saying so).
        CloseAfterOne,
        /// Answers with `Connection: close`, then closes.
        SaysClose,
        /// Reads the request, then closes without answering.
        Hangup,
        /// Reads the request and never answers.
        Silent,
    }

    /// A raw HTTP/1.1 server on an ephemeral port; counts accepted connections and
    /// requests read.
    async fn server(mode: Serve) -> (String, Arc<AtomicUsize>, Arc<AtomicUsize>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let (accepts, requests) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
        let (a, r) = (Arc::clone(&accepts), Arc::clone(&requests));
        tokio::spawn(async move {
            while let Ok((mut tcp, _)) = listener.accept().await {
                a.fetch_add(1, Ordering::SeqCst);
                let r = Arc::clone(&r);
                tokio::spawn(async move {
                    let mut buf = Vec::new();
                    loop {
                        let mut chunk = [0u8; 1024];
                        let n = tcp.read(&mut chunk).await.unwrap_or(0);
                        if n == 0 {
                            return;
                        }
                        buf.extend_from_slice(&chunk[..n]);
                        let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") else {
                            continue;
                        };
                        buf.drain(..end + 4);
                        r.fetch_add(1, Ordering::SeqCst);
                        let answer: &[u8] = match mode {
                            Serve::SaysClose => {
                                b"HTTP/1.1 200 OK\r\nconnection: close\r\ncontent-length: 2\r\n\r\nok"
                            }
                            Serve::Hangup => return,
                            Serve::Silent => {
                                tokio::time::sleep(Duration::from_secs(60)).await;
                                return;
                            }
                            _ => b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok",
                        };
                        if tcp.write_all(answer).await.is_err() {
                            return;
                        }
                        if matches!(mode, Serve::CloseAfterOne | Serve::SaysClose) {
                            return;
                        }
                    }
                });
            }
        });
        (url, accepts, requests)
    }

    async fn get(c: &HttpClient, url: &str) -> Result<Answer, CallError> {
        c.call(
            Method::GET,
            &format!("{url}/x"),
            &[("a", "b")],
            Bytes::new(),
        )
        .await
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn calls_reuse_one_connection() {
        let (url, accepts, _) = server(Serve::KeepAlive).await;
        let c = HttpClient::new(Duration::from_secs(5));
        for _ in 0..50 {
            let a = get(&c, &url).await.unwrap();
            assert_eq!((a.status, &a.body[..]), (StatusCode::OK, &b"ok"[..]));
        }
        assert_eq!(accepts.load(Ordering::SeqCst), 1);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_pooled_connection_the_peer_closed_is_replaced() {
        let (url, accepts, requests) = server(Serve::CloseAfterOne).await;
        let c = HttpClient::new(Duration::from_secs(5));
        for _ in 0..5 {
            assert_eq!(get(&c, &url).await.unwrap().status, StatusCode::OK);
            // Let the close arrive before the next call takes the connection.
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert_eq!(accepts.load(Ordering::SeqCst), 5);
        assert_eq!(requests.load(Ordering::SeqCst), 5);
    }

    #[tokio::test]
    async fn connection_close_is_not_pooled() {
        let (url, accepts, _) = server(Serve::SaysClose).await;
        let c = HttpClient::new(Duration::from_secs(5));
        for _ in 0..3 {
            assert_eq!(get(&c, &url).await.unwrap().status, StatusCode::OK);
        }
        assert_eq!(accepts.load(Ordering::SeqCst), 3);
        assert!(c.checkout(url.trim_start_matches("http://")).is_none());
    }

    #[tokio::test]
    async fn a_request_the_peer_read_is_never_sent_twice() {
        let (url, accepts, requests) = server(Serve::Hangup).await;
        let c = HttpClient::new(Duration::from_secs(5));
        assert!(matches!(get(&c, &url).await, Err(CallError::Transport(_))));
        assert_eq!(requests.load(Ordering::SeqCst), 1);
        assert_eq!(accepts.load(Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn nothing_listening_is_a_connect_error_and_bad_urls_are_refused() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}", l.local_addr().unwrap());
        drop(l);
        let c = HttpClient::new(Duration::from_secs(5));
        assert!(matches!(get(&c, &url).await, Err(CallError::Connect(_))));
        for bad in ["not a url", "https://127.0.0.1:1/x", "/relative"] {
            let r = c.call(Method::GET, bad, &[], Bytes::new()).await;
            assert!(matches!(r, Err(CallError::Url(_))), "{bad}");
        }
    }

    #[tokio::test]
    async fn connections_to_a_peer_gone_quiet_are_closed_on_later_use() {
        let (gone, gone_accepts, _) = server(Serve::KeepAlive).await;
        let (busy, _, _) = server(Serve::KeepAlive).await;
        let mut c = HttpClient::new(Duration::from_secs(5));
        c.idle_for = Duration::from_millis(100);
        assert_eq!(get(&c, &gone).await.unwrap().status, StatusCode::OK);
        assert_eq!(c.idle_count(), 1);
        tokio::time::sleep(Duration::from_millis(150)).await;
        // A call to another peer sweeps the first one's stale connection.
        assert_eq!(get(&c, &busy).await.unwrap().status, StatusCode::OK);
        assert_eq!(c.idle_count(), 1);
        // And a stale connection is never reused: a new one is made.
        tokio::time::sleep(Duration::from_millis(150)).await;
        assert_eq!(get(&c, &gone).await.unwrap().status, StatusCode::OK);
        assert_eq!(gone_accepts.load(Ordering::SeqCst), 2);
    }

    #[tokio::test]
    async fn a_silent_peer_times_out() {
        let (url, _, _) = server(Serve::Silent).await;
        let c = HttpClient::new(Duration::from_millis(200));
        assert!(matches!(get(&c, &url).await, Err(CallError::Timeout)));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn concurrent_calls_each_get_their_own_answer() {
        let app = axum::Router::new().route(
            "/echo/{n}",
            axum::routing::get(
                |axum::extract::Path(n): axum::extract::Path<u32>| async move { n.to_string() },
            ),
        );
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let server = tokio::spawn(serve_until(listener, app, async {
            let _ = stopped.await;
        }));
        let c = HttpClient::new(Duration::from_secs(5));
        let tasks: Vec<_> = (0..32u32)
            .map(|i| {
                let (c, url) = (c.clone(), url.clone());
                tokio::spawn(async move {
                    for j in 0..20u32 {
                        let n = i * 100 + j;
                        let a = c
                            .call(Method::GET, &format!("{url}/echo/{n}"), &[], Bytes::new())
                            .await
                            .unwrap();
                        assert_eq!(a.status, StatusCode::OK);
                        assert_eq!(a.body, n.to_string().into_bytes());
                    }
                })
            })
            .collect();
        for t in tasks {
            t.await.unwrap();
        }
        let _ = stop.send(());
        server.await.unwrap().unwrap();
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_file_body_streams_out_and_an_answer_spools_to_a_sink_within_its_limit() {
        use std::io::Write as _;
        let app = axum::Router::new()
            .route(
                "/echo",
                axum::routing::post(|body: Bytes| async move { body }),
            )
            .layer(axum::extract::DefaultBodyLimit::disable());
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/echo", listener.local_addr().unwrap());
        tokio::spawn(serve_until(listener, app, std::future::pending()));
        let data: Vec<u8> = (0..3u32 << 20).map(|i| (i % 251) as u8).collect();
        let mut f = tempfile_for_test();
        f.write_all(&data).unwrap();
        let c = HttpClient::new(Duration::from_secs(10));
        let a = c
            .call_with_file(
                Method::POST,
                &url,
                &[],
                f.try_clone().unwrap(),
                data.len() as u64,
            )
            .await
            .unwrap();
        assert_eq!(a.status, StatusCode::OK);
        assert!(
            a.body == data,
            "the file did not arrive intact: {} of {}",
            a.body.len(),
            data.len()
        );
        // A file shorter than announced fails the call rather than sending garbage.
        let short = c
            .call_with_file(
                Method::POST,
                &url,
                &[],
                f.try_clone().unwrap(),
                data.len() as u64 + 1,
            )
            .await;
        assert!(short.is_err());
        // Spooled within the limit: every byte reaches the sink.
        let (a, spooled) = c
            .call_to_sink(
                Method::POST,
                &url,
                &[],
                Bytes::from(data.clone()),
                3 << 20,
                Vec::new(),
            )
            .await
            .unwrap();
        assert_eq!(a.status, StatusCode::OK);
        let (sink, n) = spooled.unwrap();
        assert_eq!((n, sink == data), (data.len() as u64, true));
        // Past it: refused, and at most the limit was written.
        let over = c
            .call_to_sink(
                Method::POST,
                &url,
                &[],
                Bytes::from(data.clone()),
                1 << 20,
                Vec::new(),
            )
            .await;
        assert!(
            matches!(over, Err(CallError::Transport(ref e)) if e.contains("limit")),
            "{over:?}"
        );
    }

    fn tempfile_for_test() -> std::fs::File {
        use std::os::unix::fs::OpenOptionsExt;
        std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc_o_tmpfile())
            .open(std::env::temp_dir())
            .unwrap()
    }

    /// `O_TMPFILE` on Linux (x86_64 and aarch64).
    fn libc_o_tmpfile() -> i32 {
        0o20_000_000 | 0o200_000
    }
}
