//! An E2B-compatible front for SPACE.
//!
//! E2B's SDKs find the API at `E2B_API_URL` and the in-sandbox daemon ("envd") at
//! `E2B_SANDBOX_URL`, one URL for every sandbox, routed by `E2b-Sandbox-Id` (or the
//! host name `49983-{id}.{domain}`). This crate serves both on the edge's own address,
//! ahead of SPACE's `/v1` API (whose paths E2B's never collide with):
//!
//! - [`rest`]: `/sandboxes`, `/v2/sandboxes`, … mapped onto SPACE sandboxes, with
//!   E2B-shaped answers and errors (`{"code", "message"}`);
//! - [`envd`]: envd's Connect-RPC services `process.Process` and
//!   `filesystem.Filesystem` ([`process`], [`filesystem`]), its `/files` and
//!   `/health`, each call carried out through the edge against the one execution
//!   its access token names ([`token`]);
//! - [`connect`]: the Connect protocol's JSON codec.
//!
//! What is not SPACE's own is kept here: the E2B process table (commands that outlive
//! the call that started them, found again by pid) and the polled directory watchers.

use std::sync::Arc;

use axum::Router;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, Method, header};
use axum::middleware::{self, Next};
use axum::response::Response;
use space_control::api::AppState;
use tower::ServiceExt as _;

pub mod connect;
mod entries;
pub mod envd;
mod files;
pub mod filesystem;
pub mod front;
pub mod interpreter;
mod keys;
mod proc_table;
pub mod process;
pub mod rest;
pub mod token;
mod watch_table;
mod watchers;

pub use front::{ENVD_PORT, ENVD_VERSION, Front};

/// The router to serve: the E2B front ahead of `api` (SPACE's own router, whose
/// service-port routing keeps every host name but envd's). A standalone edge, with
/// no control plane in its process, serves no front: `api` is returned as it is.
pub fn wrap(state: AppState, api: Router) -> Router {
    let Some(cp) = state.cp.clone() else {
        return api;
    };
    let front = Front::new(cp, Arc::clone(&state.edge));
    watchers::spawn_reaper(Arc::downgrade(&front));
    let routes = Router::new()
        .merge(rest::routes())
        .merge(envd::routes())
        .fallback(|| async { rest::not_found("no such E2B route") })
        .with_state(Arc::clone(&front));
    api.layer(middleware::from_fn_with_state((front, routes), entry))
}

/// What a request is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Claim {
    /// SPACE's own API, or SPACE's service-port routing: not the front's.
    Pass,
    /// Another port of a sandbox, routed E2B's way (`E2b-Sandbox-Port`, or a host
    /// name `{port}-{id}.{domain}` when `headers` is false): served by SPACE's
    /// service-port path once E2B's headers are put in SPACE's terms.
    Port { headers: bool },
    /// E2B's REST API.
    Rest,
    /// envd of a sandbox.
    Envd,
}

/// Which requests the front takes: E2B's REST paths (no sandbox routing), and
/// anything routed to envd's port by `E2b-Sandbox-Id`/`E2b-Sandbox-Port` or by the
/// host name `49983-{id}.{domain}`. Other ports routed E2B's way are service-port
/// traffic ([`Claim::Port`]). Everything else — `/v1`, SPACE's service-port headers
/// — goes on to SPACE's router.
fn claim(headers: &HeaderMap, path: &str, domain: impl FnOnce() -> String) -> Claim {
    if headers.contains_key("x-space-sandbox") || path.starts_with("/v1/") {
        return Claim::Pass;
    }
    if headers.contains_key(front::SANDBOX_HEADER) {
        let port = headers
            .get(front::PORT_HEADER)
            .and_then(|v| v.to_str().ok())
            .map(str::trim);
        return match port {
            None => Claim::Envd,
            Some(p) if p == ENVD_PORT.to_string() => Claim::Envd,
            Some(_) => Claim::Port { headers: true },
        };
    }
    if let Some(host) = headers.get(header::HOST).and_then(|v| v.to_str().ok()) {
        if let Some((port, _)) = front::port_host(host, &domain()) {
            return if port == ENVD_PORT {
                Claim::Envd
            } else {
                Claim::Port { headers: false }
            };
        }
    }
    if rest::is_rest_path(path) {
        Claim::Rest
    } else {
        Claim::Pass
    }
}

async fn entry(
    State((front, routes)): State<(Arc<Front>, Router)>,
    mut req: Request,
    next: Next,
) -> Response {
    // The domain (a lock and a copy) only for a request that is not `/v1`'s.
    match claim(req.headers(), req.uri().path(), || front.domain()) {
        Claim::Pass => next.run(req).await,
        Claim::Port { headers } => {
            in_space_terms(req.headers_mut(), headers);
            next.run(req).await
        }
        Claim::Rest | Claim::Envd => {
            let preflight = req.method() == Method::OPTIONS;
            let origin = req.headers().get(header::ORIGIN).cloned();
            let mut resp = if preflight {
                envd::preflight()
            } else {
                match routes.oneshot(req).await {
                    Ok(r) => r,
                    Err(never) => match never {},
                }
            };
            envd::cors(resp.headers_mut(), origin);
            resp
        }
    }
}

/// E2B's service-port headers as SPACE's: the routing headers (when `routing`)
/// become `X-Space-Sandbox`/`X-Space-Port`, and `e2b-traffic-access-token` (the
/// sandbox's traffic token, which is the port token of every port its catch-all
/// covers) becomes `X-Space-Port-Token` unless one is given. E2B's own are taken off,
/// so none reaches the sandbox's server — an envd access token in `X-Access-Token`
/// too, which E2B's code-interpreter SDK sends along to its port: a sandbox's server
/// never sees a credential of the platform's (an application's own header of that
/// name, not one of our tokens, goes on).
fn in_space_terms(h: &mut HeaderMap, routing: bool) {
    use space_proto::api::ports::{PORT_HEADER, PORT_TOKEN_HEADER, SANDBOX_HEADER};
    let ours = h
        .get(front::TOKEN_HEADER)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.trim_start().starts_with(token::PREFIX));
    if ours {
        h.remove(front::TOKEN_HEADER);
    }
    let sandbox = h.remove(front::SANDBOX_HEADER);
    let port = h.remove(front::PORT_HEADER);
    if routing {
        if let (Some(s), Some(p)) = (sandbox, port) {
            h.insert(SANDBOX_HEADER, s);
            h.insert(PORT_HEADER, p);
        }
    }
    if let Some(token) = h.remove(front::TRAFFIC_TOKEN_HEADER) {
        if !h.contains_key(PORT_TOKEN_HEADER) {
            h.insert(PORT_TOKEN_HEADER, token);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.insert(*k, HeaderValue::from_str(v).unwrap());
        }
        h
    }

    #[test]
    fn the_front_takes_e2b_paths_and_envd_routing_and_leaves_the_rest_to_space() {
        let d = || "localhost".to_owned();
        let id = "sbx_aaaaaaaaaaaaaaaaaaaaaaaaaa";
        assert_eq!(claim(&headers(&[]), "/sandboxes", d), Claim::Rest);
        assert_eq!(claim(&headers(&[]), "/v2/sandboxes", d), Claim::Rest);
        assert_eq!(claim(&headers(&[]), "/v1/sandboxes", d), Claim::Pass);
        assert_eq!(claim(&headers(&[]), "/healthz", d), Claim::Pass);
        let envd = headers(&[("e2b-sandbox-id", id), ("e2b-sandbox-port", "49983")]);
        assert_eq!(claim(&envd, "/process.Process/Start", d), Claim::Envd);
        // Another port of the sandbox is a service port: SPACE's.
        let port = headers(&[("e2b-sandbox-id", id), ("e2b-sandbox-port", "8000")]);
        assert_eq!(claim(&port, "/", d), Claim::Port { headers: true });
        let host = headers(&[("host", &format!("49983-{id}.localhost:7070"))]);
        assert_eq!(claim(&host, "/files", d), Claim::Envd);
        let other = headers(&[("host", &format!("8000-{id}.localhost:7070"))]);
        assert_eq!(
            claim(&other, "/sandboxes", d),
            Claim::Port { headers: false }
        );
        // SPACE's own service-port headers always win.
        let space = headers(&[("x-space-sandbox", id), ("e2b-sandbox-id", id)]);
        assert_eq!(claim(&space, "/files", d), Claim::Pass);
    }

    #[test]
    fn e2b_port_headers_become_spaces_and_none_of_e2bs_go_on() {
        let id = "sbx_aaaaaaaaaaaaaaaaaaaaaaaaaa";
        let mut h = headers(&[
            ("e2b-sandbox-id", id),
            ("e2b-sandbox-port", "8000"),
            ("e2b-traffic-access-token", "spt_t"),
            ("x-access-token", "sxt1.claims.mac"),
            ("cookie", "a=b"),
        ]);
        in_space_terms(&mut h, true);
        assert_eq!(h["x-space-sandbox"], id);
        assert_eq!(h["x-space-port"], "8000");
        assert_eq!(h["x-space-port-token"], "spt_t");
        assert_eq!(h["cookie"], "a=b");
        for gone in [
            "e2b-sandbox-id",
            "e2b-sandbox-port",
            "e2b-traffic-access-token",
            "x-access-token",
        ] {
            assert!(!h.contains_key(gone), "{gone}");
        }
        // Host routing: no routing headers are made; a SPACE token given wins; an
        // application's own `X-Access-Token` (not one of ours) goes on.
        let mut h = headers(&[
            ("e2b-traffic-access-token", "spt_t"),
            ("x-space-port-token", "spt_own"),
            ("x-access-token", "the-apps-own"),
        ]);
        in_space_terms(&mut h, false);
        assert!(!h.contains_key("x-space-sandbox"));
        assert_eq!(h["x-space-port-token"], "spt_own");
        assert_eq!(h["x-access-token"], "the-apps-own");
        assert!(!h.contains_key("e2b-traffic-access-token"));
    }
}
