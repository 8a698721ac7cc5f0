//! The front's state and what every envd call starts from: the context of a call —
//! its access token checked, the sandbox it is routed to compared with the token's,
//! the account it runs as — and the calls through the edge, pinned to the token's
//! execution (a token from before a resume elsewhere or a migration is refused,
//! `unauthenticated`, never served by the new execution).

use std::sync::Arc;

use axum::body::Bytes;
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::response::Response;
use base64::Engine as _;
use space_control::auth::Caller;
use space_control::edge::{Authenticated, Backend, Edge, Forwarded};
use space_control::error::ControlError;
use space_control::service::ControlPlane;
use space_identity::{ExecutionId, OperationClass, SandboxId};
use space_proto::api::ErrorBody;

use crate::connect::{Code, RpcError};
use crate::{keys, proc_table, watch_table};

/// The port E2B's SDKs address envd at.
pub const ENVD_PORT: u16 = 49983;

/// The envd version this front advertises: what the SDKs switch features on by.
/// Only what is implemented is claimed (see `envd`).
pub const ENVD_VERSION: &str = "0.5.2";

/// The front's state, shared by its handlers.
#[derive(Debug)]
pub struct Front {
    pub(crate) cp: Arc<ControlPlane>,
    pub(crate) edge: Arc<Edge>,
    pub(crate) tokens: keys::Tokens,
    pub(crate) processes: proc_table::Table,
    pub(crate) watchers: watch_table::Table,
    /// Executions found replaced: their tokens are refused without asking the edge
    /// again (an execution that was replaced never serves again).
    replaced: std::sync::Mutex<
        std::collections::HashSet<(space_identity::SandboxId, space_identity::ExecutionId)>,
    >,
}

/// Replaced executions remembered at most (the set starts again when full).
const REPLACED_KEPT: usize = 100_000;

impl Front {
    pub(crate) fn new(cp: Arc<ControlPlane>, edge: Arc<Edge>) -> Arc<Self> {
        Arc::new(Self {
            tokens: keys::Tokens::new(Arc::clone(&cp)),
            cp,
            edge,
            processes: proc_table::Table::default(),
            watchers: watch_table::Table::default(),
            replaced: std::sync::Mutex::default(),
        })
    }

    /// Whether the execution is known to be replaced.
    pub(crate) fn is_replaced(
        &self,
        sandbox: &space_identity::SandboxId,
        execution: &space_identity::ExecutionId,
    ) -> bool {
        self.replaced
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .contains(&(*sandbox, *execution))
    }

    /// `e` as the envd error it is; an execution found replaced is remembered.
    pub(crate) fn envd_error(
        &self,
        ctx: &Envd,
        e: &space_control::error::ControlError,
    ) -> RpcError {
        if matches!(e, space_control::error::ControlError::ExecutionReplaced) {
            let mut r = self
                .replaced
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            if r.len() >= REPLACED_KEPT {
                r.clear();
            }
            r.insert((ctx.sandbox, ctx.execution));
        }
        rpc_error(e)
    }

    /// The domain sandboxes are named under (`{port}-{id}.{domain}`).
    pub(crate) fn domain(&self) -> String {
        self.cp.port_urls().domain
    }
}

/// The header naming the sandbox.
pub const SANDBOX_HEADER: &str = "e2b-sandbox-id";
/// The header naming the port inside it (envd's: 49983).
pub const PORT_HEADER: &str = "e2b-sandbox-port";
/// The header carrying a sandbox's traffic token to a port that is not public
/// (`network.allowPublicTraffic: false`).
pub const TRAFFIC_TOKEN_HEADER: &str = "e2b-traffic-access-token";
/// The header carrying the access token.
pub const TOKEN_HEADER: &str = "x-access-token";

/// `(port, sandbox)` of a host name `{port}-{sandbox}.{domain}[:port]`.
pub fn port_host(host: &str, domain: &str) -> Option<(u16, String)> {
    let name = host.rsplit_once(':').map_or(host, |(n, p)| {
        if p.bytes().all(|b| b.is_ascii_digit()) {
            n
        } else {
            host
        }
    });
    let name = name.to_ascii_lowercase();
    let label = name.strip_suffix(domain)?.strip_suffix('.')?;
    if label.contains('.') {
        return None;
    }
    let (port, sandbox) = label.split_once('-')?;
    Some((port.parse().ok()?, sandbox.to_owned()))
}

/// One envd call's context: who it acts for, on which sandbox and execution, as
/// which account of the sandbox.
#[derive(Debug)]
pub struct Envd {
    pub(crate) who: Authenticated,
    pub(crate) sandbox: SandboxId,
    pub(crate) execution: ExecutionId,
    /// The account of `Authorization: Basic` (`user:`), if any.
    pub(crate) user: Option<String>,
}

/// Why an envd call was refused before it ran.
pub(crate) fn unauthenticated(message: &str) -> RpcError {
    RpcError::new(Code::Unauthenticated, message)
}

impl Front {
    /// The context of an envd call, or why it is refused: the sandbox it is routed
    /// to must be the one its token names.
    pub(crate) async fn envd(&self, headers: &HeaderMap) -> Result<Envd, RpcError> {
        let routed = headers
            .get(SANDBOX_HEADER)
            .and_then(|v| v.to_str().ok())
            .map(|v| v.trim().to_owned())
            .or_else(|| {
                let host = headers.get(header::HOST)?.to_str().ok()?;
                port_host(host, &self.domain()).map(|(_, s)| s)
            })
            .ok_or_else(|| {
                RpcError::new(Code::InvalidArgument, "no sandbox named (E2b-Sandbox-Id)")
            })?;
        let token = headers
            .get(TOKEN_HEADER)
            .and_then(|v| v.to_str().ok())
            .ok_or_else(|| unauthenticated("an access token is required (X-Access-Token)"))?;
        self.envd_with_token(&routed, token, headers).await
    }

    /// The context of a call with `token` to the sandbox `routed`.
    pub(crate) async fn envd_with_token(
        &self,
        routed: &str,
        token: &str,
        headers: &HeaderMap,
    ) -> Result<Envd, RpcError> {
        let (claims, caller) = self
            .tokens
            .verify(token)
            .await
            .map_err(|_| unauthenticated("invalid access token"))?;
        if claims.sandbox.to_string() != routed {
            return Err(unauthenticated(
                "the access token was issued for another sandbox",
            ));
        }
        if self.is_replaced(&claims.sandbox, &claims.execution) {
            return Err(rpc_error(&ControlError::ExecutionReplaced));
        }
        Ok(Envd {
            who: acting_for(caller),
            sandbox: claims.sandbox,
            execution: claims.execution,
            user: basic_user(headers),
        })
    }

    /// A buffered operation of the node API under `/v1/sandboxes/{id}/`, on the
    /// context's execution only.
    pub(crate) async fn operate(
        &self,
        e: &Envd,
        method: Method,
        path_and_query: &str,
        content_type: Option<&str>,
        body: Bytes,
        class: OperationClass,
    ) -> Result<Forwarded, RpcError> {
        let mut headers = HeaderMap::new();
        if let Some(ct) = content_type.and_then(|c| HeaderValue::from_str(c).ok()) {
            headers.insert(header::CONTENT_TYPE, ct);
        }
        let pq = format!("/v1/sandboxes/{}/{path_and_query}", e.sandbox);
        let f = self
            .edge
            .forward_to(
                &e.who,
                &e.sandbox,
                Some(&e.execution),
                method,
                &pq,
                &headers,
                body,
                class,
            )
            .await
            .map_err(|err| self.envd_error(e, &err))?;
        if f.status.is_success() {
            Ok(f)
        } else {
            Err(worker_error(f.status, &f.body))
        }
    }

    /// A stream of the node API (`exec/stream`, `watch?…`), on the context's
    /// execution only.
    pub(crate) async fn stream(&self, e: &Envd, path_and_query: &str) -> Result<Backend, RpcError> {
        let pq = format!("/v1/sandboxes/{}/{path_and_query}", e.sandbox);
        self.edge
            .open_stream_to(&e.who, &e.sandbox, Some(&e.execution), &pq)
            .await
            .map_err(|err| self.envd_error(e, &err))
    }
}

/// The start of every RPC: its context — the token checked before any byte of the body
/// is read — and its body, at most `limit` bytes; or the answer refusing it (in the
/// call's own form: a unary error, or a stream ending with it).
pub(crate) async fn begin(
    front: &Front,
    headers: &HeaderMap,
    body: axum::body::Body,
    limit: usize,
) -> Result<(Envd, Bytes), Response> {
    let streaming = crate::connect::is_streaming(headers);
    let ctx = match front.envd(headers).await {
        Ok(ctx) => ctx,
        Err(e) => {
            drain_refused(body).await;
            return Err(crate::connect::failure(streaming, &e));
        }
    };
    let body = axum::body::to_bytes(body, limit).await.map_err(|_| {
        let e = RpcError::new(
            Code::ResourceExhausted,
            "the request is over its size limit",
        );
        crate::connect::failure(streaming, &e)
    })?;
    Ok((ctx, body))
}

/// What of a refused request's body is read (and discarded) at most, and for how
/// long, before the refusal is sent.
const DRAIN_MAX: usize = 256 << 10;
const DRAIN_TIME: std::time::Duration = std::time::Duration::from_secs(2);

/// Reads what is left of a refused request's body — at most [`DRAIN_MAX`] bytes
/// within [`DRAIN_TIME`], keeping none of it — so that a client still sending it
/// gets the refusal. Answered with the body unread, the server closes the
/// connection under the client's writes, and the client sees a broken pipe or a
/// reset instead of the answer (the SDK's `AuthenticationException`, which tells it
/// to reconnect). The refusal is decided before any of it is read.
pub(crate) async fn drain_refused(body: axum::body::Body) {
    use http_body_util::BodyExt as _;
    let mut body = body;
    let mut read = 0usize;
    let _ = tokio::time::timeout(DRAIN_TIME, async {
        while read <= DRAIN_MAX {
            match body.frame().await {
                Some(Ok(frame)) => read += frame.data_ref().map_or(0, Bytes::len),
                Some(Err(_)) | None => break,
            }
        }
    })
    .await;
}

/// The caller a token acts for (its tenant, never an admin's reach).
pub(crate) fn acting_for(caller: Caller) -> Authenticated {
    Authenticated::new(
        Caller {
            admin: false,
            ..caller
        },
        String::new(),
    )
}

/// The account of `Authorization: Basic base64("name:")`, which the SDKs send to
/// choose the user a call runs as.
fn basic_user(headers: &HeaderMap) -> Option<String> {
    let v = headers.get(header::AUTHORIZATION)?.to_str().ok()?;
    let encoded = v.strip_prefix("Basic ")?;
    let decoded = base64::engine::general_purpose::STANDARD
        .decode(encoded.trim())
        .ok()?;
    let text = String::from_utf8(decoded).ok()?;
    let name = text.split(':').next()?.trim();
    (!name.is_empty() && name.len() <= 256).then(|| name.to_owned())
}

/// A platform error as the SDKs read it.
pub(crate) fn rpc_error(e: &ControlError) -> RpcError {
    let code = match e {
        ControlError::Unauthorized | ControlError::ExecutionReplaced => Code::Unauthenticated,
        ControlError::NotFound(_) => Code::NotFound,
        ControlError::Deny { .. } | ControlError::Forbidden(_) => Code::PermissionDenied,
        ControlError::BadRequest(_) | ControlError::InvalidLimits(_) => Code::InvalidArgument,
        ControlError::TooLarge(_) | ControlError::Quota { .. } => Code::ResourceExhausted,
        ControlError::Relayed(r) => status_code(r.status, &r.code.to_string()),
        ControlError::Internal(_) | ControlError::Store(_) => Code::Internal,
        _ => Code::Unavailable,
    };
    let message = match e {
        ControlError::ExecutionReplaced => "the sandbox was resumed or moved as a new execution since this access token was issued: reconnect (Sandbox.connect) for a new one".to_owned(),
        ControlError::NotFound(_) => "sandbox not found".to_owned(),
        other => other.to_string(),
    };
    RpcError::new(code, message)
}

/// A worker's error answer (`{"error", "message"}`) as the SDKs read it.
pub(crate) fn worker_error(status: StatusCode, body: &[u8]) -> RpcError {
    let parsed: Option<ErrorBody> = serde_json::from_slice(body).ok();
    let (code, message) = parsed.map_or_else(
        || (String::new(), format!("the sandbox answered {status}")),
        |b| (b.error, b.message),
    );
    RpcError::new(status_code(status.as_u16(), &code), message)
}

fn status_code(status: u16, code: &str) -> Code {
    match (status, code) {
        (_, "paused") => Code::Unavailable,
        (_, "already_exists") => Code::AlreadyExists,
        (_, "unknown_user") => Code::InvalidArgument,
        (404, _) => Code::NotFound,
        (400, _) => Code::InvalidArgument,
        (401, _) => Code::Unauthenticated,
        (403, _) => Code::PermissionDenied,
        (409, _) => Code::FailedPrecondition,
        (413 | 507 | 429, _) => Code::ResourceExhausted,
        (408 | 504, _) => Code::DeadlineExceeded,
        (500, _) => Code::Internal,
        _ => Code::Unavailable,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn envd_host_names_give_their_port_and_sandbox() {
        let id = "sbx_aaaaaaaaaaaaaaaaaaaaaaaaaa";
        assert_eq!(
            port_host(&format!("49983-{id}.localhost:7070"), "localhost"),
            Some((49983, id.to_owned()))
        );
        assert_eq!(
            port_host(
                &format!("49983-{id}.sandboxes.example.com"),
                "sandboxes.example.com"
            ),
            Some((49983, id.to_owned()))
        );
        assert_eq!(port_host("localhost:7070", "localhost"), None);
        assert_eq!(
            port_host(&format!("x.49983-{id}.localhost"), "localhost"),
            None
        );
        assert_eq!(
            port_host(&format!("49983-{id}.otherhost"), "localhost"),
            None
        );
    }

    #[test]
    fn the_basic_user_is_the_name_before_the_colon() {
        let mut h = HeaderMap::new();
        h.insert(
            header::AUTHORIZATION,
            HeaderValue::from_static("Basic dXNlcjo="),
        );
        assert_eq!(basic_user(&h).as_deref(), Some("user"));
        h.insert(header::AUTHORIZATION, HeaderValue::from_static("Basic !!"));
        assert_eq!(basic_user(&h), None);
        h.insert(header::AUTHORIZATION, HeaderValue::from_static("Bearer x"));
        assert_eq!(basic_user(&h), None);
    }
}
