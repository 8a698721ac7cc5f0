//! Memory snapshots: a VM's RAM and device state written by QEMU's migration into a
//! pipe the worker passed over QMP (`getfd`, then `fd:` migration: QEMU spawns nothing,
//! and its seccomp filter denies spawning) and drains into a file of its own
//! ([`super::drain`]), with a copy of its writable disk and the
//! machine it ran on. Restoring starts a new QEMU with the same machine, loads the
//! state (`-incoming`) and continues it: every process of the guest goes on with its
//! memory. It is a new execution: the new bridge gives the guest the new activation
//! (the old link ends when the restored guest finds no host on its port), so nothing
//! the old execution was authorized for reaches it.
//!
//! The disk image is the guest's own bytes: the host copies it as a blob and never
//! mounts it.

use std::io;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use serde_json::json;

use super::drain::Drain;
use super::qmp::Qmp;
use super::transport::AgentTransport;
use crate::substrate::{LaunchSpec, Limits, SandboxHandle, SubstrateError, io_err};

/// Least guest RAM.
const MIN_RAM: u64 = 128 << 20;

/// Guest RAM and vCPUs for `limits`.
pub fn machine_size(limits: &Limits) -> (u64, u32) {
    let ram = limits.memory_bytes.unwrap_or(512 << 20).max(MIN_RAM);
    let cpus = limits.cpu_millis.map_or(1, |m| m.div_ceil(1000).max(1));
    (ram, cpus)
}

/// The RAM and device state.
pub const MEMORY: &str = "memory";
/// The writable disk.
pub const DISK: &str = "upper.ext4";
/// The machine ([`Machine`], JSON).
pub const MACHINE: &str = "vm.json";
/// Firecracker's device and vCPU state (its `snapshot_path`), beside [`MEMORY`] (its
/// `mem_file_path`: the guest's RAM alone) in a Firecracker VM's snapshot.
pub const VMSTATE: &str = "vmstate";
/// Beside a kept layer's `upper/`: it is a VM snapshot this worker received (written
/// by the receiving VM worker, never by a sandbox).
pub const RECEIVED_MARK: &str = "vm-snapshot";
/// Largest machine file read.
const MAX_MACHINE: u64 = 16 * 1024;
/// How long a migration to or from a file may take.
const MIGRATION_WAIT: Duration = Duration::from_secs(300);

/// What a memory snapshot's stream may hold beyond the guest's RAM: QEMU's page
/// headers (a few bytes a page, see [`stream_bound`]) and the devices' state.
const MAX_DEVICE_STATE: u64 = 64 << 20;

/// The most bytes QEMU's migration stream of a guest with `ram` can hold: every page
/// whole with its header, and the devices' state.
fn stream_bound(ram: u64) -> u64 {
    ram + ram / 256 + MAX_DEVICE_STATE
}

/// What a restore must reproduce exactly (QEMU refuses state of another machine).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Machine {
    /// Guest RAM, bytes.
    pub ram: u64,
    /// vCPUs.
    pub cpus: u32,
    /// The template's layer images, top first (their file names in the images
    /// directory, comma-separated; see [`image_names`]).
    pub root_image: String,
    /// The guest kernel's release.
    pub kernel: String,
    /// Whether it has the NIC (QEMU's user-mode network in the execution's network
    /// namespace); machines of snapshots taken before VMs had one do not.
    #[serde(default)]
    pub nic: bool,
    /// The VMM whose state the snapshot holds: one VMM never loads another's. Absent
    /// (and not written) for QEMU, as machines were before Firecracker's.
    #[serde(default, skip_serializing_if = "Vmm::is_qemu")]
    pub vmm: Vmm,
    /// How a QEMU machine's agent is reached — its device set, which a restore must
    /// reproduce: a snapshot taken over vhost-vsock restores only over vhost-vsock.
    /// Absent (and not written) for the serial port, as machines were before
    /// vhost-vsock; Firecracker's machines always have its hybrid vsock.
    #[serde(default, skip_serializing_if = "AgentTransport::is_serial")]
    pub transport: AgentTransport,
}

/// Which VMM ran a machine.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Vmm {
    /// QEMU (`microvm`): its migration stream in [`MEMORY`].
    #[default]
    Qemu,
    /// Firecracker: its state in [`VMSTATE`], the guest's RAM in [`MEMORY`].
    Firecracker,
}

impl Vmm {
    fn is_qemu(&self) -> bool {
        *self == Self::Qemu
    }
}

impl Machine {
    /// Reads a machine file.
    pub fn read(path: &Path) -> Result<Self, SubstrateError> {
        use std::io::Read;
        let mut bytes = Vec::new();
        std::fs::File::open(path)
            .and_then(|f| f.take(MAX_MACHINE + 1).read_to_end(&mut bytes))
            .map_err(io_err("read a VM machine file"))?;
        if bytes.len() as u64 > MAX_MACHINE {
            return Err(SubstrateError::InvalidSpec(
                "VM machine file too long".into(),
            ));
        }
        serde_json::from_slice(&bytes)
            .map_err(|e| SubstrateError::InvalidSpec(format!("VM machine file: {e}")))
    }

    /// Writes it.
    pub fn write(&self, path: &Path) -> Result<(), SubstrateError> {
        let bytes = serde_json::to_vec(self).unwrap_or_default();
        std::fs::write(path, bytes).map_err(io_err("write a VM machine file"))
    }
}

/// The file names of `layers`' images, top first, comma-separated (a machine's
/// `root_image`).
pub fn image_names(layers: &[PathBuf]) -> String {
    layers
        .iter()
        .map(|l| file_name(l))
        .collect::<Vec<_>>()
        .join(",")
}

/// A memory snapshot on disk.
#[derive(Debug, Clone)]
pub struct VmSnapshot {
    dir: PathBuf,
    /// Its machine.
    pub machine: Machine,
}

impl VmSnapshot {
    /// The snapshot in `dir` (its three files present).
    pub fn open(dir: &Path) -> Result<Self, SubstrateError> {
        let machine = Machine::read(&dir.join(MACHINE))?;
        let files: &[&str] = match machine.vmm {
            Vmm::Qemu => &[MEMORY, DISK],
            Vmm::Firecracker => &[MEMORY, DISK, VMSTATE],
        };
        for &f in files {
            let plain = std::fs::symlink_metadata(dir.join(f)).is_ok_and(|m| m.is_file());
            if !plain {
                return Err(SubstrateError::InvalidSpec(format!(
                    "the snapshot in {} has no {f}",
                    dir.display()
                )));
            }
        }
        Ok(Self {
            dir: dir.to_path_buf(),
            machine,
        })
    }

    /// The snapshot's directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Checks that `spec` (its limits) and the template's `root` image make the
    /// machine the snapshot was taken on, under `vmm`.
    pub(crate) fn check_fits(
        &self,
        spec: &LaunchSpec,
        layers: &[PathBuf],
        kernel: &str,
        vmm: Vmm,
    ) -> Result<&Self, SubstrateError> {
        if self.machine.vmm != vmm {
            return Err(SubstrateError::InvalidSpec(format!(
                "the snapshot is {:?}'s state; this worker's VMM is {vmm:?}",
                self.machine.vmm
            )));
        }
        let (ram, cpus) = machine_size(&spec.limits);
        let image = image_names(layers);
        if self.machine.kernel != kernel {
            return Err(SubstrateError::InvalidSpec(format!(
                "the snapshot ran on kernel {}, this worker's is {kernel}",
                self.machine.kernel
            )));
        }
        if (ram, cpus, image.as_str())
            != (
                self.machine.ram,
                self.machine.cpus,
                self.machine.root_image.as_str(),
            )
        {
            return Err(SubstrateError::InvalidSpec(format!(
                "the snapshot ran on {} MiB, {} vCPUs, root {}; this launch is {} MiB, {cpus} vCPUs, root {image}",
                self.machine.ram >> 20,
                self.machine.cpus,
                self.machine.root_image,
                ram >> 20
            )));
        }
        // The disk is the guest's of the sandbox's disk limit, whatever length the
        // snapshot's file says (it came from another worker).
        let want = spec.limits.disk_bytes.unwrap_or(1 << 30).div_ceil(1 << 20) << 20;
        let got = std::fs::symlink_metadata(self.dir.join(DISK))
            .map_err(io_err("the snapshot's disk"))?
            .len();
        if got != want {
            return Err(SubstrateError::InvalidSpec(format!(
                "the snapshot's disk is {got} bytes; this sandbox's is {want}"
            )));
        }
        Ok(self)
    }

    /// Copies the snapshot's disk to `to` (sparse: unwritten blocks stay holes).
    pub(crate) fn copy_disk_to(&self, to: &Path) -> Result<(), SubstrateError> {
        copy_sparse(&self.dir.join(DISK), to)
    }

    /// QEMU's arguments to wait, stopped, for this snapshot's state (given over QMP by
    /// [`finish_incoming`]).
    pub(super) fn incoming_args(&self) -> Vec<String> {
        vec!["-S".into(), "-incoming".into(), "defer".into()]
    }

    /// The state file, opened read-only, without following a link, only as a plain
    /// file of one link.
    pub(super) fn memory(&self) -> Result<std::fs::File, SubstrateError> {
        super::files::open_single(&self.dir.join(MEMORY))
            .map_err(io_err("open the VM memory snapshot"))
    }
}

fn file_name(p: &Path) -> String {
    p.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
}

/// Copies `from` to `to` keeping holes (and sharing blocks where the filesystem can).
pub(crate) fn copy_sparse(from: &Path, to: &Path) -> Result<(), SubstrateError> {
    let out = Command::new("cp")
        .args(["--sparse=always", "--reflink=auto"])
        .arg(from)
        .arg(to)
        .output()
        .map_err(io_err("copy a VM disk"))?;
    if !out.status.success() {
        return Err(SubstrateError::io(
            "copy a VM disk",
            io::Error::other(String::from_utf8_lossy(&out.stderr).trim().to_owned()),
        ));
    }
    Ok(())
}

/// After `-incoming defer`: hands QEMU the state file, waits for it to load, then
/// continues the guest.
pub(super) fn finish_incoming(q: &mut Qmp, memory: &std::fs::File) -> io::Result<()> {
    use std::os::fd::AsFd;
    q.execute_with_fd(
        "getfd",
        Some(json!({ "fdname": "incoming" })),
        Some(memory.as_fd()),
    )?;
    q.execute("migrate-incoming", Some(json!({ "uri": "fd:incoming" })))?;
    let deadline = Instant::now() + MIGRATION_WAIT;
    loop {
        let status = q.status()?;
        match status.as_str() {
            "inmigrate" => {}
            "prelaunch" | "paused" => break,
            other => {
                return Err(io::Error::other(format!(
                    "loading the snapshot left the VM {other}"
                )));
            }
        }
        if Instant::now() > deadline {
            return Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "the snapshot did not load",
            ));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    q.execute("cont", None)?;
    match q.status()?.as_str() {
        "running" => Ok(()),
        other => Err(io::Error::other(format!("the restored VM is {other}"))),
    }
}

/// Writes a memory snapshot of `handle`'s VM into `dir` (created) over `q`: its vCPUs
/// stop first and stay stopped (see [`super::QemuDriver::snapshot`]).
pub(super) fn take(
    q: &mut Qmp,
    handle: &SandboxHandle,
    dir: &Path,
) -> Result<VmSnapshot, SubstrateError> {
    std::fs::create_dir_all(dir).map_err(io_err("the snapshot directory"))?;
    let machine = Machine::read(&handle.sandbox_dir.join(MACHINE))?;
    q.execute("stop", None).map_err(io_err("QMP stop"))?;
    // QEMU writes the state into a pipe the worker drains into its own file: it never
    // holds a descriptor on the snapshot (an escaped QEMU could otherwise keep one and
    // change or grow the file after the worker took it), and what it sends is bounded.
    use std::os::unix::fs::OpenOptionsExt as _;
    let memory = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(dir.join(MEMORY))
        .map_err(io_err("create the VM memory snapshot"))?;
    let (from_qemu, to_worker) = rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC)
        .map_err(|e| SubstrateError::io("a pipe for the memory snapshot", io::Error::from(e)))?;
    let deadline = Instant::now() + MIGRATION_WAIT;
    let drain = Drain::start(from_qemu, memory, stream_bound(machine.ram), deadline);
    {
        use std::os::fd::AsFd;
        q.execute_with_fd(
            "getfd",
            Some(json!({ "fdname": "snapshot" })),
            Some(to_worker.as_fd()),
        )
        .map_err(io_err("QMP getfd"))?;
    }
    drop(to_worker);
    let migrated = migrate(q, deadline);
    // Whatever came, the drain ends: at the end of the stream, or once the pipe is
    // quiet after the migration ended (a QEMU keeping its end open sends no more).
    let drained = drain.finish();
    migrated?;
    drained?;
    // Stopped, its disks flushed by the migration's end: the disk is consistent. The
    // disk is QEMU's, open for writing in it: copied from a descriptor, at most the
    // length it had, within the deadline.
    super::files::copy_plain(&handle.upper_dir, &dir.join(DISK), None, deadline)?;
    machine.write(&dir.join(MACHINE))?;
    VmSnapshot::open(dir)
}

/// Starts QEMU's migration to the descriptor named `snapshot` and waits for its end.
fn migrate(q: &mut Qmp, deadline: Instant) -> Result<(), SubstrateError> {
    q.execute("migrate", Some(json!({ "uri": "fd:snapshot" })))
        .map_err(io_err("QMP migrate"))?;
    loop {
        let m = q
            .execute("query-migrate", None)
            .map_err(io_err("QMP query-migrate"))?;
        match m["status"].as_str().unwrap_or_default() {
            "completed" => return Ok(()),
            "failed" | "cancelled" => {
                return Err(SubstrateError::io(
                    "the memory snapshot",
                    io::Error::other(format!("migration {}: {}", m["status"], m["error-desc"])),
                ));
            }
            _ => {}
        }
        if Instant::now() > deadline {
            let _ = q.execute("migrate_cancel", None);
            return Err(SubstrateError::Timeout("the memory snapshot".into()));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn machine(transport: AgentTransport) -> Machine {
        Machine {
            ram: 256 << 20,
            cpus: 1,
            root_image: "layer-a.ext4".into(),
            kernel: "6.1.0-1-cloud-amd64".into(),
            nic: false,
            vmm: Vmm::Qemu,
            transport,
        }
    }

    #[test]
    fn a_machines_transport_survives_its_record_and_serial_is_left_out() {
        let t = tempfile::tempdir().unwrap();
        let path = t.path().join(MACHINE);
        for transport in [AgentTransport::Serial, AgentTransport::VhostVsock] {
            let m = machine(transport);
            m.write(&path).unwrap();
            assert_eq!(Machine::read(&path).unwrap(), m);
            let text = std::fs::read_to_string(&path).unwrap();
            assert_eq!(
                text.contains("\"transport\":\"vhost_vsock\""),
                transport == AgentTransport::VhostVsock,
                "{text}"
            );
            assert_eq!(
                text.contains("transport"),
                transport != AgentTransport::Serial
            );
        }
        // A record written before vhost-vsock is a serial machine's.
        std::fs::write(
            &path,
            r#"{"ram":268435456,"cpus":1,"root_image":"layer-a.ext4","kernel":"6.1.0-1-cloud-amd64","nic":false}"#,
        )
        .unwrap();
        assert_eq!(
            Machine::read(&path).unwrap(),
            machine(AgentTransport::Serial)
        );
        // A transport this worker does not know is refused, not taken for serial.
        std::fs::write(
            &path,
            r#"{"ram":268435456,"cpus":1,"root_image":"x","kernel":"k","transport":"vsock_over_carrier_pigeon"}"#,
        )
        .unwrap();
        assert!(Machine::read(&path).is_err());
    }
}
