//! The `vm` substrate: each execution in its own kernel, under QEMU (`microvm`, KVM
//! where a guest boots under it, software emulation otherwise).
//!
//! A launch renders the template to a read-only disk image once (shared), makes the
//! sandbox's writable disk (its size the disk limit), and starts QEMU in a cgroup of
//! its own with the Debian guest kernel ([`kernel`]), the initramfs this driver builds
//! ([`initramfs`]: the statically linked agent as `/init` and the modules it loads),
//! the two disks, a virtio-serial port on a Unix socket in the worker's run directory
//! (the agent's transport, served by QEMU: the recorded agent process is QEMU) and a
//! QMP socket for pause and resume (vCPUs stopped, memory kept). The bridge does the
//! rest (`spaced_host::serial`): it verifies QEMU as the socket's peer and sends the
//! activation record over the port before anything is served.

mod accel;
pub mod disk;
mod drain;
pub mod initramfs;
pub mod kernel;
pub mod qmp;
pub(crate) mod shared;
pub mod snapshot;
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
pub(crate) use shared::*;

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
}

/// Memory QEMU itself may use beyond the guest's RAM (its code, device state and, under
/// software emulation, the translation cache `tb-size` bounds).
const VMM_OVERHEAD: u64 = 192 << 20;
/// The translation cache under software emulation, in MiB.
const TB_SIZE_MIB: u64 = 16;
/// The guest console's ring buffer (a power of two).
const CONSOLE_BYTES: usize = 64 * 1024;

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
        Ok(Self {
            config,
            kernel,
            initramfs,
            cgroups,
            nic: rustix::process::geteuid().is_root(),
        })
    }

    /// The guest kernel's release.
    pub fn kernel_release(&self) -> &str {
        &self.kernel.release
    }

    /// Starts QEMU for `spec`: a fresh boot, or (with `restore`) the VM of a memory
    /// snapshot, loaded and continued (a new execution of the sandbox: the bridge
    /// gives its guest the new activation before anything is served).
    fn start(
        &self,
        spec: &LaunchSpec,
        restore: Option<&snapshot::VmSnapshot>,
    ) -> Result<SandboxHandle, SubstrateError> {
        spec.key.validate()?;
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
        let serial = run.join(format!("vm-{}.sock", spec.key.execution_id));
        let qmp_path = qmp_socket(&serial);
        for p in [&serial, &qmp_path] {
            let _ = std::fs::remove_file(p);
        }
        // QEMU's own messages (the guest's console is a ring inside QEMU, see below).
        let log_path = sandbox_dir.join("qemu.log");
        let (ram, cpus) = machine_size(&spec.limits);
        // A restored machine is the one its state was saved on, NIC or none.
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
        }
        .write(&sandbox_dir.join(snapshot::MACHINE))?;
        let accel = match self.config.accel {
            Accel::Kvm => "kvm".to_owned(),
            Accel::Tcg => format!("tcg,tb-size={TB_SIZE_MIB}"),
        };
        let cpu = match self.config.accel {
            Accel::Kvm => "host",
            Accel::Tcg => "max",
        };
        // The disks are opened here and handed to QEMU as descriptors, named by
        // `/proc/self/fd/N`: QEMU reopens an image to change its access (a
        // migration's end makes it read-only), and after dropping to the VM's uid it
        // could not reach them by path through the worker's 0700 data directory. A
        // reopen through the magic link checks only the file's own mode (the layers
        // are read-only to everyone, the disk is the VM uid's). QEMU's image locking
        // is off: it would set each reopened descriptor against its own earlier one,
        // and no other process opens these images while it runs.
        let mut disks = Vec::with_capacity(layers.len() + 1);
        for layer in &layers {
            disks.push(open_disk(layer, false)?);
        }
        let upper_fd = disks.len();
        disks.push(open_disk(&upper, true)?);
        let handed = crate::substrate::jail::spawn::for_qemu(&disks)
            .map_err(io_err("hand QEMU its disks"))?;
        let fd_number = |i: usize| std::os::fd::AsRawFd::as_raw_fd(&handed[i]);
        let drive = |fd: usize, id: &str, ro: bool| {
            format!(
                // An I/O error (a full host disk) is the guest's to see, not a pause
                // of the VM the worker would not know of.
                "file=/proc/self/fd/{},if=none,id={id},format=raw,readonly={},cache=none,aio=threads,werror=report,rerror=report,file.locking=off",
                fd_number(fd),
                if ro { "on" } else { "off" }
            )
        };
        let vmm_log = std::fs::File::create(&log_path).map_err(io_err("the QEMU log"))?;
        if let Some(base) = uid.base() {
            // Its own disk stays writable after the drop (QEMU may reopen it to
            // change its flags); the layers' images are read-only to everyone.
            std::os::unix::fs::fchown(&disks[upper_fd], Some(base), Some(base))
                .map_err(io_err("give the VM's disk to its uid"))?;
        }
        // After its devices are open QEMU drops to the VM's uid, with no capability
        // and no_new_privs: the drop needs set*id (so the seccomp filter allows them,
        // which can then raise nothing); without a uid, they are denied.
        let sandbox_opts = match uid.base() {
            Some(_) => "on,obsolete=deny,elevateprivileges=allow,spawn=deny,resourcecontrol=deny",
            None => "on,obsolete=deny,elevateprivileges=deny,spawn=deny,resourcecontrol=deny",
        };
        let mut cmd = Command::new(&self.config.qemu);
        // Guest RAM is never merged with other VMs' (KSM, where the host runs it, would
        // let one tenant time another's memory contents through shared pages) and
        // never written into a core dump of QEMU's.
        cmd.args(["-machine", "microvm,mem-merge=off,dump-guest-core=off"])
            .args(["-accel", &accel])
            .args(["-cpu", cpu])
            .args(["-m", &format!("{}M", ram >> 20)])
            .args(["-smp", &cpus.to_string()])
            .args(["-nodefaults", "-no-user-config", "-nographic", "-no-reboot"])
            // QEMU's own seccomp filter: no obsolete system calls, no privilege gain,
            // no spawning (snapshots go through descriptors the worker passes), no
            // scheduler or resource changes.
            .args(["-sandbox", sandbox_opts])
            .args(
                uid.base()
                    .map(|b| ["-runas".to_owned(), format!("{b}:{b}")])
                    .into_iter()
                    .flatten(),
            )
            .arg("-kernel")
            .arg(&self.kernel.vmlinuz)
            .arg("-initrd")
            .arg(&self.initramfs)
            .args([
                "-append",
                &kernel_command_line(self.config.accel, layers.len()),
            ])
            // The guest's console: a ring buffer of CONSOLE_BYTES in QEMU (read over
            // QMP), never a host file the guest could grow without end.
            .args([
                "-chardev",
                &format!("ringbuf,id=console,size={CONSOLE_BYTES}"),
            ])
            .args(["-serial", "chardev:console"])
            .args(["-device", "virtio-serial-device"])
            .args([
                "-chardev",
                &format!(
                    "socket,id=agent,path={},server=on,wait=off",
                    serial.display()
                ),
            ])
            .args([
                "-device",
                &format!(
                    "virtserialport,chardev=agent,name={}",
                    space_proto::vm::PORT_NAME
                ),
            ])
            .args((0..layers.len()).flat_map(|i| {
                [
                    "-drive".to_owned(),
                    drive(i, &format!("layer{i}"), true),
                    "-device".to_owned(),
                    format!(
                        "virtio-blk-device,drive=layer{i},serial={}",
                        space_proto::vm::layer_serial(i)
                    ),
                ]
            }))
            .args(["-drive", &drive(upper_fd, "upper", false)])
            .args([
                "-device",
                &format!(
                    "virtio-blk-device,drive=upper,serial={}",
                    space_proto::vm::UPPER_SERIAL
                ),
            ])
            .args(nic_args(nic))
            .args([
                "-qmp",
                &format!("unix:{},server=on,wait=off", qmp_path.display()),
            ])
            .args(
                restore
                    .map(snapshot::VmSnapshot::incoming_args)
                    .unwrap_or_default(),
            )
            .env_clear()
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(vmm_log);
        // The disks at their descriptors, and QEMU in a network namespace of its own
        // wherever the worker can give one (root), NIC or not: its NIC's connections
        // leave from there (through the sandbox's veth once the worker gives it one),
        // and QEMU itself reaches nothing of the host's network.
        crate::substrate::jail::spawn::qemu_child(&mut cmd, &handed, self.nic);
        let cgroups = match &self.cgroups {
            Some(h) => {
                let limits = Limits {
                    memory_bytes: Some(ram + VMM_OVERHEAD),
                    // Its block I/O thread pool (up to 64), main, RCU, I/O and
                    // vCPU threads.
                    pids_max: Some(128 + u64::from(cpus)),
                    cpu_millis: spec.limits.cpu_millis,
                    disk_bytes: None,
                };
                h.create(&self.config.cgroup_parent, &spec.key.dir_name(), &limits)?
            }
            None => CgroupSet::None,
        };
        let child = match cmd.spawn() {
            Ok(c) => c,
            Err(e) => {
                let _ = cgroups.remove();
                return Err(SubstrateError::io("start QEMU", e));
            }
        };
        let pid = child.id() as i32;
        // The child handle is dropped: destroy reaps it by PID. QEMU holds its own
        // copies of the disks now.
        drop(child);
        drop((handed, disks));
        let fail = |e: SubstrateError| {
            let _ = rustix::process::kill_process(
                rustix::process::Pid::from_raw(pid).expect("a child's PID is positive"),
                rustix::process::Signal::KILL,
            );
            reap(pid);
            let _ = cgroups.kill_all();
            let _ = cgroups.remove();
            e
        };
        if let Err(e) = cgroups.add_process(pid) {
            return Err(fail(e));
        }
        // QEMU creates both sockets before it runs the guest: once QMP answers, the
        // serial socket listens — and QEMU has dropped to the VM's uid, which its
        // recorded identity carries.
        let mut q = match qmp::Qmp::connect(&qmp_path, Duration::from_secs(10)) {
            Ok(q) => q,
            Err(e) => {
                let log = std::fs::read_to_string(&log_path).unwrap_or_default();
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
        if let Some(base) = uid.base() {
            let runs_as = space_peer::LiveProcess::open(pid as u32)
                .map(|l| l.identity.uid)
                .ok();
            if runs_as != Some(base) {
                return Err(fail(SubstrateError::InvalidSpec(format!(
                    "QEMU runs as uid {runs_as:?}, not the VM's {base}"
                ))));
            }
        }
        let started = match restore {
            Some(snap) => snap
                .memory()
                .map_err(|e| std::io::Error::other(e.to_string()))
                .and_then(|m| snapshot::finish_incoming(&mut q, &m)),
            None => q.status().map(drop),
        };
        if let Err(e) = started {
            return Err(fail(SubstrateError::io("QEMU did not start the guest", e)));
        }
        let socket_inode = match std::fs::metadata(&serial) {
            Ok(m) => std::os::unix::fs::MetadataExt::ino(&m),
            Err(e) => return Err(fail(SubstrateError::io("the serial socket", e))),
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
            init,
            agent: Some(init),
            socket_path: serial,
            socket_inode,
            sandbox_dir,
            upper_dir: upper,
            log_path,
            cgroups,
            host_uid: uid.keep(),
        })
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
                    "size": CONSOLE_BYTES,
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

/// QEMU's arguments for the guest's NIC: its user-mode network (every guest the same
/// addresses, [`space_proto::vm::GUEST_ADDR`] and its gateway), IPv4 only.
fn nic_args(nic: bool) -> Vec<String> {
    if !nic {
        return Vec::new();
    }
    vec![
        "-netdev".into(),
        format!(
            "user,id=net0,ipv6=off,net={},host={}",
            space_proto::vm::GUEST_NET,
            space_proto::vm::GUEST_GATEWAY
        ),
        "-device".into(),
        "virtio-net-device,netdev=net0".into(),
    ]
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
