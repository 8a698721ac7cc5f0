//! Two control-plane replicas on one PostgreSQL, one worker: either replica creates,
//! authorizes and serves any sandbox, and generations stay unique.

mod support;

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};

use support::{can_run_jails, http, space_bin};

struct Proc(Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(self.0.id() as i32),
            nix::sys::signal::Signal::SIGTERM,
        );
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        while std::time::Instant::now() < deadline {
            if let Ok(Some(_)) = self.0.try_wait() {
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts a `space` subcommand and returns it with the URL from its first line.
fn start(args: &[&str], prefix: &str) -> (Proc, String) {
    let mut child = Command::new(space_bin())
        .args(args)
        .env("SPACE_LOG", "warn")
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let first = lines.next().unwrap().unwrap();
    std::thread::spawn(move || for _ in lines {});
    let url = first
        .strip_prefix(prefix)
        .unwrap_or_else(|| panic!("unexpected: {first}"))
        .to_owned();
    (Proc(child), url)
}

#[test]
fn two_control_plane_replicas_on_one_postgresql_serve_the_same_sandboxes() {
    if !can_run_jails() {
        return;
    }
    let Some(pg) = space_store::testing::PgServer::start().expect("PostgreSQL failed to start")
    else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let (a_dir, b_dir) = (dir.path().join("a"), dir.path().join("b"));
    let db = pg.url();
    let (_a, a) = start(
        &[
            "control",
            "--listen",
            "127.0.0.1:0",
            "--data-dir",
            a_dir.to_str().unwrap(),
            "--database-url",
            &db,
        ],
        "control plane listening on ",
    );
    let (_b, b) = start(
        &[
            "control",
            "--listen",
            "127.0.0.1:0",
            "--data-dir",
            b_dir.to_str().unwrap(),
            "--database-url",
            &db,
        ],
        "control plane listening on ",
    );
    // Both replicas hold the same enrollment secret; the first wrote the admin key.
    assert_eq!(
        std::fs::read_to_string(a_dir.join("enroll.key")).unwrap(),
        std::fs::read_to_string(b_dir.join("enroll.key")).unwrap()
    );
    let admin = format!(
        "Bearer {}",
        std::fs::read_to_string(a_dir.join("admin.key"))
            .unwrap()
            .trim()
    );
    let worker_dir = dir.path().join("w1");
    let cgroup = format!("space-test-replicas-{}", std::process::id());
    let (_w, _) = start(
        &[
            "worker",
            "--id",
            "w1",
            "--control",
            &b,
            "--enroll-secret-file",
            a_dir.join("enroll.key").to_str().unwrap(),
            "--data-dir",
            worker_dir.to_str().unwrap(),
            "--cgroup-parent",
            &cgroup,
        ],
        "worker w1 listening on ",
    );

    // Create through A, run through B, and the other way round.
    let (status, body) = http("POST", &format!("{a}/v1/sandboxes"), Some(&admin), b"{}");
    assert_eq!(status, 201, "{}", String::from_utf8_lossy(&body));
    let s1: serde_json::Value = serde_json::from_slice(&body).unwrap();
    let id1 = s1["id"].as_str().unwrap();
    let (status, body) = http(
        "POST",
        &format!("{b}/v1/sandboxes/{id1}/exec"),
        Some(&admin),
        br#"{"cmd":["echo","from b"]}"#,
    );
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
    let (status, body) = http("POST", &format!("{b}/v1/sandboxes"), Some(&admin), b"{}");
    assert_eq!(status, 201, "{}", String::from_utf8_lossy(&body));
    let s2: serde_json::Value = serde_json::from_slice(&body).unwrap();
    let id2 = s2["id"].as_str().unwrap();
    let (status, _) = http(
        "POST",
        &format!("{a}/v1/sandboxes/{id2}/exec"),
        Some(&admin),
        br#"{"cmd":["true"]}"#,
    );
    assert_eq!(status, 200);
    // Both see both.
    for url in [&a, &b] {
        let (_, body) = http("GET", &format!("{url}/v1/sandboxes"), Some(&admin), b"");
        let list: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(list.as_array().unwrap().len(), 2);
    }
    // A capability signed by A is accepted by the worker B pushed keys to, and the other
    // way round: one trust anchor, one key set.
    for (issuer, sandbox) in [(&a, id2), (&b, id1)] {
        let (status, body) = http(
            "POST",
            &format!("{issuer}/v1/sandboxes/{sandbox}/capabilities"),
            Some(&admin),
            br#"{"access":["exec"],"purpose":"control"}"#,
        );
        assert_eq!(status, 200);
        let cap: serde_json::Value = serde_json::from_slice(&body).unwrap();
        let (status, body) = http(
            "POST",
            &format!(
                "{}/v1/sandboxes/{sandbox}/exec",
                cap["route"]["worker_url"].as_str().unwrap()
            ),
            Some(&format!("SpaceCap {}", cap["token"].as_str().unwrap())),
            br#"{"cmd":["true"]}"#,
        );
        assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
    }
}
