//! The `jail` substrate: each execution is a `space-jail` init in new mount, PID,
//! network, UTS and IPC namespaces, on an overlay root, inside its own cgroups,
//! without capabilities and under a seccomp filter.
//!
//! Layout under the data dir:
//!
//! ```text
//! templates/default/                  skeleton of the default template
//! sandboxes/<sandbox>.<execution>/    upper/ work/ root/ jail.log
//! run/<sandbox>/agent-<exe>.sock      the agent's socket (dir 0700, never inside a jail;
//!                                     `<exe>`: the execution ID's last 8 characters)
//! run/warm_<random>/agent.sock        the same, of a jail launched warm (see [`warm`])
//! ```
//!
//! cgroups: `<controller mount>/<parent>/<sandbox>.<execution>` (`parent` is
//! `space` by default).
//!
//! Launch order, so that nothing of the sandbox ever runs outside its cgroups:
//! create dirs and cgroups, bind the listener, spawn `space-jail` (which blocks
//! reading its spec), move it into the cgroups, then write the spec.

pub mod cgroup;
pub mod disk;
pub mod log;
pub mod netns;
pub(crate) mod spawn;
pub mod sweep;
pub mod template;
pub mod uid_ranges;
pub mod warm;

use std::fs::{self, File};
use std::io::{Read, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::process::Child;
use std::sync::Arc;
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};
use nix::unistd::{Pid, pipe2};
use space_jail::spec::{
    Accounts, AgentSpec, JailSpec, MAX_ACTIVATION_BYTES, Rootless, StatusEvent, UserNamespace,
};

use self::cgroup::{CgroupHierarchy, CgroupSet};
use self::log::LogCollector;
use self::spawn::{JailFds, spawn_jail};
pub use self::sweep::SweepReport;
use self::template::Template;
use self::uid_ranges::{UidRangeConfig, UidRanges};
use super::process::{self, ProcessIdentity, reap_children_of_this_process};
use super::{
    ExecutionKey, LaunchSpec, SandboxHandle, SandboxStats, Substrate, SubstrateError,
    SubstrateKind, TemplateSpec, io_err,
};

/// Environment variable naming the `space-jail` binary, for
/// [`locate_jail_binary`].
pub const JAIL_BIN_ENV: &str = "SPACE_JAIL_BIN";

/// Longest Unix socket path (`sun_path` is 108 bytes with the NUL).
const MAX_SOCKET_PATH: usize = 107;

/// How the jail driver is set up.
#[derive(Debug, Clone)]
pub struct JailConfig {
    /// The `space-jail` executable.
    pub jail_binary: PathBuf,
    /// cgroup directory (under each hierarchy) holding the sandboxes' cgroups;
    /// several workers on one host use different parents.
    pub cgroup_parent: String,
    /// Longest a launch may take until the agent runs.
    pub launch_timeout: Duration,
    /// Host id ranges for the jails' user namespaces (as root). `None` runs jails
    /// as host uid 0 without a user namespace: only behind the worker's explicit
    /// `--no-userns`, see docs/operations.md.
    pub userns: Option<UidRangeConfig>,
}

impl JailConfig {
    /// Defaults: cgroup parent `space`, 10 s launch timeout.
    pub fn new(jail_binary: impl Into<PathBuf>) -> Self {
        Self {
            jail_binary: jail_binary.into(),
            cgroup_parent: "space".to_owned(),
            launch_timeout: Duration::from_secs(10),
            userns: Some(UidRangeConfig::default()),
        }
    }
}

/// Finds `space-jail`: `$SPACE_JAIL_BIN`, else next to the running executable
/// (or one level up, where cargo puts binaries relative to test executables).
pub fn locate_jail_binary() -> Option<PathBuf> {
    if let Some(path) = std::env::var_os(JAIL_BIN_ENV) {
        return Some(PathBuf::from(path));
    }
    let exe = std::env::current_exe().ok()?;
    let dir = exe.parent()?;
    [dir.join("space-jail"), dir.parent()?.join("space-jail")]
        .into_iter()
        .find(|p| p.is_file())
}

/// The jail substrate driver.
#[derive(Debug)]
pub struct JailDriver {
    config: JailConfig,
    hierarchy: CgroupHierarchy,
    rootless: bool,
    /// The user namespace ranges this worker holds (root, userns on).
    uid_ranges: Option<Arc<UidRanges>>,
    /// Copies each jail's stderr pipe into its `jail.log`.
    logs: LogCollector,
}

/// Paths of one execution.
struct Layout {
    sandbox_dir: PathBuf,
    upper: PathBuf,
    work: PathBuf,
    root: PathBuf,
    log: PathBuf,
    run_dir: PathBuf,
    socket: PathBuf,
}

impl Layout {
    fn new(data_dir: &Path, key: &ExecutionKey) -> Self {
        let sandbox_dir = data_dir.join("sandboxes").join(key.dir_name());
        let run_dir = data_dir.join("run").join(&key.sandbox_id);
        // A socket name per execution: two executions of a sandbox on one worker (a
        // resume from a snapshot in place, a restart) shared `agent.sock`, and the
        // old one's teardown — comparing the socket's inode, then removing the path —
        // could remove the socket the new one had just bound there. (Not a directory
        // per execution: the path must stay within the 108 bytes of a socket address.)
        let short: String = key.execution_id.chars().rev().take(8).collect();
        Self {
            upper: sandbox_dir.join("upper"),
            work: sandbox_dir.join("work"),
            root: sandbox_dir.join("root"),
            log: sandbox_dir.join("jail.log"),
            socket: run_dir.join(format!("agent-{short}.sock")),
            run_dir,
            sandbox_dir,
        }
    }
}

/// Creates `dir` (and missing parents) with `mode`, and enforces the mode even if
/// it existed: the run dirs must stay private to the worker.
fn private_dir(dir: &Path, mode: u32) -> Result<(), SubstrateError> {
    fs::DirBuilder::new()
        .recursive(true)
        .mode(mode)
        .create(dir)
        .and_then(|()| fs::set_permissions(dir, fs::Permissions::from_mode(mode)))
        .map_err(io_err(format!("create {}", dir.display())))
}

impl JailDriver {
    /// A driver with `config`: detects the cgroup hierarchies and makes this
    /// process a child subreaper, so that each jail's init (orphaned when
    /// `space-jail`'s first process exits) is reparented to, and reaped by, it.
    pub fn new(config: JailConfig) -> Result<Self, SubstrateError> {
        if !config.jail_binary.is_file() {
            return Err(SubstrateError::InvalidSpec(format!(
                "jail binary {} does not exist",
                config.jail_binary.display()
            )));
        }
        // Without root, jails run rootless: a user namespace maps root inside to this
        // user, and limits fall back to rlimits (no cgroups are delegated to us).
        let rootless = !nix::unistd::geteuid().is_root();
        let hierarchy = CgroupHierarchy::detect()?;
        nix::sys::prctl::set_child_subreaper(true)
            .map_err(|e| SubstrateError::io("PR_SET_CHILD_SUBREAPER", e.into()))?;
        let uid_ranges = match (&config.userns, rootless) {
            (Some(ranges), false) => Some(Arc::new(UidRanges::new(ranges.clone())?)),
            _ => None,
        };
        let logs = LogCollector::start(log::MAX_LOG_BYTES)
            .map_err(|e| SubstrateError::io("start the jail log thread", e))?;
        Ok(Self {
            config,
            hierarchy,
            rootless,
            uid_ranges,
            logs,
        })
    }

    /// Whether jails run rootless (this process is not root).
    pub fn is_rootless(&self) -> bool {
        self.rootless
    }

    /// Whether jails get a user namespace of their own (root, not `--no-userns`).
    pub fn uses_user_namespaces(&self) -> bool {
        self.uid_ranges.is_some()
    }

    /// The host uid ranges jails take their user namespaces from (shared with the VM
    /// driver, whose QEMU processes each run as a range's first uid); `None` without
    /// user namespaces.
    pub fn uid_ranges(&self) -> Option<Arc<UidRanges>> {
        self.uid_ranges.clone()
    }

    /// Takes the user namespace range of a jail re-adopted after a restart again;
    /// `false` if another process holds it meanwhile.
    pub fn hold_userns(&self, handle: &SandboxHandle) -> Result<bool, SubstrateError> {
        match (&self.uid_ranges, handle.host_uid) {
            (Some(ranges), Some(base)) => ranges.hold(base),
            _ => Ok(true),
        }
    }

    /// The cgroup hierarchies in use.
    pub fn hierarchy(&self) -> &CgroupHierarchy {
        &self.hierarchy
    }

    /// The configuration.
    pub fn config(&self) -> &JailConfig {
        &self.config
    }

    /// Removes what a crashed worker left under `data_dir`: see [`sweep`].
    pub fn sweep_leftovers(
        &self,
        data_dir: &Path,
        keep: &[ExecutionKey],
        keep_run_dirs: &[PathBuf],
    ) -> Result<SweepReport, SubstrateError> {
        sweep::sweep_leftovers(
            &self.hierarchy,
            &self.config.cgroup_parent,
            data_dir,
            keep,
            keep_run_dirs,
        )
    }

    fn resolve_template(
        &self,
        data_dir: &Path,
        template: &TemplateSpec,
    ) -> Result<Template, SubstrateError> {
        match template {
            TemplateSpec::Default => template::ensure_default(data_dir),
            TemplateSpec::Directory {
                lower_dir,
                read_only_binds,
            } => {
                if !lower_dir.is_dir() {
                    return Err(SubstrateError::InvalidSpec(format!(
                        "template {} is not a directory",
                        lower_dir.display()
                    )));
                }
                Ok(Template {
                    lower_dirs: vec![lower_dir.clone()],
                    read_only_binds: read_only_binds.clone(),
                    masked_dirs: Vec::new(),
                    accounts: Accounts::Synthesized,
                })
            }
            TemplateSpec::Image { lower_dirs, .. } => {
                if let Some(missing) = lower_dirs.iter().find(|d| !d.is_dir()) {
                    return Err(SubstrateError::InvalidSpec(format!(
                        "template layer {} is not a directory",
                        missing.display()
                    )));
                }
                Ok(Template {
                    lower_dirs: lower_dirs.clone(),
                    read_only_binds: Vec::new(),
                    masked_dirs: Vec::new(),
                    accounts: Accounts::Image,
                })
            }
        }
    }

    fn validate(spec: &LaunchSpec) -> Result<(), SubstrateError> {
        spec.key.validate()?;
        if spec.activation.len() > MAX_ACTIVATION_BYTES {
            return Err(SubstrateError::InvalidSpec(format!(
                "activation is {} bytes, at most {MAX_ACTIVATION_BYTES}",
                spec.activation.len()
            )));
        }
        if !spec.data_dir.is_absolute() || !spec.agent.path.is_absolute() {
            return Err(SubstrateError::InvalidSpec(
                "data dir and agent path must be absolute".into(),
            ));
        }
        Ok(())
    }

    /// Launches the jail of `spec`. With `warm`, the activation record is not written:
    /// the write end of the agent's activation pipe is returned instead.
    fn launch_inner(
        &self,
        spec: &LaunchSpec,
        layout: &Layout,
        cleanup: &mut LaunchCleanup,
        warm: bool,
    ) -> Result<(SandboxHandle, Option<File>), SubstrateError> {
        let data_dir = &spec.data_dir;
        let template = self.resolve_template(data_dir, &spec.template)?;
        if matches!(spec.template, TemplateSpec::Image { .. })
            && !template::is_static(&spec.agent.path)
        {
            // The agent runs from the image's root: a dynamically linked one would
            // load the image's loader and libraries (or none at all).
            return Err(SubstrateError::InvalidSpec(format!(
                "image templates need a statically linked agent; {} is dynamically linked \
                 (build it with `cargo static-agent`, see the operations guide)",
                spec.agent.path.display()
            )));
        }
        // The sandbox dir must be new: an existing one is another execution's.
        private_dir(&data_dir.join("sandboxes"), 0o700)?;
        // The sandbox's disk (see [`disk`]): new, or the kept layer of an earlier
        // execution of this sandbox, which a failed launch moves back (`LaunchCleanup`).
        let taken = disk::create_sandbox_dir(
            &layout.sandbox_dir,
            spec.initial_upper.as_deref(),
            spec.limits.disk_bytes,
        )?;
        cleanup.sandbox_dir = Some(layout.sandbox_dir.clone());
        match taken {
            Some(kept) => cleanup.restore_upper = Some((layout.sandbox_dir.clone(), kept)),
            None => fs::create_dir(&layout.upper)
                .map_err(io_err(format!("create {}", layout.upper.display())))?,
        }
        for dir in [&layout.work, &layout.root] {
            fs::create_dir(dir).map_err(io_err(format!("create {}", dir.display())))?;
        }
        // The upper dir's root becomes the jail's `/`: it must be traversable.
        fs::set_permissions(&layout.upper, fs::Permissions::from_mode(0o755))
            .map_err(io_err("chmod upper"))?;

        private_dir(&data_dir.join("run"), 0o700)?;
        private_dir(&layout.run_dir, 0o700)?;
        if layout.socket.as_os_str().len() > MAX_SOCKET_PATH {
            return Err(SubstrateError::InvalidSpec(format!(
                "socket path {} is longer than {MAX_SOCKET_PATH} bytes",
                layout.socket.display()
            )));
        }
        // A socket file left by a crashed worker; a live one belongs to an
        // execution the caller should have destroyed first.
        let _ = fs::remove_file(&layout.socket);
        let listener = UnixListener::bind(&layout.socket)
            .map_err(io_err(format!("bind {}", layout.socket.display())))?;
        let socket_inode = fs::metadata(&layout.socket)
            .map_err(io_err("stat socket"))?
            .ino();
        cleanup.socket = Some((layout.socket.clone(), socket_inode));

        let cgroups = if self.rootless {
            CgroupSet::None
        } else {
            self.hierarchy.create(
                &self.config.cgroup_parent,
                &spec.key.dir_name(),
                &spec.limits,
            )?
        };
        cleanup.cgroups = Some(cgroups.clone());
        let userns = match &self.uid_ranges {
            Some(ranges) => {
                let base = ranges.allocate()?;
                cleanup.uid_range = Some((Arc::clone(ranges), base));
                Some(UserNamespace {
                    host_uid: base,
                    host_gid: base,
                    count: uid_ranges::RANGE_SIZE,
                })
            }
            None => None,
        };

        let jail_spec = JailSpec {
            root_dir: layout.root.clone(),
            lower_dirs: template.lower_dirs,
            upper_dir: layout.upper.clone(),
            work_dir: layout.work.clone(),
            read_only_binds: template.read_only_binds,
            hostname: spec
                .hostname
                .clone()
                .unwrap_or_else(|| spec.key.sandbox_id.replace('_', "-")),
            tmpfs_bytes: spec.limits.memory_bytes.map(|m| m / 2).unwrap_or(256 << 20),
            agent: AgentSpec {
                path: spec.agent.path.clone(),
                args: spec.agent.args.clone(),
                env: spec.agent.env.clone(),
                cwd: PathBuf::from("/root"),
            },
            rootless: self.rootless.then(|| Rootless {
                uid: nix::unistd::geteuid().as_raw(),
                gid: nix::unistd::getegid().as_raw(),
                pids_max: spec.limits.pids_max,
                memory_bytes: spec.limits.memory_bytes,
            }),
            userns,
            masked_dirs: template.masked_dirs,
            accounts: template.accounts,
            nofile: None,
        };
        let spec_json = serde_json::to_vec(&jail_spec)
            .map_err(|e| SubstrateError::InvalidSpec(format!("spec: {e}")))?;

        let pipe = || {
            pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(|e| SubstrateError::io("pipe", e.into()))
        };
        let (spec_read, spec_write) = pipe()?;
        let (status_read, status_write) = pipe()?;
        let (activation_read, activation_write) = pipe()?;
        let log = File::options()
            .create(true)
            .append(true)
            .open(&layout.log)
            .map_err(io_err("open jail log"))?;
        // The jail gets a pipe, never the host file (see [`log`]).
        let log = File::from(self.logs.attach(log).map_err(io_err("jail log pipe"))?);
        let child = spawn_jail(
            &self.config.jail_binary,
            // Rootless, space-jail creates its namespaces itself, inside a user
            // namespace; only root may create them before the exec.
            !self.rootless,
            JailFds {
                spec: spec_read,
                status: status_write,
                log,
                listener: OwnedFd::from(listener),
                activation: activation_read,
            },
        )
        .map_err(io_err(format!(
            "spawn {}",
            self.config.jail_binary.display()
        )))?;
        let launcher_pid = child.id() as i32;
        cleanup.child = Some(child);

        // space-jail is blocked reading its spec: move it into the cgroups first.
        cgroups.add_process(launcher_pid)?;
        let mut activation_write = File::from(activation_write);
        let pending_activation = if warm {
            // The agent blocks reading it until `activate` writes it.
            Some(activation_write)
        } else {
            activation_write
                .write_all(&spec.activation)
                .map_err(io_err("write activation"))?;
            drop(activation_write);
            None
        };
        File::from(spec_write)
            .write_all(&spec_json)
            .map_err(io_err("write jail spec"))?;

        let deadline = Instant::now() + self.config.launch_timeout;
        let report = read_status(status_read, deadline)?;
        if let Some(child) = cleanup.child.as_mut() {
            let _ = child.wait();
        }
        cleanup.child = None;
        if let Some((stage, message)) = report.error {
            return Err(SubstrateError::Jail { stage, message });
        }
        let (Some(init_pid), Some(_)) = (report.init_pid, report.agent_pid_in_jail) else {
            return Err(SubstrateError::Jail {
                stage: "status".into(),
                message: format!(
                    "space-jail exited without reporting readiness; see {}",
                    layout.log.display()
                ),
            });
        };
        let init = ProcessIdentity::of(init_pid).map_err(io_err("read init identity"))?;
        // The init has exactly one child, the agent, unless it has already exited.
        let agent = process::children(init_pid)
            .ok()
            .and_then(|kids| kids.first().copied())
            .and_then(|pid| ProcessIdentity::of(pid).ok());
        let handle = SandboxHandle {
            key: spec.key.clone(),
            substrate: SubstrateKind::Jail,
            init,
            agent,
            socket_path: layout.socket.clone(),
            socket_inode,
            sandbox_dir: layout.sandbox_dir.clone(),
            upper_dir: layout.upper.clone(),
            log_path: layout.log.clone(),
            cgroups,
            host_uid: userns.map(|u| u.host_uid),
            guest_cid: None,
        };
        Ok((handle, pending_activation))
    }

    /// Reaps the init if it is this process's child; a no-op otherwise.
    /// Kills every process, removes cgroups, socket and directories; with `keep`, the
    /// writable layer is first moved there (once no process can write to it).
    fn teardown(&self, handle: &SandboxHandle, keep: Option<&Path>) -> Result<(), SubstrateError> {
        // SIGKILL to a frozen cgroup's tasks lands once thawed (kill_all thaws).
        if matches!(handle.cgroups, CgroupSet::None) {
            // No cgroup to empty: the PID namespace goes with its init.
            kill_process(&handle.init);
        }
        let killed = handle.cgroups.kill_all();
        // Block only when the kill went out: the init is then dying, not running.
        let _ = self.reap_init(&handle.init, killed.is_ok());
        killed?;
        handle.cgroups.wait_empty()?;
        handle.cgroups.remove()?;
        // Every process of the jail is gone: its id range may serve another jail.
        if let (Some(ranges), Some(base)) = (&self.uid_ranges, handle.host_uid) {
            ranges.release(base);
        }
        remove_socket_if_same(&handle.socket_path, handle.socket_inode);
        // An execution torn down before (its layer already kept) has no upper dir left;
        // the kept layer must then stay as it is.
        if let Some(dest) = keep.filter(|_| handle.upper_dir.is_dir()) {
            disk::keep_layer(&handle.sandbox_dir, dest)?;
        }
        if matches!(handle.cgroups, CgroupSet::None) {
            super::tree::make_removable(&handle.sandbox_dir);
        }
        match crate::substrate::tree::remove_tree(&handle.sandbox_dir) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => {
                return Err(SubstrateError::io(
                    format!("remove {}", handle.sandbox_dir.display()),
                    e,
                ));
            }
        }
        tracing::debug!(sandbox = %handle.key.sandbox_id, execution = %handle.key.execution_id, "jail destroyed");
        Ok(())
    }

    fn reap_init(&self, init: &ProcessIdentity, block: bool) -> Option<WaitStatus> {
        if !init.exists() {
            return None;
        }
        let flags = (!block).then_some(WaitPidFlag::WNOHANG);
        loop {
            match waitpid(Pid::from_raw(init.pid), flags) {
                Err(Errno::EINTR) => continue,
                Ok(status) => return Some(status),
                Err(_) => return None,
            }
        }
    }
}

/// What `space-jail` reported on its status pipe.
#[derive(Debug, Default)]
struct StatusReport {
    init_pid: Option<i32>,
    agent_pid_in_jail: Option<i32>,
    error: Option<(String, String)>,
}

/// Reads status lines until EOF (both jail processes let go of the pipe) or the
/// deadline.
fn read_status(pipe: OwnedFd, deadline: Instant) -> Result<StatusReport, SubstrateError> {
    let mut file = File::from(pipe);
    let mut buffer = Vec::new();
    let mut chunk = [0u8; 1024];
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(SubstrateError::Timeout(
                "space-jail did not report readiness".into(),
            ));
        }
        let millis = u16::try_from(left.as_millis()).unwrap_or(u16::MAX);
        let mut fds = [PollFd::new(file.as_fd(), PollFlags::POLLIN)];
        match poll(&mut fds, PollTimeout::from(millis)) {
            Ok(0) | Err(Errno::EINTR) => continue,
            Ok(_) => {}
            Err(e) => return Err(SubstrateError::io("poll status pipe", e.into())),
        }
        let n = file.read(&mut chunk).map_err(io_err("read status pipe"))?;
        if n == 0 {
            break;
        }
        buffer.extend_from_slice(&chunk[..n]);
    }
    let mut report = StatusReport::default();
    for line in buffer.split(|&b| b == b'\n').filter(|l| !l.is_empty()) {
        match serde_json::from_slice::<StatusEvent>(line) {
            Ok(StatusEvent::Init { pid }) => report.init_pid = Some(pid),
            Ok(StatusEvent::Ready { pid_in_jail }) => report.agent_pid_in_jail = Some(pid_in_jail),
            Ok(StatusEvent::Error { stage, message }) => {
                report.error.get_or_insert((stage, message));
            }
            Err(e) => {
                report
                    .error
                    .get_or_insert(("status".into(), format!("unparseable status line: {e}")));
            }
        }
    }
    Ok(report)
}

/// Undoes a launch that failed half-way (dropped without [`LaunchCleanup::disarm`]).
#[derive(Default)]
struct LaunchCleanup {
    disarmed: bool,
    child: Option<Child>,
    cgroups: Option<CgroupSet>,
    sandbox_dir: Option<PathBuf>,
    socket: Option<(PathBuf, u64)>,
    /// (where the adopted layer is now, where it came from)
    restore_upper: Option<(PathBuf, PathBuf)>,
    /// The user namespace range taken for this launch.
    uid_range: Option<(Arc<UidRanges>, u32)>,
}

impl LaunchCleanup {
    fn disarm(&mut self) {
        self.disarmed = true;
    }
}

impl Drop for LaunchCleanup {
    fn drop(&mut self) {
        if self.disarmed {
            return;
        }
        let mut emptied = true;
        if let Some(cgroups) = &self.cgroups {
            let _ = cgroups.kill_all();
        }
        if let Some(child) = self.child.as_mut() {
            let _ = child.kill();
            let _ = child.wait();
        }
        if let Some(cgroups) = &self.cgroups {
            // An init forked before the failure is our child (subreaper) too.
            reap_children_of_this_process(&cgroups.procs().unwrap_or_default());
            emptied = cgroups.wait_empty().is_ok();
            let _ = cgroups.remove();
        }
        if let Some((socket, inode)) = &self.socket {
            remove_socket_if_same(socket, *inode);
        }
        if let Some((now, was)) = &self.restore_upper {
            let _ = fs::rename(now, was);
        }
        if let Some(dir) = &self.sandbox_dir {
            let _ = crate::substrate::tree::remove_tree(dir);
        }
        // Only once no process of the jail is left (above): the range is free again.
        // Processes that would not die keep it, so no other jail ever shares it.
        if let Some((ranges, base)) = &self.uid_range {
            if emptied {
                ranges.release(*base);
            } else {
                tracing::warn!(
                    base,
                    "a failed launch left processes: its uid range stays taken"
                );
            }
        }
    }
}

/// SIGKILL through a pidfd, only if `p` is still the recorded process.
fn kill_process(p: &ProcessIdentity) {
    let Some(pid) = rustix::process::Pid::from_raw(p.pid) else {
        return;
    };
    if let Ok(fd) = rustix::process::pidfd_open(pid, rustix::process::PidfdFlags::empty()) {
        if p.is_alive() {
            let _ = rustix::process::pidfd_send_signal(&fd, rustix::process::Signal::KILL);
        }
    }
}

/// Removes the socket file only if it is still the one this execution bound: a
/// later execution of the same sandbox may have bound the same path since.
fn remove_socket_if_same(socket: &Path, inode: u64) {
    if matches!(fs::symlink_metadata(socket), Ok(m) if m.ino() == inode) {
        let _ = fs::remove_file(socket);
        if let Some(dir) = socket.parent() {
            // Succeeds only when empty, which is what we want.
            let _ = fs::remove_dir(dir);
        }
    }
}

impl Substrate for JailDriver {
    fn kind(&self) -> SubstrateKind {
        SubstrateKind::Jail
    }

    fn launch(&self, spec: &LaunchSpec) -> Result<SandboxHandle, SubstrateError> {
        Self::validate(spec)?;
        fs::create_dir_all(&spec.data_dir).map_err(io_err("create data dir"))?;
        let data_dir = spec
            .data_dir
            .canonicalize()
            .map_err(io_err("resolve data dir"))?;
        let spec = LaunchSpec {
            data_dir,
            ..spec.clone()
        };
        let layout = Layout::new(&spec.data_dir, &spec.key);
        let mut cleanup = LaunchCleanup::default();
        let (handle, _) = self.launch_inner(&spec, &layout, &mut cleanup, false)?;
        // A kept layer may fill its disk: the launch wrote what it needs without the
        // limit (see `disk::create_sandbox_dir`), which holds from here on.
        disk::set_limit(&handle.sandbox_dir, spec.limits.disk_bytes)?;
        cleanup.disarm();
        tracing::debug!(
            sandbox = %spec.key.sandbox_id,
            execution = %spec.key.execution_id,
            init = handle.init.pid,
            "jail launched"
        );
        Ok(handle)
    }

    fn pause(&self, handle: &SandboxHandle) -> Result<(), SubstrateError> {
        if !handle.init.exists() {
            return Err(SubstrateError::NotRunning);
        }
        handle.cgroups.freeze()
    }

    fn resume(&self, handle: &SandboxHandle) -> Result<(), SubstrateError> {
        if !handle.init.exists() {
            return Err(SubstrateError::NotRunning);
        }
        handle.cgroups.thaw()
    }

    fn destroy(&self, handle: &SandboxHandle) -> Result<(), SubstrateError> {
        self.teardown(handle, None)
    }

    fn destroy_keeping_layer(
        &self,
        handle: &SandboxHandle,
        keep_at: &Path,
    ) -> Result<(), SubstrateError> {
        self.teardown(handle, Some(keep_at))
    }

    fn stats(&self, handle: &SandboxHandle) -> Result<SandboxStats, SubstrateError> {
        Ok(SandboxStats {
            cgroup: handle.cgroups.stats()?,
            running: handle.init.is_alive(),
        })
    }

    fn service_socket(&self, handle: &SandboxHandle) -> Result<OwnedFd, SubstrateError> {
        netns::tcp_socket_in(&handle.init)
    }

    fn try_wait(&self, handle: &SandboxHandle) -> Result<Option<i32>, SubstrateError> {
        match self.reap_init(&handle.init, false) {
            Some(WaitStatus::Exited(_, code)) => Ok(Some(code)),
            Some(WaitStatus::Signaled(_, signal, _)) => Ok(Some(128 + signal as i32)),
            Some(_) => Ok(None),
            None if handle.init.is_alive() => Ok(None),
            None => Err(SubstrateError::NotRunning),
        }
    }
}
