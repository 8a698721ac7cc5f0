//! Exposed service ports and their one-time links.

use space_identity::SandboxId;
use space_store::{PortRecord, StoreError};

use crate::fixture::{Fixture, NOW, sandbox_id, with_sandbox};

/// A hash as the caller stores it: 64 lowercase hex digits, distinct per `n`.
fn hash(n: u64) -> String {
    format!("{n:064x}")
}

fn port(sandbox: SandboxId, port: u16) -> PortRecord {
    PortRecord {
        sandbox,
        port,
        protocol: "http".into(),
        public: false,
        token_hash: hash(u64::from(port)),
        created_at: NOW,
    }
}

pub async fn exposing_a_port_again_replaces_it_and_deletes_its_links(f: &Fixture) {
    let store = f.open().await;
    let sbx = with_sandbox(&store, 1).await;
    let first = port(sbx, 8080);
    assert!(store.upsert_port(&first).await.unwrap(), "a new port");
    assert_eq!(store.get_port(&sbx, 8080).await.unwrap(), Some(first));
    store
        .insert_port_link(&hash(1), &sbx, 8080, NOW + 300)
        .await
        .unwrap();
    // A link of another port of the same sandbox is not the replaced token's.
    store.upsert_port(&port(sbx, 3000)).await.unwrap();
    store
        .insert_port_link(&hash(2), &sbx, 3000, NOW + 300)
        .await
        .unwrap();

    let replaced = PortRecord {
        protocol: "tcp".into(),
        public: true,
        token_hash: hash(0xbeef),
        created_at: NOW + 60,
        ..port(sbx, 8080)
    };
    assert!(
        !store.upsert_port(&replaced).await.unwrap(),
        "a replaced port"
    );
    assert_eq!(store.get_port(&sbx, 8080).await.unwrap(), Some(replaced));
    assert_eq!(
        store.take_port_link(&hash(1), NOW).await.unwrap(),
        None,
        "a link to the replaced token survived"
    );
    assert_eq!(
        store.take_port_link(&hash(2), NOW).await.unwrap(),
        Some((sbx, 3000))
    );
    assert_eq!(store.list_ports(&sbx).await.unwrap().len(), 2);
}

pub async fn a_port_of_a_missing_sandbox_or_a_malformed_port_is_refused(f: &Fixture) {
    let store = f.open().await;
    let sbx = with_sandbox(&store, 1).await;
    assert!(matches!(
        store.upsert_port(&port(sandbox_id(9), 8080)).await,
        Err(StoreError::NotFound(_))
    ));
    for bad in [
        // Port 0 is the catch-all of every HTTP port: never tcp.
        PortRecord {
            port: 0,
            protocol: "tcp".into(),
            ..port(sbx, 1)
        },
        PortRecord {
            token_hash: "A".repeat(64),
            ..port(sbx, 1)
        },
        PortRecord {
            token_hash: "abc".into(),
            ..port(sbx, 1)
        },
        PortRecord {
            protocol: String::new(),
            ..port(sbx, 1)
        },
    ] {
        assert!(
            matches!(store.upsert_port(&bad).await, Err(StoreError::Backend(_))),
            "{bad:?} was stored"
        );
    }
    assert!(matches!(
        store.insert_port_link("not-a-hash", &sbx, 1, NOW).await,
        Err(StoreError::Backend(_))
    ));
    assert_eq!(store.list_ports(&sbx).await.unwrap(), vec![]);
}

pub async fn the_catch_all_record_is_port_0_listed_first_and_goes_with_the_sandboxs_ports(
    f: &Fixture,
) {
    let store = f.open().await;
    let a = with_sandbox(&store, 1).await;
    let b = with_sandbox(&store, 2).await;
    assert!(matches!(
        store.upsert_port(&port(sandbox_id(9), 0)).await,
        Err(StoreError::NotFound(_))
    ));
    store.upsert_port(&port(a, 8080)).await.unwrap();
    assert!(store.upsert_port(&port(a, 0)).await.unwrap(), "new");
    let public = PortRecord {
        public: true,
        ..port(a, 0)
    };
    assert!(!store.upsert_port(&public).await.unwrap(), "replaced");
    assert_eq!(store.get_port(&a, 0).await.unwrap(), Some(public.clone()));
    assert_eq!(store.get_port(&b, 0).await.unwrap(), None);
    assert_eq!(
        store.list_ports(&a).await.unwrap(),
        vec![public.clone(), port(a, 8080)]
    );
    // No link leads to the catch-all itself.
    assert!(
        store
            .insert_port_link(&hash(7), &a, 0, NOW + 300)
            .await
            .is_err()
    );
    assert!(store.delete_port(&a, 0).await.unwrap());
    assert!(!store.delete_port(&a, 0).await.unwrap());
    assert_eq!(store.list_ports(&a).await.unwrap(), vec![port(a, 8080)]);
    // A sandbox's ports go together, the catch-all with them; another's stay.
    store.upsert_port(&public).await.unwrap();
    store.upsert_port(&port(b, 0)).await.unwrap();
    assert_eq!(store.delete_ports(&a).await.unwrap(), 1);
    assert_eq!(store.list_ports(&a).await.unwrap(), vec![]);
    assert_eq!(store.list_ports(&b).await.unwrap(), vec![port(b, 0)]);
}

pub async fn ports_are_listed_by_port_and_scoped_to_their_sandbox(f: &Fixture) {
    let store = f.open().await;
    let a = with_sandbox(&store, 1).await;
    let b = with_sandbox(&store, 2).await;
    // Exposed out of order, the later a port the higher its number: by port is
    // neither by insertion nor by time.
    let exposed = |p: u16| PortRecord {
        created_at: NOW - i64::from(p),
        ..port(a, p)
    };
    for p in [8080, 22, 65535, 3000] {
        store.upsert_port(&exposed(p)).await.unwrap();
    }
    store.upsert_port(&port(b, 80)).await.unwrap();
    assert_eq!(
        store.list_ports(&a).await.unwrap(),
        vec![exposed(22), exposed(3000), exposed(8080), exposed(65535)]
    );
    assert_eq!(store.list_ports(&b).await.unwrap(), vec![port(b, 80)]);
    assert_eq!(store.list_ports(&sandbox_id(3)).await.unwrap(), vec![]);
    assert_eq!(store.get_port(&b, 8080).await.unwrap(), None);
}

pub async fn deleting_a_port_returns_true_once_then_false_and_deletes_its_links(f: &Fixture) {
    let store = f.open().await;
    let sbx = with_sandbox(&store, 1).await;
    store.upsert_port(&port(sbx, 8080)).await.unwrap();
    store.upsert_port(&port(sbx, 8081)).await.unwrap();
    store
        .insert_port_link(&hash(1), &sbx, 8080, NOW + 300)
        .await
        .unwrap();
    assert!(store.delete_port(&sbx, 8080).await.unwrap());
    assert!(!store.delete_port(&sbx, 8080).await.unwrap());
    assert_eq!(store.get_port(&sbx, 8080).await.unwrap(), None);
    assert_eq!(store.list_ports(&sbx).await.unwrap(), vec![port(sbx, 8081)]);
    assert_eq!(store.take_port_link(&hash(1), NOW).await.unwrap(), None);
    // A link needs an exposed port.
    assert!(matches!(
        store
            .insert_port_link(&hash(2), &sbx, 8080, NOW + 300)
            .await,
        Err(StoreError::NotFound(_))
    ));
}

pub async fn deleting_a_sandboxs_ports_leaves_other_sandboxes_ports_and_links(f: &Fixture) {
    let store = f.open().await;
    let a = with_sandbox(&store, 1).await;
    let b = with_sandbox(&store, 2).await;
    for p in [80, 443, 8080] {
        store.upsert_port(&port(a, p)).await.unwrap();
    }
    store.upsert_port(&port(b, 80)).await.unwrap();
    store
        .insert_port_link(&hash(1), &a, 443, NOW + 300)
        .await
        .unwrap();
    store
        .insert_port_link(&hash(2), &b, 80, NOW + 300)
        .await
        .unwrap();

    assert_eq!(store.delete_ports(&a).await.unwrap(), 3);
    assert_eq!(store.delete_ports(&a).await.unwrap(), 0);
    assert_eq!(store.list_ports(&a).await.unwrap(), vec![]);
    assert_eq!(store.list_ports(&b).await.unwrap(), vec![port(b, 80)]);
    assert_eq!(store.take_port_link(&hash(1), NOW).await.unwrap(), None);
    assert_eq!(
        store.take_port_link(&hash(2), NOW).await.unwrap(),
        Some((b, 80))
    );
}

pub async fn a_taken_link_cannot_be_taken_again(f: &Fixture) {
    let store = f.open().await;
    let sbx = with_sandbox(&store, 1).await;
    store.upsert_port(&port(sbx, 8080)).await.unwrap();
    store
        .insert_port_link(&hash(1), &sbx, 8080, NOW + 300)
        .await
        .unwrap();
    assert!(matches!(
        store
            .insert_port_link(&hash(1), &sbx, 8080, NOW + 600)
            .await,
        Err(StoreError::Conflict(_))
    ));
    // Usable up to and including its expiry second.
    assert_eq!(
        store.take_port_link(&hash(1), NOW + 300).await.unwrap(),
        Some((sbx, 8080))
    );
    assert_eq!(store.take_port_link(&hash(1), NOW).await.unwrap(), None);
    assert_eq!(store.take_port_link(&hash(7), NOW).await.unwrap(), None);
    // Its code hash is free again once taken.
    store
        .insert_port_link(&hash(1), &sbx, 8080, NOW + 300)
        .await
        .unwrap();
}

pub async fn an_expired_link_is_not_taken_and_is_gone_after(f: &Fixture) {
    let store = f.open().await;
    let sbx = with_sandbox(&store, 1).await;
    store.upsert_port(&port(sbx, 8080)).await.unwrap();
    store
        .insert_port_link(&hash(1), &sbx, 8080, NOW + 10)
        .await
        .unwrap();
    assert_eq!(
        store.take_port_link(&hash(1), NOW + 11).await.unwrap(),
        None
    );
    // Gone, not merely refused: even a clock that went back cannot take it now.
    assert_eq!(store.take_port_link(&hash(1), NOW).await.unwrap(), None);
}

pub async fn two_edges_taking_one_link_at_once_only_one_gets_it(f: &Fixture) {
    const LINKS: u64 = 40;
    let edge_a = f.open().await;
    let edge_b = f.open().await;
    let sbx = with_sandbox(&edge_a, 1).await;
    edge_a.upsert_port(&port(sbx, 8080)).await.unwrap();
    for n in 0..LINKS {
        edge_a
            .insert_port_link(&hash(n), &sbx, 8080, NOW + 300)
            .await
            .unwrap();
    }
    let mut races = Vec::new();
    for n in 0..LINKS {
        let takers = [edge_a.clone(), edge_b.clone()].map(|edge| {
            tokio::spawn(async move { edge.take_port_link(&hash(n), NOW).await.expect("take") })
        });
        races.push(takers);
    }
    for (n, [first, second]) in races.into_iter().enumerate() {
        let won = [first.await.expect("task"), second.await.expect("task")];
        let winners: Vec<_> = won.iter().flatten().collect();
        assert_eq!(winners, vec![&(sbx, 8080)], "link {n}: {won:?}");
    }
}

pub async fn purging_links_removes_only_the_expired_ones(f: &Fixture) {
    let store = f.open().await;
    let sbx = with_sandbox(&store, 1).await;
    store.upsert_port(&port(sbx, 8080)).await.unwrap();
    for (n, expires_at) in [(1, NOW - 1), (2, NOW), (3, NOW + 1), (4, NOW - 100)] {
        store
            .insert_port_link(&hash(n), &sbx, 8080, expires_at)
            .await
            .unwrap();
    }
    assert_eq!(store.purge_port_links(NOW).await.unwrap(), 2);
    assert_eq!(store.purge_port_links(NOW).await.unwrap(), 0);
    // The purged ones are gone even for a clock early enough to accept them.
    assert_eq!(
        store.take_port_link(&hash(1), NOW - 200).await.unwrap(),
        None
    );
    assert_eq!(
        store.take_port_link(&hash(4), NOW - 200).await.unwrap(),
        None
    );
    assert_eq!(
        store.take_port_link(&hash(2), NOW).await.unwrap(),
        Some((sbx, 8080))
    );
    assert_eq!(
        store.take_port_link(&hash(3), NOW).await.unwrap(),
        Some((sbx, 8080))
    );
}

pub async fn two_control_planes_exposing_one_port_at_once_see_it_new_only_once(f: &Fixture) {
    const PORTS: u16 = 30;
    let plane_a = f.open().await;
    let plane_b = f.open().await;
    let sbx = with_sandbox(&plane_a, 1).await;
    let mut races = Vec::new();
    for p in 1..=PORTS {
        let exposers = [(plane_a.clone(), 1), (plane_b.clone(), 2)].map(|(plane, n)| {
            let record = PortRecord {
                token_hash: hash(u64::from(p) * 10 + n),
                ..port(sbx, p)
            };
            tokio::spawn(async move { plane.upsert_port(&record).await.expect("upsert") })
        });
        races.push(exposers);
    }
    for (i, [first, second]) in races.into_iter().enumerate() {
        let new = [first.await.expect("task"), second.await.expect("task")];
        assert_eq!(
            new.iter().filter(|n| **n).count(),
            1,
            "port {}: {new:?}",
            i + 1
        );
    }
    assert_eq!(
        plane_b.list_ports(&sbx).await.unwrap().len(),
        usize::from(PORTS)
    );
}
