//! Crash tests: `kill -9` at precise points (the crash points of
//! `space_http::crash`, armed one at a time by a file) of a worker during install and
//! during retirement, and of the control plane during key rotation. After the restart
//! nothing acknowledged is lost, no retired execution is served, and the operation
//! that was cut off either completed or failed cleanly and can be retried.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use space_client::{Client, Options};
use space_identity::SandboxId;
use space_testkit::cluster as support;
use support::{Cluster, can_run_jails, find_pid, jail_pids_of, kill9};

const WAIT: Duration = Duration::from_secs(60);

/// The one-shot crash points of a cluster: `SPACE_CRASH_AT=<points>@<dir>`; a point
/// fires once each time its file is created in `dir`.
struct CrashPoints {
    dir: tempfile::TempDir,
    points: Vec<&'static str>,
}

impl CrashPoints {
    fn new(points: &[&'static str]) -> Self {
        Self {
            dir: tempfile::tempdir().unwrap(),
            points: points.to_vec(),
        }
    }

    fn start(&self) -> Cluster {
        let value = format!("{}@{}", self.points.join(","), self.dir.path().display());
        Cluster::start_with_env(&[("SPACE_CRASH_AT", &value)])
    }

    fn file(&self, point: &str) -> PathBuf {
        self.dir.path().join(point)
    }

    /// The next process to reach `point` dies there by SIGKILL.
    fn arm(&self, point: &str) {
        std::fs::write(self.file(point), b"").unwrap();
    }

    /// Whether an armed point was reached (its file consumed).
    fn fired(&self, point: &str) -> bool {
        !self.file(point).exists()
    }
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn json(bytes: &[u8]) -> serde_json::Value {
    serde_json::from_slice(bytes).unwrap_or_else(|_| panic!("not JSON: {}", text(bytes)))
}

/// One blocking HTTP call, with the answer's headers.
fn call(method: &str, url: &str, auth: &str, body: &[u8]) -> space_http::Answer {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(space_http::HttpClient::new(Duration::from_secs(60)).call(
        method.parse().unwrap(),
        url,
        &[
            ("content-type", "application/json"),
            ("authorization", auth),
        ],
        bytes::Bytes::copy_from_slice(body),
    ))
    .unwrap_or_else(|e| panic!("{method} {url}: {e}"))
}

/// `POST /v1/sandboxes/{id}/capabilities` for exec: status and body.
fn ask_capability(c: &Cluster, id: &str) -> (u16, serde_json::Value) {
    let a = call(
        "POST",
        &format!("{}/v1/sandboxes/{id}/capabilities", c.url),
        &format!("Bearer {}", c.admin_key),
        br#"{"access":["exec"],"purpose":"control"}"#,
    );
    let body = serde_json::from_slice(&a.body).unwrap_or(serde_json::Value::Null);
    (a.status.as_u16(), body)
}

fn capability(c: &Cluster, id: &str) -> serde_json::Value {
    let (status, body) = ask_capability(c, id);
    assert_eq!(status, 200, "{body}");
    body
}

/// An exec straight at the worker the capability names: status and body.
fn direct_exec(cap: &serde_json::Value) -> (u16, serde_json::Value) {
    let url = format!(
        "{}/v1/sandboxes/{}/exec",
        cap["route"]["worker_url"].as_str().unwrap(),
        cap["route"]["sandbox"].as_str().unwrap(),
    );
    let a = call(
        "POST",
        &url,
        &format!("SpaceCap {}", cap["token"].as_str().unwrap()),
        br#"{"cmd":["true"]}"#,
    );
    let body = serde_json::from_slice(&a.body).unwrap_or(serde_json::Value::Null);
    (a.status.as_u16(), body)
}

/// The same, once the worker the capability names accepts connections again.
fn direct_exec_when_up(cap: &serde_json::Value) -> (u16, serde_json::Value) {
    let addr = cap["route"]["worker_url"]
        .as_str()
        .unwrap()
        .trim_start_matches("http://")
        .to_owned();
    eventually("the worker listens again", || {
        std::net::TcpStream::connect(&addr).is_ok()
    });
    // Listening comes before the worker has re-adopted its executions: until then the
    // record is not running yet (421 not_running), which is no answer about the key.
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let (status, body) = direct_exec(cap);
        if status != 421 || body["reason"] != "not_running" || std::time::Instant::now() > deadline
        {
            return (status, body);
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// An exec through the edge: the execution that ran it, by its answer's header and
/// body (they must agree).
fn edge_exec(c: &Cluster, id: &str) -> String {
    let a = call(
        "POST",
        &format!("{}/v1/sandboxes/{id}/exec", c.url),
        &format!("Bearer {}", c.admin_key),
        br#"{"cmd":["true"]}"#,
    );
    assert_eq!(a.status, 200, "{}", text(&a.body));
    let header = a
        .headers
        .get("space-execution")
        .expect("no space-execution header")
        .to_str()
        .unwrap()
        .to_owned();
    assert_eq!(json(&a.body)["execution_id"], header.as_str());
    header
}

fn put(c: &Cluster, id: &str, path: &str, data: &[u8]) {
    let out = c.cli_with_stdin(&["fs", "put", id, "-", path], data);
    assert!(out.status.success(), "{}", text(&out.stderr));
}

fn get(c: &Cluster, id: &str, path: &str) -> String {
    let out = c.cli(&["fs", "get", id, path]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    text(&out.stdout)
}

fn sandbox_ids(c: &Cluster) -> BTreeSet<String> {
    let out = c.cli(&["--json", "sandbox", "list"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    json(&out.stdout)
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["id"].as_str().unwrap().to_owned())
        .collect()
}

/// Polls `ok` until it holds, panicking with `what` after [`WAIT`].
fn eventually(what: &str, mut ok: impl FnMut() -> bool) {
    let deadline = Instant::now() + WAIT;
    while !ok() {
        assert!(Instant::now() < deadline, "timed out: {what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Waits until worker `w` (whose process was `old_pid`) died, was restarted by the
/// supervisor and serves again.
fn wait_restarted(c: &Cluster, w: &str, old_pid: i32) {
    let dir = c.worker_dir(w);
    let words = ["worker", "--id", w, dir.to_str().unwrap()];
    eventually("the worker is restarted", || {
        find_pid(&words).is_some_and(|p| p != old_pid)
    });
    let url = c
        .worker_urls()
        .into_iter()
        .find(|(id, _)| id == w)
        .unwrap()
        .1;
    let addr = url.trim_start_matches("http://").to_owned();
    eventually("the restarted worker listens", || {
        std::net::TcpStream::connect(&addr).is_ok()
    });
    c.wait_for_workers(2);
}

/// The states of `sandbox`'s executions in worker `w`'s own records.
fn worker_record_states(c: &Cluster, w: &str, sandbox: &str) -> Vec<(u64, String)> {
    let db = c.worker_dir(w).join("records.db");
    let conn = rusqlite::Connection::open_with_flags(
        &db,
        rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY | rusqlite::OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )
    .unwrap();
    conn.busy_timeout(Duration::from_secs(10)).unwrap();
    let mut q = conn
        .prepare("SELECT generation, state FROM executions WHERE sandbox = ?1 ORDER BY generation")
        .unwrap();
    q.query_map([sandbox], |r| Ok((r.get::<_, i64>(0)? as u64, r.get(1)?)))
        .unwrap()
        .map(Result::unwrap)
        .collect()
}

/// How many directories (jail roots) worker `w` holds for executions of `sandbox`.
fn sandbox_dirs(c: &Cluster, w: &str, sandbox: &str) -> usize {
    std::fs::read_dir(c.worker_dir(w).join("sandboxes"))
        .unwrap()
        .flatten()
        .filter(|e| {
            e.file_name()
                .to_string_lossy()
                .starts_with(&format!("{sandbox}."))
        })
        .count()
}

/// How many of worker `w`'s executions its records say are live (running or paused).
fn live_records(c: &Cluster, w: &str) -> usize {
    let db = c.worker_dir(w).join("records.db");
    let conn =
        rusqlite::Connection::open_with_flags(&db, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY)
            .unwrap();
    conn.busy_timeout(Duration::from_secs(10)).unwrap();
    conn.query_row(
        "SELECT COUNT(*) FROM executions WHERE state IN ('running', 'paused')",
        [],
        |r| r.get::<_, i64>(0),
    )
    .unwrap() as usize
}

/// How many bridge processes (`spaced-host`) listen on a socket under worker `w`'s
/// `run/` (`/proc/net/unix` keeps a socket's bound path after its file is removed).
fn bridges_of(c: &Cluster, w: &str) -> usize {
    let run = c.worker_dir(w).join("run");
    let table = std::fs::read_to_string("/proc/net/unix").unwrap();
    let inodes: BTreeSet<String> = table
        .lines()
        .skip(1)
        .filter_map(|line| {
            let f: Vec<&str> = line.split_whitespace().collect();
            let accepts = u32::from_str_radix(f.get(3)?, 16).ok()? & 0x1_0000 != 0;
            (accepts && std::path::Path::new(f.get(7)?).starts_with(&run))
                .then(|| format!("socket:[{}]", f[6]))
        })
        .collect();
    let mut n = 0;
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let cmd = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
        let argv0 = cmd.split(|&b| b == 0).next().unwrap_or_default();
        if !argv0.ends_with(b"spaced-host") {
            continue;
        }
        let listens = std::fs::read_dir(entry.path().join("fd"))
            .into_iter()
            .flatten()
            .flatten()
            .any(|fd| {
                std::fs::read_link(fd.path())
                    .is_ok_and(|l| inodes.contains(l.to_string_lossy().as_ref()))
            });
        n += usize::from(listens);
    }
    n
}

/// Waits until every bridge listening under worker `w`'s `run/` is the bridge of a
/// live execution: none is left over from a crash.
fn assert_no_stray_bridge(c: &Cluster, w: &str, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let (bridges, live) = (bridges_of(c, w), live_records(c, w));
        if bridges == live {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{what}: {bridges} bridges listen for {live} live executions: one was left over"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// A capability like `cap` (same route, same worker URL, issued now) signed by the
/// control plane's key `key_id`, its seed read from the store: a worker accepts it
/// only if it holds that key.
fn signed_by(c: &Cluster, cap: &serde_json::Value, key_id: &str) -> serde_json::Value {
    use space_identity::{
        Access, AccessSet, CapabilitySigner, Claims, Execution, Placement, Purpose, Route,
        Timestamp, TokenId,
    };
    let conn = rusqlite::Connection::open(c.data_dir().join("control.db")).unwrap();
    let seed: Vec<u8> = conn
        .query_row(
            "SELECT seed FROM signing_keys WHERE key_id = ?1",
            [key_id],
            |r| r.get(0),
        )
        .unwrap();
    let signer = CapabilitySigner::from_seed(seed.try_into().unwrap());
    assert_eq!(signer.key_id().to_string(), key_id);
    let view: space_proto::api::RouteView = serde_json::from_value(cap["route"].clone()).unwrap();
    let now = support::unix_now();
    let claims = Claims {
        key_id: signer.key_id(),
        route: Route {
            sandbox: view.sandbox,
            execution: Execution {
                generation: view.generation,
                id: view.execution_id,
            },
            placement: Placement {
                worker: view.worker,
                substrate: view.substrate,
                activation: view.activation,
                pod_uid: view.pod_uid,
            },
        },
        access: AccessSet::of(&[Access::Exec]),
        purpose: Purpose::Control,
        service_port: None,
        issued_at: Timestamp::from_unix_secs(now),
        expires_at: Timestamp::from_unix_secs(now + 60),
        token_id: TokenId::from_bytes(support::rand_u128().to_le_bytes()),
    };
    let mut out = cap.clone();
    out["token"] = signer.sign(&claims).unwrap().to_text().into();
    out
}

/// Whether worker `w`'s durable keys — the anchor and the bundle in its records, the
/// bundle it acknowledged and loads again at a restart — verify `cap`'s token.
fn durably_accepted_by(c: &Cluster, w: &str, cap: &serde_json::Value) -> bool {
    use space_identity::{InstalledKeys, SignedKeyBundle, Timestamp, Token, VerifyingKey};
    let conn = rusqlite::Connection::open_with_flags(
        c.worker_dir(w).join("records.db"),
        rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY,
    )
    .unwrap();
    conn.busy_timeout(Duration::from_secs(10)).unwrap();
    let setting = |name: &str| -> Vec<u8> {
        conn.query_row("SELECT value FROM settings WHERE name = ?1", [name], |r| {
            r.get(0)
        })
        .unwrap()
    };
    let anchor = VerifyingKey::from_bytes(&setting("anchor").try_into().unwrap()).unwrap();
    let mut keys = InstalledKeys::new(anchor);
    keys.install(&SignedKeyBundle::from_bytes(setting("bundle")))
        .unwrap();
    let token = Token::from_text(cap["token"].as_str().unwrap()).unwrap();
    let now = Timestamp::from_unix_secs(support::unix_now());
    space_identity::verify_capability(token.as_bytes(), &keys, now).is_ok()
}

/// Waits until the platform has recovered `ids` after a restart: each runs, under
/// the execution it had (re-adopted) or a newer one its worker's records name as
/// running (replaced after its worker reported the old one lost).
fn wait_recovered(c: &Cluster, ids: &[&String], before: &[serde_json::Value]) {
    for (id, old) in ids.iter().zip(before) {
        eventually(&format!("{id} runs again"), || {
            let s = c.sandbox(id);
            let e = &s["execution"];
            let w = e["worker"].as_str().unwrap_or_default();
            s["state"] == "running"
                && (e == old
                    || (e["generation"].as_u64() > old["generation"].as_u64()
                        && worker_record_states(c, w, id)
                            .contains(&(e["generation"].as_u64().unwrap(), "running".to_owned()))))
        });
    }
}

/// The control plane's signing keys: (key ID, state).
fn signing_keys(c: &Cluster) -> Vec<(String, String)> {
    let conn = rusqlite::Connection::open(c.data_dir().join("control.db")).unwrap();
    conn.busy_timeout(Duration::from_secs(10)).unwrap();
    let mut q = conn
        .prepare("SELECT key_id, state FROM signing_keys ORDER BY created_at, key_id")
        .unwrap();
    q.query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
        .unwrap()
        .map(Result::unwrap)
        .collect()
}

/// For a retiring key: its `not_after` in the control plane's newest bundle, and the
/// end of its retirement grace.
fn retiring_validity(c: &Cluster, key_id: &str) -> (u64, u64) {
    use space_identity::{BundleSigner, KeyBundle};
    let conn = rusqlite::Connection::open(c.data_dir().join("control.db")).unwrap();
    conn.busy_timeout(Duration::from_secs(10)).unwrap();
    let kv = |name: &str| -> String {
        conn.query_row("SELECT value FROM kv WHERE name = ?1", [name], |r| r.get(0))
            .unwrap()
    };
    let seed: Vec<u8> = (0..32)
        .map(|i| u8::from_str_radix(&kv("anchor_seed")[2 * i..2 * i + 2], 16).unwrap())
        .collect();
    let anchor = BundleSigner::from_seed(seed.try_into().unwrap()).anchor();
    let bytes: Vec<u8> = conn
        .query_row(
            "SELECT bytes FROM key_bundle WHERE singleton = 1",
            [],
            |r| r.get(0),
        )
        .unwrap();
    let bundle = KeyBundle::decode_verified(&bytes, &anchor).unwrap();
    let key = bundle
        .keys
        .iter()
        .find(|k| k.key_id.to_string() == key_id)
        .expect("the retiring key is in the bundle");
    let grace_ends = kv(&format!("retire_at:{key_id}")).parse().unwrap();
    (key.not_after.unix_secs(), grace_ends)
}

fn keys_in(keys: &[(String, String)], state: &str) -> Vec<String> {
    keys.iter()
        .filter(|(_, s)| s == state)
        .map(|(k, _)| k.clone())
        .collect()
}

/// Sandboxes the platform acknowledged earlier: still there, same files.
fn assert_intact(c: &Cluster, kept: &[(String, &str)]) {
    for (id, data) in kept {
        assert_eq!(c.sandbox(id)["state"], "running", "{id}");
        assert_eq!(get(c, id, "/root/f"), *data, "{id}: files lost");
    }
}

#[test]
fn a_worker_killed_during_install_recovers_without_serving_a_half_installed_execution() {
    if !can_run_jails() {
        return;
    }
    let points = ["worker.install.recorded", "worker.install.launched"];
    let crash = CrashPoints::new(&points);
    let c = crash.start();
    let kept = c.create(&["--worker", "w1"]);
    put(&c, &kept, "/root/f", b"kept");
    let kept_execution = c.sandbox(&kept)["execution"].clone();
    for point in points {
        let before = sandbox_ids(&c);
        let old_pid = c.worker_pid("w1");
        crash.arm(point);
        // The worker dies before it acknowledges the install: the create is not
        // acknowledged either (an error, not 201).
        let out = c.cli(&["sandbox", "create", "--worker", "w1"]);
        assert!(crash.fired(point), "{point} was not reached");
        assert!(
            !out.status.success(),
            "{point}: a create whose install was cut off was acknowledged: {}",
            text(&out.stdout)
        );
        let cut: Vec<String> = sandbox_ids(&c).difference(&before).cloned().collect();
        assert_eq!(cut.len(), 1, "{point}: {cut:?}");
        let cut = &cut[0];
        assert_eq!(c.sandbox(cut)["state"], "stopped", "{point}");
        wait_restarted(&c, "w1", old_pid);
        // Recovered: the cut-off execution is neither left starting nor running, and
        // its jail and directory are gone (the startup sweep removes what no live
        // record names).
        eventually(
            &format!("{point}: the half-installed execution is cleared"),
            || {
                jail_pids_of(cut).is_empty()
                    && sandbox_dirs(&c, "w1", cut) == 0
                    && worker_record_states(&c, "w1", cut)
                        .iter()
                        .all(|(_, s)| s == "retired" || s == "failed")
            },
        );
        assert_no_stray_bridge(&c, "w1", point);
        // Never served: no capability is issued for it.
        let (status, body) = ask_capability(&c, cut);
        assert_ne!(status, 200, "{point}: {body}");
        assert!(
            !c.cli(&["exec", cut, "--", "true"]).status.success(),
            "{point}: the cut-off sandbox ran a command"
        );
        // What was acknowledged before is intact: the survivor was re-adopted.
        assert_eq!(c.sandbox(&kept)["execution"], kept_execution, "{point}");
        assert_intact(&c, &[(kept.clone(), "kept")]);
        // The create can be retried, on the same worker, and the new sandbox answers
        // from its own execution.
        let again = c.create(&["--worker", "w1"]);
        let view = c.sandbox(&again);
        assert_eq!(
            edge_exec(&c, &again),
            view["execution"]["execution_id"].as_str().unwrap()
        );
        // And the cut-off one is removed cleanly.
        let out = c.cli(&["sandbox", "rm", cut]);
        assert!(out.status.success(), "{}", text(&out.stderr));
    }
}

#[test]
fn a_worker_killed_during_retirement_never_serves_the_retired_execution_again() {
    if !can_run_jails() {
        return;
    }
    let points = ["worker.retire.recorded", "worker.retire.torn_down"];
    let crash = CrashPoints::new(&points);
    let c = crash.start();
    let kept = c.create(&["--worker", "w1"]);
    put(&c, &kept, "/root/f", b"kept");
    let kept_execution = c.sandbox(&kept)["execution"].clone();
    for point in points {
        let id = c.create(&["--worker", "w1"]);
        let cap = capability(&c, &id);
        assert_eq!(direct_exec(&cap).0, 200);
        let generation = c.sandbox(&id)["execution"]["generation"].as_u64().unwrap();
        let old_pid = c.worker_pid("w1");
        crash.arm(point);
        let out = c.cli(&["sandbox", "rm", &id]);
        assert!(crash.fired(point), "{point} was not reached");
        wait_restarted(&c, "w1", old_pid);
        if !out.status.success() {
            // Cut off without an answer: the delete is retried and completes.
            let out = c.cli(&["sandbox", "rm", &id]);
            assert!(out.status.success(), "{point}: {}", text(&out.stderr));
        }
        // The retired execution is never served again: its capability, at its worker
        // on its old address, is refused as retired.
        let (status, body) = direct_exec_when_up(&cap);
        assert_eq!(status, 421, "{point}: {body}");
        assert_eq!(body["reason"], "retired", "{point}: {body}");
        eventually(&format!("{point}: the retired jail is torn down"), || {
            jail_pids_of(&id).is_empty()
        });
        assert_no_stray_bridge(&c, "w1", point);
        assert_eq!(
            worker_record_states(&c, "w1", &id),
            vec![(generation, "retired".to_owned())],
            "{point}"
        );
        assert_eq!(c.sandbox(&id)["state"], "stopped");
        let (status, body) = ask_capability(&c, &id);
        assert_ne!(status, 200, "{point}: {body}");
        assert_eq!(c.sandbox(&kept)["execution"], kept_execution, "{point}");
        assert_intact(&c, &[(kept.clone(), "kept")]);
    }

    // The same cut during a migration (the source's retirement is its last step):
    // the migration completes, the sandbox answers from the new execution only, with
    // its files, and the old one is refused at its worker.
    let id = c.create(&["--worker", "w1"]);
    put(&c, &id, "/root/f", b"moved");
    let old = c.sandbox(&id)["execution"].clone();
    let old_cap = capability(&c, &id);
    let old_pid = c.worker_pid("w1");
    crash.arm("worker.retire.recorded");
    let out = c.cli(&["sandbox", "migrate", &id, "--worker", "w2"]);
    assert!(crash.fired("worker.retire.recorded"));
    assert!(out.status.success(), "{}", text(&out.stderr));
    wait_restarted(&c, "w1", old_pid);
    let new = c.sandbox(&id)["execution"].clone();
    assert_eq!(new["worker"], "w2");
    assert!(new["generation"].as_u64() > old["generation"].as_u64());
    let (status, body) = direct_exec_when_up(&old_cap);
    assert_eq!(status, 421, "{body}");
    for _ in 0..10 {
        assert_eq!(edge_exec(&c, &id), new["execution_id"].as_str().unwrap());
    }
    assert_intact(&c, &[(id.clone(), "moved"), (kept.clone(), "kept")]);
    let old_key = format!("{id}.{}", old["execution_id"].as_str().unwrap());
    eventually("the migrated-away jail is torn down", || {
        jail_pids_of(&old_key).is_empty()
    });
    assert_no_stray_bridge(&c, "w1", "migration");
    assert_eq!(
        worker_record_states(&c, "w1", &id),
        vec![(old["generation"].as_u64().unwrap(), "retired".to_owned())]
    );
}

#[test]
fn a_control_plane_killed_during_key_rotation_loses_no_key_and_keeps_serving() {
    if !can_run_jails() {
        return;
    }
    let points = [
        "control.rotate.published",
        "control.rotate.activating",
        "control.rotate.activated",
    ];
    let crash = CrashPoints::new(&points);
    let mut c = crash.start();
    let on_w1 = c.create(&["--worker", "w1"]);
    let on_w2 = c.create(&["--worker", "w2"]);
    put(&c, &on_w1, "/root/f", b"one");
    put(&c, &on_w2, "/root/f", b"two");
    let kept = [(on_w1.clone(), "one"), (on_w2.clone(), "two")];
    for point in points {
        let keys = signing_keys(&c);
        let active = keys_in(&keys, "active");
        assert_eq!(active.len(), 1, "{keys:?}");
        let before = capability(&c, &on_w1);
        let before_w2 = capability(&c, &on_w2);
        let executions = [
            c.sandbox(&on_w1)["execution"].clone(),
            c.sandbox(&on_w2)["execution"].clone(),
        ];
        crash.arm(point);
        let out = c.cli(&["--json", "keys", "rotate"]);
        assert!(
            c.wait_for_exit(Duration::from_secs(30)).is_some(),
            "{point}: the control plane did not die"
        );
        assert!(crash.fired(point), "{point} was not reached");
        assert!(
            !out.status.success(),
            "{point}: a rotation cut off was acknowledged: {}",
            text(&out.stdout)
        );
        // Published before it signs anything: every worker had acknowledged (so
        // stored) the bundle with the new key before the crash.
        let new_key = signing_keys(&c)
            .into_iter()
            .find(|(k, _)| !keys.iter().any(|(old, _)| old == k))
            .expect("the new key is not in the store")
            .0;
        for (w, cap) in [("w1", &before), ("w2", &before_w2)] {
            assert!(
                durably_accepted_by(&c, w, &signed_by(&c, cap, &new_key)),
                "{point}: {w} did not hold the new key when the control plane died"
            );
        }
        c.crash_and_restart();
        wait_recovered(&c, &[&on_w1, &on_w2], &executions);
        // The restarted workers accept what the new key signs.
        for cap in [&before, &before_w2] {
            let (status, body) = direct_exec_when_up(&signed_by(&c, cap, &new_key));
            assert!(
                status == 200 || (status == 421 && body["reason"] == "stale_generation"),
                "{point}: the new key at a restarted worker: {status} {body}"
            );
        }

        // The store's keyring is consistent: one key signs — the old one if the
        // crash came before activation, the new one after — and nothing was lost.
        let after = signing_keys(&c);
        let now_active = keys_in(&after, "active");
        assert_eq!(now_active.len(), 1, "{point}: {after:?}");
        assert_eq!(after.len(), keys.len() + 1, "{point}: {keys:?} → {after:?}");
        let state_of_new = &after.iter().find(|(k, _)| *k == new_key).unwrap().1;
        match point {
            "control.rotate.published" => {
                assert_eq!(now_active, active, "{point}");
                assert_eq!(state_of_new, "published", "{point}");
            }
            _ => {
                assert_eq!(now_active[0], new_key, "{point}");
                assert!(keys_in(&after, "retiring").contains(&active[0]), "{point}");
                // And the newest bundle cuts the retiring key's validity to its grace:
                // cut off after the activation, it kept the full year.
                let (until, grace_ends) = retiring_validity(&c, &active[0]);
                assert!(
                    until <= grace_ends,
                    "{point}: the retiring key stays valid until {until}, its grace ends at {grace_ends}"
                );
            }
        }
        // Acknowledged sandboxes run on, with their files.
        assert_intact(&c, &kept);
        // Capabilities signed by the key in force verify at every worker.
        for id in [&on_w1, &on_w2] {
            let cap = capability(&c, id);
            let (status, body) = direct_exec(&cap);
            assert_eq!(status, 200, "{point}: {body}");
        }
        // The capability issued before the crash: its key still verifies (a 200, or
        // a 421 if its execution was replaced meanwhile — the comparator answers 421
        // only after the signature verified), never a signature refusal.
        let (status, body) = direct_exec_when_up(&before);
        assert!(
            status == 200 || (status == 421 && body["reason"] == "stale_generation"),
            "{point}: the capability of the old key: {status} {body}"
        );
        // The rotation can be retried and completes.
        let out = c.cli(&["--json", "keys", "rotate"]);
        assert!(out.status.success(), "{point}: {}", text(&out.stderr));
        let rotated = json(&out.stdout)["active_key"].as_str().unwrap().to_owned();
        let settled = signing_keys(&c);
        assert_eq!(keys_in(&settled, "active"), vec![rotated], "{point}");
        assert!(
            keys_in(&settled, "published").is_empty(),
            "{point}: a published key of the interrupted rotation is left: {settled:?}"
        );
        for id in [&on_w1, &on_w2] {
            let cap = capability(&c, id);
            let (status, body) = direct_exec(&cap);
            assert_eq!(status, 200, "{point}: after the retried rotation: {body}");
        }
    }
}

/// A sandbox whose agent died is relaunched as a new execution on its worker; the
/// worker is killed while it installs that execution. Before: the control plane,
/// its install cut off, stopped the sandbox, and the restarted worker retired the
/// half-installed execution with the sandbox's writable layer — acknowledged files
/// gone. Now the sandbox stays `starting`, the worker keeps the layer of an
/// execution that never ran, and the reconciler starts the sandbox again from it.
#[test]
fn a_worker_killed_while_installing_a_replacement_loses_no_acknowledged_file() {
    if !can_run_jails() {
        return;
    }
    let crash = CrashPoints::new(&["worker.install.recorded"]);
    let c = crash.start();
    let id = c.create(&["--worker", "w1"]);
    put(&c, &id, "/root/f", b"acknowledged");
    let first = c.sandbox(&id)["execution"]["generation"].as_u64().unwrap();
    let old_pid = c.worker_pid("w1");
    crash.arm("worker.install.recorded");
    let agent = jail_pids_of(&id)
        .into_iter()
        .find(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline"))
                .is_ok_and(|c| String::from_utf8_lossy(&c).contains("spaced-guest"))
        })
        .expect("the sandbox's agent");
    kill9(agent);
    eventually("the replacement's install reached the crash point", || {
        crash.fired("worker.install.recorded")
    });
    wait_restarted(&c, "w1", old_pid);
    eventually("the sandbox runs again as a newer execution", || {
        let now = c.sandbox(&id);
        now["state"] == "running" && now["execution"]["generation"].as_u64() > Some(first)
    });
    assert_eq!(get(&c, &id, "/root/f"), "acknowledged", "files lost");
    let view = c.sandbox(&id);
    assert_eq!(
        edge_exec(&c, &id),
        view["execution"]["execution_id"].as_str().unwrap()
    );
}

/// A migration whose target dies installing the new execution, while its source's
/// worker dies as it is told to thaw and the sandbox's bridge dies with it: nothing
/// runs, and the only copy of the files is the source worker's kept layer. The
/// reconciler starts the sandbox again there — it used to stop it (a migration "that
/// lost both ends"), losing every acknowledged file.
#[test]
fn a_migration_that_loses_both_ends_starts_again_where_the_files_are() {
    if !can_run_jails() {
        return;
    }
    let crash = CrashPoints::new(&["worker.install.recorded", "worker.unfreeze.received"]);
    let c = crash.start();
    let id = c.create(&["--worker", "w1"]);
    put(&c, &id, "/root/f", b"acknowledged");
    let first = c.sandbox(&id)["execution"]["generation"].as_u64().unwrap();
    let (w1, w2) = (c.worker_pid("w1"), c.worker_pid("w2"));
    let agent = jail_pids_of(&id)
        .into_iter()
        .find(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline"))
                .is_ok_and(|c| String::from_utf8_lossy(&c).contains("spaced-guest"))
        })
        .expect("the sandbox's agent");
    // Its bridge (and w1's warm jails' hosts, harmless to lose): spaced-host children
    // of w1, reparented when w1 dies. A frozen agent dies of SIGKILL only once thawed,
    // so the bridge is what makes the execution lost at w1's restart.
    let hosts: Vec<i32> = std::fs::read_dir(format!("/proc/{w1}/task"))
        .unwrap()
        .flatten()
        .filter_map(|t| std::fs::read_to_string(t.path().join("children")).ok())
        .flat_map(|c| {
            c.split_whitespace()
                .filter_map(|p| p.parse().ok())
                .collect::<Vec<i32>>()
        })
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline"))
                .is_ok_and(|c| String::from_utf8_lossy(&c).contains("spaced-host"))
        })
        .collect();
    assert!(!hosts.is_empty(), "the sandbox's bridge");
    crash.arm("worker.install.recorded");
    crash.arm("worker.unfreeze.received");
    let migrated = std::thread::scope(|scope| {
        let migrate = scope.spawn(|| c.cli(&["sandbox", "migrate", &id, "--worker", "w2"]));
        // The source's worker dies at the thaw; its sandbox's agent goes before that
        // worker is back to re-adopt it.
        let deadline = Instant::now() + WAIT;
        while !crash.fired("worker.unfreeze.received") {
            assert!(
                Instant::now() < deadline,
                "timed out: the thaw never reached w1"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
        for pid in hosts.iter().copied().chain([agent]) {
            kill9(pid);
        }
        migrate.join().unwrap()
    });
    assert!(
        !migrated.status.success(),
        "the migration cannot have succeeded"
    );
    assert!(crash.fired("worker.install.recorded"));
    wait_restarted(&c, "w2", w2);
    wait_restarted(&c, "w1", w1);
    eventually("the sandbox runs again, as a newer execution on w1", || {
        let now = c.sandbox(&id);
        now["state"] == "running"
            && now["execution"]["generation"].as_u64() > Some(first + 1)
            && now["execution"]["worker"] == "w1"
    });
    assert_eq!(get(&c, &id, "/root/f"), "acknowledged", "files lost");
}

/// A write through the edge whose worker dies after writing the file and before
/// answering: the edge kept the (small) body, and the write carries an idempotency
/// key, so the edge sends it again — once, to the same execution, which the restarted
/// worker re-adopted — and the caller gets its answer instead of a 502.
#[test]
fn a_write_whose_worker_dies_before_answering_is_sent_again_to_the_same_execution() {
    if !can_run_jails() {
        return;
    }
    let crash = CrashPoints::new(&["worker.write.done"]);
    let c = crash.start();
    let id = c.create(&["--worker", "w1"]);
    let before = c.sandbox(&id)["execution"].clone();
    let old_pid = c.worker_pid("w1");
    let sandbox: SandboxId = id.parse().unwrap();
    let edge = Client::with_options(
        &c.url,
        &c.admin_key,
        Options {
            direct: false,
            ..Options::default()
        },
    );
    crash.arm("worker.write.done");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let written = rt.block_on(edge.write_file(&sandbox, "/root/f", &b"once"[..]));
    assert!(crash.fired("worker.write.done"), "the worker did not die");
    written.expect("the write is answered");
    wait_restarted(&c, "w1", old_pid);
    assert_eq!(get(&c, &id, "/root/f"), "once");
    // Still the same execution: re-adopted, not replaced.
    assert_eq!(c.sandbox(&id)["execution"], before);
}
