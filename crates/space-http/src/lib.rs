//! A small HTTP/1.1 client (hyper): control plane → workers, edge → workers and control
//! plane, worker → control plane, CLI → edge; and [`serve_until`], how every server of
//! the platform serves. Plain HTTP: the embedded default runs on loopback; put TLS in
//! front for anything else.

use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::{Method, Request, StatusCode};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;

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

/// A pooled HTTP/1.1 client.
#[derive(Clone, Debug)]
pub struct HttpClient {
    inner: Client<HttpConnector, Full<Bytes>>,
    timeout: Duration,
}

impl HttpClient {
    /// A client whose calls time out after `timeout`.
    pub fn new(timeout: Duration) -> Self {
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        let inner = Client::builder(TokioExecutor::new())
            .pool_idle_timeout(Duration::from_secs(30))
            .pool_max_idle_per_host(64)
            .build(connector);
        Self { inner, timeout }
    }

    /// Sends one request.
    pub async fn call(
        &self,
        method: Method,
        url: &str,
        headers: &[(&str, &str)],
        body: Bytes,
    ) -> Result<Answer, CallError> {
        let mut req = Request::builder().method(method).uri(url);
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        let req = req
            .body(Full::new(body))
            .map_err(|_| CallError::Url(url.to_owned()))?;
        let fut = async {
            let resp = self.inner.request(req).await.map_err(|e| {
                if e.is_connect() {
                    CallError::Connect(e.to_string())
                } else {
                    CallError::Transport(e.to_string())
                }
            })?;
            let (parts, body) = resp.into_parts();
            let body = Limited::new(body, MAX_ANSWER)
                .collect()
                .await
                .map_err(|e| CallError::Transport(e.to_string()))?
                .to_bytes();
            Ok(Answer {
                status: parts.status,
                headers: parts.headers,
                body,
            })
        };
        tokio::time::timeout(self.timeout, fut)
            .await
            .map_err(|_| CallError::Timeout)?
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

/// Serves `app` on `listener` until `signal` completes (then finishes the requests
/// under way). Every accepted connection gets `TCP_NODELAY`: small answers go out at
/// once, not behind an unacknowledged write (measured: P3 end to end 0.46 → 0.33 ms).
pub async fn serve_until(
    listener: tokio::net::TcpListener,
    app: axum::Router,
    signal: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    axum::serve(
        axum::serve::ListenerExt::tap_io(listener, |tcp| {
            let _ = tcp.set_nodelay(true);
        }),
        app,
    )
    .with_graceful_shutdown(signal)
    .await
}
