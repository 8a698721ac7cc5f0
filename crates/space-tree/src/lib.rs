//! Directories as tar streams: [`pack`] writes a directory as a tar archive without
//! following any link, [`unpack`] writes an archive into a directory without ever
//! writing outside it.
//!
//! Both sides may be hostile. Inside a sandbox the agent unpacks what a client sent
//! into a tree the sandbox's own processes can change at the same moment; on a user's
//! machine the CLI unpacks what a sandbox packed. So [`unpack`] works through
//! directory descriptors only: every directory on an entry's way is opened one
//! component at a time with `O_NOFOLLOW | O_DIRECTORY` relative to the one before, and
//! every file is created relative to its parent's descriptor with `O_NOFOLLOW |
//! O_EXCL`. A symlink planted in the tree (by the archive or by anyone else, before or
//! during the unpack) is never followed, so no write lands outside the target
//! directory. Entries that are absolute, climb with `..`, or are devices, FIFOs or
//! sockets are refused, and refusing one ends the unpack with an error.
//!
//! Bounds: the archive streams (one entry's 64 KiB copy buffer, never the whole
//! archive), names at most [`MAX_PATH`] bytes (components [`MAX_COMPONENT`]), at most
//! [`Limits::max_entries`] entries.

use std::io::{self, Read, Write};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

use rustix::fs::{AtFlags, FileType, Mode, OFlags, Timespec, Timestamps};
use rustix::io::Errno;

/// Longest entry name (and symlink or hard link target), in bytes.
pub const MAX_PATH: usize = 4096;

/// Longest component of a name, in bytes (the kernel's `NAME_MAX`).
pub const MAX_COMPONENT: usize = 255;

/// Entries of one archive unless the caller says otherwise.
pub const DEFAULT_MAX_ENTRIES: u64 = 1_000_000;

/// Directories whose mode and mtime are set once their contents are in place (a
/// read-only directory must not stop its own entries); past this many, a directory
/// gets them at once.
const DEFERRED_DIRS: usize = 65_536;

/// What an archive may hold.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Most entries (files, directories, links) of one archive.
    pub max_entries: u64,
    /// Keep only the permission bits (`0o777`): no setuid, setgid or sticky bit. For
    /// an archive unpacked on a user's machine.
    pub strip_special_bits: bool,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_entries: DEFAULT_MAX_ENTRIES,
            strip_special_bits: false,
        }
    }
}

/// Why a pack or an unpack stopped.
#[derive(Debug, thiserror::Error)]
pub enum TreeError {
    /// An entry the unpack refuses (the name and why).
    #[error("refused entry {name:?}: {why}")]
    Refused {
        /// The entry's name as the archive gave it (lossy).
        name: String,
        /// Why.
        why: &'static str,
    },
    /// More entries than [`Limits::max_entries`].
    #[error("the archive has more than {0} entries")]
    TooManyEntries(u64),
    /// Not a tar archive, or a truncated one.
    #[error("not a valid tar archive: {0}")]
    Archive(io::Error),
    /// A file system call failed (what was done, and the error).
    #[error("{what}: {error}")]
    Io {
        /// What was being done.
        what: String,
        /// The error.
        error: io::Error,
    },
}

impl TreeError {
    /// The operating system error underneath, if there is one.
    pub fn os_error(&self) -> Option<i32> {
        match self {
            Self::Io { error, .. } | Self::Archive(error) => error.raw_os_error(),
            _ => None,
        }
    }
}

fn io_at(what: impl Into<String>) -> impl FnOnce(Errno) -> TreeError {
    let what = what.into();
    move |e| TreeError::Io {
        what,
        error: e.into(),
    }
}

/// What an unpack or a pack did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Summary {
    /// Entries written (directories, files, links).
    pub entries: u64,
    /// Bytes of file content.
    pub bytes: u64,
    /// Entries left out by [`pack`] (devices, FIFOs, sockets).
    pub skipped: u64,
}

const DIR_FLAGS: OFlags = OFlags::RDONLY
    .union(OFlags::DIRECTORY)
    .union(OFlags::NOFOLLOW)
    .union(OFlags::CLOEXEC);

/// Opens directory `path` (absolute or relative to the working directory) itself
/// without following a symlink at its last component, for [`pack`] or [`unpack`].
pub fn open_dir(path: &std::path::Path) -> Result<OwnedFd, TreeError> {
    rustix::fs::open(path, DIR_FLAGS, Mode::empty())
        .map_err(io_at(format!("open {}", path.display())))
}

/// The components of an entry name, checked: relative, no `..`, no NUL, within the
/// bounds. `.` components and a leading `./` are dropped; an empty result is the
/// root itself.
pub fn components(name: &[u8]) -> Result<Vec<&[u8]>, &'static str> {
    if name.len() > MAX_PATH {
        return Err("name too long");
    }
    if name.contains(&0) {
        return Err("name contains NUL");
    }
    if name.first() == Some(&b'/') {
        return Err("absolute name");
    }
    let mut out = Vec::new();
    for c in name.split(|b| *b == b'/') {
        match c {
            b"" | b"." => {}
            b".." => return Err("name climbs out with `..`"),
            c if c.len() > MAX_COMPONENT => return Err("name component too long"),
            c => out.push(c),
        }
    }
    Ok(out)
}

/// A directory reached from the root, one component at a time.
struct Walker<'a> {
    root: BorrowedFd<'a>,
    /// The last parent opened, for the next entry in the same directory.
    cached: Option<(Vec<u8>, OwnedFd)>,
}

impl<'a> Walker<'a> {
    /// The directory `parts` (relative to the root), made when `create` (mode 0755
    /// before the umask) where missing. A component that is a symlink or not a
    /// directory is refused.
    fn dir(&mut self, parts: &[&[u8]], create: bool, name: &str) -> Result<OwnedFd, TreeError> {
        let key = parts.join(&b'/');
        if let Some((k, fd)) = &self.cached {
            if *k == key {
                return fd.try_clone().map_err(|e| TreeError::Io {
                    what: "dup".into(),
                    error: e,
                });
            }
        }
        let mut cur = rustix::io::fcntl_dupfd_cloexec(self.root, 0).map_err(io_at("dup"))?;
        for part in parts {
            cur = match rustix::fs::openat(&cur, *part, DIR_FLAGS, Mode::empty()) {
                Ok(fd) => fd,
                Err(Errno::NOENT) if create => {
                    let made = match rustix::fs::mkdirat(&cur, *part, Mode::from_raw_mode(0o755)) {
                        Ok(()) => true,
                        Err(Errno::EXIST) => false,
                        Err(e) => return Err(io_at(format!("mkdir {name}"))(e)),
                    };
                    let fd = rustix::fs::openat(&cur, *part, DIR_FLAGS, Mode::empty())
                        .map_err(|e| refused_or_io(e, name))?;
                    if made {
                        // 0755 whatever the umask (the archive's own mode, if it names
                        // this directory, is set at the end).
                        rustix::fs::fchmod(&fd, Mode::from_raw_mode(0o755))
                            .map_err(io_at(format!("chmod {name}")))?;
                    }
                    fd
                }
                Err(e) => return Err(refused_or_io(e, name)),
            };
        }
        let copy = cur.try_clone().map_err(|e| TreeError::Io {
            what: "dup".into(),
            error: e,
        })?;
        self.cached = Some((key, copy));
        Ok(cur)
    }

    fn forget(&mut self) {
        self.cached = None;
    }
}

/// A failed open of a directory on an entry's way: a symlink or a non-directory
/// there is a refusal (the archive, or someone in the tree, tried to redirect it).
fn refused_or_io(e: Errno, name: &str) -> TreeError {
    match e {
        Errno::LOOP | Errno::NOTDIR => TreeError::Refused {
            name: name.to_owned(),
            why: "its path passes through a symlink or a file",
        },
        e => io_at(format!("open the directory of {name}"))(e),
    }
}

fn timestamps(mtime: u64) -> Timestamps {
    let t = Timespec {
        tv_sec: i64::try_from(mtime).unwrap_or(i64::MAX),
        tv_nsec: 0,
    };
    Timestamps {
        last_access: t,
        last_modification: t,
    }
}

/// Removes what is at `name` in `dir` unless it is a directory (which is kept, and
/// `false` returned for it). Nothing there is fine.
fn clear(dir: &OwnedFd, name: &[u8], shown: &str) -> Result<bool, TreeError> {
    match rustix::fs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW) {
        Err(Errno::NOENT) => Ok(true),
        Err(e) => Err(io_at(format!("stat {shown}"))(e)),
        Ok(st) if FileType::from_raw_mode(st.st_mode) == FileType::Directory => Ok(false),
        Ok(_) => {
            rustix::fs::unlinkat(dir, name, AtFlags::empty())
                .map_err(io_at(format!("replace {shown}")))?;
            Ok(true)
        }
    }
}

/// Unpacks the tar archive read from `input` into the directory `root` (a
/// descriptor, see [`open_dir`]). Files and links replace what is at their name (a
/// symlink there is removed, never followed); directories are merged. Modes (the
/// permission bits, see [`Limits::strip_special_bits`]) and mtimes come from the
/// archive; owners are the caller's. Stops at the first refused entry or failure,
/// with what was unpacked before it left in place.
pub fn unpack(
    input: impl Read,
    root: BorrowedFd<'_>,
    limits: Limits,
) -> Result<Summary, TreeError> {
    let mut archive = tar::Archive::new(input);
    let mut walker = Walker { root, cached: None };
    let mut summary = Summary::default();
    let mut deferred: Vec<(Vec<Vec<u8>>, u32, u64)> = Vec::new();
    let mask = if limits.strip_special_bits {
        0o777
    } else {
        0o7777
    };
    let entries = archive.entries().map_err(TreeError::Archive)?;
    let mut buf = vec![0u8; 64 << 10];
    for entry in entries {
        let mut entry = entry.map_err(TreeError::Archive)?;
        let kind = entry.header().entry_type();
        if matches!(kind, tar::EntryType::XGlobalHeader) {
            continue;
        }
        if summary.entries >= limits.max_entries {
            return Err(TreeError::TooManyEntries(limits.max_entries));
        }
        let raw = entry.path_bytes().into_owned();
        let shown = String::from_utf8_lossy(&raw).into_owned();
        let refuse = |why| TreeError::Refused {
            name: shown.clone(),
            why,
        };
        let parts = components(&raw).map_err(refuse)?;
        let mode = entry.header().mode().map_err(TreeError::Archive)? & mask;
        let mtime = entry.header().mtime().unwrap_or(0);
        summary.entries += 1;
        let Some((last, parents)) = parts.split_last() else {
            // The root itself (`./`): only a directory may name it.
            if kind.is_dir() {
                continue;
            }
            return Err(refuse("names the target directory itself"));
        };
        let dir = walker.dir(parents, true, &shown)?;
        match kind {
            tar::EntryType::Directory => {
                if clear(&dir, last, &shown)? {
                    rustix::fs::mkdirat(&dir, *last, Mode::from_raw_mode(0o700))
                        .or_else(|e| if e == Errno::EXIST { Ok(()) } else { Err(e) })
                        .map_err(io_at(format!("mkdir {shown}")))?;
                }
                // The directory must be one now, reached without a link.
                let made = rustix::fs::openat(&dir, *last, DIR_FLAGS, Mode::empty())
                    .map_err(|e| refused_or_io(e, &shown))?;
                if deferred.len() < DEFERRED_DIRS {
                    let owned = parts.iter().map(|p| p.to_vec()).collect();
                    deferred.push((owned, mode, mtime));
                } else {
                    set_mode_and_time(&made, mode, mtime, &shown)?;
                }
            }
            tar::EntryType::Regular | tar::EntryType::Continuous => {
                if !clear(&dir, last, &shown)? {
                    return Err(refuse("a directory is in the way"));
                }
                let flags = OFlags::WRONLY
                    | OFlags::CREATE
                    | OFlags::EXCL
                    | OFlags::NOFOLLOW
                    | OFlags::CLOEXEC;
                let fd = rustix::fs::openat(&dir, *last, flags, Mode::from_raw_mode(0o600))
                    .map_err(io_at(format!("create {shown}")))?;
                let mut file = std::fs::File::from(fd);
                loop {
                    let n = match entry.read(&mut buf) {
                        Ok(0) => break,
                        Ok(n) => n,
                        Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                        Err(e) => return Err(TreeError::Archive(e)),
                    };
                    file.write_all(&buf[..n]).map_err(|e| TreeError::Io {
                        what: format!("write {shown}"),
                        error: e,
                    })?;
                    summary.bytes += n as u64;
                }
                set_mode_and_time(&file, mode, mtime, &shown)?;
            }
            tar::EntryType::Symlink => {
                let target = entry
                    .link_name_bytes()
                    .map(|t| t.into_owned())
                    .ok_or_else(|| refuse("a symlink without a target"))?;
                if target.is_empty() || target.len() > MAX_PATH || target.contains(&0) {
                    return Err(refuse(
                        "a symlink target that is empty, too long or has NUL",
                    ));
                }
                if !clear(&dir, last, &shown)? {
                    return Err(refuse("a directory is in the way"));
                }
                rustix::fs::symlinkat(target.as_slice(), &dir, *last)
                    .map_err(io_at(format!("symlink {shown}")))?;
                let _ = rustix::fs::utimensat(
                    &dir,
                    *last,
                    &timestamps(mtime),
                    AtFlags::SYMLINK_NOFOLLOW,
                );
                // A link may now stand where a cached directory path was.
                walker.forget();
            }
            tar::EntryType::Link => {
                let target = entry
                    .link_name_bytes()
                    .map(|t| t.into_owned())
                    .ok_or_else(|| refuse("a hard link without a target"))?;
                let target_parts = components(&target).map_err(refuse)?;
                let Some((t_last, t_parents)) = target_parts.split_last() else {
                    return Err(refuse("a hard link to the target directory"));
                };
                let t_dir = walker.dir(t_parents, false, &shown)?;
                let st = rustix::fs::statat(&t_dir, *t_last, AtFlags::SYMLINK_NOFOLLOW)
                    .map_err(io_at(format!("hard link {shown}")))?;
                if FileType::from_raw_mode(st.st_mode) != FileType::RegularFile {
                    return Err(refuse("a hard link to something other than a file"));
                }
                let dir = walker.dir(parents, true, &shown)?;
                if !clear(&dir, last, &shown)? {
                    return Err(refuse("a directory is in the way"));
                }
                rustix::fs::linkat(&t_dir, *t_last, &dir, *last, AtFlags::empty())
                    .map_err(io_at(format!("hard link {shown}")))?;
            }
            tar::EntryType::Char | tar::EntryType::Block => {
                return Err(refuse("a device node"));
            }
            tar::EntryType::Fifo => return Err(refuse("a FIFO")),
            _ => return Err(refuse("an entry type this unpack does not write")),
        }
    }
    // Innermost first: a directory's own mtime after its children changed it.
    for (parts, mode, mtime) in deferred.iter().rev() {
        let parts: Vec<&[u8]> = parts.iter().map(Vec::as_slice).collect();
        let shown = String::from_utf8_lossy(&parts.join(&b'/')).into_owned();
        walker.forget();
        let fd = walker.dir(&parts, false, &shown)?;
        set_mode_and_time(&fd, *mode, *mtime, &shown)?;
    }
    Ok(summary)
}

fn set_mode_and_time(fd: impl AsFd, mode: u32, mtime: u64, shown: &str) -> Result<(), TreeError> {
    rustix::fs::fchmod(&fd, Mode::from_raw_mode(mode)).map_err(io_at(format!("chmod {shown}")))?;
    rustix::fs::futimens(&fd, &timestamps(mtime))
        .map_err(io_at(format!("set the mtime of {shown}")))
}

/// Writes the directory `root` (a descriptor, see [`open_dir`]) as a tar archive to
/// `out`: directories, regular files and symlinks (as links, never followed), with
/// their permission bits and mtimes, names relative to `root`; devices, FIFOs and
/// sockets are left out (counted in [`Summary::skipped`]). Directories are walked
/// without recursion, one component at a time with `O_NOFOLLOW`, so a tree changed
/// while it is packed cannot redirect the walk outside `root`. A file that changes
/// size meanwhile is cut or padded with zeros to the size it had when opened.
pub fn pack(root: BorrowedFd<'_>, out: impl Write, max_entries: u64) -> Result<Summary, TreeError> {
    let mut builder = tar::Builder::new(out);
    let mut summary = Summary::default();
    // Directories still to list, relative to the root.
    let mut pending: Vec<Vec<u8>> = vec![Vec::new()];
    let mut walker = Walker { root, cached: None };
    let write_err = |e: io::Error| TreeError::Io {
        what: "write the archive".into(),
        error: e,
    };
    while let Some(rel) = pending.pop() {
        let parts: Vec<&[u8]> = rel
            .split(|b| *b == b'/')
            .filter(|c| !c.is_empty())
            .collect();
        let shown = String::from_utf8_lossy(&rel).into_owned();
        let dir = match walker.dir(&parts, false, &shown) {
            Ok(d) => d,
            // Replaced by something else since it was listed: left out.
            Err(TreeError::Refused { .. }) => continue,
            Err(e) => return Err(e),
        };
        let mut names: Vec<Vec<u8>> = Vec::new();
        let listing = rustix::fs::Dir::read_from(&dir).map_err(io_at(format!("list {shown}")))?;
        for item in listing {
            let item = item.map_err(io_at(format!("list {shown}")))?;
            let name = item.file_name().to_bytes();
            if name != b"." && name != b".." {
                names.push(name.to_vec());
            }
        }
        names.sort();
        for name in names {
            let path = if rel.is_empty() {
                name.clone()
            } else {
                [rel.as_slice(), b"/", name.as_slice()].concat()
            };
            if path.len() > MAX_PATH {
                return Err(TreeError::Refused {
                    name: String::from_utf8_lossy(&path).into_owned(),
                    why: "name too long",
                });
            }
            let st = match rustix::fs::statat(&dir, name.as_slice(), AtFlags::SYMLINK_NOFOLLOW) {
                Ok(st) => st,
                Err(Errno::NOENT) => continue,
                Err(e) => return Err(io_at("stat")(e)),
            };
            if summary.entries >= max_entries {
                return Err(TreeError::TooManyEntries(max_entries));
            }
            let os_path = std::path::Path::new(std::ffi::OsStr::from_bytes_compat(&path));
            let mut header = tar::Header::new_gnu();
            header.set_mode(st.st_mode & 0o7777);
            header.set_mtime(u64::try_from(st.st_mtime).unwrap_or(0));
            header.set_uid(u64::from(st.st_uid));
            header.set_gid(u64::from(st.st_gid));
            match FileType::from_raw_mode(st.st_mode) {
                FileType::Directory => {
                    header.set_entry_type(tar::EntryType::Directory);
                    header.set_size(0);
                    builder
                        .append_data(&mut header, os_path, io::empty())
                        .map_err(write_err)?;
                    pending.push(path);
                }
                FileType::RegularFile => {
                    let flags =
                        OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC;
                    let fd = match rustix::fs::openat(&dir, name.as_slice(), flags, Mode::empty()) {
                        Ok(fd) => fd,
                        Err(Errno::NOENT | Errno::LOOP) => continue,
                        Err(e) => return Err(io_at("open")(e)),
                    };
                    let size = rustix::fs::fstat(&fd).map_err(io_at("stat"))?.st_size;
                    let size = u64::try_from(size).unwrap_or(0);
                    header.set_entry_type(tar::EntryType::Regular);
                    header.set_size(size);
                    let file = std::fs::File::from(fd);
                    // Exactly `size` bytes, whatever the file does meanwhile.
                    let data = file.take(size).chain(io::repeat(0)).take(size);
                    builder
                        .append_data(&mut header, os_path, data)
                        .map_err(write_err)?;
                    summary.bytes += size;
                }
                FileType::Symlink => {
                    let target = rustix::fs::readlinkat(&dir, name.as_slice(), Vec::new())
                        .map_err(io_at("readlink"))?;
                    header.set_entry_type(tar::EntryType::Symlink);
                    header.set_size(0);
                    let target =
                        std::path::Path::new(std::ffi::OsStr::from_bytes_compat(target.as_bytes()));
                    builder
                        .append_link(&mut header, os_path, target)
                        .map_err(write_err)?;
                }
                _ => {
                    summary.skipped += 1;
                    continue;
                }
            }
            summary.entries += 1;
        }
    }
    builder
        .into_inner()
        .and_then(|mut w| w.flush())
        .map_err(write_err)?;
    Ok(summary)
}

/// `OsStr` from bytes (Unix).
trait FromBytesCompat {
    fn from_bytes_compat(b: &[u8]) -> &Self;
}

impl FromBytesCompat for std::ffi::OsStr {
    fn from_bytes_compat(b: &[u8]) -> &Self {
        std::os::unix::ffi::OsStrExt::from_bytes(b)
    }
}

#[cfg(test)]
mod tests;
