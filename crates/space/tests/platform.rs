//! End to end: `space up` with two workers, driven through the CLI and HTTP, with real
//! processes, jails and sockets on loopback.

use space_testkit::cluster as support;
use support::{Cluster, can_run_jails, find_pid, http, jail_pids_of, kill9, pid_of};

fn stdout(o: &std::process::Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn json(bytes: &[u8]) -> serde_json::Value {
    serde_json::from_slice(bytes)
        .unwrap_or_else(|_| panic!("not JSON: {}", String::from_utf8_lossy(bytes)))
}

fn capability(c: &Cluster, sandbox: &str, access: &[&str]) -> serde_json::Value {
    let body = serde_json::json!({"access": access, "purpose": "control"}).to_string();
    let (status, body) = http(
        "POST",
        &format!("{}/v1/sandboxes/{sandbox}/capabilities", c.url),
        Some(&format!("Bearer {}", c.admin_key)),
        body.as_bytes(),
    );
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
    json(&body)
}

fn direct_exec(
    cap: &serde_json::Value,
    path_sandbox: &str,
    token: &str,
) -> (u16, serde_json::Value) {
    let url = format!(
        "{}/v1/sandboxes/{path_sandbox}/exec",
        cap["route"]["worker_url"].as_str().unwrap()
    );
    let (status, body) = http(
        "POST",
        &url,
        Some(&format!("SpaceCap {token}")),
        br#"{"cmd":["echo","direct"]}"#,
    );
    (
        status,
        serde_json::from_slice(&body).unwrap_or(serde_json::Value::Null),
    )
}

#[test]
fn sandbox_exec_and_files_through_the_cli_with_exit_codes() {
    if !can_run_jails() {
        return;
    }
    let c = Cluster::start();
    let id = c.create(&["--env", "GREETING=hi"]);
    let out = c.cli(&[
        "exec",
        &id,
        "--",
        "sh",
        "-c",
        "echo $GREETING from $(hostname)",
    ]);
    assert!(out.status.success());
    assert!(stdout(&out).starts_with("hi from sbx-"), "{}", stdout(&out));
    // The command's exit code becomes the CLI's.
    assert_eq!(
        c.cli(&["exec", &id, "--", "sh", "-c", "exit 7"])
            .status
            .code(),
        Some(7)
    );

    // A missing directory is made for the file (`mkdir=0` refuses instead: see
    // `accounts_files.rs`).
    assert!(
        c.cli_with_stdin(&["fs", "put", &id, "-", "/root/notes/a.txt"], b"first")
            .status
            .success(),
        "writing into a missing directory makes it"
    );
    assert!(
        c.cli(&["exec", &id, "--", "mkdir", "-p", "/root/notes"])
            .status
            .success()
    );
    assert!(
        c.cli_with_stdin(&["fs", "put", &id, "-", "/root/notes/a.txt"], b"first")
            .status
            .success()
    );
    assert_eq!(
        stdout(&c.cli(&["fs", "get", &id, "/root/notes/a.txt"])),
        "first"
    );
    let ls = c.cli(&["--json", "fs", "ls", &id, "/root/notes"]);
    let entries = json(&ls.stdout);
    assert_eq!(entries[0]["name"], "a.txt");
    assert_eq!(entries[0]["size"], 5);
    assert!(
        c.cli(&["fs", "rm", &id, "/root/notes/a.txt"])
            .status
            .success()
    );
    let gone = c.cli(&["fs", "get", &id, "/root/notes/a.txt"]);
    assert!(!gone.status.success());
    assert!(String::from_utf8_lossy(&gone.stderr).contains("not_found"));

    // Errors are clear and the CLI exits non-zero.
    let bad = c.cli(&["exec", "sbx_doesnotexist", "--", "true"]);
    assert!(!bad.status.success());
    assert!(String::from_utf8_lossy(&bad.stderr).contains("not_found"));

    assert!(c.cli(&["sandbox", "rm", &id]).status.success());
    assert_eq!(c.sandbox(&id)["state"], "stopped");
    assert!(!c.cli(&["exec", &id, "--", "true"]).status.success());
}

#[test]
fn two_workers_share_the_load_and_an_explicit_worker_is_honoured() {
    if !can_run_jails() {
        return;
    }
    let c = Cluster::start();
    let a = c.create(&["--worker", "w1"]);
    let b = c.create(&["--worker", "w2"]);
    assert_eq!(c.sandbox(&a)["execution"]["worker"], "w1");
    assert_eq!(c.sandbox(&b)["execution"]["worker"], "w2");
    let unknown = c.cli(&["sandbox", "create", "--worker", "w9"]);
    assert!(!unknown.status.success());
}

#[test]
fn concurrent_creates_spread_evenly_over_the_workers() {
    if !can_run_jails() {
        return;
    }
    let c = Cluster::start();
    let (url, auth) = (c.url.clone(), format!("Bearer {}", c.admin_key));
    // All at once: placement must count what it placed, not only what the store shows.
    let threads: Vec<_> = (0..16)
        .map(|_| {
            let (url, auth) = (url.clone(), auth.clone());
            std::thread::spawn(move || {
                let (status, body) =
                    http("POST", &format!("{url}/v1/sandboxes"), Some(&auth), b"{}");
                assert_eq!(status, 201, "{}", String::from_utf8_lossy(&body));
                json(&body)["id"].as_str().unwrap().to_owned()
            })
        })
        .collect();
    let mut on_w1 = 0;
    for t in threads {
        let id = t.join().unwrap();
        if c.sandbox(&id)["execution"]["worker"] == "w1" {
            on_w1 += 1;
        }
    }
    assert!((7..=9).contains(&on_w1), "{on_w1} of 16 on w1");
}

#[test]
fn restart_of_space_up_keeps_sandboxes_keys_and_files() {
    if !can_run_jails() {
        return;
    }
    let mut c = Cluster::start();
    let id = c.create(&[]);
    assert!(
        c.cli_with_stdin(&["fs", "put", &id, "-", "/root/keep.txt"], b"kept")
            .status
            .success()
    );
    let before = c.sandbox(&id);
    let key = c.admin_key.clone();
    c.restart();
    assert_eq!(c.admin_key, key, "the admin key is the same");
    // The sandbox comes back as a new execution (a new generation), with its files: the
    // restarted worker finds the old execution gone and reports it lost.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let after = loop {
        let s = c.sandbox(&id);
        if s["state"] == "running"
            && s["execution"]["generation"].as_u64() > before["execution"]["generation"].as_u64()
        {
            break s;
        }
        assert!(std::time::Instant::now() < deadline, "not restarted: {s}");
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    assert_ne!(
        after["execution"]["execution_id"],
        before["execution"]["execution_id"]
    );
    let got = c.cli(&["fs", "get", &id, "/root/keep.txt"]);
    let ls = c.cli(&["exec", &id, "--", "ls", "-la", "/root"]);
    assert_eq!(
        stdout(&got),
        "kept",
        "status {:?} stderr {} ls {}",
        got.status,
        String::from_utf8_lossy(&got.stderr),
        stdout(&ls)
    );
}

#[test]
fn sandbox_a_capability_on_sandbox_b_path_is_refused_with_403() {
    if !can_run_jails() {
        return;
    }
    let c = Cluster::start();
    let a = c.create(&["--worker", "w1"]);
    let b = c.create(&["--worker", "w1"]);
    let cap_a = capability(&c, &a, &["exec"]);
    let token = cap_a["token"].as_str().unwrap();
    let (status, body) = direct_exec(&cap_a, &a, token);
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["stdout"], "direct\n");
    let (status, body) = direct_exec(&cap_a, &b, token);
    assert_eq!(status, 403, "{body}");
    assert_eq!(body["error"], "deny");
    assert_eq!(body["reason"], "sandbox_mismatch");
}

#[test]
fn exec_capability_is_refused_for_files() {
    if !can_run_jails() {
        return;
    }
    let c = Cluster::start();
    let a = c.create(&[]);
    let cap = capability(&c, &a, &["exec"]);
    let url = format!(
        "{}/v1/sandboxes/{a}/files?path=/etc/hostname",
        cap["route"]["worker_url"].as_str().unwrap()
    );
    let (status, body) = http(
        "GET",
        &url,
        Some(&format!("SpaceCap {}", cap["token"].as_str().unwrap())),
        b"",
    );
    assert_eq!(status, 403);
    assert_eq!(json(&body)["reason"], "access_denied");
}

#[test]
fn tampered_garbage_and_oversized_capabilities_get_4xx_and_the_worker_keeps_serving() {
    if !can_run_jails() {
        return;
    }
    let c = Cluster::start();
    let a = c.create(&[]);
    let cap = capability(&c, &a, &["exec"]);
    let token = cap["token"].as_str().unwrap().to_owned();
    // Flip one character in the middle of the token.
    let mut chars: Vec<char> = token.chars().collect();
    let mid = chars.len() / 2;
    chars[mid] = if chars[mid] == 'A' { 'B' } else { 'A' };
    let tampered: String = chars.into_iter().collect();
    let (status, _) = direct_exec(&cap, &a, &tampered);
    assert!(
        status == 403 || status == 401,
        "tampered token got {status}"
    );
    for garbage in [
        "",
        "not base64 !!",
        "eyJhbGciOiJub25lIn0.e30.",
        &"A".repeat(20_000),
    ] {
        let (status, _) = direct_exec(&cap, &a, garbage);
        assert!((400..500).contains(&status), "{garbage:.20}… got {status}");
    }
    let url = format!(
        "{}/v1/sandboxes/{a}/exec",
        cap["route"]["worker_url"].as_str().unwrap()
    );
    let (status, _) = http("POST", &url, None, br#"{"cmd":["true"]}"#);
    assert_eq!(status, 401);
    let (status, _) = http(
        "POST",
        &url,
        Some(&format!("SpaceCap {token}")),
        b"{not json",
    );
    assert_eq!(status, 400);
    // Still serving.
    let (status, body) = direct_exec(&cap, &a, &token);
    assert_eq!(status, 200, "{body}");
}

#[test]
fn killed_worker_is_restarted_and_its_sandboxes_are_readopted_or_replaced_never_served_stale() {
    if !can_run_jails() {
        return;
    }
    let c = Cluster::start();
    let kept = c.create(&["--worker", "w2"]);
    let lost = c.create(&["--worker", "w2"]);
    assert!(
        c.cli_with_stdin(&["fs", "put", &lost, "-", "/root/f"], b"data")
            .status
            .success()
    );
    let before_kept = c.sandbox(&kept);
    let before_lost = c.sandbox(&lost);
    let old_cap = capability(&c, &lost, &["exec"]);

    // kill -9 the worker, and the jail of one of its sandboxes with it.
    let data_dir = c.data_dir();
    let worker_pid = pid_of(&["worker", "--id", "w2", data_dir.to_str().unwrap()]);
    let lost_init = jail_pids_of(&lost);
    assert!(!lost_init.is_empty(), "no jail processes found for {lost}");
    kill9(worker_pid);
    for p in lost_init {
        kill9(p);
    }
    // The supervisor restarts it; it re-adopts the survivor and reports the other lost.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let s = c.sandbox(&lost);
        if s["execution"]["generation"].as_u64() > before_lost["execution"]["generation"].as_u64()
            && s["state"] == "running"
        {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "lost sandbox not replaced: {s}"
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    c.wait_for_workers(2);
    assert_eq!(
        c.sandbox(&kept)["execution"],
        before_kept["execution"],
        "the survivor keeps its execution"
    );
    assert!(c.cli(&["exec", &kept, "--", "true"]).status.success());
    // The replacement has the files, under a new execution. The edge still held the
    // old route (the worker came back on its old address): the worker answered 421 and
    // the edge repaired the route with one rebuilt attempt.
    assert_eq!(stdout(&c.cli(&["fs", "get", &lost, "/root/f"])), "data");
    let (_, metrics) = http("GET", &format!("{}/metrics", c.url), None, b"");
    let metrics = String::from_utf8(metrics).unwrap();
    assert!(
        metrics.contains(
            r#"space_edge_route_recoveries_total{reason="stale_generation",outcome="rebuilt"} 1"#
        ),
        "{metrics}"
    );
    // The old capability, at the restarted worker: refused as stale, never served.
    let new_cap = capability(&c, &lost, &["exec"]);
    let mut stale = old_cap.clone();
    stale["route"]["worker_url"] = new_cap["route"]["worker_url"].clone();
    let (status, body) = direct_exec(&stale, &lost, old_cap["token"].as_str().unwrap());
    assert_eq!(status, 421, "{body}");
    assert_eq!(body["error"], "refresh_route");
    assert_eq!(body["reason"], "stale_generation");
}

#[test]
fn replayed_exec_with_the_same_idempotency_key_has_no_second_effect() {
    if !can_run_jails() {
        return;
    }
    let c = Cluster::start();
    let id = c.create(&[]);
    let body = br#"{"cmd":["sh","-c","echo run >> /root/count; wc -l < /root/count"]}"#;
    let url = format!("{}/v1/sandboxes/{id}/exec", c.url);
    let auth = format!("Bearer {}", c.admin_key);
    let first = support::http_with(&url, &auth, body, &[("idempotency-key", "op-1")]);
    let again = support::http_with(&url, &auth, body, &[("idempotency-key", "op-1")]);
    assert_eq!(first.0, 200);
    assert_eq!(json(&first.1)["stdout"], "1\n");
    assert_eq!(
        json(&again.1),
        json(&first.1),
        "the replay returns the first answer"
    );
    let other = support::http_with(&url, &auth, body, &[("idempotency-key", "op-2")]);
    assert_eq!(json(&other.1)["stdout"], "2\n", "a new key runs again");
}

#[test]
fn an_exec_whose_client_went_away_runs_to_its_end_and_its_retry_gets_that_answer() {
    if !can_run_jails() {
        return;
    }
    let c = Cluster::start();
    let id = c.create(&[]);
    let body =
        br#"{"cmd":["sh","-c","echo start >> /root/log; sleep 1; echo end >> /root/log; echo done"]}"#;
    let url = format!("{}/v1/sandboxes/{id}/exec", c.url);
    let auth = format!("Bearer {}", c.admin_key);
    let gave_up = support::post_within(
        &url,
        &auth,
        body,
        &[("idempotency-key", "slow-1")],
        std::time::Duration::from_millis(300),
    );
    assert!(matches!(gave_up, Err(space_http::CallError::Timeout)));
    let retry = support::http_with(&url, &auth, body, &[("idempotency-key", "slow-1")]);
    assert_eq!(retry.0, 200, "{}", String::from_utf8_lossy(&retry.1));
    assert_eq!(json(&retry.1)["stdout"], "done\n");
    let log = c.cli(&["fs", "get", &id, "/root/log", "-"]);
    assert_eq!(
        String::from_utf8_lossy(&log.stdout),
        "start\nend\n",
        "one run, to its end"
    );
}

#[test]
fn a_migration_whose_client_went_away_still_finishes() {
    if !can_run_jails() {
        return;
    }
    // No reconciler within the test's time: the migration must finish on its own.
    let c = Cluster::start_with_env(&[("SPACE_RECONCILE_AFTER_SECS", "600")]);
    let id = c.create(&["--worker", "w1"]);
    assert!(
        c.cli_with_stdin(&["fs", "put", &id, "-", "/root/f"], b"moved")
            .status
            .success()
    );
    // The client gives up after 30 ms, well inside the migration, and disconnects.
    let gave_up = support::post_within(
        &format!("{}/v1/sandboxes/{id}/migrate", c.url),
        &format!("Bearer {}", c.admin_key),
        br#"{"worker":"w2"}"#,
        &[],
        std::time::Duration::from_millis(30),
    );
    assert!(matches!(gave_up, Err(space_http::CallError::Timeout)));
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    let after = loop {
        let s = c.sandbox(&id);
        if s["state"] != "migrating" {
            break s;
        }
        assert!(std::time::Instant::now() < deadline, "left half-way: {s}");
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    assert_eq!(after["state"], "running", "{after}");
    assert_eq!(after["execution"]["worker"], "w2", "{after}");
    assert_eq!(stdout(&c.cli(&["fs", "get", &id, "/root/f"])), "moved");
}

#[test]
fn key_rotation_publishes_the_new_key_before_signing_and_old_capabilities_keep_working() {
    if !can_run_jails() {
        return;
    }
    let c = Cluster::start();
    let id = c.create(&[]);
    let before = capability(&c, &id, &["exec"]);
    let out = c.cli(&["--json", "keys", "rotate"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let new_key = json(&out.stdout)["active_key"].as_str().unwrap().to_owned();
    let after = capability(&c, &id, &["exec"]);
    assert_ne!(before["token"], after["token"]);
    // Every worker holds the new key (it was published first), and the old key still
    // verifies until its capabilities have expired.
    let (status, body) = direct_exec(&after, &id, after["token"].as_str().unwrap());
    assert_eq!(status, 200, "new key refused: {body}");
    let (status, body) = direct_exec(&before, &id, before["token"].as_str().unwrap());
    assert_eq!(status, 200, "old key refused during its grace: {body}");
    // The CLI and the edge keep working across the rotation.
    assert!(c.cli(&["exec", &id, "--", "true"]).status.success());
    assert!(new_key.starts_with("key_"));
}

#[test]
fn metrics_count_admissions_by_verdict_and_sandboxes_by_state() {
    if !can_run_jails() {
        return;
    }
    let c = Cluster::start();
    let a = c.create(&["--worker", "w1"]);
    let b = c.create(&["--worker", "w1"]);
    let cap = capability(&c, &a, &["exec"]);
    let (status, _) = direct_exec(&cap, &b, cap["token"].as_str().unwrap());
    assert_eq!(status, 403);
    assert!(c.cli(&["exec", &a, "--", "true"]).status.success());
    let worker = cap["route"]["worker_url"].as_str().unwrap();
    let (status, text) = http("GET", &format!("{worker}/metrics"), None, b"");
    assert_eq!(status, 200);
    let text = String::from_utf8(text).unwrap();
    assert!(
        text.contains(
            r#"space_worker_admissions_total{verdict="deny",reason="sandbox_mismatch"} 1"#
        ),
        "{text}"
    );
    assert!(
        text.contains(r#"space_worker_admissions_total{verdict="allow",reason="allow"}"#),
        "{text}"
    );
    assert!(
        text.contains("space_worker_operation_duration_seconds_bucket"),
        "{text}"
    );
    // The control plane refreshes its gauges every few seconds.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(15);
    loop {
        let (status, text) = http("GET", &format!("{}/metrics", c.url), None, b"");
        assert_eq!(status, 200);
        let text = String::from_utf8(text).unwrap();
        if text.contains(r#"space_control_sandboxes{state="running"} 2"#) {
            assert!(text.contains("space_control_request_duration_seconds_bucket"));
            break;
        }
        assert!(std::time::Instant::now() < deadline, "{text}");
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
}

#[test]
fn standalone_edge_forwards_to_workers_and_relays_the_rest() {
    if !can_run_jails() {
        return;
    }
    let c = Cluster::start();
    let mut edge = std::process::Command::new(support::space_bin())
        .args(["edge", "--listen", "127.0.0.1:0", "--control", &c.url])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(edge.stdout.take().unwrap()),
        &mut line,
    )
    .unwrap();
    let edge_url = line
        .trim()
        .strip_prefix("edge listening on ")
        .unwrap()
        .to_owned();
    let auth = format!("Bearer {}", c.admin_key);
    let (status, body) = http(
        "POST",
        &format!("{edge_url}/v1/sandboxes"),
        Some(&auth),
        b"{}",
    );
    assert_eq!(status, 201, "{}", String::from_utf8_lossy(&body));
    let id = json(&body)["id"].as_str().unwrap().to_owned();
    let (status, body) = http(
        "POST",
        &format!("{edge_url}/v1/sandboxes/{id}/exec"),
        Some(&auth),
        br#"{"cmd":["echo","via edge"]}"#,
    );
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
    assert_eq!(json(&body)["stdout"], "via edge\n");
    let (status, _) = http(
        "GET",
        &format!("{edge_url}/v1/sandboxes/{id}"),
        Some("Bearer nope"),
        b"",
    );
    assert_eq!(status, 401);
    let _ = edge.kill();
    let _ = edge.wait();
}

#[test]
fn tenants_are_isolated_and_a_revoked_key_stops_working_at_once() {
    if !can_run_jails() {
        return;
    }
    let c = Cluster::start();
    let admin = format!("Bearer {}", c.admin_key);
    let make_tenant = |name: &str| {
        let (status, body) = http(
            "POST",
            &format!("{}/v1/tenants", c.url),
            Some(&admin),
            format!(r#"{{"name":"{name}"}}"#).as_bytes(),
        );
        assert_eq!(status, 201, "{}", String::from_utf8_lossy(&body));
        json(&body)
    };
    let alice = make_tenant("alice");
    let bob = make_tenant("bob");
    let alice_auth = format!("Bearer {}", alice["api_key"].as_str().unwrap());
    let bob_auth = format!("Bearer {}", bob["api_key"].as_str().unwrap());
    let (status, body) = http(
        "POST",
        &format!("{}/v1/sandboxes", c.url),
        Some(&alice_auth),
        b"{}",
    );
    assert_eq!(status, 201);
    let id = json(&body)["id"].as_str().unwrap().to_owned();
    // Bob can neither see nor use Alice's sandbox, and learns nothing about it.
    let (status, _) = http(
        "GET",
        &format!("{}/v1/sandboxes/{id}", c.url),
        Some(&bob_auth),
        b"",
    );
    assert_eq!(status, 404);
    let (status, _) = http(
        "POST",
        &format!("{}/v1/sandboxes/{id}/exec", c.url),
        Some(&bob_auth),
        br#"{"cmd":["true"]}"#,
    );
    assert_eq!(status, 404);
    let (status, body) = http(
        "GET",
        &format!("{}/v1/sandboxes", c.url),
        Some(&bob_auth),
        b"",
    );
    assert_eq!(status, 200);
    assert_eq!(json(&body), serde_json::json!([]));
    // Non-admins cannot create tenants.
    let (status, _) = http(
        "POST",
        &format!("{}/v1/tenants", c.url),
        Some(&alice_auth),
        br#"{"name":"x"}"#,
    );
    assert_eq!(status, 403);
    // Revocation takes effect at once.
    let key_id = alice["key_id"].as_str().unwrap();
    let (status, _) = http(
        "DELETE",
        &format!("{}/v1/keys/{key_id}", c.url),
        Some(&alice_auth),
        b"",
    );
    assert_eq!(status, 204);
    let (status, _) = http(
        "GET",
        &format!("{}/v1/sandboxes", c.url),
        Some(&alice_auth),
        b"",
    );
    assert_eq!(status, 401);
    // Bad input is a 4xx with a JSON error, never a 500.
    for (method, path, body) in [
        ("POST", "/v1/sandboxes", &b"{not json"[..]),
        ("POST", "/v1/sandboxes", br#"{"ttl_secs":0}"#),
        ("POST", "/v1/sandboxes", br#"{"templte":"x"}"#),
        ("POST", "/v1/sandboxes", br#"{"env":{"1BAD":"x"}}"#),
        ("GET", "/v1/sandboxes/not-an-id", b""),
        (
            "POST",
            &format!("/v1/sandboxes/{id}/capabilities"),
            br#"{"access":[],"purpose":"control"}"#,
        ),
    ] {
        let (status, body) = http(method, &format!("{}{path}", c.url), Some(&admin), body);
        assert!((400..500).contains(&status), "{method} {path}: {status}");
        assert!(json(&body)["error"].is_string());
    }
}

#[test]
fn worker_refuses_unsigned_foreign_and_replayed_updates() {
    if !can_run_jails() {
        return;
    }
    let c = Cluster::start();
    let id = c.create(&["--worker", "w1"]);
    let cap = capability(&c, &id, &["exec"]);
    let worker = cap["route"]["worker_url"].as_str().unwrap().to_owned();
    let url = format!("{worker}/internal/v1/updates");
    use base64::Engine as _;
    let b64 = |b: &[u8]| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(b);
    let signer = support::Signer::of(&c);
    let retire = |w: &str| {
        serde_json::json!({
            "worker": w,
            // Fresh, under a number of w1's sequence reserved as a replica would.
            "issued_at": support::unix_now(),
            "seq": signer.next_seq("w1"),
            "update": {"kind": "retire", "sandbox": id, "generation": 1,
                       "execution_id": cap["route"]["execution_id"]},
        })
        .to_string()
    };
    // Not signed by the trust anchor.
    let forged =
        serde_json::json!({"body": b64(retire("w1").as_bytes()), "signature": b64(&[0u8; 64])});
    // Without the signed delivery header the body is not even read.
    let (status, _) = http("POST", &url, None, forged.to_string().as_bytes());
    assert_eq!(status, 401);
    let (status, _) = signer.post_update(&url, "w1", forged.to_string().as_bytes());
    assert_eq!(status, 403);
    // Garbage.
    let (status, _) = signer.post_update(&url, "w1", b"{}");
    assert_eq!(status, 400);
    // A delivery header for another worker, or for other bytes: refused before the body.
    let body = forged.to_string();
    let (status, _) = signer.post_update(&url, "w2", body.as_bytes());
    assert_eq!(status, 403);
    // Validly signed (with the anchor read from the control plane's store), but for
    // another worker: refused.
    let seed_hex: String = rusqlite::Connection::open(c.data_dir().join("control.db"))
        .unwrap()
        .query_row("SELECT value FROM kv WHERE name = 'anchor_seed'", [], |r| {
            r.get(0)
        })
        .unwrap();
    let seed: Vec<u8> = (0..32)
        .map(|i| u8::from_str_radix(&seed_hex[2 * i..2 * i + 2], 16).unwrap())
        .collect();
    let anchor = space_identity::BundleSigner::from_seed(seed.try_into().unwrap());
    let signed = |body: String| {
        serde_json::json!({"body": b64(body.as_bytes()), "signature": b64(&anchor.sign_update(body.as_bytes()))})
            .to_string()
    };
    let (status, _) = signer.post_update(&url, "w1", signed(retire("w2")).as_bytes());
    assert_eq!(status, 403, "an update for w2 was accepted by w1");
    // A replayed install of an older-or-equal generation with another execution: refused.
    let install = |execution_id: &serde_json::Value| {
        serde_json::json!({
            "worker": "w1",
            // Fresh, under a number of w1's sequence reserved as a replica would.
            "issued_at": support::unix_now(),
            "seq": signer.next_seq("w1"),
            "update": {"kind": "install", "sandbox": id, "generation": 1, "execution_id": execution_id,
                       "substrate": "jail", "activation": 1, "template": "default", "env": {},
                       "limits": {"memory_bytes": 536870912, "pids": 256, "cpu_millis": 1000}},
        })
        .to_string()
    };
    let other_exe = serde_json::json!("exe_aaaaaaaaaaaaaaaaaaaaaaaaaa");
    let (status, body) = signer.post_update(&url, "w1", signed(install(&other_exe)).as_bytes());
    assert_eq!(status, 409, "{}", String::from_utf8_lossy(&body));
    // The same install delivered again is answered with its state, and changes nothing.
    let (status, body) = signer.post_update(
        &url,
        "w1",
        signed(install(&cap["route"]["execution_id"])).as_bytes(),
    );
    assert_eq!(status, 200);
    assert_eq!(json(&body)["state"], "running");
    // The sandbox is still served, by the same execution.
    let (status, body) = direct_exec(&cap, &id, cap["token"].as_str().unwrap());
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["execution_id"], cap["route"]["execution_id"]);
}

#[test]
fn paused_sandbox_keeps_its_execution_answers_paused_and_resumes_where_it_was() {
    if !can_run_jails() {
        return;
    }
    let c = Cluster::start();
    let id = c.create(&[]);
    // A background process whose counter must stop while paused.
    assert!(
        c.cli(&[
            "exec",
            &id,
            "--",
            "sh",
            "-c",
            "(while true; do echo x >> /tmp/ticks; sleep 0.05; done) >/dev/null 2>&1 &"
        ])
        .status
        .success()
    );
    let before = c.sandbox(&id);
    let out = c.cli(&["--json", "sandbox", "pause", &id]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(json(&out.stdout)["state"], "paused");
    let paused = c.cli(&["exec", &id, "--", "true"]);
    assert!(!paused.status.success());
    assert!(
        String::from_utf8_lossy(&paused.stderr).contains("paused"),
        "{}",
        String::from_utf8_lossy(&paused.stderr)
    );
    let out = c.cli(&["--json", "sandbox", "resume", &id]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let after = json(&out.stdout);
    assert_eq!(after["state"], "running");
    assert_eq!(
        after["execution"], before["execution"],
        "pause keeps the execution"
    );
    // The background process survived the freeze and keeps counting.
    let n1 = stdout(&c.cli(&["exec", &id, "--", "sh", "-c", "wc -l < /tmp/ticks"]));
    std::thread::sleep(std::time::Duration::from_millis(300));
    let n2 = stdout(&c.cli(&["exec", &id, "--", "sh", "-c", "wc -l < /tmp/ticks"]));
    assert!(n2.trim().parse::<u32>().unwrap() > n1.trim().parse::<u32>().unwrap());
    // Resuming a running sandbox is a no-op.
    assert!(c.cli(&["sandbox", "resume", &id]).status.success());
}

#[test]
fn acknowledged_retirement_survives_a_worker_crash_and_is_never_served_again() {
    if !can_run_jails() {
        return;
    }
    let c = Cluster::start();
    let id = c.create(&["--worker", "w1"]);
    let cap = capability(&c, &id, &["exec"]);
    let token = cap["token"].as_str().unwrap().to_owned();
    assert_eq!(direct_exec(&cap, &id, &token).0, 200);
    // The delete returns once the worker acknowledged the retirement (after fsync).
    assert!(c.cli(&["sandbox", "rm", &id]).status.success());
    let data_dir = c.data_dir();
    let words = ["worker", "--id", "w1", data_dir.to_str().unwrap()];
    let old_pid = pid_of(&words);
    kill9(old_pid);
    // Wait for the supervisor's replacement process.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while find_pid(&words).is_none_or(|p| p == old_pid) {
        assert!(std::time::Instant::now() < deadline, "worker not restarted");
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    // Restarted on its old address, the worker still holds the tombstone.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let (status, body) = loop {
        let addr = cap["route"]["worker_url"]
            .as_str()
            .unwrap()
            .trim_start_matches("http://");
        if std::net::TcpStream::connect(addr).is_ok() {
            break direct_exec(&cap, &id, &token);
        }
        assert!(
            std::time::Instant::now() < deadline,
            "worker did not come back"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    assert_eq!(status, 421, "{body}");
    assert_eq!(body["reason"], "retired");
}

mod streams {
    use std::time::{Duration, Instant};

    use futures_util::{SinkExt, StreamExt};
    use tokio_tungstenite::tungstenite::Message;
    use tokio_tungstenite::tungstenite::client::IntoClientRequest;

    use super::support::Cluster;

    type Socket = tokio_tungstenite::WebSocketStream<
        tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>,
    >;

    async fn open(c: &Cluster, path: &str) -> Socket {
        let mut req = format!("{}{path}", c.url.replacen("http", "ws", 1))
            .into_client_request()
            .unwrap();
        req.headers_mut().insert(
            "authorization",
            format!("Bearer {}", c.admin_key).parse().unwrap(),
        );
        tokio_tungstenite::connect_async(req).await.unwrap().0
    }

    /// Reads until `want` matches a message, or panics after 15 s.
    async fn until(s: &mut Socket, mut want: impl FnMut(&Message) -> bool) -> Message {
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let m = tokio::time::timeout(left, s.next())
                .await
                .expect("timed out waiting for a message")
                .expect("stream ended")
                .expect("stream error");
            if want(&m) {
                return m;
            }
        }
    }

    fn runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()
            .unwrap()
    }

    fn close_code(m: &Message) -> Option<u16> {
        match m {
            Message::Close(Some(f)) => Some(f.code.into()),
            _ => None,
        }
    }

    #[test]
    fn closing_a_terminal_ends_its_shell_in_the_sandbox() {
        if !super::can_run_jails() {
            return;
        }
        let c = Cluster::start();
        let id = c.create(&[]);
        let rt = runtime();
        rt.block_on(async {
            let mut term = open(&c, &format!("/v1/sandboxes/{id}/terminal")).await;
            term.send(Message::Binary(
                b"echo $$ > /root/shell; echo saved-$((2*3))\n"
                    .to_vec()
                    .into(),
            ))
            .await
            .unwrap();
            let mut seen = String::new();
            until(&mut term, |m| {
                if let Message::Binary(b) = m {
                    seen.push_str(&String::from_utf8_lossy(b));
                }
                seen.contains("saved-6")
            })
            .await;
            term.close(None).await.unwrap();
        });
        // The shell's process is gone soon after (the worker closed its connection, the
        // agent ended the process group).
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let out = c.cli(&["exec", &id, "--", "sh", "-c", "kill -0 $(cat /root/shell)"]);
            if out.status.code() == Some(1) {
                break;
            }
            assert!(Instant::now() < deadline, "the shell outlived its terminal");
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    #[test]
    fn terminal_and_watch_stream_through_the_edge_and_end_when_the_execution_is_retired() {
        if !super::can_run_jails() {
            return;
        }
        let c = Cluster::start();
        let id = c.create(&[]);
        let rt = runtime();
        rt.block_on(async {
            let mut term = open(&c, &format!("/v1/sandboxes/{id}/terminal?rows=30&cols=100")).await;
            term.send(Message::Binary(b"echo hello-$((6*7)); stty size\n".to_vec().into()))
                .await
                .unwrap();
            let mut seen = String::new();
            until(&mut term, |m| {
                if let Message::Binary(b) = m {
                    seen.push_str(&String::from_utf8_lossy(b));
                }
                seen.contains("hello-42") && seen.contains("30 100")
            })
            .await;

            let mut watch = open(&c, &format!("/v1/sandboxes/{id}/watch?path=/root")).await;
            let cli = c.cli(&["exec", &id, "--", "touch", "/root/seen-by-watch"]);
            assert!(cli.status.success());
            until(&mut watch, |m| {
                matches!(m, Message::Text(t) if t.as_str().contains("seen-by-watch") && t.as_str().contains("created"))
            })
            .await;

            // Retiring the execution (deleting the sandbox) ends both streams with
            // "execution replaced", promptly.
            let start = Instant::now();
            assert!(c.cli(&["sandbox", "rm", &id]).status.success());
            let acked = start.elapsed();
            for s in [&mut term, &mut watch] {
                let m = until(s, |m| matches!(m, Message::Close(_))).await;
                assert_eq!(close_code(&m), Some(4001), "{m:?}");
            }
            assert!(start.elapsed() - acked < Duration::from_secs(2), "streams outlived the retirement");
        });
    }

    #[test]
    fn on_migration_the_terminal_closes_and_the_watch_resubscribes_to_the_new_execution() {
        if !super::can_run_jails() {
            return;
        }
        let c = Cluster::start();
        let id = c.create(&["--worker", "w1"]);
        let rt = runtime();
        rt.block_on(async {
            let mut term = open(&c, &format!("/v1/sandboxes/{id}/terminal")).await;
            // Output that would go on forever if the old shell were still attached.
            term.send(Message::Binary(
                b"while true; do echo tick; sleep 0.05; done\n"
                    .to_vec()
                    .into(),
            ))
            .await
            .unwrap();
            until(
                &mut term,
                |m| matches!(m, Message::Binary(b) if String::from_utf8_lossy(b).contains("tick")),
            )
            .await;
            let mut watch = open(&c, &format!("/v1/sandboxes/{id}/watch?path=/root")).await;
            let out = c.cli(&["sandbox", "migrate", &id, "--worker", "w2"]);
            assert!(
                out.status.success(),
                "{}",
                String::from_utf8_lossy(&out.stderr)
            );
            let migrated = Instant::now();
            // The terminal ends: its shell is gone, and nothing of it follows.
            let m = until(&mut term, |m| matches!(m, Message::Close(_))).await;
            assert_eq!(close_code(&m), Some(4001), "{m:?}");
            let next = tokio::time::timeout(Duration::from_millis(300), term.next()).await;
            assert!(
                matches!(
                    next,
                    Ok(None) | Ok(Some(Err(_))) | Ok(Some(Ok(Message::Close(_))))
                ),
                "output after the close: {next:?}"
            );
            // The watch is re-admitted on the new execution and keeps reporting.
            until(
                &mut watch,
                |m| matches!(m, Message::Text(t) if t.as_str().contains("resubscribed")),
            )
            .await;
            assert!(migrated.elapsed() < Duration::from_secs(2));
            let cli = c.cli(&["exec", &id, "--", "touch", "/root/after-move"]);
            assert!(cli.status.success());
            until(
                &mut watch,
                |m| matches!(m, Message::Text(t) if t.as_str().contains("after-move")),
            )
            .await;
        });
        assert_eq!(c.sandbox(&id)["execution"]["worker"], "w2");
    }

    #[test]
    fn direct_terminal_and_watch_at_the_worker_both_close_on_migration() {
        if !super::can_run_jails() {
            return;
        }
        let c = Cluster::start();
        let id = c.create(&["--worker", "w1"]);
        let cap = super::capability(&c, &id, &["terminal", "watch"]);
        let worker = cap["route"]["worker_url"]
            .as_str()
            .unwrap()
            .replacen("http", "ws", 1);
        let auth = format!("SpaceCap {}", cap["token"].as_str().unwrap());
        let rt = runtime();
        rt.block_on(async {
            let mut sockets = Vec::new();
            for path in ["terminal", "watch?path=/root"] {
                let mut req = format!("{worker}/v1/sandboxes/{id}/{path}")
                    .into_client_request()
                    .unwrap();
                req.headers_mut()
                    .insert("authorization", auth.parse().unwrap());
                sockets.push(tokio_tungstenite::connect_async(req).await.unwrap().0);
            }
            let out = c.cli(&["sandbox", "migrate", &id, "--worker", "w2"]);
            assert!(
                out.status.success(),
                "{}",
                String::from_utf8_lossy(&out.stderr)
            );
            for s in &mut sockets {
                let m = until(s, |m| matches!(m, Message::Close(_))).await;
                assert_eq!(close_code(&m), Some(4001), "{m:?}");
            }
        });
    }

    #[test]
    fn streaming_exec_delivers_output_as_it_is_produced() {
        if !super::can_run_jails() {
            return;
        }
        let c = Cluster::start();
        let id = c.create(&[]);
        let rt = runtime();
        rt.block_on(async {
            let mut s = open(&c, &format!("/v1/sandboxes/{id}/exec/stream")).await;
            let req =
                r#"{"cmd":["sh","-c","echo first; echo oops >&2; sleep 1; echo second; exit 4"]}"#;
            s.send(Message::Text(req.into())).await.unwrap();
            let first = until(
                &mut s,
                |m| matches!(m, Message::Binary(b) if b.starts_with(b"\x01first")),
            )
            .await;
            let at_first = Instant::now();
            drop(first);
            let mut stderr = Vec::new();
            let end = until(&mut s, |m| {
                if let Message::Binary(b) = m {
                    if b.first() == Some(&2) {
                        stderr.extend_from_slice(&b[1..]);
                    }
                }
                matches!(m, Message::Close(_))
            })
            .await;
            assert!(
                at_first.elapsed() >= Duration::from_millis(800),
                "output was not streamed"
            );
            match end {
                Message::Close(Some(f)) => assert_eq!(f.reason.as_str(), "exited 4"),
                other => panic!("{other:?}"),
            }
            assert_eq!(stderr, b"oops\n");
        });
        // The CLI's --stream prints the same and exits with the command's code.
        let out = c.cli(&[
            "exec",
            "--stream",
            &id,
            "--",
            "sh",
            "-c",
            "echo a; echo b >&2; exit 6",
        ]);
        assert_eq!(out.status.code(), Some(6));
        assert_eq!(super::stdout(&out), "a\n");
        assert_eq!(String::from_utf8_lossy(&out.stderr), "b\n");
    }

    #[test]
    fn stream_with_another_sandboxs_capability_is_refused_before_it_opens() {
        if !super::can_run_jails() {
            return;
        }
        let c = Cluster::start();
        let a = c.create(&["--worker", "w1"]);
        let b = c.create(&["--worker", "w1"]);
        let cap = super::capability(&c, &a, &["terminal"]);
        let url = format!(
            "{}/v1/sandboxes/{b}/terminal",
            cap["route"]["worker_url"]
                .as_str()
                .unwrap()
                .replacen("http", "ws", 1)
        );
        let mut req = url.into_client_request().unwrap();
        req.headers_mut().insert(
            "authorization",
            format!("SpaceCap {}", cap["token"].as_str().unwrap())
                .parse()
                .unwrap(),
        );
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        match rt.block_on(tokio_tungstenite::connect_async(req)) {
            Err(tokio_tungstenite::tungstenite::Error::Http(resp)) => {
                assert_eq!(resp.status(), 403)
            }
            other => panic!(
                "stream opened with another sandbox's capability: {:?}",
                other.map(|_| ())
            ),
        }
    }
}

#[test]
fn cli_term_runs_a_shell_and_exits_with_its_code_and_cli_watch_prints_changes() {
    if !can_run_jails() {
        return;
    }
    let c = Cluster::start();
    let id = c.create(&[]);
    let out = c.cli_with_stdin(&["term", &id], b"echo term-$((20+22))\nexit 5\n");
    assert_eq!(
        out.status.code(),
        Some(5),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout(&out).contains("term-42"), "{}", stdout(&out));
    // `space watch` until killed: start it, make a change, read its first line.
    let mut watch = std::process::Command::new(support::space_bin())
        .args(["watch", &id, "/root"])
        .env("SPACE_URL", &c.url)
        .env("SPACE_API_KEY", &c.admin_key)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let stdout_pipe = watch.stdout.take().unwrap();
    let reader = std::thread::spawn(move || {
        let mut line = String::new();
        std::io::BufRead::read_line(&mut std::io::BufReader::new(stdout_pipe), &mut line).unwrap();
        line
    });
    // Retry the change until the watch (which opens asynchronously) reports it.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(15);
    let mut n = 0;
    while !reader.is_finished() {
        assert!(
            std::time::Instant::now() < deadline,
            "space watch printed nothing"
        );
        assert!(
            c.cli(&["exec", &id, "--", "touch", &format!("/root/w{n}")])
                .status
                .success()
        );
        n += 1;
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    let line = reader.join().unwrap();
    assert!(line.contains(r#""type":"created""#), "{line}");
    let _ = watch.kill();
    let _ = watch.wait();
}

#[test]
fn migration_moves_a_sandbox_as_a_new_execution_and_old_capabilities_get_421_at_both_workers() {
    if !can_run_jails() {
        return;
    }
    let c = Cluster::start();
    let id = c.create(&["--worker", "w1"]);
    assert!(
        c.cli_with_stdin(&["fs", "put", &id, "-", "/root/moving.txt"], b"with me")
            .status
            .success()
    );
    assert!(
        c.cli(&[
            "exec",
            &id,
            "--",
            "sh",
            "-c",
            "mkdir -p /opt/m && ln -s /opt/m /root/to-m"
        ])
        .status
        .success()
    );
    let before = c.sandbox(&id);
    let old_cap = capability(&c, &id, &["exec"]);
    let out = c.cli(&["--json", "sandbox", "migrate", &id, "--worker", "w2"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let after = json(&out.stdout);
    assert_eq!(after["state"], "running");
    assert_eq!(after["execution"]["worker"], "w2");
    assert_eq!(
        after["execution"]["generation"].as_u64(),
        before["execution"]["generation"].as_u64().map(|g| g + 1)
    );
    assert_ne!(
        after["execution"]["execution_id"],
        before["execution"]["execution_id"]
    );
    // The files came along: contents, directories, symlinks.
    assert_eq!(
        stdout(&c.cli(&["fs", "get", &id, "/root/moving.txt"])),
        "with me"
    );
    assert!(
        c.cli(&["exec", &id, "--", "test", "-L", "/root/to-m"])
            .status
            .success()
    );
    assert!(
        c.cli(&["exec", &id, "--", "test", "-d", "/opt/m"])
            .status
            .success()
    );
    // The old capability: the old worker answers from its tombstone, the new one
    // names the wrong worker. Never served.
    let token = old_cap["token"].as_str().unwrap();
    let (status, body) = direct_exec(&old_cap, &id, token);
    assert_eq!(
        (status, body["reason"].as_str()),
        (421, Some("retired")),
        "{body}"
    );
    let new_cap = capability(&c, &id, &["exec"]);
    let mut at_new = old_cap.clone();
    at_new["route"]["worker_url"] = new_cap["route"]["worker_url"].clone();
    let (status, body) = direct_exec(&at_new, &id, token);
    assert_eq!(
        (status, body["reason"].as_str()),
        (421, Some("wrong_worker")),
        "{body}"
    );
}

#[test]
fn reads_in_a_loop_succeed_while_the_sandbox_migrates_back_and_forth() {
    if !can_run_jails() {
        return;
    }
    let c = Cluster::start();
    let id = c.create(&["--worker", "w1"]);
    assert!(
        c.cli_with_stdin(&["fs", "put", &id, "-", "/root/r.txt"], b"steady")
            .status
            .success()
    );
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (url, auth) = (
        format!("{}/v1/sandboxes/{id}/files?path=/root/r.txt", c.url),
        format!("Bearer {}", c.admin_key),
    );
    let reader = {
        let stop = std::sync::Arc::clone(&stop);
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async {
                let client = space_http::HttpClient::new(std::time::Duration::from_secs(60));
                let (mut ok, mut failed, mut executions) =
                    (0u32, Vec::new(), std::collections::BTreeSet::new());
                while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                    let a = client
                        .call(
                            hyper::Method::GET,
                            &url,
                            &[("authorization", auth.as_str())],
                            bytes::Bytes::new(),
                        )
                        .await
                        .unwrap();
                    if a.status == 200 && &a.body[..] == b"steady" {
                        ok += 1;
                        if let Some(e) = a.headers.get("space-execution") {
                            executions.insert(e.to_str().unwrap().to_owned());
                        }
                    } else {
                        failed.push(format!("{} {}", a.status, String::from_utf8_lossy(&a.body)));
                    }
                }
                (ok, failed, executions)
            })
        })
    };
    for target in ["w2", "w1", "w2", "w1"] {
        let out = c.cli(&["sandbox", "migrate", &id, "--worker", target]);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    let (ok, failed, executions) = reader.join().unwrap();
    assert!(
        failed.is_empty(),
        "{} failed reads: {failed:?}",
        failed.len()
    );
    assert!(ok > 10, "only {ok} reads");
    assert!(executions.len() >= 2, "answers came from {executions:?}");
}

#[test]
fn tampered_or_truncated_layer_is_refused_by_the_receiving_worker() {
    if !can_run_jails() {
        return;
    }
    let c = Cluster::start();
    let id = c.create(&["--worker", "w1"]);
    let cap = capability(&c, &id, &["exec"]);
    let worker = cap["route"]["worker_url"].as_str().unwrap().to_owned();
    use base64::Engine as _;
    let b64 = |b: &[u8]| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(b);
    let signer = support::Signer::of(&c);
    let archive = b"pretend this is a tar archive of a layer".to_vec();
    let digest = blake3::hash(&archive).to_hex().to_string();
    let size = archive.len();
    // Each attempt under its own fresh, signed update: a number is used once.
    let header = || {
        let signed = signer.update(
            "w1",
            serde_json::json!({"kind": "layer", "sandbox": id, "digest": digest, "size": size}),
        );
        b64(signed.as_bytes())
    };
    let post = |what: &str, bytes: Vec<u8>| {
        let header = header();
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let started = std::time::Instant::now();
        rt.block_on(async {
            let answer = space_http::HttpClient::new(std::time::Duration::from_secs(60))
                .call(
                    hyper::Method::POST,
                    &format!("{worker}/internal/v1/layers"),
                    &[("space-update", header.as_str())],
                    bytes::Bytes::from(bytes),
                )
                .await;
            // Which post, and how long it took, if the worker did not answer.
            let answer = answer.unwrap_or_else(|e| {
                panic!(
                    "the {what} layer: no answer after {:?}: {e}",
                    started.elapsed()
                )
            });
            answer.status.as_u16()
        })
    };
    let mut tampered = archive.clone();
    tampered[3] ^= 1;
    assert_eq!(post("tampered", tampered), 403);
    assert_eq!(
        post("truncated", archive[..archive.len() - 1].to_vec()),
        403
    );
    // The genuine bytes pass the check (and then fail to unpack: they are no tar).
    assert_eq!(post("genuine", archive), 400);
}

#[test]
fn crash_of_the_control_plane_during_a_migration_leaves_one_consistent_state() {
    if !can_run_jails() {
        return;
    }
    let mut c = Cluster::start();
    let id = c.create(&["--worker", "w1"]);
    assert!(
        c.cli_with_stdin(&["fs", "put", &id, "-", "/root/f"], b"survives")
            .status
            .success()
    );
    let before = c.sandbox(&id);
    let cap = capability(&c, &id, &["exec"]);
    // The target hangs (stopped), so the migration is caught half-way: source frozen,
    // layer transfer under way.
    let data_dir = c.data_dir();
    let w2 = pid_of(&["worker", "--id", "w2", data_dir.to_str().unwrap()]);
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(w2),
        nix::sys::signal::Signal::SIGSTOP,
    )
    .unwrap();
    let mut migrate = c.spawn_cli(&["sandbox", "migrate", &id, "--worker", "w2"]);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(15);
    while c.sandbox(&id)["state"] != "migrating" {
        assert!(
            std::time::Instant::now() < deadline,
            "migration did not start"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    std::thread::sleep(std::time::Duration::from_millis(300));
    c.crash_and_restart();
    let _ = migrate.kill();
    let _ = migrate.wait();
    // After the restart: running again, one execution serves, the files are there.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(40);
    let after = loop {
        let s = c.sandbox(&id);
        if s["state"] == "running" {
            break s;
        }
        assert!(std::time::Instant::now() < deadline, "not reconciled: {s}");
        std::thread::sleep(std::time::Duration::from_millis(100));
    };
    let got = c.cli(&["fs", "get", &id, "/root/f"]);
    assert_eq!(
        stdout(&got),
        "survives",
        "{}",
        String::from_utf8_lossy(&got.stderr)
    );
    let exec = c.cli(&["exec", &id, "--", "echo", "alive"]);
    assert_eq!(stdout(&exec), "alive\n");
    assert!(
        after["execution"]["generation"].as_u64() >= before["execution"]["generation"].as_u64(),
        "{after}"
    );
    // The reconciler took the operation over without a new execution: the route is the
    // same, so a capability issued before the crash still works.
    if after["execution"] == before["execution"] {
        let (status, body) = direct_exec(&cap, &id, cap["token"].as_str().unwrap());
        assert_eq!(status, 200, "{body}");
    }
}

#[test]
fn ttl_stops_a_sandbox_or_pauses_it_when_asked() {
    if !can_run_jails() {
        return;
    }
    let c = Cluster::start();
    let stops = c.create(&["--ttl", "1"]);
    let pauses = c.create(&["--ttl", "1", "--ttl-action", "pause"]);
    assert!(
        c.cli_with_stdin(&["fs", "put", &pauses, "-", "/root/kept"], b"yes")
            .status
            .success()
    );
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        let (a, b) = (c.sandbox(&stops), c.sandbox(&pauses));
        if a["state"] == "stopped" && b["state"] == "paused" {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "ttl not applied: {a} {b}"
        );
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    // The paused one resumes where it was.
    assert!(c.cli(&["sandbox", "resume", &pauses]).status.success());
    assert_eq!(stdout(&c.cli(&["fs", "get", &pauses, "/root/kept"])), "yes");
    // The TTL paused it once; resumed, it keeps running past the next sweep.
    std::thread::sleep(std::time::Duration::from_secs(6));
    assert_eq!(c.sandbox(&pauses)["state"], "running");
    // Bad values are refused.
    let bad = c.cli(&["sandbox", "create", "--ttl-action", "pause"]);
    assert!(!bad.status.success());
}

#[test]
fn snapshot_restores_as_a_new_execution_on_the_same_or_another_worker_and_a_tampered_one_is_refused()
 {
    if !can_run_jails() {
        return;
    }
    let c = Cluster::start();
    let id = c.create(&["--worker", "w1"]);
    assert!(
        c.cli_with_stdin(&["fs", "put", &id, "-", "/root/s"], b"snap")
            .status
            .success()
    );
    let g1 = c.sandbox(&id)["execution"]["generation"].as_u64().unwrap();
    let out = c.cli(&["--json", "sandbox", "snapshot", &id]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(c.sandbox(&id)["state"], "paused");
    // Tamper with the stored snapshot: the restore is refused and nothing changes.
    let stored = c.data_dir().join("snapshots").join(format!("{id}.tar"));
    let good = std::fs::read(&stored).unwrap();
    let mut bad = good.clone();
    let n = bad.len() / 2;
    bad[n] ^= 0x40;
    std::fs::write(&stored, &bad).unwrap();
    let refused = c.cli(&["sandbox", "resume", &id, "--worker", "w2"]);
    assert!(!refused.status.success());
    assert!(String::from_utf8_lossy(&refused.stderr).contains("snapshot_corrupt"));
    std::fs::write(&stored, &good[..good.len() - 10]).unwrap();
    assert!(
        !c.cli(&["sandbox", "resume", &id, "--worker", "w2"])
            .status
            .success(),
        "truncated accepted"
    );
    assert_eq!(c.sandbox(&id)["state"], "paused");
    assert_eq!(c.sandbox(&id)["execution"]["generation"].as_u64(), Some(g1));
    // The genuine snapshot restores on the same worker as a new execution.
    std::fs::write(&stored, &good).unwrap();
    let out = c.cli(&["--json", "sandbox", "resume", &id, "--worker", "w1"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let s = json(&out.stdout);
    assert_eq!(s["state"], "running");
    assert_eq!(s["execution"]["worker"], "w1");
    assert_eq!(s["execution"]["generation"].as_u64(), Some(g1 + 1));
    let got = c.cli(&["fs", "get", &id, "/root/s"]);
    // With the CLI's error, so that a transient refusal is told from a lost file.
    assert_eq!(
        stdout(&got),
        "snap",
        "{}",
        String::from_utf8_lossy(&got.stderr)
    );
    // And again, onto the other worker.
    assert!(c.cli(&["sandbox", "snapshot", &id]).status.success());
    let out = c.cli(&["--json", "sandbox", "resume", &id, "--worker", "w2"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let s = json(&out.stdout);
    assert_eq!(s["execution"]["worker"], "w2");
    assert_eq!(s["execution"]["generation"].as_u64(), Some(g1 + 2));
    let got = c.cli(&["fs", "get", &id, "/root/s"]);
    // With the CLI's error, so that a transient refusal is told from a lost file.
    assert_eq!(
        stdout(&got),
        "snap",
        "{}",
        String::from_utf8_lossy(&got.stderr)
    );
}

/// Whether a cgroup of `sandbox`'s jail reports itself frozen (v1 or v2).
fn jail_frozen(sandbox: &str) -> bool {
    for root in ["/sys/fs/cgroup/freezer", "/sys/fs/cgroup"] {
        let Ok(parents) = std::fs::read_dir(root) else {
            continue;
        };
        for parent in parents.flatten() {
            let Ok(children) = std::fs::read_dir(parent.path()) else {
                continue;
            };
            for child in children.flatten() {
                if !child
                    .file_name()
                    .to_string_lossy()
                    .starts_with(&format!("{sandbox}."))
                {
                    continue;
                }
                let p = child.path();
                let v1 = std::fs::read_to_string(p.join("freezer.state"));
                let v2 = std::fs::read_to_string(p.join("cgroup.freeze"));
                if v1.is_ok_and(|s| s.trim() == "FROZEN") || v2.is_ok_and(|s| s.trim() == "1") {
                    return true;
                }
            }
        }
    }
    false
}

#[test]
fn kill_of_a_worker_during_a_migration_leaves_one_consistent_state() {
    if !can_run_jails() {
        return;
    }
    let c = Cluster::start();
    let data_dir = c.data_dir();
    let data_dir = data_dir.to_str().unwrap();
    // The source dies with its jail frozen for the snapshot; then the target dies
    // while the layer is on its way to it; then the source dies during a snapshot
    // the control plane keeps.
    for (victim, op) in [("w1", "migrate"), ("w2", "migrate"), ("w1", "snapshot")] {
        let id = c.create(&["--worker", "w1"]);
        let fill = c.cli(&[
            "exec",
            &id,
            "--",
            "sh",
            "-c",
            "echo survives > /root/f && head -c 100000000 /dev/urandom > /root/big",
        ]);
        assert!(
            fill.status.success(),
            "{}",
            String::from_utf8_lossy(&fill.stderr)
        );
        let before = c.sandbox(&id);
        let pid = pid_of(&["worker", "--id", victim, data_dir]);
        if victim == "w2" {
            nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGSTOP,
            )
            .unwrap();
        }
        let mut args = vec!["sandbox", op, &id];
        if op == "migrate" {
            args.extend(["--worker", "w2"]);
        }
        let mut migrate = c.spawn_cli(&args);
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(15);
        while !jail_frozen(&id) {
            assert!(
                std::time::Instant::now() < deadline,
                "{victim}: the source was never frozen"
            );
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        if victim == "w2" {
            // Kill the target only once the archive is on its way to it: killed
            // earlier, the supervisor's fresh w2 would take the layer and the
            // migration would (rightly) succeed. The control plane reports the step;
            // the stopped target's socket then holds what the kernel accepted.
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
            while !c.sandbox(&id)["step"]
                .as_str()
                .is_some_and(|s| s.contains("transferring"))
            {
                assert!(
                    std::time::Instant::now() < deadline,
                    "{victim}: the transfer never started: {}",
                    c.sandbox(&id)
                );
                std::thread::sleep(std::time::Duration::from_millis(5));
            }
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        kill9(pid);
        let status = migrate.wait().unwrap();
        assert!(
            !status.success(),
            "{victim}: the migration cannot have succeeded"
        );
        // The supervisor restarts the worker; the sandbox ends up running, on one
        // execution, with its files, and nothing else serves it.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        let after = loop {
            let s = c.sandbox(&id);
            if s["state"] == "running" && !jail_frozen(&id) {
                break s;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "{victim}: not consistent: {s}"
            );
            std::thread::sleep(std::time::Duration::from_millis(100));
        };
        c.wait_for_workers(2);
        assert_eq!(
            after["execution"]["worker"], "w1",
            "{victim}: the sandbox moved although the migration failed: {after}"
        );
        let got = c.cli(&["fs", "get", &id, "/root/f"]);
        assert_eq!(
            stdout(&got),
            "survives\n",
            "{victim}: {}",
            String::from_utf8_lossy(&got.stderr)
        );
        let exec = c.cli(&["exec", &id, "--", "echo", "alive"]);
        assert_eq!(stdout(&exec), "alive\n", "{victim}");
        // Nothing half-taken is left to restore.
        let (status, _) = c.http(
            "POST",
            &format!("{}/v1/sandboxes/{id}/resume", c.url),
            Some(&format!("Bearer {}", c.admin_key)),
            br#"{"worker":"w2"}"#,
        );
        assert_eq!(status, 409, "{victim} {op}");
        assert!(
            after["execution"]["generation"].as_u64() >= before["execution"]["generation"].as_u64()
        );
        // The target keeps no jail for it: only the execution the control plane lists
        // runs anywhere.
        let current = after["execution"]["execution_id"].as_str().unwrap();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        loop {
            let all = jail_pids_of(&id);
            let own = jail_pids_of(&format!("{id}.{current}"));
            if !own.is_empty() && all.len() == own.len() {
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "{victim}: jails other than {current} still run for {id}"
            );
            std::thread::sleep(std::time::Duration::from_millis(200));
        }
        c.cli(&["sandbox", "rm", &id]);
    }
}

#[test]
fn crash_of_the_control_plane_during_a_snapshot_leaves_one_consistent_state() {
    if !can_run_jails() {
        return;
    }
    let mut c = Cluster::start();
    let id = c.create(&["--worker", "w1"]);
    let fill = c.cli(&[
        "exec",
        &id,
        "--",
        "sh",
        "-c",
        "echo survives > /root/f && head -c 100000000 /dev/urandom > /root/big",
    ]);
    assert!(fill.status.success());
    let mut snapshot = c.spawn_cli(&["sandbox", "snapshot", &id]);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(15);
    while !jail_frozen(&id) {
        assert!(
            std::time::Instant::now() < deadline,
            "the jail was never frozen"
        );
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    c.crash_and_restart();
    let _ = snapshot.kill();
    let _ = snapshot.wait();
    // Either the snapshot was kept before the crash (paused, frozen, restorable) or it
    // was not (running again, thawed, nothing to restore) — never a mix.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(40);
    let state = loop {
        let s = c.sandbox(&id);
        let frozen = jail_frozen(&id);
        if (s["state"] == "running" && !frozen) || (s["state"] == "paused" && frozen) {
            break s["state"].as_str().unwrap().to_owned();
        }
        assert!(
            std::time::Instant::now() < deadline,
            "not consistent: {s} frozen={frozen}"
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    };
    let resume = c.cli(&["sandbox", "resume", &id, "--worker", "w2"]);
    if state == "running" {
        assert!(!resume.status.success(), "a running sandbox was restored");
    } else {
        assert!(
            resume.status.success(),
            "{}",
            String::from_utf8_lossy(&resume.stderr)
        );
        assert_eq!(c.sandbox(&id)["execution"]["worker"], "w2");
    }
    assert_eq!(stdout(&c.cli(&["fs", "get", &id, "/root/f"])), "survives\n");
}

#[test]
fn migrate_on_a_terminal_shows_the_step_under_way() {
    if !can_run_jails() {
        return;
    }
    if std::process::Command::new("script")
        .arg("--version")
        .output()
        .is_err()
    {
        eprintln!("skipped: needs `script` (util-linux) to give the CLI a terminal");
        return;
    }
    let c = Cluster::start();
    let id = c.create(&["--worker", "w1"]);
    // The target is held still for a while, so the transfer is seen under way.
    let data_dir = c.data_dir();
    let w2 = pid_of(&["worker", "--id", "w2", data_dir.to_str().unwrap()]);
    let w2 = nix::unistd::Pid::from_raw(w2);
    nix::sys::signal::kill(w2, nix::sys::signal::Signal::SIGSTOP).unwrap();
    let resume = std::thread::spawn(move || {
        std::thread::sleep(std::time::Duration::from_millis(1500));
        nix::sys::signal::kill(w2, nix::sys::signal::Signal::SIGCONT).unwrap();
    });
    let cmd = format!(
        "{} sandbox migrate {id} --worker w2",
        support::space_bin().display()
    );
    let out = std::process::Command::new("script")
        .args(["-qec", &cmd, "/dev/null"])
        .env("SPACE_URL", &c.url)
        .env("SPACE_API_KEY", &c.admin_key)
        .output()
        .unwrap();
    resume.join().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert!(
        text.contains(&format!("migrating {id} to w2: transferring")),
        "{text}"
    );
    assert!(text.contains("new execution exe_"), "{text}");
    // Once done, no step is reported.
    assert!(c.sandbox(&id).get("step").is_none());
}

#[test]
fn a_worker_signalled_while_it_waits_to_enroll_stops_promptly_and_cleanly() {
    use std::os::unix::process::ExitStatusExt;
    if !can_run_jails() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("enroll.key"), "not-used").unwrap();
    // Nothing listens on port 1: the worker keeps retrying its enrollment.
    let mut w = std::process::Command::new(support::space_bin())
        .args(["worker", "--id", "wx", "--control", "http://127.0.0.1:1"])
        .env("SPACE_NO_EGRESS", "1")
        .arg("--enroll-secret-file")
        .arg(dir.path().join("enroll.key"))
        .arg("--data-dir")
        .arg(dir.path().join("data"))
        .args(["--cgroup-parent", "space-test-signal"])
        .env("SPACE_LOG", "error")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    std::thread::sleep(std::time::Duration::from_millis(500));
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(w.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(15);
    let status = loop {
        if let Some(s) = w.try_wait().unwrap() {
            break s;
        }
        if std::time::Instant::now() > deadline {
            let _ = w.kill();
            panic!("the worker ignored SIGTERM while enrolling");
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    // A worker stopped before it ran anything keeps its disk volume for its next
    // start (as after a crash); this test has no next start: detach it.
    let _ = nix::mount::umount2(
        &dir.path().join("data/sandboxes"),
        nix::mount::MntFlags::MNT_DETACH,
    );
    // Handled (an exit code), not the signal's default action.
    assert_eq!(status.signal(), None, "{status:?}");
    assert_ne!(status.code(), Some(0), "{status:?}");
}
