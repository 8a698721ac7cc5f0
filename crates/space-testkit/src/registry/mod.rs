//! An OCI registry for tests, on a loopback address and an ephemeral port, in a
//! runtime of its own (usable from sync and async tests alike; stopped on drop).
//!
//! It serves what a test pushes (`/v2/<name>/manifests/<ref>`, `/v2/<name>/blobs/<digest>`),
//! requires a bearer token from its own `/token` endpoint when asked to (that
//! endpoint requiring Basic credentials when given some), speaks HTTPS with a
//! [`TestCa`]'s certificate when given one, records every request (path, `Host`,
//! `Authorization`), and gives a hostile answer for a path when told to
//! ([`Answer`]): redirects, wrong bytes, endless or oversized bodies.

mod ca;
mod image;

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use base64::Engine as _;
use bytes::Bytes;
use hyper::body::{Body, Frame, Incoming};
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;

pub use ca::{TestCa, have_openssl};
pub use image::{Blob, LayerBuilder, MediaTypes, TestImage, sha256};

/// The token the registry hands out and requires.
const TOKEN: &str = "test-registry-token";

/// A hostile (or just unusual) answer for one path.
#[derive(Debug, Clone)]
pub enum Answer {
    /// `302` to this location.
    Redirect(String),
    /// `200` with these bytes (and their `Content-Length`).
    Bytes(Vec<u8>),
    /// `200` with `chunk` sent `times` times, chunked (no length said).
    Chunked {
        /// One chunk.
        chunk: Vec<u8>,
        /// How many.
        times: usize,
    },
    /// This status, empty.
    Status(u16),
}

/// How the registry behaves.
#[derive(Debug, Clone, Default)]
pub struct Options {
    /// Require a bearer token from `/token` on `/v2/…`.
    pub token: bool,
    /// Credentials the token endpoint requires (Basic), if any.
    pub basic: Option<(String, String)>,
    /// Serve HTTPS with this CA's certificate (its cert and key files).
    pub tls: Option<(std::path::PathBuf, std::path::PathBuf)>,
    /// The loopback address to bind (127.0.0.1 if none).
    pub bind: Option<IpAddr>,
    /// The realm its challenges name (its own `/token` if none).
    pub realm: Option<String>,
    /// Require `basic`'s credentials on `/v2/…` itself, with a `Basic` challenge
    /// (instead of a token).
    pub basic_challenge: bool,
}

/// One request received.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Recorded {
    /// Path and query.
    pub path: String,
    /// The `Host` header.
    pub host: Option<String>,
    /// The `Authorization` header.
    pub authorization: Option<String>,
}

#[derive(Debug, Default)]
struct Content {
    /// `(repository, tag or digest)` → (media type, bytes).
    manifests: HashMap<(String, String), (String, Vec<u8>)>,
    /// digest → bytes.
    blobs: HashMap<String, Vec<u8>>,
    /// path → answer.
    answers: HashMap<String, Answer>,
}

#[derive(Debug)]
struct State {
    content: Mutex<Content>,
    requests: Mutex<Vec<Recorded>>,
    options: Options,
    origin: String,
}

/// A running test registry.
#[derive(Debug)]
pub struct TestRegistry {
    addr: SocketAddr,
    state: Arc<State>,
    runtime: Option<tokio::runtime::Runtime>,
}

impl Drop for TestRegistry {
    fn drop(&mut self) {
        if let Some(rt) = self.runtime.take() {
            rt.shutdown_background();
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl TestRegistry {
    /// A registry behaving as `options` say.
    pub fn start(options: Options) -> Self {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("the test registry's runtime");
        let ip = options.bind.unwrap_or(IpAddr::V4(Ipv4Addr::LOCALHOST));
        let std_listener = std::net::TcpListener::bind((ip, 0)).expect("bind the test registry");
        std_listener.set_nonblocking(true).expect("nonblocking");
        let addr = std_listener.local_addr().expect("local addr");
        let scheme = if options.tls.is_some() {
            "https"
        } else {
            "http"
        };
        let tls = options
            .tls
            .as_ref()
            .map(|(cert, key)| server_tls(cert, key));
        let state = Arc::new(State {
            content: Mutex::new(Content::default()),
            requests: Mutex::new(Vec::new()),
            options,
            origin: format!("{scheme}://{addr}"),
        });
        let serving = Arc::clone(&state);
        runtime.spawn(async move {
            let listener = tokio::net::TcpListener::from_std(std_listener).expect("listener");
            loop {
                let Ok((tcp, _)) = listener.accept().await else {
                    continue;
                };
                let state = Arc::clone(&serving);
                let tls = tls.clone();
                tokio::spawn(async move {
                    let service = hyper::service::service_fn(move |req| {
                        let state = Arc::clone(&state);
                        async move { Ok::<_, Infallible>(serve(&state, req)) }
                    });
                    let http = hyper::server::conn::http1::Builder::new();
                    match tls {
                        Some(acceptor) => {
                            if let Ok(s) = acceptor.accept(tcp).await {
                                let _ = http.serve_connection(TokioIo::new(s), service).await;
                            }
                        }
                        None => {
                            let _ = http.serve_connection(TokioIo::new(tcp), service).await;
                        }
                    }
                });
            }
        });
        Self {
            addr,
            state,
            runtime: Some(runtime),
        }
    }

    /// A plain-HTTP registry on 127.0.0.1 requiring its bearer token.
    pub fn plain() -> Self {
        Self::start(Options {
            token: true,
            ..Options::default()
        })
    }

    /// `host:port`, as an image reference names the registry.
    pub fn address(&self) -> String {
        self.addr.to_string()
    }

    /// `http(s)://host:port`.
    pub fn origin(&self) -> &str {
        &self.state.origin
    }

    /// Stores a blob.
    pub fn put_blob(&self, bytes: &[u8]) -> String {
        let digest = sha256(bytes);
        lock(&self.state.content)
            .blobs
            .insert(digest.clone(), bytes.to_vec());
        digest
    }

    /// Stores a manifest (or index) under `reference` (a tag or a digest).
    pub fn put_manifest(&self, repository: &str, reference: &str, media_type: &str, bytes: &[u8]) {
        lock(&self.state.content).manifests.insert(
            (repository.to_owned(), reference.to_owned()),
            (media_type.to_owned(), bytes.to_vec()),
        );
    }

    /// Pushes `image` as `repository:tag` (its manifest by digest too).
    pub fn push(&self, repository: &str, tag: &str, image: &TestImage) {
        self.put_blob(&image.config.bytes);
        for l in &image.layers {
            self.put_blob(&l.bytes);
        }
        let m = &image.manifest;
        self.put_manifest(repository, &m.digest, &image.media_type, &m.bytes);
        self.put_manifest(repository, tag, &image.media_type, &m.bytes);
    }

    /// Pushes an OCI index of `images` (each with its platform, `os/arch`) as
    /// `repository:tag`; the index's digest.
    pub fn push_index(&self, repository: &str, tag: &str, images: &[(&str, &TestImage)]) -> String {
        let mut entries = Vec::new();
        for (platform, image) in images {
            self.push(repository, &image.manifest.digest, image);
            let (os, arch) = platform.split_once('/').expect("os/arch");
            entries.push(serde_json::json!({
                "mediaType": image.media_type,
                "digest": image.manifest.digest,
                "size": image.manifest.bytes.len(),
                "platform": {"os": os, "architecture": arch},
            }));
        }
        let media_type = "application/vnd.oci.image.index.v1+json";
        let index = serde_json::json!({
            "schemaVersion": 2,
            "mediaType": media_type,
            "manifests": entries,
        })
        .to_string();
        self.put_manifest(repository, tag, media_type, index.as_bytes());
        let digest = sha256(index.as_bytes());
        self.put_manifest(repository, &digest, media_type, index.as_bytes());
        digest
    }

    /// Answers requests for `path` (`/v2/…`, no query) with `answer` from now on
    /// (after the token check, when one is required).
    pub fn answer(&self, path: &str, answer: Answer) {
        lock(&self.state.content)
            .answers
            .insert(path.to_owned(), answer);
    }

    /// Every request so far.
    pub fn requests(&self) -> Vec<Recorded> {
        lock(&self.state.requests).clone()
    }
}

fn server_tls(cert: &std::path::Path, key: &std::path::Path) -> tokio_rustls::TlsAcceptor {
    use rustls_pki_types::pem::PemObject as _;
    use rustls_pki_types::{CertificateDer, PrivateKeyDer};
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(cert)
        .expect("read the certificate")
        .collect::<Result<_, _>>()
        .expect("parse the certificate");
    let key = PrivateKeyDer::from_pem_file(key).expect("read the key");
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .expect("protocol versions")
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .expect("the server certificate");
    tokio_rustls::TlsAcceptor::from(Arc::new(config))
}

/// A body: `chunk` `times` times, no length stated.
struct Repeat {
    chunk: Bytes,
    left: usize,
}

impl Body for Repeat {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        if self.left == 0 {
            return Poll::Ready(None);
        }
        self.left -= 1;
        Poll::Ready(Some(Ok(Frame::data(self.chunk.clone()))))
    }
}

type Reply = Response<http_body_util::Either<http_body_util::Full<Bytes>, Repeat>>;

fn reply(status: u16, headers: &[(&str, String)], body: Vec<u8>) -> Reply {
    let mut r = Response::builder().status(status);
    for (k, v) in headers {
        r = r.header(*k, v.as_str());
    }
    r.body(http_body_util::Either::Left(http_body_util::Full::new(
        Bytes::from(body),
    )))
    .expect("response")
}

fn serve(state: &State, req: Request<Incoming>) -> Reply {
    let header = |name: &str| {
        req.headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
    };
    let path_and_query = req
        .uri()
        .path_and_query()
        .map_or_else(|| req.uri().path().to_owned(), |p| p.as_str().to_owned());
    let authorization = header("authorization");
    lock(&state.requests).push(Recorded {
        path: path_and_query,
        host: header("host"),
        authorization: authorization.clone(),
    });
    let path = req.uri().path().to_owned();
    let basic = state.options.basic.as_ref().map(|(user, password)| {
        format!(
            "Basic {}",
            base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"))
        )
    });
    let basic_ok = basic.is_none() || authorization == basic;
    if state.options.basic_challenge && path.starts_with("/v2/") && !basic_ok {
        let challenge = "Basic realm=\"test-registry\"".to_owned();
        return reply(401, &[("www-authenticate", challenge)], b"{}".to_vec());
    }
    if path == "/token" {
        if !basic_ok {
            return reply(
                401,
                &[],
                b"{\"errors\":[{\"code\":\"UNAUTHORIZED\"}]}".to_vec(),
            );
        }
        return reply(200, &[], format!("{{\"token\":\"{TOKEN}\"}}").into_bytes());
    }
    let Some(rest) = path.strip_prefix("/v2/") else {
        return reply(404, &[], Vec::new());
    };
    if state.options.token && authorization.as_deref() != Some(&format!("Bearer {TOKEN}")) {
        let repo = rest
            .rsplit_once("/manifests/")
            .or_else(|| rest.rsplit_once("/blobs/"))
            .map_or("", |(r, _)| r);
        let realm = state
            .options
            .realm
            .clone()
            .unwrap_or_else(|| format!("{}/token", state.origin));
        let challenge = format!(
            "Bearer realm=\"{realm}\",service=\"test-registry\",scope=\"repository:{repo}:pull\""
        );
        return reply(401, &[("www-authenticate", challenge)], b"{}".to_vec());
    }
    let content = lock(&state.content);
    if let Some(a) = content.answers.get(&path) {
        return match a.clone() {
            Answer::Redirect(to) => reply(302, &[("location", to)], Vec::new()),
            Answer::Bytes(b) => reply(200, &[], b),
            Answer::Status(s) => reply(s, &[], Vec::new()),
            Answer::Chunked { chunk, times } => Response::builder()
                .status(200)
                .body(http_body_util::Either::Right(Repeat {
                    chunk: Bytes::from(chunk),
                    left: times,
                }))
                .expect("response"),
        };
    }
    if rest.is_empty() {
        return reply(200, &[], b"{}".to_vec());
    }
    if let Some((repo, reference)) = rest.rsplit_once("/manifests/") {
        return match content
            .manifests
            .get(&(repo.to_owned(), reference.to_owned()))
        {
            Some((media_type, bytes)) => reply(
                200,
                &[
                    ("content-type", media_type.clone()),
                    ("docker-content-digest", sha256(bytes)),
                ],
                bytes.clone(),
            ),
            None => reply(
                404,
                &[],
                b"{\"errors\":[{\"code\":\"MANIFEST_UNKNOWN\"}]}".to_vec(),
            ),
        };
    }
    if let Some((_, digest)) = rest.rsplit_once("/blobs/") {
        return match content.blobs.get(digest) {
            Some(bytes) => reply(200, &[], bytes.clone()),
            None => reply(
                404,
                &[],
                b"{\"errors\":[{\"code\":\"BLOB_UNKNOWN\"}]}".to_vec(),
            ),
        };
    }
    reply(StatusCode::NOT_FOUND.as_u16(), &[], Vec::new())
}
