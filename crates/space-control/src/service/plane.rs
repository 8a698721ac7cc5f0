//! The [`ControlPlane`]: the state every operation shares, and its constructor. Each
//! operation lives in a sibling module (`impl ControlPlane` there); this module
//! names none of them but the two leaves its fields are made of ([`Arrivals`],
//! [`LoadView`]).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use space_identity::{SandboxId, WorkerId};
use space_store::{Store, Tenant};
use tokio::sync::RwLock;

use super::arrivals::Arrivals;
use super::load::LoadView;
use crate::auth::KeyCache;
use crate::error::ControlError;
use crate::http::HttpClient;
use crate::keyring::Keyring;
use crate::metrics::Metrics;
use crate::now_secs;

/// How long issued capabilities live (the verifier caps it at 120 s).
pub const CAPABILITY_LIFETIME_SECS: u64 = 60;
/// Longest TTL a sandbox may ask for.
pub const MAX_TTL_SECS: u64 = 30 * 86_400;

/// How long a resolve waits for a sandbox in a transition (a migration, a start, a
/// restart after its worker was lost) to have an acknowledged execution again.
pub const DEFAULT_TRANSITION_WAIT: Duration = Duration::from_secs(10);

/// The longest wait a caller may ask for.
pub const MAX_TRANSITION_WAIT: Duration = Duration::from_secs(30);

/// The control plane: shared by every request handler.
#[derive(Debug)]
pub struct ControlPlane {
    /// Durable state.
    pub store: Store,
    pub(super) keys: RwLock<Arc<Keyring>>,
    pub(super) http: HttpClient,
    pub(super) key_cache: KeyCache,
    pub(super) enroll_secret: String,
    /// Prometheus metrics.
    pub metrics: Metrics,
    /// Sandboxes whose lifecycle operation runs in this process right now: the
    /// reconciler leaves them alone.
    pub(super) busy: std::sync::Mutex<std::collections::HashSet<SandboxId>>,
    /// How long a transition may sit unfinished before the reconciler takes it over.
    pub(super) reconcile_after_secs: i64,
    /// Where snapshots are kept (one replica's disk; shared storage for several).
    pub(super) snapshot_dir: std::path::PathBuf,
    /// Sandboxes per worker as placement sees them.
    pub(super) load: std::sync::Mutex<LoadView>,
    /// Standby sandboxes to keep ready (0: none).
    pub(super) standby_target: std::sync::atomic::AtomicUsize,
    /// Standby sandboxes of the default template to keep ready with a link made
    /// (`--standby-egress`), for creates in mode `egress` (0: none).
    pub(super) standby_egress_target: std::sync::atomic::AtomicUsize,
    /// Standby pools of image templates the operator named (`--standby-template`).
    pub(super) standby_templates: std::sync::RwLock<Vec<crate::standby_plan::TemplatePool>>,
    /// Every pool's kind (its template as records name it, pinned), with its size:
    /// which creates may claim a standby sandbox.
    pub(super) standby_pinned:
        std::sync::RwLock<std::collections::BTreeMap<crate::standby_plan::PoolKey, usize>>,
    /// Standby starts under way, per worker.
    pub(super) standby_in_flight: std::sync::Mutex<std::collections::BTreeMap<WorkerId, usize>>,
    /// Workers that get no standby start until then (one failed there).
    pub(super) standby_backoff:
        std::sync::Mutex<std::collections::BTreeMap<WorkerId, std::time::Instant>>,
    /// When a create last claimed a standby sandbox, and since when the keeper has
    /// held refills back for it ([`crate::standby_plan::BurstClock::hold_refills`]).
    pub(super) standby_burst: std::sync::Mutex<crate::standby_plan::BurstClock>,
    /// Update sequence numbers reserved ahead, per worker (`channel::SeqBlock`).
    pub(super) seq_blocks: super::seq_blocks::SeqBlocks,
    /// Default and largest sandbox limits, and the per-tenant sandbox quota.
    pub(super) limits_policy: std::sync::RwLock<crate::limits::LimitsPolicy>,
    /// The network mode of a create that names no policy (`none` unless set).
    pub(super) network_default: std::sync::RwLock<space_proto::api::NetworkMode>,
    /// The template of a create that names none (`default`: the host's directories).
    pub(super) default_template: std::sync::RwLock<String>,
    /// The substrate of a create that names none (`jail` unless set).
    pub(super) default_substrate: std::sync::RwLock<space_identity::Substrate>,
    /// Per tenant, this process's creates between their quota check and their
    /// sandbox's row: counted with the store's live sandboxes, so a burst cannot pass
    /// the quota together (see [`QuotaHold`](super::quota::QuotaHold)).
    pub(super) quota_pending: Arc<std::sync::Mutex<BTreeMap<String, u64>>>,
    /// How long a resolve waits for a sandbox in a transition to settle by default
    /// (`SPACE_TRANSITION_WAIT_MS`, 10 s unless set).
    pub(super) transition_wait: Duration,
    /// Rebuilt attempts' capabilities: a freeze lets them arrive first.
    pub(super) arrivals: Arrivals,
    /// Where service-port URLs point.
    pub(super) port_urls: std::sync::RwLock<super::port_urls::PortUrls>,
    /// The key of one-time links' cookies (loaded from the store on first use).
    pub(super) cookie_key: std::sync::OnceLock<[u8; 32]>,
    /// The largest image archive a template import takes ([`MAX_TEMPLATE_BYTES`]
    /// unless set).
    pub(super) max_template_bytes: std::sync::atomic::AtomicU64,
}

/// The template of a sandbox started on the host's own system directories.
pub const DEFAULT_TEMPLATE: &str = "default";

/// Largest image archive a template import takes (8 GiB): 413 past it.
pub const MAX_TEMPLATE_BYTES: u64 = 8 << 30;

/// The tenant that owns standby sandboxes until a create claims one. Tenant IDs that
/// callers get are `ten_…`: no API key can ever act for it.
pub const STANDBY_TENANT: &str = "_standby";

/// Standby sandboxes `space up` keeps per worker unless told otherwise (`space
/// control` keeps none by default: its operator sizes them).
pub const STANDBY_PER_WORKER: usize = 16;

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
            standby_egress_target: std::sync::atomic::AtomicUsize::new(0),
            standby_templates: std::sync::RwLock::default(),
            standby_pinned: std::sync::RwLock::default(),
            standby_in_flight: std::sync::Mutex::default(),
            standby_backoff: std::sync::Mutex::default(),
            standby_burst: std::sync::Mutex::default(),
            seq_blocks: super::seq_blocks::SeqBlocks::default(),
            quota_pending: Arc::default(),
            limits_policy: std::sync::RwLock::new(crate::limits::LimitsPolicy::from_env()),
            network_default: std::sync::RwLock::default(),
            default_template: std::sync::RwLock::new(DEFAULT_TEMPLATE.into()),
            default_substrate: std::sync::RwLock::new(space_identity::Substrate::Jail),
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
            arrivals: Arrivals::from_env(),
            port_urls: std::sync::RwLock::default(),
            cookie_key: std::sync::OnceLock::new(),
            max_template_bytes: std::sync::atomic::AtomicU64::new(MAX_TEMPLATE_BYTES),
        }))
    }
}
