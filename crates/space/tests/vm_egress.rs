//! Egress of VM sandboxes (issue 18: "egress reach[es] the VM's network the same
//! way"): `space up` with two VM workers and egress on; the guest's NIC is QEMU's
//! user-mode network inside the execution's own network namespace, whose connections
//! leave through the sandbox's veth — so the worker's proxy, resolver and rules judge
//! a VM's traffic exactly as a jail's. The "remote" hosts are the egress tests' test
//! hosts (servers in network namespaces this test creates, addresses routed only
//! into them); the upstream DNS is this test's server on 127.0.0.1.

use std::net::Ipv4Addr;
use std::path::Path;
use std::time::Duration;

use dns::DnsServer;
use net::TestHost;
use probes::{api, run, sh};
use space_testkit::cluster::{Cluster, can_run_jails};

#[path = "egress/dns.rs"]
#[allow(
    dead_code,
    reason = "the egress tests' DNS server; this test uses part of it"
)]
mod dns;
#[path = "egress/net.rs"]
#[allow(
    dead_code,
    reason = "the egress tests' hosts; this test uses part of them"
)]
mod net;
#[path = "egress/probes.rs"]
#[allow(
    dead_code,
    reason = "the egress tests' probes; this test uses part of them"
)]
mod probes;
#[path = "vm/support.rs"]
mod support;

/// The egress tests' number of this test (its slots and test hosts).
const TEST: u8 = 20;

/// Why this test cannot run here, if it cannot.
fn missing() -> Option<String> {
    if !can_run_jails() {
        return Some("root, namespaces and cgroups (see can_run_jails)".into());
    }
    net::missing().or_else(support::missing_vm)
}

/// `GET /` with `Host: {name}` to `{addr}:80` from `id` (busybox's netcat): the
/// answer's status line and body, `None` without an answer. The proxy judges the
/// name; the address plays no part over HTTP.
fn get(c: &Cluster, id: &str, addr: Ipv4Addr, name: &str) -> Option<(String, String)> {
    let (_, out, _) = run(
        c,
        id,
        &format!(
            // Stdin stays open a while: busybox's netcat ends when it closes.
            "(printf 'GET / HTTP/1.0\\r\\nHost: {name}\\r\\n\\r\\n'; sleep 5) | busybox nc -w 5 {addr} 80"
        ),
    );
    let (head, body) = out.split_once("\r\n\r\n")?;
    let status = head.lines().next()?.to_owned();
    Some((status, body.to_owned()))
}

/// Whether `get` reached the host: a 200 with its name as the body.
fn reached(answer: &Option<(String, String)>, host: &str) -> bool {
    answer
        .as_ref()
        .is_some_and(|(status, body)| status.contains(" 200") && body.trim() == host)
}

#[test]
fn a_vm_sandbox_reaches_allowed_hosts_through_the_platforms_proxy_and_resolver_and_keeps_its_policy_across_a_migration()
 {
    if let Some(what) = missing() {
        assert!(
            std::env::var_os("SPACE_REQUIRE_VM").is_none_or(|v| v != "1"),
            "SPACE_REQUIRE_VM=1, and the VM egress test cannot run: it needs {what}"
        );
        eprintln!("SKIPPED: the VM egress test needs {what}");
        return;
    }
    let a = TestHost::start(TEST, 0, "a", None);
    let b = TestHost::start(TEST, 1, "b", None);
    let dns = DnsServer::start(&[("a.test", a.addr), ("b.test", b.addr)]);
    let kernel = support::kernel_dir();
    let agent = space_testkit::static_agent();
    let slot = (200 + 2 * u32::from(TEST)).to_string();
    let upstream = dns.addr.to_string();
    let c = Cluster::start_with_env(&[
        ("SPACE_NO_EGRESS", "0"),
        ("SPACE_EGRESS_SLOT", slot.as_str()),
        ("SPACE_EGRESS_DNS", upstream.as_str()),
        ("SPACE_AGENT", agent.to_str().unwrap()),
        ("SPACE_VM_WORKERS", "2"),
        ("SPACE_VM_KERNEL_DIR", kernel.to_str().unwrap()),
    ]);
    let dir = tempfile::tempdir().unwrap();
    let archive = dir.path().join("image.tar");
    space_image::sample::write_docker_save(&archive, Path::new(support::BUSYBOX)).unwrap();
    let out = c.cli(&[
        "template",
        "import",
        "spacetest:1",
        archive.to_str().unwrap(),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    let create = |network: serde_json::Value| {
        let body = serde_json::json!({
            "template": "spacetest:1",
            "substrate": "vm",
            "limits": {"memory_mib": 256},
            "network": network,
        });
        let (status, view) = api(&c, "POST", "/v1/sandboxes", &body.to_string());
        assert!(status == 200 || status == 201, "create: {status} {view}");
        view["id"].as_str().expect("an ID").to_owned()
    };
    let id = create(serde_json::json!({"mode": "egress", "allow": ["a.test"]}));

    // The guest's resolver is the platform's: an allowed name resolves to the test
    // host, a name outside the allow list does not resolve.
    let looked_up = sh(&c, &id, "busybox nslookup a.test");
    assert!(looked_up.contains(&a.addr.to_string()), "{looked_up}");
    let (code, out, err) = run(&c, &id, "busybox nslookup b.test");
    assert!(
        code != 0 || !out.contains(&b.addr.to_string()),
        "a denied name resolved: {out}{err}"
    );
    assert!(dns.asked("a.test") >= 1);
    assert_eq!(
        dns.asked("b.test"),
        0,
        "the platform asked upstream for a denied name"
    );

    // HTTP by name through the platform's proxy: the allowed name is reached, the
    // other refused though its host is up and routed.
    let answer = get(&c, &id, a.addr, "a.test");
    assert!(reached(&answer, "a"), "{answer:?}");
    let answer = get(&c, &id, b.addr, "b.test");
    assert!(
        !reached(&answer, "b"),
        "a denied name was reached: {answer:?}"
    );

    // Migrated to the other worker, a new execution with the same policy: the same
    // guest (its network unchanged in its memory) reaches the same hosts.
    let before = c.sandbox(&id)["execution"].clone();
    let target = if before["worker"] == "w1" { "w2" } else { "w1" };
    let out = c.cli(&["--json", "sandbox", "migrate", &id, "--worker", target]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(c.sandbox(&id)["execution"]["worker"], target);
    let answer = get(&c, &id, a.addr, "a.test");
    assert!(reached(&answer, "a"), "after the migration: {answer:?}");
    let answer = get(&c, &id, b.addr, "b.test");
    assert!(!reached(&answer, "b"), "after the migration: {answer:?}");

    // A VM sandbox without a network reaches nothing, fast.
    let none = create(serde_json::json!({"mode": "none"}));
    let started = std::time::Instant::now();
    let answer = get(&c, &none, a.addr, "a.test");
    assert_eq!(answer, None, "a sandbox without a network got an answer");
    assert!(
        started.elapsed() < Duration::from_secs(15),
        "took {:?}",
        started.elapsed()
    );
}
