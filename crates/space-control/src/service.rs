//! The control plane's operations, independent of HTTP (their errors are
//! [`ControlError`](crate::error::ControlError)s; `api` gives them their answers).
//! This root only declares and re-exports: `plane` holds the [`ControlPlane`] and its
//! constructor, `load` and `arrivals` the two leaves it is made of; each other child
//! one job, written as `impl ControlPlane` and naming `plane` and the leaves it uses:
//!
//! - `tenants`: API keys and tenants; `sandboxes`: views, creates, the limits policy;
//!   `standby`: sandboxes started ahead of demand;
//! - `workers`: enrollment, credentials, sync, lost executions; `channel`: signed
//!   updates, their delivery, key bundles pushed; `keys`: the keyring, rotation;
//! - `placing` and `quota`: where a create goes, and whether it may;
//! - `executions`: start, pause and resume, stop, retire; `transitions`: one
//!   operation per sandbox at a time and its lease; `snapshots`: snapshots and
//!   migrations; `arrivals`: rebuilt attempts let in before a freeze;
//! - `ports`: service ports, their tokens, links and cookies; `network`: the
//!   default network policy, replacing a sandbox's and pushing it;
//! - `templates`: templates imported (blobs only), listed, removed, pinned by a
//!   create, pushed to a worker that lacks one;
//! - `capabilities`: waiting for a settled sandbox, issuing a capability;
//! - `reconcile`: background work (interrupted transitions, TTLs, gauges).

mod arrivals;
mod capabilities;
mod channel;
mod commit;
mod default_template;
mod executions;
mod keys;
mod load;
mod network;
mod placing;
mod plane;
mod port_urls;
mod ports;
mod quota;
mod reconcile;
mod sandboxes;
mod seq_blocks;
mod snapshots;
mod standby;
mod templates;
mod tenants;
mod transitions;
mod workers;

pub use crate::standby_plan::TemplatePool;
pub use network::NetworkApplied;
pub use plane::{
    CAPABILITY_LIFETIME_SECS, ControlPlane, DEFAULT_TRANSITION_WAIT, MAX_TEMPLATE_BYTES,
    MAX_TRANSITION_WAIT, MAX_TTL_SECS, STANDBY_PER_WORKER, STANDBY_TENANT,
};
pub use ports::{COOKIE_LIFETIME_SECS, PortUrls, cookie_valid, secret_matches};
pub use sandboxes::api_state;
pub use standby::{STARTS_PER_WORKER, held_link_policy};
pub use templates::{DEFAULT_TEMPLATE, TEMPLATE_MISSING, pinned_digest};
