//! End to end: `space up` with two workers, driven through the CLI and HTTP, with real
//! processes, jails and sockets on loopback.

mod support;

use support::{Cluster, can_run_jails, http};

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

    assert!(
        !c.cli_with_stdin(&["fs", "put", &id, "-", "/root/notes/a.txt"], b"first")
            .status
            .success(),
        "writing into a missing directory is an error"
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
    // The replacement has the files, under a new execution.
    assert_eq!(stdout(&c.cli(&["fs", "get", &lost, "/root/f"])), "data");
    // The old capability, at the restarted worker: refused as stale, never served.
    let new_cap = capability(&c, &lost, &["exec"]);
    let mut stale = old_cap.clone();
    stale["route"]["worker_url"] = new_cap["route"]["worker_url"].clone();
    let (status, body) = direct_exec(&stale, &lost, old_cap["token"].as_str().unwrap());
    assert_eq!(status, 421, "{body}");
    assert_eq!(body["error"], "refresh_route");
    assert_eq!(body["reason"], "stale_generation");
}

fn kill9(pid: i32) {
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid),
        nix::sys::signal::Signal::SIGKILL,
    );
}

/// The PID of the process whose command line contains all of `words`.
fn pid_of(words: &[&str]) -> i32 {
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let Ok(cmd) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
            continue;
        };
        let cmd = String::from_utf8_lossy(&cmd).replace('\0', " ");
        if words.iter().all(|w| cmd.contains(w)) {
            return pid;
        }
    }
    panic!("no process with {words:?}");
}

/// Host PIDs of the jail processes of a sandbox (from its cgroups).
fn jail_pids_of(sandbox: &str) -> Vec<i32> {
    let mut out = Vec::new();
    for root in [
        "/sys/fs/cgroup/pids",
        "/sys/fs/cgroup/unified",
        "/sys/fs/cgroup",
    ] {
        let Ok(parents) = std::fs::read_dir(root) else {
            continue;
        };
        for parent in parents.flatten() {
            let Ok(children) = std::fs::read_dir(parent.path()) else {
                continue;
            };
            for child in children.flatten() {
                if child
                    .file_name()
                    .to_string_lossy()
                    .starts_with(&format!("{sandbox}."))
                {
                    if let Ok(procs) = std::fs::read_to_string(child.path().join("cgroup.procs")) {
                        out.extend(procs.lines().filter_map(|l| l.parse::<i32>().ok()));
                    }
                }
            }
        }
        if !out.is_empty() {
            break;
        }
    }
    out
}
