//! Launching an execution (jail + bridge) and tearing it down, blocking: called from
//! `spawn_blocking`.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::Duration;

use std::str::FromStr;

use space_identity::{ExecutionId, SandboxId};
use space_peer::{FileId, LiveProcess, ProcessIdentity};
use space_proto::guest::Activation;
use spaced_host::{BridgeSpec, BridgeTarget};

use super::records::BridgeRecord;
use crate::substrate::jail::JailDriver;
use crate::substrate::{
    AgentCommand, ExecutionKey, LaunchSpec, Limits, SandboxHandle, Substrate, TemplateSpec,
};

/// Where the worker's binaries are.
#[derive(Debug, Clone)]
pub struct Binaries {
    /// `spaced-guest`.
    pub agent: PathBuf,
    /// `spaced-host`.
    pub bridge: PathBuf,
}

/// Why a launch failed (nothing of it is left running).
#[derive(Debug, thiserror::Error)]
pub enum LaunchError {
    /// The substrate failed.
    #[error("substrate: {0}")]
    Substrate(#[from] crate::substrate::SubstrateError),
    /// The agent is not the binary the worker meant to run, or exited.
    #[error("agent: {0}")]
    Agent(String),
    /// The bridge failed to start.
    #[error("bridge: {0}")]
    Bridge(String),
}

/// The key naming an execution's directories.
pub fn execution_key(sandbox: &SandboxId, execution: &ExecutionId) -> ExecutionKey {
    ExecutionKey::new(sandbox.to_string(), execution.to_string())
}

/// Launches the jail of `template` with `activation`, checks the agent is the
/// recorded binary, then launches and records the bridge.
pub fn launch(
    substrate: &dyn Substrate,
    bins: &Binaries,
    data_dir: &Path,
    activation: &Activation,
    limits: Limits,
    template: &TemplateSpec,
) -> Result<(SandboxHandle, BridgeRecord), LaunchError> {
    let kept = kept_layer(data_dir, &activation.sandbox);
    let spec = LaunchSpec {
        key: execution_key(&activation.sandbox, &activation.execution_id),
        data_dir: data_dir.to_path_buf(),
        template: template.clone(),
        limits,
        agent: AgentCommand::spaced_guest(&bins.agent),
        activation: activation.encode(),
        hostname: None,
        initial_upper: Some(kept),
    };
    let handle = substrate.launch(&spec)?;
    match start_bridge(bins, &handle, activation) {
        Ok(bridge) => Ok((handle, bridge)),
        Err(e) => {
            // The sandbox's files survive a failed start.
            let _ = substrate
                .destroy_keeping_layer(&handle, &kept_layer(data_dir, &activation.sandbox));
            Err(e)
        }
    }
}

/// One jail and the bridge that will serve it, launched ahead of demand (see
/// [`super::warm`], which keeps them).
#[derive(Debug)]
pub struct Warm {
    /// The jail (agent waiting for its activation).
    pub jail: crate::substrate::jail::warm::WarmJail,
    /// The bridge (waiting for its spec).
    pub bridge: WarmBridge,
}

/// Activates a warm jail and its bridge for `activation`. On failure nothing of
/// either is left.
pub fn launch_warm(
    jail: &JailDriver,
    bins: &Binaries,
    warm: Warm,
    activation: &Activation,
) -> Result<(SandboxHandle, BridgeRecord), LaunchError> {
    let Warm {
        jail: warm_jail,
        bridge,
    } = warm;
    let key = execution_key(&activation.sandbox, &activation.execution_id);
    let handle = match jail.activate(warm_jail, &key, &activation.encode(), None) {
        Ok(h) => h,
        Err(e) => {
            bridge.discard();
            return Err(e.into());
        }
    };
    match start_bridge_with(bins, &handle, activation, bridge) {
        Ok(record) => Ok((handle, record)),
        Err(e) => {
            let _ = jail.destroy(&handle);
            Err(e)
        }
    }
}

/// A bridge process started ahead of demand: it waits for its spec on stdin.
#[derive(Debug)]
pub struct WarmBridge {
    child: Child,
    stdin: ChildStdin,
    stdout: ChildStdout,
}

impl WarmBridge {
    /// Starts `spaced-host --spec-fd 0`, which blocks reading its spec.
    pub fn spawn(bins: &Binaries) -> Result<Self, LaunchError> {
        let mut child = Command::new(&bins.bridge)
            .args(["--spec-fd", "0"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .map_err(|e| LaunchError::Bridge(format!("spawn {}: {e}", bins.bridge.display())))?;
        match (child.stdin.take(), child.stdout.take()) {
            (Some(stdin), Some(stdout)) => Ok(Self {
                child,
                stdin,
                stdout,
            }),
            _ => {
                let _ = child.kill();
                let _ = child.wait();
                Err(LaunchError::Bridge("no pipes to the bridge".into()))
            }
        }
    }

    /// Stops the bridge (it never served anything).
    pub fn discard(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Hands the bridge its spec and waits until it listens.
    fn start(self, bins: &Binaries, spec: &BridgeSpec) -> Result<BridgeRecord, LaunchError> {
        let Self {
            mut child,
            mut stdin,
            stdout,
        } = self;
        let kill = |child: &mut Child, why: String| {
            let _ = child.kill();
            let _ = child.wait();
            LaunchError::Bridge(why)
        };
        let bridge_exe = match FileId::of_path(&bins.bridge) {
            Ok(id) => id,
            Err(e) => return Err(kill(&mut child, e.to_string())),
        };
        if let Err(e) = stdin.write_all(&spec.encode()) {
            return Err(kill(&mut child, format!("spec: {e}")));
        }
        drop(stdin);
        let mut line = String::new();
        let ready = BufReader::new(stdout).read_line(&mut line);
        if ready.is_err() || line.trim() != "ready" {
            return Err(kill(&mut child, "did not report ready".into()));
        }
        let mut process = match LiveProcess::open(child.id()) {
            Ok(p) => p.identity,
            Err(e) => return Err(kill(&mut child, e.to_string())),
        };
        if process.exe != bridge_exe {
            return Err(kill(
                &mut child,
                "the running bridge is not the configured binary".into(),
            ));
        }
        // Record the executable the worker meant to launch.
        process.exe = bridge_exe;
        // Dropping the handle neither kills nor waits: the worker's reaper collects the
        // bridge when it exits.
        drop(child);
        Ok(BridgeRecord {
            socket: spec.listen.clone(),
            process,
        })
    }
}

/// Starts and records the bridge of a launched (or restored) execution.
pub fn start_bridge(
    bins: &Binaries,
    handle: &SandboxHandle,
    activation: &Activation,
) -> Result<BridgeRecord, LaunchError> {
    start_bridge_with(bins, handle, activation, WarmBridge::spawn(bins)?)
}

fn start_bridge_with(
    bins: &Binaries,
    handle: &SandboxHandle,
    activation: &Activation,
    bridge: WarmBridge,
) -> Result<BridgeRecord, LaunchError> {
    let checked = bridge_spec(bins, handle, activation);
    match checked {
        Ok(spec) => bridge.start(bins, &spec),
        Err(e) => {
            bridge.discard();
            Err(e)
        }
    }
}

fn bridge_spec(
    bins: &Binaries,
    handle: &SandboxHandle,
    activation: &Activation,
) -> Result<BridgeSpec, LaunchError> {
    let agent_pid = handle
        .agent
        .map(|a| a.pid as u32)
        .ok_or_else(|| LaunchError::Agent("the agent exited during launch".into()))?;
    let agent = LiveProcess::open(agent_pid)
        .map_err(|e| LaunchError::Agent(e.to_string()))?
        .identity;
    // A VM's transport is its VMM (QEMU, as the driver started it: its serial port,
    // or its vhost-vsock device at the guest CID it recorded); the agent runs in the
    // guest and proves itself in the handshake.
    let transport = match (handle.substrate, handle.guest_cid) {
        (crate::substrate::SubstrateKind::Vm, Some(cid)) => {
            spaced_host::Transport::VhostVsock { cid }
        }
        (crate::substrate::SubstrateKind::Vm, None) => spaced_host::Transport::Serial,
        (crate::substrate::SubstrateKind::Firecracker, _) => spaced_host::Transport::Vsock,
        _ => spaced_host::Transport::Socket,
    };
    // A jail's agent must run the binary the worker meant to start.
    let want = FileId::of_path(&bins.agent).map_err(|e| LaunchError::Agent(e.to_string()))?;
    if transport == spaced_host::Transport::Socket && agent.exe != want {
        return Err(LaunchError::Agent(
            "the running agent is not the configured binary".into(),
        ));
    }
    // A Firecracker VM's vsock socket is in its own directory (the VM uid's) inside
    // the run directory; the bridge listens in the run directory itself.
    let socket_dir = match transport {
        spaced_host::Transport::Vsock => handle.socket_path.parent().and_then(Path::parent),
        _ => handle.socket_path.parent(),
    };
    let run_dir =
        socket_dir.ok_or_else(|| LaunchError::Bridge("socket path has no directory".into()))?;
    let socket = run_dir.join(format!("bridge-{}.sock", activation.generation));
    Ok(BridgeSpec {
        listen: socket,
        agent_socket: handle.socket_path.clone(),
        worker_uid: rustix::process::geteuid().as_raw(),
        agent,
        activation: activation.clone(),
        max_connections: 256,
        transport,
    })
}

/// The worker-side target of a recorded bridge.
pub fn bridge_target(bridge: &BridgeRecord, activation: &Activation) -> BridgeTarget {
    BridgeTarget {
        socket: bridge.socket.clone(),
        bridge: bridge.process,
        served: activation.identity(),
        secret: activation.secret,
    }
}

/// Whether a recorded process is still the same live process.
pub fn still_alive(p: &ProcessIdentity) -> bool {
    LiveProcess::open(p.pid)
        .ok()
        .is_some_and(|live| p.verify(&live.identity).is_ok())
}

/// Whether `pid` is still the process that started at `start_time`.
pub fn still_alive_pid(pid: i32, start_time: u64) -> bool {
    crate::substrate::ProcessIdentity { pid, start_time }.is_alive()
}

/// Where a sandbox's writable layer waits between executions on this worker: beside
/// the sandbox directories, on the same disk volume (see
/// [`crate::substrate::jail::disk`]); the layer is `upper/` inside it.
pub fn kept_layer(data_dir: &Path, sandbox: &SandboxId) -> PathBuf {
    data_dir
        .join("sandboxes")
        .join(crate::substrate::jail::disk::KEPT_DIR)
        .join(sandbox.to_string())
}

/// What happens to the writable layer at teardown.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layer {
    /// Removed with everything else (the sandbox is gone or moved away).
    Discard,
    /// Kept for the sandbox's next execution on this worker (restart, crash).
    Keep,
}

/// Stops the bridge (if it is still the recorded process) and destroys the jail.
pub fn teardown(
    substrate: &dyn Substrate,
    data_dir: &Path,
    handle: Option<&SandboxHandle>,
    bridge: Option<&BridgeRecord>,
    layer: Layer,
) {
    if let Some(b) = bridge {
        if let Ok(live) = LiveProcess::open(b.process.pid) {
            // Signal through the pidfd: it can only reach the recorded process.
            if b.process.start_time == live.identity.start_time {
                let _ =
                    rustix::process::pidfd_send_signal(&live.pidfd, rustix::process::Signal::KILL);
            }
        }
        let _ = std::fs::remove_file(&b.socket);
    }
    if let Some(h) = handle {
        let result = match (layer, SandboxId::from_str(&h.key.sandbox_id)) {
            (Layer::Keep, Ok(sandbox)) => {
                substrate.destroy_keeping_layer(h, &kept_layer(data_dir, &sandbox))
            }
            _ => substrate.destroy(h),
        };
        if let Err(e) = result {
            tracing::warn!(sandbox = %h.key.sandbox_id, error = ?e, "destroy failed");
        }
    }
}

/// Reaps exited bridges (children of the worker) so they never linger as zombies for
/// more than a second. Jail inits are reaped by the substrate and warm bridges by the
/// pool, so only the recorded bridges (`bridges()`: PID and start time) are looked at:
/// one non-blocking `waitid` peek each (a bridge of an earlier worker process is not a
/// child: `ECHILD`), and a zombie is reaped only if it is still the recorded process,
/// never another child that reused the PID.
pub fn spawn_reaper(bridges: impl Fn() -> Vec<(i32, u64)> + Send + 'static) {
    let spawned = std::thread::Builder::new()
        .name("reaper".into())
        .stack_size(64 * 1024)
        .spawn(move || {
            loop {
                std::thread::sleep(Duration::from_secs(1));
                use nix::sys::wait::{Id, WaitPidFlag, WaitStatus, waitid, waitpid};
                for (pid, start_time) in bridges() {
                    let who = nix::unistd::Pid::from_raw(pid);
                    let peek = waitid(
                        Id::Pid(who),
                        WaitPidFlag::WEXITED | WaitPidFlag::WNOHANG | WaitPidFlag::WNOWAIT,
                    );
                    let exited = matches!(peek, Ok(s) if s != WaitStatus::StillAlive);
                    let same = crate::substrate::process::read_stat(pid)
                        .is_ok_and(|s| s.start_time == start_time);
                    if exited && same {
                        let _ = waitpid(who, Some(WaitPidFlag::WNOHANG));
                    }
                }
            }
        });
    if let Err(e) = spawned {
        tracing::error!(error = %e, "cannot start the reaper");
    }
}

/// Kills the bridges an earlier process of this worker left behind unrecorded — a
/// crash between a launch and the record naming its bridge, say: `spaced-host`
/// processes listening on a socket under this worker's `run/` that are neither
/// children of this process nor the recorded bridge (PID and start time) of one of
/// `live`. The startup sweep cannot see them: bridges run outside the jails'
/// cgroups. Run while no install is under way. Returns how many were killed.
pub fn kill_stray_bridges(
    data_dir: &Path,
    bridge_bin: &Path,
    live: &[super::records::ExecutionRecord],
) -> usize {
    let mut runs = vec![data_dir.join("run")];
    runs.extend(data_dir.canonicalize().map(|d| d.join("run")));
    // `/proc/net/unix`: Num RefCount Protocol Flags Type St Inode Path; a socket
    // keeps its bound path there after its file is removed (the sweep removes it).
    let table = std::fs::read_to_string("/proc/net/unix").unwrap_or_default();
    let listening: std::collections::HashSet<&str> = table
        .lines()
        .skip(1)
        .filter_map(|line| {
            let f: Vec<&str> = line.split_whitespace().collect();
            let accepts = u32::from_str_radix(f.get(3)?, 16).ok()? & 0x1_0000 != 0;
            let path = Path::new(f.get(7)?);
            let ours = runs.iter().any(|r| path.starts_with(r));
            (accepts && ours).then_some(*f.get(6)?)
        })
        .collect();
    if listening.is_empty() {
        return 0;
    }
    let bin = bridge_bin
        .canonicalize()
        .unwrap_or_else(|_| bridge_bin.to_path_buf());
    let me = std::process::id();
    let recorded: Vec<(u32, u64)> = live
        .iter()
        .filter_map(|r| r.bridge.as_ref())
        .map(|b| (b.process.pid, b.process.start_time))
        .collect();
    let mut killed = 0;
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        let exe = std::fs::read_link(entry.path().join("exe")).unwrap_or_default();
        let exe = exe.to_string_lossy();
        if pid == me || Path::new(exe.trim_end_matches(" (deleted)")) != bin {
            continue;
        }
        let holds = std::fs::read_dir(entry.path().join("fd"))
            .into_iter()
            .flatten()
            .flatten()
            .any(|fd| {
                std::fs::read_link(fd.path()).is_ok_and(|l| {
                    l.to_str()
                        .and_then(|l| l.strip_prefix("socket:[")?.strip_suffix(']'))
                        .is_some_and(|inode| listening.contains(inode))
                })
            });
        let Ok(live) = LiveProcess::open(pid) else {
            continue;
        };
        let mine = i32::try_from(pid)
            .ok()
            .and_then(|p| crate::substrate::process::read_stat(p).ok())
            .is_some_and(|s| u32::try_from(s.ppid) == Ok(me));
        if !holds || mine || recorded.contains(&(pid, live.identity.start_time)) {
            continue;
        }
        // Through the pidfd: only the process inspected can be reached.
        if rustix::process::pidfd_send_signal(&live.pidfd, rustix::process::Signal::KILL).is_ok() {
            tracing::warn!(pid, "killed a bridge no record names (left by a crash)");
            killed += 1;
        }
    }
    killed
}
