//! Enrollment and the per-worker update sequence.

use std::collections::BTreeSet;

use space_store::{StoreError, WorkerState};

use crate::fixture::{Fixture, NOW, worker, worker_id};

pub async fn enrolling_a_taken_worker_id_needs_the_credential_it_holds(f: &Fixture) {
    let store = f.open().await;
    let first = worker("worker-a");
    assert_eq!(store.enroll_worker(&first, None).await.unwrap(), first);

    // The enrollment secret alone (no proven credential) cannot take the ID over.
    let mut rogue = worker("worker-a");
    rogue.url = "http://127.0.0.1:6666".into();
    rogue.credential_hash = [66; 32];
    assert!(matches!(
        store.enroll_worker(&rogue, None).await,
        Err(StoreError::Conflict(_))
    ));
    // Nor can a credential the worker does not hold.
    assert!(matches!(
        store.enroll_worker(&rogue, Some([66; 32])).await,
        Err(StoreError::Conflict(_))
    ));
    assert_eq!(store.get_worker(&first.id).await.unwrap(), first);

    // The worker itself, restarting: new URL and state, same credential and first
    // registration.
    let mut again = worker("worker-a");
    again.url = "http://127.0.0.1:7200".into();
    again.state = WorkerState::Active;
    again.registered_at = NOW + 100;
    again.last_seen = NOW + 100;
    let stored = store
        .enroll_worker(&again, Some(first.credential_hash))
        .await
        .unwrap();
    assert_eq!(
        (
            stored.url.as_str(),
            stored.credential_hash,
            stored.registered_at,
            stored.last_seen
        ),
        (
            "http://127.0.0.1:7200",
            first.credential_hash,
            NOW,
            NOW + 100
        )
    );
    // A proven re-enrollment of an ID nobody enrolled is not found.
    assert!(matches!(
        store
            .enroll_worker(&worker("worker-z"), Some([1; 32]))
            .await,
        Err(StoreError::NotFound(_))
    ));
}

pub async fn update_sequences_start_at_1_only_grow_per_worker_and_survive_reopening(f: &Fixture) {
    let store = f.open().await;
    let (a, b) = (worker_id("worker-a"), worker_id("worker-b"));
    assert_eq!(store.reserve_update_seqs(&a, 1).await.unwrap(), 1);
    assert_eq!(store.reserve_update_seqs(&a, 3).await.unwrap(), 4);
    assert_eq!(store.reserve_update_seqs(&b, 1).await.unwrap(), 1);
    assert!(store.reserve_update_seqs(&a, 0).await.is_err());
    drop(store);
    let reopened = f.open().await;
    assert_eq!(reopened.reserve_update_seqs(&a, 1).await.unwrap(), 5);
}

pub async fn two_control_planes_reserving_update_sequences_never_share_one(f: &Fixture) {
    const PER_PLANE: u64 = 50;
    let plane_a = f.open().await;
    let plane_b = f.open().await;
    let w = worker_id("worker-a");
    let mut tasks = Vec::new();
    for i in 0..PER_PLANE * 2 {
        let store = if i % 2 == 0 { &plane_a } else { &plane_b }.clone();
        let w = w.clone();
        // Some reserve one, some a batch of three (a worker's sync).
        let n = if i % 5 == 0 { 3 } else { 1 };
        tasks.push(tokio::spawn(async move {
            let last = store.reserve_update_seqs(&w, n).await.expect("reserve");
            (last + 1 - n..=last).collect::<Vec<u64>>()
        }));
    }
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await.expect("task"));
    }
    let distinct: BTreeSet<u64> = all.iter().copied().collect();
    assert_eq!(
        distinct.len(),
        all.len(),
        "a sequence number was handed out twice"
    );
    let expected: BTreeSet<u64> = (1..=all.len() as u64).collect();
    assert_eq!(distinct, expected, "sequence numbers have gaps");
}
