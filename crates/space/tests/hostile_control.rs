//! Hostile tests of the control path (issue 11, holes 2 and 5, and a dead agent):
//! secrets at rest, enrollment of a worker ID that is taken, replayed and stale signed
//! updates (also across a worker restart), and an agent killed from the host.
//!
//! The updates are signed with the trust anchor read from the control plane's store
//! (as root, as an attacker who captured a signed update on the wire would hold one):
//! each test delivers an update once, as the platform would, and then again.

use std::os::unix::fs::PermissionsExt;
use std::time::{Duration, Instant};

use space_testkit::cluster as support;
use support::{Cluster, Signer, can_run_jails, find_pid, http, jail_pids_of, kill9, space_bin};

fn json(bytes: &[u8]) -> serde_json::Value {
    serde_json::from_slice(bytes)
        .unwrap_or_else(|_| panic!("not JSON: {}", String::from_utf8_lossy(bytes)))
}

/// A capability for `sandbox` (its route names the worker and the execution).
fn capability(c: &Cluster, sandbox: &str) -> serde_json::Value {
    let body = serde_json::json!({"access": ["exec"], "purpose": "control"}).to_string();
    let (status, body) = http(
        "POST",
        &format!("{}/v1/sandboxes/{sandbox}/capabilities", c.url),
        Some(&format!("Bearer {}", c.admin_key)),
        body.as_bytes(),
    );
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
    json(&body)
}

/// `{"kind": kind, "sandbox", "generation", "execution_id"}` of the execution `cap`
/// names.
fn on_execution(kind: &str, sandbox: &str, cap: &serde_json::Value) -> serde_json::Value {
    serde_json::json!({
        "kind": kind,
        "sandbox": sandbox,
        "generation": cap["route"]["generation"],
        "execution_id": cap["route"]["execution_id"],
    })
}

/// POSTs a signed update to a worker as the control plane would (with a valid
/// delivery header for w1), so that what is tested is the update itself.
fn post(signer: &Signer, url: &str, body: &str) -> (u16, serde_json::Value) {
    let (status, body) = signer.post_update(url, "w1", body.as_bytes());
    (
        status,
        serde_json::from_slice(&body).unwrap_or(serde_json::Value::Null),
    )
}

/// Whether `space exec` in the sandbox succeeds (it does not while it is frozen).
fn serves(c: &Cluster, id: &str) -> bool {
    let out = c.cli(&["exec", id, "--timeout", "5", "--", "true"]);
    out.status.success()
}

fn worker_url(cap: &serde_json::Value) -> String {
    cap["route"]["worker_url"].as_str().unwrap().to_owned()
}

/// A sandbox on w1 paused and resumed by signed updates sent to the worker (as the
/// control plane would), and the pause's envelope, captured for a replay.
struct Captured {
    id: String,
    cap: serde_json::Value,
    url: String,
    signer: Signer,
    pause: String,
}

fn capture_a_pause(c: &Cluster) -> Captured {
    let id = c.create(&["--worker", "w1"]);
    let cap = capability(c, &id);
    let url = format!("{}/internal/v1/updates", worker_url(&cap));
    let signer = Signer::of(c);
    let pause = signer.update("w1", on_execution("pause", &id, &cap));
    let (status, ack) = post(&signer, &url, &pause);
    assert_eq!(
        (status, ack["state"].as_str()),
        (200, Some("paused")),
        "{ack}"
    );
    let resume = signer.update("w1", on_execution("resume", &id, &cap));
    let (status, ack) = post(&signer, &url, &resume);
    assert_eq!(
        (status, ack["state"].as_str()),
        (200, Some("running")),
        "{ack}"
    );
    Captured {
        id,
        cap,
        url,
        signer,
        pause,
    }
}

#[test]
fn replayed_pause_update_is_refused() {
    if !can_run_jails() {
        return;
    }
    let c = Cluster::start();
    let Captured {
        id,
        url,
        signer,
        pause,
        ..
    } = capture_a_pause(&c);
    assert!(serves(&c, &id));

    // The captured pause, again (twice): refused, and the sandbox keeps running.
    for _ in 0..2 {
        let (status, answer) = post(&signer, &url, &pause);
        assert_eq!(status, 409, "a replayed pause was accepted: {answer}");
        assert_eq!(answer["error"], "update_refused");
        assert!(
            answer["message"]
                .as_str()
                .unwrap()
                .starts_with("replayed_update"),
            "{answer}"
        );
    }
    assert!(serves(&c, &id), "the replayed pause froze the sandbox");
}

#[test]
fn replayed_snapshot_update_is_refused() {
    if !can_run_jails() {
        return;
    }
    let c = Cluster::start();
    let id = c.create(&["--worker", "w1"]);
    assert!(
        c.cli_with_stdin(&["fs", "put", &id, "-", "/root/secret"], b"tenant data")
            .status
            .success()
    );
    let cap = capability(&c, &id);
    let base = worker_url(&cap);
    let signer = Signer::of(&c);
    let snapshot = signer.update("w1", on_execution("snapshot", &id, &cap));
    let (status, archive) = http(
        "POST",
        &format!("{base}/internal/v1/snapshot"),
        None,
        snapshot.as_bytes(),
    );
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&archive));
    assert!(
        archive.windows(11).any(|w| w == b"tenant data"),
        "the first delivery hands the layer over"
    );
    let (status, ack) = post(
        &signer,
        &format!("{base}/internal/v1/updates"),
        &signer.update("w1", on_execution("unfreeze", &id, &cap)),
    );
    assert_eq!(
        (status, ack["state"].as_str()),
        (200, Some("running")),
        "{ack}"
    );
    assert!(serves(&c, &id));

    // Replayed: no archive, no freeze.
    let (status, body) = http(
        "POST",
        &format!("{base}/internal/v1/snapshot"),
        None,
        snapshot.as_bytes(),
    );
    assert_eq!(
        status,
        409,
        "a replayed snapshot was served: {} bytes",
        body.len()
    );
    assert!(!body.windows(11).any(|w| w == b"tenant data"));
    let answer = json(&body);
    assert!(
        answer["message"]
            .as_str()
            .unwrap()
            .starts_with("replayed_update"),
        "{answer}"
    );
    assert!(serves(&c, &id), "the replayed snapshot froze the sandbox");
}

#[test]
fn update_issued_long_ago_is_refused() {
    if !can_run_jails() {
        return;
    }
    let c = Cluster::start();
    let id = c.create(&["--worker", "w1"]);
    let cap = capability(&c, &id);
    let url = format!("{}/internal/v1/updates", worker_url(&cap));
    let signer = Signer::of(&c);
    let now = support::unix_now();
    for (issued_at, reason) in [
        (0, "stale_update"),
        (now - 600, "stale_update"),
        (now + 3600, "future_update"),
    ] {
        let pause = signer.update_at("w1", issued_at, on_execution("pause", &id, &cap));
        let (status, answer) = post(&signer, &url, &pause);
        assert_eq!(
            status, 403,
            "a pause issued at {issued_at} (now {now}) was accepted: {answer}"
        );
        assert!(
            answer["message"].as_str().unwrap().starts_with(reason),
            "{answer}"
        );
        assert!(
            serves(&c, &id),
            "a pause issued at {issued_at} froze the sandbox"
        );
    }
    // The same update issued now is applied: the refusals were about time alone.
    let (status, ack) = post(
        &signer,
        &url,
        &signer.update("w1", on_execution("pause", &id, &cap)),
    );
    assert_eq!(
        (status, ack["state"].as_str()),
        (200, Some("paused")),
        "{ack}"
    );
}

/// kill -9 of worker `id`; returns once its supervisor has started a new one that
/// serves `sandbox` again.
fn kill_worker_and_wait(c: &Cluster, id: &str, sandbox: &str) {
    let data = c.data_dir();
    let words = ["worker", "--id", id, data.to_str().unwrap()];
    let old = find_pid(&words).expect("worker process");
    kill9(old);
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if find_pid(&words).is_some_and(|p| p != old) && serves(c, sandbox) {
            return;
        }
        assert!(Instant::now() < deadline, "worker {id} did not come back");
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn update_replayed_after_worker_restart_is_refused() {
    if !can_run_jails() {
        return;
    }
    let c = Cluster::start();
    let Captured {
        id,
        cap,
        url,
        signer,
        pause,
    } = capture_a_pause(&c);

    // The worker crashes and comes back (re-adopting the sandbox: same execution).
    kill_worker_and_wait(&c, "w1", &id);
    assert_eq!(
        capability(&c, &id)["route"]["execution_id"],
        cap["route"]["execution_id"],
        "the sandbox was re-adopted, not replaced"
    );
    let (status, answer) = post(&signer, &url, &pause);
    assert_eq!(
        status, 409,
        "a pause replayed after a worker restart was accepted: {answer}"
    );
    assert!(
        answer["message"]
            .as_str()
            .unwrap()
            .starts_with("replayed_update"),
        "{answer}"
    );
    assert!(serves(&c, &id));
}

#[test]
fn re_enrolling_an_existing_worker_id_needs_its_own_credential() {
    if !can_run_jails() {
        return;
    }
    let c = Cluster::start();
    let secret = std::fs::read_to_string(c.data_dir().join("enroll.key")).unwrap();
    let url = format!("{}/internal/v1/enroll", c.url);
    let before = c.worker_urls();
    // A rogue process holding the enrollment secret (but not w1's credential) tries to
    // take over w1, so that w1's next sandboxes (and their env) come to it.
    for credential in [None, Some("not-w1s-credential")] {
        let mut rogue = serde_json::json!({
            "worker": "w1",
            "url": "http://127.0.0.1:9",
            "substrate": "jail",
            "capacity": 100,
            "enroll_secret": secret.trim(),
        });
        if let Some(cred) = credential {
            rogue["credential"] = cred.into();
        }
        let (status, answer) = http("POST", &url, None, rogue.to_string().as_bytes());
        let answer: serde_json::Value =
            serde_json::from_slice(&answer).unwrap_or(serde_json::Value::Null);
        assert_eq!(status, 403, "the rogue took over w1: {answer}");
        assert!(
            answer["message"]
                .as_str()
                .unwrap()
                .contains("needs its own credential"),
            "{answer}"
        );
    }
    assert_eq!(c.worker_urls(), before, "w1's registration changed");

    // w1 itself restarting (as after a crash, or `space up` again) re-enrolls with its
    // credential and serves as before.
    let id = c.create(&["--worker", "w1"]);
    let credential_before = records_setting(&c, "w1", "credential");
    kill_worker_and_wait(&c, "w1", &id);
    c.wait_for_workers(2);
    assert_eq!(c.worker_urls(), before);
    assert_eq!(
        records_setting(&c, "w1", "credential"),
        credential_before,
        "a re-enrolled worker keeps its credential"
    );
    let again = c.create(&["--worker", "w1"]);
    assert!(serves(&c, &again));
}

fn records_setting(c: &Cluster, worker: &str, name: &str) -> Vec<u8> {
    rusqlite::Connection::open(c.worker_dir(worker).join("records.db"))
        .unwrap()
        .query_row("SELECT value FROM settings WHERE name = ?1", [name], |r| {
            r.get(0)
        })
        .unwrap()
}

fn mode(path: &std::path::Path) -> u32 {
    std::fs::symlink_metadata(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .permissions()
        .mode()
        & 0o777
}

#[test]
fn data_directory_databases_and_keys_are_private_from_their_creation() {
    if !can_run_jails() {
        return;
    }
    let c = Cluster::start();
    let id = c.create(&["--worker", "w1"]);
    assert!(serves(&c, &id));
    let data = c.data_dir();
    let mut dirs = vec![data.clone(), data.join("workers")];
    let mut files = vec![data.join("admin.key"), data.join("enroll.key")];
    for db in ["control.db", "control.db-wal", "control.db-shm"] {
        files.push(data.join(db));
    }
    for w in ["w1", "w2"] {
        dirs.push(c.worker_dir(w));
        for db in ["records.db", "records.db-wal", "records.db-shm"] {
            files.push(c.worker_dir(w).join(db));
        }
    }
    for d in &dirs {
        assert_eq!(mode(d), 0o700, "{} is {:04o}", d.display(), mode(d));
    }
    for f in &files {
        assert_eq!(mode(f), 0o600, "{} is {:04o}", f.display(), mode(f));
    }
    // Nothing the daemons made directly in a data directory is open to others.
    for d in &dirs {
        for entry in std::fs::read_dir(d).unwrap().flatten() {
            let m = mode(&entry.path());
            assert_eq!(m & 0o077, 0, "{} is {m:04o}", entry.path().display());
        }
    }
}

/// Runs `space up` on `data` and returns its exit status and standard error; fails
/// if it is still running after 30 s (it started on a directory it should refuse).
fn space_up_on(data: &std::path::Path) -> (std::process::ExitStatus, String) {
    let mut child = std::process::Command::new(space_bin())
        .args([
            "up",
            "--listen",
            "127.0.0.1:0",
            "--workers",
            "1",
            "--data-dir",
        ])
        .arg(data)
        .env("SPACE_LOG", "warn")
        .env("SPACE_WARM_POOL", "0")
        .env("SPACE_STANDBY", "0")
        // No egress: the test needs none, and leaves no table or link behind.
        .env("SPACE_NO_EGRESS", "1")
        // The host's directories as the default template (no image built).
        .env("SPACE_DEFAULT_TEMPLATE", "host")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            let mut err = String::new();
            use std::io::Read;
            child
                .stderr
                .take()
                .unwrap()
                .read_to_string(&mut err)
                .unwrap();
            return (status, err);
        }
        if Instant::now() > deadline {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(child.id() as i32),
                nix::sys::signal::Signal::SIGTERM,
            );
            let _ = child.wait();
            panic!("space up started on {}", data.display());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn space_up_refuses_a_data_directory_or_secret_file_others_can_read() {
    if !can_run_jails() {
        return;
    }
    let mut c = Cluster::start();
    c.stop();
    let data = c.data_dir();

    std::fs::set_permissions(&data, std::fs::Permissions::from_mode(0o755)).unwrap();
    let (status, err) = space_up_on(&data);
    assert!(!status.success());
    assert!(
        err.contains(&data.display().to_string()) && err.contains("chmod 700"),
        "{err}"
    );
    std::fs::set_permissions(&data, std::fs::Permissions::from_mode(0o700)).unwrap();

    for secret in [data.join("control.db"), data.join("admin.key")] {
        std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o644)).unwrap();
        let (status, err) = space_up_on(&data);
        assert!(!status.success());
        assert!(
            err.contains(&secret.display().to_string()) && err.contains("chmod 600"),
            "{err}"
        );
        std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o600)).unwrap();
    }

    // A worker's own data directory too (a worker started on its own).
    let w1 = c.worker_dir("w1");
    std::fs::set_permissions(&w1, std::fs::Permissions::from_mode(0o750)).unwrap();
    let out = std::process::Command::new(space_bin())
        .args(["worker", "--id", "w1", "--control", "http://127.0.0.1:9"])
        .args(["--enroll-secret", "x", "--data-dir"])
        .arg(&w1)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains(&w1.display().to_string()) && err.contains("chmod 700"),
        "{err}"
    );
    std::fs::set_permissions(&w1, std::fs::Permissions::from_mode(0o700)).unwrap();

    // Put right, it starts again with everything it had.
    c.restart();
}

/// The host PID of the sandbox's agent (`spaced-guest`).
fn agent_pid_of(sandbox: &str) -> i32 {
    jail_pids_of(sandbox)
        .into_iter()
        .find(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline"))
                .is_ok_and(|c| String::from_utf8_lossy(&c).contains("spaced-guest"))
        })
        .unwrap_or_else(|| panic!("no agent found for {sandbox}"))
}

fn edge_exec(c: &Cluster, id: &str) -> (u16, serde_json::Value) {
    let (status, body) = http(
        "POST",
        &format!("{}/v1/sandboxes/{id}/exec", c.url),
        Some(&format!("Bearer {}", c.admin_key)),
        br#"{"cmd":["cat","/root/kept"]}"#,
    );
    (
        status,
        serde_json::from_slice(&body).unwrap_or(serde_json::Value::Null),
    )
}

#[test]
fn a_killed_agent_is_relaunched_as_a_new_execution() {
    if !can_run_jails() {
        return;
    }
    let c = Cluster::start();
    let id = c.create(&["--worker", "w1"]);
    assert!(
        c.cli_with_stdin(&["fs", "put", &id, "-", "/root/kept"], b"before the kill")
            .status
            .success()
    );
    let before = c.sandbox(&id);
    let generation = before["execution"]["generation"].as_u64().unwrap();

    // From the host, as a crash (or the OOM killer) would.
    let killed_at = Instant::now();
    kill9(agent_pid_of(&id));
    let mut statuses = Vec::new();
    let relaunched = loop {
        let (status, body) = edge_exec(&c, &id);
        statuses.push(status);
        let now = c.sandbox(&id);
        if status == 200
            && now["execution"]["generation"].as_u64() > Some(generation)
            && now["state"] == "running"
        {
            assert_eq!(body["stdout"], "before the kill", "the files were lost");
            break now;
        }
        assert!(
            killed_at.elapsed() < Duration::from_secs(15),
            "the sandbox was not relaunched: {now} (answers: {statuses:?})"
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    let took = killed_at.elapsed();
    assert!(
        took < Duration::from_secs(10),
        "relaunched only after {took:?}"
    );
    assert_ne!(
        relaunched["execution"]["execution_id"], before["execution"]["execution_id"],
        "a new execution, never the old identity"
    );
    assert_eq!(relaunched["execution"]["worker"], "w1");
    // Not a stream of 502s while the worker noticed and relaunched.
    let bad_gateways = statuses.iter().filter(|s| **s == 502).count();
    assert!(bad_gateways <= 1, "answers while relaunching: {statuses:?}");
    // And it stays served.
    for _ in 0..5 {
        assert_eq!(edge_exec(&c, &id).0, 200);
    }
    eprintln!("relaunched in {took:?}; answers meanwhile: {statuses:?}");
}

#[test]
fn a_replayed_delivery_header_is_refused_before_its_body_is_read() {
    if !can_run_jails() {
        return;
    }
    let c = Cluster::start();
    let id = c.create(&["--worker", "w1"]);
    let cap = capability(&c, &id);
    let url = format!("{}/internal/v1/updates", worker_url(&cap));
    let signer = Signer::of(&c);
    let pause = signer.update("w1", on_execution("pause", &id, &cap));
    // A delivery header captured with its request, sent again at once.
    let header = signer.delivery("w1", pause.as_bytes());
    let (status, _) = support::post_delivered(&url, &header, pause.as_bytes());
    assert_eq!(status, 200);
    let (status, answer) = support::post_delivered(&url, &header, pause.as_bytes());
    let answer = String::from_utf8_lossy(&answer);
    assert_eq!(status, 409, "{answer}");
    assert!(answer.contains("replayed_delivery"), "{answer}");
    // Fresh deliveries go on.
    let (status, ack) = post(
        &signer,
        &url,
        &signer.update("w1", on_execution("resume", &id, &cap)),
    );
    assert_eq!(
        (status, ack["state"].as_str()),
        (200, Some("running")),
        "{ack}"
    );
    assert!(serves(&c, &id));
}
