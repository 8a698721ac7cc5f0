//! The pooled client: [`HttpClient`], its pool of idle connections, and one exchange
//! (a request and its whole answer) on a connection the calling task drives.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Limited};
use hyper::client::conn::http1::{Connection, SendRequest};
use hyper::{Method, Request, Uri};
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

use crate::body::{ReqBody, spool, spool_into};
use crate::{Answer, CallError, MAX_ANSWER, ServeLimits};

#[cfg(test)]
mod tests;
mod together;

use together::{Together, WakeFlag};

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
