//! Service ports (`POST/GET/DELETE /v1/sandboxes/{id}/ports`): what a caller asks
//! for, what it gets back, and the trusted exposure state a worker's netgtw compares
//! every connection with.

use serde::{Deserialize, Serialize};
use space_identity::Protocol;

/// Most ports one sandbox exposes at once.
pub const MAX_PORTS_PER_SANDBOX: usize = 32;

/// Header naming the sandbox of service-port traffic (clients without wildcard DNS).
pub const SANDBOX_HEADER: &str = "x-space-sandbox";
/// Header naming the port of service-port traffic (with [`SANDBOX_HEADER`]).
pub const PORT_HEADER: &str = "x-space-port";
/// Header carrying a port's access token.
pub const PORT_TOKEN_HEADER: &str = "x-space-port-token";
/// Cookie a one-time link sets, carrying the port's access token.
pub const PORT_COOKIE: &str = "space_port_token";
/// Query parameter of a one-time link.
pub const LINK_PARAM: &str = "space_link";
/// Seconds a one-time link stays usable.
pub const LINK_LIFETIME_SECS: u64 = 300;

/// `POST /v1/sandboxes/{id}/ports`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct ExposePort {
    /// The port inside the sandbox (1–65535), on its loopback.
    pub port: u16,
    /// `http` (default) or `tcp`.
    #[serde(default = "http")]
    #[cfg_attr(feature = "openapi", schema(value_type = crate::openapi::ProtocolSchema))]
    pub protocol: Protocol,
    /// Anyone with the URL may connect (default: only the owner's API key or the
    /// port's access token).
    #[serde(default)]
    pub public: bool,
}

fn http() -> Protocol {
    Protocol::Http
}

/// One exposed port.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct PortView {
    /// The port inside the sandbox.
    pub port: u16,
    /// `http` or `tcp`.
    #[cfg_attr(feature = "openapi", schema(value_type = crate::openapi::ProtocolSchema))]
    pub protocol: Protocol,
    /// Whether it needs no credentials.
    pub public: bool,
    /// `http://{port}-{sandbox}.{domain}:{edge port}/` (for `tcp`, the authority to
    /// `CONNECT` to is the same host name).
    pub url: String,
    /// Unix seconds it was exposed.
    pub created_at: u64,
    /// The port's access token (`X-Space-Port-Token`): only in the answer that
    /// exposed it; exposing the port again replaces it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token: Option<String>,
    /// A one-time link that sets the token as a cookie and redirects to `url`, for a
    /// browser: only in the answers of `POST …/ports` and `POST …/ports/{port}/links`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub link: Option<String>,
}

/// `GET /v1/sandboxes/{id}/ports`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct PortList {
    /// By port.
    pub ports: Vec<PortView>,
}

/// A port as the worker's netgtw knows it: trusted activation state, sent signed in
/// every install and in [`crate::api::Update::Ports`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct ExposedPort {
    /// The port.
    pub port: u16,
    /// Its protocol.
    #[cfg_attr(feature = "openapi", schema(value_type = crate::openapi::ProtocolSchema))]
    pub protocol: Protocol,
}

/// The [`ExposedPort::port`] that stands for every HTTP port of the sandbox (with
/// protocol `http` only): how a sandbox made through the E2B front has every port
/// reachable, as E2B's are (`get_host(port)`), without a record per port.
pub const EVERY_HTTP_PORT: u16 = 0;

/// The entry of `ports` that lets `port` be reached with `protocol`: the port's own
/// entry (which must have that protocol), else, for `http` to a port without one, an
/// [`EVERY_HTTP_PORT`] entry; `None` when it is not exposed so.
/// Its `port` is what counters are labelled with, so that the ports reached through
/// the catch-all cannot grow the label set.
pub fn exposure(ports: &[ExposedPort], port: u16, protocol: Protocol) -> Option<ExposedPort> {
    if port == EVERY_HTTP_PORT {
        return None;
    }
    let every = ExposedPort {
        port: EVERY_HTTP_PORT,
        protocol: Protocol::Http,
    };
    match ports.iter().find(|p| p.port == port) {
        // A port's own entry decides, also against the catch-all.
        Some(own) => (own.protocol == protocol).then_some(*own),
        None => (protocol == Protocol::Http && ports.contains(&every)).then_some(every),
    }
}

/// Whether `ports` (sorted, one entry per port) may be a sandbox's exposed ports: at
/// most [`MAX_PORTS_PER_SANDBOX`] of them besides the catch-all, which is `http` only.
pub fn check_exposed(ports: &[ExposedPort]) -> Result<(), &'static str> {
    let own = ports.iter().filter(|p| p.port != EVERY_HTTP_PORT).count();
    if own > MAX_PORTS_PER_SANDBOX {
        return Err("too many ports");
    }
    if ports
        .iter()
        .any(|p| p.port == EVERY_HTTP_PORT && p.protocol != Protocol::Http)
    {
        return Err("port 0 stands for every HTTP port and cannot be exposed for tcp");
    }
    Ok(())
}

/// Headers of a netgtw tunnel request (`POST /v1/sandboxes/{id}/netgtw`, with
/// `Upgrade: space-netgtw`): the port and protocol the tunnel is for.
pub const NETGTW_PORT_HEADER: &str = "space-port";
/// See [`NETGTW_PORT_HEADER`].
pub const NETGTW_PROTOCOL_HEADER: &str = "space-protocol";
/// The `Upgrade` token of a netgtw tunnel.
pub const NETGTW_UPGRADE: &str = "space-netgtw";

/// The port and sandbox a service-port host name `{port}-{sandbox}.{domain}[:edge
/// port]` names. With `domain`, the rest of the name must be exactly it (ASCII case
/// ignored); without, any rest is accepted (netgtw, which does not know the edge's
/// domain, only compares what the name says).
pub fn port_host(host: &str, domain: Option<&str>) -> Option<(u16, space_identity::SandboxId)> {
    let name = match host.rsplit_once(':') {
        Some((name, port)) if !port.is_empty() && port.bytes().all(|b| b.is_ascii_digit()) => name,
        _ => host,
    };
    let (label, rest) = name.split_once('.')?;
    if let Some(domain) = domain {
        if !rest.eq_ignore_ascii_case(domain) {
            return None;
        }
    }
    let (port, sandbox) = label.split_once('-')?;
    if port.is_empty() || port.len() > 5 || !port.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let port: u16 = port.parse().ok().filter(|p| *p != 0)?;
    // IDs are lowercase; a browser may send the name in another case.
    let sandbox = sandbox.to_ascii_lowercase().parse().ok()?;
    Some((port, sandbox))
}

/// The URL of `port` of `sandbox` at an edge reached as `edge_host` (`host:port`)
/// with service-port domain `domain`.
pub fn port_url(
    port: u16,
    sandbox: &space_identity::SandboxId,
    domain: &str,
    edge_port: u16,
) -> String {
    format!("http://{port}-{sandbox}.{domain}:{edge_port}/")
}

#[cfg(test)]
mod tests {
    use super::*;

    const SBX: &str = "sbx_aaaaaaaaaaaaaaaaaaaaaaaaaa";

    #[test]
    fn a_port_host_names_its_port_and_sandbox() {
        let Ok(id) = SBX.parse::<space_identity::SandboxId>() else {
            // The fixture's spelling is not an ID: nothing else here can be checked.
            panic!("{SBX} is not a sandbox id");
        };
        let host = format!("8000-{id}.localhost:7070");
        assert_eq!(port_host(&host, Some("localhost")), Some((8000, id)));
        assert_eq!(port_host(&host, None), Some((8000, id)));
        let upper = format!("8000-{}.LOCALHOST", id.to_string().to_uppercase());
        assert_eq!(port_host(&upper, Some("localhost")), Some((8000, id)));
    }

    #[test]
    fn names_that_are_not_port_hosts_name_nothing() {
        let id: space_identity::SandboxId = SBX.parse().expect("id");
        for host in [
            "localhost:7070".to_owned(),
            format!("8000-{id}.example.com"),
            format!("0-{id}.localhost"),
            format!("65536-{id}.localhost"),
            format!("+80-{id}.localhost"),
            format!("8000-{id}x.localhost"),
            format!("8000{id}.localhost"),
        ] {
            assert_eq!(port_host(&host, Some("localhost")), None, "{host}");
        }
    }

    #[test]
    fn the_catch_all_covers_http_to_ports_without_an_entry_of_their_own() {
        let e = |port, protocol| ExposedPort { port, protocol };
        let only = [e(8080, Protocol::Http), e(9000, Protocol::Tcp)];
        assert_eq!(
            exposure(&only, 8080, Protocol::Http),
            Some(e(8080, Protocol::Http))
        );
        assert_eq!(exposure(&only, 8080, Protocol::Tcp), None);
        assert_eq!(exposure(&only, 8081, Protocol::Http), None);
        let every = [
            e(EVERY_HTTP_PORT, Protocol::Http),
            e(8080, Protocol::Http),
            e(9000, Protocol::Tcp),
        ];
        let all = e(EVERY_HTTP_PORT, Protocol::Http);
        assert_eq!(exposure(&every, 8081, Protocol::Http), Some(all));
        assert_eq!(
            exposure(&every, 8080, Protocol::Http),
            Some(e(8080, Protocol::Http))
        );
        // Never raw TCP, never port 0 itself, and a port's own entry decides.
        assert_eq!(exposure(&every, 8081, Protocol::Tcp), None);
        assert_eq!(exposure(&every, EVERY_HTTP_PORT, Protocol::Http), None);
        assert_eq!(exposure(&every, 9000, Protocol::Http), None);
        assert_eq!(
            exposure(&every, 9000, Protocol::Tcp),
            Some(e(9000, Protocol::Tcp))
        );
        assert_eq!(check_exposed(&every), Ok(()));
        assert!(check_exposed(&[e(EVERY_HTTP_PORT, Protocol::Tcp)]).is_err());
        let full: Vec<_> = (1..=MAX_PORTS_PER_SANDBOX as u16)
            .map(|p| e(p, Protocol::Http))
            .collect();
        let mut with_all = vec![e(EVERY_HTTP_PORT, Protocol::Http)];
        with_all.extend(full.iter().copied());
        assert_eq!(check_exposed(&with_all), Ok(()));
        let mut over = full;
        over.push(e(9999, Protocol::Tcp));
        assert!(check_exposed(&over).is_err());
        // A catch-all that says `tcp` is no catch-all.
        assert_eq!(
            exposure(&[e(EVERY_HTTP_PORT, Protocol::Tcp)], 81, Protocol::Tcp),
            None
        );
    }
}
