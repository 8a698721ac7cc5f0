//! A real `space up` (control plane + edge + two worker processes) in a temporary data
//! directory, on an ephemeral loopback port, stopped on drop (also when a test fails);
//! its CLI with the admin key, its workers and its metrics.

use std::io::Write;
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::time::{Duration, Instant};

use super::http::http;
use super::postmortem;
use crate::bin::workspace_bins;
use crate::process::{first_line, kill9, pid_of, pids_naming, pids_with_env, stop, wait_exit};
use crate::wait::wait_for;

/// Warm jails per worker in test clusters: enough that creates in tests go through
/// activation, few enough that every cluster start stays cheap.
pub const TEST_WARM_POOL: &str = "2";

/// How often a cluster's state is polled for while a test waits for it.
const POLL: Duration = Duration::from_millis(50);

/// How long `space up` has to stop after SIGTERM before it is killed.
const STOP_GRACE: Duration = Duration::from_secs(40);

/// The `space` binary, with the sandbox binaries (`spaced-guest`, `spaced-host`,
/// `space-jail`) built next to it, where `space up` finds them.
pub fn space_bin() -> PathBuf {
    workspace_bins(&[
        ("spaced-guest", "spaced-guest"),
        ("spaced-host", "spaced-host"),
        ("space-jail", "space-jail"),
        ("space", "space"),
    ])
    .pop()
    .expect("the space binary")
}

/// A running `space up`.
#[derive(Debug)]
pub struct Cluster {
    /// Holds the data directory (`data/`).
    pub dir: tempfile::TempDir,
    child: Option<Child>,
    /// The edge's URL.
    pub url: String,
    /// The admin API key.
    pub admin_key: String,
    env: Vec<(String, String)>,
    /// The workers' cgroup parents, as seen once they were up: the clean-up of a
    /// failed test kills what is left in them.
    cgroups: Vec<String>,
}

impl Cluster {
    /// Starts `space up` with two workers.
    pub fn start() -> Self {
        Self::start_with_env(&[])
    }

    /// Starts `space up` with two workers and extra environment variables (which
    /// override the test defaults, such as `SPACE_WARM_POOL`).
    pub fn start_with_env(env: &[(&str, &str)]) -> Self {
        let mut c = Self {
            dir: tempfile::tempdir().expect("tempdir"),
            child: None,
            url: String::new(),
            admin_key: String::new(),
            env: env
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
            cgroups: Vec::new(),
        };
        c.boot();
        c
    }

    /// The data directory.
    pub fn data_dir(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    /// Where `space up` writes its log (appended to across restarts): printed when a
    /// test fails (see `Drop`).
    fn log_path(&self) -> PathBuf {
        self.dir.path().join("space-up.log")
    }

    fn boot(&mut self) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.log_path())
            .expect("open the cluster's log");
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
            // No egress unless a test asks (with a slot of its own): clusters of tests
            // running side by side must not share links or a table.
            .env("SPACE_NO_EGRESS", "1")
            // The host's directories as the default template: no test platform builds
            // a Debian image (from a mirror) at its start.
            .env("SPACE_DEFAULT_TEMPLATE", "host")
            // Marks every process of this cluster, bridges and jails included, for the
            // clean-up of a test that failed with a worker crashed (see `Drop`).
            .env(MARK, self.data_dir())
            .envs(self.env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .stdout(Stdio::piped())
            .stderr(log)
            .spawn()
            .expect("spawn space up");
        let first = first_line(&mut child);
        self.url = first
            .strip_prefix("SPACE is up at ")
            .unwrap_or_else(|| panic!("unexpected first line: {first}"))
            .to_owned();
        self.child = Some(child);
        self.admin_key = std::fs::read_to_string(self.data_dir().join("admin.key"))
            .expect("admin.key")
            .trim()
            .to_owned();
        self.wait_for_workers(2);
        for parent in cgroup_parents(&pids_naming(&self.data_dir().display().to_string())) {
            if !self.cgroups.contains(&parent) {
                self.cgroups.push(parent);
            }
        }
    }

    /// Waits until `n` workers are registered and active.
    pub fn wait_for_workers(&self, n: usize) {
        wait_for(Duration::from_secs(30), POLL, || {
            let out = self.cli(&["--json", "workers"]);
            if !out.status.success() {
                return None;
            }
            let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
            let active = v
                .as_array()
                .map_or(0, |a| a.iter().filter(|w| w["state"] == "active").count());
            (active >= n).then_some(())
        })
        .expect("workers did not come up");
    }

    /// Stops `space up` with SIGTERM and waits for it.
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            stop(&mut child, STOP_GRACE);
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
        for pid in pids_naming(data.to_str().expect("a UTF-8 data dir")) {
            kill9(pid);
        }
        self.boot();
    }

    /// Waits up to `limit` for `space up` to exit by itself (a crash point killed it);
    /// its exit status, `None` when it still runs.
    pub fn wait_for_exit(&mut self, limit: Duration) -> Option<ExitStatus> {
        wait_exit(self.child.as_mut()?, limit)
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
        metric(&url, name)
    }

    /// A metric of the control plane (first sample named exactly `name`), 0 when
    /// absent.
    pub fn control_metric(&self, name: &str) -> f64 {
        metric(&self.url, name)
    }

    /// Waits until every worker has `n` warm jails ready.
    pub fn wait_for_warm_pools(&self, n: usize) {
        let deadline = Instant::now() + Duration::from_secs(120);
        for (id, _) in self.worker_urls() {
            let mut ready = 0;
            wait_for(
                deadline.saturating_duration_since(Instant::now()),
                POLL,
                || {
                    ready = self.worker_metric(&id, "space_worker_warm_ready") as usize;
                    (ready >= n).then_some(())
                },
            )
            .unwrap_or_else(|| panic!("warm pool of {id} stuck at {ready}"));
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
        let mut child = self
            .cli_command(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn the CLI");
        let mut input = child.stdin.take().expect("piped stdin");
        input.write_all(stdin).expect("write the CLI's stdin");
        drop(input);
        child.wait_with_output().expect("the CLI's output")
    }

    /// Starts the CLI in the background (output discarded), for a command a test
    /// interrupts.
    pub fn spawn_cli(&self, args: &[&str]) -> Child {
        self.cli_command(args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn the CLI")
    }

    /// `space <args>` against this cluster with the admin key.
    fn cli_command(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new(space_bin());
        cmd.args(args)
            .env("SPACE_URL", &self.url)
            .env("SPACE_API_KEY", &self.admin_key);
        cmd
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

    /// An HTTP call with curl-like simplicity (see [`http`]).
    pub fn http(&self, method: &str, url: &str, auth: Option<&str>, body: &[u8]) -> (u16, Vec<u8>) {
        http(method, url, auth, body)
    }

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

/// The first sample named exactly `name` at `base`'s `/metrics`, 0 when absent.
fn metric(base: &str, name: &str) -> f64 {
    let (_, body) = http("GET", &format!("{base}/metrics"), None, b"");
    String::from_utf8_lossy(&body)
        .lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0.0)
}

/// The environment variable naming, in every process of a cluster, its data dir.
const MARK: &str = "SPACE_TEST_CLUSTER";

/// The cgroup parents (`--cgroup-parent`) of the running processes among `pids`.
fn cgroup_parents(pids: &[i32]) -> Vec<String> {
    let mut out = Vec::new();
    for pid in pids {
        let Ok(cmdline) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
            continue;
        };
        let args: Vec<&[u8]> = cmdline.split(|b| *b == 0).collect();
        for w in args.windows(2) {
            if w[0] == b"--cgroup-parent" {
                if let Ok(p) = std::str::from_utf8(w[1]) {
                    if !p.is_empty() && !p.contains('/') && !out.iter().any(|o| o == p) {
                        out.push(p.to_owned());
                    }
                }
            }
        }
    }
    out
}

/// Kills every process in the cgroups below `parent` (each hierarchy of
/// `/sys/fs/cgroup`, and the unified one), thawing a frozen one first: a frozen task
/// dies of SIGKILL only once thawed.
fn kill_cgroups_below(parent: &str) {
    let mut roots = vec![std::path::PathBuf::from("/sys/fs/cgroup")];
    if let Ok(dir) = std::fs::read_dir("/sys/fs/cgroup") {
        roots.extend(dir.flatten().map(|e| e.path()));
    }
    for root in roots {
        let Ok(groups) = std::fs::read_dir(root.join(parent)) else {
            continue;
        };
        for g in groups.flatten().filter(|g| g.path().is_dir()) {
            let _ = std::fs::write(g.path().join("freezer.state"), "THAWED");
            let _ = std::fs::write(g.path().join("cgroup.freeze"), "0");
            if let Ok(procs) = std::fs::read_to_string(g.path().join("cgroup.procs")) {
                for pid in procs.lines().filter_map(|l| l.parse().ok()) {
                    kill9(pid);
                }
            }
        }
    }
}

impl Cluster {
    /// What a failed test prints about this cluster (see [`postmortem`]), taken
    /// before it is stopped; the log's end is added once it is.
    fn postmortem(&self) -> String {
        let mut out = format!("--- space up at {} (test failed) ---\n", self.url);
        if let Some(port) = self
            .url
            .rsplit_once(':')
            .and_then(|(_, p)| p.parse::<u16>().ok())
        {
            match postmortem::accept_queue(port) {
                Some(queued) => out.push_str(&format!(
                    "edge listener: {queued} connections waiting to be accepted\n"
                )),
                None => out.push_str("edge listener: none on the port\n"),
            }
        }
        if let Some(child) = &self.child {
            out.push_str("threads of space up (name, state, kernel wait):\n");
            out.push_str(&postmortem::threads(child.id()));
        }
        out
    }
}

impl Cluster {
    /// Removes the egress tables of this cluster's workers (a cluster with egress
    /// on: `SPACE_NO_EGRESS=0`, slots from `SPACE_EGRESS_SLOT`), once they are gone.
    fn remove_egress_tables(&self) {
        let var = |k: &str| {
            self.env
                .iter()
                .find(|(n, _)| n == k)
                .map(|(_, v)| v.as_str())
        };
        if var("SPACE_NO_EGRESS") != Some("0") {
            return;
        }
        let first: u32 = var("SPACE_EGRESS_SLOT")
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        for slot in first..first + 2 {
            let _ = Command::new("nft")
                .args(["delete", "table", "inet", &format!("space_egress_{slot}")])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status();
        }
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let data = self.data_dir();
        let failed = std::thread::panicking().then(|| self.postmortem());
        self.stop();
        if let Some(mut report) = failed {
            report.push_str("log (SPACE_LOG=warn):\n");
            report.push_str(&postmortem::log_tail(&self.log_path()));
            eprintln!("{report}");
        }
        // A worker that crashed (a crash point, a kill) leaves jails and bridges that
        // no worker stopped when the test failed before it was back: nothing of this
        // cluster outlives it — bridges carry the cluster's mark in their environment,
        // jails are found by their workers' cgroups.
        let mark = format!("{MARK}={}", data.display());
        for pid in pids_with_env(&mark) {
            kill9(pid);
        }
        for parent in &self.cgroups {
            kill_cgroups_below(parent);
        }
        // A worker killed before it removed its egress table leaves it, and its
        // drop rule for the proxy's ports would meet whatever later gets them.
        self.remove_egress_tables();
        // A worker that crashed keeps its disk volume mounted (its jails may live on,
        // and its next start uses it): detached here, so that the data dir can go.
        if let Ok(workers) = std::fs::read_dir(self.data_dir().join("workers")) {
            for w in workers.flatten() {
                let _ = rustix::mount::unmount(
                    w.path().join("sandboxes"),
                    rustix::mount::UnmountFlags::DETACH,
                );
            }
        }
    }
}
