//! Whether the worker can do its job, as its sync loop last saw it: enrolled with its
//! control plane, its start-up reconciliation done, and its latest sync through. Read
//! by node-api's `/readyz` ([`super::health`]).

use std::sync::Mutex;
use std::time::Duration;

use tokio::sync::watch;

/// Where the worker stands with its control plane, and whether it is still
/// re-adopting the executions it ran before a restart.
#[derive(Debug)]
pub struct Readiness {
    sync: Mutex<SyncState>,
    /// `true` from the start of a worker's start-up reconciliation to its end: the
    /// sandboxes it ran before a restart are in its records but not yet re-adopted
    /// (no bridge), so their requests wait ([`Readiness::adopted`]) rather than meet
    /// a 421 that sends the caller to the same route again.
    adopting: watch::Sender<bool>,
}

impl Default for Readiness {
    fn default() -> Self {
        Self {
            sync: Mutex::default(),
            adopting: watch::Sender::new(false),
        }
    }
}

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

    /// The start-up reconciliation begins: sandbox requests wait for its end.
    pub fn adopting(&self) {
        self.adopting.send_replace(true);
    }

    /// The start-up reconciliation is over (done or given up): nothing waits any more.
    pub fn adoption_over(&self) {
        self.adopting.send_replace(false);
    }

    /// Whether a start-up reconciliation is under way now (one atomic read; no wait).
    pub fn is_adopting(&self) -> bool {
        *self.adopting.borrow()
    }

    /// Waits (woken by [`Readiness::adoption_over`], not polling) until no start-up
    /// reconciliation is under way, for at most `within`; `false` when it still is.
    pub async fn adopted(&self, within: Duration) -> bool {
        let mut rx = self.adopting.subscribe();
        matches!(
            tokio::time::timeout(within, rx.wait_for(|adopting| !*adopting)).await,
            Ok(Ok(_))
        )
    }

    /// `Ok` when ready; otherwise why not, for people. `enrolled`: the worker holds
    /// the control plane's keys.
    pub fn check(&self, enrolled: bool) -> Result<(), &'static str> {
        match self.sync.lock().map_or(SyncState::NotYet, |s| *s) {
            SyncState::Synced => Ok(()),
            SyncState::NotYet if !enrolled => Err("not enrolled with its control plane yet"),
            SyncState::NotYet => Err("not synced with its control plane yet"),
            SyncState::Failed => Err("its last sync with the control plane failed"),
        }
    }

    fn set(&self, s: SyncState) {
        if let Ok(mut state) = self.sync.lock() {
            *state = s;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn requests_wait_for_the_end_of_a_start_up_reconciliation_and_no_longer() {
        let r = std::sync::Arc::new(Readiness::default());
        // No reconciliation under way (a worker built without one): nothing waits.
        assert!(!r.is_adopting());
        assert!(r.adopted(Duration::ZERO).await);
        r.adopting();
        assert!(r.is_adopting());
        assert!(!r.adopted(Duration::from_millis(20)).await);
        let waiter = {
            let r = std::sync::Arc::clone(&r);
            tokio::spawn(async move { r.adopted(Duration::from_secs(10)).await })
        };
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(!waiter.is_finished());
        r.adoption_over();
        assert!(waiter.await.unwrap());
    }

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
