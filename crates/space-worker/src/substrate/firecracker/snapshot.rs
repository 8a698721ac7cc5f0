//! Memory snapshots under Firecracker, in the QEMU driver's layout
//! (`substrate::vm::snapshot`: `vm.json`, `memory`, `upper.ext4`) plus Firecracker's
//! device and vCPU state (`vmstate`), so that packing, transfer and unpacking carry it
//! unchanged.
//!
//! Taking one: the VM is paused, Firecracker writes a full snapshot into its own
//! directory (as the VM's uid: names it cannot have been given before, see
//! [`requests::NEW_VMSTATE`]), the worker copies both into files of its own in the
//! snapshot's directory (a reflink where it can; never Firecracker's inode, which it
//! may still hold open for writing) and removes Firecracker's, and copies the
//! (stopped, flushed) disk sparsely.
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
use crate::substrate::vm::files::copy_plain;
use crate::substrate::vm::snapshot::{self as vmsnap, Machine, VmSnapshot, Vmm};
use crate::substrate::{SandboxHandle, SubstrateError, io_err};

/// The longest a snapshot's disk copy may take (a disk of the largest limit, sparse,
/// on a slow disk).
const DISK_COPY_WAIT: Duration = Duration::from_secs(600);

/// The largest device and vCPU state taken from Firecracker (a few tens of KiB for
/// one vCPU and our devices; the rest is room).
const MAX_VMSTATE: u64 = 16 << 20;

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
    let deadline = Instant::now() + DISK_COPY_WAIT;
    for (from, to, most) in [
        (requests::NEW_VMSTATE, vmsnap::VMSTATE, MAX_VMSTATE),
        (requests::NEW_MEMORY, vmsnap::MEMORY, machine.ram),
    ] {
        take_file(&fc.join(from), &dir.join(to), most, deadline)?;
    }
    // Paused, its disk flushed by the snapshot: the disk is consistent.
    copy_plain(&handle.upper_dir, &dir.join(vmsnap::DISK), None, deadline)?;
    machine.write(&dir.join(vmsnap::MACHINE))?;
    VmSnapshot::open(dir)
}

/// Takes a file Firecracker wrote (as the VM's uid) into `to`, the worker's own and
/// private to it: a copy the worker makes, never the VMM's inode. Firecracker may still
/// hold a descriptor open for writing on what it wrote (an escaped VMM would keep one);
/// through it, it could change or grow the file after the worker took it — after the
/// snapshot's digest, outside any quota of its uid. So the file is copied (a reflink
/// where the filesystem has them: a copy as of now, sharing nothing later writes
/// reach), from a descriptor opened without following a link, only if it is a plain
/// file of one link and at most `most` bytes long, within `deadline`; then the VMM's
/// name for it goes.
fn take_file(from: &Path, to: &Path, most: u64, deadline: Instant) -> Result<(), SubstrateError> {
    let taken = copy_plain(from, to, Some(most), deadline);
    // Whatever is there goes, as a tree, never through a link.
    let _ = crate::substrate::tree::remove_tree(from);
    taken.inspect_err(|_| {
        let _ = crate::substrate::tree::remove_tree(to);
    })
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
        copy_plain(&disk, &to, None, Instant::now() + Duration::from_secs(60)).unwrap();
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
        assert!(copy_plain(&link, &t.path().join("no.ext4"), None, later).is_err());
        // A deadline already past: refused, not copied without end.
        let past = Instant::now() - Duration::from_secs(1);
        let err = copy_plain(&disk, &t.path().join("late.ext4"), None, past).unwrap_err();
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
        let later = || Instant::now() + Duration::from_secs(60);
        // A link to a file of the worker's: neither changed nor taken.
        let secret = t.path().join("secret");
        std::fs::write(&secret, b"the worker's").unwrap();
        std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o640)).unwrap();
        std::os::unix::fs::symlink(&secret, &from).unwrap();
        assert!(take_file(&from, &to, 1 << 20, later()).is_err());
        assert!(std::fs::symlink_metadata(&to).is_err());
        std::fs::hard_link(&secret, &from).unwrap();
        assert!(take_file(&from, &to, 1 << 20, later()).is_err());
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
        assert!(take_file(&from, &to, 1 << 20, later()).is_err());
        assert!(std::fs::symlink_metadata(&to).is_err());
        assert_eq!(std::fs::read(&secret).unwrap(), b"the worker's");
        let _ = std::fs::remove_dir_all(&from);
        std::fs::write(&from, b"ram").unwrap();
        take_file(&from, &to, 1 << 20, later()).unwrap();
        assert_eq!(std::fs::read(&to).unwrap(), b"ram");
        assert!(!from.exists());
        assert_eq!(
            std::fs::metadata(&to).unwrap().permissions().mode() & 0o777,
            0o600
        );
        // Longer than it can be (the guest's RAM for the memory): refused, and gone.
        std::fs::write(&from, vec![1u8; 4096]).unwrap();
        assert!(take_file(&from, &to, 4095, later()).is_err());
        assert!(std::fs::symlink_metadata(&to).is_err() && !from.exists());
    }

    #[test]
    fn a_vmm_writing_on_through_its_descriptor_cannot_change_the_file_taken() {
        use std::io::{Seek as _, Write as _};
        let t = tempfile::tempdir().unwrap();
        let (from, to) = (t.path().join("new.memory"), t.path().join("memory"));
        // The VMM wrote its memory file and kept the descriptor (an escaped one would).
        let mut held = std::fs::File::create(&from).unwrap();
        held.write_all(b"ram").unwrap();
        take_file(
            &from,
            &to,
            1 << 20,
            Instant::now() + Duration::from_secs(60),
        )
        .unwrap();
        held.rewind().unwrap();
        held.write_all(b"rewritten and grown by the VMM").unwrap();
        held.sync_all().unwrap();
        assert_eq!(std::fs::read(&to).unwrap(), b"ram");
        use std::os::unix::fs::MetadataExt as _;
        assert_ne!(
            std::fs::metadata(&to).unwrap().ino(),
            held.metadata().unwrap().ino(),
            "the worker took the VMM's own inode"
        );
    }
}
