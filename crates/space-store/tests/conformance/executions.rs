//! Generations, executions and placement counts.

use std::collections::{BTreeMap, BTreeSet};

use space_identity::{Generation, PodUid, Substrate};
use space_store::{ExecutionState, SandboxState, StoreError};

use crate::fixture::{self, Fixture, NOW, execution_id, sandbox_id, with_sandbox, worker_id};

pub async fn allocate_execution_gives_1_2_3_and_a_failed_execution_keeps_its_number(f: &Fixture) {
    let store = f.open().await;
    let id = with_sandbox(&store, 1).await;
    let w = worker_id("worker-a");
    assert_eq!(
        store.get_sandbox(&id).await.unwrap().generation,
        Generation(0)
    );

    let first = store
        .allocate_execution(&id, execution_id(), &w, Substrate::Jail, NOW)
        .await
        .unwrap();
    assert_eq!(first.generation, Generation(1));
    assert_eq!(first.state, ExecutionState::Pending);
    assert_eq!((first.activation, first.pod_uid), (1, None));
    assert_eq!((first.created_at, first.updated_at), (NOW, NOW));

    // The start fails: its number stays consumed.
    store
        .set_execution_state(&id, Generation(1), ExecutionState::Failed, None, NOW + 1)
        .await
        .unwrap();
    let second = store
        .allocate_execution(&id, execution_id(), &w, Substrate::Jail, NOW + 2)
        .await
        .unwrap();
    assert_eq!(second.generation, Generation(2));
    let third = store
        .allocate_execution(&id, execution_id(), &w, Substrate::Jail, NOW + 3)
        .await
        .unwrap();
    assert_eq!(third.generation, Generation(3));

    assert_eq!(
        store.get_sandbox(&id).await.unwrap().generation,
        Generation(3)
    );
    let states: Vec<(u64, ExecutionState)> = store
        .list_executions(&id)
        .await
        .unwrap()
        .iter()
        .map(|e| (e.generation.get(), e.state))
        .collect();
    assert_eq!(
        states,
        vec![
            (1, ExecutionState::Failed),
            (2, ExecutionState::Pending),
            (3, ExecutionState::Pending)
        ]
    );

    // Generations are per sandbox.
    let other = with_sandbox(&store, 2).await;
    let e = store
        .allocate_execution(&other, execution_id(), &w, Substrate::Jail, NOW)
        .await
        .unwrap();
    assert_eq!(e.generation, Generation(1));
}

pub async fn an_execution_id_used_twice_conflicts_and_consumes_no_generation(f: &Fixture) {
    let store = f.open().await;
    let a = with_sandbox(&store, 1).await;
    let b = with_sandbox(&store, 2).await;
    let w = worker_id("worker-a");
    let reused = execution_id();
    store
        .allocate_execution(&a, reused, &w, Substrate::Jail, NOW)
        .await
        .unwrap();
    let res = store
        .allocate_execution(&b, reused, &w, Substrate::Jail, NOW)
        .await;
    assert!(matches!(res, Err(StoreError::Conflict(_))), "{res:?}");
    // The refused allocation rolled back with its increment.
    assert_eq!(
        store.get_sandbox(&b).await.unwrap().generation,
        Generation(0)
    );
    let next = store
        .allocate_execution(&b, execution_id(), &w, Substrate::Jail, NOW)
        .await
        .unwrap();
    assert_eq!(next.generation, Generation(1));
}

pub async fn a_stopped_or_missing_sandbox_gets_no_generation(f: &Fixture) {
    let store = f.open().await;
    let id = with_sandbox(&store, 1).await;
    let w = worker_id("worker-a");
    store
        .set_sandbox_state(&id, SandboxState::Stopped, None)
        .await
        .unwrap();
    let res = store
        .allocate_execution(&id, execution_id(), &w, Substrate::Jail, NOW)
        .await;
    assert!(matches!(res, Err(StoreError::Conflict(_))), "{res:?}");
    assert_eq!(
        store.get_sandbox(&id).await.unwrap().generation,
        Generation(0)
    );

    let res = store
        .allocate_execution(&sandbox_id(99), execution_id(), &w, Substrate::Jail, NOW)
        .await;
    assert!(matches!(res, Err(StoreError::NotFound(_))), "{res:?}");
}

pub async fn execution_state_change_with_a_stale_expected_state_is_refused(f: &Fixture) {
    let store = f.open().await;
    let id = with_sandbox(&store, 1).await;
    let w = worker_id("worker-a");
    store
        .allocate_execution(&id, execution_id(), &w, Substrate::Jail, NOW)
        .await
        .unwrap();

    store
        .set_execution_state(
            &id,
            Generation(1),
            ExecutionState::Running,
            Some(ExecutionState::Pending),
            NOW + 5,
        )
        .await
        .unwrap();
    let stale = store
        .set_execution_state(
            &id,
            Generation(1),
            ExecutionState::Failed,
            Some(ExecutionState::Pending),
            NOW + 6,
        )
        .await;
    assert!(matches!(stale, Err(StoreError::Conflict(_))), "{stale:?}");
    let stored = store.get_execution(&id, Generation(1)).await.unwrap();
    assert_eq!(
        (stored.state, stored.updated_at),
        (ExecutionState::Running, NOW + 5)
    );

    assert!(matches!(
        store
            .set_execution_state(&id, Generation(2), ExecutionState::Retired, None, NOW)
            .await,
        Err(StoreError::NotFound(_))
    ));
}

pub async fn current_execution_ignores_failed_and_retired_executions(f: &Fixture) {
    let store = f.open().await;
    let id = with_sandbox(&store, 1).await;
    let w = worker_id("worker-a");
    assert_eq!(store.current_execution(&id).await.unwrap(), None);

    for _ in 0..3 {
        store
            .allocate_execution(&id, execution_id(), &w, Substrate::Jail, NOW)
            .await
            .unwrap();
    }
    store
        .set_execution_state(&id, Generation(1), ExecutionState::Running, None, NOW)
        .await
        .unwrap();
    assert_eq!(current_generation(&store, &id).await, Some(3));

    store
        .set_execution_state(&id, Generation(3), ExecutionState::Failed, None, NOW)
        .await
        .unwrap();
    assert_eq!(current_generation(&store, &id).await, Some(2));
    store
        .set_execution_state(&id, Generation(2), ExecutionState::Retired, None, NOW)
        .await
        .unwrap();
    assert_eq!(current_generation(&store, &id).await, Some(1));
    store
        .set_execution_state(&id, Generation(1), ExecutionState::Retired, None, NOW)
        .await
        .unwrap();
    assert_eq!(current_generation(&store, &id).await, None);
}

async fn current_generation(
    store: &space_store::Store,
    id: &space_identity::SandboxId,
) -> Option<u64> {
    store
        .current_execution(id)
        .await
        .unwrap()
        .map(|e| e.generation.get())
}

pub async fn executions_on_worker_filters_by_state(f: &Fixture) {
    let store = f.open().await;
    let a = with_sandbox(&store, 1).await;
    let b = with_sandbox(&store, 2).await;
    let (wa, wb) = (worker_id("worker-a"), worker_id("worker-b"));
    store
        .allocate_execution(&a, execution_id(), &wa, Substrate::Jail, NOW)
        .await
        .unwrap();
    store
        .allocate_execution(&b, execution_id(), &wa, Substrate::Jail, NOW)
        .await
        .unwrap();
    store
        .allocate_execution(&b, execution_id(), &wb, Substrate::Jail, NOW)
        .await
        .unwrap();
    store
        .set_execution_state(&a, Generation(1), ExecutionState::Running, None, NOW)
        .await
        .unwrap();
    store
        .set_execution_state(&b, Generation(1), ExecutionState::Retired, None, NOW)
        .await
        .unwrap();

    let keys = |v: Vec<space_store::ExecutionRecord>| -> Vec<(String, u64)> {
        v.into_iter()
            .map(|e| (e.sandbox.to_string(), e.generation.get()))
            .collect()
    };
    let all = store.executions_on_worker(&wa, &[]).await.unwrap();
    assert_eq!(keys(all), vec![(a.to_string(), 1), (b.to_string(), 1)]);
    let live = store
        .executions_on_worker(&wa, &[ExecutionState::Pending, ExecutionState::Running])
        .await
        .unwrap();
    assert_eq!(keys(live), vec![(a.to_string(), 1)]);
    let retired = store
        .executions_on_worker(&wa, &[ExecutionState::Retired])
        .await
        .unwrap();
    assert_eq!(keys(retired), vec![(b.to_string(), 1)]);
    let on_b = store.executions_on_worker(&wb, &[]).await.unwrap();
    assert_eq!(keys(on_b), vec![(b.to_string(), 2)]);
    assert!(
        store
            .executions_on_worker(&worker_id("worker-z"), &[])
            .await
            .unwrap()
            .is_empty()
    );
}

pub async fn activation_and_pod_uid_updates_are_stored(f: &Fixture) {
    let store = f.open().await;
    let id = with_sandbox(&store, 1).await;
    store
        .allocate_execution(
            &id,
            execution_id(),
            &worker_id("node-1"),
            Substrate::Kubernetes,
            NOW,
        )
        .await
        .unwrap();
    let pod: PodUid = "0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0".parse().unwrap();
    store
        .set_execution_activation(&id, Generation(1), 2, Some(pod), NOW + 9)
        .await
        .unwrap();
    let stored = store.get_execution(&id, Generation(1)).await.unwrap();
    assert_eq!(
        (stored.activation, stored.pod_uid, stored.updated_at),
        (2, Some(pod), NOW + 9)
    );
    assert_eq!(stored.substrate, Substrate::Kubernetes);
    assert!(matches!(
        store
            .set_execution_activation(&id, Generation(2), 1, None, NOW)
            .await,
        Err(StoreError::NotFound(_))
    ));
}

pub async fn count_active_by_worker_counts_only_current_executions_of_live_sandboxes(f: &Fixture) {
    let store = f.open().await;
    let (wa, wb) = (worker_id("worker-a"), worker_id("worker-b"));
    let mut ids = Vec::new();
    for n in 1..=5 {
        ids.push(with_sandbox(&store, n).await);
    }
    let alloc = |id, w| {
        let store = store.clone();
        let w = worker_id(w);
        async move {
            store
                .allocate_execution(id, execution_id(), &w, Substrate::Jail, NOW)
                .await
                .unwrap()
        }
    };
    // 1: running on a.  2: pending on a.  3: moved from a to b (a's retired).
    // 4: on b but the sandbox is stopped.  5: its only execution failed.
    alloc(&ids[0], "worker-a").await;
    alloc(&ids[1], "worker-a").await;
    alloc(&ids[2], "worker-a").await;
    alloc(&ids[2], "worker-b").await;
    alloc(&ids[3], "worker-b").await;
    alloc(&ids[4], "worker-b").await;
    let set = |id, g, s| {
        let store = store.clone();
        async move {
            store
                .set_execution_state(id, g, s, None, NOW)
                .await
                .unwrap()
        }
    };
    set(&ids[0], Generation(1), ExecutionState::Running).await;
    set(&ids[2], Generation(1), ExecutionState::Retired).await;
    set(&ids[2], Generation(2), ExecutionState::Running).await;
    set(&ids[4], Generation(1), ExecutionState::Failed).await;
    store
        .set_sandbox_state(&ids[3], SandboxState::Stopped, None)
        .await
        .unwrap();

    let counts = store.count_active_by_worker().await.unwrap();
    assert_eq!(counts, BTreeMap::from([(wa.clone(), 2), (wb.clone(), 1)]));

    // A newer pending execution elsewhere makes the sandbox count there instead.
    alloc(&ids[0], "worker-b").await;
    let counts = store.count_active_by_worker().await.unwrap();
    assert_eq!(counts, BTreeMap::from([(wa, 1), (wb, 2)]));
}

pub async fn two_control_planes_allocating_concurrently_for_one_sandbox_never_share_a_generation(
    f: &Fixture,
) {
    const PER_PLANE: usize = 50;
    // Two store instances: two connection pools (PostgreSQL) or two connections to one
    // file (SQLite), as two control-plane processes would have.
    let plane_a = f.open().await;
    let plane_b = f.open().await;
    let id = with_sandbox(&plane_a, 1).await;
    let w = worker_id("worker-a");

    let mut tasks = Vec::new();
    for i in 0..PER_PLANE * 2 {
        let store = if i % 2 == 0 { &plane_a } else { &plane_b }.clone();
        let (id, w) = (id, w.clone());
        tasks.push(tokio::spawn(async move {
            store
                .allocate_execution(&id, execution_id(), &w, Substrate::Jail, NOW)
                .await
        }));
    }
    let mut generations = Vec::new();
    for t in tasks {
        let rec = t.await.expect("task").expect("allocate");
        generations.push(rec.generation.get());
    }

    let distinct: BTreeSet<u64> = generations.iter().copied().collect();
    assert_eq!(
        distinct.len(),
        PER_PLANE * 2,
        "a generation was handed out twice"
    );
    let expected: BTreeSet<u64> = (1..=(PER_PLANE * 2) as u64).collect();
    assert_eq!(
        distinct, expected,
        "generations are not 1..=100 without gaps"
    );
    assert_eq!(
        plane_b.get_sandbox(&id).await.unwrap().generation,
        Generation((PER_PLANE * 2) as u64)
    );
    let stored = plane_b.list_executions(&id).await.unwrap();
    assert_eq!(stored.len(), PER_PLANE * 2);
    let ids: BTreeSet<String> = stored.iter().map(|e| e.execution_id.to_string()).collect();
    assert_eq!(ids.len(), PER_PLANE * 2);
    let _ = fixture::NOW;
}
