//! Builds the jail's root filesystem in the jail's private mount namespace: the
//! overlay root, read-only system binds, `/tmp` and a minimal `/dev` (in the first
//! `space-jail` process, before the init forks); `/proc` and `pivot_root` come later,
//! in the init, which then writes the homes and a synthesized `/etc`
//! ([`finish_inside`]). Every path below the root is resolved without following
//! links (see [`crate::mounts`]): the writable layer is the sandbox's.

use std::fs;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::fs::{DirBuilderExt, PermissionsExt, symlink};
use std::path::{Path, PathBuf};

use nix::mount::{MsFlags, mount};
use nix::sys::stat::{Mode, SFlag, makedev, mknod};

use crate::error::JailError;
use crate::mounts::{self, BindAttrs};
use crate::spec::{Accounts, JailSpec};
use crate::userns;

/// uid/gid of the unprivileged account in the synthesized `/etc/passwd`.
pub const USER_ID: u32 = 1000;

/// Character devices of the minimal `/dev`: name, major, minor.
const DEVICES: &[(&str, u64, u64)] = &[
    ("null", 1, 3),
    ("zero", 1, 5),
    ("full", 1, 7),
    ("random", 1, 8),
    ("urandom", 1, 9),
    ("tty", 5, 0),
];

fn mount_fs(
    stage: &str,
    source: &str,
    target: &Path,
    fstype: &str,
    flags: MsFlags,
    data: &str,
) -> Result<(), JailError> {
    mount(Some(source), target, Some(fstype), flags, Some(data))
        .map_err(|e| JailError::new(stage, format!("{}: {e}", target.display())))
}

fn ensure_dir(path: &Path, mode: u32) -> Result<(), JailError> {
    match fs::DirBuilder::new()
        .recursive(true)
        .mode(mode)
        .create(path)
    {
        Ok(()) => Ok(()),
        Err(e) => Err(JailError::io("create directory", path, e)),
    }
}

/// The directory holding the writable layer (`upper/`, `work/`) and the mount point
/// (`root/`): the worker creates all three side by side.
fn layer_dir(spec: &JailSpec) -> Result<&Path, JailError> {
    let parent = spec.root_dir.parent();
    if parent.is_none() || spec.upper_dir.parent() != parent || spec.work_dir.parent() != parent {
        return Err(JailError::new(
            "validate spec",
            "root, upper and work dirs must be side by side",
        ));
    }
    parent.ok_or_else(|| JailError::new("validate spec", "root dir has no parent"))
}

/// Builds the whole root under `spec.root_dir` (mount namespace must be private).
///
/// With `userns` (the sandbox's user namespace, see [`crate::userns`]) the layers
/// are idmapped through it; the init enters it after `pivot_root`
/// ([`finish_inside`] then writes `/etc` and the homes).
pub fn build(spec: &JailSpec, userns: Option<&OwnedFd>) -> Result<(), JailError> {
    // Nothing mounted below may propagate back to the host's namespace.
    mount(
        None::<&str>,
        "/",
        None::<&str>,
        MsFlags::MS_REC | MsFlags::MS_PRIVATE,
        None::<&str>,
    )
    .map_err(|e| JailError::new("make / private", e.to_string()))?;
    let layer = layer_dir(spec)?;
    // The lower layers' mount points, made before the layer dir is idmapped (through
    // the idmapped mount the worker's own ids are not mapped).
    let lowers = layer.join(LOWERS);
    ensure_dir(&lowers, 0o700)?;
    let mount_points: Vec<PathBuf> = (0..spec.lower_dirs.len())
        .map(|i| lowers.join(i.to_string()))
        .collect();
    for mount_point in &mount_points {
        ensure_dir(mount_point, 0o755)?;
    }
    let idmap = userns.map(|fd| fd.as_fd());
    if idmap.is_some() {
        // The writable layer, seen through the sandbox's id mapping: on disk its
        // files keep canonical ids whatever host range this execution has.
        let tree = mounts::clone_tree(
            layer,
            BindAttrs {
                read_only: false,
                idmap,
            },
        )
        .map_err(|e| JailError::new("idmap writable layer", e.to_string()))?;
        let target =
            mounts::open_dir_path(layer).map_err(|e| JailError::io("open layer", layer, e))?;
        mounts::attach(&tree, target.as_fd())
            .map_err(|e| JailError::new("idmap writable layer", e.to_string()))?;
    }
    // The template's layers, read-only (and idmapped): mounted at `lowers/<i>` beside
    // the writable layer so that the overlay's options name only relative paths, and
    // the jail's mountinfo shows no host path of the data directory or of the
    // template. One unpacked copy of a layer serves every sandbox.
    for (i, (lower, mount_point)) in spec.lower_dirs.iter().zip(&mount_points).enumerate() {
        let tree = mounts::clone_tree(
            lower,
            BindAttrs {
                read_only: true,
                idmap,
            },
        )
        .map_err(|e| JailError::new("bind template", format!("layer {i}: {e}")))?;
        let target = mounts::open_dir_path(mount_point)
            .map_err(|e| JailError::io("open lower mount point", mount_point, e))?;
        mounts::attach(&tree, target.as_fd())
            .map_err(|e| JailError::new("bind template", format!("layer {i}: {e}")))?;
    }

    let inner = || build_root(spec, layer, idmap);
    match spec.userns.as_ref().filter(|_| userns.is_some()) {
        // Overlayfs creates its work dirs and copies up with its mounter's ids, which
        // must be mapped by the idmapped layers.
        Some(map) => userns::with_fs_ids(map, inner)
            .map_err(|e| JailError::new("switch filesystem ids", e.to_string()))??,
        None => inner()?,
    }
    Ok(())
}

fn build_root(
    spec: &JailSpec,
    layer: &Path,
    idmap: Option<BorrowedFd<'_>>,
) -> Result<(), JailError> {
    let root = &spec.root_dir;
    std::env::set_current_dir(layer).map_err(|e| JailError::io("enter layer dir", layer, e))?;
    if spec.upper_dir != layer.join("upper") || spec.work_dir != layer.join("work") {
        return Err(JailError::new(
            "validate spec",
            "the writable layer must be <dir>/upper and <dir>/work",
        ));
    }
    // Relative to the layer dir (the current directory): mountinfo inside the jail
    // shows these strings, not host paths.
    let options = overlay_options(spec.lower_dirs.len());
    mount_fs(
        "mount overlay",
        "overlay",
        root,
        "overlay",
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
        &options,
    )?;
    let root_fd = mounts::open_dir_path(root).map_err(|e| JailError::io("open root", root, e))?;

    for bind in &spec.read_only_binds {
        let (target, _) =
            mounts::ensure_dir(root_fd.as_fd(), &bind.target, 0o755).map_err(|e| {
                JailError::new(
                    "bind mount point",
                    format!("{}: {e}", bind.target.display()),
                )
            })?;
        let tree = mounts::clone_tree(
            &bind.source,
            BindAttrs {
                read_only: true,
                idmap,
            },
        )
        .map_err(|e| {
            JailError::new(
                "bind system directory",
                format!("{}: {e}", bind.source.display()),
            )
        })?;
        mounts::attach(&tree, target.as_fd()).map_err(|e| {
            JailError::new(
                "bind system directory",
                format!("{}: {e}", bind.source.display()),
            )
        })?;
    }
    for masked in &spec.masked_dirs {
        mask_dir(root_fd.as_fd(), masked)?;
    }

    let ids = spec
        .userns
        .as_ref()
        .map(|m| format!(",uid={},gid={}", m.host_uid, m.host_gid))
        .unwrap_or_default();
    for (dir, mode) in [
        ("proc", 0o555),
        ("tmp", 0o1777),
        ("dev", 0o755),
        ("etc", 0o755),
        ("root", 0o700),
    ] {
        // A link or file the sandbox put in place of a mount point is replaced: from
        // here on these paths are real directories, and nothing of the sandbox runs
        // until the jail is finished.
        mounts::ensure_dir(root_fd.as_fd(), Path::new(dir), mode)
            .map_err(|e| JailError::new("create mount point", format!("/{dir}: {e}")))?;
    }
    let tmpfs_size = format!("size={}", spec.tmpfs_bytes.max(1 << 20));
    mount_fs(
        "mount /tmp",
        "tmpfs",
        &root.join("tmp"),
        "tmpfs",
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
        &format!("mode=1777,{tmpfs_size}{ids}"),
    )?;
    let tty_gid = spec.userns.as_ref().map(|m| m.host_gid + 5);
    build_dev(
        &root.join("dev"),
        &tmpfs_size,
        &ids,
        spec.rootless.is_some(),
        tty_gid,
    )?;
    Ok(())
}

/// The directory beside the writable layer holding the lower layers' mount points.
pub const LOWERS: &str = "lowers";

/// The overlay's options for `layers` lower dirs (mounted at `lowers/0` (top) …),
/// relative to the layer dir.
fn overlay_options(layers: usize) -> String {
    let lower: Vec<String> = (0..layers).map(|i| format!("{LOWERS}/{i}")).collect();
    format!("lowerdir={},upperdir=upper,workdir=work", lower.join(":"))
}

/// Hides a directory of a read-only bind (e.g. the host's `/usr/local`) under an
/// empty read-only tmpfs. Absent directories need no mask.
fn mask_dir(root: BorrowedFd<'_>, inside: &Path) -> Result<(), JailError> {
    let parts =
        mounts::components(inside).map_err(|e| JailError::new("mask directory", e.to_string()))?;
    let rel: PathBuf = parts.iter().collect();
    let dir =
        match mounts::open_beneath_across_mounts(root, &rel, libc::O_PATH | libc::O_DIRECTORY, 0) {
            Ok(fd) => fd,
            // Absent, or a link of the host's own read-only system directory (it
            // points at a path the jail does not have): nothing to hide.
            Err(e)
                if matches!(
                    e.raw_os_error(),
                    Some(libc::ENOENT | libc::ELOOP | libc::ENOTDIR)
                ) =>
            {
                return Ok(());
            }
            Err(e) => {
                return Err(JailError::new(
                    "mask directory",
                    format!("{}: {e}", inside.display()),
                ));
            }
        };
    mount_fs(
        "mask directory",
        "tmpfs",
        &mounts::fd_path(dir.as_fd()),
        "tmpfs",
        MsFlags::MS_RDONLY | MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC,
        "size=0,mode=755",
    )
}

/// A tmpfs `/dev` holding only harmless character devices, a private devpts
/// instance (so the jail's terminals are its own) and `/dev/shm`. `dev` is a real
/// directory of the jail's root (checked by the caller) and nothing of the sandbox
/// runs yet, so paths below the fresh tmpfs are the builder's alone.
fn build_dev(
    dev: &Path,
    tmpfs_size: &str,
    ids: &str,
    rootless: bool,
    tty_gid: Option<u32>,
) -> Result<(), JailError> {
    mount_fs(
        "mount /dev",
        "tmpfs",
        dev,
        "tmpfs",
        MsFlags::MS_NOSUID,
        &format!("mode=755,size=64k{ids}"),
    )?;
    for &(name, major, minor) in DEVICES {
        let path = dev.join(name);
        let made = mknod(
            &path,
            SFlag::S_IFCHR,
            Mode::from_bits_truncate(0o666),
            makedev(major, minor),
        );
        if let Err(err) = made {
            // Without CAP_MKNOD (a rootless worker) bind the host's node instead.
            fs::File::create(&path).map_err(|e| JailError::io("create device", &path, e))?;
            let host = Path::new("/dev").join(name);
            mount(
                Some(&host),
                &path,
                None::<&str>,
                MsFlags::MS_BIND,
                None::<&str>,
            )
            .map_err(|e| {
                JailError::new("create device", format!("{name}: mknod {err}, bind {e}"))
            })?;
        } else {
            // mknod's mode is filtered by the umask; devices must be 0666.
            fs::set_permissions(&path, fs::Permissions::from_mode(0o666))
                .map_err(|e| JailError::io("chmod device", &path, e))?;
        }
    }
    let pts = dev.join("pts");
    ensure_dir(&pts, 0o755)?;
    // `gid=5` (tty) names a group a rootless jail's user namespace does not map; with
    // the sandbox's own namespace it is the range's 5.
    let devpts = match (rootless, tty_gid) {
        (true, _) => "newinstance,ptmxmode=0666,mode=0620".to_owned(),
        (false, Some(gid)) => format!("newinstance,ptmxmode=0666,mode=0620,gid={gid}"),
        (false, None) => "newinstance,ptmxmode=0666,mode=0620,gid=5".to_owned(),
    };
    mount_fs(
        "mount devpts",
        "devpts",
        &pts,
        "devpts",
        MsFlags::MS_NOSUID | MsFlags::MS_NOEXEC,
        &devpts,
    )?;
    let shm = dev.join("shm");
    ensure_dir(&shm, 0o1777)?;
    mount_fs(
        "mount /dev/shm",
        "tmpfs",
        &shm,
        "tmpfs",
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
        &format!("mode=1777,{tmpfs_size}{ids}"),
    )?;
    for (link, target) in [
        ("ptmx", "pts/ptmx"),
        ("fd", "/proc/self/fd"),
        ("stdin", "/proc/self/fd/0"),
        ("stdout", "/proc/self/fd/1"),
        ("stderr", "/proc/self/fd/2"),
    ] {
        let path = dev.join(link);
        symlink(target, &path).map_err(|e| JailError::io("create /dev link", &path, e))?;
    }
    Ok(())
}

/// Run by the init after `pivot_root` (and, with a user namespace, as the sandbox's
/// root): the homes and the synthesized `/etc`, written through descriptors that
/// never follow a link, into new inodes. Whatever the sandbox left at those names
/// (a symlink to a host file, a hard link, a FIFO) is replaced, never written through.
///
/// With [`Accounts::Image`] the image's `passwd`, `group` and `nsswitch.conf` stay
/// (its users, homes and groups are the image's); the platform still writes what it
/// owns: `hosts`, `hostname`, `resolv.conf`. An image without a `passwd` gets the
/// synthesized accounts.
pub fn finish_inside(hostname: &str, rootless: bool, accounts: Accounts) -> Result<(), JailError> {
    let root = mounts::open_dir_path(Path::new("/")).map_err(fail("open /"))?;
    mounts::ensure_dir(root.as_fd(), Path::new("root"), 0o700).map_err(fail("create /root"))?;
    let (etc, _) =
        mounts::ensure_dir(root.as_fd(), Path::new("etc"), 0o755).map_err(fail("create /etc"))?;
    let etc = mounts::open_beneath(etc.as_fd(), Path::new("."), DIR_FLAGS, 0)
        .map_err(fail("open /etc"))?;
    let synthesize = match accounts {
        Accounts::Synthesized => true,
        // Inside the jail, after `pivot_root`: whatever the image's `passwd` is (a
        // link included) it is the sandbox's own file.
        Accounts::Image => {
            nix::sys::stat::fstatat(&etc, "passwd", nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW)
                .is_err()
        }
    };
    if synthesize {
        let (home, _) = mounts::ensure_dir(root.as_fd(), Path::new("home"), 0o755)
            .map_err(fail("create /home"))?;
        let (_, made) = mounts::ensure_dir(home.as_fd(), Path::new("user"), 0o755)
            .map_err(fail("create /home/user"))?;
        // A rootless jail maps only root: `user` cannot own anything there.
        if made == mounts::Made::Created && !rootless {
            let home = mounts::open_beneath(home.as_fd(), Path::new("."), DIR_FLAGS, 0)
                .map_err(fail("open /home"))?;
            mounts::chown_entry(home.as_fd(), "user", USER_ID, USER_ID)
                .map_err(fail("chown /home/user"))?;
        }
    }
    for (name, content) in etc_files(hostname) {
        if !synthesize && ACCOUNT_FILES.contains(&name) {
            continue;
        }
        mounts::replace_file(etc.as_fd(), name, content.as_bytes(), 0o644)
            .map_err(|e| JailError::new("write /etc", format!("{name}: {e}")))?;
    }
    Ok(())
}

/// The files of the synthesized `/etc` that an image's own accounts replace.
const ACCOUNT_FILES: &[&str] = &["passwd", "group", "nsswitch.conf"];

fn fail(stage: &'static str) -> impl Fn(std::io::Error) -> JailError {
    move |e| JailError::new(stage, e.to_string())
}

/// A directory opened for `*at` calls that need a real (not `O_PATH`) descriptor.
const DIR_FLAGS: libc::c_int = libc::O_RDONLY | libc::O_DIRECTORY;

/// The address `/etc/resolv.conf` names (the one AWS gives its resolver; any address
/// would do, as the worker's rules send every DNS packet of a sandbox to the
/// platform's resolver).
pub const RESOLVER_ADDR: &str = "169.254.169.253";

/// The synthesized `/etc`: enough for `id`, `whoami`, name resolution of
/// `localhost` and the hostname; no `shadow`, no host keys, nothing of the host.
pub fn etc_files(hostname: &str) -> Vec<(&'static str, String)> {
    vec![
        (
            "passwd",
            format!(
                "root:x:0:0:root:/root:/bin/sh\n\
                 user:x:{USER_ID}:{USER_ID}:user:/home/user:/bin/sh\n\
                 nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n"
            ),
        ),
        (
            "group",
            format!("root:x:0:\ntty:x:5:\nuser:x:{USER_ID}:\nnogroup:x:65534:\n"),
        ),
        (
            "hosts",
            format!("127.0.0.1\tlocalhost\n::1\tlocalhost\n127.0.1.1\t{hostname}\n"),
        ),
        ("hostname", format!("{hostname}\n")),
        // The platform's resolver: every DNS packet from a sandbox with a network is
        // answered by it, whatever address it was sent to; without one, lookups fail
        // at once (no route).
        ("resolv.conf", format!("nameserver {RESOLVER_ADDR}\n")),
        (
            "nsswitch.conf",
            "passwd: files\ngroup: files\nhosts: files dns\n".to_owned(),
        ),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn synthesized_etc_has_root_and_a_user_and_no_shadow() {
        let files = etc_files("sbx");
        let names: Vec<_> = files.iter().map(|(n, _)| *n).collect();
        assert!(!names.contains(&"shadow") && !names.contains(&"gshadow"));
        let passwd = &files.iter().find(|(n, _)| *n == "passwd").unwrap().1;
        assert!(passwd.starts_with("root:x:0:0:"));
        assert!(passwd.contains("user:x:1000:1000:"));
        let hosts = &files.iter().find(|(n, _)| *n == "hosts").unwrap().1;
        assert!(hosts.contains("127.0.1.1\tsbx"));
        assert!(
            files
                .iter()
                .any(|(n, c)| *n == "resolv.conf" && c == "nameserver 169.254.169.253\n")
        );
    }

    #[test]
    fn the_overlay_stacks_every_lower_dir_top_first_by_relative_name() {
        assert_eq!(
            overlay_options(1),
            "lowerdir=lowers/0,upperdir=upper,workdir=work"
        );
        assert_eq!(
            overlay_options(3),
            "lowerdir=lowers/0:lowers/1:lowers/2,upperdir=upper,workdir=work"
        );
    }

    #[test]
    fn the_writable_layer_must_sit_beside_the_mount_point() {
        let spec_with = |upper: &str| JailSpec {
            root_dir: "/d/root".into(),
            lower_dirs: vec!["/t".into()],
            upper_dir: upper.into(),
            work_dir: "/d/work".into(),
            read_only_binds: vec![],
            masked_dirs: vec![],
            hostname: "h".into(),
            tmpfs_bytes: 1 << 20,
            agent: crate::spec::AgentSpec {
                path: "/bin/sh".into(),
                args: vec![],
                env: vec![],
                cwd: "/".into(),
            },
            rootless: None,
            userns: None,
            accounts: Accounts::Synthesized,
            nofile: None,
        };
        assert_eq!(layer_dir(&spec_with("/d/upper")).unwrap(), Path::new("/d"));
        assert!(layer_dir(&spec_with("/elsewhere/upper")).is_err());
    }
}
