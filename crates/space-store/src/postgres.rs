//! The shared backend: PostgreSQL through a small pool of `tokio-postgres` clients.
//!
//! Several control-plane replicas may use one database at once. Every rule that must
//! hold across them is enforced by the database itself — row locks taken by single
//! `UPDATE … RETURNING` statements, unique keys, `ON CONFLICT … WHERE` — never by a
//! read in one statement followed by a write in another.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use space_identity::{ExecutionId, Generation, PodUid, SandboxId, Substrate, WorkerId};
use tokio::sync::Semaphore;
use tokio_postgres::types::ToSql;
use tokio_postgres::{Config, GenericClient, Row};

use crate::error::StoreError;
use crate::outcomes;

mod error;
mod listen;
mod pool;
mod ports;
mod templates;
use crate::records::{
    ApiKeyRecord, Claim, ExecutionRecord, ExecutionState, KeyState, SandboxRecord, SandboxState,
    SigningKeyRecord, Tenant, WorkerRecord, WorkerState,
};
use crate::rows::{self, Cols, to_sql_int};
use crate::sql::{self, MIGRATIONS};
use error::pg_err;
use listen::{LIFECYCLE_CHANNEL, listen};
use pool::Pool;

/// Serialises schema migrations between replicas starting at the same time (an
/// arbitrary constant: "SPACE" in ASCII).
const MIGRATION_LOCK: i64 = 0x53_50_41_43_45;

type Params<'a> = &'a [&'a (dyn ToSql + Sync)];

/// A store in a PostgreSQL database.
#[derive(Clone, Debug)]
pub struct PgStore {
    pool: Arc<Pool>,
}

impl PgStore {
    /// Connections per store when opened through [`crate::Store::open`].
    pub const DEFAULT_POOL_SIZE: usize = 4;

    /// Connects with at most `pool_size` connections (at least one), checks that the
    /// server answers, and migrates the schema.
    pub async fn connect(url: &str, pool_size: usize) -> Result<Self, StoreError> {
        let mut config: Config = url
            .parse()
            .map_err(|e| StoreError::Backend(format!("invalid PostgreSQL URL: {e}")))?;
        if config.get_connect_timeout().is_none() {
            config.connect_timeout(Duration::from_secs(10));
        }
        if config.get_application_name().is_none() {
            config.application_name("space-store");
        }
        let pool = Pool {
            config,
            idle: Mutex::new(Vec::new()),
            permits: Semaphore::new(pool_size.max(1)),
            listener: Mutex::new(None),
        };
        let store = Self {
            pool: Arc::new(pool),
        };
        store.migrate().await?;
        let listener = tokio::spawn(listen(store.pool.config.clone()));
        *store
            .pool
            .listener
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some(listener.abort_handle());
        Ok(store)
    }

    /// Applies every migration the database lacks, in one transaction under an
    /// advisory lock, so replicas starting together migrate once.
    pub async fn migrate(&self) -> Result<(), StoreError> {
        let mut c = self.pool.get().await?;
        let tx = c.client().transaction().await.map_err(pg_err)?;
        tx.execute("SELECT pg_advisory_xact_lock($1)", &[&MIGRATION_LOCK])
            .await
            .map_err(pg_err)?;
        tx.batch_execute(sql::CREATE_MIGRATIONS_TABLE)
            .await
            .map_err(pg_err)?;
        let applied: Vec<i64> = query_all(&tx, sql::APPLIED_VERSIONS, &[], |r| r.int(0)).await?;
        outcomes::check_not_newer(&applied)?;
        for m in MIGRATIONS.iter().filter(|m| !applied.contains(&m.version)) {
            tx.batch_execute(m.postgres).await.map_err(|e| {
                StoreError::Backend(format!(
                    "migration {} ({}): {}",
                    m.version,
                    m.name,
                    pg_err(e)
                ))
            })?;
            tx.execute(sql::RECORD_MIGRATION, &[&m.version, &m.name])
                .await
                .map_err(pg_err)?;
        }
        tx.commit().await.map_err(pg_err)
    }

    /// Applied schema versions, oldest first.
    pub async fn schema_versions(&self) -> Result<Vec<i64>, StoreError> {
        let mut c = self.pool.get().await?;
        query_all(c.client(), sql::APPLIED_VERSIONS, &[], |r| r.int(0)).await
    }

    /// Runs one statement on a pooled client; the number of rows it changed.
    /// Announces a change of `sandbox` to every replica's waiters (best effort: a
    /// waiter's own deadline bounds a lost one).
    async fn announce(&self, sandbox: &str) {
        let _ = self
            .exec("SELECT pg_notify($1, $2)", &[&LIFECYCLE_CHANNEL, &sandbox])
            .await;
    }

    async fn exec(&self, sql: &str, params: Params<'_>) -> Result<u64, StoreError> {
        let mut c = self.pool.get().await?;
        c.client().execute(sql, params).await.map_err(pg_err)
    }

    async fn exists(&self, sql: &str, params: Params<'_>) -> Result<bool, StoreError> {
        let mut c = self.pool.get().await?;
        let row = c.client().query_opt(sql, params).await.map_err(pg_err)?;
        Ok(row.is_some())
    }

    async fn all<T>(
        &self,
        sql: &str,
        params: Params<'_>,
        decode: impl Fn(&Row) -> Result<T, StoreError>,
    ) -> Result<Vec<T>, StoreError> {
        let mut c = self.pool.get().await?;
        query_all(c.client(), sql, params, decode).await
    }

    async fn one<T>(
        &self,
        sql: &str,
        params: Params<'_>,
        decode: impl Fn(&Row) -> Result<T, StoreError>,
    ) -> Result<Option<T>, StoreError> {
        let mut c = self.pool.get().await?;
        let row = c.client().query_opt(sql, params).await.map_err(pg_err)?;
        row.as_ref().map(decode).transpose()
    }

    /// Creates a tenant; `Conflict` if the ID exists.
    pub async fn create_tenant(&self, t: &Tenant) -> Result<(), StoreError> {
        self.exec(sql::INSERT_TENANT, &[&t.id, &t.name, &t.created_at])
            .await
            .map(drop)
    }

    /// One tenant.
    pub async fn get_tenant(&self, id: &str) -> Result<Tenant, StoreError> {
        let q = sql::select(rows::TENANT_COLUMNS, "tenants", "WHERE id = $1");
        self.one(&q, &[&id], rows::tenant)
            .await?
            .ok_or_else(|| StoreError::NotFound(format!("tenant {id}")))
    }

    /// Every tenant, oldest first.
    pub async fn list_tenants(&self) -> Result<Vec<Tenant>, StoreError> {
        let q = sql::select(rows::TENANT_COLUMNS, "tenants", "ORDER BY created_at, id");
        self.all(&q, &[], rows::tenant).await
    }

    /// Stores an API key; `Conflict` if the ID exists, `NotFound` if the tenant does not.
    pub async fn insert_api_key(&self, k: &ApiKeyRecord) -> Result<(), StoreError> {
        let params: Params = &[
            &k.id,
            &k.tenant,
            &k.hash.as_slice(),
            &k.admin,
            &k.created_at,
            &k.revoked_at,
        ];
        self.exec(sql::INSERT_API_KEY, params).await.map(drop)
    }

    /// The key with this public ID, revoked or not.
    pub async fn find_api_key(&self, id: &str) -> Result<Option<ApiKeyRecord>, StoreError> {
        let q = sql::select(rows::API_KEY_COLUMNS, "api_keys", "WHERE id = $1");
        self.one(&q, &[&id], rows::api_key).await
    }

    /// A tenant's keys, oldest first.
    pub async fn list_api_keys(&self, tenant: &str) -> Result<Vec<ApiKeyRecord>, StoreError> {
        let q = sql::select(
            rows::API_KEY_COLUMNS,
            "api_keys",
            "WHERE tenant = $1 ORDER BY created_at, id",
        );
        self.all(&q, &[&tenant], rows::api_key).await
    }

    /// Revokes a key; `Ok(false)` if it already was.
    pub async fn revoke_api_key(&self, id: &str, now: i64) -> Result<bool, StoreError> {
        if self.exec(sql::REVOKE_API_KEY, &[&id, &now]).await? == 1 {
            return Ok(true);
        }
        if self.exists(sql::API_KEY_EXISTS, &[&id]).await? {
            Ok(false)
        } else {
            Err(StoreError::NotFound(format!("api key {id}")))
        }
    }

    /// Registers or re-enrolls a worker and returns the stored record.
    pub async fn upsert_worker(&self, w: &WorkerRecord) -> Result<WorkerRecord, StoreError> {
        let id = w.id.to_string();
        let capacity = i64::from(w.capacity);
        let params: Params = &[
            &id,
            &w.url,
            &w.substrate.as_str(),
            &capacity,
            &w.state.as_str(),
            &w.credential_hash.as_slice(),
            &w.registered_at,
            &w.last_seen,
        ];
        let q = format!("{} RETURNING {}", sql::UPSERT_WORKER, rows::WORKER_COLUMNS);
        self.one(&q, params, rows::worker)
            .await?
            .ok_or_else(|| StoreError::Backend("upsert returned no row".into()))
    }

    /// See [`crate::Store::enroll_worker`].
    pub async fn enroll_worker(
        &self,
        w: &WorkerRecord,
        proven: Option<[u8; 32]>,
    ) -> Result<WorkerRecord, StoreError> {
        let id = w.id.to_string();
        let capacity = i64::from(w.capacity);
        let changed = match proven {
            None => {
                let params: Params = &[
                    &id,
                    &w.url,
                    &w.substrate.as_str(),
                    &capacity,
                    &w.state.as_str(),
                    &w.credential_hash.as_slice(),
                    &w.registered_at,
                    &w.last_seen,
                ];
                self.exec(sql::ENROLL_NEW_WORKER, params).await?
            }
            Some(hash) => {
                let params: Params = &[
                    &id,
                    &w.url,
                    &w.substrate.as_str(),
                    &capacity,
                    &w.state.as_str(),
                    &hash.as_slice(),
                    &w.last_seen,
                ];
                let n = self.exec(sql::REENROLL_WORKER, params).await?;
                if n == 0 {
                    self.get_worker(&w.id).await?;
                }
                n
            }
        };
        outcomes::enroll_outcome(changed, proven.is_some(), &id)?;
        self.get_worker(&w.id).await
    }

    /// See [`crate::Store::reserve_update_seqs`].
    pub async fn reserve_update_seqs(&self, worker: &WorkerId, n: u64) -> Result<u64, StoreError> {
        let id = worker.to_string();
        let count = outcomes::seq_count(n)?;
        let last = self
            .one(sql::RESERVE_UPDATE_SEQ, &[&id, &count], |r| {
                r.try_get::<_, i64>(0).map_err(pg_err)
            })
            .await?
            .ok_or_else(|| {
                StoreError::Backend("reserving update sequence numbers returned no row".into())
            })?;
        outcomes::reserved_seq(last, n)
    }

    /// One worker.
    pub async fn get_worker(&self, id: &WorkerId) -> Result<WorkerRecord, StoreError> {
        let id = id.to_string();
        let q = sql::select(rows::WORKER_COLUMNS, "workers", "WHERE id = $1");
        self.one(&q, &[&id], rows::worker)
            .await?
            .ok_or_else(|| StoreError::NotFound(format!("worker {id}")))
    }

    /// Every worker, by ID.
    pub async fn list_workers(&self) -> Result<Vec<WorkerRecord>, StoreError> {
        let q = sql::select(rows::WORKER_COLUMNS, "workers", "ORDER BY id");
        self.all(&q, &[], rows::worker).await
    }

    /// Changes a worker's state.
    pub async fn set_worker_state(
        &self,
        id: &WorkerId,
        state: WorkerState,
    ) -> Result<(), StoreError> {
        let id = id.to_string();
        let n = self
            .exec(sql::SET_WORKER_STATE, &[&id, &state.as_str()])
            .await?;
        one_row(n, || format!("worker {id}"))
    }

    /// Records a heartbeat.
    pub async fn touch_worker(&self, id: &WorkerId, now: i64) -> Result<(), StoreError> {
        let id = id.to_string();
        let n = self.exec(sql::TOUCH_WORKER, &[&id, &now]).await?;
        one_row(n, || format!("worker {id}"))
    }

    /// Creates a sandbox; `Conflict` if the ID exists, `NotFound` if the tenant does not.
    pub async fn create_sandbox(&self, s: &SandboxRecord) -> Result<(), StoreError> {
        let (metadata, env) = rows::sandbox_json(s)?;
        let limits = rows::limits_json(s)?;
        let network = rows::network_json(&s.network)?;
        let generation = to_sql_int("generation", s.generation.get())?;
        let id = s.id.to_string();
        let params: Params = &[
            &id,
            &s.tenant,
            &s.template,
            &s.state.as_str(),
            &s.created_at,
            &s.expires_at,
            &metadata,
            &env,
            &generation,
            &limits,
            &network,
        ];
        self.exec(sql::INSERT_SANDBOX, params).await.map(drop)
    }

    /// See [`crate::Store::set_network`].
    pub async fn set_network(
        &self,
        id: &SandboxId,
        network: &crate::records::Policy,
    ) -> Result<(), StoreError> {
        let id = id.to_string();
        let network = rows::network_json(network)?;
        let changed = self
            .exec(sql::SET_SANDBOX_NETWORK, &[&id, &network])
            .await?;
        let found = changed > 0 || self.exists(sql::SANDBOX_EXISTS, &[&id]).await?;
        outcomes::live_sandbox_outcome(changed, found, &id)
    }

    /// See [`crate::Store::set_expiry`].
    pub async fn set_expiry(
        &self,
        id: &SandboxId,
        expires_at: Option<i64>,
    ) -> Result<(), StoreError> {
        let id = id.to_string();
        let changed = self
            .exec(sql::SET_SANDBOX_EXPIRY, &[&id, &expires_at])
            .await?;
        let found = changed > 0 || self.exists(sql::SANDBOX_EXISTS, &[&id]).await?;
        outcomes::live_sandbox_outcome(changed, found, &id)
    }

    /// One sandbox.
    pub async fn get_sandbox(&self, id: &SandboxId) -> Result<SandboxRecord, StoreError> {
        let id = id.to_string();
        let q = sql::select(rows::SANDBOX_COLUMNS, "sandboxes", "WHERE id = $1");
        self.one(&q, &[&id], rows::sandbox)
            .await?
            .ok_or_else(|| StoreError::NotFound(format!("sandbox {id}")))
    }

    /// See [`crate::Store::claim_standby`].
    pub async fn claim_standby(
        &self,
        standby: &str,
        claim: &Claim,
    ) -> Result<Option<SandboxRecord>, StoreError> {
        let metadata = rows::to_json("metadata", &claim.metadata)?;
        let network = rows::network_json(&claim.network)?;
        let mode = rows::mode_text(claim.network.mode);
        let q = sql::claim_standby(rows::SANDBOX_COLUMNS, sql::Backend::Postgres);
        let params: Params = &[
            &standby,
            &claim.tenant,
            &claim.created_at,
            &claim.expires_at,
            &metadata,
            &claim.template,
            &network,
            &mode,
        ];
        self.one(&q, params, rows::sandbox).await
    }

    /// A tenant's sandboxes, oldest first.
    pub async fn list_sandboxes(&self, tenant: &str) -> Result<Vec<SandboxRecord>, StoreError> {
        let q = sql::select(
            rows::SANDBOX_COLUMNS,
            "sandboxes",
            "WHERE tenant = $1 ORDER BY created_at, id",
        );
        self.all(&q, &[&tenant], rows::sandbox).await
    }

    /// Sets a sandbox's state, only from `expected` when given.
    pub async fn set_sandbox_state(
        &self,
        id: &SandboxId,
        state: SandboxState,
        expected: Option<SandboxState>,
    ) -> Result<(), StoreError> {
        let id = id.to_string();
        let changed = match expected {
            None => {
                self.exec(sql::SET_SANDBOX_STATE, &[&id, &state.as_str()])
                    .await?
            }
            Some(from) => {
                self.exec(
                    sql::SET_SANDBOX_STATE_IF,
                    &[&id, &state.as_str(), &from.as_str()],
                )
                .await?
            }
        };
        if changed > 0 {
            self.announce(&id).await;
        }
        let found = changed > 0 || self.exists(sql::SANDBOX_EXISTS, &[&id]).await?;
        outcomes::cas_outcome(changed, found, || format!("sandbox {id}"))
    }

    /// See [`crate::Store::count_live_sandboxes`].
    pub async fn count_live_sandboxes(&self, tenant: &str) -> Result<u64, StoreError> {
        let n = self
            .all(sql::COUNT_LIVE_BY_TENANT, &[&tenant], |r| r.int(0))
            .await?;
        Ok(n.first().copied().unwrap_or(0).max(0) as u64)
    }

    /// See [`crate::Store::count_standby_by_worker`].
    pub async fn count_standby_by_worker(
        &self,
        standby: &str,
    ) -> Result<Vec<crate::StandbyCount>, StoreError> {
        let q =
            sql::count_standby_by_worker(&sql::network_mode(sql::Backend::Postgres, "s.network"));
        let rows = self
            .all(&q, &[&standby], |r| {
                Ok((r.text(0)?, r.text(1)?, r.text(2)?, r.int(3)?))
            })
            .await?;
        outcomes::standby_counts(rows)
    }

    /// Active sandboxes per worker; workers with none are absent.
    pub async fn count_active_by_worker(&self) -> Result<BTreeMap<WorkerId, u64>, StoreError> {
        let pairs = self
            .all(sql::COUNT_ACTIVE_BY_WORKER, &[], |r| {
                Ok((r.text(0)?, r.int(1)?))
            })
            .await?;
        outcomes::worker_counts(pairs)
    }

    /// Takes the sandbox's next generation and records a pending execution for it.
    pub async fn allocate_execution(
        &self,
        sandbox: &SandboxId,
        execution_id: ExecutionId,
        worker: &WorkerId,
        substrate: Substrate,
        now: i64,
    ) -> Result<ExecutionRecord, StoreError> {
        let sbx = sandbox.to_string();
        let mut c = self.pool.get().await?;
        let tx = c.client().transaction().await.map_err(pg_err)?;
        // The increment locks the sandbox row until commit: a concurrent allocation in
        // another process waits here, then increments the committed value.
        let next = tx
            .query_opt(sql::NEXT_GENERATION, &[&sbx])
            .await
            .map_err(pg_err)?;
        let Some(row) = next else {
            let found = tx
                .query_opt(sql::SANDBOX_EXISTS, &[&sbx])
                .await
                .map_err(pg_err)?
                .is_some();
            return Err(outcomes::no_generation(found, &sbx));
        };
        let generation = row.int(0)?;
        let rec = outcomes::new_execution(
            *sandbox,
            generation,
            execution_id,
            worker.clone(),
            substrate,
            now,
        )?;
        let params: Params = &[
            &sbx,
            &generation,
            &rec.execution_id.to_string(),
            &rec.worker.to_string(),
            &rec.substrate.as_str(),
            &i64::from(rec.activation),
            &None::<String>,
            &rec.state.as_str(),
            &now,
            &now,
        ];
        tx.execute(sql::INSERT_EXECUTION, params)
            .await
            .map_err(pg_err)?;
        tx.commit().await.map_err(pg_err)?;
        Ok(rec)
    }

    /// Sets an execution's state, only from `expected` when given.
    pub async fn set_execution_state(
        &self,
        sandbox: &SandboxId,
        generation: Generation,
        state: ExecutionState,
        expected: Option<ExecutionState>,
        now: i64,
    ) -> Result<(), StoreError> {
        let sbx = sandbox.to_string();
        let generation = to_sql_int("generation", generation.get())?;
        let changed = match expected {
            None => {
                let params: Params = &[&sbx, &generation, &state.as_str(), &now];
                self.exec(sql::SET_EXECUTION_STATE, params).await?
            }
            Some(from) => {
                let params: Params = &[&sbx, &generation, &state.as_str(), &now, &from.as_str()];
                self.exec(sql::SET_EXECUTION_STATE_IF, params).await?
            }
        };
        if changed > 0 {
            self.announce(&sbx).await;
        }
        let found = changed > 0
            || self
                .exists(sql::EXECUTION_EXISTS, &[&sbx, &generation])
                .await?;
        outcomes::cas_outcome(changed, found, || format!("execution {sbx}@{generation}"))
    }

    /// Records a new activation attempt (and the pod UID on Kubernetes).
    pub async fn set_execution_activation(
        &self,
        sandbox: &SandboxId,
        generation: Generation,
        activation: u32,
        pod_uid: Option<PodUid>,
        now: i64,
    ) -> Result<(), StoreError> {
        let sbx = sandbox.to_string();
        let generation = to_sql_int("generation", generation.get())?;
        let pod_uid = pod_uid.map(|p| p.to_string());
        let activation = i64::from(activation);
        let params: Params = &[&sbx, &generation, &activation, &pod_uid, &now];
        let n = self.exec(sql::SET_EXECUTION_ACTIVATION, params).await?;
        one_row(n, || format!("execution {sbx}@{generation}"))
    }

    /// One execution.
    pub async fn get_execution(
        &self,
        sandbox: &SandboxId,
        generation: Generation,
    ) -> Result<ExecutionRecord, StoreError> {
        let sbx = sandbox.to_string();
        let generation = to_sql_int("generation", generation.get())?;
        let q = sql::select(
            rows::EXECUTION_COLUMNS,
            "executions",
            "WHERE sandbox = $1 AND generation = $2",
        );
        self.one(&q, &[&sbx, &generation], rows::execution)
            .await?
            .ok_or_else(|| StoreError::NotFound(format!("execution {sbx}@{generation}")))
    }

    /// The highest pending or running execution of a sandbox.
    pub async fn current_execution(
        &self,
        sandbox: &SandboxId,
    ) -> Result<Option<ExecutionRecord>, StoreError> {
        let sbx = sandbox.to_string();
        let q = sql::select(
            rows::EXECUTION_COLUMNS,
            "executions",
            "WHERE sandbox = $1 AND state IN ('pending', 'running') \
             ORDER BY generation DESC LIMIT 1",
        );
        self.one(&q, &[&sbx], rows::execution).await
    }

    /// Every execution of a sandbox, by generation.
    pub async fn list_executions(
        &self,
        sandbox: &SandboxId,
    ) -> Result<Vec<ExecutionRecord>, StoreError> {
        let sbx = sandbox.to_string();
        let q = sql::select(
            rows::EXECUTION_COLUMNS,
            "executions",
            "WHERE sandbox = $1 ORDER BY generation",
        );
        self.all(&q, &[&sbx], rows::execution).await
    }

    /// Executions on a worker in any of `states` (all states when empty).
    pub async fn executions_on_worker(
        &self,
        worker: &WorkerId,
        states: &[ExecutionState],
    ) -> Result<Vec<ExecutionRecord>, StoreError> {
        let worker = worker.to_string();
        let names: Vec<&'static str> = states.iter().map(|s| s.as_str()).collect();
        let mut params: Vec<&(dyn ToSql + Sync)> = vec![&worker];
        params.extend(names.iter().map(|s| s as &(dyn ToSql + Sync)));
        let q = sql::executions_on_worker_sql(names.len());
        self.all(&q, &params, rows::execution).await
    }

    /// Stores a signing key; `Conflict` if the ID exists.
    pub async fn insert_signing_key(&self, k: &SigningKeyRecord) -> Result<(), StoreError> {
        let params: Params = &[
            &k.key_id,
            &k.seed.as_slice(),
            &k.state.as_str(),
            &k.created_at,
            &k.not_before,
            &k.not_after,
        ];
        self.exec(sql::INSERT_SIGNING_KEY, params).await.map(drop)
    }

    /// Every signing key, oldest first.
    pub async fn list_signing_keys(&self) -> Result<Vec<SigningKeyRecord>, StoreError> {
        let q = sql::select(
            rows::SIGNING_KEY_COLUMNS,
            "signing_keys",
            "ORDER BY created_at, key_id",
        );
        self.all(&q, &[], rows::signing_key).await
    }

    /// Moves a signing key to `state`.
    pub async fn set_signing_key_state(
        &self,
        key_id: &str,
        state: KeyState,
    ) -> Result<(), StoreError> {
        let n = self
            .exec(sql::SET_SIGNING_KEY_STATE, &[&key_id, &state.as_str()])
            .await?;
        one_row(n, || format!("signing key {key_id}"))
    }

    /// Stores a key bundle if its version is newer than the stored one.
    pub async fn store_bundle(&self, version: u64, bytes: Vec<u8>) -> Result<(), StoreError> {
        let v = to_sql_int("bundle version", version)?;
        let n = self.exec(sql::STORE_BUNDLE, &[&v, &bytes]).await?;
        outcomes::bundle_outcome(n, version)
    }

    /// The newest bundle.
    pub async fn latest_bundle(&self) -> Result<Option<(u64, Vec<u8>)>, StoreError> {
        self.one(sql::LATEST_BUNDLE, &[], |r| {
            Ok((outcomes::bundle_version(r.int(0)?)?, r.blob(1)?))
        })
        .await
    }

    /// A setting.
    pub async fn kv_get(&self, name: &str) -> Result<Option<String>, StoreError> {
        self.one(sql::KV_GET, &[&name], |r| r.text(0)).await
    }

    /// Sets a setting, replacing any value.
    pub async fn kv_set(&self, name: &str, value: &str) -> Result<(), StoreError> {
        self.exec(sql::KV_SET, &[&name, &value]).await.map(drop)
    }

    /// Sets a setting only if it has no value; `Ok(true)` if this call set it.
    pub async fn kv_insert_if_absent(&self, name: &str, value: &str) -> Result<bool, StoreError> {
        Ok(self
            .exec(sql::KV_INSERT_IF_ABSENT, &[&name, &value])
            .await?
            == 1)
    }
}

async fn query_all<T>(
    c: &impl GenericClient,
    sql: &str,
    params: Params<'_>,
    decode: impl Fn(&Row) -> Result<T, StoreError>,
) -> Result<Vec<T>, StoreError> {
    let rows = c.query(sql, params).await.map_err(pg_err)?;
    rows.iter().map(decode).collect()
}

fn one_row(changed: u64, what: impl FnOnce() -> String) -> Result<(), StoreError> {
    if changed == 0 {
        Err(StoreError::NotFound(what()))
    } else {
        Ok(())
    }
}

impl Cols for Row {
    fn text(&self, i: usize) -> Result<String, StoreError> {
        self.try_get(i).map_err(pg_err)
    }
    fn opt_text(&self, i: usize) -> Result<Option<String>, StoreError> {
        self.try_get(i).map_err(pg_err)
    }
    fn int(&self, i: usize) -> Result<i64, StoreError> {
        self.try_get(i).map_err(pg_err)
    }
    fn opt_int(&self, i: usize) -> Result<Option<i64>, StoreError> {
        self.try_get(i).map_err(pg_err)
    }
    fn blob(&self, i: usize) -> Result<Vec<u8>, StoreError> {
        self.try_get(i).map_err(pg_err)
    }
    fn boolean(&self, i: usize) -> Result<bool, StoreError> {
        self.try_get(i).map_err(pg_err)
    }
}
