//! Templates: a name bound once to a digest, looked up by name or digest, listed,
//! removed, and the live sandboxes pinned to a digest counted.

use space_store::{SandboxState, StoreError, TemplateRecord};

use crate::fixture::{Fixture, NOW, sandbox, tenant};

fn digest(n: u8) -> String {
    format!("sha256:{}", format!("{n:02x}").repeat(32))
}

fn template(name: &str, tag: &str, n: u8) -> TemplateRecord {
    TemplateRecord {
        name: name.into(),
        tag: tag.into(),
        digest: digest(n),
        manifest: format!(r#"{{"schema":1,"n":{n}}}"#),
        size: 1000 + u64::from(n),
        created_at: NOW + i64::from(n),
    }
}

pub async fn a_template_name_is_bound_once_and_the_same_digest_again_changes_nothing(f: &Fixture) {
    let store = f.open().await;
    let first = template("py", "3.12", 1);
    assert!(store.put_template(&first).await.unwrap(), "a new binding");
    // The same digest again (a second import of the same image): no change, not even
    // of its creation time.
    let again = TemplateRecord {
        created_at: NOW + 999,
        ..first.clone()
    };
    assert!(!store.put_template(&again).await.unwrap());
    assert_eq!(
        store.template("py", "3.12").await.unwrap(),
        Some(first.clone())
    );
    // Another digest under the name is refused and leaves the first.
    match store.put_template(&template("py", "3.12", 2)).await {
        Err(StoreError::Conflict(m)) => assert!(m.contains(&digest(1)), "{m}"),
        other => panic!("another digest under a taken name: {other:?}"),
    }
    assert_eq!(store.template("py", "3.12").await.unwrap(), Some(first));
    // Another tag of the name is another template.
    assert!(
        store
            .put_template(&template("py", "3.13", 2))
            .await
            .unwrap()
    );
    assert_eq!(store.template("py", "latest").await.unwrap(), None);
}

pub async fn templates_are_found_by_digest_under_any_name_listed_by_name_and_removed(f: &Fixture) {
    let store = f.open().await;
    for t in [
        template("zeta", "latest", 3),
        template("alpha", "b", 3),
        template("alpha", "a", 4),
    ] {
        store.put_template(&t).await.unwrap();
    }
    let listed: Vec<String> = store
        .list_templates()
        .await
        .unwrap()
        .iter()
        .map(TemplateRecord::reference)
        .collect();
    assert_eq!(listed, ["alpha:a", "alpha:b", "zeta:latest"]);
    let by_digest = store.template_by_digest(&digest(3)).await.unwrap().unwrap();
    assert_eq!(by_digest, template("alpha", "b", 3));
    assert_eq!(store.template_by_digest(&digest(9)).await.unwrap(), None);

    assert!(store.delete_template("alpha", "b").await.unwrap());
    assert!(
        !store.delete_template("alpha", "b").await.unwrap(),
        "deleted twice"
    );
    assert_eq!(
        store
            .template_by_digest(&digest(3))
            .await
            .unwrap()
            .map(|t| t.reference()),
        Some("zeta:latest".into()),
        "the digest is still bound under its other name"
    );
    // Reopened (another replica), the same.
    let other = f.open().await;
    assert_eq!(other.list_templates().await.unwrap().len(), 2);
    // A removed name may be bound to another digest.
    assert!(
        other
            .put_template(&template("alpha", "b", 5))
            .await
            .unwrap()
    );
}

pub async fn a_malformed_template_record_is_refused(f: &Fixture) {
    let store = f.open().await;
    for bad in [
        TemplateRecord {
            digest: "sha256:XYZ".into(),
            ..template("a", "b", 1)
        },
        TemplateRecord {
            digest: digest(1).to_uppercase(),
            ..template("a", "b", 1)
        },
        TemplateRecord {
            name: String::new(),
            ..template("a", "b", 1)
        },
        TemplateRecord {
            tag: "x@y".into(),
            ..template("a", "b", 1)
        },
        TemplateRecord {
            size: u64::MAX,
            ..template("a", "b", 1)
        },
    ] {
        assert!(store.put_template(&bad).await.is_err(), "accepted {bad:?}");
    }
    assert!(store.list_templates().await.unwrap().is_empty());
    assert!(
        store
            .count_live_sandboxes_with_template("sha256:%")
            .await
            .is_err()
    );
}

pub async fn live_sandboxes_pinned_to_a_digest_are_counted_whatever_their_name(f: &Fixture) {
    let store = f.open().await;
    store.create_tenant(&tenant("ten_a")).await.unwrap();
    let pinned = |n: u8, name: &str, d: u8| space_store::SandboxRecord {
        template: format!("{name}@{}", digest(d)),
        ..sandbox(n, "ten_a")
    };
    for s in [
        pinned(1, "py:3.12", 7),
        pinned(2, "python:latest", 7),
        pinned(3, "py:3.12", 7),
        pinned(4, "other:latest", 8),
        sandbox(5, "ten_a"),
    ] {
        store.create_sandbox(&s).await.unwrap();
    }
    assert_eq!(
        store
            .count_live_sandboxes_with_template(&digest(7))
            .await
            .unwrap(),
        3
    );
    store
        .set_sandbox_state(&pinned(3, "", 0).id, SandboxState::Stopped, None)
        .await
        .unwrap();
    assert_eq!(
        store
            .count_live_sandboxes_with_template(&digest(7))
            .await
            .unwrap(),
        2
    );
    assert_eq!(
        store
            .count_live_sandboxes_with_template(&digest(8))
            .await
            .unwrap(),
        1
    );
    assert_eq!(
        store
            .count_live_sandboxes_with_template(&digest(9))
            .await
            .unwrap(),
        0
    );
}

pub async fn two_control_planes_binding_one_name_at_once_bind_one_digest(f: &Fixture) {
    let (a, b) = (f.open().await, f.open().await);
    let mut tasks = Vec::new();
    for i in 0..8u8 {
        let store = if i % 2 == 0 { a.clone() } else { b.clone() };
        tasks.push(tokio::spawn(async move {
            store
                .put_template(&template("race", "latest", 10 + i % 2))
                .await
        }));
    }
    let mut new = 0;
    let mut conflicts = 0;
    for t in tasks {
        match t.await.unwrap() {
            Ok(true) => new += 1,
            Ok(false) => {}
            Err(StoreError::Conflict(_)) => conflicts += 1,
            Err(e) => panic!("{e}"),
        }
    }
    assert_eq!(new, 1, "exactly one put bound the name");
    let bound = a.template("race", "latest").await.unwrap().unwrap();
    // Every put of the other digest was refused.
    assert_eq!(conflicts, 4, "{bound:?}");
}
