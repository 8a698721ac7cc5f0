//! Two control-plane replicas on one PostgreSQL, one worker: either replica creates,
//! authorizes and serves any sandbox, and generations stay unique.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};

use space_testkit::cluster as support;
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
    start_with(args, prefix, &[])
}

fn start_with(args: &[&str], prefix: &str, env: &[(&str, &str)]) -> (Proc, String) {
    let mut child = Command::new(space_bin())
        .args(args)
        .env("SPACE_LOG", "warn")
        // No egress table: a test's killed worker must not leave one behind.
        .env("SPACE_NO_EGRESS", "1")
        .envs(env.iter().copied())
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

/// Starts a control-plane replica on `db` with its data in `dir`.
fn start_control(dir: &std::path::Path, db: &str, env: &[(&str, &str)]) -> (Proc, String) {
    start_with(
        &[
            "control",
            "--listen",
            "127.0.0.1:0",
            "--data-dir",
            dir.to_str().unwrap(),
            "--database-url",
            db,
        ],
        "control plane listening on ",
        env,
    )
}

/// Starts worker `id` enrolled with the replica at `control`.
fn start_worker(id: &str, control: &str, enroll: &std::path::Path, dir: &std::path::Path) -> Proc {
    // One cgroup parent per worker: the tests of this file run at once.
    static N: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let cgroup = format!("space-test-replicas-{}-{n}", std::process::id());
    start(
        &[
            "worker",
            "--id",
            id,
            "--control",
            control,
            "--enroll-secret-file",
            enroll.to_str().unwrap(),
            "--data-dir",
            dir.join(id).to_str().unwrap(),
            "--cgroup-parent",
            &cgroup,
        ],
        &format!("worker {id} listening on "),
    )
    .0
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
    let (_a, a) = start_control(&a_dir, &db, &[]);
    let (_b, b) = start_control(&b_dir, &db, &[]);
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
    let _w = start_worker("w1", &b, &a_dir.join("enroll.key"), dir.path());

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

/// The replica a worker enrolled with dies (`kill -9`); the other takes over the
/// sandbox's operations. The execution, its route and the capabilities the dead
/// replica issued stay valid, and streams opened before the hand-off (at the worker,
/// and through a standalone edge that relayed to the dead replica) keep delivering.
#[test]
fn a_surviving_replica_takes_over_keeping_the_execution_capabilities_and_streams() {
    use futures_util::StreamExt;
    use tokio_tungstenite::tungstenite::{Message, client::IntoClientRequest};

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
    let (mut a_proc, a) = start_control(&a_dir, &db, &[]);
    let (_b, b) = start_control(&b_dir, &db, &[]);
    let admin = format!(
        "Bearer {}",
        std::fs::read_to_string(a_dir.join("admin.key"))
            .unwrap()
            .trim()
    );
    let _w = start_worker("w1", &a, &a_dir.join("enroll.key"), dir.path());
    let json = |b: &[u8]| -> serde_json::Value { serde_json::from_slice(b).unwrap() };
    let exec = |url: &str, auth: &str, id: &str, cmd: &str| -> serde_json::Value {
        let body = serde_json::json!({"cmd": ["sh", "-c", cmd]}).to_string();
        let (status, body) = http(
            "POST",
            &format!("{url}/v1/sandboxes/{id}/exec"),
            Some(auth),
            body.as_bytes(),
        );
        assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
        json(&body)
    };

    let (status, body) = http("POST", &format!("{a}/v1/sandboxes"), Some(&admin), b"{}");
    assert_eq!(status, 201, "{}", String::from_utf8_lossy(&body));
    let id = json(&body)["id"].as_str().unwrap().to_owned();
    let before = exec(&a, &admin, &id, "true")["execution_id"].clone();
    assert!(before.is_string());
    let (status, body) = http(
        "POST",
        &format!("{a}/v1/sandboxes/{id}/capabilities"),
        Some(&admin),
        br#"{"access":["exec","watch"],"purpose":"control"}"#,
    );
    assert_eq!(status, 200);
    let cap = json(&body);
    let worker = cap["route"]["worker_url"].as_str().unwrap().to_owned();
    let cap_auth = format!("SpaceCap {}", cap["token"].as_str().unwrap());

    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    // A standalone edge that relays to the replica about to die.
    let (_edge, edge) = start(
        &["edge", "--control", &a, "--listen", "127.0.0.1:0"],
        "edge listening on ",
    );
    let open = |base: &str, auth: &str| {
        let mut req = format!(
            "{}/v1/sandboxes/{id}/watch?path=/root",
            base.replacen("http", "ws", 1)
        )
        .into_client_request()
        .unwrap();
        req.headers_mut()
            .insert("authorization", auth.parse().unwrap());
        rt.block_on(tokio_tungstenite::connect_async(req))
            .unwrap()
            .0
    };
    // One watch straight at the worker, one through the edge.
    let mut watches = [open(&worker, &cap_auth), open(&edge, &admin)];

    // The replica that created the sandbox, issued the capability and enrolled the
    // worker dies without warning.
    a_proc.0.kill().unwrap();
    a_proc.0.wait().unwrap();

    // The survivor serves the same execution; the dead replica's capability still
    // opens it at the worker.
    assert_eq!(exec(&b, &admin, &id, "true")["execution_id"], before);
    let direct = exec(&worker, &cap_auth, &id, "echo handed-off > /root/after");
    assert_eq!(direct["execution_id"], before);
    // The streams opened before the hand-off see the change.
    for watch in &mut watches {
        rt.block_on(async {
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(15);
            loop {
                let left = deadline.saturating_duration_since(std::time::Instant::now());
                let m = tokio::time::timeout(left, watch.next())
                    .await
                    .expect("no watch event after the hand-off")
                    .expect("the watch ended")
                    .expect("watch error");
                match m {
                    Message::Text(t) if t.contains("after") => break,
                    Message::Close(f) => panic!("the watch closed: {f:?}"),
                    _ => {}
                }
            }
        });
    }
    // The survivor's signed updates reach the worker the dead replica enrolled:
    // pause and resume in place keep the execution and the stream.
    for op in ["pause", "resume"] {
        let (status, body) = http(
            "POST",
            &format!("{b}/v1/sandboxes/{id}/{op}"),
            Some(&admin),
            b"",
        );
        assert_eq!(status, 200, "{op}: {}", String::from_utf8_lossy(&body));
    }
    let out = exec(&b, &admin, &id, "cat /root/after");
    assert_eq!(out["execution_id"], before);
    assert_eq!(out["stdout"], "handed-off\n");
    let (status, body) = http(
        "POST",
        &format!("{b}/v1/sandboxes/{id}/capabilities"),
        Some(&admin),
        br#"{"access":["exec"],"purpose":"control"}"#,
    );
    assert_eq!(status, 200);
    let fresh = json(&body);
    assert_eq!(
        fresh["route"], cap["route"],
        "the route changed in the hand-off"
    );
    for watch in &mut watches {
        rt.block_on(async {
            let m = tokio::time::timeout(std::time::Duration::from_millis(300), watch.next()).await;
            if let Ok(Some(Ok(Message::Close(f)))) = m {
                panic!("the watch closed after pause/resume: {f:?}");
            }
        });
    }
}

/// A migration held up on one replica (its target stalls for longer than the
/// reconciler's grace period) is not taken over by the other replica's reconciler:
/// the replica running it renews its lease. It then finishes normally.
#[test]
fn a_slow_transition_on_one_replica_is_not_taken_over_by_another() {
    if !can_run_jails() {
        return;
    }
    let Some(pg) = space_store::testing::PgServer::start().expect("PostgreSQL failed to start")
    else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let db = pg.url();
    let lease = [("SPACE_RECONCILE_AFTER_SECS", "1")];
    let (_a, a) = start_control(&dir.path().join("a"), &db, &lease);
    let (_b, b) = start_control(&dir.path().join("b"), &db, &lease);
    let admin = format!(
        "Bearer {}",
        std::fs::read_to_string(dir.path().join("a/admin.key"))
            .unwrap()
            .trim()
    );
    let enroll = dir.path().join("a/enroll.key");
    let workers: Vec<Proc> = ["w1", "w2"]
        .iter()
        .map(|id| start_worker(id, &a, &enroll, dir.path()))
        .collect();
    let (status, body) = http(
        "POST",
        &format!("{a}/v1/sandboxes"),
        Some(&admin),
        br#"{"worker":"w1"}"#,
    );
    assert_eq!(status, 201, "{}", String::from_utf8_lossy(&body));
    let id = serde_json::from_slice::<serde_json::Value>(&body).unwrap()["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let w2 = nix::unistd::Pid::from_raw(workers[1].0.id() as i32);
    nix::sys::signal::kill(w2, nix::sys::signal::Signal::SIGSTOP).unwrap();
    let migrate = {
        let (a, id, admin) = (a.clone(), id.clone(), admin.clone());
        std::thread::spawn(move || {
            http(
                "POST",
                &format!("{a}/v1/sandboxes/{id}/migrate"),
                Some(&admin),
                br#"{"worker":"w2"}"#,
            )
        })
    };
    // Longer than B's grace period plus one reconciler round (5 s).
    let until = std::time::Instant::now() + std::time::Duration::from_secs(8);
    let mut seen_migrating = false;
    while std::time::Instant::now() < until {
        let (_, body) = http("GET", &format!("{b}/v1/sandboxes/{id}"), Some(&admin), b"");
        let s: serde_json::Value = serde_json::from_slice(&body).unwrap();
        seen_migrating |= s["state"] == "migrating";
        assert!(
            !seen_migrating || s["state"] == "migrating",
            "replica B took over a migration still under way on A: {s}"
        );
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    assert!(seen_migrating, "the migration was never under way");
    nix::sys::signal::kill(w2, nix::sys::signal::Signal::SIGCONT).unwrap();
    let (status, body) = migrate.join().unwrap();
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
    let s: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(s["state"], "running");
    assert_eq!(s["execution"]["worker"], "w2");
}
