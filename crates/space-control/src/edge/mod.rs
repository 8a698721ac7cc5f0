//! The edge: forwards sandbox-scoped operations to the worker named by the route, with
//! the route cache and the recovery rules of `IDENTITY.md` §4 — both the route
//! driver's ([`space_route::RouteDriver`]), the same one the SDK drives.
//!
//! RefreshRoute from a worker → one coalesced resolve → one rebuilt attempt for an
//! eligible operation. Deny is surfaced. Cache replacement is compare-and-swap on the
//! rejected route and keeps the original authorization expiry.
//!
//! - [`authority`]: who authenticates callers and issues capabilities — the control
//!   plane in this process, or one over HTTP — and the [`Authenticated`] caller that
//!   carries the API key a remote control plane needs;
//! - `routes`: the driver's resolver for one caller (its routes, from the authority;
//!   what recovery did, counted), and `Edge::drive`;
//! - [`forward`]: buffered operations (exec, deletes, listings);
//! - [`files`]: file reads and writes, streamed;
//! - [`streams`]: WebSocket streams (terminal, watch, streaming exec) and their relay.

use std::sync::Arc;
use std::time::Duration;

use space_route::RouteDriver;

use crate::auth::Caller;
use crate::http::HttpClient;

pub mod authority;
pub(crate) mod files;
pub mod forward;
mod port_grants;
pub mod ports;
mod routes;
pub mod streams;

pub use authority::{Authenticated, Authority};
pub use forward::Forwarded;
pub use streams::Backend;

/// Routes cached at most (one per sandbox used).
const ROUTES: usize = 100_000;

/// What the cache keeps per sandbox.
#[derive(Debug, Clone)]
pub(crate) struct Grant {
    /// `SpaceCap <token>`: the worker's `authorization` header.
    pub(crate) authorization: String,
    pub(crate) worker_url: String,
    /// The tenant whose authorization produced it (`None`: an admin's).
    owner: Option<String>,
}

impl Grant {
    /// Whether `caller` may use this grant: its owner's, or any for an admin.
    fn may_serve(&self, caller: &Caller) -> bool {
        caller.admin || self.owner.as_deref() == Some(caller.tenant.as_str())
    }
}

/// The edge's state.
#[derive(Debug)]
pub struct Edge {
    authority: Authority,
    http: HttpClient,
    routes: RouteDriver<Grant>,
    /// Service-port capabilities by sandbox, port and protocol, reused until shortly
    /// before they expire (see `ports`).
    port_grants: port_grants::PortGrants,
}

impl Edge {
    /// An edge using `authority`.
    pub fn new(authority: Authority) -> Arc<Self> {
        Arc::new(Self {
            authority,
            http: HttpClient::new(Duration::from_secs(300)),
            routes: RouteDriver::new(ROUTES),
            port_grants: port_grants::PortGrants::default(),
        })
    }

    /// The authority.
    pub fn authority(&self) -> &Authority {
        &self.authority
    }

    /// Drops every cached route (tests, key rotation).
    pub fn clear(&self) {
        self.routes.clear();
        self.port_grants.clear();
    }
}
