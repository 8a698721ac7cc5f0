//! HTTP/1.1 GETs, one connection each, through the workspace's hyper client: TCP
//! (plain only to loopback addresses, checked again after name resolution), TLS by
//! rustls for `https`. Connecting (resolution, TCP, TLS, HTTP handshake) is bounded
//! by [`CONNECT_TIMEOUT`]; the answer's head and then every read of its body by
//! [`READ_TIMEOUT`].

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt as _, Empty};
use hyper::body::Incoming;
use hyper::client::conn::http1::SendRequest;
use hyper::header::{self, HeaderMap, HeaderValue};
use hyper::{Request, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;

use crate::error::{RegistryError, Result, printable};
use crate::url::{Scheme, Url};

/// How long a connection may take to be made (resolution, TCP, TLS, HTTP).
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// How long the answer's head, and each read of its body, may take.
pub const READ_TIMEOUT: Duration = Duration::from_secs(60);

/// The timeouts of a transport.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timeouts {
    /// See [`CONNECT_TIMEOUT`].
    pub connect: Duration,
    /// See [`READ_TIMEOUT`].
    pub read: Duration,
}

impl Default for Timeouts {
    fn default() -> Self {
        Self {
            connect: CONNECT_TIMEOUT,
            read: READ_TIMEOUT,
        }
    }
}

/// Makes connections for a pull.
#[derive(Debug)]
pub(crate) struct Transport {
    plain_http: bool,
    ca_file: Option<PathBuf>,
    timeouts: Timeouts,
    /// Made at the first HTTPS connection (a plain-HTTP pull needs no roots).
    tls: Mutex<Option<Arc<rustls::ClientConfig>>>,
}

/// Aborts the task driving a connection when the answer using it goes.
#[derive(Debug)]
struct Connection(tokio::task::JoinHandle<()>);

impl Drop for Connection {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// An answer: its status and headers, its body read on demand.
#[derive(Debug)]
pub(crate) struct Answer {
    pub(crate) url: Url,
    pub(crate) status: StatusCode,
    pub(crate) headers: HeaderMap,
    body: Incoming,
    read_timeout: Duration,
    _connection: Connection,
}

const USER_AGENT: &str = concat!("space/", env!("CARGO_PKG_VERSION"));

impl Transport {
    pub(crate) fn new(plain_http: bool, ca_file: Option<PathBuf>, timeouts: Timeouts) -> Self {
        Self {
            plain_http,
            ca_file,
            timeouts,
            tls: Mutex::new(None),
        }
    }

    /// Whether plain HTTP was asked for.
    pub(crate) fn plain_http(&self) -> bool {
        self.plain_http
    }

    fn tls(&self) -> Result<Arc<rustls::ClientConfig>> {
        let mut slot = self.tls.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(c) = slot.as_ref() {
            return Ok(Arc::clone(c));
        }
        let roots = crate::tls::load_roots(self.ca_file.as_deref())?;
        let config = crate::tls::client_config(roots)?;
        *slot = Some(Arc::clone(&config));
        Ok(config)
    }

    /// `GET url` with `headers` (and `Host`, `User-Agent`); the answer whatever its
    /// status.
    pub(crate) async fn get(&self, url: &Url, headers: HeaderMap) -> Result<Answer> {
        url.check_scheme(self.plain_http)?;
        let connect = self.connect(url);
        let (mut sender, connection) = tokio::time::timeout(self.timeouts.connect, connect)
            .await
            .map_err(|_| RegistryError::Timeout {
                url: url.to_string(),
                secs: self.timeouts.connect.as_secs(),
                during: "connecting",
            })??;
        let mut request = Request::get(url.path.as_str())
            .body(Empty::<Bytes>::new())
            .map_err(|e| http_error(url, e))?;
        *request.headers_mut() = headers;
        let h = request.headers_mut();
        let host = HeaderValue::from_str(&url.authority()).map_err(|e| http_error(url, e))?;
        h.insert(header::HOST, host);
        h.insert(header::USER_AGENT, HeaderValue::from_static(USER_AGENT));
        let response = tokio::time::timeout(self.timeouts.read, sender.send_request(request))
            .await
            .map_err(|_| RegistryError::Timeout {
                url: url.to_string(),
                secs: self.timeouts.read.as_secs(),
                during: "waiting for the answer",
            })?
            .map_err(|e| http_error(url, e))?;
        let (parts, body) = response.into_parts();
        Ok(Answer {
            url: url.clone(),
            status: parts.status,
            headers: parts.headers,
            body,
            read_timeout: self.timeouts.read,
            _connection: connection,
        })
    }

    async fn connect(&self, url: &Url) -> Result<(SendRequest<Empty<Bytes>>, Connection)> {
        let authority = format!("{}:{}", url.host, url.port);
        let failed = |why: String| RegistryError::Connect {
            authority: authority.clone(),
            why,
        };
        let mut addrs: Vec<SocketAddr> = tokio::net::lookup_host((url.host.as_str(), url.port))
            .await
            .map_err(|e| failed(e.to_string()))?
            .collect();
        if url.scheme == Scheme::Http {
            // `localhost` (or any name) must resolve to loopback only to go in clear.
            addrs.retain(|a| a.ip().is_loopback());
            if addrs.is_empty() {
                return Err(RegistryError::PlainHttp {
                    url: url.to_string(),
                    why: "the name resolves to no loopback address (plain HTTP goes only there)",
                });
            }
        }
        let mut last = String::from("the name resolves to no address");
        let mut tcp = None;
        for a in addrs {
            match TcpStream::connect(a).await {
                Ok(s) => {
                    tcp = Some(s);
                    break;
                }
                Err(e) => last = format!("{a}: {e}"),
            }
        }
        let tcp = tcp.ok_or_else(|| failed(last))?;
        let _ = tcp.set_nodelay(true);
        match url.scheme {
            Scheme::Http => handshake(tcp, url).await,
            Scheme::Https => {
                let connector = tokio_rustls::TlsConnector::from(self.tls()?);
                let name = rustls_pki_types::ServerName::try_from(url.host.clone())
                    .map_err(|e| failed(format!("not a TLS server name: {e}")))?;
                let tls = connector
                    .connect(name, tcp)
                    .await
                    .map_err(|e| failed(format!("TLS: {e}")))?;
                handshake(tls, url).await
            }
        }
    }
}

async fn handshake<S>(io: S, url: &Url) -> Result<(SendRequest<Empty<Bytes>>, Connection)>
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(io))
        .await
        .map_err(|e| http_error(url, e))?;
    let task = tokio::spawn(async move {
        if let Err(e) = conn.await {
            tracing::debug!(error = %e, "registry connection ended");
        }
    });
    let connection = Connection(task);
    sender.ready().await.map_err(|e| http_error(url, e))?;
    Ok((sender, connection))
}

fn http_error(url: &Url, e: impl std::fmt::Display) -> RegistryError {
    RegistryError::Http {
        url: url.to_string(),
        why: e.to_string(),
    }
}

impl Answer {
    /// The `Content-Length`, if it states one.
    pub(crate) fn content_length(&self) -> Option<u64> {
        self.headers
            .get(header::CONTENT_LENGTH)?
            .to_str()
            .ok()?
            .parse()
            .ok()
    }

    /// A header as text, if it is some.
    pub(crate) fn header(&self, name: header::HeaderName) -> Option<&str> {
        self.headers.get(name)?.to_str().ok()
    }

    /// The next bytes of the body (`None` at its end), within the read timeout.
    pub(crate) async fn chunk(&mut self) -> Result<Option<Bytes>> {
        loop {
            let frame = tokio::time::timeout(self.read_timeout, self.body.frame())
                .await
                .map_err(|_| RegistryError::Timeout {
                    url: self.url.to_string(),
                    secs: self.read_timeout.as_secs(),
                    during: "reading the body",
                })?;
            match frame {
                None => return Ok(None),
                Some(Err(e)) => return Err(http_error(&self.url, e)),
                Some(Ok(f)) => {
                    if let Ok(data) = f.into_data() {
                        return Ok(Some(data));
                    }
                }
            }
        }
    }

    /// The whole body, refused past `limit` bytes (before reading, when its length
    /// says so; else as soon as more has come).
    pub(crate) async fn read_bounded(mut self, limit: u64, what: &str) -> Result<Vec<u8>> {
        let too_large = || RegistryError::TooLarge {
            what: what.to_owned(),
            limit,
        };
        if self.content_length().is_some_and(|n| n > limit) {
            return Err(too_large());
        }
        let mut out = Vec::new();
        while let Some(c) = self.chunk().await? {
            if out.len() as u64 + c.len() as u64 > limit {
                return Err(too_large());
            }
            out.extend_from_slice(&c);
        }
        Ok(out)
    }

    /// The start of an error answer's body, for a message: `: text` or nothing.
    pub(crate) async fn message(mut self) -> String {
        let mut out = Vec::new();
        while out.len() < 2048 {
            match self.chunk().await {
                Ok(Some(c)) => out.extend_from_slice(&c[..c.len().min(2048)]),
                _ => break,
            }
        }
        let text = printable(&out, 200);
        if text.is_empty() {
            text
        } else {
            format!(": {text}")
        }
    }
}
