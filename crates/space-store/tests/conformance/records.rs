//! Tenants, API keys, workers, sandboxes, signing keys, bundles, settings, migrations.

use space_identity::{Generation, Substrate};
use space_store::{
    ApiKeyRecord, KeyState, SandboxState, SigningKeyRecord, StoreError, WorkerState,
};

use crate::fixture::{self, Fixture, NOW, sandbox, sandbox_id, tenant, worker, worker_id};

pub async fn migrations_are_idempotent_and_reopening_a_store_keeps_its_data(f: &Fixture) {
    let store = f.open().await;
    let versions = store.schema_versions().await.unwrap();
    assert_eq!(versions, vec![1, 2, 3, 4, 5, 6, 7]);
    store.migrate().await.unwrap();
    store.migrate().await.unwrap();
    assert_eq!(store.schema_versions().await.unwrap(), versions);

    store.create_tenant(&tenant("ten_keep")).await.unwrap();
    store.kv_set("trust-anchor", "seed").await.unwrap();
    // A row in the newest migration's tables, to be found after the reopen.
    let sbx = fixture::with_sandbox(&store, 1).await;
    let port = space_store::PortRecord {
        sandbox: sbx,
        port: 8080,
        protocol: "http".into(),
        public: false,
        token_hash: "ab".repeat(32),
        created_at: NOW,
    };
    store.upsert_port(&port).await.unwrap();
    store
        .insert_port_link(&"cd".repeat(32), &sbx, 8080, NOW + 300)
        .await
        .unwrap();
    drop(store);

    // A reopen runs the migrations again over the existing schema.
    let reopened = f.open().await;
    assert_eq!(reopened.schema_versions().await.unwrap(), versions);
    assert_eq!(
        reopened.get_tenant("ten_keep").await.unwrap(),
        tenant("ten_keep")
    );
    assert_eq!(
        reopened.kv_get("trust-anchor").await.unwrap().as_deref(),
        Some("seed")
    );
    assert_eq!(reopened.list_ports(&sbx).await.unwrap(), vec![port]);
    assert_eq!(
        reopened
            .take_port_link(&"cd".repeat(32), NOW)
            .await
            .unwrap(),
        Some((sbx, 8080))
    );
}

pub async fn every_record_type_round_trips(f: &Fixture) {
    let store = f.open().await;

    store.create_tenant(&tenant("ten_b")).await.unwrap();
    store.create_tenant(&tenant("ten_a")).await.unwrap();
    let tenants = store.list_tenants().await.unwrap();
    assert_eq!(tenants, vec![tenant("ten_a"), tenant("ten_b")]);
    assert_eq!(store.get_tenant("ten_b").await.unwrap(), tenant("ten_b"));

    let key = ApiKeyRecord {
        id: "ak_1".into(),
        tenant: "ten_a".into(),
        hash: *b"0123456789abcdef0123456789abcdef",
        admin: true,
        created_at: NOW,
        revoked_at: None,
    };
    let revoked = ApiKeyRecord {
        id: "ak_2".into(),
        admin: false,
        created_at: NOW + 1,
        revoked_at: Some(NOW + 5),
        hash: [0xff; 32],
        ..key.clone()
    };
    store.insert_api_key(&key).await.unwrap();
    store.insert_api_key(&revoked).await.unwrap();
    assert_eq!(store.find_api_key("ak_1").await.unwrap(), Some(key.clone()));
    assert_eq!(store.find_api_key("ak_nope").await.unwrap(), None);
    assert_eq!(
        store.list_api_keys("ten_a").await.unwrap(),
        vec![key, revoked]
    );
    assert!(store.list_api_keys("ten_b").await.unwrap().is_empty());

    let mut w = worker("worker-b");
    w.substrate = Substrate::Firecracker;
    w.capacity = u32::MAX;
    w.state = WorkerState::Draining;
    assert_eq!(store.upsert_worker(&w).await.unwrap(), w);
    assert_eq!(store.get_worker(&w.id).await.unwrap(), w);
    store.upsert_worker(&worker("worker-a")).await.unwrap();
    assert_eq!(
        store.list_workers().await.unwrap(),
        vec![worker("worker-a"), w]
    );

    let s1 = sandbox(1, "ten_a");
    let mut s2 = sandbox(2, "ten_a");
    s2.expires_at = None;
    s2.metadata = serde_json::Value::Null;
    s2.env.clear();
    s2.state = SandboxState::Paused;
    store.create_sandbox(&s2).await.unwrap();
    store.create_sandbox(&s1).await.unwrap();
    assert_eq!(store.get_sandbox(&s1.id).await.unwrap(), s1);
    assert_eq!(store.get_sandbox(&s2.id).await.unwrap(), s2);
    assert_eq!(store.list_sandboxes("ten_a").await.unwrap(), vec![s1, s2]);
    assert!(store.list_sandboxes("ten_b").await.unwrap().is_empty());

    let exec = store
        .allocate_execution(
            &sandbox_id(1),
            fixture::execution_id(),
            &worker_id("worker-a"),
            Substrate::Kubernetes,
            NOW + 10,
        )
        .await
        .unwrap();
    assert_eq!(
        store
            .get_execution(&sandbox_id(1), Generation(1))
            .await
            .unwrap(),
        exec
    );

    let k1 = SigningKeyRecord {
        key_id: "key-1".into(),
        seed: [42; 32],
        state: KeyState::Active,
        created_at: NOW,
        not_before: NOW,
        not_after: NOW + 86_400,
    };
    let k2 = SigningKeyRecord {
        key_id: "key-2".into(),
        seed: [43; 32],
        state: KeyState::Published,
        created_at: NOW + 1,
        ..k1.clone()
    };
    store.insert_signing_key(&k2).await.unwrap();
    store.insert_signing_key(&k1).await.unwrap();
    assert_eq!(store.list_signing_keys().await.unwrap(), vec![k1, k2]);

    assert_eq!(store.latest_bundle().await.unwrap(), None);
    store.store_bundle(1, vec![0, 1, 2, 255]).await.unwrap();
    assert_eq!(
        store.latest_bundle().await.unwrap(),
        Some((1, vec![0, 1, 2, 255]))
    );

    assert_eq!(store.kv_get("a").await.unwrap(), None);
    store.kv_set("a", "1").await.unwrap();
    store.kv_set("a", "2 ünïcode").await.unwrap();
    assert_eq!(
        store.kv_get("a").await.unwrap().as_deref(),
        Some("2 ünïcode")
    );
}

pub async fn duplicate_ids_conflict_and_missing_references_are_not_found(f: &Fixture) {
    let store = f.open().await;
    store.create_tenant(&tenant("ten_a")).await.unwrap();
    assert!(matches!(
        store.create_tenant(&tenant("ten_a")).await,
        Err(StoreError::Conflict(_))
    ));
    assert!(matches!(
        store.get_tenant("ten_zz").await,
        Err(StoreError::NotFound(_))
    ));

    // A sandbox or key of a tenant that does not exist is refused.
    assert!(matches!(
        store.create_sandbox(&sandbox(1, "ten_ghost")).await,
        Err(StoreError::NotFound(_))
    ));
    store.create_sandbox(&sandbox(1, "ten_a")).await.unwrap();
    assert!(matches!(
        store.create_sandbox(&sandbox(1, "ten_a")).await,
        Err(StoreError::Conflict(_))
    ));
    assert!(matches!(
        store.get_sandbox(&sandbox_id(9)).await,
        Err(StoreError::NotFound(_))
    ));
    assert!(matches!(
        store.get_worker(&worker_id("nobody")).await,
        Err(StoreError::NotFound(_))
    ));
    assert!(matches!(
        store.get_execution(&sandbox_id(1), Generation(1)).await,
        Err(StoreError::NotFound(_))
    ));

    let key = SigningKeyRecord {
        key_id: "k".into(),
        seed: [1; 32],
        state: KeyState::Published,
        created_at: NOW,
        not_before: NOW,
        not_after: NOW + 1,
    };
    store.insert_signing_key(&key).await.unwrap();
    assert!(matches!(
        store.insert_signing_key(&key).await,
        Err(StoreError::Conflict(_))
    ));
}

pub async fn revoking_an_api_key_is_idempotent_and_keeps_the_first_revocation_time(f: &Fixture) {
    let store = f.open().await;
    store.create_tenant(&tenant("ten_a")).await.unwrap();
    let key = ApiKeyRecord {
        id: "ak_r".into(),
        tenant: "ten_a".into(),
        hash: [9; 32],
        admin: false,
        created_at: NOW,
        revoked_at: None,
    };
    store.insert_api_key(&key).await.unwrap();
    assert!(matches!(
        store.insert_api_key(&key).await,
        Err(StoreError::Conflict(_))
    ));

    assert!(store.revoke_api_key("ak_r", NOW + 10).await.unwrap());
    assert!(!store.revoke_api_key("ak_r", NOW + 20).await.unwrap());
    let stored = store.find_api_key("ak_r").await.unwrap().unwrap();
    assert_eq!(stored.revoked_at, Some(NOW + 10));
    assert!(matches!(
        store.revoke_api_key("ak_missing", NOW).await,
        Err(StoreError::NotFound(_))
    ));
}

pub async fn worker_state_changes_and_heartbeats_are_stored_and_re_enrolment_keeps_registered_at(
    f: &Fixture,
) {
    let store = f.open().await;
    let w = worker("worker-a");
    store.upsert_worker(&w).await.unwrap();

    store
        .set_worker_state(&w.id, WorkerState::Draining)
        .await
        .unwrap();
    assert_eq!(
        store.get_worker(&w.id).await.unwrap().state,
        WorkerState::Draining
    );
    store
        .set_worker_state(&w.id, WorkerState::Dead)
        .await
        .unwrap();
    store.touch_worker(&w.id, NOW + 30).await.unwrap();
    let stored = store.get_worker(&w.id).await.unwrap();
    assert_eq!(
        (stored.state, stored.last_seen),
        (WorkerState::Dead, NOW + 30)
    );

    // Re-enrolment after a restart: new URL, credential and state, same first registration.
    let mut again = worker("worker-a");
    again.url = "http://127.0.0.1:7200".into();
    again.credential_hash = [8; 32];
    again.registered_at = NOW + 100;
    again.last_seen = NOW + 100;
    let stored = store.upsert_worker(&again).await.unwrap();
    assert_eq!(stored.registered_at, NOW);
    assert_eq!(
        (
            stored.url.as_str(),
            stored.credential_hash,
            stored.state,
            stored.last_seen
        ),
        (
            "http://127.0.0.1:7200",
            [8; 32],
            WorkerState::Active,
            NOW + 100
        )
    );
    assert_eq!(store.get_worker(&w.id).await.unwrap(), stored);

    let ghost = worker_id("ghost");
    assert!(matches!(
        store.set_worker_state(&ghost, WorkerState::Active).await,
        Err(StoreError::NotFound(_))
    ));
    assert!(matches!(
        store.touch_worker(&ghost, NOW).await,
        Err(StoreError::NotFound(_))
    ));
}

pub async fn sandbox_state_change_with_a_stale_expected_state_is_refused(f: &Fixture) {
    let store = f.open().await;
    let id = fixture::with_sandbox(&store, 1).await;

    store
        .set_sandbox_state(&id, SandboxState::Running, Some(SandboxState::Starting))
        .await
        .unwrap();
    // A second replica still believing the sandbox is starting loses.
    let stale = store
        .set_sandbox_state(&id, SandboxState::Stopped, Some(SandboxState::Starting))
        .await;
    assert!(matches!(stale, Err(StoreError::Conflict(_))), "{stale:?}");
    assert_eq!(
        store.get_sandbox(&id).await.unwrap().state,
        SandboxState::Running
    );

    store
        .set_sandbox_state(&id, SandboxState::Paused, None)
        .await
        .unwrap();
    assert_eq!(
        store.get_sandbox(&id).await.unwrap().state,
        SandboxState::Paused
    );
    assert!(matches!(
        store
            .set_sandbox_state(
                &sandbox_id(77),
                SandboxState::Paused,
                Some(SandboxState::Running)
            )
            .await,
        Err(StoreError::NotFound(_))
    ));
}

pub async fn signing_key_state_changes_are_stored(f: &Fixture) {
    let store = f.open().await;
    let key = SigningKeyRecord {
        key_id: "key-r".into(),
        seed: [5; 32],
        state: KeyState::Published,
        created_at: NOW,
        not_before: NOW,
        not_after: NOW + 10,
    };
    store.insert_signing_key(&key).await.unwrap();
    for state in [KeyState::Active, KeyState::Retiring, KeyState::Retired] {
        store.set_signing_key_state("key-r", state).await.unwrap();
        assert_eq!(store.list_signing_keys().await.unwrap()[0].state, state);
    }
    assert!(matches!(
        store.set_signing_key_state("key-x", KeyState::Active).await,
        Err(StoreError::NotFound(_))
    ));
}

pub async fn bundles_never_roll_back(f: &Fixture) {
    let store = f.open().await;
    store.store_bundle(5, b"five".to_vec()).await.unwrap();
    for older in [5, 4, 0] {
        let res = store.store_bundle(older, b"old".to_vec()).await;
        assert!(
            matches!(res, Err(StoreError::Conflict(_))),
            "{older}: {res:?}"
        );
    }
    assert_eq!(
        store.latest_bundle().await.unwrap(),
        Some((5, b"five".to_vec()))
    );
    store.store_bundle(7, b"seven".to_vec()).await.unwrap();

    // Another replica's store sees the same newest bundle and cannot go back either.
    let other = f.open().await;
    assert!(matches!(
        other.store_bundle(6, b"six".to_vec()).await,
        Err(StoreError::Conflict(_))
    ));
    assert_eq!(
        other.latest_bundle().await.unwrap(),
        Some((7, b"seven".to_vec()))
    );
}

pub async fn kv_insert_if_absent_keeps_the_first_value(f: &Fixture) {
    let a = f.open().await;
    let b = f.open().await;
    assert!(a.kv_insert_if_absent("anchor", "from-a").await.unwrap());
    assert!(!b.kv_insert_if_absent("anchor", "from-b").await.unwrap());
    assert_eq!(b.kv_get("anchor").await.unwrap().as_deref(), Some("from-a"));
}

pub async fn standby_sandboxes_are_claimed_oldest_first_once_each_and_only_when_running(
    f: &Fixture,
) {
    let store = f.open().await;
    for t in ["_standby", "ten_a", "ten_b"] {
        store.create_tenant(&tenant(t)).await.unwrap();
    }
    let claim = |t: &str, n: i64| space_store::Claim {
        tenant: t.into(),
        created_at: NOW + 1000 + n,
        expires_at: None,
        metadata: serde_json::json!({ "claimed": n }),
        template: "default".into(),
        network: space_store::Policy::none(),
    };
    // None yet; a starting one is not ready.
    assert_eq!(
        store
            .claim_standby("_standby", &claim("ten_a", 0))
            .await
            .unwrap(),
        None
    );
    // All in mode none, as the claims (the fixture gives every third a network).
    for n in 1..=6u8 {
        let mut s = sandbox(n, "_standby");
        s.network = space_store::Policy::none();
        store.create_sandbox(&s).await.unwrap();
    }
    assert_eq!(
        store
            .claim_standby("_standby", &claim("ten_a", 0))
            .await
            .unwrap(),
        None
    );
    for n in 1..=5u8 {
        store
            .set_sandbox_state(&sandbox_id(n), SandboxState::Running, None)
            .await
            .unwrap();
    }
    // The oldest goes first, stamped for its new owner.
    let first = store
        .claim_standby("_standby", &claim("ten_a", 1))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(first.id, sandbox_id(1));
    assert_eq!(first.tenant, "ten_a");
    assert_eq!(first.created_at, NOW + 1001);
    assert_eq!(first.expires_at, None);
    assert_eq!(first.metadata, serde_json::json!({ "claimed": 1 }));
    assert_eq!(store.get_sandbox(&sandbox_id(1)).await.unwrap(), first);
    // Concurrent claims (two stores: two control planes) never share a sandbox.
    let other = f.open().await;
    let claims: Vec<_> = (2..=6)
        .map(|n| claim(if n % 2 == 0 { "ten_a" } else { "ten_b" }, n))
        .collect();
    let (a, b, c, d, e) = tokio::join!(
        store.claim_standby("_standby", &claims[0]),
        other.claim_standby("_standby", &claims[1]),
        store.claim_standby("_standby", &claims[2]),
        other.claim_standby("_standby", &claims[3]),
        store.claim_standby("_standby", &claims[4]),
    );
    let got: Vec<_> = [a, b, c, d, e].into_iter().map(|r| r.unwrap()).collect();
    let mut ids: Vec<_> = got.iter().flatten().map(|s| s.id).collect();
    ids.sort();
    ids.dedup();
    assert_eq!(ids.len(), 4, "{got:?}");
    assert_eq!(got.iter().filter(|s| s.is_none()).count(), 1);
    // What is left: the one still starting, under the standby tenant.
    let left = store.list_sandboxes("_standby").await.unwrap();
    assert_eq!(left.len(), 1);
    assert_eq!(left[0].id, sandbox_id(6));
}

pub async fn sandbox_limits_round_trip_and_live_sandboxes_are_counted_per_tenant(f: &Fixture) {
    let store = f.open().await;
    for t in ["ten_a", "ten_b"] {
        store.create_tenant(&tenant(t)).await.unwrap();
    }
    assert_eq!(store.count_live_sandboxes("ten_a").await.unwrap(), 0);
    for n in 1..=4u8 {
        store.create_sandbox(&sandbox(n, "ten_a")).await.unwrap();
    }
    store.create_sandbox(&sandbox(5, "ten_b")).await.unwrap();
    // With limits and without (a row from before limits): both read back as written.
    for n in [1u8, 2] {
        let want = sandbox(n, "ten_a");
        let got = store.get_sandbox(&want.id).await.unwrap();
        assert_eq!(got.limits, want.limits);
    }
    assert!(
        store
            .get_sandbox(&sandbox(1, "ten_a").id)
            .await
            .unwrap()
            .limits
            .is_some()
    );
    assert_eq!(store.count_live_sandboxes("ten_a").await.unwrap(), 4);
    assert_eq!(store.count_live_sandboxes("ten_b").await.unwrap(), 1);
    // A stopped sandbox no longer counts.
    store
        .set_sandbox_state(&sandbox(3, "ten_a").id, SandboxState::Stopped, None)
        .await
        .unwrap();
    assert_eq!(store.count_live_sandboxes("ten_a").await.unwrap(), 3);
    assert_eq!(store.count_live_sandboxes("nobody").await.unwrap(), 0);
}

pub async fn a_claim_takes_only_a_standby_sandbox_of_its_template_and_pools_are_counted_per_worker(
    f: &Fixture,
) {
    let store = f.open().await;
    for t in ["_standby", "ten_a"] {
        store.create_tenant(&tenant(t)).await.unwrap();
    }
    let image = "app:1@sha256:".to_owned() + &"ab".repeat(32);
    let (w1, w2) = (worker_id("worker-a"), worker_id("worker-b"));
    // Two of the default on worker-a, one of the image on worker-b, one of the
    // image with no execution yet (not counted).
    for (n, template, worker) in [
        (1u8, "default", Some(&w1)),
        (2, "default", Some(&w1)),
        (3, image.as_str(), Some(&w2)),
        (4, image.as_str(), None),
    ] {
        let mut s = sandbox(n, "_standby");
        s.template = template.to_owned();
        s.network = space_store::Policy::none();
        store.create_sandbox(&s).await.unwrap();
        if let Some(w) = worker {
            store
                .allocate_execution(&s.id, fixture::execution_id(), w, Substrate::Jail, NOW)
                .await
                .unwrap();
        }
    }
    assert_eq!(
        standby_counts(&store).await,
        vec![
            (w1.clone(), "default".to_owned(), 2),
            (w2.clone(), image.clone(), 1)
        ]
    );
    for n in 1..=4u8 {
        store
            .set_sandbox_state(&sandbox_id(n), SandboxState::Running, None)
            .await
            .unwrap();
    }
    let claim = |template: &str| space_store::Claim {
        tenant: "ten_a".into(),
        created_at: NOW + 10,
        expires_at: None,
        metadata: serde_json::json!({}),
        template: template.into(),
        network: space_store::Policy::none(),
    };
    // A claim of the image never takes a default one, nor one of another template.
    let other = "app:2@sha256:".to_owned() + &"cd".repeat(32);
    assert_eq!(
        store
            .claim_standby("_standby", &claim(&other))
            .await
            .unwrap(),
        None
    );
    let got = store
        .claim_standby("_standby", &claim(&image))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        (got.id, got.template.as_str()),
        (sandbox_id(3), image.as_str())
    );
    let got = store
        .claim_standby("_standby", &claim("default"))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(got.template, "default");
    // Claimed ones are no longer the standby tenant's.
    assert_eq!(
        standby_counts(&store).await,
        vec![(w1, "default".to_owned(), 1)]
    );
}

/// The standby counts, sorted, as (worker, template, n); every one in mode `none`.
async fn standby_counts(
    store: &space_store::Store,
) -> Vec<(space_identity::WorkerId, String, u64)> {
    let mut counts: Vec<_> = store
        .count_standby_by_worker("_standby")
        .await
        .unwrap()
        .into_iter()
        .map(|c| {
            assert_eq!(c.mode, space_store::NetworkMode::None);
            (c.worker, c.template, c.n)
        })
        .collect();
    counts.sort();
    counts
}

pub async fn an_expiry_is_set_and_cleared_on_a_live_sandbox_and_refused_on_a_stopped_one(
    f: &Fixture,
) {
    let store = f.open().await;
    let id = fixture::with_sandbox(&store, 7).await;
    store.set_expiry(&id, Some(NOW + 300)).await.unwrap();
    assert_eq!(
        store.get_sandbox(&id).await.unwrap().expires_at,
        Some(NOW + 300)
    );
    store.set_expiry(&id, None).await.unwrap();
    assert_eq!(store.get_sandbox(&id).await.unwrap().expires_at, None);
    store.set_expiry(&id, Some(NOW + 60)).await.unwrap();
    store
        .set_sandbox_state(&id, SandboxState::Stopped, None)
        .await
        .unwrap();
    let res = store.set_expiry(&id, Some(NOW + 9_000)).await;
    assert!(
        matches!(&res, Err(StoreError::Conflict(m)) if m.contains("stopped")),
        "{res:?}"
    );
    assert_eq!(
        store.get_sandbox(&id).await.unwrap().expires_at,
        Some(NOW + 60)
    );
    let res = store.set_expiry(&sandbox_id(98), None).await;
    assert!(matches!(res, Err(StoreError::NotFound(_))), "{res:?}");
}
