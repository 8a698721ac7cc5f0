//! The route driver of SPACE: one implementation of route recovery (`IDENTITY.md` §4)
//! for everything that sends operations to workers — the edge's forwarded requests,
//! file transfers and stream opens (the stream relay's re-opens included), and the
//! SDK's direct mode.
//!
//! - [`RouteDriver`]: the route cache (compare-and-swap replacement on the rejected
//!   route, the original expiry kept), one coalesced resolve per sandbox, and
//!   [`RouteDriver::drive`], the loop: one rebuilt attempt after a RefreshRoute, a Deny
//!   surfaced, a worker refusing connections waited for, the transport rules;
//! - [`Resolver`]: how a route is resolved (the edge: the control plane; the SDK: the
//!   edge), for one caller whose credential it holds;
//! - [`Attempt`]: what one attempt gave, classified by whoever sent it (HTTP, a
//!   streamed body, a WebSocket upgrade);
//! - [`Patience`]: the bounded wait for a worker that refuses connections.
//!
//! The decisions themselves (which route a cache may hold, whether an operation may
//! be tried again) are `space_identity`'s pure rules; this crate drives them.

mod driver;
mod patience;

pub use driver::{Attempt, Event, Resolved, Resolver, RouteDriver};
pub use patience::Patience;
