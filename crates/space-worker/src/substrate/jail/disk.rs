//! Disk limits: every sandbox's writable layer on a filesystem that enforces a
//! per-sandbox limit, so that a workload writing without end gets `EDQUOT` ("Disk quota
//! exceeded") inside and the host loses at most the limit.
//!
//! The host's filesystems here offer no project quotas (ext4 and XFS quotas are not in
//! this kernel), so the worker brings its own volume: a sparse btrfs image in its data
//! directory (`disk.img`, made once with `mkfs.btrfs`), loop-mounted over
//! `<data>/sandboxes` with qgroups on. Each sandbox directory
//! (`sandboxes/<sandbox>.<execution>/`: `upper/`, `work/`, `root/`, `jail.log`) is a
//! btrfs subvolume with a qgroup limit on the bytes it references. Data and metadata
//! both count, so a flood of empty files runs into the same limit (inodes are
//! allocated dynamically in btrfs: there is no inode table to exhaust, and the host
//! sees one file). Creating a subvolume and setting its limit are two ioctls, well
//! under a millisecond: nothing is formatted on the create path.
//!
//! A subvolume is the unit files cannot leave by rename (`EXDEV`), so a sandbox's disk
//! moves as a whole between its executions: at teardown the sandbox directory, emptied
//! of everything but `upper/`, is renamed to `sandboxes/.layers/<sandbox>` (the *kept
//! layer*), and the next execution's directory is that subvolume renamed back, with
//! its limit set again. Limits can be changed at any time (a warm jail claimed with
//! other limits).
//!
//! Without the volume (rootless, no `mkfs.btrfs`, a data directory whose `sandboxes/`
//! already holds executions from before) sandbox directories are plain directories and
//! disk limits are not enforced; the worker says so in its log.

use std::fs;
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;

use crate::substrate::SubstrateError;
use crate::substrate::io_err;

/// The image file, in the worker's data dir.
pub const IMAGE_FILE: &str = "disk.img";
/// Where kept layers wait between executions, inside `sandboxes/` (same volume).
pub const KEPT_DIR: &str = ".layers";
/// Largest image made when none is asked for: it is sparse, so this is a ceiling on
/// what all sandboxes of the worker together may write, not space taken.
pub const DEFAULT_MAX_IMAGE_BYTES: u64 = 64 << 30;
/// Smallest image the worker makes.
pub const MIN_IMAGE_BYTES: u64 = 1 << 30;

const BTRFS_SUPER_MAGIC: i64 = 0x9123_683E;
/// Inode number of a btrfs subvolume's root directory.
const BTRFS_FIRST_FREE_OBJECTID: u64 = 256;
const MIB: u64 = 1 << 20;

/// The raw ioctls (btrfs's `ioctl.h`).
#[allow(unsafe_code)]
mod sys {
    /// `struct btrfs_ioctl_vol_args`.
    #[repr(C)]
    pub struct VolArgs {
        pub fd: i64,
        pub name: [u8; 4088],
    }

    /// `struct btrfs_ioctl_quota_ctl_args`.
    #[repr(C)]
    pub struct QuotaCtlArgs {
        pub cmd: u64,
        pub status: u64,
    }

    /// `struct btrfs_qgroup_limit`.
    #[repr(C)]
    pub struct QgroupLimit {
        pub flags: u64,
        pub max_rfer: u64,
        pub max_excl: u64,
        pub rsv_rfer: u64,
        pub rsv_excl: u64,
    }

    /// `struct btrfs_ioctl_qgroup_limit_args`.
    #[repr(C)]
    pub struct QgroupLimitArgs {
        pub qgroupid: u64,
        pub lim: QgroupLimit,
    }

    pub const QUOTA_CTL_ENABLE: u64 = 1;
    pub const LIMIT_MAX_RFER: u64 = 1;
    pub const LIMIT_MAX_EXCL: u64 = 2;

    nix::ioctl_write_ptr!(subvol_create, 0x94, 14, VolArgs);
    nix::ioctl_readwrite!(quota_ctl, 0x94, 40, QuotaCtlArgs);
    // Declared `_IOR` in the kernel's header, though the kernel reads it.
    nix::ioctl_read!(qgroup_limit, 0x94, 43, QgroupLimitArgs);
}

/// Serialises mounting (two drivers of one process on one data dir).
static MOUNTING: Mutex<()> = Mutex::new(());

fn os_err(context: &str, e: nix::errno::Errno) -> SubstrateError {
    SubstrateError::io(context.to_owned(), e.into())
}

/// Whether `dir` is on btrfs.
fn on_btrfs(dir: &Path) -> bool {
    nix::sys::statfs::statfs(dir).is_ok_and(|s| s.filesystem_type().0 == BTRFS_SUPER_MAGIC)
}

/// Whether `sandboxes` is the mount point of a btrfs volume (not merely on one).
fn is_volume_root(sandboxes: &Path) -> bool {
    on_btrfs(sandboxes)
        && fs::metadata(sandboxes).is_ok_and(|m| {
            m.ino() == BTRFS_FIRST_FREE_OBJECTID
                && sandboxes
                    .parent()
                    .and_then(|p| fs::metadata(p).ok())
                    .is_some_and(|pm| pm.dev() != m.dev())
        })
}

/// Whether disk limits are enforced for sandbox directories under `data_dir`.
pub fn enforced(data_dir: &Path) -> bool {
    on_btrfs(&data_dir.join("sandboxes"))
}

/// Whether `mount_point` is the disk volume of `data_dir` (which the startup sweep must
/// leave mounted).
pub fn is_volume_mount(data_dir: &Path, mount_point: &Path) -> bool {
    mount_point == data_dir.join("sandboxes")
}

/// Size for a new image: `asked`, or a quarter of the free space of the data dir's
/// filesystem, at most [`DEFAULT_MAX_IMAGE_BYTES`], at least [`MIN_IMAGE_BYTES`].
fn image_size(data_dir: &Path, asked: Option<u64>) -> u64 {
    if let Some(bytes) = asked {
        return bytes.max(MIN_IMAGE_BYTES);
    }
    let free = nix::sys::statvfs::statvfs(data_dir)
        .map(|s| s.blocks_available() * s.fragment_size())
        .unwrap_or(DEFAULT_MAX_IMAGE_BYTES);
    (free / 4).clamp(MIN_IMAGE_BYTES, DEFAULT_MAX_IMAGE_BYTES)
}

/// Whether the file holds a btrfs filesystem (its superblock's magic at 64 KiB + 64).
fn has_btrfs_superblock(image: &Path) -> bool {
    use std::io::{Read, Seek, SeekFrom};
    let mut magic = [0u8; 8];
    fs::File::open(image)
        .and_then(|mut f| {
            f.seek(SeekFrom::Start(0x1_0040))?;
            f.read_exact(&mut magic)
        })
        .is_ok()
        && &magic == b"_BHRfS_M"
}

fn run(cmd: &mut Command) -> Result<(), SubstrateError> {
    let what = format!("{cmd:?}");
    let out = cmd.output().map_err(io_err(format!("run {what}")))?;
    if out.status.success() {
        return Ok(());
    }
    Err(SubstrateError::io(
        what,
        io::Error::other(String::from_utf8_lossy(&out.stderr).trim().to_owned()),
    ))
}

/// What [`ensure_volume`] found or did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VolumeState {
    /// The volume was mounted already (a restarted worker).
    Mounted,
    /// The image was mounted now (and made first if `created`).
    MountedNow {
        /// Whether the image was made.
        created: bool,
    },
    /// No volume: sandbox directories are plain, disk limits are not enforced.
    Unavailable,
}

/// Makes `<data_dir>/sandboxes` the disk volume: mounts the existing image, or makes a
/// sparse one of `image_bytes` (see [`image_size`]) first. Refuses to mount over a
/// `sandboxes/` that already holds directories (executions of a worker from before
/// disk limits): their processes and records refer to those paths. Then moves kept
/// layers of the older layout (`<data>/layers/<sandbox>`) into the volume.
pub fn ensure_volume(
    data_dir: &Path,
    image_bytes: Option<u64>,
) -> Result<VolumeState, SubstrateError> {
    let _one = MOUNTING.lock().unwrap_or_else(|p| p.into_inner());
    let sandboxes = data_dir.join("sandboxes");
    let state = if is_volume_root(&sandboxes) {
        VolumeState::Mounted
    } else {
        mount_image(data_dir, &sandboxes, image_bytes)?
    };
    if state != VolumeState::Unavailable {
        enable_quota(&sandboxes)?;
    }
    let kept = sandboxes.join(KEPT_DIR);
    fs::create_dir_all(&kept).map_err(io_err(format!("create {}", kept.display())))?;
    fs::set_permissions(&kept, fs::Permissions::from_mode(0o700))
        .map_err(io_err("chmod kept layers"))?;
    adopt_legacy_layers(data_dir, &kept);
    Ok(state)
}

fn mount_image(
    data_dir: &Path,
    sandboxes: &Path,
    image_bytes: Option<u64>,
) -> Result<VolumeState, SubstrateError> {
    fs::create_dir_all(sandboxes).map_err(io_err(format!("create {}", sandboxes.display())))?;
    fs::set_permissions(sandboxes, fs::Permissions::from_mode(0o700))
        .map_err(io_err("chmod sandboxes"))?;
    let leftovers = fs::read_dir(sandboxes)
        .map_err(io_err("list sandboxes"))?
        .filter_map(Result::ok)
        .any(|e| e.file_name() != KEPT_DIR);
    if leftovers {
        tracing::warn!(
            dir = %sandboxes.display(),
            "sandboxes/ holds executions from before disk limits: disk limits stay off until it is empty"
        );
        return Ok(VolumeState::Unavailable);
    }
    let image = data_dir.join(IMAGE_FILE);
    let mut created = false;
    if !has_btrfs_superblock(&image) {
        let size = image_size(data_dir, image_bytes);
        let file = fs::OpenOptions::new()
            .create(true)
            .truncate(true)
            .write(true)
            .mode(0o600)
            .open(&image)
            .map_err(io_err(format!("create {}", image.display())))?;
        file.set_len(size).map_err(io_err("size the disk image"))?;
        drop(file);
        if let Err(e) = run(Command::new("mkfs.btrfs")
            .args(["-q", "-f", "-K", "-m", "single", "-d", "single"])
            .arg(&image))
        {
            let _ = fs::remove_file(&image);
            if which("mkfs.btrfs").is_none() {
                tracing::warn!("mkfs.btrfs not found (package btrfs-progs): disk limits are off");
                return Ok(VolumeState::Unavailable);
            }
            return Err(e);
        }
        created = true;
    }
    // A kept layer of the plain layout would be hidden under the mount: it moves in
    // after (see `adopt_legacy_layers`), so `.layers` here must be empty.
    let _ = fs::remove_dir(sandboxes.join(KEPT_DIR));
    run(Command::new("mount")
        .args(["-t", "btrfs", "-o", "loop,nosuid,nodev,noatime,discard"])
        .arg(&image)
        .arg(sandboxes))?;
    fs::set_permissions(sandboxes, fs::Permissions::from_mode(0o700))
        .map_err(io_err("chmod the disk volume"))?;
    tracing::info!(image = %image.display(), created, "disk volume mounted");
    Ok(VolumeState::MountedNow { created })
}

fn which(program: &str) -> Option<PathBuf> {
    std::env::var_os("PATH")
        .into_iter()
        .flat_map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .chain(["/usr/sbin", "/sbin"].map(PathBuf::from))
        .map(|d| d.join(program))
        .find(|p| p.is_file())
}

fn open_dir(dir: &Path) -> Result<fs::File, SubstrateError> {
    fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(dir)
        .map_err(io_err(format!("open {}", dir.display())))
}

fn enable_quota(volume: &Path) -> Result<(), SubstrateError> {
    let dir = open_dir(volume)?;
    let mut args = sys::QuotaCtlArgs {
        cmd: sys::QUOTA_CTL_ENABLE,
        status: 0,
    };
    // SAFETY: `dir` is an open directory and `args` a valid, live `btrfs_ioctl_quota_ctl_args`.
    #[allow(unsafe_code)]
    let done = unsafe { sys::quota_ctl(dir.as_raw_fd(), &mut args) };
    done.map(drop)
        .map_err(|e| os_err("enable quotas on the disk volume", e))
}

/// Unmounts the volume of `data_dir` if nothing uses it any more (no jail holds a
/// layer on it); otherwise leaves it for the next start to use.
pub fn unmount_volume(data_dir: &Path) {
    let sandboxes = data_dir.join("sandboxes");
    if !is_volume_root(&sandboxes) {
        return;
    }
    match nix::mount::umount2(&sandboxes, nix::mount::MntFlags::empty()) {
        Ok(()) => tracing::info!(dir = %sandboxes.display(), "disk volume unmounted"),
        Err(e) => {
            tracing::info!(dir = %sandboxes.display(), error = %e, "disk volume stays mounted")
        }
    }
}

/// Moves kept layers of the plain layout (`<data>/layers/<sandbox>`: the upper
/// directory itself) into the new one (`sandboxes/.layers/<sandbox>/upper`).
fn adopt_legacy_layers(data_dir: &Path, kept: &Path) {
    let legacy = data_dir.join("layers");
    let Ok(entries) = fs::read_dir(&legacy) else {
        return;
    };
    for e in entries.filter_map(Result::ok) {
        let (from, to) = (e.path(), kept.join(e.file_name()));
        if to.exists() || !e.file_type().is_ok_and(|t| t.is_dir()) {
            continue;
        }
        let moved = new_layer(&to, None).and_then(|upper| move_tree(&from, &upper));
        match moved {
            Ok(()) => {
                tracing::info!(layer = %to.display(), "kept layer moved onto the disk volume")
            }
            Err(e) => {
                let _ = crate::substrate::tree::remove_tree(&to);
                tracing::warn!(layer = %from.display(), error = %e, "kept layer not moved");
            }
        }
    }
    let _ = fs::remove_dir(&legacy);
}

/// Moves the tree `from` to `to` (absent): a rename, or across filesystems a copy that
/// keeps owners, modes, links, device nodes (overlay whiteouts) and extended
/// attributes, then the removal of `from`. Symbolic links are copied, never followed.
fn move_tree(from: &Path, to: &Path) -> Result<(), SubstrateError> {
    match fs::rename(from, to) {
        Ok(()) => return Ok(()),
        Err(e) if e.raw_os_error() == Some(libc::EXDEV) => {}
        Err(e) => return Err(SubstrateError::io(format!("move {}", from.display()), e)),
    }
    // `cp -a` creates every entry itself under `to`, which it makes: it cannot be led
    // outside it by a link in `from` (links are copied as links).
    run(Command::new("cp")
        .args(["-a", "--no-target-directory"])
        .arg(from)
        .arg(to))?;
    crate::substrate::tree::remove_tree(from).map_err(io_err(format!("remove {}", from.display())))
}

fn subvol_create(parent: &Path, name: &str) -> Result<(), SubstrateError> {
    let dir = open_dir(parent)?;
    let mut args = sys::VolArgs {
        fd: 0,
        name: [0; 4088],
    };
    if name.is_empty() || name.len() >= args.name.len() || name.contains('/') {
        return Err(SubstrateError::InvalidSpec(format!(
            "subvolume name {name:?}"
        )));
    }
    args.name[..name.len()].copy_from_slice(name.as_bytes());
    // SAFETY: `dir` is an open directory, `args` a valid NUL-terminated `btrfs_ioctl_vol_args`.
    #[allow(unsafe_code)]
    let done = unsafe { sys::subvol_create(dir.as_raw_fd(), &args) };
    done.map(drop).map_err(|e| {
        os_err(
            &format!("create subvolume {name} in {}", parent.display()),
            e,
        )
    })
}

/// Sets (or, with `None`, lifts) the limit of the subvolume at `dir`: bytes it
/// references, data and metadata. A no-op where limits are not enforced.
pub fn set_limit(dir: &Path, bytes: Option<u64>) -> Result<(), SubstrateError> {
    if !on_btrfs(dir) {
        return Ok(());
    }
    let file = open_dir(dir)?;
    let (flags, max) = match bytes {
        Some(b) => (sys::LIMIT_MAX_RFER | sys::LIMIT_MAX_EXCL, b),
        // Flags set with a limit of u64::MAX lift it.
        None => (sys::LIMIT_MAX_RFER | sys::LIMIT_MAX_EXCL, u64::MAX),
    };
    let mut args = sys::QgroupLimitArgs {
        // 0: the subvolume the descriptor is in.
        qgroupid: 0,
        lim: sys::QgroupLimit {
            flags,
            max_rfer: max,
            max_excl: max,
            rsv_rfer: 0,
            rsv_excl: 0,
        },
    };
    // SAFETY: `file` is an open directory, `args` a valid `btrfs_ioctl_qgroup_limit_args`.
    #[allow(unsafe_code)]
    let done = unsafe { sys::qgroup_limit(file.as_raw_fd(), &mut args) };
    done.map(drop).map_err(|e| {
        os_err(
            &format!(
                "set the disk limit of {} to {} MiB",
                dir.display(),
                max / MIB
            ),
            e,
        )
    })
}

/// A new, empty sandbox disk at `dir` (absent): a subvolume with `bytes` as its limit
/// on the volume, a plain directory elsewhere. Mode 0755, like `mkdir` under the
/// worker's umask.
fn new_disk(dir: &Path, bytes: Option<u64>) -> Result<(), SubstrateError> {
    let parent = dir
        .parent()
        .ok_or_else(|| SubstrateError::InvalidSpec(format!("{} has no parent", dir.display())))?;
    if on_btrfs(parent) {
        let name = dir
            .file_name()
            .and_then(|n| n.to_str())
            .ok_or_else(|| SubstrateError::InvalidSpec(format!("{}", dir.display())))?;
        subvol_create(parent, name)?;
        fs::set_permissions(dir, fs::Permissions::from_mode(0o755))
            .map_err(io_err(format!("chmod {}", dir.display())))?;
        if let Err(e) = set_limit(dir, bytes) {
            let _ = fs::remove_dir(dir);
            return Err(e);
        }
        Ok(())
    } else {
        fs::create_dir(dir).map_err(io_err(format!("create {}", dir.display())))
    }
}

/// A new kept layer at `dir` (absent), for an archive to be unpacked into: returns
/// where the upper directory goes (`dir/upper`, not yet there). On the volume `dir` is
/// a subvolume limited to `bytes`, so unpacking stops at the limit too.
pub fn new_layer(dir: &Path, bytes: Option<u64>) -> Result<PathBuf, SubstrateError> {
    new_disk(dir, bytes)?;
    Ok(dir.join("upper"))
}

/// Creates the execution's directory `sandbox_dir`: the kept layer `kept` renamed
/// there when it exists (the sandbox's files, `upper/` inside; its limit lifted until
/// the launch sets `bytes`), else a new disk limited to `bytes`. Returns the kept layer's path when it was taken, so that a
/// failed launch can move it back ([`give_back`]).
pub fn create_sandbox_dir(
    sandbox_dir: &Path,
    kept: Option<&Path>,
    bytes: Option<u64>,
) -> Result<Option<PathBuf>, SubstrateError> {
    let kept = kept.filter(|k| fs::symlink_metadata(k).is_ok_and(|m| m.is_dir()));
    let Some(kept) = kept else {
        new_disk(sandbox_dir, bytes)?;
        return Ok(None);
    };
    fs::rename(kept, sandbox_dir).map_err(io_err(format!("adopt layer {}", kept.display())))?;
    // What a failed launch left beside the layer (see `give_back`).
    for scratch in ["work", "root", "lower", "lowers", "jail.log"] {
        remove_scratch(&sandbox_dir.join(scratch));
    }
    // The layer may fill its disk, and the launch still has to write (scratch
    // directories, `/etc`): the limit is lifted until the launch is done, before any
    // process of the sandbox runs (`JailDriver::launch` sets it again).
    if let Err(e) = set_limit(sandbox_dir, None) {
        let _ = fs::rename(sandbox_dir, kept);
        return Err(e);
    }
    // A layer without an upper dir (an empty archive) still gets one.
    let upper = sandbox_dir.join("upper");
    if !upper.is_dir() {
        fs::create_dir(&upper).map_err(io_err(format!("create {}", upper.display())))?;
    }
    Ok(Some(kept.to_path_buf()))
}

fn remove_scratch(path: &Path) {
    match fs::symlink_metadata(path) {
        Ok(m) if m.is_dir() => {
            crate::substrate::tree::make_removable(path);
            let _ = crate::substrate::tree::remove_tree(path);
        }
        Ok(_) => {
            let _ = fs::remove_file(path);
        }
        Err(_) => {}
    }
}

/// Moves a sandbox directory taken by [`create_sandbox_dir`] back to where the kept
/// layer was (a launch that failed), without its scratch directories.
pub fn give_back(sandbox_dir: &Path, kept: &Path) -> Result<(), SubstrateError> {
    for scratch in ["work", "root", "lower", "lowers", "jail.log"] {
        remove_scratch(&sandbox_dir.join(scratch));
    }
    fs::rename(sandbox_dir, kept).map_err(io_err(format!("give back {}", kept.display())))
}

/// Keeps the writable layer of a torn-down execution at `dest` (replacing anything
/// there): the sandbox directory itself, emptied of its scratch, is renamed — on the
/// volume, a file cannot leave its subvolume. `dest` must be on the same filesystem.
pub fn keep_layer(sandbox_dir: &Path, dest: &Path) -> Result<(), SubstrateError> {
    if let Some(parent) = dest.parent() {
        fs::create_dir_all(parent).map_err(io_err(format!("create {}", parent.display())))?;
    }
    match fs::symlink_metadata(dest) {
        Ok(m) if m.is_dir() => {
            crate::substrate::tree::make_removable(dest);
            crate::substrate::tree::remove_tree(dest)
                .map_err(io_err(format!("remove {}", dest.display())))?;
        }
        Ok(_) => fs::remove_file(dest).map_err(io_err(format!("remove {}", dest.display())))?,
        Err(_) => {}
    }
    give_back(sandbox_dir, dest)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_image_size_is_bounded_both_ways() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(image_size(dir.path(), Some(1)), MIN_IMAGE_BYTES);
        assert_eq!(image_size(dir.path(), Some(5 << 30)), 5 << 30);
        let auto = image_size(dir.path(), None);
        assert!((MIN_IMAGE_BYTES..=DEFAULT_MAX_IMAGE_BYTES).contains(&auto));
    }

    #[test]
    fn a_file_that_is_not_btrfs_is_not_taken_for_an_image() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("x");
        fs::write(&f, vec![0u8; 0x2_0000]).unwrap();
        assert!(!has_btrfs_superblock(&f));
        assert!(!has_btrfs_superblock(&dir.path().join("absent")));
    }

    #[test]
    fn a_plain_layer_moves_with_its_scratch_removed() {
        let dir = tempfile::tempdir().unwrap();
        let sandboxes = dir.path().join("sandboxes");
        fs::create_dir(&sandboxes).unwrap();
        let sbx = sandboxes.join("a.1");
        assert_eq!(create_sandbox_dir(&sbx, None, Some(MIB)).unwrap(), None);
        fs::create_dir(sbx.join("upper")).unwrap();
        fs::write(sbx.join("upper/file"), "x").unwrap();
        fs::create_dir(sbx.join("work")).unwrap();
        fs::write(sbx.join("jail.log"), "log").unwrap();
        let kept = sandboxes.join(KEPT_DIR).join("a");
        keep_layer(&sbx, &kept).unwrap();
        assert!(!sbx.exists());
        assert!(!kept.join("work").exists() && !kept.join("jail.log").exists());
        let next = sandboxes.join("a.2");
        let taken = create_sandbox_dir(&next, Some(&kept), None).unwrap();
        assert_eq!(taken.as_deref(), Some(kept.as_path()));
        assert_eq!(fs::read_to_string(next.join("upper/file")).unwrap(), "x");
        give_back(&next, &kept).unwrap();
        assert!(kept.join("upper/file").is_file());
    }
}
