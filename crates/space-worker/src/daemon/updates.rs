//! Signed identity updates from the control plane: verified, persisted with fsync,
//! applied, and only then acknowledged.

use std::sync::Arc;

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD as B64;
use space_identity::{Execution, SandboxId, SignedKeyBundle};
use space_proto::api::{
    AckState, InstallExecution, SignedUpdate, UPDATE_CLOCK_SKEW_SECS, UPDATE_MAX_AGE_SECS, Update,
    UpdateAck, UpdateBody,
};

use super::launch;
use super::records::{Claim, ExecutionRecord, RecordState};
use super::state::{Worker, activation_of, now_secs, random32};

/// Why an update (or the delivery carrying it) is refused. The message is the whole
/// answer a client sees; node-api chooses the status (`node_api::refusal`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UpdateError {
    /// The request carries no readable signed delivery: its sender is unknown.
    #[error("{0}")]
    Unauthenticated(String),
    /// Not signed by the trust anchor, for another worker, or not fresh.
    #[error("{0}")]
    Refused(String),
    /// Malformed, or asking for what this worker does not do.
    #[error("{0}")]
    Invalid(String),
    /// Contrary to this worker's records: a replay, an old generation, an execution
    /// not in the state the update expects.
    #[error("{0}")]
    Conflict(String),
    /// Larger than this worker reads.
    #[error("{0}")]
    TooLarge(String),
    /// This worker holds no trust anchor yet.
    #[error("not enrolled yet")]
    NotEnrolled,
    /// This worker failed (its records, a task, the freezer).
    #[error("{0}")]
    Internal(String),
}

fn unauthenticated(why: impl Into<String>) -> UpdateError {
    UpdateError::Unauthenticated(why.into())
}

fn refused(why: impl Into<String>) -> UpdateError {
    UpdateError::Refused(why.into())
}

fn invalid(why: impl Into<String>) -> UpdateError {
    UpdateError::Invalid(why.into())
}

fn conflict(why: impl Into<String>) -> UpdateError {
    UpdateError::Conflict(why.into())
}

fn too_large(why: impl Into<String>) -> UpdateError {
    UpdateError::TooLarge(why.into())
}

fn internal(why: impl Into<String>) -> UpdateError {
    UpdateError::Internal(why.into())
}

/// [`verify`] on a blocking thread: its claim waits for a durable commit (one fsync
/// for every claim waiting), which must not hold a runtime thread — with the runtime's
/// threads each waiting on a commit, no other request is read meanwhile, and a burst of
/// updates commits two at a time instead of together.
pub async fn verify_detached(
    worker: &Arc<Worker>,
    signed: SignedUpdate,
) -> Result<(Vec<u8>, Update), UpdateError> {
    let w = Arc::clone(worker);
    tokio::task::spawn_blocking(move || verify(&w, &signed))
        .await
        .map_err(|e| internal(format!("update check task: {e}")))?
}

/// Checks an update the way [`verify_all`] does; for one arriving on its own.
pub fn verify(worker: &Worker, signed: &SignedUpdate) -> Result<(Vec<u8>, Update), UpdateError> {
    let mut one = verify_all(worker, std::slice::from_ref(signed))?;
    one.pop().ok_or_else(|| internal("no update verified"))
}

/// Checks updates: signed by the trust anchor, for this worker, fresh (issued at most
/// [`UPDATE_MAX_AGE_SECS`] ago, allowing [`UPDATE_CLOCK_SKEW_SECS`] either way), and
/// each sequence number never used before. The numbers are recorded durably (one
/// fsync for the whole list) before this returns, so whatever happens next, the same
/// update is refused if it comes again — also after a restart. The refusal's message
/// starts with its reason: `stale_update`, `future_update`, `replayed_update` or
/// `old_sequence`. One refused update refuses the whole list.
///
/// Out of order is fine: updates signed concurrently (numbers 5 and 6, delivered 6
/// then 5) are each applied once. What is refused is a number seen before, or one at
/// or below the floor of numbers forgotten with their age (see
/// [`super::records::SEEN_UPDATES_KEPT_SECS`]).
pub fn verify_all(
    worker: &Worker,
    signed: &[SignedUpdate],
) -> Result<Vec<(Vec<u8>, Update)>, UpdateError> {
    let anchor = {
        let keys = worker.keys.read().map_err(|_| internal("poisoned"))?;
        *keys.as_ref().ok_or(UpdateError::NotEnrolled)?.anchor()
    };
    let now = now_secs();
    let mut out = Vec::with_capacity(signed.len());
    let mut seqs = Vec::with_capacity(signed.len());
    for signed in signed {
        let body = B64
            .decode(&signed.body)
            .map_err(|_| invalid("update body is not base64url"))?;
        let sig: [u8; 64] = B64
            .decode(&signed.signature)
            .ok()
            .and_then(|s| s.try_into().ok())
            .ok_or_else(|| invalid("update signature is not 64 bytes of base64url"))?;
        if !space_identity::verify_update(&anchor, &body, &sig) {
            return Err(refused("update not signed by the trust anchor"));
        }
        let parsed: UpdateBody =
            serde_json::from_slice(&body).map_err(|e| invalid(format!("update body: {e}")))?;
        if parsed.worker != worker.id {
            return Err(refused(format!("update is for worker {}", parsed.worker)));
        }
        check_fresh(parsed.issued_at, now)?;
        if parsed.seq == 0 {
            return Err(invalid("update sequence numbers start at 1"));
        }
        seqs.push((parsed.seq, parsed.issued_at));
        out.push((body, parsed.update));
    }
    let claims = worker
        .records
        .claim_updates(&seqs, now)
        .map_err(|e| internal(e.to_string()))?;
    for (&(seq, _), claim) in seqs.iter().zip(&claims) {
        match claim {
            Claim::Fresh => {}
            Claim::Replayed => {
                tracing::warn!(seq, "refused a replayed update");
                return Err(conflict(format!(
                    "replayed_update: update {seq} was received before; each is applied once"
                )));
            }
            Claim::BelowFloor => {
                tracing::warn!(seq, "refused an update below the sequence floor");
                return Err(conflict(format!(
                    "old_sequence: update {seq} is older than every update this worker still accepts"
                )));
            }
        }
    }
    Ok(out)
}

/// Checks the signed delivery descriptor of an update request (its header) before the
/// body is read: signed by the trust anchor, for this worker, fresh, and of a size
/// this worker reads. `header` is the header's text (`None` when it is absent or not
/// text): unauthenticated when absent or unparseable, refused otherwise.
pub fn check_delivery(
    worker: &Worker,
    header: Option<&str>,
) -> Result<space_proto::api::Delivery, UpdateError> {
    use space_proto::api::{DELIVERY_HEADER, Delivery, MAX_UPDATE_BODY};
    let text = header.ok_or_else(|| unauthenticated(format!("no {DELIVERY_HEADER} header")))?;
    let (descriptor, signature) = text
        .split_once('.')
        .and_then(|(d, s)| Some((B64.decode(d).ok()?, B64.decode(s).ok()?)))
        .ok_or_else(|| {
            unauthenticated(format!("{DELIVERY_HEADER} is not <base64url>.<base64url>"))
        })?;
    let signature: [u8; 64] = signature
        .try_into()
        .map_err(|_| unauthenticated("delivery signature is not 64 bytes"))?;
    let anchor = {
        let keys = worker.keys.read().map_err(|_| internal("poisoned"))?;
        *keys.as_ref().ok_or(UpdateError::NotEnrolled)?.anchor()
    };
    if !space_identity::verify_delivery(&anchor, &descriptor, &signature) {
        return Err(refused("delivery not signed by the trust anchor"));
    }
    let delivery: Delivery = serde_json::from_slice(&descriptor)
        .map_err(|e| refused(format!("delivery descriptor: {e}")))?;
    if delivery.worker != worker.id.as_str() {
        return Err(refused("delivery addressed to another worker"));
    }
    let now = now_secs();
    check_fresh(delivery.issued_at, now)?;
    // Used once: a captured header cannot make this worker read its body again (the
    // update inside would be refused as a replay, but only after reading it).
    if !first_delivery(&signature, delivery.issued_at, now) {
        return Err(conflict(
            "replayed_delivery: this delivery header was used before",
        ));
    }
    if delivery.size > MAX_UPDATE_BODY {
        return Err(too_large(format!(
            "too_large: updates are at most {MAX_UPDATE_BODY} bytes"
        )));
    }
    Ok(delivery)
}

/// Delivery signatures seen within the freshness window, with their `issued_at`
/// (older ones are refused by their time already, and forgotten).
static SEEN_DELIVERIES: std::sync::Mutex<Option<std::collections::HashMap<[u8; 64], u64>>> =
    std::sync::Mutex::new(None);

/// Most delivery signatures remembered at once (≈ 8 MiB); past it a delivery is
/// refused rather than remembered without bound (far above any real update rate).
const MAX_SEEN_DELIVERIES: usize = 100_000;

/// Whether `signature` is new in the window; records it.
fn first_delivery(signature: &[u8; 64], issued_at: u64, now: u64) -> bool {
    let mut seen = SEEN_DELIVERIES.lock().unwrap_or_else(|p| p.into_inner());
    let seen = seen.get_or_insert_with(Default::default);
    let window = UPDATE_MAX_AGE_SECS + 2 * UPDATE_CLOCK_SKEW_SECS;
    if seen.len() >= MAX_SEEN_DELIVERIES {
        seen.retain(|_, at| at.saturating_add(window) >= now);
        if seen.len() >= MAX_SEEN_DELIVERIES {
            return false;
        }
    }
    seen.insert(*signature, issued_at).is_none()
}

/// Refuses an `issued_at` outside the freshness window around `now`.
fn check_fresh(issued_at: u64, now: u64) -> Result<(), UpdateError> {
    if issued_at.saturating_add(UPDATE_MAX_AGE_SECS + UPDATE_CLOCK_SKEW_SECS) < now {
        return Err(refused(format!(
            "stale_update: issued {} s ago; updates older than {UPDATE_MAX_AGE_SECS} s \
                 (+{UPDATE_CLOCK_SKEW_SECS} s skew) are refused",
            now - issued_at
        )));
    }
    if issued_at > now + UPDATE_CLOCK_SKEW_SECS {
        return Err(refused(format!(
            "future_update: issued {} s ahead of this worker's clock (skew allowed: {UPDATE_CLOCK_SKEW_SECS} s)",
            issued_at - now
        )));
    }
    Ok(())
}

fn bundle_version(worker: &Worker) -> u64 {
    worker
        .keys
        .read()
        .ok()
        .and_then(|k| k.as_ref().map(|k| k.version()))
        .unwrap_or(0)
}

/// A template that cannot be used or received, as a refused update.
pub(crate) fn template_refusal(e: super::templates::TemplateError) -> UpdateError {
    use super::templates::TemplateError;
    match e {
        TemplateError::Invalid(m) => UpdateError::Invalid(m),
        TemplateError::Missing(m) => UpdateError::Conflict(m),
        TemplateError::Refused(m) => UpdateError::Refused(m),
        TemplateError::Internal(m) => UpdateError::Internal(m),
    }
}

pub(crate) fn ack(worker: &Worker, state: AckState, message: Option<String>) -> UpdateAck {
    UpdateAck {
        state,
        message,
        bundle_version: bundle_version(worker),
        warm_ready: Some(u32::try_from(worker.warm.ready()).unwrap_or(u32::MAX)),
    }
}

/// Applies a verified update. One at a time.
pub async fn apply(
    worker: &Arc<Worker>,
    _body: Vec<u8>,
    update: Update,
) -> Result<UpdateAck, UpdateError> {
    match update {
        Update::Bundle { bundle } => {
            let _applying = worker.exclusive("a key bundle").await;
            let bytes = B64
                .decode(&bundle)
                .map_err(|_| invalid("bundle is not base64url"))?;
            let signed = SignedKeyBundle::from_bytes(bytes);
            let mut staged = worker
                .keys
                .read()
                .map_err(|_| internal("poisoned"))?
                .clone()
                .ok_or(UpdateError::NotEnrolled)?;
            let changed = staged
                .install(&signed)
                .map_err(|e| conflict(e.to_string()))?;
            if changed {
                // Durable first, then in effect, then acknowledged.
                worker
                    .records
                    .set_setting("bundle", signed.as_bytes())
                    .map_err(|e| internal(e.to_string()))?;
                *worker.keys.write().map_err(|_| internal("poisoned"))? = Some(staged);
            }
            Ok(ack(worker, AckState::Installed, None))
        }
        Update::Retire {
            sandbox,
            generation,
            execution_id,
        } => {
            let _turn = worker.lock_sandbox(&sandbox).await;
            let execution = Execution {
                generation,
                id: execution_id,
            };
            retire_local(worker, &sandbox, execution).await;
            Ok(ack(worker, AckState::Retired, None))
        }
        Update::Install(install) => {
            let _turn = worker.lock_sandbox(&install.sandbox).await;
            install_execution(worker, install).await
        }
        Update::Pause {
            sandbox,
            generation,
            execution_id,
        } => {
            let _turn = worker.lock_sandbox(&sandbox).await;
            let execution = Execution {
                generation,
                id: execution_id,
            };
            freeze(worker, &sandbox, execution, true).await
        }
        Update::Resume {
            sandbox,
            generation,
            execution_id,
        } => {
            let _turn = worker.lock_sandbox(&sandbox).await;
            let execution = Execution {
                generation,
                id: execution_id,
            };
            freeze(worker, &sandbox, execution, false).await
        }
        Update::Unfreeze {
            sandbox,
            generation,
            execution_id,
        } => {
            space_http::crash::crash_point("worker.unfreeze.received");
            let _turn = worker.lock_sandbox(&sandbox).await;
            let execution = Execution {
                generation,
                id: execution_id,
            };
            freeze(worker, &sandbox, execution, false).await
        }
        Update::Ports {
            sandbox,
            generation,
            execution_id,
            ports,
        } => {
            let _turn = worker.lock_sandbox(&sandbox).await;
            let execution = Execution {
                generation,
                id: execution_id,
            };
            set_ports(worker, &sandbox, execution, ports)
        }
        Update::Network {
            sandbox,
            generation,
            execution_id,
            network,
        } => {
            let _turn = worker.lock_sandbox(&sandbox).await;
            let execution = Execution {
                generation,
                id: execution_id,
            };
            set_network(worker, &sandbox, execution, network).await
        }
        // These carry or return an archive: they have their own endpoints.
        Update::Snapshot { .. } | Update::Layer { .. } | Update::Template { .. } => {
            Err(invalid("this update has its own endpoint"))
        }
        // Its list is only as good as the moment the worker asked for it.
        Update::Templates { .. } => Err(invalid(
            "a list of templates to keep comes with a sync, never on its own",
        )),
    }
}

/// The slot of `execution` of `sandbox` while it lives (a 409 otherwise), and the
/// state an update of its trusted state acknowledges.
fn live_slot(
    worker: &Worker,
    sandbox: &SandboxId,
    execution: Execution,
) -> Result<(Arc<super::state::Slot>, AckState), UpdateError> {
    let slot = worker
        .slot(sandbox)
        .filter(|s| s.record.execution() == execution)
        .ok_or_else(|| conflict("no such execution on this worker"))?;
    let state = match slot.record.state {
        RecordState::Retired | RecordState::Failed => {
            return Err(conflict(format!("execution is {:?}", slot.record.state)));
        }
        RecordState::Paused => AckState::Paused,
        RecordState::Starting => AckState::Installed,
        RecordState::Running => AckState::Running,
    };
    Ok((slot, state))
}

/// Replaces the exposed ports of a live execution: persisted, then in effect (netgtw
/// closes connections to a port no longer listed when the slot changes).
fn set_ports(
    worker: &Arc<Worker>,
    sandbox: &SandboxId,
    execution: Execution,
    mut ports: Vec<space_proto::api::ports::ExposedPort>,
) -> Result<UpdateAck, UpdateError> {
    let (slot, state) = live_slot(worker, sandbox, execution)?;
    ports.sort_by_key(|p| p.port);
    ports.dedup_by_key(|p| p.port);
    space_proto::api::ports::check_exposed(&ports).map_err(invalid)?;
    if slot.record.ports == ports {
        return Ok(ack(worker, state, None));
    }
    let mut record = slot.record.clone();
    record.ports = ports;
    record.updated_at = now_secs() as i64;
    worker
        .records
        .put(&record)
        .map_err(|e| internal(e.to_string()))?;
    worker.put_slot(record, slot.pool.clone());
    Ok(ack(worker, state, None))
}

/// Replaces the network policy of a live execution: persisted, then in effect (the
/// worker's rules and its proxy and resolver judge new connections by it; established
/// ones are kept).
async fn set_network(
    worker: &Arc<Worker>,
    sandbox: &SandboxId,
    execution: Execution,
    network: space_proto::api::Policy,
) -> Result<UpdateAck, UpdateError> {
    let (slot, state) = live_slot(worker, sandbox, execution)?;
    if slot.record.network == network {
        return Ok(ack(worker, state, None));
    }
    let mut record = slot.record.clone();
    record.network = network;
    record.updated_at = now_secs() as i64;
    // In effect before it is recorded: a policy that cannot be applied (egress on a
    // worker without it) is refused, and the sandbox keeps the one it had.
    if record.handle.is_some() {
        worker.give_network(&record).await.map_err(conflict)?;
    }
    put_record(worker, &record).await.map_err(internal)?;
    worker.put_slot(record, slot.pool.clone());
    Ok(ack(worker, state, None))
}

/// Pauses (freezes) or resumes (thaws) an execution in place: the same execution, so
/// its capabilities stay valid. The new state is persisted before the freezer acts and
/// put back if it fails, so a restart never finds a record less paused than reality.
pub(crate) async fn freeze(
    worker: &Arc<Worker>,
    sandbox: &SandboxId,
    execution: Execution,
    pause: bool,
) -> Result<UpdateAck, UpdateError> {
    let slot = worker
        .slot(sandbox)
        .filter(|s| s.record.execution() == execution)
        .ok_or_else(|| conflict("no such execution on this worker"))?;
    if !pause {
        worker.set_snapshot_frozen(sandbox, execution.generation, false);
    }
    let (from, to, done) = if pause {
        (RecordState::Running, RecordState::Paused, AckState::Paused)
    } else {
        (RecordState::Paused, RecordState::Running, AckState::Running)
    };
    if slot.record.state == to {
        return Ok(ack(worker, done, None));
    }
    if slot.record.state != from {
        return Err(conflict(format!("execution is {:?}", slot.record.state)));
    }
    let handle = slot
        .record
        .handle
        .clone()
        .ok_or_else(|| conflict("execution has no processes"))?;
    let mut record = slot.record.clone();
    record.state = to;
    record.updated_at = now_secs() as i64;
    put_record(worker, &record).await.map_err(internal)?;
    let substrate = worker.driver();
    let acted = tokio::task::spawn_blocking(move || {
        if pause {
            substrate.pause(&handle)
        } else {
            substrate.resume(&handle)
        }
    })
    .await
    .map_err(|e| internal(e.to_string()))?;
    if let Err(e) = acted {
        let _ = put_record(worker, &slot.record).await;
        return Err(internal(format!("freezer: {e}")));
    }
    worker.put_slot(record, slot.pool.clone());
    Ok(ack(worker, done, None))
}

/// Retires one execution: tombstone first (durable), then its processes go.
pub async fn retire_local(worker: &Arc<Worker>, sandbox: &SandboxId, execution: Execution) {
    retire_execution(worker, sandbox, execution, true).await;
}

/// Retires an execution the control plane did not list at this worker's start. One
/// that never ran — its install was cut off by a crash, so nothing acknowledged it —
/// leaves the sandbox's writable layer kept here: the control plane starts the
/// sandbox again from it (a sandbox it stopped meanwhile has it removed by that
/// retirement). Discarding it lost acknowledged files.
pub async fn retire_unlisted(worker: &Arc<Worker>, r: &ExecutionRecord) {
    let never_ran = r.state == RecordState::Starting;
    retire_execution(worker, &r.sandbox, r.execution(), !never_ran).await;
}

/// [`retire_local`]; with `drop_kept_layer` false the sandbox's kept layer stays (a
/// new execution of it is being installed here and starts from that layer), and so
/// does the layer of an execution that never ran.
async fn retire_execution(
    worker: &Arc<Worker>,
    sandbox: &SandboxId,
    execution: Execution,
    drop_kept_layer: bool,
) {
    let Execution {
        generation,
        id: execution_id,
    } = execution;
    // This execution's record alone (reading every record made each retirement cost
    // as much as the worker's whole history).
    let existing = worker.records.get(sandbox, generation).ok().flatten();
    let mut tomb = existing.clone().unwrap_or(ExecutionRecord {
        sandbox: *sandbox,
        generation,
        execution_id,
        substrate: space_identity::Substrate::Jail,
        activation: 1,
        state: RecordState::Retired,
        secret: [0; 32],
        handle: None,
        bridge: None,
        env: Default::default(),
        ports: Vec::new(),
        network: space_proto::api::Policy::none(),
        defaults: Default::default(),
        template: None,
        updated_at: 0,
    });
    if tomb.execution_id != execution_id {
        tracing::warn!(sandbox = %sandbox, generation = generation.get(), "retire names another execution id than recorded; retiring the generation");
    }
    tomb.state = RecordState::Retired;
    tomb.updated_at = now_secs() as i64;
    if let Err(e) = put_record(worker, &tomb).await {
        tracing::error!(sandbox = %sandbox, error = %e, "cannot persist retirement");
        return;
    }
    space_http::crash::crash_point("worker.retire.recorded");
    // The tombstone first: it ends the execution's lease, so an operation whose
    // connection breaks from here on is told its route is stale (421), not that the
    // backend failed; then its pooled connections go.
    let old = worker.slot(sandbox);
    worker.put_slot(tomb.clone(), None);
    worker.set_snapshot_frozen(sandbox, generation, false);
    if let Some(slot) = old {
        if let Some(pool) = &slot.pool {
            if slot.record.generation == generation {
                pool.clear();
            }
        }
    }
    worker.metrics.retired();
    if let Some(r) = &existing {
        let ports: Vec<u16> = r.ports.iter().map(|p| p.port).collect();
        worker.metrics.forget_ports(sandbox, &ports);
    }
    if let Some(r) = existing {
        let layer = if r.state == RecordState::Starting && !drop_kept_layer {
            launch::Layer::Keep
        } else {
            launch::Layer::Discard
        };
        worker.teardown(&r, layer).await;
        // A retired sandbox's kept layer (from an earlier crash) goes too.
        if drop_kept_layer {
            let _ =
                crate::substrate::tree::remove_tree(&launch::kept_layer(&worker.data_dir, sandbox));
        }
    }
    space_http::crash::crash_point("worker.retire.torn_down");
}

async fn install_execution(
    worker: &Arc<Worker>,
    i: InstallExecution,
) -> Result<UpdateAck, UpdateError> {
    if let Some(why) = worker.limits.refusal(&i.limits) {
        return Err(invalid(why));
    }
    if i.substrate != worker.kind() {
        return Err(invalid(format!(
            "this worker runs {} sandboxes, not {}",
            worker.kind(),
            i.substrate
        )));
    }
    let max = worker
        .records
        .max_generation(&i.sandbox)
        .map_err(|e| internal(e.to_string()))?;
    if i.generation <= max {
        // The same install again (a retried delivery) is answered with its state;
        // anything older is a replay and is refused.
        if let Some(slot) = worker.slot(&i.sandbox) {
            let r = &slot.record;
            if r.execution() == i.execution() {
                let state = match r.state {
                    RecordState::Running | RecordState::Paused => AckState::Running,
                    RecordState::Retired => AckState::Retired,
                    _ => AckState::Failed,
                };
                return Ok(ack(worker, state, None));
            }
        }
        return Err(conflict(format!(
            "generation {} is not newer than {max} already recorded",
            i.generation
        )));
    }
    // A newer execution supersedes whatever ran before on this worker.
    if let Some(old) = worker.slot(&i.sandbox) {
        if matches!(
            old.record.state,
            RecordState::Starting | RecordState::Running | RecordState::Paused
        ) {
            retire_execution(worker, &i.sandbox, old.record.execution(), false).await;
        }
    }
    // An execution that continues a sandbox starts from its files, never from an empty
    // layer: an install sent where they are not (a worker restarted meanwhile, a
    // migration's layer that never arrived) is refused, and nothing is recorded. An
    // empty start lost every acknowledged file of the sandbox silently.
    if i.needs_layer && !launch::kept_layer(&worker.data_dir, &i.sandbox).exists() {
        return Err(conflict(format!(
            "layer_missing: the files of {} are not on this worker; it will not start it empty",
            i.sandbox
        )));
    }
    // The template before anything is recorded: one this worker lacks is refused
    // (`template_missing`), and the control plane sends it and installs again.
    let (template, image) =
        super::templates::resolve(worker, &i.template).map_err(template_refusal)?;
    let mut env = image
        .env
        .into_iter()
        .collect::<std::collections::BTreeMap<_, _>>();
    env.extend(i.env.clone());
    let mut record = ExecutionRecord {
        sandbox: i.sandbox,
        generation: i.generation,
        execution_id: i.execution_id,
        substrate: i.substrate,
        activation: i.activation,
        state: RecordState::Starting,
        secret: random32(),
        handle: None,
        bridge: None,
        env,
        ports: i.ports.clone(),
        network: i.network.clone(),
        defaults: super::records::ProcessDefaults {
            cwd: image.cwd,
            user: image.user,
        },
        template: Some(i.template.clone()),
        updated_at: now_secs() as i64,
    };
    put_record(worker, &record).await.map_err(internal)?;
    worker.put_slot(record.clone(), None);
    space_http::crash::crash_point("worker.install.recorded");

    let jail = Arc::clone(&worker.jail);
    let driver = worker.driver();
    let bins = worker.binaries.clone();
    let data_dir = worker.data_dir.clone();
    let activation = activation_of(&record);
    let limits = super::limits::substrate_limits(&i.limits);
    let warm = Arc::clone(&worker.warm);
    let launched = tokio::task::spawn_blocking(move || {
        // A warm jail starts with an empty writable layer of the default template: a
        // sandbox that has files on this worker (a restart) or another template
        // launches cold.
        let fresh = !launch::kept_layer(&data_dir, &activation.sandbox).exists()
            && template == crate::substrate::TemplateSpec::Default;
        if let Some(w) = fresh.then(|| warm.take(&limits)).flatten() {
            match launch::launch_warm(&jail, &bins, w, &activation) {
                Ok(done) => return Ok((done, true)),
                Err(e) => tracing::warn!(error = %e, "warm activation failed; launching cold"),
            }
        }
        launch::launch(&*driver, &bins, &data_dir, &activation, limits, &template)
            .map(|d| (d, false))
    })
    .await
    .map_err(|e| internal(format!("launch task: {e}")))?;
    match launched {
        Ok(((handle, bridge), was_warm)) => {
            space_http::crash::crash_point("worker.install.launched");
            if was_warm {
                worker.metrics.warm_activation();
            }
            record.state = RecordState::Running;
            record.handle = Some(handle);
            record.bridge = Some(bridge.clone());
            record.updated_at = now_secs() as i64;
            // Its network before anyone can reach it: no process of the user's runs
            // in the jail until the install is acknowledged.
            if let Err(e) = worker.give_network(&record).await {
                worker.teardown(&record, launch::Layer::Keep).await;
                record.state = RecordState::Failed;
                let _ = put_record(worker, &record).await;
                worker.put_slot(record, None);
                tracing::warn!(sandbox = %i.sandbox, generation = i.generation.get(), error = %e, "network failed");
                return Ok(ack(worker, AckState::Failed, Some(e)));
            }
            if let Err(e) = put_record(worker, &record).await {
                worker.teardown(&record, launch::Layer::Keep).await;
                return Err(internal(e));
            }
            let pool = Arc::new(super::state::AgentPool::new(
                launch::bridge_target(&bridge, &activation_of(&record)),
                32,
            ));
            super::agent_watch::watch_agent(worker, &record);
            worker.put_slot(record, Some(pool));
            worker.metrics.launched();
            Ok(ack(worker, AckState::Running, None))
        }
        Err(e) => {
            record.state = RecordState::Failed;
            record.updated_at = now_secs() as i64;
            let _ = put_record(worker, &record).await;
            worker.put_slot(record, None);
            tracing::warn!(sandbox = %i.sandbox, generation = i.generation.get(), error = %e, "launch failed");
            Ok(ack(worker, AckState::Failed, Some(e.to_string())))
        }
    }
}

/// Persists `record` (an fsync) off the runtime's threads, so installs of several
/// sandboxes proceed while one waits for the disk.
async fn put_record(worker: &Arc<Worker>, record: &ExecutionRecord) -> Result<(), String> {
    let (w, r) = (Arc::clone(worker), record.clone());
    tokio::task::spawn_blocking(move || w.records.put(&r).map_err(|e| e.to_string()))
        .await
        .map_err(|e| format!("records task: {e}"))?
}
