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
    /// SPACE's own API, or a service port: not the front's.
    Pass,
    /// E2B's REST API.
    Rest,
    /// envd of a sandbox.
    Envd,
}

/// Which requests the front takes: E2B's REST paths (no sandbox routing), and
/// anything routed to envd's port by `E2b-Sandbox-Id`/`E2b-Sandbox-Port` or by the
/// host name `49983-{id}.{domain}`. Everything else — `/v1`, SPACE's service-port
/// headers and host names of other ports — goes on to SPACE's router.
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
            Some(_) => Claim::Pass,
        };
    }
    if let Some(host) = headers.get(header::HOST).and_then(|v| v.to_str().ok()) {
        if let Some((port, _)) = front::port_host(host, &domain()) {
            return if port == ENVD_PORT {
                Claim::Envd
            } else {
                Claim::Pass
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
    req: Request,
    next: Next,
) -> Response {
    // The domain (a lock and a copy) only for a request that is not `/v1`'s.
    match claim(req.headers(), req.uri().path(), || front.domain()) {
        Claim::Pass => next.run(req).await,
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
        assert_eq!(claim(&port, "/", d), Claim::Pass);
        let host = headers(&[("host", &format!("49983-{id}.localhost:7070"))]);
        assert_eq!(claim(&host, "/files", d), Claim::Envd);
        let other = headers(&[("host", &format!("8000-{id}.localhost:7070"))]);
        assert_eq!(claim(&other, "/sandboxes", d), Claim::Pass);
        // SPACE's own service-port headers always win.
        let space = headers(&[("x-space-sandbox", id), ("e2b-sandbox-id", id)]);
        assert_eq!(claim(&space, "/files", d), Claim::Pass);
    }
}
