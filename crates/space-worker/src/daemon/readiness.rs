//! Whether the worker can do its job, as its sync loop last saw it: enrolled with its
//! control plane, its start-up reconciliation done, and its latest sync through. Read
//! by node-api's `/readyz` ([`super::health`]).

use std::sync::Mutex;

/// Where the worker stands with its control plane.
#[derive(Debug, Default)]
pub struct Readiness(Mutex<SyncState>);

#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
enum SyncState {
    /// The start-up sync (with its reconciliation) has not finished yet.
    #[default]
    NotYet,
    /// The latest sync went through.
    Synced,
    /// The latest sync failed.
    Failed,
}

impl Readiness {
    /// A sync (the start-up one, with its reconciliation, or a periodic one) went
    /// through.
    pub fn synced(&self) {
        self.set(SyncState::Synced);
    }

    /// A periodic sync failed: the control plane did not answer, or refused it.
    pub fn sync_failed(&self) {
        self.set(SyncState::Failed);
    }

    /// `Ok` when ready; otherwise why not, for people. `enrolled`: the worker holds
    /// the control plane's keys.
    pub fn check(&self, enrolled: bool) -> Result<(), &'static str> {
        match self.0.lock().map_or(SyncState::NotYet, |s| *s) {
            SyncState::Synced => Ok(()),
            SyncState::NotYet if !enrolled => Err("not enrolled with its control plane yet"),
            SyncState::NotYet => Err("not synced with its control plane yet"),
            SyncState::Failed => Err("its last sync with the control plane failed"),
        }
    }

    fn set(&self, s: SyncState) {
        if let Ok(mut state) = self.0.lock() {
            *state = s;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_worker_is_not_ready_before_its_first_sync_enrolled_or_not() {
        let r = Readiness::default();
        assert_eq!(
            r.check(false),
            Err("not enrolled with its control plane yet")
        );
        // Keys kept from before a restart are not a sync.
        assert_eq!(r.check(true), Err("not synced with its control plane yet"));
    }

    #[test]
    fn a_failed_sync_makes_a_ready_worker_not_ready_until_one_goes_through() {
        let r = Readiness::default();
        r.synced();
        assert_eq!(r.check(true), Ok(()));
        r.sync_failed();
        assert_eq!(
            r.check(true),
            Err("its last sync with the control plane failed")
        );
        r.synced();
        assert_eq!(r.check(true), Ok(()));
    }
}
