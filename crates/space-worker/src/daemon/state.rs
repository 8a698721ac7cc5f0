//! The worker's state: records, installed keys, the verified-token cache, and one slot
//! per sandbox holding its current (or retired) execution and its bridge pool.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, RwLock};

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD as B64;
use space_identity::{
    Generation, InstalledIdentity, InstalledKeys, Operation, Placement, RecordState as IdState,
    Route, SandboxId, SignedKeyBundle, Timestamp, Verdict, VerifiedTokenCache, VerifyingKey,
    WorkerId,
};
use space_proto::guest::Activation;
use spaced_host::BridgePool;

/// A verified agent connection as the worker keeps it: non-blocking, driven by the
/// runtime (no thread waits on an agent), woken only when the agent has written.
pub type AgentStream = super::agent_socket::AgentSocket;

/// The worker's pool of verified connections to one execution.
pub type AgentPool = BridgePool<AgentStream>;

use super::config::WorkerConfig;
use super::launch::{self, Binaries};
use super::metrics::WorkerMetrics;
use super::records::{ExecutionRecord, RecordState, Records};
use super::warm::WarmPool;
use crate::substrate::jail::{JailConfig, JailDriver};

/// One sandbox as this worker holds it.
#[derive(Debug)]
pub struct Slot {
    /// The durable record.
    pub record: ExecutionRecord,
    /// The identity the comparator checks against.
    pub installed: InstalledIdentity,
    /// Verified connections to the bridge, while running.
    pub pool: Option<Arc<AgentPool>>,
    /// The streams' lease on this execution's identity epoch: set to `true` (and
    /// every stream holding it ends with "execution replaced") the moment the worker
    /// retires, fails or replaces the execution. Pausing and resuming keep it.
    pub lease: Arc<tokio::sync::watch::Sender<bool>>,
}

impl Slot {
    /// A receiver of the lease, for a stream opened now.
    pub fn lease(&self) -> tokio::sync::watch::Receiver<bool> {
        self.lease.subscribe()
    }
}

/// Unix seconds now.
pub fn now_secs() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// 32 bytes from the kernel's CSPRNG.
pub fn random32() -> [u8; 32] {
    let mut out = [0u8; 32];
    let mut filled = 0;
    while filled < 32 {
        if let Ok(n) =
            rustix::rand::getrandom(&mut out[filled..], rustix::rand::GetRandomFlags::empty())
        {
            filled += n;
        }
    }
    out
}

/// The worker.
pub struct Worker {
    /// This worker's ID.
    pub id: WorkerId,
    /// Its node-api URL.
    pub url: String,
    /// Durable records.
    pub records: Records,
    /// The jail driver: every worker has one (it also keeps the cgroup parents, the
    /// startup sweep and warm jails); the driver of its sandboxes unless `vm` is set.
    pub jail: Arc<JailDriver>,
    /// The VM driver of a worker that runs VM sandboxes (`--substrate vm`, QEMU's or
    /// with `--vmm firecracker` Firecracker's).
    pub vm: Option<crate::substrate::vmm::VmDriver>,
    /// Binaries.
    pub binaries: Binaries,
    /// Data directory.
    pub data_dir: std::path::PathBuf,
    /// Installed verification keys (`None` until enrolled).
    pub keys: RwLock<Option<InstalledKeys>>,
    /// Tokens verified before (signature work only).
    pub cache: Mutex<VerifiedTokenCache>,
    /// Sandboxes.
    pub slots: RwLock<HashMap<SandboxId, Arc<Slot>>>,
    /// Bumped whenever a slot is put: requests waiting for a paused execution to be
    /// resumed (or replaced) wake on it instead of polling.
    pub slot_changes: tokio::sync::watch::Sender<u64>,
    /// Executions frozen for a snapshot or a migration (not paused by their owner):
    /// requests for them wait as long as a transition may take, not the 2 s a pause
    /// gets. Cleared when the execution is thawed or retired.
    pub snapshot_frozen: Mutex<std::collections::HashSet<(SandboxId, Generation)>>,
    /// netgtw tunnels open per sandbox (bounded by
    /// [`super::netgtw::MAX_TUNNELS_PER_SANDBOX`]).
    pub tunnels: Mutex<HashMap<SandboxId, usize>>,
    /// Updates of one sandbox apply one at a time, in arrival order (see
    /// [`Worker::lock_sandbox`]); updates of different sandboxes run side by side.
    /// Work that must see no update under way — the startup sweep, key bundles,
    /// snapshots and layer transfers — takes this lock exclusively.
    pub update_lock: tokio::sync::RwLock<()>,
    sandbox_locks: Mutex<HashMap<SandboxId, Arc<tokio::sync::Mutex<()>>>>,
    /// Who holds or waits for a sandbox's turn (named when exclusive work waits).
    pub turns: super::turns::Turns,
    /// Metrics.
    pub metrics: WorkerMetrics,
    /// Whether it is enrolled and synced with its control plane (`/readyz`).
    pub readiness: super::readiness::Readiness,
    /// Jails launched ahead of demand.
    pub warm: Arc<WarmPool>,
    /// The control plane's base URL (lost executions are reported there).
    pub control_url: String,
    /// Set when the worker stops its sandboxes itself: their agents' exits are then
    /// expected (the agent watch checks [`Worker::is_stopping`]).
    stopping: std::sync::atomic::AtomicBool,
    /// Default and largest sandbox limits.
    pub limits: super::limits::WorkerLimits,
    /// Egress for sandboxes in network mode `egress`, or why there is none here (set
    /// once at start, before any install is served).
    pub egress: std::sync::OnceLock<Result<Arc<crate::egress::manager::Egress>, String>>,
    /// The template store (`<data>/images`): images' layers, unpacked once, that
    /// sandboxes of those templates stack as their lower dirs.
    pub images: Arc<space_image::Store>,
}

impl std::fmt::Debug for Worker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Worker")
            .field("id", &self.id)
            .field("url", &self.url)
            .finish_non_exhaustive()
    }
}

/// One sandbox's turn to apply an update; the next waiting update of that sandbox
/// goes when it is dropped.
#[derive(Debug)]
pub struct SandboxTurn<'a> {
    worker: &'a Worker,
    sandbox: SandboxId,
    turn: Option<tokio::sync::OwnedMutexGuard<()>>,
    _shared: tokio::sync::RwLockReadGuard<'a, ()>,
    _noted: super::turns::Noted<'a>,
}

impl Drop for SandboxTurn<'_> {
    fn drop(&mut self) {
        let mut locks = self
            .worker
            .sandbox_locks
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        // Only the map and this turn hold the lock: nobody waits, so the entry goes.
        if locks
            .get(&self.sandbox)
            .is_some_and(|l| Arc::strong_count(l) <= 2)
        {
            locks.remove(&self.sandbox);
        }
        self.turn = None;
    }
}

/// Sandboxes torn down at once when the worker stops them all.
const STOP_AT_ONCE: usize = 8;

/// The comparator's view of a record.
pub fn installed_of(worker: &WorkerId, r: &ExecutionRecord) -> InstalledIdentity {
    InstalledIdentity {
        route: Route {
            sandbox: r.sandbox,
            execution: r.execution(),
            placement: Placement {
                worker: worker.clone(),
                substrate: r.substrate,
                activation: r.activation,
                pod_uid: None,
            },
        },
        state: match r.state {
            RecordState::Starting => IdState::Starting,
            RecordState::Running => IdState::Running,
            RecordState::Paused => IdState::Paused,
            RecordState::Retired | RecordState::Failed => IdState::Retired,
        },
    }
}

/// A data directory holds one substrate's sandboxes for good (a jail's layers are no
/// VM's disks): the first start records it (`<data>/substrate`), a later start as
/// another substrate is refused.
fn keep_substrate(config: &WorkerConfig) -> Result<(), String> {
    let kind = match config.vm {
        Some(_) => space_identity::Substrate::Vm,
        None => space_identity::Substrate::Jail,
    };
    let mark = config.data_dir.join("substrate");
    match std::fs::read_to_string(&mark) {
        Ok(was) if was.trim() == kind.as_str() => Ok(()),
        Ok(was) => Err(format!(
            "{} belongs to a {} worker (its sandboxes' files are of that substrate): start \
             it with --substrate {}, or give a {kind} worker a data directory of its own",
            config.data_dir.display(),
            was.trim(),
            was.trim()
        )),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            std::fs::create_dir_all(&config.data_dir)
                .and_then(|()| std::fs::write(&mark, kind.as_str()))
                .map_err(|e| format!("{}: {e}", mark.display()))
        }
        Err(e) => Err(format!("{}: {e}", mark.display())),
    }
}

/// The VM driver of `vm`: Firecracker's where configured, else QEMU's (its
/// accelerator probed once per data directory and logged).
fn open_vm(
    config: &WorkerConfig,
    vm: &super::config::VmSettings,
    jail: &JailDriver,
) -> Result<crate::substrate::vmm::VmDriver, String> {
    use crate::substrate::vm::{QemuDriver, VmConfig, detect_accel};
    use crate::substrate::vmm::VmDriver;
    if let Some(firecracker) = &vm.firecracker {
        let driver = crate::substrate::firecracker::FirecrackerDriver::new(
            crate::substrate::firecracker::FirecrackerConfig {
                firecracker: firecracker.clone(),
                kernel_dir: vm.kernel_dir.clone(),
                agent: config.binaries.agent.clone(),
                cgroup_parent: config.cgroup_parent.clone(),
                uid_ranges: jail.uid_ranges(),
            },
            &config.data_dir,
        )
        .map_err(|e| format!("VM substrate (Firecracker): {e}"))?;
        tracing::info!(firecracker = %firecracker.display(), "VMs under Firecracker");
        return Ok(VmDriver::Firecracker(Arc::new(driver)));
    }
    let (accel, why) = detect_accel(&vm.qemu, &vm.kernel_dir, &config.data_dir);
    tracing::info!(accel = accel.as_str(), reason = %why, "VM accelerator");
    let driver = QemuDriver::new(
        VmConfig {
            qemu: vm.qemu.clone(),
            kernel_dir: vm.kernel_dir.clone(),
            agent: config.binaries.agent.clone(),
            accel,
            // The jail driver's parent: the startup sweep ends leftover VMs too.
            cgroup_parent: config.cgroup_parent.clone(),
            uid_ranges: jail.uid_ranges(),
            transport: vm.transport,
        },
        &config.data_dir,
    )
    .map_err(|e| format!("VM substrate: {e}"))?;
    Ok(VmDriver::Qemu(Arc::new(driver)))
}

/// The activation of a record.
pub fn activation_of(r: &ExecutionRecord) -> Activation {
    Activation {
        sandbox: r.sandbox,
        generation: r.generation,
        execution_id: r.execution_id,
        activation: r.activation,
        secret: r.secret,
    }
}

impl Worker {
    /// Opens the records and the substrate; loads installed keys and slots.
    pub fn open(config: &WorkerConfig, url: String) -> Result<Arc<Self>, String> {
        keep_substrate(config)?;
        let records =
            Records::open(&config.data_dir.join("records.db")).map_err(|e| e.to_string())?;
        let mut jail = JailConfig::new(&config.jail_binary);
        jail.cgroup_parent = config.cgroup_parent.clone();
        jail.userns = config.userns.clone();
        let substrate = Arc::new(JailDriver::new(jail).map_err(|e| e.to_string())?);
        // Sandbox directories on the disk volume, where disk limits hold (root only:
        // a rootless worker cannot mount). Before the sweep, which leaves it mounted.
        // VM sandboxes' disks are files of their disk limit's size: no volume.
        if !substrate.is_rootless() && config.vm.is_none() {
            let disk = crate::substrate::jail::disk::ensure_volume(
                &config.data_dir,
                config.limits.disk_image_bytes,
            )
            .map_err(|e| format!("disk volume: {e}"))?;
            tracing::info!(?disk, "disk limits");
        }
        Self::assemble(config, url, records, substrate)
    }

    /// The driver of this worker's sandboxes.
    pub fn driver(&self) -> Arc<dyn crate::substrate::Substrate> {
        match &self.vm {
            Some(vm) => vm.substrate(),
            None => Arc::clone(&self.jail) as Arc<dyn crate::substrate::Substrate>,
        }
    }

    /// Which substrate this worker's sandboxes run on.
    pub fn kind(&self) -> space_identity::Substrate {
        match self.vm {
            Some(_) => space_identity::Substrate::Vm,
            None => space_identity::Substrate::Jail,
        }
    }

    /// The worker of `config` on `records` and `substrate` (its disk volume, if any,
    /// already mounted): installed keys and slots loaded from the records.
    pub(crate) fn assemble(
        config: &WorkerConfig,
        url: String,
        records: Records,
        substrate: Arc<JailDriver>,
    ) -> Result<Arc<Self>, String> {
        let images = Arc::new(
            space_image::Store::open(config.data_dir.join("images"))
                .map_err(|e| format!("template store: {e}"))?
                .with_limits(config.limits.images),
        );
        let vm = config
            .vm
            .as_ref()
            .map(|vm| open_vm(config, vm, &substrate))
            .transpose()?;
        let worker = Arc::new(Self {
            id: config.id.clone(),
            url,
            records,
            jail: substrate,
            vm,
            binaries: config.binaries.clone(),
            data_dir: config.data_dir.clone(),
            keys: RwLock::new(None),
            cache: Mutex::new(VerifiedTokenCache::new(10_000)),
            slots: RwLock::new(HashMap::new()),
            slot_changes: tokio::sync::watch::Sender::new(0),
            snapshot_frozen: Mutex::new(Default::default()),
            tunnels: Mutex::new(HashMap::new()),
            update_lock: tokio::sync::RwLock::new(()),
            sandbox_locks: Mutex::new(HashMap::new()),
            turns: super::turns::Turns::default(),
            metrics: WorkerMetrics::default(),
            readiness: super::readiness::Readiness::default(),
            control_url: config.control_url.clone(),
            stopping: std::sync::atomic::AtomicBool::new(false),
            // Warm jails are jails: a VM worker keeps none.
            warm: WarmPool::new(
                if config.vm.is_some() {
                    0
                } else {
                    config.warm_pool
                },
                super::limits::substrate_limits(&config.limits.defaults),
            ),
            limits: config.limits,
            egress: std::sync::OnceLock::new(),
            images,
        });
        // Keys persisted from before a restart: the worker comes back with what it
        // acknowledged, never with less.
        if let (Some(anchor), Some(bundle)) = (
            worker
                .records
                .setting("anchor")
                .map_err(|e| e.to_string())?,
            worker
                .records
                .setting("bundle")
                .map_err(|e| e.to_string())?,
        ) {
            let anchor = VerifyingKey::from_bytes(
                &anchor.try_into().map_err(|_| "stored anchor is corrupt")?,
            )
            .map_err(|e| e.to_string())?;
            let mut keys = InstalledKeys::new(anchor);
            keys.install(&SignedKeyBundle::from_bytes(bundle))
                .map_err(|e| format!("stored bundle: {e}"))?;
            *worker.keys.write().map_err(|_| "poisoned")? = Some(keys);
        }
        for r in worker.records.all().map_err(|e| e.to_string())? {
            worker.put_slot(r, None);
        }
        let me = Arc::downgrade(&worker);
        launch::spawn_reaper(move || {
            me.upgrade()
                .and_then(|w| {
                    w.slots.read().ok().map(|slots| {
                        slots
                            .values()
                            .filter_map(|s| s.record.bridge.as_ref())
                            .filter_map(|b| {
                                Some((i32::try_from(b.process.pid).ok()?, b.process.start_time))
                            })
                            .collect()
                    })
                })
                .unwrap_or_default()
        });
        Ok(worker)
    }

    /// From now on, an agent's exit is the worker's own doing (it stops).
    pub fn set_stopping(&self) {
        self.stopping
            .store(true, std::sync::atomic::Ordering::SeqCst);
    }

    /// Whether the worker is stopping.
    pub fn is_stopping(&self) -> bool {
        self.stopping.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Waits until no update is under way and takes the update lock exclusively, for
    /// `what`. Still waiting after [`super::turns::WARN_EVERY`], it says so in a
    /// warning naming the turns under way (sandbox, stage, caller), and again every
    /// period; done after more than a second, it says how long it waited.
    pub async fn exclusive(&self, what: &str) -> tokio::sync::RwLockWriteGuard<'_, ()> {
        let asked = std::time::Instant::now();
        // The same future throughout: its place in the lock's queue is kept.
        let mut write = std::pin::pin!(self.update_lock.write());
        let guard = loop {
            match tokio::time::timeout(super::turns::WARN_EVERY, &mut write).await {
                Ok(guard) => break guard,
                Err(_) => tracing::warn!(
                    waited = ?asked.elapsed(),
                    what,
                    turns = %self.turns.describe(),
                    "still waiting for updates under way to finish"
                ),
            }
        };
        let waited = asked.elapsed();
        if waited > std::time::Duration::from_secs(1) {
            tracing::warn!(?waited, what, "waited long for updates under way to finish");
        }
        guard
    }

    /// Waits for `sandbox`'s turn to apply an update (and for no exclusive work).
    /// The caller's location is noted until the turn is dropped (see
    /// [`super::turns`]).
    #[track_caller]
    pub fn lock_sandbox(
        &self,
        sandbox: &SandboxId,
    ) -> impl std::future::Future<Output = SandboxTurn<'_>> + '_ {
        let sandbox = *sandbox;
        let noted = self.turns.note(sandbox, std::panic::Location::caller());
        async move {
            let shared = self.update_lock.read().await;
            noted.stage(super::turns::Stage::Queued);
            let lock = {
                let mut locks = self
                    .sandbox_locks
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
                Arc::clone(locks.entry(sandbox).or_default())
            };
            let turn = lock.lock_owned().await;
            noted.stage(super::turns::Stage::Holding);
            SandboxTurn {
                worker: self,
                sandbox,
                turn: Some(turn),
                _shared: shared,
                _noted: noted,
            }
        }
    }

    /// Makes `record` the sandbox's current slot if it is not older than the one held.
    pub fn put_slot(&self, record: ExecutionRecord, pool: Option<Arc<AgentPool>>) {
        let installed = installed_of(&self.id, &record);
        let Ok(mut slots) = self.slots.write() else {
            return;
        };
        let old = slots.get(&record.sandbox).cloned();
        if old
            .as_ref()
            .is_some_and(|s| s.record.generation > record.generation)
        {
            return;
        }
        let live = matches!(
            record.state,
            RecordState::Starting | RecordState::Running | RecordState::Paused
        );
        let lease = match old {
            // The same execution, still live (paused or resumed, say): streams go on.
            Some(o)
                if live
                    && o.record.generation == record.generation
                    && o.record.execution_id == record.execution_id =>
            {
                Arc::clone(&o.lease)
            }
            // Anything else ends every stream of the old execution at once.
            Some(o) => {
                o.lease.send_replace(true);
                Arc::new(tokio::sync::watch::Sender::new(!live))
            }
            None => Arc::new(tokio::sync::watch::Sender::new(!live)),
        };
        slots.insert(
            record.sandbox,
            Arc::new(Slot {
                record,
                installed,
                pool,
                lease,
            }),
        );
        drop(slots);
        self.slot_changes.send_modify(|n| *n = n.wrapping_add(1));
    }

    /// Marks (or, with `frozen` false, unmarks) an execution as frozen for a snapshot.
    pub fn set_snapshot_frozen(&self, sandbox: &SandboxId, generation: Generation, frozen: bool) {
        if let Ok(mut set) = self.snapshot_frozen.lock() {
            if frozen {
                set.insert((*sandbox, generation));
            } else {
                set.remove(&(*sandbox, generation));
            }
        }
    }

    /// Whether an execution is frozen for a snapshot (see [`Worker::snapshot_frozen`]).
    pub fn is_snapshot_frozen(&self, sandbox: &SandboxId, generation: Generation) -> bool {
        self.snapshot_frozen
            .lock()
            .is_ok_and(|set| set.contains(&(*sandbox, generation)))
    }

    /// The current slot of a sandbox.
    pub fn slot(&self, sandbox: &SandboxId) -> Option<Arc<Slot>> {
        self.slots.read().ok()?.get(sandbox).cloned()
    }

    /// Stores the enrollment's anchor (refusing a different one than before) and
    /// credential.
    pub fn set_enrollment(&self, anchor: VerifyingKey, credential: &str) -> Result<(), String> {
        if let Some(old) = self.records.setting("anchor").map_err(|e| e.to_string())? {
            if old != anchor.as_bytes() {
                return Err("the control plane presents another trust anchor than at first enrollment; refusing".into());
            }
        }
        self.records
            .set_setting("anchor", anchor.as_bytes())
            .map_err(|e| e.to_string())?;
        self.records
            .set_setting("credential", credential.as_bytes())
            .map_err(|e| e.to_string())?;
        let mut keys = self.keys.write().map_err(|_| "poisoned")?;
        if keys.is_none() {
            *keys = Some(InstalledKeys::new(anchor));
        }
        Ok(())
    }

    /// Admission: the comparator against this worker's records, with the signature
    /// work cached. Local state only.
    pub fn admit(&self, token: &[u8], op: &Operation<'_>) -> (Verdict, Option<Arc<Slot>>) {
        let now = Timestamp::from_unix_secs(now_secs());
        let Ok(keys) = self.keys.read() else {
            return (
                Verdict::Deny {
                    reason: space_identity::DenyReason::UnknownKey,
                },
                None,
            );
        };
        let Some(keys) = keys.as_ref() else {
            return (
                Verdict::Deny {
                    reason: space_identity::DenyReason::UnknownKey,
                },
                None,
            );
        };
        let slot = self.slot(op.path_sandbox);
        let installed = slot.as_ref().map(|s| &s.installed);
        let verdict = match self.cache.lock() {
            Ok(mut cache) => cache.admit(token, keys, now, op, &self.id, installed),
            // A poisoned cache only loses the signature shortcut.
            Err(_) => space_identity::verify(token, keys, now, op, &self.id, installed),
        };
        (verdict, slot)
    }

    /// Stops every sandbox's processes (clean shutdown); records stay as they are, so
    /// a restart reports them lost and the control plane starts new executions.
    pub async fn stop_all(self: &Arc<Self>) {
        self.set_stopping();
        let slots: Vec<Arc<Slot>> = self
            .slots
            .read()
            .map(|s| s.values().cloned().collect())
            .unwrap_or_default();
        // Several at a time: a teardown mostly waits (for processes to die, for the
        // disk), and a worker with hundreds of sandboxes must stop within its
        // supervisor's grace period.
        let mut stopping = tokio::task::JoinSet::new();
        for s in slots {
            while stopping.len() >= STOP_AT_ONCE {
                let _ = stopping.join_next().await;
            }
            let worker = Arc::clone(self);
            stopping.spawn(async move {
                s.lease.send_replace(true);
                if let Some(pool) = &s.pool {
                    pool.clear();
                }
                worker.teardown(&s.record, launch::Layer::Keep).await;
            });
        }
        while stopping.join_next().await.is_some() {}
        // The worker's own cgroup parents go too once empty (rmdir refuses otherwise).
        let parent = self.jail.config().cgroup_parent.clone();
        for dir in self.jail.hierarchy().parent_dirs(&parent) {
            let _ = std::fs::remove_dir(dir);
        }
    }

    /// Stops an execution's processes off the runtime.
    pub async fn teardown(&self, r: &ExecutionRecord, layer: launch::Layer) {
        let substrate = self.driver();
        let data_dir = self.data_dir.clone();
        let (h, b) = (r.handle.clone(), r.bridge.clone());
        let egress = self.egress().ok().cloned();
        let (sandbox, execution) = (r.sandbox, r.execution());
        let _ = tokio::task::spawn_blocking(move || {
            // The link first: nothing of this execution leaves once it is going away.
            if let Some(e) = egress {
                e.release(&sandbox, Some(execution));
            }
            launch::teardown(&*substrate, &data_dir, h.as_ref(), b.as_ref(), layer);
        })
        .await;
    }

    /// The worker's egress, or why this worker has none.
    pub fn egress(&self) -> Result<&Arc<crate::egress::manager::Egress>, String> {
        match self.egress.get() {
            Some(Ok(e)) => Ok(e),
            Some(Err(why)) => Err(why.clone()),
            None => Err("egress is not started yet".into()),
        }
    }

    /// Gives a launched execution the network its record asks for (a link and rules
    /// for mode `egress`; nothing for `none`), before its install is acknowledged.
    pub async fn give_network(&self, r: &ExecutionRecord) -> Result<(), String> {
        if r.network.mode == space_proto::api::NetworkMode::None {
            if let Ok(e) = self.egress() {
                let (e, sandbox) = (Arc::clone(e), r.sandbox);
                let _ = tokio::task::spawn_blocking(move || e.release(&sandbox, None)).await;
            }
            return Ok(());
        }
        let egress = Arc::clone(self.egress()?);
        let init = r
            .handle
            .as_ref()
            .map(|h| h.init)
            .ok_or("the execution has no jail to give a network to")?;
        let (sandbox, execution, policy) = (r.sandbox, r.execution(), r.network.clone());
        tokio::task::spawn_blocking(move || egress.apply(&sandbox, execution, &init, &policy))
            .await
            .map_err(|e| format!("egress task: {e}"))?
            .map_err(|e| e.to_string())
    }

    /// Encodes a bundle for persistence.
    pub fn b64(bytes: &[u8]) -> String {
        B64.encode(bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(data: &std::path::Path, vm: bool) -> WorkerConfig {
        WorkerConfig {
            id: space_testkit::worker("w1"),
            control_url: "http://127.0.0.1:9".into(),
            enroll_secret: "unused".into(),
            listen: "127.0.0.1:0".parse().unwrap(),
            advertise_url: None,
            data_dir: data.to_path_buf(),
            capacity: 1,
            binaries: Binaries {
                agent: "/nonexistent".into(),
                bridge: "/nonexistent".into(),
            },
            jail_binary: "/nonexistent".into(),
            cgroup_parent: "unused".into(),
            warm_pool: 0,
            userns: None,
            limits: Default::default(),
            egress: None,
            vm: vm.then(|| super::super::config::VmSettings {
                qemu: "/nonexistent".into(),
                firecracker: None,
                kernel_dir: "/nonexistent".into(),
                transport: Default::default(),
            }),
        }
    }

    #[test]
    fn a_data_directory_keeps_the_substrate_of_its_first_start() {
        let data = tempfile::tempdir().unwrap();
        keep_substrate(&config(data.path(), false)).unwrap();
        keep_substrate(&config(data.path(), false)).unwrap();
        // Its sandboxes' files are jails': a VM worker on it is refused, saying so.
        let e = keep_substrate(&config(data.path(), true)).unwrap_err();
        assert!(e.contains("belongs to a jail worker"), "{e}");
        assert!(e.contains("--substrate jail"), "{e}");
        let other = tempfile::tempdir().unwrap();
        keep_substrate(&config(other.path(), true)).unwrap();
        let e = keep_substrate(&config(other.path(), false)).unwrap_err();
        assert!(e.contains("belongs to a vm worker"), "{e}");
    }
}
