//! The worker daemon (`space worker`): node-api + sbx-manager.
//!
//! - Enrolls with the control plane and applies its signed identity updates (install,
//!   retire, key bundle), each verified, persisted with fsync, then acknowledged.
//! - Serves the sandbox-scoped operations with `Authorization: SpaceCap …`, admitting
//!   each through `space-identity` against its persisted records (local state only),
//!   then forwarding through the verified bridge.
//! - After a restart, re-adopts executions whose processes survived and verify, and
//!   reports the others lost; nothing is ever served under a retired identity.
//!
//! # Layers
//!
//! Each layer uses only the layers below it (checked by
//! `crates/space-testkit/tests/no_import_cycles.rs`); where a lower one must reach up,
//! it owns the channel (the slots' change notifications, the streams' leases).
//!
//! 1. Storage and settings, no HTTP and no [`Worker`]: [`config`], [`records`],
//!    [`limits`], [`lock`], [`metrics`], [`agent_socket`], [`launch`] and [`warm`].
//! 2. State: [`state`] — the [`Worker`], its slots and keys, the comparator's
//!    admission against the records (no HTTP).
//! 3. Lifecycle operations: [`updates`] (verify, install, retire, pause — errors are
//!    [`updates::UpdateError`], no status codes), [`sync`] (reconciliation at start,
//!    periodic resync), [`snapshot`] (the layer archive, taking and receiving one),
//!    [`agent_watch`] (a dead agent is a lost execution).
//! 4. HTTP: [`node_api`] — parse a request, admit it (a handler takes only an
//!    `Admitted` request), handle it, and answer every refusal through one mapping.
//! 5. The process: [`start`] — bind, enroll, sync, serve, stop.

pub mod agent_socket;
pub mod agent_watch;
pub mod config;
pub mod health;
pub mod launch;
pub mod limits;
pub mod lock;
pub mod metrics;
pub mod netgtw;
pub mod node_api;
pub mod readiness;
pub mod records;
pub mod snapshot;
pub mod start;
pub mod state;
pub mod sync;
pub mod templates;
pub mod turns;
pub mod updates;
pub mod warm;

pub use config::{DEFAULT_WARM_POOL, VmSettings, WorkerConfig};
pub use launch::Binaries;
pub use start::{WorkerHandle, empty_keys, run};
pub use state::Worker;
