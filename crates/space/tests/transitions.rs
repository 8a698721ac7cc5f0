//! Operations across lifecycle transitions: a resolve during a migration waits for the
//! next execution instead of answering `not_running`, within its bound; a request to
//! an execution frozen for a snapshot waits for its outcome.

use std::time::{Duration, Instant};

use space_testkit::cluster as support;
use support::{Cluster, Signer, can_run_jails, http};

fn json(bytes: &[u8]) -> serde_json::Value {
    serde_json::from_slice(bytes)
        .unwrap_or_else(|_| panic!("not JSON: {}", String::from_utf8_lossy(bytes)))
}

fn capability(c: &Cluster, sandbox: &str, extra: serde_json::Value) -> (u16, serde_json::Value) {
    let mut body = serde_json::json!({"access": ["exec", "fs_read"], "purpose": "control"});
    if let (Some(b), Some(e)) = (body.as_object_mut(), extra.as_object()) {
        b.extend(e.clone());
    }
    let (status, body) = http(
        "POST",
        &format!("{}/v1/sandboxes/{sandbox}/capabilities", c.url),
        Some(&format!("Bearer {}", c.admin_key)),
        body.to_string().as_bytes(),
    );
    (status, json(&body))
}

/// A sandbox on w1 holding `mib` MiB of incompressible data, so that moving it takes a
/// while.
fn sandbox_with_data(c: &Cluster, mib: u32) -> String {
    let id = c.create(&["--worker", "w1"]);
    let out = c.cli(&[
        "exec",
        &id,
        "--",
        "sh",
        "-c",
        &format!("head -c {mib}M /dev/urandom > /root/data && sync"),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    id
}

/// Starts a migration of `id` to w2 in the background and returns once the control
/// plane says it is under way.
fn migrating(c: &Cluster, id: &str) -> std::process::Child {
    let child = std::process::Command::new(support::space_bin())
        .args(["sandbox", "migrate", id, "--worker", "w2"])
        .env("SPACE_URL", &c.url)
        .env("SPACE_API_KEY", &c.admin_key)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while c.sandbox(id)["state"] != "migrating" {
        assert!(Instant::now() < deadline, "the migration never showed");
        std::thread::sleep(Duration::from_millis(5));
    }
    child
}

#[test]
fn a_resolve_during_a_migration_waits_for_the_next_execution_instead_of_answering_not_running() {
    if !can_run_jails() {
        return;
    }
    let c = Cluster::start();
    let id = sandbox_with_data(&c, 192);
    let (_, before) = capability(&c, &id, serde_json::json!({}));
    let mut migration = migrating(&c, &id);
    // Asked while the sandbox is migrating: the answer names the execution on w2.
    let (status, cap) = capability(&c, &id, serde_json::json!({}));
    assert_eq!(status, 200, "{cap}");
    assert_eq!(cap["route"]["worker"], "w2", "{cap}");
    assert!(
        cap["route"]["generation"].as_u64() > before["route"]["generation"].as_u64(),
        "{cap} after {before}"
    );
    assert!(migration.wait().unwrap().success());
    // And it is the execution that serves now.
    let now = c.sandbox(&id);
    assert_eq!(
        now["execution"]["execution_id"],
        cap["route"]["execution_id"]
    );
}

#[test]
fn a_resolve_that_waits_past_its_bound_answers_503_transitioning_naming_the_state() {
    if !can_run_jails() {
        return;
    }
    let c = Cluster::start();
    let id = sandbox_with_data(&c, 192);
    let mut migration = migrating(&c, &id);
    let (status, body) = capability(&c, &id, serde_json::json!({"wait_ms": 0}));
    assert_eq!(status, 503, "{body}");
    assert_eq!(body["error"], "transitioning", "{body}");
    assert!(
        body["message"].as_str().unwrap().contains("migrating"),
        "{body}"
    );
    assert!(migration.wait().unwrap().success());
    let (status, body) = capability(&c, &id, serde_json::json!({"wait_ms": 0}));
    assert_eq!(status, 200, "settled: answered at once: {body}");
}

/// A request at a worker for an execution frozen for a snapshot waits past the 2 s a
/// pause gets; when the execution is then retired (a migration's end), it is told to
/// refresh its route (421 `retired`), never `409 paused`.
#[test]
fn a_request_to_an_execution_frozen_for_a_snapshot_waits_for_its_retirement_and_is_told_to_refresh()
{
    if !can_run_jails() {
        return;
    }
    let c = Cluster::start();
    let id = c.create(&["--worker", "w1"]);
    let (_, cap) = capability(&c, &id, serde_json::json!({}));
    let base = cap["route"]["worker_url"].as_str().unwrap().to_owned();
    let on = |kind: &str| {
        serde_json::json!({
            "kind": kind,
            "sandbox": id,
            "generation": cap["route"]["generation"],
            "execution_id": cap["route"]["execution_id"],
        })
    };
    let signer = Signer::of(&c);
    let snapshot = signer.update("w1", on("snapshot"));
    let (status, _) = http(
        "POST",
        &format!("{base}/internal/v1/snapshot"),
        None,
        snapshot.as_bytes(),
    );
    assert_eq!(status, 200);
    // Frozen now. A read of the frozen execution, in the background.
    let token = format!("SpaceCap {}", cap["token"].as_str().unwrap());
    let url = format!("{base}/v1/sandboxes/{id}/files?path=/etc/hostname");
    let reader = std::thread::spawn(move || {
        let start = Instant::now();
        let (status, body) = http("GET", &url, Some(&token), b"");
        (status, json(&body), start.elapsed())
    });
    std::thread::sleep(Duration::from_secs(3));
    let (status, ack) = signer.post_update(
        &format!("{base}/internal/v1/updates"),
        "w1",
        signer.update("w1", on("retire")).as_bytes(),
    );
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&ack));
    let (status, body, waited) = reader.join().unwrap();
    assert_eq!(status, 421, "{body} after {waited:?}");
    assert_eq!(body["reason"], "retired", "{body}");
    assert!(waited >= Duration::from_secs(3), "{waited:?}");
}

/// A rebuilt attempt — the one retry after a RefreshRoute — resolved to an execution
/// just before the next migration of its sandbox began arrives after that migration
/// froze the execution: it waited for the retirement and was refused a second time
/// (3 of 1,000,008 soak operations). The migration now lets it arrive first: the
/// freeze starts a grace (2 s here) after the rebuilt capability was issued.
#[test]
fn a_rebuilt_attempt_resolved_just_before_the_next_migration_is_served_by_its_execution() {
    if !can_run_jails() {
        return;
    }
    let c = Cluster::start_with_env(&[("SPACE_REBUILT_ARRIVAL_MS", "2000")]);
    let id = c.create(&["--worker", "w1"]);
    let (status, cap) = capability(&c, &id, serde_json::json!({"rebuilt": true}));
    assert_eq!(status, 200, "{cap}");
    let issued = Instant::now();
    let mut migration = migrating(&c, &id);
    // Later than the freeze would have come without the grace, well inside it.
    std::thread::sleep(Duration::from_millis(400));
    let base = cap["route"]["worker_url"].as_str().unwrap().to_owned();
    let token = format!("SpaceCap {}", cap["token"].as_str().unwrap());
    let (status, body) = http(
        "GET",
        &format!("{base}/v1/sandboxes/{id}/files?path=/etc/hostname"),
        Some(&token),
        b"",
    );
    let arrived = issued.elapsed();
    assert!(migration.wait().unwrap().success(), "the migration failed");
    assert!(
        arrived < Duration::from_millis(1800),
        "the attempt itself came too late to judge: {arrived:?}"
    );
    assert_eq!(
        status,
        200,
        "{} after {arrived:?}",
        String::from_utf8_lossy(&body)
    );
    // The migration happened all the same, to a new execution.
    let now = c.sandbox(&id);
    assert_eq!(now["execution"]["worker"], "w2", "{now}");
    assert_ne!(
        now["execution"]["execution_id"], cap["route"]["execution_id"],
        "{now}"
    );
}
