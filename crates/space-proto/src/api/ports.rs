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

/// Headers of a netgtw tunnel request (`POST /v1/sandboxes/{id}/netgtw`, with
/// `Upgrade: space-netgtw`): the port and protocol the tunnel is for.
pub const NETGTW_PORT_HEADER: &str = "space-port";
/// See [`NETGTW_PORT_HEADER`].
pub const NETGTW_PROTOCOL_HEADER: &str = "space-protocol";
/// The `Upgrade` token of a netgtw tunnel.
pub const NETGTW_UPGRADE: &str = "space-netgtw";
