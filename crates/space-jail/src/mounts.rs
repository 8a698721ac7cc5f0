//! Mounting and writing inside a tree the sandbox controls, without ever following a
//! link it planted.
//!
//! The jail's root is an overlay whose upper layer is the sandbox's own writable
//! layer: a previous execution of the sandbox may have replaced `/etc`, `/tmp`,
//! `/usr` or `/etc/passwd` with a symlink to anywhere on the host. So every path
//! under the root is resolved here with `openat2(RESOLVE_BENEATH |
//! RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS | RESOLVE_NO_XDEV)` from a descriptor
//! of the root, a component that is not a real directory is replaced, and mounts are
//! attached to the resulting descriptor (`move_mount` with `MOVE_MOUNT_T_EMPTY_PATH`,
//! or `mount(2)` on its `/proc/self/fd/N` name), never to a path string.
//!
//! Bind mounts use the new mount API (`open_tree(OPEN_TREE_CLONE)` +
//! `mount_setattr`): the read-only, nosuid, nodev and idmap attributes are set on
//! the detached copy before it becomes visible, so there is no moment where a bind
//! is writable.
#![allow(unsafe_code)]

use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};

const OPEN_TREE_CLONE: libc::c_uint = 1;
const AT_RECURSIVE: libc::c_uint = 0x8000;
const MOVE_MOUNT_F_EMPTY_PATH: libc::c_uint = 0x4;
const MOVE_MOUNT_T_EMPTY_PATH: libc::c_uint = 0x40;
const MOUNT_ATTR_RDONLY: u64 = 0x1;
const MOUNT_ATTR_NOSUID: u64 = 0x2;
const MOUNT_ATTR_NODEV: u64 = 0x4;
const MOUNT_ATTR_IDMAP: u64 = 0x0010_0000;

/// `struct mount_attr` of `mount_setattr(2)`.
#[repr(C)]
struct MountAttr {
    attr_set: u64,
    attr_clr: u64,
    propagation: u64,
    userns_fd: u64,
}

/// How [`open_beneath`] resolves: inside `dir`, no symlink of any kind, no mount
/// crossing (a `..` is refused by `RESOLVE_BENEATH` already).
const RESOLVE_STRICT: u64 = libc::RESOLVE_BENEATH
    | libc::RESOLVE_NO_SYMLINKS
    | libc::RESOLVE_NO_MAGICLINKS
    | libc::RESOLVE_NO_XDEV;

fn cstr(path: &Path) -> io::Result<CString> {
    CString::new(path.as_os_str().as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "path contains a NUL byte"))
}

fn check(rc: libc::c_long) -> io::Result<libc::c_long> {
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(rc)
    }
}

/// The relative components of `inside` (an absolute or relative path in the jail),
/// refusing `..`.
pub fn components(inside: &Path) -> io::Result<Vec<&std::ffi::OsStr>> {
    let mut out = Vec::new();
    for c in inside.components() {
        match c {
            Component::RootDir | Component::CurDir => {}
            Component::Normal(part) => out.push(part),
            Component::ParentDir | Component::Prefix(_) => {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!("{} leaves the jail root", inside.display()),
                ));
            }
        }
    }
    Ok(out)
}

/// `openat2(dir, path, flags, RESOLVE_BENEATH | NO_SYMLINKS | NO_MAGICLINKS |
/// NO_XDEV)`: `ELOOP` if any component is a symlink, `EXDEV` if it crosses a mount.
pub fn open_beneath(
    dir: BorrowedFd<'_>,
    path: &Path,
    flags: libc::c_int,
    mode: libc::mode_t,
) -> io::Result<OwnedFd> {
    open_with(dir, path, flags, mode, RESOLVE_STRICT)
}

/// Like [`open_beneath`] but may cross into mounts below `dir` (used once the jail
/// has its mounts, e.g. to reach the tmpfs `/dev`).
pub fn open_beneath_across_mounts(
    dir: BorrowedFd<'_>,
    path: &Path,
    flags: libc::c_int,
    mode: libc::mode_t,
) -> io::Result<OwnedFd> {
    open_with(
        dir,
        path,
        flags,
        mode,
        RESOLVE_STRICT & !libc::RESOLVE_NO_XDEV,
    )
}

fn open_with(
    dir: BorrowedFd<'_>,
    path: &Path,
    flags: libc::c_int,
    mode: libc::mode_t,
    resolve: u64,
) -> io::Result<OwnedFd> {
    let name = cstr(path)?;
    // SAFETY: open_how is plain old data; all-zero is valid, then the fields are set.
    let mut how: libc::open_how = unsafe { std::mem::zeroed() };
    how.flags = (flags | libc::O_CLOEXEC | libc::O_NOFOLLOW) as u64;
    how.mode = if flags & libc::O_CREAT != 0 {
        u64::from(mode)
    } else {
        0
    };
    how.resolve = resolve;
    // SAFETY: openat2 reads the NUL-terminated name and `how` (size passed), both
    // alive for the call; the returned descriptor is owned by nothing else.
    let fd = check(unsafe {
        libc::syscall(
            libc::SYS_openat2,
            dir.as_raw_fd(),
            name.as_ptr(),
            &how as *const libc::open_how,
            std::mem::size_of::<libc::open_how>(),
        )
    })?;
    // SAFETY: `fd` was just returned by the kernel and is owned by nothing else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

/// Opens `path` (a directory outside the sandbox's control: the worker's own) as an
/// `O_PATH` descriptor.
pub fn open_dir_path(path: &Path) -> io::Result<OwnedFd> {
    let name = cstr(path)?;
    // SAFETY: open with a NUL-terminated name; the descriptor is owned by nothing else.
    let fd = unsafe {
        libc::open(
            name.as_ptr(),
            libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC | libc::O_NOFOLLOW,
        )
    };
    check(fd as libc::c_long)?;
    // SAFETY: as above.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Removes the entry `name` of `dir` (not following it), whatever it is, provided it
/// is not a non-empty directory.
fn remove_entry(dir: BorrowedFd<'_>, name: &CString) -> io::Result<()> {
    // SAFETY: unlinkat with a NUL-terminated name; it never follows a final symlink.
    if unsafe { libc::unlinkat(dir.as_raw_fd(), name.as_ptr(), 0) } == 0 {
        return Ok(());
    }
    let err = io::Error::last_os_error();
    match err.raw_os_error() {
        Some(libc::ENOENT) => Ok(()),
        Some(libc::EISDIR) => {
            // SAFETY: as above, removing an (empty) directory.
            if unsafe { libc::unlinkat(dir.as_raw_fd(), name.as_ptr(), libc::AT_REMOVEDIR) } == 0 {
                Ok(())
            } else {
                Err(io::Error::last_os_error())
            }
        }
        _ => Err(err),
    }
}

/// `mkdirat(dir, name, mode)`, tolerating an existing entry (checked by the caller's
/// next open).
fn make_dir(dir: BorrowedFd<'_>, name: &CString, mode: libc::mode_t) -> io::Result<()> {
    // SAFETY: mkdirat with a NUL-terminated name.
    if unsafe { libc::mkdirat(dir.as_raw_fd(), name.as_ptr(), mode) } == 0 {
        // mkdir's mode is filtered by the umask: set it exactly (sticky bits too).
        let fd = open_beneath(
            dir,
            Path::new(std::ffi::OsStr::from_bytes(name.as_bytes())),
            libc::O_RDONLY | libc::O_DIRECTORY,
            0,
        )?;
        // SAFETY: fchmod on a descriptor we own.
        if unsafe { libc::fchmod(fd.as_raw_fd(), mode) } != 0 {
            return Err(io::Error::last_os_error());
        }
        return Ok(());
    }
    let err = io::Error::last_os_error();
    if err.raw_os_error() == Some(libc::EEXIST) {
        Ok(())
    } else {
        Err(err)
    }
}

/// What [`ensure_dir`] did with the final component.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Made {
    /// It was a real directory already.
    Existing,
    /// It was created (absent, or something else that was removed first).
    Created,
}

/// A real directory at `inside` under `root`, as an `O_PATH` descriptor: every
/// component that is missing is created with `mode`, and every component that is
/// a symlink, a file or anything but a directory is removed and replaced by one.
/// Nothing is ever followed, so the result is always beneath `root`.
pub fn ensure_dir(
    root: BorrowedFd<'_>,
    inside: &Path,
    mode: libc::mode_t,
) -> io::Result<(OwnedFd, Made)> {
    let parts = components(inside)?;
    let mut current = open_beneath(root, Path::new("."), libc::O_PATH | libc::O_DIRECTORY, 0)?;
    let mut made = Made::Existing;
    for part in parts {
        let name = CString::new(part.as_bytes())
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "NUL in path"))?;
        let next = match open_beneath(
            current.as_fd_borrowed(),
            Path::new(part),
            libc::O_PATH | libc::O_DIRECTORY,
            0,
        ) {
            Ok(fd) => {
                made = Made::Existing;
                fd
            }
            Err(e)
                if matches!(
                    e.raw_os_error(),
                    Some(libc::ELOOP | libc::ENOTDIR | libc::ENOENT)
                ) =>
            {
                remove_entry(current.as_fd_borrowed(), &name)?;
                make_dir(current.as_fd_borrowed(), &name, mode)?;
                made = Made::Created;
                open_beneath(
                    current.as_fd_borrowed(),
                    Path::new(part),
                    libc::O_PATH | libc::O_DIRECTORY,
                    0,
                )?
            }
            Err(e) => return Err(e),
        };
        current = next;
    }
    Ok((current, made))
}

/// Writes `content` as the regular file `name` in `dir`: whatever was there (a
/// symlink to a host file, a hard link, a FIFO) is unlinked first and a new file is
/// created with `O_EXCL | O_NOFOLLOW`, so the write can only land in a new inode.
pub fn replace_file(
    dir: BorrowedFd<'_>,
    name: &str,
    content: &[u8],
    mode: libc::mode_t,
) -> io::Result<()> {
    let cname = CString::new(name)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "NUL in name"))?;
    if let Err(e) = remove_entry(dir, &cname) {
        if e.raw_os_error() != Some(libc::ENOTEMPTY) {
            return Err(e);
        }
        // A directory with contents where the file belongs: moved aside (within
        // `dir`, never followed, to the first free name), so the sandbox keeps its
        // files and still starts.
        let mut moved = Err(io::Error::from_raw_os_error(libc::EEXIST));
        for n in 0..1000u32 {
            let aside = match n {
                0 => format!("{name}.replaced-by-space"),
                n => format!("{name}.replaced-by-space.{n}"),
            };
            let aside = CString::new(aside)
                .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "NUL in name"))?;
            // SAFETY: renameat2 with NUL-terminated names relative to `dir`;
            // RENAME_NOREPLACE never overwrites what is at the new name.
            let rc = unsafe {
                libc::renameat2(
                    dir.as_raw_fd(),
                    cname.as_ptr(),
                    dir.as_raw_fd(),
                    aside.as_ptr(),
                    libc::RENAME_NOREPLACE,
                )
            };
            moved = if rc == 0 {
                Ok(())
            } else {
                Err(io::Error::last_os_error())
            };
            if !matches!(&moved, Err(e) if e.raw_os_error() == Some(libc::EEXIST)) {
                break;
            }
        }
        moved?;
    }
    let fd = open_beneath(
        dir,
        Path::new(name),
        libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL,
        mode,
    )?;
    let mut file = std::fs::File::from(fd);
    io::Write::write_all(&mut file, content)?;
    // SAFETY: fchmod on a descriptor we own (the umask filtered the create mode).
    if unsafe { libc::fchmod(file.as_raw_fd(), mode) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// `fchownat(dir, name, uid, gid, AT_SYMLINK_NOFOLLOW)`.
pub fn chown_entry(dir: BorrowedFd<'_>, name: &str, uid: u32, gid: u32) -> io::Result<()> {
    let cname = CString::new(name)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "NUL in name"))?;
    // SAFETY: fchownat with a NUL-terminated name; never follows a final symlink.
    let rc = unsafe {
        libc::fchownat(
            dir.as_raw_fd(),
            cname.as_ptr(),
            uid,
            gid,
            libc::AT_SYMLINK_NOFOLLOW,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// `/proc/self/fd/N`: the name under which `mount(2)` reaches exactly the directory
/// `fd` refers to (the kernel resolves the magic link to that dentry, not to a path).
pub fn fd_path(fd: BorrowedFd<'_>) -> PathBuf {
    PathBuf::from(format!("/proc/self/fd/{}", fd.as_raw_fd()))
}

/// Attributes of a bind made by [`bind_tree`].
#[derive(Debug, Clone, Copy, Default)]
pub struct BindAttrs<'a> {
    /// Read-only, nosuid, nodev.
    pub read_only: bool,
    /// Map ids through this user namespace (an idmapped mount).
    pub idmap: Option<BorrowedFd<'a>>,
}

/// A detached recursive copy of the mount tree at `source` with `attrs` applied,
/// not yet attached anywhere.
pub fn clone_tree(source: &Path, attrs: BindAttrs<'_>) -> io::Result<OwnedFd> {
    let name = cstr(source)?;
    // SAFETY: open_tree with a NUL-terminated name; the descriptor is owned by nothing else.
    let fd = check(unsafe {
        libc::syscall(
            libc::SYS_open_tree,
            libc::AT_FDCWD,
            name.as_ptr(),
            OPEN_TREE_CLONE | libc::O_CLOEXEC as libc::c_uint | AT_RECURSIVE,
        )
    })?;
    // SAFETY: as above.
    let tree = unsafe { OwnedFd::from_raw_fd(fd as i32) };
    let mut set = 0;
    if attrs.read_only {
        set |= MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV;
    }
    let mut attr = MountAttr {
        attr_set: set,
        attr_clr: 0,
        propagation: 0,
        userns_fd: 0,
    };
    if let Some(userns) = attrs.idmap {
        attr.attr_set |= MOUNT_ATTR_IDMAP;
        attr.userns_fd = userns.as_raw_fd() as u64;
    }
    if attr.attr_set != 0 {
        // SAFETY: mount_setattr reads `attr` (size passed) for the detached tree.
        check(unsafe {
            libc::syscall(
                libc::SYS_mount_setattr,
                tree.as_raw_fd(),
                c"".as_ptr(),
                libc::AT_EMPTY_PATH as libc::c_uint | AT_RECURSIVE,
                &attr as *const MountAttr,
                std::mem::size_of::<MountAttr>(),
            )
        })?;
    }
    Ok(tree)
}

/// Attaches the detached tree `tree` on the directory `target` refers to.
pub fn attach(tree: &OwnedFd, target: BorrowedFd<'_>) -> io::Result<()> {
    // SAFETY: move_mount between two descriptors with empty names.
    check(unsafe {
        libc::syscall(
            libc::SYS_move_mount,
            tree.as_raw_fd(),
            c"".as_ptr(),
            target.as_raw_fd(),
            c"".as_ptr(),
            MOVE_MOUNT_F_EMPTY_PATH | MOVE_MOUNT_T_EMPTY_PATH,
        )
    })?;
    Ok(())
}

/// Borrowing helper: `OwnedFd` to `BorrowedFd` without importing `AsFd` everywhere.
pub trait AsFdBorrowed {
    /// The descriptor, borrowed.
    fn as_fd_borrowed(&self) -> BorrowedFd<'_>;
}

impl AsFdBorrowed for OwnedFd {
    fn as_fd_borrowed(&self) -> BorrowedFd<'_> {
        std::os::fd::AsFd::as_fd(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;
    use std::os::unix::fs::symlink;

    #[test]
    fn paths_that_climb_out_are_refused() {
        assert!(components(Path::new("/usr/../../etc")).is_err());
        assert_eq!(components(Path::new("/usr/./lib")).unwrap().len(), 2);
    }

    #[test]
    fn a_symlinked_directory_is_replaced_not_followed() {
        let jail = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        symlink(outside.path(), jail.path().join("etc")).unwrap();
        let root = open_dir_path(jail.path()).unwrap();
        let (etc, made) = ensure_dir(root.as_fd(), Path::new("/etc"), 0o755).unwrap();
        assert_eq!(made, Made::Created);
        let etc = open_beneath(etc.as_fd(), Path::new("."), libc::O_RDONLY, 0).unwrap();
        replace_file(etc.as_fd(), "passwd", b"root:x:0:0::/root:/bin/sh\n", 0o644).unwrap();
        assert!(jail.path().join("etc").is_dir());
        assert!(
            !std::fs::symlink_metadata(jail.path().join("etc"))
                .unwrap()
                .is_symlink()
        );
        assert!(jail.path().join("etc/passwd").is_file());
        assert_eq!(std::fs::read_dir(outside.path()).unwrap().count(), 0);
    }

    #[test]
    fn a_symlinked_file_is_unlinked_and_the_host_target_untouched() {
        let jail = tempfile::tempdir().unwrap();
        let victim = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(victim.path(), "host secret").unwrap();
        std::fs::create_dir(jail.path().join("etc")).unwrap();
        symlink(victim.path(), jail.path().join("etc/passwd")).unwrap();
        // A hard link to a host file is another way in: replaced, not written through.
        let root = open_dir_path(jail.path()).unwrap();
        let (etc, _) = ensure_dir(root.as_fd(), Path::new("etc"), 0o755).unwrap();
        let etc = open_beneath(etc.as_fd(), Path::new("."), libc::O_RDONLY, 0).unwrap();
        replace_file(etc.as_fd(), "passwd", b"new", 0o644).unwrap();
        assert_eq!(
            std::fs::read_to_string(victim.path()).unwrap(),
            "host secret"
        );
        assert_eq!(
            std::fs::read_to_string(jail.path().join("etc/passwd")).unwrap(),
            "new"
        );
    }

    #[test]
    fn a_directory_in_place_of_a_file_is_moved_aside_with_its_contents() {
        let jail = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(jail.path().join("etc/passwd")).unwrap();
        std::fs::write(jail.path().join("etc/passwd/mine"), "kept").unwrap();
        let etc = open_dir_path(&jail.path().join("etc")).unwrap();
        let etc = open_beneath(etc.as_fd(), Path::new("."), libc::O_RDONLY, 0).unwrap();
        replace_file(etc.as_fd(), "passwd", b"root:x:0:0::/root:/bin/sh\n", 0o644).unwrap();
        assert!(jail.path().join("etc/passwd").is_file());
        assert_eq!(
            std::fs::read_to_string(jail.path().join("etc/passwd.replaced-by-space/mine")).unwrap(),
            "kept"
        );
        // Again (the sandbox did it twice): the next free name, still no failure.
        std::fs::remove_file(jail.path().join("etc/passwd")).unwrap();
        std::fs::create_dir_all(jail.path().join("etc/passwd/again")).unwrap();
        replace_file(etc.as_fd(), "passwd", b"root:x:0:0::/root:/bin/sh\n", 0o644).unwrap();
        assert!(
            jail.path()
                .join("etc/passwd.replaced-by-space.1/again")
                .is_dir()
        );
    }

    #[test]
    fn an_intermediate_symlink_is_replaced_too() {
        let jail = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        symlink(outside.path(), jail.path().join("home")).unwrap();
        let root = open_dir_path(jail.path()).unwrap();
        ensure_dir(root.as_fd(), Path::new("/home/user"), 0o755).unwrap();
        assert!(jail.path().join("home/user").is_dir());
        assert_eq!(std::fs::read_dir(outside.path()).unwrap().count(), 0);
    }
}
