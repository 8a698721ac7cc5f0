//! Shared fixtures for the jail tests: the `space-jail` binary, a driver on a
//! private data dir, jails that destroy themselves, and the probe agent's client.
#![allow(dead_code)]

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use space_jail::probe_agent::ProbeReply;
use space_worker::substrate::jail::{JAIL_BIN_ENV, JailConfig, JailDriver};
use space_worker::substrate::{
    AgentCommand, ExecutionKey, LaunchSpec, Limits, SandboxHandle, Substrate, SubstrateError,
    TemplateSpec,
};

/// The `space-jail` binary of this build: `$SPACE_JAIL_BIN`, or built once with
/// cargo into the target dir of the running test (same profile).
pub fn jail_binary() -> PathBuf {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        if let Some(path) = std::env::var_os(JAIL_BIN_ENV) {
            return PathBuf::from(path);
        }
        let exe = std::env::current_exe().expect("current exe");
        // <target>/<profile>/deps/<test binary>
        let profile_dir = exe.parent().and_then(Path::parent).expect("profile dir");
        let target_dir = profile_dir.parent().expect("target dir");
        let manifest = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../Cargo.toml");
        let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
        let mut build = Command::new(cargo);
        build.args([
            "build",
            "--quiet",
            "-p",
            "space-jail",
            "--bin",
            "space-jail",
        ]);
        build
            .arg("--manifest-path")
            .arg(&manifest)
            .arg("--target-dir")
            .arg(target_dir);
        if profile_dir.file_name().is_some_and(|n| n == "release") {
            build.arg("--release");
        }
        let status = build.status().expect("run cargo build -p space-jail");
        assert!(status.success(), "building space-jail failed");
        profile_dir.join("space-jail")
    })
    .clone()
}

/// Why this host cannot run the jail tests, if it cannot.
pub fn missing_requirement() -> Option<String> {
    if !nix::unistd::geteuid().is_root() {
        return Some("needs root (mount, PID and network namespaces; cgroups)".into());
    }
    if let Err(e) = space_worker::substrate::jail::cgroup::CgroupHierarchy::detect() {
        return Some(format!(
            "needs cgroup v1 memory+pids+freezer or cgroup v2 with memory+pids: {e}"
        ));
    }
    None
}

/// Skips the calling test (returning early) when the host lacks what jails need.
#[macro_export]
macro_rules! require_jail_host {
    () => {
        if let Some(reason) = support::missing_requirement() {
            eprintln!("SKIPPED: {reason}");
            return;
        }
    };
}

/// A driver on a private data dir, removed at the end.
pub struct TestEnv {
    pub driver: Arc<JailDriver>,
    pub data: tempfile::TempDir,
}

static NEXT_ID: AtomicU32 = AtomicU32::new(0);

impl TestEnv {
    /// A new environment (each test gets its own data dir).
    pub fn new() -> Self {
        let driver = JailDriver::new(JailConfig::new(jail_binary())).expect("jail driver");
        let data = tempfile::Builder::new()
            .prefix("spw")
            .tempdir()
            .expect("data dir");
        Self {
            driver: Arc::new(driver),
            data,
        }
    }

    /// An environment whose jails run without a user namespace (`--no-userns`).
    pub fn without_user_namespaces() -> Self {
        let mut config = JailConfig::new(jail_binary());
        config.userns = None;
        Self {
            driver: Arc::new(JailDriver::new(config).expect("jail driver")),
            data: tempfile::Builder::new()
                .prefix("spw")
                .tempdir()
                .expect("data dir"),
        }
    }

    /// The data dir.
    pub fn data_dir(&self) -> PathBuf {
        self.data.path().canonicalize().unwrap()
    }

    /// A launch spec for the probe agent with a fresh key and `limits`.
    pub fn spec(&self, limits: Limits) -> LaunchSpec {
        let n = NEXT_ID.fetch_add(1, Ordering::Relaxed);
        LaunchSpec {
            key: ExecutionKey::new(format!("sbx_t{}_{n}", std::process::id()), format!("e{n}")),
            data_dir: self.data_dir(),
            template: TemplateSpec::Default,
            limits,
            agent: AgentCommand {
                path: jail_binary(),
                args: vec!["probe-agent".into()],
                env: vec![],
            },
            activation: br#"{"execution":"test"}"#.to_vec(),
            hostname: None,
            initial_upper: None,
        }
    }

    /// Launches the probe agent with default limits.
    pub fn jail(&self) -> Jail {
        self.launch(self.spec(Limits::default()))
            .expect("launch jail")
    }

    /// Launches `spec`, guarded.
    pub fn launch(&self, spec: LaunchSpec) -> Result<Jail, SubstrateError> {
        let handle = self.driver.launch(&spec)?;
        Ok(Jail {
            driver: self.driver.clone(),
            handle,
            destroyed: false,
        })
    }
}

/// A launched jail, destroyed when dropped (also when the test panics).
pub struct Jail {
    pub driver: Arc<JailDriver>,
    pub handle: SandboxHandle,
    destroyed: bool,
}

impl Jail {
    /// Runs `command` with `/bin/sh -c` inside, through the probe agent.
    pub fn sh(&self, command: &str) -> ProbeReply {
        request(&self.handle.socket_path, command)
    }

    /// Runs `command` inside and returns its stdout, asserting it exited 0.
    pub fn ok(&self, command: &str) -> String {
        let reply = self.sh(command);
        assert_eq!(reply.exit_code, 0, "`{command}` failed: {reply:?}");
        reply.stdout
    }

    /// Destroys now (the guard then does nothing).
    pub fn destroy(mut self) -> SandboxHandle {
        self.destroyed = true;
        self.driver.destroy(&self.handle).expect("destroy");
        self.handle.clone()
    }
}

impl Drop for Jail {
    fn drop(&mut self) {
        if !self.destroyed {
            let _ = self.driver.destroy(&self.handle);
        }
    }
}

/// One probe-agent request.
pub fn request(socket: &Path, line: &str) -> ProbeReply {
    let mut stream = UnixStream::connect(socket).expect("connect to agent");
    stream
        .set_read_timeout(Some(Duration::from_secs(60)))
        .unwrap();
    stream.write_all(line.as_bytes()).unwrap();
    stream.write_all(b"\n").unwrap();
    let mut body = Vec::new();
    stream.read_to_end(&mut body).expect("agent reply");
    serde_json::from_slice(&body)
        .unwrap_or_else(|e| panic!("bad reply {e}: {}", String::from_utf8_lossy(&body)))
}

/// Host-side view of leftovers of `handle`: (processes alive, cgroup dirs, dirs,
/// mounts mentioning the sandbox dir in any visible mount table).
pub fn leftovers(handle: &SandboxHandle) -> Vec<String> {
    let mut found = Vec::new();
    if handle.init.exists() {
        found.push(format!("init {} still exists", handle.init.pid));
    }
    if let Some(agent) = handle.agent.filter(|a| a.exists()) {
        found.push(format!("agent {} still exists", agent.pid));
    }
    for dir in handle.cgroups.dirs() {
        if dir.exists() {
            found.push(format!("cgroup {}", dir.display()));
        }
    }
    for path in [&handle.sandbox_dir, &handle.socket_path] {
        if path.exists() {
            found.push(format!("path {}", path.display()));
        }
    }
    let needle = handle.sandbox_dir.to_string_lossy().into_owned();
    if std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap()
        .contains(&needle)
    {
        found.push("mount in the host namespace".into());
    }
    found
}
