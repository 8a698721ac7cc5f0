//! The Rust SDK of SPACE.
//!
//! A [`Client`] holds the edge's URL and an API key. Lifecycle calls (create, get, list,
//! delete, pause, resume, migrate, the network policy) go to the edge, and so do service ports (expose,
//! list, close, links, and TCP tunnels: [`Client::connect_port`]). Sandbox-scoped
//! operations (exec and files) go, by default, straight to the worker that serves the
//! sandbox — **direct mode**: the client asks the edge for a capability once, caches
//! the route it names until shortly before it expires, and sends each operation to
//! that worker's node-api with `Authorization: SpaceCap …`. The worker admits every
//! request against its own record of the execution, exactly as it does for the edge,
//! so direct mode gives up no check; it only takes the edge's hop off the path.
//!
//! A worker that no longer serves the execution a capability names answers 421
//! (RefreshRoute). The client then follows `IDENTITY.md` §4 as the edge does, with the
//! same pure rules (`space_identity::Recovery`, `RouteCache`): one resolve per sandbox
//! at a time (concurrent operations share it), one rebuilt attempt for an eligible
//! operation, the cache entry replaced only if it still names the rejected route. A
//! Deny (403) is surfaced and never retried. Exec, write and remove carry an
//! idempotency key, so the one retry after a transport failure cannot run them twice.
//!
//! [`Options::direct`] `false` sends every operation through the edge instead (for
//! clients that cannot reach the workers).
//!
//! ```no_run
//! # async fn demo() -> Result<(), space_client::Error> {
//! let client = space_client::Client::new("http://127.0.0.1:7070", "space_…");
//! let sandbox = client.create_sandbox(&Default::default()).await?;
//! let out = client.exec(&sandbox.id, &space_client::exec(["echo", "hi"])).await?;
//! assert_eq!(out.stdout, "hi\n");
//! client.write_file(&sandbox.id, "/root/a.txt", "data").await?;
//! let data = client.read_file(&sandbox.id, "/root/a.txt").await?;
//! # Ok(()) }
//! ```

use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use hyper::{Method, StatusCode};
use serde::de::DeserializeOwned;
pub use space_http::Answer;
use space_http::{CallError, HttpClient};
pub use space_identity::OperationClass;
use space_identity::{Progress, RecoveryError, Route, SandboxId, WorkerId};
use space_proto::api::{CapabilityResponse, ErrorBody};
pub use space_proto::api::{
    CreateSandbox, ExecRequest, ExecResponse, FileEntry, NetworkMode, Policy, Sandbox,
    SandboxState, WorkerView,
};
use space_route::RouteDriver;

/// Why a call failed.
#[derive(Debug)]
pub enum Error {
    /// The platform answered with an error: `{"error", "message", "reason"?}`.
    Api {
        /// HTTP status.
        status: StatusCode,
        /// Stable code (`not_found`, `deny`, `refresh_route`, …).
        code: String,
        /// Human-readable text.
        message: String,
        /// The identity check's reason code, for `deny` and `refresh_route`.
        reason: Option<String>,
    },
    /// No complete answer came back.
    Transport(CallError),
    /// The operation was not repeated on a new route: the route changed again after
    /// the one rebuilt attempt, or a mutation may already have run at an execution
    /// that is gone.
    Route(RecoveryError),
    /// An answer that is not what the API promises.
    Decode(String),
    /// A stream could not be opened, or failed.
    Stream(String),
    /// A stream was closed with another code than 1000 (normal end): 4001 when the
    /// execution it ran in was replaced, which is never silently reattached.
    Closed {
        /// The WebSocket close code.
        code: u16,
        /// Its reason text.
        reason: String,
    },
    /// The worker answered from another execution than the route the request was
    /// sent on named: the answer was dropped (this never happens unless something
    /// is badly wrong; it is checked on every answer in direct mode).
    WrongExecution {
        /// The route's execution.
        expected: String,
        /// The execution the answer named.
        got: String,
    },
}

impl Error {
    /// The HTTP status of an API error.
    pub fn status(&self) -> Option<StatusCode> {
        match self {
            Self::Api { status, .. } => Some(*status),
            _ => None,
        }
    }

    /// The stable code of an API error.
    pub fn code(&self) -> Option<&str> {
        match self {
            Self::Api { code, .. } => Some(code),
            _ => None,
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Api {
                status,
                code,
                message,
                reason,
            } => {
                write!(f, "{message} ({code}, {}", status.as_u16())?;
                match reason {
                    Some(r) => write!(f, ", reason {r})"),
                    None => f.write_str(")"),
                }
            }
            Self::Transport(e) => write!(f, "{e}"),
            Self::Route(e) => write!(f, "{e}"),
            Self::Decode(e) => write!(f, "unexpected answer: {e}"),
            Self::Stream(e) => write!(f, "stream: {e}"),
            Self::Closed { code, reason } => write!(f, "stream: closed: {reason} ({code})"),
            Self::WrongExecution { expected, got } => write!(
                f,
                "the answer came from execution {got}, not {expected} the route named; dropped"
            ),
        }
    }
}

impl std::error::Error for Error {}

impl From<CallError> for Error {
    fn from(e: CallError) -> Self {
        Self::Transport(e)
    }
}

impl From<RecoveryError> for Error {
    fn from(e: RecoveryError) -> Self {
        Self::Route(e)
    }
}

/// How a [`Client`] talks to the platform.
#[derive(Clone, Debug)]
pub struct Options {
    /// Send exec and file operations straight to the sandbox's worker (the default),
    /// or through the edge.
    pub direct: bool,
    /// Longest wait for one answer (an exec waits for its command).
    pub timeout: Duration,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            direct: true,
            timeout: Duration::from_secs(300),
        }
    }
}

/// A client of one SPACE installation. Cheap to clone; clones share connections and
/// the route cache.
#[derive(Clone, Debug)]
pub struct Client {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    /// The edge's base URL, without a trailing `/`.
    url: String,
    /// `Bearer <api key>`.
    bearer: String,
    http: HttpClient,
    direct: bool,
    /// The route cache and recovery of direct mode.
    routes: RouteDriver<Grant>,
    /// What route recovery cost so far.
    recoveries: Mutex<Recoveries>,
}

/// Rebuilt attempts this client made (direct mode) and the latency each added: from
/// the worker's RefreshRoute to the rebuilt attempt's outcome.
#[derive(Clone, Debug, Default)]
pub struct Recoveries {
    /// Rebuilt attempts that ended (in success or not).
    pub rebuilt: u64,
    /// The added latency of each, up to [`Recoveries::KEPT`] of them (the first ones).
    pub added: Vec<Duration>,
}

impl Recoveries {
    /// Latencies kept at most.
    pub const KEPT: usize = 1 << 20;
}

/// What one attempt on a route gave (see [`space_route::Attempt`]).
type Attempt<T> = space_route::Attempt<T, Error>;

/// A worker's (or the edge's) refusal of an attempt: RefreshRoute (421) or Deny (403).
fn refused<T>(a: &Answer) -> Option<Attempt<T>> {
    match a.status {
        StatusCode::MISDIRECTED_REQUEST => Some(Attempt::RefreshRoute {
            reason: space_proto::api::refresh_reason(error_body(a).as_ref()),
            answer: api_error(a),
        }),
        StatusCode::FORBIDDEN => Some(Attempt::Denied {
            reason: error_body(a).and_then(|b| b.reason).unwrap_or_default(),
            answer: Err(api_error(a)),
        }),
        _ => None,
    }
}

/// What a cached route is used with.
#[derive(Debug)]
struct Grant {
    /// `SpaceCap <token>`.
    authorization: String,
    /// The worker's node-api base URL.
    worker_url: String,
    /// The route's execution, as the worker names it in `space-execution`.
    execution: String,
}

/// Routes cached at most (one per sandbox used).
const ROUTES: usize = 10_000;

/// An [`ExecRequest`] running `argv`.
pub fn exec<I, S>(argv: I) -> ExecRequest
where
    I: IntoIterator<Item = S>,
    S: Into<String>,
{
    ExecRequest {
        cmd: argv.into_iter().map(Into::into).collect(),
        ..ExecRequest::default()
    }
}

/// An [`ExecRequest`] running `argv` with `stdin` (any bytes, not only text; at most
/// [`space_proto::api::MAX_EXEC_STDIN`], 64 MiB: more is `413 too_large`, stream it
/// with [`Client::exec_stream`] and [`ExecStream::send_stdin`] instead) written to its
/// stdin, which is then closed.
pub fn exec_with_stdin<I, S>(argv: I, stdin: &[u8]) -> ExecRequest
where
    I: IntoIterator<Item = S>,
    S: Into<String>,
{
    ExecRequest {
        stdin_base64: Some(base64_standard(stdin)),
        ..exec(argv)
    }
}

/// Standard, padded base64 (as `stdin_base64` takes it).
fn base64_standard(data: &[u8]) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.encode(data)
}

/// `s` as a URL query value (unreserved characters and `/` kept, the rest
/// percent-encoded).
pub fn encode_query(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~' | b'/') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

impl Client {
    /// A client of the edge at `url` (`http://host:port`) with `api_key`, in direct
    /// mode.
    pub fn new(url: &str, api_key: &str) -> Self {
        Self::with_options(url, api_key, Options::default())
    }

    /// A client with `options`.
    pub fn with_options(url: &str, api_key: &str, options: Options) -> Self {
        Self {
            inner: Arc::new(Inner {
                url: url.trim_end_matches('/').to_owned(),
                bearer: format!("Bearer {api_key}"),
                http: HttpClient::new(options.timeout),
                direct: options.direct,
                routes: RouteDriver::new(ROUTES),
                recoveries: Mutex::default(),
            }),
        }
    }

    // ---- lifecycle (edge) -------------------------------------------------------------

    /// Creates a sandbox. Its network policy is `req.network` (`None`: the platform's
    /// default, loopback only unless the operator chose otherwise), as its limits
    /// are `req.limits`:
    ///
    /// ```no_run
    /// # async fn demo(client: &space_client::Client) -> Result<(), space_client::Error> {
    /// use space_client::{CreateSandbox, NetworkMode, Policy};
    /// let network = Policy::parse(NetworkMode::Egress, &["pypi.org", "*.pythonhosted.org"], &[] as &[&str])
    ///     .expect("valid rules");
    /// let req = CreateSandbox { network: Some(network), ..Default::default() };
    /// let sandbox = client.create_sandbox(&req).await?;
    /// # Ok(()) }
    /// ```
    pub async fn create_sandbox(&self, req: &CreateSandbox) -> Result<Sandbox, Error> {
        decode(&self.edge_json(Method::POST, "/v1/sandboxes", req).await?)
    }

    /// One sandbox.
    pub async fn sandbox(&self, id: &SandboxId) -> Result<Sandbox, Error> {
        let a = self
            .edge(
                Method::GET,
                &format!("/v1/sandboxes/{id}"),
                None,
                Bytes::new(),
            )
            .await?;
        decode(&a)
    }

    /// The caller's sandboxes.
    pub async fn sandboxes(&self) -> Result<Vec<Sandbox>, Error> {
        decode(
            &self
                .edge(Method::GET, "/v1/sandboxes", None, Bytes::new())
                .await?,
        )
    }

    /// Stops and deletes a sandbox.
    pub async fn delete_sandbox(&self, id: &SandboxId) -> Result<(), Error> {
        self.edge(
            Method::DELETE,
            &format!("/v1/sandboxes/{id}"),
            None,
            Bytes::new(),
        )
        .await?;
        self.inner.routes.forget_sandbox(id);
        Ok(())
    }

    /// Freezes a sandbox in place.
    pub async fn pause(&self, id: &SandboxId) -> Result<Sandbox, Error> {
        let path = format!("/v1/sandboxes/{id}/pause");
        decode(&self.edge(Method::POST, &path, None, Bytes::new()).await?)
    }

    /// Resumes a paused sandbox, where it was or (as a new execution) on `worker`.
    pub async fn resume(
        &self,
        id: &SandboxId,
        worker: Option<&WorkerId>,
    ) -> Result<Sandbox, Error> {
        let body = serde_json::json!({ "worker": worker });
        let path = format!("/v1/sandboxes/{id}/resume");
        decode(&self.edge_json(Method::POST, &path, &body).await?)
    }

    /// Replaces a sandbox's network policy (`PATCH /v1/sandboxes/{id}/network`): new
    /// connections of its running execution are judged by it once the answer comes,
    /// and every later execution gets it. A worker that did not take it is an
    /// [`Error::Api`] `bad_gateway` (the policy is stored: send it again).
    pub async fn set_network(&self, id: &SandboxId, policy: &Policy) -> Result<Sandbox, Error> {
        let path = format!("/v1/sandboxes/{id}/network");
        decode(&self.edge_json(Method::PATCH, &path, policy).await?)
    }

    /// Moves a sandbox to `worker` as a new execution.
    pub async fn migrate(&self, id: &SandboxId, worker: &WorkerId) -> Result<Sandbox, Error> {
        let body = serde_json::json!({ "worker": worker });
        let path = format!("/v1/sandboxes/{id}/migrate");
        decode(&self.edge_json(Method::POST, &path, &body).await?)
    }

    // ---- operations (worker in direct mode) -------------------------------------------

    /// Runs a command to its end.
    pub async fn exec(&self, id: &SandboxId, req: &ExecRequest) -> Result<ExecResponse, Error> {
        let body = serde_json::to_vec(req).map_err(|e| Error::Decode(e.to_string()))?;
        let a = self
            .operate(
                id,
                Method::POST,
                &format!("/v1/sandboxes/{id}/exec"),
                Some("application/json"),
                Bytes::from(body),
                mutation(),
            )
            .await?;
        decode(&a)
    }

    /// A file's bytes, in memory: at most [`READ_FILE_MAX`] (a larger file is refused
    /// with `413 too_large`, never cut). Stream any size with [`Client::read_file_to`].
    pub async fn read_file(&self, id: &SandboxId, path: &str) -> Result<Bytes, Error> {
        self.read_file_bounded(id, path).await
    }

    /// Writes a file, replacing what was there (its directory must exist).
    pub async fn write_file(
        &self,
        id: &SandboxId,
        path: &str,
        data: impl Into<Bytes>,
    ) -> Result<(), Error> {
        self.operate(
            id,
            Method::PUT,
            &files(id, "files", path),
            Some("application/octet-stream"),
            data.into(),
            mutation(),
        )
        .await
        .map(drop)
    }

    /// A directory's entries.
    pub async fn list_files(&self, id: &SandboxId, path: &str) -> Result<Vec<FileEntry>, Error> {
        let a = self
            .operate(
                id,
                Method::GET,
                &files(id, "files/list", path),
                None,
                Bytes::new(),
                OperationClass::Read,
            )
            .await?;
        decode(&a)
    }

    /// What the platform refused the sandbox lately (network policy refusals on its
    /// current execution), newest first.
    pub async fn events(
        &self,
        id: &SandboxId,
    ) -> Result<Vec<space_proto::api::SandboxEvent>, Error> {
        let a = self
            .operate(
                id,
                Method::GET,
                &format!("/v1/sandboxes/{id}/events"),
                None,
                Bytes::new(),
                OperationClass::Read,
            )
            .await?;
        decode::<space_proto::api::EventList>(&a).map(|l| l.events)
    }

    /// Removes a file or a directory with what is in it.
    pub async fn remove_file(&self, id: &SandboxId, path: &str) -> Result<(), Error> {
        self.operate(
            id,
            Method::DELETE,
            &files(id, "files", path),
            None,
            Bytes::new(),
            mutation(),
        )
        .await
        .map(drop)
    }

    /// Any sandbox-scoped operation of the node API (`path_and_query` under
    /// `/v1/sandboxes/{id}/`), through the edge or in direct mode, with the recovery
    /// rules of `class` (a mutation with `idempotency_key: true` gets a fresh key). The
    /// whole answer comes back, headers included: `space-execution` names the execution
    /// that produced it (in direct mode already checked against the route used).
    pub async fn operation(
        &self,
        sandbox: &SandboxId,
        method: Method,
        path_and_query: &str,
        content_type: Option<&str>,
        body: Bytes,
        class: OperationClass,
    ) -> Result<Answer, Error> {
        self.operate(sandbox, method, path_and_query, content_type, body, class)
            .await
    }

    // ---- the two paths ----------------------------------------------------------------

    /// One call to the edge; an error status becomes [`Error::Api`].
    async fn edge(
        &self,
        method: Method,
        path_and_query: &str,
        extra: Option<&[(&str, &str)]>,
        body: Bytes,
    ) -> Result<Answer, Error> {
        let mut h = vec![("authorization", self.inner.bearer.as_str())];
        h.extend_from_slice(extra.unwrap_or_default());
        let url = format!("{}{path_and_query}", self.inner.url);
        let a = self.inner.http.call(method, &url, &h, body).await?;
        if a.status.is_success() {
            Ok(a)
        } else {
            Err(api_error(&a))
        }
    }

    async fn edge_json(
        &self,
        method: Method,
        path: &str,
        body: &impl serde::Serialize,
    ) -> Result<Answer, Error> {
        let body = serde_json::to_vec(body).map_err(|e| Error::Decode(e.to_string()))?;
        let h = [("content-type", "application/json")];
        self.edge(method, path, Some(&h), Bytes::from(body)).await
    }

    /// A sandbox-scoped operation: through the edge, or to the worker with recovery.
    async fn operate(
        &self,
        sandbox: &SandboxId,
        method: Method,
        path_and_query: &str,
        content_type: Option<&str>,
        body: Bytes,
        class: OperationClass,
    ) -> Result<Answer, Error> {
        let key = matches!(
            class,
            OperationClass::Mutation {
                idempotency_key: true
            }
        )
        .then(idempotency_key);
        let mut extra: Vec<(&str, &str)> = Vec::with_capacity(2);
        if let Some(ct) = content_type {
            extra.push(("content-type", ct));
        }
        if let Some(k) = &key {
            extra.push(("idempotency-key", k));
        }
        if !self.inner.direct {
            return self.edge(method, path_and_query, Some(&extra), body).await;
        }
        let extra = &extra;
        self.on_route(sandbox, class, |grant| {
            let (method, body) = (method.clone(), body.clone());
            async move {
                let mut h = vec![("authorization", grant.authorization.as_str())];
                h.extend_from_slice(extra);
                let url = format!("{}{path_and_query}", grant.worker_url);
                match self.inner.http.call(method, &url, &h, body).await {
                    Ok(a) => match refused(&a) {
                        Some(refusal) => refusal,
                        None if wrong_execution(&a, &grant).is_some() => {
                            let got = wrong_execution(&a, &grant).unwrap_or_default();
                            Attempt::Done(Err(Error::WrongExecution {
                                expected: grant.execution.clone(),
                                got,
                            }))
                        }
                        None if a.status.is_success() => Attempt::Done(Ok(a)),
                        None => Attempt::Done(Err(api_error(&a))),
                    },
                    Err(e) => {
                        let progress = match e {
                            CallError::Connect(_) => Progress::NotStarted,
                            _ => Progress::Started,
                        };
                        Attempt::Failed {
                            error: Error::Transport(e),
                            progress,
                        }
                    }
                }
            }
        })
        .await
    }
}

fn grant_of(cap: CapabilityResponse) -> (Route, Grant) {
    let route = cap.route.route();
    let grant = Grant {
        authorization: format!("SpaceCap {}", cap.token),
        worker_url: cap.route.worker_url,
        execution: cap.route.execution_id.to_string(),
    };
    (route, grant)
}

/// The execution an answer names when it is not the one of `grant`'s route.
fn wrong_execution(a: &Answer, grant: &Grant) -> Option<String> {
    let named = a.headers.get("space-execution")?.to_str().unwrap_or("?");
    (!named.is_empty() && named != grant.execution).then(|| named.to_owned())
}

fn mutation() -> OperationClass {
    OperationClass::Mutation {
        idempotency_key: true,
    }
}

fn files(id: &SandboxId, what: &str, path: &str) -> String {
    format!("/v1/sandboxes/{id}/{what}?path={}", encode_query(path))
}

/// 128 random bits, hex: the worker keeps an operation's answer under it, so a retry
/// after a lost answer gets that answer instead of running the operation again.
fn idempotency_key() -> String {
    let mut bytes = [0u8; 16];
    let mut filled = 0;
    while filled < bytes.len() {
        match rustix::rand::getrandom(&mut bytes[filled..], rustix::rand::GetRandomFlags::empty()) {
            Ok(n) => filled += n,
            Err(rustix::io::Errno::INTR) => {}
            // getrandom(2) only fails on a kernel without it; nothing runs there.
            Err(e) => panic!("getrandom failed: {e}"),
        }
    }
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn error_body(a: &Answer) -> Option<ErrorBody> {
    serde_json::from_slice(&a.body).ok()
}

fn api_error(a: &Answer) -> Error {
    let body = error_body(a).unwrap_or_else(|| ErrorBody {
        error: "http".into(),
        message: String::from_utf8_lossy(&a.body).into_owned(),
        reason: None,
    });
    Error::Api {
        status: a.status,
        code: body.error,
        message: body.message,
        reason: body.reason,
    }
}

fn decode<T: DeserializeOwned>(a: &Answer) -> Result<T, Error> {
    serde_json::from_slice(&a.body).map_err(|e| Error::Decode(e.to_string()))
}

mod commit;
mod files;
mod platform;
mod ports;
mod routes;
mod streams;
mod templates;
pub use files::{ByteRange, READ_FILE_MAX, RangeRead, WriteOptions};
pub use ports::{MAX_CONNECT_HEAD, PortCredential, PortTunnel};
pub use space_identity::Protocol;
pub use space_proto::api::ports::{ExposePort, PortList, PortView};
pub use streams::{
    ExecEvent, ExecInput, ExecOutput, ExecStream, Terminal, TerminalEvent, TerminalInput,
    TerminalOutput, WatchStream,
};
pub use templates::{ImageArchive, TemplateConfig, TemplateList, TemplateView};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn query_values_keep_paths_readable_and_encode_the_rest() {
        assert_eq!(encode_query("/root/a-b_c.~d"), "/root/a-b_c.~d");
        assert_eq!(encode_query("/a b&c=d?é"), "/a%20b%26c%3Dd%3F%C3%A9");
    }

    #[test]
    fn idempotency_keys_are_fresh_128_bit_hex() {
        let (a, b) = (idempotency_key(), idempotency_key());
        assert_eq!(a.len(), 32);
        assert!(a.bytes().all(|c| c.is_ascii_hexdigit()));
        assert_ne!(a, b);
    }

    #[test]
    fn api_errors_keep_code_message_and_reason() {
        let a = Answer {
            status: StatusCode::FORBIDDEN,
            headers: Default::default(),
            body: Bytes::from_static(
                br#"{"error":"deny","message":"denied","reason":"wrong_sandbox"}"#,
            ),
        };
        let e = api_error(&a);
        assert_eq!(e.status(), Some(StatusCode::FORBIDDEN));
        assert_eq!(e.code(), Some("deny"));
        assert_eq!(e.to_string(), "denied (deny, 403, reason wrong_sandbox)");
        let plain = Answer {
            status: StatusCode::BAD_GATEWAY,
            headers: Default::default(),
            body: Bytes::from_static(b"upstream gone"),
        };
        assert_eq!(api_error(&plain).to_string(), "upstream gone (http, 502)");
    }
}

#[cfg(test)]
mod stdin_tests {
    #[test]
    fn stdin_base64_is_standard_padded_base64() {
        // RFC 4648's test vectors, and every byte value.
        for (plain, encoded) in [
            ("", ""),
            ("f", "Zg=="),
            ("fo", "Zm8="),
            ("foo", "Zm9v"),
            ("foob", "Zm9vYg=="),
            ("fooba", "Zm9vYmE="),
            ("foobar", "Zm9vYmFy"),
        ] {
            assert_eq!(super::base64_standard(plain.as_bytes()), encoded);
        }
        let all: Vec<u8> = (0..=255).collect();
        assert!(super::base64_standard(&all).ends_with("+/w=="));
    }
}
