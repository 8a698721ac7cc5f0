//! Hostile workloads and callers against per-sandbox limits, through a real `space up`:
//! a disk flood, a memory hog, limits past the maxima, a tenant over its quota.

use std::os::unix::fs::MetadataExt;

use space_testkit::cluster as support;
use support::{Cluster, can_run_jails, http};

const MIB: u64 = 1 << 20;

/// A new tenant named `name`: the `Bearer …` header of its API key.
fn new_tenant(c: &Cluster, name: &str) -> String {
    let (status, t) = http(
        "POST",
        &format!("{}/v1/tenants", c.url),
        Some(&format!("Bearer {}", c.admin_key)),
        serde_json::json!({ "name": name }).to_string().as_bytes(),
    );
    assert_eq!(status, 201);
    format!("Bearer {}", json(&t)["api_key"].as_str().unwrap())
}

fn json(bytes: &[u8]) -> serde_json::Value {
    serde_json::from_slice(bytes).unwrap_or(serde_json::Value::Null)
}

fn create(c: &Cluster, auth: &str, body: &str) -> (u16, serde_json::Value) {
    let (status, body) = http(
        "POST",
        &format!("{}/v1/sandboxes", c.url),
        Some(auth),
        body.as_bytes(),
    );
    (status, json(&body))
}

fn exec(c: &Cluster, auth: &str, id: &str, sh: &str) -> serde_json::Value {
    let body = serde_json::json!({"cmd": ["sh", "-c", sh], "timeout_secs": 120});
    let (status, out) = http(
        "POST",
        &format!("{}/v1/sandboxes/{id}/exec", c.url),
        Some(auth),
        body.to_string().as_bytes(),
    );
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&out));
    json(&out)
}

/// Bytes a worker's disk image takes on the host.
fn image_bytes(c: &Cluster, worker: &str) -> u64 {
    let _ = std::process::Command::new("sync").status();
    std::fs::metadata(c.worker_dir(worker).join("disk.img"))
        .map(|m| m.blocks() * 512)
        .unwrap_or(0)
}

#[test]
fn writes_past_the_disk_limit_get_enospc_inside() {
    if !can_run_jails() {
        return;
    }
    let c = Cluster::start();
    let admin = format!("Bearer {}", c.admin_key);
    if !c.worker_dir("w1").join("disk.img").exists() {
        eprintln!("skipping: the workers have no disk volume (mkfs.btrfs missing?)");
        return;
    }
    let (status, s) = create(&c, &admin, r#"{"limits": {"disk_mib": 64}}"#);
    assert_eq!(status, 201, "{s}");
    assert_eq!(s["limits"]["disk_mib"], 64, "{s}");
    let id = s["id"].as_str().unwrap().to_owned();
    let worker = s["execution"]["worker"].as_str().unwrap().to_owned();
    let before = image_bytes(&c, &worker);
    let out = exec(
        &c,
        &admin,
        &id,
        "dd if=/dev/zero of=/root/flood bs=1M count=300 2>&1; sync; stat -c %s /root/flood",
    );
    let stdout = out["stdout"].as_str().unwrap();
    // Quota errors are EDQUOT ("Disk quota exceeded"), the disk-full kind of ENOSPC.
    assert!(stdout.contains("Disk quota exceeded"), "{out}");
    let written: u64 = stdout.lines().last().unwrap().trim().parse().unwrap();
    assert!(written <= 64 * MIB, "{written} bytes past a 64 MiB limit");
    let grown = image_bytes(&c, &worker).saturating_sub(before);
    eprintln!(
        "disk_mib 64, 300 MiB written: the host lost {} MiB",
        grown / MIB
    );
    assert!(
        grown <= 64 * MIB + 48 * MIB,
        "host lost {} MiB",
        grown / MIB
    );

    // The limit stays with the sandbox: migrated, it is as full as before.
    let other = if worker == "w1" { "w2" } else { "w1" };
    let (status, moved) = http(
        "POST",
        &format!("{}/v1/sandboxes/{id}/migrate", c.url),
        Some(&admin),
        format!(r#"{{"worker":"{other}"}}"#).as_bytes(),
    );
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&moved));
    assert_eq!(json(&moved)["limits"]["disk_mib"], 64);
    let out = exec(
        &c,
        &admin,
        &id,
        "dd if=/dev/zero of=/root/more bs=1M count=100 2>&1",
    );
    assert!(
        out["stdout"]
            .as_str()
            .unwrap()
            .contains("Disk quota exceeded"),
        "after migration: {out}"
    );
}

#[test]
fn memory_hog_exec_says_oom_killed() {
    if !can_run_jails() {
        return;
    }
    let c = Cluster::start();
    let admin = format!("Bearer {}", c.admin_key);
    let (status, s) = create(&c, &admin, r#"{"limits": {"memory_mib": 128}}"#);
    assert_eq!(status, 201, "{s}");
    assert_eq!(s["limits"]["memory_mib"], 128);
    let id = s["id"].as_str().unwrap().to_owned();
    let out = exec(
        &c,
        &admin,
        &id,
        "python3 -c \"b = bytearray(512 << 20); print('survived')\"",
    );
    assert_eq!(out["oom_killed"], true, "{out}");
    assert_eq!(out["memory_limit_mib"], 128, "{out}");
    assert_eq!(out["exit_code"], 137, "{out}");
    // A normal exec after it says nothing of the kind.
    let fine = exec(&c, &admin, &id, "echo fine");
    assert_eq!(fine["oom_killed"], false, "{fine}");
    // The CLI says why.
    let cli = c.cli(&[
        "exec",
        &id,
        "--",
        "python3",
        "-c",
        "b = bytearray(512 << 20)",
    ]);
    let stderr = String::from_utf8_lossy(&cli.stderr);
    assert!(
        stderr.contains("killed: out of memory (limit 128 MiB)"),
        "{stderr}"
    );
}

#[test]
fn limits_past_the_maxima_or_unknown_are_refused_with_400() {
    if !can_run_jails() {
        return;
    }
    let c = Cluster::start();
    let admin = format!("Bearer {}", c.admin_key);
    for body in [
        r#"{"limits": {"memory_mib": 0}}"#,
        r#"{"limits": {"memory_mib": 1000000000}}"#,
        r#"{"limits": {"cpus": -1}}"#,
        r#"{"limits": {"pids": 1000000}}"#,
        r#"{"limits": {"disk_mib": 18446744073709551615}}"#,
        r#"{"limits": {"swap_mib": 1}}"#,
        r#"{"limits": {"memory_mib": "lots"}}"#,
    ] {
        let (status, e) = create(&c, &admin, body);
        assert_eq!(status, 400, "{body}: {e}");
        assert!(e["error"].is_string(), "{body}: {e}");
    }
}

#[test]
fn tenant_over_its_sandbox_quota_is_refused() {
    if !can_run_jails() {
        return;
    }
    let c = Cluster::start_with_env(&[("SPACE_TENANT_SANDBOXES", "3")]);
    let admin = format!("Bearer {}", c.admin_key);
    let greedy = new_tenant(&c, "greedy");
    let mut ids = Vec::new();
    for _ in 0..3 {
        let (status, s) = create(&c, &greedy, "{}");
        assert_eq!(status, 201, "{s}");
        ids.push(s["id"].as_str().unwrap().to_owned());
    }
    let (status, e) = create(&c, &greedy, "{}");
    assert_eq!(status, 429, "{e}");
    assert_eq!(e["error"], "quota_exceeded", "{e}");
    // Another tenant is not affected; a deleted sandbox frees its place.
    let (status, _) = create(&c, &admin, "{}");
    assert_eq!(status, 201);
    let (status, _) = http(
        "DELETE",
        &format!("{}/v1/sandboxes/{}", c.url, ids[0]),
        Some(&greedy),
        b"",
    );
    assert_eq!(status, 204);
    let (status, s) = create(&c, &greedy, "{}");
    assert_eq!(status, 201, "{s}");
}

#[test]
fn a_burst_of_creates_never_passes_the_tenant_quota() {
    if !can_run_jails() {
        return;
    }
    let c = Cluster::start_with_env(&[("SPACE_TENANT_SANDBOXES", "3")]);
    let bursty = new_tenant(&c, "bursty");
    // Twelve creates at once (each would read the same count of live sandboxes).
    let statuses: Vec<u16> = std::thread::scope(|scope| {
        let threads: Vec<_> = (0..12)
            .map(|i| {
                let (c, bursty) = (&c, &bursty);
                scope.spawn(move || {
                    // Half claim standby sandboxes, half start their own.
                    let body = if i % 2 == 0 {
                        "{}"
                    } else {
                        r#"{"env": {"A": "1"}}"#
                    };
                    create(c, bursty, body).0
                })
            })
            .collect();
        threads.into_iter().map(|t| t.join().unwrap()).collect()
    });
    let created = statuses.iter().filter(|s| **s == 201).count();
    assert!(
        created <= 3,
        "{created} sandboxes under a quota of 3: {statuses:?}"
    );
    assert!(created >= 1, "{statuses:?}");
    assert!(
        statuses.iter().all(|s| *s == 201 || *s == 429),
        "{statuses:?}"
    );
    let (_, list) = http(
        "GET",
        &format!("{}/v1/sandboxes", c.url),
        Some(&bursty),
        b"",
    );
    assert_eq!(json(&list).as_array().unwrap().len(), created);
}

#[test]
fn cli_create_flags_set_the_sandboxs_limits_and_bad_ones_are_refused() {
    if !can_run_jails() {
        return;
    }
    let c = Cluster::start();
    let id = c.create(&[
        "--memory-mib",
        "256",
        "--cpus",
        "0.5",
        "--pids",
        "64",
        "--disk-mib",
        "128",
    ]);
    let s = c.sandbox(&id);
    assert_eq!(s["limits"]["memory_mib"], 256, "{s}");
    assert_eq!(s["limits"]["cpus"], 0.5, "{s}");
    assert_eq!(s["limits"]["pids"], 64, "{s}");
    assert_eq!(s["limits"]["disk_mib"], 128, "{s}");
    // The pids limit holds inside.
    let out = c.cli(&[
        "exec",
        &id,
        "--",
        "sh",
        "-c",
        "for i in $(seq 200); do sleep 5 & done 2>&1 | grep -c 'fork\\|Resource' ; true",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let refused: u32 = String::from_utf8_lossy(&out.stdout)
        .trim()
        .parse()
        .unwrap_or(0);
    assert!(
        refused > 0,
        "200 processes started under a pids limit of 64"
    );
    // Bad input gets a clear error and creates nothing.
    let before = c.cli(&["--json", "sandbox", "list"]).stdout;
    let bad = c.cli(&["sandbox", "create", "--memory-mib", "0"]);
    assert!(!bad.status.success());
    assert!(
        String::from_utf8_lossy(&bad.stderr).contains("invalid_limits")
            || String::from_utf8_lossy(&bad.stderr).contains("memory"),
        "{}",
        String::from_utf8_lossy(&bad.stderr)
    );
    assert_eq!(c.cli(&["--json", "sandbox", "list"]).stdout, before);
}
