//! Choosing a worker for a new execution: pure, so every rule is testable.

use space_identity::WorkerId;

/// A worker as placement sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Candidate {
    /// ID.
    pub id: WorkerId,
    /// Whether it takes new executions (not draining, not dead).
    pub active: bool,
    /// Sandboxes it may hold.
    pub capacity: u32,
    /// Sandboxes it holds.
    pub load: u32,
    /// Whether it can start a sandbox from a warm jail (or may: unknown counts as yes).
    pub warm: bool,
}

/// Why no worker was chosen.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PlacementError {
    /// The requested worker is not registered.
    #[error("worker {0} is not registered")]
    UnknownWorker(WorkerId),
    /// The requested worker is draining or dead.
    #[error("worker {0} does not take new sandboxes (draining or dead)")]
    Unavailable(WorkerId),
    /// The requested worker, or every worker, is full.
    #[error("no worker has capacity")]
    Full,
}

/// Picks the least-loaded active worker with room (ties broken by ID so the choice is
/// deterministic), preferring workers that can start it from a warm jail; or the
/// explicitly requested one if it is active and has room. `exclude` is never chosen
/// (the current worker, for a migration).
pub fn choose(
    candidates: &[Candidate],
    requested: Option<&WorkerId>,
    exclude: Option<&WorkerId>,
) -> Result<WorkerId, PlacementError> {
    if let Some(want) = requested {
        let c = candidates
            .iter()
            .find(|c| &c.id == want)
            .ok_or_else(|| PlacementError::UnknownWorker(want.clone()))?;
        if !c.active {
            return Err(PlacementError::Unavailable(want.clone()));
        }
        if c.load >= c.capacity {
            return Err(PlacementError::Full);
        }
        return Ok(c.id.clone());
    }
    candidates
        .iter()
        .filter(|c| c.active && c.load < c.capacity && Some(&c.id) != exclude)
        .min_by(|a, b| {
            // Compare load / capacity without floating point.
            let l = u64::from(a.load) * u64::from(b.capacity);
            let r = u64::from(b.load) * u64::from(a.capacity);
            b.warm
                .cmp(&a.warm)
                .then(l.cmp(&r))
                .then_with(|| a.id.cmp(&b.id))
        })
        .map(|c| c.id.clone())
        .ok_or(PlacementError::Full)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn c(id: &str, active: bool, capacity: u32, load: u32) -> Candidate {
        Candidate {
            id: id.parse().unwrap(),
            active,
            capacity,
            load,
            warm: true,
        }
    }

    #[test]
    fn least_loaded_active_worker_is_chosen() {
        let ws = [
            c("w1", true, 10, 5),
            c("w2", true, 10, 2),
            c("w3", false, 10, 0),
        ];
        assert_eq!(choose(&ws, None, None).unwrap().as_str(), "w2");
    }

    #[test]
    fn draining_or_dead_worker_is_never_chosen_even_when_requested() {
        let ws = [c("w1", false, 10, 0), c("w2", true, 10, 9)];
        assert_eq!(choose(&ws, None, None).unwrap().as_str(), "w2");
        assert_eq!(
            choose(&ws, Some(&"w1".parse().unwrap()), None),
            Err(PlacementError::Unavailable("w1".parse().unwrap()))
        );
    }

    #[test]
    fn explicit_worker_is_honoured() {
        let ws = [c("w1", true, 10, 9), c("w2", true, 10, 0)];
        assert_eq!(
            choose(&ws, Some(&"w1".parse().unwrap()), None)
                .unwrap()
                .as_str(),
            "w1"
        );
        assert!(matches!(
            choose(&ws, Some(&"w9".parse().unwrap()), None),
            Err(PlacementError::UnknownWorker(_))
        ));
    }

    #[test]
    fn full_workers_are_skipped_and_all_full_is_an_error() {
        let ws = [c("w1", true, 2, 2), c("w2", true, 1, 0)];
        assert_eq!(choose(&ws, None, None).unwrap().as_str(), "w2");
        assert_eq!(
            choose(&[c("w1", true, 1, 1)], None, None),
            Err(PlacementError::Full)
        );
    }

    #[test]
    fn a_worker_with_warm_jails_is_preferred_over_a_less_loaded_one_without() {
        let mut cold = c("w1", true, 10, 1);
        cold.warm = false;
        let ws = [cold.clone(), c("w2", true, 10, 5)];
        assert_eq!(choose(&ws, None, None).unwrap().as_str(), "w2");
        // Without warm jails anywhere, load decides again; a full worker stays out.
        let mut busy = c("w2", true, 10, 5);
        busy.warm = false;
        assert_eq!(
            choose(&[cold.clone(), busy], None, None).unwrap().as_str(),
            "w1"
        );
        let full = c("w2", true, 5, 5);
        assert_eq!(choose(&[cold, full], None, None).unwrap().as_str(), "w1");
    }

    #[test]
    fn excluded_worker_is_not_chosen() {
        let ws = [c("w1", true, 10, 0), c("w2", true, 10, 5)];
        assert_eq!(
            choose(&ws, None, Some(&"w1".parse().unwrap()))
                .unwrap()
                .as_str(),
            "w2"
        );
    }
}
