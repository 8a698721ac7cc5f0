//! Jails for the substrate's tests: a jail driver on a private data dir, jails that
//! destroy themselves when dropped, the probe agent's client, and what a destroyed
//! jail left behind.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use space_jail::probe_agent::ProbeReply;
use space_worker::substrate::jail::cgroup::CgroupHierarchy;
use space_worker::substrate::jail::{JAIL_BIN_ENV, JailConfig, JailDriver};
use space_worker::substrate::{
    AgentCommand, ExecutionKey, LaunchSpec, Limits, SandboxHandle, Substrate, SubstrateError,
    TemplateSpec,
};

use crate::bin::workspace_bin;
use crate::host::jail_host_missing;

/// The `space-jail` binary: `$SPACE_JAIL_BIN`, else the one of this build (see
/// [`workspace_bin`]).
pub fn jail_binary() -> PathBuf {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| match std::env::var_os(JAIL_BIN_ENV) {
        Some(path) => PathBuf::from(path),
        None => workspace_bin("space-jail", "space-jail"),
    })
    .clone()
}

/// Why this host cannot run the jail tests, if it cannot: what every jail needs (see
/// [`jail_host_missing`]), and a cgroup hierarchy the driver can use.
pub fn missing_requirement() -> Option<String> {
    if let Some(reason) = jail_host_missing() {
        return Some(reason.to_owned());
    }
    if let Err(e) = CgroupHierarchy::detect() {
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
        if let Some(reason) = $crate::jail::missing_requirement() {
            eprintln!("SKIPPED: {reason}");
            return;
        }
    };
}

/// A driver on a private data dir, removed at the end.
#[derive(Debug)]
pub struct TestEnv {
    /// The driver.
    pub driver: Arc<JailDriver>,
    /// Its data dir.
    pub data: tempfile::TempDir,
}

static NEXT_ID: AtomicU32 = AtomicU32::new(0);

impl Default for TestEnv {
    fn default() -> Self {
        Self::new()
    }
}

impl TestEnv {
    /// A new environment (each test gets its own data dir).
    pub fn new() -> Self {
        Self::with_config(JailConfig::new(jail_binary()))
    }

    /// An environment whose jails run without a user namespace (`--no-userns`).
    pub fn without_user_namespaces() -> Self {
        let mut config = JailConfig::new(jail_binary());
        config.userns = None;
        Self::with_config(config)
    }

    /// A driver of `config` on a new data dir.
    pub fn with_config(config: JailConfig) -> Self {
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
#[derive(Debug)]
pub struct Jail {
    /// The driver that launched it.
    pub driver: Arc<JailDriver>,
    /// What the driver returned.
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
