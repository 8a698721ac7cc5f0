//! Substrates: what runs a sandbox's execution. One trait, several drivers; this
//! crate has the `jail` driver (namespaces + overlay + cgroups + seccomp).
//!
//! The trait is blocking: launching forks processes and polls cgroup files.
//! The worker daemon calls it from `tokio::task::spawn_blocking`.

pub mod firecracker;
pub mod jail;
pub mod process;
pub mod tree;
pub mod vm;
pub mod vmm;

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

pub use jail::cgroup::{CgroupSet, CgroupStats};
pub use process::ProcessIdentity;
pub use space_jail::spec::BindMount;

/// Which substrate runs an execution (part of its placement).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SubstrateKind {
    /// Linux namespaces jail.
    Jail,
    /// Firecracker microVM.
    Firecracker,
    /// Kubernetes pod.
    Kubernetes,
    /// A VM under QEMU (its own kernel).
    Vm,
}

/// Resource limits of one sandbox. `None` leaves a resource unlimited.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Limits {
    /// Memory (RAM and swap together) in bytes; exceeding it OOM-kills inside.
    pub memory_bytes: Option<u64>,
    /// Most processes and threads at once.
    pub pids_max: Option<u64>,
    /// CPU bandwidth in thousandths of a core (1000 = one core).
    pub cpu_millis: Option<u32>,
    /// Bytes the writable layer may take, data and metadata (see [`jail::disk`]);
    /// enforced where the worker's disk volume is mounted.
    #[serde(default)]
    pub disk_bytes: Option<u64>,
}

impl Default for Limits {
    /// Conservative defaults for an interactive sandbox: 512 MiB, 512 tasks, one core,
    /// 1 GiB of disk.
    fn default() -> Self {
        Self {
            memory_bytes: Some(512 << 20),
            pids_max: Some(512),
            cpu_millis: Some(1000),
            disk_bytes: Some(1 << 30),
        }
    }
}

/// The root filesystem's template.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum TemplateSpec {
    /// The host's read-only system directories (`/usr`, `/bin`, `/lib`, …) and a
    /// synthesized `/etc`; built once per data dir.
    #[default]
    Default,
    /// Any directory tree as the lower layer, plus optional read-only host binds.
    Directory {
        /// The read-only lower layer.
        lower_dir: PathBuf,
        /// Host directories bound read-only over it.
        #[serde(default)]
        read_only_binds: Vec<BindMount>,
    },
    /// An image of the worker's template store: its unpacked layers, stacked; its own
    /// `/etc` accounts. Needs a statically linked agent.
    Image {
        /// The template's digest (`sha256:…`), for records and snapshots.
        digest: String,
        /// The layers' directories, top first.
        lower_dirs: Vec<PathBuf>,
    },
}

/// The agent's command line, resolved on the host.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AgentCommand {
    /// Host path of the executable (`spaced-guest`, or a test program).
    pub path: PathBuf,
    /// Arguments after `argv[0]`, e.g. `["serve", "--listen-fd", "3", "--activation-fd", "4"]`.
    pub args: Vec<String>,
    /// Extra environment variables.
    #[serde(default)]
    pub env: Vec<(String, String)>,
}

impl AgentCommand {
    /// The real agent's command: `spaced-guest serve --listen-fd 3 --activation-fd 4`.
    pub fn spaced_guest(path: impl Into<PathBuf>) -> Self {
        Self {
            path: path.into(),
            args: ["serve", "--listen-fd", "3", "--activation-fd", "4"]
                .map(String::from)
                .to_vec(),
            env: Vec::new(),
        }
    }
}

/// Names one execution: the sandbox and its execution ID. Both appear in
/// directory and cgroup names, so they are restricted to `[A-Za-z0-9_-]`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ExecutionKey {
    /// Sandbox ID, e.g. `sbx_…`.
    pub sandbox_id: String,
    /// Execution ID (hex).
    pub execution_id: String,
}

impl ExecutionKey {
    /// A key from its two parts.
    pub fn new(sandbox_id: impl Into<String>, execution_id: impl Into<String>) -> Self {
        Self {
            sandbox_id: sandbox_id.into(),
            execution_id: execution_id.into(),
        }
    }

    /// Checks both parts are 1–64 characters of `[A-Za-z0-9_-]`.
    pub fn validate(&self) -> Result<(), SubstrateError> {
        for (what, id) in [
            ("sandbox id", &self.sandbox_id),
            ("execution id", &self.execution_id),
        ] {
            let ok = !id.is_empty()
                && id.len() <= 64
                && id
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
            if !ok {
                return Err(SubstrateError::InvalidSpec(format!(
                    "{what} {id:?} must be 1-64 characters of [A-Za-z0-9_-]"
                )));
            }
        }
        Ok(())
    }

    /// Name of the execution's directory and cgroups: `<sandbox>.<execution>`.
    pub fn dir_name(&self) -> String {
        format!("{}.{}", self.sandbox_id, self.execution_id)
    }

    /// Parses a [`ExecutionKey::dir_name`] back.
    pub fn from_dir_name(name: &str) -> Option<Self> {
        let (sandbox, execution) = name.split_once('.')?;
        let key = Self::new(sandbox, execution);
        key.validate().ok().map(|()| key)
    }
}

/// Everything needed to launch one execution.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LaunchSpec {
    /// Which execution.
    pub key: ExecutionKey,
    /// The worker's data directory (templates, layers, sockets live under it).
    pub data_dir: PathBuf,
    /// Root filesystem template.
    pub template: TemplateSpec,
    /// Resource limits.
    pub limits: Limits,
    /// The agent to start.
    pub agent: AgentCommand,
    /// Bytes the agent reads from fd 4 to EOF (its activation JSON).
    pub activation: Vec<u8>,
    /// Hostname inside; defaults to the sandbox ID with `_` mapped to `-`.
    pub hostname: Option<String>,
    /// The writable layer kept from an earlier execution of this sandbox (see
    /// [`Substrate::destroy_keeping_layer`]): moved into place, so the new execution
    /// starts with the sandbox's files. On the same filesystem as `data_dir`.
    #[serde(default)]
    pub initial_upper: Option<PathBuf>,
}

/// What a launch produced: identities to verify against later, and where things
/// are. Serializable so the worker can keep it in its runtime records.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SandboxHandle {
    /// Which execution.
    pub key: ExecutionKey,
    /// Which substrate runs it.
    pub substrate: SubstrateKind,
    /// The jail's init (PID 1 inside), host PID and start time.
    pub init: ProcessIdentity,
    /// The agent, host PID and start time; `None` if it exited before the launch
    /// returned. Connections to [`SandboxHandle::socket_path`] carry this PID in
    /// their peer credentials.
    pub agent: Option<ProcessIdentity>,
    /// The agent's Unix socket on the host (`<data>/run/<sandbox>/agent-<exe>.sock`).
    pub socket_path: PathBuf,
    /// Inode of the socket file, so that destroying this execution never removes
    /// a socket a later execution of the same sandbox bound at the same path.
    pub socket_inode: u64,
    /// The execution's directory (`<data>/sandboxes/<sandbox>.<execution>`).
    pub sandbox_dir: PathBuf,
    /// The writable layer: every file the sandbox changed (snapshot material).
    pub upper_dir: PathBuf,
    /// The jail's log: `space-jail`'s errors and the agent's stdout/stderr.
    pub log_path: PathBuf,
    /// The execution's cgroups.
    pub cgroups: CgroupSet,
    /// First host uid of the jail's user namespace range (its root); `None` without
    /// a user namespace. Records written before user namespaces lack it.
    #[serde(default)]
    pub host_uid: Option<u32>,
    /// A vhost-vsock VM's guest context ID (host-wide unique while its QEMU lives):
    /// where its bridge connects, and what a restarted worker holds for it. `None`
    /// for every other transport.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub guest_cid: Option<u32>,
}

/// Usage and state of a running execution.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct SandboxStats {
    /// From the cgroups.
    pub cgroup: CgroupStats,
    /// Whether the init is still alive (same PID and start time).
    pub running: bool,
}

/// Why a substrate operation failed.
#[derive(Debug, thiserror::Error)]
pub enum SubstrateError {
    /// The spec is unusable; nothing was created.
    #[error("invalid launch spec: {0}")]
    InvalidSpec(String),
    /// This machine lacks something the substrate needs.
    #[error("unsupported on this host: {0}")]
    Unsupported(String),
    /// A filesystem or process operation failed.
    #[error("{context}")]
    Io {
        /// What was being done.
        context: String,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// Reading or writing a cgroup file failed.
    #[error("cgroup {}", path.display())]
    Cgroup {
        /// The cgroup file or directory.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// `space-jail` reported a failed step.
    #[error("jail failed at {stage}: {message}")]
    Jail {
        /// The step.
        stage: String,
        /// Its error.
        message: String,
    },
    /// Something did not happen in time.
    #[error("timed out: {0}")]
    Timeout(String),
    /// The execution's init is gone (or its PID now names another process).
    #[error("execution is not running")]
    NotRunning,
}

impl SubstrateError {
    /// An I/O error with what was being done.
    pub fn io(context: impl Into<String>, source: std::io::Error) -> Self {
        Self::Io {
            context: context.into(),
            source,
        }
    }
}

/// A `map_err` that makes an I/O error a [`SubstrateError::Io`] saying what was done.
pub(crate) fn io_err(context: impl Into<String>) -> impl FnOnce(std::io::Error) -> SubstrateError {
    let context = context.into();
    move |e| SubstrateError::io(context, e)
}

/// A way to run executions. Implementations are blocking and thread-safe.
pub trait Substrate: Send + Sync {
    /// Which substrate this is.
    fn kind(&self) -> SubstrateKind;

    /// Starts an execution; returns once its agent runs (or failed to start, in
    /// which case nothing of it is left).
    fn launch(&self, spec: &LaunchSpec) -> Result<SandboxHandle, SubstrateError>;

    /// Stops every process of the execution in place, keeping memory.
    fn pause(&self, handle: &SandboxHandle) -> Result<(), SubstrateError>;

    /// Continues a paused execution.
    fn resume(&self, handle: &SandboxHandle) -> Result<(), SubstrateError>;

    /// Removes every process, mount, cgroup and directory of the execution.
    /// Idempotent: destroying what is already gone succeeds.
    fn destroy(&self, handle: &SandboxHandle) -> Result<(), SubstrateError>;

    /// Like [`Substrate::destroy`], but the writable layer is moved to `keep_at`
    /// (replacing anything there) for a later execution of the same sandbox.
    fn destroy_keeping_layer(
        &self,
        handle: &SandboxHandle,
        keep_at: &std::path::Path,
    ) -> Result<(), SubstrateError>;

    /// Usage and liveness.
    fn stats(&self, handle: &SandboxHandle) -> Result<SandboxStats, SubstrateError>;

    /// A TCP socket (IPv4, non-blocking, not connected) inside the execution's
    /// network namespace, for netgtw to connect to a port on the sandbox's loopback.
    /// Blocking: call it off the async runtime.
    fn service_socket(
        &self,
        handle: &SandboxHandle,
    ) -> Result<std::os::fd::OwnedFd, SubstrateError>;

    /// The init's exit code once it has exited (reaping it), `None` while it runs.
    fn try_wait(&self, handle: &SandboxHandle) -> Result<Option<i32>, SubstrateError>;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn execution_keys_that_could_escape_a_directory_are_refused() {
        assert!(ExecutionKey::new("sbx_1", "00ff").validate().is_ok());
        for (s, e) in [
            ("../x", "1"),
            ("a/b", "1"),
            ("a", ""),
            ("a.b", "1"),
            ("a", "1 2"),
        ] {
            assert!(ExecutionKey::new(s, e).validate().is_err(), "{s:?} {e:?}");
        }
        assert!(ExecutionKey::new("a".repeat(65), "1").validate().is_err());
    }

    #[test]
    fn dir_names_round_trip() {
        let key = ExecutionKey::new("sbx_abc", "0123");
        assert_eq!(key.dir_name(), "sbx_abc.0123");
        assert_eq!(ExecutionKey::from_dir_name("sbx_abc.0123"), Some(key));
        assert_eq!(ExecutionKey::from_dir_name("nodot"), None);
        assert_eq!(ExecutionKey::from_dir_name(".tmp-x"), None);
    }

    #[test]
    fn the_real_agent_is_started_with_its_fd_convention() {
        let agent = AgentCommand::spaced_guest("/usr/bin/spaced-guest");
        assert_eq!(
            agent.args,
            ["serve", "--listen-fd", "3", "--activation-fd", "4"]
        );
    }
}
