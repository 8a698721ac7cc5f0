//! `space bench load http|tcp`: P10's load client, the same code on both paths — run
//! inside a sandbox's network namespace against the server directly, and on the host
//! against the edge — printing one JSON line (a [`HttpReport`] or a [`TcpReport`]).
//!
//! HTTP: sequential requests on one kept-alive connection on a one-thread runtime of
//! their own (on a multi-thread runtime the client's own wake-ups cross CPUs and add
//! tens of microseconds to every round trip on a small machine), then requests per
//! second with concurrent kept-alive connections. An answer that closes its
//! connection (python's `http.server` speaks HTTP/1.0) is followed by a new one.
//! TCP: one connection (direct, or a `CONNECT` tunnel through the edge), a warm-up
//! frame, then one frame of the given size to the sink, timed until the sink says it
//! counted every byte.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use clap::{Args, Subcommand};
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;

use super::serve::{BODY, head_end};
use crate::bench::row::quantile;

/// The environment variable the load client takes its API key from (sent as
/// `Authorization: Bearer …` to the edge; kept off the command line).
pub const KEY_ENV: &str = "SPACE_BENCH_KEY";

/// Longest answer head read.
const MAX_ANSWER_HEAD: usize = 16 * 1024;
/// Largest answer body read.
const MAX_ANSWER_BODY: usize = 1 << 20;
/// Longest wait for one request's answer (or one connect).
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// The TCP warm-up frame.
const TCP_WARMUP: u64 = 8 << 20;
/// Bytes written to the sink at a time.
const TCP_CHUNK: usize = 256 * 1024;

/// `space bench load`.
#[derive(Debug, Clone, Args)]
pub struct LoadArgs {
    /// What to measure.
    #[command(subcommand)]
    pub what: LoadWhat,
}

/// `space bench load http|tcp`.
#[derive(Debug, Clone, Subcommand)]
pub enum LoadWhat {
    /// Sequential latency on one kept-alive connection, then requests per second.
    Http(HttpLoad),
    /// Throughput of one connection to the sink.
    Tcp(TcpLoad),
}

/// `space bench load http`.
#[derive(Debug, Clone, Args)]
pub struct HttpLoad {
    /// Address to connect to: the server, or the edge.
    #[arg(long)]
    pub connect: SocketAddr,
    /// The `Host` header.
    #[arg(long)]
    pub host: String,
    /// The path requested (its answer must be the bench server's 13-byte body).
    #[arg(long, default_value = "/")]
    pub path: String,
    /// Sequential requests timed.
    #[arg(long, default_value_t = 2000)]
    pub requests: usize,
    /// Sequential requests before those, not timed.
    #[arg(long, default_value_t = 200)]
    pub warmup: usize,
    /// Concurrent connections for requests per second.
    #[arg(long, default_value_t = 16)]
    pub clients: usize,
    /// How long the concurrent connections run, in seconds.
    #[arg(long, default_value_t = 5.0)]
    pub secs: f64,
    /// API key for `Authorization: Bearer …`.
    #[arg(long, env = KEY_ENV, hide_env_values = true)]
    pub key: Option<String>,
}

/// `space bench load tcp`.
#[derive(Debug, Clone, Args)]
pub struct TcpLoad {
    /// Address to connect to: the sink, or (with `--tunnel`) the edge.
    #[arg(long)]
    pub connect: SocketAddr,
    /// `SANDBOX:PORT`: open a `CONNECT` tunnel to it through the edge at `--connect`
    /// (with the API key).
    #[arg(long)]
    pub tunnel: Option<String>,
    /// MiB pushed in the timed frame.
    #[arg(long, default_value_t = 256)]
    pub mib: u64,
    /// Send a TLS ClientHello naming this server first (through the egress proxy,
    /// which judges its SNI, to a `tls-sink`).
    #[arg(long)]
    pub sni: Option<String>,
    /// API key for the tunnel.
    #[arg(long, env = KEY_ENV, hide_env_values = true)]
    pub key: Option<String>,
}

/// What `space bench load http` prints.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct HttpReport {
    /// Sequential latency, median.
    pub p50_ms: f64,
    /// Sequential latency, 99th percentile.
    pub p99_ms: f64,
    /// Requests per second with the concurrent connections.
    pub requests_per_s: f64,
    /// Failed requests while concurrent.
    pub failed: u64,
    /// The first failure's message.
    pub first_failure: String,
    /// Connections opened in all.
    pub connections: u64,
}

/// What `space bench load tcp` prints.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TcpReport {
    /// MiB per second through the connection.
    pub mib_per_s: f64,
    /// Bytes the sink counted in the timed frame.
    pub bytes: u64,
}

/// Runs `space bench load …` and prints its report.
pub async fn run(a: &LoadArgs) -> Result<i32, String> {
    let line = match &a.what {
        LoadWhat::Http(h) => serde_json::to_string(&http(h).await?),
        LoadWhat::Tcp(t) => serde_json::to_string(&tcp(t).await?),
    }
    .map_err(|e| format!("report: {e}"))?;
    println!("{line}");
    Ok(0)
}

/// A kept-alive HTTP/1.1 client connection sending one fixed `GET`; reconnects when
/// an answer closes the connection.
#[derive(Debug)]
pub struct HttpConnection {
    addr: SocketAddr,
    request: Vec<u8>,
    stream: Option<TcpStream>,
    buf: Vec<u8>,
    /// Connections opened so far.
    pub connects: u64,
}

/// Why an exchange failed.
enum Failure {
    /// A reused connection ended before any byte of the answer (the server closed it
    /// while idle): worth one more try on a new connection.
    Stale,
    Other(String),
}

impl From<String> for Failure {
    fn from(s: String) -> Self {
        Self::Other(s)
    }
}

/// What an answer's head says.
#[derive(Debug, PartialEq, Eq)]
struct AnswerHead {
    status: u16,
    length: Option<usize>,
    keep_alive: bool,
}

fn parse_answer(head: &[u8]) -> Result<AnswerHead, String> {
    let text = std::str::from_utf8(head).map_err(|_| "an answer head that is not text")?;
    let mut lines = text.split("\r\n");
    let status_line = lines.next().unwrap_or_default();
    let mut parts = status_line.splitn(3, ' ');
    let mut keep_alive = match parts.next() {
        Some("HTTP/1.1") => true,
        Some("HTTP/1.0") => false,
        _ => return Err(format!("not an HTTP/1 answer: {status_line:?}")),
    };
    let status = parts
        .next()
        .and_then(|c| c.parse::<u16>().ok())
        .ok_or_else(|| format!("no status in {status_line:?}"))?;
    let mut length = None;
    for line in lines.filter(|l| !l.is_empty()) {
        let (name, value) = line
            .split_once(':')
            .ok_or_else(|| format!("a header line without a colon: {line:?}"))?;
        let (name, value) = (name.trim(), value.trim());
        if name.eq_ignore_ascii_case("content-length") {
            let n = value
                .parse::<usize>()
                .map_err(|_| format!("Content-Length {value:?}"))?;
            if n > MAX_ANSWER_BODY {
                return Err(format!("an answer body of {n} bytes is over 1 MiB"));
            }
            length = Some(n);
        } else if name.eq_ignore_ascii_case("transfer-encoding") {
            return Err(format!("a {value} answer (only Content-Length is read)"));
        } else if name.eq_ignore_ascii_case("connection") {
            if value.eq_ignore_ascii_case("close") {
                keep_alive = false;
            } else if value.eq_ignore_ascii_case("keep-alive") {
                keep_alive = true;
            }
        }
    }
    Ok(AnswerHead {
        status,
        length,
        keep_alive,
    })
}

impl HttpConnection {
    /// A client of `addr` sending `GET path` with `host` (and the API key, if any).
    pub fn new(
        addr: SocketAddr,
        host: &str,
        path: &str,
        key: Option<&str>,
    ) -> Result<Self, String> {
        let fields = [host, path, key.unwrap_or_default()];
        if fields
            .iter()
            .any(|f| f.bytes().any(|b| b.is_ascii_control() || b == b' '))
        {
            return Err("host, path and key must be printable without spaces".into());
        }
        let mut request = format!("GET {path} HTTP/1.1\r\nHost: {host}\r\n");
        if let Some(key) = key {
            request.push_str(&format!("Authorization: Bearer {key}\r\n"));
        }
        request.push_str("\r\n");
        Ok(Self {
            addr,
            request: request.into_bytes(),
            stream: None,
            buf: Vec::with_capacity(4096),
            connects: 0,
        })
    }

    /// One request and its answer, which must be `200` with the bench server's body.
    pub async fn get(&mut self) -> Result<(), String> {
        for attempt in 0..2 {
            let reused = self.stream.is_some();
            let r = match tokio::time::timeout(REQUEST_TIMEOUT, self.exchange()).await {
                Ok(r) => r,
                Err(_) => Err(Failure::Other("no answer within 10 s".into())),
            };
            match r {
                Ok(()) => return Ok(()),
                Err(Failure::Stale) if reused && attempt == 0 => self.stream = None,
                Err(Failure::Stale) => {
                    self.stream = None;
                    return Err("the connection closed before an answer".into());
                }
                Err(Failure::Other(e)) => {
                    self.stream = None;
                    return Err(e);
                }
            }
        }
        Err("the connection closed before an answer".into())
    }

    async fn exchange(&mut self) -> Result<(), Failure> {
        let stream = match &mut self.stream {
            Some(s) => s,
            None => {
                let s = TcpStream::connect(self.addr)
                    .await
                    .map_err(|e| format!("connect to {}: {e}", self.addr))?;
                let _ = s.set_nodelay(true);
                self.connects += 1;
                self.buf.clear();
                self.stream.insert(s)
            }
        };
        if let Err(e) = stream.write_all(&self.request).await {
            return Err(if e.kind() == std::io::ErrorKind::BrokenPipe {
                Failure::Stale
            } else {
                Failure::Other(format!("send: {e}"))
            });
        }
        let mut chunk = [0u8; 8192];
        let end = loop {
            if let Some(end) = head_end(&self.buf, 0) {
                break end;
            }
            if self.buf.len() > MAX_ANSWER_HEAD {
                return Err(format!("an answer head over {} KiB", MAX_ANSWER_HEAD / 1024).into());
            }
            let n = match stream.read(&mut chunk).await {
                Ok(n) => n,
                Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => 0,
                Err(e) => return Err(format!("receive: {e}").into()),
            };
            if n == 0 {
                return Err(if self.buf.is_empty() {
                    Failure::Stale
                } else {
                    format!(
                        "the connection closed after {} bytes of an answer",
                        self.buf.len()
                    )
                    .into()
                });
            }
            self.buf.extend_from_slice(&chunk[..n]);
        };
        let head = parse_answer(&self.buf[..end])?;
        if head.length.is_none() && head.keep_alive {
            return Err(
                "an answer without Content-Length on a kept-alive connection"
                    .to_owned()
                    .into(),
            );
        }
        // The body: to its length, or (a closing answer without one) to the end.
        let want = head.length.unwrap_or(MAX_ANSWER_BODY);
        while self.buf.len() < end + want {
            let n = stream
                .read(&mut chunk)
                .await
                .map_err(|e| format!("receive: {e}"))?;
            if n == 0 {
                if head.length.is_none() {
                    break;
                }
                return Err("the connection closed inside an answer body"
                    .to_owned()
                    .into());
            }
            self.buf.extend_from_slice(&chunk[..n]);
            if head.length.is_none() && self.buf.len() > end + MAX_ANSWER_BODY {
                return Err("an answer body over 1 MiB".to_owned().into());
            }
        }
        let body_end = (end + want).min(self.buf.len());
        let body = &self.buf[end..body_end];
        if head.status != 200 {
            let shown = String::from_utf8_lossy(&body[..body.len().min(300)]).into_owned();
            return Err(format!("status {}: {shown}", head.status).into());
        }
        if body != BODY {
            return Err(format!(
                "an answer of {} bytes that is not the bench body",
                body.len()
            )
            .into());
        }
        if body_end != self.buf.len() {
            return Err("bytes after the answer, none asked for".to_owned().into());
        }
        self.buf.clear();
        if !head.keep_alive {
            self.stream = None;
        }
        Ok(())
    }
}

/// Sorted times (ms) of `h.requests` sequential requests after `h.warmup`, on one
/// connection, on a one-thread runtime of their own; and the connections opened.
fn sequential(h: &HttpLoad) -> Result<(Vec<f64>, u64), String> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("runtime: {e}"))?;
    let mut c = HttpConnection::new(h.connect, &h.host, &h.path, h.key.as_deref())?;
    rt.block_on(async {
        let mut times = Vec::with_capacity(h.requests);
        for i in 0..h.warmup + h.requests {
            let t = Instant::now();
            c.get()
                .await
                .map_err(|e| format!("request {}: {e}", i + 1))?;
            if i >= h.warmup {
                times.push(t.elapsed().as_secs_f64() * 1e3);
            }
        }
        times.sort_by(f64::total_cmp);
        Ok((times, c.connects))
    })
}

/// Requests per second with `h.clients` connections, each warmed by one request
/// before all start together; the failures (count, first message); connections.
async fn concurrent(h: &HttpLoad) -> Result<(f64, u64, String, u64), String> {
    if h.clients == 0 || !(h.secs > 0.0 && h.secs <= 600.0) {
        return Err("--clients must be positive and --secs within (0, 600]".into());
    }
    let run_for = Duration::from_secs_f64(h.secs);
    let done = Arc::new(AtomicU64::new(0));
    let start = Arc::new(tokio::sync::Barrier::new(h.clients));
    let mut tasks = Vec::with_capacity(h.clients);
    for _ in 0..h.clients {
        let mut c = HttpConnection::new(h.connect, &h.host, &h.path, h.key.as_deref())?;
        let (done, start) = (Arc::clone(&done), Arc::clone(&start));
        tasks.push(tokio::spawn(async move {
            let warm = c.get().await;
            start.wait().await;
            let until = Instant::now() + run_for;
            let (mut failed, mut first) = (0u64, warm.err().unwrap_or_default());
            while Instant::now() < until {
                match c.get().await {
                    Ok(()) => {
                        done.fetch_add(1, Ordering::Relaxed);
                    }
                    Err(e) => {
                        failed += 1;
                        if first.is_empty() {
                            first = e;
                        }
                    }
                }
            }
            (failed, first, c.connects)
        }));
    }
    let (mut failed, mut first, mut connects) = (0, String::new(), 0);
    for t in tasks {
        let (f, m, c) = t.await.map_err(|e| format!("client task: {e}"))?;
        failed += f;
        connects += c;
        if first.is_empty() {
            first = m;
        }
    }
    let rps = done.load(Ordering::Relaxed) as f64 / h.secs;
    Ok((rps, failed, first, connects))
}

async fn http(h: &HttpLoad) -> Result<HttpReport, String> {
    if h.requests == 0 {
        return Err("--requests must be positive".into());
    }
    let seq_args = h.clone();
    let (times, seq_connects) = tokio::task::spawn_blocking(move || sequential(&seq_args))
        .await
        .map_err(|e| format!("sequential requests: {e}"))??;
    let (requests_per_s, failed, first_failure, connects) = concurrent(h).await?;
    Ok(HttpReport {
        p50_ms: quantile(&times, 0.5),
        p99_ms: quantile(&times, 0.99),
        requests_per_s,
        failed,
        first_failure,
        connections: seq_connects + connects,
    })
}

/// Pushes a frame of `bytes` to the sink on `s` and waits for its count; the time it
/// took.
pub async fn push<S>(s: &mut S, bytes: u64) -> Result<Duration, String>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let chunk = vec![0x5au8; TCP_CHUNK];
    let t = Instant::now();
    s.write_all(&bytes.to_be_bytes())
        .await
        .map_err(|e| format!("send: {e}"))?;
    let mut left = bytes;
    while left > 0 {
        let n = usize::try_from(left).map_or(TCP_CHUNK, |l| l.min(TCP_CHUNK));
        s.write_all(&chunk[..n])
            .await
            .map_err(|e| format!("send after {} bytes: {e}", bytes - left))?;
        left -= n as u64;
    }
    s.flush().await.map_err(|e| format!("send: {e}"))?;
    let mut count = [0u8; 8];
    s.read_exact(&mut count)
        .await
        .map_err(|e| format!("the sink's count: {e}"))?;
    let counted = u64::from_be_bytes(count);
    if counted != bytes {
        return Err(format!("the sink counted {counted} bytes of {bytes}"));
    }
    Ok(t.elapsed())
}

async fn warm_and_push<S>(mut s: S, bytes: u64) -> Result<TcpReport, String>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    push(&mut s, TCP_WARMUP).await?;
    let took = push(&mut s, bytes).await?;
    Ok(TcpReport {
        mib_per_s: bytes as f64 / (1 << 20) as f64 / took.as_secs_f64(),
        bytes,
    })
}

/// A TLS 1.2-framed ClientHello whose only extension is `server_name` = `name`.
pub fn client_hello(name: &str) -> Result<Vec<u8>, String> {
    let host = name.as_bytes();
    if host.is_empty() || host.len() > 253 {
        return Err(format!("--sni {name:?}: 1 to 253 bytes"));
    }
    let u16_of = |n: usize| (n as u16).to_be_bytes();
    let mut sni = Vec::new();
    sni.extend(u16_of(host.len() + 3));
    sni.push(0);
    sni.extend(u16_of(host.len()));
    sni.extend(host);
    let mut extensions = vec![0, 0];
    extensions.extend(u16_of(sni.len()));
    extensions.extend(sni);
    // Version, random, no session, one suite (TLS_AES_128_GCM_SHA256), no compression.
    let mut body = vec![3, 3];
    body.extend([7u8; 32]);
    body.push(0);
    body.extend([0, 2, 0x13, 0x01, 1, 0]);
    body.extend(u16_of(extensions.len()));
    body.extend(extensions);
    let mut handshake = vec![1];
    handshake.extend(&(body.len() as u32).to_be_bytes()[1..]);
    handshake.extend(body);
    let mut record = vec![22, 3, 1];
    record.extend(u16_of(handshake.len()));
    record.extend(handshake);
    Ok(record)
}

async fn tcp(t: &TcpLoad) -> Result<TcpReport, String> {
    if t.mib == 0 || t.mib > 1 << 20 {
        return Err("--mib must be 1 to 1048576".into());
    }
    let bytes = t.mib << 20;
    match &t.tunnel {
        None => {
            let mut s = TcpStream::connect(t.connect)
                .await
                .map_err(|e| format!("connect to {}: {e}", t.connect))?;
            let _ = s.set_nodelay(true);
            if let Some(name) = &t.sni {
                s.write_all(&client_hello(name)?)
                    .await
                    .map_err(|e| format!("send the ClientHello: {e}"))?;
            }
            warm_and_push(s, bytes).await
        }
        Some(target) => {
            let (sandbox, port) = target
                .rsplit_once(':')
                .and_then(|(s, p)| Some((s.parse().ok()?, p.parse::<u16>().ok()?)))
                .ok_or_else(|| format!("--tunnel {target:?} is not SANDBOX:PORT"))?;
            let key = t
                .key
                .as_deref()
                .ok_or(format!("a tunnel needs {KEY_ENV}"))?;
            let client = space_client::Client::new(&format!("http://{}", t.connect), key);
            let tunnel = client
                .connect_port(&sandbox, port)
                .await
                .map_err(|e| format!("tunnel to {target}: {e}"))?;
            warm_and_push(tunnel, bytes).await
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::serve::{ServeKind, serve};
    use super::*;
    use tokio::net::TcpListener;

    #[test]
    fn the_client_hello_names_the_server_as_the_egress_proxy_reads_it() {
        let hello = client_hello("sink.bench").expect("a ClientHello");
        assert_eq!(
            space_egress::sniff::tls_sni(&hello),
            space_egress::sniff::Sniff::Complete("sink.bench".into())
        );
        assert!(client_hello("").is_err());
    }

    async fn server(kind: ServeKind) -> SocketAddr {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        tokio::spawn(serve(listener, kind));
        addr
    }

    /// What a [`canned`] server does after its one answer on a connection.
    #[derive(Clone, Copy, PartialEq)]
    enum After {
        /// Closes the connection.
        Close,
        /// Reads once more, then closes.
        ReadOnce,
        /// Holds the connection open, reading nothing, for 30 s.
        Hold,
    }

    /// A server that answers each connection once with `answer` after reading a
    /// request head, then does `after`.
    async fn canned(answer: &'static [u8], after: After) -> SocketAddr {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        tokio::spawn(async move {
            loop {
                let (mut s, _) = listener.accept().await.expect("accept");
                tokio::spawn(async move {
                    let mut buf = Vec::new();
                    let mut chunk = [0u8; 1024];
                    while head_end(&buf, 0).is_none() {
                        match s.read(&mut chunk).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => buf.extend_from_slice(&chunk[..n]),
                        }
                    }
                    let _ = s.write_all(answer).await;
                    match after {
                        After::Close => {}
                        After::ReadOnce => {
                            let _ = s.read(&mut chunk).await;
                        }
                        After::Hold => tokio::time::sleep(Duration::from_secs(30)).await,
                    }
                });
            }
        });
        addr
    }

    #[tokio::test]
    async fn requests_on_a_kept_alive_connection_reuse_it() {
        let addr = server(ServeKind::Http).await;
        let mut c = HttpConnection::new(addr, "x", "/", Some("k")).expect("client");
        for _ in 0..50 {
            c.get().await.expect("answer");
        }
        assert_eq!(c.connects, 1);
    }

    #[tokio::test]
    async fn an_answer_that_closes_is_followed_by_a_new_connection() {
        let addr = canned(
            b"HTTP/1.0 200 OK\r\nContent-Length: 13\r\n\r\nhello, world\n",
            After::Close,
        )
        .await;
        let mut c = HttpConnection::new(addr, "x", "/", None).expect("client");
        for _ in 0..5 {
            c.get().await.expect("answer");
        }
        assert_eq!(c.connects, 5);
    }

    #[tokio::test]
    async fn a_refusal_a_wrong_body_or_an_unbounded_answer_is_a_failure() {
        for (answer, says) in [
            (
                &b"HTTP/1.1 403 Forbidden\r\nContent-Length: 6\r\n\r\ndenied"[..],
                "status 403: denied",
            ),
            (
                b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\nabc",
                "not the bench body",
            ),
            (
                b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n",
                "chunked",
            ),
            (b"HTTP/1.1 200 OK\r\n\r\n", "without Content-Length"),
            (
                b"HTTP/1.1 200 OK\r\nContent-Length: 1048577\r\n\r\n",
                "over 1 MiB",
            ),
        ] {
            let addr = canned(answer, After::ReadOnce).await;
            let mut c = HttpConnection::new(addr, "x", "/", None).expect("client");
            let e = c.get().await.expect_err("a failure");
            assert!(e.contains(says), "{e:?} should say {says:?}");
        }
    }

    #[tokio::test]
    async fn an_answer_marked_close_is_never_followed_on_its_connection() {
        // The server keeps the socket open after saying it closes: a client that
        // sent its next request there would wait for an answer that never comes.
        let addr = canned(
            b"HTTP/1.1 200 OK\r\nContent-Length: 13\r\nConnection: close\r\n\r\nhello, world\n",
            After::Hold,
        )
        .await;
        let mut c = HttpConnection::new(addr, "x", "/", None).expect("client");
        for _ in 0..3 {
            tokio::time::timeout(Duration::from_secs(2), c.get())
                .await
                .expect("an answer within 2 s")
                .expect("answer");
        }
        assert_eq!(c.connects, 3);
    }

    #[test]
    fn a_header_value_with_a_line_break_is_refused_before_anything_is_sent() {
        let addr: SocketAddr = "127.0.0.1:1".parse().expect("addr");
        assert!(HttpConnection::new(addr, "x\r\nX-Other: y", "/", None).is_err());
        assert!(HttpConnection::new(addr, "x", "/ HTTP/1.0", None).is_err());
    }

    #[tokio::test]
    async fn the_load_client_reads_python_http_server_one_connection_per_request() {
        let dir = tempfile::tempdir().expect("dir");
        std::fs::write(dir.path().join("hello.txt"), BODY).expect("file");
        let port = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
            l.local_addr().expect("addr").port()
        };
        let mut python = tokio::process::Command::new("python3")
            .args([
                "-m",
                "http.server",
                &port.to_string(),
                "--bind",
                "127.0.0.1",
            ])
            .arg("--directory")
            .arg(dir.path())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .expect("python3 -m http.server");
        let addr: SocketAddr = format!("127.0.0.1:{port}").parse().expect("addr");
        let deadline = Instant::now() + Duration::from_secs(20);
        while TcpStream::connect(addr).await.is_err() {
            assert!(Instant::now() < deadline, "python did not listen");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let mut c = HttpConnection::new(addr, "x", "/hello.txt", None).expect("client");
        for _ in 0..3 {
            c.get().await.expect("answer");
        }
        // HTTP/1.0: every answer closed its connection.
        assert_eq!(c.connects, 3);
        let _ = python.kill().await;
    }

    #[tokio::test]
    async fn a_pushed_frame_is_timed_until_the_sink_counted_all_of_it() {
        let addr = server(ServeKind::Tcp).await;
        let s = TcpStream::connect(addr).await.expect("connect");
        let r = warm_and_push(s, 32 << 20).await.expect("push");
        assert_eq!(r.bytes, 32 << 20);
        assert!(r.mib_per_s > 0.0);
    }

    #[tokio::test]
    async fn a_sink_that_counts_short_is_a_failure() {
        // Reads the frame's length and answers with one byte less, at once.
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        tokio::spawn(async move {
            let (mut s, _) = listener.accept().await.expect("accept");
            let mut len = [0u8; 8];
            s.read_exact(&mut len).await.expect("len");
            let short = u64::from_be_bytes(len) - 1;
            s.write_all(&short.to_be_bytes()).await.expect("count");
            let mut sink = vec![0u8; 1 << 16];
            while s.read(&mut sink).await.is_ok_and(|n| n > 0) {}
        });
        let mut s = TcpStream::connect(addr).await.expect("connect");
        let e = push(&mut s, 1 << 20).await.expect_err("short");
        assert!(e.contains("counted 1048575 bytes of 1048576"), "{e}");
    }

    #[test]
    fn an_answer_head_says_its_status_length_and_whether_it_keeps_the_connection() {
        let p = |h: &str| parse_answer(h.as_bytes());
        assert_eq!(
            p("HTTP/1.1 200 OK\r\nContent-Length: 13\r\n\r\n"),
            Ok(AnswerHead {
                status: 200,
                length: Some(13),
                keep_alive: true
            })
        );
        assert_eq!(
            p("HTTP/1.0 200 OK\r\nConnection: keep-alive\r\n\r\n").map(|h| h.keep_alive),
            Ok(true)
        );
        assert_eq!(
            p("HTTP/1.1 502 Bad Gateway\r\nconnection: close\r\n\r\n").map(|h| h.keep_alive),
            Ok(false)
        );
        assert!(p("SSH-2.0\r\n\r\n").is_err());
        assert!(p("HTTP/1.1 200 OK\r\nContent-Length: x\r\n\r\n").is_err());
    }
}
