//! The control plane's operations, independent of HTTP: tenants and keys, sandboxes and
//! their executions, placement, capability issuance, key rotation, and the signed
//! identity updates it pushes to workers.

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

mod arrivals;
mod background;
mod capabilities;
mod executions;
mod placing;
mod quota;
mod snapshots;
mod workers;

use placing::LoadView;
use quota::QuotaHold;

pub use capabilities::{DEFAULT_TRANSITION_WAIT, MAX_TRANSITION_WAIT};

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

/// Marks a sandbox busy for as long as it lives; with a lease, also renews the
/// sandbox's lease in the store so that other replicas' reconcilers leave it alone.
struct Busy<'a>(
    &'a ControlPlane,
    SandboxId,
    Option<tokio::task::AbortHandle>,
);

impl Drop for Busy<'_> {
    fn drop(&mut self) {
        if let Some(lease) = self.2.take() {
            lease.abort();
        }
        if let Ok(mut b) = self.0.busy.lock() {
            b.remove(&self.1);
        }
    }
}

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

    /// The current keys.
    pub async fn keys(&self) -> Arc<Keyring> {
        Arc::clone(&*self.keys.read().await)
    }

    /// Re-reads keys from the store (other replicas may have rotated).
    pub async fn reload_keys(&self) -> Result<(), ControlError> {
        let fresh = self.keys().await.reload(&self.store).await?;
        *self.keys.write().await = Arc::new(fresh);
        Ok(())
    }

    // ---- callers -------------------------------------------------------------------

    /// Resolves an `Authorization: Bearer` API key to its caller.
    pub async fn authenticate(&self, bearer: &str) -> Result<Caller, ControlError> {
        let (id, hash) = auth::parse_key(bearer).ok_or(ControlError::Unauthorized)?;
        if let Some(c) = self.key_cache.get(id, &hash) {
            return Ok(c);
        }
        let record = self
            .store
            .find_api_key(id)
            .await?
            .filter(|k| k.revoked_at.is_none() && auth::hashes_equal(&k.hash, &hash))
            .ok_or(ControlError::Unauthorized)?;
        let caller = Caller {
            tenant: record.tenant,
            key_id: record.id,
            admin: record.admin,
        };
        self.key_cache.put(id, hash, caller.clone());
        Ok(caller)
    }

    /// Creates a tenant with a first key.
    pub async fn create_tenant(
        &self,
        name: &str,
        admin: bool,
    ) -> Result<(Tenant, IssuedKey), ControlError> {
        if name.is_empty() || name.len() > 64 {
            return Err(ControlError::BadRequest(
                "tenant name must be 1 to 64 characters".into(),
            ));
        }
        let tenant = Tenant {
            id: format!(
                "ten_{}",
                SandboxId::from_bytes(random_bytes())
                    .to_string()
                    .trim_start_matches("sbx_")
            ),
            name: name.to_owned(),
            created_at: now_secs() as i64,
        };
        self.store.create_tenant(&tenant).await?;
        let key = self.create_key(&tenant.id, admin).await?;
        Ok((tenant, key))
    }

    /// Issues a new API key for `tenant`.
    pub async fn create_key(&self, tenant: &str, admin: bool) -> Result<IssuedKey, ControlError> {
        let key = auth::issue_key();
        self.store
            .insert_api_key(&ApiKeyRecord {
                id: key.id.clone(),
                tenant: tenant.to_owned(),
                hash: key.hash,
                admin,
                created_at: now_secs() as i64,
                revoked_at: None,
            })
            .await?;
        Ok(key)
    }

    /// Revokes a key of `tenant` (admins may revoke any).
    pub async fn revoke_key(&self, caller: &Caller, id: &str) -> Result<(), ControlError> {
        let key = self
            .store
            .find_api_key(id)
            .await?
            .filter(|k| caller.admin || k.tenant == caller.tenant)
            .ok_or(ControlError::NotFound("api key"))?;
        self.store
            .revoke_api_key(&key.id, now_secs() as i64)
            .await?;
        self.key_cache.forget(&key.id);
        Ok(())
    }

    // ---- sandboxes -----------------------------------------------------------------

    /// The sandbox `id` if `caller` may see it (404 otherwise, revealing nothing).
    pub async fn sandbox_for(
        &self,
        caller: &Caller,
        id: &SandboxId,
    ) -> Result<SandboxRecord, ControlError> {
        match self.store.get_sandbox(id).await {
            Ok(s) if s.tenant == caller.tenant || caller.admin => Ok(s),
            Ok(_) | Err(space_store::StoreError::NotFound(_)) => {
                Err(ControlError::NotFound("sandbox"))
            }
            Err(e) => Err(e.into()),
        }
    }

    /// The user-facing view of a sandbox.
    pub async fn view(&self, s: &SandboxRecord) -> Result<api::Sandbox, ControlError> {
        let execution = match s.state {
            SandboxState::Stopped => None,
            _ => self.store.current_execution(&s.id).await?,
        };
        let mut view = self.view_of(s, execution.as_ref());
        if s.state == SandboxState::Migrating {
            view.step = self
                .store
                .kv_get(&step_key(&s.id))
                .await?
                .filter(|v| !v.is_empty());
        }
        Ok(view)
    }

    /// The API view of `s` with its current execution `e` (no step).
    fn view_of(&self, s: &SandboxRecord, e: Option<&ExecutionRecord>) -> api::Sandbox {
        let execution = e.map(|e| ExecutionView {
            generation: e.generation,
            execution_id: e.execution_id,
            worker: e.worker.clone(),
            substrate: e.substrate,
            activation: e.activation,
        });
        api::Sandbox {
            id: s.id,
            state: api_state(s.state),
            template: s.template.clone(),
            created_at: api::rfc3339(s.created_at.max(0) as u64),
            expires_at: s.expires_at.map(|t| api::rfc3339(t.max(0) as u64)),
            execution,
            metadata: s.metadata.clone(),
            step: None,
            limits: Some(api::LimitsView::from(&crate::limits::of_store(
                s.limits.as_ref(),
            ))),
        }
    }

    /// The sandbox's current execution, which must be running (`409 not_running`
    /// otherwise).
    async fn running_execution(
        &self,
        sandbox: &SandboxId,
    ) -> Result<ExecutionRecord, ControlError> {
        self.store
            .current_execution(sandbox)
            .await?
            .filter(|e| e.state == ExecutionState::Running)
            .ok_or(ControlError::NotRunning)
    }

    /// Records the step a snapshot or migration of `sandbox` is at, for clients that
    /// show progress (best effort: a failure to record it changes nothing else).
    async fn step(&self, sandbox: &SandboxId, step: String) {
        let _ = self.store.kv_set(&step_key(sandbox), &step).await;
    }

    /// Creates a sandbox and launches its first execution.
    pub async fn create_sandbox(
        &self,
        caller: &Caller,
        req: CreateSandbox,
    ) -> Result<api::Sandbox, ControlError> {
        let template = req.template.unwrap_or_else(|| "default".into());
        if template != "default" {
            return Err(ControlError::BadRequest(format!(
                "unknown template {template:?}"
            )));
        }
        if let Some(ttl) = req.ttl_secs {
            if ttl == 0 || ttl > MAX_TTL_SECS {
                return Err(ControlError::BadRequest(format!(
                    "ttl_secs must be 1 to {MAX_TTL_SECS}"
                )));
            }
        }
        let pause_at_ttl = match req.ttl_action.as_deref() {
            None | Some("stop") => false,
            Some("pause") if req.ttl_secs.is_some() => true,
            Some("pause") => {
                return Err(ControlError::BadRequest("ttl_action needs ttl_secs".into()));
            }
            Some(other) => {
                return Err(ControlError::BadRequest(format!(
                    "ttl_action must be stop or pause, not {other:?}"
                )));
            }
        };
        let env = req.env.unwrap_or_default();
        validate_env(&env)?;
        let metadata = req
            .metadata
            .unwrap_or(serde_json::Value::Object(Default::default()));
        if metadata.to_string().len() > 16 * 1024 {
            return Err(ControlError::BadRequest("metadata is over 16 KiB".into()));
        }
        let policy = self.limits_policy();
        let limits = policy.resolve(req.limits.as_ref())?;
        let mut quota_hold = None;
        if caller.tenant != STANDBY_TENANT {
            // Standby sandboxes belong to no tenant until claimed: they never count.
            // Creates of this process still under way count too (a burst that read
            // the same count would pass the quota together); a create whose row is
            // already written may be counted twice for a moment, which only refuses
            // early near the quota, never admits past it. Replicas on one PostgreSQL
            // each count their own creates under way.
            let (hold, pending) = QuotaHold::take(&self.quota_pending, &caller.tenant);
            quota_hold = Some(hold);
            let live = self.store.count_live_sandboxes(&caller.tenant).await?;
            policy.admit(live + pending)?;
            *self
                .last_create
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner) =
                Some(std::time::Instant::now());
        }
        let now = now_secs() as i64;
        let expires_at = req.ttl_secs.map(|t| now + t as i64);
        // A standby sandbox is a default sandbox that already runs: claiming one is a
        // single write. Sandboxes with their own environment or a chosen worker are
        // started for the request.
        // Standby sandboxes run with the default limits: other limits start their own.
        let plain = env.is_empty() && req.worker.is_none() && limits == policy.defaults;
        if plain && caller.tenant != STANDBY_TENANT && self.standby_target() > 0 {
            let claim = space_store::Claim {
                tenant: caller.tenant.clone(),
                created_at: now,
                expires_at,
                metadata: metadata.clone(),
            };
            if let Some(s) = self.store.claim_standby(STANDBY_TENANT, &claim).await? {
                drop(quota_hold.take());
                if pause_at_ttl {
                    self.store.kv_set(&ttl_pause_key(&s.id), "pause").await?;
                }
                self.metrics.standby_claims.inc();
                self.metrics.standby_ready.dec();
                return self.view(&s).await;
            }
        }
        let placed = self.place_create(req.worker.as_ref()).await?;
        let worker = &placed.worker;
        let record = SandboxRecord {
            id: SandboxId::from_bytes(random_bytes()),
            tenant: caller.tenant.clone(),
            template,
            state: SandboxState::Starting,
            created_at: now,
            expires_at,
            metadata,
            env,
            generation: 0,
            limits: Some(crate::limits::to_store(&limits)),
        };
        let _busy = self.transition(record.id)?;
        self.store.create_sandbox(&record).await?;
        // The row counts from here on.
        drop(quota_hold);
        if pause_at_ttl {
            self.store
                .kv_set(&ttl_pause_key(&record.id), "pause")
                .await?;
        }
        let exe = match self.start_execution(&record, worker).await {
            Ok(exe) => exe,
            Err(e) => {
                let _ = self
                    .store
                    .set_sandbox_state(
                        &record.id,
                        SandboxState::Stopped,
                        Some(SandboxState::Starting),
                    )
                    .await;
                return Err(e);
            }
        };
        self.store
            .set_sandbox_state(
                &record.id,
                SandboxState::Running,
                Some(SandboxState::Starting),
            )
            .await?;
        // Built from what was written (the conditional updates above succeeded), not
        // read back: a create under load costs no extra reads.
        let s = SandboxRecord {
            state: SandboxState::Running,
            generation: exe.generation,
            ..record
        };
        Ok(self.view_of(&s, Some(&exe)))
    }

    /// The limits policy in force (defaults, maxima, tenant quota).
    pub fn limits_policy(&self) -> crate::limits::LimitsPolicy {
        *self
            .limits_policy
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Sets the limits policy for creates from now on (stored sandboxes keep theirs).
    pub fn set_limits_policy(&self, policy: crate::limits::LimitsPolicy) {
        *self
            .limits_policy
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = policy;
    }

    /// How many standby sandboxes this control plane keeps ready.
    pub fn standby_target(&self) -> usize {
        self.standby_target
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Sets how many standby sandboxes to keep ready (0: none; existing ones stay
    /// until claimed).
    pub fn set_standby_target(&self, n: usize) {
        self.standby_target
            .store(n, std::sync::atomic::Ordering::Relaxed);
    }

    /// One step of the standby keeper: when no create ran for [`STANDBY_QUIET`] and
    /// fewer than the target are ready or starting, starts one (through the normal
    /// create path: placement, warm jail, acknowledged install). Returns whether it
    /// started one.
    pub async fn keep_standby(&self) -> Result<bool, ControlError> {
        let target = self.standby_target();
        let standby = self.store.list_sandboxes(STANDBY_TENANT).await?;
        let ready = standby
            .iter()
            .filter(|s| s.state == SandboxState::Running)
            .count();
        self.metrics
            .standby_ready
            .set(i64::try_from(ready).unwrap_or(i64::MAX));
        // Starting ones count towards the target: they will be ready.
        let ready = standby
            .iter()
            .filter(|s| s.state != SandboxState::Stopped)
            .count();
        let quiet = self
            .last_create
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .is_none_or(|t| t.elapsed() >= STANDBY_QUIET);
        if ready >= target || !quiet {
            return Ok(false);
        }
        let standby = Caller {
            tenant: STANDBY_TENANT.into(),
            key_id: "standby".into(),
            admin: false,
        };
        self.create_sandbox(&standby, CreateSandbox::default())
            .await?;
        Ok(true)
    }

    fn busy(&self, sandbox: SandboxId) -> Result<Busy<'_>, ControlError> {
        let mut b = self
            .busy
            .lock()
            .map_err(|_| ControlError::Internal("lock poisoned".into()))?;
        if !b.insert(sandbox) {
            return Err(ControlError::Conflict(
                "another lifecycle operation on this sandbox is under way".into(),
            ));
        }
        Ok(Busy(self, sandbox, None))
    }

    /// Like [`Self::busy`], for a transition (start, snapshot, migration): while it
    /// lasts, its lease in the store is renewed every third of the reconciler's grace
    /// period (first after one third, so quick ones write nothing), so a slow
    /// transition on this replica is never taken over by another's reconciler.
    fn transition(&self, sandbox: SandboxId) -> Result<Busy<'_>, ControlError> {
        let mut busy = self.busy(sandbox)?;
        let store = self.store.clone();
        let period =
            std::time::Duration::from_millis((self.reconcile_after_secs.max(1) as u64) * 1000 / 3);
        let renew = tokio::spawn(async move {
            loop {
                tokio::time::sleep(period).await;
                let now = now_secs().to_string();
                if let Err(e) = store.kv_set(&lease_key(&sandbox), &now).await {
                    tracing::warn!(%sandbox, error = %e, "could not renew a transition lease");
                }
            }
        });
        busy.2 = Some(renew.abort_handle());
        Ok(busy)
    }

    // ---- capabilities --------------------------------------------------------------

    // ---- workers -------------------------------------------------------------------
}

impl ControlPlane {}

/// Largest archive of a writable layer taken or sent (the workers' limit).
const MAX_ARCHIVE: u64 = 1 << 30;

/// The kv key recording a stored snapshot: "generation digest size".
fn lease_key(sandbox: &SandboxId) -> String {
    format!("lease:{sandbox}")
}

fn step_key(sandbox: &SandboxId) -> String {
    format!("step:{sandbox}")
}

/// The kv key that marks a sandbox to be paused, not stopped, at its TTL.
fn ttl_pause_key(sandbox: &SandboxId) -> String {
    format!("ttl_pause:{sandbox}")
}

/// What a worker must run for execution `exe` of sandbox `s`.
fn install_of(s: &SandboxRecord, exe: &ExecutionRecord) -> InstallExecution {
    InstallExecution {
        sandbox: s.id,
        generation: exe.generation,
        execution_id: exe.execution_id,
        substrate: exe.substrate,
        activation: exe.activation,
        template: s.template.clone(),
        env: s.env.clone(),
        limits: crate::limits::of_store(s.limits.as_ref()),
    }
}

fn validate_env(env: &BTreeMap<String, String>) -> Result<(), ControlError> {
    if env.len() > 256 {
        return Err(ControlError::BadRequest(
            "at most 256 environment variables".into(),
        ));
    }
    for (k, v) in env {
        let ok_name = !k.is_empty()
            && k.len() <= 256
            && !k.starts_with(|c: char| c.is_ascii_digit())
            && k.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_');
        if !ok_name {
            return Err(ControlError::BadRequest(format!(
                "invalid environment variable name {k:?}"
            )));
        }
        if v.len() > 32 * 1024 || v.contains('\0') {
            return Err(ControlError::BadRequest(format!("invalid value for {k}")));
        }
    }
    Ok(())
}

/// Maps the store's state to the API's.
pub fn api_state(s: SandboxState) -> api::SandboxState {
    match s {
        SandboxState::Starting => api::SandboxState::Starting,
        SandboxState::Running => api::SandboxState::Running,
        SandboxState::Paused => api::SandboxState::Paused,
        SandboxState::Migrating => api::SandboxState::Migrating,
        SandboxState::Stopped => api::SandboxState::Stopped,
    }
}
