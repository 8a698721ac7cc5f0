//! Where a new execution goes: the load of each worker as placement sees it (the
//! [`LoadView`](super::load::LoadView)), and the create counted there until it ends.
//! Only workers of the sandbox's substrate are candidates: a sandbox keeps the
//! substrate of its first execution for every later one.

use space_identity::{Substrate, WorkerId};
use space_store::{WorkerRecord, WorkerState};

use super::plane::ControlPlane;
use crate::error::ControlError;
use crate::placement::{self, Candidate};

impl ControlPlane {
    /// Chooses a worker for a new sandbox, counted as in flight there until the
    /// returned guard is dropped.
    pub(super) async fn place_create(
        &self,
        requested: Option<&WorkerId>,
        substrate: Substrate,
    ) -> Result<Placed<'_>, ControlError> {
        let worker = self.choose_worker(requested, None, true, substrate).await?;
        Ok(Placed { cp: self, worker })
    }

    /// Chooses a worker of `substrate`.
    pub async fn place(
        &self,
        requested: Option<&WorkerId>,
        exclude: Option<&WorkerId>,
        substrate: Substrate,
    ) -> Result<WorkerRecord, ControlError> {
        self.choose_worker(requested, exclude, false, substrate)
            .await
    }

    /// The substrate of a create that names none.
    pub fn default_substrate(&self) -> Substrate {
        *self
            .default_substrate
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Sets [`ControlPlane::default_substrate`].
    pub fn set_default_substrate(&self, substrate: Substrate) {
        *self
            .default_substrate
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = substrate;
    }

    /// Chooses a worker of `substrate`; with `in_flight`, counts one more create on it
    /// in the same step, so that concurrent choices see each other.
    pub(super) async fn choose_worker(
        &self,
        requested: Option<&WorkerId>,
        exclude: Option<&WorkerId>,
        in_flight: bool,
        substrate: Substrate,
    ) -> Result<WorkerRecord, ControlError> {
        let workers = self.store.list_workers().await?;
        substrate_offered(&workers, requested, substrate)?;
        let workers: Vec<WorkerRecord> = workers
            .into_iter()
            .filter(|w| w.substrate == substrate)
            .collect();
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
            placement::PlacementError::UnknownWorker(_) => ControlError::BadRequest(e.to_string()),
            _ => ControlError::Unavailable(e.to_string()),
        })?;
        if in_flight {
            view.placed_on(&chosen);
        }
        drop(view);
        workers
            .into_iter()
            .find(|w| w.id == chosen)
            .ok_or_else(|| ControlError::Unavailable(format!("worker {chosen} is gone")))
    }
}

/// Refuses a `substrate` no registered worker runs, or a requested worker of another
/// substrate, saying what there is.
fn substrate_offered(
    workers: &[WorkerRecord],
    requested: Option<&WorkerId>,
    substrate: Substrate,
) -> Result<(), ControlError> {
    if let Some(w) = requested.and_then(|r| workers.iter().find(|w| &w.id == r)) {
        if w.substrate != substrate {
            return Err(ControlError::Conflict(format!(
                "worker {} runs {} sandboxes, not {substrate}",
                w.id, w.substrate
            )));
        }
        return Ok(());
    }
    if workers.is_empty() || workers.iter().any(|w| w.substrate == substrate) {
        return Ok(());
    }
    let mut offered: Vec<&str> = workers.iter().map(|w| w.substrate.as_str()).collect();
    offered.sort_unstable();
    offered.dedup();
    Err(ControlError::BadRequest(format!(
        "no worker of this platform runs {substrate} sandboxes (its workers run: {})",
        offered.join(", ")
    )))
}

/// A create placed on `worker` and not finished: counted by placement until dropped.
pub(super) struct Placed<'a> {
    cp: &'a ControlPlane,
    pub(super) worker: WorkerRecord,
}

impl Drop for Placed<'_> {
    fn drop(&mut self) {
        let mut view = self
            .cp
            .load
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        view.finished_on(&self.worker.id);
    }
}
