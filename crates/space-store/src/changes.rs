//! Notifications of lifecycle changes: whoever waits for a sandbox to settle (the edge
//! resolving a route during a migration, say) subscribes here before it reads the
//! store, and is woken when a state of that sandbox or of one of its executions is
//! written — no polling.
//!
//! In-process: every [`crate::Store`] of this process notifies after a successful write.
//! Sandbox IDs are random and unique, so one registry serves every store of the
//! process; a change written by another process (a second control-plane replica on
//! the same PostgreSQL) arrives through [`crate::PgStore`]'s `LISTEN` connection,
//! which notifies here too. A notification says only "look again": a waiter re-reads
//! the store, so a spurious one costs a read and a lost one is bounded by the
//! waiter's own deadline.

use std::collections::HashMap;
use std::sync::{Arc, LazyLock, Mutex, PoisonError};

use space_identity::SandboxId;
use tokio::sync::watch;

/// Subscribers per sandbox; an entry lives while someone holds a [`Subscription`].
static REGISTRY: LazyLock<Mutex<HashMap<SandboxId, Arc<watch::Sender<u64>>>>> =
    LazyLock::new(|| Mutex::new(HashMap::new()));

/// A subscription to one sandbox's changes.
#[derive(Debug)]
pub struct Subscription {
    sandbox: SandboxId,
    rx: watch::Receiver<u64>,
}

impl Subscription {
    /// Waits for the next change after the subscription was taken (or after the last
    /// one this returned for). Returns at once if one already happened.
    pub async fn changed(&mut self) {
        // The sender lives in the registry while this receiver does.
        let _ = self.rx.changed().await;
    }
}

impl Drop for Subscription {
    fn drop(&mut self) {
        let mut map = REGISTRY.lock().unwrap_or_else(PoisonError::into_inner);
        // Ours is the last receiver: the registry's sender has no one left to wake.
        if map
            .get(&self.sandbox)
            .is_some_and(|tx| tx.receiver_count() <= 1)
        {
            map.remove(&self.sandbox);
        }
    }
}

/// Subscribes to `sandbox`'s changes. Take it *before* reading the state it waits on,
/// so a change written in between is not missed.
pub fn subscribe(sandbox: &SandboxId) -> Subscription {
    let mut map = REGISTRY.lock().unwrap_or_else(PoisonError::into_inner);
    let tx = map
        .entry(*sandbox)
        .or_insert_with(|| Arc::new(watch::Sender::new(0)));
    Subscription {
        sandbox: *sandbox,
        rx: tx.subscribe(),
    }
}

/// Wakes every subscriber of `sandbox` (nothing happens when there is none).
pub fn notify(sandbox: &SandboxId) {
    let map = REGISTRY.lock().unwrap_or_else(PoisonError::into_inner);
    if let Some(tx) = map.get(sandbox) {
        tx.send_modify(|n| *n = n.wrapping_add(1));
    }
}

/// Subscribers registered now (tests: the registry does not grow with every sandbox).
pub fn watched() -> usize {
    REGISTRY
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .len()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn sandbox(n: u8) -> SandboxId {
        SandboxId::from_bytes([n; 16])
    }

    #[tokio::test]
    async fn a_change_written_after_subscribing_wakes_the_waiter() {
        let s = sandbox(1);
        let mut sub = subscribe(&s);
        let waiter = tokio::spawn(async move {
            sub.changed().await;
        });
        tokio::time::sleep(Duration::from_millis(20)).await;
        notify(&s);
        tokio::time::timeout(Duration::from_secs(5), waiter)
            .await
            .expect("woken")
            .expect("joined");
    }

    #[tokio::test]
    async fn a_change_between_subscribing_and_waiting_is_not_lost() {
        let s = sandbox(2);
        let mut sub = subscribe(&s);
        notify(&s);
        tokio::time::timeout(Duration::from_secs(5), sub.changed())
            .await
            .expect("the earlier change is seen");
    }

    #[tokio::test]
    async fn another_sandbox_change_does_not_wake_the_waiter() {
        let (a, b) = (sandbox(3), sandbox(4));
        let mut sub = subscribe(&a);
        notify(&b);
        assert!(
            tokio::time::timeout(Duration::from_millis(50), sub.changed())
                .await
                .is_err()
        );
    }

    #[test]
    fn the_registry_forgets_a_sandbox_nobody_waits_for() {
        let s = sandbox(5);
        let one = subscribe(&s);
        let two = subscribe(&s);
        drop(one);
        assert!(REGISTRY.lock().unwrap().contains_key(&s));
        drop(two);
        assert!(!REGISTRY.lock().unwrap().contains_key(&s));
        notify(&s);
        assert!(!REGISTRY.lock().unwrap().contains_key(&s));
    }
}
