//! Outcome rules shared by both backends, so they answer alike: how a write's row
//! counts become an answer or a typed error, and how stored numbers are checked.

use std::collections::BTreeMap;

use space_identity::{ExecutionId, Generation, SandboxId, Substrate, WorkerId};

use crate::error::StoreError;
use crate::records::{ExecutionRecord, ExecutionState, PortRecord};
use crate::sql;

/// Refuses a database migrated by a newer build: its schema may mean something this
/// build does not know.
pub(crate) fn check_not_newer(applied: &[i64]) -> Result<(), StoreError> {
    let latest = sql::latest_version();
    match applied.iter().max() {
        Some(&v) if v > latest => Err(StoreError::Backend(format!(
            "database schema version {v} is newer than this build's {latest}"
        ))),
        _ => Ok(()),
    }
}

/// After an update of a row that may be guarded by an expected state: changed → done;
/// unchanged but present → the guard failed; absent → not found.
pub(crate) fn cas_outcome(
    changed: u64,
    found: bool,
    what: impl FnOnce() -> String,
) -> Result<(), StoreError> {
    match (changed, found) {
        (1.., _) => Ok(()),
        (0, true) => Err(StoreError::Conflict(format!(
            "{} is not in the expected state",
            what()
        ))),
        (0, false) => Err(StoreError::NotFound(what())),
    }
}

/// Why the generation counter did not move.
pub(crate) fn no_generation(sandbox_exists: bool, sandbox: &str) -> StoreError {
    if sandbox_exists {
        StoreError::Conflict(format!("sandbox {sandbox} is stopped"))
    } else {
        StoreError::NotFound(format!("sandbox {sandbox}"))
    }
}

/// After an update of a sandbox row guarded by "not stopped": changed → done; a
/// stopped sandbox → `Conflict`; none → `NotFound`.
pub(crate) fn live_sandbox_outcome(
    changed: u64,
    found: bool,
    sandbox: &str,
) -> Result<(), StoreError> {
    if changed > 0 {
        Ok(())
    } else {
        Err(no_generation(found, sandbox))
    }
}

pub(crate) fn new_execution(
    sandbox: SandboxId,
    generation: i64,
    execution_id: ExecutionId,
    worker: WorkerId,
    substrate: Substrate,
    now: i64,
) -> Result<ExecutionRecord, StoreError> {
    let generation = u64::try_from(generation)
        .map(Generation)
        .map_err(|_| StoreError::Backend(format!("generation {generation} is negative")))?;
    Ok(ExecutionRecord {
        sandbox,
        generation,
        execution_id,
        worker,
        substrate,
        activation: 1,
        pod_uid: None,
        state: ExecutionState::Pending,
        created_at: now,
        updated_at: now,
    })
}

pub(crate) fn standby_counts(
    rows: Vec<(String, String, String, i64)>,
) -> Result<Vec<crate::StandbyCount>, StoreError> {
    rows.into_iter()
        .map(|(worker, template, mode, n)| {
            let [(worker, n)]: [(WorkerId, u64); 1] = worker_counts(vec![(worker, n)])?
                .into_iter()
                .collect::<Vec<_>>()
                .try_into()
                .map_err(|_| StoreError::Backend("a worker count".into()))?;
            let mode = serde_json::from_value(serde_json::Value::String(mode)).map_err(|e| {
                StoreError::Backend(format!("a standby sandbox's network mode: {e}"))
            })?;
            Ok(crate::StandbyCount {
                worker,
                template,
                mode,
                n,
            })
        })
        .collect()
}

pub(crate) fn worker_counts(
    pairs: Vec<(String, i64)>,
) -> Result<BTreeMap<WorkerId, u64>, StoreError> {
    pairs
        .into_iter()
        .map(|(worker, n)| {
            let id = worker
                .parse()
                .map_err(|e| StoreError::Backend(format!("stored worker id is invalid: {e}")))?;
            let n =
                u64::try_from(n).map_err(|_| StoreError::Backend(format!("negative count {n}")))?;
            Ok((id, n))
        })
        .collect()
}

pub(crate) fn enroll_outcome(changed: u64, proven: bool, id: &str) -> Result<(), StoreError> {
    match (changed, proven) {
        (1.., _) => Ok(()),
        (0, false) => Err(StoreError::Conflict(format!(
            "worker {id} is enrolled already"
        ))),
        (0, true) => Err(StoreError::Conflict(format!(
            "worker {id} holds another credential"
        ))),
    }
}

pub(crate) fn reserved_seq(last: i64, n: u64) -> Result<u64, StoreError> {
    u64::try_from(last)
        .ok()
        .filter(|l| *l >= n)
        .ok_or_else(|| StoreError::Backend(format!("stored update sequence {last}")))
}

pub(crate) fn seq_count(n: u64) -> Result<i64, StoreError> {
    i64::try_from(n)
        .ok()
        .filter(|n| *n >= 1)
        .ok_or_else(|| StoreError::Conflict(format!("cannot reserve {n} update sequence numbers")))
}

pub(crate) fn bundle_outcome(changed: u64, version: u64) -> Result<(), StoreError> {
    if changed == 0 {
        Err(StoreError::Conflict(format!(
            "key bundle {version} is not newer than the stored one"
        )))
    } else {
        Ok(())
    }
}

pub(crate) fn bundle_version(v: i64) -> Result<u64, StoreError> {
    u64::try_from(v).map_err(|_| StoreError::Backend(format!("stored bundle version {v}")))
}

/// Longest protocol name a port record may carry (the caller's are `http` and `tcp`).
const MAX_PROTOCOL_LEN: usize = 16;

/// Refuses a port record the caller should never have built: port 0, an empty or
/// overlong protocol, a token hash that is not 64 lowercase hex digits.
pub(crate) fn check_port(p: &PortRecord) -> Result<(), StoreError> {
    // Port 0 is the catch-all of every HTTP port, and only that.
    if p.port == 0 && p.protocol != "http" {
        return Err(StoreError::Backend(
            "port 0 stands for every HTTP port: its protocol is http".into(),
        ));
    }
    if p.protocol.is_empty() || p.protocol.len() > MAX_PROTOCOL_LEN {
        return Err(StoreError::Backend(format!(
            "port protocol {:?} is empty or longer than {MAX_PROTOCOL_LEN} bytes",
            p.protocol
        )));
    }
    check_hash("port token hash", &p.token_hash)
}

pub(crate) fn check_port_number(port: u16) -> Result<(), StoreError> {
    if port == 0 {
        Err(StoreError::Backend("port 0 cannot be exposed".into()))
    } else {
        Ok(())
    }
}

/// A BLAKE3 hash as the store keeps it: 64 lowercase hex digits.
pub(crate) fn check_hash(what: &str, hash: &str) -> Result<(), StoreError> {
    if hash.len() == 64 && hash.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) {
        Ok(())
    } else {
        Err(StoreError::Backend(format!(
            "{what} is not 64 lowercase hex digits"
        )))
    }
}

/// How many times an upsert retries when the row it found vanished before it could
/// replace it (a concurrent delete, PostgreSQL only): each retry means another
/// writer got in between, so a few suffice.
pub(crate) const UPSERT_ATTEMPTS: usize = 4;

pub(crate) fn upsert_gave_up(sandbox: &str, port: u16) -> StoreError {
    StoreError::Conflict(format!(
        "port {port} of sandbox {sandbox} kept changing while it was exposed"
    ))
}

/// A link's verdict: past `expires_at` it leads nowhere (it was deleted all the same).
pub(crate) fn live_link<T>(target: T, expires_at: i64, now: i64) -> Option<T> {
    (expires_at >= now).then_some(target)
}
