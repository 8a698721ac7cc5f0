//! The warm pool through `space up`: creates are served by jails launched ahead of
//! demand, the pool refills, and neither a clean stop nor a crash leaves a warm jail
//! behind.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use space_testkit::cluster as support;
use support::{Cluster, TEST_WARM_POOL, can_run_jails};

fn pool_size() -> usize {
    TEST_WARM_POOL.parse().unwrap()
}

/// Names under `dir` starting with `warm_`.
fn warm_names(dir: &std::path::Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .map(|d| {
            d.flatten()
                .filter_map(|e| e.file_name().into_string().ok())
                .filter(|n| n.starts_with("warm_"))
                .collect()
        })
        .unwrap_or_default()
}

/// Every cgroup directory (any controller, one level below the sandboxes' parents)
/// whose name starts with one of `prefixes`.
fn cgroups_named(prefixes: &[String]) -> Vec<PathBuf> {
    let mut found = Vec::new();
    for controller in std::fs::read_dir("/sys/fs/cgroup").unwrap().flatten() {
        for parent in std::fs::read_dir(controller.path())
            .into_iter()
            .flatten()
            .flatten()
        {
            if !parent.path().is_dir() {
                continue;
            }
            for child in std::fs::read_dir(parent.path())
                .into_iter()
                .flatten()
                .flatten()
            {
                let name = child.file_name().to_string_lossy().into_owned();
                if prefixes.iter().any(|p| name.starts_with(p.as_str())) {
                    found.push(child.path());
                }
            }
        }
    }
    found
}

#[test]
fn creates_are_served_by_warm_jails_and_the_pool_refills() {
    if !can_run_jails() {
        return;
    }
    let c = Cluster::start();
    c.wait_for_warm_pools(pool_size());
    let ids: Vec<String> = (0..pool_size())
        .map(|_| c.create(&["--worker", "w1"]))
        .collect();
    assert!(
        c.worker_metric("w1", "space_worker_warm_activations_total") >= 1.0,
        "no create was served by a warm jail"
    );
    for id in &ids {
        // The activated jail is this sandbox's: its hostname, its files, its execution.
        let out = c.cli(&["exec", id, "--", "sh", "-c", "hostname; echo ok > /root/f"]);
        assert!(out.status.success());
        assert_eq!(
            String::from_utf8_lossy(&out.stdout).trim(),
            id.replace('_', "-")
        );
        let got = c.cli(&["fs", "get", id, "/root/f", "-"]);
        assert_eq!(String::from_utf8_lossy(&got.stdout), "ok\n");
    }
    // Directories carry the execution's name, not the placeholder's.
    let dirs = std::fs::read_dir(c.worker_dir("w1").join("sandboxes")).unwrap();
    let named: Vec<String> = dirs
        .flatten()
        .filter_map(|e| e.file_name().into_string().ok())
        .filter(|n| !n.starts_with("warm_"))
        .collect();
    for id in &ids {
        assert!(
            named.iter().any(|n| n.starts_with(id.as_str())),
            "{named:?}"
        );
    }
    // The pool fills up again once creates stop.
    c.wait_for_warm_pools(pool_size());
    // The sandboxes count as running; the warm jails do not count as sandboxes.
    assert_eq!(
        c.worker_metric("w1", "space_worker_sandboxes{state=\"running\"}"),
        ids.len() as f64
    );
}

#[test]
fn a_crashed_worker_leaves_no_warm_jail_behind() {
    if !can_run_jails() {
        return;
    }
    let mut c = Cluster::start();
    c.wait_for_warm_pools(pool_size());
    let before: Vec<String> = ["w1", "w2"]
        .iter()
        .flat_map(|w| warm_names(&c.worker_dir(w).join("sandboxes")))
        .collect();
    assert_eq!(before.len(), 2 * pool_size());
    let prefixes: Vec<String> = before
        .iter()
        .map(|n| n.split('.').next().unwrap().to_owned())
        .collect();
    assert!(!cgroups_named(&prefixes).is_empty());
    c.crash_and_restart();
    c.wait_for_warm_pools(pool_size());
    // The restarted workers swept the old warm jails: directories, sockets, cgroups.
    for w in ["w1", "w2"] {
        for dir in ["sandboxes", "run"] {
            let now = warm_names(&c.worker_dir(w).join(dir));
            assert!(
                prefixes
                    .iter()
                    .all(|p| !now.iter().any(|n| n.starts_with(p.as_str()))),
                "{w}/{dir}: {now:?}"
            );
        }
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    while !cgroups_named(&prefixes).is_empty() {
        assert!(Instant::now() < deadline, "{:?}", cgroups_named(&prefixes));
        std::thread::sleep(Duration::from_millis(50));
    }
    // And the platform still creates sandboxes.
    let id = c.create(&[]);
    assert!(c.cli(&["exec", &id, "--", "true"]).status.success());
}

#[test]
fn a_clean_stop_leaves_no_warm_jail_behind() {
    if !can_run_jails() {
        return;
    }
    let mut c = Cluster::start();
    c.wait_for_warm_pools(pool_size());
    let prefixes: Vec<String> = ["w1", "w2"]
        .iter()
        .flat_map(|w| warm_names(&c.worker_dir(w).join("sandboxes")))
        .map(|n| n.split('.').next().unwrap().to_owned())
        .collect();
    c.stop();
    for w in ["w1", "w2"] {
        assert!(warm_names(&c.worker_dir(w).join("sandboxes")).is_empty());
        assert!(warm_names(&c.worker_dir(w).join("run")).is_empty());
    }
    assert!(
        cgroups_named(&prefixes).is_empty(),
        "{:?}",
        cgroups_named(&prefixes)
    );
}

fn wait_for_standby(c: &Cluster, n: f64) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while c.control_metric("space_control_standby_ready") < n {
        assert!(
            Instant::now() < deadline,
            "standby sandboxes did not come up"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn a_plain_create_claims_a_standby_sandbox_that_then_belongs_to_the_caller_alone() {
    if !can_run_jails() {
        return;
    }
    let c = Cluster::start_with_env(&[("SPACE_STANDBY", "2")]);
    let admin = format!("Bearer {}", c.admin_key);
    wait_for_standby(&c, 2.0);
    // Standby sandboxes belong to nobody: no tenant lists them.
    let (_, body) = support::http("GET", &format!("{}/v1/sandboxes", c.url), Some(&admin), b"");
    assert_eq!(
        serde_json::from_slice::<serde_json::Value>(&body).unwrap(),
        serde_json::json!([])
    );
    let make_tenant = |name: &str| {
        let (status, body) = support::http(
            "POST",
            &format!("{}/v1/tenants", c.url),
            Some(&admin),
            format!(r#"{{"name":"{name}"}}"#).as_bytes(),
        );
        assert_eq!(status, 201);
        let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
        format!("Bearer {}", v["api_key"].as_str().unwrap())
    };
    let (alice, bob) = (make_tenant("alice"), make_tenant("bob"));
    let (status, body) = support::http(
        "POST",
        &format!("{}/v1/sandboxes", c.url),
        Some(&alice),
        br#"{"metadata":{"job":"7"},"ttl_secs":600}"#,
    );
    assert_eq!(status, 201, "{}", String::from_utf8_lossy(&body));
    let created: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(c.control_metric("space_control_standby_claims_total"), 1.0);
    let id = created["id"].as_str().unwrap().to_owned();
    // Stamped for its owner: metadata, a TTL from now, running, with an execution.
    assert_eq!(created["metadata"]["job"], "7");
    assert_eq!(created["state"], "running");
    assert!(created["execution"]["generation"].as_u64().unwrap() >= 1);
    assert!(created["expires_at"].is_string());
    let (_, listed) = support::http("GET", &format!("{}/v1/sandboxes", c.url), Some(&alice), b"");
    let listed: serde_json::Value = serde_json::from_slice(&listed).unwrap();
    assert_eq!(listed.as_array().unwrap().len(), 1);
    assert_eq!(listed[0]["id"], id.as_str());
    // Alice's alone: Bob gets 404, as for any sandbox not his.
    let (status, _) = support::http(
        "GET",
        &format!("{}/v1/sandboxes/{id}", c.url),
        Some(&bob),
        b"",
    );
    assert_eq!(status, 404);
    // Ready for its first exec, with its own hostname.
    let (status, body) = support::http(
        "POST",
        &format!("{}/v1/sandboxes/{id}/exec", c.url),
        Some(&alice),
        br#"{"cmd":["hostname"]}"#,
    );
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
    let out: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(out["stdout"].as_str().unwrap().trim(), id.replace('_', "-"));
    // A create with its own environment starts its own sandbox.
    let (status, body) = support::http(
        "POST",
        &format!("{}/v1/sandboxes", c.url),
        Some(&alice),
        br#"{"env":{"GREETING":"hi"}}"#,
    );
    assert_eq!(status, 201);
    assert_eq!(c.control_metric("space_control_standby_claims_total"), 1.0);
    let env_id = serde_json::from_slice::<serde_json::Value>(&body).unwrap()["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let (_, body) = support::http(
        "POST",
        &format!("{}/v1/sandboxes/{env_id}/exec", c.url),
        Some(&alice),
        br#"{"cmd":["sh","-c","echo $GREETING"]}"#,
    );
    let out: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(out["stdout"].as_str().unwrap(), "hi\n");
    // The keeper tops the standby sandboxes up again.
    wait_for_standby(&c, 2.0);
}

/// `spaced-host` zombies whose parent is a worker of this cluster.
fn zombie_bridges(c: &Cluster) -> Vec<i32> {
    let data = c.data_dir();
    let workers: Vec<i32> = std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().to_string_lossy().parse::<i32>().ok())
        .filter(|pid| {
            let cmd = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            let cmd = String::from_utf8_lossy(&cmd);
            cmd.contains("worker") && cmd.contains(data.to_str().unwrap())
        })
        .collect();
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().to_string_lossy().parse::<i32>().ok())
        .filter(|pid| {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
            let Some(rest) = stat.rsplit_once(") ").map(|(_, r)| r.to_owned()) else {
                return false;
            };
            let f: Vec<&str> = rest.split(' ').collect();
            stat.contains("(spaced-host)")
                && f.first() == Some(&"Z")
                && f.get(1)
                    .and_then(|p| p.parse::<i32>().ok())
                    .is_some_and(|pp| workers.contains(&pp))
        })
        .collect()
}

#[test]
fn bridges_of_deleted_sandboxes_are_reaped() {
    if !can_run_jails() {
        return;
    }
    let c = Cluster::start();
    let ids: Vec<String> = (0..3).map(|_| c.create(&[])).collect();
    for id in &ids {
        assert!(c.cli(&["sandbox", "rm", id]).status.success());
    }
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let zombies = zombie_bridges(&c);
        if zombies.is_empty() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "bridges left as zombies: {zombies:?}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}
