//! Directory-fd-relative file operations that never follow a symbolic link: a path
//! below a directory is opened with `openat2(RESOLVE_IN_ROOT | RESOLVE_NO_SYMLINKS |
//! RESOLVE_NO_MAGICLINKS | RESOLVE_NO_XDEV)`, and every final component is acted on
//! with `*at` calls on its parent's fd (`AT_SYMLINK_NOFOLLOW` where the call has it).

use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

use rustix::fs::{AtFlags, FileType, Mode, OFlags, ResolveFlags};
use rustix::io::Errno;

/// How every lookup below a layer's root resolves.
pub(crate) const RESOLVE: ResolveFlags = ResolveFlags::IN_ROOT
    .union(ResolveFlags::NO_SYMLINKS)
    .union(ResolveFlags::NO_MAGICLINKS)
    .union(ResolveFlags::NO_XDEV);

/// Flags of a directory opened to work in (readable: `fsetxattr` and `getdents`
/// need a real file description, not `O_PATH`).
pub(crate) const DIR: OFlags = OFlags::RDONLY
    .union(OFlags::DIRECTORY)
    .union(OFlags::NOFOLLOW)
    .union(OFlags::CLOEXEC);

/// Opens the directory `rel` (components joined by `/`, no `..`) below `root`.
pub(crate) fn open_dir(root: BorrowedFd<'_>, rel: &[u8]) -> io::Result<OwnedFd> {
    let rel: &[u8] = if rel.is_empty() { b"." } else { rel };
    Ok(rustix::fs::openat2(root, rel, DIR, Mode::empty(), RESOLVE)?)
}

/// The type of `name` in `dir`, not following it; `None` if there is none.
pub(crate) fn kind_of(dir: BorrowedFd<'_>, name: &[u8]) -> io::Result<Option<(FileType, u64)>> {
    match rustix::fs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW) {
        Ok(st) => Ok(Some((FileType::from_raw_mode(st.st_mode), st.st_rdev))),
        Err(Errno::NOENT) => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// Removes `name` from `dir`: a directory with everything in it (walked by fd, links
/// removed, never followed), anything else unlinked.
pub(crate) fn remove(dir: BorrowedFd<'_>, name: &[u8]) -> io::Result<()> {
    match kind_of(dir, name)? {
        None => Ok(()),
        Some((FileType::Directory, _)) => {
            let sub = rustix::fs::openat(dir, name, DIR, Mode::empty())?;
            empty_dir(sub.as_fd())?;
            Ok(rustix::fs::unlinkat(dir, name, AtFlags::REMOVEDIR)?)
        }
        Some(_) => Ok(rustix::fs::unlinkat(dir, name, AtFlags::empty())?),
    }
}

/// Removes everything in the directory `dir`.
pub(crate) fn empty_dir(dir: BorrowedFd<'_>) -> io::Result<()> {
    // Names first, then removal: getdents over a directory being changed may skip.
    let mut names = Vec::new();
    for entry in rustix::fs::Dir::read_from(dir)? {
        let entry = entry?;
        let name = entry.file_name().to_bytes();
        if name != b"." && name != b".." {
            names.push(name.to_vec());
        }
    }
    for name in names {
        remove(dir, &name)?;
    }
    Ok(())
}

/// Whether `(kind, rdev)` is an overlay whiteout (a character device 0/0).
pub(crate) fn is_whiteout(kind: FileType, rdev: u64) -> bool {
    kind == FileType::CharacterDevice && rdev == 0
}

/// Marks the directory `dir` opaque for overlayfs: entries of lower layers under it
/// are hidden.
pub(crate) fn set_opaque(dir: impl AsFd) -> io::Result<()> {
    Ok(rustix::fs::fsetxattr(
        dir,
        "trusted.overlay.opaque",
        b"y",
        rustix::fs::XattrFlags::empty(),
    )?)
}
