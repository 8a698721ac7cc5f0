//! The `vm` substrate: each execution in its own kernel, under QEMU (`microvm`, KVM
//! where a guest boots under it, software emulation otherwise).
//!
//! A launch renders the template to a read-only disk image once (shared), makes the
//! sandbox's writable disk (its size the disk limit), and starts QEMU in a cgroup of
//! its own with the Debian guest kernel ([`kernel`]), the initramfs this driver builds
//! ([`initramfs`]: the statically linked agent as `/init` and the modules it loads),
//! the two disks, the agent's transport (served by QEMU: the recorded agent process is
//! QEMU) and a QMP socket for pause and resume (vCPUs stopped, memory kept). The
//! transport ([`transport`], chosen once per driver) is a virtio-serial port on a Unix
//! socket in the worker's run directory, or — on `--vm-transport vsock`, where
//! `/dev/vhost-vsock` opens read-write — a vhost-vsock device on a descriptor of it
//! the worker opened, with a guest CID of the VM's own ([`cid`]; claimed by the worker
//! on that descriptor before QEMU starts, a taken one passed over for another). The bridge does the rest
//! (`spaced_host::serial`, `spaced_host::vhost`): it verifies QEMU as the socket's peer
//! (or as the live holder of the vhost device) and sends the activation record over
//! the link before anything is served.

mod accel;
mod cid;
mod command;
pub mod disk;
mod drain;
pub(crate) mod files;
pub mod initramfs;
pub mod kernel;
pub mod qmp;
pub(crate) mod shared;
pub mod snapshot;
pub mod transport;
pub mod vmlinux;

pub use snapshot::machine_size;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use super::jail::cgroup::CgroupHierarchy;
use super::{
    CgroupSet, LaunchSpec, Limits, ProcessIdentity, SandboxHandle, SandboxStats, Substrate,
    SubstrateError, SubstrateKind, io_err,
};
use accel::kernel_command_line;
pub use accel::{Accel, detect_accel};
pub(crate) use files::open_single;
pub(crate) use shared::*;
pub use transport::{AgentTransport, TransportChoice};

/// What the driver needs.
#[derive(Debug, Clone)]
pub struct VmConfig {
    /// `qemu-system-x86_64`.
    pub qemu: PathBuf,
    /// The prepared guest kernel's directory ([`kernel::setup`]).
    pub kernel_dir: PathBuf,
    /// The statically linked `spaced-guest` (the guest's `/init`).
    pub agent: PathBuf,
    /// The accelerator.
    pub accel: Accel,
    /// The cgroup (under each hierarchy) holding the VMs' cgroups.
    pub cgroup_parent: String,
    /// Host uids for QEMU processes (the jails' ranges, shared with the jail driver):
    /// each VM's QEMU drops to the first uid of a range of its own (`-runas`) once
    /// its devices are open. `None`: QEMU stays the worker's uid (`--no-userns`).
    pub uid_ranges: Option<std::sync::Arc<super::jail::uid_ranges::UidRanges>>,
    /// How VMs reach their agents (`--vm-transport`): the serial port (`auto`,
    /// `serial`), or vhost-vsock only when asked for (`vsock`).
    pub transport: TransportChoice,
}

/// Memory QEMU itself may use beyond the guest's RAM (its code, device state and, under
/// software emulation, the translation cache `tb-size` bounds).
const VMM_OVERHEAD: u64 = 192 << 20;
/// Most guest CIDs tried for one VM over vhost-vsock while other processes of the
/// host hold the ones tried (each try is one ioctl of the worker's, before QEMU
/// starts; after a taken one the next is random, so that a process holding the CIDs
/// after the one it saw cannot make every start fail).
const MAX_CID_TRIES: usize = 64;

/// The QEMU driver.
#[derive(Debug)]
pub struct QemuDriver {
    config: VmConfig,
    kernel: kernel::GuestKernel,
    initramfs: PathBuf,
    cgroups: Option<CgroupHierarchy>,
    /// Whether VMs get a NIC: only where QEMU can be given a network namespace of its
    /// own (a root worker) — a NIC in the worker's namespace would reach the host's
    /// network past every egress rule.
    nic: bool,
    /// How new VMs reach their agents, and why (probed once, at construction).
    transport: AgentTransport,
    transport_reason: String,
    /// The guest CIDs of this worker's live vhost-vsock VMs.
    cids: std::sync::Mutex<cid::CidAllocator>,
}

/// What one VM's start attempts share.
struct Vm<'a> {
    spec: &'a LaunchSpec,
    restore: Option<&'a snapshot::VmSnapshot>,
    layers: &'a [PathBuf],
    upper: &'a Path,
    serial: &'a Path,
    log_path: PathBuf,
    ram: u64,
    cpus: u32,
    nic: bool,
    uid: Option<u32>,
}

/// A started QEMU.
struct Started {
    init: ProcessIdentity,
    cgroups: CgroupSet,
    socket_inode: u64,
    cid: Option<u32>,
}

/// A start that failed (nothing of it left), and whether it failed because another
/// process of the host holds its guest CID.
struct Failed {
    error: SubstrateError,
    cid_taken: bool,
}

/// `/dev/vhost-vsock`, read-write, for QEMU.
fn open_vhost_vsock() -> Result<std::os::fd::OwnedFd, SubstrateError> {
    use std::os::unix::fs::OpenOptionsExt as _;
    std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_CLOEXEC)
        .open(transport::VHOST_VSOCK)
        .map(std::os::fd::OwnedFd::from)
        .map_err(io_err(format!("open {}", transport::VHOST_VSOCK)))
}

impl QemuDriver {
    /// A driver for `config`, its initramfs built under `data_dir/vm` (once per agent
    /// binary and kernel).
    pub fn new(config: VmConfig, data_dir: &Path) -> Result<Self, SubstrateError> {
        if !config.qemu.is_file() {
            return Err(SubstrateError::Unsupported(format!(
                "no QEMU at {} (Debian: qemu-system-x86)",
                config.qemu.display()
            )));
        }
        let kernel = kernel::load(&config.kernel_dir).map_err(SubstrateError::Unsupported)?;
        let initramfs = guest_initramfs(&config.agent, &kernel, data_dir)?;
        let cgroups = CgroupHierarchy::detect().ok();
        let (mut transport, mut transport_reason) =
            transport::choose(config.transport, &transport::probe_host())
                .map_err(SubstrateError::Unsupported)?;
        // A kernel prepared before the vsock modules were kept boots a guest without
        // them: forced, that is an error; chosen, the serial port.
        if transport == AgentTransport::VhostVsock {
            if let Err(e) = kernel::has_vsock_modules(&kernel) {
                if config.transport == TransportChoice::Vsock {
                    return Err(SubstrateError::Unsupported(format!(
                        "--vm-transport vsock: {e}"
                    )));
                }
                transport = AgentTransport::Serial;
                transport_reason = format!("{e}: the serial port");
            }
        }
        tracing::info!(
            transport = transport.as_str(),
            reason = %transport_reason,
            "VM agent transport"
        );
        // The first CID tried is random: the workers of one host rarely try the same.
        let mut seed = [0u8; 4];
        let _ = rustix::rand::getrandom(&mut seed, rustix::rand::GetRandomFlags::empty());
        let start = cid::FIRST_GUEST_CID + u32::from_ne_bytes(seed) % (1 << 30);
        Ok(Self {
            config,
            kernel,
            initramfs,
            cgroups,
            nic: rustix::process::geteuid().is_root(),
            transport,
            transport_reason,
            cids: std::sync::Mutex::new(cid::CidAllocator::new(start)),
        })
    }

    /// The guest kernel's release.
    pub fn kernel_release(&self) -> &str {
        &self.kernel.release
    }

    /// Starts QEMU for `spec`: a fresh boot, or (with `restore`) the VM of a memory
    /// snapshot, loaded and continued (a new execution of the sandbox: the bridge
    /// gives its guest the new activation before anything is served). Over vhost-vsock
    /// each attempt takes a guest CID of its own; one another process of the host
    /// holds fails QEMU's start, and the start is made again with another, at most
    /// [`MAX_CID_TRIES`] times.
    fn start(
        &self,
        spec: &LaunchSpec,
        restore: Option<&snapshot::VmSnapshot>,
    ) -> Result<SandboxHandle, SubstrateError> {
        spec.key.validate()?;
        // A restored machine is the one its state was saved on: its devices too.
        let transport = restore.map_or(self.transport, |s| s.machine.transport);
        if transport == AgentTransport::VhostVsock && self.transport != AgentTransport::VhostVsock {
            return Err(SubstrateError::Unsupported(format!(
                "the snapshot's VM reaches its agent over vhost-vsock, and QEMU loads its \
                 state only into the same devices; this worker's VMs use the serial port \
                 ({})",
                self.transport_reason
            )));
        }
        // A uid of its own for this VM's QEMU, given back if the start fails.
        let uid = VmUid::take(self.config.uid_ranges.as_ref())?;
        let layers = disk::layer_images(&spec.data_dir.join("vm").join("images"), &spec.template)?;
        let sandbox_dir = spec.data_dir.join("sandboxes").join(spec.key.dir_name());
        std::fs::create_dir_all(&sandbox_dir).map_err(io_err("the sandbox directory"))?;
        let upper = sandbox_dir.join("upper.ext4");
        // A kept disk moved in goes back where it was if this start fails: a failed
        // start never loses the sandbox's files.
        let mut kept_back: Option<KeptDisk> = None;
        let kept = spec
            .initial_upper
            .as_ref()
            .map(|k| k.join("upper.ext4"))
            .filter(|k| std::fs::symlink_metadata(k).is_ok_and(|m| m.is_file()));
        match (restore, kept) {
            (Some(snap), _) => snap
                .check_fits(spec, &layers, &self.kernel.release, snapshot::Vmm::Qemu)?
                .copy_disk_to(&upper)?,
            (None, Some(k)) => {
                // Moved out; the rest of the kept layer goes once the VM runs, so
                // nothing is left to pass for the sandbox's files.
                std::fs::rename(&k, &upper).map_err(io_err("the kept VM disk"))?;
                kept_back = Some(KeptDisk {
                    from: upper.clone(),
                    to: k,
                });
            }
            (None, None) => disk::upper_image(&upper, spec.limits.disk_bytes.unwrap_or(1 << 30))?,
        }
        let run = spec.data_dir.join("run").join(&spec.key.sandbox_id);
        space_peer::prepare_socket_dir(&run)
            .map_err(|e| SubstrateError::io("the run directory", std::io::Error::other(e)))?;
        // The serial socket's name (over vhost-vsock nothing is bound there: it names
        // the QMP socket beside it, and the run directory).
        let serial = run.join(format!("vm-{}.sock", spec.key.execution_id));
        let (ram, cpus) = machine_size(&spec.limits);
        let nic = restore.map_or(self.nic, |s| s.machine.nic);
        if nic && !self.nic {
            return Err(SubstrateError::Unsupported(
                "the snapshot's VM has a NIC, which needs a network namespace of its own \
                 for QEMU: a worker running as root"
                    .into(),
            ));
        }
        snapshot::Machine {
            ram,
            cpus,
            root_image: snapshot::image_names(&layers),
            kernel: self.kernel.release.clone(),
            nic,
            vmm: snapshot::Vmm::Qemu,
            transport,
        }
        .write(&sandbox_dir.join(snapshot::MACHINE))?;
        let vm = Vm {
            spec,
            restore,
            layers: &layers,
            upper: &upper,
            serial: &serial,
            log_path: sandbox_dir.join("qemu.log"),
            ram,
            cpus,
            nic,
            uid: uid.base(),
        };
        let owner = spec.key.dir_name();
        let mut tries = 0;
        let started = loop {
            let cid = match transport {
                AgentTransport::Serial => None,
                AgentTransport::VhostVsock => {
                    Some(self.lock_cids().allocate(&owner).ok_or_else(|| {
                        SubstrateError::Unsupported("every guest CID is held".into())
                    })?)
                }
            };
            match self.spawn(&vm, cid) {
                Ok(started) => break started,
                Err(failed) => {
                    if let Some(c) = cid {
                        self.lock_cids().release(c, &owner);
                    }
                    tries += 1;
                    if !failed.cid_taken || tries >= MAX_CID_TRIES {
                        return Err(failed.error);
                    }
                    let mut seed = [0u8; 4];
                    let _ =
                        rustix::rand::getrandom(&mut seed, rustix::rand::GetRandomFlags::empty());
                    self.lock_cids().search_from(u32::from_ne_bytes(seed));
                    tracing::info!(
                        sandbox = %spec.key.sandbox_id,
                        cid = ?cid,
                        "another VM of the host holds the guest CID: starting again with another"
                    );
                }
            }
        };
        if let Some(k) = kept_back.as_mut() {
            k.started();
            if let Some(kept) = &spec.initial_upper {
                let _ = super::tree::remove_tree(kept);
            }
        }
        Ok(SandboxHandle {
            key: spec.key.clone(),
            substrate: SubstrateKind::Vm,
            init: started.init,
            agent: Some(started.init),
            socket_path: serial.clone(),
            socket_inode: started.socket_inode,
            sandbox_dir,
            upper_dir: upper.clone(),
            log_path: vm.log_path.clone(),
            cgroups: started.cgroups,
            host_uid: uid.keep(),
            guest_cid: started.cid,
        })
    }

    /// One attempt to start QEMU for `vm`, over vhost-vsock with guest CID `cid`:
    /// QEMU running its guest (or loading and continuing its snapshot), or nothing of
    /// it left.
    fn spawn(&self, vm: &Vm<'_>, cid: Option<u32>) -> Result<Started, Failed> {
        let failed = |error| Failed {
            error,
            cid_taken: false,
        };
        let qmp_path = qmp_socket(vm.serial);
        for p in [vm.serial, qmp_path.as_path()] {
            let _ = std::fs::remove_file(p);
        }
        // The disks are opened here and handed to QEMU as descriptors, named by
        // `/proc/self/fd/N`: QEMU reopens an image to change its access (a
        // migration's end makes it read-only), and after dropping to the VM's uid it
        // could not reach them by path through the worker's 0700 data directory. A
        // reopen through the magic link checks only the file's own mode (the layers
        // are read-only to everyone, the disk is the VM uid's). QEMU's image locking
        // is off: it would set each reopened descriptor against its own earlier one,
        // and no other process opens these images while it runs. The vhost-vsock
        // device too is the worker's to open (QEMU may not reach it after its drop, and
        // opens nothing by path): QEMU makes it its own (`VHOST_SET_OWNER` binds it to
        // QEMU's memory) and sets the CID.
        let mut fds = Vec::with_capacity(vm.layers.len() + 2);
        for layer in vm.layers {
            fds.push(open_disk(layer, false).map_err(failed)?);
        }
        let upper_fd = fds.len();
        fds.push(open_disk(vm.upper, true).map_err(failed)?);
        if let Some(cid) = cid {
            let device = open_vhost_vsock().map_err(failed)?;
            // The CID claimed on the worker's own descriptor before QEMU starts: a
            // taken one costs an ioctl, not a QEMU; QEMU's own set of the same CID on
            // the same device then succeeds.
            if let Err(e) = transport::claim_guest_cid(&device, cid) {
                return Err(Failed {
                    cid_taken: e == nix::errno::Errno::EADDRINUSE,
                    error: SubstrateError::io(
                        format!("claim guest CID {cid}"),
                        std::io::Error::from(e),
                    ),
                });
            }
            fds.push(device);
        }
        let handed = crate::substrate::jail::spawn::for_qemu(&fds)
            .map_err(|e| failed(SubstrateError::io("hand QEMU its disks", e)))?;
        let fd_number = |i: usize| std::os::fd::AsRawFd::as_raw_fd(&handed[i]);
        let vmm_log = std::fs::File::create(&vm.log_path)
            .map_err(|e| failed(SubstrateError::io("the QEMU log", e)))?;
        if let Some(base) = vm.uid {
            // Its own disk stays writable after the drop (QEMU may reopen it to
            // change its flags); the layers' images are read-only to everyone.
            std::os::unix::fs::fchown(&fds[upper_fd], Some(base), Some(base))
                .map_err(|e| failed(SubstrateError::io("give the VM's disk to its uid", e)))?;
        }
        // After its devices are open QEMU drops to the VM's uid, with no capability
        // and no_new_privs: the drop needs set*id (so the seccomp filter allows them,
        // which can then raise nothing); without a uid, they are denied.
        let sandbox_opts = match vm.uid {
            Some(_) => "on,obsolete=deny,elevateprivileges=allow,spawn=deny,resourcecontrol=deny",
            None => "on,obsolete=deny,elevateprivileges=deny,spawn=deny,resourcecontrol=deny",
        };
        let transport = match cid {
            Some(_) => AgentTransport::VhostVsock,
            None => AgentTransport::Serial,
        };
        let append = kernel_command_line(self.config.accel, vm.layers.len(), transport);
        let layer_fds: Vec<i32> = (0..vm.layers.len()).map(fd_number).collect();
        let incoming = vm
            .restore
            .map(snapshot::VmSnapshot::incoming_args)
            .unwrap_or_default();
        let args = command::qemu_args(&command::QemuArgs {
            accel: self.config.accel,
            ram: vm.ram,
            cpus: vm.cpus,
            sandbox: sandbox_opts,
            runas: vm.uid,
            kernel: &self.kernel.vmlinuz,
            initramfs: &self.initramfs,
            append: &append,
            layer_fds: &layer_fds,
            upper_fd: fd_number(upper_fd),
            agent: match cid {
                Some(cid) => command::AgentDevice::VhostVsock {
                    cid,
                    fd: fd_number(upper_fd + 1),
                },
                None => command::AgentDevice::Serial { socket: vm.serial },
            },
            nic: vm.nic,
            qmp: &qmp_path,
            incoming: &incoming,
        });
        let mut cmd = Command::new(&self.config.qemu);
        cmd.args(args)
            .env_clear()
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(vmm_log);
        // The disks at their descriptors, and QEMU in a network namespace of its own
        // wherever the worker can give one (root), NIC or not: its NIC's connections
        // leave from there (through the sandbox's veth once the worker gives it one),
        // and QEMU itself reaches nothing of the host's network. (Vhost-vsock belongs
        // to the namespace of the worker, which opened the device: the bridge's.)
        crate::substrate::jail::spawn::qemu_child(&mut cmd, &handed, self.nic);
        let cgroups = match &self.cgroups {
            Some(h) => {
                let limits = Limits {
                    memory_bytes: Some(vm.ram + VMM_OVERHEAD),
                    // Its block I/O thread pool (up to 64), main, RCU, I/O, vhost
                    // and vCPU threads.
                    pids_max: Some(128 + u64::from(vm.cpus)),
                    cpu_millis: vm.spec.limits.cpu_millis,
                    disk_bytes: None,
                };
                h.create(&self.config.cgroup_parent, &vm.spec.key.dir_name(), &limits)
                    .map_err(failed)?
            }
            None => CgroupSet::None,
        };
        // Its cgroup joined in the child, before `exec`: nothing of QEMU runs outside
        // its limits, not even for the moment after its start (and the vhost worker
        // thread it makes is charged to it, on kernels that attach it at the start).
        match cgroups.procs_files() {
            Ok(join) => crate::substrate::jail::spawn::join_cgroup(&mut cmd, join),
            Err(e) => {
                let _ = cgroups.remove();
                return Err(failed(SubstrateError::io("open the VM's cgroup", e)));
            }
        }
        let child = match cmd.spawn() {
            Ok(c) => c,
            Err(e) => {
                let _ = cgroups.remove();
                return Err(failed(SubstrateError::io("start QEMU", e)));
            }
        };
        let pid = child.id() as i32;
        // The child handle is dropped: destroy reaps it by PID. QEMU holds its own
        // copies of the disks (and the vhost device) now.
        drop(child);
        drop((handed, fds));
        let fail = |e: SubstrateError| {
            let _ = rustix::process::kill_process(
                rustix::process::Pid::from_raw(pid).expect("a child's PID is positive"),
                rustix::process::Signal::KILL,
            );
            reap(pid);
            let _ = cgroups.kill_all();
            let _ = cgroups.remove();
            let log = std::fs::read_to_string(&vm.log_path).unwrap_or_default();
            Failed {
                error: e,
                cid_taken: cid.is_some() && command::cid_taken(&log),
            }
        };
        // QEMU creates both sockets before it runs the guest: once QMP answers, the
        // serial socket listens (and the vhost-vsock device holds its CID) — and QEMU
        // has dropped to the VM's uid, which its recorded identity carries.
        let mut q = match qmp::Qmp::connect(&qmp_path, Duration::from_secs(10)) {
            Ok(q) => q,
            Err(e) => {
                let log = std::fs::read_to_string(&vm.log_path).unwrap_or_default();
                return Err(fail(SubstrateError::io(
                    format!("QEMU did not start: {}", log.trim()),
                    e,
                )));
            }
        };
        let init = match ProcessIdentity::of(pid) {
            Ok(i) => i,
            Err(e) => return Err(fail(SubstrateError::io("QEMU's identity", e))),
        };
        if let Some(base) = vm.uid {
            let runs_as = space_peer::LiveProcess::open(pid as u32)
                .map(|l| l.identity.uid)
                .ok();
            if runs_as != Some(base) {
                return Err(fail(SubstrateError::InvalidSpec(format!(
                    "QEMU runs as uid {runs_as:?}, not the VM's {base}"
                ))));
            }
        }
        let started = match vm.restore {
            Some(snap) => snap
                .memory()
                .map_err(|e| std::io::Error::other(e.to_string()))
                .and_then(|m| snapshot::finish_incoming(&mut q, &m)),
            None => q.status().map(drop),
        };
        if let Err(e) = started {
            return Err(fail(SubstrateError::io("QEMU did not start the guest", e)));
        }
        let socket_inode = match cid {
            Some(_) => 0,
            None => match std::fs::metadata(vm.serial) {
                Ok(m) => std::os::unix::fs::MetadataExt::ino(&m),
                Err(e) => return Err(fail(SubstrateError::io("the serial socket", e))),
            },
        };
        Ok(Started {
            init,
            cgroups,
            socket_inode,
            cid,
        })
    }

    fn lock_cids(&self) -> std::sync::MutexGuard<'_, cid::CidAllocator> {
        self.cids
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Holds `handle`'s guest CID for it (a VM re-adopted after the worker restarted):
    /// no other VM of this worker is given it while it runs. `false` if another VM of
    /// this worker holds it already.
    pub fn hold_guest_cid(&self, handle: &SandboxHandle) -> bool {
        match handle.guest_cid {
            Some(c) => self.lock_cids().hold(c, &handle.key.dir_name()),
            None => true,
        }
    }

    /// How this driver's VMs reach their agents (a restored one: as its snapshot's
    /// did), and why.
    pub fn transport(&self) -> (AgentTransport, &str) {
        (self.transport, &self.transport_reason)
    }

    /// Writes a memory snapshot of `handle`'s VM into `dir` (created): its vCPUs stop
    /// first and stay stopped — the caller continues it ([`Substrate::resume`]) or
    /// destroys it (a migration). See [`snapshot`].
    pub fn snapshot(
        &self,
        handle: &SandboxHandle,
        dir: &Path,
    ) -> Result<snapshot::VmSnapshot, SubstrateError> {
        let mut q = self.qmp(handle)?;
        snapshot::take(&mut q, handle, dir)
    }

    /// A new execution from `snapshot`: QEMU loads it and continues (see [`snapshot`]).
    pub fn restore(
        &self,
        spec: &LaunchSpec,
        snapshot: &snapshot::VmSnapshot,
    ) -> Result<SandboxHandle, SubstrateError> {
        self.start(spec, Some(snapshot))
    }

    /// The guest console's last bytes (at most its ring buffer), for diagnostics.
    pub fn console(&self, handle: &SandboxHandle) -> Result<String, SubstrateError> {
        let v = self
            .qmp(handle)?
            .execute(
                "ringbuf-read",
                Some(serde_json::json!({
                    "device": "console",
                    "size": command::CONSOLE_BYTES,
                    "format": "utf8"
                })),
            )
            .map_err(io_err("QMP ringbuf-read"))?;
        Ok(v.as_str().unwrap_or_default().to_owned())
    }

    fn qmp(&self, handle: &SandboxHandle) -> Result<qmp::Qmp, SubstrateError> {
        if !handle.init.is_alive() {
            return Err(SubstrateError::NotRunning);
        }
        qmp::Qmp::connect(&qmp_socket(&handle.socket_path), Duration::from_secs(5))
            .map_err(io_err("QMP"))
    }

    /// Ends QEMU, then gives its uid back — once, and only when nothing of it runs any
    /// more (a uid handed out while a QEMU of it lives would be shared). Called once
    /// per handle, by `destroy`.
    fn kill(&self, handle: &SandboxHandle) {
        let gone = self.kill_qemu(handle);
        // Its CID is free once no descriptor of its vhost device is left (QEMU's are
        // gone with it); otherwise it stays held.
        if let (true, Some(c)) = (gone, handle.guest_cid) {
            self.lock_cids().release(c, &handle.key.dir_name());
        }
        if let (Some(ranges), Some(base)) = (&self.config.uid_ranges, handle.host_uid) {
            if gone {
                ranges.release(base);
            } else {
                tracing::warn!(
                    uid = base,
                    pid = handle.init.pid,
                    "QEMU did not end: its uid stays taken until the worker exits"
                );
            }
        }
    }

    /// Ends QEMU and its cgroup; whether nothing of it runs now.
    fn kill_qemu(&self, handle: &SandboxHandle) -> bool {
        let gone = end_vmm(handle);
        for p in [handle.socket_path.clone(), qmp_socket(&handle.socket_path)] {
            let _ = std::fs::remove_file(p);
        }
        gone
    }
}

/// The QMP socket beside an execution's serial socket.
fn qmp_socket(serial: &Path) -> PathBuf {
    serial.with_extension("qmp")
}

impl Substrate for QemuDriver {
    fn kind(&self) -> SubstrateKind {
        SubstrateKind::Vm
    }

    /// A kept layer holding a memory snapshot (a migration's or a snapshot's, received
    /// as `<kept>/upper/`) is restored; one holding a disk (a relaunch after a crash)
    /// boots from it; otherwise a fresh disk is made.
    fn launch(&self, spec: &LaunchSpec) -> Result<SandboxHandle, SubstrateError> {
        let Some(kept) = received_snapshot(spec) else {
            return self.start(spec, None);
        };
        let snap = snapshot::VmSnapshot::open(&kept.join("upper"))?;
        let handle = self.start(spec, Some(&snap))?;
        // Restored: the new execution has its own copy of the disk; the kept
        // snapshot (its memory file as large as the guest's RAM) goes.
        if let Some(kept) = &spec.initial_upper {
            let _ = super::tree::remove_tree(kept);
        }
        Ok(handle)
    }
    fn pause(&self, handle: &SandboxHandle) -> Result<(), SubstrateError> {
        self.qmp(handle)?
            .execute("stop", None)
            .map_err(io_err("QMP stop"))?;
        Ok(())
    }

    fn resume(&self, handle: &SandboxHandle) -> Result<(), SubstrateError> {
        self.qmp(handle)?
            .execute("cont", None)
            .map_err(io_err("QMP cont"))?;
        Ok(())
    }

    fn destroy(&self, handle: &SandboxHandle) -> Result<(), SubstrateError> {
        self.kill(handle);
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
        // QEMU ends here; its uid goes back in `destroy` below, once, after the disk
        // is the worker's again.
        self.kill_qemu(handle);
        keep_disk(handle, keep_at)?;
        self.destroy(handle)
    }

    fn stats(&self, handle: &SandboxHandle) -> Result<SandboxStats, SubstrateError> {
        vmm_stats(handle)
    }

    fn service_socket(
        &self,
        _handle: &SandboxHandle,
    ) -> Result<std::os::fd::OwnedFd, SubstrateError> {
        Err(SubstrateError::Unsupported(
            "a VM's loopback is its guest kernel's, not in a namespace of the host: \
             netgtw reaches its ports through the guest's agent (ConnectPort)"
                .into(),
        ))
    }

    fn try_wait(&self, handle: &SandboxHandle) -> Result<Option<i32>, SubstrateError> {
        vmm_exit(handle)
    }
}
