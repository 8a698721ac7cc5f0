//! Sandbox network policies: stored with the sandbox, replaced while it lives, kept
//! across reopens; rows from before policies read as `none`.

use space_store::{Policy, SandboxState, StoreError};

use crate::fixture::{self, Fixture, egress, sandbox, sandbox_id, tenant};

pub async fn a_network_policy_round_trips_through_create_set_network_and_a_reopen(f: &Fixture) {
    let store = f.open().await;
    store.create_tenant(&tenant("ten_a")).await.unwrap();
    // Sandbox 3 is created with an egress policy, sandbox 1 without a network.
    let with = sandbox(3, "ten_a");
    let without = sandbox(1, "ten_a");
    assert_ne!(with.network, Policy::none());
    store.create_sandbox(&with).await.unwrap();
    store.create_sandbox(&without).await.unwrap();
    assert_eq!(
        store.get_sandbox(&with.id).await.unwrap().network,
        with.network
    );
    assert_eq!(
        store.get_sandbox(&without.id).await.unwrap().network,
        Policy::none()
    );

    let changed = egress(&["*.example.com", "2001:db8::/32"], &["bad.example.com"]);
    store.set_network(&without.id, &changed).await.unwrap();
    assert_eq!(
        store.get_sandbox(&without.id).await.unwrap().network,
        changed
    );
    // Back to no network: the lists are kept as given.
    let off = Policy::parse(
        space_egress::NetworkMode::None,
        &["pypi.org"],
        &[] as &[&str],
    )
    .unwrap();
    store.set_network(&with.id, &off).await.unwrap();
    // Every read path decodes it: one, a tenant's list.
    let listed = store.list_sandboxes("ten_a").await.unwrap();
    let of = |id| listed.iter().find(|s| s.id == id).unwrap().network.clone();
    assert_eq!(
        (of(with.id), of(without.id)),
        (off.clone(), changed.clone())
    );
    drop(store);

    let reopened = f.open().await;
    assert_eq!(reopened.get_sandbox(&with.id).await.unwrap().network, off);
    assert_eq!(
        reopened.get_sandbox(&without.id).await.unwrap().network,
        changed
    );
}

pub async fn set_network_is_refused_for_a_stopped_or_missing_sandbox_and_changes_nothing(
    f: &Fixture,
) {
    let store = f.open().await;
    let id = fixture::with_sandbox(&store, 3).await;
    let before = store.get_sandbox(&id).await.unwrap().network;
    store
        .set_sandbox_state(&id, SandboxState::Stopped, None)
        .await
        .unwrap();
    let res = store.set_network(&id, &egress(&[], &[])).await;
    assert!(
        matches!(&res, Err(StoreError::Conflict(m)) if m.contains("stopped")),
        "{res:?}"
    );
    assert_eq!(store.get_sandbox(&id).await.unwrap().network, before);
    let res = store.set_network(&sandbox_id(99), &Policy::none()).await;
    assert!(matches!(res, Err(StoreError::NotFound(_))), "{res:?}");
    // Every state but stopped takes a new policy.
    let live = fixture::with_sandbox(&store, 4).await;
    for (state, rule) in [
        (SandboxState::Starting, "starting.example"),
        (SandboxState::Running, "running.example"),
        (SandboxState::Paused, "paused.example"),
        (SandboxState::Migrating, "migrating.example"),
    ] {
        store.set_sandbox_state(&live, state, None).await.unwrap();
        let p = egress(&[rule], &[]);
        store.set_network(&live, &p).await.unwrap();
        assert_eq!(
            store.get_sandbox(&live).await.unwrap().network,
            p,
            "{state}"
        );
    }
}

pub async fn a_row_written_without_a_policy_reads_as_none(f: &Fixture) {
    let store = f.open().await;
    store.create_tenant(&tenant("ten_a")).await.unwrap();
    let id = sandbox_id(7);
    // As a build from before policies writes a sandbox: the column is not named.
    f.execute_raw(&format!(
        "INSERT INTO sandboxes (id, tenant, template, state, created_at, expires_at, metadata, env, generation, limits) \
         VALUES ('{id}', 'ten_a', 'default', 'running', 1, NULL, '{{}}', '{{}}', 0, NULL)"
    ))
    .await;
    let s = store.get_sandbox(&id).await.unwrap();
    assert_eq!(s.network, Policy::none());
    assert_eq!(s.state, SandboxState::Running);
    // And it takes a policy like any other.
    let p = egress(&["pypi.org"], &[]);
    store.set_network(&id, &p).await.unwrap();
    assert_eq!(store.get_sandbox(&id).await.unwrap().network, p);
}

pub async fn a_claim_takes_a_standby_sandbox_of_its_network_mode_and_writes_its_policy(
    f: &Fixture,
) {
    let store = f.open().await;
    for t in ["_standby", "ten_a"] {
        store.create_tenant(&tenant(t)).await.unwrap();
    }
    // Sandbox 3 is in mode egress (it would have its link), sandbox 1 in mode none.
    let w = fixture::worker_id("worker-a");
    let (linked, bare) = (sandbox(3, "_standby"), sandbox(1, "_standby"));
    for s in [&linked, &bare] {
        store.create_sandbox(s).await.unwrap();
        store
            .allocate_execution(
                &s.id,
                fixture::execution_id(),
                &w,
                space_identity::Substrate::Jail,
                fixture::NOW,
            )
            .await
            .unwrap();
        store
            .set_sandbox_state(&s.id, SandboxState::Running, None)
            .await
            .unwrap();
    }
    let mut counts: Vec<_> = store
        .count_standby_by_worker("_standby")
        .await
        .unwrap()
        .into_iter()
        .map(|c| (c.worker.to_string(), c.template, c.mode, c.n))
        .collect();
    counts.sort_by_key(|c| c.2 == space_egress::NetworkMode::None);
    assert_eq!(
        counts,
        vec![
            (
                w.to_string(),
                "default".into(),
                space_egress::NetworkMode::Egress,
                1
            ),
            (
                w.to_string(),
                "default".into(),
                space_egress::NetworkMode::None,
                1
            ),
        ]
    );
    let claim = |network: Policy| space_store::Claim {
        tenant: "ten_a".into(),
        created_at: fixture::NOW + 5,
        expires_at: None,
        metadata: serde_json::json!({}),
        template: "default".into(),
        network,
    };
    // A claim in mode egress takes the one in mode egress and writes its own policy.
    let asked = egress(&["pypi.org"], &[]);
    assert_ne!(asked, linked.network);
    let got = store
        .claim_standby("_standby", &claim(asked.clone()))
        .await
        .unwrap()
        .unwrap();
    assert_eq!((got.id, &got.network), (linked.id, &asked));
    assert_eq!(store.get_sandbox(&linked.id).await.unwrap().network, asked);
    // None in mode egress is left: another such claim gets none, never the bare one.
    assert_eq!(
        store
            .claim_standby("_standby", &claim(egress(&[], &[])))
            .await
            .unwrap(),
        None
    );
    // A claim in mode none takes the one without a link.
    let got = store
        .claim_standby("_standby", &claim(Policy::none()))
        .await
        .unwrap()
        .unwrap();
    assert_eq!((got.id, got.network), (bare.id, Policy::none()));
}
