//! Builds the jail's root filesystem in the jail's private mount namespace: the
//! overlay root, read-only system binds, `/tmp`, a minimal `/dev`, a home
//! directory and a synthesized `/etc`. Runs in the first `space-jail` process,
//! before the init forks; `/proc` and `pivot_root` come later, in the init.

use std::fs;
use std::os::unix::fs::{DirBuilderExt, PermissionsExt, symlink};
use std::path::{Component, Path, PathBuf};

use nix::mount::{MsFlags, mount};
use nix::sys::stat::{Mode, SFlag, makedev, mknod};

use crate::JailError;
use crate::spec::JailSpec;

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

/// Resolves `inside` (an absolute path in the jail) under `root`, refusing `..`
/// so a spec cannot place a mount outside the jail's root.
pub fn under_root(root: &Path, inside: &Path) -> Result<PathBuf, JailError> {
    let mut out = root.to_path_buf();
    for component in inside.components() {
        match component {
            Component::RootDir | Component::CurDir => {}
            Component::Normal(part) => out.push(part),
            Component::ParentDir | Component::Prefix(_) => {
                return Err(JailError::new(
                    "resolve path",
                    format!("{} leaves the jail root", inside.display()),
                ));
            }
        }
    }
    Ok(out)
}

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

/// Overlay mount options, refusing paths that would be parsed as option syntax.
fn overlay_options(spec: &JailSpec) -> Result<String, JailError> {
    let mut parts = Vec::with_capacity(3);
    for (key, path) in [
        ("lowerdir", &spec.lower_dir),
        ("upperdir", &spec.upper_dir),
        ("workdir", &spec.work_dir),
    ] {
        let text = path
            .to_str()
            .filter(|t| t.starts_with('/') && !t.contains([',', ':', '\\', '\n']))
            .ok_or_else(|| {
                JailError::new(
                    "overlay options",
                    format!("{key} {} is not an absolute plain path", path.display()),
                )
            })?;
        parts.push(format!("{key}={text}"));
    }
    Ok(parts.join(","))
}

/// Builds the whole root under `spec.root_dir` (mount namespace must be private).
pub fn build(spec: &JailSpec) -> Result<(), JailError> {
    let root = &spec.root_dir;
    // Nothing mounted below may propagate back to the host's namespace.
    mount(
        None::<&str>,
        "/",
        None::<&str>,
        MsFlags::MS_REC | MsFlags::MS_PRIVATE,
        None::<&str>,
    )
    .map_err(|e| JailError::new("make / private", e.to_string()))?;

    mount_fs(
        "mount overlay",
        "overlay",
        root,
        "overlay",
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
        &overlay_options(spec)?,
    )?;

    for bind in &spec.read_only_binds {
        bind_read_only(&bind.source, &under_root(root, &bind.target)?)?;
    }

    for (dir, mode) in [
        ("proc", 0o555),
        ("tmp", 0o1777),
        ("dev", 0o755),
        ("etc", 0o755),
    ] {
        ensure_dir(&root.join(dir), mode)?;
    }
    let tmpfs_size = format!("size={}", spec.tmpfs_bytes.max(1 << 20));
    mount_fs(
        "mount /tmp",
        "tmpfs",
        &root.join("tmp"),
        "tmpfs",
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
        &format!("mode=1777,{tmpfs_size}"),
    )?;
    build_dev(&root.join("dev"), &tmpfs_size, spec.rootless.is_some())?;
    build_homes(root, spec.rootless.is_some())?;
    write_etc(&root.join("etc"), &spec.hostname)?;
    Ok(())
}

/// Binds a host directory read-only: a bind mount cannot be made read-only in
/// one step, so bind first, then remount with the flags.
fn bind_read_only(source: &Path, target: &Path) -> Result<(), JailError> {
    ensure_dir(target, 0o755)?;
    mount(
        Some(source),
        target,
        None::<&str>,
        MsFlags::MS_BIND,
        None::<&str>,
    )
    .map_err(|e| {
        JailError::new(
            "bind system directory",
            format!("{}: {e}", source.display()),
        )
    })?;
    mount(
        None::<&str>,
        target,
        None::<&str>,
        MsFlags::MS_BIND
            | MsFlags::MS_REMOUNT
            | MsFlags::MS_RDONLY
            | MsFlags::MS_NOSUID
            | MsFlags::MS_NODEV,
        None::<&str>,
    )
    .map_err(|e| JailError::new("remount read-only", format!("{}: {e}", target.display())))
}

/// A tmpfs `/dev` holding only harmless character devices, a private devpts
/// instance (so the jail's terminals are its own) and `/dev/shm`.
fn build_dev(dev: &Path, tmpfs_size: &str, rootless: bool) -> Result<(), JailError> {
    mount_fs(
        "mount /dev",
        "tmpfs",
        dev,
        "tmpfs",
        MsFlags::MS_NOSUID,
        "mode=755,size=64k",
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
    mount_fs(
        "mount devpts",
        "devpts",
        &pts,
        "devpts",
        MsFlags::MS_NOSUID | MsFlags::MS_NOEXEC,
        // `gid=5` (tty) names a group a rootless jail's user namespace does not map.
        if rootless {
            "newinstance,ptmxmode=0666,mode=0620"
        } else {
            "newinstance,ptmxmode=0666,mode=0620,gid=5"
        },
    )?;
    let shm = dev.join("shm");
    ensure_dir(&shm, 0o1777)?;
    mount_fs(
        "mount /dev/shm",
        "tmpfs",
        &shm,
        "tmpfs",
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
        &format!("mode=1777,{tmpfs_size}"),
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

fn build_homes(root: &Path, rootless: bool) -> Result<(), JailError> {
    let root_home = root.join("root");
    ensure_dir(&root_home, 0o700)?;
    let user_home = root.join("home/user");
    if !user_home.exists() {
        ensure_dir(&user_home, 0o755)?;
        // A rootless jail maps only root: `user` cannot own anything there.
        if !rootless {
            std::os::unix::fs::chown(&user_home, Some(USER_ID), Some(USER_ID))
                .map_err(|e| JailError::io("chown home", &user_home, e))?;
        }
    }
    Ok(())
}

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
        ("resolv.conf", String::new()),
        (
            "nsswitch.conf",
            "passwd: files\ngroup: files\nhosts: files dns\n".to_owned(),
        ),
    ]
}

fn write_etc(etc: &Path, hostname: &str) -> Result<(), JailError> {
    for (name, content) in etc_files(hostname) {
        let path = etc.join(name);
        fs::write(&path, content).map_err(|e| JailError::io("write /etc", &path, e))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_inside_the_jail_cannot_climb_out_of_the_root() {
        let root = Path::new("/data/sbx/root");
        assert_eq!(
            under_root(root, Path::new("/usr")).unwrap(),
            root.join("usr")
        );
        assert_eq!(
            under_root(root, Path::new("usr/./lib")).unwrap(),
            root.join("usr/lib")
        );
        assert!(under_root(root, Path::new("/usr/../../etc")).is_err());
    }

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
                .any(|(n, c)| *n == "resolv.conf" && c.is_empty())
        );
    }

    #[test]
    fn overlay_options_refuse_paths_that_look_like_option_syntax() {
        let spec_with = |lower: &str| JailSpec {
            root_dir: "/d/root".into(),
            lower_dir: lower.into(),
            upper_dir: "/d/upper".into(),
            work_dir: "/d/work".into(),
            read_only_binds: vec![],
            hostname: "h".into(),
            tmpfs_bytes: 1 << 20,
            agent: crate::spec::AgentSpec {
                path: "/bin/sh".into(),
                args: vec![],
                env: vec![],
                cwd: "/".into(),
            },
            rootless: None,
        };
        assert_eq!(
            overlay_options(&spec_with("/t")).unwrap(),
            "lowerdir=/t,upperdir=/d/upper,workdir=/d/work"
        );
        assert!(overlay_options(&spec_with("/t,upperdir=/etc")).is_err());
        assert!(overlay_options(&spec_with("/a:/b")).is_err());
        assert!(overlay_options(&spec_with("relative")).is_err());
    }
}
