//! What both VMM drivers (QEMU's and Firecracker's) share: ending a VMM and its
//! cgroup, keeping and checking a VM's disk, its exit and stats, the guest's
//! initramfs, the VM's uid lease and a kept disk given back on failure.

use std::path::{Path, PathBuf};
use std::time::Duration;

use super::super::{CgroupSet, SandboxHandle, SandboxStats, SubstrateError, io_err, tree};
use super::files::{open_single, own};
use super::{initramfs, kernel};

/// The kept layer of `spec` if it is a VM snapshot this worker received: only a
/// layer so marked is one (the mark is beside `upper/`, where the sandbox's own files
/// never are), so a jail's files holding a `vm.json` are never loaded into a VMM.
pub(crate) fn received_snapshot(spec: &super::super::LaunchSpec) -> Option<&PathBuf> {
    spec.initial_upper.as_ref().filter(|k| {
        std::fs::symlink_metadata(k.join(super::snapshot::RECEIVED_MARK)).is_ok_and(|m| m.is_file())
    })
}

/// Ends a VM's VMM process (the recorded one: through a pidfd, never a reused PID)
/// and everything in its cgroup; whether nothing of it runs now. Shared by the QEMU
/// and Firecracker drivers.
pub(crate) fn end_vmm(handle: &SandboxHandle) -> bool {
    if let Ok(live) = space_peer::LiveProcess::open(handle.init.pid as u32) {
        if live.identity.start_time == handle.init.start_time {
            let _ = rustix::process::pidfd_send_signal(&live.pidfd, rustix::process::Signal::KILL);
        }
    }
    reap(handle.init.pid);
    let mut empty = true;
    if !matches!(handle.cgroups, CgroupSet::None) {
        let _ = handle.cgroups.kill_all();
        empty = handle.cgroups.wait_empty().is_ok();
        let _ = handle.cgroups.remove();
    }
    empty && !handle.init.is_alive()
}

/// Moves a stopped VM's writable disk to `keep_at/upper.ext4`, the worker's again;
/// shared by both VMM drivers' `destroy_keeping_layer`.
pub(crate) fn keep_disk(handle: &SandboxHandle, keep_at: &Path) -> Result<(), SubstrateError> {
    // A kept layer only where there is a disk to keep (the worker made the path:
    // never through a link).
    // One link only: a VMM that hard-linked another file there gets nothing kept.
    // Checked and given back by descriptor (opened without following a link), and the
    // name moved is checked to be that file.
    let Ok(disk) = open_single(&handle.upper_dir) else {
        return Ok(());
    };
    // The worker's again: whoever takes the VM's uid next has no claim on it.
    if handle.host_uid.is_some() {
        own(&disk).map_err(io_err("take the kept VM disk back"))?;
    }
    std::fs::create_dir_all(keep_at).map_err(io_err("the kept layer directory"))?;
    let kept = keep_at.join("upper.ext4");
    std::fs::rename(&handle.upper_dir, &kept).map_err(io_err("keep the VM disk"))?;
    if !same_file(&disk, &kept) {
        let _ = tree::remove_tree(&kept);
        return Err(SubstrateError::InvalidSpec(
            "the VM disk changed while it was kept".into(),
        ));
    }
    Ok(())
}

/// Whether the name `path` (not followed) is `file`.
pub(crate) fn same_file(file: &std::fs::File, path: &Path) -> bool {
    use std::os::unix::fs::MetadataExt as _;
    match (file.metadata(), std::fs::symlink_metadata(path)) {
        (Ok(a), Ok(b)) => (a.dev(), a.ino()) == (b.dev(), b.ino()),
        _ => false,
    }
}

/// A VM's exit status once its VMM (this process's child) has exited; shared by both
/// VMM drivers' `try_wait`.
pub(crate) fn vmm_exit(handle: &SandboxHandle) -> Result<Option<i32>, SubstrateError> {
    use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};
    match waitpid(
        nix::unistd::Pid::from_raw(handle.init.pid),
        Some(WaitPidFlag::WNOHANG),
    ) {
        Ok(WaitStatus::Exited(_, code)) => Ok(Some(code)),
        Ok(WaitStatus::Signaled(_, sig, _)) => Ok(Some(128 + sig as i32)),
        Ok(_) => Ok(None),
        Err(nix::errno::Errno::ECHILD) => Ok((!handle.init.is_alive()).then_some(-1)),
        Err(e) => Err(SubstrateError::io("wait for the VMM", e.into())),
    }
}

/// A VM's usage (its VMM's cgroup) and liveness; shared by both VMM drivers.
pub(crate) fn vmm_stats(handle: &SandboxHandle) -> Result<SandboxStats, SubstrateError> {
    let cgroup = match handle.cgroups {
        CgroupSet::None => Default::default(),
        ref c => c.stats()?,
    };
    Ok(SandboxStats {
        cgroup,
        running: handle.init.is_alive(),
    })
}

/// The guest's initramfs for `agent` and `kernel` under `data_dir/vm` (the agent as
/// `/init` and the kernel's modules), written once per agent binary and kernel; shared
/// by both VMM drivers.
pub(crate) fn guest_initramfs(
    agent: &Path,
    kernel: &kernel::GuestKernel,
    data_dir: &Path,
) -> Result<PathBuf, SubstrateError> {
    let agent = std::fs::read(agent).map_err(io_err("read the guest agent"))?;
    let mut modules = Vec::new();
    for (name, path) in &kernel.modules {
        modules.push((
            name.clone(),
            std::fs::read(path).map_err(io_err("read a guest module"))?,
        ));
    }
    let mut h = blake3::Hasher::new();
    h.update(&agent);
    h.update(kernel.release.as_bytes());
    for (name, bytes) in &modules {
        h.update(name.as_bytes());
        h.update(bytes);
    }
    let dir = data_dir.join("vm");
    std::fs::create_dir_all(&dir).map_err(io_err("the VM directory"))?;
    let initramfs = dir.join(format!("initramfs-{}.cpio", &h.finalize().to_hex()[..16]));
    if !initramfs.is_file() {
        initramfs::write_file(&initramfs, &agent, &modules)
            .map_err(io_err("write the guest initramfs"))?;
    }
    Ok(initramfs)
}

/// A VM's QEMU uid while its start is under way: given back when dropped unless kept.
pub(crate) struct VmUid {
    ranges: Option<std::sync::Arc<super::super::jail::uid_ranges::UidRanges>>,
    base: Option<u32>,
}

impl VmUid {
    pub(crate) fn take(
        ranges: Option<&std::sync::Arc<super::super::jail::uid_ranges::UidRanges>>,
    ) -> Result<Self, SubstrateError> {
        let base = ranges.map(|r| r.allocate()).transpose()?;
        Ok(Self {
            ranges: ranges.cloned(),
            base,
        })
    }

    pub(crate) fn base(&self) -> Option<u32> {
        self.base
    }

    /// The uid, now the started VM's (released by its destroy).
    pub(crate) fn keep(mut self) -> Option<u32> {
        self.base.take()
    }
}

impl Drop for VmUid {
    fn drop(&mut self) {
        if let (Some(r), Some(b)) = (&self.ranges, self.base) {
            r.release(b);
        }
    }
}

/// A kept writable disk moved into a starting VM's directory: moved back when dropped
/// before [`KeptDisk::started`].
pub(crate) struct KeptDisk {
    pub(crate) from: PathBuf,
    pub(crate) to: PathBuf,
}

impl KeptDisk {
    pub(crate) fn started(&mut self) {
        self.from = PathBuf::new();
    }
}

impl Drop for KeptDisk {
    /// Back only as the plain single-link file it was, the worker's again (the VM's
    /// uid may have owned it, and goes to another VM next); anything else stays to be
    /// removed with the VM's directory.
    fn drop(&mut self) {
        if self.from.as_os_str().is_empty() {
            return;
        }
        let Ok(disk) = open_single(&self.from) else {
            return;
        };
        if own(&disk).is_ok()
            && std::fs::rename(&self.from, &self.to).is_ok()
            && !same_file(&disk, &self.to)
        {
            let _ = tree::remove_tree(&self.to);
        }
    }
}

/// Reaps `pid` if it is this process's exited child (QEMU, once killed).
pub(crate) fn reap(pid: i32) {
    use nix::sys::wait::{WaitPidFlag, waitpid};
    let pid = nix::unistd::Pid::from_raw(pid);
    for _ in 0..200 {
        match waitpid(pid, Some(WaitPidFlag::WNOHANG)) {
            Ok(nix::sys::wait::WaitStatus::StillAlive) => {
                std::thread::sleep(Duration::from_millis(10));
            }
            _ => return,
        }
    }
}

/// An image for QEMU: read-only, or read-write (the sandbox's disk); never through a
/// symlink (the worker made every one of them, nothing else should be there).
pub(crate) fn open_disk(
    path: &Path,
    writable: bool,
) -> Result<std::os::fd::OwnedFd, SubstrateError> {
    use std::os::unix::fs::OpenOptionsExt as _;
    std::fs::OpenOptions::new()
        .read(true)
        .write(writable)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)
        .map(std::os::fd::OwnedFd::from)
        .map_err(io_err(format!("open the VM disk {}", path.display())))
}

/// What a probe VM (`child`, its console on stdout) printed within `wait` — at most
/// `max_output` bytes — once it has ended or been killed; and the last line it printed
/// (`nothing` if none), cut to 120 characters, to say where a boot stopped.
pub(crate) fn probe_output(
    mut child: std::process::Child,
    max_output: usize,
    wait: Duration,
) -> (String, String) {
    use std::io::Read as _;
    let mut stdout = child.stdout.take();
    let reader = std::thread::spawn(move || {
        let mut kept = Vec::new();
        let mut buf = [0u8; 4096];
        while let Some(out) = stdout.as_mut() {
            match out.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    let room = max_output.saturating_sub(kept.len());
                    kept.extend_from_slice(&buf[..n.min(room)]);
                }
            }
        }
        kept
    });
    let deadline = std::time::Instant::now() + wait;
    while std::time::Instant::now() < deadline {
        if matches!(child.try_wait(), Ok(Some(_))) {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = child.kill();
    let _ = child.wait();
    let output = reader.join().unwrap_or_default();
    let text = String::from_utf8_lossy(&output).into_owned();
    let last = text
        .lines()
        .map(str::trim)
        .rfind(|l| !l.is_empty())
        .unwrap_or("nothing")
        .chars()
        .take(120)
        .collect::<String>();
    (text, last)
}
