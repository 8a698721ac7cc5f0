//! The control plane's operations, independent of HTTP (their errors are
//! [`ControlError`]s; `api` gives them their answers). This root holds the
//! [`ControlPlane`] and its constructor; each child one job:
//!
//! - `tenants`: API keys and tenants; `sandboxes`: views, creates, the limits policy;
//!   `standby`: sandboxes started ahead of demand;
//! - `workers`: enrollment, credentials, sync, lost executions; `channel`: signed
//!   updates, their delivery, key bundles pushed; `keys`: the keyring, rotation;
//! - `placing` and `quota`: where a create goes, and whether it may;
//! - `executions`: start, pause and resume, stop, retire; `transitions`: one
//!   operation per sandbox at a time and its lease; `snapshots`: snapshots and
//!   migrations; `arrivals`: rebuilt attempts let in before a freeze;
//! - `capabilities`: waiting for a settled sandbox, issuing a capability;
//! - `reconcile`: background work (interrupted transitions, TTLs, gauges).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD as B64;
use space_identity::{
    Access, AccessSet, Claims, Execution, ExecutionId, Generation, Placement, Protocol, Purpose,
    Route, SandboxId, ServicePort, Timestamp, TokenId, WorkerId,
};
use space_proto::api::{
    self, CapabilityResponse, CreateSandbox, ExecutionView, InstallExecution, RouteView,
    SignedUpdate, Update, UpdateAck, UpdateBody, WorkerView,
};
use space_store::{
    ApiKeyRecord, ExecutionRecord, ExecutionState, SandboxRecord, SandboxState, Store, Tenant,
    WorkerRecord, WorkerState,
};
use tokio::sync::RwLock;

use crate::auth::{self, Caller, IssuedKey, KeyCache};
use crate::error::ControlError;
use crate::http::HttpClient;
use crate::keyring::{self, Keyring};
use crate::metrics::Metrics;
use crate::placement::{self, Candidate};
use crate::{now_secs, random_bytes};

/// How long issued capabilities live (the verifier caps it at 120 s).
pub const CAPABILITY_LIFETIME_SECS: u64 = 60;
/// Longest TTL a sandbox may ask for.
pub const MAX_TTL_SECS: u64 = 30 * 86_400;

// One job each; every child sees what is imported or declared here (`use super::*`).
mod arrivals;
mod capabilities;
mod channel;
mod executions;
mod keys;
mod placing;
mod quota;
mod reconcile;
mod sandboxes;
mod snapshots;
mod standby;
mod tenants;
mod transitions;
mod workers;

use channel::install_of;
use placing::LoadView;
use quota::QuotaHold;
use sandboxes::ttl_pause_key;
use transitions::{lease_key, step_key};

pub use capabilities::{DEFAULT_TRANSITION_WAIT, MAX_TRANSITION_WAIT};
pub use sandboxes::api_state;

/// The control plane: shared by every request handler.
#[derive(Debug)]
pub struct ControlPlane {
    /// Durable state.
    pub store: Store,
    keys: RwLock<Arc<Keyring>>,
    http: HttpClient,
    key_cache: KeyCache,
    enroll_secret: String,
    /// Prometheus metrics.
    pub metrics: Metrics,
    /// Sandboxes whose lifecycle operation runs in this process right now: the
    /// reconciler leaves them alone.
    busy: std::sync::Mutex<std::collections::HashSet<SandboxId>>,
    /// How long a transition may sit unfinished before the reconciler takes it over.
    reconcile_after_secs: i64,
    /// Where snapshots are kept (one replica's disk; shared storage for several).
    snapshot_dir: std::path::PathBuf,
    /// Sandboxes per worker as placement sees them.
    load: std::sync::Mutex<LoadView>,
    /// Standby sandboxes to keep ready (0: none).
    standby_target: std::sync::atomic::AtomicUsize,
    /// When a create last ran in this process: the standby keeper waits for a quiet
    /// moment before refilling, so refills never compete with a burst.
    last_create: std::sync::Mutex<Option<std::time::Instant>>,
    /// Default and largest sandbox limits, and the per-tenant sandbox quota.
    limits_policy: std::sync::RwLock<crate::limits::LimitsPolicy>,
    /// Per tenant, this process's creates between their quota check and their
    /// sandbox's row: counted with the store's live sandboxes, so a burst cannot pass
    /// the quota together (see [`QuotaHold`]).
    quota_pending: Arc<std::sync::Mutex<BTreeMap<String, u64>>>,
    /// How long a resolve waits for a sandbox in a transition to settle by default
    /// (`SPACE_TRANSITION_WAIT_MS`, 10 s unless set).
    transition_wait: Duration,
    /// Rebuilt attempts' capabilities: a freeze lets them arrive first.
    arrivals: arrivals::Arrivals,
}

/// The tenant that owns standby sandboxes until a create claims one. Tenant IDs that
/// callers get are `ten_…`: no API key can ever act for it.
pub const STANDBY_TENANT: &str = "_standby";

/// Standby sandboxes `space up` keeps per worker unless told otherwise (`space
/// control` keeps none by default: its operator sizes them).
pub const STANDBY_PER_WORKER: usize = 16;

/// How long after the last create the standby keeper waits before refilling.
const STANDBY_QUIET: Duration = Duration::from_millis(300);

/// How long placement trusts the store's count of sandboxes per worker.
const LOAD_TTL: Duration = Duration::from_secs(1);

/// How long a worker's reported count of warm jails guides placement.
const WARM_ESTIMATE_TTL: Duration = Duration::from_secs(2);

fn b64(bytes: &[u8]) -> String {
    B64.encode(bytes)
}

impl ControlPlane {
    /// Opens the control plane on `store`, creating keys on first start.
    pub async fn new(
        store: Store,
        enroll_secret: String,
        snapshot_dir: std::path::PathBuf,
    ) -> Result<Arc<Self>, ControlError> {
        let keys = Keyring::load(&store, now_secs() as i64).await?;
        let standby = Tenant {
            id: STANDBY_TENANT.into(),
            name: "standby sandboxes".into(),
            created_at: now_secs() as i64,
        };
        match store.create_tenant(&standby).await {
            Ok(()) | Err(space_store::StoreError::Conflict(_)) => {}
            Err(e) => return Err(e.into()),
        }
        Ok(Arc::new(Self {
            store,
            keys: RwLock::new(Arc::new(keys)),
            http: HttpClient::new(Duration::from_secs(30)),
            key_cache: KeyCache::new(Duration::from_secs(5)),
            enroll_secret,
            metrics: Metrics::default(),
            busy: std::sync::Mutex::new(Default::default()),
            load: std::sync::Mutex::new(LoadView::default()),
            standby_target: std::sync::atomic::AtomicUsize::new(0),
            last_create: std::sync::Mutex::new(None),
            quota_pending: Arc::default(),
            limits_policy: std::sync::RwLock::new(crate::limits::LimitsPolicy::from_env()),
            reconcile_after_secs: std::env::var("SPACE_RECONCILE_AFTER_SECS")
                .ok()
                .and_then(|v| v.parse().ok())
                .unwrap_or(30),
            snapshot_dir,
            transition_wait: std::env::var("SPACE_TRANSITION_WAIT_MS")
                .ok()
                .and_then(|v| v.parse().ok())
                .map_or(DEFAULT_TRANSITION_WAIT, Duration::from_millis)
                .min(MAX_TRANSITION_WAIT),
            arrivals: arrivals::Arrivals::from_env(),
        }))
    }
}

/// Largest archive of a writable layer taken or sent (the workers' limit).
const MAX_ARCHIVE: u64 = 1 << 30;
