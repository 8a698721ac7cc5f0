//! Unpacks one layer's tar stream into a new, empty directory, as an overlayfs lower
//! layer over the layers below it, without ever following a link.
//!
//! Every path is made relative (a leading `/` is dropped) and normalised lexically; a
//! `..` that would climb above the layer's root refuses the whole layer, naming the
//! entry. An entry's parent is opened with [`crate::at::RESOLVE`]
//! (`RESOLVE_NO_SYMLINKS`) when the layer has it as directories; otherwise its path is
//! resolved in the root the layers make ([`crate::view`]): through a symbolic link —
//! of this layer or of one below — the entry lands where the link leads *within that
//! root*, in this layer (`lib -> usr/lib` below, `lib/x.so` here: `usr/lib/x.so`
//! here), as `tar -x` in a chroot of the root would put it. A link pointing anywhere
//! (`evil -> /`) is created as it is: resolved, it names a path of the root, never of
//! the host, and the kernel never follows it for us. A parent that is neither a
//! directory nor a link, or a path through more than 40 links, refuses the layer.
//! Missing parents are created with the owner, mode and mtime of the directory the
//! layers below have there (so that the merged directory keeps them), or as `0755`
//! directories owned by root.
//!
//! Refused, each with an error naming the entry: character and block devices, ids at
//! or above `id_limit`, hard links whose target is not an earlier entry of the same
//! layer (`/etc/shadow` becomes `etc/shadow` *in the layer*, which is not there),
//! sparse files and exotic tar types. Image xattrs are not applied (a layer cannot
//! plant `trusted.overlay.*` itself); the only overlay metadata is what the
//! whiteouts below translate to.
//!
//! Whiteouts (the OCI image spec's layer format): `.wh.NAME` hides `NAME` of the
//! layers below and becomes an overlay whiteout (a character device 0/0 named `NAME`);
//! `.wh..wh..opq` hides everything of the layers below in its directory and becomes
//! `trusted.overlay.opaque=y` on it. A whiteout applies only to lower layers: an entry
//! of the same layer of that name stays (a directory becomes opaque, so that the lower
//! one's contents stay hidden), whichever comes first in the stream. Other `.wh..wh.`
//! names (AUFS metadata) are skipped. Unprivileged, whiteouts are refused: an overlay
//! whiteout is a device node and the opaque mark a `trusted.` xattr, both need root.
//!
//! A path repeated in the stream replaces the earlier entry (unlinked, or removed as a
//! tree, never followed), except that a directory over a directory keeps it and takes
//! the new metadata. Owners (`fchownat` with `AT_SYMLINK_NOFOLLOW`, or `fchown` on our
//! own fd), modes including setuid/setgid/sticky, and mtimes are kept; directory
//! modes and mtimes are applied once the stream is done. Not root, owners are left as
//! the unpacking user.

use std::collections::{HashMap, HashSet};
use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::Path;

use rustix::fs::{AtFlags, FileType, Gid, Mode, OFlags, Timespec, Timestamps, Uid};
use rustix::io::Errno;

use crate::at::{self, DIR};
use crate::entry::{self, Kind, Member};
use crate::error::{ImageError, Result};
use crate::limits::{DEFAULT_ID_LIMIT, MAX_ENTRIES_PER_LAYER, MAX_LOOKUPS_PER_LAYER};
use crate::view::{Found, MAX_LINKS, MAX_LOOKUPS_PER_PATH, MergedDir, Stack, Unresolved};

/// Bounds of one unpack.
#[derive(Debug, Clone)]
pub struct UnpackOptions {
    /// Uids and gids must be below this (the size of a sandbox's id range).
    pub id_limit: u64,
    /// The most tar entries.
    pub max_entries: u64,
    /// The most names the resolution of the layer's paths through links may look up
    /// in its layers, altogether (see [`crate::view`]).
    pub max_lookups: u64,
}

impl Default for UnpackOptions {
    fn default() -> Self {
        Self {
            id_limit: DEFAULT_ID_LIMIT,
            max_entries: MAX_ENTRIES_PER_LAYER,
            max_lookups: MAX_LOOKUPS_PER_LAYER,
        }
    }
}

/// What an unpack wrote.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct UnpackStats {
    /// Entries applied (whiteouts included).
    pub entries: u64,
    /// Bytes of file data written.
    pub bytes: u64,
}

/// Unpacks the tar stream `stream` (already decompressed) into `dest`, an existing
/// empty directory, as a layer of its own (a bottom layer); `layer` names the layer in
/// errors.
pub fn unpack(
    layer: &str,
    stream: impl Read,
    dest: &Path,
    options: &UnpackOptions,
) -> Result<UnpackStats> {
    unpack_on(layer, stream, dest, &[], options)
}

/// [`unpack`] over `lowers`, the unpacked layers below it (top first): paths resolve
/// in the root they make with it.
pub fn unpack_on(
    layer: &str,
    stream: impl Read,
    dest: &Path,
    lowers: &[std::path::PathBuf],
    options: &UnpackOptions,
) -> Result<UnpackStats> {
    let root = rustix::fs::open(dest, DIR, Mode::empty())
        .map_err(|e| ImageError::io("open layer directory", dest, e.into()))?;
    let lowers = lowers
        .iter()
        .map(|p| {
            rustix::fs::open(p, DIR, Mode::empty())
                .map_err(|e| ImageError::io("open lower layer", p, e.into()))
        })
        .collect::<Result<Vec<_>>>()?;
    let stack = Stack::new(&root, lowers, options.max_lookups)
        .map_err(|e| ImageError::io("open layer directory", dest, e))?;
    let mut u = Unpacker {
        layer,
        root,
        stack,
        options,
        privileged: rustix::process::geteuid().is_root(),
        whiteouts: HashSet::new(),
        dirs: HashMap::new(),
        parent: None,
        stats: UnpackStats::default(),
        buf: vec![0; 256 << 10],
    };
    // The layer's root: 0755 unless the stream has a `./` entry.
    rustix::fs::fchmod(&u.root, Mode::from_raw_mode(0o755))
        .map_err(|e| ImageError::io("chmod layer directory", dest, e.into()))?;
    entry::for_each(stream, layer, options.max_entries, |m, data| {
        u.apply(m, data)
    })?;
    u.finish_dirs()?;
    Ok(u.stats)
}

/// A directory's metadata, applied at the end (creating entries in it changes its
/// mtime, and a read-only mode would stop an unprivileged unpack writing in it).
#[derive(Debug, Clone, Copy)]
struct DirMeta {
    mode: u32,
    mtime: i64,
}

struct Unpacker<'a> {
    layer: &'a str,
    root: OwnedFd,
    /// This layer over the layers below it.
    stack: Stack,
    options: &'a UnpackOptions,
    privileged: bool,
    /// Whiteouts this layer created (path), which a later entry may replace.
    whiteouts: HashSet<Vec<u8>>,
    /// Directory entries of the stream (path → metadata).
    dirs: HashMap<Vec<u8>, DirMeta>,
    /// The last parent directory opened (its path in the stream, its path in the
    /// layer, its fd): consecutive entries share it.
    parent: Option<(Vec<u8>, Vec<u8>, OwnedFd)>,
    stats: UnpackStats,
    buf: Vec<u8>,
}

/// A path split into normal components; `None` if a `..` climbs above the root.
fn normalise(path: &[u8]) -> Option<Vec<&[u8]>> {
    let mut out: Vec<&[u8]> = Vec::new();
    for c in path.split(|&b| b == b'/') {
        match c {
            b"" | b"." => {}
            b".." => {
                out.pop()?;
            }
            c => out.push(c),
        }
    }
    Some(out)
}

fn join(components: &[&[u8]]) -> Vec<u8> {
    components.join(&b'/')
}

/// The path of `name` in the directory at `dir` (`""`: the layer's root).
fn child(dir: &[u8], name: &[u8]) -> Vec<u8> {
    let mut path = dir.to_vec();
    if !path.is_empty() {
        path.push(b'/');
    }
    path.extend_from_slice(name);
    path
}

/// Whether opening a path failed on its way: a component missing, a link or not a
/// directory (resolved in the merged root instead).
fn is_walk_error(e: &io::Error) -> bool {
    [Errno::NOENT, Errno::LOOP, Errno::NOTDIR, Errno::XDEV]
        .iter()
        .any(|c| e.raw_os_error() == Some(c.raw_os_error()))
}

const WH: &[u8] = b".wh.";
const WH_META: &[u8] = b".wh..wh.";
const OPAQUE: &[u8] = b".wh..wh..opq";

impl Unpacker<'_> {
    fn refuse(&self, m: &Member, why: impl Into<String>) -> ImageError {
        ImageError::Refused {
            layer: self.layer.to_owned(),
            entry: m.name(),
            why: why.into(),
        }
    }

    fn fail(&self, m: &Member, what: &str, e: impl Into<io::Error>) -> ImageError {
        self.refuse(m, format!("{what}: {}", e.into()))
    }

    fn apply(&mut self, m: Member, data: &mut dyn Read) -> Result<()> {
        self.stats.entries += 1;
        if m.uid >= self.options.id_limit || m.gid >= self.options.id_limit {
            return Err(self.refuse(
                &m,
                format!(
                    "owner {}:{} is outside the sandbox id range (ids below {})",
                    m.uid, m.gid, self.options.id_limit
                ),
            ));
        }
        let path = m.path.clone();
        let Some(parts) = normalise(&path) else {
            return Err(self.refuse(&m, "its path climbs out of the layer (`..`)"));
        };
        if parts.iter().any(|c| c.contains(&0)) {
            return Err(self.refuse(&m, "a NUL byte in its path"));
        }
        let Some((&name, parents)) = parts.split_last() else {
            // The layer's root itself ("./").
            if m.kind != Kind::Dir {
                return Err(self.refuse(&m, "the layer's root must be a directory"));
            }
            if self.privileged {
                rustix::fs::fchown(&self.root, Some(uid(&m)), Some(gid(&m)))
                    .map_err(|e| self.fail(&m, "chown", e))?;
            }
            self.dirs.insert(Vec::new(), dir_meta(&m));
            return Ok(());
        };
        if parents.iter().any(|c| c.starts_with(WH)) {
            return Err(self.refuse(&m, "a whiteout name used as a directory"));
        }
        match m.kind {
            Kind::CharDevice | Kind::BlockDevice => {
                return Err(self.refuse(&m, "device nodes are refused in images"));
            }
            _ => {}
        }
        let literal = join(parents);
        let (parent_path, parent) = self.parent_dir(&m, parents, &literal)?;
        if name == OPAQUE {
            self.need_root(&m)?;
            return at::set_opaque(&parent).map_err(|e| self.fail(&m, "mark opaque", e));
        }
        if name.starts_with(WH_META) {
            return Ok(());
        }
        if let Some(hidden) = name.strip_prefix(WH) {
            self.need_root(&m)?;
            if hidden.is_empty() || hidden == b"." || hidden == b".." {
                return Err(self.refuse(&m, "a whiteout of no name"));
            }
            return self.whiteout(&m, parent.as_fd(), &parent_path, hidden);
        }
        let full = child(&parent_path, name);
        let mut opaque = false;
        match at::kind_of(parent.as_fd(), name).map_err(|e| self.fail(&m, "stat", e))? {
            None => {}
            Some((FileType::Directory, _)) if m.kind == Kind::Dir => {
                self.chown(&m, parent.as_fd(), name)?;
                self.dirs.insert(full, dir_meta(&m));
                self.put_parent(literal, parent_path, parent);
                return Ok(());
            }
            Some((kind, rdev)) => {
                // The same layer's whiteout of this name: the new entry stays, and a
                // directory keeps the lower layers' contents hidden.
                opaque = at::is_whiteout(kind, rdev) && self.whiteouts.remove(&full);
                if kind == FileType::Directory {
                    self.forget_dirs_under(&full);
                }
                at::remove(parent.as_fd(), name).map_err(|e| self.fail(&m, "replace", e))?;
            }
        }
        let dir = parent.as_fd();
        match m.kind {
            Kind::Dir => {
                rustix::fs::mkdirat(dir, name, Mode::from_raw_mode(0o700))
                    .map_err(|e| self.fail(&m, "mkdir", e))?;
                self.chown(&m, dir, name)?;
                if opaque {
                    let d = rustix::fs::openat(dir, name, DIR, Mode::empty())
                        .map_err(|e| self.fail(&m, "open", e))?;
                    at::set_opaque(&d).map_err(|e| self.fail(&m, "mark opaque", e))?;
                }
                self.dirs.insert(full, dir_meta(&m));
            }
            Kind::File => self.file(&m, dir, name, data)?,
            Kind::Symlink => {
                if m.link.is_empty() || m.link.contains(&0) {
                    return Err(self.refuse(&m, "a symbolic link with no target"));
                }
                // Created as it is: nothing of ours follows it.
                rustix::fs::symlinkat(&m.link[..], dir, name)
                    .map_err(|e| self.fail(&m, "symlink", e))?;
                self.chown(&m, dir, name)?;
                self.times(&m, dir, name)?;
            }
            Kind::HardLink => self.hard_link(&m, dir, name, &full)?,
            Kind::Fifo => {
                rustix::fs::mknodat(dir, name, FileType::Fifo, Mode::from_raw_mode(0o600), 0)
                    .map_err(|e| self.fail(&m, "mkfifo", e))?;
                self.chown(&m, dir, name)?;
                // No fchmodat without following exists; the name was just made a fifo
                // in a directory only this unpack writes to.
                rustix::fs::chmodat(dir, name, mode(&m), AtFlags::empty())
                    .map_err(|e| self.fail(&m, "chmod", e))?;
                self.times(&m, dir, name)?;
            }
            Kind::CharDevice | Kind::BlockDevice => {
                return Err(self.refuse(&m, "device nodes are refused in images"));
            }
        }
        self.put_parent(literal, parent_path, parent);
        Ok(())
    }

    fn need_root(&self, m: &Member) -> Result<()> {
        if self.privileged {
            return Ok(());
        }
        Err(self.refuse(
            m,
            "whiteouts need root: an overlay whiteout is a device node and an opaque \
             directory a trusted.* xattr",
        ))
    }

    /// `.wh.NAME` in `dir`.
    fn whiteout(
        &mut self,
        m: &Member,
        dir: BorrowedFd<'_>,
        dir_path: &[u8],
        hidden: &[u8],
    ) -> Result<()> {
        let path = child(dir_path, hidden);
        match at::kind_of(dir, hidden).map_err(|e| self.fail(m, "stat", e))? {
            None => {
                let dev = rustix::fs::makedev(0, 0);
                rustix::fs::mknodat(dir, hidden, FileType::CharacterDevice, Mode::empty(), dev)
                    .map_err(|e| self.fail(m, "create whiteout", e))?;
                self.whiteouts.insert(path);
            }
            // This layer's own directory of that name stays, hiding the lower one's
            // contents.
            Some((FileType::Directory, _)) => {
                let d = rustix::fs::openat(dir, hidden, DIR, Mode::empty())
                    .map_err(|e| self.fail(m, "open", e))?;
                at::set_opaque(&d).map_err(|e| self.fail(m, "mark opaque", e))?;
            }
            // Anything else of this layer hides the lower one already.
            Some(_) => {}
        }
        Ok(())
    }

    fn file(
        &mut self,
        m: &Member,
        dir: BorrowedFd<'_>,
        name: &[u8],
        data: &mut dyn Read,
    ) -> Result<()> {
        let flags =
            OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC;
        let fd = rustix::fs::openat(dir, name, flags, Mode::from_raw_mode(0o600))
            .map_err(|e| self.fail(m, "create", e))?;
        let mut file = File::from(fd);
        loop {
            let n = match data.read(&mut self.buf) {
                Ok(0) => break,
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(self.fail(m, "read", e)),
            };
            file.write_all(&self.buf[..n])
                .map_err(|e| self.fail(m, "write", e))?;
            self.stats.bytes += n as u64;
        }
        // Owner first: a chown clears setuid and setgid.
        if self.privileged {
            rustix::fs::fchown(&file, Some(uid(m)), Some(gid(m)))
                .map_err(|e| self.fail(m, "chown", e))?;
        }
        rustix::fs::fchmod(&file, mode(m)).map_err(|e| self.fail(m, "chmod", e))?;
        rustix::fs::futimens(&file, &stamps(m.mtime)).map_err(|e| self.fail(m, "set mtime", e))?;
        Ok(())
    }

    fn hard_link(
        &mut self,
        m: &Member,
        dir: BorrowedFd<'_>,
        name: &[u8],
        full: &[u8],
    ) -> Result<()> {
        let Some(target) = normalise(&m.link) else {
            return Err(self.refuse(m, "its link target climbs out of the layer (`..`)"));
        };
        let Some((&tname, tparents)) = target.split_last() else {
            return Err(self.refuse(m, "a hard link to the layer's root"));
        };
        let not_here = || {
            self.refuse(
                m,
                format!(
                    "hard link target {:?} is not a file of this layer",
                    String::from_utf8_lossy(&m.link)
                ),
            )
        };
        // The target's directory as the entries' own: in the root the layers make.
        let tpath = match at::open_dir(self.root.as_fd(), &join(tparents)) {
            Ok(_) => join(tparents),
            Err(_) => match self.stack.resolve(tparents) {
                Ok(p) => p.join(&b'/'),
                Err(Unresolved::Io(e)) => return Err(self.fail(m, "hard link target", e)),
                Err(_) => return Err(not_here()),
            },
        };
        if child(&tpath, tname) == full {
            return Err(self.refuse(m, "a hard link to itself"));
        }
        let tdir = match at::open_dir(self.root.as_fd(), &tpath) {
            Ok(d) => d,
            Err(e) if is_walk_error(&e) => return Err(not_here()),
            Err(e) => return Err(self.fail(m, "hard link target's directory", e)),
        };
        match at::kind_of(tdir.as_fd(), tname).map_err(|e| self.fail(m, "stat", e))? {
            None => return Err(not_here()),
            Some((FileType::Directory, _)) => {
                return Err(self.refuse(m, "a hard link to a directory"));
            }
            Some((k, rdev)) if at::is_whiteout(k, rdev) => {
                return Err(self.refuse(m, "a hard link to a whiteout"));
            }
            Some(_) => {}
        }
        // linkat without AT_SYMLINK_FOLLOW links a symlink itself, never its target.
        rustix::fs::linkat(tdir.as_fd(), tname, dir, name, AtFlags::empty())
            .map_err(|e| self.fail(m, "link", e))
    }

    fn chown(&self, m: &Member, dir: BorrowedFd<'_>, name: &[u8]) -> Result<()> {
        if !self.privileged {
            return Ok(());
        }
        rustix::fs::chownat(
            dir,
            name,
            Some(uid(m)),
            Some(gid(m)),
            AtFlags::SYMLINK_NOFOLLOW,
        )
        .map_err(|e| self.fail(m, "chown", e))
    }

    fn times(&self, m: &Member, dir: BorrowedFd<'_>, name: &[u8]) -> Result<()> {
        rustix::fs::utimensat(dir, name, &stamps(m.mtime), AtFlags::SYMLINK_NOFOLLOW)
            .map_err(|e| self.fail(m, "set mtime", e))
    }

    /// The parent directory of an entry (`parents`, `literal` joined) and its path in
    /// the layer: the layer's own directories if it has them, else the path resolved
    /// in the root the layers make, created where missing.
    fn parent_dir(
        &mut self,
        m: &Member,
        parents: &[&[u8]],
        literal: &[u8],
    ) -> Result<(Vec<u8>, OwnedFd)> {
        if let Some((cached, path, fd)) = self.parent.take() {
            if cached == literal {
                return Ok((path, fd));
            }
        }
        // Directories of this layer all the way: the top of the merged root, whatever
        // the layers below have there.
        match at::open_dir(self.root.as_fd(), literal) {
            Ok(fd) => return Ok((literal.to_vec(), fd)),
            Err(e) if is_walk_error(&e) => {}
            Err(e) => return Err(self.fail(m, "open parent", e)),
        }
        let resolved = self
            .stack
            .resolve(parents)
            .map_err(|e| self.unresolved(m, e))?;
        if resolved.iter().any(|c| c.starts_with(WH)) {
            return Err(self.refuse(m, "its path resolves through a whiteout name"));
        }
        let fd = self.make_dirs(m, &resolved)?;
        Ok((resolved.join(&b'/'), fd))
    }

    /// The refusal of an entry whose parent does not resolve.
    fn unresolved(&self, m: &Member, e: Unresolved) -> ImageError {
        match e {
            Unresolved::TooManyLinks => self.refuse(
                m,
                format!("its path goes through more than {MAX_LINKS} symbolic links"),
            ),
            Unresolved::TooCostly => self.refuse(
                m,
                format!(
                    "resolving its path through links looks up too many names (more than \
                     {MAX_LOOKUPS_PER_PATH} for one path, or {} for the layer)",
                    self.options.max_lookups
                ),
            ),
            Unresolved::TooLong => self.refuse(
                m,
                format!(
                    "its path resolves to more than {} bytes",
                    crate::limits::MAX_PATH
                ),
            ),
            Unresolved::NotADirectory(at) => {
                let shown = entry::shown(&at);
                self.refuse(
                    m,
                    format!("its path goes through {shown:?}, not a directory"),
                )
            }
            Unresolved::Io(e) => self.fail(m, "resolve parent", e),
        }
    }

    /// Opens `path` (directories of the merged root, or missing ones) in this layer,
    /// creating what it lacks.
    fn make_dirs(&mut self, m: &Member, path: &[Vec<u8>]) -> Result<OwnedFd> {
        let mut dir =
            rustix::io::fcntl_dupfd_cloexec(&self.root, 0).map_err(|e| self.fail(m, "dup", e))?;
        let mut here: Option<MergedDir> = None;
        if self.stack.has_lowers() {
            here = Some(
                self.stack
                    .root()
                    .map_err(|e| self.fail(m, "open lower", e))?,
            );
        }
        for (i, c) in path.iter().enumerate() {
            let below = match &here {
                Some(h) => match self.stack.lookup(h, c) {
                    Ok(Found::Dir(d)) => Some(d),
                    Ok(_) => None,
                    Err(e) => return Err(self.unresolved(m, e)),
                },
                None => None,
            };
            let next = match rustix::fs::openat(&dir, c, DIR, Mode::empty()) {
                Ok(fd) => fd,
                Err(e) => {
                    let sub = path[..=i].join(&b'/');
                    let lower = below.as_ref().and_then(MergedDir::below_top);
                    self.make_dir(m, dir.as_fd(), c, &sub, lower, e)?
                }
            };
            dir = next;
            here = below;
        }
        Ok(dir)
    }

    /// Creates the missing directory `name` (at `path`) in `dir` after `open` failed:
    /// with the metadata of `lower` (the layers below's directory there), or `0755`
    /// and root's. This layer's own whiteout of it gives way to an opaque directory
    /// (the lower one's contents stay hidden).
    fn make_dir(
        &mut self,
        m: &Member,
        dir: BorrowedFd<'_>,
        name: &[u8],
        path: &[u8],
        lower: Option<BorrowedFd<'_>>,
        open: Errno,
    ) -> Result<OwnedFd> {
        let mut opaque = false;
        if open != Errno::NOENT {
            match at::kind_of(dir, name).map_err(|e| self.fail(m, "stat", e))? {
                Some((k, rdev)) if at::is_whiteout(k, rdev) && self.whiteouts.remove(path) => {
                    rustix::fs::unlinkat(dir, name, AtFlags::empty())
                        .map_err(|e| self.fail(m, "replace whiteout", e))?;
                    opaque = true;
                }
                _ => return Err(self.fail(m, "open parent", open)),
            }
        }
        rustix::fs::mkdirat(dir, name, Mode::from_raw_mode(0o700))
            .map_err(|e| self.fail(m, "create parent", e))?;
        let fd = rustix::fs::openat(dir, name, DIR, Mode::empty())
            .map_err(|e| self.fail(m, "open parent", e))?;
        if opaque {
            at::set_opaque(&fd).map_err(|e| self.fail(m, "mark opaque", e))?;
        }
        match lower.map(rustix::fs::fstat).transpose() {
            Ok(Some(st)) => {
                if self.privileged {
                    rustix::fs::fchown(
                        &fd,
                        Some(Uid::from_raw(st.st_uid)),
                        Some(Gid::from_raw(st.st_gid)),
                    )
                    .map_err(|e| self.fail(m, "chown parent", e))?;
                }
                // Applied at the end, like an entry's (unless an entry sets them).
                let meta = DirMeta {
                    mode: st.st_mode & 0o7777,
                    mtime: st.st_mtime,
                };
                self.dirs.entry(path.to_vec()).or_insert(meta);
            }
            Ok(None) => rustix::fs::fchmod(&fd, Mode::from_raw_mode(0o755))
                .map_err(|e| self.fail(m, "chmod parent", e))?,
            Err(e) => return Err(self.fail(m, "stat lower directory", e)),
        }
        Ok(fd)
    }

    fn put_parent(&mut self, literal: Vec<u8>, path: Vec<u8>, fd: OwnedFd) {
        self.parent = Some((literal, path, fd));
    }

    /// A directory is being removed: entries under it are gone (and so may be the
    /// cached parent).
    fn forget_dirs_under(&mut self, path: &[u8]) {
        let under =
            |p: &[u8]| p == path || (p.starts_with(path) && p.get(path.len()) == Some(&b'/'));
        self.dirs.retain(|p, _| !under(p));
        self.whiteouts.retain(|p| !under(p));
        self.parent = None;
    }

    /// Applies directory modes and mtimes, deepest first (a parent's mtime would
    /// change with its children's).
    fn finish_dirs(&mut self) -> Result<()> {
        self.parent = None;
        let mut dirs: Vec<_> = self.dirs.drain().collect();
        dirs.sort_by_key(|(p, _)| std::cmp::Reverse(depth(p)));
        for (path, meta) in dirs {
            let bad = |e: io::Error| ImageError::Refused {
                layer: self.layer.to_owned(),
                entry: String::from_utf8_lossy(&path).into_owned(),
                why: format!("set directory metadata: {e}"),
            };
            let fd = at::open_dir(self.root.as_fd(), &path).map_err(bad)?;
            rustix::fs::fchmod(&fd, Mode::from_raw_mode(meta.mode & 0o7777))
                .map_err(|e| bad(e.into()))?;
            rustix::fs::futimens(&fd, &stamps(meta.mtime)).map_err(|e| bad(e.into()))?;
        }
        Ok(())
    }
}

/// How many components `path` has.
fn depth(path: &[u8]) -> usize {
    if path.is_empty() {
        return 0;
    }
    1 + path.iter().filter(|&&b| b == b'/').count()
}

fn dir_meta(m: &Member) -> DirMeta {
    DirMeta {
        mode: m.mode,
        mtime: m.mtime,
    }
}

fn mode(m: &Member) -> Mode {
    Mode::from_raw_mode(m.mode & 0o7777)
}

fn uid(m: &Member) -> Uid {
    // Below the id limit (checked first), which is far below u32::MAX.
    Uid::from_raw(u32::try_from(m.uid).unwrap_or(u32::MAX))
}

fn gid(m: &Member) -> Gid {
    Gid::from_raw(u32::try_from(m.gid).unwrap_or(u32::MAX))
}

fn stamps(mtime: i64) -> Timestamps {
    let t = Timespec {
        tv_sec: mtime,
        tv_nsec: 0,
    };
    Timestamps {
        last_access: t,
        last_modification: t,
    }
}
