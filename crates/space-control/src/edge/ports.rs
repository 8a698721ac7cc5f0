//! Service-port traffic at the edge (`API.md`, "Service ports"): a request whose
//! `Host` is `{port}-{sandbox}.{domain}`, or that names `X-Space-Sandbox` and
//! `X-Space-Port`, or a `CONNECT {sandbox}:{port}`, goes to that port — never to the
//! API.
//!
//! For each request: the port must be exposed (the store), the caller allowed (a
//! public port; the owner's API key; the port's token in `X-Space-Port-Token`; or
//! the cookie a one-time link set), the protocol right (`CONNECT` only to `tcp`
//! ports, HTTP only to `http` ones, upgrades only to WebSocket). The credential is
//! taken off the request before it goes on. A kept-alive client connection is bound
//! to the first sandbox and port it reaches — a request naming another is refused
//! (421) and the connection closed — and to one tunnel into that sandbox's worker
//! (netgtw, with a `service_port` capability for this port and protocol), reused
//! while it stays open. netgtw closes the tunnel when the execution it was admitted
//! for is replaced, and the client's connection closes with it; the client's next
//! connection opens a new tunnel to the new execution, so the same URL follows the
//! sandbox.

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;
use space_http::proxy::{self, Forwarded, UpgradeAsk, UpgradeRefused};
use space_identity::{Access, AccessSet, DenyReason, Execution, Protocol, Purpose, SandboxId};
use space_proto::api::ErrorBody;
use space_proto::api::ports::{
    LINK_PARAM, NETGTW_PORT_HEADER, NETGTW_PROTOCOL_HEADER, NETGTW_UPGRADE, PORT_COOKIE,
    PORT_HEADER, PORT_TOKEN_HEADER, SANDBOX_HEADER, port_host,
};
use space_store::PortRecord;
use tokio::sync::watch;

use super::port_grants::PortGrants;
use super::{Authority, Edge};
use crate::error::ControlError;
use crate::service::{ControlPlane, secret_matches};

/// How long a tunnel to a worker's netgtw may take to open.
const DIAL_TIMEOUT: Duration = Duration::from_secs(10);

/// How long a kept-alive connection trusts what it checked (the port's record, the
/// credential presented) before it reads them again.
const RECHECK_AFTER: Duration = Duration::from_secs(1);

/// What a service-port request names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Target {
    sandbox: SandboxId,
    port: u16,
    connect: bool,
}

fn refused(e: ControlError, close: bool) -> Response {
    let mut resp = e.into_response();
    if close {
        resp.headers_mut()
            .insert(header::CONNECTION, HeaderValue::from_static("close"));
    }
    resp
}

/// What `req` names, if it is service-port traffic; a malformed naming is an error.
pub(crate) fn target(req: &Request, domain: &str) -> Result<Option<Target>, ControlError> {
    let h = req.headers();
    let text = |name: &str| h.get(name).map(|v| v.to_str().map(str::trim));
    if req.method() == Method::CONNECT {
        let authority = req.uri().authority().map(|a| a.as_str().to_owned());
        let named = authority.as_deref().and_then(|a| {
            port_host(a, Some(domain)).or_else(|| {
                let (s, p) = a.rsplit_once(':')?;
                Some((p.parse().ok().filter(|p| *p != 0)?, s.parse().ok()?))
            })
        });
        let (port, sandbox) = named.ok_or_else(|| {
            ControlError::BadRequest(
                "CONNECT needs {sandbox}:{port} or {port}-{sandbox}.{domain} as its target".into(),
            )
        })?;
        return Ok(Some(Target {
            sandbox,
            port,
            connect: true,
        }));
    }
    match (text(SANDBOX_HEADER), text(PORT_HEADER)) {
        (None, None) => {}
        (Some(Ok(s)), Some(Ok(p))) => {
            let sandbox = s.parse().map_err(|_| {
                ControlError::BadRequest(format!("{SANDBOX_HEADER} is not a sandbox ID"))
            })?;
            let port = p.parse::<u16>().ok().filter(|p| *p != 0).ok_or_else(|| {
                ControlError::BadRequest(format!("{PORT_HEADER} must be 1-65535"))
            })?;
            return Ok(Some(Target {
                sandbox,
                port,
                connect: false,
            }));
        }
        _ => {
            return Err(ControlError::BadRequest(format!(
                "service-port header routing needs both {SANDBOX_HEADER} and {PORT_HEADER}"
            )));
        }
    }
    let host = h
        .get(header::HOST)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned)
        .or_else(|| req.uri().authority().map(|a| a.as_str().to_owned()));
    Ok(host
        .and_then(|host| port_host(&host, Some(domain)))
        .map(|(port, sandbox)| Target {
            sandbox,
            port,
            connect: false,
        }))
}

/// The middleware in front of the whole API: service-port traffic is served here,
/// everything else goes on.
pub async fn entry(State(edge): State<Arc<Edge>>, req: Request, next: Next) -> Response {
    let cp = match &edge.authority {
        Authority::Local(cp) => Arc::clone(cp),
        Authority::Remote { .. } => {
            // Without the store a standalone edge cannot check ports or tokens.
            let domain = "localhost";
            return match target(&req, domain) {
                Ok(None) => next.run(req).await,
                Ok(Some(_)) | Err(_) => refused(
                    ControlError::BadRequest(
                        "service ports are served by the edge of `space up` or `space control`, not by a standalone `space edge`".into(),
                    ),
                    true,
                ),
            };
        }
    };
    let domain = cp.port_urls().domain;
    match target(&req, &domain) {
        Ok(None) => next.run(req).await,
        Ok(Some(t)) => serve(&cp, &edge.port_grants, t, req).await,
        Err(e) => {
            cp.metrics.port_refused("bad_request");
            refused(e, true)
        }
    }
}

/// Which credential let a request in (it is taken off the request).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Credential {
    Public,
    ApiKey,
    Token,
    Cookie,
}

/// The value of cookie `name` in `headers`.
fn cookie<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|c| c.trim().split_once('='))
        .find(|(k, _)| *k == name)
        .map(|(_, v)| v.trim())
}

/// `headers` without cookie `name` (the others stay, in order).
fn drop_cookie(headers: &mut HeaderMap, name: &str) {
    let kept: Vec<String> = headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .map(str::trim)
        .filter(|c| !c.is_empty() && c.split_once('=').is_none_or(|(k, _)| k != name))
        .map(str::to_owned)
        .collect();
    headers.remove(header::COOKIE);
    if !kept.is_empty() {
        if let Ok(v) = HeaderValue::from_str(&kept.join("; ")) {
            headers.insert(header::COOKIE, v);
        }
    }
}

/// Who may use port `p`: anyone if public; else the owner's (or an admin's) API
/// key, the port's token, or a link's cookie.
async fn authorize(
    cp: &ControlPlane,
    p: &PortRecord,
    headers: &HeaderMap,
) -> Result<Credential, ControlError> {
    if p.public {
        return Ok(Credential::Public);
    }
    if let Some(token) = headers.get(PORT_TOKEN_HEADER).and_then(|v| v.to_str().ok()) {
        if secret_matches(token.trim(), &p.token_hash) {
            return Ok(Credential::Token);
        }
        return Err(ControlError::PortPrivate(p.port));
    }
    if let Some(key) = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
    {
        if let Ok(caller) = cp.authenticate(key.trim()).await {
            if caller.admin || cp.sandbox_for(&caller, &p.sandbox).await.is_ok() {
                return Ok(Credential::ApiKey);
            }
        }
    }
    if let Some(c) = cookie(headers, PORT_COOKIE) {
        if cp.cookie_opens(p, c).await? {
            return Ok(Credential::Cookie);
        }
    }
    Err(ControlError::PortPrivate(p.port))
}

/// `req` with the credential that let it in (and netgtw's routing headers) taken off.
fn strip_credential(req: &mut Request, used: Credential) {
    let h = req.headers_mut();
    h.remove(PORT_TOKEN_HEADER);
    h.remove(SANDBOX_HEADER);
    h.remove(PORT_HEADER);
    // The key that let it in, and any other platform API key the client sent along
    // (one that opened nothing still must not reach the sandbox's server); an
    // `Authorization` of the application's own goes on.
    let platform_key = h
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .is_some_and(|k| crate::auth::parse_key(k.trim()).is_some());
    if used == Credential::ApiKey || platform_key {
        h.remove(header::AUTHORIZATION);
    }
    drop_cookie(h, PORT_COOKIE);
}

/// What a kept-alive client connection is bound to.
struct Session {
    target: Target,
    execution: Execution,
    sender: SendRequest<Body>,
    record: PortRecord,
    checked_at: Instant,
    /// The credential header values that passed at `checked_at`, and which one it was.
    presented: Vec<Option<HeaderValue>>,
    used: Credential,
    /// Set before a WebSocket upgrade is forwarded.
    upgrading: Arc<std::sync::atomic::AtomicBool>,
}

fn presented(headers: &HeaderMap) -> Vec<Option<HeaderValue>> {
    [
        header::AUTHORIZATION.as_str(),
        PORT_TOKEN_HEADER,
        header::COOKIE.as_str(),
    ]
    .iter()
    .map(|n| headers.get(*n).cloned())
    .collect()
}

async fn serve(cp: &Arc<ControlPlane>, grants: &PortGrants, t: Target, req: Request) -> Response {
    match serve_checked(cp, grants, t, req).await {
        Ok(resp) => resp,
        Err(e) => {
            cp.metrics.port_refused(e.code().as_str());
            refused(e, true)
        }
    }
}

async fn serve_checked(
    cp: &Arc<ControlPlane>,
    grants: &PortGrants,
    t: Target,
    mut req: Request,
) -> Result<Response, ControlError> {
    if !t.connect {
        if let Some(code) = link_code(&req) {
            let path = req.uri().path().to_owned();
            let query = req.uri().query().unwrap_or("").to_owned();
            return open_link(cp, t, &path, &query, &code).await;
        }
    }
    let connection = req.extensions().get::<space_http::Connection>().cloned();
    let mut kept = match &connection {
        Some(c) => Some(c.kept.clone().lock_owned().await),
        None => None,
    };
    let mut session: Option<Box<Session>> = kept
        .as_mut()
        .and_then(|k| k.take())
        .and_then(|b| b.downcast::<Session>().ok());
    if let Some(s) = &session {
        if s.target != t {
            return Err(ControlError::Misdirected(
                "this connection is bound to another sandbox or port: open a new connection".into(),
            ));
        }
    }
    // What was checked on this connection within the last second stands.
    let checked = presented(req.headers());
    let fresh = session
        .as_ref()
        .is_some_and(|s| s.checked_at.elapsed() < RECHECK_AFTER && s.presented == checked);
    let (record, used) = if let Some(s) = session.as_ref().filter(|_| fresh) {
        (s.record.clone(), s.used)
    } else {
        let record = cp.port(&t.sandbox, t.port).await?;
        let used = authorize(cp, &record, req.headers()).await?;
        (record, used)
    };
    let protocol: Protocol = record.protocol.parse().unwrap_or(Protocol::Http);
    match (t.connect, protocol) {
        (true, Protocol::Http) => {
            return Err(ControlError::Deny {
                reason: DenyReason::WrongProtocol,
            });
        }
        (false, Protocol::Tcp) => {
            return Err(ControlError::Deny {
                reason: DenyReason::WrongProtocol,
            });
        }
        _ => {}
    }
    if let UpgradeAsk::Other(_) = proxy::upgrade_asked(req.headers()) {
        return Err(ControlError::Deny {
            reason: DenyReason::WrongProtocol,
        });
    }
    strip_credential(&mut req, used);
    if t.connect {
        return connect_tcp(cp, grants, t, req).await;
    }
    let mut s = match session.take().filter(|s| !s.sender.is_closed()) {
        Some(s) => s,
        None => {
            let (upgraded, execution) = open_tunnel(cp, grants, t, Protocol::Http).await?;
            let (sender, ended) = proxy::backend_watched::<Body, _>(TokioIo::new(upgraded))
                .await
                .map_err(|e| ControlError::BadGateway(format!("netgtw: {e}")))?;
            // The client's connection lives as long as its tunnel: netgtw ends the
            // tunnel when the execution is replaced, and the client's kept-alive
            // connection to it ends with it (its next request opens a new one, which
            // reaches the new execution).
            // (Not after a WebSocket upgrade: the tunnel's HTTP connection ends by
            // handing its bytes to the upgrade, and the client's has ended the same way.)
            let upgrading = Arc::new(std::sync::atomic::AtomicBool::new(false));
            if let Some(c) = connection.clone() {
                let upgrading = Arc::clone(&upgrading);
                tokio::spawn(async move {
                    let _ = ended.await;
                    if !upgrading.load(std::sync::atomic::Ordering::SeqCst) {
                        c.close();
                    }
                });
            }
            Box::new(Session {
                target: t,
                execution,
                sender,
                record: record.clone(),
                checked_at: Instant::now(),
                presented: checked.clone(),
                used,
                upgrading,
            })
        }
    };
    if !fresh {
        s.record = record;
        s.checked_at = Instant::now();
        s.presented = checked;
        s.used = used;
    }
    let upgrading = proxy::upgrade_asked(req.headers()) == UpgradeAsk::WebSocket;
    if upgrading {
        s.upgrading.store(true, std::sync::atomic::Ordering::SeqCst);
    }
    // An upgraded stream keeps the client connection's place under the edge's limit
    // (`space_http::Connection`) for as long as it is bridged.
    let held = if upgrading { connection.clone() } else { None };
    let forwarded = proxy::forward(&mut s.sender, req, never_stops(), held).await;
    let execution = s.execution;
    if let Some(k) = kept.as_mut() {
        **k = Some(s);
    }
    match forwarded {
        Ok(Forwarded::Answer(resp) | Forwarded::Last(resp) | Forwarded::Upgraded(resp)) => {
            Ok(resp.map(Body::new))
        }
        Err(e) => Err(ControlError::BadGateway(format!(
            "the connection to execution {} ended: {e}",
            execution.id
        ))),
    }
}

/// A stop signal that never fires (its sender is gone: see `proxy::stopped`): what
/// ends the edge's bridges is netgtw ending the tunnel. One for the process, cloned.
fn never_stops() -> watch::Receiver<bool> {
    static NEVER: std::sync::OnceLock<watch::Receiver<bool>> = std::sync::OnceLock::new();
    NEVER.get_or_init(|| watch::channel(false).1).clone()
}

/// A `CONNECT`: a raw tunnel to a `tcp` port, once the worker's netgtw admitted it.
async fn connect_tcp(
    cp: &Arc<ControlPlane>,
    grants: &PortGrants,
    t: Target,
    mut req: Request,
) -> Result<Response, ControlError> {
    let (upgraded, _) = open_tunnel(cp, grants, t, Protocol::Tcp).await?;
    let client = hyper::upgrade::on(&mut req);
    tokio::spawn(async move {
        let Ok(client) = client.await else {
            return;
        };
        let stop = never_stops();
        // Kernel to kernel when both are plain TCP connections (they are, here).
        let (client, client_early) = match proxy::raw_tcp(client) {
            Ok(parts) => parts,
            Err(client) => {
                proxy::bridge(TokioIo::new(client), TokioIo::new(upgraded), stop).await;
                return;
            }
        };
        match proxy::raw_tcp(upgraded) {
            Ok((tunnel, tunnel_early)) => {
                proxy::splice_bridge(client, client_early, tunnel, tunnel_early, stop, |_, _| {})
                    .await;
            }
            Err(tunnel) => {
                use tokio::io::AsyncWriteExt as _;
                let mut tunnel = TokioIo::new(tunnel);
                if tunnel.write_all(&client_early).await.is_ok() {
                    proxy::bridge(client, tunnel, stop).await;
                }
            }
        }
    });
    Ok(StatusCode::OK.into_response())
}

/// Opens a tunnel to `t` at the worker running the sandbox: a `service_port`
/// capability for this port and protocol, presented to its netgtw. A stale route
/// (421) is resolved once more; a port the worker was not told about (the push after
/// the expose failed) is pushed again, once.
async fn open_tunnel(
    cp: &Arc<ControlPlane>,
    grants: &PortGrants,
    t: Target,
    protocol: Protocol,
) -> Result<(hyper::upgrade::Upgraded, Execution), ControlError> {
    let mut last = None;
    let key = (t.sandbox, t.port, protocol);
    for attempt in 0..2 {
        let cap = match grants.get(&key).filter(|_| attempt == 0) {
            Some(cap) => cap,
            None => {
                let s = cp.store.get_sandbox(&t.sandbox).await?;
                let s = cp.settled_record(s, cp.transition_wait()).await?;
                let cap = cp
                    .issue_capability(
                        &s,
                        AccessSet::of(&[Access::ServicePort]),
                        Purpose::ServicePort,
                        Some((t.port, protocol)),
                    )
                    .await?;
                grants.put(key, cap.clone());
                cap
            }
        };
        let auth = format!("SpaceCap {}", cap.token);
        let port = t.port.to_string();
        let path = format!("/v1/sandboxes/{}/netgtw", t.sandbox);
        let headers = [
            ("authorization", auth.as_str()),
            (NETGTW_PORT_HEADER, port.as_str()),
            (NETGTW_PROTOCOL_HEADER, protocol.as_str()),
        ];
        let execution = Execution {
            generation: cap.route.generation,
            id: cap.route.execution_id,
        };
        match proxy::open_upgrade(
            &cap.route.worker_url,
            &path,
            NETGTW_UPGRADE,
            &headers,
            DIAL_TIMEOUT,
        )
        .await
        {
            Ok(up) => {
                cp.metrics.port_opened();
                return Ok((up, execution));
            }
            Err(UpgradeRefused::Answered(status, body)) => {
                grants.forget(&key);
                let body: Option<ErrorBody> = serde_json::from_slice(&body).ok();
                let not_exposed = body
                    .as_ref()
                    .and_then(|b| b.reason.as_deref())
                    .is_some_and(|r| r == DenyReason::PortNotExposed.as_str());
                let e = super::routes::relayed(status.as_u16(), body);
                if attempt == 0 && status == StatusCode::MISDIRECTED_REQUEST {
                    last = Some(e);
                    continue;
                }
                if attempt == 0 && not_exposed {
                    cp.push_ports(&t.sandbox).await;
                    last = Some(e);
                    continue;
                }
                return Err(e);
            }
            Err(UpgradeRefused::Unreachable(m)) if attempt == 0 => {
                // A worker restarting: nothing reached it; one more try after a pause.
                tokio::time::sleep(Duration::from_millis(200)).await;
                last = Some(ControlError::BadGateway(format!("worker: {m}")));
            }
            Err(UpgradeRefused::Unreachable(m) | UpgradeRefused::Failed(m)) => {
                return Err(ControlError::BadGateway(format!("worker netgtw: {m}")));
            }
        }
    }
    Err(last.unwrap_or_else(|| ControlError::BadGateway("no tunnel".into())))
}

/// The one-time link code a request carries in its query, if any.
fn link_code(req: &Request) -> Option<String> {
    req.uri().query()?.split('&').find_map(|kv| {
        let (k, v) = kv.split_once('=')?;
        (k == LINK_PARAM && !v.is_empty() && v.len() <= 128).then(|| v.to_owned())
    })
}

/// Where a used link sends the browser: the same path, if it is one on this host
/// (`//other.example` would send it elsewhere), without the link's code.
fn link_location(path: &str, query: &str) -> String {
    let rest: Vec<&str> = query
        .split('&')
        .filter(|kv| !kv.is_empty() && kv.split_once('=').is_none_or(|(k, _)| k != LINK_PARAM))
        .collect();
    let path = if path.starts_with('/') && !path.starts_with("//") && !path.contains('\\') {
        path
    } else {
        "/"
    };
    if rest.is_empty() {
        path.to_owned()
    } else {
        format!("{path}?{}", rest.join("&"))
    }
}

/// A one-time link: its code is used up, a cookie for this port is set, and the
/// browser is sent to the same URL without the code.
async fn open_link(
    cp: &Arc<ControlPlane>,
    t: Target,
    path: &str,
    query: &str,
    code: &str,
) -> Result<Response, ControlError> {
    let Some((sandbox, port, value)) = cp.take_link(code).await? else {
        return Err(ControlError::Unauthorized);
    };
    if sandbox != t.sandbox || port != t.port {
        return Err(ControlError::Unauthorized);
    }
    let location = link_location(path, query);
    let cookie = format!(
        "{PORT_COOKIE}={value}; Path=/; Max-Age={}; HttpOnly; SameSite=Lax",
        crate::service::COOKIE_LIFETIME_SECS
    );
    let mut resp = StatusCode::SEE_OTHER.into_response();
    let h = resp.headers_mut();
    h.insert(
        header::LOCATION,
        HeaderValue::from_str(&location)
            .map_err(|_| ControlError::BadRequest("bad path".into()))?,
    );
    h.insert(
        header::SET_COOKIE,
        HeaderValue::from_str(&cookie).map_err(|e| ControlError::Internal(e.to_string()))?,
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    Ok(resp)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_link_redirects_only_to_a_path_on_the_same_host() {
        for (path, want) in [
            ("/app", "/app"),
            ("//evil.example/x", "/"),
            ("/\\evil.example", "/"),
            ("", "/"),
        ] {
            assert_eq!(
                link_location(path, "space_link=spl_x&a=1"),
                format!("{want}?a=1")
            );
        }
        assert_eq!(link_location("/", "space_link=spl_x"), "/");
    }

    #[test]
    fn a_platform_api_key_never_reaches_the_sandbox_whatever_opened_the_port() {
        let key = crate::auth::issue_key().text;
        for used in [Credential::Token, Credential::Cookie, Credential::Public] {
            let mut req = Request::new(Body::empty());
            req.headers_mut().insert(
                header::AUTHORIZATION,
                HeaderValue::from_str(&format!("Bearer {key}")).unwrap(),
            );
            strip_credential(&mut req, used);
            assert!(
                req.headers().get(header::AUTHORIZATION).is_none(),
                "{used:?}"
            );
        }
        // The application's own credential goes on when it did not open the port.
        let mut req = Request::new(Body::empty());
        req.headers_mut().insert(
            header::AUTHORIZATION,
            HeaderValue::from_static("Basic dXNlcjpwYXNz"),
        );
        strip_credential(&mut req, Credential::Token);
        assert_eq!(req.headers()[header::AUTHORIZATION], "Basic dXNlcjpwYXNz");
    }

    #[test]
    fn only_the_ports_cookie_is_taken_off() {
        let mut h = HeaderMap::new();
        h.insert(
            header::COOKIE,
            HeaderValue::from_static("a=1; space_port_token=v1.x; b=2"),
        );
        assert_eq!(cookie(&h, PORT_COOKIE), Some("v1.x"));
        drop_cookie(&mut h, PORT_COOKIE);
        assert_eq!(h[header::COOKIE], "a=1; b=2");
        let mut only = HeaderMap::new();
        only.insert(
            header::COOKIE,
            HeaderValue::from_static("space_port_token=v1.x"),
        );
        drop_cookie(&mut only, PORT_COOKIE);
        assert!(only.get(header::COOKIE).is_none());
    }
}
