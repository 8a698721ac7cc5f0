//! `/healthz` and `/readyz` of every daemon: the control plane (with its edge), a
//! worker and a standalone edge, each ready and not ready. `/healthz` says 200 while
//! the process serves; `/readyz` 503 `not_ready` when it cannot do its job. Neither
//! asks for a credential.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use space_testkit::cluster as support;
use support::{Cluster, can_run_jails, http, space_bin};

/// A daemon started by a test, stopped with SIGTERM (then SIGKILL) when dropped.
struct Proc(Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(self.0.id() as i32),
            nix::sys::signal::Signal::SIGTERM,
        );
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.0.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A worker's process; once it is gone, its disk volume is detached (a worker stopped
/// while starting leaves it mounted), so that its data directory can be removed.
struct WorkerProc {
    proc: Option<Proc>,
    data_dir: std::path::PathBuf,
}

impl Drop for WorkerProc {
    fn drop(&mut self) {
        drop(self.proc.take());
        let _ = nix::mount::umount2(
            &self.data_dir.join("sandboxes"),
            nix::mount::MntFlags::MNT_DETACH,
        );
    }
}

/// Starts `space <args>`; with a `prefix`, waits for its first line and returns the
/// URL that follows the prefix there.
fn start(args: &[&str], prefix: Option<&str>) -> (Proc, String) {
    let mut child = Command::new(space_bin())
        .args(args)
        .env("SPACE_LOG", "warn")
        // No egress table: a test's killed worker must not leave one behind.
        .env("SPACE_NO_EGRESS", "1")
        .env_remove("SPACE_UP_PID")
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let Some(prefix) = prefix else {
        std::thread::spawn(move || for _ in lines {});
        return (Proc(child), String::new());
    };
    let first = lines.next().unwrap().unwrap();
    std::thread::spawn(move || for _ in lines {});
    let url = first
        .strip_prefix(prefix)
        .unwrap_or_else(|| panic!("unexpected first line: {first}"))
        .to_owned();
    (Proc(child), url)
}

/// A worker `id` (its own process, not one of `space up`'s) with its data in `dir`,
/// enrolling with `control`.
fn worker_args(id: &str, control: &str, enroll: &str, dir: &str) -> Vec<String> {
    // One cgroup parent per worker: the tests of this file run at once.
    static N: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    [
        "worker",
        "--id",
        id,
        "--control",
        control,
        "--enroll-secret-file",
        enroll,
        "--data-dir",
        dir,
        "--cgroup-parent",
        &format!("space-test-health-{}-{n}", std::process::id()),
        "--warm-pool",
        "0",
    ]
    .map(str::to_owned)
    .to_vec()
}

/// `GET url` without credentials: status and body as JSON.
fn get(url: &str) -> (u16, serde_json::Value) {
    let (status, body) = http("GET", url, None, b"");
    let json = serde_json::from_slice(&body)
        .unwrap_or_else(|e| panic!("{url}: {e}: {}", String::from_utf8_lossy(&body)));
    (status, json)
}

fn is_healthy(base: &str) {
    assert_eq!(
        get(&format!("{base}/healthz")),
        (200, serde_json::json!({"status": "ok"})),
        "{base}/healthz"
    );
}

fn is_ready(base: &str) {
    assert_eq!(
        get(&format!("{base}/readyz")),
        (200, serde_json::json!({"status": "ready"})),
        "{base}/readyz"
    );
}

/// Waits up to `limit` for `/readyz` of `base` to answer 200 (a worker the control
/// plane lists as active may still be reconciling what the sync told it).
fn becomes_ready(base: &str, limit: Duration) {
    let deadline = Instant::now() + limit;
    loop {
        let (status, body) = get(&format!("{base}/readyz"));
        if status == 200 {
            assert_eq!(body, serde_json::json!({"status": "ready"}));
            return;
        }
        assert_eq!(status, 503, "{body}");
        assert_eq!(body["error"], "not_ready", "{body}");
        assert!(
            Instant::now() < deadline,
            "{base}/readyz still says {body} after {limit:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Waits up to `limit` for `/readyz` of `base` to answer 503; its message.
fn becomes_not_ready(base: &str, limit: Duration) -> String {
    let deadline = Instant::now() + limit;
    loop {
        let (status, body) = get(&format!("{base}/readyz"));
        if status == 503 {
            assert_eq!(body["error"], "not_ready", "{body}");
            return body["message"].as_str().unwrap().to_owned();
        }
        assert_eq!(status, 200, "{body}");
        assert!(
            Instant::now() < deadline,
            "{base}/readyz still says ready after {limit:?}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// A loopback port nothing listens on (bound, then released).
fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().port()
}

#[test]
fn the_control_plane_and_its_edge_are_healthy_and_ready_without_a_credential() {
    if !can_run_jails() {
        return;
    }
    let c = Cluster::start();
    is_healthy(&c.url);
    is_ready(&c.url);
}

#[test]
fn a_control_plane_whose_store_is_gone_is_healthy_but_not_ready() {
    let Some(pg) = space_store::testing::PgServer::start().expect("PostgreSQL failed to start")
    else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("control");
    let (_control, url) = start(
        &[
            "control",
            "--listen",
            "127.0.0.1:0",
            "--data-dir",
            data.to_str().unwrap(),
            "--database-url",
            &pg.url(),
        ],
        Some("control plane listening on "),
    );
    is_ready(&url);
    drop(pg);
    let why = becomes_not_ready(&url, Duration::from_secs(10));
    assert_eq!(why, "the store does not answer");
    is_healthy(&url);
}

#[test]
fn a_worker_enrolled_and_synced_is_healthy_and_ready() {
    if !can_run_jails() {
        return;
    }
    let c = Cluster::start();
    let workers = c.worker_urls();
    assert_eq!(workers.len(), 2, "{workers:?}");
    for (_, url) in workers {
        is_healthy(&url);
        becomes_ready(&url, Duration::from_secs(10));
    }
}

#[test]
fn a_worker_whose_control_plane_is_gone_is_healthy_but_not_ready() {
    if !can_run_jails() {
        return;
    }
    let mut c = Cluster::start();
    let enroll = c.data_dir().join("enroll.key");
    let dir = c.dir.path().join("w3");
    let args = worker_args(
        "w3",
        &c.url,
        enroll.to_str().unwrap(),
        dir.to_str().unwrap(),
    );
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let (proc, w3) = start(&args, Some("worker w3 listening on "));
    let _w3 = WorkerProc {
        proc: Some(proc),
        data_dir: dir,
    };
    is_ready(&w3);
    c.stop();
    // Noticed at the next periodic sync (every 15 s).
    let why = becomes_not_ready(&w3, Duration::from_secs(40));
    assert_eq!(why, "its last sync with the control plane failed");
    is_healthy(&w3);
}

#[test]
fn a_worker_not_enrolled_yet_is_healthy_but_not_ready() {
    if !can_run_jails() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let enroll = dir.path().join("enroll.key");
    std::fs::write(&enroll, "not-a-secret-anyone-accepts").unwrap();
    let data = dir.path().join("w1");
    // A control plane that never answers: the worker keeps trying to enroll (about
    // 35 s) while node-api serves.
    let control = format!("http://127.0.0.1:{}", free_port());
    let port = free_port();
    let mut args = worker_args(
        "w1",
        &control,
        enroll.to_str().unwrap(),
        data.to_str().unwrap(),
    );
    args.extend(["--listen".into(), format!("127.0.0.1:{port}")]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let (proc, _) = start(&args, None);
    let _worker = WorkerProc {
        proc: Some(proc),
        data_dir: data,
    };
    let base = format!("http://127.0.0.1:{port}");
    let deadline = Instant::now() + Duration::from_secs(20);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "node-api did not come up");
        std::thread::sleep(Duration::from_millis(50));
    }
    is_healthy(&base);
    let why = becomes_not_ready(&base, Duration::from_secs(1));
    assert_eq!(why, "not enrolled with its control plane yet");
}

#[test]
fn a_standalone_edge_is_healthy_and_ready_while_its_control_plane_is() {
    if !can_run_jails() {
        return;
    }
    let c = Cluster::start();
    let (_edge, edge) = start(
        &["edge", "--control", &c.url, "--listen", "127.0.0.1:0"],
        Some("edge listening on "),
    );
    is_healthy(&edge);
    is_ready(&edge);
}

#[test]
fn a_standalone_edge_whose_control_plane_is_gone_is_healthy_but_not_ready() {
    if !can_run_jails() {
        return;
    }
    let mut c = Cluster::start();
    let (_edge, edge) = start(
        &["edge", "--control", &c.url, "--listen", "127.0.0.1:0"],
        Some("edge listening on "),
    );
    is_ready(&edge);
    c.stop();
    let why = becomes_not_ready(&edge, Duration::from_secs(10));
    assert_eq!(why, "the control plane does not answer");
    is_healthy(&edge);
}
