//! `POST /v1/sandboxes/{id}/netgtw`: a service-port tunnel, admitted here and run by
//! [`crate::daemon::netgtw`].

use std::sync::Arc;

use axum::extract::{Path, Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use space_identity::{Protocol, ServicePort};
use space_proto::api::ports::{NETGTW_PORT_HEADER, NETGTW_PROTOCOL_HEADER, NETGTW_UPGRADE};

use super::admission::admit_service_port;
use super::refusal::Refusal;
use crate::daemon::netgtw::Tunnel;
use crate::daemon::state::Worker;

/// The port and protocol a tunnel request names.
fn requested(req: &Request) -> Result<ServicePort, Refusal> {
    let h = req.headers();
    let text = |name: &str| {
        h.get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::trim)
            .ok_or_else(|| Refusal::BadRequest(format!("a netgtw tunnel needs the {name} header")))
    };
    let port = text(NETGTW_PORT_HEADER)?
        .parse::<u16>()
        .ok()
        .filter(|p| *p != 0)
        .ok_or_else(|| {
            Refusal::BadRequest(format!("{NETGTW_PORT_HEADER} must be a port, 1-65535"))
        })?;
    let protocol = text(NETGTW_PROTOCOL_HEADER)?
        .parse::<Protocol>()
        .map_err(|_| {
            Refusal::BadRequest(format!("{NETGTW_PROTOCOL_HEADER} must be http or tcp"))
        })?;
    let upgrade = h
        .get(header::UPGRADE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.trim().eq_ignore_ascii_case(NETGTW_UPGRADE));
    if !upgrade {
        return Err(Refusal::BadRequest(format!(
            "a netgtw tunnel is an upgrade: Upgrade: {NETGTW_UPGRADE}"
        )));
    }
    Ok(ServicePort { port, protocol })
}

/// `POST /v1/sandboxes/{id}/netgtw` with `Upgrade: space-netgtw`, `space-port` and
/// `space-protocol`: a tunnel to that port inside the sandbox, once the capability
/// (purpose `service_port`, naming this port and protocol) is admitted against the
/// sandbox's record, which must expose the port. `101` and then the tunnel's bytes.
#[utoipa::path(post, path = "/v1/sandboxes/{id}/netgtw", tag = "netgtw", params(space_proto::openapi::SandboxPath, ("space-port" = u16, Header, description = "The port inside the sandbox"), ("space-protocol" = String, Header, description = "`http` or `tcp`: what the capability grants")), responses((status = 101, description = "The tunnel: raw bytes for `tcp`, HTTP/1.1 requests (each checked) for `http`"), (status = 502, description = "Nothing accepts connections on the port (`port_closed`)", body = space_proto::api::ErrorBody), super::openapi::Operation), security(("capability" = [])))]
pub async fn open(
    State(w): State<Arc<Worker>>,
    Path(id): Path<String>,
    mut req: Request,
) -> Response {
    let refused = |w: &Worker, port: u16, r: Refusal| {
        let held = id.parse().ok().filter(|s| w.slot(s).is_some());
        let reason = match &r {
            Refusal::Deny(reason) => reason.as_str().to_owned(),
            Refusal::RefreshRoute(_) => "refresh_route".to_owned(),
            other => format!("{}", other.status().as_u16()),
        };
        w.metrics.port_refused(held.as_ref(), port, &reason);
        r.closing()
    };
    let port = match requested(&req) {
        Ok(p) => p,
        Err(r) => return refused(&w, 0, r),
    };
    let slot = match admit_service_port(&w, req.headers(), &id, port).await {
        Ok(admitted) => admitted.into_slot(),
        Err(r) => return refused(&w, port.port, r),
    };
    let tunnel = match Tunnel::open(&w, slot, port).await {
        Ok(t) => t,
        Err(r) => return refused(&w, port.port, r),
    };
    let upgrade = hyper::upgrade::on(&mut req);
    tokio::spawn(async move {
        if let Ok(client) = upgrade.await {
            tunnel.run(client).await;
        }
    });
    let mut resp = StatusCode::SWITCHING_PROTOCOLS.into_response();
    let h = resp.headers_mut();
    h.insert(header::UPGRADE, HeaderValue::from_static(NETGTW_UPGRADE));
    h.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
    resp
}
