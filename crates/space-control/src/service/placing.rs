//! Where a new execution goes: the load of each worker as placement sees it (the
//! [`LoadView`](super::load::LoadView)), and the create counted there until it ends.

use space_identity::WorkerId;
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
    ) -> Result<Placed<'_>, ControlError> {
        let worker = self.choose_worker(requested, None, true).await?;
        Ok(Placed { cp: self, worker })
    }

    /// Chooses a worker.
    pub async fn place(
        &self,
        requested: Option<&WorkerId>,
        exclude: Option<&WorkerId>,
    ) -> Result<WorkerRecord, ControlError> {
        self.choose_worker(requested, exclude, false).await
    }

    /// Chooses a worker; with `in_flight`, counts one more create on it in the same
    /// step, so that concurrent choices see each other.
    pub(super) async fn choose_worker(
        &self,
        requested: Option<&WorkerId>,
        exclude: Option<&WorkerId>,
        in_flight: bool,
    ) -> Result<WorkerRecord, ControlError> {
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
