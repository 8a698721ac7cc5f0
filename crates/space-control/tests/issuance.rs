//! Capability issuance and key rotation against a real (SQLite) store, without workers.

use space_control::error::ControlError;
use space_control::service::ControlPlane;
use space_identity::{
    Access, AccessSet, DenyReason, ExecutionId, Generation, InstalledKeys, Purpose, SandboxId,
    Substrate, Timestamp, Token, verify_capability,
};
use space_store::{ExecutionState, SandboxRecord, SandboxState, Store, WorkerRecord, WorkerState};

async fn plane() -> (tempfile::TempDir, std::sync::Arc<ControlPlane>) {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path().join("control.db").to_str().unwrap())
        .await
        .unwrap();
    let cp = ControlPlane::new(store, "enroll".into(), dir.path().join("snapshots"))
        .await
        .unwrap();
    (dir, cp)
}

fn now() -> i64 {
    space_control::now_secs() as i64
}

async fn sandbox_with_pending_execution(cp: &ControlPlane) -> SandboxRecord {
    let (tenant, _) = cp.create_tenant("t", false).await.unwrap();
    cp.store
        .upsert_worker(&WorkerRecord {
            id: "w1".parse().unwrap(),
            url: "http://127.0.0.1:9".into(),
            substrate: Substrate::Jail,
            capacity: 10,
            state: WorkerState::Active,
            credential_hash: [0; 32],
            registered_at: now(),
            last_seen: now(),
        })
        .await
        .unwrap();
    let s = SandboxRecord {
        id: SandboxId::from_bytes([3; 16]),
        tenant: tenant.id,
        template: "default".into(),
        state: SandboxState::Running,
        created_at: now(),
        expires_at: None,
        metadata: serde_json::json!({}),
        env: Default::default(),
        generation: Generation(0),
        limits: None,
        network: space_store::Policy::none(),
    };
    cp.store.create_sandbox(&s).await.unwrap();
    cp.store
        .allocate_execution(
            &s.id,
            ExecutionId::from_bytes([4; 16]),
            &"w1".parse().unwrap(),
            Substrate::Jail,
            now(),
        )
        .await
        .unwrap();
    s
}

fn receiver(cp_keys: &space_control::keyring::Keyring) -> InstalledKeys {
    let mut keys = InstalledKeys::new(cp_keys.anchor.anchor());
    keys.install(&cp_keys.bundle).unwrap();
    keys
}

#[tokio::test]
async fn capability_is_issued_only_for_an_execution_its_worker_acknowledged_running() {
    let (_dir, cp) = plane().await;
    let s = sandbox_with_pending_execution(&cp).await;
    let exec = AccessSet::of(&[Access::Exec]);
    let refused = cp
        .issue_capability(&s, exec, Purpose::Control, None)
        .await
        .unwrap_err();
    assert!(matches!(refused, ControlError::NotRunning), "{refused:?}");
    cp.store
        .set_execution_state(
            &s.id,
            Generation(1),
            ExecutionState::Running,
            Some(ExecutionState::Pending),
            now(),
        )
        .await
        .unwrap();
    let cap = cp
        .issue_capability(&s, exec, Purpose::Control, None)
        .await
        .unwrap();
    assert!(cap.expires_at <= space_control::now_secs() + 120);
    // What a worker holding the published bundle makes of it.
    let keys = receiver(&*cp.keys().await);
    let token = Token::from_text(&cap.token).unwrap();
    let claims = verify_capability(
        token.as_bytes(),
        &keys,
        Timestamp::from_unix_secs(space_control::now_secs()),
    )
    .unwrap();
    assert_eq!(claims.route.sandbox, s.id);
    assert_eq!(claims.route.execution.generation.0, 1);
    assert_eq!(claims.route.execution.id, ExecutionId::from_bytes([4; 16]));
    assert_eq!(claims.access, exec);
}

#[tokio::test]
async fn issuer_refuses_invalid_access_and_port_combinations() {
    let (_dir, cp) = plane().await;
    let s = sandbox_with_pending_execution(&cp).await;
    cp.store
        .set_execution_state(&s.id, Generation(1), ExecutionState::Running, None, now())
        .await
        .unwrap();
    let port = AccessSet::of(&[Access::ServicePort]);
    assert!(
        cp.issue_capability(&s, AccessSet::empty(), Purpose::Control, None)
            .await
            .is_err()
    );
    assert!(
        cp.issue_capability(&s, port, Purpose::ServicePort, None)
            .await
            .is_err()
    );
    assert!(
        cp.issue_capability(&s, port, Purpose::Control, None)
            .await
            .is_err()
    );
    assert!(
        cp.issue_capability(
            &s,
            AccessSet::of(&[Access::Exec]),
            Purpose::Control,
            Some((80, space_identity::Protocol::Http))
        )
        .await
        .is_err()
    );
    // Only for a port the sandbox exposes, with its protocol.
    let issue =
        |protocol| cp.issue_capability(&s, port, Purpose::ServicePort, Some((8080, protocol)));
    assert!(matches!(
        issue(space_identity::Protocol::Http).await,
        Err(space_control::error::ControlError::PortNotExposed(8080))
    ));
    cp.store
        .upsert_port(&space_store::PortRecord {
            sandbox: s.id,
            port: 8080,
            protocol: "http".into(),
            public: false,
            token_hash: blake3::hash(b"spt_test").to_hex().to_string(),
            created_at: now(),
        })
        .await
        .unwrap();
    assert!(issue(space_identity::Protocol::Http).await.is_ok());
    assert!(matches!(
        issue(space_identity::Protocol::Tcp).await,
        Err(space_control::error::ControlError::Deny {
            reason: space_identity::DenyReason::WrongProtocol
        })
    ));
}

#[tokio::test]
async fn rotation_publishes_the_new_key_before_signing_with_it_and_retires_the_old_later() {
    let (_dir, cp) = plane().await;
    let s = sandbox_with_pending_execution(&cp).await;
    cp.store
        .set_execution_state(&s.id, Generation(1), ExecutionState::Running, None, now())
        .await
        .unwrap();
    let exec = AccessSet::of(&[Access::Exec]);
    let before = receiver(&*cp.keys().await);
    let old_cap = cp
        .issue_capability(&s, exec, Purpose::Control, None)
        .await
        .unwrap();
    let t0 = Timestamp::from_unix_secs(space_control::now_secs());
    let old_key = verify_capability(
        Token::from_text(&old_cap.token).unwrap().as_bytes(),
        &before,
        t0,
    )
    .unwrap()
    .key_id;
    // An active worker that cannot be reached never acknowledges the new bundle: the
    // new key is published but not used.
    let refused = cp.rotate_keys().await.unwrap_err();
    assert!(
        matches!(refused, ControlError::Unavailable(_)),
        "{refused:?}"
    );
    let still = cp
        .issue_capability(&s, exec, Purpose::Control, None)
        .await
        .unwrap();
    let still_claims = verify_capability(
        Token::from_text(&still.token).unwrap().as_bytes(),
        &before,
        t0,
    );
    assert_eq!(
        still_claims.unwrap().key_id,
        old_key,
        "signed with an unpublished key"
    );
    // With the worker out of service, rotation completes.
    cp.store
        .set_worker_state(&"w1".parse().unwrap(), WorkerState::Dead)
        .await
        .unwrap();
    let new_key = cp.rotate_keys().await.unwrap();
    let after = receiver(&*cp.keys().await);
    assert!(after.version() > before.version());
    let new_cap = cp
        .issue_capability(&s, exec, Purpose::Control, None)
        .await
        .unwrap();
    let t = Timestamp::from_unix_secs(space_control::now_secs());
    let new_token = Token::from_text(&new_cap.token).unwrap();
    let old_token = Token::from_text(&old_cap.token).unwrap();
    // The new capability is signed by the new key, which a receiver on the old bundle
    // does not know — which is why it is published first.
    assert_eq!(
        verify_capability(new_token.as_bytes(), &after, t)
            .unwrap()
            .key_id
            .to_string(),
        new_key
    );
    assert_eq!(
        verify_capability(new_token.as_bytes(), &before, t),
        Err(DenyReason::UnknownKey)
    );
    // The old key still verifies on the new bundle during its grace…
    assert!(verify_capability(old_token.as_bytes(), &after, t).is_ok());
    // …and not after it (lifetime + twice the skew).
    let later = t.plus_secs(space_identity::TOMBSTONE_RETENTION_SECS + 1);
    // The key window is checked before time, so the reason names the key.
    assert_eq!(
        verify_capability(old_token.as_bytes(), &after, later),
        Err(DenyReason::KeyNotValid)
    );
}
