//! Workers: registration, enrollment (a taken ID needs its credential) and the
//! per-worker update sequence.

use super::*;

impl SqliteStore {
    /// Registers or re-enrolls a worker and returns the stored record.
    pub async fn upsert_worker(&self, w: &WorkerRecord) -> Result<WorkerRecord, StoreError> {
        let w = w.clone();
        self.call(move |c| {
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
            exec(c, sql::UPSERT_WORKER, params)?;
            get_worker(c, &id)
        })
        .await
    }

    /// See [`crate::Store::enroll_worker`].
    pub async fn enroll_worker(
        &self,
        w: &WorkerRecord,
        proven: Option<[u8; 32]>,
    ) -> Result<WorkerRecord, StoreError> {
        let w = w.clone();
        self.call(move |c| {
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
                    exec(c, sql::ENROLL_NEW_WORKER, params)?
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
                    let n = exec(c, sql::REENROLL_WORKER, params)?;
                    if n == 0 {
                        get_worker(c, &id)?;
                    }
                    n
                }
            };
            outcomes::enroll_outcome(changed, proven.is_some(), &id)?;
            get_worker(c, &id)
        })
        .await
    }

    /// See [`crate::Store::reserve_update_seqs`].
    pub async fn reserve_update_seqs(&self, worker: &WorkerId, n: u64) -> Result<u64, StoreError> {
        let id = worker.to_string();
        let count = outcomes::seq_count(n)?;
        self.call(move |c| {
            let last: i64 = c
                .prepare_cached(&dollar_to_question(sql::RESERVE_UPDATE_SEQ))
                .and_then(|mut s| s.query_row(rusqlite::params![id, count], |r| r.get(0)))
                .map_err(sqlite_err)?;
            outcomes::reserved_seq(last, n)
        })
        .await
    }

    /// One worker.
    pub async fn get_worker(&self, id: &WorkerId) -> Result<WorkerRecord, StoreError> {
        let id = id.to_string();
        self.read(move |c| get_worker(c, &id)).await
    }

    /// Every worker, by ID.
    pub async fn list_workers(&self) -> Result<Vec<WorkerRecord>, StoreError> {
        self.read(|c| {
            let q = sql::select(rows::WORKER_COLUMNS, "workers", "ORDER BY id");
            query_all(c, &q, &[], |r| rows::worker(r))
        })
        .await
    }

    /// Changes a worker's state.
    pub async fn set_worker_state(
        &self,
        id: &WorkerId,
        state: WorkerState,
    ) -> Result<(), StoreError> {
        let id = id.to_string();
        self.call(move |c| {
            one_row(
                exec(c, sql::SET_WORKER_STATE, &[&id, &state.as_str()])?,
                || format!("worker {id}"),
            )
        })
        .await
    }

    /// Records a heartbeat.
    pub async fn touch_worker(&self, id: &WorkerId, now: i64) -> Result<(), StoreError> {
        let id = id.to_string();
        self.call(move |c| {
            one_row(exec(c, sql::TOUCH_WORKER, &[&id, &now])?, || {
                format!("worker {id}")
            })
        })
        .await
    }
}

pub(super) fn get_worker(c: &Connection, id: &str) -> Result<WorkerRecord, StoreError> {
    let q = sql::select(rows::WORKER_COLUMNS, "workers", "WHERE id = $1");
    query_one(c, &q, &[&id], |r| rows::worker(r))?
        .ok_or_else(|| StoreError::NotFound(format!("worker {id}")))
}
