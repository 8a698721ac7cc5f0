//! The control plane's durable store: tenants, API keys, workers, sandboxes, their
//! executions, signing keys, key bundles, exposed service ports with their one-time
//! links, published templates, and a few settings.
//!
//! Two backends behind one enum: SQLite for the embedded single-machine default and
//! PostgreSQL when several control-plane replicas share state. Both run the same SQL
//! (see `sql.rs`) and pass the same conformance suite (`tests/conformance.rs`).
//!
//! The invariant that matters most lives in [`Store::allocate_execution`]: a sandbox's
//! generations are handed out by one atomic increment on its row, so they only grow,
//! are never shared, and a failed start still consumes its number — also with two
//! control planes on one PostgreSQL database.
//!
//! Times are Unix seconds passed in by the caller; the store reads no clock.

pub mod changes;
mod error;
mod outcomes;
mod postgres;
mod records;
mod rows;
mod sql;
mod sqlite;
mod templates;
#[cfg(feature = "pg-harness")]
pub mod testing;

use std::collections::BTreeMap;

use space_identity::{ExecutionId, Generation, PodUid, SandboxId, Substrate, WorkerId};

pub use error::StoreError;
pub use postgres::PgStore;
pub use records::{
    ApiKeyRecord, Claim, ExecutionRecord, ExecutionState, KeyState, NetworkMode, ParseStateError,
    Policy, PortRecord, SandboxLimits, SandboxRecord, SandboxState, SigningKeyRecord, StandbyCount,
    Tenant, WorkerRecord, WorkerState,
};
pub use sqlite::SqliteStore;
pub use templates::TemplateRecord;

/// A store on one of the two backends.
#[derive(Clone, Debug)]
pub enum Store {
    /// Embedded, one file.
    Sqlite(SqliteStore),
    /// Shared by several control-plane replicas.
    Postgres(PgStore),
}

/// Calls the same method on whichever backend `self` holds.
macro_rules! dispatch {
    ($self:ident . $method:ident ( $($arg:expr),* )) => {
        match $self {
            Store::Sqlite(s) => s.$method($($arg),*).await,
            Store::Postgres(s) => s.$method($($arg),*).await,
        }
    };
}

impl Store {
    /// Opens and migrates a store: `postgres://…`/`postgresql://…` is PostgreSQL
    /// (a pool of [`PgStore::DEFAULT_POOL_SIZE`] connections); `sqlite:PATH`,
    /// `sqlite://PATH` or a bare path is a SQLite file.
    pub async fn open(url_or_path: &str) -> Result<Self, StoreError> {
        if url_or_path.starts_with("postgres://") || url_or_path.starts_with("postgresql://") {
            return Ok(Self::Postgres(
                PgStore::connect(url_or_path, PgStore::DEFAULT_POOL_SIZE).await?,
            ));
        }
        let path = url_or_path
            .strip_prefix("sqlite://")
            .or_else(|| url_or_path.strip_prefix("sqlite:"))
            .unwrap_or(url_or_path);
        if path.is_empty() {
            return Err(StoreError::Backend("empty database path".into()));
        }
        Ok(Self::Sqlite(SqliteStore::open(path).await?))
    }

    /// Applies missing schema migrations; a no-op when the schema is current. [`open`]
    /// already calls it. Fails if the database was migrated by a newer build.
    ///
    /// [`open`]: Store::open
    pub async fn migrate(&self) -> Result<(), StoreError> {
        dispatch!(self.migrate())
    }

    /// Applied schema versions, oldest first.
    pub async fn schema_versions(&self) -> Result<Vec<i64>, StoreError> {
        dispatch!(self.schema_versions())
    }

    /// Creates a tenant; `Conflict` if the ID exists.
    pub async fn create_tenant(&self, tenant: &Tenant) -> Result<(), StoreError> {
        dispatch!(self.create_tenant(tenant))
    }

    /// One tenant; `NotFound` if absent.
    pub async fn get_tenant(&self, id: &str) -> Result<Tenant, StoreError> {
        dispatch!(self.get_tenant(id))
    }

    /// Every tenant, oldest first.
    pub async fn list_tenants(&self) -> Result<Vec<Tenant>, StoreError> {
        dispatch!(self.list_tenants())
    }

    /// Stores an API key; `Conflict` if the ID exists, `NotFound` if its tenant does not.
    pub async fn insert_api_key(&self, key: &ApiKeyRecord) -> Result<(), StoreError> {
        dispatch!(self.insert_api_key(key))
    }

    /// The key with this public ID, revoked or not; `None` if there is none. The caller
    /// compares the presented secret's hash and checks `revoked_at`.
    pub async fn find_api_key(&self, id: &str) -> Result<Option<ApiKeyRecord>, StoreError> {
        dispatch!(self.find_api_key(id))
    }

    /// A tenant's keys, oldest first.
    pub async fn list_api_keys(&self, tenant: &str) -> Result<Vec<ApiKeyRecord>, StoreError> {
        dispatch!(self.list_api_keys(tenant))
    }

    /// Revokes a key at `now`. Idempotent: `Ok(true)` if this call revoked it,
    /// `Ok(false)` if it was already revoked (the first revocation time stays);
    /// `NotFound` if there is no such key.
    pub async fn revoke_api_key(&self, id: &str, now: i64) -> Result<bool, StoreError> {
        dispatch!(self.revoke_api_key(id, now))
    }

    /// Registers a worker, or re-enrolls it: every field is replaced except
    /// `registered_at`, which keeps the first registration. Returns the stored record.
    pub async fn upsert_worker(&self, worker: &WorkerRecord) -> Result<WorkerRecord, StoreError> {
        dispatch!(self.upsert_worker(worker))
    }

    /// Enrolls a worker. With `proven` `None`, only a new worker ID: `Conflict` if the
    /// ID is taken. With `Some(hash)`, only an existing worker whose stored credential
    /// hash is `hash` (the caller checked the worker holds that credential): its URL,
    /// substrate, capacity, state and `last_seen` are replaced, its credential and
    /// `registered_at` kept; `Conflict` if the hash differs, `NotFound` if absent.
    /// Atomic, also between replicas. Returns the stored record.
    pub async fn enroll_worker(
        &self,
        worker: &WorkerRecord,
        proven: Option<[u8; 32]>,
    ) -> Result<WorkerRecord, StoreError> {
        dispatch!(self.enroll_worker(worker, proven))
    }

    /// Reserves `n` (≥ 1) consecutive update sequence numbers for `worker` and returns
    /// the highest; the range is `last - n + 1 ..= last`. Numbers start at 1, only grow,
    /// are never handed out twice (also across replicas and restarts).
    pub async fn reserve_update_seqs(&self, worker: &WorkerId, n: u64) -> Result<u64, StoreError> {
        dispatch!(self.reserve_update_seqs(worker, n))
    }

    /// One worker; `NotFound` if absent.
    pub async fn get_worker(&self, id: &WorkerId) -> Result<WorkerRecord, StoreError> {
        dispatch!(self.get_worker(id))
    }

    /// Every worker, by ID.
    pub async fn list_workers(&self) -> Result<Vec<WorkerRecord>, StoreError> {
        dispatch!(self.list_workers())
    }

    /// Changes a worker's state; `NotFound` if absent.
    pub async fn set_worker_state(
        &self,
        id: &WorkerId,
        state: WorkerState,
    ) -> Result<(), StoreError> {
        dispatch!(self.set_worker_state(id, state))
    }

    /// Records a heartbeat at `now`; `NotFound` if absent.
    pub async fn touch_worker(&self, id: &WorkerId, now: i64) -> Result<(), StoreError> {
        dispatch!(self.touch_worker(id, now))
    }

    /// Creates a sandbox as given (normally with `generation` 0); `Conflict` if the ID
    /// exists, `NotFound` if its tenant does not.
    pub async fn create_sandbox(&self, sandbox: &SandboxRecord) -> Result<(), StoreError> {
        dispatch!(self.create_sandbox(sandbox))
    }

    /// One sandbox; `NotFound` if absent.
    pub async fn get_sandbox(&self, id: &SandboxId) -> Result<SandboxRecord, StoreError> {
        dispatch!(self.get_sandbox(id))
    }

    /// A tenant's sandboxes, oldest first (stopped ones included).
    pub async fn list_sandboxes(&self, tenant: &str) -> Result<Vec<SandboxRecord>, StoreError> {
        dispatch!(self.list_sandboxes(tenant))
    }

    /// Sets a sandbox's state. With `expected`, a compare-and-set: `Conflict` unless the
    /// stored state is `expected`, so two replicas cannot both win a transition.
    /// `NotFound` if absent.
    pub async fn set_sandbox_state(
        &self,
        id: &SandboxId,
        state: SandboxState,
        expected: Option<SandboxState>,
    ) -> Result<(), StoreError> {
        let done = dispatch!(self.set_sandbox_state(id, state, expected));
        changes::notify(id);
        done
    }

    /// Replaces a sandbox's network policy (what its every later execution is given).
    /// `Conflict` if the sandbox is stopped (its policy stays as it was), `NotFound`
    /// if absent.
    pub async fn set_network(&self, id: &SandboxId, network: &Policy) -> Result<(), StoreError> {
        dispatch!(self.set_network(id, network))
    }

    /// Replaces a sandbox's expiry (unix seconds; `None`: it never expires).
    /// `Conflict` if the sandbox is stopped, `NotFound` if absent.
    pub async fn set_expiry(
        &self,
        id: &SandboxId,
        expires_at: Option<i64>,
    ) -> Result<(), StoreError> {
        dispatch!(self.set_expiry(id, expires_at))
    }

    /// Hands one running sandbox of the standby tenant `standby` (the oldest of
    /// `claim.template` in the mode of `claim.network`) to `claim.tenant`, stamping
    /// its creation time, expiry, metadata and network policy; `None` when there is
    /// none. Atomic: concurrent claims, also from other replicas, never get
    /// the same sandbox.
    pub async fn claim_standby(
        &self,
        standby: &str,
        claim: &Claim,
    ) -> Result<Option<SandboxRecord>, StoreError> {
        dispatch!(self.claim_standby(standby, claim))
    }

    /// The standby tenant `standby`'s sandboxes that are not stopped, counted by the
    /// worker of their current execution, their template and their network mode: what
    /// the standby keeper spreads its pools by. Sandboxes without an execution yet are
    /// not counted.
    pub async fn count_standby_by_worker(
        &self,
        standby: &str,
    ) -> Result<Vec<StandbyCount>, StoreError> {
        dispatch!(self.count_standby_by_worker(standby))
    }

    /// For capacity-aware placement: per worker, the number of sandboxes that are not
    /// stopped and whose current execution (see [`Store::current_execution`]) runs
    /// there. Workers with none are absent from the map.
    pub async fn count_active_by_worker(&self) -> Result<BTreeMap<WorkerId, u64>, StoreError> {
        dispatch!(self.count_active_by_worker())
    }

    /// The sandboxes of `tenant` that are not stopped: what its sandbox quota counts.
    pub async fn count_live_sandboxes(&self, tenant: &str) -> Result<u64, StoreError> {
        dispatch!(self.count_live_sandboxes(tenant))
    }

    /// Atomically takes the sandbox's next generation and records a `Pending`
    /// execution for it (activation 1, no pod UID). Generations start at 1, only grow,
    /// and are never handed out twice, also to concurrent callers in other processes;
    /// a generation stays consumed whatever becomes of its execution. `NotFound` if
    /// the sandbox does not exist, `Conflict` if it is stopped or the execution ID is
    /// taken (nothing is consumed then).
    pub async fn allocate_execution(
        &self,
        sandbox: &SandboxId,
        execution_id: ExecutionId,
        worker: &WorkerId,
        substrate: Substrate,
        now: i64,
    ) -> Result<ExecutionRecord, StoreError> {
        let done =
            dispatch!(self.allocate_execution(sandbox, execution_id, worker, substrate, now));
        changes::notify(sandbox);
        done
    }

    /// Sets an execution's state and `updated_at`. With `expected`, a compare-and-set:
    /// `Conflict` unless the stored state is `expected`. `NotFound` if absent.
    pub async fn set_execution_state(
        &self,
        sandbox: &SandboxId,
        generation: Generation,
        state: ExecutionState,
        expected: Option<ExecutionState>,
        now: i64,
    ) -> Result<(), StoreError> {
        let done = dispatch!(self.set_execution_state(sandbox, generation, state, expected, now));
        changes::notify(sandbox);
        done
    }

    /// Records a new activation attempt of an execution (a VMM restarted under the same
    /// generation) and, on Kubernetes, its pod UID. `NotFound` if absent.
    pub async fn set_execution_activation(
        &self,
        sandbox: &SandboxId,
        generation: Generation,
        activation: u32,
        pod_uid: Option<PodUid>,
        now: i64,
    ) -> Result<(), StoreError> {
        let done =
            dispatch!(self.set_execution_activation(sandbox, generation, activation, pod_uid, now));
        changes::notify(sandbox);
        done
    }

    /// One execution; `NotFound` if absent.
    pub async fn get_execution(
        &self,
        sandbox: &SandboxId,
        generation: Generation,
    ) -> Result<ExecutionRecord, StoreError> {
        dispatch!(self.get_execution(sandbox, generation))
    }

    /// The sandbox's current execution: its highest generation that is `Pending` or
    /// `Running`. Failed and retired executions are never current.
    pub async fn current_execution(
        &self,
        sandbox: &SandboxId,
    ) -> Result<Option<ExecutionRecord>, StoreError> {
        dispatch!(self.current_execution(sandbox))
    }

    /// Every execution of a sandbox, by generation.
    pub async fn list_executions(
        &self,
        sandbox: &SandboxId,
    ) -> Result<Vec<ExecutionRecord>, StoreError> {
        dispatch!(self.list_executions(sandbox))
    }

    /// Executions placed on `worker` whose state is one of `states` (every state when
    /// `states` is empty), by sandbox and generation.
    pub async fn executions_on_worker(
        &self,
        worker: &WorkerId,
        states: &[ExecutionState],
    ) -> Result<Vec<ExecutionRecord>, StoreError> {
        dispatch!(self.executions_on_worker(worker, states))
    }

    /// Stores a signing key; `Conflict` if the ID exists.
    pub async fn insert_signing_key(&self, key: &SigningKeyRecord) -> Result<(), StoreError> {
        dispatch!(self.insert_signing_key(key))
    }

    /// Every signing key, oldest first.
    pub async fn list_signing_keys(&self) -> Result<Vec<SigningKeyRecord>, StoreError> {
        dispatch!(self.list_signing_keys())
    }

    /// Moves a signing key to `state`; `NotFound` if absent.
    pub async fn set_signing_key_state(
        &self,
        key_id: &str,
        state: KeyState,
    ) -> Result<(), StoreError> {
        dispatch!(self.set_signing_key_state(key_id, state))
    }

    /// Stores a key bundle. Bundles never roll back: `Conflict` unless `version` is
    /// greater than the stored one. Only the newest bundle is kept.
    pub async fn store_bundle(&self, version: u64, bytes: Vec<u8>) -> Result<(), StoreError> {
        dispatch!(self.store_bundle(version, bytes))
    }

    /// The newest bundle and its version, if any was stored.
    pub async fn latest_bundle(&self) -> Result<Option<(u64, Vec<u8>)>, StoreError> {
        dispatch!(self.latest_bundle())
    }

    /// Exposes a port, or re-exposes it: an existing (sandbox, port) row gets the new
    /// protocol, publicity, token hash and creation time. `Ok(true)` when the port was
    /// not exposed before. Every one-time link of the port is deleted in the same
    /// write, so a replaced token is not reachable through an old link. `NotFound` if
    /// the sandbox does not exist.
    pub async fn upsert_port(&self, port: &PortRecord) -> Result<bool, StoreError> {
        dispatch!(self.upsert_port(port))
    }

    /// A sandbox's exposed ports, by port.
    pub async fn list_ports(&self, sandbox: &SandboxId) -> Result<Vec<PortRecord>, StoreError> {
        dispatch!(self.list_ports(sandbox))
    }

    /// One exposed port; `None` if it is not exposed.
    pub async fn get_port(
        &self,
        sandbox: &SandboxId,
        port: u16,
    ) -> Result<Option<PortRecord>, StoreError> {
        dispatch!(self.get_port(sandbox, port))
    }

    /// Closes a port and deletes its links; `Ok(true)` if it was exposed.
    pub async fn delete_port(&self, sandbox: &SandboxId, port: u16) -> Result<bool, StoreError> {
        dispatch!(self.delete_port(sandbox, port))
    }

    /// Closes every port of a sandbox (when it is deleted) and deletes their links;
    /// the number of ports closed.
    pub async fn delete_ports(&self, sandbox: &SandboxId) -> Result<u64, StoreError> {
        dispatch!(self.delete_ports(sandbox))
    }

    /// Stores a one-time link to an exposed port, by the hash of its code (64
    /// lowercase hex digits), usable until `expires_at` (inclusive). `NotFound` if the
    /// port is not exposed, `Conflict` if the code hash exists.
    pub async fn insert_port_link(
        &self,
        code_hash: &str,
        sandbox: &SandboxId,
        port: u16,
        expires_at: i64,
    ) -> Result<(), StoreError> {
        dispatch!(self.insert_port_link(code_hash, sandbox, port, expires_at))
    }

    /// Uses a one-time link: deletes it and returns the port it leads to. `None` for
    /// an unknown link, one taken already, or one that expired (`expires_at < now`;
    /// deleted all the same). One atomic statement: of concurrent takers, also on
    /// other replicas, at most one gets it.
    pub async fn take_port_link(
        &self,
        code_hash: &str,
        now: i64,
    ) -> Result<Option<(SandboxId, u16)>, StoreError> {
        dispatch!(self.take_port_link(code_hash, now))
    }

    /// Deletes the links that expired before `now`; how many.
    pub async fn purge_port_links(&self, now: i64) -> Result<u64, StoreError> {
        dispatch!(self.purge_port_links(now))
    }

    /// Binds `name:tag` to a template (its digest, manifest and size): `Ok(true)` when
    /// the binding is new, `Ok(false)` when it holds this digest already (nothing
    /// changes), `Conflict` when it holds another digest (templates are immutable:
    /// remove the binding first). Atomic, also between replicas.
    pub async fn put_template(&self, template: &TemplateRecord) -> Result<bool, StoreError> {
        dispatch!(self.put_template(template))
    }

    /// The template bound to `name:tag`, if any.
    pub async fn template(
        &self,
        name: &str,
        tag: &str,
    ) -> Result<Option<TemplateRecord>, StoreError> {
        dispatch!(self.template(name, tag))
    }

    /// A template of digest `digest` (`sha256:<hex>`) under any name (the first by
    /// name and tag), if one is bound.
    pub async fn template_by_digest(
        &self,
        digest: &str,
    ) -> Result<Option<TemplateRecord>, StoreError> {
        dispatch!(self.template_by_digest(digest))
    }

    /// Every bound template, by name and tag.
    pub async fn list_templates(&self) -> Result<Vec<TemplateRecord>, StoreError> {
        dispatch!(self.list_templates())
    }

    /// Removes the binding `name:tag`; `Ok(true)` if there was one.
    pub async fn delete_template(&self, name: &str, tag: &str) -> Result<bool, StoreError> {
        dispatch!(self.delete_template(name, tag))
    }

    /// The sandboxes that are not stopped whose template is pinned to `digest`
    /// (`template` = `NAME:TAG@<digest>`, whatever the name): what a removal checks.
    pub async fn count_live_sandboxes_with_template(
        &self,
        digest: &str,
    ) -> Result<u64, StoreError> {
        dispatch!(self.count_live_sandboxes_with_template(digest))
    }

    /// A setting (such as the trust-anchor seed).
    pub async fn kv_get(&self, name: &str) -> Result<Option<String>, StoreError> {
        dispatch!(self.kv_get(name))
    }

    /// Sets a setting, replacing any value.
    pub async fn kv_set(&self, name: &str, value: &str) -> Result<(), StoreError> {
        dispatch!(self.kv_set(name, value))
    }

    /// Sets a setting only if it has none; `Ok(true)` if this call set it. Lets two
    /// replicas that each generated a value agree on one: the loser reads the winner's.
    pub async fn kv_insert_if_absent(&self, name: &str, value: &str) -> Result<bool, StoreError> {
        dispatch!(self.kv_insert_if_absent(name, value))
    }
}
