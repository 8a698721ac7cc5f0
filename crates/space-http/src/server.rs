//! How every server of the platform serves: [`serve_until`] / [`serve_with`] (header
//! timeout, head bound, connection limit, graceful shutdown) and [`run_to_end`].

use std::sync::Arc;
use std::time::Duration;

use hyper::StatusCode;
use hyper_util::rt::TokioIo;
/// Middleware (`axum::middleware::from_fn(run_to_end)`) for handlers that change
/// state: the handler runs in a task of its own, to its end, so a caller that goes away
/// mid-way (a dropped connection, a client's timeout) leaves no half-made change behind
/// (a sandbox left migrating, an install recorded but never started).
pub async fn run_to_end(
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    use axum::response::IntoResponse;
    match tokio::spawn(next.run(req)).await {
        Ok(resp) => resp,
        Err(e) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            [(hyper::header::CONTENT_TYPE, "application/json")],
            serde_json::json!({"error": "internal", "message": format!("handler: {e}")})
                .to_string(),
        )
            .into_response(),
    }
}

/// The connection a request came on, in every request's extensions (see
/// [`serve_with`]): lets a handler keep something for the connection's life (the
/// edge binds a kept-alive service-port connection to one sandbox, port and backend)
/// — dropped when the connection ends. It also holds the connection's place under
/// the listener's limit: a handler that carries an upgraded stream on after the HTTP
/// connection ended keeps a clone, so the stream still counts.
#[derive(Clone, Debug)]
pub struct Connection {
    /// Unique among this process's connections.
    pub id: u64,
    /// What a handler keeps for it.
    pub kept: Arc<tokio::sync::Mutex<Option<Box<dyn std::any::Any + Send>>>>,
    close: Arc<tokio::sync::watch::Sender<bool>>,
    _place: Arc<tokio::sync::OwnedSemaphorePermit>,
}

impl Connection {
    fn new(place: tokio::sync::OwnedSemaphorePermit) -> Self {
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
        Self {
            id: NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
            kept: Arc::default(),
            close: Arc::new(tokio::sync::watch::Sender::new(false)),
            _place: Arc::new(place),
        }
    }

    /// Ends the connection now, whatever it is doing (what it was bound to is gone).
    pub fn close(&self) {
        self.close.send_replace(true);
    }
}

/// Limits every listener of the platform applies (see [`serve_with`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ServeLimits {
    /// How long a client may take to send a whole request head. The timer starts when
    /// the server begins waiting for a head — on a new connection and after each answer
    /// on a kept-alive one — so it is also the idle keep-alive timeout. It does not
    /// apply to request bodies being read, to answers being written, or to upgraded
    /// (WebSocket) connections.
    pub header_timeout: Duration,
    /// Connections served at once; one accepted past it is closed at once, unanswered.
    pub max_connections: usize,
    /// The largest request head, in bytes (hyper's read buffer bound per connection).
    pub max_head: usize,
}

/// Default [`ServeLimits::header_timeout`].
pub const DEFAULT_HEADER_TIMEOUT: Duration = Duration::from_secs(10);
/// Default [`ServeLimits::max_connections`].
pub const DEFAULT_MAX_CONNECTIONS: usize = 4096;
/// Default [`ServeLimits::max_head`].
pub const DEFAULT_MAX_HEAD: usize = 64 << 10;

impl Default for ServeLimits {
    fn default() -> Self {
        Self {
            header_timeout: DEFAULT_HEADER_TIMEOUT,
            max_connections: DEFAULT_MAX_CONNECTIONS,
            max_head: DEFAULT_MAX_HEAD,
        }
    }
}

impl ServeLimits {
    /// The defaults, overridden by `SPACE_HEADER_TIMEOUT_MS` and
    /// `SPACE_MAX_CONNECTIONS` when set to a positive number (values that do not parse
    /// are ignored with a warning on stderr).
    pub fn from_env() -> Self {
        let mut l = Self::default();
        if let Some(ms) = env_number("SPACE_HEADER_TIMEOUT_MS") {
            l.header_timeout = Duration::from_millis(ms);
        }
        if let Some(n) = env_number("SPACE_MAX_CONNECTIONS") {
            l.max_connections = usize::try_from(n).unwrap_or(usize::MAX);
        }
        l
    }
}

fn env_number(name: &str) -> Option<u64> {
    let v = std::env::var(name).ok()?;
    match v.trim().parse::<u64>() {
        Ok(n) if n > 0 => Some(n),
        _ => {
            eprintln!("{name}={v:?} is not a positive number; using the default");
            None
        }
    }
}

/// Serves `app` on `listener` until `signal` completes (then finishes the requests
/// under way), with [`ServeLimits::from_env`].
pub async fn serve_until(
    listener: tokio::net::TcpListener,
    app: axum::Router,
    signal: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    serve_with(listener, app, signal, ServeLimits::from_env()).await
}

/// Serves `app` on `listener` until `signal` completes, then closes idle connections,
/// lets the requests under way finish and returns once every connection has ended.
///
/// Every accepted connection gets `TCP_NODELAY`: small answers go out at once, not
/// behind an unacknowledged write (measured: P3 end to end 0.46 → 0.33 ms). A client
/// gets [`ServeLimits::header_timeout`] to send each request head (slow or silent
/// clients are cut off), heads are bounded by [`ServeLimits::max_head`], and at most
/// [`ServeLimits::max_connections`] connections are served at once: one past the limit
/// is closed as soon as it is accepted, so the backlog is never a queue of held
/// sockets. WebSocket upgrades are handed over as usual (no timeout applies to them).
pub async fn serve_with(
    listener: tokio::net::TcpListener,
    app: axum::Router,
    signal: impl std::future::Future<Output = ()> + Send + 'static,
    limits: ServeLimits,
) -> std::io::Result<()> {
    use hyper_util::rt::TokioTimer;

    let max = limits
        .max_connections
        .clamp(1, tokio::sync::Semaphore::MAX_PERMITS);
    let permits = Arc::new(tokio::sync::Semaphore::new(max));
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout)
        .keep_alive(true)
        .max_buf_size(limits.max_head.max(8192));
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let mut signal = std::pin::pin!(signal);
    loop {
        let accepted = tokio::select! {
            a = listener.accept() => a,
            () = &mut signal => break,
        };
        let tcp = match accepted {
            Ok((tcp, _)) => tcp,
            Err(e) => {
                // Out of descriptors and the like: wait a little rather than spin.
                if !matches!(
                    e.kind(),
                    std::io::ErrorKind::ConnectionAborted | std::io::ErrorKind::ConnectionReset
                ) {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                continue;
            }
        };
        let Ok(permit) = Arc::clone(&permits).try_acquire_owned() else {
            // Over the limit: closed now (the peer sees the connection reset or end).
            drop(tcp);
            continue;
        };
        let _ = tcp.set_nodelay(true);
        let connection = Connection::new(permit);
        let mut closed = connection.close.subscribe();
        let held = connection.clone();
        let app = app.clone();
        let service = hyper::service::service_fn(move |mut req: hyper::Request<_>| {
            req.extensions_mut().insert(connection.clone());
            let mut app = app.clone();
            async move { tower_service::Service::call(&mut app, req.map(axum::body::Body::new)).await }
        });
        let conn = builder
            .serve_connection(TokioIo::new(tcp), service)
            .with_upgrades();
        let mut stop = stop_rx.clone();
        tokio::spawn(async move {
            let _held = held;
            let mut conn = std::pin::pin!(conn);
            tokio::select! {
                _ = conn.as_mut() => return,
                // Dropped: the client sees the connection end.
                _ = closed.wait_for(|c| *c) => return,
                _ = stop.wait_for(|s| *s) => {}
            }
            conn.as_mut().graceful_shutdown();
            let _ = conn.await;
        });
    }
    drop(listener);
    let _ = stop_tx.send(true);
    // Every connection task holds a permit until it ends.
    let all = u32::try_from(max).unwrap_or(u32::MAX);
    let _ = permits.acquire_many(all).await;
    Ok(())
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;
    use hyper::Method;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::{TcpListener, TcpStream};

    use super::*;
    use crate::{Answer, HttpClient};

    /// A server with `limits` whose `/slow` answer takes 500 ms and whose `/upgrade`
    /// echoes bytes on the upgraded connection.
    /// Answers 101 and echoes the upgraded stream; `place` is kept until it ends.
    fn echo_upgrade(
        req: axum::extract::Request,
        place: Option<Connection>,
    ) -> axum::response::Response {
        tokio::spawn(async move {
            let _place = place;
            let Ok(up) = hyper::upgrade::on(req).await else {
                return;
            };
            let mut io = TokioIo::new(up);
            let mut buf = [0u8; 64];
            while let Ok(n) = io.read(&mut buf).await {
                if n == 0 || io.write_all(&buf[..n]).await.is_err() {
                    return;
                }
            }
        });
        axum::response::Response::builder()
            .status(StatusCode::SWITCHING_PROTOCOLS)
            .header("connection", "upgrade")
            .header("upgrade", "echo")
            .body(axum::body::Body::empty())
            .unwrap()
    }

    async fn limited_server(
        limits: ServeLimits,
    ) -> (std::net::SocketAddr, tokio::sync::oneshot::Sender<()>) {
        let app = axum::Router::new()
            .route("/", axum::routing::get(|| async { "ok" }))
            .route(
                "/slow",
                axum::routing::get(|| async {
                    tokio::time::sleep(Duration::from_millis(500)).await;
                    "slow"
                }),
            )
            .route(
                "/upgrade-held",
                axum::routing::get(|req: axum::extract::Request| async move {
                    let place = req.extensions().get::<Connection>().cloned();
                    echo_upgrade(req, place)
                }),
            )
            .route(
                "/upgrade",
                axum::routing::get(
                    |req: axum::extract::Request| async move { echo_upgrade(req, None) },
                ),
            );
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        tokio::spawn(serve_with(
            listener,
            app,
            async {
                let _ = stopped.await;
            },
            limits,
        ));
        (addr, stop)
    }

    /// Reads until the peer closes (`true`) or `within` passes (`false`).
    async fn closed_within(tcp: &mut TcpStream, within: Duration) -> bool {
        let mut buf = [0u8; 1024];
        let deadline = tokio::time::Instant::now() + within;
        loop {
            match tokio::time::timeout_at(deadline, tcp.read(&mut buf)).await {
                Err(_) => return false,
                Ok(Ok(0) | Err(_)) => return true,
                Ok(Ok(_)) => {}
            }
        }
    }

    #[tokio::test]
    async fn a_head_trickled_slower_than_the_header_timeout_is_cut_off() {
        let limits = ServeLimits {
            header_timeout: Duration::from_millis(300),
            ..ServeLimits::default()
        };
        let (addr, _stop) = limited_server(limits).await;
        let mut slow = Vec::new();
        for _ in 0..20 {
            let mut tcp = TcpStream::connect(addr).await.unwrap();
            tcp.write_all(b"GET / HTTP/1.1\r\nhost: x\r\n")
                .await
                .unwrap();
            slow.push(tcp);
        }
        // Still trickling (one header line every 100 ms) ...
        for _ in 0..2 {
            tokio::time::sleep(Duration::from_millis(100)).await;
            for tcp in &mut slow {
                let _ = tcp.write_all(b"x-slow: 1\r\n").await;
            }
        }
        // ... yet each is closed once 300 ms have passed since it connected.
        for tcp in &mut slow {
            assert!(
                closed_within(tcp, Duration::from_secs(2)).await,
                "a slow head stayed open"
            );
        }
        // An idle kept-alive connection is closed after the same time.
        let mut idle = TcpStream::connect(addr).await.unwrap();
        idle.write_all(b"GET / HTTP/1.1\r\nhost: x\r\n\r\n")
            .await
            .unwrap();
        assert!(closed_within(&mut idle, Duration::from_secs(2)).await);
        // A request whose answer takes longer than the timeout is still answered.
        let mut tcp = TcpStream::connect(addr).await.unwrap();
        tcp.write_all(b"GET /slow HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
            .await
            .unwrap();
        let mut answer = Vec::new();
        tcp.read_to_end(&mut answer).await.unwrap();
        assert!(
            answer.starts_with(b"HTTP/1.1 200"),
            "{}",
            String::from_utf8_lossy(&answer)
        );
        assert!(answer.ends_with(b"slow"));
    }

    #[tokio::test]
    async fn an_upgraded_connection_outlives_the_header_timeout() {
        let limits = ServeLimits {
            header_timeout: Duration::from_millis(200),
            ..ServeLimits::default()
        };
        let (addr, _stop) = limited_server(limits).await;
        let mut tcp = upgraded(addr, "/upgrade").await;
        tokio::time::sleep(Duration::from_millis(700)).await;
        tcp.write_all(b"still here").await.unwrap();
        let mut echo = [0u8; 10];
        tcp.read_exact(&mut echo).await.unwrap();
        assert_eq!(&echo, b"still here");
    }

    /// Opens `path` as an upgrade: the stream once its 101 arrived.
    async fn upgraded(addr: std::net::SocketAddr, path: &str) -> TcpStream {
        let mut tcp = TcpStream::connect(addr).await.unwrap();
        let head = format!(
            "GET {path} HTTP/1.1\r\nhost: x\r\nconnection: upgrade\r\nupgrade: echo\r\n\r\n"
        );
        tcp.write_all(head.as_bytes()).await.unwrap();
        let mut head = Vec::new();
        while !head.ends_with(b"\r\n\r\n") {
            let mut b = [0u8; 1];
            assert_eq!(tcp.read(&mut b).await.unwrap(), 1);
            head.push(b[0]);
        }
        assert!(head.starts_with(b"HTTP/1.1 101"));
        tcp
    }

    /// Whether a new connection gets an answer to `GET /`.
    async fn served(addr: std::net::SocketAddr) -> bool {
        let mut tcp = TcpStream::connect(addr).await.unwrap();
        let _ = tcp.write_all(b"GET / HTTP/1.1\r\nhost: x\r\n\r\n").await;
        let mut b = [0u8; 12];
        matches!(
            tokio::time::timeout(Duration::from_secs(2), tcp.read(&mut b)).await,
            Ok(Ok(n)) if n > 0
        )
    }

    #[tokio::test]
    async fn an_upgraded_stream_that_keeps_its_connection_keeps_its_place_under_the_limit() {
        let limits = ServeLimits {
            max_connections: 1,
            ..ServeLimits::default()
        };
        let (addr, _stop) = limited_server(limits).await;
        // A stream that does not keep its `Connection` stops counting once upgraded.
        let loose = upgraded(addr, "/upgrade").await;
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(served(addr).await, "the loose stream still held the place");
        drop(loose);
        // One that keeps it holds the listener's only place while it lives.
        let held = upgraded(addr, "/upgrade-held").await;
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(
            !served(addr).await,
            "a connection past the limit was served"
        );
        drop(held);
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while !served(addr).await {
            assert!(
                std::time::Instant::now() < deadline,
                "the place was not given back"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    #[tokio::test]
    async fn connections_past_the_limit_are_closed_at_once_and_served_again_later() {
        let limits = ServeLimits {
            max_connections: 8,
            ..ServeLimits::default()
        };
        let (addr, _stop) = limited_server(limits).await;
        let mut held = Vec::new();
        for _ in 0..8 {
            let mut tcp = TcpStream::connect(addr).await.unwrap();
            tcp.write_all(b"GET / HTTP/1.1\r\nhost: x\r\n\r\n")
                .await
                .unwrap();
            let mut buf = [0u8; 256];
            assert!(tcp.read(&mut buf).await.unwrap() > 0);
            held.push(tcp);
        }
        // The ninth is accepted and closed without an answer, promptly.
        let mut extra = TcpStream::connect(addr).await.unwrap();
        let _ = extra.write_all(b"GET / HTTP/1.1\r\nhost: x\r\n\r\n").await;
        let mut buf = Vec::new();
        let read = tokio::time::timeout(Duration::from_secs(2), extra.read_to_end(&mut buf)).await;
        assert!(read.is_ok(), "the connection past the limit was held open");
        assert!(buf.is_empty(), "the connection past the limit was served");
        // Once held connections end, new ones are served.
        drop(held);
        tokio::time::sleep(Duration::from_millis(100)).await;
        let c = HttpClient::new(Duration::from_secs(5));
        let a = get_path(&c, &format!("http://{addr}/")).await;
        assert_eq!(a.body, &b"ok"[..]);
    }

    async fn get_path(c: &HttpClient, url: &str) -> Answer {
        c.call(Method::GET, url, &[], Bytes::new()).await.unwrap()
    }

    #[tokio::test]
    async fn shutdown_waits_for_the_request_under_way_and_closes_idle_connections() {
        let (addr, stop) = limited_server(ServeLimits::default()).await;
        let mut idle = TcpStream::connect(addr).await.unwrap();
        idle.write_all(b"GET / HTTP/1.1\r\nhost: x\r\n\r\n")
            .await
            .unwrap();
        let mut buf = [0u8; 256];
        assert!(idle.read(&mut buf).await.unwrap() > 0);
        let c = HttpClient::new(Duration::from_secs(5));
        let url = format!("http://{addr}/slow");
        let slow = tokio::spawn(async move { get_path(&c, &url).await });
        tokio::time::sleep(Duration::from_millis(100)).await;
        let _ = stop.send(());
        assert!(closed_within(&mut idle, Duration::from_secs(2)).await);
        assert_eq!(slow.await.unwrap().body, &b"slow"[..]);
    }
}
