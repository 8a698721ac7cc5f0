//! A real `space up` (control plane + edge + two worker processes) in a temporary data
//! directory, on an ephemeral loopback port, stopped on drop (also when a test fails).

#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

/// Whether this process may create jails; tests print why they skip otherwise.
pub fn can_run_jails() -> bool {
    if !rustix::process::geteuid().is_root() {
        eprintln!("SKIPPED: the platform tests need root (namespaces, mounts, cgroups)");
        return false;
    }
    if !Path::new("/sys/fs/cgroup").is_dir() {
        eprintln!("SKIPPED: the platform tests need a cgroup filesystem at /sys/fs/cgroup");
        return false;
    }
    true
}

/// The `space` binary, with the sandbox binaries built next to it.
pub fn space_bin() -> PathBuf {
    for (pkg, bin) in [
        ("spaced-guest", "spaced-guest"),
        ("spaced-host", "spaced-host"),
        ("space-jail", "space-jail"),
    ] {
        space_testkit::workspace_bin(pkg, bin);
    }
    PathBuf::from(env!("CARGO_BIN_EXE_space"))
}

/// A running `space up`.
pub struct Cluster {
    pub dir: tempfile::TempDir,
    child: Option<Child>,
    pub url: String,
    pub admin_key: String,
    env: Vec<(String, String)>,
}

/// Warm jails per worker in test clusters: enough that creates in tests go through
/// activation, few enough that every cluster start stays cheap.
pub const TEST_WARM_POOL: &str = "2";

impl Cluster {
    /// Starts `space up` with two workers.
    pub fn start() -> Self {
        Self::start_with_env(&[])
    }

    /// Starts `space up` with two workers and extra environment variables (which
    /// override the test defaults, such as `SPACE_WARM_POOL`).
    pub fn start_with_env(env: &[(&str, &str)]) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let mut c = Self {
            dir,
            child: None,
            url: String::new(),
            admin_key: String::new(),
            env: env
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
        };
        c.boot();
        c
    }

    pub fn data_dir(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    fn boot(&mut self) {
        let mut child = Command::new(space_bin())
            .args([
                "up",
                "--listen",
                "127.0.0.1:0",
                "--workers",
                "2",
                "--data-dir",
            ])
            .arg(self.data_dir())
            .env("SPACE_LOG", "warn")
            // Transitions a crash interrupted are finished quickly in tests.
            .env("SPACE_RECONCILE_AFTER_SECS", "1")
            .env("SPACE_WARM_POOL", TEST_WARM_POOL)
            // No standby sandboxes unless a test asks: creates stay where tests put them.
            .env("SPACE_STANDBY", "0")
            .envs(self.env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let first = lines.next().unwrap().unwrap();
        self.url = first
            .strip_prefix("SPACE is up at ")
            .unwrap_or_else(|| panic!("unexpected first line: {first}"))
            .to_owned();
        // Keep draining stdout so the process never blocks on a full pipe.
        std::thread::spawn(move || for _ in lines {});
        self.child = Some(child);
        self.admin_key = std::fs::read_to_string(self.data_dir().join("admin.key"))
            .unwrap()
            .trim()
            .to_owned();
        self.wait_for_workers(2);
    }

    /// Waits until `n` workers are registered and active.
    pub fn wait_for_workers(&self, n: usize) {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let out = self.cli(&["--json", "workers"]);
            if out.status.success() {
                let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
                let active = v
                    .as_array()
                    .map_or(0, |a| a.iter().filter(|w| w["state"] == "active").count());
                if active >= n {
                    return;
                }
            }
            assert!(Instant::now() < deadline, "workers did not come up");
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Stops `space up` with SIGTERM and waits for it.
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(child.id() as i32),
                nix::sys::signal::Signal::SIGTERM,
            );
            let deadline = Instant::now() + Duration::from_secs(40);
            while Instant::now() < deadline {
                if let Ok(Some(_)) = child.try_wait() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// `kill -9` of `space up` and of every process whose command line names this data
    /// directory (its workers; bridges and jails survive, as in a real crash), then a
    /// new start.
    pub fn crash_and_restart(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        let data = self.data_dir();
        let data = data.to_str().unwrap();
        for entry in std::fs::read_dir("/proc").unwrap().flatten() {
            let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else {
                continue;
            };
            let cmd = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            if String::from_utf8_lossy(&cmd).contains(data) {
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(pid),
                    nix::sys::signal::Signal::SIGKILL,
                );
            }
        }
        self.boot();
    }

    /// Waits up to `limit` for `space up` to exit by itself (a crash point killed it);
    /// its exit status, `None` when it still runs.
    pub fn wait_for_exit(&mut self, limit: Duration) -> Option<std::process::ExitStatus> {
        let deadline = Instant::now() + limit;
        let child = self.child.as_mut()?;
        loop {
            if let Ok(Some(status)) = child.try_wait() {
                return Some(status);
            }
            if Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Stops and starts again on the same data directory.
    pub fn restart(&mut self) {
        self.stop();
        self.boot();
    }

    /// node-api URL of each worker, by ID.
    pub fn worker_urls(&self) -> Vec<(String, String)> {
        let out = self.cli(&["--json", "workers"]);
        let list: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        list.as_array()
            .unwrap()
            .iter()
            .map(|w| {
                (
                    w["id"].as_str().unwrap().to_owned(),
                    w["address"].as_str().unwrap().to_owned(),
                )
            })
            .collect()
    }

    /// A worker's metric (first sample named exactly `name`), 0 when absent.
    pub fn worker_metric(&self, worker: &str, name: &str) -> f64 {
        let (_, url) = self
            .worker_urls()
            .into_iter()
            .find(|(id, _)| id == worker)
            .unwrap_or_else(|| panic!("no worker {worker}"));
        let (_, body) = http("GET", &format!("{url}/metrics"), None, b"");
        String::from_utf8_lossy(&body)
            .lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0.0)
    }

    /// A metric of the control plane (first sample named exactly `name`), 0 when
    /// absent.
    pub fn control_metric(&self, name: &str) -> f64 {
        let (_, body) = http("GET", &format!("{}/metrics", self.url), None, b"");
        String::from_utf8_lossy(&body)
            .lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0.0)
    }

    /// Waits until every worker has `n` warm jails ready.
    pub fn wait_for_warm_pools(&self, n: usize) {
        let deadline = Instant::now() + Duration::from_secs(120);
        for (id, _) in self.worker_urls() {
            loop {
                let ready = self.worker_metric(&id, "space_worker_warm_ready") as usize;
                if ready >= n {
                    break;
                }
                assert!(
                    Instant::now() < deadline,
                    "warm pool of {id} stuck at {ready}"
                );
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    }

    /// A worker's data directory.
    pub fn worker_dir(&self, worker: &str) -> PathBuf {
        self.data_dir().join("workers").join(worker)
    }

    /// Runs the CLI against this cluster with the admin key.
    pub fn cli(&self, args: &[&str]) -> Output {
        self.cli_with_stdin(args, &[])
    }

    /// Runs the CLI with `stdin` bytes.
    pub fn cli_with_stdin(&self, args: &[&str], stdin: &[u8]) -> Output {
        use std::io::Write;
        let mut child = Command::new(space_bin())
            .args(args)
            .env("SPACE_URL", &self.url)
            .env("SPACE_API_KEY", &self.admin_key)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut input = child.stdin.take().unwrap();
        input.write_all(stdin).unwrap();
        drop(input);
        child.wait_with_output().unwrap()
    }

    /// Starts the CLI in the background (output discarded), for a command a test
    /// interrupts.
    pub fn spawn_cli(&self, args: &[&str]) -> Child {
        Command::new(space_bin())
            .args(args)
            .env("SPACE_URL", &self.url)
            .env("SPACE_API_KEY", &self.admin_key)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap()
    }

    /// `space sandbox create` → the new ID.
    pub fn create(&self, extra: &[&str]) -> String {
        let mut args = vec!["sandbox", "create"];
        args.extend_from_slice(extra);
        let out = self.cli(&args);
        assert!(
            out.status.success(),
            "create failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap().trim().to_owned()
    }

    /// `GET /v1/sandboxes/{id}` as JSON.
    pub fn sandbox(&self, id: &str) -> serde_json::Value {
        let out = self.cli(&["--json", "sandbox", "get", id]);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).unwrap()
    }

    /// An HTTP call with curl-like simplicity (blocking, via a tiny runtime).
    pub fn http(&self, method: &str, url: &str, auth: Option<&str>, body: &[u8]) -> (u16, Vec<u8>) {
        http(method, url, auth, body)
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        self.stop();
        // A worker that crashed keeps its disk volume mounted (its jails may live on,
        // and its next start uses it): detached here, so that the data dir can go.
        if let Ok(workers) = std::fs::read_dir(self.data_dir().join("workers")) {
            for w in workers.flatten() {
                let _ = nix::mount::umount2(
                    &w.path().join("sandboxes"),
                    nix::mount::MntFlags::MNT_DETACH,
                );
            }
        }
    }
}

/// One blocking HTTP call.
pub fn http(method: &str, url: &str, auth: Option<&str>, body: &[u8]) -> (u16, Vec<u8>) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let client = space_http::HttpClient::new(Duration::from_secs(60));
        let mut headers = vec![("content-type", "application/json")];
        if let Some(a) = auth {
            headers.push(("authorization", a));
        }
        let a = client
            .call(
                method.parse().unwrap(),
                url,
                &headers,
                bytes::Bytes::copy_from_slice(body),
            )
            .await
            .unwrap();
        (a.status.as_u16(), a.body.to_vec())
    })
}

/// A POST with extra headers.
pub fn http_with(url: &str, auth: &str, body: &[u8], extra: &[(&str, &str)]) -> (u16, Vec<u8>) {
    let a = post_within(url, auth, body, extra, Duration::from_secs(60)).unwrap();
    (a.status.as_u16(), a.body.to_vec())
}

/// A JSON POST whose client gives up (and disconnects) after `limit`.
pub fn post_within(
    url: &str,
    auth: &str,
    body: &[u8],
    extra: &[(&str, &str)],
    limit: Duration,
) -> Result<space_http::Answer, space_http::CallError> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let mut headers = vec![
        ("content-type", "application/json"),
        ("authorization", auth),
    ];
    headers.extend_from_slice(extra);
    rt.block_on(space_http::HttpClient::new(limit).call(
        hyper::Method::POST,
        url,
        &headers,
        bytes::Bytes::copy_from_slice(body),
    ))
}

/// Acting as a second control-plane replica on this cluster's store: the trust anchor
/// (its seed read from `control.db`), and the next update sequence number of a worker
/// reserved the way the control plane reserves them (so the test's signed updates
/// never collide with the platform's own).
pub struct Signer {
    anchor: space_identity::BundleSigner,
    db: PathBuf,
}

impl Signer {
    /// The signer of `c`.
    pub fn of(c: &Cluster) -> Self {
        let db = c.data_dir().join("control.db");
        let seed_hex: String = rusqlite::Connection::open(&db)
            .unwrap()
            .query_row("SELECT value FROM kv WHERE name = 'anchor_seed'", [], |r| {
                r.get(0)
            })
            .unwrap();
        let seed: Vec<u8> = (0..32)
            .map(|i| u8::from_str_radix(&seed_hex[2 * i..2 * i + 2], 16).unwrap())
            .collect();
        Self {
            anchor: space_identity::BundleSigner::from_seed(seed.try_into().unwrap()),
            db,
        }
    }

    /// Reserves the next update sequence number of `worker`.
    pub fn next_seq(&self, worker: &str) -> u64 {
        let conn = rusqlite::Connection::open(&self.db).unwrap();
        conn.busy_timeout(Duration::from_secs(30)).unwrap();
        let last: i64 = conn
            .query_row(
                "INSERT INTO update_sequences (worker, last) VALUES (?1, 1) \
                 ON CONFLICT (worker) DO UPDATE SET last = update_sequences.last + 1 RETURNING last",
                [worker],
                |r| r.get(0),
            )
            .unwrap();
        last as u64
    }

    /// The signed envelope (JSON text) of `body` (the JSON of an update body).
    pub fn sign(&self, body: &str) -> String {
        use base64::Engine as _;
        let b64 = |b: &[u8]| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(b);
        serde_json::json!({
            "body": b64(body.as_bytes()),
            "signature": b64(&self.anchor.sign_update(body.as_bytes())),
        })
        .to_string()
    }

    /// The signed delivery header (`space-delivery`) of an update request body for
    /// `worker`, as the control plane makes it.
    pub fn delivery(&self, worker: &str, body: &[u8]) -> String {
        use base64::Engine as _;
        let b64 = |b: &[u8]| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(b);
        let descriptor = serde_json::json!({
            "worker": worker,
            "issued_at": unix_now(),
            "size": body.len(),
            "digest": blake3::hash(body).to_hex().to_string(),
            "nonce": format!("{:032x}", rand_u128()),
        })
        .to_string();
        let signature = self.anchor.sign_delivery(descriptor.as_bytes());
        format!("{}.{}", b64(descriptor.as_bytes()), b64(&signature))
    }

    /// POSTs an update request body to a worker's `/internal/v1/updates` with a valid
    /// delivery header for `worker`, as the control plane does.
    pub fn post_update(&self, url: &str, worker: &str, body: &[u8]) -> (u16, Vec<u8>) {
        post_delivered(url, &self.delivery(worker, body), body)
    }
}

/// POSTs `body` to a worker's `/internal/v1/updates` under the delivery header
/// `delivery` (see [`Signer::delivery`]).
pub fn post_delivered(url: &str, delivery: &str, body: &[u8]) -> (u16, Vec<u8>) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let a = space_http::HttpClient::new(Duration::from_secs(60))
            .call(
                hyper::Method::POST,
                url,
                &[
                    ("content-type", "application/json"),
                    ("space-delivery", delivery),
                ],
                bytes::Bytes::copy_from_slice(body),
            )
            .await
            .unwrap();
        (a.status.as_u16(), a.body.to_vec())
    })
}

impl Signer {
    /// A signed update for `worker` issued now, under a freshly reserved number.
    pub fn update(&self, worker: &str, update: serde_json::Value) -> String {
        self.update_at(worker, unix_now(), update)
    }

    /// A signed update for `worker` issued at `issued_at`, under a freshly reserved
    /// number.
    pub fn update_at(&self, worker: &str, issued_at: u64, update: serde_json::Value) -> String {
        let body = serde_json::json!({
            "worker": worker,
            "issued_at": issued_at,
            "seq": self.next_seq(worker),
            "update": update,
        });
        self.sign(&body.to_string())
    }
}

/// Unix seconds now.
pub fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

// ---- Host processes of a cluster (for kill -9 and peak-RSS checks) ----

/// The PID of a live process (zombies excluded: a killed worker stays one until its
/// supervisor reaps it) each of whose `words` is one of its arguments, or, for a path,
/// the start of one (a data dir names every worker's dir below it).
pub fn find_pid(words: &[&str]) -> Option<i32> {
    for entry in std::fs::read_dir("/proc").ok()?.flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let Ok(cmd) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
            continue;
        };
        let args: Vec<String> = cmd
            .split(|&b| b == 0)
            .map(|a| String::from_utf8_lossy(a).into_owned())
            .collect();
        let zombie = std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .is_ok_and(|st| st.contains(") Z "));
        let matches = |w: &&str| {
            args.iter()
                .any(|a| a == w || (w.starts_with('/') && a.starts_with(w)))
        };
        if !zombie && words.iter().all(matches) {
            return Some(pid);
        }
    }
    None
}

/// Like [`find_pid`], panicking when there is none.
pub fn pid_of(words: &[&str]) -> i32 {
    find_pid(words).unwrap_or_else(|| panic!("no process with {words:?}"))
}

/// `kill -9`.
pub fn kill9(pid: i32) {
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid),
        nix::sys::signal::Signal::SIGKILL,
    );
}

/// Host PIDs of the jail processes of a sandbox, or of one execution given as
/// `sandbox.execution` (from their cgroups).
pub fn jail_pids_of(sandbox: &str) -> Vec<i32> {
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
                let name = child.file_name().to_string_lossy().into_owned();
                if name == sandbox || name.starts_with(&format!("{sandbox}.")) {
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

/// A `kB` field of `/proc/PID/status` (`VmHWM:`, `VmRSS:`), in KiB.
pub fn status_kib(pid: i32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or_else(|| panic!("{field} of {pid}"))
}

/// Resets the peak RSS of `pid` to its current RSS (`clear_refs` 5); bytes.
pub fn reset_peak(pid: i32) -> u64 {
    std::fs::write(format!("/proc/{pid}/clear_refs"), "5").unwrap();
    status_kib(pid, "VmHWM:") * 1024
}

/// Growth of the peak RSS of `pid` over `base` bytes.
pub fn peak_growth(pid: i32, base: u64) -> u64 {
    (status_kib(pid, "VmHWM:") * 1024).saturating_sub(base)
}

impl Cluster {
    /// The `space up` process (control plane + edge).
    pub fn edge_pid(&self) -> i32 {
        self.child.as_ref().expect("space up runs").id() as i32
    }

    /// The process of worker `w` (`w1`, `w2`).
    pub fn worker_pid(&self, w: &str) -> i32 {
        let dir = self.worker_dir(w);
        pid_of(&["worker", "--id", w, dir.to_str().unwrap()])
    }
}

/// 128 random bits.
pub fn rand_u128() -> u128 {
    let mut b = [0u8; 16];
    rustix::rand::getrandom(&mut b, rustix::rand::GetRandomFlags::empty()).unwrap();
    u128::from_le_bytes(b)
}
