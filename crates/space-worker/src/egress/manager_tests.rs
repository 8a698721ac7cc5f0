//! The egress manager against the real kernel: links given and taken with each
//! execution, the table following them, a policy change swapping the rules, and
//! nothing put back after the worker's egress shut down. The "sandboxes" are python
//! peers in network namespaces of their own (see [`super::testnet`]); no packet is
//! sent anywhere.

use space_egress::{GlobalDeny, Policy};
use space_identity::{Execution, ExecutionId, Generation, SandboxId};

use super::manager::{Egress, EgressConfig, Slot};
use super::nft;
use super::testnet::{Peer, TableGuard, policy, require_tools};
use super::veth::link_exists;

/// A slot no other test (nor the e2e tests' 200+, nor the bench's 250) takes.
fn slot() -> Slot {
    Slot::new(128 + (std::process::id() % 64) as u8).unwrap()
}

fn execution(n: u8) -> Execution {
    let generation = (1..n).fold(Generation::FIRST, |g, _| g.next());
    Execution {
        generation,
        id: ExecutionId::from_bytes([n; 16]),
    }
}

fn table_text(slot: Slot) -> String {
    let out = std::process::Command::new("nft")
        .args(["list", "table", "inet", slot.table().as_str()])
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).into_owned()
}

async fn start(slot: Slot) -> std::sync::Arc<Egress> {
    Egress::start(EgressConfig {
        slot,
        global: GlobalDeny::defaults(),
        // Never asked: nothing here resolves a name.
        upstream: vec!["127.0.0.1:9".parse().unwrap()],
    })
    .await
    .expect("egress starts")
}

#[tokio::test(flavor = "multi_thread")]
async fn links_follow_executions_and_nothing_is_put_back_after_shutdown() {
    require_tools!();
    let slot = slot();
    let _table = TableGuard(slot.table());
    let egress = start(slot).await;
    let sandbox = SandboxId::from_bytes([9; 16]);
    let peer = Peer::start(true, "sandbox", &[]);
    let init = peer.identity();
    let first = execution(1);
    let allow = policy(&["203.0.113.0/24"], &[]);

    let e = std::sync::Arc::clone(&egress);
    let (p, i) = (allow.clone(), init);
    tokio::task::spawn_blocking(move || e.apply(&sandbox, first, &i, &p))
        .await
        .unwrap()
        .expect("a link for mode egress");
    let link = format!("sxh{}-0", slot.tag());
    assert!(link_exists(&link), "the host side {link} exists");
    let inside = peer.inside(&["ip", "-4", "addr", "show", "eth0"]);
    let shown = String::from_utf8_lossy(&inside.stdout).into_owned();
    let std::net::IpAddr::V4(base) = slot.block().net().addr() else {
        unreachable!()
    };
    let own = std::net::Ipv4Addr::from(u32::from(base) + 1);
    assert!(shown.contains(&format!("inet {own}/31")), "{inside:?}");
    let text = table_text(slot);
    assert!(text.contains("203.0.113.0/24"), "{text}");
    assert!(egress.tenant_of(&sandbox, first).is_some());
    assert!(egress.tenant_of(&sandbox, execution(2)).is_none());

    // A new policy for the same execution: the same link, new rules.
    let e = std::sync::Arc::clone(&egress);
    let tighter = policy(&["198.51.100.7"], &[]);
    let (p, i) = (tighter.clone(), init);
    tokio::task::spawn_blocking(move || e.apply(&sandbox, first, &i, &p))
        .await
        .unwrap()
        .unwrap();
    let text = table_text(slot);
    assert!(
        text.contains("198.51.100.7") && !text.contains("203.0.113.0/24"),
        "{text}"
    );
    assert_eq!(*egress.tenant(&sandbox).unwrap().policy(), tighter);

    // Another execution's release leaves this one's link alone; its own removes it.
    egress.release(&sandbox, Some(execution(2)));
    assert!(link_exists(&link));
    egress.release(&sandbox, Some(first));
    assert!(!link_exists(&link), "the link went with its execution");
    assert!(!table_text(slot).contains("198.51.100.7"));

    // Mode none gives no link.
    let e = std::sync::Arc::clone(&egress);
    tokio::task::spawn_blocking(move || e.apply(&sandbox, first, &init, &Policy::none()))
        .await
        .unwrap()
        .unwrap();
    assert!(!link_exists(&link));

    egress.shutdown();
    assert!(
        !nft::table_exists(&slot.table()).unwrap(),
        "shutdown removes the table"
    );
    // A teardown that finishes after the shutdown (an agent that died meanwhile) must
    // not apply the table again, and no new link is given.
    egress.release(&sandbox, None);
    let e = std::sync::Arc::clone(&egress);
    let refused =
        tokio::task::spawn_blocking(move || e.apply(&sandbox, execution(3), &init, &allow))
            .await
            .unwrap();
    assert!(refused.is_err());
    assert!(!nft::table_exists(&slot.table()).unwrap());
    assert!(!link_exists(&link));
}

#[test]
fn slots_take_disjoint_blocks_of_240_4_and_short_tags() {
    let a = Slot::new(0).unwrap();
    let b = Slot::new(1).unwrap();
    let last = Slot::new(254).unwrap();
    assert_eq!(a.block().to_string(), "240.0.0.0/12");
    assert_eq!(b.block().to_string(), "240.16.0.0/12");
    assert_eq!(last.block().to_string(), "255.224.0.0/12");
    // The last /12 holds the broadcast address: no slot.
    assert!(Slot::new(255).is_none());
    assert!(!a.block().net().overlaps(&b.block().net()));
    assert_eq!(a.tag(), "0");
    assert_eq!(Slot::new(35).unwrap().tag(), "z");
    assert_eq!(Slot::new(36).unwrap().tag(), "10");
    assert_eq!(last.tag(), "72");
    assert_eq!(last.table().as_str(), "space_egress_254");
}

#[test]
fn the_proxy_never_takes_more_connections_than_the_workers_descriptors_allow() {
    use super::manager::connections_within;
    // The common soft limit: 1024 descriptors leave room for the floor only.
    assert_eq!(connections_within(1024, 8192), 16);
    // 65,536: (65,536 − 2,048) / 6.
    assert_eq!(connections_within(65_536, 8192), 8192);
    assert_eq!(connections_within(20_480, 8192), 3072);
    assert_eq!(connections_within(u64::MAX, 100), 100);
}

#[test]
fn a_rootless_worker_refuses_egress_saying_why_and_what_would_be_needed() {
    let why = super::manager::unavailable(true).expect("refused");
    assert!(why.contains("rootless"), "{why}");
    assert!(
        why.contains("pasta") && why.contains("slirp4netns"),
        "{why}"
    );
}
