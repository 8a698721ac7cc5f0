//! The load of each worker as placement sees it: store counts re-read at most once a
//! second, plus creates in flight here, and warm-pool estimates.

use std::collections::BTreeMap;
use std::time::Duration;

use space_identity::WorkerId;

/// How long placement trusts the store's count of sandboxes per worker.
const LOAD_TTL: Duration = Duration::from_secs(1);

/// How long a worker's reported count of warm jails guides placement.
const WARM_ESTIMATE_TTL: Duration = Duration::from_secs(2);

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

    /// A create placed on `w` ended (its [`Placed`](super::placing::Placed) dropped).
    pub(super) fn finished_on(&mut self, w: &WorkerId) {
        if let Some(n) = self.in_flight.get_mut(w) {
            *n = n.saturating_sub(1);
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
