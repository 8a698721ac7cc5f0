//! Decoding rows into records, written once for both backends.
//!
//! Each backend exposes its row type through [`Cols`]; the decoders below turn the
//! primitive columns into typed records and refuse anything that does not parse, so a
//! corrupted or hand-edited row surfaces as an error instead of a wrong identity.

use std::collections::BTreeMap;
use std::str::FromStr;

use space_identity::Generation;

use crate::error::StoreError;
use crate::records::{
    ApiKeyRecord, ExecutionRecord, PortRecord, SandboxRecord, SigningKeyRecord, Tenant,
    WorkerRecord,
};

/// Column access by position, with the primitive types the schema uses.
pub(crate) trait Cols {
    fn text(&self, i: usize) -> Result<String, StoreError>;
    fn opt_text(&self, i: usize) -> Result<Option<String>, StoreError>;
    fn int(&self, i: usize) -> Result<i64, StoreError>;
    fn opt_int(&self, i: usize) -> Result<Option<i64>, StoreError>;
    fn blob(&self, i: usize) -> Result<Vec<u8>, StoreError>;
    fn boolean(&self, i: usize) -> Result<bool, StoreError>;
}

fn corrupt(what: &str, detail: impl std::fmt::Display) -> StoreError {
    StoreError::Backend(format!("stored {what} is invalid: {detail}"))
}

fn parsed<T: FromStr>(what: &str, text: String) -> Result<T, StoreError>
where
    T::Err: std::fmt::Display,
{
    text.parse().map_err(|e| corrupt(what, e))
}

fn hash32(what: &str, bytes: Vec<u8>) -> Result<[u8; 32], StoreError> {
    <[u8; 32]>::try_from(bytes.as_slice())
        .map_err(|_| corrupt(what, format_args!("{} bytes, expected 32", bytes.len())))
}

fn unsigned<T: TryFrom<i64>>(what: &str, value: i64) -> Result<T, StoreError> {
    T::try_from(value).map_err(|_| corrupt(what, format_args!("{value} is out of range")))
}

/// A `u64` as the signed 64-bit integer both databases store; values past `i64::MAX`
/// are refused rather than wrapped.
pub(crate) fn to_sql_int(what: &str, value: u64) -> Result<i64, StoreError> {
    i64::try_from(value)
        .map_err(|_| StoreError::Backend(format!("{what} {value} does not fit the database")))
}

/// Columns of `tenants`, in the order [`tenant`] reads them.
pub(crate) const TENANT_COLUMNS: &str = "id, name, created_at";

pub(crate) fn tenant(r: &impl Cols) -> Result<Tenant, StoreError> {
    Ok(Tenant {
        id: r.text(0)?,
        name: r.text(1)?,
        created_at: r.int(2)?,
    })
}

/// Columns of `api_keys`, in the order [`api_key`] reads them.
pub(crate) const API_KEY_COLUMNS: &str = "id, tenant, hash, admin, created_at, revoked_at";

pub(crate) fn api_key(r: &impl Cols) -> Result<ApiKeyRecord, StoreError> {
    Ok(ApiKeyRecord {
        id: r.text(0)?,
        tenant: r.text(1)?,
        hash: hash32("api key hash", r.blob(2)?)?,
        admin: r.boolean(3)?,
        created_at: r.int(4)?,
        revoked_at: r.opt_int(5)?,
    })
}

/// Columns of `workers`, in the order [`worker`] reads them.
pub(crate) const WORKER_COLUMNS: &str =
    "id, url, substrate, capacity, state, credential_hash, registered_at, last_seen";

pub(crate) fn worker(r: &impl Cols) -> Result<WorkerRecord, StoreError> {
    Ok(WorkerRecord {
        id: parsed("worker id", r.text(0)?)?,
        url: r.text(1)?,
        substrate: parsed("substrate", r.text(2)?)?,
        capacity: unsigned("worker capacity", r.int(3)?)?,
        state: parsed("worker state", r.text(4)?)?,
        credential_hash: hash32("worker credential hash", r.blob(5)?)?,
        registered_at: r.int(6)?,
        last_seen: r.int(7)?,
    })
}

/// Columns of `sandboxes`, in the order [`sandbox`] reads them.
pub(crate) const SANDBOX_COLUMNS: &str = "id, tenant, template, state, created_at, expires_at, metadata, env, generation, limits, network";

pub(crate) fn sandbox(r: &impl Cols) -> Result<SandboxRecord, StoreError> {
    let metadata = serde_json::from_str(&r.text(6)?).map_err(|e| corrupt("metadata", e))?;
    let env: BTreeMap<String, String> =
        serde_json::from_str(&r.text(7)?).map_err(|e| corrupt("environment", e))?;
    Ok(SandboxRecord {
        id: parsed("sandbox id", r.text(0)?)?,
        tenant: r.text(1)?,
        template: r.text(2)?,
        state: parsed("sandbox state", r.text(3)?)?,
        created_at: r.int(4)?,
        expires_at: r.opt_int(5)?,
        metadata,
        env,
        generation: Generation(unsigned("sandbox generation", r.int(8)?)?),
        limits: r
            .opt_text(9)?
            .map(|t| serde_json::from_str(&t).map_err(|e| corrupt("limits", e)))
            .transpose()?,
        network: serde_json::from_str(&r.text(10)?).map_err(|e| corrupt("network policy", e))?,
    })
}

/// Columns of `executions`, in the order [`execution`] reads them.
pub(crate) const EXECUTION_COLUMNS: &str = "sandbox, generation, execution_id, worker, substrate, activation, pod_uid, state, created_at, updated_at";

pub(crate) fn execution(r: &impl Cols) -> Result<ExecutionRecord, StoreError> {
    Ok(ExecutionRecord {
        sandbox: parsed("sandbox id", r.text(0)?)?,
        generation: Generation(unsigned("generation", r.int(1)?)?),
        execution_id: parsed("execution id", r.text(2)?)?,
        worker: parsed("worker id", r.text(3)?)?,
        substrate: parsed("substrate", r.text(4)?)?,
        activation: unsigned("activation", r.int(5)?)?,
        pod_uid: r.opt_text(6)?.map(|t| parsed("pod uid", t)).transpose()?,
        state: parsed("execution state", r.text(7)?)?,
        created_at: r.int(8)?,
        updated_at: r.int(9)?,
    })
}

/// Columns of `signing_keys`, in the order [`signing_key`] reads them.
pub(crate) const SIGNING_KEY_COLUMNS: &str =
    "key_id, seed, state, created_at, not_before, not_after";

pub(crate) fn signing_key(r: &impl Cols) -> Result<SigningKeyRecord, StoreError> {
    Ok(SigningKeyRecord {
        key_id: r.text(0)?,
        seed: hash32("signing key seed", r.blob(1)?)?,
        state: parsed("key state", r.text(2)?)?,
        created_at: r.int(3)?,
        not_before: r.int(4)?,
        not_after: r.int(5)?,
    })
}

/// Columns of `service_ports`, in the order [`port`] reads them.
pub(crate) const PORT_COLUMNS: &str = "sandbox_id, port, protocol, public, token_hash, created_at";

pub(crate) fn port(r: &impl Cols) -> Result<PortRecord, StoreError> {
    Ok(PortRecord {
        sandbox: parsed("sandbox id", r.text(0)?)?,
        // 0 is a catch-all record's (its table holds nothing else).
        port: unsigned::<u16>("port", r.int(1)?)?,
        protocol: r.text(2)?,
        public: r.boolean(3)?,
        token_hash: r.text(4)?,
        created_at: r.int(5)?,
    })
}

/// A stored port number: 1–65535.
pub(crate) fn port_number(value: i64) -> Result<u16, StoreError> {
    match unsigned::<u16>("port", value)? {
        0 => Err(corrupt("port", "0 is out of range")),
        p => Ok(p),
    }
}

/// What a taken link leads to: its sandbox and port, read back from the row.
pub(crate) fn link_target(
    sandbox: String,
    port: i64,
) -> Result<(space_identity::SandboxId, u16), StoreError> {
    Ok((parsed("sandbox id", sandbox)?, port_number(port)?))
}

/// Sandbox metadata and environment as the JSON text both databases store.
pub(crate) fn sandbox_json(s: &SandboxRecord) -> Result<(String, String), StoreError> {
    Ok((
        to_json("metadata", &s.metadata)?,
        to_json("environment", &s.env)?,
    ))
}

/// Sandbox limits as the JSON text both databases store (NULL when absent).
pub(crate) fn limits_json(s: &SandboxRecord) -> Result<Option<String>, StoreError> {
    s.limits.as_ref().map(|l| to_json("limits", l)).transpose()
}

/// A network mode as the policy's JSON spells it (`none`, `egress`).
pub(crate) fn mode_text(mode: space_egress::NetworkMode) -> String {
    match mode {
        space_egress::NetworkMode::None => "none",
        space_egress::NetworkMode::Egress => "egress",
    }
    .to_owned()
}

/// A network policy as the JSON text both databases store.
pub(crate) fn network_json(p: &space_egress::Policy) -> Result<String, StoreError> {
    to_json("network policy", p)
}

/// A JSON column's text; `what` names it in the error.
pub(crate) fn to_json(what: &str, value: &impl serde::Serialize) -> Result<String, StoreError> {
    serde_json::to_string(value)
        .map_err(|e| StoreError::Backend(format!("{what} does not serialize: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_network_columns_default_is_the_json_of_the_none_policy() {
        let none = network_json(&space_egress::Policy::none()).unwrap();
        let step = crate::sql::MIGRATIONS
            .iter()
            .find(|m| m.version == 5)
            .expect("migration 5");
        for text in [step.sqlite, step.postgres] {
            assert!(text.contains(&format!("DEFAULT '{none}'")), "{text}");
        }
    }
}
