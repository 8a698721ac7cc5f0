//! Where a new execution goes: the load of each worker as placement sees it (store
//! counts re-read at most once a second, plus creates in flight here), and warm-pool
//! estimates.

use super::*;

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

/// Sandboxes per worker for placement: the store's count, re-read at most every
/// [`LOAD_TTL`] (counting is a scan of every sandbox), plus the creates this process
/// has placed and not finished — so a burst of creates spreads over the workers
/// instead of reading the same stale count. (A create is counted twice between its
/// allocation and its end: placement errs on the side of the busier worker.) Worker
/// states are always read fresh: placement never picks a draining or dead worker.
///
/// It also estimates each worker's ready warm jails: the count its last install
/// acknowledgement reported, less the creates placed there since; an estimate older
/// than [`WARM_ESTIMATE_TTL`] is unknown (the pool refills between bursts).
#[derive(Debug, Default)]
pub(super) struct LoadView {
    read_at: Option<std::time::Instant>,
    counted: BTreeMap<WorkerId, u64>,
    in_flight: BTreeMap<WorkerId, u64>,
    warm: BTreeMap<WorkerId, (std::time::Instant, u32)>,
}

impl LoadView {
    pub(super) fn is_stale(&self) -> bool {
        self.read_at.is_none_or(|t| t.elapsed() >= LOAD_TTL)
    }

    pub(super) fn refresh(&mut self, counted: BTreeMap<WorkerId, u64>) {
        self.counted = counted;
        self.read_at = Some(std::time::Instant::now());
    }

    pub(super) fn load(&self, w: &WorkerId) -> u64 {
        self.counted.get(w).copied().unwrap_or(0) + self.in_flight.get(w).copied().unwrap_or(0)
    }

    /// Whether `w` may have a warm jail for one more create (unknown counts as yes).
    pub(super) fn may_be_warm(&self, w: &WorkerId) -> bool {
        match self.warm.get(w) {
            Some((at, n)) if at.elapsed() < WARM_ESTIMATE_TTL => *n > 0,
            _ => true,
        }
    }

    pub(super) fn placed_on(&mut self, w: &WorkerId) {
        *self.in_flight.entry(w.clone()).or_default() += 1;
        if let Some((_, n)) = self.warm.get_mut(w) {
            *n = n.saturating_sub(1);
        }
    }

    /// `ready` as reported by an install's acknowledgement, while that create is still
    /// in flight: the other creates in flight there take from it too.
    pub(super) fn reported_warm(&mut self, w: &WorkerId, ready: u32) {
        let others = self
            .in_flight
            .get(w)
            .copied()
            .unwrap_or(1)
            .saturating_sub(1);
        let left = u64::from(ready).saturating_sub(others);
        self.warm.insert(
            w.clone(),
            (std::time::Instant::now(), u32::try_from(left).unwrap_or(0)),
        );
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
        if let Some(n) = view.in_flight.get_mut(&self.worker.id) {
            *n = n.saturating_sub(1);
        }
    }
}
