//! Memory snapshots under Firecracker, in the QEMU driver's layout
//! (`substrate::vm::snapshot`: `vm.json`, `memory`, `upper.ext4`) plus Firecracker's
//! device and vCPU state (`vmstate`), so that packing, transfer and unpacking carry it
//! unchanged.
//!
//! Taking one: the VM is paused, Firecracker writes a full snapshot into its own
//! directory (as the VM's uid: names it cannot have been given before, see
//! [`requests::NEW_VMSTATE`]), the worker moves both files into the snapshot's
//! directory and makes them its own, and copies the (stopped, flushed) disk sparsely.
//!
//! Loading one: the new execution's directory gets links of the snapshot's state and
//! memory under the names the load reads, readable by the new VM's uid; once
//! Firecracker has loaded them (the memory mapped privately: the guest's writes never
//! reach the file) the names go, so nothing the restored VM writes later lands in the
//! snapshot's files.

use std::path::Path;
use std::time::{Duration, Instant};

use super::api::Api;
use super::requests;
use crate::substrate::vm::snapshot::{self as vmsnap, Machine, VmSnapshot, Vmm};
use crate::substrate::{SandboxHandle, SubstrateError, io_err};

/// The longest a snapshot's disk copy may take (a disk of the largest limit, sparse,
/// on a slow disk).
const DISK_COPY_WAIT: Duration = Duration::from_secs(600);

/// Writes a snapshot of the VM behind `api` (its Firecracker directory `fc`) into
/// `dir`; the VM stays paused.
pub(super) fn take(
    api: &Api,
    handle: &SandboxHandle,
    fc: &Path,
    dir: &Path,
    wait: Duration,
) -> Result<VmSnapshot, SubstrateError> {
    let machine = Machine::read(&handle.sandbox_dir.join(vmsnap::MACHINE))?;
    if machine.vmm != Vmm::Firecracker {
        return Err(SubstrateError::InvalidSpec(
            "not a Firecracker VM's machine".into(),
        ));
    }
    std::fs::create_dir_all(dir).map_err(io_err("the snapshot directory"))?;
    let refused = |what: &str, e: super::api::ApiError| {
        SubstrateError::io(what.to_owned(), std::io::Error::other(e.to_string()))
    };
    // Paused first unless it already is (the worker freezes an execution before
    // its snapshot).
    let state = api.state().map_err(|e| refused("the VM's state", e))?;
    if state != "Paused" {
        let (method, path, body) = requests::vm_state(true);
        api.ok(method, &path, Some(&body))
            .map_err(|e| refused("pause the VM", e))?;
    }
    for name in [requests::NEW_VMSTATE, requests::NEW_MEMORY] {
        let _ = std::fs::remove_file(fc.join(name));
    }
    let (method, path, body) = requests::snapshot_create();
    let written = api.with_timeout(wait).ok(method, &path, Some(&body));
    if let Err(e) = written {
        for name in [requests::NEW_VMSTATE, requests::NEW_MEMORY] {
            let _ = std::fs::remove_file(fc.join(name));
        }
        return Err(refused("the memory snapshot", e));
    }
    for (from, to) in [
        (requests::NEW_VMSTATE, vmsnap::VMSTATE),
        (requests::NEW_MEMORY, vmsnap::MEMORY),
    ] {
        take_file(&fc.join(from), &dir.join(to))?;
    }
    // Paused, its disk flushed by the snapshot: the disk is consistent.
    copy_disk(
        &handle.upper_dir,
        &dir.join(vmsnap::DISK),
        Instant::now() + DISK_COPY_WAIT,
    )?;
    machine.write(&dir.join(vmsnap::MACHINE))?;
    VmSnapshot::open(dir)
}

/// Moves a file Firecracker wrote (as the VM's uid) to `to`, the worker's own and
/// private to it. Whatever is at `from` is moved first (into the worker's directory,
/// out of the VM uid's reach), then checked: a plain file with one link, else it is
/// dropped — never a link Firecracker could have left to make the worker change or
/// ship another file.
fn take_file(from: &Path, to: &Path) -> Result<(), SubstrateError> {
    let _ = crate::substrate::tree::remove_tree(to);
    // Not even moved unless it looks like a plain file now (a directory of the VM
    // uid's would otherwise land in the snapshot); checked again by descriptor below,
    // and whatever it turns out to be is removed as a tree, never through a link.
    if !std::fs::symlink_metadata(from).is_ok_and(|m| m.is_file()) {
        let _ = crate::substrate::tree::remove_tree(from);
        return Err(SubstrateError::InvalidSpec(format!(
            "{} is not a plain file",
            from.display()
        )));
    }
    std::fs::rename(from, to).map_err(io_err("take a snapshot file"))?;
    let own = || -> Result<(), SubstrateError> {
        let file = open_plain(to)?;
        let me = rustix::process::geteuid().as_raw();
        let my_gid = rustix::process::getegid().as_raw();
        std::os::unix::fs::fchown(&file, Some(me), Some(my_gid))
            .map_err(io_err("own a snapshot file"))?;
        file.set_permissions(std::os::unix::fs::PermissionsExt::from_mode(0o600))
            .map_err(io_err("a snapshot file's mode"))
    };
    own().inspect_err(|_| {
        let _ = crate::substrate::tree::remove_tree(to);
    })
}

/// `path` opened read-only without following a link, and only if it is a plain file
/// with one link.
fn open_plain(path: &Path) -> Result<std::fs::File, SubstrateError> {
    use std::os::unix::fs::{MetadataExt as _, OpenOptionsExt as _};
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC | libc::O_NONBLOCK)
        .open(path)
        .map_err(io_err(format!("open {}", path.display())))?;
    let m = file.metadata().map_err(io_err("a snapshot file"))?;
    if !m.is_file() || m.nlink() != 1 {
        return Err(SubstrateError::InvalidSpec(format!(
            "{} is not a plain file of one link",
            path.display()
        )));
    }
    Ok(file)
}

/// Copies the VM's disk (in the VM uid's directory, which it could change under the
/// copy) sparsely to `to`: from a descriptor of the plain file opened without
/// following a link, only its data extents (holes stay holes), at most the length it
/// had when opened (a file the VMM grows during the copy gets no further), and within
/// `deadline`.
fn copy_disk(disk: &Path, to: &Path, deadline: Instant) -> Result<(), SubstrateError> {
    use std::os::unix::fs::{FileExt as _, OpenOptionsExt as _};
    let from = open_plain(disk)?;
    let len = from.metadata().map_err(io_err("a VM disk"))?.len();
    let _ = std::fs::remove_file(to);
    let out = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(to)
        .map_err(io_err("the snapshot's disk"))?;
    out.set_len(len).map_err(io_err("the snapshot's disk"))?;
    let late =
        || SubstrateError::Timeout(format!("copying the VM disk ({len} bytes) took too long"));
    let mut pos = 0;
    let mut buf = vec![0u8; 1 << 20];
    while pos < len {
        let data = match rustix::fs::seek(&from, rustix::fs::SeekFrom::Data(pos)) {
            Ok(d) => d,
            // No data after `pos`: the rest is a hole.
            Err(rustix::io::Errno::NXIO) => break,
            Err(e) => return Err(SubstrateError::io("read a VM disk", e.into())),
        };
        if data >= len {
            break;
        }
        let hole = rustix::fs::seek(&from, rustix::fs::SeekFrom::Hole(data))
            .unwrap_or(len)
            .min(len);
        let mut at = data;
        while at < hole {
            if Instant::now() > deadline {
                return Err(late());
            }
            let want = ((hole - at) as usize).min(buf.len());
            let n = from
                .read_at(&mut buf[..want], at)
                .map_err(io_err("read a VM disk"))?;
            if n == 0 {
                // Shortened under the copy: the rest stays zero.
                break;
            }
            out.write_all_at(&buf[..n], at)
                .map_err(io_err("write the snapshot's disk"))?;
            at += n as u64;
        }
        pos = hole.max(at);
    }
    out.sync_all().map_err(io_err("the snapshot's disk"))?;
    Ok(())
}

/// Puts `snap`'s state and memory into the new execution's directory `fc` under the
/// names the load reads: links of the snapshot's files where they are on the same
/// filesystem (readable by the VM's uid: their mode is opened to reading, their
/// directories stay closed to every other uid), copies (the VM uid's) otherwise.
pub(super) fn stage_for_load(
    snap: &VmSnapshot,
    fc: &Path,
    uid: Option<u32>,
) -> Result<(), SubstrateError> {
    for (from, to) in [
        (vmsnap::VMSTATE, requests::VMSTATE),
        (vmsnap::MEMORY, requests::MEMORY),
    ] {
        let (from, to) = (snap.dir().join(from), fc.join(to));
        let plain = std::fs::symlink_metadata(&from).is_ok_and(|m| m.is_file());
        if !plain {
            return Err(SubstrateError::InvalidSpec(format!(
                "the snapshot has no plain {}",
                from.display()
            )));
        }
        if std::fs::hard_link(&from, &to).is_ok() {
            std::fs::set_permissions(&to, std::os::unix::fs::PermissionsExt::from_mode(0o444))
                .map_err(io_err("a snapshot file's mode"))?;
        } else {
            vmsnap::copy_sparse(&from, &to)?;
            if let Some(base) = uid {
                std::os::unix::fs::lchown(&to, Some(base), Some(base))
                    .map_err(io_err("give the VM its snapshot files"))?;
            }
        }
    }
    Ok(())
}

/// Removes the names [`stage_for_load`] made (after the load, or after it failed), and
/// closes `snap`'s state and memory to all but the worker again: a link shares its
/// inode's mode, which the staging opened to reading (guest RAM stays 0600 in the
/// snapshot, whatever packs or moves it next).
pub(super) fn unstage(fc: &Path, snap: &VmSnapshot) {
    for name in [requests::VMSTATE, requests::MEMORY] {
        let _ = std::fs::remove_file(fc.join(name));
    }
    for name in [vmsnap::VMSTATE, vmsnap::MEMORY] {
        if let Ok(file) = crate::substrate::vm::open_single(&snap.dir().join(name)) {
            let _ = file.set_permissions(std::os::unix::fs::PermissionsExt::from_mode(0o600));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt as _;

    #[test]
    fn the_disk_is_copied_with_its_holes_only_from_a_plain_file() {
        let t = tempfile::tempdir().unwrap();
        let disk = t.path().join("upper.ext4");
        let f = std::fs::File::create(&disk).unwrap();
        f.set_len(64 << 20).unwrap();
        std::os::unix::fs::FileExt::write_at(&f, b"data", 1 << 20).unwrap();
        drop(f);
        let to = t.path().join("copy.ext4");
        copy_disk(&disk, &to, Instant::now() + Duration::from_secs(60)).unwrap();
        let m = std::fs::metadata(&to).unwrap();
        assert_eq!(m.len(), 64 << 20);
        use std::os::unix::fs::MetadataExt as _;
        assert!(
            m.blocks() * 512 < 8 << 20,
            "holes not kept: {} blocks",
            m.blocks()
        );
        let mut back = [0u8; 4];
        std::os::unix::fs::FileExt::read_at(&std::fs::File::open(&to).unwrap(), &mut back, 1 << 20)
            .unwrap();
        assert_eq!(&back, b"data");
        // The disk replaced by a link to another file: not copied.
        let link = t.path().join("link.ext4");
        std::os::unix::fs::symlink(&disk, &link).unwrap();
        let later = Instant::now() + Duration::from_secs(60);
        assert!(copy_disk(&link, &t.path().join("no.ext4"), later).is_err());
        // A deadline already past: refused, not copied without end.
        let past = Instant::now() - Duration::from_secs(1);
        let err = copy_disk(&disk, &t.path().join("late.ext4"), past).unwrap_err();
        assert!(matches!(err, SubstrateError::Timeout(_)), "{err}");
    }

    fn snapshot_dir(root: &Path) -> VmSnapshot {
        let dir = root.join("snap");
        std::fs::create_dir_all(&dir).unwrap();
        Machine {
            ram: 256 << 20,
            cpus: 1,
            root_image: "layer-a.ext4".into(),
            kernel: "6.1.0-cloud-amd64".into(),
            nic: false,
            vmm: Vmm::Firecracker,
            transport: Default::default(),
        }
        .write(&dir.join(vmsnap::MACHINE))
        .unwrap();
        for f in [vmsnap::MEMORY, vmsnap::DISK, vmsnap::VMSTATE] {
            std::fs::write(dir.join(f), f.as_bytes()).unwrap();
        }
        VmSnapshot::open(&dir).unwrap()
    }

    #[test]
    fn a_firecracker_snapshot_needs_its_vmstate_and_says_its_vmm() {
        let t = tempfile::tempdir().unwrap();
        let snap = snapshot_dir(t.path());
        assert_eq!(snap.machine.vmm, Vmm::Firecracker);
        std::fs::remove_file(snap.dir().join(vmsnap::VMSTATE)).unwrap();
        assert!(VmSnapshot::open(snap.dir()).is_err());
        // A QEMU machine file (no `vmm`) reads as QEMU's and is written as before.
        let qemu = Machine {
            vmm: Vmm::Qemu,
            ..snap.machine.clone()
        };
        let text = serde_json::to_string(&qemu).unwrap();
        assert!(!text.contains("vmm"), "{text}");
        let back: Machine = serde_json::from_str(&text).unwrap();
        assert_eq!(back.vmm, Vmm::Qemu);
    }

    #[test]
    fn staged_files_are_the_snapshots_own_and_go_once_loaded() {
        let t = tempfile::tempdir().unwrap();
        let snap = snapshot_dir(t.path());
        let fc = t.path().join("fc-1");
        std::fs::create_dir_all(&fc).unwrap();
        stage_for_load(&snap, &fc, None).unwrap();
        assert_eq!(
            std::fs::read(fc.join(requests::VMSTATE)).unwrap(),
            vmsnap::VMSTATE.as_bytes()
        );
        assert_eq!(
            std::fs::read(fc.join(requests::MEMORY)).unwrap(),
            vmsnap::MEMORY.as_bytes()
        );
        assert_eq!(
            std::fs::metadata(snap.dir().join(vmsnap::MEMORY))
                .unwrap()
                .permissions()
                .mode()
                & 0o777,
            0o444,
            "staged by a link: the snapshot's own inode"
        );
        unstage(&fc, &snap);
        // Private again once loaded.
        for f in [vmsnap::MEMORY, vmsnap::VMSTATE] {
            let mode = std::fs::metadata(snap.dir().join(f))
                .unwrap()
                .permissions()
                .mode();
            assert_eq!(mode & 0o777, 0o600, "{f}");
        }
        assert!(!fc.join(requests::VMSTATE).exists());
        assert!(!fc.join(requests::MEMORY).exists());
        // The snapshot itself is whole.
        assert!(VmSnapshot::open(snap.dir()).is_ok());
    }

    #[test]
    fn a_written_file_is_taken_only_if_plain_and_becomes_the_workers() {
        let t = tempfile::tempdir().unwrap();
        let (from, to) = (t.path().join("new.memory"), t.path().join("memory"));
        // A link to a file of the worker's: neither changed nor taken.
        let secret = t.path().join("secret");
        std::fs::write(&secret, b"the worker's").unwrap();
        std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o640)).unwrap();
        std::os::unix::fs::symlink(&secret, &from).unwrap();
        assert!(take_file(&from, &to).is_err());
        assert!(std::fs::symlink_metadata(&to).is_err());
        std::fs::hard_link(&secret, &from).unwrap();
        assert!(take_file(&from, &to).is_err());
        assert!(std::fs::symlink_metadata(&to).is_err());
        assert_eq!(
            std::fs::metadata(&secret).unwrap().permissions().mode() & 0o777,
            0o640
        );
        // A directory (with a link to the worker's file in it): neither moved nor
        // followed.
        let _ = std::fs::remove_file(&from);
        std::fs::create_dir(&from).unwrap();
        std::os::unix::fs::symlink(&secret, from.join("x")).unwrap();
        assert!(take_file(&from, &to).is_err());
        assert!(std::fs::symlink_metadata(&to).is_err());
        assert_eq!(std::fs::read(&secret).unwrap(), b"the worker's");
        let _ = std::fs::remove_dir_all(&from);
        std::fs::write(&from, b"ram").unwrap();
        take_file(&from, &to).unwrap();
        assert_eq!(std::fs::read(&to).unwrap(), b"ram");
        assert!(!from.exists());
        assert_eq!(
            std::fs::metadata(&to).unwrap().permissions().mode() & 0o777,
            0o600
        );
    }
}
