//! The `firecracker` substrate: each execution in its own kernel under Firecracker
//! (KVM only), the QEMU driver's guest (`substrate::vm`: the same Debian kernel, as
//! the ELF `vmlinux` Firecracker boots; the same initramfs and agent; the same layer
//! images and writable disk; the same snapshot directory) on another VMM.
//!
//! A launch prepares the execution's Firecracker directory
//! (`<data>/run/<sandbox>/fc-<execution>/`, 0700, the VM uid's): hard links of the
//! template's read-only layer images, the writable disk (the VM uid's), and later the
//! API and vsock sockets Firecracker binds there. It starts `firecracker --api-sock
//! api.sock --id …` in that directory — in a cgroup of its own (memory, pids, CPU),
//! its environment cleared, inheriting only the kernel and initramfs descriptors,
//! in a network namespace of its own where the worker is root, dropped to a uid of its
//! own before `exec` ([`child`]) — and configures it over its API ([`api`],
//! [`requests`]): machine, boot source (kernel and initramfs by `/proc/self/fd/N`),
//! drives in the guest's order, vsock, start. The guest's agent listens on vsock
//! (`space.transport=vsock`); the bridge reaches it through the hybrid vsock socket
//! (`spaced_host::vsock::connect_agent`), verifying Firecracker as its peer.
//!
//! Every path Firecracker is given is relative to its working directory (see
//! [`requests`]): a snapshot's drive and socket paths are then the same in every
//! execution directory, which is what a restore needs — Firecracker reopens exactly
//! the recorded paths and cannot rename a resource at load.

pub mod api;
pub mod child;
pub mod probe;
pub mod requests;
mod snapshot;

use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::jail::cgroup::CgroupHierarchy;
use super::vm::snapshot::{self as vmsnap, Machine, VmSnapshot, Vmm};
use super::vm::{KeptDisk, VmUid, disk, kernel};
use super::{
    CgroupSet, LaunchSpec, Limits, ProcessIdentity, SandboxHandle, SandboxStats, Substrate,
    SubstrateError, SubstrateKind, io_err,
};

/// What the driver needs.
#[derive(Debug, Clone)]
pub struct FirecrackerConfig {
    /// The `firecracker` binary.
    pub firecracker: PathBuf,
    /// The prepared guest kernel's directory (`space vm setup`, with the vsock
    /// modules); its `vmlinux` is made there from its `vmlinuz` the first time.
    pub kernel_dir: PathBuf,
    /// The statically linked `spaced-guest` (the guest's `/init`).
    pub agent: PathBuf,
    /// The cgroup (under each hierarchy) holding the VMs' cgroups.
    pub cgroup_parent: String,
    /// Host uids for Firecracker processes (the jails' ranges, shared with the jail and
    /// QEMU drivers): each VM's Firecracker runs as the first uid of a range of its
    /// own. `None`: it stays the worker's uid (`--no-userns`).
    pub uid_ranges: Option<Arc<super::jail::uid_ranges::UidRanges>>,
}

/// Memory Firecracker itself may use beyond the guest's RAM.
const VMM_OVERHEAD: u64 = 64 << 20;
/// How long Firecracker may take to answer on its API socket after it starts.
const START_WAIT: Duration = Duration::from_secs(10);
/// Each configuration request's bound.
const API_WAIT: Duration = Duration::from_secs(10);
/// A snapshot's write or load.
const SNAPSHOT_WAIT: Duration = Duration::from_secs(300);
/// The KVM device.
const KVM: &str = "/dev/kvm";

/// The Firecracker driver.
#[derive(Debug)]
pub struct FirecrackerDriver {
    config: FirecrackerConfig,
    kernel: kernel::GuestKernel,
    vmlinux: PathBuf,
    initramfs: PathBuf,
    /// Required: without a cgroup a VM would have no memory, pids or CPU limit, and
    /// its end could not be confirmed (a forked child would outlive the main PID and
    /// keep the uid and directory of a VM taken for gone).
    cgroups: CgroupHierarchy,
    /// The supplementary group a VM's uid needs for `/dev/kvm`, if any.
    kvm_group: Option<u32>,
    /// Whether Firecracker gets a network namespace of its own (a root worker): it
    /// has no NIC, and so reaches nothing of the host's network.
    netns: bool,
}

impl FirecrackerDriver {
    /// A driver for `config`, its initramfs under `data_dir/vm` (the QEMU driver's).
    pub fn new(mut config: FirecrackerConfig, data_dir: &Path) -> Result<Self, SubstrateError> {
        if !config.firecracker.is_file() {
            return Err(SubstrateError::Unsupported(format!(
                "no Firecracker at {}",
                config.firecracker.display()
            )));
        }
        // Absolute: it is started in the execution's directory.
        config.firecracker = std::fs::canonicalize(&config.firecracker)
            .map_err(io_err("the Firecracker binary's path"))?;
        let kvm_group = match config.uid_ranges {
            Some(_) => child::kvm_access(Path::new(KVM))?,
            None => None,
        };
        let cgroups = CgroupHierarchy::detect().map_err(|e| {
            SubstrateError::Unsupported(format!(
                "Firecracker VMs need cgroups (their limits, and killing all of a VM): {e}"
            ))
        })?;
        let kernel = kernel::load(&config.kernel_dir).map_err(SubstrateError::Unsupported)?;
        kernel::has_vsock_modules(&kernel).map_err(SubstrateError::Unsupported)?;
        let vmlinux = super::vm::vmlinux::vmlinux(&kernel.vmlinuz, &config.kernel_dir)
            .map_err(SubstrateError::Unsupported)?;
        let initramfs = super::vm::guest_initramfs(&config.agent, &kernel, data_dir)?;
        // Reopened by a Firecracker of another uid (through `/proc/self/fd/N`):
        // readable to everyone whatever the worker's umask. Neither holds a secret.
        for f in [&vmlinux, &initramfs] {
            std::fs::set_permissions(f, std::os::unix::fs::PermissionsExt::from_mode(0o444))
                .map_err(io_err(format!("make {} readable", f.display())))?;
        }
        Ok(Self {
            config,
            kernel,
            vmlinux,
            initramfs,
            cgroups,
            kvm_group,
            netns: rustix::process::geteuid().is_root(),
        })
    }

    /// The guest kernel's release.
    pub fn kernel_release(&self) -> &str {
        &self.kernel.release
    }

    /// Starts Firecracker for `spec`: a fresh boot, or (with `restore`) the VM of a
    /// memory snapshot, loaded and resumed (a new execution: the bridge gives its
    /// guest the new activation before anything is served).
    fn start(
        &self,
        spec: &LaunchSpec,
        restore: Option<&VmSnapshot>,
    ) -> Result<SandboxHandle, SubstrateError> {
        spec.key.validate()?;
        let uid = VmUid::take(self.config.uid_ranges.as_ref())?;
        let layers = disk::layer_images(&spec.data_dir.join("vm").join("images"), &spec.template)?;
        if let Some(snap) = restore {
            snap.check_fits(spec, &layers, &self.kernel.release, Vmm::Firecracker)?;
        }
        let sandbox_dir = spec.data_dir.join("sandboxes").join(spec.key.dir_name());
        std::fs::create_dir_all(&sandbox_dir).map_err(io_err("the sandbox directory"))?;
        let run = spec.data_dir.join("run").join(&spec.key.sandbox_id);
        space_peer::prepare_socket_dir(&run)
            .map_err(|e| SubstrateError::io("the run directory", std::io::Error::other(e)))?;
        let dir = run.join(format!("{}{}", requests::DIR_PREFIX, spec.key.execution_id));
        let _ = super::tree::remove_tree(&dir);
        space_peer::prepare_socket_dir(&dir).map_err(|e| {
            SubstrateError::io("the Firecracker directory", std::io::Error::other(e))
        })?;
        let mut kept_back: Option<KeptDisk> = None;
        let started = self.start_in(
            spec,
            restore,
            &layers,
            &dir,
            &sandbox_dir,
            &uid,
            &mut kept_back,
        );
        match started {
            Ok(mut handle) => {
                if let Some(k) = kept_back.as_mut() {
                    k.started();
                    if let Some(kept) = &spec.initial_upper {
                        let _ = super::tree::remove_tree(kept);
                    }
                }
                handle.host_uid = uid.keep();
                Ok(handle)
            }
            Err(e) => {
                // The kept disk back where it was first, then nothing of the start left.
                drop(kept_back);
                let _ = super::tree::remove_tree(&dir);
                Err(e)
            }
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn start_in(
        &self,
        spec: &LaunchSpec,
        restore: Option<&VmSnapshot>,
        layers: &[PathBuf],
        dir: &Path,
        sandbox_dir: &Path,
        uid: &VmUid,
        kept_back: &mut Option<KeptDisk>,
    ) -> Result<SandboxHandle, SubstrateError> {
        // The layers by the names the VM's drives have (hard links: the same
        // read-only inode, reachable by the VM's uid only through this directory).
        for (i, layer) in layers.iter().enumerate() {
            std::fs::hard_link(layer, dir.join(requests::layer_file(i))).map_err(io_err(
                "link a layer image into the Firecracker directory (the data directory \
                 must be one filesystem)",
            ))?;
        }
        let upper = dir.join(requests::UPPER);
        let kept = spec
            .initial_upper
            .as_ref()
            .map(|k| k.join("upper.ext4"))
            .filter(|k| std::fs::symlink_metadata(k).is_ok_and(|m| m.is_file()));
        match (restore, kept) {
            (Some(snap), _) => snap.copy_disk_to(&upper)?,
            (None, Some(k)) => {
                std::fs::rename(&k, &upper).map_err(io_err("the kept VM disk"))?;
                *kept_back = Some(KeptDisk {
                    from: upper.clone(),
                    to: k,
                });
            }
            (None, None) => disk::upper_image(&upper, spec.limits.disk_bytes.unwrap_or(1 << 30))?,
        }
        if let Some(snap) = restore {
            snapshot::stage_for_load(snap, dir, uid.base())?;
        }
        if let Some(base) = uid.base() {
            // The disk by descriptor (a plain file of one link), then the directory.
            let disk = super::vm::open_single(&upper).map_err(io_err("the VM's disk"))?;
            std::os::unix::fs::fchown(&disk, Some(base), Some(base))
                .map_err(io_err("give the VM's disk to its uid"))?;
            std::os::unix::fs::lchown(dir, Some(base), Some(base))
                .map_err(io_err("give the VM's directory to its uid"))?;
        }
        let (ram, cpus) = vmsnap::machine_size(&spec.limits);
        Machine {
            ram,
            cpus,
            root_image: vmsnap::image_names(layers),
            kernel: self.kernel.release.clone(),
            nic: false,
            vmm: Vmm::Firecracker,
            transport: Default::default(),
        }
        .write(&sandbox_dir.join(vmsnap::MACHINE))?;
        let log_path = sandbox_dir.join("firecracker.log");
        let vmm_log = bounded_log(&log_path)?;
        // The kernel and initramfs as descriptors (`/proc/self/fd/N`): the dropped
        // uid could not reach them by path.
        let boot_files = [
            super::vm::open_disk(&self.vmlinux, false)?,
            super::vm::open_disk(&self.initramfs, false)?,
        ];
        let handed = crate::substrate::jail::spawn::for_qemu(&boot_files)
            .map_err(io_err("hand Firecracker its kernel"))?;
        let fd_path =
            |fd: &OwnedFd| format!("/proc/self/fd/{}", std::os::fd::AsRawFd::as_raw_fd(fd));
        let (kernel_path, initrd_path) = (fd_path(&handed[0]), fd_path(&handed[1]));
        let mut cmd = Command::new(&self.config.firecracker);
        cmd.args(requests::command_args(&requests::instance_id(
            &spec.key.sandbox_id,
            &spec.key.execution_id,
        )))
        .current_dir(dir)
        .env_clear()
        .stdin(Stdio::null())
        // The guest's console: nowhere (a guest could write without end).
        .stdout(Stdio::null())
        .stderr(vmm_log);
        let limits = Limits {
            memory_bytes: Some(ram + VMM_OVERHEAD),
            // Its API, VMM and vCPU threads, with room.
            pids_max: Some(32 + u64::from(cpus)),
            cpu_millis: spec.limits.cpu_millis,
            disk_bytes: None,
        };
        let cgroups =
            self.cgroups
                .create(&self.config.cgroup_parent, &spec.key.dir_name(), &limits)?;
        if matches!(cgroups, CgroupSet::None) {
            return Err(SubstrateError::Unsupported(
                "no cgroup for the Firecracker VM".into(),
            ));
        }
        // Its cgroup joined in the child, before `exec` (through descriptors opened
        // here: the dropped uid could not open them): nothing of Firecracker runs
        // outside its limits.
        let join = match cgroups.procs_files() {
            Ok(fds) => fds,
            Err(e) => {
                let _ = cgroups.remove();
                return Err(SubstrateError::io("open the VM's cgroup", e));
            }
        };
        // Exactly the boot descriptors, a network namespace of its own (root), its
        // cgroup, then the VM's uid: in that order (the unshare and the join need the
        // worker's privileges).
        crate::substrate::jail::spawn::qemu_child(&mut cmd, &handed, self.netns);
        crate::substrate::jail::spawn::join_cgroup(&mut cmd, join);
        child::drop_to(&mut cmd, uid.base(), uid.base().and(self.kvm_group));
        let spawned = cmd.spawn();
        // The log pipe's write end is Firecracker's alone now: its drain ends when
        // Firecracker (and anything it gave its stderr) does.
        drop(cmd);
        let child = match spawned {
            Ok(c) => c,
            Err(e) => {
                let _ = cgroups.remove();
                return Err(SubstrateError::io("start Firecracker", e));
            }
        };
        let pid = child.id() as i32;
        drop(child);
        drop((handed, boot_files));
        let fail = |e: SubstrateError| {
            if let Some(p) = rustix::process::Pid::from_raw(pid) {
                let _ = rustix::process::kill_process(p, rustix::process::Signal::KILL);
            }
            super::vm::reap(pid);
            let _ = cgroups.kill_all();
            let _ = cgroups.remove();
            // Its drain has what it wrote by the time it is gone (or soon after).
            std::thread::sleep(Duration::from_millis(50));
            let log = read_tail(&log_path, 2000);
            let log = tail(&log, 2000).trim();
            match e {
                SubstrateError::Io { context, source } if !log.is_empty() => {
                    SubstrateError::io(format!("{context} (Firecracker: {log})"), source)
                }
                other => other,
            }
        };
        // Joined in the child already; written again here, which checks it holds.
        if let Err(e) = cgroups.add_process(pid) {
            return Err(fail(e));
        }
        // Recorded now, before its socket is asked anything: the API must be served by
        // this process (the PID the worker spawned, at this start time), never by
        // whatever a link in its directory leads to.
        let init = match ProcessIdentity::of(pid) {
            Ok(i) => i,
            Err(e) => return Err(fail(SubstrateError::io("Firecracker's identity", e))),
        };
        let api = api::Api::new(&dir.join(requests::API_SOCKET), API_WAIT, served(&init));
        if let Err(e) = wait_for_api(&api, pid) {
            return Err(fail(e));
        }
        let version = api
            .ok("GET", "/version", None)
            .map_err(|e| e.to_string())
            .and_then(|body| requests::check_version(&body));
        if let Err(e) = version {
            return Err(fail(SubstrateError::Unsupported(e)));
        }
        if let Some(base) = uid.base() {
            let runs_as = space_peer::LiveProcess::open(pid as u32)
                .map(|l| l.identity.uid)
                .ok();
            if runs_as != Some(base) {
                return Err(fail(SubstrateError::InvalidSpec(format!(
                    "Firecracker runs as uid {runs_as:?}, not the VM's {base}"
                ))));
            }
        }
        let configured = match restore {
            None => requests::boot(ram, cpus, &kernel_path, &initrd_path, layers.len())
                .iter()
                .try_for_each(|(method, path, body)| api.ok(method, path, Some(body)).map(drop)),
            Some(snap) => {
                let (method, path, body) = requests::snapshot_load();
                let loaded = api
                    .with_timeout(SNAPSHOT_WAIT)
                    .ok(method, &path, Some(&body))
                    .map(drop);
                // Loaded (the memory file mapped privately): the staged names go, so
                // that nothing later writes through them into the snapshot's files.
                snapshot::unstage(dir, snap);
                loaded
            }
        };
        if let Err(e) = configured {
            return Err(fail(SubstrateError::io(
                "configure Firecracker",
                std::io::Error::other(e.to_string()),
            )));
        }
        let socket_path = dir.join(requests::VSOCK_SOCKET);
        let socket_inode = match wait_for_socket(&socket_path, pid) {
            Ok(i) => i,
            Err(e) => return Err(fail(e)),
        };
        Ok(SandboxHandle {
            key: spec.key.clone(),
            substrate: SubstrateKind::Firecracker,
            init,
            agent: Some(init),
            socket_path,
            socket_inode,
            sandbox_dir: sandbox_dir.to_path_buf(),
            upper_dir: upper,
            log_path,
            cgroups,
            host_uid: None,
            guest_cid: None,
        })
    }

    /// Writes a memory snapshot of `handle`'s VM into `dir` (created): its vCPUs are
    /// paused first and stay paused — the caller resumes it ([`Substrate::resume`]) or
    /// destroys it (a migration). The same layout as the QEMU driver's (`vm.json`,
    /// `memory`, `upper.ext4`) plus Firecracker's `vmstate`.
    pub fn snapshot(
        &self,
        handle: &SandboxHandle,
        dir: &Path,
    ) -> Result<VmSnapshot, SubstrateError> {
        let api = self.api(handle)?;
        snapshot::take(&api, handle, &fc_dir(handle)?, dir, SNAPSHOT_WAIT)
    }

    /// A new execution from `snapshot`: a new Firecracker loads it and resumes.
    pub fn restore(
        &self,
        spec: &LaunchSpec,
        snapshot: &VmSnapshot,
    ) -> Result<SandboxHandle, SubstrateError> {
        self.start(spec, Some(snapshot))
    }

    fn api(&self, handle: &SandboxHandle) -> Result<api::Api, SubstrateError> {
        if !handle.init.is_alive() {
            return Err(SubstrateError::NotRunning);
        }
        Ok(api::Api::new(
            &fc_dir(handle)?.join(requests::API_SOCKET),
            API_WAIT,
            served(&handle.init),
        ))
    }

    fn set_paused(&self, handle: &SandboxHandle, paused: bool) -> Result<(), SubstrateError> {
        let (method, path, body) = requests::vm_state(paused);
        self.api(handle)?
            .ok(method, &path, Some(&body))
            .map(drop)
            .map_err(|e| {
                SubstrateError::io(
                    format!("pause or resume: {e}"),
                    std::io::Error::other(e.to_string()),
                )
            })
    }

    /// Ends Firecracker and its cgroup, then gives its uid back once nothing of it runs;
    /// whether nothing of it runs.
    fn kill(&self, handle: &SandboxHandle) -> bool {
        let gone = super::vm::end_vmm(handle);
        if let (Some(ranges), Some(base)) = (&self.config.uid_ranges, handle.host_uid) {
            if gone {
                ranges.release(base);
            } else {
                tracing::warn!(
                    uid = base,
                    pid = handle.init.pid,
                    "Firecracker did not end: its uid stays taken until the worker exits"
                );
            }
        }
        gone
    }
}

/// A destroy that found Firecracker (or a process of its cgroup) still running.
fn not_gone(handle: &SandboxHandle) -> SubstrateError {
    SubstrateError::Timeout(format!(
        "Firecracker {} (or a process of its cgroup) did not end: its directory, disk and \
         uid are left to the sweep",
        handle.init.pid
    ))
}

/// The recorded Firecracker process, as the API client checks its socket's peer.
fn served(init: &ProcessIdentity) -> api::Served {
    api::Served {
        pid: init.pid as u32,
        start_time: init.start_time,
    }
}

/// The execution's Firecracker directory (the vsock socket's), checked to be one.
fn fc_dir(handle: &SandboxHandle) -> Result<PathBuf, SubstrateError> {
    handle
        .socket_path
        .parent()
        .filter(|d| {
            d.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with(requests::DIR_PREFIX))
        })
        .map(Path::to_path_buf)
        .ok_or_else(|| SubstrateError::InvalidSpec("not a Firecracker execution's handle".into()))
}

/// Until Firecracker answers on its API socket (or exits, or [`START_WAIT`] passes).
fn wait_for_api(api: &api::Api, pid: i32) -> Result<(), SubstrateError> {
    let deadline = Instant::now() + START_WAIT;
    loop {
        match api.state() {
            Ok(_) => return Ok(()),
            Err(e) if Instant::now() > deadline || !alive(pid) => {
                return Err(SubstrateError::io(
                    "Firecracker did not answer on its API socket",
                    std::io::Error::other(e.to_string()),
                ));
            }
            Err(_) => std::thread::sleep(Duration::from_millis(10)),
        }
    }
}

/// Until the vsock socket is bound: its inode.
fn wait_for_socket(path: &Path, pid: i32) -> Result<u64, SubstrateError> {
    use std::os::unix::fs::{FileTypeExt as _, MetadataExt as _};
    let deadline = Instant::now() + START_WAIT;
    loop {
        match std::fs::symlink_metadata(path) {
            Ok(m) if m.file_type().is_socket() => return Ok(m.ino()),
            Ok(_) => {
                return Err(SubstrateError::InvalidSpec(format!(
                    "{} is not a socket",
                    path.display()
                )));
            }
            Err(e) if Instant::now() > deadline || !alive(pid) => {
                return Err(SubstrateError::io("the vsock socket", e));
            }
            Err(_) => std::thread::sleep(Duration::from_millis(10)),
        }
    }
}

/// Whether process `pid` still runs (an exited child not yet reaped does not).
fn alive(pid: i32) -> bool {
    space_peer::LiveProcess::open(pid as u32).is_ok_and(|l| l.is_alive())
}

/// The most of Firecracker's stderr kept in its log (`firecracker.log`): the first
/// bytes (a failed start says why there), the rest read and dropped.
pub const LOG_MAX: u64 = 256 << 10;

/// Firecracker's stderr: the write end of a pipe that a thread of the worker drains
/// into `path`, keeping at most [`LOG_MAX`] bytes and a line saying the rest was
/// dropped. Firecracker never blocks on it (the drain reads to the end), and a guest
/// that makes Firecracker warn without end cannot fill the host's disk.
fn bounded_log(path: &Path) -> Result<std::fs::File, SubstrateError> {
    use std::io::{Read as _, Write as _};
    let mut file = std::fs::File::create(path).map_err(io_err("the Firecracker log"))?;
    let (read, write) = rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC)
        .map_err(|e| SubstrateError::io("the Firecracker log's pipe", e.into()))?;
    std::thread::Builder::new()
        .name("fc-log".into())
        .stack_size(64 << 10)
        .spawn(move || {
            let mut read = std::fs::File::from(read);
            let mut kept = 0u64;
            let mut dropped = false;
            let mut buf = [0u8; 8192];
            loop {
                let n = match read.read(&mut buf) {
                    Ok(0) => break,
                    Ok(n) => n,
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                    Err(_) => break,
                };
                let room = (LOG_MAX - kept).min(n as u64) as usize;
                if room > 0 && file.write_all(&buf[..room]).is_ok() {
                    kept += room as u64;
                }
                if room < n && !dropped {
                    dropped = true;
                    let _ = file.write_all(b"\n[the rest of Firecracker's log was dropped]\n");
                }
            }
        })
        .map_err(io_err("the Firecracker log's drain"))?;
    Ok(std::fs::File::from(write))
}

/// The last `n` bytes of the file at `path` (lossy text; empty if unreadable).
fn read_tail(path: &Path, n: u64) -> String {
    use std::io::{Read as _, Seek as _};
    let Ok(mut f) = std::fs::File::open(path) else {
        return String::new();
    };
    let len = f.metadata().map(|m| m.len()).unwrap_or(0);
    let _ = f.seek(std::io::SeekFrom::Start(len.saturating_sub(n)));
    let mut bytes = Vec::new();
    let _ = f.take(n).read_to_end(&mut bytes);
    String::from_utf8_lossy(&bytes).into_owned()
}

/// The last `n` bytes of `text` or fewer (on a character boundary).
fn tail(text: &str, n: usize) -> &str {
    let mut from = text.len().saturating_sub(n);
    while !text.is_char_boundary(from) {
        from += 1;
    }
    &text[from..]
}

impl Substrate for FirecrackerDriver {
    fn kind(&self) -> SubstrateKind {
        SubstrateKind::Firecracker
    }

    /// As the QEMU driver's: a kept layer this worker received as a VM snapshot is
    /// restored (a Firecracker one: QEMU's state is refused), one holding a disk
    /// boots from it, otherwise a fresh disk.
    fn launch(&self, spec: &LaunchSpec) -> Result<SandboxHandle, SubstrateError> {
        let Some(kept) = super::vm::received_snapshot(spec) else {
            return self.start(spec, None);
        };
        let snap = VmSnapshot::open(&kept.join("upper"))?;
        let handle = self.start(spec, Some(&snap))?;
        if let Some(kept) = &spec.initial_upper {
            let _ = super::tree::remove_tree(kept);
        }
        Ok(handle)
    }

    fn pause(&self, handle: &SandboxHandle) -> Result<(), SubstrateError> {
        self.set_paused(handle, true)
    }

    fn resume(&self, handle: &SandboxHandle) -> Result<(), SubstrateError> {
        self.set_paused(handle, false)
    }

    /// Removes the VM's directory only once Firecracker and everything in its cgroup
    /// are confirmed gone: a live process of the VM's uid could change the tree under
    /// the removal. Otherwise the directory (and its disk) is left to the next start's
    /// sweep, which kills the cgroup first.
    fn destroy(&self, handle: &SandboxHandle) -> Result<(), SubstrateError> {
        if !self.kill(handle) {
            return Err(not_gone(handle));
        }
        if let Ok(dir) = fc_dir(handle) {
            super::tree::remove_tree(&dir).map_err(io_err("remove the Firecracker directory"))?;
        }
        match std::fs::remove_dir_all(&handle.sandbox_dir) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(SubstrateError::io("remove the sandbox directory", e)),
        }
    }

    fn destroy_keeping_layer(
        &self,
        handle: &SandboxHandle,
        keep_at: &Path,
    ) -> Result<(), SubstrateError> {
        // Firecracker ends here; its uid goes back in `destroy`, once. Nothing of its
        // directory is kept unless nothing of it runs.
        if !super::vm::end_vmm(handle) {
            return Err(not_gone(handle));
        }
        super::vm::keep_disk(handle, keep_at)?;
        self.destroy(handle)
    }

    fn stats(&self, handle: &SandboxHandle) -> Result<SandboxStats, SubstrateError> {
        super::vm::vmm_stats(handle)
    }

    fn service_socket(
        &self,
        _handle: &SandboxHandle,
    ) -> Result<std::os::fd::OwnedFd, SubstrateError> {
        Err(SubstrateError::Unsupported(
            "a VM's loopback is its guest kernel's: netgtw reaches its ports through the \
             guest's agent (ConnectPort)"
                .into(),
        ))
    }

    fn try_wait(&self, handle: &SandboxHandle) -> Result<Option<i32>, SubstrateError> {
        super::vm::vmm_exit(handle)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_log_tail_is_bounded_and_whole_characters() {
        assert_eq!(tail("abc", 10), "abc");
        assert_eq!(tail("abcdef", 2), "ef");
        assert_eq!(tail("aé", 1), "");
        assert_eq!(tail("aé", 2), "é");
    }

    #[test]
    fn only_a_firecracker_directory_is_taken_from_a_handle() {
        let handle = |socket: &str| SandboxHandle {
            key: crate::substrate::ExecutionKey::new("sbx_a", "01"),
            substrate: SubstrateKind::Firecracker,
            init: ProcessIdentity {
                pid: 1,
                start_time: 1,
            },
            agent: None,
            socket_path: socket.into(),
            socket_inode: 0,
            sandbox_dir: "/d/sandboxes/sbx_a.01".into(),
            upper_dir: "/d/run/sbx_a/fc-01/upper.ext4".into(),
            log_path: "/d/sandboxes/sbx_a.01/firecracker.log".into(),
            cgroups: CgroupSet::None,
            host_uid: None,
            guest_cid: None,
        };
        assert_eq!(
            fc_dir(&handle("/d/run/sbx_a/fc-01/v.sock")).unwrap(),
            Path::new("/d/run/sbx_a/fc-01")
        );
        // A QEMU execution's socket is in the run directory itself: never removed as
        // if it were a Firecracker directory.
        assert!(fc_dir(&handle("/d/run/sbx_a/vm-01.sock")).is_err());
        assert!(fc_dir(&handle("v.sock")).is_err());
    }
}
