//! The control plane's operations, independent of HTTP: tenants and keys, sandboxes and
//! their executions, placement, capability issuance, key rotation, and the signed
//! identity updates it pushes to workers.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use axum::http::StatusCode;
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
use crate::error::ApiError;
use crate::http::HttpClient;
use crate::keyring::{self, Keyring};
use crate::metrics::Metrics;
use crate::placement::{self, Candidate};
use crate::{now_secs, random_bytes};

/// How long issued capabilities live (the verifier caps it at 120 s).
pub const CAPABILITY_LIFETIME_SECS: u64 = 60;
/// Longest TTL a sandbox may ask for.
pub const MAX_TTL_SECS: u64 = 30 * 86_400;

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
}

/// One create counted against its tenant's quota until its sandbox's row exists (or
/// the create failed): dropped then.
struct QuotaHold {
    pending: Arc<std::sync::Mutex<BTreeMap<String, u64>>>,
    tenant: String,
}

impl QuotaHold {
    /// Counts a create of `tenant`; returns the hold and how many others were pending.
    fn take(pending: &Arc<std::sync::Mutex<BTreeMap<String, u64>>>, tenant: &str) -> (Self, u64) {
        let mut map = pending
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let n = map.entry(tenant.to_owned()).or_insert(0);
        let others = *n;
        *n += 1;
        let hold = Self {
            pending: Arc::clone(pending),
            tenant: tenant.to_owned(),
        };
        (hold, others)
    }
}

impl Drop for QuotaHold {
    fn drop(&mut self) {
        let mut map = self
            .pending
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(n) = map.get_mut(&self.tenant) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                map.remove(&self.tenant);
            }
        }
    }
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

/// Sandboxes per worker for placement: the store's count, re-read at most every
/// [`LOAD_TTL`] (counting is a scan of every sandbox), plus the creates this process
/// has placed and not finished — so a burst of creates spreads over the workers
/// instead of reading the same stale count. (A create is counted twice between its
/// allocation and its end: placement errs on the side of the busier worker.) Worker
/// states are always read fresh: placement never picks a draining or dead worker.
///
/// It also estimates each worker's ready warm jails: the count its last install
/// acknowledgement reported, less the creates placed there since; an estimate older
/// than [`WARM_ESTIMATE_TTL`] is unknown (the pool refills between bursts).
#[derive(Debug, Default)]
struct LoadView {
    read_at: Option<std::time::Instant>,
    counted: BTreeMap<WorkerId, u64>,
    in_flight: BTreeMap<WorkerId, u64>,
    warm: BTreeMap<WorkerId, (std::time::Instant, u32)>,
}

/// How long a worker's reported count of warm jails guides placement.
const WARM_ESTIMATE_TTL: Duration = Duration::from_secs(2);

impl LoadView {
    fn is_stale(&self) -> bool {
        self.read_at.is_none_or(|t| t.elapsed() >= LOAD_TTL)
    }

    fn refresh(&mut self, counted: BTreeMap<WorkerId, u64>) {
        self.counted = counted;
        self.read_at = Some(std::time::Instant::now());
    }

    fn load(&self, w: &WorkerId) -> u64 {
        self.counted.get(w).copied().unwrap_or(0) + self.in_flight.get(w).copied().unwrap_or(0)
    }

    /// Whether `w` may have a warm jail for one more create (unknown counts as yes).
    fn may_be_warm(&self, w: &WorkerId) -> bool {
        match self.warm.get(w) {
            Some((at, n)) if at.elapsed() < WARM_ESTIMATE_TTL => *n > 0,
            _ => true,
        }
    }

    fn placed_on(&mut self, w: &WorkerId) {
        *self.in_flight.entry(w.clone()).or_default() += 1;
        if let Some((_, n)) = self.warm.get_mut(w) {
            *n = n.saturating_sub(1);
        }
    }

    /// `ready` as reported by an install's acknowledgement, while that create is still
    /// in flight: the other creates in flight there take from it too.
    fn reported_warm(&mut self, w: &WorkerId, ready: u32) {
        let others = self
            .in_flight
            .get(w)
            .copied()
            .unwrap_or(1)
            .saturating_sub(1);
        let left = u64::from(ready).saturating_sub(others);
        self.warm.insert(
            w.clone(),
            (std::time::Instant::now(), u32::try_from(left).unwrap_or(0)),
        );
    }
}

/// A create placed on `worker` and not finished: counted by placement until dropped.
struct Placed<'a> {
    cp: &'a ControlPlane,
    worker: WorkerRecord,
}

impl Drop for Placed<'_> {
    fn drop(&mut self) {
        let mut view = self
            .cp
            .load
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(n) = view.in_flight.get_mut(&self.worker.id) {
            *n = n.saturating_sub(1);
        }
    }
}

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
    ) -> Result<Arc<Self>, ApiError> {
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
        }))
    }

    /// The current keys.
    pub async fn keys(&self) -> Arc<Keyring> {
        Arc::clone(&*self.keys.read().await)
    }

    /// Re-reads keys from the store (other replicas may have rotated).
    pub async fn reload_keys(&self) -> Result<(), ApiError> {
        let fresh = self.keys().await.reload(&self.store).await?;
        *self.keys.write().await = Arc::new(fresh);
        Ok(())
    }

    // ---- callers -------------------------------------------------------------------

    /// Resolves an `Authorization: Bearer` API key to its caller.
    pub async fn authenticate(&self, bearer: &str) -> Result<Caller, ApiError> {
        let (id, hash) = auth::parse_key(bearer).ok_or_else(ApiError::unauthorized)?;
        if let Some(c) = self.key_cache.get(id, &hash) {
            return Ok(c);
        }
        let record = self
            .store
            .find_api_key(id)
            .await?
            .filter(|k| k.revoked_at.is_none() && auth::hashes_equal(&k.hash, &hash))
            .ok_or_else(ApiError::unauthorized)?;
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
    ) -> Result<(Tenant, IssuedKey), ApiError> {
        if name.is_empty() || name.len() > 64 {
            return Err(ApiError::bad_request(
                "tenant name must be 1 to 64 characters",
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
    pub async fn create_key(&self, tenant: &str, admin: bool) -> Result<IssuedKey, ApiError> {
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
    pub async fn revoke_key(&self, caller: &Caller, id: &str) -> Result<(), ApiError> {
        let key = self
            .store
            .find_api_key(id)
            .await?
            .filter(|k| caller.admin || k.tenant == caller.tenant)
            .ok_or_else(|| ApiError::not_found("api key"))?;
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
    ) -> Result<SandboxRecord, ApiError> {
        match self.store.get_sandbox(id).await {
            Ok(s) if s.tenant == caller.tenant || caller.admin => Ok(s),
            Ok(_) | Err(space_store::StoreError::NotFound(_)) => {
                Err(ApiError::not_found("sandbox"))
            }
            Err(e) => Err(e.into()),
        }
    }

    /// The user-facing view of a sandbox.
    pub async fn view(&self, s: &SandboxRecord) -> Result<api::Sandbox, ApiError> {
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
    async fn running_execution(&self, sandbox: &SandboxId) -> Result<ExecutionRecord, ApiError> {
        self.store
            .current_execution(sandbox)
            .await?
            .filter(|e| e.state == ExecutionState::Running)
            .ok_or_else(|| {
                ApiError::new(
                    StatusCode::CONFLICT,
                    "not_running",
                    "the sandbox has no running execution",
                )
            })
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
    ) -> Result<api::Sandbox, ApiError> {
        let template = req.template.unwrap_or_else(|| "default".into());
        if template != "default" {
            return Err(ApiError::bad_request(format!(
                "unknown template {template:?}"
            )));
        }
        if let Some(ttl) = req.ttl_secs {
            if ttl == 0 || ttl > MAX_TTL_SECS {
                return Err(ApiError::bad_request(format!(
                    "ttl_secs must be 1 to {MAX_TTL_SECS}"
                )));
            }
        }
        let pause_at_ttl = match req.ttl_action.as_deref() {
            None | Some("stop") => false,
            Some("pause") if req.ttl_secs.is_some() => true,
            Some("pause") => return Err(ApiError::bad_request("ttl_action needs ttl_secs")),
            Some(other) => {
                return Err(ApiError::bad_request(format!(
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
            return Err(ApiError::bad_request("metadata is over 16 KiB"));
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
    pub async fn keep_standby(&self) -> Result<bool, ApiError> {
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

    /// Chooses a worker for a new sandbox, counted as in flight there until the
    /// returned guard is dropped.
    async fn place_create(&self, requested: Option<&WorkerId>) -> Result<Placed<'_>, ApiError> {
        let worker = self.choose_worker(requested, None, true).await?;
        Ok(Placed { cp: self, worker })
    }

    /// Chooses a worker.
    pub async fn place(
        &self,
        requested: Option<&WorkerId>,
        exclude: Option<&WorkerId>,
    ) -> Result<WorkerRecord, ApiError> {
        self.choose_worker(requested, exclude, false).await
    }

    /// Chooses a worker; with `in_flight`, counts one more create on it in the same
    /// step, so that concurrent choices see each other.
    async fn choose_worker(
        &self,
        requested: Option<&WorkerId>,
        exclude: Option<&WorkerId>,
        in_flight: bool,
    ) -> Result<WorkerRecord, ApiError> {
        let workers = self.store.list_workers().await?;
        let stale = self
            .load
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .is_stale();
        let counted = match stale {
            true => Some(self.store.count_active_by_worker().await?),
            false => None,
        };
        let mut view = self
            .load
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(counted) = counted {
            view.refresh(counted);
        }
        let candidates: Vec<Candidate> = workers
            .iter()
            .map(|w| Candidate {
                id: w.id.clone(),
                active: w.state == WorkerState::Active,
                capacity: w.capacity,
                load: u32::try_from(view.load(&w.id)).unwrap_or(u32::MAX),
                warm: view.may_be_warm(&w.id),
            })
            .collect();
        let chosen = placement::choose(&candidates, requested, exclude).map_err(|e| match e {
            placement::PlacementError::UnknownWorker(_) => ApiError::bad_request(e.to_string()),
            _ => ApiError::unavailable(e.to_string()),
        })?;
        if in_flight {
            view.placed_on(&chosen);
        }
        drop(view);
        workers
            .into_iter()
            .find(|w| w.id == chosen)
            .ok_or_else(|| ApiError::unavailable(format!("worker {chosen} is gone")))
    }

    /// Allocates the next generation on `worker`, installs it there and waits for the
    /// worker to acknowledge it running. A failed start consumes its generation.
    pub async fn start_execution(
        &self,
        s: &SandboxRecord,
        w: &WorkerRecord,
    ) -> Result<ExecutionRecord, ApiError> {
        let worker = &w.id;
        let now = now_secs() as i64;
        let exe = self
            .store
            .allocate_execution(
                &s.id,
                ExecutionId::from_bytes(random_bytes()),
                worker,
                w.substrate,
                now,
            )
            .await?;
        let outcome = self.deliver(w, Update::Install(install_of(s, &exe))).await;
        if let Some(ready) = outcome.as_ref().ok().and_then(|a| a.warm_ready) {
            self.load
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .reported_warm(worker, ready);
        }
        match outcome {
            Ok(ack) if ack.state == "running" => {
                let now = now_secs() as i64;
                self.store
                    .set_execution_state(
                        &s.id,
                        exe.generation,
                        ExecutionState::Running,
                        Some(ExecutionState::Pending),
                        now,
                    )
                    .await?;
                // What the conditional update wrote: nothing else changes a pending
                // execution.
                Ok(ExecutionRecord {
                    state: ExecutionState::Running,
                    updated_at: now,
                    ..exe
                })
            }
            other => {
                let _ = self
                    .store
                    .set_execution_state(
                        &s.id,
                        exe.generation,
                        ExecutionState::Failed,
                        None,
                        now_secs() as i64,
                    )
                    .await;
                let why = match other {
                    Ok(ack) => ack.message.unwrap_or(ack.state),
                    Err(e) => e.message,
                };
                tracing::warn!(sandbox = %s.id, generation = exe.generation, worker = %worker, reason = %why, "execution failed to start");
                Err(ApiError::bad_gateway(format!(
                    "worker {worker} could not start the sandbox: {why}"
                )))
            }
        }
    }

    /// Stops a sandbox: its execution is retired on its worker (which keeps a
    /// tombstone), and it is never served again.
    pub async fn delete_sandbox(&self, s: &SandboxRecord) -> Result<(), ApiError> {
        self.store
            .set_sandbox_state(&s.id, SandboxState::Stopped, None)
            .await?;
        if let Some(exe) = self.store.current_execution(&s.id).await? {
            self.retire(&exe).await?;
        }
        Ok(())
    }

    /// Pauses a running sandbox in place (freezer): the same execution, so
    /// capabilities and routes stay valid; requests wait or get a clear `paused`.
    pub async fn pause(&self, s: &SandboxRecord) -> Result<(), ApiError> {
        self.freeze(s, true).await
    }

    /// Resumes a paused sandbox in place.
    pub async fn resume(&self, s: &SandboxRecord) -> Result<(), ApiError> {
        self.freeze(s, false).await
    }

    async fn freeze(&self, s: &SandboxRecord, pause: bool) -> Result<(), ApiError> {
        let (from, to) = if pause {
            (SandboxState::Running, SandboxState::Paused)
        } else {
            (SandboxState::Paused, SandboxState::Running)
        };
        if s.state == to {
            return Ok(());
        }
        if s.state != from {
            return Err(ApiError::conflict(format!(
                "the sandbox is {}",
                s.state.as_str()
            )));
        }
        let exe = self.running_execution(&s.id).await?;
        let w = self.store.get_worker(&exe.worker).await?;
        let (sandbox, generation, execution_id) = (s.id, exe.generation, exe.execution_id);
        let update = if pause {
            Update::Pause {
                sandbox,
                generation,
                execution_id,
            }
        } else {
            Update::Resume {
                sandbox,
                generation,
                execution_id,
            }
        };
        let ack = self.deliver(&w, update).await?;
        let expected = if pause { "paused" } else { "running" };
        if ack.state != expected {
            return Err(ApiError::bad_gateway(format!(
                "worker answered {}",
                ack.state
            )));
        }
        self.store.set_sandbox_state(&s.id, to, Some(from)).await?;
        Ok(())
    }

    /// Moves a sandbox to `target` as a new execution (next generation, new execution
    /// ID, fresh activation secret): the source is frozen and its writable layer
    /// archived; the archive's digest is signed and the layer handed to the target,
    /// which checks it before unpacking; the new execution is installed and
    /// acknowledged running before any capability names it; only then is the source
    /// retired (it keeps a tombstone). On failure the source is thawed and stays.
    pub async fn migrate(&self, s: &SandboxRecord, target: &WorkerId) -> Result<(), ApiError> {
        let before = s.state;
        if !matches!(before, SandboxState::Running | SandboxState::Paused) {
            return Err(ApiError::conflict(format!(
                "the sandbox is {}",
                before.as_str()
            )));
        }
        let src = self.running_execution(&s.id).await?;
        if src.worker == *target {
            return Err(ApiError::conflict(format!(
                "the sandbox already runs on {target}"
            )));
        }
        self.place(Some(target), None).await?;
        let _busy = self.transition(s.id)?;
        self.store
            .set_sandbox_state(&s.id, SandboxState::Migrating, Some(before))
            .await?;
        match self.move_execution(s, &src, target).await {
            Ok(()) => {
                self.store
                    .set_sandbox_state(&s.id, SandboxState::Running, Some(SandboxState::Migrating))
                    .await?;
                Ok(())
            }
            Err(e) => {
                self.abandon(s, &src, before).await;
                Err(e)
            }
        }
    }

    /// After a failed snapshot or migration: the source was frozen for the snapshot
    /// and carries on as it was (`before`). If it cannot be thawed now (its worker is
    /// down), the sandbox stays `migrating` and the reconciler finishes the job later.
    async fn abandon(&self, s: &SandboxRecord, src: &ExecutionRecord, before: SandboxState) {
        let mut thawed = before != SandboxState::Running;
        if !thawed {
            if let Ok(w) = self.store.get_worker(&src.worker).await {
                let thaw = Update::Unfreeze {
                    sandbox: s.id,
                    generation: src.generation,
                    execution_id: src.execution_id,
                };
                thawed = self.deliver(&w, thaw).await.is_ok();
            }
        }
        if thawed {
            let _ = self
                .store
                .set_sandbox_state(&s.id, before, Some(SandboxState::Migrating))
                .await;
        }
    }

    async fn move_execution(
        &self,
        s: &SandboxRecord,
        src: &ExecutionRecord,
        target: &WorkerId,
    ) -> Result<(), ApiError> {
        let archive = self.take_snapshot(s, src, None).await?;
        self.restore(s, src, target, archive).await
    }

    /// Freezes `src` on its worker and streams its writable layer into a file in the
    /// snapshot directory (`keep_as`, or a temporary one removed when the archive is
    /// dropped), hashed as it arrives: no archive is ever held in memory.
    async fn take_snapshot(
        &self,
        s: &SandboxRecord,
        src: &ExecutionRecord,
        keep_as: Option<std::path::PathBuf>,
    ) -> Result<Archive, ApiError> {
        let sw = self.store.get_worker(&src.worker).await?;
        self.step(&s.id, format!("freezing and archiving on {}", sw.id))
            .await;
        let snapshot = self
            .sign_update(
                &sw.id,
                Update::Snapshot {
                    sandbox: s.id,
                    generation: src.generation,
                    execution_id: src.execution_id,
                },
            )
            .await?;
        let order = serde_json::to_vec(&snapshot).unwrap_or_default();
        let dir = self.snapshot_dir.clone();
        let (file, path) = tokio::task::spawn_blocking(move || Archive::create(&dir, &s_id_tmp()))
            .await
            .map_err(|e| ApiError::internal(e.to_string()))?
            .map_err(|e| ApiError::internal(format!("snapshot spool: {e}")))?;
        let mut archive = Archive {
            file: file
                .try_clone()
                .map_err(|e| ApiError::internal(e.to_string()))?,
            path: Some(path),
            size: 0,
            digest: String::new(),
        };
        let sink = space_http::HashingFile::new(file);
        let (answer, spooled) = self
            .http
            .call_to_sink(
                axum::http::Method::POST,
                &format!("{}/internal/v1/snapshot", sw.url),
                &[("content-type", "application/json")],
                bytes::Bytes::from(order),
                MAX_ARCHIVE,
                sink,
            )
            .await
            .map_err(|e| ApiError::bad_gateway(format!("snapshot on {}: {e}", sw.id)))?;
        let Some((sink, size)) = spooled else {
            let message = format!(
                "snapshot on {}: {} {}",
                sw.id,
                answer.status,
                String::from_utf8_lossy(&answer.body)
            );
            // A layer over the limit is the sandbox's doing, not a failure of the platform.
            if answer.status == StatusCode::PAYLOAD_TOO_LARGE {
                return Err(ApiError::new(
                    StatusCode::PAYLOAD_TOO_LARGE,
                    "too_large",
                    message,
                ));
            }
            return Err(ApiError::bad_gateway(message));
        };
        let file = sink
            .out
            .into_inner()
            .map_err(|e| ApiError::internal(format!("snapshot spool: {}", e.error())))?;
        archive.size = size;
        archive.digest = sink.hash.finalize().to_hex().to_string();
        let synced = tokio::task::spawn_blocking(move || file.sync_all()).await;
        if !matches!(synced, Ok(Ok(()))) {
            return Err(ApiError::internal("snapshot spool: fsync failed"));
        }
        if let Some(keep) = keep_as {
            archive.keep_as(keep)?;
        }
        Ok(archive)
    }

    /// Hands `archive` to `target` under a signed digest, starts the next execution
    /// there, and retires `src` once that one runs.
    async fn restore(
        &self,
        s: &SandboxRecord,
        src: &ExecutionRecord,
        target: &WorkerId,
        archive: Archive,
    ) -> Result<(), ApiError> {
        let tw = self.store.get_worker(target).await?;
        // The digest signed for the target is the one of the bytes on disk here.
        let layer = self
            .sign_update(
                &tw.id,
                Update::Layer {
                    sandbox: s.id,
                    digest: archive.digest.clone(),
                    size: archive.size,
                },
            )
            .await?;
        self.step(
            &s.id,
            format!("transferring {} to {}", mib(archive.size as usize), tw.id),
        )
        .await;
        let header = b64(&serde_json::to_vec(&layer).unwrap_or_default());
        let body = archive
            .file
            .try_clone()
            .map_err(|e| ApiError::internal(e.to_string()))?;
        let placed = self
            .http
            .call_with_file(
                axum::http::Method::POST,
                &format!("{}/internal/v1/layers", tw.url),
                &[
                    ("space-update", header.as_str()),
                    ("content-type", "application/x-tar"),
                ],
                body,
                archive.size,
            )
            .await
            .map_err(|e| ApiError::bad_gateway(format!("layer to {}: {e}", tw.id)))?;
        if !placed.status.is_success() {
            return Err(ApiError::bad_gateway(format!(
                "layer to {}: {} {}",
                tw.id,
                placed.status,
                String::from_utf8_lossy(&placed.body)
            )));
        }
        self.step(&s.id, format!("starting the new execution on {}", tw.id))
            .await;
        self.start_execution(s, &tw).await?;
        self.step(
            &s.id,
            format!("retiring the old execution on {}", src.worker),
        )
        .await;
        let src = self.store.get_execution(&s.id, src.generation).await?;
        self.retire(&src).await
    }

    /// Takes a snapshot: the execution is frozen, its writable layer archived and kept
    /// by the control plane with its digest; the sandbox is `paused`. A later
    /// `resume` on a worker restores it there as a new execution (after checking the
    /// digest); `resume` in place thaws the same execution and drops the snapshot.
    pub async fn snapshot(&self, s: &SandboxRecord) -> Result<serde_json::Value, ApiError> {
        if !matches!(s.state, SandboxState::Running | SandboxState::Paused) {
            return Err(ApiError::conflict(format!(
                "the sandbox is {}",
                s.state.as_str()
            )));
        }
        let _busy = self.transition(s.id)?;
        let src = self.running_execution(&s.id).await?;
        // `migrating` while the snapshot is taken: a crash before it is stored leaves
        // a state the reconciler finishes (thawed and running again).
        self.store
            .set_sandbox_state(&s.id, SandboxState::Migrating, Some(s.state))
            .await?;
        match self.store_snapshot(s, &src).await {
            Ok(taken) => {
                self.store
                    .set_sandbox_state(&s.id, SandboxState::Paused, Some(SandboxState::Migrating))
                    .await?;
                Ok(taken)
            }
            Err(e) => {
                self.abandon(s, &src, s.state).await;
                Err(e)
            }
        }
    }

    /// Takes the snapshot of `src` and keeps it (file fsynced, then its generation,
    /// digest and size recorded).
    async fn store_snapshot(
        &self,
        s: &SandboxRecord,
        src: &ExecutionRecord,
    ) -> Result<serde_json::Value, ApiError> {
        self.step(&s.id, "receiving and storing the archive".to_owned())
            .await;
        // Streamed to disk, fsynced, then renamed to its place.
        let archive = self
            .take_snapshot(s, src, Some(self.snapshot_path(&s.id)))
            .await?;
        let (digest, size) = (archive.digest.clone(), archive.size);
        self.store
            .kv_set(
                &snapshot_key(&s.id),
                &format!("{} {digest} {size}", src.generation),
            )
            .await?;
        Ok(serde_json::json!({"generation": src.generation, "digest": digest, "size": size}))
    }

    fn snapshot_path(&self, sandbox: &SandboxId) -> std::path::PathBuf {
        self.snapshot_dir.join(format!("{sandbox}.tar"))
    }

    /// Restores the stored snapshot of a paused sandbox on `target` as a new
    /// execution. The archive must still have the digest recorded when it was taken:
    /// a tampered or truncated snapshot is refused and nothing changes.
    pub async fn resume_from_snapshot(
        &self,
        s: &SandboxRecord,
        target: &WorkerId,
    ) -> Result<(), ApiError> {
        if s.state != SandboxState::Paused {
            return Err(ApiError::conflict(format!(
                "the sandbox is {}",
                s.state.as_str()
            )));
        }
        let src = self.running_execution(&s.id).await?;
        let recorded = self.store.kv_get(&snapshot_key(&s.id)).await?;
        let Some((generation, digest)) = recorded.as_deref().and_then(|v| {
            let mut f = v.split(' ');
            Some((f.next()?.parse::<u64>().ok()?, f.next()?.to_owned()))
        }) else {
            // No snapshot was taken: on its own worker the paused execution simply
            // thaws; elsewhere a snapshot is taken now and moved.
            if src.worker == *target {
                return self.resume(s).await;
            }
            return self.migrate(s, target).await;
        };
        if generation != src.generation {
            return Err(ApiError::conflict(
                "the stored snapshot is of an older execution",
            ));
        }
        let archive = Archive::open_kept(self.snapshot_path(&s.id))
            .await
            .map_err(|e| ApiError::internal(format!("reading the snapshot: {e}")))?;
        if archive.digest != digest {
            return Err(ApiError::new(
                StatusCode::CONFLICT,
                "snapshot_corrupt",
                "the stored snapshot does not match its digest (tampered or truncated); nothing was changed",
            ));
        }
        let _busy = self.transition(s.id)?;
        self.store
            .set_sandbox_state(&s.id, SandboxState::Migrating, Some(SandboxState::Paused))
            .await?;
        match self.restore(s, &src, target, archive).await {
            Ok(()) => {
                self.forget_snapshot(&s.id).await;
                self.store
                    .set_sandbox_state(&s.id, SandboxState::Running, Some(SandboxState::Migrating))
                    .await?;
                Ok(())
            }
            Err(e) => {
                let _ = self
                    .store
                    .set_sandbox_state(&s.id, SandboxState::Paused, Some(SandboxState::Migrating))
                    .await;
                Err(e)
            }
        }
    }

    /// Drops a stored snapshot (it no longer matches a running sandbox).
    pub async fn forget_snapshot(&self, sandbox: &SandboxId) {
        let _ = tokio::fs::remove_file(self.snapshot_path(sandbox)).await;
        let _ = self.store.kv_set(&snapshot_key(sandbox), "").await;
    }

    fn busy(&self, sandbox: SandboxId) -> Result<Busy<'_>, ApiError> {
        let mut b = self
            .busy
            .lock()
            .map_err(|_| ApiError::internal("lock poisoned"))?;
        if !b.insert(sandbox) {
            return Err(ApiError::conflict(
                "another lifecycle operation on this sandbox is under way",
            ));
        }
        Ok(Busy(self, sandbox, None))
    }

    /// Like [`Self::busy`], for a transition (start, snapshot, migration): while it
    /// lasts, its lease in the store is renewed every third of the reconciler's grace
    /// period (first after one third, so quick ones write nothing), so a slow
    /// transition on this replica is never taken over by another's reconciler.
    fn transition(&self, sandbox: SandboxId) -> Result<Busy<'_>, ApiError> {
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

    /// Finishes transitions that a crash interrupted (a control plane killed during a
    /// migration or a start): every execution still pending is failed (its worker,
    /// not seeing it listed any more, retires it at its next sync), every running
    /// execution but the newest is retired, the newest is thawed in case a snapshot
    /// froze it, and the sandbox is running again — or stopped when nothing runs. A
    /// transition is taken over only when neither its newest execution nor its lease
    /// (renewed by the replica running it) has changed for the grace period, so one
    /// still under way elsewhere, however slow, is left alone.
    pub async fn reconcile_transitions(&self) -> Result<(), ApiError> {
        let now = now_secs() as i64;
        for t in self.store.list_tenants().await? {
            for s in self.store.list_sandboxes(&t.id).await? {
                if !matches!(s.state, SandboxState::Migrating | SandboxState::Starting) {
                    continue;
                }
                let Ok(_busy) = self.busy(s.id) else {
                    continue;
                };
                let execs = self.store.list_executions(&s.id).await?;
                let newest = execs
                    .iter()
                    .map(|e| e.updated_at)
                    .max()
                    .unwrap_or(s.created_at);
                let leased = self
                    .store
                    .kv_get(&lease_key(&s.id))
                    .await?
                    .and_then(|v| v.parse::<i64>().ok())
                    .unwrap_or(0);
                // Whole seconds on both sides: a lease renewed a moment ago can read
                // as a full second old, hence `<=`.
                if now - newest.max(leased) <= self.reconcile_after_secs {
                    continue;
                }
                tracing::warn!(sandbox = %s.id, state = s.state.as_str(), "finishing an interrupted transition");
                for e in execs.iter().filter(|e| e.state == ExecutionState::Pending) {
                    self.store
                        .set_execution_state(&s.id, e.generation, ExecutionState::Failed, None, now)
                        .await?;
                }
                let mut running: Vec<&ExecutionRecord> = execs
                    .iter()
                    .filter(|e| e.state == ExecutionState::Running)
                    .collect();
                running.sort_by_key(|e| e.generation);
                let Some(current) = running.pop() else {
                    self.store
                        .set_sandbox_state(&s.id, SandboxState::Stopped, Some(s.state))
                        .await?;
                    continue;
                };
                for old in running {
                    self.retire(old).await?;
                }
                let thaw = Update::Unfreeze {
                    sandbox: s.id,
                    generation: current.generation,
                    execution_id: current.execution_id,
                };
                let thawed = match self.store.get_worker(&current.worker).await {
                    Ok(w) => self.deliver(&w, thaw).await,
                    Err(e) => Err(e.into()),
                };
                if let Err(e) = thawed {
                    // Its worker is not back yet: try again at the next round.
                    tracing::warn!(sandbox = %s.id, error = %e.message, "could not thaw after an interrupted transition");
                    continue;
                }
                // Running again: a snapshot stored before the crash is stale.
                self.forget_snapshot(&s.id).await;
                self.store
                    .set_sandbox_state(&s.id, SandboxState::Running, Some(s.state))
                    .await?;
            }
        }
        Ok(())
    }

    /// Retires one execution on its worker and records it.
    pub async fn retire(&self, exe: &ExecutionRecord) -> Result<(), ApiError> {
        let w = self.store.get_worker(&exe.worker).await?;
        let update = Update::Retire {
            sandbox: exe.sandbox,
            generation: exe.generation,
            execution_id: exe.execution_id,
        };
        match self.deliver(&w, update).await {
            Ok(_) => {}
            // A worker that is down learns of the retirement at its next sync, and the
            // capabilities for the execution expire; the record is retired either way.
            Err(e) => {
                tracing::warn!(sandbox = %exe.sandbox, worker = %exe.worker, error = %e.message, "retirement not delivered")
            }
        }
        self.store
            .set_execution_state(
                &exe.sandbox,
                exe.generation,
                ExecutionState::Retired,
                None,
                now_secs() as i64,
            )
            .await?;
        Ok(())
    }

    // ---- capabilities --------------------------------------------------------------

    /// Issues a capability for the running execution of `s`.
    pub async fn issue_capability(
        &self,
        s: &SandboxRecord,
        access: AccessSet,
        purpose: Purpose,
        port: Option<(u16, Protocol)>,
    ) -> Result<CapabilityResponse, ApiError> {
        if access.is_empty() {
            return Err(ApiError::bad_request("access must not be empty"));
        }
        let service_port = match (purpose, port) {
            (Purpose::ServicePort, Some((port, protocol))) if port != 0 => {
                Some(ServicePort { port, protocol })
            }
            (Purpose::ServicePort, _) => {
                return Err(ApiError::bad_request(
                    "service_port capabilities need a port and a protocol",
                ));
            }
            (Purpose::Control, None) => None,
            (Purpose::Control, Some(_)) => {
                return Err(ApiError::bad_request(
                    "port and protocol are only for service_port",
                ));
            }
        };
        if purpose == Purpose::ServicePort && access != AccessSet::of(&[Access::ServicePort]) {
            return Err(ApiError::bad_request(
                "a service_port capability grants service_port only",
            ));
        }
        if purpose == Purpose::Control && access.contains(Access::ServicePort) {
            return Err(ApiError::bad_request(
                "service_port access needs purpose service_port",
            ));
        }
        if matches!(s.state, SandboxState::Stopped) {
            return Err(ApiError::conflict("the sandbox is stopped"));
        }
        // Only an execution its worker acknowledged as running gets capabilities.
        let exe = self.running_execution(&s.id).await?;
        let worker = self.store.get_worker(&exe.worker).await?;
        let keys = self.keys().await;
        let now = now_secs();
        let route = Route {
            sandbox: s.id,
            execution: Execution {
                generation: Generation(exe.generation),
                id: exe.execution_id,
            },
            placement: Placement {
                worker: exe.worker.clone(),
                substrate: exe.substrate,
                activation: exe.activation,
                pod_uid: exe.pod_uid,
            },
        };
        let claims = Claims {
            key_id: keys.signer.key_id(),
            route,
            access,
            purpose,
            service_port,
            issued_at: Timestamp::from_unix_secs(now),
            expires_at: Timestamp::from_unix_secs(now + CAPABILITY_LIFETIME_SECS),
            token_id: TokenId::from_bytes(random_bytes()),
        };
        let token = keys
            .signer
            .sign(&claims)
            .map_err(|e| ApiError::internal(format!("cannot sign capability: {e}")))?;
        self.metrics.capabilities_issued.inc();
        Ok(CapabilityResponse {
            token: token.to_text(),
            route: RouteView {
                sandbox: s.id,
                generation: exe.generation,
                execution_id: exe.execution_id,
                worker: exe.worker,
                substrate: exe.substrate,
                activation: exe.activation,
                pod_uid: exe.pod_uid,
                worker_url: worker.url,
            },
            expires_at: now + CAPABILITY_LIFETIME_SECS,
        })
    }

    // ---- workers -------------------------------------------------------------------

    /// Registers a worker presenting the enrollment secret. A worker ID that is
    /// enrolled already is re-enrolled only by the worker holding its credential (a
    /// restart): the enrollment secret alone enrolls new IDs only, so it cannot take
    /// over a worker and the sandboxes (and environments) placed on it. A re-enrolled
    /// worker keeps its credential, so an answer lost on the way cannot lock it out.
    pub async fn enroll(&self, req: &api::EnrollRequest) -> Result<api::EnrollResponse, ApiError> {
        let expected = blake3::hash(self.enroll_secret.as_bytes());
        if blake3::hash(req.enroll_secret.as_bytes()) != expected {
            return Err(ApiError::forbidden("wrong enrollment secret"));
        }
        if !(req.url.starts_with("http://") || req.url.starts_with("https://"))
            || req.url.len() > 512
        {
            return Err(ApiError::bad_request("url must be an http(s) URL"));
        }
        let existing = match self.store.get_worker(&req.worker).await {
            Ok(w) => Some(w),
            Err(space_store::StoreError::NotFound(_)) => None,
            Err(e) => return Err(e.into()),
        };
        let taken = || {
            ApiError::forbidden(format!(
                "worker {} is enrolled already: re-enrolling it needs its own credential \
                 (kept in its records); the enrollment secret alone only enrolls a new worker ID",
                req.worker
            ))
        };
        let (credential, proven) = match (&existing, &req.credential) {
            (None, _) => (b64(&random_bytes::<32>()), None),
            (Some(w), Some(presented))
                if presented.len() <= 128
                    && auth::hashes_equal(
                        &w.credential_hash,
                        blake3::hash(presented.as_bytes()).as_bytes(),
                    ) =>
            {
                (presented.clone(), Some(w.credential_hash))
            }
            (Some(_), _) => return Err(taken()),
        };
        let now = now_secs() as i64;
        let record = WorkerRecord {
            id: req.worker.clone(),
            url: req.url.trim_end_matches('/').to_owned(),
            substrate: req.substrate,
            capacity: req.capacity.clamp(1, 100_000),
            state: WorkerState::Active,
            credential_hash: *blake3::hash(credential.as_bytes()).as_bytes(),
            registered_at: now,
            last_seen: now,
        };
        match self.store.enroll_worker(&record, proven).await {
            Ok(_) => {}
            // Another enrollment of this ID won in between.
            Err(space_store::StoreError::Conflict(_) | space_store::StoreError::NotFound(_)) => {
                return Err(taken());
            }
            Err(e) => return Err(e.into()),
        }
        let keys = self.keys().await;
        Ok(api::EnrollResponse {
            credential,
            anchor: b64(keys.anchor.anchor().as_bytes()),
        })
    }

    /// Checks a worker's credential.
    pub async fn authenticate_worker(
        &self,
        id: &WorkerId,
        credential: &str,
    ) -> Result<WorkerRecord, ApiError> {
        let w = self
            .store
            .get_worker(id)
            .await
            .map_err(|_| ApiError::unauthorized())?;
        if !auth::hashes_equal(
            &w.credential_hash,
            blake3::hash(credential.as_bytes()).as_bytes(),
        ) {
            return Err(ApiError::unauthorized());
        }
        Ok(w)
    }

    /// Signs an update for `worker` under the next number of its update sequence
    /// (reserved durably in the store first, so no number is signed twice, also by
    /// two replicas or across restarts); the worker applies each number once.
    pub async fn sign_update(
        &self,
        worker: &WorkerId,
        update: Update,
    ) -> Result<SignedUpdate, ApiError> {
        let mut signed = self.sign_updates(worker, vec![update]).await?;
        signed
            .pop()
            .ok_or_else(|| ApiError::internal("no update was signed"))
    }

    /// Signs several updates for `worker` with consecutive sequence numbers, reserved
    /// in one store write.
    pub async fn sign_updates(
        &self,
        worker: &WorkerId,
        updates: Vec<Update>,
    ) -> Result<Vec<SignedUpdate>, ApiError> {
        let n = updates.len() as u64;
        if n == 0 {
            return Ok(Vec::new());
        }
        let last = self.store.reserve_update_seqs(worker, n).await?;
        let issued_at = now_secs();
        let keys = self.keys().await;
        Ok(updates
            .into_iter()
            .zip(last + 1 - n..)
            .map(|(update, seq)| {
                let body = serde_json::to_vec(&UpdateBody {
                    worker: worker.clone(),
                    issued_at,
                    seq,
                    update,
                })
                .unwrap_or_default();
                let signature = keys.anchor.sign_update(&body);
                SignedUpdate {
                    body: b64(&body),
                    signature: b64(&signature),
                }
            })
            .collect())
    }

    /// Pushes one signed update to a worker and returns its acknowledgement, which the
    /// worker sends only after the update is durable.
    pub async fn deliver(&self, w: &WorkerRecord, update: Update) -> Result<UpdateAck, ApiError> {
        let signed = self.sign_update(&w.id, update).await?;
        let url = format!("{}/internal/v1/updates", w.url);
        let body = serde_json::to_vec(&signed)
            .map_err(|e| ApiError::internal(format!("encode update: {e}")))?;
        let delivery = self.delivery_header(&w.id, &body).await?;
        let answer = self
            .http
            .call(
                axum::http::Method::POST,
                &url,
                &[
                    ("content-type", "application/json"),
                    (space_proto::api::DELIVERY_HEADER, delivery.as_str()),
                ],
                bytes::Bytes::from(body),
            )
            .await
            .map_err(|e| ApiError::bad_gateway(format!("worker {}: {e}", w.id)))?;
        if !answer.status.is_success() {
            let text = String::from_utf8_lossy(&answer.body);
            return Err(ApiError::bad_gateway(format!(
                "worker {} answered {}: {text}",
                w.id, answer.status
            )));
        }
        serde_json::from_slice(&answer.body)
            .map_err(|e| ApiError::bad_gateway(format!("worker {}: bad ack: {e}", w.id)))
    }

    /// The signed [`space_proto::api::Delivery`] of a request body for worker `to`: it
    /// lets the worker authenticate the request before reading the body.
    pub async fn delivery_header(&self, to: &WorkerId, body: &[u8]) -> Result<String, ApiError> {
        let descriptor = serde_json::to_vec(&space_proto::api::Delivery {
            worker: to.to_string(),
            issued_at: now_secs(),
            size: body.len() as u64,
            digest: blake3::hash(body).to_hex().to_string(),
            nonce: random_bytes::<16>()
                .iter()
                .map(|b| format!("{b:02x}"))
                .collect(),
        })
        .map_err(|e| ApiError::internal(format!("encode delivery: {e}")))?;
        let keys = self.keys().await;
        let signature = keys.anchor.sign_delivery(&descriptor);
        Ok(format!("{}.{}", b64(&descriptor), b64(&signature)))
    }

    /// What a (re)starting worker must hold: the newest bundle, then an install for each
    /// execution the control plane believes runs there.
    pub async fn sync_for(&self, w: &WorkerRecord) -> Result<Vec<SignedUpdate>, ApiError> {
        self.store.touch_worker(&w.id, now_secs() as i64).await?;
        let keys = self.keys().await;
        let mut updates = vec![Update::Bundle {
            bundle: b64(keys.bundle.as_bytes()),
        }];
        for exe in self
            .store
            .executions_on_worker(&w.id, &[ExecutionState::Pending, ExecutionState::Running])
            .await?
        {
            let Ok(s) = self.store.get_sandbox(&exe.sandbox).await else {
                continue;
            };
            updates.push(Update::Install(install_of(&s, &exe)));
        }
        self.sign_updates(&w.id, updates).await
    }

    /// A worker reports that an execution it was told to run is gone (its processes did
    /// not survive a restart). The execution fails; a sandbox that should be running
    /// gets a new execution — a new generation, never the old identity.
    pub async fn execution_lost(
        &self,
        w: &WorkerRecord,
        sandbox: &SandboxId,
        generation: u64,
    ) -> Result<(), ApiError> {
        let exe = self.store.get_execution(sandbox, generation).await?;
        if exe.worker != w.id {
            return Err(ApiError::forbidden("not this worker's execution"));
        }
        self.store
            .set_execution_state(
                sandbox,
                generation,
                ExecutionState::Failed,
                None,
                now_secs() as i64,
            )
            .await?;
        let s = self.store.get_sandbox(sandbox).await?;
        let current = self.store.current_execution(sandbox).await?;
        let superseded = current.is_some_and(|c| c.generation > generation);
        if matches!(s.state, SandboxState::Running | SandboxState::Starting) && !superseded {
            let _busy = self.transition(s.id)?;
            // Starting until the replacement runs: no capability is issued meanwhile.
            self.store
                .set_sandbox_state(sandbox, SandboxState::Starting, Some(s.state))
                .await?;
            let started = self.start_execution(&s, w).await;
            let next = if started.is_ok() {
                SandboxState::Running
            } else {
                SandboxState::Stopped
            };
            self.store
                .set_sandbox_state(sandbox, next, Some(SandboxState::Starting))
                .await?;
            started?;
        }
        Ok(())
    }

    /// Lists workers with their load.
    pub async fn workers(&self) -> Result<Vec<WorkerView>, ApiError> {
        let load = self.store.count_active_by_worker().await?;
        Ok(self
            .store
            .list_workers()
            .await?
            .into_iter()
            .map(|w| WorkerView {
                sandboxes: load.get(&w.id).copied().unwrap_or(0) as u32,
                address: w.url,
                state: w.state.as_str().to_owned(),
                capacity: w.capacity,
                substrate: w.substrate,
                id: w.id,
            })
            .collect())
    }

    /// Pushes the newest bundle to every active worker; returns the workers that did
    /// not acknowledge it.
    pub async fn push_bundle(
        &self,
        bundle: &space_identity::SignedKeyBundle,
    ) -> Result<Vec<WorkerId>, ApiError> {
        let mut failed = Vec::new();
        for w in self.store.list_workers().await? {
            if w.state != WorkerState::Active {
                continue;
            }
            let update = Update::Bundle {
                bundle: b64(bundle.as_bytes()),
            };
            if let Err(e) = self.deliver(&w, update).await {
                tracing::warn!(worker = %w.id, error = %e.message, "bundle not acknowledged");
                failed.push(w.id);
            }
        }
        Ok(failed)
    }

    /// Rotates the capability signing key: publish the new key to every receiver, and
    /// only then sign with it; the old key retires after the maximum capability
    /// lifetime plus skew.
    pub async fn rotate_keys(&self) -> Result<String, ApiError> {
        let now = now_secs() as i64;
        let keys = self.keys().await;
        let (record, _, bundle) = keyring::begin_rotation(&self.store, &keys.anchor, now).await?;
        let failed = self.push_bundle(&bundle).await?;
        if !failed.is_empty() {
            let names: Vec<String> = failed.iter().map(ToString::to_string).collect();
            return Err(ApiError::unavailable(format!(
                "new key {} published but not acknowledged by {}; it is not used yet — retry when they are back or drain them",
                record.key_id,
                names.join(", ")
            )));
        }
        keyring::activate(&self.store, &record.key_id, now).await?;
        // The retiring key's shortened validity must reach verifiers too.
        let (_, bundle) = keyring::publish_bundle(&self.store, &keys.anchor, now).await?;
        self.push_bundle(&bundle).await?;
        self.reload_keys().await?;
        Ok(record.key_id)
    }

    /// Drops keys whose retirement grace has passed, and pushes the smaller bundle.
    pub async fn retire_old_keys(&self) -> Result<(), ApiError> {
        let now = now_secs() as i64;
        if keyring::retire_expired(&self.store, now).await? {
            let keys = self.keys().await;
            let (_, bundle) = keyring::publish_bundle(&self.store, &keys.anchor, now).await?;
            self.push_bundle(&bundle).await?;
            self.reload_keys().await?;
        }
        Ok(())
    }

    /// Stops sandboxes past their TTL.
    pub async fn expire_sandboxes(&self) -> Result<(), ApiError> {
        let now = now_secs() as i64;
        for t in self.store.list_tenants().await? {
            for s in self.store.list_sandboxes(&t.id).await? {
                if s.state == SandboxState::Stopped || s.expires_at.is_none_or(|e| e > now) {
                    continue;
                }
                match self.store.kv_get(&ttl_pause_key(&s.id)).await?.as_deref() {
                    // Asked to pause at the TTL, once: a later resume keeps it running.
                    Some("pause") => {
                        if s.state == SandboxState::Running {
                            tracing::info!(sandbox = %s.id, "ttl reached: pausing");
                            self.pause(&s).await?;
                            self.store.kv_set(&ttl_pause_key(&s.id), "done").await?;
                        }
                        continue;
                    }
                    Some(_) => continue,
                    None => {}
                }
                tracing::info!(sandbox = %s.id, "ttl reached: stopping");
                self.delete_sandbox(&s).await?;
            }
        }
        Ok(())
    }
}

impl ControlPlane {
    /// Refreshes the sandboxes-by-state gauges.
    pub async fn refresh_gauges(&self) {
        let mut counts: BTreeMap<&'static str, i64> = BTreeMap::new();
        for st in SandboxState::ALL {
            counts.insert(st.as_str(), 0);
        }
        let Ok(tenants) = self.store.list_tenants().await else {
            return;
        };
        for t in tenants {
            if let Ok(list) = self.store.list_sandboxes(&t.id).await {
                for s in list {
                    *counts.entry(s.state.as_str()).or_default() += 1;
                }
            }
        }
        for (state, n) in counts {
            self.metrics
                .sandboxes
                .get_or_create(&crate::metrics::StateLabels {
                    state: state.to_owned(),
                })
                .set(n);
        }
    }
}

/// Largest archive of a writable layer taken or sent (the workers' limit).
const MAX_ARCHIVE: u64 = 1 << 30;

/// A name for a snapshot file being received.
fn s_id_tmp() -> String {
    let r: [u8; 8] = crate::random_bytes();
    format!(
        ".incoming-{}",
        r.iter().map(|b| format!("{b:02x}")).collect::<String>()
    )
}

/// An archive of a writable layer on the control plane's disk.
struct Archive {
    /// Open for reading from the start.
    file: std::fs::File,
    /// Removed when dropped (a temporary file); `None` once kept.
    path: Option<std::path::PathBuf>,
    size: u64,
    /// BLAKE3 of its bytes, lowercase hex.
    digest: String,
}

impl Archive {
    /// A new file `name` in `dir` (created 0700), mode 0600.
    fn create(
        dir: &std::path::Path,
        name: &str,
    ) -> std::io::Result<(std::fs::File, std::path::PathBuf)> {
        use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)?;
        let path = dir.join(name);
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&path)?;
        Ok((f, path))
    }

    /// Renames the file to `to` (it is no longer removed when dropped).
    fn keep_as(&mut self, to: std::path::PathBuf) -> Result<(), ApiError> {
        if let Some(from) = self.path.take() {
            if let Err(e) = std::fs::rename(&from, &to) {
                let _ = std::fs::remove_file(&from);
                return Err(ApiError::internal(format!("storing the snapshot: {e}")));
            }
        }
        Ok(())
    }

    /// A kept archive, hashed by reading it through (never whole in memory).
    async fn open_kept(path: std::path::PathBuf) -> std::io::Result<Self> {
        tokio::task::spawn_blocking(move || {
            let mut file = std::fs::File::open(&path)?;
            let mut hash = blake3::Hasher::new();
            let size = std::io::copy(&mut file, &mut hash)?;
            Ok(Self {
                file,
                path: None,
                size,
                digest: hash.finalize().to_hex().to_string(),
            })
        })
        .await
        .map_err(std::io::Error::other)?
    }
}

impl Drop for Archive {
    fn drop(&mut self) {
        if let Some(p) = self.path.take() {
            let _ = std::fs::remove_file(p);
        }
    }
}

/// The kv key recording a stored snapshot: "generation digest size".
fn lease_key(sandbox: &SandboxId) -> String {
    format!("lease:{sandbox}")
}

fn step_key(sandbox: &SandboxId) -> String {
    format!("step:{sandbox}")
}

fn mib(bytes: usize) -> String {
    format!("{:.1} MiB", bytes as f64 / (1024.0 * 1024.0))
}

fn snapshot_key(sandbox: &SandboxId) -> String {
    format!("snapshot:{sandbox}")
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

fn validate_env(env: &BTreeMap<String, String>) -> Result<(), ApiError> {
    if env.len() > 256 {
        return Err(ApiError::bad_request("at most 256 environment variables"));
    }
    for (k, v) in env {
        let ok_name = !k.is_empty()
            && k.len() <= 256
            && !k.starts_with(|c: char| c.is_ascii_digit())
            && k.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_');
        if !ok_name {
            return Err(ApiError::bad_request(format!(
                "invalid environment variable name {k:?}"
            )));
        }
        if v.len() > 32 * 1024 || v.contains('\0') {
            return Err(ApiError::bad_request(format!("invalid value for {k}")));
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
