//! The embedded backend: one SQLite file in WAL mode.
//!
//! Writes go to one writer thread, which commits them in groups: it takes every write
//! waiting (up to [`MAX_GROUP`]), runs each in its own savepoint inside one
//! `BEGIN IMMEDIATE` transaction, and answers them after the one `COMMIT` (and its
//! fsync) — a write that fails rolls back to its savepoint and leaves the others.
//! A burst of concurrent writes thus costs a few fsyncs instead of one each, and
//! no write is answered before it is durable. Reads run on a few read-only
//! connections on tokio's blocking pool; WAL lets them proceed during a commit, and
//! they see every write that has been answered.
//! Several `SqliteStore`s (or processes) may open the same file: each group takes
//! SQLite's write lock up front and waits on the busy timeout instead of failing on a
//! stale snapshot.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError, mpsc};

use rusqlite::{Connection, OptionalExtension, ToSql, TransactionBehavior};
use space_identity::{ExecutionId, Generation, PodUid, SandboxId, Substrate, WorkerId};
use tokio::sync::oneshot;

use crate::error::StoreError;
use crate::outcomes;
use crate::records::{
    ApiKeyRecord, Claim, ExecutionRecord, ExecutionState, KeyState, SandboxRecord, SandboxState,
    SigningKeyRecord, Tenant, WorkerRecord, WorkerState,
};
use crate::rows::{self, Cols, to_sql_int};
use crate::sql::{self, MIGRATIONS};

mod helpers;
mod ports;
mod templates;
mod workers;
mod writer;

use helpers::*;
use writer::*;

/// Read-only connections.
const READERS: usize = 2;

/// A store in one SQLite file.
#[derive(Clone, Debug)]
pub struct SqliteStore {
    /// The writer's connection (the writer thread locks it for each group).
    #[cfg_attr(
        not(test),
        expect(
            dead_code,
            reason = "the writer thread holds its own handle; tests inspect it"
        )
    )]
    conn: Arc<Mutex<Connection>>,
    writes: mpsc::Sender<Box<dyn WriteJob>>,
    readers: Arc<Readers>,
    path: Arc<Path>,
}

#[derive(Debug)]
struct Readers {
    conns: Vec<Mutex<Connection>>,
    next: AtomicUsize,
}

impl SqliteStore {
    /// Opens (creating it and its directory if needed) the database at `path` with WAL, `synchronous=FULL`
    /// (a commit is on disk before it returns) and foreign keys on, then migrates it.
    pub async fn open(path: impl AsRef<Path>) -> Result<Self, StoreError> {
        let path: PathBuf = path.as_ref().to_owned();
        let conn = {
            let path = path.clone();
            tokio::task::spawn_blocking(move || open_connection(&path))
                .await
                .map_err(|e| StoreError::Backend(format!("open task failed: {e}")))??
        };
        let conn = Arc::new(Mutex::new(conn));
        let (writes, jobs) = mpsc::channel::<Box<dyn WriteJob>>();
        let writer = Arc::clone(&conn);
        std::thread::Builder::new()
            .name("sqlite-writer".into())
            .spawn(move || writer_loop(&writer, &jobs))
            .map_err(|e| StoreError::Backend(format!("start the writer: {e}")))?;
        let readers = {
            let path = path.clone();
            tokio::task::spawn_blocking(move || {
                (0..READERS)
                    .map(|_| open_reader(&path).map(Mutex::new))
                    .collect::<Result<Vec<_>, _>>()
            })
            .await
            .map_err(|e| StoreError::Backend(format!("open task failed: {e}")))??
        };
        let store = Self {
            conn,
            writes,
            readers: Arc::new(Readers {
                conns: readers,
                next: AtomicUsize::new(0),
            }),
            path: path.into(),
        };
        store.migrate().await?;
        Ok(store)
    }

    /// The database file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Runs the write `f` on the writer thread, in a group commit; answers once it
    /// is durable (or failed).
    async fn call<T, F>(&self, f: F) -> Result<T, StoreError>
    where
        T: Send + 'static,
        F: FnOnce(&mut Connection) -> Result<T, StoreError> + Send + 'static,
    {
        self.submit(f, false).await
    }

    /// Runs `f` alone on the writer's connection, outside any group: for work that
    /// manages its own transaction (migrations).
    async fn exclusive<T, F>(&self, f: F) -> Result<T, StoreError>
    where
        T: Send + 'static,
        F: FnOnce(&mut Connection) -> Result<T, StoreError> + Send + 'static,
    {
        self.submit(f, true).await
    }

    async fn submit<T, F>(&self, f: F, exclusive: bool) -> Result<T, StoreError>
    where
        T: Send + 'static,
        F: FnOnce(&mut Connection) -> Result<T, StoreError> + Send + 'static,
    {
        let (reply, answer) = oneshot::channel();
        let job = Job {
            f: Some(f),
            exclusive,
            result: None,
            reply,
        };
        self.writes
            .send(Box::new(job))
            .map_err(|_| StoreError::Backend("the database writer has stopped".into()))?;
        answer
            .await
            .map_err(|_| StoreError::Backend("the database writer has stopped".into()))?
    }

    /// Runs the read `f` on a read-only connection on the blocking pool.
    async fn read<T, F>(&self, f: F) -> Result<T, StoreError>
    where
        T: Send + 'static,
        F: FnOnce(&mut Connection) -> Result<T, StoreError> + Send + 'static,
    {
        let readers = Arc::clone(&self.readers);
        tokio::task::spawn_blocking(move || {
            let n = readers.conns.len();
            let start = readers.next.fetch_add(1, Ordering::Relaxed);
            // A free connection if there is one, else wait for ours.
            let mut conn = (0..n)
                .find_map(|i| readers.conns[(start + i) % n].try_lock().ok())
                .unwrap_or_else(|| {
                    readers.conns[start % n]
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner)
                });
            f(&mut conn)
        })
        .await
        .map_err(|e| StoreError::Backend(format!("database task failed: {e}")))?
    }

    /// Applies every migration the database lacks, in one immediate transaction.
    pub async fn migrate(&self) -> Result<(), StoreError> {
        self.exclusive(|c| {
            let tx = c
                .transaction_with_behavior(TransactionBehavior::Immediate)
                .map_err(sqlite_err)?;
            tx.execute(sql::CREATE_MIGRATIONS_TABLE, [])
                .map_err(sqlite_err)?;
            let applied: Vec<i64> = query_all(&tx, sql::APPLIED_VERSIONS, &[], |r| r.int(0))?;
            outcomes::check_not_newer(&applied)?;
            for m in MIGRATIONS.iter().filter(|m| !applied.contains(&m.version)) {
                tx.execute_batch(m.sqlite).map_err(|e| {
                    StoreError::Backend(format!("migration {} ({}): {e}", m.version, m.name))
                })?;
                exec(&tx, sql::RECORD_MIGRATION, &[&m.version, &m.name])?;
            }
            tx.commit().map_err(sqlite_err)
        })
        .await
    }

    /// Applied schema versions, oldest first.
    pub async fn schema_versions(&self) -> Result<Vec<i64>, StoreError> {
        self.read(|c| query_all(c, sql::APPLIED_VERSIONS, &[], |r| r.int(0)))
            .await
    }

    /// Creates a tenant; `Conflict` if the ID exists.
    pub async fn create_tenant(&self, t: &Tenant) -> Result<(), StoreError> {
        let t = t.clone();
        self.call(move |c| exec(c, sql::INSERT_TENANT, &[&t.id, &t.name, &t.created_at]).map(drop))
            .await
    }

    /// One tenant.
    pub async fn get_tenant(&self, id: &str) -> Result<Tenant, StoreError> {
        let id = id.to_owned();
        self.read(move |c| {
            let q = sql::select(rows::TENANT_COLUMNS, "tenants", "WHERE id = $1");
            query_one(c, &q, &[&id], |r| rows::tenant(r))?
                .ok_or_else(|| StoreError::NotFound(format!("tenant {id}")))
        })
        .await
    }

    /// Every tenant, oldest first.
    pub async fn list_tenants(&self) -> Result<Vec<Tenant>, StoreError> {
        self.read(|c| {
            let q = sql::select(rows::TENANT_COLUMNS, "tenants", "ORDER BY created_at, id");
            query_all(c, &q, &[], |r| rows::tenant(r))
        })
        .await
    }

    /// Stores an API key; `Conflict` if the ID exists, `NotFound` if the tenant does not.
    pub async fn insert_api_key(&self, k: &ApiKeyRecord) -> Result<(), StoreError> {
        let k = k.clone();
        self.call(move |c| {
            let params: Params = &[
                &k.id,
                &k.tenant,
                &k.hash.as_slice(),
                &k.admin,
                &k.created_at,
                &k.revoked_at,
            ];
            exec(c, sql::INSERT_API_KEY, params).map(drop)
        })
        .await
    }

    /// The key with this public ID, revoked or not.
    pub async fn find_api_key(&self, id: &str) -> Result<Option<ApiKeyRecord>, StoreError> {
        let id = id.to_owned();
        self.read(move |c| {
            let q = sql::select(rows::API_KEY_COLUMNS, "api_keys", "WHERE id = $1");
            query_one(c, &q, &[&id], |r| rows::api_key(r))
        })
        .await
    }

    /// A tenant's keys, oldest first.
    pub async fn list_api_keys(&self, tenant: &str) -> Result<Vec<ApiKeyRecord>, StoreError> {
        let tenant = tenant.to_owned();
        self.read(move |c| {
            let q = sql::select(
                rows::API_KEY_COLUMNS,
                "api_keys",
                "WHERE tenant = $1 ORDER BY created_at, id",
            );
            query_all(c, &q, &[&tenant], |r| rows::api_key(r))
        })
        .await
    }

    /// Revokes a key; `Ok(false)` if it already was.
    pub async fn revoke_api_key(&self, id: &str, now: i64) -> Result<bool, StoreError> {
        let id = id.to_owned();
        self.call(move |c| {
            if exec(c, sql::REVOKE_API_KEY, &[&id, &now])? == 1 {
                return Ok(true);
            }
            if exists(c, sql::API_KEY_EXISTS, &[&id])? {
                Ok(false)
            } else {
                Err(StoreError::NotFound(format!("api key {id}")))
            }
        })
        .await
    }

    /// Creates a sandbox; `Conflict` if the ID exists, `NotFound` if the tenant does not.
    pub async fn create_sandbox(&self, s: &SandboxRecord) -> Result<(), StoreError> {
        let (metadata, env) = rows::sandbox_json(s)?;
        let limits = rows::limits_json(s)?;
        let network = rows::network_json(&s.network)?;
        let generation = to_sql_int("generation", s.generation.get())?;
        let s = s.clone();
        self.call(move |c| {
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
            exec(c, sql::INSERT_SANDBOX, params).map(drop)
        })
        .await
    }

    /// See [`crate::Store::set_network`].
    pub async fn set_network(
        &self,
        id: &SandboxId,
        network: &crate::records::Policy,
    ) -> Result<(), StoreError> {
        let id = id.to_string();
        let network = rows::network_json(network)?;
        self.call(move |c| {
            let changed = exec(c, sql::SET_SANDBOX_NETWORK, &[&id, &network])?;
            let found = changed > 0 || exists(c, sql::SANDBOX_EXISTS, &[&id])?;
            outcomes::live_sandbox_outcome(changed, found, &id)
        })
        .await
    }

    /// See [`crate::Store::set_expiry`].
    pub async fn set_expiry(
        &self,
        id: &SandboxId,
        expires_at: Option<i64>,
    ) -> Result<(), StoreError> {
        let id = id.to_string();
        self.call(move |c| {
            let changed = exec(c, sql::SET_SANDBOX_EXPIRY, &[&id, &expires_at])?;
            let found = changed > 0 || exists(c, sql::SANDBOX_EXISTS, &[&id])?;
            outcomes::live_sandbox_outcome(changed, found, &id)
        })
        .await
    }

    /// One sandbox.
    pub async fn get_sandbox(&self, id: &SandboxId) -> Result<SandboxRecord, StoreError> {
        let id = id.to_string();
        self.read(move |c| {
            let q = sql::select(rows::SANDBOX_COLUMNS, "sandboxes", "WHERE id = $1");
            query_one(c, &q, &[&id], |r| rows::sandbox(r))?
                .ok_or_else(|| StoreError::NotFound(format!("sandbox {id}")))
        })
        .await
    }

    /// A tenant's sandboxes, oldest first.
    pub async fn list_sandboxes(&self, tenant: &str) -> Result<Vec<SandboxRecord>, StoreError> {
        let tenant = tenant.to_owned();
        self.read(move |c| {
            let q = sql::select(
                rows::SANDBOX_COLUMNS,
                "sandboxes",
                "WHERE tenant = $1 ORDER BY created_at, id",
            );
            query_all(c, &q, &[&tenant], |r| rows::sandbox(r))
        })
        .await
    }

    /// Sets a sandbox's state, only from `expected` when given.
    pub async fn set_sandbox_state(
        &self,
        id: &SandboxId,
        state: SandboxState,
        expected: Option<SandboxState>,
    ) -> Result<(), StoreError> {
        let id = id.to_string();
        self.call(move |c| {
            let changed = match expected {
                None => exec(c, sql::SET_SANDBOX_STATE, &[&id, &state.as_str()])?,
                Some(from) => exec(
                    c,
                    sql::SET_SANDBOX_STATE_IF,
                    &[&id, &state.as_str(), &from.as_str()],
                )?,
            };
            let found = changed > 0 || exists(c, sql::SANDBOX_EXISTS, &[&id])?;
            outcomes::cas_outcome(changed, found, || format!("sandbox {id}"))
        })
        .await
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
        let (standby, c2) = (standby.to_owned(), claim.clone());
        self.call(move |c| {
            let q = sql::claim_standby(rows::SANDBOX_COLUMNS, sql::Backend::Sqlite);
            query_one(
                c,
                &q,
                &[
                    &standby,
                    &c2.tenant,
                    &c2.created_at,
                    &c2.expires_at,
                    &metadata,
                    &c2.template,
                    &network,
                    &mode,
                ],
                |r| rows::sandbox(r),
            )
        })
        .await
    }

    /// See [`crate::Store::count_live_sandboxes`].
    pub async fn count_live_sandboxes(&self, tenant: &str) -> Result<u64, StoreError> {
        let tenant = tenant.to_owned();
        self.read(move |c| {
            let n = query_one(c, sql::COUNT_LIVE_BY_TENANT, &[&tenant], |r| r.int(0))?;
            Ok(n.unwrap_or(0).max(0) as u64)
        })
        .await
    }

    /// See [`crate::Store::count_standby_by_worker`].
    pub async fn count_standby_by_worker(
        &self,
        standby: &str,
    ) -> Result<Vec<crate::StandbyCount>, StoreError> {
        let standby = standby.to_owned();
        self.read(move |c| {
            let q =
                sql::count_standby_by_worker(&sql::network_mode(sql::Backend::Sqlite, "s.network"));
            let rows = query_all(c, &q, &[&standby], |r| {
                Ok((r.text(0)?, r.text(1)?, r.text(2)?, r.int(3)?))
            })?;
            outcomes::standby_counts(rows)
        })
        .await
    }

    /// Active sandboxes per worker; workers with none are absent.
    pub async fn count_active_by_worker(&self) -> Result<BTreeMap<WorkerId, u64>, StoreError> {
        self.read(|c| {
            let pairs = query_all(c, sql::COUNT_ACTIVE_BY_WORKER, &[], |r| {
                Ok((r.text(0)?, r.int(1)?))
            })?;
            outcomes::worker_counts(pairs)
        })
        .await
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
        let (sandbox, worker) = (*sandbox, worker.clone());
        self.call(move |c| {
            let sbx = sandbox.to_string();
            // Atomic as every write: its own savepoint in a group holding the write lock.
            let tx: &Connection = c;
            let next: Option<i64> = tx
                .query_row(&dollar_to_question(sql::NEXT_GENERATION), [&sbx], |r| {
                    r.get(0)
                })
                .optional()
                .map_err(sqlite_err)?;
            let Some(generation) = next else {
                let found = exists(tx, sql::SANDBOX_EXISTS, &[&sbx])?;
                return Err(outcomes::no_generation(found, &sbx));
            };
            let rec =
                outcomes::new_execution(sandbox, generation, execution_id, worker, substrate, now)?;
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
            exec(tx, sql::INSERT_EXECUTION, params)?;
            Ok(rec)
        })
        .await
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
        self.call(move |c| {
            let changed = match expected {
                None => exec(
                    c,
                    sql::SET_EXECUTION_STATE,
                    &[&sbx, &generation, &state.as_str(), &now],
                )?,
                Some(from) => exec(
                    c,
                    sql::SET_EXECUTION_STATE_IF,
                    &[&sbx, &generation, &state.as_str(), &now, &from.as_str()],
                )?,
            };
            let found = changed > 0 || exists(c, sql::EXECUTION_EXISTS, &[&sbx, &generation])?;
            outcomes::cas_outcome(changed, found, || format!("execution {sbx}@{generation}"))
        })
        .await
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
        self.call(move |c| {
            let params: Params = &[&sbx, &generation, &i64::from(activation), &pod_uid, &now];
            one_row(exec(c, sql::SET_EXECUTION_ACTIVATION, params)?, || {
                format!("execution {sbx}@{generation}")
            })
        })
        .await
    }

    /// One execution.
    pub async fn get_execution(
        &self,
        sandbox: &SandboxId,
        generation: Generation,
    ) -> Result<ExecutionRecord, StoreError> {
        let sbx = sandbox.to_string();
        let generation = to_sql_int("generation", generation.get())?;
        self.read(move |c| {
            let q = sql::select(
                rows::EXECUTION_COLUMNS,
                "executions",
                "WHERE sandbox = $1 AND generation = $2",
            );
            query_one(c, &q, &[&sbx, &generation], |r| rows::execution(r))?
                .ok_or_else(|| StoreError::NotFound(format!("execution {sbx}@{generation}")))
        })
        .await
    }

    /// The highest pending or running execution of a sandbox.
    pub async fn current_execution(
        &self,
        sandbox: &SandboxId,
    ) -> Result<Option<ExecutionRecord>, StoreError> {
        let sbx = sandbox.to_string();
        self.read(move |c| {
            let q = sql::select(
                rows::EXECUTION_COLUMNS,
                "executions",
                "WHERE sandbox = $1 AND state IN ('pending', 'running') \
                 ORDER BY generation DESC LIMIT 1",
            );
            query_one(c, &q, &[&sbx], |r| rows::execution(r))
        })
        .await
    }

    /// Every execution of a sandbox, by generation.
    pub async fn list_executions(
        &self,
        sandbox: &SandboxId,
    ) -> Result<Vec<ExecutionRecord>, StoreError> {
        let sbx = sandbox.to_string();
        self.read(move |c| {
            let q = sql::select(
                rows::EXECUTION_COLUMNS,
                "executions",
                "WHERE sandbox = $1 ORDER BY generation",
            );
            query_all(c, &q, &[&sbx], |r| rows::execution(r))
        })
        .await
    }

    /// Executions on a worker in any of `states` (all states when empty).
    pub async fn executions_on_worker(
        &self,
        worker: &WorkerId,
        states: &[ExecutionState],
    ) -> Result<Vec<ExecutionRecord>, StoreError> {
        let worker = worker.to_string();
        let states: Vec<&'static str> = states.iter().map(|s| s.as_str()).collect();
        self.read(move |c| {
            let q = sql::executions_on_worker_sql(states.len());
            let mut params: Vec<&dyn ToSql> = vec![&worker];
            params.extend(states.iter().map(|s| s as &dyn ToSql));
            query_all(c, &q, &params, |r| rows::execution(r))
        })
        .await
    }

    /// Stores a signing key; `Conflict` if the ID exists.
    pub async fn insert_signing_key(&self, k: &SigningKeyRecord) -> Result<(), StoreError> {
        let k = k.clone();
        self.call(move |c| {
            let params: Params = &[
                &k.key_id,
                &k.seed.as_slice(),
                &k.state.as_str(),
                &k.created_at,
                &k.not_before,
                &k.not_after,
            ];
            exec(c, sql::INSERT_SIGNING_KEY, params).map(drop)
        })
        .await
    }

    /// Every signing key, oldest first.
    pub async fn list_signing_keys(&self) -> Result<Vec<SigningKeyRecord>, StoreError> {
        self.read(|c| {
            let q = sql::select(
                rows::SIGNING_KEY_COLUMNS,
                "signing_keys",
                "ORDER BY created_at, key_id",
            );
            query_all(c, &q, &[], |r| rows::signing_key(r))
        })
        .await
    }

    /// Moves a signing key to `state`.
    pub async fn set_signing_key_state(
        &self,
        key_id: &str,
        state: KeyState,
    ) -> Result<(), StoreError> {
        let key_id = key_id.to_owned();
        self.call(move |c| {
            one_row(
                exec(c, sql::SET_SIGNING_KEY_STATE, &[&key_id, &state.as_str()])?,
                || format!("signing key {key_id}"),
            )
        })
        .await
    }

    /// Stores a key bundle if its version is newer than the stored one.
    pub async fn store_bundle(&self, version: u64, bytes: Vec<u8>) -> Result<(), StoreError> {
        let v = to_sql_int("bundle version", version)?;
        self.call(move |c| {
            outcomes::bundle_outcome(exec(c, sql::STORE_BUNDLE, &[&v, &bytes])?, version)
        })
        .await
    }

    /// The newest bundle.
    pub async fn latest_bundle(&self) -> Result<Option<(u64, Vec<u8>)>, StoreError> {
        self.read(|c| {
            query_one(c, sql::LATEST_BUNDLE, &[], |r| {
                Ok((outcomes::bundle_version(r.int(0)?)?, r.blob(1)?))
            })
        })
        .await
    }

    /// A setting.
    pub async fn kv_get(&self, name: &str) -> Result<Option<String>, StoreError> {
        let name = name.to_owned();
        self.read(move |c| query_one(c, sql::KV_GET, &[&name], |r| r.text(0)))
            .await
    }

    /// Sets a setting, replacing any value.
    pub async fn kv_set(&self, name: &str, value: &str) -> Result<(), StoreError> {
        let (name, value) = (name.to_owned(), value.to_owned());
        self.call(move |c| exec(c, sql::KV_SET, &[&name, &value]).map(drop))
            .await
    }

    /// Sets a setting only if it has no value; `Ok(true)` if this call set it.
    pub async fn kv_insert_if_absent(&self, name: &str, value: &str) -> Result<bool, StoreError> {
        let (name, value) = (name.to_owned(), value.to_owned());
        self.call(move |c| Ok(exec(c, sql::KV_INSERT_IF_ABSENT, &[&name, &value])? == 1))
            .await
    }
}

#[cfg(test)]
#[path = "sqlite_tests.rs"]
mod tests;
