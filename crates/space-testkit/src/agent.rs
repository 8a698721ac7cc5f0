//! A real agent (`spaced-guest serve`) on a Unix socket in a temporary directory,
//! killed on drop.

use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use space_identity::{ExecutionId, Generation, SandboxId};
use space_proto::client::AgentConnection;
use space_proto::guest::Activation;

use crate::bin::workspace_bin;
use crate::process::{Proc, status_kib};
use crate::rng::random;
use crate::wait::wait_for;

/// How long an agent may take to listen.
const LISTEN_WITHIN: Duration = Duration::from_secs(10);

/// The `spaced-guest` binary.
pub fn agent_bin() -> PathBuf {
    workspace_bin("spaced-guest", "spaced-guest")
}

/// Starts an agent serving `activation` at `socket`, its activation file (0600) and
/// its home (`home/`) in `dir`, with `extra_args` after the usual ones; returns once it
/// accepts connections. A socket file left at `socket` is replaced.
pub fn serve(dir: &Path, socket: &Path, activation: &Activation, extra_args: &[&str]) -> Proc {
    let file = dir.join(format!("activation-{}", activation.execution_id));
    std::fs::write(&file, activation.encode()).expect("write activation");
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600))
        .expect("chmod activation");
    let _ = std::fs::remove_file(socket);
    let home = dir.join("home");
    std::fs::create_dir_all(&home).expect("mkdir home");
    let child = Command::new(agent_bin())
        .args(["serve", "--listen"])
        .arg(socket)
        .arg("--activation-file")
        .arg(&file)
        .arg("--home")
        .arg(&home)
        .args(extra_args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawn spaced-guest");
    let agent = Proc(child);
    wait_for(LISTEN_WITHIN, Duration::from_millis(5), || {
        UnixStream::connect(socket).ok()
    })
    .unwrap_or_else(|| panic!("agent did not listen at {}", socket.display()));
    agent
}

/// An agent of a fresh random activation in its own temporary directory.
#[derive(Debug)]
pub struct AgentProcess {
    proc: Proc,
    /// The directory of its socket, activation file and home.
    pub dir: tempfile::TempDir,
    /// Where it listens.
    pub socket: PathBuf,
    /// Its home (`--home`).
    pub home: PathBuf,
    /// What it serves.
    pub activation: Activation,
}

impl AgentProcess {
    /// Starts an agent.
    pub fn start() -> Self {
        Self::start_with(&[])
    }

    /// Starts an agent with `extra_args` (limits, for instance).
    pub fn start_with(extra_args: &[&str]) -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let activation = Activation {
            sandbox: SandboxId::from_bytes(random()),
            generation: Generation(4),
            execution_id: ExecutionId::from_bytes(random()),
            activation: 2,
            secret: random(),
        };
        let socket = dir.path().join("agent.sock");
        let proc = serve(dir.path(), &socket, &activation, extra_args);
        Self {
            proc,
            home: dir.path().join("home"),
            dir,
            socket,
            activation,
        }
    }

    /// A raw, un-handshaken connection.
    pub fn raw(&self) -> UnixStream {
        let s = UnixStream::connect(&self.socket).expect("connect");
        s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
        s
    }

    /// A connection whose handshake proof verified with the activation's secret.
    pub fn connect(&self) -> AgentConnection {
        AgentConnection::handshake_verified(self.raw(), random(), &self.activation.secret)
            .expect("handshake")
    }

    /// Its PID.
    pub fn pid(&self) -> u32 {
        self.proc.0.id()
    }

    /// `rel` below its home, as a string.
    pub fn path(&self, rel: &str) -> String {
        self.home.join(rel).to_string_lossy().into_owned()
    }

    /// Its resident memory, KiB.
    pub fn vm_rss_kib(&self) -> u64 {
        status_kib(self.pid() as i32, "VmRSS:")
    }

    /// Whether the agent process is still running.
    pub fn is_running(&mut self) -> bool {
        matches!(self.proc.0.try_wait(), Ok(None))
    }

    /// Its home.
    pub fn home_path(&self) -> &Path {
        &self.home
    }
}
